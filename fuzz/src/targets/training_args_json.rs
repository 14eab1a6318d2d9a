//! `TrainingArguments::from_json_str` (a `training_args.json` or hand-written config, with
//! `post_init`); what parses must also write itself out and read back.

use tchtrain_training_args::TrainingArguments;

/// One input.
pub fn run(data: &[u8]) {
    let Some(text) = crate::text(data) else {
        return;
    };
    let Ok(parsed) = TrainingArguments::from_json_str(text) else {
        return;
    };
    let args = parsed.args;
    let _ = args.get_warmup_steps(1000);
    let _ = args.world_size();
    let _ = args.ddp_timeout_delta();
    let _ = args.to_sanitized_dict();
    let saved = args.to_json_string();
    if let Err(e) = TrainingArguments::from_json_str(&saved) {
        panic!("to_json_string output does not parse again: {e}\n{saved}");
    }
}

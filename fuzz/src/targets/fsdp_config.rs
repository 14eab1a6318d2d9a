//! `fsdp_config` (a JSON object) through `TrainingArguments::post_init`, then
//! `fsdp_plugin_args`, `FsdpPlugin::from_args` and the Trainer's FSDP checks.

use serde_json::{Value, json};
use tchtrain_fsdp::{FsdpPlugin, check_trainer_compat, fsdp_plugin_args};
use tchtrain_training_args::TrainingArguments;

/// One input.
pub fn run(data: &[u8]) {
    let Some(text) = crate::text(data) else {
        return;
    };
    let Ok(config @ Value::Object(_)) = serde_json::from_str::<Value>(text) else {
        return;
    };
    for fsdp in [json!(true), json!("full_shard auto_wrap offload")] {
        let Value::Object(map) = json!({"fsdp": fsdp, "fsdp_config": config.clone()}) else {
            unreachable!()
        };
        let Ok(parsed) = TrainingArguments::from_dict(map) else {
            continue;
        };
        let Ok(Some(plugin_args)) = fsdp_plugin_args(&parsed.args) else {
            continue;
        };
        if let Ok(plugin) = FsdpPlugin::from_args(&plugin_args) {
            let _ = check_trainer_compat(
                &parsed.args,
                &plugin,
                false,
                parsed.args.world_size(),
                false,
            );
        }
    }
}

//! `HfTrainerDeepSpeedConfig::from_path_or_json` (the `--deepspeed` value) and the Trainer's
//! processing of it: `auto` filling, finalisation, compatibility checks.

use tchtrain_accelerate::ZeroStage;
use tchtrain_deepspeed::HfTrainerDeepSpeedConfig;
use tchtrain_training_args::TrainingArguments;

/// One input.
pub fn run(data: &[u8]) {
    let Some(text) = crate::text(data) else {
        return;
    };
    // A path would be read from disk: the fuzzer gives JSON text only.
    if !text.trim_start().starts_with('{') {
        return;
    }
    let Ok(mut config) = HfTrainerDeepSpeedConfig::from_path_or_json(text) else {
        return;
    };
    let args = TrainingArguments::new("fuzz_output");
    let _ = ZeroStage::from_stage(config.zero_stage());
    let _ = config.is_offload();
    let _ = config.offload_devices();
    let _ = config.check_trainer_compat(&args);
    let _ = config.trainer_config_process(&args, data.len() % 2 == 0);
    let _ = config.trainer_config_finalize(&args, Some(64), 100);
}

//! `trl/trainer/base_config.py`'s `_BaseConfig`: the Trainer's arguments with the defaults
//! every TRL trainer shares (`logging_steps` 10, gradient checkpointing on, `bf16=None`
//! resolved to `not fp16`).

use tchtrain_training_args::TrainingArguments;

/// `_BaseConfig(output_dir)` with the trainer's own `learning_rate` default.
pub(crate) fn base_arguments(
    output_dir: impl Into<String>,
    learning_rate: f64,
) -> TrainingArguments {
    let mut base = TrainingArguments::new(output_dir);
    base.learning_rate = learning_rate;
    base.logging_steps = 10.0;
    base.gradient_checkpointing = true;
    base
}

/// `_BaseConfig.__post_init__`: `bf16 = not fp16` when unset, then the Trainer's
/// `__post_init__`.
pub(crate) fn post_init(
    base: &mut TrainingArguments,
    bf16: Option<bool>,
) -> tchtrain_training_args::Result<()> {
    base.bf16 = bf16.unwrap_or(!base.fp16);
    base.post_init().map(|_| ())
}

//! `tchtrain-deepspeed` — DeepSpeed JSON configs and (next) ZeRO stages 1/2/3 on
//! tchtrain-distributed.
//!
//! Owns [`HfTrainerDeepSpeedConfig`]: reading a config (`--deepspeed ds_config.json` or
//! inline JSON), filling `"auto"` values from `TrainingArguments` and raising upstream's
//! mismatch error for conflicting ones, the ZeRO stage / offload queries, and the
//! Trainer's DeepSpeed constraints.
//!
//! Mirrors upstream transformers/integrations/deepspeed.py and accelerate's
//! `HfDeepSpeedConfig`; names follow upstream.

mod config;
mod error;

pub use config::HfTrainerDeepSpeedConfig;
pub use error::{Error, Result};

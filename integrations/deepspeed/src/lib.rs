//! `tchtrain-deepspeed` — DeepSpeed JSON configs and ZeRO stages 1/2/3 on
//! tchtrain-distributed.
//!
//! Owns [`HfTrainerDeepSpeedConfig`]: reading a config (`--deepspeed ds_config.json` or
//! inline JSON), filling `"auto"` values from `TrainingArguments` and raising upstream's
//! mismatch error for conflicting ones, the ZeRO stage / offload queries, and the
//! Trainer's DeepSpeed constraints. The ZeRO engine these settings drive lives in
//! `tchtrain-accelerate` (`ZeroEngine`, as DeepSpeed's engine sits behind accelerate's
//! `DeepSpeedPlugin`); this crate keeps the policy and the files: the per-rank checkpoint
//! files ([`save_zero_shard`]) and their consolidation into one `model.safetensors`
//! ([`convert_zero_checkpoint_to_fp32_state_dict`], the `zero_to_fp32` example binary).
//!
//! Mirrors upstream transformers/integrations/deepspeed.py, accelerate's
//! `HfDeepSpeedConfig`, DeepSpeed's ZeRO optimizers and `zero_to_fp32.py`; names follow
//! upstream.

mod config;
mod error;
mod lr_schedules;
mod optimizer;
mod universal_checkpoint;
mod zero_checkpoint;
mod zero_to_fp32;

pub use config::HfTrainerDeepSpeedConfig;
pub use error::{Error, Result};
pub use lr_schedules::{DeepSpeedLR, SCHEDULER_TYPES, WarmupType};
pub use optimizer::DeepSpeedOptimizer;
pub use universal_checkpoint::{
    UniversalCheckpoint, UniversalParam, ds_to_universal, load_universal,
};
pub use zero_checkpoint::{
    FSDP_MODEL_DIR, LATEST_NAME, ZeroShardMeta, global_step_dir, load_zero_shard, read_zero_shard,
    save_zero_shard, zero_shard_stem,
};
pub use zero_to_fp32::{
    SAFE_WEIGHTS_NAME, convert_zero_checkpoint_to_fp32_state_dict, find_shard_dir,
    get_fp32_state_dict_from_zero_checkpoint,
};

//! `tchtrain-deepspeed` — DeepSpeed JSON configs and ZeRO stages 1/2/3 on
//! tchtrain-distributed.
//!
//! Owns [`HfTrainerDeepSpeedConfig`]: reading a config (`--deepspeed ds_config.json` or
//! inline JSON), filling `"auto"` values from `TrainingArguments` and raising upstream's
//! mismatch error for conflicting ones, the ZeRO stage / offload queries, and the
//! Trainer's DeepSpeed constraints. And the sharding engine, [`ZeroEngine`]: parameters
//! flattened into padded [`FlatBuffer`]s, each rank owning a contiguous slice; stage 1
//! partitions the optimizer state, stage 2 the gradients too, stage 3 the parameters too
//! (gathered layer by layer for forward and backward, released after). Per-rank checkpoint files
//! ([`save_zero_shard`]) and their consolidation into one `model.safetensors`
//! ([`convert_zero_checkpoint_to_fp32_state_dict`], the `zero_to_fp32` example binary).
//!
//! The engine lives here rather than in `tchtrain-distributed` because it steps an
//! optimizer on the shards (`tchtrain-optim`), which the process-group crate does not know
//! about; `tchtrain-fsdp` maps FSDP's sharding strategies and wrap policies onto it.
//!
//! Mirrors upstream transformers/integrations/deepspeed.py, accelerate's
//! `HfDeepSpeedConfig`, DeepSpeed's ZeRO optimizers and `zero_to_fp32.py`; names follow
//! upstream.

mod config;
mod error;
mod flat;
mod zero;
mod zero_checkpoint;
mod zero_to_fp32;

pub use config::HfTrainerDeepSpeedConfig;
pub use error::{Error, Result};
pub use flat::{FlatBuffer, FlatLayout, FlatParamInfo, dtype_name};
pub use zero::{ShardMemory, ZeroEngine, ZeroStage, optimizer_state_bytes, unit_of};
pub use zero_checkpoint::{
    FSDP_MODEL_DIR, LATEST_NAME, ZeroShardMeta, global_step_dir, load_zero_shard, read_zero_shard,
    save_zero_shard, zero_shard_stem,
};
pub use zero_to_fp32::{
    SAFE_WEIGHTS_NAME, convert_zero_checkpoint_to_fp32_state_dict, find_shard_dir,
    get_fp32_state_dict_from_zero_checkpoint,
};

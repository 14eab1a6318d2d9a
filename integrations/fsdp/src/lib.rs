//! `tchtrain-fsdp` — FSDP options and (next) sharded training on tchtrain-distributed.
//!
//! Owns the `--fsdp` / `fsdp_config` handling that follows `TrainingArguments`'
//! normalisation: [`fsdp_plugin_args`] (equal to upstream's `fsdp_plugin_args`), the typed
//! [`FsdpPlugin`] (full_shard / shard_grad_op / no_shard, offload, auto-wrap, FULL vs
//! SHARDED state dicts, cpu_ram_efficient_loading) and the Trainer's FSDP checks.
//!
//! Mirrors upstream transformers' training_args.py `_process_fsdp_args` and trainer.py.

mod error;
mod plugin;

pub use error::{Error, Result};
pub use plugin::{
    FSDP_AUTO_WRAP_POLICY, FSDP_STATE_DICT_TYPE, FsdpPlugin, ShardingStrategy, StateDictType,
    check_trainer_compat, fsdp_plugin_args,
};

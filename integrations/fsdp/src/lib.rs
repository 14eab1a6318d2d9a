//! `tchtrain-fsdp` — FSDP options and sharded training on tchtrain-distributed.
//!
//! Owns the `--fsdp` / `fsdp_config` handling that follows `TrainingArguments`'
//! normalisation: [`fsdp_plugin_args`] (equal to upstream's `fsdp_plugin_args`), the typed
//! [`FsdpPlugin`] (full_shard / shard_grad_op / no_shard, offload, auto-wrap, FULL vs
//! SHARDED state dicts, cpu_ram_efficient_loading) and the Trainer's FSDP checks; and the
//! mapping of FSDP onto `tchtrain-accelerate`'s ZeRO engine ([`zero_stage_for`]: no_shard =
//! DDP, shard_grad_op = stage 2, full_shard = stage 3; [`auto_wrap_units`]: the wrapped
//! decoder layers). One engine serves both integrations: they differ in policy (which
//! stage, which units), not in mechanism.
//!
//! Mirrors upstream transformers' training_args.py `_process_fsdp_args` and trainer.py.

mod error;
mod plugin;
mod sharding;

pub use error::{Error, Result};
pub use plugin::{
    FSDP_AUTO_WRAP_POLICY, FSDP_STATE_DICT_TYPE, FsdpPlugin, ShardingStrategy, StateDictType,
    check_trainer_compat, fsdp_plugin_args,
};
pub use sharding::{auto_wrap_units, check_wrap_classes, zero_stage_for};

//! `tchtrain-fsdp` — FSDP sharding strategies and state dicts on tchtrain-distributed.
//!
//! Owns the `--fsdp` options and `fsdp_config` keys, full_shard / shard_grad_op / no_shard, and FULL / SHARDED state dicts.
//!
//! Mirrors upstream transformers' FSDP integration (training_args fsdp options, accelerate's FSDP plugin); names follow upstream so a transformers user finds each
//! concept where they expect it.

mod error;

pub use error::{Error, Result};

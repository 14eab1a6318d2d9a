//! `tchtrain-distributed` — process groups over libtorch's own c10d (Gloo on CPU) and the
//! torchrun environment.
//!
//! Owns the safe [`ProcessGroup`] over a small C++ shim to c10d (`csrc/c10d_shim.cpp`,
//! wrapped by the private `ffi` module, the only code that sees raw pointers): TCPStore
//! rendezvous from `RANK` / `WORLD_SIZE` / `MASTER_ADDR` / `MASTER_PORT`, then
//! all_reduce, reduce_scatter, all_gather, broadcast and barrier on tch tensors in place.
//! [`DistributedDataParallel`] averages gradients in buckets. NCCL (behind a `cuda`
//! feature) comes next.
//!
//! Mirrors upstream torch.distributed; names follow it so a PyTorch user finds each
//! concept where they expect it.

mod ddp;
mod env;
mod error;
mod ffi;
mod process_group;

pub use ddp::{DEFAULT_BUCKET_CAP_MB, DistributedDataParallel};
pub use env::DistributedEnv;
pub use error::{Error, Result};
pub use process_group::{DEFAULT_TIMEOUT, ProcessGroup, ReduceOp};

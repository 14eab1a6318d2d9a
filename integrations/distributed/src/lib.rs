//! `tchtrain-distributed` — process groups over libtorch's own c10d (Gloo on CPU, NCCL on
//! CUDA with the `cuda` feature) and the torchrun environment.
//!
//! Owns the safe [`ProcessGroup`] over a small C++ shim to c10d (`tchtrain-sys`'s `csrc/c10d.cpp`,
//! wrapped by the private `ffi` module, the only code that sees raw pointers): TCPStore
//! rendezvous from `RANK` / `WORLD_SIZE` / `MASTER_ADDR` / `MASTER_PORT`, then
//! all_reduce, reduce_scatter, all_gather, broadcast and barrier on tch tensors in place.
//! [`DistributedDataParallel`] averages gradients in buckets; [`ShardReducer`] reduces a
//! sharded engine's gradients in buckets during the backward.
//!
//! ## NCCL (the `cuda` feature)
//!
//! Built with `--features cuda`, the shim also compiles c10d's `ProcessGroupNCCL`
//! ([`ProcessGroup::new_nccl`], [`Backend::Nccl`]): one CUDA device per process
//! (`LOCAL_RANK`), collectives on tensors there. It needs a CUDA libtorch (the torch wheel
//! `cargo xtask setup` installs is one: `libtorch_cuda.so`, `libc10_cuda.so`) and the CUDA
//! and NCCL headers: `CUDA_HOME`'s toolkit, or the `nvidia-*` wheels beside torch
//! (`nvidia-cuda-runtime`, `nvidia-nccl-cu13`, which torch depends on, plus
//! `nvidia-cuda-crt` for `crt/host_config.h` and `nvidia-cuda-cccl` for `nv/target`, which
//! setup adds). `cargo xtask test` builds and tests this crate with the feature too; the
//! collectives on a GPU run with `cargo xtask test --gpu`. Without the feature, or without a
//! CUDA device for `LOCAL_RANK`, asking for NCCL is [`Error::BackendUnavailable`].
//!
//! Mirrors upstream torch.distributed; names follow it so a PyTorch user finds each
//! concept where they expect it.

mod ddp;
mod env;
mod error;
mod ffi;
mod process_group;
mod shard_reducer;

pub use ddp::{DEFAULT_BUCKET_CAP_MB, DEFAULT_FIRST_BUCKET_BYTES, DistributedDataParallel};
pub use env::DistributedEnv;
pub use error::{Error, Result};
pub use process_group::{Backend, DEFAULT_TIMEOUT, ProcessGroup, ReduceOp};
pub use shard_reducer::{BucketReduction, ShardReducer};

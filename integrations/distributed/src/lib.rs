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
//! ## NCCL: what compiling the shim needs (not built yet)
//!
//! A probe compiling `ProcessGroupNCCL` construction (`-DUSE_C10D_NCCL`, the flags of
//! `build.rs`, linking `torch_cuda` and `c10_cuda` from the torch wheel) against the setup
//! virtualenv found: `nccl.h` in the `nvidia-nccl-cu13` wheel (`nvidia/nccl/include`) and
//! `cuda_runtime.h` in `nvidia-cuda-runtime` (`nvidia/cu13/include`) are there, but
//! `cuda_runtime.h` includes `crt/host_config.h` (PyPI `nvidia-cuda-crt`; a copy exists
//! only inside triton's `backends/nvidia/include`) and `cuda_fp16.h` includes `nv/target`
//! (CCCL, PyPI `nvidia-cuda-cccl`), which nothing in the virtualenv provides. So the
//! `cuda` feature needs `nvidia-cuda-crt` and `nvidia-cuda-cccl` 13.0 added to setup's
//! requirements (the default build needs neither).
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

//! `tchtrain-distributed` — Process groups over libtorch's own c10d (Gloo on CPU, NCCL on GPU) and DDP.
//!
//! Owns process groups over libtorch's c10d through a small C++ shim, the torchrun environment, and DDP gradient all-reduce.
//!
//! Mirrors upstream torch.distributed and DistributedDataParallel; names follow upstream so a transformers user finds each
//! concept where they expect it.

mod error;

pub use error::{Error, Result};

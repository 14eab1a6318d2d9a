//! `tchtrain-optim` — Optimizers with exportable state and every transformers LR scheduler, on tch.
//!
//! Owns optimizers written over tensors with `state_dict()` / `load_state_dict()`, every `SchedulerType`, decay / no-decay parameter groups and global grad-norm clipping.
//!
//! Mirrors upstream transformers/optimization.py, trainer_optimizer.py and torch.optim; names follow upstream so a transformers user finds each
//! concept where they expect it.

mod error;

pub use error::{Error, Result};

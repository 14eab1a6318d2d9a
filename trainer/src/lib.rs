//! `tchtrain-trainer` — The Trainer loop of transformers 5.23 (trainer.py) on tch.
//!
//! Owns the `Trainer`: train / evaluate / predict, gradient accumulation, mixed precision, checkpoints and resume, and the example scripts.
//!
//! Mirrors upstream transformers/trainer.py; names follow upstream so a transformers user finds each
//! concept where they expect it.

mod error;

pub use error::{Error, Result};

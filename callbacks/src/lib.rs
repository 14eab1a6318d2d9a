//! `tchtrain-callbacks` — TrainerState, TrainerControl and TrainerCallback as in transformers 5.23 trainer_callback.py.
//!
//! Owns `TrainerState` (the exact `trainer_state.json` schema), `TrainerControl`, the `TrainerCallback` trait and the built-in callbacks and loggers.
//!
//! Mirrors upstream transformers/trainer_callback.py; names follow upstream so a transformers user finds each
//! concept where they expect it.

mod error;

pub use error::{Error, Result};

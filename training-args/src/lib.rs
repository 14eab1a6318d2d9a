//! `tchtrain-training-args` — TrainingArguments with Hugging Face's flag names, defaults and checks (transformers 5.23 training_args.py).
//!
//! Owns `TrainingArguments`, its defaults and `__post_init__` checks, JSON and command-line
//! parsing with upstream's flag names, and the strategy / scheduler / optimizer enums.
//! Does not depend on tch.
//!
//! Mirrors upstream transformers/training_args.py and the enums of trainer_utils.py; names
//! follow upstream so a transformers user finds each concept where they expect it.

mod error;
mod trainer_utils;
mod training_args;

pub use error::{Error, Result};
pub use trainer_utils::{IntervalStrategy, SaveStrategy};
pub use training_args::TrainingArguments;

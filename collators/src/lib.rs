//! `tchtrain-collators` — Every data collator of transformers 5.23 (data/data_collator.py) on tch.
//!
//! Owns the `DataCollator` trait, `Batch`, and the padding, language-modeling, seq2seq, token-classification and flattening collators.
//!
//! Mirrors upstream transformers/data/data_collator.py; names follow upstream so a transformers user finds each
//! concept where they expect it.

mod error;

pub use error::{Error, Result};

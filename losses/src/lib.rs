//! `tchtrain-losses` — The LOSS_MAPPING of transformers 5.23 (loss/loss_utils.py) on tch.
//!
//! Owns `fixed_cross_entropy` and the causal-LM, masked-LM, sequence / token classification and question-answering losses, normalised by `num_items_in_batch`.
//!
//! Mirrors upstream transformers/loss/loss_utils.py; names follow upstream so a transformers user finds each
//! concept where they expect it.

mod error;

pub use error::{Error, Result};

//! `tchtrain-deepspeed` — DeepSpeed JSON configs and ZeRO stages 1/2/3 on tchtrain-distributed.
//!
//! Owns DeepSpeed JSON config reading with `"auto"` fill and mismatch errors, and ZeRO stages 1, 2 and 3.
//!
//! Mirrors upstream transformers/integrations/deepspeed.py; names follow upstream so a transformers user finds each
//! concept where they expect it.

mod error;

pub use error::{Error, Result};

//! `tchtrain-trainer` — The Trainer loop of transformers 5.23 (trainer.py) on tch.
//!
//! Owns the `Trainer`: train / evaluate, gradient accumulation, checkpoints and resume,
//! and the data side it drives: [`Dataset`], [`Sampler`]s, the [`DataLoader`], and the
//! plain-text preparation of upstream's `run_clm.py` ([`group_texts`]).
//!
//! Mirrors upstream transformers/trainer.py (and trainer_pt_utils.py, trainer_utils.py);
//! names follow upstream so a transformers user finds each concept where they expect it.

mod data_loader;
mod dataset;
mod error;
mod sampler;
mod text;

pub use data_loader::{DataLoader, EpochIter, SharedCollator, shared_collator};
pub use dataset::{Dataset, InMemoryDataset};
pub use error::{Error, Result};
pub use sampler::{RandomSampler, Sampler, SequentialSampler, randperm};
pub use text::{
    DEFAULT_MAP_BATCH_SIZE, causal_lm_blocks_from_file, group_texts, load_text_lines, split_lines,
    tokenize_lines,
};

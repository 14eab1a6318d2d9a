//! `tchtrain-data` — `torch.utils.data` and accelerate's data loader for tchtrain.
//!
//! Owns the [`Dataset`] trait (map-style: a length and rows by index) with its in-memory
//! form [`InMemoryDataset`], the [`IterableDataset`] trait (a stream of rows, one pass per
//! epoch), the [`Sampler`]s (upstream's seeded random order reproduced exactly, sequential,
//! length-grouped), the [`DataLoader`] (batches collated by a shared collator, prefetched on
//! a background thread when asked), and accelerate's [`BatchSamplerShard`] (which batches
//! one process of a data-parallel run takes) and `skip_first_batches`
//! ([`EpochIter::skip_batches`]).
//!
//! Mirrors torch's `torch/utils/data/` and accelerate's `data_loader.py`; names follow
//! upstream so a user finds each concept where they expect it.
//!
//! ```
//! use std::sync::Arc;
//! use tchtrain_collators::DefaultDataCollator;
//! use tchtrain_data::{DataLoader, Feature, InMemoryDataset, SequentialSampler, shared_collator};
//! let rows = (0..5).map(|i| Feature::new(vec![i, i + 1])).collect::<Vec<_>>();
//! let loader = DataLoader::new(
//!     InMemoryDataset::new(rows).into_shared(),
//!     shared_collator(DefaultDataCollator),
//!     Arc::new(SequentialSampler),
//!     2,
//!     false,
//! )?;
//! assert_eq!(loader.len(), 3);
//! let first = loader.epoch(0).next().unwrap()?;
//! assert_eq!(first.get("input_ids").unwrap().size(), [2, 2]);
//! # Ok::<(), tchtrain_data::Error>(())
//! ```

mod data_loader;
mod dataset;
mod error;
mod sampler;
mod shard;
mod text_stream;

pub use data_loader::{DataLoader, EpochIter, Prefetch, SharedCollator, shared_collator};
pub use dataset::{Dataset, FeatureStream, InMemoryDataset, IterableDataset};
pub use error::{Error, Result};
pub use sampler::{
    LengthGroupedSampler, RandomSampler, Sampler, SequentialSampler, get_length_grouped_indices,
    randperm,
};
pub use shard::BatchSamplerShard;
pub use tchtrain_datasets::Feature;

//! The `Dataset` trait (upstream's map-style `torch.utils.data.Dataset`: a length and rows
//! by index) and its in-memory form, and the `IterableDataset` trait (a stream of rows read
//! as training goes, upstream's `IterableDataset` / `load_dataset(..., streaming=True)`).

use std::sync::Arc;

use tchtrain_datasets::Feature;

use crate::error::{Error, Result};

/// A map-style dataset: `len()` rows, each fetched by index as a tokenized [`Feature`]
/// (upstream's `__len__` / `__getitem__`).
///
/// `Send + Sync` so that a data loader can read rows from a background thread.
pub trait Dataset: Send + Sync {
    /// Number of rows.
    fn len(&self) -> usize;

    /// Row `index`; an index `>= len()` is [`Error::IndexOutOfRange`].
    fn get(&self, index: usize) -> Result<Feature>;

    /// Row `index`'s label alone (what the Trainer's label check reads): the row's, unless a
    /// dataset whose rows are made when fetched (random transforms drawing from the global
    /// generator, upstream's `set_transform`) can tell it without making the row.
    fn labels(&self, index: usize) -> Result<Option<tchtrain_datasets::Label>> {
        Ok(self.get(index)?.labels)
    }

    /// Whether the dataset has no rows.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A dataset held in memory as a vector of rows.
///
/// ```
/// use tchtrain_data::{Dataset, Feature, InMemoryDataset};
/// let ds = InMemoryDataset::new(vec![Feature::new(vec![1, 2]), Feature::new(vec![3])]);
/// assert_eq!(ds.len(), 2);
/// assert_eq!(ds.get(1)?.input_ids, [3]);
/// assert!(ds.get(2).is_err());
/// # Ok::<(), tchtrain_data::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InMemoryDataset {
    rows: Vec<Feature>,
}

impl InMemoryDataset {
    /// A dataset of `rows`.
    pub fn new(rows: Vec<Feature>) -> Self {
        Self { rows }
    }

    /// The rows.
    pub fn rows(&self) -> &[Feature] {
        &self.rows
    }

    /// The first `n` rows (all when `n >= len`), as upstream's `dataset.select(range(n))`
    /// used by the examples' `--max_train_samples`.
    pub fn take(&self, n: usize) -> Self {
        Self::new(self.rows.iter().take(n).cloned().collect())
    }

    /// Rows `start..end` (clamped to the length).
    pub fn slice(&self, start: usize, end: usize) -> Self {
        let end = end.min(self.rows.len());
        let start = start.min(end);
        Self::new(self.rows[start..end].to_vec())
    }

    /// This dataset behind a shared pointer (what a [`DataLoader`](crate::DataLoader) and
    /// the Trainer take).
    pub fn into_shared(self) -> Arc<dyn Dataset> {
        Arc::new(self)
    }
}

impl From<Vec<Feature>> for InMemoryDataset {
    fn from(rows: Vec<Feature>) -> Self {
        Self::new(rows)
    }
}

impl Dataset for InMemoryDataset {
    fn len(&self) -> usize {
        self.rows.len()
    }

    fn get(&self, index: usize) -> Result<Feature> {
        self.rows.get(index).cloned().ok_or(Error::IndexOutOfRange {
            index,
            len: self.rows.len(),
        })
    }
}

/// A shared dataset is a dataset (so a builder taking `impl Dataset` takes an
/// `Arc<dyn Dataset>` too).
impl<D: Dataset + ?Sized> Dataset for Arc<D> {
    fn len(&self) -> usize {
        (**self).len()
    }

    fn get(&self, index: usize) -> Result<Feature> {
        (**self).get(index)
    }

    fn labels(&self, index: usize) -> Result<Option<tchtrain_datasets::Label>> {
        (**self).labels(index)
    }
}

/// The rows of one pass over an [`IterableDataset`].
pub type FeatureStream = Box<dyn Iterator<Item = Result<Feature>> + Send>;

/// A dataset read as a stream (upstream's `IterableDataset`, e.g. `load_dataset(...,
/// streaming=True)`): rows in its own order, produced as the training consumes them, with no
/// length and no access by index. The Trainer then needs `max_steps` and starts a new pass
/// (a new "epoch") whenever the stream ends before it; samplers do not apply.
pub trait IterableDataset: Send + Sync {
    /// The rows of pass `epoch`, from the beginning (upstream: `set_epoch(epoch)`, then
    /// `__iter__`). Failing to open the source is an error here; a row that cannot be read is
    /// an error item.
    fn iter_epoch(&self, epoch: u64) -> Result<FeatureStream>;
}

/// A shared stream is a stream.
impl<D: IterableDataset + ?Sized> IterableDataset for Arc<D> {
    fn iter_epoch(&self, epoch: u64) -> Result<FeatureStream> {
        (**self).iter_epoch(epoch)
    }
}

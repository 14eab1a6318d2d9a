//! `DataLoader`: rows of a [`Dataset`] in a [`Sampler`]'s order, collated into [`Batch`]es
//! (torch's `DataLoader` with `batch_size`, `sampler`, `collate_fn`, `drop_last`).
//!
//! An epoch is an [`EpochIter`] that owns everything it needs (shared dataset, shared
//! collator, the epoch's index order), so [`EpochIter::prefetch`] can move it to a
//! background thread that reads and collates batches ahead of the training step (the
//! Trainer does so when `dataloader_num_workers > 0`, `dataloader_prefetch_factor` batches
//! ahead). Resuming skips batches by position without reading or collating them
//! (accelerate's `skip_first_batches`).

use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tch::{Device, Kind, Tensor};
use tchtrain_collators::{Batch, DataCollator, Feature};

use crate::dataset::{Dataset, FeatureStream, IterableDataset};
use crate::error::{Error, Result};
use crate::sampler::Sampler;
use crate::shard::BatchSamplerShard;

/// A collator shared between the data loaders of one Trainer (training and evaluation use
/// the same one, as upstream's `data_collator`).
pub type SharedCollator = Arc<Mutex<Box<dyn DataCollator<Feature> + Send>>>;

/// Wraps a collator for [`DataLoader::new`] (and the Trainer's builder).
pub fn shared_collator(collator: impl DataCollator<Feature> + Send + 'static) -> SharedCollator {
    Arc::new(Mutex::new(Box::new(collator)))
}

/// Where a [`DataLoader`]'s rows come from.
#[derive(Clone)]
enum Source {
    /// A map-style dataset, read in a sampler's order.
    Map {
        dataset: Arc<dyn Dataset>,
        sampler: Arc<dyn Sampler>,
    },
    /// A stream, read in its own order (no length, no sampler).
    Stream(Arc<dyn IterableDataset>),
}

/// Batches of a dataset in a sampler's order, or of a stream in its own order.
#[derive(Clone)]
pub struct DataLoader {
    source: Source,
    collator: SharedCollator,
    batch_size: usize,
    drop_last: bool,
    shard: Option<BatchSamplerShard>,
}

impl std::fmt::Debug for DataLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataLoader")
            .field("rows", &self.num_examples())
            .field("sampler", &self.sampler().map_or("stream", |s| s.name()))
            .field("batch_size", &self.batch_size)
            .field("drop_last", &self.drop_last)
            .finish()
    }
}

impl DataLoader {
    /// A loader of `batch_size` rows per batch; `drop_last` drops a last, smaller batch.
    /// A zero batch size is [`Error::InvalidArgument`].
    pub fn new(
        dataset: Arc<dyn Dataset>,
        collator: SharedCollator,
        sampler: Arc<dyn Sampler>,
        batch_size: usize,
        drop_last: bool,
    ) -> Result<Self> {
        Self::with_source(
            Source::Map { dataset, sampler },
            collator,
            batch_size,
            drop_last,
        )
    }

    fn with_source(
        source: Source,
        collator: SharedCollator,
        batch_size: usize,
        drop_last: bool,
    ) -> Result<Self> {
        if batch_size == 0 {
            return Err(Error::InvalidArgument {
                field: "batch_size",
                detail:
                    "must be at least 1 (per_device_train_batch_size / per_device_eval_batch_size)"
                        .into(),
            });
        }
        Ok(Self {
            source,
            collator,
            batch_size,
            drop_last,
            shard: None,
        })
    }

    /// A loader over a stream: `batch_size` rows per batch in the stream's order, each epoch
    /// a new pass; `drop_last` drops a last, smaller batch. It has no length
    /// ([`DataLoader::len`] is 0, [`DataLoader::is_stream`] is true).
    pub fn streaming(
        stream: Arc<dyn IterableDataset>,
        collator: SharedCollator,
        batch_size: usize,
        drop_last: bool,
    ) -> Result<Self> {
        Self::with_source(Source::Stream(stream), collator, batch_size, drop_last)
    }

    /// Whether this loader reads a stream (no length, no sampler).
    pub fn is_stream(&self) -> bool {
        matches!(self.source, Source::Stream(_))
    }

    /// This loader as seen by one process of a data-parallel run (accelerate's
    /// `prepare_data_loader`): each epoch yields only the process's batches, see
    /// [`BatchSamplerShard`].
    pub fn sharded(mut self, shard: BatchSamplerShard) -> Self {
        self.shard = Some(shard);
        self
    }

    /// The shard this loader yields, when it is one process's part of a data-parallel run.
    pub fn shard(&self) -> Option<BatchSamplerShard> {
        self.shard
    }

    /// Number of batches per epoch (`len(dataloader)`); 0 for a stream.
    pub fn len(&self) -> usize {
        let n = match &self.source {
            Source::Map { dataset, sampler } => sampler.num_samples(dataset.len()),
            Source::Stream(_) => 0,
        };
        let batches = if self.drop_last {
            n / self.batch_size
        } else {
            n.div_ceil(self.batch_size)
        };
        match self.shard {
            Some(shard) => shard.len(batches, self.drop_last),
            None => batches,
        }
    }

    /// Whether an epoch yields no batch.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of rows (upstream `num_examples(dataloader)`: the dataset's length); 0 for a
    /// stream.
    pub fn num_examples(&self) -> usize {
        match &self.source {
            Source::Map { dataset, .. } => dataset.len(),
            Source::Stream(_) => 0,
        }
    }

    /// Rows per batch.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// The sampler (`None` for a stream, which has its own order).
    pub fn sampler(&self) -> Option<&dyn Sampler> {
        match &self.source {
            Source::Map { sampler, .. } => Some(&**sampler),
            Source::Stream(_) => None,
        }
    }

    /// The batches of epoch `epoch`. Like torch's `DataLoader.__iter__`, this first draws the
    /// iterator's base seed from libtorch's global generator (`torch.empty((), dtype=int64)
    /// .random_()`), so that the draws that follow (a sampler using the global generator,
    /// dropout) see the generator in the state upstream's do.
    pub fn epoch(&self, epoch: u64) -> EpochIter {
        let _base_seed = Tensor::empty([] as [i64; 0], (Kind::Int64, Device::Cpu)).random_();
        let (dataset, sampler) = match &self.source {
            Source::Stream(stream) => {
                let rows = match stream.iter_epoch(epoch) {
                    Ok(rows) => EpochRows::Stream(rows),
                    Err(e) => EpochRows::Failed(Some(e)),
                };
                return EpochIter {
                    rows,
                    collator: Arc::clone(&self.collator),
                    batch_size: self.batch_size,
                    next_batch: 0,
                    drop_last: self.drop_last,
                };
            }
            Source::Map { dataset, sampler } => (dataset, sampler),
        };
        let mut order = sampler.indices(dataset.len(), epoch);
        if let Some(shard) = self.shard {
            // Every batch of a shard is full, so the concatenation cuts back into them.
            order = shard
                .batches(&order, self.batch_size, self.drop_last)
                .concat();
        } else if self.drop_last {
            order.truncate(self.len() * self.batch_size);
        }
        EpochIter {
            rows: EpochRows::Map {
                dataset: Arc::clone(dataset),
                order,
            },
            collator: Arc::clone(&self.collator),
            batch_size: self.batch_size,
            next_batch: 0,
            drop_last: self.drop_last,
        }
    }
}

/// The rows of one epoch: indices into a dataset, or a stream's pass.
enum EpochRows {
    /// The dataset and this epoch's indices, in order.
    Map {
        dataset: Arc<dyn Dataset>,
        order: Vec<usize>,
    },
    /// The rows of a stream's pass.
    Stream(FeatureStream),
    /// Opening the stream failed: yields that error once.
    Failed(Option<Error>),
    /// A stream that ended.
    Done,
}

/// The batches of one epoch, in order; each item is the collated [`Batch`] or the error
/// reading or collating it.
pub struct EpochIter {
    rows: EpochRows,
    collator: SharedCollator,
    batch_size: usize,
    next_batch: usize,
    drop_last: bool,
}

impl std::fmt::Debug for EpochIter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EpochIter")
            .field("batches", &self.num_batches())
            .field("next_batch", &self.next_batch)
            .finish()
    }
}

impl EpochIter {
    /// Number of batches in this epoch (0 for a stream: unknown).
    pub fn num_batches(&self) -> usize {
        self.order().len().div_ceil(self.batch_size)
    }

    /// Index of the next batch (batches already yielded or skipped).
    pub fn position(&self) -> usize {
        self.next_batch
    }

    /// The dataset indices of this epoch, in order (empty for a stream).
    pub fn order(&self) -> &[usize] {
        match &self.rows {
            EpochRows::Map { order, .. } => order,
            _ => &[],
        }
    }

    /// Skips `n` batches without reading them (accelerate's `skip_first_batches`); a
    /// stream's rows are read and dropped (not collated).
    pub fn skip_batches(&mut self, n: usize) {
        let batches = self.num_batches();
        match &mut self.rows {
            EpochRows::Map { .. } => self.next_batch = (self.next_batch + n).min(batches),
            EpochRows::Stream(rows) => {
                for _ in 0..n * self.batch_size {
                    if rows.next().is_none() {
                        break;
                    }
                }
                self.next_batch += n;
            }
            EpochRows::Failed(_) | EpochRows::Done => self.next_batch += n,
        }
    }

    /// The remaining batches, read and collated on a background thread at most `depth`
    /// batches ahead of the consumer (torch's `DataLoader` worker with `prefetch_factor`).
    /// Same batches in the same order as iterating `self`; the collator still runs one batch
    /// at a time. A collator that draws from libtorch's global generator (an unseeded MLM
    /// collator) then draws concurrently with the training step's dropout, so the masks
    /// depend on timing: seed such a collator when prefetching. If the thread cannot be
    /// started, the first item is [`Error::Prefetch`].
    pub fn prefetch(self, depth: usize) -> Prefetch {
        let (tx, rx): (SyncSender<Result<Batch>>, Receiver<Result<Batch>>) =
            sync_channel(depth.max(1));
        let spawned = std::thread::Builder::new()
            .name("tchtrain-prefetch".into())
            .spawn(move || {
                for item in self {
                    if tx.send(item).is_err() {
                        break;
                    }
                }
            });
        match spawned {
            Ok(handle) => Prefetch::Background {
                rx: Some(rx),
                handle: Some(handle),
            },
            // The closure (and with it the epoch) is gone: report it as the first item.
            Err(e) => Prefetch::Failed(Some(Err(Error::Prefetch(e.to_string())))),
        }
    }

    /// The next batch of a stream: up to `batch_size` rows (`None` at its end, or when
    /// `drop_last` and fewer are left).
    fn next_stream_batch(&mut self) -> Option<Result<Batch>> {
        let rows_iter = match &mut self.rows {
            EpochRows::Stream(rows) => rows,
            EpochRows::Failed(e) => return e.take().map(Err),
            EpochRows::Map { .. } | EpochRows::Done => return None,
        };
        let mut rows = Vec::with_capacity(self.batch_size);
        while rows.len() < self.batch_size {
            match rows_iter.next() {
                Some(Ok(row)) => rows.push(row),
                Some(Err(e)) => return Some(Err(e)),
                None => break,
            }
        }
        if rows.is_empty() || (self.drop_last && rows.len() < self.batch_size) {
            self.rows = EpochRows::Done;
            return None;
        }
        self.next_batch += 1;
        Some(self.collate_rows(&rows))
    }

    fn collate_rows(&self, rows: &[Feature]) -> Result<Batch> {
        // A poisoned lock only means another thread panicked mid-collate; the collator's
        // state is still a valid generator position, so keep going.
        let mut collator = self.collator.lock().unwrap_or_else(|e| e.into_inner());
        Ok(collator.collate(rows)?)
    }
}

impl Iterator for EpochIter {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Self::Item> {
        let EpochRows::Map { dataset, order } = &self.rows else {
            return self.next_stream_batch();
        };
        let start = self.next_batch * self.batch_size;
        if start >= order.len() {
            return None;
        }
        let end = (start + self.batch_size).min(order.len());
        self.next_batch += 1;
        let rows = order[start..end]
            .iter()
            .map(|&i| dataset.get(i))
            .collect::<Result<Vec<_>>>();
        Some(rows.and_then(|rows| self.collate_rows(&rows)))
    }
}

/// The batches of an epoch from [`EpochIter::prefetch`].
pub enum Prefetch {
    /// Produced by the background thread.
    Background {
        /// Batches, in order; `None` once dropped.
        rx: Option<Receiver<Result<Batch>>>,
        /// The thread, joined on drop.
        handle: Option<JoinHandle<()>>,
    },
    /// The thread could not be started: yields that error once.
    Failed(Option<Result<Batch>>),
}

impl std::fmt::Debug for Prefetch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Background { .. } => f.write_str("Prefetch::Background"),
            Self::Failed(_) => f.write_str("Prefetch::Failed"),
        }
    }
}

impl Iterator for Prefetch {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Self::Background { rx, .. } => rx.as_ref()?.recv().ok(),
            Self::Failed(err) => err.take(),
        }
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        if let Self::Background { rx, handle } = self {
            // Closing the channel makes the thread's next send fail; it then stops.
            drop(rx.take());
            if let Some(h) = handle.take()
                && h.join().is_err()
            {
                log::error!("the prefetch thread panicked");
            }
        }
    }
}

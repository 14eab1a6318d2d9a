//! Samplers: the order in which a data loader visits a dataset's rows in each epoch.
//!
//! Upstream's Trainer picks the sampler from `train_sampling_strategy`: `"sequential"` is
//! torch's `SequentialSampler`; `"random"` (the default) is torch's `RandomSampler`, which
//! accelerate (with its default `use_seedable_sampler=True`) replaces by a
//! `SeedableRandomSampler`: in epoch `e` the order is
//! `torch.randperm(n, generator=torch.Generator().manual_seed(seed + e))` with
//! `seed = data_seed or seed`. [`RandomSampler`] reproduces that order exactly: it runs
//! ATen's CPU `randperm` on [`TorchGenerator`], a bit-exact copy of torch's CPU generator.
//! The order depends only on the seed and the epoch (not on torch's global generator), so
//! a sampler needs no state of its own to resume: the trainer checkpoints the epoch and the
//! number of batches already drawn. `"group_by_length"` is upstream's
//! [`LengthGroupedSampler`], which draws from libtorch's global generator (seeded with `seed`
//! when the Trainer is built), as upstream's does.

use tch::{Device, Kind, Tensor};
use tchtrain_collators::TorchGenerator;

/// A sampler: the row indices of one epoch, a function of the dataset length and the epoch.
pub trait Sampler: Send + Sync {
    /// Upstream's name of this order (`"sequential"`, `"random"`); stored in checkpoints.
    fn name(&self) -> &str;

    /// The seed, for seeded samplers (stored in checkpoints and checked on resume).
    fn seed(&self) -> Option<u64> {
        None
    }

    /// The indices of epoch `epoch` over a dataset of `len` rows (each once, unless the
    /// sampler repeats rows: then [`num_samples`](Self::num_samples) of them).
    fn indices(&self, len: usize, epoch: u64) -> Vec<usize>;

    /// How many indices an epoch yields over a dataset of `len` rows (torch's
    /// `len(sampler)`): `len` unless the sampler repeats or drops rows.
    fn num_samples(&self, len: usize) -> usize {
        len
    }
}

/// torch's `SequentialSampler`: `0, 1, ..., len - 1` in every epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SequentialSampler;

impl Sampler for SequentialSampler {
    fn name(&self) -> &str {
        "sequential"
    }

    fn indices(&self, len: usize, _epoch: u64) -> Vec<usize> {
        (0..len).collect()
    }
}

/// accelerate's `SeedableRandomSampler` (upstream's default training order): a fresh
/// permutation per epoch from `torch.Generator().manual_seed(seed + epoch)`.
///
/// ```
/// use tchtrain_data::{RandomSampler, Sampler};
/// // torch.randperm(10, generator=torch.Generator().manual_seed(42)).tolist()
/// assert_eq!(RandomSampler::new(42).indices(10, 0), [2, 6, 1, 8, 4, 5, 0, 9, 3, 7]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RandomSampler {
    seed: u64,
}

impl RandomSampler {
    /// A sampler seeded with `seed` (the Trainer passes `data_seed`, else `seed`).
    pub fn new(seed: u64) -> Self {
        Self { seed }
    }
}

impl Sampler for RandomSampler {
    fn name(&self) -> &str {
        "random"
    }

    fn seed(&self) -> Option<u64> {
        Some(self.seed)
    }

    fn indices(&self, len: usize, epoch: u64) -> Vec<usize> {
        let mut g = TorchGenerator::new(self.seed.wrapping_add(epoch));
        randperm(len, &mut g)
    }
}

/// `torch.randperm(n, generator=g)` on CPU, as ATen 2.13's `randperm_cpu`: for
/// `n < u32::MAX / 20`, a Fisher-Yates shuffle of `0..n` drawing `random() % (n - i)`;
/// above that, the no-initialisation variant drawing `random64() % (i + 1)`.
pub fn randperm(n: usize, g: &mut TorchGenerator) -> Vec<usize> {
    if (n as u64) < u64::from(u32::MAX / 20) {
        let mut r: Vec<usize> = (0..n).collect();
        for i in 0..n.saturating_sub(1) {
            let z = (u64::from(g.random()) % (n - i) as u64) as usize;
            r.swap(i, z + i);
        }
        r
    } else {
        let mut r = vec![0usize; n];
        for i in 0..n {
            let z = (g.random64() % (i as u64 + 1)) as usize;
            r[i] = r[z];
            r[z] = i;
        }
        r
    }
}

/// Upstream `LengthGroupedSampler` (`train_sampling_strategy="group_by_length"`): rows of
/// similar length together, with some randomness, so that batches carry less padding.
/// Each epoch draws `torch.randperm(len)` from libtorch's **global** generator (upstream
/// passes no generator), then orders it with [`get_length_grouped_indices`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LengthGroupedSampler {
    batch_size: usize,
    lengths: Vec<usize>,
}

impl LengthGroupedSampler {
    /// A sampler over rows of the given `lengths` for batches of `batch_size` rows (the
    /// Trainer passes `train_batch_size * gradient_accumulation_steps`).
    pub fn new(batch_size: usize, lengths: Vec<usize>) -> Self {
        Self {
            batch_size: batch_size.max(1),
            lengths,
        }
    }

    /// The lengths of `dataset`'s rows (their `input_ids`), as upstream infers them.
    pub fn from_dataset(batch_size: usize, dataset: &dyn crate::Dataset) -> crate::Result<Self> {
        let lengths = (0..dataset.len())
            .map(|i| Ok(dataset.get(i)?.input_ids.len()))
            .collect::<crate::Result<Vec<_>>>()?;
        Ok(Self::new(batch_size, lengths))
    }
}

impl Sampler for LengthGroupedSampler {
    fn name(&self) -> &str {
        "group_by_length"
    }

    fn indices(&self, len: usize, _epoch: u64) -> Vec<usize> {
        let perm: Vec<usize> = Tensor::randperm(len as i64, (Kind::Int64, Device::Cpu))
            .iter::<i64>()
            .map(|it| it.map(|i| i as usize).collect())
            .unwrap_or_else(|_| (0..len).collect());
        if self.lengths.len() != len {
            log::warn!(
                "group_by_length: {} lengths for {len} rows; using the random order",
                self.lengths.len()
            );
            return perm;
        }
        get_length_grouped_indices(&self.lengths, self.batch_size, None, &perm)
    }
}

/// Upstream `get_length_grouped_indices` with the permutation already drawn: `perm` cut
/// into megabatches of `mega_batch_mult * batch_size` (default `min(len / (4 * batch_size),
/// 50)`, at least 1), each sorted by decreasing length (stably, as Python's
/// `sorted(reverse=True)`), and the longest row of all moved to the front (swapped with the
/// first megabatch's first row) so that an out-of-memory shows at the first step.
pub fn get_length_grouped_indices(
    lengths: &[usize],
    batch_size: usize,
    mega_batch_mult: Option<usize>,
    perm: &[usize],
) -> Vec<usize> {
    let batch_size = batch_size.max(1);
    let mult = mega_batch_mult
        .unwrap_or_else(|| (lengths.len() / (batch_size * 4)).min(50))
        .max(1);
    let mut megabatches: Vec<Vec<usize>> = perm
        .chunks(mult * batch_size)
        .map(|chunk| {
            let mut m = chunk.to_vec();
            m.sort_by(|&a, &b| lengths[b].cmp(&lengths[a]));
            m
        })
        .collect();
    if megabatches.is_empty() {
        return Vec::new();
    }
    // torch.argmax: the first megabatch holding the maximum.
    let mut max_idx = 0;
    for (i, m) in megabatches.iter().enumerate() {
        if lengths[m[0]] > lengths[megabatches[max_idx][0]] {
            max_idx = i;
        }
    }
    if max_idx != 0 {
        let longest = megabatches[max_idx][0];
        megabatches[max_idx][0] = megabatches[0][0];
        megabatches[0][0] = longest;
    }
    megabatches.concat()
}

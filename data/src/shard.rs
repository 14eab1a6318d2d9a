//! `BatchSamplerShard`: which batches of an epoch one process of a data-parallel run takes,
//! exactly as accelerate's `BatchSamplerShard` (`split_batches=False`, `even_batches=True`,
//! the Trainer's setting) in accelerate's `data_loader.py`.
//!
//! The global batches are the sampler's order cut into `batch_size` rows (the last one
//! shorter unless `drop_last`); every process computes the same order (the sampler is
//! seeded), and process `p` of `n` takes batches `p, p + n, p + 2n, ...`. A group of `n`
//! batches is handed out only when its last batch is full, so every process sees the same
//! number of full batches:
//!
//! * `drop_last`: an incomplete last group is dropped;
//! * otherwise the missing batches (and the missing rows of a short last batch) are filled
//!   by cycling through the indices of the first `n` batches, as accelerate does.

/// accelerate's `BatchSamplerShard` for process `process_index` of `num_processes`.
///
/// ```
/// use tchtrain_data::BatchSamplerShard;
/// // 10 rows, batches of 2 -> [0,1] [2,3] [4,5] [6,7] [8,9]; 3 processes.
/// let order: Vec<usize> = (0..10).collect();
/// let shard = BatchSamplerShard::new(3, 1);
/// // Process 1 takes batches 1 and 4; the 6th batch (for process 2) wraps around to [0, 1].
/// assert_eq!(shard.batches(&order, 2, false), vec![vec![2, 3], vec![8, 9]]);
/// assert_eq!(BatchSamplerShard::new(3, 2).batches(&order, 2, false), vec![vec![4, 5], vec![0, 1]]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSamplerShard {
    num_processes: usize,
    process_index: usize,
}

impl BatchSamplerShard {
    /// The shard of process `process_index` (0-based) among `num_processes` (at least 1;
    /// an index past the end is clamped to the last process).
    pub fn new(num_processes: usize, process_index: usize) -> Self {
        let num_processes = num_processes.max(1);
        Self {
            num_processes,
            process_index: process_index.min(num_processes - 1),
        }
    }

    /// Number of processes.
    pub fn num_processes(&self) -> usize {
        self.num_processes
    }

    /// This process's index.
    pub fn process_index(&self) -> usize {
        self.process_index
    }

    /// accelerate's `len(BatchSamplerShard)`: the batches each process gets out of
    /// `total_batches` global ones.
    pub fn len(&self, total_batches: usize, drop_last: bool) -> usize {
        let n = self.num_processes;
        if total_batches.is_multiple_of(n) || drop_last {
            total_batches / n
        } else {
            total_batches / n + 1
        }
    }

    /// This process's batches of one epoch whose global order is `order` (accelerate's
    /// `_iter_with_no_split` with `even_batches=True`). Every batch has `batch_size` rows.
    pub fn batches(&self, order: &[usize], batch_size: usize, drop_last: bool) -> Vec<Vec<usize>> {
        let n = self.num_processes;
        let p = self.process_index;
        let bs = batch_size.max(1);
        let mut global: Vec<Vec<usize>> = order.chunks(bs).map(<[usize]>::to_vec).collect();
        if drop_last && global.last().is_some_and(|b| b.len() < bs) {
            global.pop();
        }
        let mut out = Vec::new();
        let mut initial: Vec<usize> = Vec::new();
        let mut pending: Option<usize> = None;
        for (idx, batch) in global.iter().enumerate() {
            if !drop_last && idx < n {
                initial.extend_from_slice(batch);
            }
            if idx % n == p {
                pending = Some(idx);
            }
            if idx % n == n - 1
                && batch.len() == bs
                && let Some(i) = pending.take()
            {
                out.push(global[i].clone());
            }
        }
        if drop_last || initial.is_empty() {
            return out;
        }
        if let Some(i) = pending
            && global[i].len() == bs
        {
            out.push(global[i].clone());
        }
        while initial.len() < n * bs {
            initial.extend_from_within(..);
        }
        // `idx` and `batch` of upstream's loop after its last iteration.
        let mut idx = global.len() - 1;
        let mut batch: Vec<usize> = global[idx].clone();
        if batch.len() == bs {
            batch.clear();
            idx += 1;
        }
        let mut cycle = 0usize;
        while !idx.is_multiple_of(n) || !batch.is_empty() {
            let end = cycle + bs - batch.len();
            batch.extend_from_slice(&initial[cycle..end]);
            if idx % n == p {
                out.push(std::mem::take(&mut batch));
            }
            cycle = end;
            batch.clear();
            idx += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(len: usize, bs: usize, n: usize, drop_last: bool) -> Vec<Vec<Vec<usize>>> {
        let order: Vec<usize> = (0..len).collect();
        (0..n)
            .map(|p| BatchSamplerShard::new(n, p).batches(&order, bs, drop_last))
            .collect()
    }

    /// Expected values printed by accelerate's own `BatchSamplerShard` over torch's
    /// `BatchSampler(range(len), bs, drop_last)` (the cases of its test_data_loader.py).
    #[test]
    fn matches_accelerate_test_cases() {
        // A round multiple of total batch size.
        assert_eq!(
            all(24, 3, 2, false),
            [
                vec![
                    vec![0, 1, 2],
                    vec![6, 7, 8],
                    vec![12, 13, 14],
                    vec![18, 19, 20]
                ],
                vec![
                    vec![3, 4, 5],
                    vec![9, 10, 11],
                    vec![15, 16, 17],
                    vec![21, 22, 23]
                ],
            ]
        );
        // Round multiple of batch size but not of total batch size: wraps to the start.
        assert_eq!(
            all(21, 3, 2, false),
            [
                vec![
                    vec![0, 1, 2],
                    vec![6, 7, 8],
                    vec![12, 13, 14],
                    vec![18, 19, 20]
                ],
                vec![
                    vec![3, 4, 5],
                    vec![9, 10, 11],
                    vec![15, 16, 17],
                    vec![0, 1, 2]
                ],
            ]
        );
        assert_eq!(
            all(21, 3, 2, true),
            [
                vec![vec![0, 1, 2], vec![6, 7, 8], vec![12, 13, 14]],
                vec![vec![3, 4, 5], vec![9, 10, 11], vec![15, 16, 17]],
            ]
        );
        // Not a round multiple of batch size, last batch on process 0 is short.
        assert_eq!(
            all(22, 3, 2, false),
            [
                vec![
                    vec![0, 1, 2],
                    vec![6, 7, 8],
                    vec![12, 13, 14],
                    vec![18, 19, 20]
                ],
                vec![
                    vec![3, 4, 5],
                    vec![9, 10, 11],
                    vec![15, 16, 17],
                    vec![21, 0, 1]
                ],
            ]
        );
        // The short last batch starts a new group: both processes get padded batches.
        assert_eq!(
            all(20, 3, 2, false),
            [
                vec![
                    vec![0, 1, 2],
                    vec![6, 7, 8],
                    vec![12, 13, 14],
                    vec![18, 19, 0]
                ],
                vec![
                    vec![3, 4, 5],
                    vec![9, 10, 11],
                    vec![15, 16, 17],
                    vec![1, 2, 3]
                ],
            ]
        );
        assert_eq!(
            all(20, 3, 2, true),
            [
                vec![vec![0, 1, 2], vec![6, 7, 8], vec![12, 13, 14]],
                vec![vec![3, 4, 5], vec![9, 10, 11], vec![15, 16, 17]],
            ]
        );
        // Very small dataset.
        assert_eq!(
            all(2, 3, 2, false),
            [vec![vec![0, 1, 0]], vec![vec![1, 0, 1]]]
        );
        assert_eq!(all(2, 3, 2, true), [Vec::<Vec<usize>>::new(), Vec::new()]);
    }

    #[test]
    fn len_matches_the_batches() {
        for len in 1..30usize {
            for bs in 1..5 {
                for n in 1..4 {
                    for drop_last in [false, true] {
                        let total = if drop_last {
                            len / bs
                        } else {
                            len.div_ceil(bs)
                        };
                        for (p, batches) in all(len, bs, n, drop_last).iter().enumerate() {
                            let s = BatchSamplerShard::new(n, p);
                            assert_eq!(
                                batches.len(),
                                s.len(total, drop_last),
                                "{len} {bs} {n} {p}"
                            );
                            assert!(batches.iter().all(|b| b.len() == bs));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn one_process_is_the_plain_batching() {
        let order: Vec<usize> = (0..7).rev().collect();
        let s = BatchSamplerShard::new(1, 0);
        // A short last batch is completed from the start of the epoch (even_batches).
        assert_eq!(
            s.batches(&order, 3, false),
            vec![vec![6, 5, 4], vec![3, 2, 1], vec![0, 6, 5]]
        );
    }
}

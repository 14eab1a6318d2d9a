//! TRL's `pack_dataset` (`trl/data_utils.py`): tokenized rows packed into rows of at most
//! `seq_length` tokens, so that short documents stop wasting a padded block. Feed the
//! packed rows to a padding-free collator whose `position_ids` restart at each document
//! (`seq_lengths`), and the models' packed-sequence detection keeps the documents apart.
//!
//! As TRL runs it through `datasets.map(batched=True)`, the rows are packed batch by batch
//! (`batch_size` rows each, `datasets`' default 1000): no packed row spans two batches.

use std::collections::{HashMap, VecDeque};
use std::str::FromStr;

use crate::error::{Error, Result};

/// `pack_dataset`'s `strategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackingStrategy {
    /// `"bfd"`: Best Fit Decreasing; a row longer than `seq_length` is truncated (its
    /// overflow dropped), document boundaries are kept (`seq_lengths`).
    Bfd,
    /// `"bfd_split"`: as `Bfd`, a longer row split into `seq_length` pieces (the last
    /// shorter), each packed as a document of its own: no token is lost.
    BfdSplit,
    /// `"wrapped"`: every row concatenated and cut every `seq_length` tokens, boundaries
    /// ignored (no `seq_lengths`).
    Wrapped,
}

impl FromStr for PackingStrategy {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "bfd" => Ok(Self::Bfd),
            "bfd_split" => Ok(Self::BfdSplit),
            "wrapped" => Ok(Self::Wrapped),
            other => Err(Error::InvalidArgument {
                field: "packing_strategy",
                detail: format!(
                    "Invalid packing strategy '{other}', must be one of ('bfd', 'bfd_split', 'wrapped'). (TRL's message)"
                ),
            }),
        }
    }
}

/// Packed rows: `columns[c][row]` the packed values of column `c` (in the order given),
/// and, for the BFD strategies, `seq_lengths[row]` the lengths of the documents the row
/// holds, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packed {
    /// Per column, the packed rows.
    pub columns: Vec<Vec<Vec<i64>>>,
    /// Per packed row, its documents' lengths (`None` for `Wrapped`).
    pub seq_lengths: Option<Vec<Vec<i64>>>,
}

/// TRL's `pack_dataset(dataset, seq_length, strategy, map_kwargs={"batch_size": ...})` on
/// list columns: `columns[c][row]` is row `row` of column `c` (`input_ids`,
/// `attention_mask`, `labels`, ...), every column's row as long as the first column's.
/// Rows are packed `batch_size` at a time.
pub fn pack_dataset(
    columns: &[Vec<Vec<i64>>],
    seq_length: usize,
    strategy: PackingStrategy,
    batch_size: usize,
) -> Result<Packed> {
    let rows = check_columns(columns)?;
    if seq_length == 0 || batch_size == 0 {
        return Err(Error::InvalidArgument {
            field: if seq_length == 0 {
                "seq_length"
            } else {
                "batch_size"
            },
            detail: "must be at least 1".into(),
        });
    }
    let mut out = Packed {
        columns: vec![Vec::new(); columns.len()],
        seq_lengths: (strategy != PackingStrategy::Wrapped).then(Vec::new),
    };
    let mut start = 0;
    while start < rows {
        let end = (start + batch_size).min(rows);
        let batch: Vec<&[Vec<i64>]> = columns.iter().map(|c| &c[start..end]).collect();
        match strategy {
            PackingStrategy::Wrapped => pack_wrapped(&batch, seq_length, &mut out),
            _ => pack_bfd(
                &batch,
                seq_length,
                strategy == PackingStrategy::BfdSplit,
                &mut out,
            ),
        }
        start = end;
    }
    Ok(out)
}

/// TRL's `_check_if_columns_can_be_packed`: list columns of equal row lengths.
fn check_columns(columns: &[Vec<Vec<i64>>]) -> Result<usize> {
    let first = columns.first().ok_or(Error::InvalidArgument {
        field: "columns",
        detail: "no column to pack".into(),
    })?;
    for (c, column) in columns.iter().enumerate() {
        let same = column.len() == first.len()
            && column.iter().zip(first).all(|(a, b)| a.len() == b.len());
        if !same {
            return Err(Error::InvalidArgument {
                field: "columns",
                detail: format!(
                    "All columns must have values of the same length. (TRL's message): column {c} differs from column 0"
                ),
            });
        }
    }
    Ok(first.len())
}

/// TRL's `_SegmentTree`: the largest value in each subtree of the values `1..=maxval`
/// present, to find the smallest present value at least as large as a query.
struct SegmentTree {
    size: usize,
    tree: Vec<usize>,
}

impl SegmentTree {
    fn new(maxval: usize) -> Self {
        let size = (maxval).next_power_of_two();
        Self {
            size,
            tree: vec![0; 2 * size],
        }
    }

    fn set(&mut self, val: usize, present: bool) {
        let mut i = self.size + val - 1;
        self.tree[i] = if present { val } else { 0 };
        while i > 1 {
            i >>= 1;
            self.tree[i] = self.tree[2 * i].max(self.tree[2 * i + 1]);
        }
    }

    /// The leaf the search for `val` ends at: the smallest present value `>= val`.
    fn search(&self, val: usize) -> usize {
        let mut i = 1;
        while i < self.size {
            i = if self.tree[2 * i] >= val {
                2 * i
            } else {
                2 * i + 1
            };
        }
        self.tree[i]
    }
}

/// TRL's `_pack_bfd` on one batch.
fn pack_bfd(batch: &[&[Vec<i64>]], seq_length: usize, split: bool, out: &mut Packed) {
    // Empty rows are dropped; each row truncated, or split into `seq_length` pieces.
    let mut docs: Vec<(usize, usize, usize)> = Vec::new(); // (row, start, len)
    for (row, values) in batch[0].iter().enumerate() {
        let len = values.len();
        if len == 0 {
            continue;
        }
        if split {
            let mut start = 0;
            while start < len {
                docs.push((row, start, seq_length.min(len - start)));
                start += seq_length;
            }
        } else {
            docs.push((row, 0, len.min(seq_length)));
        }
    }
    // Longest first; equal lengths keep their order (Arrow's sort is stable).
    let mut order: Vec<usize> = (0..docs.len()).collect();
    order.sort_by(|&a, &b| docs[b].2.cmp(&docs[a].2));
    let mut tree = SegmentTree::new(seq_length);
    tree.set(seq_length, true);
    let mut space_to_bin: HashMap<usize, VecDeque<usize>> = HashMap::new();
    let mut bins: Vec<(Vec<usize>, usize)> = Vec::new(); // (docs, length)
    for idx in order {
        let length = docs[idx].2;
        let space = tree.search(length);
        let bin = if space < seq_length {
            space_to_bin
                .get_mut(&space)
                .and_then(VecDeque::pop_front)
                .unwrap_or_default()
        } else {
            bins.push((Vec::new(), 0));
            bins.len() - 1
        };
        bins[bin].0.push(idx);
        bins[bin].1 += length;
        if space < seq_length && space_to_bin.get(&space).is_none_or(VecDeque::is_empty) {
            tree.set(space, false);
        }
        let left = space - length;
        space_to_bin.entry(left).or_default().push_back(bin);
        if left > 0 {
            tree.set(left, true);
        }
    }
    let lengths = out.seq_lengths.get_or_insert_with(Vec::new);
    for (members, _) in &bins {
        for (c, column) in batch.iter().enumerate() {
            let mut packed = Vec::new();
            for &d in members {
                let (row, start, len) = docs[d];
                packed.extend_from_slice(&column[row][start..start + len]);
            }
            out.columns[c].push(packed);
        }
        lengths.push(members.iter().map(|&d| docs[d].2 as i64).collect());
    }
}

/// TRL's `_pack_wrapped` on one batch.
fn pack_wrapped(batch: &[&[Vec<i64>]], seq_length: usize, out: &mut Packed) {
    for (c, column) in batch.iter().enumerate() {
        let all: Vec<i64> = column.iter().flatten().copied().collect();
        out.columns[c].extend(all.chunks(seq_length).map(<[i64]>::to_vec));
    }
}

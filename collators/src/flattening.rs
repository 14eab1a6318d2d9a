//! `DataCollatorWithFlattening`: padding-free batches, every row concatenated into one
//! sequence with restarting `position_ids` and FlashAttention's sequence boundaries.

use tch::Tensor;

use crate::batch::Batch;
use crate::data_collator::DataCollator;
use crate::error::{Error, Result};
use tchtrain_datasets::{Feature, Label};

/// Concatenates the batch into one `[1, total_tokens]` row (upstream's
/// `DataCollatorWithFlattening`). A packed row (a [`Feature`] with `seq_lengths`, from
/// [`pack_dataset`](tchtrain_datasets::pack_dataset)) counts as its documents, each with its
/// own positions and separator label: TRL's `DataCollatorForLanguageModeling(padding_free=True)`
/// on packed rows.
///
/// Returns `input_ids` and `labels` (int64 `[1, T]`; each row's first label is replaced
/// by `separator_id`, the labels being the row's own [`Label::Ids`] or its input ids),
/// `position_ids` (int64 `[1, T]`, restarting at `position_ids_start`) when
/// `return_position_ids`, `seq_idx` (int32 `[1, T]`) when `return_seq_idx`, and
/// `cu_seq_lens_q` / `cu_seq_lens_k` (int32 `[rows + 1]`) with the plain integers
/// `max_length_q` / `max_length_k` ([`Batch::int`]) when `return_flash_attn_kwargs`.
///
/// ```
/// use tchtrain_collators::{DataCollator, DataCollatorWithFlattening, Feature};
/// let mut collator = DataCollatorWithFlattening { return_flash_attn_kwargs: true, ..Default::default() };
/// let batch = collator.collate(&[Feature::new(vec![5, 6, 7]), Feature::new(vec![8, 9])])?;
/// assert_eq!(Vec::<i64>::try_from(batch.get("position_ids").unwrap().get(0))?, [0, 1, 2, 0, 1]);
/// assert_eq!(Vec::<i64>::try_from(batch.get("labels").unwrap().get(0))?, [-100, 6, 7, -100, 9]);
/// assert_eq!(Vec::<i32>::try_from(batch.get("cu_seq_lens_q").unwrap())?, [0, 3, 5]);
/// assert_eq!(batch.int("max_length_q"), Some(3));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataCollatorWithFlattening {
    /// Return `position_ids` (upstream default true).
    pub return_position_ids: bool,
    /// The label put at each row's first position (upstream default -100).
    pub separator_id: i64,
    /// Return `cu_seq_lens_q/k` and `max_length_q/k` (upstream default false).
    pub return_flash_attn_kwargs: bool,
    /// Return `seq_idx` (upstream default false).
    pub return_seq_idx: bool,
    /// The position id of each row's first token (upstream default 0; RoBERTa-like
    /// models start at `padding_idx + 1`).
    pub position_ids_start: i64,
}

impl Default for DataCollatorWithFlattening {
    fn default() -> Self {
        Self {
            return_position_ids: true,
            separator_id: -100,
            return_flash_attn_kwargs: false,
            return_seq_idx: false,
            position_ids_start: 0,
        }
    }
}

impl DataCollator for DataCollatorWithFlattening {
    fn collate(&mut self, features: &[Feature]) -> Result<Batch> {
        let first = features.first().ok_or(Error::EmptyBatch)?;
        let labels_provided = first.labels.is_some();
        let mut input_ids = Vec::new();
        let mut labels = Vec::new();
        let mut position_ids = Vec::new();
        let mut seq_idx = Vec::new();
        let mut cu_seq_lens = vec![0i32];
        let mut max_length = 0usize;
        for (index, f) in features.iter().enumerate() {
            let n = f.input_ids.len();
            let documents = documents(index, f)?;
            let source = if labels_provided {
                match &f.labels {
                    Some(Label::Ids(l)) => l,
                    _ => {
                        return Err(Error::LabelKind {
                            index,
                            expected: "a sequence of ids like the first row's",
                        });
                    }
                }
            } else {
                &f.input_ids
            };
            if source.len() != n {
                return Err(Error::LabelLengthMismatch {
                    index,
                    label_len: source.len(),
                    seq_len: n,
                });
            }
            input_ids.extend_from_slice(&f.input_ids);
            let mut at = 0;
            for len in documents {
                let doc = &source[at..at + len];
                at += len;
                if len == 0 {
                    continue;
                }
                labels.push(self.separator_id);
                labels.extend_from_slice(&doc[1..]);
                position_ids.extend((0..len as i64).map(|i| self.position_ids_start + i));
                seq_idx.extend(std::iter::repeat_n((cu_seq_lens.len() - 1) as i32, len));
                cu_seq_lens.push(cu_seq_lens[cu_seq_lens.len() - 1] + len as i32);
                max_length = max_length.max(len);
            }
        }
        let row =
            |v: &[i64]| -> Result<Tensor> { Ok(Tensor::f_from_slice(v)?.f_reshape([1, -1])?) };
        let mut batch = Batch::new();
        batch.insert("input_ids", row(&input_ids)?);
        batch.insert("labels", row(&labels)?);
        if self.return_position_ids {
            batch.insert("position_ids", row(&position_ids)?);
        }
        if self.return_seq_idx {
            batch.insert(
                "seq_idx",
                Tensor::f_from_slice(&seq_idx)?.f_reshape([1, -1])?,
            );
        }
        if self.return_flash_attn_kwargs {
            batch.insert("cu_seq_lens_q", Tensor::f_from_slice(&cu_seq_lens)?);
            batch.insert("cu_seq_lens_k", Tensor::f_from_slice(&cu_seq_lens)?);
            batch.insert_int("max_length_q", max_length as i64);
            batch.insert_int("max_length_k", max_length as i64);
        }
        Ok(batch)
    }
}

/// The lengths of the documents feature `index` holds: its `seq_lengths` (a packed row;
/// empty documents hold no token, as TRL's `arange(0)`), else the whole row, which must not
/// be empty.
fn documents(index: usize, f: &Feature) -> Result<Vec<usize>> {
    let n = f.input_ids.len();
    match &f.seq_lengths {
        None if n == 0 => Err(Error::EmptySequence { index }),
        None => Ok(vec![n]),
        Some(lengths) => {
            let total = lengths.iter().try_fold(0u64, |sum, &l| {
                u64::try_from(l).ok().and_then(|l| sum.checked_add(l))
            });
            let valid = total == Some(n as u64);
            if !valid || n == 0 {
                return Err(Error::SeqLengthsMismatch {
                    index,
                    seq_lengths: lengths.clone(),
                    input_len: n,
                });
            }
            Ok(lengths.iter().map(|&l| l as usize).collect())
        }
    }
}

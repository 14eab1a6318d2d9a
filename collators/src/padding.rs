//! Padding: `PaddingStrategy`, `PaddingSide`, upstream's `tokenizer.pad` on rows of
//! token ids, and `DataCollatorWithPadding`.

use tch::Tensor;

use crate::batch::Batch;
use crate::data_collator::DataCollator;
use crate::error::{Error, Result};
use crate::tokenizer_info::TokenizerInfo;
use tchtrain_datasets::{Feature, Label};

/// How to pad a batch (upstream's `PaddingStrategy`, or `padding=True/False/str`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PaddingStrategy {
    /// `True` / `"longest"`: pad to the longest row of the batch.
    #[default]
    Longest,
    /// `"max_length"`: pad to `max_length` (or the tokenizer's `model_max_length`; when
    /// neither is known, no padding, as upstream).
    MaxLength,
    /// `False` / `"do_not_pad"`: no padding (rows must then have equal lengths).
    DoNotPad,
}

/// Which side padding goes on (`tokenizer.padding_side`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PaddingSide {
    /// Pad after the tokens (BERT, GPT-2, Llama for training).
    #[default]
    Right,
    /// Pad before the tokens (decoder-only generation).
    Left,
}

/// Rows padded by [`pad_features`]; per-token fields absent from the first row are `None`.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct PaddedRows {
    pub input_ids: Vec<Vec<i64>>,
    pub token_type_ids: Option<Vec<Vec<i64>>>,
    pub attention_mask: Option<Vec<Vec<i64>>>,
    pub special_tokens_mask: Option<Vec<Vec<i64>>>,
    pub offset_mapping: Option<Vec<Vec<(i64, i64)>>>,
    pub start_positions: Option<Vec<i64>>,
    pub end_positions: Option<Vec<i64>>,
}

impl PaddedRows {
    /// The tensors, in upstream's key order (`input_ids`, `token_type_ids`,
    /// `attention_mask`, `special_tokens_mask`, `offset_mapping`), then question
    /// answering's `start_positions` / `end_positions` as int64 `[batch]`.
    pub fn into_batch(self) -> Result<Batch> {
        let mut batch = Batch::new();
        batch.insert("input_ids", stack_i64("input_ids", &self.input_ids)?);
        if let Some(rows) = &self.token_type_ids {
            batch.insert("token_type_ids", stack_i64("token_type_ids", rows)?);
        }
        if let Some(rows) = &self.attention_mask {
            batch.insert("attention_mask", stack_i64("attention_mask", rows)?);
        }
        if let Some(rows) = &self.special_tokens_mask {
            batch.insert(
                "special_tokens_mask",
                stack_i64("special_tokens_mask", rows)?,
            );
        }
        if let Some(rows) = &self.offset_mapping {
            let flat: Vec<Vec<i64>> = rows
                .iter()
                .map(|r| r.iter().flat_map(|&(a, b)| [a, b]).collect())
                .collect();
            let t = stack_i64("offset_mapping", &flat)?;
            let size = t.size();
            batch.insert("offset_mapping", t.f_reshape([size[0], size[1] / 2, 2])?);
        }
        for (key, rows) in [
            ("start_positions", &self.start_positions),
            ("end_positions", &self.end_positions),
        ] {
            if let Some(rows) = rows {
                batch.insert(key, Tensor::f_from_slice(rows)?);
            }
        }
        Ok(batch)
    }
}

/// Stacks equal-length rows into an int64 `[rows, len]` tensor.
pub(crate) fn stack_i64(key: &'static str, rows: &[Vec<i64>]) -> Result<Tensor> {
    let len = check_rectangular(key, rows.iter().map(Vec::len))?;
    let flat: Vec<i64> = rows.iter().flatten().copied().collect();
    Ok(Tensor::f_from_slice(&flat)?.f_reshape([rows.len() as i64, len as i64])?)
}

/// Stacks equal-length rows of floats into a float32 `[rows, len]` tensor.
pub(crate) fn stack_f32(key: &'static str, rows: &[Vec<f64>]) -> Result<Tensor> {
    let len = check_rectangular(key, rows.iter().map(Vec::len))?;
    let flat: Vec<f32> = rows.iter().flatten().map(|&x| x as f32).collect();
    Ok(Tensor::f_from_slice(&flat)?.f_reshape([rows.len() as i64, len as i64])?)
}

fn check_rectangular(key: &'static str, lengths: impl Iterator<Item = usize>) -> Result<usize> {
    let lengths: Vec<usize> = lengths.collect();
    match lengths.first() {
        None => Err(Error::EmptyBatch),
        Some(&first) if lengths.iter().all(|&l| l == first) => Ok(first),
        Some(_) => Err(Error::RaggedBatch { key, lengths }),
    }
}

/// The labels of a batch as upstream's `torch.tensor([...])` makes them: class ids and
/// id sequences as int64, floats as float32 (the kind of the first row decides, and
/// every row must have the same kind). `None` when the first row has no label.
pub(crate) fn collate_labels(features: &[&Feature]) -> Result<Option<Tensor>> {
    let Some(first) = features.first() else {
        return Err(Error::EmptyBatch);
    };
    let Some(first_label) = &first.labels else {
        check_absent(features, |f| f.labels.is_some(), "labels")?;
        return Ok(None);
    };
    let tensor = match first_label {
        Label::Class(_) => {
            let v = gather(features, "a class id like the first row's", |l| match l {
                Label::Class(c) => Some(*c),
                _ => None,
            })?;
            Tensor::f_from_slice(&v)?
        }
        Label::Value(_) => {
            let v = gather(features, "a float like the first row's", |l| match l {
                Label::Value(x) => Some(*x as f32),
                _ => None,
            })?;
            Tensor::f_from_slice(&v)?
        }
        Label::Ids(_) => {
            let rows = gather(
                features,
                "a sequence of ids like the first row's",
                |l| match l {
                    Label::Ids(v) => Some(v.clone()),
                    _ => None,
                },
            )?;
            stack_i64("labels", &rows)?
        }
        Label::Values(_) => {
            let rows = gather(
                features,
                "a sequence of floats like the first row's",
                |l| match l {
                    Label::Values(v) => Some(v.clone()),
                    _ => None,
                },
            )?;
            stack_f32("labels", &rows)?
        }
    };
    Ok(Some(tensor))
}

fn gather<T>(
    features: &[&Feature],
    expected: &'static str,
    pick: impl Fn(&Label) -> Option<T>,
) -> Result<Vec<T>> {
    features
        .iter()
        .enumerate()
        .map(|(index, f)| {
            f.labels
                .as_ref()
                .and_then(&pick)
                .ok_or(Error::LabelKind { index, expected })
        })
        .collect()
}

/// Fails when a row other than the first has a field the first lacks.
pub(crate) fn check_absent(
    features: &[&Feature],
    present: impl Fn(&Feature) -> bool,
    key: &'static str,
) -> Result<()> {
    match features.iter().position(|f| present(f)) {
        Some(index) => Err(Error::InconsistentFeatures {
            key,
            index,
            presence: "has",
            other: "does not",
        }),
        None => Ok(()),
    }
}

/// Collects an optional per-token field: `None` when the first row lacks it, an error
/// when rows disagree or a row's field length differs from its input_ids.
fn optional_field<T: Clone>(
    features: &[&Feature],
    key: &'static str,
    get: impl Fn(&Feature) -> Option<&Vec<T>>,
) -> Result<Option<Vec<Vec<T>>>> {
    if get(features[0]).is_none() {
        check_absent(features, |f| get(f).is_some(), key)?;
        return Ok(None);
    }
    features
        .iter()
        .enumerate()
        .map(|(index, f)| {
            let v = get(f).ok_or(Error::InconsistentFeatures {
                key,
                index,
                presence: "lacks",
                other: "does",
            })?;
            if v.len() != f.input_ids.len() {
                return Err(Error::FieldLengthMismatch {
                    index,
                    key,
                    len: v.len(),
                    input_len: f.input_ids.len(),
                });
            }
            Ok(v.clone())
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// Collects an optional per-row integer (question answering's answer positions): `None`
/// when the first row lacks it, an error when rows disagree.
fn optional_scalar(
    features: &[&Feature],
    key: &'static str,
    get: impl Fn(&Feature) -> Option<i64>,
) -> Result<Option<Vec<i64>>> {
    if get(features[0]).is_none() {
        check_absent(features, |f| get(f).is_some(), key)?;
        return Ok(None);
    }
    features
        .iter()
        .enumerate()
        .map(|(index, f)| {
            get(f).ok_or(Error::InconsistentFeatures {
                key,
                index,
                presence: "lacks",
                other: "does",
            })
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// Rounds `length` up to a multiple of `multiple` (upstream's `pad_to_multiple_of`).
pub(crate) fn round_up(length: usize, multiple: Option<usize>) -> Result<usize> {
    match multiple {
        None => Ok(length),
        Some(0) => Err(Error::ZeroPadToMultipleOf),
        Some(m) if !length.is_multiple_of(m) => Ok((length / m + 1) * m),
        Some(_) => Ok(length),
    }
}

fn pad_row<T: Clone>(row: &mut Vec<T>, target: usize, value: T, side: PaddingSide) {
    if row.len() >= target {
        return;
    }
    let fill = vec![value; target - row.len()];
    match side {
        PaddingSide::Right => row.extend(fill),
        PaddingSide::Left => {
            let mut padded = fill;
            padded.append(row);
            *row = padded;
        }
    }
}

/// Upstream's `tokenizer.pad(features, padding, max_length, pad_to_multiple_of)` on the
/// per-token fields of `features` (labels are left to the caller).
///
/// Pads `input_ids` with the pad id, `attention_mask` with 0 (creating it, all ones,
/// when the rows have none), `token_type_ids` with `pad_token_type_id`,
/// `special_tokens_mask` with 1, and `offset_mapping` with `(0, 0)` (upstream leaves
/// offsets unpadded, which fails on a ragged batch). Rows longer than the target length
/// are left as they are (upstream does not truncate here).
pub(crate) fn pad_features(
    features: &[&Feature],
    tokenizer: &TokenizerInfo,
    padding: PaddingStrategy,
    max_length: Option<usize>,
    pad_to_multiple_of: Option<usize>,
) -> Result<PaddedRows> {
    if features.is_empty() {
        return Err(Error::EmptyBatch);
    }
    let mut rows = PaddedRows {
        input_ids: features.iter().map(|f| f.input_ids.clone()).collect(),
        token_type_ids: optional_field(features, "token_type_ids", |f| f.token_type_ids.as_ref())?,
        attention_mask: optional_field(features, "attention_mask", |f| f.attention_mask.as_ref())?,
        special_tokens_mask: optional_field(features, "special_tokens_mask", |f| {
            f.special_tokens_mask.as_ref()
        })?,
        offset_mapping: optional_field(features, "offset_mapping", |f| f.offset_mapping.as_ref())?,
        start_positions: optional_scalar(features, "start_positions", |f| f.start_positions)?,
        end_positions: optional_scalar(features, "end_positions", |f| f.end_positions)?,
    };
    if tokenizer.return_attention_mask && rows.attention_mask.is_none() {
        rows.attention_mask = Some(rows.input_ids.iter().map(|r| vec![1; r.len()]).collect());
    }
    // _get_padding_truncation_strategies: max_length falls back to model_max_length,
    // and without any limit "max_length" padding becomes no padding.
    let (padding, max_length) = match padding {
        PaddingStrategy::MaxLength => match max_length.or(tokenizer.model_max_length) {
            Some(m) => (PaddingStrategy::MaxLength, Some(m)),
            None => (PaddingStrategy::DoNotPad, None),
        },
        other => (other, max_length),
    };
    let target = match padding {
        PaddingStrategy::DoNotPad => return Ok(rows),
        PaddingStrategy::Longest => rows.input_ids.iter().map(Vec::len).max().unwrap_or(0),
        PaddingStrategy::MaxLength => max_length.unwrap_or(0),
    };
    let pad_id = tokenizer.pad_token_id.ok_or(Error::NoPadToken)?;
    if pad_id < 0 {
        return Err(Error::NoPadToken);
    }
    let target = round_up(target, pad_to_multiple_of)?;
    let side = tokenizer.padding_side;
    for i in 0..rows.input_ids.len() {
        pad_row(&mut rows.input_ids[i], target, pad_id, side);
        if let Some(r) = &mut rows.attention_mask {
            pad_row(&mut r[i], target, 0, side);
        }
        if let Some(r) = &mut rows.token_type_ids {
            pad_row(&mut r[i], target, tokenizer.pad_token_type_id, side);
        }
        if let Some(r) = &mut rows.special_tokens_mask {
            pad_row(&mut r[i], target, 1, side);
        }
        if let Some(r) = &mut rows.offset_mapping {
            pad_row(&mut r[i], target, (0, 0), side);
        }
    }
    Ok(rows)
}

/// Pads the inputs of a batch dynamically (upstream's `DataCollatorWithPadding`).
///
/// Per-token fields are padded as `tokenizer.pad` does; labels (`label` / `label_ids`
/// upstream, always `labels` in the batch) are collated but not padded: scalar labels
/// become `[batch]`, sequence labels must already have equal lengths.
///
/// ```
/// use tchtrain_collators::{DataCollator, DataCollatorWithPadding, Feature, Label, PaddingSide, TokenizerInfo};
/// let tokenizer = TokenizerInfo { pad_token_id: Some(0), padding_side: PaddingSide::Left, ..Default::default() };
/// let mut collator = DataCollatorWithPadding { pad_to_multiple_of: Some(4), ..DataCollatorWithPadding::new(tokenizer) };
/// let rows = [Feature::new(vec![5, 6]).with_labels(Label::Class(1)), Feature::new(vec![7]).with_labels(Label::Class(0))];
/// let batch = collator.collate(&rows)?;
/// assert_eq!(Vec::<i64>::try_from(batch.get("input_ids").unwrap().get(1))?, [0, 0, 0, 7]);
/// assert_eq!(Vec::<i64>::try_from(batch.get("labels").unwrap())?, [1, 0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct DataCollatorWithPadding {
    /// Pad id, padding side and the rest of the tokenizer's facts.
    pub tokenizer: TokenizerInfo,
    /// Padding strategy (upstream default `True` = longest).
    pub padding: PaddingStrategy,
    /// Length for [`PaddingStrategy::MaxLength`].
    pub max_length: Option<usize>,
    /// Round the padded length up to a multiple of this.
    pub pad_to_multiple_of: Option<usize>,
}

impl DataCollatorWithPadding {
    /// Upstream's defaults: pad to the longest row.
    pub fn new(tokenizer: TokenizerInfo) -> Self {
        Self {
            tokenizer,
            padding: PaddingStrategy::Longest,
            max_length: None,
            pad_to_multiple_of: None,
        }
    }
}

impl DataCollator for DataCollatorWithPadding {
    fn collate(&mut self, features: &[Feature]) -> Result<Batch> {
        let refs: Vec<&Feature> = features.iter().collect();
        let rows = pad_features(
            &refs,
            &self.tokenizer,
            self.padding,
            self.max_length,
            self.pad_to_multiple_of,
        )?;
        let mut batch = rows.into_batch()?;
        if let Some(labels) = collate_labels(&refs)? {
            batch.insert("labels", labels);
        }
        Ok(batch)
    }
}

//! `default_data_collator` / `DefaultDataCollator`: stack rows that already have equal
//! lengths, with upstream's handling of `label` / `label_ids`.

use crate::batch::Batch;
use crate::data_collator::DataCollator;
use crate::error::{Error, Result};
use crate::padding::{PaddedRows, PaddingStrategy, collate_labels, pad_features};
use crate::tokenizer_info::TokenizerInfo;
use tchtrain_datasets::Feature;

/// Collates rows without any padding (upstream's `default_data_collator`).
///
/// `labels` come first: class ids as int64 `[batch]`, floats as float32, sequences as
/// `[batch, len]`; then every field present in the first row (`input_ids`,
/// `token_type_ids`, `attention_mask`, `special_tokens_mask`, `offset_mapping`), stacked.
/// Unlike the padding collators it does not add an `attention_mask`. Rows of different
/// lengths give [`Error::RaggedBatch`].
///
/// ```
/// use tchtrain_collators::{Feature, Label, default_data_collator};
/// let rows = [Feature::new(vec![1, 2]).with_labels(Label::Value(0.5)), Feature::new(vec![3, 4]).with_labels(Label::Value(1.5))];
/// let batch = default_data_collator(&rows)?;
/// assert_eq!(batch.keys().collect::<Vec<_>>(), ["labels", "input_ids"]);
/// assert_eq!(batch.get("labels").unwrap().kind(), tch::Kind::Float);
/// # Ok::<(), tchtrain_collators::Error>(())
/// ```
pub fn default_data_collator(features: &[Feature]) -> Result<Batch> {
    if features.is_empty() {
        return Err(Error::EmptyBatch);
    }
    let refs: Vec<&Feature> = features.iter().collect();
    let no_mask = TokenizerInfo {
        return_attention_mask: false,
        ..TokenizerInfo::default()
    };
    let mut batch = Batch::new();
    if let Some(labels) = collate_labels(&refs)? {
        batch.insert("labels", labels);
    }
    // An image row (its `pixel_values` a float array, no tokens) has no `input_ids` key
    // upstream: an empty one is left out.
    let arrays = float_arrays(features)?;
    if arrays.is_empty() || features.iter().any(|f| !f.input_ids.is_empty()) {
        let rows: PaddedRows =
            pad_features(&refs, &no_mask, PaddingStrategy::DoNotPad, None, None)?;
        for (key, tensor) in rows.into_batch()? {
            batch.insert(key, tensor);
        }
    }
    for (key, tensor) in arrays {
        batch.insert(key, tensor);
    }
    Ok(batch)
}

/// The float-array columns of the first row (`pixel_values`), each stacked over the rows
/// (upstream's `torch.stack` of a tensor-valued key): float32 `[batch, ...shape]`.
pub(crate) fn float_arrays(features: &[Feature]) -> Result<Vec<(String, tch::Tensor)>> {
    use tchtrain_datasets::Column;
    let mut out = Vec::new();
    for (name, first) in &features[0].columns {
        let Column::Floats { shape, .. } = first else {
            continue;
        };
        let mut flat = Vec::new();
        for (i, f) in features.iter().enumerate() {
            match f.column(name) {
                Some(Column::Floats { shape: s, values }) if s == shape => {
                    flat.extend_from_slice(values)
                }
                Some(Column::Floats { .. }) => {
                    return Err(Error::RaggedBatch {
                        key: "pixel_values",
                        lengths: features
                            .iter()
                            .map(|f| match f.column(name) {
                                Some(Column::Floats { values, .. }) => values.len(),
                                _ => 0,
                            })
                            .collect(),
                    });
                }
                _ => {
                    return Err(Error::InconsistentFeatures {
                        key: "pixel_values",
                        index: i,
                        presence: "lacks",
                        other: "has it",
                    });
                }
            }
        }
        let mut dims = vec![features.len() as i64];
        dims.extend_from_slice(shape);
        let t = tch::Tensor::from_slice(&flat).f_reshape(dims.as_slice())?;
        out.push((name.clone(), t));
    }
    Ok(out)
}

/// The struct form of [`default_data_collator`] (upstream's `DefaultDataCollator`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DefaultDataCollator;

impl DataCollator for DefaultDataCollator {
    fn collate(&mut self, features: &[Feature]) -> Result<Batch> {
        default_data_collator(features)
    }
}

//! `DataCollatorForTokenClassification`: pads the inputs and the per-token labels.

use crate::batch::Batch;
use crate::data_collator::DataCollator;
use crate::error::{Error, Result};
use crate::padding::{PaddingSide, PaddingStrategy, check_absent, pad_features, stack_i64};
use crate::tokenizer_info::TokenizerInfo;
use tchtrain_datasets::{Feature, Label};

/// Pads inputs as [`DataCollatorWithPadding`](crate::DataCollatorWithPadding) does and
/// the per-token labels ([`Label::Ids`]) to the same length with `label_pad_token_id`,
/// on the tokenizer's padding side (upstream's `DataCollatorForTokenClassification`).
///
/// ```
/// use tchtrain_collators::{DataCollator, DataCollatorForTokenClassification, Feature, Label, TokenizerInfo};
/// let tokenizer = TokenizerInfo { pad_token_id: Some(0), ..Default::default() };
/// let mut collator = DataCollatorForTokenClassification::new(tokenizer);
/// let rows = [Feature::new(vec![5, 6, 7]).with_labels(Label::Ids(vec![1, 2, 1])),
///             Feature::new(vec![8]).with_labels(Label::Ids(vec![3]))];
/// let batch = collator.collate(&rows)?;
/// assert_eq!(Vec::<i64>::try_from(batch.get("labels").unwrap().get(1))?, [3, -100, -100]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct DataCollatorForTokenClassification {
    /// Pad id, padding side and the rest of the tokenizer's facts.
    pub tokenizer: TokenizerInfo,
    /// Padding strategy (upstream default longest).
    pub padding: PaddingStrategy,
    /// Length for [`PaddingStrategy::MaxLength`].
    pub max_length: Option<usize>,
    /// Round the padded length up to a multiple of this.
    pub pad_to_multiple_of: Option<usize>,
    /// The label given to padding positions (upstream default -100, ignored by the losses).
    pub label_pad_token_id: i64,
}

impl DataCollatorForTokenClassification {
    /// Upstream's defaults: pad to the longest row, labels padded with -100.
    pub fn new(tokenizer: TokenizerInfo) -> Self {
        Self {
            tokenizer,
            padding: PaddingStrategy::Longest,
            max_length: None,
            pad_to_multiple_of: None,
            label_pad_token_id: -100,
        }
    }
}

impl DataCollator for DataCollatorForTokenClassification {
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
        if features[0].labels.is_none() {
            check_absent(&refs, |f| f.labels.is_some(), "labels")?;
            return Ok(batch);
        }
        let seq_len = batch.get("input_ids").map_or(0, |t| t.size()[1] as usize);
        let labels = features
            .iter()
            .enumerate()
            .map(|(index, f)| {
                let Some(Label::Ids(label)) = &f.labels else {
                    return Err(Error::LabelKind {
                        index,
                        expected: "a sequence of ids (one per token)",
                    });
                };
                pad_labels(
                    label,
                    seq_len,
                    self.label_pad_token_id,
                    self.tokenizer.padding_side,
                )
                .ok_or(Error::LabelLengthMismatch {
                    index,
                    label_len: label.len(),
                    seq_len,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        batch.insert("labels", stack_i64("labels", &labels)?);
        Ok(batch)
    }
}

/// `label` padded to `len` with `pad` on `side`; `None` when it is longer than `len`.
pub(crate) fn pad_labels(
    label: &[i64],
    len: usize,
    pad: i64,
    side: PaddingSide,
) -> Option<Vec<i64>> {
    let fill = len.checked_sub(label.len())?;
    let padding = std::iter::repeat_n(pad, fill);
    Some(match side {
        PaddingSide::Right => label.iter().copied().chain(padding).collect(),
        PaddingSide::Left => padding.chain(label.iter().copied()).collect(),
    })
}

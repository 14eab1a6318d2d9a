//! `DataCollatorForMultipleChoice`: pads every choice of every example to one length
//! and shapes the batch `[batch, num_choices, seq]`.

use tch::Tensor;

use crate::batch::Batch;
use crate::data_collator::DataCollator;
use crate::error::{Error, Result};
use crate::padding::{PaddingStrategy, pad_features};
use crate::tokenizer_info::TokenizerInfo;
use tchtrain_datasets::Feature;

/// One multiple-choice example: one tokenized [`Feature`] per choice (their `labels`
/// are not used) and the index of the right choice.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MultipleChoiceFeature {
    /// The tokenized choices (e.g. context + each candidate ending).
    pub choices: Vec<Feature>,
    /// The index of the correct choice.
    pub label: i64,
}

/// Flattens the choices of all examples, pads them as one batch, and reshapes each
/// field to `[batch, num_choices, seq]`; `labels` is int64 `[batch]` (upstream's
/// `DataCollatorForMultipleChoice`).
///
/// ```
/// use tchtrain_collators::{DataCollator, DataCollatorForMultipleChoice, Feature, MultipleChoiceFeature, TokenizerInfo};
/// let tokenizer = TokenizerInfo { pad_token_id: Some(0), ..Default::default() };
/// let example = MultipleChoiceFeature { choices: vec![Feature::new(vec![1, 2]), Feature::new(vec![3])], label: 1 };
/// let batch = DataCollatorForMultipleChoice::new(tokenizer).collate(&[example])?;
/// assert_eq!(batch.get("input_ids").unwrap().size(), [1, 2, 2]);
/// # Ok::<(), tchtrain_collators::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct DataCollatorForMultipleChoice {
    /// Pad id, padding side and the rest of the tokenizer's facts.
    pub tokenizer: TokenizerInfo,
    /// Padding strategy (upstream default longest).
    pub padding: PaddingStrategy,
    /// Length for [`PaddingStrategy::MaxLength`].
    pub max_length: Option<usize>,
    /// Round the padded length up to a multiple of this.
    pub pad_to_multiple_of: Option<usize>,
}

impl DataCollatorForMultipleChoice {
    /// Upstream's defaults: pad to the longest choice.
    pub fn new(tokenizer: TokenizerInfo) -> Self {
        Self {
            tokenizer,
            padding: PaddingStrategy::Longest,
            max_length: None,
            pad_to_multiple_of: None,
        }
    }
}

impl DataCollator<MultipleChoiceFeature> for DataCollatorForMultipleChoice {
    fn collate(&mut self, examples: &[MultipleChoiceFeature]) -> Result<Batch> {
        let first = examples.first().ok_or(Error::EmptyBatch)?;
        let num_choices = first.choices.len();
        if num_choices == 0 {
            return Err(Error::EmptyBatch);
        }
        if let Some((index, e)) = examples
            .iter()
            .enumerate()
            .find(|(_, e)| e.choices.len() != num_choices)
        {
            return Err(Error::ChoiceCountMismatch {
                index,
                expected: num_choices,
                got: e.choices.len(),
            });
        }
        let flat: Vec<&Feature> = examples.iter().flat_map(|e| e.choices.iter()).collect();
        let rows = pad_features(
            &flat,
            &self.tokenizer,
            self.padding,
            self.max_length,
            self.pad_to_multiple_of,
        )?;
        let mut batch = Batch::new();
        let batch_size = examples.len() as i64;
        for (key, t) in rows.into_batch()? {
            let mut shape = vec![batch_size, num_choices as i64];
            shape.extend_from_slice(&t.size()[1..]);
            batch.insert(key, t.f_reshape(shape.as_slice())?);
        }
        let labels: Vec<i64> = examples.iter().map(|e| e.label).collect();
        batch.insert("labels", Tensor::f_from_slice(&labels)?);
        Ok(batch)
    }
}

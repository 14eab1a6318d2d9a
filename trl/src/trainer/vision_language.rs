//! `SFTTrainer` on vision datasets (`trl/trainer/sft_trainer.py`'s
//! `DataCollatorForVisionLanguageModeling` and the trainer's vision path): rows with an
//! `images` list (or one `image`) and `messages` (or the `dataset_text_field` text), processed
//! when fetched by the model's processor ([`Gemma3Processor`]) as TRL's collator processes them
//! — the messages given their image placeholders (`prepare_multimodal_messages`), rendered by
//! the chat template, the images expanded into their tokens, tokenized without special tokens,
//! cut to `max_length` — and batched: padded on the right, `labels` the ids with -100 on the
//! padding, every row's images' `pixel_values` concatenated.
//!
//! Processing a row when it is fetched and padding the batch gives the batch TRL's collator
//! gives (it processes the batch at once; padding changes no row's tokens). Prompt-completion
//! vision rows and `assistant_only_loss` on them are refused, naming the field.

use std::sync::Arc;

use serde_json::Value;
use tchtrain_collators::{Batch, DataCollator, Feature};
use tchtrain_data::Dataset;
use tchtrain_datasets::{Column, Table, image_from_cell};
use tchtrain_models::{ChatTemplateOptions, Gemma3Processor};

use crate::data_utils::prepare_multimodal_messages;
use crate::trainer::base_trainer::{pad_batch, row};

/// TRL's `DataCollatorForVisionLanguageModeling` over rows [`VisionRows`] processed: the
/// rows padded on the right to the batch's longest (or a multiple of `pad_to_multiple_of`) —
/// `input_ids` with `pad_token_id`, `attention_mask` and `token_type_ids` with 0 —, `labels`
/// the ids with -100 on the padding (the image tokens kept, as TRL keeps them), and
/// `pixel_values` `[images in the batch, channels, height, width]` when a row has images.
#[derive(Debug, Clone)]
pub struct DataCollatorForVisionLanguageModeling {
    /// The tokenizer's pad token id.
    pub pad_token_id: i64,
    /// `pad_to_multiple_of`.
    pub pad_to_multiple_of: Option<usize>,
}

impl DataCollator<Feature> for DataCollatorForVisionLanguageModeling {
    fn collate(&mut self, features: &[Feature]) -> tchtrain_collators::Result<Batch> {
        if features.is_empty() {
            return Err(tchtrain_collators::Error::EmptyBatch);
        }
        let ids: Vec<Vec<i64>> = features.iter().map(|f| f.input_ids.clone()).collect();
        let masks: Vec<Vec<i64>> = ids.iter().map(|r| vec![1; r.len()]).collect();
        let mut types = Vec::with_capacity(features.len());
        for (index, f) in features.iter().enumerate() {
            match &f.token_type_ids {
                Some(t) if t.len() == f.input_ids.len() => types.push(t.clone()),
                _ => {
                    return Err(tchtrain_collators::Error::FieldLengthMismatch {
                        index,
                        key: "token_type_ids",
                        len: f.token_type_ids.as_ref().map_or(0, Vec::len),
                        input_len: f.input_ids.len(),
                    });
                }
            }
        }
        let pad = |rows: &[Vec<i64>], v: i64| pad_batch(rows, v, self.pad_to_multiple_of);
        let mut batch = Batch::new();
        batch.insert("input_ids", pad(&ids, self.pad_token_id)?);
        batch.insert("attention_mask", pad(&masks, 0)?);
        batch.insert("token_type_ids", pad(&types, 0)?);
        batch.insert("labels", pad(&ids, -100)?);
        // Every row's images, in order.
        let mut shape: Option<Vec<i64>> = None;
        let (mut images, mut values) = (0i64, Vec::new());
        for f in features {
            let Some(Column::Floats {
                shape: s,
                values: v,
            }) = f.column("pixel_values")
            else {
                continue;
            };
            match &shape {
                Some(first) if first[1..] != s[1..] => {
                    return Err(tchtrain_collators::Error::RaggedBatch {
                        key: "pixel_values",
                        lengths: features
                            .iter()
                            .map(|f| match f.column("pixel_values") {
                                Some(Column::Floats { values, .. }) => values.len(),
                                _ => 0,
                            })
                            .collect(),
                    });
                }
                _ => shape = Some(s.clone()),
            }
            images += s[0];
            values.extend_from_slice(v);
        }
        if let Some(mut s) = shape {
            s[0] = images;
            batch.insert(
                "pixel_values",
                tch::Tensor::from_slice(&values).f_reshape(s.as_slice())?,
            );
        }
        Ok(batch)
    }
}

/// A vision dataset's rows, processed when fetched (TRL skips `_prepare_dataset` for them).
pub(crate) struct VisionRows {
    pub(crate) table: Table,
    pub(crate) processor: Arc<Gemma3Processor>,
    pub(crate) max_length: Option<usize>,
    pub(crate) dataset_text_field: String,
    pub(crate) dataset: &'static str,
}

impl VisionRows {
    fn process(&self, index: usize) -> crate::Result<Feature> {
        let bad = |detail: String| crate::Error::Dataset {
            dataset: self.dataset.into(),
            row: index,
            detail,
        };
        let example = row(&self.table, index, self.dataset)?;
        let cells: Vec<&Value> = match (example.get("images"), example.get("image")) {
            (Some(Value::Array(list)), _) => list.iter().collect(),
            (Some(Value::Null) | None, Some(Value::Null) | None) => Vec::new(),
            (None, Some(one)) => vec![one],
            (Some(other), _) => {
                return Err(bad(format!(
                    "`images` must be a list of images, got {other}"
                )));
            }
        };
        let base = self.table.path().parent();
        let images = cells
            .iter()
            .enumerate()
            .map(|(j, cell)| {
                image_from_cell(
                    cell,
                    base,
                    &format!("{} row {index} image {j}", self.dataset),
                )
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let text = match (
            example.get("messages"),
            example.get(&self.dataset_text_field),
        ) {
            (Some(messages), _) => {
                let messages = prepare_multimodal_messages(messages, images.len())
                    .map_err(|e| bad(e.to_string()))?;
                self.processor.tokenizer.apply_chat_template_text(
                    &messages.to_string(),
                    &ChatTemplateOptions::default(),
                )?
            }
            (None, Some(Value::String(t))) => t.clone(),
            _ => {
                return Err(bad(format!(
                    "The input examples must contain either 'messages' for conversational data or '{}' for standard data. (TRL's message)",
                    self.dataset_text_field
                )));
            }
        };
        let processed = self.processor.call(&text, &images, self.max_length)?;
        let mut feature = Feature {
            attention_mask: Some(vec![1; processed.input_ids.len()]),
            input_ids: processed.input_ids,
            token_type_ids: Some(processed.token_type_ids),
            ..Feature::default()
        };
        if let Some((shape, values)) = processed.pixel_values {
            feature = feature.with_column("pixel_values", Column::Floats { shape, values });
        }
        Ok(feature)
    }
}

impl Dataset for VisionRows {
    fn len(&self) -> usize {
        self.table.len()
    }

    fn get(&self, index: usize) -> tchtrain_data::Result<Feature> {
        if index >= self.table.len() {
            return Err(tchtrain_data::Error::IndexOutOfRange {
                index,
                len: self.table.len(),
            });
        }
        self.process(index)
            .map_err(|e| tchtrain_data::Error::InvalidArgument {
                field: "dataset",
                detail: e.to_string(),
            })
    }

    fn labels(&self, _index: usize) -> tchtrain_data::Result<Option<tchtrain_datasets::Label>> {
        // The labels are the ids, made by the collator (a causal LM's are not checked).
        Ok(None)
    }
}

//! `DataCollatorSpeechSeq2SeqWithPadding` of upstream's
//! `examples/pytorch/speech-recognition/run_speech_recognition_seq2seq.py`: the feature
//! extractor's `pad` of the rows' `input_features` (Whisper's are all `[num_mel_bins,
//! 3000]`: stacked), the tokenizer's `pad` of the `labels` (right, to the longest) with the
//! padding replaced by -100, and the first column cut when every row starts with
//! `decoder_start_token_id` (the model prepends it again when it shifts the labels).

use crate::batch::Batch;
use crate::data_collator::DataCollator;
use crate::error::{Error, Result};
use tchtrain_datasets::{Feature, Label};

/// The speech-recognition script's collator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataCollatorSpeechSeq2SeqWithPadding {
    /// The model's `decoder_start_token_id`.
    pub decoder_start_token_id: i64,
}

impl DataCollator for DataCollatorSpeechSeq2SeqWithPadding {
    fn collate(&mut self, features: &[Feature]) -> Result<Batch> {
        if features.is_empty() {
            return Err(Error::EmptyBatch);
        }
        let mut batch = Batch::new();
        let arrays = crate::default::float_arrays(features)?;
        if !arrays.iter().any(|(name, _)| name == "input_features") {
            return Err(Error::InconsistentFeatures {
                key: "input_features",
                index: 0,
                presence: "lacks",
                other: "should have it (the feature extractor's output)",
            });
        }
        for (name, t) in arrays {
            batch.insert(name, t);
        }
        let mut rows = Vec::with_capacity(features.len());
        for (index, f) in features.iter().enumerate() {
            match &f.labels {
                Some(Label::Ids(ids)) => rows.push(ids.as_slice()),
                _ => {
                    return Err(Error::LabelKind {
                        index,
                        expected: "the transcript's token ids",
                    });
                }
            }
        }
        let longest = rows.iter().map(|r| r.len()).max().unwrap_or(0);
        let strip = longest > 0
            && rows
                .iter()
                .all(|r| r.first() == Some(&self.decoder_start_token_id));
        let start = usize::from(strip);
        let mut flat = Vec::with_capacity(rows.len() * longest);
        for r in &rows {
            flat.extend_from_slice(&r[start.min(r.len())..]);
            flat.extend(std::iter::repeat_n(-100, longest - r.len().max(start)));
        }
        let width = (longest - start) as i64;
        batch.insert(
            "labels",
            tch::Tensor::from_slice(&flat).f_reshape([rows.len() as i64, width])?,
        );
        Ok(batch)
    }
}

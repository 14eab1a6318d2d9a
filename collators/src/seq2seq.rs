//! `DataCollatorForSeq2Seq`: pads encoder inputs and target labels, and builds
//! `decoder_input_ids` with the model's `shift_tokens_right`.

use tch::{Kind, Tensor};

use crate::batch::Batch;
use crate::data_collator::DataCollator;
use crate::error::{Error, Result};
use crate::padding::{PaddingStrategy, check_absent, pad_features, round_up, stack_i64};
use crate::token_classification::pad_labels;
use crate::tokenizer_info::TokenizerInfo;
use tchtrain_datasets::{Feature, Label};

/// Shifts `input_ids` (`[batch, len]`) one token to the right, puts
/// `decoder_start_token_id` first and replaces `-100` by `pad_token_id`: the
/// `shift_tokens_right` of BART, T5, Marian, mBART... that their
/// `prepare_decoder_input_ids_from_labels` calls.
///
/// ```
/// use tch::Tensor;
/// let labels = Tensor::from_slice(&[5i64, 6, -100]).reshape([1, 3]);
/// let shifted = tchtrain_collators::shift_tokens_right(&labels, 1, 2)?;
/// assert_eq!(Vec::<i64>::try_from(shifted.get(0))?, [2, 5, 6]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn shift_tokens_right(
    input_ids: &Tensor,
    pad_token_id: i64,
    decoder_start_token_id: i64,
) -> Result<Tensor> {
    let len = input_ids.size().last().copied().unwrap_or(0);
    if len == 0 {
        return Ok(input_ids.f_detach_copy()?);
    }
    let start = Tensor::f_full(
        [input_ids.size()[0], 1],
        decoder_start_token_id,
        (input_ids.kind(), input_ids.device()),
    )?;
    let shifted = Tensor::f_cat(&[start, input_ids.f_narrow(-1, 0, len - 1)?], -1)?;
    let is_ignored = shifted.f_eq(-100)?;
    Ok(shifted.f_masked_fill(&is_ignored, pad_token_id)?)
}

/// mBART's `shift_tokens_right(input_ids, pad_token_id)`: -100 replaced by the pad id,
/// each row's last non-padding token (its language code) moved to the front, the rest
/// shifted one position right.
///
/// ```
/// use tch::Tensor;
/// let labels = Tensor::from_slice(&[5i64, 6, 250004, -100]).reshape([1, 4]);
/// let shifted = tchtrain_collators::mbart_shift_tokens_right(&labels, 1)?;
/// assert_eq!(Vec::<i64>::try_from(shifted.get(0))?, [250004, 5, 6, 250004]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn mbart_shift_tokens_right(input_ids: &Tensor, pad_token_id: i64) -> Result<Tensor> {
    let len = input_ids.size().last().copied().unwrap_or(0);
    if len == 0 {
        return Ok(input_ids.f_detach_copy()?);
    }
    let prev = input_ids.f_masked_fill(&input_ids.f_eq(-100)?, pad_token_id)?;
    let index_of_eos =
        (prev
            .f_ne(pad_token_id)?
            .f_sum_dim_intlist(&[1i64][..], false, Kind::Int64)?
            - 1)
        .f_clamp_min(0)?
        .f_unsqueeze(-1)?;
    let start = prev.f_gather(1, &index_of_eos, false)?;
    Ok(Tensor::f_cat(&[&start, &prev.f_narrow(1, 0, len - 1)?], 1)?)
}

/// How the model's `prepare_decoder_input_ids_from_labels` builds `decoder_input_ids`:
/// upstream passes the model itself; here what its config says
/// (`TrainableModel::decoder_start` of tchtrain-models gives it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecoderStart {
    /// BART, T5, Marian...: [`shift_tokens_right`] behind `decoder_start_token_id`.
    Token {
        /// `config.decoder_start_token_id`.
        decoder_start_token_id: i64,
        /// `config.pad_token_id` (replaces -100 in the shifted labels).
        pad_token_id: i64,
    },
    /// mBART: [`mbart_shift_tokens_right`] (each row's last non-padding token first).
    LastToken {
        /// `config.pad_token_id`.
        pad_token_id: i64,
    },
}

impl DecoderStart {
    /// The decoder ids for `labels` `[batch, len]`.
    pub fn decoder_input_ids(&self, labels: &Tensor) -> Result<Tensor> {
        match *self {
            Self::Token {
                decoder_start_token_id,
                pad_token_id,
            } => shift_tokens_right(labels, pad_token_id, decoder_start_token_id),
            Self::LastToken { pad_token_id } => mbart_shift_tokens_right(labels, pad_token_id),
        }
    }
}

/// Pads the inputs like [`DataCollatorWithPadding`](crate::DataCollatorWithPadding) and
/// the labels ([`Label::Ids`]) to the longest label (or `max_length` under
/// [`PaddingStrategy::MaxLength`]), rounded to `pad_to_multiple_of`, with
/// `label_pad_token_id` on the tokenizer's padding side; adds `decoder_input_ids` when
/// `decoder_start` is set (upstream's `DataCollatorForSeq2Seq` with a `model`).
///
/// ```
/// use tchtrain_collators::{DataCollator, DataCollatorForSeq2Seq, DecoderStart, Feature, Label, TokenizerInfo};
/// let tokenizer = TokenizerInfo { pad_token_id: Some(1), ..Default::default() };
/// let mut collator = DataCollatorForSeq2Seq {
///     decoder_start: Some(DecoderStart::Token { decoder_start_token_id: 2, pad_token_id: 1 }),
///     ..DataCollatorForSeq2Seq::new(tokenizer)
/// };
/// let rows = [Feature::new(vec![0, 9, 2]).with_labels(Label::Ids(vec![0, 7, 2])),
///             Feature::new(vec![0, 2]).with_labels(Label::Ids(vec![0, 2]))];
/// let batch = collator.collate(&rows)?;
/// assert_eq!(Vec::<i64>::try_from(batch.get("labels").unwrap().get(1))?, [0, 2, -100]);
/// assert_eq!(Vec::<i64>::try_from(batch.get("decoder_input_ids").unwrap().get(1))?, [2, 0, 2]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct DataCollatorForSeq2Seq {
    /// Pad id, padding side and the rest of the tokenizer's facts.
    pub tokenizer: TokenizerInfo,
    /// When set, `decoder_input_ids` are built from the padded labels.
    pub decoder_start: Option<DecoderStart>,
    /// Padding strategy (upstream default longest).
    pub padding: PaddingStrategy,
    /// Length for [`PaddingStrategy::MaxLength`] (inputs and labels).
    pub max_length: Option<usize>,
    /// Round padded lengths up to a multiple of this.
    pub pad_to_multiple_of: Option<usize>,
    /// The label given to padding positions (upstream default -100).
    pub label_pad_token_id: i64,
}

impl DataCollatorForSeq2Seq {
    /// Upstream's defaults: no model, pad to the longest row, labels padded with -100.
    pub fn new(tokenizer: TokenizerInfo) -> Self {
        Self {
            tokenizer,
            decoder_start: None,
            padding: PaddingStrategy::Longest,
            max_length: None,
            pad_to_multiple_of: None,
            label_pad_token_id: -100,
        }
    }
}

impl DataCollator for DataCollatorForSeq2Seq {
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
        let labels: Vec<&Vec<i64>> = features
            .iter()
            .enumerate()
            .map(|(index, f)| match &f.labels {
                Some(Label::Ids(l)) => Ok(l),
                _ => Err(Error::LabelKind {
                    index,
                    expected: "a sequence of target ids",
                }),
            })
            .collect::<Result<_>>()?;
        let padded: Vec<Vec<i64>> = if self.padding == PaddingStrategy::DoNotPad {
            labels.into_iter().cloned().collect()
        } else {
            let max_label_length = match (self.padding, self.max_length) {
                (PaddingStrategy::MaxLength, Some(m)) => m,
                _ => labels.iter().map(|l| l.len()).max().unwrap_or(0),
            };
            let target = round_up(max_label_length, self.pad_to_multiple_of)?;
            // Labels longer than the target stay as they are (upstream pads by a
            // negative amount, i.e. not at all); stacking then reports the ragged rows.
            labels
                .iter()
                .map(|l| {
                    pad_labels(
                        l,
                        target,
                        self.label_pad_token_id,
                        self.tokenizer.padding_side,
                    )
                    .unwrap_or_else(|| l.to_vec())
                })
                .collect()
        };
        let labels = stack_i64("labels", &padded)?.f_to_kind(Kind::Int64)?;
        if let Some(start) = self.decoder_start {
            let decoder_input_ids = start.decoder_input_ids(&labels)?;
            batch.insert("labels", labels);
            batch.insert("decoder_input_ids", decoder_input_ids);
        } else {
            batch.insert("labels", labels);
        }
        Ok(batch)
    }
}

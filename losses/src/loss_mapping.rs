//! `LOSS_MAPPING`: upstream's table from a model's loss type (derived from its class
//! name) to its loss function, as the [`LossType`] enum.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// The keys of upstream's `LOSS_MAPPING`, in upstream's order (the order matters for
/// [`loss_type_for_model_class`], which mirrors upstream's regular expression).
pub const LOSS_MAPPING_KEYS: [&str; 31] = [
    "ForSemanticSegmentation",
    "ForCausalLM",
    "ForMaskedLM",
    "ForQuestionAnswering",
    "ForSequenceClassification",
    "ForImageClassification",
    "ForVideoClassification",
    "ForAudioClassification",
    "ForTokenClassification",
    "ForSegmentation",
    "ForObjectDetection",
    "ForCTC",
    "ForConditionalGeneration",
    "DeformableDetrForObjectDetection",
    "ConditionalDetrForObjectDetection",
    "DabDetrForObjectDetection",
    "GroundingDinoForObjectDetection",
    "MMGroundingDinoForObjectDetection",
    "ConditionalDetrForSegmentation",
    "RTDetrForObjectDetection",
    "RTDetrV2ForObjectDetection",
    "DFineForObjectDetection",
    "Deimv2ForObjectDetection",
    "CsmForConditionalGeneration",
    "LwDetrForObjectDetection",
    "PocketTTSForConditionalGeneration",
    "GradiumPhononTTSForConditionalGeneration",
    "ParakeetForRNNT",
    "ParakeetForTDT",
    "RfDetrForObjectDetection",
    "RfDetrForInstanceSegmentation",
];

/// The loss functions of `LOSS_MAPPING` that this crate implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LossType {
    /// [`for_causal_lm_loss`](crate::for_causal_lm_loss) (`ForCausalLM`,
    /// `ForConditionalGeneration`, `CsmForConditionalGeneration`).
    CausalLm,
    /// [`for_masked_lm_loss`](crate::for_masked_lm_loss) (`ForMaskedLM`).
    MaskedLm,
    /// [`for_question_answering_loss`](crate::for_question_answering_loss)
    /// (`ForQuestionAnswering`).
    QuestionAnswering,
    /// [`for_sequence_classification_loss`](crate::for_sequence_classification_loss)
    /// (`ForSequenceClassification` and the image / video / audio classification keys).
    SequenceClassification,
    /// [`for_token_classification`](crate::for_token_classification)
    /// (`ForTokenClassification`).
    TokenClassification,
}

impl LossType {
    /// Upstream's name of the loss function this variant stands for.
    pub fn function_name(self) -> &'static str {
        match self {
            Self::CausalLm => "ForCausalLMLoss",
            Self::MaskedLm => "ForMaskedLMLoss",
            Self::QuestionAnswering => "ForQuestionAnsweringLoss",
            Self::SequenceClassification => "ForSequenceClassificationLoss",
            Self::TokenClassification => "ForTokenClassification",
        }
    }
}

impl fmt::Display for LossType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.function_name())
    }
}

impl FromStr for LossType {
    type Err = Error;

    /// Parses a `LOSS_MAPPING` key; see [`loss_mapping`].
    fn from_str(s: &str) -> Result<Self> {
        loss_mapping(s)
    }
}

/// Looks a key up in `LOSS_MAPPING`, as `LOSS_MAPPING[name]` does upstream.
///
/// Keys whose loss is not implemented here (detection, segmentation, CTC, speech) give
/// [`Error::UnsupportedLossType`]; unknown keys give [`Error::UnknownLossType`].
///
/// ```
/// use tchtrain_losses::{LossType, loss_mapping};
/// assert_eq!(loss_mapping("ForConditionalGeneration")?, LossType::CausalLm);
/// assert_eq!(loss_mapping("ForImageClassification")?, LossType::SequenceClassification);
/// assert!(loss_mapping("ForCTC").is_err());
/// # Ok::<(), tchtrain_losses::Error>(())
/// ```
#[doc(alias = "LOSS_MAPPING")]
pub fn loss_mapping(name: &str) -> Result<LossType> {
    match name {
        "ForCausalLM" | "ForConditionalGeneration" | "CsmForConditionalGeneration" => {
            Ok(LossType::CausalLm)
        }
        "ForMaskedLM" => Ok(LossType::MaskedLm),
        "ForQuestionAnswering" => Ok(LossType::QuestionAnswering),
        "ForSequenceClassification"
        | "ForImageClassification"
        | "ForVideoClassification"
        | "ForAudioClassification" => Ok(LossType::SequenceClassification),
        "ForTokenClassification" => Ok(LossType::TokenClassification),
        other if LOSS_MAPPING_KEYS.contains(&other) => {
            Err(Error::UnsupportedLossType(other.to_string()))
        }
        other => Err(Error::UnknownLossType(other.to_string())),
    }
}

/// The `loss_type` upstream's `PreTrainedModel.__init__` derives from a model class
/// name: the name itself when it is a key, otherwise the leftmost key found in it
/// (keys tried in `LOSS_MAPPING` order at each position, as Python's `re.findall` on
/// the alternation does), or `None`.
///
/// Upstream's `loss_function` falls back to `ForCausalLM` when this is `None`.
///
/// ```
/// use tchtrain_losses::loss_type_for_model_class;
/// assert_eq!(loss_type_for_model_class("BertForMaskedLM"), Some("ForMaskedLM"));
/// assert_eq!(loss_type_for_model_class("LlamaForCausalLM"), Some("ForCausalLM"));
/// assert_eq!(loss_type_for_model_class("BertModel"), None);
/// ```
pub fn loss_type_for_model_class(class_name: &str) -> Option<&'static str> {
    if let Some(key) = LOSS_MAPPING_KEYS.iter().find(|k| **k == class_name) {
        return Some(key);
    }
    (0..class_name.len())
        .filter(|&i| class_name.is_char_boundary(i))
        .find_map(|i| {
            LOSS_MAPPING_KEYS
                .iter()
                .find(|k| class_name[i..].starts_with(**k))
                .copied()
        })
}

//! The task head an encoder family puts on its base model, as a type: upstream's
//! `...Model`, `...ForMaskedLM`, `...ForSequenceClassification`,
//! `...ForTokenClassification` and `...ForQuestionAnswering` are `Bert<C, MaskedLm>` and
//! so on. A head that does not exist does not compile.
//!
//! What every family's head of a kind shares lives here: its class name among the family's
//! five, the labels the Trainer checks and feeds it, and its loss (upstream's
//! `loss_utils.py` through `tchtrain-losses`, a plain mean unless `num_items_in_batch`).

use tch::Tensor;

use crate::Result;
use crate::configuration_utils::LabelConfig;
use crate::modeling_utils::{LabelCheck, ModelInputs};

/// Which head (the value a model matches on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadKind {
    /// The base model (its last hidden state, and BERT's pooler).
    Base,
    /// A masked-language-modeling head.
    MaskedLm,
    /// A sequence-classification head.
    SequenceClassification,
    /// A token-classification head.
    TokenClassification,
    /// An extractive question-answering head (start and end logits).
    QuestionAnswering,
}

impl HeadKind {
    /// This head's class among a family's five (`...Model`, `...ForMaskedLM`,
    /// `...ForSequenceClassification`, `...ForTokenClassification`,
    /// `...ForQuestionAnswering`, in that order).
    pub const fn class(self, classes: &[&'static str; 5]) -> &'static str {
        classes[self as usize]
    }

    /// What the Trainer checks of the training labels before the first step: a class id
    /// per row for the sequence classifier, a tag (or -100) per token for the token
    /// classifier.
    pub fn label_check(self, num_labels: i64) -> Option<LabelCheck> {
        match self {
            HeadKind::SequenceClassification => Some(LabelCheck::Sequence { num_labels }),
            HeadKind::TokenClassification => Some(LabelCheck::Token { num_labels }),
            _ => None,
        }
    }

    /// The columns the head's loss reads (upstream's `label_names`): the answer span's
    /// `start_positions` and `end_positions` for question answering, else `labels`.
    pub fn label_names(self) -> Vec<String> {
        match self {
            HeadKind::QuestionAnswering => crate::modeling_utils::question_answering_label_names(),
            _ => vec!["labels".into()],
        }
    }
}

/// `...ForSequenceClassification`'s loss on `logits` when `inputs` has labels (regression,
/// single- or multi-label as `labels` says): a mean, as the text classifiers' inline
/// `CrossEntropyLoss()` (and SigLIP's `loss_function` called without the loss kwargs).
pub(crate) fn sequence_classification_loss(
    logits: &Tensor,
    inputs: &ModelInputs<'_>,
    labels: &LabelConfig,
) -> Result<Option<Tensor>> {
    classification_loss(logits, inputs, labels, None)
}

/// Upstream's `self.loss_function(labels, logits, self.config, **kwargs)`
/// (`ForSequenceClassificationLoss`, ViT's): the single-label loss summed over
/// `num_items_in_batch` when the Trainer passes it (a gradient-accumulation window's label
/// count), else a mean.
pub(crate) fn sequence_classification_loss_kwargs(
    logits: &Tensor,
    inputs: &ModelInputs<'_>,
    labels: &LabelConfig,
) -> Result<Option<Tensor>> {
    classification_loss(logits, inputs, labels, inputs.num_items_in_batch)
}

fn classification_loss(
    logits: &Tensor,
    inputs: &ModelInputs<'_>,
    labels: &LabelConfig,
    num_items_in_batch: Option<&Tensor>,
) -> Result<Option<Tensor>> {
    let Some(l) = inputs.labels else {
        return Ok(None);
    };
    Ok(Some(tchtrain_losses::for_sequence_classification_loss(
        l,
        logits,
        labels.num_labels(),
        labels.problem_type()?,
        num_items_in_batch,
    )?))
}

/// `...ForTokenClassification`'s loss on `logits` when `inputs` has labels (-100 ignored).
pub(crate) fn token_classification_loss(
    logits: &Tensor,
    inputs: &ModelInputs<'_>,
    num_labels: i64,
) -> Result<Option<Tensor>> {
    let Some(l) = inputs.labels else {
        return Ok(None);
    };
    Ok(Some(tchtrain_losses::for_token_classification(
        logits, l, num_labels, None,
    )?))
}

/// `...ForMaskedLM`'s loss on `logits` over `vocab_size` tokens when there are `labels`
/// (-100 ignored), summed over `num_items_in_batch` when given.
pub(crate) fn masked_lm_loss(
    logits: &Tensor,
    labels: Option<&Tensor>,
    vocab_size: i64,
    num_items_in_batch: Option<&Tensor>,
) -> Result<Option<Tensor>> {
    let Some(l) = labels else {
        return Ok(None);
    };
    Ok(Some(tchtrain_losses::for_masked_lm_loss(
        logits,
        l,
        vocab_size,
        num_items_in_batch,
        -100,
    )?))
}

/// A task head type (one of this module's unit structs).
pub trait TaskHead: Send + Sync + std::fmt::Debug + 'static {
    /// Which head.
    const KIND: HeadKind;
}

macro_rules! heads {
    ($($(#[$doc:meta])* $name:ident,)*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name;

        impl TaskHead for $name {
            const KIND: HeadKind = HeadKind::$name;
        }
    )*};
}

heads! {
    /// The base model.
    Base,
    /// `...ForMaskedLM`.
    MaskedLm,
    /// `...ForSequenceClassification`.
    SequenceClassification,
    /// `...ForTokenClassification`.
    TokenClassification,
    /// `...ForQuestionAnswering`.
    QuestionAnswering,
}

//! `ForSequenceClassificationLoss`: regression (MSE), single-label (cross-entropy) or
//! multi-label (BCE with logits) classification of pooled logits, and `ProblemType`.

use std::fmt;
use std::str::FromStr;

use tch::{Kind, Reduction, Tensor};

use crate::cross_entropy::{IGNORE_INDEX, fixed_cross_entropy};
use crate::error::{Error, Result};
use crate::validate;

/// The `problem_type` of a sequence-classification config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProblemType {
    /// `"regression"`: mean squared error.
    Regression,
    /// `"single_label_classification"`: cross-entropy over `num_labels` classes.
    SingleLabelClassification,
    /// `"multi_label_classification"`: binary cross-entropy with logits per label.
    MultiLabelClassification,
}

impl ProblemType {
    /// Upstream's string for this problem type.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Regression => "regression",
            Self::SingleLabelClassification => "single_label_classification",
            Self::MultiLabelClassification => "multi_label_classification",
        }
    }

    /// The problem type upstream infers when `config.problem_type` is `None`:
    /// regression when `num_labels == 1`, single-label when `num_labels > 1` and the
    /// labels are `int64`/`int32`, multi-label otherwise.
    pub fn infer(num_labels: i64, labels_kind: Kind) -> Self {
        if num_labels == 1 {
            Self::Regression
        } else if num_labels > 1 && matches!(labels_kind, Kind::Int64 | Kind::Int) {
            Self::SingleLabelClassification
        } else {
            Self::MultiLabelClassification
        }
    }
}

impl fmt::Display for ProblemType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ProblemType {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "regression" => Ok(Self::Regression),
            "single_label_classification" => Ok(Self::SingleLabelClassification),
            "multi_label_classification" => Ok(Self::MultiLabelClassification),
            other => Err(Error::InvalidProblemType(other.to_string())),
        }
    }
}

/// Sequence-classification loss, mirroring upstream's `ForSequenceClassificationLoss`.
///
/// * `labels`: `[batch]` class ids (single-label), `[batch]` or `[batch, num_labels]`
///   floats (regression), `[batch, num_labels]` floats in `[0, 1]` (multi-label);
/// * `pooled_logits`: `[batch, num_labels]`;
/// * `problem_type`: the config's `problem_type`; `None` infers it as upstream does
///   ([`ProblemType::infer`]);
/// * `num_items_in_batch`: passed to [`fixed_cross_entropy`] for single-label
///   classification (upstream forwards its `**kwargs` there); MSE and BCE ignore it.
///
/// ```
/// use tch::{Kind, Tensor};
/// let logits = Tensor::zeros([2, 3], (Kind::Float, tch::Device::Cpu));
/// let labels = Tensor::from_slice(&[0i64, 2]);
/// let loss = tchtrain_losses::for_sequence_classification_loss(&labels, &logits, 3, None, None)?;
/// assert!((loss.double_value(&[]) - 3f64.ln()).abs() < 1e-6);
/// # Ok::<(), tchtrain_losses::Error>(())
/// ```
#[doc(alias = "ForSequenceClassificationLoss")]
pub fn for_sequence_classification_loss(
    labels: &Tensor,
    pooled_logits: &Tensor,
    num_labels: i64,
    problem_type: Option<ProblemType>,
    num_items_in_batch: Option<&Tensor>,
) -> Result<Tensor> {
    validate::positive(num_labels, "num_labels")?;
    validate::float_tensor(pooled_logits, "pooled_logits", "a floating dtype")?;
    validate::non_empty(pooled_logits, "pooled_logits")?;
    validate::non_empty(labels, "labels")?;
    let problem_type =
        problem_type.unwrap_or_else(|| ProblemType::infer(num_labels, labels.kind()));
    let labels = labels.f_to_device(pooled_logits.device())?;
    match problem_type {
        ProblemType::Regression => {
            validate::float_tensor(&labels, "labels", "a floating dtype for regression")?;
            let (logits, labels) = if num_labels == 1 {
                (pooled_logits.f_squeeze()?, labels.f_squeeze()?)
            } else {
                (pooled_logits.shallow_clone(), labels)
            };
            validate::shape_eq(&labels, &logits.size(), "labels")?;
            Ok(logits.f_mse_loss(&labels, Reduction::Mean)?)
        }
        ProblemType::SingleLabelClassification => {
            validate::integer_labels(&labels, "labels")?;
            let logits =
                pooled_logits
                    .f_reshape([-1, num_labels])
                    .map_err(|_| Error::ShapeMismatch {
                        what: "pooled_logits",
                        expected: format!("[batch, {num_labels}]"),
                        got: pooled_logits.size(),
                    })?;
            let labels = labels.f_reshape([-1])?;
            fixed_cross_entropy(&logits, &labels, num_items_in_batch, IGNORE_INDEX)
        }
        ProblemType::MultiLabelClassification => {
            validate::float_tensor(&labels, "labels", "a floating dtype for multi-label")?;
            validate::shape_eq(&labels, &pooled_logits.size(), "labels")?;
            Ok(pooled_logits.f_binary_cross_entropy_with_logits::<Tensor>(
                &labels,
                None,
                None,
                Reduction::Mean,
            )?)
        }
    }
}

//! `LabelSmoother` (upstream `trainer_pt_utils.LabelSmoother`): label-smoothed
//! cross-entropy the Trainer applies when `label_smoothing_factor > 0`.

use tch::{Kind, Tensor};

use crate::cross_entropy::IGNORE_INDEX;
use crate::error::{Error, Result};
use crate::validate;

/// Adds label smoothing on pre-computed logits, mirroring upstream's `LabelSmoother`.
///
/// The loss is `(1 - epsilon) * nll + epsilon * smoothed`, where `nll` is the summed
/// negative log-likelihood of the labels and `smoothed` the summed mean negative
/// log-probability over the vocabulary, both over the non-ignored positions and divided
/// by their count (or by `num_items_in_batch` when given).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LabelSmoother {
    /// The label-smoothing factor (upstream default 0.1).
    pub epsilon: f64,
    /// The label value to ignore (upstream default -100).
    pub ignore_index: i64,
}

impl Default for LabelSmoother {
    fn default() -> Self {
        Self {
            epsilon: 0.1,
            ignore_index: IGNORE_INDEX,
        }
    }
}

impl LabelSmoother {
    /// A smoother with the given `epsilon` and upstream's ignore index (-100).
    pub fn new(epsilon: f64) -> Self {
        Self {
            epsilon,
            ..Self::default()
        }
    }

    /// The smoothed loss of `logits` (`[..., vocab]`) against `labels` (`[...]` or
    /// `[..., 1]`), upstream's `LabelSmoother.__call__` with the model output's logits.
    ///
    /// `shift_labels` drops the last logit and the first label (causal LM);
    /// `num_items_in_batch` replaces the count of non-ignored labels as denominator.
    ///
    /// ```
    /// use tch::{Kind, Tensor};
    /// let logits = Tensor::zeros([1, 2, 4], (Kind::Float, tch::Device::Cpu));
    /// let labels = Tensor::from_slice(&[3i64, -100]).reshape([1, 2]);
    /// let loss = tchtrain_losses::LabelSmoother::new(0.1).compute(&logits, &labels, false, None)?;
    /// // uniform logits: nll and the smoothed term are both ln(4)
    /// assert!((loss.double_value(&[]) - 4f64.ln()).abs() < 1e-6);
    /// # Ok::<(), tchtrain_losses::Error>(())
    /// ```
    #[doc(alias = "__call__")]
    pub fn compute(
        &self,
        logits: &Tensor,
        labels: &Tensor,
        shift_labels: bool,
        num_items_in_batch: Option<&Tensor>,
    ) -> Result<Tensor> {
        validate::float_tensor(logits, "logits", "a floating dtype")?;
        validate::integer_labels(labels, "labels")?;
        validate::non_empty(logits, "logits")?;
        if logits.dim() < 2 {
            return Err(Error::ShapeMismatch {
                what: "logits",
                expected: "[..., seq, vocab]".into(),
                got: logits.size(),
            });
        }
        let (logits, labels) = if shift_labels {
            let seq_dim = logits.dim() as i64 - 2;
            let seq = logits.size()[seq_dim as usize];
            let label_len = labels.size().last().copied().unwrap_or(0);
            if seq < 2 || label_len < 2 {
                return Err(Error::ShapeMismatch {
                    what: "logits",
                    expected: "at least 2 positions when shift_labels is true".into(),
                    got: logits.size(),
                });
            }
            (
                logits.f_narrow(seq_dim, 0, seq - 1)?.f_contiguous()?,
                labels.f_narrow(-1, 1, label_len - 1)?.f_contiguous()?,
            )
        } else {
            (logits.shallow_clone(), labels.shallow_clone())
        };

        let log_probs = logits.f_log_softmax(-1, None::<Kind>)?.f_neg()?;
        let labels = if labels.dim() == log_probs.dim() - 1 {
            labels.f_unsqueeze(-1)?
        } else {
            labels
        };
        let mut expected = log_probs.size();
        *expected.last_mut().expect("dim >= 2") = 1;
        validate::shape_eq(&labels, &expected, "labels")?;
        let vocab = log_probs.size()[log_probs.dim() - 1];
        validate::labels_in_range(&labels, vocab, self.ignore_index, "labels")?;
        let labels = labels
            .f_to_kind(Kind::Int64)?
            .f_to_device(log_probs.device())?;

        let padding_mask = labels.f_eq(self.ignore_index)?;
        let labels = labels.f_clamp_min(0)?;
        let mut nll_loss = log_probs.f_gather(-1, &labels, false)?;
        let mut smoothed_loss =
            log_probs.f_sum_dim_intlist([-1i64].as_slice(), true, Kind::Float)?;
        let _ = nll_loss.f_masked_fill_(&padding_mask, 0.0)?;
        let _ = smoothed_loss.f_masked_fill_(&padding_mask, 0.0)?;

        let denominator = match num_items_in_batch {
            None => {
                let ignored = padding_mask.f_to_kind(Kind::Int64)?.f_sum(None::<Kind>)?;
                ignored.f_neg()?.f_add_scalar(padding_mask.numel() as i64)?
            }
            Some(n) => n.f_to_device(nll_loss.device())?,
        };
        let nll_loss = nll_loss.f_sum(None::<Kind>)?.f_div(&denominator)?;
        let smoothed_loss = smoothed_loss
            .f_sum(None::<Kind>)?
            .f_div(&denominator.f_mul_scalar(vocab)?)?;
        Ok(nll_loss
            .f_mul_scalar(1.0 - self.epsilon)?
            .f_add(&smoothed_loss.f_mul_scalar(self.epsilon)?)?)
    }
}

//! `ForTokenClassification`: per-token cross-entropy over `num_labels` classes.

use tch::{Kind, Tensor};

use crate::cross_entropy::{IGNORE_INDEX, fixed_cross_entropy};
use crate::error::{Error, Result};
use crate::validate;

/// Token-classification loss, mirroring upstream's `ForTokenClassification`.
///
/// * `logits`: `[..., seq, num_labels]` (upcast to float32 as upstream does);
/// * `labels`: `[..., seq]` class ids, `-100` at ignored positions (sub-word
///   continuations and padding, as `DataCollatorForTokenClassification` pads them);
/// * `num_items_in_batch`: see [`fixed_cross_entropy`].
///
/// ```
/// use tch::{Kind, Tensor};
/// let logits = Tensor::zeros([1, 2, 3], (Kind::Float, tch::Device::Cpu));
/// let labels = Tensor::from_slice(&[2i64, -100]).reshape([1, 2]);
/// let loss = tchtrain_losses::for_token_classification(&logits, &labels, 3, None)?;
/// assert!((loss.double_value(&[]) - 3f64.ln()).abs() < 1e-6);
/// # Ok::<(), tchtrain_losses::Error>(())
/// ```
#[doc(alias = "ForTokenClassification")]
pub fn for_token_classification(
    logits: &Tensor,
    labels: &Tensor,
    num_labels: i64,
    num_items_in_batch: Option<&Tensor>,
) -> Result<Tensor> {
    validate::positive(num_labels, "num_labels")?;
    validate::float_tensor(logits, "logits", "a floating dtype")?;
    validate::integer_labels(labels, "labels")?;
    validate::non_empty(logits, "logits")?;
    let size = logits.size();
    if size.last() != Some(&num_labels) {
        return Err(Error::ShapeMismatch {
            what: "logits",
            expected: format!("[..., seq, {num_labels}] (last dimension = num_labels)"),
            got: size,
        });
    }
    validate::shape_eq(labels, &size[..size.len() - 1], "labels")?;
    let logits = logits.f_reshape([-1, num_labels])?;
    let labels = labels.f_reshape([-1])?.f_to_device(logits.device())?;
    let logits = logits.f_to_kind(Kind::Float)?;
    fixed_cross_entropy(&logits, &labels, num_items_in_batch, IGNORE_INDEX)
}

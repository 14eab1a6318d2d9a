//! `ForMaskedLMLoss`: cross-entropy over every position whose label is not ignored.

use tch::{Kind, Tensor};

use crate::cross_entropy::fixed_cross_entropy;
use crate::error::{Error, Result};
use crate::validate;

/// Masked-LM loss, mirroring upstream's `ForMaskedLMLoss`.
///
/// * `logits`: `[..., seq, vocab_size]`, upcast to float32 as upstream does;
/// * `labels`: `[..., seq]`, the original token at masked positions and `ignore_index`
///   elsewhere (what `DataCollatorForLanguageModeling` produces);
/// * `num_items_in_batch`: see [`fixed_cross_entropy`].
///
/// ```
/// use tch::{Kind, Tensor};
/// let logits = Tensor::zeros([1, 2, 4], (Kind::Float, tch::Device::Cpu));
/// let labels = Tensor::from_slice(&[3i64, -100]).reshape([1, 2]);
/// let loss = tchtrain_losses::for_masked_lm_loss(&logits, &labels, 4, None, -100)?;
/// assert!((loss.double_value(&[]) - 4f64.ln()).abs() < 1e-6);
/// # Ok::<(), tchtrain_losses::Error>(())
/// ```
#[doc(alias = "ForMaskedLMLoss")]
pub fn for_masked_lm_loss(
    logits: &Tensor,
    labels: &Tensor,
    vocab_size: i64,
    num_items_in_batch: Option<&Tensor>,
    ignore_index: i64,
) -> Result<Tensor> {
    validate::positive(vocab_size, "vocab_size")?;
    validate::float_tensor(logits, "logits", "a floating dtype")?;
    validate::integer_labels(labels, "labels")?;
    validate::non_empty(logits, "logits")?;
    let size = logits.size();
    if size.last() != Some(&vocab_size) {
        return Err(Error::ShapeMismatch {
            what: "logits",
            expected: format!("[..., seq, {vocab_size}] (last dimension = vocab_size)"),
            got: size,
        });
    }
    validate::shape_eq(labels, &size[..size.len() - 1], "labels")?;
    let logits = logits.f_to_kind(Kind::Float)?.f_reshape([-1, vocab_size])?;
    let labels = labels.f_reshape([-1])?.f_to_device(logits.device())?;
    fixed_cross_entropy(&logits, &labels, num_items_in_batch, ignore_index)
}

//! `ForCausalLMLoss`: next-token cross-entropy with the labels shifted left by one
//! (also upstream's loss for `ForConditionalGeneration`).

use tch::{Kind, Tensor};

use crate::cross_entropy::fixed_cross_entropy;
use crate::error::{Error, Result};
use crate::validate;

/// Causal-LM loss, mirroring upstream's `ForCausalLMLoss`.
///
/// * `logits`: `[..., seq, vocab_size]`, upcast to float32 first as upstream does (the
///   gradient flows back to the original dtype);
/// * `labels`: `[..., seq]` integer token ids or `ignore_index`; position `t` of the
///   logits is scored against label `t + 1` (the labels are padded on the right with
///   `ignore_index` and shifted, so the last position is ignored);
/// * `shift_labels`: already-shifted labels `[..., seq]`; when given, `labels` is not
///   used (upstream's behaviour; context-parallel training passes these);
/// * `num_items_in_batch`: see [`fixed_cross_entropy`].
///
/// ```
/// use tch::{Kind, Tensor};
/// let logits = Tensor::zeros([1, 3, 5], (Kind::Float, tch::Device::Cpu));
/// let labels = Tensor::from_slice(&[-100i64, 2, 4]).reshape([1, 3]);
/// let loss = tchtrain_losses::for_causal_lm_loss(&logits, &labels, 5, None, -100, None)?;
/// assert!((loss.double_value(&[]) - 5f64.ln()).abs() < 1e-6);
/// # Ok::<(), tchtrain_losses::Error>(())
/// ```
#[doc(alias = "ForCausalLMLoss")]
pub fn for_causal_lm_loss(
    logits: &Tensor,
    labels: &Tensor,
    vocab_size: i64,
    num_items_in_batch: Option<&Tensor>,
    ignore_index: i64,
    shift_labels: Option<&Tensor>,
) -> Result<Tensor> {
    validate::positive(vocab_size, "vocab_size")?;
    validate::float_tensor(logits, "logits", "a floating dtype")?;
    validate::non_empty(logits, "logits")?;
    let size = logits.size();
    if size.last() != Some(&vocab_size) {
        return Err(Error::ShapeMismatch {
            what: "logits",
            expected: format!("[..., seq, {vocab_size}] (last dimension = vocab_size)"),
            got: size,
        });
    }
    let leading = &size[..size.len() - 1];
    let logits = logits.f_to_kind(Kind::Float)?;

    let shift_labels = match shift_labels {
        Some(shifted) => {
            validate::integer_labels(shifted, "shift_labels")?;
            validate::shape_eq(shifted, leading, "shift_labels")?;
            shifted.shallow_clone()
        }
        None => {
            validate::integer_labels(labels, "labels")?;
            validate::shape_eq(labels, leading, "labels")?;
            // labels = F.pad(labels, (0, 1), value=ignore_index); labels[..., 1:]
            let padded = labels.f_pad([0, 1], "constant", Some(ignore_index as f64))?;
            let len = padded.size()[padded.dim() - 1];
            padded.f_narrow(-1, 1, len - 1)?.f_contiguous()?
        }
    };
    let logits = logits.f_reshape([-1, vocab_size])?;
    let shift_labels = shift_labels.f_reshape([-1])?.f_to_device(logits.device())?;
    fixed_cross_entropy(&logits, &shift_labels, num_items_in_batch, ignore_index)
}

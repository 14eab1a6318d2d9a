//! `fixed_cross_entropy`: the cross-entropy every token-level loss of `LOSS_MAPPING`
//! is built on, with upstream's `num_items_in_batch` normalisation.

use tch::{Kind, Reduction, Tensor};

use crate::error::{Error, Result};
use crate::validate;

/// The ignore index of PyTorch's `cross_entropy` and of every upstream loss (`-100`).
pub const IGNORE_INDEX: i64 = -100;

/// Cross-entropy of `source` (logits, classes on dimension 1) against the class indices
/// `target`, mirroring upstream's `fixed_cross_entropy`.
///
/// * `source`: `[N, C]` (or `[N, C, d1, ...]`, or `[C]`), any floating dtype;
/// * `target`: `[N]` (or `[N, d1, ...]`, or `[]`), integer class indices in `0..C` or
///   `ignore_index`;
/// * `num_items_in_batch`: when given the loss is summed (`reduction="sum"`) and divided
///   by it, exactly as upstream (the Trainer passes the number of label tokens in the
///   whole accumulation window so that the gradient-accumulated loss equals the loss of
///   one big batch); when `None` it is the mean over the non-ignored targets.
///
/// Like upstream, a batch whose targets are all `ignore_index` gives NaN without
/// `num_items_in_batch` (0 / 0) and `0 / num_items_in_batch` with it.
///
/// ```
/// use tch::{Kind, Tensor};
/// let logits = Tensor::from_slice(&[1.0f32, 2.0, 0.5, 0.0, 0.0, 3.0]).reshape([2, 3]);
/// let labels = Tensor::from_slice(&[1i64, -100]);
/// let loss = tchtrain_losses::fixed_cross_entropy(&logits, &labels, None, -100)?;
/// let manual = -logits.get(0).log_softmax(-1, Kind::Float).double_value(&[1]);
/// assert!((loss.double_value(&[]) - manual).abs() < 1e-6);
/// # Ok::<(), tchtrain_losses::Error>(())
/// ```
pub fn fixed_cross_entropy(
    source: &Tensor,
    target: &Tensor,
    num_items_in_batch: Option<&Tensor>,
    ignore_index: i64,
) -> Result<Tensor> {
    validate::float_tensor(source, "source", "a floating dtype (logits)")?;
    validate::integer_labels(target, "target")?;
    validate::non_empty(source, "source")?;
    let size = source.size();
    let (num_classes, expected) = match size.len() {
        0 => {
            return Err(Error::ShapeMismatch {
                what: "source",
                expected: "[N, C, ...] or [C]".into(),
                got: size,
            });
        }
        1 => (size[0], Vec::new()),
        _ => {
            let mut expected = size.clone();
            expected.remove(1);
            (size[1], expected)
        }
    };
    validate::shape_eq(target, &expected, "target")?;
    validate::labels_in_range(target, num_classes, ignore_index, "target")?;
    let target = if target.kind() == Kind::Int64 {
        target.shallow_clone()
    } else {
        target.f_to_kind(Kind::Int64)?
    };

    let reduction = if num_items_in_batch.is_some() {
        Reduction::Sum
    } else {
        Reduction::Mean
    };
    let loss =
        source.f_cross_entropy_loss::<Tensor>(&target, None, reduction, ignore_index, 0.0)?;
    match num_items_in_batch {
        Some(n) => Ok(loss.f_div(&n.f_to_device(loss.device())?)?),
        None => Ok(loss),
    }
}

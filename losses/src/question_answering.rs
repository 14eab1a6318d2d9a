//! `ForQuestionAnsweringLoss`: mean of the start- and end-position cross-entropies of
//! extractive question answering.

use tch::Tensor;

use crate::cross_entropy::fixed_cross_entropy;
use crate::error::{Error, Result};
use crate::validate;

/// Extractive QA loss, mirroring upstream's `ForQuestionAnsweringLoss`.
///
/// * `start_logits`, `end_logits`: `[batch, seq]`;
/// * `start_positions`, `end_positions`: `[batch]` (or `[batch, 1]`, squeezed as
///   upstream does) integer positions. Like upstream, positions are clamped to
///   `0..=seq`, and `seq` is the ignore index: a position past the end of the input
///   is ignored, a negative one counts as position 0;
/// * `num_items_in_batch`: see [`fixed_cross_entropy`] (upstream forwards its
///   `**kwargs` there).
///
/// Returns `(start_loss + end_loss) / 2`.
///
/// ```
/// use tch::{Kind, Tensor};
/// let logits = Tensor::zeros([2, 4], (Kind::Float, tch::Device::Cpu));
/// let starts = Tensor::from_slice(&[1i64, 9]); // 9 is past the end: ignored
/// let ends = Tensor::from_slice(&[2i64, 3]);
/// let loss =
///     tchtrain_losses::for_question_answering_loss(&logits, &logits, &starts, &ends, None)?;
/// assert!((loss.double_value(&[]) - 4f64.ln()).abs() < 1e-6);
/// # Ok::<(), tchtrain_losses::Error>(())
/// ```
#[doc(alias = "ForQuestionAnsweringLoss")]
pub fn for_question_answering_loss(
    start_logits: &Tensor,
    end_logits: &Tensor,
    start_positions: &Tensor,
    end_positions: &Tensor,
    num_items_in_batch: Option<&Tensor>,
) -> Result<Tensor> {
    for (logits, what) in [(start_logits, "start_logits"), (end_logits, "end_logits")] {
        validate::float_tensor(logits, what, "a floating dtype")?;
        validate::non_empty(logits, what)?;
        if logits.dim() != 2 {
            return Err(Error::ShapeMismatch {
                what,
                expected: "[batch, seq]".into(),
                got: logits.size(),
            });
        }
    }
    validate::shape_eq(end_logits, &start_logits.size(), "end_logits")?;
    let batch = start_logits.size()[0];
    let ignored_index = start_logits.size()[1];
    let prepare = |positions: &Tensor, what: &'static str| -> Result<Tensor> {
        validate::integer_labels(positions, what)?;
        let positions = if positions.dim() > 1 {
            positions.f_squeeze_dim(-1)?
        } else {
            positions.shallow_clone()
        };
        validate::shape_eq(&positions, &[batch], what)?;
        Ok(positions
            .f_to_device(start_logits.device())?
            .f_clamp(0, ignored_index)?)
    };
    let start_positions = prepare(start_positions, "start_positions")?;
    let end_positions = prepare(end_positions, "end_positions")?;
    let start_loss = fixed_cross_entropy(
        start_logits,
        &start_positions,
        num_items_in_batch,
        ignored_index,
    )?;
    let end_loss = fixed_cross_entropy(
        end_logits,
        &end_positions,
        num_items_in_batch,
        ignored_index,
    )?;
    Ok(start_loss.f_add(&end_loss)?.f_div_scalar(2)?)
}

//! Global gradient-norm clipping, as `torch.nn.utils.clip_grad_norm_` (and its parts
//! `get_total_norm` / `clip_grads_with_norm_`), plus `clip_grad_value_`.
//!
//! Same ops as torch's CPU path: a `linalg.vector_norm` per gradient, the norm of the
//! stacked norms, `clip_coef = max_norm * (total + 1e-6).reciprocal()` clamped to 1, and an
//! in-place multiply of each gradient by that 0-d tensor.

use tch::{Device, Kind, Tensor};

use crate::optimizer::grad_of;
use crate::{Error, Result, ffi};

/// `torch.linalg.vector_norm(t, ord)`: the norm of all of `t`'s elements, a 0-d tensor
/// (the per-gradient norm of [`get_total_norm`]).
pub fn vector_norm(t: &Tensor, ord: f64) -> Result<Tensor> {
    ffi::vector_norm(t, ord)
}

/// The norm of the norms of `tensors` (as if concatenated into one vector), a 0-d tensor
/// (`torch.nn.utils.get_total_norm`). `norm_type` may be `f64::INFINITY`. An empty list gives
/// `tensor(0.)`.
pub fn get_total_norm(
    tensors: &[Tensor],
    norm_type: f64,
    error_if_nonfinite: bool,
) -> Result<Tensor> {
    let Some(first) = tensors.first() else {
        return Ok(Tensor::f_scalar_tensor(0.0, (Kind::Float, Device::Cpu))?);
    };
    let first_device = first.device();
    let norms = tensors
        .iter()
        .map(|t| {
            ffi::vector_norm(t, norm_type)?
                .f_to_device(first_device)
                .map_err(Error::from)
        })
        .collect::<Result<Vec<_>>>()?;
    let total = ffi::vector_norm(&Tensor::f_stack(&norms, 0)?, norm_type)?;
    if error_if_nonfinite {
        let v = total.f_double_value(&[])?;
        if v.is_nan() || v.is_infinite() {
            return Err(Error::NonFiniteNorm { norm_type });
        }
    }
    Ok(total)
}

/// Scales the gradients of `params` in place by `min(max_norm / (total_norm + 1e-6), 1)`
/// (`torch.nn.utils.clip_grads_with_norm_`).
pub fn clip_grads_with_norm(params: &[Tensor], max_norm: f64, total_norm: &Tensor) -> Result<()> {
    let grads: Vec<Tensor> = params.iter().filter_map(grad_of).collect();
    if grads.is_empty() {
        return Ok(());
    }
    let coef = total_norm
        .f_add_scalar(1e-6)?
        .f_reciprocal()?
        .f_mul_scalar(max_norm)?;
    let coef = coef.f_clamp_max(1.0)?;
    tch::no_grad(|| {
        for mut g in grads {
            let c = coef.f_to_device(g.device())?;
            let _ = g.f_mul_(&c)?;
        }
        Ok(())
    })
}

/// Clips the global gradient norm of `params` to `max_norm` and returns the total norm before
/// clipping, a 0-d float tensor (`torch.nn.utils.clip_grad_norm_`). Parameters without a
/// gradient are ignored. With `error_if_nonfinite`, a nan / inf total is
/// [`Error::NonFiniteNorm`] and nothing is scaled.
///
/// ```
/// use tch::{Device, Kind, Tensor};
/// let p = Tensor::zeros([2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
/// (&p * Tensor::from_slice(&[3.0f32, 4.0])).sum(Kind::Float).backward();
/// let total = tchtrain_optim::clip_grad_norm(&[p.shallow_clone()], 1.0, 2.0, false)?;
/// assert!((total.double_value(&[]) - 5.0).abs() < 1e-6);
/// assert!((p.grad().double_value(&[1]) - 0.8).abs() < 1e-6);
/// # Ok::<(), tchtrain_optim::Error>(())
/// ```
#[doc(alias = "clip_grad_norm_")]
pub fn clip_grad_norm(
    params: &[Tensor],
    max_norm: f64,
    norm_type: f64,
    error_if_nonfinite: bool,
) -> Result<Tensor> {
    let grads: Vec<Tensor> = params.iter().filter_map(grad_of).collect();
    let total = tch::no_grad(|| get_total_norm(&grads, norm_type, error_if_nonfinite))?;
    clip_grads_with_norm(params, max_norm, &total)?;
    Ok(total)
}

/// The Trainer's rule: clip with the L2 norm when `max_grad_norm > 0` and return the total
/// norm as `f64`; `max_grad_norm <= 0` disables clipping (returns `None`).
pub fn clip_grad_norm_if_enabled(params: &[Tensor], max_grad_norm: f64) -> Result<Option<f64>> {
    if max_grad_norm > 0.0 {
        let total = clip_grad_norm(params, max_grad_norm, 2.0, false)?;
        Ok(Some(total.f_double_value(&[])?))
    } else {
        Ok(None)
    }
}

/// Clamps every gradient of `params` to `[-clip_value, clip_value]` in place
/// (`torch.nn.utils.clip_grad_value_`).
#[doc(alias = "clip_grad_value_")]
pub fn clip_grad_value(params: &[Tensor], clip_value: f64) -> Result<()> {
    tch::no_grad(|| {
        for mut g in params.iter().filter_map(grad_of) {
            let _ = g.f_clamp_(-clip_value, clip_value)?;
        }
        Ok(())
    })
}

//! TRL's `ChunkedLogProbFunction` (`trl/kernels/chunked_logprob.py`, its torch fallback for
//! devices without Triton), computed by `tchtrain-sys` (`csrc/chunked_logprob.cpp`): the
//! per-token log-probabilities of `hidden @ weight.T` without the `[N, V]` logits, and the
//! entropy and whether the target is the (first) argmax, with TRL's backward.

use tch::Tensor;

use crate::error::{Error, Result};

/// TRL's `_CHUNKED_LOGPROB_CHUNK_SIZE`: the vocabulary tile.
pub const CHUNKED_LOGPROB_CHUNK_SIZE: i64 = 32768;

/// What [`chunked_logprob`] returns (TRL's optional outputs `entropy` and `is_top1` always
/// computed).
#[derive(Debug)]
pub struct ChunkedLogProbs {
    /// `log p(target)` per token `[N]` (float32), differentiable.
    pub log_probs: Tensor,
    /// The entropy of each token's distribution `[N]` (float32), differentiable.
    pub entropy: Tensor,
    /// Whether the target is the first maximum of its logits `[N]` (bool).
    pub is_top1: Tensor,
}

/// `ChunkedLogProbFunction.apply(hidden, weight, bias, targets, temperature, chunk_size,
/// final_logit_softcapping, logit_scale, ("log_probs", "entropy", "is_top1"))`: `hidden`
/// `[N, H]`, `weight` `[V, H]`, `targets` `[N]` (int64, in `0..V`). The projection runs in the
/// autocast dtype when autocast is on, else in `hidden`'s.
#[allow(unsafe_code)]
#[allow(clippy::too_many_arguments)]
pub fn chunked_logprob(
    hidden: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    targets: &Tensor,
    temperature: f64,
    chunk_size: i64,
    final_logit_softcapping: Option<f64>,
    logit_scale: f64,
) -> Result<ChunkedLogProbs> {
    if chunk_size <= 0 || temperature == 0.0 {
        return Err(Error::InvalidArgument {
            field: "chunk_size",
            detail: format!(
                "chunk_size {chunk_size}, temperature {temperature}: both must be positive"
            ),
        });
    }
    let mut out: [*mut torch_sys::C_tensor; 3] = [std::ptr::null_mut(); 3];
    // SAFETY: every tensor is live for the call; the shim writes three owned tensors (or
    // nulls) into `out`.
    let err = unsafe {
        tchtrain_sys::tchtrain_chunked_logprob(
            hidden.as_ptr(),
            weight.as_ptr(),
            bias.map_or(std::ptr::null(), |b| b.as_ptr()),
            targets.as_ptr(),
            temperature,
            chunk_size,
            final_logit_softcapping.unwrap_or(f64::NAN),
            logit_scale,
            true,
            true,
            out.as_mut_ptr(),
        )
    };
    // SAFETY: the shim's result, freed by `take_error`.
    unsafe { tchtrain_sys::take_error(err) }.map_err(|m| Error::Torch(tch::TchError::Torch(m)))?;
    // SAFETY: each non-null pointer was allocated by the shim with `new at::Tensor(..)` and is
    // owned by nobody else.
    let take = |p: *mut torch_sys::C_tensor| -> Result<Tensor> {
        if p.is_null() {
            return Err(Error::Torch(tch::TchError::Torch(
                "chunked_logprob: an output was not computed".into(),
            )));
        }
        Ok(unsafe { Tensor::from_ptr(p) })
    };
    Ok(ChunkedLogProbs {
        log_probs: take(out[0])?,
        entropy: take(out[1])?,
        is_top1: take(out[2])?,
    })
}

//! TRL's `ChunkedLogProbFunction` (`trl/kernels/chunked_logprob.py`, its torch fallback for
//! devices without Triton), computed by `tchtrain-sys` (`csrc/chunked_logprob.cpp`): the
//! per-token log-probabilities of `hidden @ weight.T` without the `[N, V]` logits, and on
//! request the entropy, `log(sum_v p_v^2)`, the mean logit and whether the target is the
//! (first) argmax, with TRL's backward.

use tch::Tensor;

use crate::error::{Error, Result};

/// TRL's `_CHUNKED_LOGPROB_CHUNK_SIZE`: the vocabulary tile.
pub const CHUNKED_LOGPROB_CHUNK_SIZE: i64 = 32768;

/// The optional outputs (TRL's `outputs` tuple beside `log_probs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogProbOutputs {
    /// `"entropy"`.
    pub entropy: bool,
    /// `"log_sum_sq_probs"`.
    pub log_sum_sq_probs: bool,
    /// `"mean_logits"`.
    pub mean_logits: bool,
    /// `"is_top1"`.
    pub is_top1: bool,
}

/// What [`chunked_logprob`] returns (the optional outputs `None` unless asked for).
#[derive(Debug)]
pub struct ChunkedLogProbs {
    /// `log p(target)` per token `[N]` (float32), differentiable.
    pub log_probs: Tensor,
    /// The entropy of each token's distribution `[N]` (float32), differentiable.
    pub entropy: Option<Tensor>,
    /// `log(sum_v p_v^2)` per token `[N]` (float32).
    pub log_sum_sq_probs: Option<Tensor>,
    /// The mean of each token's (transformed) logits `[N]` (float32).
    pub mean_logits: Option<Tensor>,
    /// Whether the target is the first maximum of its logits `[N]` (bool).
    pub is_top1: Option<Tensor>,
}

/// `ChunkedLogProbFunction.apply(hidden, weight, bias, targets, temperature, chunk_size,
/// final_logit_softcapping, logit_scale, outputs)`: `hidden` `[N, H]`, `weight` `[V, H]`,
/// `targets` `[N]` (int64, in `0..V`). The projection runs in the autocast dtype when autocast
/// is on, else in `hidden`'s.
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
    outputs: LogProbOutputs,
) -> Result<ChunkedLogProbs> {
    if chunk_size <= 0 || temperature == 0.0 {
        return Err(Error::InvalidArgument {
            field: "chunk_size",
            detail: format!(
                "chunk_size {chunk_size}, temperature {temperature}: both must be positive"
            ),
        });
    }
    let mut out: [*mut torch_sys::C_tensor; 5] = [std::ptr::null_mut(); 5];
    // SAFETY: every tensor is live for the call; the shim writes five owned tensors (or
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
            outputs.entropy,
            outputs.is_top1,
            outputs.log_sum_sq_probs,
            outputs.mean_logits,
            out.as_mut_ptr(),
        )
    };
    // SAFETY: the shim's result, freed by `take_error`.
    unsafe { tchtrain_sys::take_error(err) }.map_err(|m| Error::Torch(tch::TchError::Torch(m)))?;
    // SAFETY: each non-null pointer was allocated by the shim with `new at::Tensor(..)` and is
    // owned by nobody else.
    let take = |p: *mut torch_sys::C_tensor| -> Option<Tensor> {
        (!p.is_null()).then(|| unsafe { Tensor::from_ptr(p) })
    };
    let [log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1] = out.map(take);
    Ok(ChunkedLogProbs {
        log_probs: log_probs.ok_or_else(|| {
            Error::Torch(tch::TchError::Torch(
                "chunked_logprob: the log-probabilities were not computed".into(),
            ))
        })?,
        entropy,
        log_sum_sq_probs,
        mean_logits,
        is_top1,
    })
}

//! `use_liger_kernel` (upstream `integrations/liger.py`, which calls Liger-Kernel's
//! `_apply_liger_kernel_to_instance`): the fused linear + cross-entropy loss, which computes
//! a causal LM's training loss chunk of rows by chunk of rows without ever holding the
//! whole `[tokens, vocab]` logits, and Liger's per-model-type options.
//!
//! Liger's other kernels (RoPE, RMSNorm, SwiGLU, its cross-entropy) are Triton versions of
//! the same functions; here the model keeps its own ops for them, which compute the same
//! numbers, and the options are accepted as such.
//!
//! The chunked loss ([`fused_linear_cross_entropy`]) computes, as Liger does, each chunk's
//! logits, its summed loss and its gradients in the forward, and drops the logits: one
//! chunk's logits are alive at a time, and the backward has only to scale the gradients.
//! The chunk size is Liger's (`chunk_mem_const = 1`): the next power of two of
//! `tokens / ceil(vocab / hidden)`, so that a chunk's logits are about as large as the
//! hidden states, but at least 8 rows (see [`MIN_CHUNK_ROWS`]).

use serde_json::Value;
use tch::{Kind, Tensor};

use crate::error::{Error, Result};

/// Liger's options for a model type (`liger_kernel_config`), with Liger's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LigerKernelConfig {
    /// `fused_linear_cross_entropy` (default true): the chunked loss, no logits in training.
    pub fused_linear_cross_entropy: bool,
    /// `cross_entropy` (default false): Liger's cross-entropy on the full logits, the same
    /// numbers as the plain loss.
    pub cross_entropy: bool,
    /// `rope`, `rms_norm`, `swiglu` (default true): Liger's kernels for the same functions.
    pub rope: bool,
    #[allow(missing_docs)]
    pub rms_norm: bool,
    #[allow(missing_docs)]
    pub swiglu: bool,
}

impl Default for LigerKernelConfig {
    fn default() -> Self {
        Self {
            fused_linear_cross_entropy: true,
            cross_entropy: false,
            rope: true,
            rms_norm: true,
            swiglu: true,
        }
    }
}

/// The keys of Liger's `apply_liger_kernel_to_llama` (which also serves `mistral`, `qwen2`,
/// ... with the same names).
const LLAMA_KEYS: &[&str] = &[
    "rope",
    "cross_entropy",
    "fused_linear_cross_entropy",
    "rms_norm",
    "swiglu",
];

impl LigerKernelConfig {
    /// From upstream's `liger_kernel_config` for a model of type `model_type`. Liger drops
    /// keys its apply function does not take; here they are an error naming them, as is a
    /// value that is not a boolean, and Liger's assertion that `cross_entropy` and
    /// `fused_linear_cross_entropy` are not both true.
    pub fn from_json(config: Option<&Value>, model_type: &str) -> Result<Self> {
        let mut out = Self::default();
        let bad = |detail: String| Error::InvalidArgument {
            field: "liger_kernel_config",
            detail,
        };
        let Some(config) = config else {
            return Ok(out);
        };
        let map = config.as_object().ok_or_else(|| {
            bad(format!(
                "{config}: give an object of options, e.g. {{\"rope\": true}}"
            ))
        })?;
        for (key, value) in map {
            let flag = value
                .as_bool()
                .ok_or_else(|| bad(format!("{key}={value}: use true or false")))?;
            match key.as_str() {
                "rope" => out.rope = flag,
                "cross_entropy" => out.cross_entropy = flag,
                "fused_linear_cross_entropy" => out.fused_linear_cross_entropy = flag,
                "rms_norm" => out.rms_norm = flag,
                "swiglu" => out.swiglu = flag,
                _ => {
                    return Err(bad(format!(
                        "`{key}` is not an option of Liger's kernels for model type {model_type} (Liger would drop it silently); its options are {}",
                        LLAMA_KEYS.join(", ")
                    )));
                }
            }
        }
        if out.cross_entropy && out.fused_linear_cross_entropy {
            return Err(bad(
                "cross_entropy and fused_linear_cross_entropy cannot both be True. (Liger's assertion; set one of them to false)".into(),
            ));
        }
        Ok(out)
    }
}

/// The fewest rows a chunk has here. Liger's rule gives 1 or 2 rows when the vocabulary is
/// much wider than the hidden size (tiny Llama: 49152 over 64); libtorch's CPU matmul then
/// reduces the gradient's `[rows, vocab] @ [vocab, hidden]` product in a long float32 sum
/// whose error measured 10x the plain path's (6e-6 against 6e-7 relative to float64, on
/// every gradient of tiny Llama); from 4 rows on it is the plain path's. 8 rows of a
/// 50k vocabulary are 1.5 MB of logits.
const MIN_CHUNK_ROWS: i64 = 8;

/// Liger's chunk size for `tokens` rows of width `hidden` against a `vocab`-row head.
pub(crate) fn chunk_size(tokens: i64, hidden: i64, vocab: i64) -> i64 {
    let inc_factor = (vocab + hidden - 1) / hidden.max(1);
    let rows = (tokens + inc_factor - 1) / inc_factor.max(1);
    (rows.max(1) as u64)
        .next_power_of_two()
        .min(tokens.max(1) as u64) as i64
}

/// Liger's `LigerForCausalLMLoss`: `hidden` `[batch, seq, hidden]` against the head
/// `weight` `[vocab, hidden]`, the labels shifted as upstream's causal LM loss shifts them
/// (padded with `ignore_index`, `labels[..., 1:]`), the cross-entropy in float32 summed
/// chunk by chunk, then divided by `num_items_in_batch` when given, else by the number of
/// labels that are not `ignore_index` (a mean).
pub fn liger_for_causal_lm_loss(
    hidden: &Tensor,
    weight: &Tensor,
    labels: &Tensor,
    num_items_in_batch: Option<&Tensor>,
    ignore_index: i64,
) -> Result<Tensor> {
    let width = *hidden
        .size()
        .last()
        .ok_or(Error::MissingInput { name: "hidden" })?;
    let padded = labels.f_pad([0, 1], "constant", Some(ignore_index as f64))?;
    let len = padded.size()[padded.dim() - 1];
    let shift_labels = padded
        .f_narrow(-1, 1, len - 1)?
        .f_contiguous()?
        .f_reshape([-1])?
        .f_to_device(hidden.device())?;
    let hidden = hidden.f_reshape([-1, width])?;
    let sum = fused_linear_cross_entropy(&hidden, weight, &shift_labels, ignore_index)?;
    Ok(match num_items_in_batch {
        Some(n) => sum.f_div(&n.f_to_device(sum.device())?)?,
        None => {
            let count = shift_labels.f_ne(ignore_index)?.f_sum(Kind::Float)?;
            sum.f_div(&count)?
        }
    })
}

/// The summed float32 cross-entropy of `hidden @ weight.T` (`[tokens, hidden]` against
/// `[vocab, hidden]`) with `target`, computed chunk by chunk (see the module documentation).
///
/// As Liger's `LigerFusedLinearCrossEntropyFunction`, the gradients are computed in the
/// forward, chunk by chunk (`d = softmax - onehot`, `grad_hidden = d @ W`,
/// `grad_weight += d.T @ hidden`, accumulated in place), and the backward only scales them
/// by the incoming gradient. The returned loss carries them through
/// `dot(hidden, grad_hidden) - dot(..).detach()` (and the same for the weight), whose value
/// is exactly 0 and whose gradient is exactly the precomputed one, so no custom autograd
/// node is needed. Nothing is precomputed when neither input requires a gradient.
pub fn fused_linear_cross_entropy(
    hidden: &Tensor,
    weight: &Tensor,
    target: &Tensor,
    ignore_index: i64,
) -> Result<Tensor> {
    let (tokens, width) = (hidden.size()[0], hidden.size()[1]);
    let vocab = weight.size()[0];
    let chunk = chunk_size(tokens, width, vocab)
        .max(MIN_CHUNK_ROWS)
        .min(tokens.max(1));
    // Whether autograd records here (tch has no `is_grad_enabled`): an op on a leaf that
    // requires a gradient gives a result that does only when it does.
    let grad_enabled = Tensor::f_zeros([1], (Kind::Float, tch::Device::Cpu))?
        .set_requires_grad(true)
        .f_mul_scalar(1.0)?
        .requires_grad();
    let want_x = grad_enabled && hidden.requires_grad();
    let want_w = grad_enabled && weight.requires_grad();
    let x = hidden.detach();
    // Under autocast the head is cast once here (Liger's `Function.forward` gets the
    // parameter, which autocast casts once per forward), not once per chunk and matmul.
    let matmul_kind = tch::no_grad(|| -> Result<Kind> {
        let probe = Tensor::f_zeros([1, 1], (Kind::Float, weight.device()))?;
        Ok(probe.f_matmul(&probe)?.kind())
    })?;
    let w = match (weight.kind(), matmul_kind) {
        (Kind::Float, Kind::BFloat16 | Kind::Half) => weight.detach().f_to_kind(matmul_kind)?,
        _ => weight.detach(),
    };
    let (loss, grad_x, grad_w) = tch::no_grad(|| -> Result<_> {
        let mut loss = Tensor::f_zeros([], (Kind::Float, x.device()))?;
        let grad_x = want_x.then(|| Tensor::f_zeros_like(&x)).transpose()?;
        let mut grad_w = want_w.then(|| Tensor::f_zeros_like(weight)).transpose()?;
        let mut start = 0;
        while start < tokens {
            let rows = chunk.min(tokens - start);
            let xc = x.f_narrow(0, start, rows)?;
            let tc = target.f_narrow(0, start, rows)?;
            let logits = xc.f_matmul(&w.f_tr()?)?.f_to_kind(Kind::Float)?;
            let log_probs = logits.f_log_softmax(-1, Kind::Float)?;
            drop(logits);
            let valid = tc.f_ne(ignore_index)?;
            let safe = tc.f_where_scalarother(&valid, 0)?.f_unsqueeze(1)?;
            let valid_f = valid.f_to_kind(Kind::Float)?.f_unsqueeze(1)?;
            let picked = log_probs.f_gather(1, &safe, false)?;
            loss = loss.f_sub(&picked.f_mul(&valid_f)?.f_sum(Kind::Float)?)?;
            if want_x || want_w {
                // d(-log_softmax[target]) / d logits = softmax - onehot (0 on ignored rows).
                let d = log_probs
                    .f_exp()?
                    .f_scatter_add(1, &safe, &valid_f.f_neg()?)?
                    .f_mul(&valid_f)?;
                if let Some(gx) = &grad_x {
                    let dx = d.f_to_kind(w.kind())?.f_matmul(&w)?;
                    gx.f_narrow(0, start, rows)?.f_copy_(&dx)?;
                }
                // Accumulated in the head's own dtype (float32 under mixed precision).
                if let Some(gw) = grad_w.as_mut() {
                    let kind = gw.kind();
                    let _ = gw.f_addmm_(&d.f_to_kind(kind)?.f_tr()?, &xc.f_to_kind(kind)?)?;
                }
            }
            start += rows;
        }
        Ok((loss, grad_x, grad_w))
    })?;
    let mut out = loss;
    // `flatten` views, `dot` saves no copy: the precomputed gradients flow back as they are.
    // The sum is taken in float32 (a half-precision one could overflow to inf, and
    // `inf - inf` is NaN); `to_kind` of a float32 tensor is the tensor itself.
    let carry = |input: &Tensor, grad: &Tensor| -> Result<Tensor> {
        let s = input
            .f_to_kind(Kind::Float)?
            .f_flatten(0, -1)?
            .f_dot(&grad.f_to_kind(Kind::Float)?.f_flatten(0, -1)?)?;
        Ok(s.f_sub(&s.f_detach()?)?)
    };
    if let Some(gx) = &grad_x {
        out = out.f_add(&carry(hidden, gx)?)?;
    }
    if let Some(gw) = &grad_w {
        out = out.f_add(&carry(weight, gw)?)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_ligers() {
        // Liger's own example: BT = 4096 * 4, V = 32000, H = 4096 -> 2048 rows.
        assert_eq!(chunk_size(4096 * 4, 4096, 32000), 2048);
        // SmolLM2-135M, one block of 512: ceil(49152 / 576) = 86 -> 8 rows.
        assert_eq!(chunk_size(512, 576, 49152), 8);
        // A budget larger than the tokens: one chunk.
        assert_eq!(chunk_size(5, 64, 100), 4);
        assert_eq!(chunk_size(3, 1024, 100), 3);
    }

    #[test]
    fn options_follow_liger() {
        let c = LigerKernelConfig::from_json(None, "llama").unwrap();
        assert_eq!(c, LigerKernelConfig::default());
        let c = LigerKernelConfig::from_json(
            Some(&serde_json::json!({"fused_linear_cross_entropy": false, "rope": false})),
            "llama",
        )
        .unwrap();
        assert!(!c.fused_linear_cross_entropy && !c.rope && c.swiglu);
        let err = LigerKernelConfig::from_json(
            Some(&serde_json::json!({"cross_entropy": true})),
            "llama",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("cannot both be True"), "{err}");
        let err = LigerKernelConfig::from_json(Some(&serde_json::json!({"geglu": true})), "llama")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`geglu`") && err.contains("liger_kernel_config"),
            "{err}"
        );
    }
}

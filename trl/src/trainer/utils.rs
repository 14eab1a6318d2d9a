//! `trl/trainer/utils.py`: `add_fused_lm_head`'s forward (`model(..., labels=labels,
//! fused_lm_head=True)`), which TRL's SFT trainer scores every batch with.

use tch::{Kind, Tensor};
use tchtrain_models::{ModelInputs, TrainableModel};

use crate::error::{Error, Result};
use crate::kernels::{CHUNKED_LOGPROB_CHUNK_SIZE, chunked_logprob};

/// TRL's `FusedCausalLMOutput` (the fields the SFT trainer reads): per-token values over the
/// shifted labels' positions `[batch, seq - 1]`, zero (false) where the label is -100.
#[derive(Debug)]
pub struct FusedCausalLMOutput {
    /// `log p(label)` (float32), differentiable.
    pub log_probs: Tensor,
    /// The entropy of each position's distribution (float32).
    pub entropy: Tensor,
    /// Whether the label is the (first) argmax of its logits.
    pub is_top1: Tensor,
    /// `labels[:, 1:] != -100`.
    pub label_mask: Tensor,
}

/// `model(**inputs, labels=labels, fused_lm_head=True)` with `add_fused_lm_head(model,
/// outputs=("log_probs", "entropy", "is_top1"))`: the backbone alone
/// ([`ModelInputs::backbone_only`]), its hidden states but the last and the labels but the
/// first, and every position scored through the LM head by
/// [`chunked_logprob`](crate::kernels::chunked_logprob) (all positions, as TRL does off
/// Triton devices, then masked). Runs in the caller's autocast region.
pub fn fused_lm_head_forward(
    model: &dyn TrainableModel,
    inputs: &ModelInputs<'_>,
    labels: &Tensor,
) -> Result<FusedCausalLMOutput> {
    let head = model.output_head().ok_or_else(|| Error::InvalidArgument {
        field: "model",
        detail: format!(
            "{} has no fused LM head here (a causal LM of the decoder families: Llama, Qwen, Mistral, Gemma, ...); TRL's trainers score tokens through it",
            model.model_name()
        ),
    })?;
    let backbone = model.forward(&ModelInputs {
        labels: None,
        num_items_in_batch: None,
        skip_logits: None,
        logits_to_keep: None,
        backbone_only: true,
        ..*inputs
    })?;
    let hidden = match (backbone.last_hidden_state, backbone.logits) {
        (Some(h), None) => h,
        _ => {
            return Err(Error::InvalidArgument {
                field: "model",
                detail: format!(
                    "{} did not run its backbone alone (ModelInputs::backbone_only)",
                    model.model_name()
                ),
            });
        }
    };
    let size = hidden.size();
    let (t, width) = (size[1], size[2]);
    if labels.size().get(1) != Some(&t) {
        return Err(Error::InvalidArgument {
            field: "labels",
            detail: format!(
                "labels {:?} do not match the hidden states {size:?}",
                labels.size()
            ),
        });
    }
    let hidden = hidden.f_narrow(1, 0, t - 1)?;
    let labels = labels.f_narrow(1, 1, t - 1)?;
    let mask = labels.f_ne(-100)?;
    let out = chunked_logprob(
        &hidden.f_reshape([-1, width])?,
        &head.weight,
        head.bias.as_ref(),
        &labels.f_clamp_min(0)?.f_reshape([-1])?,
        1.0,
        CHUNKED_LOGPROB_CHUNK_SIZE,
        head.final_logit_softcapping,
        head.logit_scale,
    )?;
    let shape = mask.size();
    let unmasked = mask.f_logical_not()?;
    let per_token = |x: Tensor, fill: f64| -> Result<Tensor> {
        Ok(x.f_view(shape.as_slice())?.f_masked_fill(&unmasked, fill)?)
    };
    Ok(FusedCausalLMOutput {
        log_probs: per_token(out.log_probs, 0.0)?,
        entropy: per_token(out.entropy, 0.0)?,
        is_top1: per_token(out.is_top1, 0.0)?,
        label_mask: mask,
    })
}

/// `mask.sum()` as an int64 0-d tensor.
pub(crate) fn count(mask: &Tensor) -> Result<Tensor> {
    Ok(mask.f_sum(Kind::Int64)?)
}

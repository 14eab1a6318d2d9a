//! `trl/trainer/utils.py`: `add_fused_lm_head`'s forward (`model(..., labels=labels,
//! fused_lm_head=True)`), which TRL's SFT trainer scores every batch with.

use tch::{Kind, Tensor};
use tchtrain_models::{ModelInputs, TrainableModel};

use crate::error::{Error, Result};
use crate::kernels::{CHUNKED_LOGPROB_CHUNK_SIZE, LogProbOutputs, chunked_logprob};

/// TRL's `FusedCausalLMOutput`: per-token values over the shifted labels' positions
/// `[batch, seq - 1]`, zero (false) where the label is -100; the optional ones `None` unless
/// asked for.
#[derive(Debug)]
pub struct FusedCausalLMOutput {
    /// `log p(label)` (float32), differentiable.
    pub log_probs: Tensor,
    /// The entropy of each position's distribution (float32).
    pub entropy: Option<Tensor>,
    /// `log(sum_v p_v^2)` of each position (float32).
    pub log_sum_sq_probs: Option<Tensor>,
    /// The mean logit of each position (float32).
    pub mean_logits: Option<Tensor>,
    /// Whether the label is the (first) argmax of its logits.
    pub is_top1: Option<Tensor>,
    /// `labels[:, 1:] != -100`.
    pub label_mask: Tensor,
}

impl FusedCausalLMOutput {
    /// An optional output the caller asked for.
    pub(crate) fn required<'a>(
        field: &'a Option<Tensor>,
        name: &'static str,
    ) -> Result<&'a Tensor> {
        field.as_ref().ok_or_else(|| Error::InvalidArgument {
            field: name,
            detail: format!("the fused LM head was not asked for `{name}`"),
        })
    }
}

/// `model(**inputs, labels=labels, fused_lm_head=True)` with `add_fused_lm_head(model,
/// outputs=...)`: the backbone alone
/// ([`ModelInputs::backbone_only`]), its hidden states but the last and the labels but the
/// first, and every position scored through the LM head by
/// [`chunked_logprob`](crate::kernels::chunked_logprob) (all positions, as TRL does off
/// Triton devices, then masked). Runs in the caller's autocast region.
pub fn fused_lm_head_forward(
    model: &dyn TrainableModel,
    inputs: &ModelInputs<'_>,
    labels: &Tensor,
    outputs: LogProbOutputs,
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
        outputs,
    )?;
    let shape = mask.size();
    let unmasked = mask.f_logical_not()?;
    let per_token = |x: Tensor, fill: f64| -> Result<Tensor> {
        Ok(x.f_view(shape.as_slice())?.f_masked_fill(&unmasked, fill)?)
    };
    let optional = |x: Option<Tensor>| x.map(|x| per_token(x, 0.0)).transpose();
    Ok(FusedCausalLMOutput {
        log_probs: per_token(out.log_probs, 0.0)?,
        entropy: optional(out.entropy)?,
        log_sum_sq_probs: optional(out.log_sum_sq_probs)?,
        mean_logits: optional(out.mean_logits)?,
        is_top1: optional(out.is_top1)?,
        label_mask: mask,
    })
}

/// `mask.sum()` as an int64 0-d tensor.
pub(crate) fn count(mask: &Tensor) -> Result<Tensor> {
    Ok(mask.f_sum(Kind::Int64)?)
}

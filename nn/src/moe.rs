//! The mixture-of-experts parts (transformers' `integrations/moe.py` and the families'
//! `XTopKRouter` / `XExperts` / `load_balancing_loss_func`): the top-k router, the experts
//! stored as upstream stores them (fused 3-D `gate_up_proj` `[experts, 2 · inter, hidden]`
//! and `down_proj` `[experts, hidden, inter]`), their grouped-matmul forward
//! (`grouped_mm_experts_forward`, transformers 5's default `experts_implementation`), and the
//! auxiliary load-balancing loss.

use tch::{Kind, Tensor};

use crate::activations::Activation;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::initialization::{self, normal};
use crate::lora::LoraSlot;
use crate::path::Path;

/// `with torch.autocast(device_type, enabled=False): f()` (peft folds an expert adapter into
/// its weight in the weight's dtype).
#[allow(unsafe_code)]
pub(crate) fn without_autocast<T>(device: tch::Device, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let code = match device {
        tch::Device::Cuda(_) => 1,
        _ => 0,
    };
    let (mut prev_enabled, mut prev_dtype, mut prev_cache) = (false, 0, false);
    // SAFETY: the out-pointers point at live locals for the duration of the call.
    unsafe {
        tchtrain_sys::take_error(tchtrain_sys::tchtrain_autocast_enter_disabled(
            code,
            &mut prev_enabled,
            &mut prev_dtype,
            &mut prev_cache,
        ))
    }
    .map_err(|m| Error::Torch(tch::TchError::Torch(m)))?;
    let out = f();
    // SAFETY: plain values; the shim only touches libtorch's thread-local autocast state.
    unsafe {
        tchtrain_sys::take_error(tchtrain_sys::tchtrain_autocast_exit(
            code,
            prev_enabled,
            prev_dtype,
            prev_cache,
        ))
    }
    .map_err(|m| Error::Torch(tch::TchError::Torch(m)))?;
    out
}

/// How a family's router turns its logits into the experts' weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouterKind {
    /// `norm_topk_prob`: the top-k probabilities renormalised to sum to 1 (always for
    /// Mixtral).
    pub norm_topk_prob: bool,
    /// The weights cast back to the logits' dtype (`router_top_value.to(router_logits.dtype)`:
    /// Qwen2-MoE, Qwen3-MoE, OLMoE); Mixtral keeps them in float32.
    pub scores_in_logits_dtype: bool,
    /// gpt-oss's router: a bias on the logits, the top k of the logits, then a softmax over
    /// those k in the logits' dtype (the other flags unused).
    pub softmax_after_topk: bool,
}

/// Upstream `XTopKRouter`: `weight` `[experts, hidden]` (no bias), softmax in float32 over the
/// experts, the top `top_k`.
#[derive(Debug)]
pub struct TopKRouter {
    /// `weight` `[num_experts, hidden]`.
    pub weight: Tensor,
    /// gpt-oss's `bias` `[num_experts]`.
    pub bias: Option<Tensor>,
    top_k: i64,
    kind: RouterKind,
}

impl TopKRouter {
    /// The router at `p` (upstream's `gate`), `normal(0, std)` as `_init_weights` draws it.
    pub fn new(
        p: Path<'_>,
        num_experts: i64,
        hidden: i64,
        top_k: i64,
        std: f64,
        kind: RouterKind,
    ) -> Self {
        let weight = initialization::var(&p, "weight", &[num_experts, hidden], normal(std));
        // gpt-oss's router has a bias, drawn as the weight.
        let bias = kind
            .softmax_after_topk
            .then(|| initialization::var(&p, "bias", &[num_experts], normal(std)));
        Self {
            weight,
            bias,
            top_k,
            kind,
        }
    }

    /// `(router_logits [tokens, experts], top_k_weights [tokens, k], top_k_index [tokens, k])`
    /// for the hidden states `[tokens, hidden]`.
    pub fn forward(&self, h: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let logits = h.f_linear(&self.weight, self.bias.as_ref())?;
        if self.kind.softmax_after_topk {
            let (top, index) = logits.f_topk(self.top_k, -1, true, true)?;
            let scores = top.f_softmax(1, top.kind())?;
            return Ok((logits, scores, index));
        }
        let probs = logits.f_softmax(-1, Kind::Float)?;
        let (top, index) = probs.f_topk(self.top_k, -1, true, true)?;
        let top = if self.kind.norm_topk_prob {
            top.f_div(&top.f_sum_dim_intlist(-1, true, None::<Kind>)?)?
        } else {
            top
        };
        let top = if self.kind.scores_in_logits_dtype {
            top.f_to_kind(logits.kind())?
        } else {
            top
        };
        Ok((logits, top, index))
    }
}

/// How the experts gate (`_apply_gate`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExpertGate {
    /// `act(gate) * up` over the concatenated `[gate; up]` halves.
    Concatenated(Activation),
    /// gpt-oss's: interleaved `gate = x[..., ::2]`, `up = x[..., 1::2]`, the gate clamped at
    /// `limit` and the up to `[-limit, limit]`, `(up + 1) · gate · sigmoid(gate · alpha)`.
    GptOss {
        /// `swiglu_alpha`.
        alpha: f64,
        /// `swiglu_limit`.
        limit: f64,
    },
}

/// Upstream `XExperts` (`@use_experts_implementation`): `down(gate(gate_up(x)))` per expert,
/// the tokens routed to it weighted by their router scores. The families' layout: gated and
/// concatenated `[gate; up]`, not transposed, no bias; or gpt-oss's (`is_transposed`,
/// `has_bias`, interleaved, its clamped gate).
#[derive(Debug)]
pub struct Experts {
    /// `gate_up_proj` `[num_experts, 2 · intermediate, hidden]` (gpt-oss: transposed,
    /// `[num_experts, hidden, 2 · intermediate]`).
    pub gate_up_proj: Tensor,
    /// gpt-oss's `gate_up_proj_bias` `[num_experts, 2 · intermediate]`.
    pub gate_up_proj_bias: Option<Tensor>,
    /// `down_proj` `[num_experts, hidden, intermediate]` (gpt-oss: `[num_experts,
    /// intermediate, hidden]`).
    pub down_proj: Tensor,
    /// gpt-oss's `down_proj_bias` `[num_experts, hidden]`.
    pub down_proj_bias: Option<Tensor>,
    gate: ExpertGate,
    num_experts: i64,
    name: String,
    class: String,
    ctx: Context,
    /// peft's `ParamWrapper` slots of `gate_up_proj` and `down_proj` (`target_parameters`),
    /// registered as `<experts>.gate_up_proj` / `<experts>.down_proj`.
    lora: [LoraSlot; 2],
}

impl Experts {
    /// The experts at `p` (upstream's `experts`), each parameter `normal(0, std)`.
    pub fn new(
        p: Path<'_>,
        num_experts: i64,
        hidden: i64,
        intermediate: i64,
        act: Activation,
        std: f64,
        class: impl Into<String>,
    ) -> Self {
        let gate_up_proj = initialization::var(
            &p,
            "gate_up_proj",
            &[num_experts, 2 * intermediate, hidden],
            normal(std),
        );
        let down_proj = initialization::var(
            &p,
            "down_proj",
            &[num_experts, hidden, intermediate],
            normal(std),
        );
        Self::build(
            p,
            [gate_up_proj, down_proj],
            [None, None],
            ExpertGate::Concatenated(act),
            num_experts,
            class,
        )
    }

    /// gpt-oss's experts at `p`: `gate_up_proj` `[E, hidden, 2 · inter]`, its bias, `down_proj`
    /// `[E, inter, hidden]`, its bias (registered in that order), the weights `normal(0, std)`
    /// and the biases zero, as `_init_weights`.
    #[allow(clippy::too_many_arguments)]
    pub fn gpt_oss(
        p: Path<'_>,
        num_experts: i64,
        hidden: i64,
        intermediate: i64,
        alpha: f64,
        limit: f64,
        std: f64,
        class: impl Into<String>,
    ) -> Self {
        let zero = tch::nn::Init::Const(0.0);
        let gate_up_proj = initialization::var(
            &p,
            "gate_up_proj",
            &[num_experts, hidden, 2 * intermediate],
            normal(std),
        );
        let gate_up_bias = initialization::var(
            &p,
            "gate_up_proj_bias",
            &[num_experts, 2 * intermediate],
            zero,
        );
        let down_proj = initialization::var(
            &p,
            "down_proj",
            &[num_experts, intermediate, hidden],
            normal(std),
        );
        let down_bias = initialization::var(&p, "down_proj_bias", &[num_experts, hidden], zero);
        Self::build(
            p,
            [gate_up_proj, down_proj],
            [Some(gate_up_bias), Some(down_bias)],
            ExpertGate::GptOss { alpha, limit },
            num_experts,
            class,
        )
    }

    fn build(
        p: Path<'_>,
        [gate_up_proj, down_proj]: [Tensor; 2],
        [gate_up_proj_bias, down_proj_bias]: [Option<Tensor>; 2],
        gate: ExpertGate,
        num_experts: i64,
        class: impl Into<String>,
    ) -> Self {
        let name = p.name();
        let lora = [LoraSlot::default(), LoraSlot::default()];
        for (parameter, slot) in ["gate_up_proj", "down_proj"].iter().zip(&lora) {
            p.ctx()
                .register_lora_slot(format!("{name}.{parameter}"), slot.clone());
        }
        Self {
            gate_up_proj,
            gate_up_proj_bias,
            down_proj,
            down_proj_bias,
            gate,
            num_experts,
            name,
            class: class.into(),
            ctx: p.ctx().clone(),
            lora,
        }
    }

    /// `grouped_mm_experts_forward` op for op: the (token, slot) pairs sorted by expert, one
    /// grouped matmul per projection over the experts' row groups, the outputs weighted,
    /// put back in token order and summed over each token's `k` slots.
    pub fn forward(
        &self,
        h: &Tensor,
        top_k_index: &Tensor,
        top_k_weights: &Tensor,
    ) -> Result<Tensor> {
        let k = top_k_index.size().last().copied().unwrap_or(1);
        let tokens = h.size()[0];
        let hidden = h.size()[1];
        let device = h.device();
        let sample_weights = top_k_weights.f_reshape([-1])?;
        let expert_ids = top_k_index.f_reshape([-1])?;
        let (expert_ids_g, perm) = expert_ids.f_sort(0, false)?;
        let rows = perm.f_floor_divide_scalar(k)?;
        // Advanced indexing as upstream's (`hidden_states[perm // k]`): its backward accumulates
        // as torch's `index` does.
        let selected = h.f_index(&[Some(&rows)])?;
        let sample_weights_g = sample_weights.f_index(&[Some(&perm)])?;
        // Upstream's `torch.histc(ids, bins=experts, min=0, max=experts - 1)` puts each whole
        // id in its own bin: the counts per expert, as `bincount` gives them.
        let tokens_per_expert = expert_ids_g.f_bincount::<&Tensor>(None, self.num_experts)?;
        let offsets = tokens_per_expert.f_cumsum(0, Kind::Int)?;
        // peft's `target_parameters` adapters fold into the weights for the forward.
        let gate_up_proj = self.lora[0].apply_parameter(&self.gate_up_proj)?;
        let down_proj = self.lora[1].apply_parameter(&self.down_proj)?;
        let transposed = self.gate_up_proj_bias.is_some();
        let bias_of = |b: &Option<Tensor>| -> Result<Option<Tensor>> {
            Ok(match b {
                Some(b) => Some(b.f_index(&[Some(&expert_ids_g)])?),
                None => None,
            })
        };
        let proj = grouped_linear(&selected, &gate_up_proj, &offsets, transposed, &self.name)?;
        let proj = match bias_of(&self.gate_up_proj_bias)? {
            Some(b) => proj.f_add(&b)?,
            None => proj,
        };
        let proj = match self.gate {
            ExpertGate::Concatenated(act) => {
                let half = proj.size()[1] / 2;
                let gate = proj.f_narrow(-1, 0, half)?;
                let up = proj.f_narrow(-1, half, half)?;
                act.apply(&gate).f_mul(&up)?
            }
            ExpertGate::GptOss { alpha, limit } => {
                let last = proj.size()[1];
                let gate = proj.f_slice(-1, 0, last, 2)?;
                let up = proj.f_slice(-1, 1, last, 2)?;
                let gate = gate.f_clamp_max(limit)?;
                let up = up.f_clamp(-limit, limit)?;
                let glu = gate.f_mul(&gate.f_mul_scalar(alpha)?.f_sigmoid()?)?;
                up.f_add_scalar(1.0)?.f_mul(&glu)?
            }
        };
        let proj = grouped_linear(&proj, &down_proj, &offsets, transposed, &self.name)?;
        let proj = match bias_of(&self.down_proj_bias)? {
            Some(b) => proj.f_add(&b)?,
            None => proj,
        };
        let weighted = proj.f_mul(&sample_weights_g.f_unsqueeze(-1)?)?;
        let inv_perm = perm.f_empty_like()?.f_index_put_(
            &[Some(&perm)],
            &Tensor::f_arange(perm.size()[0], (perm.kind(), device))?,
            false,
        )?;
        let weighted = weighted.f_index(&[Some(&inv_perm)])?;
        let out = weighted
            .f_view([tokens, k, hidden])?
            .f_sum_dim_intlist(1, false, None::<Kind>)?
            .f_to_kind(h.kind())?;
        if self.ctx.traced() {
            let params = [
                ("gate_up_proj", &self.gate_up_proj),
                ("down_proj", &self.down_proj),
            ];
            self.ctx
                .leaf(|| self.name.clone(), &self.class, &params, h, &out);
        }
        Ok(out)
    }
}

/// `_grouped_linear(input, weight, offs, is_transposed)`: `torch._grouped_mm(input.to(weight.dtype),
/// w, offs)` with `w` the weight `[experts, in, out]` when transposed, else the weight
/// `[experts, out, in]` transposed.
fn grouped_linear(
    input: &Tensor,
    weight: &Tensor,
    offsets: &Tensor,
    transposed: bool,
    name: &str,
) -> Result<Tensor> {
    let input = input.f_to_kind(weight.kind())?;
    let weight = if transposed {
        weight.shallow_clone()
    } else {
        weight.f_transpose(-2, -1)?
    };
    input
        .f_internal_grouped_mm(&weight, Some(offsets), None, None::<Kind>)
        .map_err(|e| Error::InvalidArgument {
            field: "experts",
            detail: format!(
                "{name}: torch's grouped matmul refused the experts' shapes ({e}); as upstream's, it needs the hidden and expert intermediate sizes' rows to be multiples of 16 bytes"
            ),
        })
}

/// Upstream `load_balancing_loss_func` (Switch Transformer's auxiliary loss, eqs. 4–6): over
/// the layers' router logits `[tokens, experts]`, the fraction of routed slots per expert
/// times its mean router probability, summed, times the number of experts; with an
/// `attention_mask` `[batch, seq]` only the real tokens count. `None` when no layer routed.
pub fn load_balancing_loss_func(
    gate_logits: &[Tensor],
    num_experts: i64,
    top_k: i64,
    attention_mask: Option<&Tensor>,
) -> Result<Option<Tensor>> {
    let Some(first) = gate_logits.first() else {
        return Ok(None);
    };
    let device = first.device();
    let zeros = || Tensor::f_zeros([num_experts], (Kind::Float, device));
    let mut tokens_per_expert_sum = zeros()?;
    let mut router_prob_sum = zeros()?;
    let flat_mask = match attention_mask {
        Some(m) => Some(
            m.f_reshape([-1])?
                .f_to_device(device)?
                .f_to_kind(Kind::Float)?,
        ),
        None => None,
    };
    let mut total_rows_plain = 0.0f64;
    let mut total_rows_masked: Option<Tensor> = None;
    for layer_gate in gate_logits {
        let routing_weights = layer_gate.f_softmax(-1, None::<Kind>)?;
        let (_, selected) = routing_weights.f_topk(top_k, -1, true, true)?;
        match &flat_mask {
            None => {
                // `torch.histc(ids, bins=experts, min=0, max=experts)`: whole ids, one bin
                // each, counted in float32.
                let hist = selected
                    .f_reshape([-1])?
                    .f_bincount::<&Tensor>(None, num_experts)?
                    .f_to_kind(Kind::Float)?;
                tokens_per_expert_sum = tokens_per_expert_sum.f_add(&hist)?;
                router_prob_sum = router_prob_sum.f_add(
                    &routing_weights.f_to_kind(Kind::Float)?.f_sum_dim_intlist(
                        0,
                        false,
                        None::<Kind>,
                    )?,
                )?;
                total_rows_plain += routing_weights.size()[0] as f64;
            }
            Some(mask) => {
                let counts = zeros()?.f_scatter_add(
                    0,
                    &selected.f_reshape([-1])?,
                    &mask.f_repeat_interleave_self_int(top_k, None, None)?,
                )?;
                tokens_per_expert_sum = tokens_per_expert_sum.f_add(&counts)?;
                router_prob_sum = router_prob_sum.f_add(
                    &routing_weights
                        .f_to_kind(Kind::Float)?
                        .f_mul(&mask.f_unsqueeze(-1)?)?
                        .f_sum_dim_intlist(0, false, None::<Kind>)?,
                )?;
                let rows = mask.f_sum(None::<Kind>)?;
                // Upstream: `total_rows = 0.0 + flat_mask.sum()` (a float plus a tensor).
                total_rows_masked = Some(match total_rows_masked {
                    None => rows.f_add_scalar(0.0)?,
                    Some(t) => t.f_add(&rows)?,
                });
            }
        }
    }
    let (tokens_per_expert, router_prob_per_expert) = match &total_rows_masked {
        Some(total) => (
            tokens_per_expert_sum.f_div(total)?,
            router_prob_sum.f_div(total)?,
        ),
        None => (
            tokens_per_expert_sum.f_div_scalar(total_rows_plain)?,
            router_prob_sum.f_div_scalar(total_rows_plain)?,
        ),
    };
    let overall = tokens_per_expert
        .f_mul(&router_prob_per_expert.f_unsqueeze(0)?)?
        .f_sum(None::<Kind>)?;
    Ok(Some(overall.f_mul_scalar(num_experts)?))
}

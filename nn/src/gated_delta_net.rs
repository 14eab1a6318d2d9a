//! Gated DeltaNet linear attention (upstream `Qwen3_5GatedDeltaNet`, shared by Qwen3-Next,
//! Qwen3.5 and Qwen3.5-MoE) with upstream's torch fallbacks, op for op: the depthwise causal
//! convolution (`causal_conv1d_fn` / `causal_conv1d_update`), the chunked gated delta rule
//! (`torch_chunk_gated_delta_rule`, 64-token chunks solved with a unit lower-triangular
//! solve) and its one-token recurrent form (`torch_recurrent_gated_delta_rule`, decoding), and
//! the gated RMSNorm (`Qwen3_5RMSNormGated`).

// `state = state * d` on purpose: tch's `*=` works in place and would modify a tensor
// autograd saved for backward.
#![allow(clippy::assign_op_pattern)]

use tch::nn::Init;
use tch::{Kind, Tensor};

use crate::activations::Activation;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::initialization::{self, normal};
use crate::linear::Linear;
use crate::path::Path;

/// The sizes of a Gated DeltaNet layer (upstream's `linear_*` config keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatedDeltaNetSizes {
    /// `hidden_size`.
    pub hidden_size: i64,
    /// `linear_num_key_heads`.
    pub num_key_heads: i64,
    /// `linear_num_value_heads` (a multiple of the key heads: each query / key head serves
    /// `num_value_heads / num_key_heads` consecutive value heads).
    pub num_value_heads: i64,
    /// `linear_key_head_dim`.
    pub key_head_dim: i64,
    /// `linear_value_head_dim`.
    pub value_head_dim: i64,
    /// `linear_conv_kernel_dim`.
    pub conv_kernel_dim: i64,
}

impl GatedDeltaNetSizes {
    fn key_dim(&self) -> i64 {
        self.key_head_dim * self.num_key_heads
    }
    fn value_dim(&self) -> i64 {
        self.value_head_dim * self.num_value_heads
    }
    /// The convolution's channels: queries, keys and values.
    pub fn conv_dim(&self) -> i64 {
        2 * self.key_dim() + self.value_dim()
    }

    /// The sizes upstream's layer needs to run, naming the first bad one.
    pub fn validate(&self) -> Result<()> {
        for (field, v) in [
            ("linear_num_key_heads", self.num_key_heads),
            ("linear_num_value_heads", self.num_value_heads),
            ("linear_key_head_dim", self.key_head_dim),
            ("linear_value_head_dim", self.value_head_dim),
            ("linear_conv_kernel_dim", self.conv_kernel_dim),
        ] {
            if v <= 0 {
                return Err(Error::InvalidArgument {
                    field,
                    detail: format!("{v}: must be positive"),
                });
            }
        }
        if self.num_value_heads % self.num_key_heads != 0 {
            return Err(Error::InvalidArgument {
                field: "linear_num_value_heads",
                detail: format!(
                    "{} is not a multiple of linear_num_key_heads {}: each key head serves a whole number of value heads",
                    self.num_value_heads, self.num_key_heads
                ),
            });
        }
        Ok(())
    }
}

/// A linear-attention layer's state while decoding (upstream's cache entries of the layer):
/// the last `conv_kernel_dim` convolution inputs `[batch, conv_dim, kernel]` and the
/// recurrent state `[batch, value_heads, key_head_dim, value_head_dim]` (float32).
#[derive(Debug)]
pub struct LinearAttentionState {
    /// `conv_states`.
    pub conv_state: Tensor,
    /// `recurrent_states`.
    pub recurrent_state: Tensor,
}

/// Upstream `Qwen3_5GatedDeltaNet`: `in_proj_qkv` → depthwise causal convolution → SiLU →
/// queries, keys (L2-normalised) and values; the decay `g = -exp(A_log) · softplus(a + dt_bias)`
/// and the write strength `β = sigmoid(b)`; the gated delta rule; the gated RMSNorm with
/// `z`; `out_proj`.
#[derive(Debug)]
pub struct GatedDeltaNet {
    /// `dt_bias` `[value_heads]`.
    pub dt_bias: Tensor,
    /// `A_log` `[value_heads]`.
    pub a_log: Tensor,
    /// `conv1d.weight` `[conv_dim, 1, kernel]` (no bias).
    pub conv1d: Tensor,
    /// `norm.weight` `[value_head_dim]`.
    pub norm: Tensor,
    out_proj: Linear,
    in_proj_qkv: Linear,
    in_proj_z: Linear,
    in_proj_b: Linear,
    in_proj_a: Linear,
    sizes: GatedDeltaNetSizes,
    act: Activation,
    eps: f64,
    name: String,
    class: String,
    ctx: Context,
}

impl GatedDeltaNet {
    /// The layer at `p` (upstream's `linear_attn`), its parameters created in upstream's
    /// `named_parameters()` order (the module's own `dt_bias`, `A_log`, then `conv1d`,
    /// `norm`, `out_proj`, `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`), drawn as
    /// upstream's `_init_weights`: the projections and the convolution `normal(0, std)`,
    /// `dt_bias` ones, `A_log` `log(U(0.01, 16))`, the norm ones.
    pub fn new(
        p: Path<'_>,
        sizes: GatedDeltaNetSizes,
        act: Activation,
        eps: f64,
        std: f64,
        class: impl Into<String>,
    ) -> Result<Self> {
        sizes.validate()?;
        let (d, heads) = (sizes.hidden_size, sizes.num_value_heads);
        let dt_bias = initialization::var(&p, "dt_bias", &[heads], Init::Const(1.0));
        let uniform = Init::Uniform { lo: 0.01, up: 16.0 };
        let init = initialization::init(&p, "A_log", uniform);
        let mut a_log = p.var("A_log", &[heads], init);
        if matches!(init, Init::Uniform { .. }) {
            // Drawn now (not deferred): upstream's `log` of the uniform draw. A checkpoint
            // lacking `A_log` gets the uniform draw recorded for it, without the log.
            tch::no_grad(|| a_log.f_log_().map(drop))?;
        }
        let conv1d = initialization::var(
            &(&p / "conv1d"),
            "weight",
            &[sizes.conv_dim(), 1, sizes.conv_kernel_dim],
            normal(std),
        );
        let norm = initialization::var(
            &(&p / "norm"),
            "weight",
            &[sizes.value_head_dim],
            Init::Const(1.0),
        );
        let linear = |name: &str, i: i64, o: i64| Linear::in_layer(&p / name, i, o, false, std);
        let out_proj = linear("out_proj", sizes.value_dim(), d);
        let in_proj_qkv = linear("in_proj_qkv", d, sizes.conv_dim());
        let in_proj_z = linear("in_proj_z", d, sizes.value_dim());
        let in_proj_b = linear("in_proj_b", d, heads);
        let in_proj_a = linear("in_proj_a", d, heads);
        Ok(Self {
            dt_bias,
            a_log,
            conv1d,
            norm,
            out_proj,
            in_proj_qkv,
            in_proj_z,
            in_proj_b,
            in_proj_a,
            sizes,
            act,
            eps,
            name: p.name(),
            class: class.into(),
            ctx: p.ctx().clone(),
        })
    }

    /// A zero state for `batch` sequences (upstream's cache before the prefill).
    pub fn empty_state(&self, batch: i64) -> Result<LinearAttentionState> {
        let device = self.conv1d.device();
        let s = &self.sizes;
        Ok(LinearAttentionState {
            conv_state: Tensor::f_zeros(
                [batch, s.conv_dim(), s.conv_kernel_dim],
                (self.conv1d.kind(), device),
            )?,
            recurrent_state: Tensor::f_zeros(
                [batch, s.num_value_heads, s.key_head_dim, s.value_head_dim],
                (Kind::Float, device),
            )?,
        })
    }

    /// Upstream's forward on the normed hidden states `h` `[batch, seq, hidden]`: `mask` is
    /// the 2-D padding mask of upstream's `create_recurrent_attention_mask` (`None` when no
    /// token is padding), `state` the layer's decoding state (`None` in training; `Some`
    /// with `fresh` at the prefill, which runs the chunked rule and keeps the final state,
    /// and one-token steps after it, which run the recurrent rule).
    pub fn forward(
        &self,
        h: &Tensor,
        mask: Option<&Tensor>,
        state: Option<(&mut LinearAttentionState, bool)>,
    ) -> Result<Tensor> {
        let input = h;
        let h = match mask {
            Some(m) => (h * m.f_unsqueeze(-1)?).f_to_kind(h.kind())?,
            None => h.shallow_clone(),
        };
        let size = h.size();
        let (batch, seq) = (size[0], size[1]);
        let s = self.sizes;
        let mixed_qkv = self.in_proj_qkv.forward(&h).f_transpose(1, 2)?;
        let z = self
            .in_proj_z
            .forward(&h)
            .f_reshape([batch, seq, -1, s.value_head_dim])?;
        let b = self.in_proj_b.forward(&h);
        let a = self.in_proj_a.forward(&h);
        let weight = self.conv1d.f_squeeze_dim(1)?;
        let (mixed_qkv, mut state) = match state {
            Some((state, false)) if seq == 1 => {
                let out =
                    causal_conv1d_update(&mixed_qkv, &mut state.conv_state, &weight, self.act)?;
                (out, Some((state, false)))
            }
            Some((state, fresh)) => {
                // Upstream's `update_conv_state`: at the prefill the new inputs (left-padded
                // with zeros to the kernel when shorter), later the stored ones before them;
                // the last `kernel` kept, the convolution's last `seq` outputs used.
                let k = s.conv_kernel_dim;
                let full = if fresh {
                    let short = (k - seq).max(0);
                    mixed_qkv.f_constant_pad_nd([short, 0])?
                } else {
                    Tensor::f_cat(&[&state.conv_state, &mixed_qkv], -1)?
                };
                let len = full.size()[2];
                state.conv_state = full.f_narrow(2, len - k, k)?.f_contiguous()?;
                let out = causal_conv1d_fn(&full, &weight, self.act)?;
                let out_len = out.size()[2];
                (out.f_narrow(2, out_len - seq, seq)?, Some((state, fresh)))
            }
            None => (causal_conv1d_fn(&mixed_qkv, &weight, self.act)?, None),
        };
        let mixed_qkv = mixed_qkv.f_transpose(1, 2)?;
        let (kd, vd) = (s.key_dim(), s.value_dim());
        // `torch.split`: one node in the graph (its backward assembles the three gradients).
        let parts = mixed_qkv.f_split_with_sizes([kd, kd, vd], -1)?;
        let [query, key, value] = parts.as_slice() else {
            return Err(Error::InvalidArgument {
                field: "in_proj_qkv",
                detail: "the projection did not split into queries, keys and values".into(),
            });
        };
        let query = query.f_reshape([batch, seq, -1, s.key_head_dim])?;
        let key = key.f_reshape([batch, seq, -1, s.key_head_dim])?;
        let value = value.f_reshape([batch, seq, -1, s.value_head_dim])?;
        let beta = b.f_sigmoid()?;
        // `-self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)`.
        let g = self.a_log.f_to_kind(Kind::Float)?.f_exp()?.f_neg()?
            * (a.f_to_kind(Kind::Float)? + &self.dt_bias).f_softplus()?;
        let core = match state.as_mut() {
            Some((state, false)) if seq == 1 => {
                let (out, last) = torch_recurrent_gated_delta_rule(
                    &query,
                    &key,
                    &value,
                    &g,
                    &beta,
                    Some(&state.recurrent_state),
                    true,
                )?;
                state.recurrent_state = last.unwrap_or(state.recurrent_state.shallow_clone());
                out
            }
            Some((state, fresh)) => {
                let initial = (!*fresh).then_some(&state.recurrent_state);
                let (out, last) = torch_chunk_gated_delta_rule(
                    &query, &key, &value, &g, &beta, 64, initial, true, true,
                )?;
                if let Some(last) = last {
                    state.recurrent_state = last;
                }
                out
            }
            None => {
                torch_chunk_gated_delta_rule(
                    &query, &key, &value, &g, &beta, 64, None, false, true,
                )?
                .0
            }
        };
        let core = core.f_reshape([-1, s.value_head_dim])?;
        let z = z.f_reshape([-1, s.value_head_dim])?;
        let core = rms_norm_gated(&core, &z, &self.norm, self.eps)?;
        let core = core.f_reshape([batch, seq, -1])?;
        let out = self.out_proj.forward(&core);
        self.ctx
            .leaf(|| self.name.clone(), &self.class, &[], input, &out);
        Ok(out)
    }
}

/// Upstream `Qwen3_5RMSNormGated`: the RMS norm in float32, scaled by `weight` in the input
/// dtype, times `silu(gate)` in float32, cast back.
pub fn rms_norm_gated(x: &Tensor, gate: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let kind = x.kind();
    let h = x.f_to_kind(Kind::Float)?;
    let variance = h
        .f_pow_tensor_scalar(2)?
        .f_mean_dim(-1, true, Kind::Float)?;
    let h = h * (variance + eps).f_rsqrt()?;
    let h = weight * h.f_to_kind(kind)?;
    let h = h * gate.f_to_kind(Kind::Float)?.f_silu()?;
    Ok(h.f_to_kind(kind)?)
}

/// Upstream `causal_conv1d_fn` (the torch fallback): the depthwise convolution of `x`
/// `[batch, channels, seq]` with `weight` `[channels, kernel]`, left-padded, cut to `seq`,
/// the activation, cast back to `x`'s dtype.
pub fn causal_conv1d_fn(x: &Tensor, weight: &Tensor, act: Activation) -> Result<Tensor> {
    let size = x.size();
    let (channels, seq) = (size[1], size[2]);
    let padding = weight.size()[1] - 1;
    let out = x.f_to_kind(weight.kind())?.f_conv1d(
        &weight.f_unsqueeze(1)?,
        None::<Tensor>,
        [1],
        [padding],
        [1],
        channels,
    )?;
    let out = act.apply(&out.f_narrow(2, 0, seq)?);
    Ok(out.f_to_kind(x.kind())?)
}

/// Upstream `causal_conv1d_update` (the torch fallback): one decoding step's convolution over
/// the stored inputs and the new ones, the state shifted in place.
pub fn causal_conv1d_update(
    x: &Tensor,
    conv_state: &mut Tensor,
    weight: &Tensor,
    act: Activation,
) -> Result<Tensor> {
    let size = x.size();
    let (channels, seq) = (size[1], size[2]);
    let state_len = conv_state.size()[2];
    let joined = Tensor::f_cat(&[&*conv_state, x], -1)?.f_to_kind(weight.kind())?;
    let len = joined.size()[2];
    conv_state.f_copy_(&joined.f_narrow(2, len - state_len, state_len)?)?;
    let out = joined.f_conv1d(
        &weight.f_unsqueeze(1)?,
        None::<Tensor>,
        [1],
        [0],
        [1],
        channels,
    )?;
    let out_len = out.size()[2];
    let out = act.apply(&out.f_narrow(2, out_len - seq, seq)?);
    Ok(out.f_to_kind(x.kind())?)
}

/// `x * rsqrt((x * x).sum(-1, keepdim=True) + eps)` (upstream's `l2norm`, as the FLA library).
fn l2norm(x: &Tensor) -> Result<Tensor> {
    let sum = (x * x).f_sum_dim_intlist(Some(&[-1i64][..]), true, None::<Kind>)?;
    Ok(x * (sum + 1e-6).f_rsqrt()?)
}

/// The query / key heads repeated for each value head they serve, then every input as
/// float32 `[batch, heads, seq, ...]` (upstream's preamble of both rules).
#[allow(clippy::type_complexity)]
fn prepare(
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    g: &Tensor,
    beta: &Tensor,
) -> Result<(Tensor, Tensor, Tensor, Tensor, Tensor)> {
    let (num_k, num_v) = (key.size()[2], value.size()[2]);
    let (query, key) = if num_k != num_v {
        let r = num_v / num_k;
        (
            query.f_repeat_interleave_self_int(r, 2, None::<i64>)?,
            key.f_repeat_interleave_self_int(r, 2, None::<i64>)?,
        )
    } else {
        (query.shallow_clone(), key.shallow_clone())
    };
    let prep = |x: &Tensor| -> Result<Tensor> {
        Ok(x.f_transpose(1, 2)?
            .f_to_kind(Kind::Float)?
            .f_contiguous()?)
    };
    Ok((
        prep(&query)?,
        prep(&key)?,
        prep(value)?,
        prep(beta)?,
        prep(g)?,
    ))
}

/// Upstream `torch_chunk_gated_delta_rule`: `[batch, seq, heads, dim]` queries / keys /
/// values, the decay `g` and `beta` `[batch, seq, value_heads]`; the output in the queries'
/// dtype and, with `output_final_state`, the recurrent state.
#[allow(clippy::too_many_arguments)]
pub fn torch_chunk_gated_delta_rule(
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    chunk_size: i64,
    initial_state: Option<&Tensor>,
    output_final_state: bool,
    use_qk_l2norm_in_kernel: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let initial_kind = query.kind();
    let ks = key.size();
    let (batch, seq, k_dim) = (ks[0], ks[1], ks[3]);
    let vs = value.size();
    let (num_v, v_dim) = (vs[2], vs[3]);
    let (query, key, value, beta, decay) = prepare(query, key, value, g, beta)?;
    let (query, key) = if use_qk_l2norm_in_kernel {
        (l2norm(&query)?, l2norm(&key)?)
    } else {
        (query, key)
    };
    let scaling = (query.size()[3] as f64).powf(-0.5);
    let query = query * scaling;
    let pad = (chunk_size - seq % chunk_size) % chunk_size;
    let pad4 = |x: &Tensor| x.f_constant_pad_nd([0, 0, 0, pad]);
    let (query, key, value) = (pad4(&query)?, pad4(&key)?, pad4(&value)?);
    let pad3 = |x: &Tensor| x.f_constant_pad_nd([0, pad]);
    let (beta, decay) = (pad3(&beta)?, pad3(&decay)?);
    let num_chunks = (seq + pad) / chunk_size;
    let v_beta = &value * beta.f_unsqueeze(-1)?;
    let k_beta = &key * beta.f_unsqueeze(-1)?;
    let chunked = |x: &Tensor| {
        let s = x.size();
        x.f_reshape([s[0], s[1], -1, chunk_size, s[3]])
    };
    let (query, key, k_beta, v_beta) = (
        chunked(&query)?,
        chunked(&key)?,
        chunked(&k_beta)?,
        chunked(&v_beta)?,
    );
    let ds = decay.size();
    let decay = decay.f_reshape([ds[0], ds[1], -1, chunk_size])?;
    let device = query.device();
    let upper = Tensor::f_ones([chunk_size, chunk_size], (Kind::Bool, device))?.f_triu(1)?;
    let cum_decay = decay.f_cumsum(3, None::<Kind>)?;
    let pairwise = (cum_decay.f_unsqueeze(4)? - cum_decay.f_unsqueeze(3)?)
        .f_masked_fill(&upper, f64::NEG_INFINITY)?
        .f_exp()?;
    let ut_system = k_beta.f_matmul(&key.f_transpose(-1, -2)?)? * &pairwise;
    let intra_chunk_attn = query.f_matmul(&key.f_transpose(-1, -2)?)? * &pairwise;
    let decayed_k_beta = &k_beta * cum_decay.f_exp()?.f_unsqueeze(-1)?;
    let new_values = ut_system.f_linalg_solve_triangular(&v_beta, false, true, true)?;
    let k_cumdecay = ut_system.f_linalg_solve_triangular(&decayed_k_beta, false, true, true)?;
    let mut state = match initial_state {
        None => Tensor::f_zeros(
            [batch, num_v, k_dim, v_dim],
            (new_values.kind(), new_values.device()),
        )?,
        Some(s) => s.f_to_kind(new_values.kind())?,
    };
    let core = new_values.f_zeros_like()?;
    let query = query * cum_decay.f_exp()?.f_unsqueeze(-1)?;
    let last = cum_decay.f_narrow(-1, chunk_size - 1, 1)?;
    let key = key * (last - &cum_decay).f_exp()?.f_unsqueeze(-1)?;
    let chunk_decay = cum_decay
        .f_select(-1, chunk_size - 1)?
        .f_exp()?
        .f_unsqueeze(-1)?
        .f_unsqueeze(-1)?;
    for i in 0..num_chunks {
        let v_new = new_values.f_select(2, i)? - k_cumdecay.f_select(2, i)?.f_matmul(&state)?;
        let inter = query.f_select(2, i)?.f_matmul(&state)?;
        let out = inter + intra_chunk_attn.f_select(2, i)?.f_matmul(&v_new)?;
        core.f_select(2, i)?.f_copy_(&out)?;
        state = state * chunk_decay.f_select(2, i)?
            + key.f_select(2, i)?.f_transpose(-1, -2)?.f_matmul(&v_new)?;
    }
    let core = core
        .f_reshape([batch, num_v, -1, v_dim])?
        .f_narrow(2, 0, seq)?
        .f_transpose(1, 2)?
        .f_to_kind(initial_kind)?
        .f_contiguous()?;
    Ok((core, output_final_state.then_some(state)))
}

/// Upstream `torch_recurrent_gated_delta_rule`: the rule token by token (decoding).
pub fn torch_recurrent_gated_delta_rule(
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    initial_state: Option<&Tensor>,
    output_final_state: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let initial_kind = query.kind();
    let ks = key.size();
    let (batch, seq, k_dim) = (ks[0], ks[1], ks[3]);
    let vs = value.size();
    let (num_v, v_dim) = (vs[2], vs[3]);
    let (query, key, value, beta, decay) = prepare(query, key, value, g, beta)?;
    let (query, key) = (l2norm(&query)?, l2norm(&key)?);
    let root = (query.size()[3] as f64).powf(0.5);
    let query = query / root;
    let mut state = match initial_state {
        None => Tensor::f_zeros([batch, num_v, k_dim, v_dim], (value.kind(), value.device()))?,
        Some(s) => s.f_to_kind(value.kind())?,
    };
    let core = value.f_zeros_like()?;
    for i in 0..seq {
        let (q_t, k_t, v_t) = (
            query.f_select(2, i)?,
            key.f_select(2, i)?,
            value.f_select(2, i)?,
        );
        let decay_t = decay
            .f_select(2, i)?
            .f_exp()?
            .f_unsqueeze(-1)?
            .f_unsqueeze(-1)?;
        state = state * decay_t;
        let beta_t = beta.f_select(2, i)?.f_unsqueeze(-1)?;
        let kv_mem = (&state * k_t.f_unsqueeze(-1)?).f_sum_dim_intlist(
            Some(&[-2i64][..]),
            false,
            None::<Kind>,
        )?;
        let delta = (v_t - kv_mem) * beta_t;
        state = &state + k_t.f_unsqueeze(-1)? * delta.f_unsqueeze(-2)?;
        let out = (&state * q_t.f_unsqueeze(-1)?).f_sum_dim_intlist(
            Some(&[-2i64][..]),
            false,
            None::<Kind>,
        )?;
        core.f_select(2, i)?.f_copy_(&out)?;
    }
    let core = core
        .f_transpose(1, 2)?
        .f_contiguous()?
        .f_to_kind(initial_kind)?;
    Ok((core, output_final_state.then_some(state)))
}

//! T5 (upstream `models/t5`): `T5Config` and `T5ForConditionalGeneration`, with upstream's
//! parameter names (`encoder.block.0.layer.0.SelfAttention.q.weight`, ...).
//!
//! Both generations of the checkpoints load: T5 v1.0 (`feed_forward_proj="relu"`, the head
//! tied to `shared` and the decoder output rescaled by `d_model ** -0.5`) and T5 v1.1 /
//! Flan-T5 (`"gated-gelu"`, an untied `lm_head`, no rescale). As transformers 5.23: the
//! config's `tie_word_embeddings` decides only the rescale (`scale_decoder_outputs`), and the
//! head is tied unless the checkpoint holds an `lm_head.weight` that differs from
//! `shared.weight`.
//!
//! The attention is upstream's sdpa path: no scaling of `q kᵀ`, the relative position bias
//! (computed by the first block of each stack, shared by the others) merged with the mask
//! into one additive float mask (`create_position_bias_mask`).

// `h = h + x` on purpose: tch's `+=` works in place and would modify tensors autograd
// saved for backward.
#![allow(clippy::assign_op_pattern)]

use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::nn;
use tch::{Device, Kind, Tensor};

use crate::attention;
use crate::configuration_utils::{self, LabelConfig, PretrainedConfig};
use crate::loading::{self, LoadOptions};
use crate::modeling_utils::{Loaded, ModelInputs, ModelOutput, PreTrainedModel, TrainableModel};
use crate::padding_free::{self, Unpadded};
use crate::{DynamicCache, Error, Result};
use tchtrain_nn::neftune_post_forward_hook;
use tchtrain_nn::{Activation, Context, Embedding, Linear, ModuleRepr};

/// Upstream `T5Config` with its defaults (t5-small).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct T5Config {
    pub vocab_size: i64,
    pub d_model: i64,
    pub d_kv: i64,
    pub d_ff: i64,
    pub num_layers: i64,
    /// `None`: as many as `num_layers` (upstream's "symmetry").
    pub num_decoder_layers: Option<i64>,
    pub num_heads: i64,
    pub relative_attention_num_buckets: i64,
    pub relative_attention_max_distance: i64,
    pub dropout_rate: f64,
    pub layer_norm_epsilon: f64,
    pub initializer_factor: f64,
    /// `"relu"` (v1.0), `"gated-gelu"` (v1.1, Flan-T5), `"gated-silu"`, ...
    pub feed_forward_proj: String,
    pub is_encoder_decoder: bool,
    pub pad_token_id: Option<i64>,
    /// An id or a list of ids.
    pub eos_token_id: Option<serde_json::Value>,
    pub decoder_start_token_id: Option<i64>,
    /// Always `true` once read, as upstream's `__post_init__` forces it; what a file said
    /// decides [`scale_decoder_outputs`](Self::scale_decoder_outputs).
    pub tie_word_embeddings: Option<bool>,
    /// Whether the decoder output is multiplied by `d_model ** -0.5` before the head
    /// (T5 v1.0); `None` in a file: `tie_word_embeddings != false`.
    pub scale_decoder_outputs: Option<bool>,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Default for T5Config {
    fn default() -> Self {
        Self {
            vocab_size: 32128,
            d_model: 512,
            d_kv: 64,
            d_ff: 2048,
            num_layers: 6,
            num_decoder_layers: None,
            num_heads: 8,
            relative_attention_num_buckets: 32,
            relative_attention_max_distance: 128,
            dropout_rate: 0.1,
            layer_norm_epsilon: 1e-6,
            initializer_factor: 1.0,
            feed_forward_proj: "relu".into(),
            is_encoder_decoder: true,
            pad_token_id: Some(0),
            eos_token_id: Some(serde_json::Value::from(1)),
            decoder_start_token_id: None,
            tie_word_embeddings: None,
            scale_decoder_outputs: None,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

impl PretrainedConfig for T5Config {
    fn model_type(&self) -> &'static str {
        "t5"
    }
    fn to_json_value(&self) -> Result<serde_json::Value> {
        let mut c = self.clone();
        c.normalize();
        let mut v = configuration_utils::to_value(&c)?;
        // Upstream's derived attributes, as its `to_dict` writes them.
        if let Some(m) = v.as_object_mut() {
            let (act, gated) = self.activation_name()?;
            m.insert("dense_act_fn".into(), act.into());
            m.insert("is_gated_act".into(), gated.into());
            m.insert("num_decoder_layers".into(), self.decoder_layers().into());
        }
        Ok(v)
    }
    fn labels(&self) -> &LabelConfig {
        &self.labels
    }
}

impl T5Config {
    /// Reads `config.json`, with upstream's `__post_init__` (the rescale decided from
    /// `tie_word_embeddings`, which is then forced to `true`).
    pub fn from_file(path: &Path) -> Result<Self> {
        let mut c: Self = configuration_utils::read_config(path)?;
        c.normalize();
        c.validate()?;
        Ok(c)
    }

    /// Upstream's `__post_init__`: `scale_decoder_outputs = tie_word_embeddings is not
    /// False` unless the file states it, and `tie_word_embeddings = True`.
    fn normalize(&mut self) {
        let scale = self
            .scale_decoder_outputs
            .unwrap_or(self.tie_word_embeddings != Some(false));
        self.scale_decoder_outputs = Some(scale);
        self.tie_word_embeddings = Some(true);
        // Derived on reading, as upstream's `__post_init__` does.
        self.extra.remove("dense_act_fn");
        self.extra.remove("is_gated_act");
    }

    /// Whether the decoder output is rescaled by `d_model ** -0.5`.
    pub fn scales_decoder_outputs(&self) -> bool {
        self.scale_decoder_outputs
            .unwrap_or(self.tie_word_embeddings != Some(false))
    }

    /// The decoder's number of blocks.
    pub fn decoder_layers(&self) -> i64 {
        self.num_decoder_layers.unwrap_or(self.num_layers)
    }

    /// Upstream's `dense_act_fn` and `is_gated_act` from `feed_forward_proj`
    /// (`"gated-gelu"` means `gelu_new`), with `validate_architecture`'s check.
    fn activation_name(&self) -> Result<(String, bool)> {
        let parts: Vec<&str> = self.feed_forward_proj.split('-').collect();
        if (parts.len() > 1 && parts[0] != "gated") || parts.len() > 2 {
            return Err(Error::InvalidConfig {
                field: "feed_forward_proj",
                value: self.feed_forward_proj.clone(),
                fix: "use the format `gated-{ACT_FN}` or `{ACT_FN}`, e.g. 'gated-gelu' or 'relu' (upstream's check)",
            });
        }
        let gated = parts[0] == "gated";
        let act = if self.feed_forward_proj == "gated-gelu" {
            "gelu_new"
        } else {
            parts[parts.len() - 1]
        };
        Ok((act.to_string(), gated))
    }

    fn activation(&self) -> Result<(Activation, bool)> {
        let (name, gated) = self.activation_name()?;
        Ok((Activation::parse(&name, "feed_forward_proj")?, gated))
    }

    fn validate(&self) -> Result<()> {
        configuration_utils::check_sizes(
            &[
                ("vocab_size", self.vocab_size),
                ("d_model", self.d_model),
                ("d_kv", self.d_kv),
                ("d_ff", self.d_ff),
                ("num_heads", self.num_heads),
                (
                    "relative_attention_num_buckets",
                    self.relative_attention_num_buckets,
                ),
                (
                    "relative_attention_max_distance",
                    self.relative_attention_max_distance,
                ),
            ],
            ("num_layers", self.num_layers),
        )?;
        if self.decoder_layers() < 1 {
            return Err(Error::InvalidConfig {
                field: "num_decoder_layers",
                value: self.decoder_layers().to_string(),
                fix: "the decoder needs at least one block",
            });
        }
        if self.relative_attention_num_buckets < 4 {
            return Err(Error::InvalidConfig {
                field: "relative_attention_num_buckets",
                value: self.relative_attention_num_buckets.to_string(),
                fix: "at least 4 buckets (half exact, half logarithmic, per direction)",
            });
        }
        if !(0.0..1.0).contains(&self.dropout_rate) {
            return Err(Error::InvalidConfig {
                field: "dropout_rate",
                value: self.dropout_rate.to_string(),
                fix: "a probability in [0, 1)",
            });
        }
        self.activation()?;
        Ok(())
    }
}

/// Upstream `T5LayerNorm`: the variance in float32, `x * rsqrt(variance + eps)` (promoted
/// to float32), cast to the weight's dtype when that is half precision, times the weight.
#[derive(Debug)]
struct T5LayerNorm {
    weight: Tensor,
    eps: f64,
    name: String,
    ctx: Context,
}

impl T5LayerNorm {
    fn new(p: tchtrain_nn::Path<'_>, dim: i64, eps: f64, factor: f64) -> Self {
        Self {
            weight: tchtrain_nn::initialization::var(&p, "weight", &[dim], nn::Init::Const(factor)),
            eps,
            name: p.name(),
            ctx: p.ctx().clone(),
        }
    }

    /// The norm, reported to the tracer.
    fn forward(&self, x: &Tensor) -> Tensor {
        let y = self.norm(x);
        if self.ctx.traced() {
            let params = [("weight", &self.weight)];
            self.ctx
                .leaf(|| self.name.clone(), "T5LayerNorm", &params, x, &y);
        }
        y
    }

    fn norm(&self, x: &Tensor) -> Tensor {
        let variance = x
            .to_kind(Kind::Float)
            .pow_tensor_scalar(2)
            .mean_dim(-1, true, Kind::Float);
        let mut h = x * (variance + self.eps).rsqrt();
        if matches!(self.weight.kind(), Kind::Half | Kind::BFloat16) {
            h = h.to_kind(self.weight.kind());
        }
        &self.weight * h
    }
}

/// Upstream `T5Attention` (self-attention, or cross-attention over the encoder's states).
#[derive(Debug)]
struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    relative_attention_bias: Option<Embedding>,
}

/// One of a stack's sub-layers with its pre-norm (`T5LayerSelfAttention`,
/// `T5LayerCrossAttention`).
#[derive(Debug)]
struct AttentionLayer {
    attention: Attention,
    layer_norm: T5LayerNorm,
    name: String,
}

/// Upstream `T5DenseActDense` (`wi`) or `T5DenseGatedActDense` (`wi_0`, `wi_1`), then `wo`.
#[derive(Debug)]
struct FeedForward {
    wi: Option<Linear>,
    wi_0: Option<Linear>,
    wi_1: Option<Linear>,
    wo: Linear,
    layer_norm: T5LayerNorm,
    name: String,
}

#[derive(Debug)]
struct Block {
    self_attention: AttentionLayer,
    cross_attention: Option<AttentionLayer>,
    ff: FeedForward,
    idx: usize,
}

/// Upstream `T5Stack` (the encoder, or the decoder with cross-attention); its
/// `embed_tokens` is the model's `shared`.
#[derive(Debug)]
struct Stack {
    ctx: Context,
    block: Vec<Block>,
    final_layer_norm: T5LayerNorm,
    is_decoder: bool,
    name: &'static str,
}

/// What every block of a stack's forward shares.
struct StackInputs<'a> {
    ctx: Context,
    config: &'a T5Config,
    act: Activation,
    train: bool,
    /// The decoder (its relative positions are one-sided).
    is_decoder: bool,
    /// The self-attention mask (causal in the decoder).
    mask: attention::Mask,
    /// The decoder's view of the encoder: its last hidden state and padding mask.
    encoder: Option<(&'a Tensor, attention::Mask)>,
    cache: Option<&'a DynamicCache>,
    /// Tokens already in the cache (the decoder's relative positions start there).
    past: i64,
    /// The encoder's padding-free layout, when its blocks run on the real tokens only.
    unpadded: Option<Unpadded>,
}

impl StackInputs<'_> {
    /// Dropout on the hidden states, padded or padding-free.
    fn dropout(&self, x: &Tensor, name: impl FnOnce() -> String) -> Tensor {
        padding_free::dropout_traced(
            &self.ctx,
            self.unpadded.as_ref(),
            x,
            self.config.dropout_rate,
            self.train,
            name,
        )
    }
}

/// Upstream `_relative_position_bucket`, op for op (the logarithmic buckets through a
/// float32 log and a truncating cast).
fn relative_position_bucket(
    relative_position: &Tensor,
    bidirectional: bool,
    num_buckets: i64,
    max_distance: i64,
) -> Tensor {
    let mut num_buckets = num_buckets;
    let mut buckets = relative_position.zeros_like();
    let relative_position = if bidirectional {
        num_buckets /= 2;
        buckets = buckets + relative_position.gt(0).to_kind(Kind::Int64) * num_buckets;
        relative_position.abs()
    } else {
        -relative_position.minimum(&relative_position.zeros_like())
    };
    let max_exact = num_buckets / 2;
    let is_small = relative_position.lt(max_exact);
    let if_large = (relative_position.to_kind(Kind::Float) / max_exact as f64).log()
        / (max_distance as f64 / max_exact as f64).ln()
        * (num_buckets - max_exact) as f64;
    let if_large = if_large.to_kind(Kind::Int64) + max_exact;
    let if_large = if_large.minimum(&if_large.full_like(num_buckets - 1));
    buckets + relative_position.where_self(&is_small, &if_large)
}

impl Attention {
    fn new(p: tchtrain_nn::Path<'_>, c: &T5Config, has_relative_attention_bias: bool) -> Self {
        let f = c.initializer_factor;
        let (d, inner) = (c.d_model, c.num_heads * c.d_kv);
        let std_q = f * ((d * c.d_kv) as f64).powf(-0.5);
        let std_kv = f * (d as f64).powf(-0.5);
        let std_o = f * (inner as f64).powf(-0.5);
        Self {
            q: Linear::in_layer(&p / "q", d, inner, false, std_q),
            k: Linear::in_layer(&p / "k", d, inner, false, std_kv),
            v: Linear::in_layer(&p / "v", d, inner, false, std_kv),
            o: Linear::in_layer(&p / "o", inner, d, false, std_o),
            relative_attention_bias: has_relative_attention_bias.then(|| {
                Embedding::new(
                    &p / "relative_attention_bias",
                    c.relative_attention_num_buckets,
                    c.num_heads,
                    std_kv,
                )
            }),
        }
    }

    /// Upstream `compute_bias`: `[1, heads, q, k]` for queries after `past` cached tokens.
    fn compute_bias(
        &self,
        table: &Embedding,
        q_len: i64,
        k_len: i64,
        s: &StackInputs<'_>,
    ) -> Tensor {
        let device = table.ws.device();
        let context = Tensor::arange(q_len, (Kind::Int64, device)).unsqueeze(1) + s.past;
        let memory = Tensor::arange(k_len, (Kind::Int64, device)).unsqueeze(0);
        let buckets = relative_position_bucket(
            &(memory - context),
            !s.is_decoder,
            s.config.relative_attention_num_buckets,
            s.config.relative_attention_max_distance,
        );
        let values = table.forward(&buckets);
        values.permute([2, 0, 1]).unsqueeze(0)
    }

    /// Upstream `T5Attention.forward`: returns the output and the position bias the next
    /// blocks reuse.
    fn forward(
        &self,
        h: &Tensor,
        key_value_states: Option<&Tensor>,
        mask: &attention::Mask,
        position_bias: Option<&Tensor>,
        s: &StackInputs<'_>,
        idx: usize,
    ) -> Result<(Tensor, Tensor)> {
        let c = s.config;
        let unpadded = s.unpadded.as_ref();
        let (batch, q_len) = match unpadded {
            Some(u) => u.batch_seq(),
            None => (h.size()[0], h.size()[1]),
        };
        let heads = |t: &Tensor| {
            padding_free::padded(unpadded, t.shallow_clone())
                .view([batch, -1, c.num_heads, c.d_kv])
                .transpose(1, 2)
        };
        let q = heads(&self.q.forward(h));
        let current = key_value_states.unwrap_or(h);
        let k = heads(&self.k.forward(current));
        let v = heads(&self.v.forward(current));
        // The cross-attention keys of the encoder are computed again at every step (upstream
        // caches them: the same op on the same states, the same values).
        let (k, v) = match (s.cache, key_value_states) {
            (Some(cache), None) => cache.update(idx, &k, &v)?,
            (Some(_), Some(_)) => (
                crate::cache_utils::first_update(&k, k.kind())?,
                crate::cache_utils::first_update(&v, k.kind())?,
            ),
            (None, _) => (k, v),
        };
        let k_len = k.size()[2];
        let position_bias = match (position_bias, &self.relative_attention_bias) {
            (Some(b), _) => b.shallow_clone(),
            (None, Some(table)) => self.compute_bias(table, q_len, k_len, s),
            (None, None) => Tensor::zeros([1, c.num_heads, q_len, k_len], (q.kind(), q.device())),
        };
        let dropout = if s.train { c.dropout_rate } else { 0.0 };
        let a = attention::sdpa_with_position_bias(&q, &k, &v, mask, &position_bias, dropout);
        let a = padding_free::unpadded(unpadded, a.transpose(1, 2).reshape([batch, q_len, -1]));
        let a = self.o.forward(&a);
        Ok((a, position_bias))
    }
}

impl FeedForward {
    fn new(p: tchtrain_nn::Path<'_>, c: &T5Config, gated: bool, name: String) -> Self {
        let f = c.initializer_factor;
        let std_i = f * (c.d_model as f64).powf(-0.5);
        let std_o = f * (c.d_ff as f64).powf(-0.5);
        let dense = &p / "DenseReluDense";
        let lin = |n: &str, i, o, std| Some(Linear::in_layer(&dense / n, i, o, false, std));
        let (wi, wi_0, wi_1) = if gated {
            (
                None,
                lin("wi_0", c.d_model, c.d_ff, std_i),
                lin("wi_1", c.d_model, c.d_ff, std_i),
            )
        } else {
            (lin("wi", c.d_model, c.d_ff, std_i), None, None)
        };
        Self {
            wi,
            wi_0,
            wi_1,
            wo: Linear::in_layer(&dense / "wo", c.d_ff, c.d_model, false, std_o),
            layer_norm: T5LayerNorm::new(&p / "layer_norm", c.d_model, c.layer_norm_epsilon, f),
            name,
        }
    }

    /// Upstream `T5LayerFF.forward`.
    fn forward(&self, h: &Tensor, s: &StackInputs<'_>) -> Tensor {
        let n = |rest: &str| format!("{}.{rest}", self.name);
        let x = self.layer_norm.forward(h);
        let inner = match (&self.wi, &self.wi_0, &self.wi_1) {
            (Some(wi), _, _) => {
                let x = wi.forward(&x);
                s.act.apply_traced(&s.ctx, &x, || n("DenseReluDense.act"))
            }
            (None, Some(wi_0), Some(wi_1)) => {
                let gelu = s
                    .act
                    .apply_traced(&s.ctx, &wi_0.forward(&x), || n("DenseReluDense.act"));
                let linear = wi_1.forward(&x);
                gelu * linear
            }
            _ => unreachable!("a feed-forward layer has `wi` or `wi_0` and `wi_1`"),
        };
        let inner = s.dropout(&inner, || n("DenseReluDense.dropout"));
        // `wo` stays in float32 when the rest is in half precision (`_keep_in_fp32_modules`).
        let wo_kind = self.wo.ws.kind();
        let inner = if inner.kind() != wo_kind {
            inner.to_kind(wo_kind)
        } else {
            inner
        };
        let out = self.wo.forward(&inner);
        h + s.dropout(&out, || n("dropout"))
    }
}

/// Upstream's clamp of float16 hidden states in each block (`finfo.max`, less 1000 when an
/// infinity showed up).
fn clamp_fp16(h: Tensor) -> Tensor {
    if h.kind() != Kind::Half {
        return h;
    }
    let max = 65504.0;
    let clamp = if h.isinf().any().int64_value(&[]) != 0 {
        max - 1000.0
    } else {
        max
    };
    h.clamp(-clamp, clamp)
}

impl AttentionLayer {
    fn forward(
        &self,
        h: &Tensor,
        key_value_states: Option<&Tensor>,
        mask: &attention::Mask,
        position_bias: Option<&Tensor>,
        s: &StackInputs<'_>,
        idx: usize,
    ) -> Result<(Tensor, Tensor)> {
        let normed = self.layer_norm.forward(h);
        let (a, bias) =
            self.attention
                .forward(&normed, key_value_states, mask, position_bias, s, idx)?;
        let a = s.dropout(&a, || format!("{}.dropout", self.name));
        Ok((h + a, bias))
    }
}

impl Block {
    /// Upstream `T5Block.forward`: self-attention, cross-attention (decoder), feed-forward;
    /// returns the hidden states and the two position biases.
    fn forward(
        &self,
        h: &Tensor,
        self_bias: Option<&Tensor>,
        cross_bias: Option<&Tensor>,
        s: &StackInputs<'_>,
    ) -> Result<(Tensor, Tensor, Option<Tensor>)> {
        let (h, self_bias) = self
            .self_attention
            .forward(h, None, &s.mask, self_bias, s, self.idx)?;
        let mut h = clamp_fp16(h);
        let mut cross = None;
        if let (Some(layer), Some((states, mask))) = (&self.cross_attention, &s.encoder) {
            let (out, bias) = layer.forward(&h, Some(states), mask, cross_bias, s, self.idx)?;
            h = clamp_fp16(out);
            cross = Some(bias);
        }
        let h = clamp_fp16(self.ff.forward(&h, s));
        Ok((h, self_bias, cross))
    }
}

impl Stack {
    fn new(p: tchtrain_nn::Path<'_>, c: &T5Config, is_decoder: bool, gated: bool) -> Self {
        let name = if is_decoder { "decoder" } else { "encoder" };
        let layers_n = if is_decoder {
            c.decoder_layers()
        } else {
            c.num_layers
        };
        let eps = c.layer_norm_epsilon;
        let f = c.initializer_factor;
        let block = (0..layers_n)
            .map(|i| {
                let b = &p / "block" / i;
                let prefix = format!("{name}.block.{i}");
                let l0 = &b / "layer" / 0;
                let self_attention = AttentionLayer {
                    attention: Attention::new(&l0 / "SelfAttention", c, i == 0),
                    layer_norm: T5LayerNorm::new(&l0 / "layer_norm", c.d_model, eps, f),
                    name: format!("{prefix}.layer.0"),
                };
                let cross_attention = is_decoder.then(|| {
                    let l1 = &b / "layer" / 1;
                    AttentionLayer {
                        attention: Attention::new(&l1 / "EncDecAttention", c, false),
                        layer_norm: T5LayerNorm::new(&l1 / "layer_norm", c.d_model, eps, f),
                        name: format!("{prefix}.layer.1"),
                    }
                });
                let ff_idx = if is_decoder { 2 } else { 1 };
                let ff = FeedForward::new(
                    &b / "layer" / ff_idx,
                    c,
                    gated,
                    format!("{prefix}.layer.{ff_idx}"),
                );
                Block {
                    self_attention,
                    cross_attention,
                    ff,
                    idx: i as usize,
                }
            })
            .collect();
        Self {
            ctx: p.ctx().clone(),
            block,
            final_layer_norm: T5LayerNorm::new(&p / "final_layer_norm", c.d_model, eps, f),
            is_decoder,
            name,
        }
    }

    /// Upstream `T5Stack.forward` on the token embeddings; the last hidden state.
    fn forward(&self, embeds: &Tensor, s: &StackInputs<'_>) -> Result<Tensor> {
        let p = s.config.dropout_rate;
        let n = |rest: &str| format!("{}.{rest}", self.name);
        let mut h = tchtrain_nn::dropout_traced(&self.ctx, embeds, p, s.train, || n("dropout"));
        if let Some(u) = &s.unpadded {
            h = u.gather(&h);
        }
        let (mut self_bias, mut cross_bias) = (None::<Tensor>, None::<Tensor>);
        for b in &self.block {
            let (out, sb, cb) = b.forward(&h, self_bias.as_ref(), cross_bias.as_ref(), s)?;
            h = out;
            self_bias = Some(sb);
            if self.is_decoder {
                cross_bias = cb;
            }
        }
        let h = self.final_layer_norm.forward(&h);
        let h = s.dropout(&h, || n("dropout"));
        Ok(padding_free::padded(s.unpadded.as_ref(), h))
    }
}

/// Upstream `T5ForConditionalGeneration`: `shared` embeddings, the encoder and decoder
/// stacks, and `lm_head` (tied to `shared` unless the checkpoint holds its own).
#[derive(Debug)]
pub struct T5ForConditionalGeneration {
    vs: nn::VarStore,
    ctx: Context,
    shared: Embedding,
    encoder: Stack,
    decoder: Stack,
    lm_head: Option<Tensor>,
    act: Activation,
    config: T5Config,
    training: bool,
    /// `generation_config` (as JSON).
    generation_config: serde_json::Value,
    /// The decoder stack's own `use_cache` (upstream deep-copies the config into each stack
    /// when the model is built, so a later `model.config.use_cache = ...`, the Trainer's
    /// included, does not reach it): with it, every decoder forward builds a cache, whose
    /// first update lays the keys out anew.
    decoder_use_cache: bool,
    /// Run the encoder on the real tokens only (see [`TrainableModel::set_padding_free`];
    /// off unless `TCHTRAIN_PADDING_FREE` turns it on).
    padding_free: bool,
}

impl T5ForConditionalGeneration {
    /// A freshly initialised model (upstream `T5ForConditionalGeneration(config)`: the head
    /// tied to `shared`), seeded by tch's RNG.
    pub fn new(config: &T5Config, device: Device) -> Result<Self> {
        Self::new_in(config, device, &Context::new())
    }

    /// [`new`](Self::new) with the parts sharing `ctx` (a deferred one in
    /// `from_pretrained`).
    pub(crate) fn new_in(config: &T5Config, device: Device, ctx: &Context) -> Result<Self> {
        Self::build(config, false, device, ctx)
    }

    fn build(config: &T5Config, untied_head: bool, device: Device, ctx: &Context) -> Result<Self> {
        let mut config = config.clone();
        config.normalize();
        config.validate()?;
        let (act, gated) = config.activation()?;
        let vs = nn::VarStore::new(device);
        let root = tchtrain_nn::Path::root(&vs, ctx);
        let f = config.initializer_factor;
        // Upstream's registration order: shared, encoder, decoder, lm_head.
        let shared = Embedding::new(&root / "shared", config.vocab_size, config.d_model, f);
        let encoder = Stack::new(&root / "encoder", &config, false, gated);
        let decoder = Stack::new(&root / "decoder", &config, true, gated);
        let lm_head = untied_head.then(|| {
            tchtrain_nn::initialization::var(
                &(&root / "lm_head"),
                "weight",
                &[config.vocab_size, config.d_model],
                tchtrain_nn::initialization::normal(f),
            )
        });
        let generation_config = crate::generation::generation_fields_of(&config.to_json_value()?);
        Ok(Self {
            vs,
            ctx: ctx.clone(),
            shared,
            encoder,
            decoder,
            lm_head,
            act,
            decoder_use_cache: configuration_utils::use_cache(&config.extra),
            config,
            training: false,
            generation_config,
            padding_free: crate::modeling_utils::padding_free_from_env(),
        })
    }

    /// Upstream `from_pretrained` on a resolved local folder. The head is tied to
    /// `shared` unless the checkpoint holds an `lm_head.weight` that differs from it
    /// (upstream's `tie_weights` then warns and leaves them apart).
    pub fn from_pretrained_dir(
        dir: &Path,
        device: Device,
        options: &LoadOptions,
    ) -> Result<Loaded<Self>> {
        let config = T5Config::from_file(&dir.join(loading::CONFIG_NAME))?;
        let untied = loading::checkpoint_tensors_differ(dir, "lm_head.weight", "shared.weight")?;
        if untied {
            log::warn!(
                "The tied weights mapping and config for this model specifies to tie shared.weight to lm_head.weight, but both are present in the checkpoints with different values, so we will NOT tie them. You should update the config with `tie_word_embeddings=False` to silence this warning."
            );
        }
        let mut loaded = loading::from_pretrained_with(
            dir,
            "transformer",
            &["decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"],
            options,
            |ctx| Self::build(&config, untied, device, ctx),
        )?;
        // `_keep_in_fp32_modules = ["wo"]`: a half-precision load keeps `wo` in float32.
        let m = &mut loaded.model;
        if m.vs.root().kind() != Kind::Float {
            tch::no_grad(|| {
                for (name, mut var) in m.vs.variables() {
                    if name.ends_with(".DenseReluDense.wo.weight") {
                        var.set_data(&var.to_kind(Kind::Float));
                    }
                }
            });
        }
        loaded.model.generation_config =
            crate::generation::model_generation_config(dir, &config.to_json_value()?)?;
        Ok(loaded)
    }

    /// The config.
    pub fn t5_config(&self) -> &T5Config {
        &self.config
    }

    /// Upstream `_shift_right` (`prepare_decoder_input_ids_from_labels`): the labels moved
    /// one position right behind `decoder_start_token_id`, -100 replaced by the pad id.
    pub fn prepare_decoder_input_ids_from_labels(&self, labels: &Tensor) -> Result<Tensor> {
        self.decoder_start_of()?
            .decoder_input_ids(labels)
            .map_err(|e| Error::InvalidInput {
                name: "labels",
                detail: e.to_string(),
            })
    }

    fn decoder_start_of(&self) -> Result<tchtrain_collators::DecoderStart> {
        let start = self
            .config
            .decoder_start_token_id
            .ok_or(Error::InvalidConfig {
                field: "decoder_start_token_id",
                value: "null".into(),
                fix: "self.model.config.decoder_start_token_id has to be defined. In T5 it is usually set to the pad_token_id. (upstream's message)",
            })?;
        let pad = self.config.pad_token_id.ok_or(Error::InvalidConfig {
            field: "pad_token_id",
            value: "null".into(),
            fix: "self.model.config.pad_token_id has to be defined. (upstream's message)",
        })?;
        Ok(tchtrain_collators::DecoderStart::Token {
            decoder_start_token_id: start,
            pad_token_id: pad,
        })
    }

    fn embed(&self, ids: &Tensor, name: &str) -> Result<Tensor> {
        crate::check_ids(ids, self.config.vocab_size, i64::MAX)?;
        let ids = ids.f_to_device(self.shared.ws.device())?;
        let e = self.shared.lookup(&ids);
        let e = neftune_post_forward_hook(&self.ctx, e, self.training)?;
        self.ctx.leaf(
            || format!("{name}.embed_tokens"),
            "Embedding",
            &[("weight", &self.shared.ws)],
            &ids,
            &e,
        );
        Ok(e)
    }

    /// The encoder's last hidden state for `input_ids` (upstream `model.get_encoder()`).
    fn run_encoder(&self, input_ids: &Tensor, attention_mask: Option<&Tensor>) -> Result<Tensor> {
        let embeds = self.embed(input_ids, "encoder")?;
        let (batch, seq) = (embeds.size()[0], embeds.size()[1]);
        crate::modeling_utils::check_mask_shape(attention_mask, "attention_mask", batch, seq)?;
        let device = embeds.device();
        let s = StackInputs {
            ctx: self.ctx.clone(),
            config: &self.config,
            act: self.act,
            train: self.training,
            is_decoder: false,
            mask: attention::attention_mask(attention_mask, batch, seq, false, device),
            encoder: None,
            cache: None,
            past: 0,
            unpadded: Unpadded::for_forward(
                &self.ctx,
                self.padding_free,
                false,
                attention_mask,
                device,
            )?,
        };
        self.encoder.forward(&embeds, &s)
    }
}

impl T5ForConditionalGeneration {
    /// What `print(model)` shows: `shared`, the two `T5Stack`s (each block's layers; the
    /// first block's attention with `relative_attention_bias`; `T5DenseGatedActDense` for the
    /// gated activations), `lm_head`.
    fn t5_module_repr(&self) -> Option<ModuleRepr> {
        let c = &self.config;
        let (d, inner) = (c.d_model, c.num_heads * c.d_kv);
        let (_, gated) = c.activation_name().ok()?;
        let dropout = || ModuleRepr::dropout(c.dropout_rate);
        let attention = |relative: bool| {
            let mut a = ModuleRepr::new("T5Attention")
                .child("q", ModuleRepr::linear(d, inner, false))
                .child("k", ModuleRepr::linear(d, inner, false))
                .child("v", ModuleRepr::linear(d, inner, false))
                .child("o", ModuleRepr::linear(inner, d, false));
            if relative {
                a = a.child(
                    "relative_attention_bias",
                    ModuleRepr::embedding(c.relative_attention_num_buckets, c.num_heads, None),
                );
            }
            a
        };
        let act = || ModuleRepr::new(self.act.class_name());
        let dense = match gated {
            true => ModuleRepr::new("T5DenseGatedActDense")
                .child("wi_0", ModuleRepr::linear(d, c.d_ff, false))
                .child("wi_1", ModuleRepr::linear(d, c.d_ff, false))
                .child("wo", ModuleRepr::linear(c.d_ff, d, false))
                .child("dropout", dropout())
                .child("act", act()),
            false => ModuleRepr::new("T5DenseActDense")
                .child("wi", ModuleRepr::linear(d, c.d_ff, false))
                .child("wo", ModuleRepr::linear(c.d_ff, d, false))
                .child("dropout", dropout())
                .child("act", act()),
        };
        let sublayer = |class: &str, key: &str, module: ModuleRepr| {
            ModuleRepr::new(class)
                .child(key, module)
                .child("layer_norm", ModuleRepr::new("T5LayerNorm"))
                .child("dropout", dropout())
        };
        let stack = |stack: &Stack| {
            let blocks = (0..stack.block.len())
                .map(|i| {
                    let mut layers = vec![sublayer(
                        "T5LayerSelfAttention",
                        "SelfAttention",
                        attention(i == 0),
                    )];
                    if stack.is_decoder {
                        layers.push(sublayer(
                            "T5LayerCrossAttention",
                            "EncDecAttention",
                            attention(false),
                        ));
                    }
                    layers.push(sublayer("T5LayerFF", "DenseReluDense", dense.clone()));
                    ModuleRepr::new("T5Block").child("layer", ModuleRepr::module_list(layers))
                })
                .collect();
            ModuleRepr::new("T5Stack")
                .child("embed_tokens", ModuleRepr::embedding(c.vocab_size, d, None))
                .child("block", ModuleRepr::module_list(blocks))
                .child("final_layer_norm", ModuleRepr::new("T5LayerNorm"))
                .child("dropout", dropout())
        };
        Some(
            ModuleRepr::new("T5ForConditionalGeneration")
                .child("shared", ModuleRepr::embedding(c.vocab_size, d, None))
                .child("encoder", stack(&self.encoder))
                .child("decoder", stack(&self.decoder))
                .child("lm_head", ModuleRepr::linear(d, c.vocab_size, false)),
        )
    }
}

impl PreTrainedModel for T5ForConditionalGeneration {
    fn architecture(&self) -> &'static str {
        "T5ForConditionalGeneration"
    }
    fn module_repr(&self) -> Option<ModuleRepr> {
        self.t5_module_repr()
    }
    fn config(&self) -> &dyn PretrainedConfig {
        &self.config
    }
    fn generation_config(&self) -> Option<&serde_json::Value> {
        Some(&self.generation_config)
    }
}

impl TrainableModel for T5ForConditionalGeneration {
    crate::modeling_utils::model_plumbing!();

    crate::modeling_utils::encoder_decoder_plumbing!();
    fn is_embedding_weight(&self, name: &str) -> bool {
        name == "shared.weight" || name.ends_with(".relative_attention_bias.weight")
    }
    fn tied_weights(&self) -> Vec<(String, String)> {
        let mut tied = vec![
            ("encoder.embed_tokens.weight".into(), "shared.weight".into()),
            ("decoder.embed_tokens.weight".into(), "shared.weight".into()),
        ];
        if self.lm_head.is_none() {
            tied.push(("lm_head.weight".into(), "shared.weight".into()));
        }
        tied
    }
    fn forward(&self, inputs: &ModelInputs<'_>) -> Result<ModelOutput> {
        let device = self.shared.ws.device();
        let resolved = crate::modeling_utils::seq2seq_inputs(
            inputs,
            device,
            self.architecture(),
            |ids, mask| self.run_encoder(ids, mask),
            |labels| self.prepare_decoder_input_ids_from_labels(labels),
            false,
        )?;
        let encoder_hidden = &resolved.encoder_hidden;
        let labels = &resolved.labels;
        let (batch, enc_seq) = (encoder_hidden.size()[0], encoder_hidden.size()[1]);
        let embeds = self.embed(&resolved.decoder_input_ids, "decoder")?;
        let seq = embeds.size()[1];
        // Without a cache given, the decoder builds its own when its `use_cache` says so.
        let own_cache =
            (inputs.past_key_values.is_none() && self.decoder_use_cache).then(DynamicCache::new);
        let cache = inputs.past_key_values.or(own_cache.as_ref());
        let past = cache.map_or(0, DynamicCache::get_seq_length);
        let s = StackInputs {
            ctx: self.ctx.clone(),
            config: &self.config,
            act: self.act,
            train: self.training,
            is_decoder: true,
            mask: attention::attention_mask_after(
                inputs.decoder_attention_mask,
                batch,
                seq,
                past,
                device,
            )?,
            encoder: Some((
                encoder_hidden,
                attention::attention_mask(inputs.attention_mask, batch, enc_seq, false, device),
            )),
            cache,
            past,
            unpadded: None,
        };
        let mut h = self.decoder.forward(&embeds, &s)?;
        if self.config.scales_decoder_outputs() {
            h = h * (self.config.d_model as f64).powf(-0.5);
        }
        let weight = self.lm_head.as_ref().unwrap_or(&self.shared.ws);
        let logits = h.matmul(&weight.tr());
        self.ctx.leaf(
            || "lm_head".into(),
            "Linear",
            &[("weight", weight)],
            &h,
            &logits,
        );
        let loss = match labels {
            Some(labels) => {
                let vocab = logits.size()[2];
                Some(logits.f_view([-1, vocab])?.f_cross_entropy_loss::<Tensor>(
                    &labels.f_view([-1])?,
                    None,
                    tch::Reduction::Mean,
                    -100,
                    0.0,
                )?)
            }
            None => None,
        };
        self.ctx.model_frame(self.architecture())?;
        Ok(ModelOutput {
            loss,
            logits: Some(logits),
            last_hidden_state: Some(h),
            pooler_output: None,
            aux_loss: None,
        })
    }
}

//! ModernBERT (upstream `models/modernbert`): `ModernBertConfig`, `ModernBertModel`,
//! `ModernBertForMaskedLM`, `ModernBertForSequenceClassification`,
//! `ModernBertForTokenClassification`.
//!
//! A pre-norm encoder: embeddings → LayerNorm (no biases unless `norm_bias`), layers of
//! fused-`Wqkv` attention with RoPE (each layer `full_attention`, or `sliding_attention`
//! over the keys within `local_attention / 2` of the query, with its own RoPE base) and a
//! GeGLU MLP (`Wi` split into input and gate), `final_norm`; the heads put a prediction head
//! (dense, `classifier_activation`, LayerNorm) before the tied decoder or the classifier.
//! Upstream runs it through SDPA on CPU (no unpadding there), and so does this one.
//!
//! Initialisation as upstream's `_init_weights`: the generic normal draw, then ModernBERT's
//! truncated normal (`initializer_cutoff_factor` standard deviations) with a per-module
//! standard deviation: `initializer_range` for the embeddings, `Wqkv`, `Wi`; divided by
//! `sqrt(2 · num_hidden_layers)` for the output projections, the head's dense and the
//! decoder; `hidden_size ** -0.5` for a classifier.

// `h = h + x` on purpose: tch's `+=` works in place and would modify tensors autograd
// saved for backward.
#![allow(clippy::assign_op_pattern)]

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tch::nn::Init;
use tch::{Kind, Tensor};

use crate::attention;
use crate::checkpoint::{ActivationCheckpointing, ReadOnlyLayer, Shared, run_layers};
use crate::configuration_utils::{self, LabelConfig, PretrainedConfig};
use crate::encoder::{EncoderArchitecture, EncoderFor};
use crate::heads::{self, HeadKind};
use crate::modeling_utils::{ModelInputs, ModelOutput};
use crate::padding_free::{self, EncoderHead, Unpadded};
use crate::rope::{self, RopeParameters, RotaryEmbedding};
use crate::{Error, Result};
use tchtrain_nn::initialization::{self, TruncNormal};
use tchtrain_nn::{Activation, Context, Embedding, Linear, ModuleRepr};

/// Upstream `ModernBertConfig` with its defaults (ModernBERT base).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct ModernBertConfig {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub hidden_activation: String,
    pub max_position_embeddings: i64,
    pub initializer_range: f64,
    pub initializer_cutoff_factor: Option<f64>,
    pub norm_eps: f64,
    pub norm_bias: bool,
    pub pad_token_id: Option<i64>,
    pub eos_token_id: Option<Value>,
    pub bos_token_id: Option<i64>,
    pub cls_token_id: Option<i64>,
    pub sep_token_id: Option<i64>,
    pub attention_bias: bool,
    pub attention_dropout: f64,
    /// `full_attention` / `sliding_attention` per layer; `None`: every
    /// `global_attn_every_n_layers`-th layer (3 by default) full from the first, the others
    /// sliding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer_types: Option<Vec<String>>,
    /// Per layer type: `{"full_attention": {"rope_type": "default", "rope_theta": 160000.0},
    /// "sliding_attention": {...}}`; v4's `global_rope_theta` / `local_rope_theta` /
    /// `rope_scaling` are read from the other keys.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<Map<String, Value>>,
    pub local_attention: i64,
    pub embedding_dropout: f64,
    pub mlp_bias: bool,
    pub mlp_dropout: f64,
    pub decoder_bias: bool,
    pub classifier_pooling: String,
    pub classifier_dropout: f64,
    pub classifier_bias: bool,
    pub classifier_activation: String,
    /// Flash-attention only upstream (not on CPU): refused when true.
    pub deterministic_flash_attn: bool,
    pub sparse_prediction: bool,
    pub sparse_pred_ignore_index: i64,
    pub tie_word_embeddings: bool,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Default for ModernBertConfig {
    fn default() -> Self {
        Self {
            vocab_size: 50368,
            hidden_size: 768,
            intermediate_size: 1152,
            num_hidden_layers: 22,
            num_attention_heads: 12,
            hidden_activation: "gelu".into(),
            max_position_embeddings: 8192,
            initializer_range: 0.02,
            initializer_cutoff_factor: Some(2.0),
            norm_eps: 1e-5,
            norm_bias: false,
            pad_token_id: Some(50283),
            eos_token_id: Some(50282.into()),
            bos_token_id: Some(50281),
            cls_token_id: Some(50281),
            sep_token_id: Some(50282),
            attention_bias: false,
            attention_dropout: 0.0,
            layer_types: None,
            rope_parameters: None,
            local_attention: 128,
            embedding_dropout: 0.0,
            mlp_bias: false,
            mlp_dropout: 0.0,
            decoder_bias: true,
            classifier_pooling: "cls".into(),
            classifier_dropout: 0.0,
            classifier_bias: false,
            classifier_activation: "gelu".into(),
            deterministic_flash_attn: false,
            sparse_prediction: false,
            sparse_pred_ignore_index: -100,
            tie_word_embeddings: true,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

impl PretrainedConfig for ModernBertConfig {
    fn model_type(&self) -> &'static str {
        "modernbert"
    }
    fn to_json_value(&self) -> Result<Value> {
        configuration_utils::to_value(self)
    }
    fn labels(&self) -> &LabelConfig {
        &self.labels
    }
}

impl ModernBertConfig {
    /// Reads and checks `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let c: Self = configuration_utils::read_config(path)?;
        c.validate()?;
        Ok(c)
    }

    fn head_dim(&self) -> i64 {
        self.hidden_size / self.num_attention_heads.max(1)
    }

    /// Whether each layer attends through the local window (upstream's `__post_init__`).
    fn sliding_layers(&self) -> Result<Vec<bool>> {
        let every = match self.extra.get("global_attn_every_n_layers") {
            None | Some(Value::Null) => 3,
            Some(v) => v.as_i64().filter(|n| *n > 0).ok_or(Error::InvalidConfig {
                field: "global_attn_every_n_layers",
                value: v.to_string(),
                fix: "give a positive number of layers",
            })?,
        };
        let types: Vec<String> = match &self.layer_types {
            Some(t) => t.clone(),
            None => (0..self.num_hidden_layers)
                .map(|i| match i % every {
                    0 => "full_attention".into(),
                    _ => "sliding_attention".into(),
                })
                .collect(),
        };
        if types.len() as i64 != self.num_hidden_layers {
            return Err(Error::InvalidConfig {
                field: "layer_types",
                value: format!("{} entries", types.len()),
                fix: "give one entry per layer (num_hidden_layers)",
            });
        }
        types
            .iter()
            .map(|t| match t.as_str() {
                "full_attention" => Ok(false),
                "sliding_attention" => Ok(true),
                other => Err(Error::InvalidConfig {
                    field: "layer_types",
                    value: other.to_string(),
                    fix: "use full_attention or sliding_attention",
                }),
            })
            .collect()
    }

    /// Upstream's `convert_rope_params_to_dict`: the RoPE of a layer type, `rope_scaling`
    /// merged into both, the bases `global_rope_theta` (160 000) and `local_rope_theta`
    /// (10 000) by default.
    fn rope(&self, layer_type: &str) -> Result<RopeParameters> {
        let mut p = match self
            .rope_parameters
            .as_ref()
            .and_then(|r| r.get(layer_type))
        {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(other) => {
                return Err(Error::InvalidConfig {
                    field: "rope_parameters",
                    value: format!("{layer_type}: {other}"),
                    fix: "give one dict per layer type (full_attention, sliding_attention)",
                });
            }
        };
        if let Some(Value::Object(scaling)) = self.extra.get("rope_scaling") {
            p.extend(scaling.clone());
        }
        let (key, default) = match layer_type {
            "full_attention" => ("global_rope_theta", 160_000.0),
            _ => ("local_rope_theta", 10_000.0),
        };
        let theta = self.extra.get(key).and_then(Value::as_f64);
        let p = rope::standardize(Some(&p), None, theta, default);
        RopeParameters::from_dict(&p, self.head_dim(), self.max_position_embeddings, None)
    }

    fn validate(&self) -> Result<()> {
        configuration_utils::check_sizes(
            &[
                ("vocab_size", self.vocab_size),
                ("hidden_size", self.hidden_size),
                ("intermediate_size", self.intermediate_size),
                ("max_position_embeddings", self.max_position_embeddings),
            ],
            ("num_hidden_layers", self.num_hidden_layers),
        )?;
        if self.num_attention_heads <= 0 || self.hidden_size % self.num_attention_heads != 0 {
            return Err(Error::InvalidConfig {
                field: "num_attention_heads",
                value: format!(
                    "{} (hidden_size {})",
                    self.num_attention_heads, self.hidden_size
                ),
                fix: "hidden_size must be divisible by num_attention_heads",
            });
        }
        configuration_utils::check_padding_idx(self.pad_token_id, self.vocab_size)?;
        if !matches!(self.classifier_pooling.as_str(), "cls" | "mean") {
            return Err(Error::InvalidConfig {
                field: "classifier_pooling",
                value: self.classifier_pooling.clone(),
                fix: "use cls or mean",
            });
        }
        if self.deterministic_flash_attn {
            return Err(Error::InvalidConfig {
                field: "deterministic_flash_attn",
                value: "true".into(),
                fix: "it only affects flash-attention kernels, which are not used here (SDPA); set it to false",
            });
        }
        if self.local_attention < 0 {
            return Err(Error::InvalidConfig {
                field: "local_attention",
                value: self.local_attention.to_string(),
                fix: "give the window's total width (a non-negative number of tokens)",
            });
        }
        self.sliding_layers()?;
        self.rope("full_attention")?;
        self.rope("sliding_attention")?;
        Activation::parse(&self.hidden_activation, "hidden_activation")?;
        Activation::parse(&self.classifier_activation, "classifier_activation")?;
        Ok(())
    }

    fn cutoff(&self) -> f64 {
        self.initializer_cutoff_factor.unwrap_or(3.0)
    }

    /// ModernBERT's truncated normal of standard deviation `std`.
    fn trunc(&self, std: f64) -> TruncNormal {
        let c = self.cutoff();
        TruncNormal {
            mean: 0.0,
            std,
            a: -c * std,
            b: c * std,
        }
    }

    /// The output projections' standard deviation.
    fn std_out(&self) -> f64 {
        self.initializer_range / (2.0 * self.num_hidden_layers as f64).sqrt()
    }
}

/// `nn.LayerNorm(dim, eps, bias=norm_bias)`.
#[derive(Debug)]
struct Norm {
    weight: Tensor,
    bias: Option<Tensor>,
    eps: f64,
    name: String,
    ctx: Context,
}

impl Norm {
    fn new(p: tchtrain_nn::Path<'_>, dim: i64, config: &ModernBertConfig) -> Self {
        Self {
            weight: tchtrain_nn::initialization::var(&p, "weight", &[dim], Init::Const(1.0)),
            bias: config
                .norm_bias
                .then(|| tchtrain_nn::initialization::var(&p, "bias", &[dim], Init::Const(0.0))),
            eps: config.norm_eps,
            name: p.name(),
            ctx: p.ctx().clone(),
        }
    }

    /// `nn.LayerNorm(dim, eps, bias=norm_bias)`, reported to the tracer.
    fn forward(&self, x: &Tensor) -> Tensor {
        let dim = x.size().last().copied().unwrap_or(0);
        let y = x.layer_norm(
            [dim],
            Some(&self.weight),
            self.bias.as_ref(),
            self.eps,
            false,
        );
        if self.ctx.traced() {
            let mut params = vec![("weight", &self.weight)];
            params.extend(self.bias.as_ref().map(|b| ("bias", b)));
            self.ctx
                .leaf(|| self.name.clone(), "LayerNorm", &params, x, &y);
        }
        y
    }
}

/// `nn.Linear` drawn as ModernBERT's `_init_weights` draws it: the generic normal, then the
/// truncated normal of `std`; a zero bias.
fn linear(
    p: tchtrain_nn::Path<'_>,
    in_dim: i64,
    out_dim: i64,
    bias: bool,
    std: f64,
    config: &ModernBertConfig,
) -> Result<Linear> {
    let ws = initialization::var_trunc_normal(
        &p,
        "weight",
        &[out_dim, in_dim],
        tchtrain_nn::initialization::normal(config.initializer_range),
        None,
        config.trunc(std),
    )?;
    let bs =
        bias.then(|| tchtrain_nn::initialization::var(&p, "bias", &[out_dim], Init::Const(0.0)));
    Ok(Linear::from_parts(&p, ws, bs))
}

#[derive(Debug)]
struct Layer {
    ctx: Context,
    /// `None` for layer 0 (upstream's `nn.Identity`).
    attn_norm: Option<Norm>,
    wqkv: Linear,
    attn_wo: Linear,
    mlp_norm: Norm,
    wi: Linear,
    mlp_wo: Linear,
    sliding: bool,
    /// `model.layers.{i}`, as the underflow / overflow tracer names it.
    name: String,
}

// SAFETY: parameter tensors and plain values that the forward only reads.
#[allow(unsafe_code)]
unsafe impl ReadOnlyLayer for Layer {}

/// What a layer's forward needs besides the hidden states (owned, so that a checkpointed
/// layer can run again in the backward).
struct LayerInputs {
    /// cos / sin `[1 or batch, 1, seq, head_dim]` of the full and the sliding layers.
    full_rope: (Tensor, Tensor),
    sliding_rope: (Tensor, Tensor),
    full_mask: attention::Mask,
    sliding_mask: attention::Mask,
    batch: i64,
    seq: i64,
    heads: i64,
    head_dim: i64,
    attention_dropout: f64,
    mlp_dropout: f64,
    train: bool,
    act: Activation,
    /// The padding-free layout, when the layers run on the real tokens only.
    unpadded: Option<Unpadded>,
}

// SAFETY: parameter tensors and plain values that the forward only reads.
#[allow(unsafe_code)]
unsafe impl ReadOnlyLayer for LayerInputs {}

fn rotate_half(x: &Tensor) -> Tensor {
    let half = x.size().last().copied().unwrap_or(0) / 2;
    Tensor::cat(&[x.narrow(-1, half, half).neg(), x.narrow(-1, 0, half)], -1)
}

impl Layer {
    /// Upstream `ModernBertEncoderLayer.forward`: `h + attn(attn_norm(h))`, then
    /// `h + mlp(mlp_norm(h))`.
    fn forward(&self, h: &Tensor, x: &LayerInputs) -> Tensor {
        let LayerInputs {
            batch,
            seq,
            heads,
            head_dim: hd,
            ..
        } = *x;
        let n = |rest: &str| format!("{}.{rest}", self.name);
        let normed = match &self.attn_norm {
            Some(norm) => norm.forward(h),
            None => h.shallow_clone(),
        };
        let unpadded = x.unpadded.as_ref();
        let qkv = self.wqkv.forward(&normed);
        let qkv = padding_free::padded(unpadded, qkv).view([batch, seq, 3, heads, hd]);
        let part = |i: i64| qkv.select(2, i).transpose(1, 2);
        let (q, k, v) = (part(0), part(1), part(2));
        let ((cos, sin), mask) = if self.sliding {
            (&x.sliding_rope, &x.sliding_mask)
        } else {
            (&x.full_rope, &x.full_mask)
        };
        // Upstream rotates in float32 and casts back, casting the input once per term: under
        // autocast the two terms' gradients come back to bfloat16 separately and add there.
        let rotate = |t: &Tensor| {
            let f = || t.to_kind(Kind::Float);
            (f() * cos + rotate_half(&f()) * sin).to_kind(t.kind())
        };
        let (q, k) = (rotate(&q), rotate(&k));
        let p = if x.train { x.attention_dropout } else { 0.0 };
        let a = attention::sdpa(&q, &k, &v, mask, p, (hd as f64).powf(-0.5));
        let a = a
            .transpose(1, 2)
            .contiguous()
            .reshape([batch, seq, heads * hd]);
        let a = padding_free::unpadded(unpadded, a);
        let a = self.attn_wo.forward(&a);
        let a = match unpadded {
            Some(u) => u.dropout(&a, x.attention_dropout, x.train),
            None if x.train && x.attention_dropout > 0.0 => {
                tchtrain_nn::dropout(&a, x.attention_dropout, true)
            }
            None => a,
        };
        let h2 = h + a;
        let normed = self.mlp_norm.forward(&h2);
        let wi = self.wi.forward(&normed);
        let half = wi.size().last().copied().unwrap_or(0) / 2;
        let (input, gate) = (wi.narrow(-1, 0, half), wi.narrow(-1, half, half));
        let m = x.act.apply_traced(&self.ctx, &input, || n("mlp.act")) * gate;
        let m =
            padding_free::dropout_traced(&self.ctx, unpadded, &m, x.mlp_dropout, x.train, || {
                n("mlp.drop")
            });
        let m = self.mlp_wo.forward(&m);
        let out = h2 + m;
        self.ctx
            .leaf(|| self.name.clone(), "ModernBertEncoderLayer", &[], h, &out);
        out
    }
}

/// Upstream `ModernBertModel`: embeddings, encoder layers, `final_norm`.
#[derive(Debug)]
pub struct ModernBertModel {
    ctx: Context,
    /// Where it sits in its model (`model`; empty for `ModernBertModel` itself).
    prefix: String,
    tok_embeddings: Embedding,
    embeddings_norm: Norm,
    layers: Vec<Arc<Shared<Layer>>>,
    final_norm: Norm,
    full_rotary: RotaryEmbedding,
    sliding_rotary: RotaryEmbedding,
    act: Activation,
    config: ModernBertConfig,
    /// Upstream's `gradient_checkpointing` on the layers.
    pub(crate) checkpointing: Option<ActivationCheckpointing>,
}

impl ModernBertModel {
    /// Creates the variables under `p` (upstream prefix `model`, or the root).
    pub fn new(p: tchtrain_nn::Path<'_>, config: &ModernBertConfig) -> Result<Self> {
        config.validate()?;
        let (d, r) = (config.hidden_size, config.initializer_range);
        let std_out = config.std_out();
        let e = &p / "embeddings";
        // The generic init zeroes the padding row, ModernBERT's truncated draw then
        // overwrites it (upstream's pad row is not zero).
        let tok = &e / "tok_embeddings";
        let weight = initialization::var_trunc_normal(
            &tok,
            "weight",
            &[config.vocab_size, d],
            tchtrain_nn::initialization::normal(r),
            config.pad_token_id,
            config.trunc(r),
        )?;
        let padding_idx = config
            .pad_token_id
            .map(|i| if i < 0 { i + config.vocab_size } else { i });
        let tok_embeddings = Embedding::from_parts(&tok, weight, padding_idx);
        let embeddings_norm = Norm::new(&e / "norm", d, config);
        let sliding = config.sliding_layers()?;
        let layers = (0..config.num_hidden_layers)
            .map(|i| -> Result<_> {
                let l = &p / "layers" / i;
                let (a, m) = (&l / "attn", &l / "mlp");
                let attn_norm = (i > 0).then(|| Norm::new(&l / "attn_norm", d, config));
                let ab = config.attention_bias;
                let wqkv = linear(&a / "Wqkv", d, 3 * d, ab, r, config)?;
                let attn_wo = linear(&a / "Wo", d, d, ab, std_out, config)?;
                let mlp_norm = Norm::new(&l / "mlp_norm", d, config);
                let inter = config.intermediate_size;
                let mb = config.mlp_bias;
                let wi = linear(&m / "Wi", d, 2 * inter, mb, r, config)?;
                let mlp_wo = linear(&m / "Wo", inter, d, mb, std_out, config)?;
                Ok(Arc::new(Shared(Layer {
                    attn_norm,
                    wqkv: wqkv.layer_form(),
                    attn_wo: attn_wo.layer_form(),
                    mlp_norm,
                    wi: wi.layer_form(),
                    mlp_wo: mlp_wo.layer_form(),
                    sliding: sliding[i as usize],
                    name: l.name(),
                    ctx: l.ctx().clone(),
                })))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            prefix: p.name(),
            ctx: p.ctx().clone(),
            tok_embeddings,
            embeddings_norm,
            layers,
            final_norm: Norm::new(&p / "final_norm", d, config),
            full_rotary: RotaryEmbedding::new(config.rope("full_attention")?, p.device())?,
            sliding_rotary: RotaryEmbedding::new(config.rope("sliding_attention")?, p.device())?,
            act: Activation::parse(&config.hidden_activation, "hidden_activation")?,
            config: config.clone(),
            checkpointing: None,
        })
    }

    /// The token embedding matrix (tied to the masked LM's decoder).
    pub fn tok_embeddings(&self) -> &Tensor {
        &self.tok_embeddings.ws
    }

    /// The last hidden state `[batch, seq, hidden]`.
    pub fn forward(&self, inputs: &ModelInputs<'_>, train: bool) -> Result<Tensor> {
        self.forward_with(inputs, train, false)
    }

    /// [`forward`](Self::forward), the layers and `final_norm` run padding-free when
    /// `padding_free` and the attention mask pads a token (see `crate::padding_free`): the
    /// padding positions of the last hidden state are then zeros, the real tokens' values
    /// those of the padded run up to the last bits.
    pub(crate) fn forward_with(
        &self,
        inputs: &ModelInputs<'_>,
        train: bool,
        padding_free: bool,
    ) -> Result<Tensor> {
        let c = &self.config;
        let ids = inputs.ids()?;
        let (batch, seq) = crate::check_ids(ids, c.vocab_size, c.max_position_embeddings)?;
        let device = self.tok_embeddings.ws.device();
        let ids = ids.f_to_device(device)?;
        let positions = match inputs.position_ids {
            Some(p) => p.f_to_device(device)?,
            None => Tensor::arange(seq, (Kind::Int64, device)).unsqueeze(0),
        };
        use tchtrain_nn::join;
        let n = |rest: &str| join(&self.prefix, rest);
        let h = self.tok_embeddings.lookup(&ids);
        let h = self.tok_embeddings.input_forward(&ids, h, None, train)?;
        let h = self.embeddings_norm.forward(&h);
        let mut h = tchtrain_nn::dropout_traced(&self.ctx, &h, c.embedding_dropout, train, || {
            n("embeddings.drop")
        });
        let kind = h.kind();
        let unpadded = Unpadded::for_forward(
            &self.ctx,
            padding_free,
            false,
            inputs.attention_mask,
            device,
        )?;
        if let Some(u) = &unpadded {
            h = u.gather(&h);
        }
        let cos_sin = |r: &RotaryEmbedding| -> Result<(Tensor, Tensor)> {
            let (cos, sin) = r.cos_sin(&positions, kind)?;
            Ok((cos.unsqueeze(1), sin.unsqueeze(1)))
        };
        let x = Arc::new(Shared(LayerInputs {
            full_rope: cos_sin(&self.full_rotary)?,
            sliding_rope: cos_sin(&self.sliding_rotary)?,
            full_mask: attention::attention_mask(inputs.attention_mask, batch, seq, false, device),
            sliding_mask: attention::local_window_mask(
                inputs.attention_mask,
                batch,
                seq,
                c.local_attention / 2,
                device,
            ),
            batch,
            seq,
            heads: c.num_attention_heads,
            head_dim: c.head_dim(),
            attention_dropout: c.attention_dropout,
            mlp_dropout: c.mlp_dropout,
            train,
            act: self.act,
            unpadded,
        }));
        let h = run_layers(
            &self.ctx,
            &self.layers,
            &x,
            None,
            self.checkpointing.as_ref(),
            train,
            h,
            |l, h, _, x| Ok(l.forward(h, x)),
        )?;
        let h = self.final_norm.forward(&h);
        Ok(padding_free::padded(x.unpadded.as_ref(), h))
    }
}

/// Upstream `ModernBertPredictionHead`: `norm(act(dense(x)))`.
#[derive(Debug)]
pub struct PredictionHead {
    ctx: Context,
    dense: Linear,
    norm: Norm,
    act: Activation,
}

impl PredictionHead {
    fn new(p: tchtrain_nn::Path<'_>, config: &ModernBertConfig) -> Result<Self> {
        let d = config.hidden_size;
        Ok(Self {
            ctx: p.ctx().clone(),
            dense: linear(
                &p / "dense",
                d,
                d,
                config.classifier_bias,
                config.std_out(),
                config,
            )?,
            norm: Norm::new(&p / "norm", d, config),
            act: Activation::parse(&config.classifier_activation, "classifier_activation")?,
        })
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let t = self.dense.forward(x);
        let t = self.act.apply_traced(&self.ctx, &t, || "head.act".into());
        self.norm.forward(&t)
    }
}

/// Which head sits on the body.
#[derive(Debug)]
pub enum Head {
    /// The base model's: none.
    None,
    /// `head` then the decoder tied to `tok_embeddings`, with `decoder.bias`.
    MaskedLm {
        head: PredictionHead,
        bias: Option<Tensor>,
    },
    /// `head` on the pooled states, dropout, `classifier`.
    SequenceClassification {
        head: PredictionHead,
        classifier: Linear,
    },
    /// `head` on every token, dropout, `classifier`.
    TokenClassification {
        head: PredictionHead,
        classifier: Linear,
    },
    /// `head` on every token, dropout, `classifier` (two outputs): the start and end
    /// logits.
    QuestionAnswering {
        head: PredictionHead,
        classifier: Linear,
    },
}

/// A ModernBERT model with one of upstream's heads; use the type aliases.
pub type ModernBert<K> = EncoderFor<ModernBertConfig, K>;

/// Upstream `ModernBertModel` as a standalone model (weights at the root).
pub type ModernBertBaseModel = ModernBert<heads::Base>;
/// Upstream `ModernBertForMaskedLM`.
pub type ModernBertForMaskedLM = ModernBert<heads::MaskedLm>;
/// Upstream `ModernBertForSequenceClassification`.
pub type ModernBertForSequenceClassification = ModernBert<heads::SequenceClassification>;
/// Upstream `ModernBertForTokenClassification`.
pub type ModernBertForTokenClassification = ModernBert<heads::TokenClassification>;
/// Upstream `ModernBertForQuestionAnswering`.
pub type ModernBertForQuestionAnswering = ModernBert<heads::QuestionAnswering>;

impl EncoderArchitecture for ModernBertConfig {
    type Body = ModernBertModel;
    type Head = Head;

    fn config_from_file(path: &Path) -> Result<Self> {
        Self::from_file(path)
    }
    fn labels_mut(&mut self) -> &mut LabelConfig {
        &mut self.labels
    }
    fn extra_mut(&mut self) -> &mut Map<String, Value> {
        &mut self.extra
    }
    fn tie_word_embeddings(&self) -> bool {
        self.tie_word_embeddings
    }
    fn base_model_prefix(&self) -> &'static str {
        "model"
    }
    fn classes(&self) -> [&'static str; 5] {
        [
            "ModernBertModel",
            "ModernBertForMaskedLM",
            "ModernBertForSequenceClassification",
            "ModernBertForTokenClassification",
            "ModernBertForQuestionAnswering",
        ]
    }
    /// The sequence classifier pools the first token or, with `classifier_pooling:
    /// "mean"`, the real tokens' mean.
    fn encoder_head(&self, kind: HeadKind) -> EncoderHead {
        match kind {
            HeadKind::SequenceClassification if self.classifier_pooling == "mean" => {
                EncoderHead::MaskedMean
            }
            kind => EncoderHead::of(kind),
        }
    }
    fn build(
        &self,
        kind: HeadKind,
        root: &tchtrain_nn::Path<'_>,
        body: tchtrain_nn::Path<'_>,
    ) -> Result<(ModernBertModel, Head)> {
        let config = self;
        let model = ModernBertModel::new(body, config)?;
        let (d, n) = (config.hidden_size, config.labels.num_labels());
        // Every classifier has a bias; its weight's deviation is `hidden_size ** -0.5`.
        let classifier = |root: &tchtrain_nn::Path<'_>| {
            linear(
                root / "classifier",
                d,
                n,
                true,
                (d as f64).powf(-0.5),
                config,
            )
        };
        let head = match kind {
            HeadKind::MaskedLm => {
                let head = PredictionHead::new(root / "head", config)?;
                let bias = config.decoder_bias.then(|| {
                    tchtrain_nn::initialization::var(
                        &(root / "decoder"),
                        "bias",
                        &[config.vocab_size],
                        Init::Const(0.0),
                    )
                });
                Head::MaskedLm { head, bias }
            }
            HeadKind::SequenceClassification => Head::SequenceClassification {
                head: PredictionHead::new(root / "head", config)?,
                classifier: classifier(root)?,
            },
            HeadKind::TokenClassification => Head::TokenClassification {
                head: PredictionHead::new(root / "head", config)?,
                classifier: classifier(root)?,
            },
            HeadKind::QuestionAnswering => {
                crate::modeling_utils::check_question_answering_labels(n)?;
                Head::QuestionAnswering {
                    head: PredictionHead::new(root / "head", config)?,
                    classifier: classifier(root)?,
                }
            }
            HeadKind::Base => Head::None,
        };
        Ok((model, head))
    }
    fn checkpointing(body: &mut ModernBertModel) -> &mut Option<ActivationCheckpointing> {
        &mut body.checkpointing
    }
    fn is_checkpointing(body: &ModernBertModel) -> bool {
        body.checkpointing.is_some()
    }
    fn loss_type(kind: HeadKind) -> Option<&'static str> {
        (kind == HeadKind::MaskedLm).then_some("ForMaskedLM")
    }
    fn is_embedding_weight(&self, name: &str) -> bool {
        name == "embeddings.tok_embeddings.weight"
    }
    /// What `print(model)` shows: `ModernBertModel` (the first layer's `attn_norm` an
    /// `Identity`, `out_drop` an `Identity` without attention dropout) and the head
    /// (`ModernBertPredictionHead`, then the decoder or the dropout and the classifier).
    fn module_repr(&self, kind: HeadKind, body: &ModernBertModel) -> Option<ModuleRepr> {
        let (d, inner) = (self.hidden_size, self.intermediate_size);
        let norm = || ModuleRepr::layer_norm(d, self.norm_eps, true, self.norm_bias);
        let dropout_or_identity = |p: f64| match p > 0.0 {
            true => ModuleRepr::dropout(p),
            false => ModuleRepr::new("Identity"),
        };
        let layer = |i: usize| {
            ModuleRepr::new("ModernBertEncoderLayer")
                .child(
                    "attn_norm",
                    match i {
                        0 => ModuleRepr::new("Identity"),
                        _ => norm(),
                    },
                )
                .child(
                    "attn",
                    ModuleRepr::new("ModernBertAttention")
                        .child("Wqkv", ModuleRepr::linear(d, 3 * d, self.attention_bias))
                        .child("Wo", ModuleRepr::linear(d, d, self.attention_bias))
                        .child("out_drop", dropout_or_identity(self.attention_dropout)),
                )
                .child("mlp_norm", norm())
                .child(
                    "mlp",
                    ModuleRepr::new("ModernBertMLP")
                        .child("Wi", ModuleRepr::linear(d, 2 * inner, self.mlp_bias))
                        .child("act", ModuleRepr::new(body.act.class_name()))
                        .child("drop", ModuleRepr::dropout(self.mlp_dropout))
                        .child("Wo", ModuleRepr::linear(inner, d, self.mlp_bias)),
                )
        };
        let model = ModuleRepr::new("ModernBertModel")
            .child(
                "embeddings",
                ModuleRepr::new("ModernBertEmbeddings")
                    .child(
                        "tok_embeddings",
                        ModuleRepr::embedding(self.vocab_size, d, self.pad_token_id),
                    )
                    .child("norm", norm())
                    .child("drop", ModuleRepr::dropout(self.embedding_dropout)),
            )
            .child(
                "layers",
                ModuleRepr::module_list((0..body.layers.len()).map(layer).collect()),
            )
            .child("final_norm", norm())
            .child("rotary_emb", ModuleRepr::new("ModernBertRotaryEmbedding"));
        if kind == HeadKind::Base {
            return Some(model);
        }
        let head_act =
            Activation::parse(&self.classifier_activation, "classifier_activation").ok()?;
        let root = ModuleRepr::new(kind.class(&self.classes()))
            .child("model", model)
            .child(
                "head",
                ModuleRepr::new("ModernBertPredictionHead")
                    .child("dense", ModuleRepr::linear(d, d, self.classifier_bias))
                    .child("act", ModuleRepr::new(head_act.class_name()))
                    .child("norm", norm()),
            );
        Some(match kind {
            HeadKind::MaskedLm => root.child(
                "decoder",
                ModuleRepr::linear(d, self.vocab_size, self.decoder_bias),
            ),
            _ => root
                .child("drop", ModuleRepr::dropout(self.classifier_dropout))
                .child(
                    "classifier",
                    ModuleRepr::linear(d, self.labels.num_labels(), true),
                ),
        })
    }
    fn tied_weights(&self, kind: HeadKind) -> Vec<(String, String)> {
        match kind {
            HeadKind::MaskedLm => vec![(
                "decoder.weight".into(),
                "model.embeddings.tok_embeddings.weight".into(),
            )],
            _ => vec![],
        }
    }
    fn forward(
        &self,
        _kind: HeadKind,
        model: &ModernBertModel,
        head: &Head,
        ctx: &Context,
        inputs: &ModelInputs<'_>,
        train: bool,
        padding_free: bool,
    ) -> Result<ModelOutput> {
        let h = model.forward_with(inputs, train, padding_free)?;
        let c = self;
        let dropout = |x: &Tensor| {
            tchtrain_nn::dropout_traced(ctx, x, c.classifier_dropout, train, || "drop".into())
        };
        let (logits, loss) = match head {
            Head::None => (h.shallow_clone(), None),
            Head::MaskedLm { head, bias } => {
                // `sparse_prediction`: only the labelled tokens go through the head.
                let (x, labels) = match (c.sparse_prediction, inputs.labels) {
                    (true, Some(l)) => {
                        let l = l.f_to_device(h.device())?.reshape([-1]);
                        let keep = l.ne(c.sparse_pred_ignore_index);
                        let x = h.f_reshape([l.size()[0], -1])?.f_index(&[Some(&keep)])?;
                        (x, Some(l.index(&[Some(&keep)])))
                    }
                    (_, l) => (h.shallow_clone(), l.map(|l| l.shallow_clone())),
                };
                let t = head.forward(&x);
                let weight = model.tok_embeddings();
                let logits = match bias {
                    Some(b) => t.linear(weight, Some(b)),
                    None => t.linear(weight, None::<&Tensor>),
                };
                let loss = heads::masked_lm_loss(
                    &logits,
                    labels.as_ref(),
                    c.vocab_size,
                    inputs.num_items_in_batch,
                )?;
                (logits, loss)
            }
            Head::SequenceClassification { head, classifier } => {
                let pooled = match c.classifier_pooling.as_str() {
                    "mean" => {
                        let mask = match inputs.attention_mask {
                            Some(m) => m.f_to_device(h.device())?,
                            None => Tensor::ones(&h.size()[..2], (Kind::Bool, h.device())),
                        };
                        (&h * mask.unsqueeze(-1)).sum_dim_intlist(1, false, None)
                            / mask.sum_dim_intlist(1, true, None)
                    }
                    _ => h.select(1, 0),
                };
                let t = dropout(&head.forward(&pooled));
                let logits = classifier.forward(&t);
                let loss = heads::sequence_classification_loss(&logits, inputs, &c.labels)?;
                (logits, loss)
            }
            Head::TokenClassification { head, classifier } => {
                let t = dropout(&head.forward(&h));
                let logits = classifier.forward(&t);
                let loss =
                    heads::token_classification_loss(&logits, inputs, c.labels.num_labels())?;
                (logits, loss)
            }
            Head::QuestionAnswering { head, classifier } => {
                let t = dropout(&head.forward(&h));
                let logits = classifier.forward(&t);
                // `self.loss_function`: `num_items_in_batch` reaches the loss.
                let loss = crate::modeling_utils::question_answering_loss(
                    &logits,
                    inputs,
                    inputs.num_items_in_batch,
                )?;
                (logits, loss)
            }
        };
        Ok(ModelOutput {
            loss,
            logits: Some(logits),
            last_hidden_state: Some(h),
            pooler_output: None,
            aux_loss: None,
        })
    }
}

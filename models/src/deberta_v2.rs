//! DeBERTa-v2 / v3 (upstream `models/deberta_v2`, `model_type` `deberta-v2`):
//! `DebertaV2Config`, `DebertaV2Model`, `DebertaV2ForMaskedLM`,
//! `DebertaV2ForSequenceClassification`, `DebertaV2ForTokenClassification`.
//!
//! BERT's post-LayerNorm encoder with disentangled attention: the content scores
//! `q · (kᵀ / √(d · scale_factor))` plus, with `relative_attention`, content-to-position
//! (`c2p`) and position-to-content (`p2c`) scores gathered from the projections of shared
//! relative-position embeddings (`rel_embeddings`, LayerNorm-ed by `norm_rel_ebd`), the
//! relative positions log-bucketed past `position_buckets / 2` (`make_log_bucket_position`).
//! Eager attention as upstream's (DeBERTa has no SDPA path), the mask the outer product of
//! the padding mask, masked scores set to the float32 minimum before the softmax. The
//! embeddings are multiplied by the padding mask after their LayerNorm.
//!
//! Every op follows upstream's order (the division of `kᵀ` before the `bmm`, the scores
//! summed as upstream sums them), so the numbers are bit-identical on CPU.

// `h = h + x` on purpose: tch's `+=` works in place and would modify tensors autograd
// saved for backward.
#![allow(clippy::assign_op_pattern)]

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tch::nn;
use tch::{Device, Kind, Tensor};

use crate::checkpoint::{ActivationCheckpointing, ReadOnlyLayer, Shared, run_layers};
use crate::configuration_utils::{self, LabelConfig, PretrainedConfig};
use crate::encoder::{EncoderArchitecture, EncoderFor};
use crate::heads::{self, HeadKind};
use crate::modeling_utils::{LabelCheck, ModelInputs, ModelOutput};
use crate::padding_free::{self, Unpadded};
use crate::{Error, Result};
use tchtrain_nn::{Activation, Context, Embedding, LayerNorm, Linear, ModuleRepr};

/// Upstream `DebertaV2Config` with its defaults (DeBERTa-v2 xlarge), and the keys v3's
/// `config.json` adds that upstream reads with `getattr` (`position_buckets`,
/// `norm_rel_ebd`, `share_att_key`, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct DebertaV2Config {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub intermediate_size: i64,
    pub hidden_act: String,
    pub hidden_dropout_prob: f64,
    pub attention_probs_dropout_prob: f64,
    pub max_position_embeddings: i64,
    pub type_vocab_size: i64,
    pub initializer_range: f64,
    pub layer_norm_eps: f64,
    pub relative_attention: bool,
    pub max_relative_positions: i64,
    pub pad_token_id: Option<i64>,
    pub bos_token_id: Option<i64>,
    pub eos_token_id: Option<Value>,
    pub position_biased_input: bool,
    /// `["p2c", "c2p"]` or `"p2c|c2p"`.
    pub pos_att_type: Option<Value>,
    pub pooler_dropout: f64,
    pub pooler_hidden_act: String,
    /// The masked LM's head: `cls.predictions` (true, upstream's default) or
    /// `lm_predictions.lm_head`.
    pub legacy: bool,
    pub tie_word_embeddings: bool,
    /// `-1` (no buckets) unless the config says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position_buckets: Option<i64>,
    /// `"layer_norm"` normalises the relative embeddings; `"none"` by default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub norm_rel_ebd: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share_att_key: Option<bool>,
    /// The classifier's dropout (`hidden_dropout_prob` when absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cls_dropout: Option<f64>,
    /// Only `hidden_size` is implemented.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub embedding_size: Option<i64>,
    /// Only `hidden_size / num_attention_heads` is implemented.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attention_head_size: Option<i64>,
    /// Only 0 (no convolution layer) is implemented.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conv_kernel_size: Option<i64>,
    /// Only `hidden_size` is implemented.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pooler_hidden_size: Option<i64>,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

impl Default for DebertaV2Config {
    fn default() -> Self {
        Self {
            vocab_size: 128100,
            hidden_size: 1536,
            num_hidden_layers: 24,
            num_attention_heads: 24,
            intermediate_size: 6144,
            hidden_act: "gelu".into(),
            hidden_dropout_prob: 0.1,
            attention_probs_dropout_prob: 0.1,
            max_position_embeddings: 512,
            type_vocab_size: 0,
            initializer_range: 0.02,
            layer_norm_eps: 1e-7,
            relative_attention: false,
            max_relative_positions: -1,
            pad_token_id: Some(0),
            bos_token_id: None,
            eos_token_id: None,
            position_biased_input: true,
            pos_att_type: None,
            pooler_dropout: 0.0,
            pooler_hidden_act: "gelu".into(),
            legacy: true,
            tie_word_embeddings: true,
            position_buckets: None,
            norm_rel_ebd: None,
            share_att_key: None,
            cls_dropout: None,
            embedding_size: None,
            attention_head_size: None,
            conv_kernel_size: None,
            pooler_hidden_size: None,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

impl PretrainedConfig for DebertaV2Config {
    fn model_type(&self) -> &'static str {
        "deberta-v2"
    }
    fn to_json_value(&self) -> Result<Value> {
        configuration_utils::to_value(self)
    }
    fn labels(&self) -> &LabelConfig {
        &self.labels
    }
}

impl DebertaV2Config {
    /// Reads and checks `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let c: Self = configuration_utils::read_config(path)?;
        c.validate()?;
        Ok(c)
    }

    /// `pos_att_type` as a list (upstream splits a string on `|`).
    fn pos_att_type(&self) -> Result<Vec<String>> {
        let bad = |v: &Value| Error::InvalidConfig {
            field: "pos_att_type",
            value: v.to_string(),
            fix: "give a list of p2c / c2p, or a string such as \"p2c|c2p\"",
        };
        let types: Vec<String> = match &self.pos_att_type {
            None | Some(Value::Null) => vec![],
            Some(Value::String(s)) => s
                .to_lowercase()
                .split('|')
                .map(|x| x.trim().to_string())
                .collect(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| x.as_str().map(str::to_string).ok_or_else(|| bad(x)))
                .collect::<Result<_>>()?,
            Some(other) => return Err(bad(other)),
        };
        for t in &types {
            if !matches!(t.as_str(), "p2c" | "c2p") {
                return Err(bad(&Value::String(t.clone())));
            }
        }
        Ok(types)
    }

    fn head_dim(&self) -> i64 {
        self.hidden_size / self.num_attention_heads.max(1)
    }

    /// `max_relative_positions`, or `max_position_embeddings` when below 1.
    fn max_relative(&self) -> i64 {
        if self.max_relative_positions < 1 {
            self.max_position_embeddings
        } else {
            self.max_relative_positions
        }
    }

    fn buckets(&self) -> i64 {
        self.position_buckets.unwrap_or(-1)
    }

    /// Upstream's `pos_ebd_size` (the attention span `S`: `2·S` relative embeddings).
    fn att_span(&self) -> i64 {
        if self.buckets() > 0 {
            self.buckets()
        } else {
            self.max_relative()
        }
    }

    fn norm_rel(&self) -> bool {
        self.norm_rel_ebd
            .as_deref()
            .unwrap_or("none")
            .to_lowercase()
            .split('|')
            .any(|x| x.trim() == "layer_norm")
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
                fix: "hidden_size must be a multiple of num_attention_heads (upstream's check)",
            });
        }
        let refuse = |field: &'static str, value: String, fix: &'static str| {
            Err(Error::InvalidConfig { field, value, fix })
        };
        if self.embedding_size.is_some_and(|e| e != self.hidden_size) {
            return refuse(
                "embedding_size",
                format!("{:?}", self.embedding_size),
                "only embeddings of hidden_size are implemented (no embed_proj)",
            );
        }
        if self
            .attention_head_size
            .is_some_and(|a| a != self.head_dim())
        {
            return refuse(
                "attention_head_size",
                format!("{:?}", self.attention_head_size),
                "only hidden_size / num_attention_heads is implemented",
            );
        }
        if self.conv_kernel_size.is_some_and(|k| k > 0) {
            return refuse(
                "conv_kernel_size",
                format!("{:?}", self.conv_kernel_size),
                "DeBERTa-v2's convolution layer is not implemented here (v3 has none); use 0",
            );
        }
        if self
            .pooler_hidden_size
            .is_some_and(|p| p != self.hidden_size)
        {
            return refuse(
                "pooler_hidden_size",
                format!("{:?}", self.pooler_hidden_size),
                "only a pooler of hidden_size is implemented",
            );
        }
        configuration_utils::check_padding_idx(self.pad_token_id, self.vocab_size)?;
        if self.relative_attention && self.att_span() <= 0 {
            return refuse(
                "position_buckets",
                self.att_span().to_string(),
                "the relative span must be positive",
            );
        }
        self.pos_att_type()?;
        Activation::parse(&self.hidden_act, "hidden_act")?;
        Activation::parse(&self.pooler_hidden_act, "pooler_hidden_act")?;
        Ok(())
    }
}

/// Upstream `make_log_bucket_position` / `build_relative_position`: the relative position
/// `q - k` of `seq` tokens, log-bucketed past `buckets / 2` when `buckets` and
/// `max_position` are positive (float32 math, truncated to integers), `[1, seq, seq]`.
fn relative_positions(seq: i64, buckets: i64, max_position: i64, device: Device) -> Tensor {
    let ids = Tensor::arange(seq, (Kind::Int64, device));
    let rel = ids.unsqueeze(1) - ids.unsqueeze(0);
    let rel = if buckets > 0 && max_position > 0 {
        let mid = buckets / 2;
        let sign = rel.sign();
        let inside = rel.lt(mid).logical_and(&rel.gt(-mid));
        let abs_pos = Tensor::scalar_tensor((mid - 1) as f64, (Kind::Int64, device))
            .where_self(&inside, &rel.abs());
        // (abs_pos / mid): integer true division, float32
        let log_pos = ((abs_pos.true_divide_scalar(mid).log()
            / Tensor::scalar_tensor(
                ((max_position - 1) as f64) / mid as f64,
                (Kind::Float, device),
            )
            .log())
            * (mid - 1) as f64)
            .ceil()
            + mid as f64;
        let bucket = rel
            .to_kind(Kind::Float)
            .where_self(&abs_pos.le(mid), &(log_pos * sign));
        bucket.to_kind(Kind::Int64)
    } else {
        rel
    };
    rel.unsqueeze(0)
}

#[derive(Debug)]
struct Layer {
    ctx: Context,
    query_proj: Linear,
    key_proj: Linear,
    value_proj: Linear,
    /// Without `share_att_key`: the relative embeddings' own projections.
    pos_key_proj: Option<Linear>,
    pos_query_proj: Option<Linear>,
    attn_out: Linear,
    attn_ln: LayerNorm,
    intermediate: Linear,
    output: Linear,
    output_ln: LayerNorm,
    /// `deberta.encoder.layer.{i}`, as the underflow / overflow tracer names it.
    name: String,
}

// SAFETY: parameter tensors and plain values that the forward only reads.
#[allow(unsafe_code)]
unsafe impl ReadOnlyLayer for Layer {}

/// What a layer's forward needs besides the hidden states.
struct LayerInputs {
    /// `[batch, 1, seq, seq]`: true where the query and the key are both tokens.
    mask: Tensor,
    /// The relative positions `[1, seq, seq]` (the normalised relative embeddings are the
    /// layer's second input: a checkpoint hands their gradient back).
    rel_pos: Option<Tensor>,
    c2p: bool,
    p2c: bool,
    span: i64,
    batch: i64,
    seq: i64,
    heads: i64,
    head_dim: i64,
    hidden_size: i64,
    attn_p: f64,
    hidden_p: f64,
    train: bool,
    act: Activation,
    /// The padding-free layout, when the layers run on the real tokens only.
    unpadded: Option<Unpadded>,
}

// SAFETY: parameter tensors and plain values that the forward only reads.
#[allow(unsafe_code)]
unsafe impl ReadOnlyLayer for LayerInputs {}

impl Layer {
    /// Upstream `DebertaV2Layer.forward`: disentangled self-attention, then the
    /// feed-forward block, each followed by dropout, the residual and a LayerNorm.
    fn forward(&self, h: &Tensor, rel_embeddings: Option<&Tensor>, x: &LayerInputs) -> Tensor {
        use tchtrain_nn::dropout_traced;
        let LayerInputs {
            batch,
            seq,
            heads,
            head_dim: d,
            ..
        } = *x;
        let n = |rest: &str| format!("{}.{rest}", self.name);
        let unpadded = x.unpadded.as_ref();
        let padded = |t: Tensor| padding_free::padded(unpadded, t);
        // `transpose_for_scores`: [b, l, H] -> [b·heads, l, d]
        let for_scores = |t: Tensor| {
            let l = t.size()[1];
            t.view([t.size()[0], l, heads, -1])
                .permute([0, 2, 1, 3])
                .contiguous()
                .view([-1, l, d])
        };
        let q = for_scores(padded(self.query_proj.forward(h)));
        let k = for_scores(padded(self.key_proj.forward(h)));
        let v = for_scores(padded(self.value_proj.forward(h)));
        let scale_factor = 1 + i64::from(x.c2p) + i64::from(x.p2c);
        // `torch.sqrt(torch.tensor(d, dtype=float) * scale_factor)`
        let scale = (Tensor::scalar_tensor(d as f64, (Kind::Float, h.device())) * scale_factor)
            .sqrt()
            .to_kind(q.kind());
        let mut scores = q.bmm(&(k.transpose(-1, -2) / &scale));
        if let (Some(rel_embeddings), Some(rel_pos)) = (rel_embeddings, &x.rel_pos) {
            let span = x.span;
            let re = dropout_traced(&self.ctx, rel_embeddings, x.hidden_p, x.train, || {
                n("attention.self.pos_dropout")
            });
            let re = re.narrow(0, 0, 2 * span).unsqueeze(0);
            // Upstream calls the projection module on the relative embeddings (so LoRA
            // adapters and the tracer see this call too).
            let project = |proj: &Linear| {
                let y = proj.forward(&re);
                for_scores(y).repeat([batch, 1, 1])
            };
            let bh = batch * heads;
            let mut score: Option<Tensor> = None;
            if x.c2p {
                let pos_key = match &self.pos_key_proj {
                    Some(own) => project(own),
                    None => project(&self.key_proj),
                };
                let c2p = q.bmm(&pos_key.transpose(-1, -2));
                let index = (rel_pos + span)
                    .clamp(0, 2 * span - 1)
                    .expand([bh, seq, seq], false);
                let c2p = c2p.gather(-1, &index, false);
                score = Some(c2p / &scale);
            }
            if x.p2c {
                let pos_query = match &self.pos_query_proj {
                    Some(own) => project(own),
                    None => project(&self.query_proj),
                };
                let index = (-rel_pos + span)
                    .clamp(0, 2 * span - 1)
                    .expand([bh, seq, seq], false);
                let p2c = k
                    .bmm(&pos_query.transpose(-1, -2))
                    .gather(-1, &index, false)
                    .transpose(-1, -2);
                let p2c = p2c / &scale;
                score = Some(match score {
                    Some(s) => s + p2c,
                    None => p2c,
                });
            }
            if let Some(s) = score {
                scores = scores + s;
            }
        }
        // `torch.finfo(query.dtype).min`; the softmax without a dtype, as upstream's (autocast
        // computes it in float32).
        let lowest = crate::attention::finfo_min(q.kind());
        let scores = scores
            .view([-1, heads, seq, seq])
            .masked_fill(&x.mask.logical_not(), lowest);
        let probs = scores.softmax(-1, None::<Kind>);
        let probs = dropout_traced(&self.ctx, &probs, x.attn_p, x.train, || {
            n("attention.self.dropout")
        });
        let ctx = probs
            .view([-1, seq, seq])
            .bmm(&v)
            .view([-1, heads, seq, d])
            .permute([0, 2, 1, 3])
            .contiguous()
            .view([batch, seq, x.hidden_size]);
        let ctx = padding_free::unpadded(unpadded, ctx);
        let o = self.attn_out.forward(&ctx);
        let o = padding_free::dropout_traced(&self.ctx, unpadded, &o, x.hidden_p, x.train, || {
            n("attention.output.dropout")
        });
        let a = self.attn_ln.forward(&(o + h));
        let i = self.intermediate.forward(&a);
        let i = x
            .act
            .apply_traced(&self.ctx, &i, || n("intermediate.intermediate_act_fn"));
        let m = self.output.forward(&i);
        let m = padding_free::dropout_traced(&self.ctx, unpadded, &m, x.hidden_p, x.train, || {
            n("output.dropout")
        });
        let out = self.output_ln.forward(&(m + &a));
        self.ctx
            .leaf(|| self.name.clone(), "DebertaV2Layer", &[], h, &out);
        out
    }
}

/// Upstream `DebertaV2Model`: embeddings and the encoder.
#[derive(Debug)]
pub struct DebertaV2Model {
    ctx: Context,
    /// Where it sits in its model (`deberta`; empty for `DebertaV2Model` itself).
    prefix: String,
    word_embeddings: Embedding,
    position_embeddings: Option<Embedding>,
    token_type_embeddings: Option<Embedding>,
    embeddings_ln: LayerNorm,
    layers: Vec<Arc<Shared<Layer>>>,
    rel_embeddings: Option<Embedding>,
    rel_ln: Option<LayerNorm>,
    act: Activation,
    config: DebertaV2Config,
    /// Upstream's `gradient_checkpointing` on the layers.
    pub(crate) checkpointing: Option<ActivationCheckpointing>,
}

impl DebertaV2Model {
    /// Creates the variables under `p` (upstream prefix `deberta`, or the root).
    pub fn new(p: tchtrain_nn::Path<'_>, config: &DebertaV2Config) -> Result<Self> {
        config.validate()?;
        let (d, std, eps) = (
            config.hidden_size,
            config.initializer_range,
            config.layer_norm_eps,
        );
        let e = &p / "embeddings";
        let word_embeddings = Embedding::with_padding(
            &e / "word_embeddings",
            config.vocab_size,
            d,
            std,
            config.pad_token_id,
        );
        let position_embeddings = config.position_biased_input.then(|| {
            Embedding::new(
                &e / "position_embeddings",
                config.max_position_embeddings,
                d,
                std,
            )
        });
        let token_type_embeddings = (config.type_vocab_size > 0)
            .then(|| Embedding::new(&e / "token_type_embeddings", config.type_vocab_size, d, std));
        let embeddings_ln = LayerNorm::new(&e / "LayerNorm", d, eps);
        let types = config.pos_att_type()?;
        let own_pos = config.relative_attention && !config.share_att_key.unwrap_or(false);
        let layers = (0..config.num_hidden_layers)
            .map(|i| {
                let l = &p / "encoder" / "layer" / i;
                let a = &l / "attention";
                let s = &a / "self";
                let linear =
                    |p: tchtrain_nn::Path<'_>, i: i64, o: i64| Linear::in_layer(p, i, o, true, std);
                let query_proj = linear(&s / "query_proj", d, d);
                let key_proj = linear(&s / "key_proj", d, d);
                let value_proj = linear(&s / "value_proj", d, d);
                let pos_key_proj = (own_pos && types.iter().any(|t| t == "c2p"))
                    .then(|| linear(&s / "pos_key_proj", d, d));
                let pos_query_proj = (own_pos && types.iter().any(|t| t == "p2c"))
                    .then(|| linear(&s / "pos_query_proj", d, d));
                Arc::new(Shared(Layer {
                    query_proj,
                    key_proj,
                    value_proj,
                    pos_key_proj,
                    pos_query_proj,
                    attn_out: linear(&a / "output" / "dense", d, d),
                    attn_ln: LayerNorm::new(&a / "output" / "LayerNorm", d, eps),
                    intermediate: linear(
                        &l / "intermediate" / "dense",
                        d,
                        config.intermediate_size,
                    ),
                    output: linear(&l / "output" / "dense", config.intermediate_size, d),
                    output_ln: LayerNorm::new(&l / "output" / "LayerNorm", d, eps),
                    name: l.name(),
                    ctx: l.ctx().clone(),
                }))
            })
            .collect();
        let rel_embeddings = config.relative_attention.then(|| {
            Embedding::new(
                &p / "encoder" / "rel_embeddings",
                2 * config.att_span(),
                d,
                std,
            )
        });
        let rel_ln = config
            .norm_rel()
            .then(|| LayerNorm::new(&p / "encoder" / "LayerNorm", d, eps));
        Ok(Self {
            prefix: p.name(),
            ctx: p.ctx().clone(),
            word_embeddings,
            position_embeddings,
            token_type_embeddings,
            embeddings_ln,
            layers,
            rel_embeddings,
            rel_ln,
            act: Activation::parse(&config.hidden_act, "hidden_act")?,
            config: config.clone(),
            checkpointing: None,
        })
    }

    /// The word embedding matrix (tied to the masked LM's decoder).
    pub fn word_embeddings(&self) -> &Tensor {
        &self.word_embeddings.ws
    }

    /// The last hidden state `[batch, seq, hidden]`.
    pub fn forward(&self, inputs: &ModelInputs<'_>, train: bool) -> Result<Tensor> {
        self.forward_with(inputs, train, false)
    }

    /// [`forward`](Self::forward), the layers run padding-free when `padding_free` and the
    /// attention mask pads a token (see `crate::padding_free`): the padding positions of the
    /// last hidden state are then zeros, the real tokens' values those of the padded run up
    /// to the last bits.
    pub(crate) fn forward_with(
        &self,
        inputs: &ModelInputs<'_>,
        train: bool,
        padding_free: bool,
    ) -> Result<Tensor> {
        use tchtrain_nn::join;
        let c = &self.config;
        let ids = inputs.ids()?;
        let max_len = if c.position_biased_input {
            c.max_position_embeddings
        } else {
            i64::MAX
        };
        let (batch, seq) = crate::check_ids(ids, c.vocab_size, max_len)?;
        let device = self.word_embeddings.ws.device();
        let ids = ids.f_to_device(device)?;
        let n = |rest: &str| join(&self.prefix, rest);
        let mut h = self.word_embeddings.input_forward(
            &ids,
            self.word_embeddings.lookup(&ids),
            None,
            train,
        )?;
        if let Some(pe) = &self.position_embeddings {
            let positions = match inputs.position_ids {
                Some(p) => p.f_to_device(device)?,
                None => Tensor::arange(seq, (Kind::Int64, device)).unsqueeze(0),
            };
            h = h + pe.forward(&positions);
        }
        if let Some(te) = &self.token_type_embeddings {
            let types = match inputs.token_type_ids {
                Some(t) => t.f_to_device(device)?,
                None => Tensor::zeros([batch, seq], (Kind::Int64, device)),
            };
            h = h + te.forward(&types);
        }
        let h = self.embeddings_ln.forward(&h);
        // Without a mask upstream uses float ones.
        let mask = match inputs.attention_mask {
            Some(m) => m.f_to_device(device)?,
            None => Tensor::ones([batch, seq], (Kind::Float, device)),
        };
        let kind = h.kind();
        let h = h * mask.unsqueeze(2).to_kind(kind);
        let mut h =
            tchtrain_nn::dropout_traced(&self.ctx, &h, c.hidden_dropout_prob, train, || {
                n("embeddings.dropout")
            });
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
        // `get_attention_mask`: the outer product of the padding mask, as booleans.
        let ext = mask.unsqueeze(1).unsqueeze(2);
        let mask = (&ext * ext.squeeze_dim(-2).unsqueeze(-1)).to_kind(Kind::Bool);
        // `get_rel_embedding()`, once per forward.
        let rel_embeddings = self.rel_embeddings.as_ref().map(|re| match &self.rel_ln {
            Some(ln) => ln.forward(&re.ws),
            None => re.ws.shallow_clone(),
        });
        let rel_pos = rel_embeddings
            .is_some()
            .then(|| relative_positions(seq, c.buckets(), c.max_relative(), device));
        let types = c.pos_att_type()?;
        let x = Arc::new(Shared(LayerInputs {
            mask,
            rel_pos,
            c2p: c.relative_attention && types.iter().any(|t| t == "c2p"),
            p2c: c.relative_attention && types.iter().any(|t| t == "p2c"),
            span: c.att_span(),
            batch,
            seq,
            heads: c.num_attention_heads,
            head_dim: c.head_dim(),
            hidden_size: c.hidden_size,
            attn_p: c.attention_probs_dropout_prob,
            hidden_p: c.hidden_dropout_prob,
            train,
            act: self.act,
            unpadded,
        }));
        let h = run_layers(
            &self.ctx,
            &self.layers,
            &x,
            rel_embeddings.as_ref(),
            self.checkpointing.as_ref(),
            train,
            h,
            |l, h, e, x| Ok(l.forward(h, e, x)),
        )?;
        Ok(padding_free::padded(x.unpadded.as_ref(), h))
    }
}

/// Which head sits on the body.
#[derive(Debug)]
pub enum Head {
    /// The base model's: none.
    None,
    /// `cls.predictions` (legacy) or `lm_predictions.lm_head`: dense, act, LayerNorm, the
    /// tied decoder with `bias`.
    MaskedLm {
        dense: Linear,
        ln: LayerNorm,
        bias: Tensor,
        legacy: bool,
    },
    /// `pooler` (dropout, dense, act on the first token), dropout, `classifier`.
    SequenceClassification { pooler: Linear, classifier: Linear },
    /// Dropout and `classifier` on every token.
    TokenClassification { classifier: Linear },
    /// `qa_outputs` on every token (no dropout): the start and end logits.
    QuestionAnswering { qa_outputs: Linear },
}

/// A DeBERTa-v2 model with one of upstream's heads; use the type aliases.
pub type DebertaV2<K> = EncoderFor<DebertaV2Config, K>;

/// Upstream `DebertaV2Model` as a standalone model (weights at the root).
pub type DebertaV2BaseModel = DebertaV2<heads::Base>;
/// Upstream `DebertaV2ForMaskedLM`.
pub type DebertaV2ForMaskedLM = DebertaV2<heads::MaskedLm>;
/// Upstream `DebertaV2ForSequenceClassification`.
pub type DebertaV2ForSequenceClassification = DebertaV2<heads::SequenceClassification>;
/// Upstream `DebertaV2ForTokenClassification`.
pub type DebertaV2ForTokenClassification = DebertaV2<heads::TokenClassification>;
/// Upstream `DebertaV2ForQuestionAnswering`.
pub type DebertaV2ForQuestionAnswering = DebertaV2<heads::QuestionAnswering>;

/// DeBERTa-v2's sequence-classification loss without a `problem_type`: one label → MSE on
/// the logits cast to the labels' dtype; class ids → cross-entropy over the rows whose
/// label is not negative (0 when none is); soft labels → `-(log_softmax · labels)` summed
/// over classes, averaged over rows. With a `problem_type`, the usual losses.
fn sequence_classification_loss(
    logits: &Tensor,
    labels: &Tensor,
    config: &DebertaV2Config,
) -> Result<Tensor> {
    let num_labels = config.labels.num_labels();
    let labels = labels.f_to_device(logits.device())?;
    if config.labels.problem_type.is_some() {
        return Ok(tchtrain_losses::for_sequence_classification_loss(
            &labels,
            logits,
            num_labels,
            config.labels.problem_type()?,
            None,
        )?);
    }
    if num_labels == 1 {
        let l = logits.reshape([-1]).to_kind(labels.kind());
        return Ok(l.mse_loss(&labels.reshape([-1]), tch::Reduction::Mean));
    }
    let dims = labels.size();
    if dims.len() == 1 || dims.last() == Some(&1) {
        let index = labels.ge(0).nonzero();
        let labels = labels.to_kind(Kind::Int64);
        let kept = index.size()[0];
        if kept == 0 {
            return Ok(Tensor::scalar_tensor(0.0, (logits.kind(), logits.device())));
        }
        let rows = logits.f_gather(0, &index.f_expand([kept, logits.size()[1]], false)?, false)?;
        let labels = labels.f_gather(0, &index.f_view([-1])?, false)?;
        return Ok(tchtrain_losses::fixed_cross_entropy(
            &rows.view([-1, num_labels]).to_kind(Kind::Float),
            &labels.view([-1]),
            None,
            -100,
        )?);
    }
    Ok(-(logits.log_softmax(-1, None::<Kind>) * labels)
        .sum_dim_intlist(-1, false, None)
        .mean(None))
}

impl EncoderArchitecture for DebertaV2Config {
    type Body = DebertaV2Model;
    type Head = Head;

    fn config_from_file(path: &Path) -> Result<Self> {
        Self::from_file(path)
    }
    fn labels_mut(&mut self) -> &mut LabelConfig {
        &mut self.labels
    }
    fn extra_mut(&mut self) -> &mut serde_json::Map<String, Value> {
        &mut self.extra
    }
    fn tie_word_embeddings(&self) -> bool {
        self.tie_word_embeddings
    }
    fn base_model_prefix(&self) -> &'static str {
        "deberta"
    }
    fn classes(&self) -> [&'static str; 5] {
        [
            "DebertaV2Model",
            "DebertaV2ForMaskedLM",
            "DebertaV2ForSequenceClassification",
            "DebertaV2ForTokenClassification",
            "DebertaV2ForQuestionAnswering",
        ]
    }
    fn build(
        &self,
        kind: HeadKind,
        root: &tchtrain_nn::Path<'_>,
        body: tchtrain_nn::Path<'_>,
    ) -> Result<(DebertaV2Model, Head)> {
        let config = self;
        let deberta = DebertaV2Model::new(body, config)?;
        let (d, std, n) = (
            config.hidden_size,
            config.initializer_range,
            config.labels.num_labels(),
        );
        let head = match kind {
            HeadKind::MaskedLm => {
                let (t, transform) = if config.legacy {
                    let t = root / "cls" / "predictions";
                    let transform = &t / "transform";
                    (t, transform)
                } else {
                    let t = root / "lm_predictions" / "lm_head";
                    let transform = t.clone();
                    (t, transform)
                };
                // The head's own `bias` is listed before its children's parameters.
                let bias = tchtrain_nn::initialization::var(
                    &t,
                    "bias",
                    &[config.vocab_size],
                    nn::Init::Const(0.0),
                );
                Head::MaskedLm {
                    dense: Linear::new(&transform / "dense", d, d, true, std),
                    ln: LayerNorm::new(&transform / "LayerNorm", d, config.layer_norm_eps),
                    bias,
                    legacy: config.legacy,
                }
            }
            HeadKind::SequenceClassification => Head::SequenceClassification {
                pooler: Linear::new(root / "pooler" / "dense", d, d, true, std),
                classifier: Linear::new(root / "classifier", d, n, true, std),
            },
            HeadKind::TokenClassification => Head::TokenClassification {
                classifier: Linear::new(root / "classifier", d, n, true, std),
            },
            HeadKind::QuestionAnswering => {
                crate::modeling_utils::check_question_answering_labels(n)?;
                Head::QuestionAnswering {
                    qa_outputs: Linear::new(root / "qa_outputs", d, n, true, std),
                }
            }
            HeadKind::Base => Head::None,
        };
        Ok((deberta, head))
    }
    fn checkpointing(body: &mut DebertaV2Model) -> &mut Option<ActivationCheckpointing> {
        &mut body.checkpointing
    }
    fn is_checkpointing(body: &DebertaV2Model) -> bool {
        body.checkpointing.is_some()
    }
    fn label_check(&self, kind: HeadKind) -> Option<LabelCheck> {
        match kind {
            // Negative class ids are dropped from the loss, not refused.
            HeadKind::SequenceClassification => None,
            kind => kind.label_check(self.labels.num_labels()),
        }
    }
    /// As upstream's `_keys_to_ignore_on_load_unexpected`: a checkpoint's
    /// `position_embeddings` (v3 stores them, unused) and masked-LM `mask_predictions`.
    fn reports_unexpected(key: &str) -> bool {
        !key.contains("position_embeddings") && !key.contains("mask_predictions")
    }
    fn is_embedding_weight(&self, name: &str) -> bool {
        name.starts_with("embeddings.") && name.ends_with("_embeddings.weight")
            || name == "encoder.rel_embeddings.weight"
    }
    /// What `print(model)` shows, for the shapes built here (v3's keys shared with the
    /// position embeddings, or v2's own position projections; the legacy and the current
    /// masked-LM heads); `None` for the shapes this crate refuses to build (a convolution, an
    /// embedding projection, other head or pooler sizes).
    fn module_repr(&self, kind: HeadKind, body: &DebertaV2Model) -> Option<ModuleRepr> {
        let h = self.hidden_size;
        let plain = self.conv_kernel_size.unwrap_or(0) == 0
            && self.embedding_size.unwrap_or(h) == h
            && self
                .attention_head_size
                .is_none_or(|a| a * self.num_attention_heads == h)
            && self.pooler_hidden_size.unwrap_or(h) == h;
        if !plain {
            return None;
        }
        let ln = || ModuleRepr::layer_norm(h, self.layer_norm_eps, true, true);
        let dropout = || ModuleRepr::dropout(self.hidden_dropout_prob);
        let act = || ModuleRepr::new(body.act.class_name());
        let mut embeddings = ModuleRepr::new("DebertaV2Embeddings").child(
            "word_embeddings",
            ModuleRepr::embedding(self.vocab_size, h, self.pad_token_id),
        );
        if body.position_embeddings.is_some() {
            embeddings = embeddings.child(
                "position_embeddings",
                ModuleRepr::embedding(self.max_position_embeddings, h, None),
            );
        }
        if body.token_type_embeddings.is_some() {
            embeddings = embeddings.child(
                "token_type_embeddings",
                ModuleRepr::embedding(self.type_vocab_size, h, None),
            );
        }
        embeddings = embeddings
            .child("LayerNorm", ln())
            .child("dropout", dropout());
        let mut attention = ModuleRepr::new("DisentangledSelfAttention")
            .child("query_proj", ModuleRepr::linear(h, h, true))
            .child("key_proj", ModuleRepr::linear(h, h, true))
            .child("value_proj", ModuleRepr::linear(h, h, true));
        if self.relative_attention {
            attention = attention.child("pos_dropout", dropout());
            // Without `share_att_key`, the relative embeddings' own projections: keys for
            // `c2p`, queries for `p2c`.
            if !self.share_att_key.unwrap_or(false) {
                let types = self.pos_att_type().ok()?;
                if types.iter().any(|t| t == "c2p") {
                    attention = attention.child("pos_key_proj", ModuleRepr::linear(h, h, true));
                }
                if types.iter().any(|t| t == "p2c") {
                    attention = attention.child("pos_query_proj", ModuleRepr::linear(h, h, true));
                }
            }
        }
        attention = attention.child(
            "dropout",
            ModuleRepr::dropout(self.attention_probs_dropout_prob),
        );
        let layer = ModuleRepr::new("DebertaV2Layer")
            .child(
                "attention",
                ModuleRepr::new("DebertaV2Attention")
                    .child("self", attention)
                    .child(
                        "output",
                        ModuleRepr::new("DebertaV2SelfOutput")
                            .child("dense", ModuleRepr::linear(h, h, true))
                            .child("LayerNorm", ln())
                            .child("dropout", dropout()),
                    ),
            )
            .child(
                "intermediate",
                ModuleRepr::new("DebertaV2Intermediate")
                    .child("dense", ModuleRepr::linear(h, self.intermediate_size, true))
                    .child("intermediate_act_fn", act()),
            )
            .child(
                "output",
                ModuleRepr::new("DebertaV2Output")
                    .child("dense", ModuleRepr::linear(self.intermediate_size, h, true))
                    .child("LayerNorm", ln())
                    .child("dropout", dropout()),
            );
        let mut encoder = ModuleRepr::new("DebertaV2Encoder").child(
            "layer",
            ModuleRepr::module_list(vec![layer; body.layers.len()]),
        );
        if let Some(rel) = &body.rel_embeddings {
            let (n, width) = rel.ws.size2().ok()?;
            encoder = encoder.child("rel_embeddings", ModuleRepr::embedding(n, width, None));
        }
        if body.rel_ln.is_some() {
            encoder = encoder.child("LayerNorm", ln());
        }
        let model = ModuleRepr::new("DebertaV2Model")
            .child("embeddings", embeddings)
            .child("encoder", encoder);
        let labels = self.labels.num_labels();
        let root = ModuleRepr::new(kind.class(&self.classes())).child("deberta", model.clone());
        let classifier_dropout =
            ModuleRepr::dropout(self.cls_dropout.unwrap_or(self.hidden_dropout_prob));
        Some(match kind {
            HeadKind::Base => model,
            // The current head: the transform's modules on the head itself, the output
            // projection tied to the word embeddings (a matmul, no module).
            HeadKind::MaskedLm if !self.legacy => root.child(
                "lm_predictions",
                ModuleRepr::new("DebertaV2OnlyMLMHead").child(
                    "lm_head",
                    ModuleRepr::new("DebertaV2LMPredictionHead")
                        .child("dense", ModuleRepr::linear(h, h, true))
                        .child("transform_act_fn", act())
                        .child("LayerNorm", ln()),
                ),
            ),
            HeadKind::MaskedLm => root.child(
                "cls",
                ModuleRepr::new("LegacyDebertaV2OnlyMLMHead").child(
                    "predictions",
                    ModuleRepr::new("LegacyDebertaV2LMPredictionHead")
                        .child(
                            "transform",
                            ModuleRepr::new("LegacyDebertaV2PredictionHeadTransform")
                                .child("dense", ModuleRepr::linear(h, h, true))
                                .child("transform_act_fn", act())
                                .child("LayerNorm", ln()),
                        )
                        .child("decoder", ModuleRepr::linear(h, self.vocab_size, true)),
                ),
            ),
            HeadKind::SequenceClassification => root
                .child(
                    "pooler",
                    ModuleRepr::new("ContextPooler")
                        .child("dense", ModuleRepr::linear(h, h, true))
                        .child("dropout", ModuleRepr::dropout(self.pooler_dropout)),
                )
                .child("classifier", ModuleRepr::linear(h, labels, true))
                .child("dropout", classifier_dropout),
            HeadKind::TokenClassification => root
                .child("dropout", dropout())
                .child("classifier", ModuleRepr::linear(h, labels, true)),
            HeadKind::QuestionAnswering => {
                root.child("qa_outputs", ModuleRepr::linear(h, labels, true))
            }
        })
    }
    fn tied_weights(&self, kind: HeadKind) -> Vec<(String, String)> {
        match kind {
            HeadKind::MaskedLm if self.legacy => vec![
                (
                    "cls.predictions.decoder.weight".into(),
                    "deberta.embeddings.word_embeddings.weight".into(),
                ),
                (
                    "cls.predictions.decoder.bias".into(),
                    "cls.predictions.bias".into(),
                ),
            ],
            _ => vec![],
        }
    }
    fn forward(
        &self,
        _kind: HeadKind,
        deberta: &DebertaV2Model,
        head: &Head,
        ctx: &Context,
        inputs: &ModelInputs<'_>,
        train: bool,
        padding_free: bool,
    ) -> Result<ModelOutput> {
        use tchtrain_nn::dropout_traced;
        let h = deberta.forward_with(inputs, train, padding_free)?;
        let c = self;
        let num_labels = c.labels.num_labels();
        let (logits, loss) = match head {
            Head::None => (h.shallow_clone(), None),
            Head::MaskedLm {
                dense,
                ln,
                bias,
                legacy,
            } => {
                let t = dense.forward(&h);
                let t = deberta
                    .act
                    .apply_traced(ctx, &t, || "transform_act_fn".into());
                let t = ln.forward(&t);
                let weight = deberta.word_embeddings();
                let logits = if *legacy {
                    t.linear(weight, Some(bias))
                } else {
                    t.matmul(&weight.tr()) + bias
                };
                let loss = heads::masked_lm_loss(&logits, inputs.labels, c.vocab_size, None)?;
                (logits, loss)
            }
            Head::SequenceClassification { pooler, classifier } => {
                let first = h.select(1, 0);
                let first = dropout_traced(ctx, &first, c.pooler_dropout, train, || {
                    "pooler.dropout".into()
                });
                let pooled = pooler.forward(&first);
                let pooled = Activation::parse(&c.pooler_hidden_act, "pooler_hidden_act")?
                    .apply_traced(ctx, &pooled, || "pooler.activation".into());
                let p = c.cls_dropout.unwrap_or(c.hidden_dropout_prob);
                let pooled = dropout_traced(ctx, &pooled, p, train, || "dropout".into());
                let logits = classifier.forward(&pooled);
                let loss = match inputs.labels {
                    Some(l) => Some(sequence_classification_loss(&logits, l, c)?),
                    None => None,
                };
                (logits, loss)
            }
            Head::TokenClassification { classifier } => {
                let t = dropout_traced(ctx, &h, c.hidden_dropout_prob, train, || "dropout".into());
                let logits = classifier.forward(&t);
                let loss = heads::token_classification_loss(&logits, inputs, num_labels)?;
                (logits, loss)
            }
            Head::QuestionAnswering { qa_outputs } => {
                let logits = qa_outputs.forward(&h);
                let loss = crate::modeling_utils::question_answering_loss(&logits, inputs, None)?;
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

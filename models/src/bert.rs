//! BERT (upstream `models/bert`): `BertConfig`, `BertModel`, `BertForMaskedLM`,
//! `BertForSequenceClassification`, `BertForTokenClassification`; and the BERT-shaped
//! encoders (RoBERTa, XLM-RoBERTa: `roberta.rs`), which are this model with an
//! [`EncoderFamily`] (their embeddings' order and positions, their heads, class names) and
//! an [`EncoderConfig`] of their own.
//!
//! As upstream, the BERT heads compute a plain mean cross-entropy (their forward builds
//! `CrossEntropyLoss()` itself) and ignore `num_items_in_batch`.

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tch::nn;
use tch::{Kind, Tensor};

use crate::attention;
use crate::checkpoint::{ActivationCheckpointing, ReadOnlyLayer, Shared, run_layers};
use crate::configuration_utils::{self, LabelConfig, PretrainedConfig};
use crate::encoder::{EncoderArchitecture, EncoderFor};
use crate::heads::{self, HeadKind};
use crate::modeling_utils::{ModelInputs, ModelOutput};
use crate::padding_free;
use crate::{Error, Result};
use tchtrain_nn::{Activation, Context, Embedding, LayerNorm, Linear, ModuleRepr};

/// Upstream `BertConfig` with its defaults (BERT base).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct BertConfig {
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
    pub pad_token_id: Option<i64>,
    pub classifier_dropout: Option<f64>,
    pub is_decoder: bool,
    pub tie_word_embeddings: bool,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Default for BertConfig {
    fn default() -> Self {
        Self {
            vocab_size: 30522,
            hidden_size: 768,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            intermediate_size: 3072,
            hidden_act: "gelu".into(),
            hidden_dropout_prob: 0.1,
            attention_probs_dropout_prob: 0.1,
            max_position_embeddings: 512,
            type_vocab_size: 2,
            initializer_range: 0.02,
            layer_norm_eps: 1e-12,
            pad_token_id: Some(0),
            classifier_dropout: None,
            is_decoder: false,
            tie_word_embeddings: true,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

impl PretrainedConfig for BertConfig {
    fn model_type(&self) -> &'static str {
        "bert"
    }
    fn to_json_value(&self) -> Result<serde_json::Value> {
        configuration_utils::to_value(self)
    }
    fn labels(&self) -> &LabelConfig {
        &self.labels
    }
}

impl BertConfig {
    /// Reads `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let c: Self = configuration_utils::read_config(path)?;
        c.validate()?;
        Ok(c)
    }

    pub(crate) fn validate(&self) -> Result<()> {
        configuration_utils::check_sizes(
            &[
                ("vocab_size", self.vocab_size),
                ("hidden_size", self.hidden_size),
                ("intermediate_size", self.intermediate_size),
                ("max_position_embeddings", self.max_position_embeddings),
                ("type_vocab_size", self.type_vocab_size),
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
        if self.is_decoder {
            return Err(Error::InvalidConfig {
                field: "is_decoder",
                value: "true".into(),
                fix: "only the bidirectional encoder is implemented; set is_decoder to false",
            });
        }
        if let Some(pe) = self
            .extra
            .get("position_embedding_type")
            .and_then(|v| v.as_str())
            && pe != "absolute"
        {
            return Err(Error::InvalidConfig {
                field: "position_embedding_type",
                value: pe.to_string(),
                fix: "only absolute position embeddings are implemented",
            });
        }
        Activation::parse(&self.hidden_act, "hidden_act")?;
        Ok(())
    }
}

/// What a BERT-shaped family changes (upstream's `modeling_roberta.py` against
/// `modeling_bert.py`).
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderFamily {
    /// `model_type` (`bert`, `roberta`, `xlm-roberta`).
    pub model_type: &'static str,
    /// Upstream's `base_model_prefix` (`bert`, `roberta`).
    pub base_model_prefix: &'static str,
    /// Upstream's class-name prefix (`Bert`, `Roberta`, `XLMRoberta`).
    pub prefix: &'static str,
    /// Upstream's class names of the heads: base, masked LM, sequence and token
    /// classification.
    pub classes: [&'static str; 5],
    /// RoBERTa's embeddings (`position_embeddings` registered last, positions counted
    /// from `pad_token_id + 1` over the non-padding tokens), its `lm_head` and
    /// `RobertaClassificationHead`, no pooler under a head.
    pub roberta: bool,
    /// XLM-RoBERTa's heads register before the body (`named_parameters()` lists them first,
    /// the tied decoder under `lm_head.decoder.weight`).
    pub head_first: bool,
}

impl EncoderFamily {
    /// BERT's.
    pub fn bert() -> Self {
        Self {
            model_type: "bert",
            base_model_prefix: "bert",
            prefix: "Bert",
            classes: [
                "BertModel",
                "BertForMaskedLM",
                "BertForSequenceClassification",
                "BertForTokenClassification",
                "BertForQuestionAnswering",
            ],
            roberta: false,
            head_first: false,
        }
    }
}

/// A BERT-shaped family's config: upstream's own class (its defaults, its `config.json`),
/// seen as BERT's sizes plus the [`EncoderFamily`] facts.
pub trait EncoderConfig:
    PretrainedConfig + Clone + std::fmt::Debug + Send + Sync + 'static
{
    /// Reads and checks `config.json`.
    fn from_file(path: &Path) -> Result<Self>;
    /// The sizes, dropouts and special tokens in BERT's form.
    fn bert(&self) -> BertConfig;
    /// What the family changes.
    fn family(&self) -> EncoderFamily;
    /// `num_labels`, `id2label`, `problem_type`.
    fn labels_mut(&mut self) -> &mut LabelConfig;
    /// Keys not interpreted (`use_cache`, ...), kept so that `config.json` round-trips.
    fn extra_mut(&mut self) -> &mut serde_json::Map<String, serde_json::Value>;
}

impl EncoderConfig for BertConfig {
    fn from_file(path: &Path) -> Result<Self> {
        BertConfig::from_file(path)
    }
    fn bert(&self) -> BertConfig {
        self.clone()
    }
    fn family(&self) -> EncoderFamily {
        EncoderFamily::bert()
    }
    fn labels_mut(&mut self) -> &mut LabelConfig {
        &mut self.labels
    }
    fn extra_mut(&mut self) -> &mut serde_json::Map<String, serde_json::Value> {
        &mut self.extra
    }
}

/// Upstream's class names of a family's modules (what the underflow / overflow tracer prints).
#[derive(Debug)]
struct Classes {
    self_attention: String,
    self_output: String,
    attention: String,
    intermediate: String,
    output: String,
    layer: String,
    embeddings: String,
    encoder: String,
    pooler: String,
    model: String,
}

impl Classes {
    fn new(prefix: &str) -> Self {
        Self {
            self_attention: format!("{prefix}SelfAttention"),
            self_output: format!("{prefix}SelfOutput"),
            attention: format!("{prefix}Attention"),
            intermediate: format!("{prefix}Intermediate"),
            output: format!("{prefix}Output"),
            layer: format!("{prefix}Layer"),
            embeddings: format!("{prefix}Embeddings"),
            encoder: format!("{prefix}Encoder"),
            pooler: format!("{prefix}Pooler"),
            model: format!("{prefix}Model"),
        }
    }
}

#[derive(Debug)]
struct Layer {
    ctx: Context,
    query: Linear,
    key: Linear,
    value: Linear,
    attn_out: Linear,
    attn_ln: LayerNorm,
    intermediate: Linear,
    output: Linear,
    output_ln: LayerNorm,
    /// `bert.encoder.layer.{i}`, as the underflow / overflow tracer names it.
    name: String,
    classes: Arc<Classes>,
}

// SAFETY: parameter tensors and plain values that the forward only reads.
#[allow(unsafe_code)]
unsafe impl ReadOnlyLayer for Layer {}

/// What a layer's forward needs besides the hidden states (owned, so that a checkpointed
/// layer can run again in the backward).
struct LayerInputs {
    mask: attention::Mask,
    batch: i64,
    seq: i64,
    heads: i64,
    head_dim: i64,
    hidden_size: i64,
    scale: f64,
    attn_p: f64,
    hidden_dropout_prob: f64,
    train: bool,
    act: Activation,
    /// The padding-free layout, when the layers run on the real tokens only.
    unpadded: Option<padding_free::Unpadded>,
}

// SAFETY: parameter tensors and plain values that the forward only reads.
#[allow(unsafe_code)]
unsafe impl ReadOnlyLayer for LayerInputs {}

impl LayerInputs {
    /// Dropout on the hidden states, padded or padding-free.
    fn dropout(&self, ctx: &Context, x: &Tensor, name: impl FnOnce() -> String) -> Tensor {
        padding_free::dropout_traced(
            ctx,
            self.unpadded.as_ref(),
            x,
            self.hidden_dropout_prob,
            self.train,
            name,
        )
    }
}

impl Layer {
    /// Upstream `BertLayer.forward`: self-attention, then the feed-forward block, each
    /// followed by dropout, the residual connection and a post-LayerNorm.
    fn forward(&self, h: &Tensor, x: &LayerInputs) -> Tensor {
        let LayerInputs {
            batch,
            seq,
            heads,
            head_dim,
            ..
        } = *x;
        use tchtrain_nn::{Out, Var};
        let n = |rest: &str| format!("{}.{rest}", self.name);
        let to_heads = |t: Tensor| {
            padding_free::padded(x.unpadded.as_ref(), t)
                .view([batch, seq, heads, head_dim])
                .transpose(1, 2)
        };
        let q = self.query.forward(h);
        let k = self.key.forward(h);
        let v = self.value.forward(h);
        let a = attention::sdpa(
            &to_heads(q),
            &to_heads(k),
            &to_heads(v),
            &x.mask,
            x.attn_p,
            x.scale,
        );
        let ctx = padding_free::unpadded(
            x.unpadded.as_ref(),
            a.transpose(1, 2).reshape([batch, seq, x.hidden_size]),
        );
        self.ctx.hook(
            || n("attention.self"),
            &self.classes.self_attention,
            &[],
            &[Var::T(h)],
            Out::Tuple(&[Var::T(&ctx), Var::None]),
        );
        let d = self.attn_out.forward(&ctx);
        let d = x.dropout(&self.ctx, &d, || n("attention.output.dropout"));
        let a = self.attn_ln.forward(&(d + h));
        self.ctx.hook(
            || n("attention.output"),
            &self.classes.self_output,
            &[],
            &[Var::T(&ctx), Var::T(h)],
            Out::One(Var::T(&a)),
        );
        // Upstream's layers get (hidden_states, attention_mask, ...) positionally.
        let mask = x.mask.tensor().map_or(Var::None, Var::T);
        self.ctx.hook(
            || n("attention"),
            &self.classes.attention,
            &[],
            &[Var::T(h), mask],
            Out::Tuple(&[Var::T(&a), Var::None]),
        );
        let i = self.intermediate.forward(&a);
        let i = x
            .act
            .apply_traced(&self.ctx, &i, || n("intermediate.intermediate_act_fn"));
        self.ctx.leaf(
            || n("intermediate"),
            &self.classes.intermediate,
            &[],
            &a,
            &i,
        );
        let m = self.output.forward(&i);
        let m = x.dropout(&self.ctx, &m, || n("output.dropout"));
        let out = self.output_ln.forward(&(m + &a));
        self.ctx.hook(
            || n("output"),
            &self.classes.output,
            &[],
            &[Var::T(&i), Var::T(&a)],
            Out::One(Var::T(&out)),
        );
        self.ctx.hook(
            || self.name.clone(),
            &self.classes.layer,
            &[],
            &[Var::T(h), mask, Var::None],
            Out::One(Var::T(&out)),
        );
        out
    }
}

/// Upstream `BertModel`: embeddings, encoder and (optionally) the pooler.
#[derive(Debug)]
pub struct BertModel {
    ctx: Context,
    /// Where it sits in its model (`bert`; empty for `BertModel` itself).
    prefix: String,
    word_embeddings: Embedding,
    position_embeddings: Embedding,
    token_type_embeddings: Embedding,
    embeddings_ln: LayerNorm,
    layers: Vec<Arc<Shared<Layer>>>,
    pooler: Option<Linear>,
    act: Activation,
    config: BertConfig,
    family: EncoderFamily,
    classes: Arc<Classes>,
    /// Upstream's `gradient_checkpointing` on the layers.
    pub(crate) checkpointing: Option<ActivationCheckpointing>,
}

impl BertModel {
    /// Creates the variables under `p` (upstream prefix `bert`, or the root for `BertModel`).
    pub fn new(
        p: tchtrain_nn::Path<'_>,
        config: &BertConfig,
        add_pooling_layer: bool,
    ) -> Result<Self> {
        Self::with_family(p, config, add_pooling_layer, EncoderFamily::bert())
    }

    /// [`new`](Self::new) for a BERT-shaped family.
    pub fn with_family(
        p: tchtrain_nn::Path<'_>,
        config: &BertConfig,
        add_pooling_layer: bool,
        family: EncoderFamily,
    ) -> Result<Self> {
        config.validate()?;
        configuration_utils::check_padding_idx(config.pad_token_id, config.vocab_size)?;
        if family.roberta
            && let Some(pad) = config.pad_token_id
            && (pad < 0 || pad + 1 >= config.max_position_embeddings)
        {
            return Err(Error::InvalidConfig {
                field: "pad_token_id",
                value: format!(
                    "{pad} (max_position_embeddings {})",
                    config.max_position_embeddings
                ),
                fix: "RoBERTa's positions start after the padding index: use a pad_token_id from 0 to max_position_embeddings - 2",
            });
        }
        if family.roberta && config.pad_token_id.is_none() {
            return Err(Error::InvalidConfig {
                field: "pad_token_id",
                value: "null".into(),
                fix: "RoBERTa counts its positions from the padding index; set pad_token_id (1 in RoBERTa's vocabularies)",
            });
        }
        let classes = Arc::new(Classes::new(family.prefix));
        let (d, std, eps) = (
            config.hidden_size,
            config.initializer_range,
            config.layer_norm_eps,
        );
        let e = &p / "embeddings";
        // Created in upstream's registration order (embeddings, encoder, pooler):
        // `model.parameters()` follows it, and gradient clipping sums the per-parameter norms
        // in that order.
        // RoBERTa registers `position_embeddings` (with the padding index) last.
        let pad = config.pad_token_id;
        let word_embeddings =
            Embedding::with_padding(&e / "word_embeddings", config.vocab_size, d, std, pad);
        let positions = |e: &tchtrain_nn::Path<'_>, padding| {
            Embedding::with_padding(
                e / "position_embeddings",
                config.max_position_embeddings,
                d,
                std,
                padding,
            )
        };
        let position_embeddings = (!family.roberta).then(|| positions(&e, None));
        let token_type_embeddings =
            Embedding::new(&e / "token_type_embeddings", config.type_vocab_size, d, std);
        let embeddings_ln = LayerNorm::new(&e / "LayerNorm", d, eps);
        let position_embeddings = match position_embeddings {
            Some(p) => p,
            None => positions(&e, pad),
        };
        let layers = (0..config.num_hidden_layers)
            .map(|i| {
                let l = &p / "encoder" / "layer" / i;
                let a = &l / "attention";
                Arc::new(Shared(Layer {
                    query: Linear::in_layer(&a / "self" / "query", d, d, true, std),
                    key: Linear::in_layer(&a / "self" / "key", d, d, true, std),
                    value: Linear::in_layer(&a / "self" / "value", d, d, true, std),
                    attn_out: Linear::in_layer(&a / "output" / "dense", d, d, true, std),
                    attn_ln: LayerNorm::new(&a / "output" / "LayerNorm", d, eps),
                    intermediate: Linear::in_layer(
                        &l / "intermediate" / "dense",
                        d,
                        config.intermediate_size,
                        true,
                        std,
                    ),
                    output: Linear::in_layer(
                        &l / "output" / "dense",
                        config.intermediate_size,
                        d,
                        true,
                        std,
                    ),
                    output_ln: LayerNorm::new(&l / "output" / "LayerNorm", d, eps),
                    name: l.name(),
                    ctx: l.ctx().clone(),
                    classes: Arc::clone(&classes),
                }))
            })
            .collect();
        Ok(Self {
            prefix: p.name(),
            ctx: p.ctx().clone(),
            word_embeddings,
            position_embeddings,
            token_type_embeddings,
            embeddings_ln,
            layers,
            pooler: add_pooling_layer
                .then(|| Linear::new(&p / "pooler" / "dense", d, d, true, std)),
            act: Activation::parse(&config.hidden_act, "hidden_act")?,
            config: config.clone(),
            family,
            classes,
            checkpointing: None,
        })
    }

    /// `(last_hidden_state, pooler_output)`.
    pub fn forward(
        &self,
        inputs: &ModelInputs<'_>,
        train: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        self.forward_with(inputs, train, false)
    }

    /// [`forward`](Self::forward), the layers run padding-free when `padding_free` and the
    /// attention mask pads a token (see `crate::padding_free`): the padding positions of the last
    /// hidden state are then zeros, the real tokens' values those of the padded run up to
    /// the last bits.
    pub(crate) fn forward_with(
        &self,
        inputs: &ModelInputs<'_>,
        train: bool,
        padding_free: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let c = &self.config;
        let ids = inputs.ids()?;
        // RoBERTa's positions run from `pad_token_id + 1`.
        let offset = match (self.family.roberta, c.pad_token_id) {
            (true, Some(pad)) => pad + 1,
            _ => 0,
        };
        let (batch, seq) = crate::check_ids(ids, c.vocab_size, c.max_position_embeddings - offset)?;
        let device = self.word_embeddings.ws.device();
        let ids = ids.f_to_device(device)?;
        let positions = match (inputs.position_ids, self.family.roberta, c.pad_token_id) {
            (Some(p), _, _) => p.f_to_device(device)?,
            // Upstream `create_position_ids_from_input_ids`: the non-padding tokens counted
            // from `padding_idx + 1`, the padding at `padding_idx`.
            (None, true, Some(pad)) => {
                let mask = ids.ne(pad).to_kind(Kind::Int);
                (mask.cumsum(1, Kind::Int) * &mask).to_kind(Kind::Int64) + pad
            }
            _ => Tensor::arange(seq, (Kind::Int64, device)).unsqueeze(0),
        };
        let token_types = match inputs.token_type_ids {
            Some(t) => t.f_to_device(device)?,
            None => Tensor::zeros([batch, seq], (Kind::Int64, device)),
        };
        use tchtrain_nn::{Out, Var, join};
        let n = |rest: &str| join(&self.prefix, rest);
        let words = self.word_embeddings.input_forward(
            &ids,
            self.word_embeddings.lookup(&ids),
            None,
            train,
        )?;
        let types = self.token_type_embeddings.forward(&token_types);
        let position = self.position_embeddings.forward(&positions);
        let h = words + types + position;
        let h = self.embeddings_ln.forward(&h);
        let mut h =
            tchtrain_nn::dropout_traced(&self.ctx, &h, c.hidden_dropout_prob, train, || {
                n("embeddings.dropout")
            });
        // Called with keyword arguments: no positional inputs.
        self.ctx.hook(
            || n("embeddings"),
            &self.classes.embeddings,
            &[],
            &[],
            Out::One(Var::T(&h)),
        );
        let embedding_output = h.shallow_clone();
        let unpadded = padding_free::Unpadded::for_forward(
            &self.ctx,
            padding_free,
            false,
            inputs.attention_mask,
            device,
        )?;
        if let Some(u) = &unpadded {
            h = u.gather(&h);
        }
        let head_dim = c.hidden_size / c.num_attention_heads;
        let x = Arc::new(Shared(LayerInputs {
            mask: attention::attention_mask(inputs.attention_mask, batch, seq, false, device),
            batch,
            seq,
            heads: c.num_attention_heads,
            head_dim,
            hidden_size: c.hidden_size,
            scale: (head_dim as f64).powf(-0.5),
            attn_p: if train {
                c.attention_probs_dropout_prob
            } else {
                0.0
            },
            hidden_dropout_prob: c.hidden_dropout_prob,
            train,
            act: self.act,
            unpadded,
        }));
        let mut h = run_layers(
            &self.ctx,
            &self.layers,
            &x,
            None,
            self.checkpointing.as_ref(),
            train,
            h,
            |l, h, _, x| Ok(l.forward(h, x)),
        )?;
        if let Some(u) = &x.unpadded {
            h = u.scatter(&h);
        }
        self.ctx.hook(
            || n("encoder"),
            &self.classes.encoder,
            &[],
            &[Var::T(&embedding_output)],
            Out::One(Var::NotTensor),
        );
        let pooled = self.pooler.as_ref().map(|p| {
            let dense = p.forward(&h.select(1, 0));
            let pooled = dense.tanh();
            self.ctx
                .leaf(|| n("pooler.activation"), "Tanh", &[], &dense, &pooled);
            self.ctx
                .leaf(|| n("pooler"), &self.classes.pooler, &[], &h, &pooled);
            pooled
        });
        if !self.prefix.is_empty() {
            // Called positionally with `input_ids` by the heads.
            self.ctx.hook(
                || self.prefix.clone(),
                &self.classes.model,
                &[],
                &[Var::T(&ids)],
                Out::One(Var::NotTensor),
            );
        }
        Ok((h, pooled))
    }

    /// The word embedding matrix (tied to the HeadKind::MaskedLm decoder).
    pub fn word_embeddings(&self) -> &Tensor {
        &self.word_embeddings.ws
    }
}

/// Which head sits on the BERT body.
#[derive(Debug)]
pub enum Head {
    /// `BertModel` itself: no head.
    None,
    /// `cls.predictions`: transform (dense, act, LayerNorm) then the tied decoder + bias.
    MaskedLm {
        dense: Linear,
        ln: LayerNorm,
        bias: Tensor,
    },
    /// RoBERTa's `lm_head`: dense, GELU, `layer_norm`, then the tied decoder + bias.
    RobertaLm {
        dense: Linear,
        layer_norm: LayerNorm,
        bias: Tensor,
    },
    /// `classifier` on the pooled output.
    SequenceClassification { classifier: Linear },
    /// RoBERTa's `classifier` (`RobertaClassificationHead`) on the first token: dropout,
    /// dense, tanh, dropout, `out_proj`.
    RobertaClassification { dense: Linear, out_proj: Linear },
    /// `classifier` on every token.
    TokenClassification { classifier: Linear },
    /// `qa_outputs` on every token (no dropout): the start and end logits.
    QuestionAnswering { qa_outputs: Linear },
}

/// A BERT-shaped model with one of upstream's heads; use the type aliases
/// ([`BertForMaskedLM`], `RobertaForSequenceClassification`, ...).
pub type Bert<C, K> = EncoderFor<C, K>;

/// Upstream `BertModel` as a standalone model (weights at the root, with the pooler).
pub type BertBaseModel = Bert<BertConfig, heads::Base>;
/// Upstream `BertForMaskedLM`.
pub type BertForMaskedLM = Bert<BertConfig, heads::MaskedLm>;
/// Upstream `BertForSequenceClassification`.
pub type BertForSequenceClassification = Bert<BertConfig, heads::SequenceClassification>;
/// Upstream `BertForTokenClassification`.
pub type BertForTokenClassification = Bert<BertConfig, heads::TokenClassification>;
/// Upstream `BertForQuestionAnswering`.
pub type BertForQuestionAnswering = Bert<BertConfig, heads::QuestionAnswering>;

/// The head of `kind`'s variables, created under `root` in upstream's order.
fn head(kind: HeadKind, root: &tchtrain_nn::Path<'_>, config: &BertConfig, roberta: bool) -> Head {
    let (d, std) = (config.hidden_size, config.initializer_range);
    match kind {
        HeadKind::MaskedLm if roberta => {
            let t = root / "lm_head";
            // `lm_head.bias` (the decoder's bias) comes first in `named_parameters()`.
            let bias = tchtrain_nn::initialization::var(
                &t,
                "bias",
                &[config.vocab_size],
                nn::Init::Const(0.0),
            );
            Head::RobertaLm {
                dense: Linear::new(&t / "dense", d, d, true, std),
                layer_norm: LayerNorm::new(&t / "layer_norm", d, config.layer_norm_eps),
                bias,
            }
        }
        HeadKind::SequenceClassification if roberta => {
            let c = root / "classifier";
            Head::RobertaClassification {
                dense: Linear::new(&c / "dense", d, d, true, std),
                out_proj: Linear::new(&c / "out_proj", d, config.num_labels(), true, std),
            }
        }
        HeadKind::MaskedLm => {
            let t = root / "cls" / "predictions";
            // Upstream's `named_parameters()` lists `cls.predictions.bias` before the
            // transform (the decoder's bias is that parameter, and the decoder weight is
            // the tied word embeddings): created in that order.
            let bias = tchtrain_nn::initialization::var(
                &t,
                "bias",
                &[config.vocab_size],
                nn::Init::Const(0.0),
            );
            Head::MaskedLm {
                dense: Linear::new(&t / "transform" / "dense", d, d, true, std),
                ln: LayerNorm::new(&t / "transform" / "LayerNorm", d, config.layer_norm_eps),
                bias,
            }
        }
        HeadKind::SequenceClassification => Head::SequenceClassification {
            classifier: Linear::new(root / "classifier", d, config.num_labels(), true, std),
        },
        HeadKind::TokenClassification => Head::TokenClassification {
            classifier: Linear::new(root / "classifier", d, config.num_labels(), true, std),
        },
        HeadKind::QuestionAnswering => Head::QuestionAnswering {
            qa_outputs: Linear::new(root / "qa_outputs", d, 2, true, std),
        },
        HeadKind::Base => Head::None,
    }
}

/// What `print(model)` shows of a BERT-shaped model with the head of `kind`: the body
/// (`<Prefix>Model`: embeddings, encoder layers, the pooler where there is one) and the head,
/// registered before the body for XLM-RoBERTa.
fn module_repr(c: &BertConfig, f: &EncoderFamily, kind: HeadKind, body: &BertModel) -> ModuleRepr {
    let (p, h) = (f.prefix, c.hidden_size);
    let ln = || ModuleRepr::layer_norm(h, c.layer_norm_eps, true, true);
    let hidden_dropout = || ModuleRepr::dropout(c.hidden_dropout_prob);
    let words = ModuleRepr::embedding(c.vocab_size, h, c.pad_token_id);
    let types = ModuleRepr::embedding(c.type_vocab_size, h, None);
    let mut embeddings = ModuleRepr::new(format!("{p}Embeddings")).child("word_embeddings", words);
    if f.roberta {
        embeddings = embeddings
            .child("token_type_embeddings", types)
            .child("LayerNorm", ln())
            .child("dropout", hidden_dropout())
            .child(
                "position_embeddings",
                ModuleRepr::embedding(c.max_position_embeddings, h, c.pad_token_id),
            );
    } else {
        embeddings = embeddings
            .child(
                "position_embeddings",
                ModuleRepr::embedding(c.max_position_embeddings, h, None),
            )
            .child("token_type_embeddings", types)
            .child("LayerNorm", ln())
            .child("dropout", hidden_dropout());
    }
    let attention = ModuleRepr::new(format!("{p}Attention"))
        .child(
            "self",
            ModuleRepr::new(format!("{p}SelfAttention"))
                .child("query", ModuleRepr::linear(h, h, true))
                .child("key", ModuleRepr::linear(h, h, true))
                .child("value", ModuleRepr::linear(h, h, true))
                .child(
                    "dropout",
                    ModuleRepr::dropout(c.attention_probs_dropout_prob),
                ),
        )
        .child(
            "output",
            ModuleRepr::new(format!("{p}SelfOutput"))
                .child("dense", ModuleRepr::linear(h, h, true))
                .child("LayerNorm", ln())
                .child("dropout", hidden_dropout()),
        );
    let layer = ModuleRepr::new(format!("{p}Layer"))
        .child("attention", attention)
        .child(
            "intermediate",
            ModuleRepr::new(format!("{p}Intermediate"))
                .child("dense", ModuleRepr::linear(h, c.intermediate_size, true))
                .child(
                    "intermediate_act_fn",
                    ModuleRepr::new(body.act.class_name()),
                ),
        )
        .child(
            "output",
            ModuleRepr::new(format!("{p}Output"))
                .child("dense", ModuleRepr::linear(c.intermediate_size, h, true))
                .child("LayerNorm", ln())
                .child("dropout", hidden_dropout()),
        );
    let mut model = ModuleRepr::new(format!("{p}Model"))
        .child("embeddings", embeddings)
        .child(
            "encoder",
            ModuleRepr::new(format!("{p}Encoder")).child(
                "layer",
                ModuleRepr::module_list(vec![layer; body.layers.len()]),
            ),
        );
    if body.pooler.is_some() {
        model = model.child(
            "pooler",
            ModuleRepr::new(format!("{p}Pooler"))
                .child("dense", ModuleRepr::linear(h, h, true))
                .child("activation", ModuleRepr::new("Tanh")),
        );
    }
    let labels = c.num_labels();
    let head: Vec<(&str, ModuleRepr)> = match kind {
        HeadKind::Base => return model,
        HeadKind::MaskedLm if f.roberta => vec![(
            "lm_head",
            ModuleRepr::new(format!("{p}LMHead"))
                .child("dense", ModuleRepr::linear(h, h, true))
                .child("layer_norm", ln())
                .child("decoder", ModuleRepr::linear(h, c.vocab_size, true)),
        )],
        HeadKind::MaskedLm => vec![(
            "cls",
            ModuleRepr::new(format!("{p}OnlyMLMHead")).child(
                "predictions",
                ModuleRepr::new(format!("{p}LMPredictionHead"))
                    .child(
                        "transform",
                        ModuleRepr::new(format!("{p}PredictionHeadTransform"))
                            .child("dense", ModuleRepr::linear(h, h, true))
                            .child("transform_act_fn", ModuleRepr::new(body.act.class_name()))
                            .child("LayerNorm", ln()),
                    )
                    .child("decoder", ModuleRepr::linear(h, c.vocab_size, true)),
            ),
        )],
        HeadKind::SequenceClassification if f.roberta => vec![(
            "classifier",
            ModuleRepr::new(format!("{p}ClassificationHead"))
                .child("dense", ModuleRepr::linear(h, h, true))
                .child("dropout", ModuleRepr::dropout(dropout_p(c)))
                .child("out_proj", ModuleRepr::linear(h, labels, true)),
        )],
        HeadKind::SequenceClassification | HeadKind::TokenClassification => vec![
            ("dropout", ModuleRepr::dropout(dropout_p(c))),
            ("classifier", ModuleRepr::linear(h, labels, true)),
        ],
        HeadKind::QuestionAnswering => vec![("qa_outputs", ModuleRepr::linear(h, 2, true))],
    };
    let mut root = ModuleRepr::new(kind.class(&f.classes));
    if !f.head_first {
        root = root.child(f.base_model_prefix, model.clone());
    }
    for (key, m) in head {
        root = root.child(key, m);
    }
    if f.head_first {
        root = root.child(f.base_model_prefix, model);
    }
    root
}

/// The heads' dropout: `classifier_dropout`, else `hidden_dropout_prob`.
fn dropout_p(c: &BertConfig) -> f64 {
    c.classifier_dropout.unwrap_or(c.hidden_dropout_prob)
}

/// Every BERT-shaped config (BERT, RoBERTa, XLM-RoBERTa, ...) is an encoder family through
/// its [`EncoderFamily`] facts.
impl<C: EncoderConfig> EncoderArchitecture for C {
    type Body = BertModel;
    type Head = Head;

    fn config_from_file(path: &Path) -> Result<Self> {
        C::from_file(path)
    }
    fn labels_mut(&mut self) -> &mut LabelConfig {
        EncoderConfig::labels_mut(self)
    }
    fn extra_mut(&mut self) -> &mut serde_json::Map<String, serde_json::Value> {
        EncoderConfig::extra_mut(self)
    }
    fn tie_word_embeddings(&self) -> bool {
        self.bert().tie_word_embeddings
    }
    fn base_model_prefix(&self) -> &'static str {
        self.family().base_model_prefix
    }
    fn classes(&self) -> [&'static str; 5] {
        self.family().classes
    }
    fn build(
        &self,
        kind: HeadKind,
        root: &tchtrain_nn::Path<'_>,
        body: tchtrain_nn::Path<'_>,
    ) -> Result<(BertModel, Head)> {
        let config = &self.bert();
        let family = self.family();
        // BERT's sequence classifier reads the pooler; RoBERTa's heads have none.
        let pooler =
            kind == HeadKind::Base || (kind == HeadKind::SequenceClassification && !family.roberta);
        let roberta = family.roberta;
        if kind == HeadKind::QuestionAnswering {
            crate::modeling_utils::check_question_answering_labels(config.num_labels())?;
        }
        // XLM-RoBERTa's heads register before the body (their parameters come first).
        if family.head_first {
            let head = head(kind, root, config, roberta);
            Ok((BertModel::with_family(body, config, pooler, family)?, head))
        } else {
            let bert = BertModel::with_family(body, config, pooler, family)?;
            Ok((bert, head(kind, root, config, roberta)))
        }
    }
    fn checkpointing(body: &mut BertModel) -> &mut Option<ActivationCheckpointing> {
        &mut body.checkpointing
    }
    fn is_checkpointing(body: &BertModel) -> bool {
        body.checkpointing.is_some()
    }
    // BERT's LayerNorms are named `LayerNorm`, which the name patterns already exclude.
    fn is_embedding_weight(&self, name: &str) -> bool {
        matches!(
            name,
            "embeddings.word_embeddings.weight"
                | "embeddings.position_embeddings.weight"
                | "embeddings.token_type_embeddings.weight"
        )
    }
    fn module_repr(&self, kind: HeadKind, body: &BertModel) -> Option<ModuleRepr> {
        Some(module_repr(&self.bert(), &self.family(), kind, body))
    }
    fn tied_weights(&self, kind: HeadKind) -> Vec<(String, String)> {
        let family = self.family();
        match kind {
            HeadKind::MaskedLm if family.roberta => vec![
                (
                    "lm_head.decoder.weight".into(),
                    format!(
                        "{}.embeddings.word_embeddings.weight",
                        family.base_model_prefix
                    ),
                ),
                ("lm_head.decoder.bias".into(), "lm_head.bias".into()),
            ],
            HeadKind::MaskedLm => vec![
                (
                    "cls.predictions.decoder.weight".into(),
                    "bert.embeddings.word_embeddings.weight".into(),
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
        bert: &BertModel,
        head: &Head,
        ctx: &Context,
        inputs: &ModelInputs<'_>,
        train: bool,
        padding_free: bool,
    ) -> Result<ModelOutput> {
        let (h, pooled) = bert.forward_with(inputs, train, padding_free)?;
        let labels_config = self.labels();
        let num_labels = labels_config.num_labels();
        let vocab_size = bert.config.vocab_size;
        let (logits, loss) = match head {
            Head::None => (h.shallow_clone(), None),
            Head::MaskedLm { dense, ln, bias } => {
                let p = "cls.predictions";
                let t = dense.forward(&h);
                let t = bert
                    .act
                    .apply_traced(ctx, &t, || format!("{p}.transform.transform_act_fn"));
                let t = ln.forward(&t);
                ctx.leaf(
                    || format!("{p}.transform"),
                    "BertPredictionHeadTransform",
                    &[],
                    &h,
                    &t,
                );
                let weight = bert.word_embeddings();
                let logits = t.linear(weight, Some(bias));
                let decoder = [("weight", weight), ("bias", bias)];
                ctx.leaf(|| format!("{p}.decoder"), "Linear", &decoder, &t, &logits);
                ctx.leaf(
                    || p.into(),
                    "BertLMPredictionHead",
                    &[("bias", bias)],
                    &h,
                    &logits,
                );
                ctx.leaf(|| "cls".into(), "BertOnlyMLMHead", &[], &h, &logits);
                let loss = heads::masked_lm_loss(&logits, inputs.labels, vocab_size, None)?;
                (logits, loss)
            }
            Head::RobertaLm {
                dense,
                layer_norm,
                bias,
            } => {
                let x = dense.forward(&h);
                // upstream's `gelu` function (exact), whatever `hidden_act` says
                let x = x.gelu("none");
                let x = layer_norm.forward(&x);
                let weight = bert.word_embeddings();
                let logits = x.linear(weight, Some(bias));
                let decoder = [("weight", weight), ("bias", bias)];
                ctx.leaf(|| "lm_head.decoder".into(), "Linear", &decoder, &x, &logits);
                ctx.leaf(
                    || "lm_head".into(),
                    "RobertaLMHead",
                    &[("bias", bias)],
                    &h,
                    &logits,
                );
                let loss = heads::masked_lm_loss(&logits, inputs.labels, vocab_size, None)?;
                (logits, loss)
            }
            Head::RobertaClassification { dense, out_proj } => {
                use tchtrain_nn::dropout_traced;
                let p = dropout_p(&bert.config);
                let x = h.select(1, 0);
                let x = dropout_traced(ctx, &x, p, train, || "classifier.dropout".into());
                let x = dense.forward(&x).tanh();
                let x = dropout_traced(ctx, &x, p, train, || "classifier.dropout".into());
                let logits = out_proj.forward(&x);
                let loss = heads::sequence_classification_loss(&logits, inputs, labels_config)?;
                (logits, loss)
            }
            Head::SequenceClassification { classifier } => {
                let pooled = pooled.as_ref().ok_or(Error::MissingInput {
                    name: "pooler_output",
                })?;
                let d = tchtrain_nn::dropout_traced(
                    ctx,
                    pooled,
                    dropout_p(&bert.config),
                    train,
                    || "dropout".into(),
                );
                let logits = classifier.forward(&d);
                let loss = heads::sequence_classification_loss(&logits, inputs, labels_config)?;
                (logits, loss)
            }
            Head::TokenClassification { classifier } => {
                let d =
                    tchtrain_nn::dropout_traced(ctx, &h, dropout_p(&bert.config), train, || {
                        "dropout".into()
                    });
                let logits = classifier.forward(&d);
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
            pooler_output: pooled,
            aux_loss: None,
        })
    }
}

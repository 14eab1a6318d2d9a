//! DistilBERT (upstream `models/distilbert`): `DistilBertConfig`, `DistilBertModel`,
//! `DistilBertForMaskedLM`, `DistilBertForSequenceClassification`,
//! `DistilBertForTokenClassification`.
//!
//! BERT's post-LayerNorm encoder without token types or pooler: word and learned position
//! embeddings, layers of `q_lin` / `k_lin` / `v_lin` / `out_lin` attention (SDPA, as
//! upstream's default) and `lin1` / `lin2` feed-forward, each added to its input and
//! normalised (`eps` 1e-12); the masked LM's `vocab_transform` / `vocab_layer_norm` /
//! `vocab_projector` (tied), the sequence classifier's `pre_classifier` → ReLU → dropout
//! (`seq_classif_dropout`) → `classifier` on the first token. The heads compute a plain mean
//! cross-entropy (their forward builds `CrossEntropyLoss()`), ignoring `num_items_in_batch`.

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
use crate::padding_free::{self, Unpadded};
use crate::{Error, Result};
use tchtrain_nn::{Activation, Context, Embedding, LayerNorm, Linear, ModuleRepr};

/// Upstream `DistilBertConfig` with its defaults (DistilBERT base).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct DistilBertConfig {
    pub vocab_size: i64,
    pub max_position_embeddings: i64,
    /// Fixed sinusoidal position embeddings: refused (not implemented here).
    pub sinusoidal_pos_embds: bool,
    pub n_layers: i64,
    pub n_heads: i64,
    pub dim: i64,
    pub hidden_dim: i64,
    pub dropout: f64,
    pub attention_dropout: f64,
    pub activation: String,
    pub initializer_range: f64,
    pub qa_dropout: f64,
    pub seq_classif_dropout: f64,
    pub pad_token_id: Option<i64>,
    pub eos_token_id: Option<serde_json::Value>,
    pub bos_token_id: Option<i64>,
    pub tie_word_embeddings: bool,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Default for DistilBertConfig {
    fn default() -> Self {
        Self {
            vocab_size: 30522,
            max_position_embeddings: 512,
            sinusoidal_pos_embds: false,
            n_layers: 6,
            n_heads: 12,
            dim: 768,
            hidden_dim: 4 * 768,
            dropout: 0.1,
            attention_dropout: 0.1,
            activation: "gelu".into(),
            initializer_range: 0.02,
            qa_dropout: 0.1,
            seq_classif_dropout: 0.2,
            pad_token_id: Some(0),
            eos_token_id: None,
            bos_token_id: None,
            tie_word_embeddings: true,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

impl PretrainedConfig for DistilBertConfig {
    fn model_type(&self) -> &'static str {
        "distilbert"
    }
    fn to_json_value(&self) -> Result<serde_json::Value> {
        configuration_utils::to_value(self)
    }
    fn labels(&self) -> &LabelConfig {
        &self.labels
    }
}

/// DistilBERT's LayerNorms all use 1e-12.
const EPS: f64 = 1e-12;

impl DistilBertConfig {
    /// Reads and checks `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let c: Self = configuration_utils::read_config(path)?;
        c.validate()?;
        Ok(c)
    }

    fn validate(&self) -> Result<()> {
        configuration_utils::check_sizes(
            &[
                ("vocab_size", self.vocab_size),
                ("dim", self.dim),
                ("hidden_dim", self.hidden_dim),
                ("max_position_embeddings", self.max_position_embeddings),
            ],
            ("n_layers", self.n_layers),
        )?;
        if self.n_heads <= 0 || self.dim % self.n_heads != 0 {
            return Err(Error::InvalidConfig {
                field: "n_heads",
                value: format!("{} (dim {})", self.n_heads, self.dim),
                fix: "dim must be divisible by n_heads (upstream's check)",
            });
        }
        if self.sinusoidal_pos_embds {
            return Err(Error::InvalidConfig {
                field: "sinusoidal_pos_embds",
                value: "true".into(),
                fix: "fixed sinusoidal position embeddings are not implemented here; use a checkpoint with learned ones (the default)",
            });
        }
        configuration_utils::check_padding_idx(self.pad_token_id, self.vocab_size)?;
        Activation::parse(&self.activation, "activation")?;
        Ok(())
    }
}

#[derive(Debug)]
struct Layer {
    ctx: Context,
    q_lin: Linear,
    k_lin: Linear,
    v_lin: Linear,
    out_lin: Linear,
    sa_layer_norm: LayerNorm,
    lin1: Linear,
    lin2: Linear,
    output_layer_norm: LayerNorm,
    /// `distilbert.transformer.layer.{i}`, as the underflow / overflow tracer names it.
    name: String,
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
    attn_p: f64,
    dropout: f64,
    train: bool,
    act: Activation,
    /// The padding-free layout, when the layers run on the real tokens only.
    unpadded: Option<Unpadded>,
}

// SAFETY: parameter tensors and plain values that the forward only reads.
#[allow(unsafe_code)]
unsafe impl ReadOnlyLayer for LayerInputs {}

impl Layer {
    /// Upstream `TransformerBlock.forward`: `sa_layer_norm(attention + h)`, then
    /// `output_layer_norm(ffn + that)`.
    fn forward(&self, h: &Tensor, x: &LayerInputs) -> Tensor {
        let LayerInputs {
            batch,
            seq,
            heads,
            head_dim,
            ..
        } = *x;
        let n = |rest: &str| format!("{}.{rest}", self.name);
        let unpadded = x.unpadded.as_ref();
        let to_heads = |t: Tensor| {
            padding_free::padded(unpadded, t)
                .view([batch, seq, heads, head_dim])
                .transpose(1, 2)
        };
        let q = self.q_lin.forward(h);
        let k = self.k_lin.forward(h);
        let v = self.v_lin.forward(h);
        let a = attention::sdpa(
            &to_heads(q),
            &to_heads(k),
            &to_heads(v),
            &x.mask,
            x.attn_p,
            (head_dim as f64).powf(-0.5),
        );
        let a = padding_free::unpadded(
            unpadded,
            a.transpose(1, 2).reshape([batch, seq, heads * head_dim]),
        );
        let a = self.out_lin.forward(&a);
        let a = self.sa_layer_norm.forward(&(a + h));
        let f = self.lin1.forward(&a);
        let f = x.act.apply_traced(&self.ctx, &f, || n("ffn.activation"));
        let f = self.lin2.forward(&f);
        let f = padding_free::dropout_traced(&self.ctx, unpadded, &f, x.dropout, x.train, || {
            n("ffn.dropout")
        });
        let out = self.output_layer_norm.forward(&(f + &a));
        self.ctx
            .leaf(|| self.name.clone(), "TransformerBlock", &[], h, &out);
        out
    }
}

/// Upstream `DistilBertModel`: embeddings and the transformer.
#[derive(Debug)]
pub struct DistilBertModel {
    ctx: Context,
    /// Where it sits in its model (`distilbert`; empty for `DistilBertModel` itself).
    prefix: String,
    word_embeddings: Embedding,
    position_embeddings: Embedding,
    embeddings_ln: LayerNorm,
    layers: Vec<Arc<Shared<Layer>>>,
    act: Activation,
    config: DistilBertConfig,
    /// Upstream's `gradient_checkpointing` on the layers.
    pub(crate) checkpointing: Option<ActivationCheckpointing>,
}

impl DistilBertModel {
    /// Creates the variables under `p` (upstream prefix `distilbert`, or the root).
    pub fn new(p: tchtrain_nn::Path<'_>, config: &DistilBertConfig) -> Result<Self> {
        config.validate()?;
        let (d, std) = (config.dim, config.initializer_range);
        let e = &p / "embeddings";
        let word_embeddings = Embedding::with_padding(
            &e / "word_embeddings",
            config.vocab_size,
            d,
            std,
            config.pad_token_id,
        );
        let position_embeddings = Embedding::new(
            &e / "position_embeddings",
            config.max_position_embeddings,
            d,
            std,
        );
        let embeddings_ln = LayerNorm::new(&e / "LayerNorm", d, EPS);
        let layers = (0..config.n_layers)
            .map(|i| {
                let l = &p / "transformer" / "layer" / i;
                let a = &l / "attention";
                let linear =
                    |p: tchtrain_nn::Path<'_>, i: i64, o: i64| Linear::in_layer(p, i, o, true, std);
                Arc::new(Shared(Layer {
                    q_lin: linear(&a / "q_lin", d, d),
                    k_lin: linear(&a / "k_lin", d, d),
                    v_lin: linear(&a / "v_lin", d, d),
                    out_lin: linear(&a / "out_lin", d, d),
                    sa_layer_norm: LayerNorm::new(&l / "sa_layer_norm", d, EPS),
                    lin1: linear(&l / "ffn" / "lin1", d, config.hidden_dim),
                    lin2: linear(&l / "ffn" / "lin2", config.hidden_dim, d),
                    output_layer_norm: LayerNorm::new(&l / "output_layer_norm", d, EPS),
                    name: l.name(),
                    ctx: l.ctx().clone(),
                }))
            })
            .collect();
        Ok(Self {
            prefix: p.name(),
            ctx: p.ctx().clone(),
            word_embeddings,
            position_embeddings,
            embeddings_ln,
            layers,
            act: Activation::parse(&config.activation, "activation")?,
            config: config.clone(),
            checkpointing: None,
        })
    }

    /// The word embedding matrix (tied to the masked LM's `vocab_projector`).
    pub fn word_embeddings(&self) -> &Tensor {
        &self.word_embeddings.ws
    }

    /// The last hidden state `[batch, seq, dim]`.
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
        let (batch, seq) = crate::check_ids(ids, c.vocab_size, c.max_position_embeddings)?;
        let device = self.word_embeddings.ws.device();
        let ids = ids.f_to_device(device)?;
        let positions = match inputs.position_ids {
            Some(p) => p.f_to_device(device)?,
            None => Tensor::arange(seq, (Kind::Int64, device)).unsqueeze(0),
        };
        let n = |rest: &str| join(&self.prefix, rest);
        let words = self.word_embeddings.input_forward(
            &ids,
            self.word_embeddings.lookup(&ids),
            None,
            train,
        )?;
        let position = self.position_embeddings.forward(&positions);
        let h = self.embeddings_ln.forward(&(words + position));
        let mut h = tchtrain_nn::dropout_traced(&self.ctx, &h, c.dropout, train, || {
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
        let x = Arc::new(Shared(LayerInputs {
            mask: attention::attention_mask(inputs.attention_mask, batch, seq, false, device),
            batch,
            seq,
            heads: c.n_heads,
            head_dim: c.dim / c.n_heads,
            attn_p: if train { c.attention_dropout } else { 0.0 },
            dropout: c.dropout,
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
        Ok(h)
    }
}

/// Which head sits on the body.
#[derive(Debug)]
pub enum Head {
    /// The base model's: none.
    None,
    /// `vocab_transform`, the activation, `vocab_layer_norm`, `vocab_projector` (weight tied
    /// to the word embeddings, its own bias).
    MaskedLm {
        vocab_transform: Linear,
        vocab_layer_norm: LayerNorm,
        projector_bias: Tensor,
    },
    /// `pre_classifier`, ReLU, dropout, `classifier` on the first token.
    SequenceClassification {
        pre_classifier: Linear,
        classifier: Linear,
    },
    /// Dropout and `classifier` on every token.
    TokenClassification { classifier: Linear },
    /// Dropout (`qa_dropout`) and `qa_outputs` on every token: the start and end logits.
    QuestionAnswering { qa_outputs: Linear },
}

/// A DistilBERT model with one of upstream's heads; use the type aliases.
pub type DistilBert<K> = EncoderFor<DistilBertConfig, K>;

/// Upstream `DistilBertModel` as a standalone model (weights at the root).
pub type DistilBertBaseModel = DistilBert<heads::Base>;
/// Upstream `DistilBertForMaskedLM`.
pub type DistilBertForMaskedLM = DistilBert<heads::MaskedLm>;
/// Upstream `DistilBertForSequenceClassification`.
pub type DistilBertForSequenceClassification = DistilBert<heads::SequenceClassification>;
/// Upstream `DistilBertForTokenClassification`.
pub type DistilBertForTokenClassification = DistilBert<heads::TokenClassification>;
/// Upstream `DistilBertForQuestionAnswering`.
pub type DistilBertForQuestionAnswering = DistilBert<heads::QuestionAnswering>;

impl EncoderArchitecture for DistilBertConfig {
    type Body = DistilBertModel;
    type Head = Head;

    fn config_from_file(path: &Path) -> Result<Self> {
        Self::from_file(path)
    }
    fn labels_mut(&mut self) -> &mut LabelConfig {
        &mut self.labels
    }
    fn extra_mut(&mut self) -> &mut serde_json::Map<String, serde_json::Value> {
        &mut self.extra
    }
    fn tie_word_embeddings(&self) -> bool {
        self.tie_word_embeddings
    }
    fn base_model_prefix(&self) -> &'static str {
        "distilbert"
    }
    fn classes(&self) -> [&'static str; 5] {
        [
            "DistilBertModel",
            "DistilBertForMaskedLM",
            "DistilBertForSequenceClassification",
            "DistilBertForTokenClassification",
            "DistilBertForQuestionAnswering",
        ]
    }
    fn build(
        &self,
        kind: HeadKind,
        root: &tchtrain_nn::Path<'_>,
        body: tchtrain_nn::Path<'_>,
    ) -> Result<(DistilBertModel, Head)> {
        let config = self;
        let distilbert = DistilBertModel::new(body, config)?;
        let (d, std, n) = (
            config.dim,
            config.initializer_range,
            config.labels.num_labels(),
        );
        let head = match kind {
            HeadKind::MaskedLm => {
                let vocab_transform = Linear::new(root / "vocab_transform", d, d, true, std);
                let vocab_layer_norm = LayerNorm::new(root / "vocab_layer_norm", d, EPS);
                let projector_bias = tchtrain_nn::initialization::var(
                    &(root / "vocab_projector"),
                    "bias",
                    &[config.vocab_size],
                    nn::Init::Const(0.0),
                );
                Head::MaskedLm {
                    vocab_transform,
                    vocab_layer_norm,
                    projector_bias,
                }
            }
            HeadKind::SequenceClassification => Head::SequenceClassification {
                pre_classifier: Linear::new(root / "pre_classifier", d, d, true, std),
                classifier: Linear::new(root / "classifier", d, n, true, std),
            },
            HeadKind::TokenClassification => Head::TokenClassification {
                classifier: Linear::new(root / "classifier", d, n, true, std),
            },
            HeadKind::QuestionAnswering => {
                // Upstream raises after building `qa_outputs` with `num_labels` outputs.
                crate::modeling_utils::check_question_answering_labels(n)?;
                Head::QuestionAnswering {
                    qa_outputs: Linear::new(root / "qa_outputs", d, n, true, std),
                }
            }
            HeadKind::Base => Head::None,
        };
        Ok((distilbert, head))
    }
    fn checkpointing(body: &mut DistilBertModel) -> &mut Option<ActivationCheckpointing> {
        &mut body.checkpointing
    }
    fn is_checkpointing(body: &DistilBertModel) -> bool {
        body.checkpointing.is_some()
    }
    fn is_embedding_weight(&self, name: &str) -> bool {
        matches!(
            name,
            "embeddings.word_embeddings.weight" | "embeddings.position_embeddings.weight"
        )
    }
    /// What `print(model)` shows: `DistilBertModel` (`Embeddings`, `Transformer` of
    /// `TransformerBlock`s) and the head in upstream's registration order (the masked LM's
    /// `activation` first, its `mlm_loss_fct` last).
    fn module_repr(&self, kind: HeadKind, body: &DistilBertModel) -> Option<ModuleRepr> {
        let (d, eps) = (self.dim, 1e-12);
        let ln = || ModuleRepr::layer_norm(d, eps, true, true);
        let act = || ModuleRepr::new(body.act.class_name());
        let block = ModuleRepr::new("TransformerBlock")
            .child(
                "attention",
                ModuleRepr::new("DistilBertSelfAttention")
                    .child("q_lin", ModuleRepr::linear(d, d, true))
                    .child("k_lin", ModuleRepr::linear(d, d, true))
                    .child("v_lin", ModuleRepr::linear(d, d, true))
                    .child("out_lin", ModuleRepr::linear(d, d, true))
                    .child("dropout", ModuleRepr::dropout(self.attention_dropout)),
            )
            .child("sa_layer_norm", ln())
            .child(
                "ffn",
                ModuleRepr::new("FFN")
                    .child("dropout", ModuleRepr::dropout(self.dropout))
                    .child("lin1", ModuleRepr::linear(d, self.hidden_dim, true))
                    .child("lin2", ModuleRepr::linear(self.hidden_dim, d, true))
                    .child("activation", act()),
            )
            .child("output_layer_norm", ln());
        let model = ModuleRepr::new("DistilBertModel")
            .child(
                "embeddings",
                ModuleRepr::new("Embeddings")
                    .child(
                        "word_embeddings",
                        ModuleRepr::embedding(self.vocab_size, d, self.pad_token_id),
                    )
                    .child(
                        "position_embeddings",
                        ModuleRepr::embedding(self.max_position_embeddings, d, None),
                    )
                    .child("LayerNorm", ln())
                    .child("dropout", ModuleRepr::dropout(self.dropout)),
            )
            .child(
                "transformer",
                ModuleRepr::new("Transformer").child(
                    "layer",
                    ModuleRepr::module_list(vec![block; body.layers.len()]),
                ),
            );
        let labels = self.labels.num_labels();
        let root = ModuleRepr::new(kind.class(&self.classes()));
        Some(match kind {
            HeadKind::Base => model,
            HeadKind::MaskedLm => root
                .child("activation", act())
                .child("distilbert", model)
                .child("vocab_transform", ModuleRepr::linear(d, d, true))
                .child("vocab_layer_norm", ln())
                .child(
                    "vocab_projector",
                    ModuleRepr::linear(d, self.vocab_size, true),
                )
                .child("mlm_loss_fct", ModuleRepr::new("CrossEntropyLoss")),
            HeadKind::SequenceClassification => root
                .child("distilbert", model)
                .child("pre_classifier", ModuleRepr::linear(d, d, true))
                .child("classifier", ModuleRepr::linear(d, labels, true))
                .child("dropout", ModuleRepr::dropout(self.seq_classif_dropout)),
            HeadKind::TokenClassification => root
                .child("distilbert", model)
                .child("dropout", ModuleRepr::dropout(self.dropout))
                .child("classifier", ModuleRepr::linear(d, labels, true)),
            HeadKind::QuestionAnswering => root
                .child("distilbert", model)
                .child("qa_outputs", ModuleRepr::linear(d, 2, true))
                .child("dropout", ModuleRepr::dropout(self.qa_dropout)),
        })
    }
    fn tied_weights(&self, kind: HeadKind) -> Vec<(String, String)> {
        match kind {
            HeadKind::MaskedLm => vec![(
                "vocab_projector.weight".into(),
                "distilbert.embeddings.word_embeddings.weight".into(),
            )],
            _ => vec![],
        }
    }
    fn forward(
        &self,
        _kind: HeadKind,
        distilbert: &DistilBertModel,
        head: &Head,
        ctx: &Context,
        inputs: &ModelInputs<'_>,
        train: bool,
        padding_free: bool,
    ) -> Result<ModelOutput> {
        use tchtrain_nn::dropout_traced;
        let h = distilbert.forward_with(inputs, train, padding_free)?;
        let c = self;
        let num_labels = c.labels.num_labels();
        let (logits, loss) = match head {
            Head::None => (h.shallow_clone(), None),
            Head::MaskedLm {
                vocab_transform,
                vocab_layer_norm,
                projector_bias,
            } => {
                let t = vocab_transform.forward(&h);
                let t = distilbert.act.apply_traced(ctx, &t, || "activation".into());
                let t = vocab_layer_norm.forward(&t);
                let weight = distilbert.word_embeddings();
                let logits = t.linear(weight, Some(projector_bias));
                let decoder = [("weight", weight), ("bias", projector_bias)];
                ctx.leaf(|| "vocab_projector".into(), "Linear", &decoder, &t, &logits);
                let loss = heads::masked_lm_loss(&logits, inputs.labels, c.vocab_size, None)?;
                (logits, loss)
            }
            Head::SequenceClassification {
                pre_classifier,
                classifier,
            } => {
                let pooled = h.select(1, 0);
                let t = pre_classifier.forward(&pooled).relu();
                let t = dropout_traced(ctx, &t, c.seq_classif_dropout, train, || "dropout".into());
                let logits = classifier.forward(&t);
                let loss = heads::sequence_classification_loss(&logits, inputs, &c.labels)?;
                (logits, loss)
            }
            Head::TokenClassification { classifier } => {
                let t = dropout_traced(ctx, &h, c.dropout, train, || "dropout".into());
                let logits = classifier.forward(&t);
                let loss = heads::token_classification_loss(&logits, inputs, num_labels)?;
                (logits, loss)
            }
            Head::QuestionAnswering { qa_outputs } => {
                let t = dropout_traced(ctx, &h, c.qa_dropout, train, || "dropout".into());
                let logits = qa_outputs.forward(&t);
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

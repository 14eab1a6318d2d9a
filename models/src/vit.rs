//! ViT (upstream `models/vit`, transformers 5.23): `ViTConfig`, `ViTModel`,
//! `ViTForImageClassification`.
//!
//! The image cut into `patch_size` squares by a strided convolution (`patch_embeddings
//! .projection`), a learned `cls_token` put first, learned `position_embeddings` added,
//! dropout; pre-LayerNorm layers (`layernorm_before` → attention (SDPA, as upstream's default)
//! → dropout → residual, `layernorm_after` → `fc1` → activation → `fc2` → dropout → residual);
//! the final `layernorm`; `ViTModel`'s pooler (`dense` + tanh on the first token); the image
//! classifier's `classifier` on the first token, its loss upstream's `ForImageClassification`
//! (the sequence classifier's: regression, single- or multi-label by `problem_type`).
//!
//! Variables carry the names checkpoints have on disk (`vit.encoder.layer.{i}.attention
//! .attention.query`, ..., which transformers 5 renames to `vit.layers.{i}.attention.q_proj`
//! in memory and back when saving), created in upstream's in-memory order (`q`, `k`, `v`, `o`,
//! `layernorm_before`, `layernorm_after`, `fc1`, `fc2`) so that `model.parameters()` — and
//! gradient clipping's sum of norms — follow upstream's. Position embeddings at another image
//! size (`interpolate_pos_encoding`) and masked image modeling are refused.

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tch::Tensor;
use tch::nn::Init;

use crate::attention;
use crate::checkpoint::{ActivationCheckpointing, ReadOnlyLayer, Shared, run_layers};
use crate::configuration_utils::{self, LabelConfig, PretrainedConfig};
use crate::encoder::{EncoderArchitecture, EncoderFor};
use crate::heads::{self, HeadKind};
use crate::modeling_utils::{ModelInputs, ModelOutput};
use crate::padding_free::EncoderHead;
use crate::{Error, Result};
use tchtrain_nn::{Activation, Context, LayerNorm, Linear, ModuleRepr};

/// `image_size` / `patch_size`: one side, or `[height, width]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Size2 {
    /// A square.
    Square(i64),
    /// `[height, width]`.
    Pair([i64; 2]),
}

impl Size2 {
    /// `(height, width)`.
    pub fn hw(self) -> (i64, i64) {
        match self {
            Self::Square(s) => (s, s),
            Self::Pair([h, w]) => (h, w),
        }
    }
}

/// Upstream `ViTConfig` with its defaults (ViT-Base/16 at 224).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct ViTConfig {
    pub hidden_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub intermediate_size: i64,
    pub hidden_act: String,
    pub hidden_dropout_prob: f64,
    pub attention_probs_dropout_prob: f64,
    pub initializer_range: f64,
    pub layer_norm_eps: f64,
    pub image_size: Size2,
    pub patch_size: Size2,
    pub num_channels: i64,
    pub qkv_bias: bool,
    pub encoder_stride: i64,
    /// The pooler's width (`None`: `hidden_size`, as upstream's `__post_init__` sets it).
    pub pooler_output_size: Option<i64>,
    pub pooler_act: String,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Default for ViTConfig {
    fn default() -> Self {
        Self {
            hidden_size: 768,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            intermediate_size: 3072,
            hidden_act: "gelu".into(),
            hidden_dropout_prob: 0.0,
            attention_probs_dropout_prob: 0.0,
            initializer_range: 0.02,
            layer_norm_eps: 1e-12,
            image_size: Size2::Square(224),
            patch_size: Size2::Square(16),
            num_channels: 3,
            qkv_bias: true,
            encoder_stride: 16,
            pooler_output_size: None,
            pooler_act: "tanh".into(),
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

impl PretrainedConfig for ViTConfig {
    fn model_type(&self) -> &'static str {
        "vit"
    }
    fn to_json_value(&self) -> Result<serde_json::Value> {
        let mut c = self.clone();
        c.pooler_output_size = Some(self.pooler_width());
        configuration_utils::to_value(&c)
    }
    fn labels(&self) -> &LabelConfig {
        &self.labels
    }
}

impl ViTConfig {
    /// Reads and checks `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let c: Self = configuration_utils::read_config(path)?;
        c.validate()?;
        Ok(c)
    }

    fn pooler_width(&self) -> i64 {
        self.pooler_output_size
            .filter(|&n| n > 0)
            .unwrap_or(self.hidden_size)
    }

    /// Patches per image: `(height / patch) · (width / patch)`.
    pub fn num_patches(&self) -> i64 {
        let (h, w) = self.image_size.hw();
        let (ph, pw) = self.patch_size.hw();
        (h / ph) * (w / pw)
    }

    fn validate(&self) -> Result<()> {
        let (h, w) = self.image_size.hw();
        let (ph, pw) = self.patch_size.hw();
        configuration_utils::check_sizes(
            &[
                ("hidden_size", self.hidden_size),
                ("intermediate_size", self.intermediate_size),
                ("num_channels", self.num_channels),
                ("image_size", h.min(w)),
                ("patch_size", ph.min(pw)),
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
        Activation::parse(&self.hidden_act, "hidden_act")?;
        Activation::parse(&self.pooler_act, "pooler_act")?;
        Ok(())
    }
}

#[derive(Debug)]
struct Layer {
    ctx: Context,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    layernorm_before: LayerNorm,
    layernorm_after: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    /// `vit.encoder.layer.{i}`, as the underflow / overflow tracer names it.
    name: String,
}

// SAFETY: parameter tensors and plain values that the forward only reads.
#[allow(unsafe_code)]
unsafe impl ReadOnlyLayer for Layer {}

/// What a layer's forward needs besides the hidden states.
struct LayerInputs {
    heads: i64,
    head_dim: i64,
    attn_p: f64,
    dropout: f64,
    train: bool,
    act: Activation,
}

// SAFETY: plain values that the forward only reads.
#[allow(unsafe_code)]
unsafe impl ReadOnlyLayer for LayerInputs {}

impl Layer {
    /// Upstream `ViTLayer.forward`.
    fn forward(&self, h: &Tensor, x: &LayerInputs) -> Tensor {
        let n = |rest: &str| format!("{}.{rest}", self.name);
        let (batch, seq) = (h.size()[0], h.size()[1]);
        let t = self.layernorm_before.forward(h);
        let to_heads = |t: Tensor| t.view([batch, seq, -1, x.head_dim]).transpose(1, 2);
        let a = attention::sdpa(
            &to_heads(self.q.forward(&t)),
            &to_heads(self.k.forward(&t)),
            &to_heads(self.v.forward(&t)),
            &attention::Mask::none(),
            x.attn_p,
            (x.head_dim as f64).powf(-0.5),
        );
        let a = a
            .transpose(1, 2)
            .contiguous()
            .reshape([batch, seq, x.heads * x.head_dim]);
        let a = self.o.forward(&a);
        let a = tchtrain_nn::dropout_traced(&self.ctx, &a, x.dropout, x.train, || n("dropout"));
        let h1 = a + h;
        let f = self.layernorm_after.forward(&h1);
        let f = self.fc1.forward(&f);
        let f = x.act.apply_traced(&self.ctx, &f, || n("mlp.activation_fn"));
        let f = self.fc2.forward(&f);
        let f = tchtrain_nn::dropout_traced(&self.ctx, &f, x.dropout, x.train, || n("dropout"));
        let out = f + &h1;
        self.ctx
            .leaf(|| self.name.clone(), "ViTLayer", &[], h, &out);
        out
    }
}

/// Upstream `ViTModel`: embeddings, layers, the final LayerNorm (and, for the base model,
/// the pooler).
#[derive(Debug)]
pub struct ViTModel {
    ctx: Context,
    prefix: String,
    cls_token: Tensor,
    position_embeddings: Tensor,
    projection_weight: Tensor,
    projection_bias: Tensor,
    layers: Vec<Arc<Shared<Layer>>>,
    layernorm: LayerNorm,
    pooler: Option<Linear>,
    act: Activation,
    pooler_act: Activation,
    config: ViTConfig,
    /// Upstream's `gradient_checkpointing` on the layers.
    pub(crate) checkpointing: Option<ActivationCheckpointing>,
}

impl ViTModel {
    /// Creates the variables under `p` (upstream prefix `vit`, or the root), with the pooler
    /// when `add_pooling_layer`.
    pub fn new(
        p: tchtrain_nn::Path<'_>,
        config: &ViTConfig,
        add_pooling_layer: bool,
    ) -> Result<Self> {
        config.validate()?;
        let (d, std) = (config.hidden_size, config.initializer_range);
        let e = &p / "embeddings";
        // Upstream: a truncated normal at ±2 (which ±100σ never reaches); drawn here from
        // N(0, std), not upstream's draws.
        let normal = Init::Randn {
            mean: 0.0,
            stdev: std,
        };
        let cls_token = tchtrain_nn::initialization::var(&e, "cls_token", &[1, 1, d], normal);
        let position_embeddings = tchtrain_nn::initialization::var(
            &e,
            "position_embeddings",
            &[1, config.num_patches() + 1, d],
            normal,
        );
        let (ph, pw) = config.patch_size.hw();
        let proj = &e / "patch_embeddings" / "projection";
        let projection_weight = tchtrain_nn::initialization::var(
            &proj,
            "weight",
            &[d, config.num_channels, ph, pw],
            tchtrain_nn::initialization::normal(std),
        );
        let projection_bias =
            tchtrain_nn::initialization::var(&proj, "bias", &[d], Init::Const(0.0));
        let eps = config.layer_norm_eps;
        let layers = (0..config.num_hidden_layers)
            .map(|i| {
                let l = &p / "encoder" / "layer" / i;
                let a = &l / "attention";
                let linear = |p: tchtrain_nn::Path<'_>, i: i64, o: i64, bias: bool| {
                    Linear::in_layer(p, i, o, bias, std)
                };
                let qkv = config.qkv_bias;
                Arc::new(Shared(Layer {
                    q: linear(&a / "attention" / "query", d, d, qkv),
                    k: linear(&a / "attention" / "key", d, d, qkv),
                    v: linear(&a / "attention" / "value", d, d, qkv),
                    o: linear(&a / "output" / "dense", d, d, true),
                    layernorm_before: LayerNorm::new(&l / "layernorm_before", d, eps),
                    layernorm_after: LayerNorm::new(&l / "layernorm_after", d, eps),
                    fc1: linear(
                        &l / "intermediate" / "dense",
                        d,
                        config.intermediate_size,
                        true,
                    ),
                    fc2: linear(&l / "output" / "dense", config.intermediate_size, d, true),
                    name: l.name(),
                    ctx: l.ctx().clone(),
                }))
            })
            .collect();
        let layernorm = LayerNorm::new(&p / "layernorm", d, eps);
        let pooler = add_pooling_layer
            .then(|| Linear::new(&p / "pooler" / "dense", d, config.pooler_width(), true, std));
        Ok(Self {
            prefix: p.name(),
            ctx: p.ctx().clone(),
            cls_token,
            position_embeddings,
            projection_weight,
            projection_bias,
            layers,
            layernorm,
            pooler,
            act: Activation::parse(&config.hidden_act, "hidden_act")?,
            pooler_act: Activation::parse(&config.pooler_act, "pooler_act")?,
            config: config.clone(),
            checkpointing: None,
        })
    }

    /// The last hidden state `[batch, 1 + patches, hidden]` of `pixel_values` `[batch,
    /// channels, height, width]`.
    pub fn forward(&self, inputs: &ModelInputs<'_>, train: bool) -> Result<Tensor> {
        let c = &self.config;
        let pixel_values = inputs.pixel_values.ok_or(Error::MissingInput {
            name: "pixel_values",
        })?;
        let size = pixel_values.size();
        let (h, w) = c.image_size.hw();
        if size.len() != 4 || size[1] != c.num_channels {
            return Err(Error::InvalidInput {
                name: "pixel_values",
                detail: format!(
                    "Make sure that the channel dimension of the pixel values match with the one set in the configuration. Expected {} but got {:?} (upstream's message; [batch, channels, height, width])",
                    c.num_channels, size
                ),
            });
        }
        if size[2] != h || size[3] != w {
            return Err(Error::InvalidInput {
                name: "pixel_values",
                detail: format!(
                    "Input image size ({}*{}) doesn't match model ({h}*{w}). (upstream's message; interpolate_pos_encoding is not implemented here)",
                    size[2], size[3]
                ),
            });
        }
        let device = self.projection_weight.device();
        let pixel_values = pixel_values
            .f_to_device(device)?
            .f_to_kind(self.projection_weight.kind())?;
        let (ph, pw) = c.patch_size.hw();
        let patches = pixel_values
            .f_conv2d(
                &self.projection_weight,
                Some(&self.projection_bias),
                [ph, pw],
                [0, 0],
                [1, 1],
                1,
            )?
            .f_flatten(2, -1)?
            .f_transpose(1, 2)?;
        let batch = size[0];
        let cls = self.cls_token.f_expand([batch, -1, -1], false)?;
        let embeddings = Tensor::f_cat(&[&cls, &patches], 1)?.f_add(&self.position_embeddings)?;
        let n = |rest: &str| tchtrain_nn::join(&self.prefix, rest);
        let h0 = tchtrain_nn::dropout_traced(
            &self.ctx,
            &embeddings,
            c.hidden_dropout_prob,
            train,
            || n("embeddings.dropout"),
        );
        let x = Arc::new(Shared(LayerInputs {
            heads: c.num_attention_heads,
            head_dim: c.hidden_size / c.num_attention_heads,
            attn_p: if train {
                c.attention_probs_dropout_prob
            } else {
                0.0
            },
            dropout: c.hidden_dropout_prob,
            train,
            act: self.act,
        }));
        let h = run_layers(
            &self.ctx,
            &self.layers,
            &x,
            None,
            self.checkpointing.as_ref(),
            train,
            h0,
            |l, h, _, x| Ok(l.forward(h, x)),
        )?;
        Ok(self.layernorm.forward(&h))
    }

    /// `ViTPooler`: `dense` and the activation on the first token (the base model's).
    fn pool(&self, h: &Tensor) -> Option<Tensor> {
        let dense = self.pooler.as_ref()?;
        let first = h.select(1, 0);
        Some(
            self.pooler_act
                .apply_traced(&self.ctx, &dense.forward(&first), || {
                    tchtrain_nn::join(&self.prefix, "pooler.activation")
                }),
        )
    }
}

/// Which head sits on the body.
#[derive(Debug)]
pub enum Head {
    /// The base model's: none (the pooler is the body's).
    None,
    /// `classifier` on the first token.
    ImageClassification {
        /// `nn.Linear(hidden_size, num_labels)`.
        classifier: Linear,
    },
}

/// A ViT model with one of upstream's heads; use the type aliases.
pub type ViT<K> = EncoderFor<ViTConfig, K>;

/// Upstream `ViTModel` as a standalone model (weights at the root, with the pooler).
pub type ViTBaseModel = ViT<heads::Base>;
/// Upstream `ViTForImageClassification` (the sequence-classification slot of the encoder
/// families: one label set per image).
pub type ViTForImageClassification = ViT<heads::SequenceClassification>;

impl EncoderArchitecture for ViTConfig {
    type Body = ViTModel;
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
        false
    }
    fn base_model_prefix(&self) -> &'static str {
        "vit"
    }
    fn classes(&self) -> [&'static str; 5] {
        [
            "ViTModel",
            "ViTForMaskedImageModeling",
            "ViTForImageClassification",
            "ViTForTokenClassification",
            "ViTForQuestionAnswering",
        ]
    }
    fn main_input_name(&self) -> &'static str {
        "pixel_values"
    }
    fn encoder_head(&self, _kind: HeadKind) -> EncoderHead {
        EncoderHead::AllPositions
    }
    fn build(
        &self,
        kind: HeadKind,
        root: &tchtrain_nn::Path<'_>,
        body: tchtrain_nn::Path<'_>,
    ) -> Result<(ViTModel, Head)> {
        let head = match kind {
            HeadKind::Base => {
                return Ok((ViTModel::new(body, self, true)?, Head::None));
            }
            HeadKind::SequenceClassification => {
                let vit = ViTModel::new(body, self, false)?;
                let classifier = Linear::new(
                    root / "classifier",
                    self.hidden_size,
                    self.labels.num_labels(),
                    true,
                    self.initializer_range,
                );
                return Ok((vit, Head::ImageClassification { classifier }));
            }
            other => other,
        };
        Err(Error::InvalidConfig {
            field: "architectures",
            value: format!("{head:?}"),
            fix: "ViT takes ViTModel and ViTForImageClassification here (masked image modeling is not implemented)",
        })
    }
    fn checkpointing(body: &mut ViTModel) -> &mut Option<ActivationCheckpointing> {
        &mut body.checkpointing
    }
    fn is_checkpointing(body: &ViTModel) -> bool {
        body.checkpointing.is_some()
    }
    /// None: `cls_token` and `position_embeddings` are plain parameters, not `nn.Embedding`
    /// weights, so upstream's `num_parameters(exclude_embeddings=True)` counts them.
    fn is_embedding_weight(&self, _name: &str) -> bool {
        false
    }
    /// What `print(model)` shows: `ViTModel` (the patch projection a `Conv2d`, the pooler
    /// for the base model) and the image classifier.
    fn module_repr(&self, kind: HeadKind, body: &ViTModel) -> Option<ModuleRepr> {
        let h = self.hidden_size;
        let ln = || ModuleRepr::layer_norm(h, self.layer_norm_eps, true, true);
        let (ph, pw) = self.patch_size.hw();
        let layer = ModuleRepr::new("ViTLayer")
            .child(
                "attention",
                ModuleRepr::new("ViTAttention")
                    .child("q_proj", ModuleRepr::linear(h, h, self.qkv_bias))
                    .child("k_proj", ModuleRepr::linear(h, h, self.qkv_bias))
                    .child("v_proj", ModuleRepr::linear(h, h, self.qkv_bias))
                    .child("o_proj", ModuleRepr::linear(h, h, true)),
            )
            .child("layernorm_before", ln())
            .child("layernorm_after", ln())
            .child(
                "mlp",
                ModuleRepr::new("ViTMLP")
                    .child("activation_fn", ModuleRepr::new(body.act.class_name()))
                    .child("fc1", ModuleRepr::linear(h, self.intermediate_size, true))
                    .child("fc2", ModuleRepr::linear(self.intermediate_size, h, true)),
            )
            .child("dropout", ModuleRepr::dropout(self.hidden_dropout_prob));
        let mut model = ModuleRepr::new("ViTModel")
            .child(
                "embeddings",
                ModuleRepr::new("ViTEmbeddings")
                    .child(
                        "patch_embeddings",
                        ModuleRepr::new("ViTPatchEmbeddings").child(
                            "projection",
                            ModuleRepr::with_extra(
                                "Conv2d",
                                format!(
                                    "{}, {h}, kernel_size=({ph}, {pw}), stride=({ph}, {pw})",
                                    self.num_channels
                                ),
                            ),
                        ),
                    )
                    .child("dropout", ModuleRepr::dropout(self.hidden_dropout_prob)),
            )
            .child(
                "layers",
                ModuleRepr::module_list(vec![layer; body.layers.len()]),
            )
            .child("layernorm", ln());
        if let Some(pooler) = &body.pooler {
            let (out, _) = pooler.ws.size2().ok()?;
            model = model.child(
                "pooler",
                ModuleRepr::new("ViTPooler")
                    .child("dense", ModuleRepr::linear(h, out, true))
                    .child("activation", ModuleRepr::new(body.pooler_act.class_name())),
            );
        }
        match kind {
            HeadKind::Base => Some(model),
            HeadKind::SequenceClassification => Some(
                ModuleRepr::new(kind.class(&self.classes()))
                    .child("vit", model)
                    .child(
                        "classifier",
                        ModuleRepr::linear(h, self.labels.num_labels(), true),
                    ),
            ),
            _ => None,
        }
    }
    fn tied_weights(&self, _kind: HeadKind) -> Vec<(String, String)> {
        vec![]
    }
    fn forward(
        &self,
        _kind: HeadKind,
        vit: &ViTModel,
        head: &Head,
        _ctx: &Context,
        inputs: &ModelInputs<'_>,
        train: bool,
        _padding_free: bool,
    ) -> Result<ModelOutput> {
        let h = vit.forward(inputs, train)?;
        let (logits, loss, pooler_output) = match head {
            Head::None => (h.shallow_clone(), None, vit.pool(&h)),
            Head::ImageClassification { classifier } => {
                let logits = classifier.forward(&h.select(1, 0));
                // ViT's `loss_function(labels, logits, config, **kwargs)`: the Trainer's
                // `num_items_in_batch` reaches it (SigLIP's call passes no kwargs).
                let loss =
                    heads::sequence_classification_loss_kwargs(&logits, inputs, &self.labels)?;
                (logits, loss, None)
            }
        };
        Ok(ModelOutput {
            loss,
            logits: Some(logits),
            last_hidden_state: Some(h),
            pooler_output,
            aux_loss: None,
        })
    }
}

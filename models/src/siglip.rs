//! SigLIP's vision side (upstream `models/siglip`, transformers 5.23):
//! `SiglipForImageClassification` — the vision tower of a `SiglipConfig` (its
//! `vision_config`) and a linear `classifier` on the mean of the last hidden states.
//!
//! The image cut into patches by a strided convolution (`patch_embedding`, no class token), a
//! learned `position_embedding` (an `nn.Embedding` over the patch positions), pre-LayerNorm
//! layers (`layer_norm1` → attention (SDPA, dropout `attention_dropout`, its projections
//! registered `k`, `v`, `q`, `out` as upstream's) → residual, `layer_norm2` → `fc1` →
//! `gelu_pytorch_tanh` → `fc2` → residual), `post_layernorm`. The vision tower's attention
//! pooling `head` (`probe`, `nn.MultiheadAttention`, ...) is built, loaded and saved as upstream
//! builds it, and, as upstream's classifier, never run (its parameters get no gradient); the
//! text tower's configuration is kept and its weights, when a `SiglipModel` checkpoint has
//! them, are left out as upstream's classifier leaves them. The base vision model (its
//! pooled output through the head) and interpolated position embeddings are refused.

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
use crate::vit::Size2;
use crate::{Error, Result};
use tchtrain_nn::{Activation, Context, LayerNorm, Linear, ModuleRepr};

/// Upstream `SiglipVisionConfig` with its defaults (SigLIP base, 224, patches of 16).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct SiglipVisionConfig {
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub num_channels: i64,
    pub image_size: Size2,
    pub patch_size: Size2,
    pub hidden_act: String,
    pub layer_norm_eps: f64,
    pub attention_dropout: f64,
    pub vision_use_head: bool,
    /// Keys this crate does not interpret (`model_type`, ...), kept.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Default for SiglipVisionConfig {
    fn default() -> Self {
        Self {
            hidden_size: 768,
            intermediate_size: 3072,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            num_channels: 3,
            image_size: Size2::Square(224),
            patch_size: Size2::Square(16),
            hidden_act: "gelu_pytorch_tanh".into(),
            layer_norm_eps: 1e-6,
            attention_dropout: 0.0,
            vision_use_head: true,
            extra: Default::default(),
        }
    }
}

/// Upstream `SiglipConfig`: the vision tower's config, the text tower's (kept as it is), the
/// labels of the image classifier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct SiglipConfig {
    pub vision_config: SiglipVisionConfig,
    /// The text tower's config (not built by the image classifier).
    pub text_config: Option<serde_json::Value>,
    pub initializer_factor: f64,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Default for SiglipConfig {
    fn default() -> Self {
        Self {
            vision_config: SiglipVisionConfig::default(),
            text_config: None,
            initializer_factor: 1.0,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

impl PretrainedConfig for SiglipConfig {
    fn model_type(&self) -> &'static str {
        "siglip"
    }
    fn to_json_value(&self) -> Result<serde_json::Value> {
        let mut v = configuration_utils::to_value(self)?;
        if let Some(o) = v.as_object_mut()
            && o.get("text_config").is_some_and(serde_json::Value::is_null)
        {
            o.remove("text_config");
        }
        if let Some(vc) = v.get_mut("vision_config").and_then(|x| x.as_object_mut()) {
            vc.insert("model_type".into(), "siglip_vision_model".into());
        }
        Ok(v)
    }
    fn labels(&self) -> &LabelConfig {
        &self.labels
    }
}

impl SiglipConfig {
    /// Reads and checks `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let c: Self = configuration_utils::read_config(path)?;
        c.validate()?;
        Ok(c)
    }

    fn num_patches(&self) -> i64 {
        let v = &self.vision_config;
        let (h, w) = v.image_size.hw();
        let (ph, pw) = v.patch_size.hw();
        (h / ph) * (w / pw)
    }

    fn validate(&self) -> Result<()> {
        let v = &self.vision_config;
        let (h, w) = v.image_size.hw();
        let (ph, pw) = v.patch_size.hw();
        configuration_utils::check_sizes(
            &[
                ("vision_config.hidden_size", v.hidden_size),
                ("vision_config.intermediate_size", v.intermediate_size),
                ("vision_config.num_channels", v.num_channels),
                ("vision_config.image_size", h.min(w)),
                ("vision_config.patch_size", ph.min(pw)),
            ],
            ("vision_config.num_hidden_layers", v.num_hidden_layers),
        )?;
        if v.num_attention_heads <= 0 || v.hidden_size % v.num_attention_heads != 0 {
            return Err(Error::InvalidConfig {
                field: "vision_config.num_attention_heads",
                value: format!("{} (hidden_size {})", v.num_attention_heads, v.hidden_size),
                fix: "embed_dim must be divisible by num_heads (upstream's check)",
            });
        }
        Activation::parse(&v.hidden_act, "vision_config.hidden_act")?;
        Ok(())
    }
}

#[derive(Debug)]
struct Layer {
    ctx: Context,
    layer_norm1: LayerNorm,
    k: Linear,
    v: Linear,
    q: Linear,
    out: Linear,
    layer_norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    name: String,
}

// SAFETY: parameter tensors and plain values that the forward only reads.
#[allow(unsafe_code)]
unsafe impl ReadOnlyLayer for Layer {}

struct LayerInputs {
    heads: i64,
    head_dim: i64,
    attn_p: f64,
    act: Activation,
}

// SAFETY: plain values that the forward only reads.
#[allow(unsafe_code)]
unsafe impl ReadOnlyLayer for LayerInputs {}

impl Layer {
    /// Upstream `SiglipEncoderLayer.forward`.
    fn forward(&self, h: &Tensor, x: &LayerInputs) -> Tensor {
        let (batch, seq) = (h.size()[0], h.size()[1]);
        let t = self.layer_norm1.forward(h);
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
        let h1 = h + self.out.forward(&a);
        let f = self.layer_norm2.forward(&h1);
        let f = self.fc1.forward(&f);
        let f = x
            .act
            .apply_traced(&self.ctx, &f, || format!("{}.mlp.activation_fn", self.name));
        let out = &h1 + self.fc2.forward(&f);
        self.ctx
            .leaf(|| self.name.clone(), "SiglipEncoderLayer", &[], h, &out);
        out
    }
}

/// The variables of `SiglipMultiheadAttentionPoolingHead`, created as upstream's (loaded and
/// saved; the image classifier does not run it).
#[derive(Debug)]
#[allow(dead_code)]
struct PoolingHead {
    probe: Tensor,
    in_proj_weight: Tensor,
    in_proj_bias: Tensor,
    out_proj: Linear,
    layernorm: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

/// Upstream `SiglipVisionModel`'s tower (embeddings, encoder, `post_layernorm`, the head's
/// variables).
#[derive(Debug)]
pub struct SiglipVisionTransformer {
    ctx: Context,
    patch_weight: Tensor,
    patch_bias: Tensor,
    position_embedding: Tensor,
    layers: Vec<Arc<Shared<Layer>>>,
    post_layernorm: LayerNorm,
    #[allow(dead_code)]
    head: Option<PoolingHead>,
    act: Activation,
    config: SiglipConfig,
    /// Upstream's `gradient_checkpointing` on the layers.
    pub(crate) checkpointing: Option<ActivationCheckpointing>,
}

impl SiglipVisionTransformer {
    /// What `print` shows of the tower (`SiglipVisionModel`): the patch `Conv2d`, the position
    /// `Embedding`, the encoder layers, `post_layernorm` and, when it has one, the
    /// attention-pooling head with its `nn.MultiheadAttention`.
    pub(crate) fn module_repr(&self) -> ModuleRepr {
        let v = &self.config.vision_config;
        let (h, inner) = (v.hidden_size, v.intermediate_size);
        let ln = || ModuleRepr::layer_norm(h, v.layer_norm_eps, true, true);
        let mlp = ModuleRepr::new("SiglipMLP")
            .child("activation_fn", ModuleRepr::new(self.act.class_name()))
            .child("fc1", ModuleRepr::linear(h, inner, true))
            .child("fc2", ModuleRepr::linear(inner, h, true));
        let layer = ModuleRepr::new("SiglipEncoderLayer")
            .child("layer_norm1", ln())
            .child(
                "self_attn",
                ModuleRepr::new("SiglipAttention")
                    .child("k_proj", ModuleRepr::linear(h, h, true))
                    .child("v_proj", ModuleRepr::linear(h, h, true))
                    .child("q_proj", ModuleRepr::linear(h, h, true))
                    .child("out_proj", ModuleRepr::linear(h, h, true)),
            )
            .child("layer_norm2", ln())
            .child("mlp", mlp.clone());
        let (ph, pw) = v.patch_size.hw();
        let tower = ModuleRepr::new("SiglipVisionModel")
            .child(
                "embeddings",
                ModuleRepr::new("SiglipVisionEmbeddings")
                    .child(
                        "patch_embedding",
                        ModuleRepr::with_extra(
                            "Conv2d",
                            format!(
                                "{}, {h}, kernel_size=({ph}, {pw}), stride=({ph}, {pw}), padding=valid",
                                v.num_channels
                            ),
                        ),
                    )
                    .child(
                        "position_embedding",
                        ModuleRepr::embedding(self.config.num_patches(), h, None),
                    ),
            )
            .child(
                "encoder",
                ModuleRepr::new("SiglipEncoder").child(
                    "layers",
                    ModuleRepr::module_list(vec![layer; self.layers.len()]),
                ),
            )
            .child("post_layernorm", ln());
        match &self.head {
            None => tower,
            Some(_) => tower.child(
                "head",
                ModuleRepr::new("SiglipMultiheadAttentionPoolingHead")
                    .child(
                        "attention",
                        ModuleRepr::new("MultiheadAttention").child(
                            "out_proj",
                            ModuleRepr::linear(h, h, true)
                                .renamed("NonDynamicallyQuantizableLinear"),
                        ),
                    )
                    .child("layernorm", ln())
                    .child("mlp", mlp),
            ),
        }
    }

    /// Creates the variables under `p` (`vision_model`). Upstream initialises them with LeCun
    /// / Xavier normals and `1/sqrt(width)` for the positions; drawn here from normals of the
    /// same scales, not upstream's draws.
    pub fn new(p: tchtrain_nn::Path<'_>, config: &SiglipConfig) -> Result<Self> {
        config.validate()?;
        let v = &config.vision_config;
        let d = v.hidden_size;
        let std = (d as f64).powf(-0.5);
        let normal = tchtrain_nn::initialization::normal(std);
        let e = &p / "embeddings";
        let pe = &e / "patch_embedding";
        let (ph, pw) = v.patch_size.hw();
        let patch_weight =
            tchtrain_nn::initialization::var(&pe, "weight", &[d, v.num_channels, ph, pw], normal);
        let patch_bias = tchtrain_nn::initialization::var(&pe, "bias", &[d], Init::Const(0.0));
        let position_embedding = tchtrain_nn::initialization::var(
            &(&e / "position_embedding"),
            "weight",
            &[config.num_patches(), d],
            normal,
        );
        let eps = v.layer_norm_eps;
        let layers = (0..v.num_hidden_layers)
            .map(|i| {
                let l = &p / "encoder" / "layers" / i;
                let a = &l / "self_attn";
                let lin =
                    |p: tchtrain_nn::Path<'_>, i: i64, o: i64| Linear::in_layer(p, i, o, true, std);
                let layer_norm1 = LayerNorm::new(&l / "layer_norm1", d, eps);
                Arc::new(Shared(Layer {
                    layer_norm1,
                    k: lin(&a / "k_proj", d, d),
                    v: lin(&a / "v_proj", d, d),
                    q: lin(&a / "q_proj", d, d),
                    out: lin(&a / "out_proj", d, d),
                    layer_norm2: LayerNorm::new(&l / "layer_norm2", d, eps),
                    fc1: lin(&l / "mlp" / "fc1", d, v.intermediate_size),
                    fc2: lin(&l / "mlp" / "fc2", v.intermediate_size, d),
                    name: l.name(),
                    ctx: l.ctx().clone(),
                }))
            })
            .collect();
        let post_layernorm = LayerNorm::new(&p / "post_layernorm", d, eps);
        let head = v.vision_use_head.then(|| {
            let h = &p / "head";
            let attn = &h / "attention";
            PoolingHead {
                probe: tchtrain_nn::initialization::var(&h, "probe", &[1, 1, d], normal),
                in_proj_weight: tchtrain_nn::initialization::var(
                    &attn,
                    "in_proj_weight",
                    &[3 * d, d],
                    normal,
                ),
                in_proj_bias: tchtrain_nn::initialization::var(
                    &attn,
                    "in_proj_bias",
                    &[3 * d],
                    Init::Const(0.0),
                ),
                out_proj: Linear::new(&attn / "out_proj", d, d, true, std),
                layernorm: LayerNorm::new(&h / "layernorm", d, eps),
                fc1: Linear::new(&h / "mlp" / "fc1", d, v.intermediate_size, true, std),
                fc2: Linear::new(&h / "mlp" / "fc2", v.intermediate_size, d, true, std),
            }
        });
        Ok(Self {
            ctx: p.ctx().clone(),
            patch_weight,
            patch_bias,
            position_embedding,
            layers,
            post_layernorm,
            head,
            act: Activation::parse(&v.hidden_act, "vision_config.hidden_act")?,
            config: config.clone(),
            checkpointing: None,
        })
    }

    /// The last hidden state `[batch, patches, hidden]` (after `post_layernorm`).
    pub fn forward(&self, inputs: &ModelInputs<'_>, train: bool) -> Result<Tensor> {
        let v = &self.config.vision_config;
        let pixel_values = inputs.pixel_values.ok_or(Error::MissingInput {
            name: "pixel_values",
        })?;
        let size = pixel_values.size();
        let (h, w) = v.image_size.hw();
        if size.len() != 4 || size[1] != v.num_channels || size[2] != h || size[3] != w {
            return Err(Error::InvalidInput {
                name: "pixel_values",
                detail: format!(
                    "expected [batch, {}, {h}, {w}], got {size:?} (interpolate_pos_encoding is not implemented here)",
                    v.num_channels
                ),
            });
        }
        let device = self.patch_weight.device();
        let pixel_values = pixel_values
            .f_to_device(device)?
            .f_to_kind(self.patch_weight.kind())?;
        let (ph, pw) = v.patch_size.hw();
        let patches = pixel_values
            .f_conv2d(
                &self.patch_weight,
                Some(&self.patch_bias),
                [ph, pw],
                [0, 0],
                [1, 1],
                1,
            )?
            .f_flatten(2, -1)?
            .f_transpose(1, 2)?;
        let n = self.position_embedding.size()[0];
        let position_ids = Tensor::f_arange(n, (tch::Kind::Int64, device))?.f_unsqueeze(0)?;
        let positions =
            Tensor::f_embedding(&self.position_embedding, &position_ids, -1, false, false)?;
        let h0 = patches.f_add(&positions)?;
        let x = Arc::new(Shared(LayerInputs {
            heads: v.num_attention_heads,
            head_dim: v.hidden_size / v.num_attention_heads,
            attn_p: if train { v.attention_dropout } else { 0.0 },
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
        Ok(self.post_layernorm.forward(&h))
    }
}

/// The image classifier's head.
#[derive(Debug)]
pub enum Head {
    /// `classifier` on the mean of the patch states.
    ImageClassification {
        /// `nn.Linear(vision_config.hidden_size, num_labels)`.
        classifier: Linear,
    },
}

/// A SigLIP model with one of upstream's heads; use the type alias.
pub type Siglip<K> = EncoderFor<SiglipConfig, K>;

/// Upstream `SiglipForImageClassification`.
pub type SiglipForImageClassification = Siglip<heads::SequenceClassification>;

impl EncoderArchitecture for SiglipConfig {
    type Body = SiglipVisionTransformer;
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
    /// Where the vision tower sits (`vision_model`; upstream's `base_model_prefix` is
    /// `siglip`, which no checkpoint key carries).
    fn base_model_prefix(&self) -> &'static str {
        "vision_model"
    }
    fn classes(&self) -> [&'static str; 5] {
        [
            "SiglipVisionModel",
            "SiglipForMaskedLM",
            "SiglipForImageClassification",
            "SiglipForTokenClassification",
            "SiglipForQuestionAnswering",
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
    ) -> Result<(SiglipVisionTransformer, Head)> {
        if kind != HeadKind::SequenceClassification {
            return Err(Error::InvalidConfig {
                field: "architectures",
                value: format!("{kind:?}"),
                fix: "SigLIP takes SiglipForImageClassification here (the vision model's pooled output through the attention head, and the contrastive SiglipModel, are not implemented)",
            });
        }
        let tower = SiglipVisionTransformer::new(body, self)?;
        let d = self.vision_config.hidden_size;
        let std = (d as f64).powf(-0.5) * self.initializer_factor;
        let classifier = Linear::new(root / "classifier", d, self.labels.num_labels(), true, std);
        Ok((tower, Head::ImageClassification { classifier }))
    }
    fn checkpointing(body: &mut SiglipVisionTransformer) -> &mut Option<ActivationCheckpointing> {
        &mut body.checkpointing
    }
    fn is_checkpointing(body: &SiglipVisionTransformer) -> bool {
        body.checkpointing.is_some()
    }
    /// `embeddings.position_embedding.weight`: an `nn.Embedding`, left out of
    /// `num_parameters(exclude_embeddings=True)` as upstream leaves it.
    fn is_embedding_weight(&self, name: &str) -> bool {
        name == "embeddings.position_embedding.weight"
    }
    fn tied_weights(&self, _kind: HeadKind) -> Vec<(String, String)> {
        vec![]
    }
    /// What `print(model)` shows of the image classifier: the vision tower
    /// ([`SiglipVisionTransformer::module_repr`]) and the classifier.
    fn module_repr(&self, kind: HeadKind, body: &SiglipVisionTransformer) -> Option<ModuleRepr> {
        if kind != HeadKind::SequenceClassification {
            return None;
        }
        Some(
            ModuleRepr::new("SiglipForImageClassification")
                .child("vision_model", body.module_repr())
                .child(
                    "classifier",
                    ModuleRepr::linear(
                        self.vision_config.hidden_size,
                        self.labels.num_labels(),
                        true,
                    ),
                ),
        )
    }
    /// The text tower's weights of a `SiglipModel` checkpoint, and its `logit_scale` /
    /// `logit_bias`, are not the classifier's.
    fn reports_unexpected(key: &str) -> bool {
        !(key.starts_with("text_model.") || key == "logit_scale" || key == "logit_bias")
    }
    fn forward(
        &self,
        _kind: HeadKind,
        tower: &SiglipVisionTransformer,
        head: &Head,
        _ctx: &Context,
        inputs: &ModelInputs<'_>,
        train: bool,
        _padding_free: bool,
    ) -> Result<ModelOutput> {
        let h = tower.forward(inputs, train)?;
        let Head::ImageClassification { classifier } = head;
        let pooled = h.f_mean_dim(Some(&[1][..]), false, None::<tch::Kind>)?;
        let logits = classifier.forward(&pooled);
        let loss = heads::sequence_classification_loss(&logits, inputs, &self.labels)?;
        Ok(ModelOutput {
            loss,
            logits: Some(logits),
            last_hidden_state: Some(h),
            pooler_output: None,
            aux_loss: None,
        })
    }
}

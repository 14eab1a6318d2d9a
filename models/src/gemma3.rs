//! Gemma 3's text model (upstream `models/gemma3`, `model_type` `gemma3_text`):
//! `Gemma3TextConfig` with upstream's defaults (Gemma 3 4B's text part), and
//! `Gemma3ForCausalLM`: Gemma 2's layers with a per-head q / k RMSNorm before RoPE, five
//! sliding layers to one full by default, and two RoPE bases (`rope_parameters` keyed by
//! layer type: 10 000 for the sliding layers, 1 000 000 for the full ones; v4's
//! `rope_local_base_freq` / `rope_theta`). Upstream runs it through SDPA, without attention
//! soft-capping, and so does this one.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tch::Tensor;
use tchtrain_nn::RmsNorm;

use crate::configuration_utils::LabelConfig;
use crate::gemma2::{check_heads, gemma_windows};
use crate::llama::{
    DecoderConfig, DecoderForCausalLM, DecoderForSequenceClassification, Family, Gemma,
    ImageEncoder, LlamaConfig, QkNorm,
};
use crate::modeling_utils::ModelInputs;
use crate::siglip::{SiglipConfig, SiglipVisionConfig, SiglipVisionTransformer};
use crate::{Error, Result};

/// Upstream `Gemma3TextConfig` with its defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct Gemma3TextConfig {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub num_key_value_heads: Option<i64>,
    pub head_dim: i64,
    pub hidden_activation: String,
    pub max_position_embeddings: i64,
    pub initializer_range: f64,
    pub rms_norm_eps: f64,
    pub pad_token_id: Option<i64>,
    pub eos_token_id: Option<serde_json::Value>,
    pub bos_token_id: Option<i64>,
    pub tie_word_embeddings: bool,
    /// v5 form, per layer type: `{"sliding_attention": {"rope_type": "default",
    /// "rope_theta": 10000.0}, "full_attention": {...}}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<Map<String, Value>>,
    /// v4 form of the full layers' RoPE base.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// v4 form of the sliding layers' RoPE base.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_local_base_freq: Option<f64>,
    /// v4 form of the full layers' RoPE scaling.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<Map<String, Value>>,
    pub attention_bias: bool,
    pub attention_dropout: f64,
    pub query_pre_attn_scalar: i64,
    pub sliding_window: Option<i64>,
    /// `full_attention` / `sliding_attention` per layer; `None`: every
    /// `sliding_window_pattern`-th layer (6 by default) full, the others sliding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer_types: Option<Vec<String>>,
    pub final_logit_softcapping: Option<f64>,
    /// Upstream's Gemma 3 attention does not read it: refused when set.
    pub attn_logit_softcapping: Option<f64>,
    /// EmbeddingGemma's bidirectional attention: refused (not implemented here).
    pub use_bidirectional_attention: bool,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Default for Gemma3TextConfig {
    fn default() -> Self {
        Self {
            vocab_size: 262_208,
            hidden_size: 2304,
            intermediate_size: 9216,
            num_hidden_layers: 26,
            num_attention_heads: 8,
            num_key_value_heads: Some(4),
            head_dim: 256,
            hidden_activation: "gelu_pytorch_tanh".into(),
            max_position_embeddings: 131_072,
            initializer_range: 0.02,
            rms_norm_eps: 1e-6,
            pad_token_id: Some(0),
            eos_token_id: Some(1.into()),
            bos_token_id: Some(2),
            tie_word_embeddings: true,
            rope_parameters: None,
            rope_theta: None,
            rope_local_base_freq: None,
            rope_scaling: None,
            attention_bias: false,
            attention_dropout: 0.0,
            query_pre_attn_scalar: 256,
            sliding_window: Some(4096),
            layer_types: None,
            final_logit_softcapping: None,
            attn_logit_softcapping: None,
            use_bidirectional_attention: false,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

impl Gemma3TextConfig {
    /// Upstream's `convert_rope_params_to_dict`: the RoPE of each layer type, `rope_scaling`
    /// applied to the full layers, the bases defaulting to `rope_theta` (1e6) and
    /// `rope_local_base_freq` (1e4).
    pub fn rope_parameters_of(&self, layer_type: &str) -> Result<Map<String, Value>> {
        let given = match &self.rope_parameters {
            Some(p) => match p.get(layer_type) {
                None | Some(Value::Null) => Map::new(),
                Some(Value::Object(m)) => m.clone(),
                Some(other) => {
                    return Err(Error::InvalidConfig {
                        field: "rope_parameters",
                        value: format!("{layer_type}: {other}"),
                        fix: "give one dict per layer type (sliding_attention, full_attention)",
                    });
                }
            },
            None => Map::new(),
        };
        let mut p = given;
        p.entry("rope_type").or_insert("default".into());
        let (theta, default) = match layer_type {
            "full_attention" => {
                if let Some(scaling) = &self.rope_scaling {
                    p.extend(scaling.clone());
                }
                (self.rope_theta, 1_000_000.0)
            }
            _ => (self.rope_local_base_freq, 10_000.0),
        };
        p.entry("rope_theta")
            .or_insert(theta.unwrap_or(default).into());
        Ok(p)
    }

    fn sliding_window_pattern(&self) -> Result<i64> {
        match self.extra.get("sliding_window_pattern") {
            None | Some(Value::Null) => Ok(6),
            Some(v) => v.as_i64().ok_or_else(|| Error::InvalidConfig {
                field: "sliding_window_pattern",
                value: v.to_string(),
                fix: "give an integer",
            }),
        }
    }
}

crate::llama::decoder_config_plumbing!(Gemma3TextConfig, "gemma3_text");

impl DecoderConfig for Gemma3TextConfig {
    crate::llama::decoder_config_plumbing!(@methods);
    fn llama(&self) -> LlamaConfig {
        LlamaConfig {
            // Checked by `family()`, which every constructor and `from_file` call.
            rope_parameters: self.rope_parameters_of("full_attention").ok(),
            rope_theta: None,
            rope_scaling: None,
            ..crate::llama::to_llama!(self, head_dim: Some(self.head_dim),
                attention_bias: self.attention_bias,
                hidden_act: self.hidden_activation.clone())
        }
    }
    fn family(&self) -> Result<Family> {
        if self.use_bidirectional_attention {
            crate::gemma::refuse_bidirectional(Some(true))?;
        }
        if let Some(cap) = self.attn_logit_softcapping {
            return Err(Error::InvalidConfig {
                field: "attn_logit_softcapping",
                value: cap.to_string(),
                fix: "upstream's Gemma 3 attention does not soft-cap (the key is read by Gemma 2 only); set it to null",
            });
        }
        check_heads(self.hidden_size, self.num_attention_heads)?;
        self.rope_parameters_of("full_attention")?;
        let sliding = self.rope_parameters_of("sliding_attention")?;
        // The sliding layers' RoPE is checked as Llama's is.
        LlamaConfig {
            rope_parameters: Some(sliding.clone()),
            ..self.llama()
        }
        .validate()?;
        Ok(Family {
            model_type: "gemma3_text",
            causal_lm: "Gemma3ForCausalLM",
            sequence_classification: Some("Gemma3TextForSequenceClassification"),
            prefix: "Gemma3",
            qkv_bias: self.attention_bias,
            o_bias: self.attention_bias,
            mlp_bias: false,
            qk_norm: QkNorm::PerHead,
            clip_qkv: None,
            moe: None,
            sliding_windows: gemma_windows(
                self.layer_types.as_deref(),
                self.num_hidden_layers,
                self.sliding_window,
                self.sliding_window_pattern()?,
            )?,
            rotary_positional: true,
            gemma: Some(Gemma {
                sandwich_norms: true,
                query_pre_attn_scalar: Some(self.query_pre_attn_scalar as f64),
                attn_logit_softcapping: None,
                final_logit_softcapping: self.final_logit_softcapping,
                eager_attention: false,
                text_model: true,
            }),
            phi3: None,
            granite: None,
            rope_layers: None,
            sliding_rope_parameters: Some(sliding),
            olmo2: false,
            base_model: "model",
            checkpoint_conversion: None,
            gpt_oss: None,
            qwen3_5: None,
            gemma4: None,
            token_classification: None,
            question_answering: None,
        })
    }
}

/// Upstream `Gemma3ForCausalLM` (the text model).
pub type Gemma3ForCausalLM = DecoderForCausalLM<Gemma3TextConfig>;

/// Upstream `Gemma3TextForSequenceClassification`.
pub type Gemma3TextForSequenceClassification = DecoderForSequenceClassification<Gemma3TextConfig>;

/// Upstream `Gemma3Config` (`model_type` `gemma3`, every Gemma 3 checkpoint from 4B up): the
/// text model's config under `text_config`, the SigLIP vision tower's under `vision_config`
/// (`SiglipVisionConfig`'s defaults when absent), the image-token facts, and a head tied to
/// the text model's embeddings by default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct Gemma3Config {
    pub text_config: Gemma3TextConfig,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vision_config: Option<Value>,
    pub mm_tokens_per_image: Option<i64>,
    pub boi_token_index: Option<i64>,
    pub eoi_token_index: Option<i64>,
    pub image_token_index: Option<i64>,
    pub initializer_range: Option<f64>,
    pub tie_word_embeddings: bool,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Default for Gemma3Config {
    fn default() -> Self {
        Self {
            text_config: Gemma3TextConfig::default(),
            vision_config: None,
            mm_tokens_per_image: Some(256),
            boi_token_index: Some(255_999),
            eoi_token_index: Some(256_000),
            image_token_index: Some(262_144),
            initializer_range: Some(0.02),
            tie_word_embeddings: true,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

impl crate::configuration_utils::PretrainedConfig for Gemma3Config {
    fn model_type(&self) -> &'static str {
        "gemma3"
    }
    fn to_json_value(&self) -> Result<Value> {
        let mut v = crate::configuration_utils::to_value(self)?;
        // The nested config names its own type, as upstream's `to_dict` writes it.
        if let Some(text) = v.get_mut("text_config").and_then(Value::as_object_mut) {
            text.insert("model_type".into(), "gemma3_text".into());
        }
        Ok(v)
    }
    fn labels(&self) -> &LabelConfig {
        &self.labels
    }
}

impl DecoderConfig for Gemma3Config {
    crate::llama::decoder_config_plumbing!(@methods);
    /// The vision tower and the projector, created before the language model (upstream's
    /// parameter order).
    fn image_encoder(&self, root: &tchtrain_nn::Path<'_>) -> Result<Option<Box<dyn ImageEncoder>>> {
        let vision = self.siglip_vision_config()?;
        let siglip = SiglipConfig {
            vision_config: vision.clone(),
            ..SiglipConfig::default()
        };
        let model = root / "model";
        let vision_tower = SiglipVisionTransformer::new(&model / "vision_tower", &siglip)?;
        let multi_modal_projector =
            Gemma3MultiModalProjector::new(&model / "multi_modal_projector", self, &vision)?;
        Ok(Some(Box::new(Gemma3Vision {
            vision_tower,
            multi_modal_projector,
            image_token_id: self.image_token_id()?,
        })))
    }
    /// `Gemma3ForConditionalGeneration` has no `accepts_loss_kwargs` of its own (its
    /// `Gemma3Model` has, `False`): the Trainer reads its forward's `**kwargs`, and passes
    /// `num_items_in_batch`.
    fn accepts_loss_kwargs(&self) -> Option<bool> {
        Some(true)
    }
    fn llama(&self) -> LlamaConfig {
        LlamaConfig {
            tie_word_embeddings: self.tie_word_embeddings,
            labels: self.labels.clone(),
            extra: self.extra.clone(),
            ..self.text_config.llama()
        }
    }
    fn family(&self) -> Result<Family> {
        let text = self.text_config.family()?;
        Ok(Family {
            model_type: "gemma3",
            causal_lm: "Gemma3ForConditionalGeneration",
            // Upstream's `Gemma3ForSequenceClassification` runs the vision tower's model.
            sequence_classification: None,
            // `Gemma3ForConditionalGeneration` returns the head's logits as they are: the
            // text model's `final_logit_softcapping` is `Gemma3ForCausalLM`'s alone.
            gemma: text.gemma.map(|g| Gemma {
                final_logit_softcapping: None,
                ..g
            }),
            base_model: "model.language_model",
            checkpoint_conversion: Some(crate::WeightConversion::Llava),
            gpt_oss: None,
            qwen3_5: None,
            ..text
        })
    }
}

/// Upstream `Gemma3ForConditionalGeneration`: the SigLIP vision tower
/// (`model.vision_tower`), the projector (`model.multi_modal_projector`), the language model
/// (`model.language_model`, Gemma 3's text model) and `lm_head`. `pixel_values` are encoded,
/// pooled and projected, and replace the embeddings of the image tokens (`image_token_index`);
/// with `token_type_ids` (1 on the image tokens, as `Gemma3Processor` returns them) each
/// image's tokens see one another both ways, as upstream's masks let them.
pub type Gemma3ForConditionalGeneration = DecoderForCausalLM<Gemma3Config>;

impl Gemma3Config {
    /// The vision tower's config: `vision_config`, or `SiglipVisionConfig()`'s defaults.
    pub fn siglip_vision_config(&self) -> Result<SiglipVisionConfig> {
        match &self.vision_config {
            None | Some(Value::Null) => Ok(SiglipVisionConfig::default()),
            Some(v) => serde_json::from_value(v.clone()).map_err(|e| Error::InvalidConfig {
                field: "vision_config",
                value: e.to_string(),
                fix: "give a SiglipVisionConfig (hidden_size, image_size, patch_size, ...)",
            }),
        }
    }

    /// `image_token_index` (`image_token_id`).
    fn image_token_id(&self) -> Result<i64> {
        self.image_token_index.ok_or(Error::InvalidConfig {
            field: "image_token_index",
            value: "null".into(),
            fix: "give the id of the image placeholder token (262144 in Gemma 3's checkpoints)",
        })
    }
}

/// Upstream `Gemma3MultiModalProjector`: the tower's patch states `[images, patches,
/// vision hidden]` laid out as their `patches_per_image²` grid, average-pooled to
/// `mm_tokens_per_image` tokens, normalised by Gemma's RMSNorm (`vision_config.layer_norm_eps`)
/// and multiplied by `mm_input_projection_weight` `[vision hidden, text hidden]`.
#[derive(Debug)]
struct Gemma3MultiModalProjector {
    mm_input_projection_weight: Tensor,
    mm_soft_emb_norm: RmsNorm,
    patches_per_image: i64,
    kernel_size: i64,
    /// The norm's width and epsilon (what `print` shows of it).
    vision_hidden: i64,
    eps: f64,
}

impl Gemma3MultiModalProjector {
    fn new(
        p: tchtrain_nn::Path<'_>,
        config: &Gemma3Config,
        vision: &SiglipVisionConfig,
    ) -> Result<Self> {
        let (image, _) = vision.image_size.hw();
        let (patch, _) = vision.patch_size.hw();
        let patches_per_image = image / patch.max(1);
        let mm_tokens = config.mm_tokens_per_image.unwrap_or(256);
        let tokens_per_side = (mm_tokens.max(0) as f64).sqrt() as i64;
        let kernel_size = if tokens_per_side > 0 {
            patches_per_image / tokens_per_side
        } else {
            0
        };
        if kernel_size < 1 {
            return Err(Error::InvalidConfig {
                field: "mm_tokens_per_image",
                value: format!(
                    "{mm_tokens} (a {patches_per_image}x{patches_per_image} patch grid)"
                ),
                fix: "give a square number of tokens per image whose side divides the patch grid's (image_size / patch_size)",
            });
        }
        Ok(Self {
            // Upstream's `nn.Parameter(torch.zeros(...))`.
            mm_input_projection_weight: tchtrain_nn::initialization::var(
                &p,
                "mm_input_projection_weight",
                &[vision.hidden_size, config.text_config.hidden_size],
                tch::nn::Init::Const(0.0),
            ),
            mm_soft_emb_norm: RmsNorm::gemma(
                &p / "mm_soft_emb_norm",
                vision.hidden_size,
                vision.layer_norm_eps,
                "Gemma3RMSNorm",
            ),
            patches_per_image,
            kernel_size,
            vision_hidden: vision.hidden_size,
            eps: vision.layer_norm_eps,
        })
    }

    fn forward(&self, vision_outputs: &Tensor) -> Result<Tensor> {
        let size = vision_outputs.size();
        let (batch, hidden) = (size[0], size[2]);
        let p = self.patches_per_image;
        let grid = vision_outputs
            .f_transpose(1, 2)?
            .f_reshape([batch, hidden, p, p])?
            .f_contiguous()?;
        let k = self.kernel_size;
        let pooled = grid
            .f_avg_pool2d([k, k], [k, k], [0, 0], false, true, None)?
            .f_flatten(2, -1)?
            .f_transpose(1, 2)?;
        let normed = self.mm_soft_emb_norm.forward(&pooled);
        Ok(normed
            .f_matmul(&self.mm_input_projection_weight)?
            .f_to_kind(vision_outputs.kind())?)
    }
}

/// `Gemma3Model`'s image side: the SigLIP tower and the projector.
#[derive(Debug)]
pub struct Gemma3Vision {
    vision_tower: SiglipVisionTransformer,
    multi_modal_projector: Gemma3MultiModalProjector,
    image_token_id: i64,
}

impl ImageEncoder for Gemma3Vision {
    fn module_repr(&self) -> Option<Vec<(&'static str, tchtrain_nn::ModuleRepr)>> {
        let p = &self.multi_modal_projector;
        let k = p.kernel_size;
        Some(vec![
            ("vision_tower", self.vision_tower.module_repr()),
            (
                "multi_modal_projector",
                tchtrain_nn::ModuleRepr::new("Gemma3MultiModalProjector")
                    .child(
                        "mm_soft_emb_norm",
                        tchtrain_nn::ModuleRepr::rms_norm("Gemma3RMSNorm", p.vision_hidden, p.eps),
                    )
                    .child(
                        "avg_pool",
                        tchtrain_nn::ModuleRepr::with_extra(
                            "AvgPool2d",
                            format!("kernel_size={k}, stride={k}, padding=0"),
                        ),
                    ),
            ),
        ])
    }
    fn image_features(&self, inputs: &ModelInputs<'_>, train: bool) -> Result<Tensor> {
        let last_hidden_state = self.vision_tower.forward(inputs, train)?;
        self.multi_modal_projector.forward(&last_hidden_state)
    }
    fn image_token_id(&self) -> i64 {
        self.image_token_id
    }
    fn checkpointing(&mut self) -> &mut Option<crate::ActivationCheckpointing> {
        &mut self.vision_tower.checkpointing
    }
}

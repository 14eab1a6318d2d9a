//! Llama (upstream `models/llama`): `LlamaConfig`, `LlamaModel`, `LlamaForCausalLM` —
//! RoPE (default, linear and llama3 scaling), RMSNorm, grouped-query attention, SiLU
//! MLP, tied or untied head. Parameter names as upstream (`model.layers.0.self_attn.q_proj.weight`).
//!
//! Upstream generates Qwen2, Qwen3, Mistral and the Gemmas from Llama's modular file; here
//! they are Llama's model with a [`Family`] (which projections have biases, Qwen3's q/k
//! RMSNorm, each layer's sliding window, the class names, what Gemma changes: [`Gemma`])
//! and a [`DecoderConfig`] of their own (`qwen2.rs`, `qwen3.rs`, `mistral.rs`, `gemma.rs`,
//! `gemma2.rs`, `gemma3.rs`), and their causal LMs are [`DecoderForCausalLM`] over that
//! config.

// `h = h + x` on purpose: tch's `+=` works in place and would modify tensors autograd
// saved for backward.
#![allow(clippy::assign_op_pattern)]

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tch::nn;
use tch::{Device, Kind, Tensor};

use crate::attention;
use crate::checkpoint::{ActivationCheckpointing, ReadOnlyLayer, Shared, run_layers};
use crate::configuration_utils::{self, LabelConfig, PretrainedConfig};
use crate::heads;
use crate::loading::{self, LoadOptions};
use crate::modeling_utils::{Loaded, ModelInputs, ModelOutput, PreTrainedModel, TrainableModel};
use crate::rope::{self, RopeParameters, RotaryEmbedding};
use crate::{Error, Result};
use tchtrain_nn::{Activation, Context, Embedding, Linear, ModuleRepr, RmsNorm};

/// Upstream `LlamaConfig` with its defaults (Llama-2 7B). Both the v5 `rope_parameters`
/// dict and the v4 `rope_theta` / `rope_scaling` keys are read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct LlamaConfig {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    /// `None` means `num_attention_heads` (multi-head attention).
    pub num_key_value_heads: Option<i64>,
    /// `None` means `hidden_size / num_attention_heads`.
    pub head_dim: Option<i64>,
    pub hidden_act: String,
    pub max_position_embeddings: i64,
    pub initializer_range: f64,
    pub rms_norm_eps: f64,
    pub attention_bias: bool,
    pub attention_dropout: f64,
    pub mlp_bias: bool,
    pub pad_token_id: Option<i64>,
    pub bos_token_id: Option<i64>,
    pub eos_token_id: Option<serde_json::Value>,
    pub tie_word_embeddings: bool,
    /// v5 form: `{"rope_type": "default", "rope_theta": 10000.0, ...}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<serde_json::Map<String, serde_json::Value>>,
    /// v4 form of the RoPE base.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// v4 form of the RoPE scaling dict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Default for LlamaConfig {
    fn default() -> Self {
        Self {
            vocab_size: 32000,
            hidden_size: 4096,
            intermediate_size: 11008,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_key_value_heads: None,
            head_dim: None,
            hidden_act: "silu".into(),
            max_position_embeddings: 2048,
            initializer_range: 0.02,
            rms_norm_eps: 1e-6,
            attention_bias: false,
            attention_dropout: 0.0,
            mlp_bias: false,
            pad_token_id: None,
            bos_token_id: Some(1),
            eos_token_id: Some(2.into()),
            tie_word_embeddings: false,
            rope_parameters: None,
            rope_theta: None,
            rope_scaling: None,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

impl PretrainedConfig for LlamaConfig {
    fn model_type(&self) -> &'static str {
        "llama"
    }
    fn to_json_value(&self) -> Result<serde_json::Value> {
        configuration_utils::to_value(self)
    }
    fn labels(&self) -> &LabelConfig {
        &self.labels
    }
}

/// What a Llama-shaped family changes in Llama's layers (upstream's modular files).
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    /// `model_type` (`llama`, `qwen2`, ...).
    pub model_type: &'static str,
    /// Upstream's class name of the causal LM (`Qwen2ForCausalLM`).
    pub causal_lm: &'static str,
    /// Upstream's class name of the sequence classifier (`Qwen2ForSequenceClassification`).
    /// `None` where upstream has none (OLMoE).
    pub sequence_classification: Option<&'static str>,
    /// Upstream's class-name prefix (`Qwen2` for `Qwen2DecoderLayer`, `Qwen2RMSNorm`, ...).
    pub prefix: &'static str,
    /// Biases on `q_proj`, `k_proj`, `v_proj`.
    pub qkv_bias: bool,
    /// Bias on `o_proj`.
    pub o_bias: bool,
    /// Biases on the MLP's projections.
    pub mlp_bias: bool,
    /// RMSNorms of the queries and keys (`q_norm`, `k_norm`) before RoPE.
    pub qk_norm: QkNorm,
    /// OLMoE's `clip_qkv`: the projections clamped to `[-clip, clip]` after the norms.
    pub clip_qkv: Option<f64>,
    /// The mixture-of-experts blocks (`None`: every layer's MLP is dense).
    pub moe: Option<Moe>,
    /// Each layer's sliding window (`None`: full causal attention).
    pub sliding_windows: Vec<Option<i64>>,
    /// The model calls its rotary embedding with `position_ids` as a positional argument
    /// (Qwen's), which the underflow / overflow tracer shows as an input.
    pub rotary_positional: bool,
    /// What Gemma 1–3 change (`None` for the other families).
    pub gemma: Option<Gemma>,
    /// What Phi-3 changes (`None` for the other families).
    pub phi3: Option<Phi3>,
    /// Granite's multipliers (`None` for the other families).
    pub granite: Option<Granite>,
    /// SmolLM3's NoPE layers: which layers apply the rotary embedding (`None`: every layer).
    pub rope_layers: Option<Vec<bool>>,
    /// The RoPE of the sliding layers where it is their own (Gemma 3's and OLMo 3's
    /// `rope_parameters["sliding_attention"]`); the full layers use the config's.
    pub sliding_rope_parameters: Option<serde_json::Map<String, serde_json::Value>>,
    /// OLMo 2 / 3's layer: no input norm, the attention's and the MLP's outputs normalised
    /// (`post_attention_layernorm`, `post_feedforward_layernorm`) before their residuals;
    /// OLMo's RMSNorm (`(weight · x).to(dtype)`); the rotary embedding in float32, the
    /// queries and keys cast back to their dtype.
    pub olmo2: bool,
    /// Where the decoder sits in the causal LM (`model`; a multimodal checkpoint's language
    /// model `model.language_model`, whose other towers the causal LM carries untrained).
    pub base_model: &'static str,
    /// How the family's checkpoints name its weights when they differ from its modules
    /// (upstream's conversion mapping: experts stored one by one, a multimodal model's
    /// language model under `language_model.model`).
    pub checkpoint_conversion: Option<crate::WeightConversion>,
    /// What gpt-oss changes (`None` for the other families).
    pub gpt_oss: Option<GptOss>,
    /// What Qwen3.5 / Qwen3.5-MoE change (`None` for the other families).
    pub qwen3_5: Option<Qwen3_5>,
    /// What Gemma 4 changes (`None` for the other families).
    pub gemma4: Option<Gemma4>,
    /// Upstream's class name of the token classifier (`Qwen2ForTokenClassification`);
    /// `None` where upstream has none (Gemma 3's text model).
    pub token_classification: Option<&'static str>,
    /// Upstream's question-answering class (`Qwen2ForQuestionAnswering`) and the attribute
    /// its body sits under; `None` where upstream has none (Gemma 1–3, Phi-3).
    pub question_answering: Option<QuestionAnsweringClass>,
}

/// Where a family normalises its queries and keys before RoPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    /// No query / key norm (Llama).
    None,
    /// Qwen3's and Gemma 3's: per head, over `head_dim`, right after each projection.
    PerHead,
    /// OLMoE's: over the whole projection (`hidden_size` for the queries, the key heads'
    /// width for the keys), before the split into heads.
    Projection,
}

/// What a mixture-of-experts family's sparse blocks are (upstream's `XSparseMoeBlock`: a
/// top-k router `gate` and the fused `experts`; Qwen2-MoE adds a gated shared expert).
#[derive(Debug, Clone, PartialEq)]
pub struct Moe {
    /// `num_experts` / `num_local_experts`.
    pub num_experts: i64,
    /// `num_experts_per_tok`.
    pub num_experts_per_tok: i64,
    /// Each expert's intermediate size (`moe_intermediate_size`, Mixtral's and OLMoE's
    /// `intermediate_size`).
    pub moe_intermediate_size: i64,
    /// How the router weighs the chosen experts.
    pub router: tchtrain_nn::RouterKind,
    /// Which layers are sparse (the others have the dense MLP of `intermediate_size`):
    /// upstream's `mlp_only_layers` and `decoder_sparse_step`.
    pub sparse_layers: Vec<bool>,
    /// Qwen2-MoE's `shared_expert_intermediate_size`: a dense MLP on every token, gated by
    /// `sigmoid(shared_expert_gate(x))`, added to the experts' output.
    pub shared_expert_intermediate_size: Option<i64>,
    /// Upstream registers the router before the experts (Mixtral, OLMoE, Qwen2-MoE); Qwen3-MoE
    /// registers the experts first.
    pub router_first: bool,
    /// `output_router_logits`: the causal LM adds `router_aux_loss_coef` times
    /// upstream's `load_balancing_loss_func` to its loss.
    pub output_router_logits: bool,
    /// `router_aux_loss_coef`.
    pub router_aux_loss_coef: f64,
    /// Mixtral's `router_jitter_noise`: in training, the block's input scaled by
    /// `U(1 - noise, 1 + noise)`.
    pub router_jitter_noise: f64,
}

impl Moe {
    /// The sizes upstream's blocks need to run.
    fn validate(&self, num_hidden_layers: i64) -> Result<()> {
        configuration_utils::check_sizes(
            &[
                ("num_experts", self.num_experts),
                ("num_experts_per_tok", self.num_experts_per_tok),
                ("moe_intermediate_size", self.moe_intermediate_size),
            ],
            ("num_hidden_layers", num_hidden_layers),
        )?;
        if self.num_experts_per_tok > self.num_experts {
            return Err(Error::InvalidConfig {
                field: "num_experts_per_tok",
                value: format!(
                    "{} (num_experts {})",
                    self.num_experts_per_tok, self.num_experts
                ),
                fix: "route each token to at most num_experts experts",
            });
        }
        if self.sparse_layers.len() as i64 != num_hidden_layers {
            return Err(Error::InvalidConfig {
                field: "mlp_only_layers",
                value: format!("{} layers", self.sparse_layers.len()),
                fix: "give one entry per layer (num_hidden_layers)",
            });
        }
        Ok(())
    }

    /// Upstream's sparse layers: not in `mlp_only_layers`, and every `decoder_sparse_step`-th
    /// (`(i + 1) % step == 0`) when there are experts.
    pub(crate) fn sparse_layers(
        num_hidden_layers: i64,
        num_experts: i64,
        mlp_only_layers: &[i64],
        decoder_sparse_step: i64,
    ) -> Result<Vec<bool>> {
        if decoder_sparse_step <= 0 {
            return Err(Error::InvalidConfig {
                field: "decoder_sparse_step",
                value: decoder_sparse_step.to_string(),
                fix: "use a positive number of layers per sparse layer",
            });
        }
        Ok((0..num_hidden_layers)
            .map(|i| {
                !mlp_only_layers.contains(&i)
                    && num_experts > 0
                    && (i + 1) % decoder_sparse_step == 0
            })
            .collect())
    }
}

/// A family's `XForQuestionAnswering` (`GenericForQuestionAnswering`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuestionAnsweringClass {
    /// The class name (`LlamaForQuestionAnswering`).
    pub name: &'static str,
    /// Its `base_model_prefix`: `"transformer"` for Llama, Qwen2 and Qwen3 ("for BC"
    /// upstream), `"model"` for Mistral.
    pub base_model_prefix: &'static str,
}

/// What Phi-3 changes in Llama's layers (upstream `modeling_phi3.py`): the fused
/// `qkv_proj` (registered after `o_proj`) and `gate_up_proj` (gate first), no biases, a
/// rotary embedding over part of each head (`partial_rotary_factor`), and dropout on the
/// attention's and the MLP's outputs before their residuals.
#[derive(Debug, Clone, PartialEq)]
pub struct Phi3 {
    /// `resid_pdrop`.
    pub resid_pdrop: f64,
}

/// What gpt-oss changes in the mixture-of-experts layers (upstream `modeling_gpt_oss.py`):
/// attention sinks (`self_attn.sinks`, one logit per head joining each softmax, then dropped)
/// through the eager attention (its SDPA is off upstream), OLMo 2's RMSNorm (`(w · x).to(dtype)`),
/// the MLP `GptOssMLP` (`mlp.router` with a bias, softmax over the top-k logits; the experts
/// transposed with biases and the clamped, interleaved SwiGLU).
#[derive(Debug, Clone, PartialEq)]
pub struct GptOss {
    /// `swiglu_alpha`.
    pub swiglu_alpha: f64,
    /// `swiglu_limit`.
    pub swiglu_limit: f64,
}

/// What Qwen3.5 and Qwen3.5-MoE change in Llama's layers (upstream `modeling_qwen3_5.py`):
/// hybrid layers — Gated DeltaNet linear attention (`linear_attn`,
/// [`tchtrain_nn::GatedDeltaNet`] with upstream's torch fallbacks) where `layer_types` says
/// `linear_attention`, elsewhere the full attention with an output gate (`q_proj` twice as
/// wide: each head's query and gate; the attention's output times `sigmoid(gate)` before
/// `o_proj`) —, the zero-centred RMSNorm (`1 + weight`, as Gemma's) everywhere but the
/// linear layers' gated norm, partial rotary embeddings, the padding zeroed in the linear
/// layers' inputs (upstream's `apply_mask_to_padding_states`).
///
/// Upstream's multimodal RoPE (`mrope_section`) gives text positions (the three position rows
/// equal) the one-dimensional RoPE, which is what runs here.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen3_5 {
    /// Which layers are linear attention (the others full attention).
    pub linear_layers: Vec<bool>,
    /// The linear layers' sizes.
    pub linear: tchtrain_nn::GatedDeltaNetSizes,
}

/// What Gemma 4 changes in Gemma 3's layers (upstream `modeling_gemma4.py`; see
/// `crate::gemma4`). With it, [`Family::gemma`] holds the final soft-capping and the
/// sandwich norms; every norm is `Gemma4RMSNorm` and the attention is unscaled.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma4 {
    /// Each layer's `(head_dim, num_key_value_heads)` (upstream's `per_layer_config`).
    pub layer_heads: Vec<(i64, i64)>,
    /// `attention_k_eq_v`: the full layers' values are their keys' projection (no `v_proj`).
    pub attention_k_eq_v: bool,
    /// Upstream's `kv_sharing_modes`.
    pub kv_sharing: Vec<KvSharing>,
    /// `use_double_wide_mlp`: the MLPs of the layers that reuse keys and values are twice as
    /// wide.
    pub use_double_wide_mlp: bool,
    /// `(hidden_size_per_layer_input, vocab_size_per_layer_input)`: the per-layer input
    /// embeddings (PLE), when on.
    pub per_layer_input: Option<(i64, i64)>,
    /// `enable_moe_block`: `(num_experts, top_k_experts, moe_intermediate_size)`.
    pub moe: Option<(i64, i64, i64)>,
    /// The ids `Gemma4ForConditionalGeneration` embeds as the pad token (its image, video and
    /// audio placeholders, which no tower fills here); empty for the text model.
    pub placeholder_ids: Vec<i64>,
}

/// A Gemma 4 layer's part in the key / value sharing (upstream's `kv_sharing_modes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvSharing {
    /// Its own keys and values.
    Own,
    /// Its own keys and values, which the later layers of its type reuse (`"store"`).
    Store,
    /// No key / value projections: the storing layer's keys and values (`"reuse"`).
    Reuse,
}

/// What Granite changes in Llama's model (upstream `modeling_granite.py`): the embeddings
/// scaled by `embedding_multiplier`, the attention by `attention_multiplier` (instead of
/// `head_dim ** -0.5`), each block's output by `residual_multiplier` before its residual, and
/// the logits divided by `logits_scaling`.
#[derive(Debug, Clone, PartialEq)]
pub struct Granite {
    /// `embedding_multiplier`.
    pub embedding_multiplier: f64,
    /// `residual_multiplier`.
    pub residual_multiplier: f64,
    /// `attention_multiplier`: the attention's scale.
    pub attention_multiplier: f64,
    /// `logits_scaling`.
    pub logits_scaling: f64,
}

/// What Gemma 1–3 change in Llama's layers (upstream `modeling_gemma*.py`) besides
/// [`Family`]'s flags: `GemmaRMSNorm` (`1 + weight` in float32, weights initialised to
/// zeros) everywhere, and the embeddings scaled by `√hidden_size` (rounded to float32, then
/// to the weights' dtype), always; the rest per version.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma {
    /// Gemma 2 / 3: `post_attention_layernorm` on the attention's output before the
    /// residual, and `pre_feedforward_layernorm` / `post_feedforward_layernorm` around the MLP.
    pub sandwich_norms: bool,
    /// Gemma 2 / 3: the attention scale is `query_pre_attn_scalar ** -0.5`.
    pub query_pre_attn_scalar: Option<f64>,
    /// Gemma 2: attention scores soft-capped as `tanh(x / cap) · cap` before the mask.
    pub attn_logit_softcapping: Option<f64>,
    /// Gemma 2 / 3: the causal LM's logits soft-capped as `tanh(x / cap) · cap`.
    pub final_logit_softcapping: Option<f64>,
    /// Upstream's attention is the eager one (Gemma 2's `_supports_sdpa = False`: SDPA
    /// cannot soft-cap).
    pub eager_attention: bool,
    /// Gemma 3: the base model's class is `Gemma3TextModel`, its embedding
    /// `Gemma3TextScaledWordEmbedding`.
    pub text_model: bool,
}

/// A Llama-shaped family's config: upstream's own class (its defaults, its `config.json`),
/// seen as Llama's sizes, RoPE and norms plus the [`Family`] facts.
pub trait DecoderConfig:
    PretrainedConfig + serde::de::DeserializeOwned + Clone + std::fmt::Debug + Send + Sync + 'static
{
    /// Reads and checks `config.json`.
    fn from_file(path: &Path) -> Result<Self>;
    /// The sizes, RoPE, norms and special tokens in Llama's form.
    fn llama(&self) -> LlamaConfig;
    /// What the family changes in the layers.
    fn family(&self) -> Result<Family>;
    /// Keys not interpreted (`use_cache`, ...), kept so that `config.json` round-trips.
    fn extra_mut(&mut self) -> &mut serde_json::Map<String, serde_json::Value>;
    /// `num_labels`, `id2label`, `problem_type`.
    fn labels_mut(&mut self) -> &mut LabelConfig;
    /// A multimodal model's image side (Gemma 3's vision tower and projector), its
    /// variables created under `root`; `None` for a text model.
    fn image_encoder(
        &self,
        _root: &tchtrain_nn::Path<'_>,
    ) -> Result<Option<Box<dyn ImageEncoder>>> {
        Ok(None)
    }
    /// The causal LM's `accepts_loss_kwargs` where the family decides it; `None`: a text
    /// model's `XForCausalLM` takes `num_items_in_batch`, a multimodal checkpoint's language
    /// model (the other towers carried) does not.
    fn accepts_loss_kwargs(&self) -> Option<bool> {
        None
    }
}

/// A multimodal model's image side: the features that replace the embeddings of the image
/// placeholder tokens (upstream's `get_image_features(pixel_values).pooler_output`).
pub trait ImageEncoder: std::fmt::Debug + Send {
    /// The features of `inputs.pixel_values`, `[images, tokens per image, hidden]`.
    fn image_features(&self, inputs: &ModelInputs<'_>, train: bool) -> Result<Tensor>;
    /// The placeholder token the features replace (`image_token_id`).
    fn image_token_id(&self) -> i64;
    /// The vision tower's activation checkpointing (upstream's `gradient_checkpointing`
    /// reaches every checkpointable layer of the model).
    fn checkpointing(&mut self) -> &mut Option<ActivationCheckpointing>;
    /// What `print` shows of its modules beside the language model, in upstream's order
    /// (`vision_tower`, `multi_modal_projector`); `None` where they are not written out.
    fn module_repr(&self) -> Option<Vec<(&'static str, ModuleRepr)>> {
        None
    }
}

impl DecoderConfig for LlamaConfig {
    fn from_file(path: &Path) -> Result<Self> {
        LlamaConfig::from_file(path)
    }
    fn llama(&self) -> LlamaConfig {
        self.clone()
    }
    fn family(&self) -> Result<Family> {
        Ok(Family {
            model_type: "llama",
            causal_lm: "LlamaForCausalLM",
            sequence_classification: Some("LlamaForSequenceClassification"),
            prefix: "Llama",
            qkv_bias: self.attention_bias,
            o_bias: self.attention_bias,
            mlp_bias: self.mlp_bias,
            qk_norm: QkNorm::None,
            clip_qkv: None,
            moe: None,
            sliding_windows: vec![None; self.num_hidden_layers.max(0) as usize],
            rotary_positional: false,
            gemma: None,
            phi3: None,
            granite: None,
            rope_layers: None,
            sliding_rope_parameters: None,
            olmo2: false,
            base_model: "model",
            checkpoint_conversion: None,
            gpt_oss: None,
            qwen3_5: None,
            gemma4: None,
            token_classification: Some("LlamaForTokenClassification"),
            question_answering: Some(QuestionAnsweringClass {
                name: "LlamaForQuestionAnswering",
                base_model_prefix: "transformer",
            }),
        })
    }
    fn extra_mut(&mut self) -> &mut serde_json::Map<String, serde_json::Value> {
        &mut self.extra
    }
    fn labels_mut(&mut self) -> &mut LabelConfig {
        &mut self.labels
    }
}

/// What every Llama-shaped family's config implements alike: `PretrainedConfig` (its
/// `model_type`), and inside its `DecoderConfig` impl (`decoder_config_plumbing!(@methods)`)
/// `from_file`, `extra_mut` and `labels_mut`; and `to_llama!`, its `llama()` from the fields
/// the families share.
macro_rules! decoder_config_plumbing {
    ($config:ty, $model_type:literal) => {
        impl $crate::configuration_utils::PretrainedConfig for $config {
            fn model_type(&self) -> &'static str {
                $model_type
            }
            fn to_json_value(&self) -> $crate::Result<serde_json::Value> {
                $crate::configuration_utils::to_value(self)
            }
            fn labels(&self) -> &$crate::configuration_utils::LabelConfig {
                &self.labels
            }
        }
    };
    (@methods) => {
        fn from_file(path: &std::path::Path) -> $crate::Result<Self> {
            let c: Self = $crate::configuration_utils::read_config(path)?;
            c.llama().validate()?;
            c.family()?;
            Ok(c)
        }
        $crate::llama::decoder_config_plumbing!(@accessors);
    };
    // A text config that a multimodal checkpoint (`model_type` `$multimodal`) holds as its
    // `text_config`: `from_file` reads either.
    (@methods text_of: $multimodal:literal) => {
        fn from_file(path: &std::path::Path) -> $crate::Result<Self> {
            let c: Self = $crate::qwen3_5::read_text_config(path, $multimodal)?;
            c.llama().validate()?;
            c.family()?;
            Ok(c)
        }
        $crate::llama::decoder_config_plumbing!(@accessors);
    };
    (@accessors) => {
        fn extra_mut(&mut self) -> &mut serde_json::Map<String, serde_json::Value> {
            &mut self.extra
        }
        fn labels_mut(&mut self) -> &mut $crate::configuration_utils::LabelConfig {
            &mut self.labels
        }
    };
}
pub(crate) use decoder_config_plumbing;

/// A family config's `llama()`: the shared fields, its `head_dim` and `attention_bias`.
macro_rules! to_llama {
    ($c:expr, head_dim: $head_dim:expr, attention_bias: $bias:expr) => {
        $crate::llama::to_llama!($c, head_dim: $head_dim, attention_bias: $bias,
            hidden_act: $c.hidden_act.clone())
    };
    ($c:expr, head_dim: $head_dim:expr, attention_bias: $bias:expr, hidden_act: $act:expr) => {
        $crate::llama::LlamaConfig {
            vocab_size: $c.vocab_size,
            hidden_size: $c.hidden_size,
            intermediate_size: $c.intermediate_size,
            num_hidden_layers: $c.num_hidden_layers,
            num_attention_heads: $c.num_attention_heads,
            num_key_value_heads: $c.num_key_value_heads,
            head_dim: $head_dim,
            hidden_act: $act,
            max_position_embeddings: $c.max_position_embeddings,
            initializer_range: $c.initializer_range,
            rms_norm_eps: $c.rms_norm_eps,
            attention_bias: $bias,
            attention_dropout: $c.attention_dropout,
            mlp_bias: false,
            pad_token_id: $c.pad_token_id,
            bos_token_id: $c.bos_token_id,
            eos_token_id: $c.eos_token_id.clone(),
            tie_word_embeddings: $c.tie_word_embeddings,
            rope_parameters: $c.rope_parameters.clone(),
            rope_theta: $c.rope_theta,
            rope_scaling: $c.rope_scaling.clone(),
            labels: $c.labels.clone(),
            extra: $c.extra.clone(),
        }
    };
}
pub(crate) use to_llama;

/// The per-layer windows of Qwen's configs (upstream's `__post_init__`): `layer_types`
/// (`full_attention` / `sliding_attention`) or, by default, the layers from
/// `max_window_layers` on sliding when there is a `window` (the config's `sliding_window`
/// with `use_sliding_window`); a sliding layer without a window attends fully, as upstream's.
pub(crate) fn sliding_windows(
    layer_types: Option<&[String]>,
    num_hidden_layers: i64,
    window: Option<i64>,
    max_window_layers: i64,
) -> Result<Vec<Option<i64>>> {
    let default: Vec<String> = (0..num_hidden_layers)
        .map(|i| match window {
            Some(_) if i >= max_window_layers => "sliding_attention".into(),
            _ => "full_attention".into(),
        })
        .collect();
    let layer_types = layer_types.unwrap_or(&default);
    if layer_types.len() as i64 != num_hidden_layers {
        return Err(Error::InvalidConfig {
            field: "layer_types",
            value: format!("{} entries", layer_types.len()),
            fix: "give one entry per layer (num_hidden_layers)",
        });
    }
    layer_types
        .iter()
        .map(|t| match t.as_str() {
            "full_attention" => Ok(None),
            "sliding_attention" if window.is_none() => Err(Error::InvalidConfig {
                field: "layer_types",
                value: "sliding_attention without a window".into(),
                fix: "set sliding_window and use_sliding_window, or make the layer full_attention (upstream cannot build its mask either)",
            }),
            "sliding_attention" => Ok(window),
            other => Err(Error::InvalidConfig {
                field: "layer_types",
                value: other.to_string(),
                fix: "use full_attention or sliding_attention",
            }),
        })
        .collect()
}

impl LlamaConfig {
    /// Reads `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let c: Self = configuration_utils::read_config(path)?;
        c.validate()?;
        Ok(c)
    }

    /// `head_dim` or `hidden_size / num_attention_heads`.
    pub fn head_dim(&self) -> i64 {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// `num_key_value_heads` or `num_attention_heads`.
    pub fn num_key_value_heads(&self) -> i64 {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// The RoPE of this config (upstream's standardised `rope_parameters`).
    pub(crate) fn rope_parameters(&self) -> Result<RopeParameters> {
        let mut p = rope::standardize(
            self.rope_parameters.as_ref(),
            self.rope_scaling.as_ref(),
            self.rope_theta,
            10_000.0,
        );
        // The top-level keys upstream's `standardize_rope_params` moves into the dict:
        // `partial_rotary_factor` (as a default) and `original_max_position_embeddings`
        // (which wins over the dict's for llama3 / yarn / longrope).
        if let Some(f) = self
            .extra
            .get("partial_rotary_factor")
            .filter(|v| v.is_number())
        {
            p.entry("partial_rotary_factor").or_insert(f.clone());
        }
        let original = self
            .extra
            .get("original_max_position_embeddings")
            .and_then(serde_json::Value::as_i64);
        RopeParameters::from_dict(&p, self.head_dim(), self.max_position_embeddings, original)
    }

    pub(crate) fn validate(&self) -> Result<()> {
        configuration_utils::check_sizes(
            &[
                ("vocab_size", self.vocab_size),
                ("hidden_size", self.hidden_size),
                ("intermediate_size", self.intermediate_size),
                ("max_position_embeddings", self.max_position_embeddings),
                ("head_dim", self.head_dim.unwrap_or(1)),
            ],
            ("num_hidden_layers", self.num_hidden_layers),
        )?;
        let kv = self.num_key_value_heads();
        if self.num_attention_heads <= 0 || kv <= 0 || self.num_attention_heads % kv != 0 {
            return Err(Error::InvalidConfig {
                field: "num_key_value_heads",
                value: format!("{kv} (num_attention_heads {})", self.num_attention_heads),
                fix: "num_attention_heads must be a positive multiple of num_key_value_heads",
            });
        }
        self.rope_parameters()?;
        Activation::parse(&self.hidden_act, "hidden_act")?;
        configuration_utils::check_padding_idx(self.pad_token_id, self.vocab_size)?;
        Ok(())
    }

    /// This config with other RoPE parameters (Gemma 3's sliding layers).
    fn with_rope(&self, rope_parameters: &serde_json::Map<String, serde_json::Value>) -> Self {
        Self {
            rope_parameters: Some(rope_parameters.clone()),
            rope_theta: None,
            rope_scaling: None,
            ..self.clone()
        }
    }
}

/// Upstream `LlamaDecoderLayer` and its variants: self-attention and MLP, each behind its
/// norms and a residual connection.
#[derive(Debug)]
struct DecoderLayer {
    ctx: Context,
    self_attn: TokenMixer,
    mlp: FeedForward,
    /// `None` in OLMo 2 / 3.
    input_layernorm: Option<RmsNorm>,
    post_attention_layernorm: RmsNorm,
    /// Gemma 2 / 3's `pre_feedforward_layernorm`.
    pre_feedforward_layernorm: Option<RmsNorm>,
    /// Gemma 2 / 3's and OLMo 2 / 3's `post_feedforward_layernorm`.
    post_feedforward_layernorm: Option<RmsNorm>,
    /// Gemma 4's per-layer input, experts and `layer_scalar`.
    gemma4: Option<Gemma4Layer>,
    /// `model.layers.{i}`, as the underflow / overflow tracer names it.
    name: String,
    /// Upstream's class names of the family's modules.
    classes: Arc<Classes>,
}

/// What a Gemma 4 layer adds after its norms (upstream's registration order).
#[derive(Debug)]
struct Gemma4Layer {
    /// `layer_scalar` `[1]`, a buffer the layer's output is multiplied by in place.
    layer_scalar: Tensor,
    /// `per_layer_input_gate`, `per_layer_projection`, `post_per_layer_input_norm`.
    per_layer: Option<(Linear, Linear, RmsNorm)>,
    /// `enable_moe_block`: the experts beside the MLP.
    moe: Option<Gemma4Moe>,
    /// The layer's index (its slice of the per-layer inputs).
    idx: i64,
}

/// Gemma 4's `router`, `experts` and their norms `post_feedforward_layernorm_1`,
/// `post_feedforward_layernorm_2`, `pre_feedforward_layernorm_2`.
#[derive(Debug)]
struct Gemma4Moe {
    router: crate::gemma4::Gemma4TextRouter,
    experts: tchtrain_nn::Experts,
    post_feedforward_layernorm_1: RmsNorm,
    post_feedforward_layernorm_2: RmsNorm,
    pre_feedforward_layernorm_2: RmsNorm,
}

/// A layer's token mixer: the attention, or Qwen3.5's Gated DeltaNet linear attention
/// (`linear_attn`).
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
enum TokenMixer {
    Attention(SelfAttention),
    Linear {
        net: tchtrain_nn::GatedDeltaNet,
        /// The layer's index (its place in the cache).
        idx: usize,
    },
}

impl TokenMixer {
    fn forward(&self, normed: &Tensor, x: &LayerInputs) -> Result<Tensor> {
        match self {
            Self::Attention(a) => a.forward(normed, x),
            Self::Linear { net, idx } => {
                let mask = x.linear_mask.as_ref();
                Ok(match &x.cache {
                    Some(cache) => cache.with_linear_state(
                        *idx,
                        || Ok(net.empty_state(x.batch)?),
                        |state, fresh| Ok(net.forward(normed, mask, Some((state, fresh)))?),
                    )?,
                    None => net.forward(normed, mask, None)?,
                })
            }
        }
    }
}

/// Upstream `LlamaAttention` and its variants: the projections, rotary embeddings, the
/// key / value cache, attention, `o_proj`.
#[derive(Debug)]
struct SelfAttention {
    ctx: Context,
    projections: AttentionProjections,
    o_proj: Linear,
    /// `q_norm` / `k_norm` (before RoPE).
    qk_norm: Option<(RmsNorm, RmsNorm)>,
    /// Whether the norms take the whole projection (OLMoE) rather than each head.
    qk_norm_projection: bool,
    /// OLMoE's `clip_qkv`.
    clip_qkv: Option<f64>,
    /// gpt-oss's attention sinks `[heads]`.
    sinks: Option<Tensor>,
    /// Qwen3.5's output gate: `q_proj` yields each head's query and gate, the attention's
    /// output is multiplied by `sigmoid(gate)` before `o_proj`.
    output_gate: bool,
    /// Whether this layer attends through the sliding-window mask.
    sliding: bool,
    /// The layer's window (its cache keeps the last `window - 1` tokens).
    window: Option<i64>,
    /// Whether this layer applies the rotary embedding (SmolLM3's NoPE layers do not).
    rotary: bool,
    /// The layer's head size and key / value heads (Gemma 4's full layers have their own).
    head_dim: i64,
    kv_heads: i64,
    /// Gemma 4's key / value sharing.
    sharing: KvSharing,
    /// The layer's index (its place in a key / value cache).
    idx: usize,
    /// `model.layers.{i}.self_attn`.
    name: String,
    class: String,
}

/// A layer's feed-forward block: the dense MLP, or a mixture of experts (one per layer: the
/// variants' sizes do not matter).
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
enum FeedForward {
    Dense(Mlp),
    Sparse(SparseMoeBlock),
}

/// Upstream `XSparseMoeBlock`: the router `gate`, the `experts`, and Qwen2-MoE's gated
/// `shared_expert`.
#[derive(Debug)]
struct SparseMoeBlock {
    ctx: Context,
    gate: tchtrain_nn::TopKRouter,
    experts: tchtrain_nn::Experts,
    /// Qwen2-MoE's `shared_expert` and `shared_expert_gate`.
    shared_expert: Option<(Mlp, Linear)>,
    jitter_noise: f64,
    /// `model.layers.{i}.mlp`.
    name: String,
    class: String,
}

/// Upstream `LlamaMLP` and its variants: `down_proj(act(gate) * up)`.
#[derive(Debug)]
struct Mlp {
    ctx: Context,
    projections: MlpProjections,
    down_proj: Linear,
    /// `model.layers.{i}.mlp`.
    name: String,
    class: String,
}

/// The query, key and value projections: Llama's three, or Phi-3's fused `qkv_proj`.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
enum AttentionProjections {
    Separate {
        q_proj: Linear,
        k_proj: Linear,
        v_proj: Linear,
    },
    Fused {
        qkv_proj: Linear,
    },
    /// Gemma 4's: `q_proj`, `q_norm`, then (unless the layer reuses another's keys and values)
    /// `k_norm`, the scale-less `v_norm`, `k_proj` and `v_proj` (none with
    /// `attention_k_eq_v`: the values are the keys' projection).
    Gemma4 {
        q_proj: Linear,
        q_norm: RmsNorm,
        kv: Option<Gemma4KeyValue>,
    },
}

/// A Gemma 4 layer's own key / value projections and norms.
#[derive(Debug)]
struct Gemma4KeyValue {
    k_norm: RmsNorm,
    v_norm: RmsNorm,
    k_proj: Linear,
    v_proj: Option<Linear>,
}

/// The MLP's gate and up projections: Llama's two, or Phi-3's fused `gate_up_proj`.
#[derive(Debug)]
enum MlpProjections {
    Separate { gate_proj: Linear, up_proj: Linear },
    Fused { gate_up_proj: Linear },
}

/// Upstream's class names of a family's modules (what the underflow / overflow tracer prints).
#[derive(Debug)]
struct Classes {
    rms_norm: String,
    attention: String,
    mlp: String,
    sparse_moe_block: String,
    experts: String,
    linear_attention: String,
    decoder_layer: String,
    rotary: String,
    model: String,
    embedding: String,
}

impl Classes {
    fn new(family: &Family) -> Self {
        let gemma4 = family.gemma4.is_some();
        // Gemma 4's text modules are `Gemma4Text*` (its norm is `Gemma4RMSNorm`).
        let prefix = if gemma4 { "Gemma4Text" } else { family.prefix };
        let text = if !gemma4
            && (family.gemma.as_ref().is_some_and(|g| g.text_model) || family.qwen3_5.is_some())
        {
            "Text"
        } else {
            ""
        };
        Self {
            rms_norm: format!("{}RMSNorm", family.prefix),
            attention: format!("{prefix}Attention"),
            mlp: format!("{prefix}MLP"),
            sparse_moe_block: format!("{prefix}SparseMoeBlock"),
            experts: format!("{prefix}Experts"),
            linear_attention: format!("{prefix}GatedDeltaNet"),
            decoder_layer: format!("{prefix}DecoderLayer"),
            rotary: format!("{prefix}RotaryEmbedding"),
            model: format!("{prefix}{text}Model"),
            embedding: match family.gemma {
                Some(_) if gemma4 => format!("{prefix}ScaledWordEmbedding"),
                Some(_) => format!("{prefix}TextScaledWordEmbedding"),
                None => "Embedding".into(),
            },
        }
    }
}

// SAFETY: parameter tensors and plain values that the forward only reads.
#[allow(unsafe_code)]
unsafe impl ReadOnlyLayer for DecoderLayer {}

/// What a decoder layer's forward needs besides the hidden states (owned, so that a
/// checkpointed layer can run again in the backward).
struct LayerInputs {
    cos: Tensor,
    sin: Tensor,
    /// Gemma 3's cos / sin of the sliding layers (their own RoPE base).
    sliding_cos_sin: Option<(Tensor, Tensor)>,
    mask: attention::Mask,
    /// The sliding-window mask, when a layer has a window.
    sliding_mask: Option<attention::Mask>,
    batch: i64,
    seq: i64,
    heads: i64,
    scale: f64,
    attn_p: f64,
    /// Phi-3's `resid_pdrop` on the attention's and the MLP's outputs (training only).
    resid_p: f64,
    /// Granite's `residual_multiplier` on the attention's and the MLP's outputs.
    residual_multiplier: Option<f64>,
    /// OLMo 2 / 3: cos / sin in float32, the rotated queries and keys cast back.
    rope_cast_back: bool,
    train: bool,
    act: Activation,
    /// Upstream's eager attention (Gemma 2) with its soft-capping, and the hidden dtype its
    /// mask is built in.
    eager: Option<(Option<f64>, Kind)>,
    /// The key / value cache the layers append to (decoding).
    cache: Option<crate::DynamicCache>,
    /// The padding-free layout, when the layers run on the real tokens only.
    unpadded: Option<crate::padding_free::Unpadded>,
    /// The 2-D padding mask the linear-attention layers zero their inputs with (upstream's
    /// `create_recurrent_attention_mask`: none without padding or for one token).
    linear_mask: Option<Tensor>,
    /// The sparse blocks' router logits `[tokens, experts]`, in layer order, when the causal
    /// LM adds the load-balancing loss (`output_router_logits`; never with checkpointed
    /// layers, whose forward runs again in the backward).
    router_logits: Option<std::sync::Mutex<Vec<Tensor>>>,
    /// Gemma 4's per-layer inputs `[batch, seq, layers, hidden_size_per_layer_input]`.
    per_layer_inputs: Option<Tensor>,
    /// Gemma 4's keys and values stored for the layers that reuse them (upstream's
    /// `shared_kv_states`), full then sliding.
    shared_kv: std::sync::Mutex<[Option<(Tensor, Tensor)>; 2]>,
}

// SAFETY: parameter tensors and plain values that the forward only reads.
#[allow(unsafe_code)]
unsafe impl ReadOnlyLayer for LayerInputs {}

impl DecoderLayer {
    /// Upstream `LlamaDecoderLayer.forward`: RMSNorm, rotary self-attention and residual,
    /// then RMSNorm, the gated MLP and residual.
    fn forward(&self, h: &Tensor, x: &LayerInputs) -> Result<Tensor> {
        let a = match &self.input_layernorm {
            Some(norm) => self.self_attn.forward(&norm.forward(h), x)?,
            None => self.self_attn.forward(h, x)?,
        };
        let a = x.resid_dropout(a);
        // Gemma 2 / 3 and OLMo 2 / 3 normalise the attention's output before the residual
        // (and the MLP's output after it); Gemma the MLP's input with its own norm, OLMo not
        // at all; Llama normalises the MLP's input with `post_attention_layernorm`.
        let (h2, normed) = match (
            &self.post_feedforward_layernorm,
            &self.pre_feedforward_layernorm,
        ) {
            (Some(_), pre) => {
                let h2 = h + self.post_attention_layernorm.forward(&a);
                let normed = match pre {
                    Some(pre) => pre.forward(&h2),
                    None => h2.shallow_clone(),
                };
                (h2, normed)
            }
            (None, _) => {
                let h2 = match x.residual_multiplier {
                    Some(m) => h + a * m,
                    None => h + a,
                };
                let normed = self.post_attention_layernorm.forward(&h2);
                (h2, normed)
            }
        };
        let m = match &self.mlp {
            FeedForward::Dense(mlp) => mlp.forward(&normed, x),
            FeedForward::Sparse(block) => block.forward(&normed, x)?,
        };
        // Gemma 4's experts beside the MLP: routed from the residual (the MLP's input before
        // its norm), each branch normalised, summed.
        let m = match self.gemma4.as_ref().and_then(|g| g.moe.as_ref()) {
            Some(moe) => {
                let m1 = moe.post_feedforward_layernorm_1.forward(&m);
                let size = h2.size();
                let flat = h2.f_reshape([-1, size.last().copied().unwrap_or(0)])?;
                let (_, weights, index) = moe.router.forward(&flat)?;
                let e = moe.pre_feedforward_layernorm_2.forward(&flat);
                let e = moe.experts.forward(&e, &index, &weights)?.f_reshape(size)?;
                m1 + moe.post_feedforward_layernorm_2.forward(&e)
            }
            None => m,
        };
        let m = match (&self.post_feedforward_layernorm, x.residual_multiplier) {
            (Some(post), _) => post.forward(&m),
            (None, Some(multiplier)) => m * multiplier,
            (None, None) => x.resid_dropout(m),
        };
        let mut out = h2 + m;
        if let Some(g) = &self.gemma4 {
            // The per-layer input: `post_norm(projection(act(gate(h)) · per_layer_input))`
            // added to the residual.
            if let (Some((gate, projection, norm)), Some(inputs)) =
                (&g.per_layer, &x.per_layer_inputs)
            {
                let t = x.act.apply(&gate.forward(&out)) * inputs.select(2, g.idx);
                out = &out + norm.forward(&projection.forward(&t));
            }
            // `hidden_states *= self.layer_scalar`: computed in the promoted dtype, written
            // back in the hidden states'.
            out = (&out * &g.layer_scalar).to_kind(out.kind());
        }
        self.ctx.leaf(
            || self.name.clone(),
            &self.classes.decoder_layer,
            &[],
            h,
            &out,
        );
        Ok(out)
    }
}

impl LayerInputs {
    /// Phi-3's `resid_pdrop` on the attention's and the MLP's outputs (padded or
    /// padding-free).
    fn resid_dropout(&self, t: Tensor) -> Tensor {
        match &self.unpadded {
            Some(u) => u.dropout(&t, self.resid_p, self.train),
            None if self.train && self.resid_p > 0.0 => {
                tchtrain_nn::dropout(&t, self.resid_p, true)
            }
            None => t,
        }
    }
}

impl SelfAttention {
    /// The attention on the normed hidden states `normed`.
    fn forward(&self, normed: &Tensor, x: &LayerInputs) -> Result<Tensor> {
        if let AttentionProjections::Gemma4 { q_proj, q_norm, kv } = &self.projections {
            let (q, k, v) = self.gemma4_qkv(q_proj, q_norm, kv.as_ref(), normed, x)?;
            return self.attend(q, k, v, None, x);
        }
        let LayerInputs {
            batch, seq, heads, ..
        } = *x;
        let (hd, kv_heads) = (self.head_dim, self.kv_heads);
        // Padding-free, the projections' real tokens go back to the padded layout here.
        let heads_of = |t: Tensor, heads: i64| {
            let t = match &x.unpadded {
                Some(u) => u.scatter(&t),
                None => t,
            };
            t.view([batch, seq, heads, hd])
        };
        let mut gate = None;
        let (q, k, v) = match &self.projections {
            AttentionProjections::Separate {
                q_proj,
                k_proj,
                v_proj,
            } => {
                // Qwen3 normalises each head of a projection right after it (q_proj, q_norm,
                // k_proj, k_norm); OLMoE the whole projection, then clamps all three
                // (`clip_qkv`) before splitting them into heads.
                let clip = |t: Tensor| match self.clip_qkv {
                    Some(c) => t.clamp(-c, c),
                    None => t,
                };
                let project = |proj: &Linear, heads: i64, norm: Option<&RmsNorm>| {
                    let t = proj.forward(normed);
                    let t = match norm {
                        Some(norm) if self.qk_norm_projection => clip(norm.forward(&t)),
                        _ => clip(t),
                    };
                    let t = heads_of(t, heads);
                    let t = match norm {
                        Some(norm) if !self.qk_norm_projection => norm.forward(&t),
                        _ => t,
                    };
                    t.transpose(1, 2)
                };
                let q = if self.output_gate {
                    // Qwen3.5: each head's query and gate side by side in `q_proj`'s output.
                    let t = q_proj.forward(normed);
                    let t = match &x.unpadded {
                        Some(u) => u.scatter(&t),
                        None => t,
                    };
                    let t = t.view([batch, seq, heads, 2 * hd]);
                    gate = Some(t.narrow(-1, hd, hd).reshape([batch, seq, heads * hd]));
                    let q = t.narrow(-1, 0, hd);
                    match &self.qk_norm {
                        Some((norm, _)) => norm.forward(&q),
                        None => q,
                    }
                    .transpose(1, 2)
                } else {
                    project(q_proj, heads, self.qk_norm.as_ref().map(|(q, _)| q))
                };
                let k = project(k_proj, kv_heads, self.qk_norm.as_ref().map(|(_, k)| k));
                let v = heads_of(clip(v_proj.forward(normed)), kv_heads).transpose(1, 2);
                (q, k, v)
            }
            AttentionProjections::Gemma4 { .. } => unreachable!("handled above"),
            AttentionProjections::Fused { qkv_proj } => {
                let qkv = qkv_proj.forward(normed);
                let (q_len, kv_len) = (heads * hd, kv_heads * hd);
                let part = |start: i64, len: i64, heads: i64| {
                    heads_of(qkv.narrow(-1, start, len), heads).transpose(1, 2)
                };
                (
                    part(0, q_len, heads),
                    part(q_len, kv_len, kv_heads),
                    part(q_len + kv_len, kv_len, kv_heads),
                )
            }
        };
        let (cos, sin) = match (&x.sliding_cos_sin, self.sliding) {
            (Some((cos, sin)), true) => (cos, sin),
            _ => (&x.cos, &x.sin),
        };
        // Phi-3's partial rotary: the first `rotary_dim` of each head rotate, the rest pass.
        let rotary_dim = cos.size().last().copied().unwrap_or(hd);
        let rotate = |t: &Tensor| {
            if rotary_dim == hd {
                t * cos + rotate_half(t) * sin
            } else {
                let r = t.narrow(-1, 0, rotary_dim);
                let pass = t.narrow(-1, rotary_dim, hd - rotary_dim);
                Tensor::cat(&[&r * cos + rotate_half(&r) * sin, pass], -1)
            }
        };
        let (q, k) = match (self.rotary, x.rope_cast_back) {
            (false, _) => (q, k),
            (true, false) => (rotate(&q), rotate(&k)),
            // OLMo 2 / 3: float32 cos / sin, the rotated queries and keys cast back.
            (true, true) => (rotate(&q).to_kind(q.kind()), rotate(&k).to_kind(k.kind())),
        };
        // The cache holds the keys after the rotary embedding, as upstream's.
        let (k, v) = match &x.cache {
            Some(cache) => match self.window {
                Some(w) => cache.update_sliding(self.idx, w, &k, &v)?,
                None => cache.update(self.idx, &k, &v)?,
            },
            None => (k, v),
        };
        self.attend(q, k, v, gate, x)
    }

    /// Gemma 4's queries, keys and values: each projection normalised per head and rotated
    /// before the heads' transpose (upstream's `unsqueeze_dim=2`), the values normalised
    /// without a scale; a reusing layer takes the storing layer's keys and values.
    fn gemma4_qkv(
        &self,
        q_proj: &Linear,
        q_norm: &RmsNorm,
        kv: Option<&Gemma4KeyValue>,
        normed: &Tensor,
        x: &LayerInputs,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let (batch, seq, hd) = (x.batch, x.seq, self.head_dim);
        let (cos, sin) = match (&x.sliding_cos_sin, self.sliding) {
            (Some((cos, sin)), true) => (cos, sin),
            _ => (&x.cos, &x.sin),
        };
        let (cos, sin) = (cos.transpose(1, 2), sin.transpose(1, 2));
        let rope = |t: &Tensor| t * &cos + rotate_half(t) * &sin;
        let q = q_norm.forward(&q_proj.forward(normed).view([batch, seq, -1, hd]));
        let q = rope(&q).transpose(1, 2);
        let slot = usize::from(self.sliding);
        let shared_kv = || {
            x.shared_kv.lock().map_err(|_| Error::InvalidArgument {
                field: "num_kv_shared_layers",
                detail: "a layer panicked while storing its keys and values".into(),
            })
        };
        let (k, v) = match kv {
            None => shared_kv()?[slot]
                .as_ref()
                .map(|(k, v)| (k.shallow_clone(), v.shallow_clone()))
                .ok_or_else(|| Error::InvalidArgument {
                    field: "num_kv_shared_layers",
                    detail: format!(
                        "{}: no earlier layer of its type stored keys and values to reuse",
                        self.name
                    ),
                })?,
            Some(kv) => {
                let k = kv.k_proj.forward(normed).view([batch, seq, -1, hd]);
                // `attention_k_eq_v`: the values are the keys' projection, before its norm.
                let v = match &kv.v_proj {
                    Some(v_proj) => v_proj.forward(normed).view([batch, seq, -1, hd]),
                    None => k.shallow_clone(),
                };
                let k = rope(&kv.k_norm.forward(&k)).transpose(1, 2);
                let v = kv.v_norm.forward(&v).transpose(1, 2);
                match &x.cache {
                    Some(cache) => match self.window {
                        Some(w) => cache.update_sliding(self.idx, w, &k, &v)?,
                        None => cache.update(self.idx, &k, &v)?,
                    },
                    None => (k, v),
                }
            }
        };
        if self.sharing == KvSharing::Store {
            shared_kv()?[slot] = Some((k.shallow_clone(), v.shallow_clone()));
        }
        Ok((q, k, v))
    }

    /// The attention of the rotated queries over the keys and values (`[batch, heads, seq,
    /// head_dim]`), Qwen3.5's output gate, `o_proj`.
    fn attend(
        &self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        gate: Option<Tensor>,
        x: &LayerInputs,
    ) -> Result<Tensor> {
        let LayerInputs {
            batch, seq, heads, ..
        } = *x;
        let hd = self.head_dim;
        let mask = match (&x.sliding_mask, self.sliding) {
            (Some(m), true) => m,
            _ => &x.mask,
        };
        let a = match x.eager {
            Some((softcap, mask_kind)) => attention::eager(
                &q,
                &k,
                &v,
                mask,
                mask_kind,
                x.attn_p,
                x.train,
                x.scale,
                softcap,
                self.sinks.as_ref(),
            ),
            None => attention::sdpa(&q, &k, &v, mask, x.attn_p, x.scale),
        };
        let a = a.transpose(1, 2).reshape([batch, seq, heads * hd]);
        let a = match gate {
            Some(gate) => a * gate.sigmoid(),
            None => a,
        };
        let a = match &x.unpadded {
            Some(u) => u.gather(&a),
            None => a,
        };
        let a = self.o_proj.forward(&a);
        // Called with keyword arguments: no positional inputs.
        self.ctx.hook(
            || self.name.clone(),
            &self.class,
            &[],
            &[],
            tchtrain_nn::Out::Tuple(&[tchtrain_nn::Var::T(&a), tchtrain_nn::Var::None]),
        );
        Ok(a)
    }
}

impl SparseMoeBlock {
    /// Upstream `XSparseMoeBlock.forward`: the tokens flattened, routed and run through their
    /// experts (plus the gated shared expert), back in the input's shape.
    fn forward(&self, normed: &Tensor, x: &LayerInputs) -> Result<Tensor> {
        let size = normed.size();
        let hidden = size.last().copied().unwrap_or(0);
        // Mixtral's jitter: `hidden_states *= U(1 - noise, 1 + noise)` in training.
        let input = if x.train && self.jitter_noise > 0.0 {
            let noise = normed
                .f_empty_like()?
                .f_uniform_(1.0 - self.jitter_noise, 1.0 + self.jitter_noise)?;
            normed * noise
        } else {
            normed.shallow_clone()
        };
        let flat = input.f_reshape([-1, hidden])?;
        // Qwen2-MoE's shared expert runs first, as upstream's: autograd sums the gradients
        // reaching the input in the reverse order of the uses.
        let shared_out = self
            .shared_expert
            .as_ref()
            .map(|(shared, _)| shared.forward(&flat, x));
        let (logits, weights, index) = self.gate.forward(&flat)?;
        if let Some(collected) = &x.router_logits {
            collected
                .lock()
                .map_err(|_| Error::InvalidArgument {
                    field: "output_router_logits",
                    detail: "a layer panicked while recording its router logits".into(),
                })?
                .push(logits);
        }
        let mut out = self.experts.forward(&flat, &index, &weights)?;
        if let (Some((_, gate)), Some(shared_out)) = (&self.shared_expert, shared_out) {
            out = out + gate.forward(&flat).sigmoid() * shared_out;
        }
        let out = out.f_reshape(size)?;
        self.ctx
            .leaf(|| self.name.clone(), &self.class, &[], normed, &out);
        Ok(out)
    }
}

impl Mlp {
    /// `down_proj(act(gate_proj(x)) * up_proj(x))`, or with Phi-3's fused `gate_up_proj`.
    fn forward(&self, normed: &Tensor, x: &LayerInputs) -> Tensor {
        let n = |rest: &str| format!("{}.{rest}", self.name);
        let (gate, up) = match &self.projections {
            MlpProjections::Separate { gate_proj, up_proj } => {
                let gate = gate_proj.forward(normed);
                let gate = x.act.apply_traced(&self.ctx, &gate, || n("act_fn"));
                (gate, up_proj.forward(normed))
            }
            MlpProjections::Fused { gate_up_proj } => {
                let gate_up = gate_up_proj.forward(normed);
                let half = gate_up.size()[gate_up.dim() - 1] / 2;
                let gate = gate_up.narrow(-1, 0, half);
                let up = gate_up.narrow(-1, half, half);
                let gate = x.act.apply_traced(&self.ctx, &gate, || n("activation_fn"));
                (gate, up)
            }
        };
        let m = self.down_proj.forward(&(gate * up));
        self.ctx
            .leaf(|| self.name.clone(), &self.class, &[], normed, &m);
        m
    }
}

/// Upstream `LlamaModel`: embeddings, decoder layers, final RMSNorm.
#[derive(Debug)]
pub struct LlamaModel {
    ctx: Context,
    /// Where it sits in its model (`model`).
    prefix: String,
    embed_tokens: Embedding,
    layers: Vec<Arc<Shared<DecoderLayer>>>,
    norm: RmsNorm,
    rotary_emb: RotaryEmbedding,
    /// Gemma 3's rotary embedding of the sliding layers.
    sliding_rotary_emb: Option<RotaryEmbedding>,
    /// Gemma 4's per-layer input embeddings (PLE).
    per_layer: Option<PerLayerEmbeddings>,
    act: Activation,
    config: LlamaConfig,
    family: Family,
    /// How this model's checkpoint names its weights: the family's layout as the
    /// checkpoint it was loaded from used it (upstream keeps the conversions that matched a
    /// key), a fresh model's without the prefix changes (upstream drops `PrefixChange`).
    conversion: Option<crate::WeightConversion>,
    classes: Arc<Classes>,
    /// The head calls the model with `input_ids` positionally (the sequence classifier),
    /// which the underflow / overflow tracer shows as an input.
    ids_positional: bool,
    /// Upstream's `gradient_checkpointing` on the decoder layers.
    pub(crate) checkpointing: Option<ActivationCheckpointing>,
}

/// Gemma 4's per-layer input embeddings: `embed_tokens_per_layer` (all layers' inputs packed,
/// scaled by `√hidden_size_per_layer_input`), `per_layer_model_projection` of the embeddings
/// (scaled by `hidden_size ** -0.5`) and its norm.
#[derive(Debug)]
struct PerLayerEmbeddings {
    embed_tokens_per_layer: Embedding,
    per_layer_model_projection: Linear,
    per_layer_projection_norm: RmsNorm,
    hidden_size_per_layer_input: i64,
    vocab_size_per_layer_input: i64,
}

/// Upstream's `model.config.use_cache = ...` on a head: the head's config and its base
/// model's (which decides whether a plain forward builds a cache).
macro_rules! set_use_cache {
    () => {
        fn set_use_cache(&mut self, use_cache: bool) {
            let value = serde_json::Value::Bool(use_cache);
            self.config
                .extra_mut()
                .insert("use_cache".into(), value.clone());
            self.model.config.extra.insert("use_cache".into(), value);
        }
    };
}

/// What every decoder head reads from its `model`: the checkpoint layout (the family's for
/// loading, the one its load used for saving) and the layer class FSDP wraps.
macro_rules! decoder_head_plumbing {
    () => {
        fn weight_conversion(&self) -> Option<crate::WeightConversion> {
            self.model.conversion
        }
        fn load_conversion(&self) -> Option<crate::WeightConversion> {
            self.model.family.checkpoint_conversion
        }
        fn set_weight_conversion(&mut self, conversion: Option<crate::WeightConversion>) {
            self.model.conversion = conversion;
        }
        fn no_split_modules(&self) -> Vec<String> {
            vec![self.model.classes.decoder_layer.clone()]
        }
        fn set_quantization_config(
            &mut self,
            config: Option<serde_json::Value>,
        ) -> crate::Result<()> {
            match config {
                Some(c) => {
                    self.config
                        .extra_mut()
                        .insert("quantization_config".into(), c);
                }
                None => {
                    self.config.extra_mut().remove("quantization_config");
                }
            }
            Ok(())
        }
        // Gemma 4's `layer_scalar`s.
        fn buffer_names(&self) -> Vec<String> {
            match &self.model.family.gemma4 {
                Some(_) => (0..self.model.layers.len())
                    .map(|i| format!("{}.layers.{i}.layer_scalar", self.model.family.base_model))
                    .collect(),
                None => Vec::new(),
            }
        }
    };
}

/// What `print` shows of Qwen3.5's Gated DeltaNet (`<Prefix>GatedDeltaNet`): the depthwise
/// causal `Conv1d` over the query / key / value channels, the gated norm (no `extra_repr`),
/// then the projections in upstream's registration order.
fn gated_delta_net_repr(p: &str, s: &tchtrain_nn::GatedDeltaNetSizes) -> ModuleRepr {
    let (h, conv, k) = (s.hidden_size, s.conv_dim(), s.conv_kernel_dim);
    let value_dim = s.num_value_heads * s.value_head_dim;
    ModuleRepr::new(format!("{p}GatedDeltaNet"))
        .child(
            "conv1d",
            ModuleRepr::with_extra(
                "Conv1d",
                format!(
                    "{conv}, {conv}, kernel_size=({k},), stride=(1,), padding=({},), groups={conv}, bias=False",
                    k - 1
                ),
            ),
        )
        .child("norm", ModuleRepr::new(format!("{p}RMSNormGated")))
        .child("out_proj", ModuleRepr::linear(value_dim, h, false))
        .child("in_proj_qkv", ModuleRepr::linear(h, conv, false))
        .child("in_proj_z", ModuleRepr::linear(h, value_dim, false))
        .child("in_proj_b", ModuleRepr::linear(h, s.num_value_heads, false))
        .child("in_proj_a", ModuleRepr::linear(h, s.num_value_heads, false))
}

fn rotate_half(x: &Tensor) -> Tensor {
    let half = x.size().last().copied().unwrap_or(0) / 2;
    let x1 = x.narrow(-1, 0, half);
    let x2 = x.narrow(-1, half, half);
    Tensor::cat(&[x2.neg(), x1], -1)
}

impl LlamaModel {
    /// What `print(model.model)` shows, for the families whose modules are Llama's under
    /// the family's class names (Llama, Mistral, Qwen2, Qwen3), Gemma 1–3's (a scaled
    /// embedding, Gemma 2 / 3's four norms a layer) and Phi-3's (fused projections, residual
    /// dropouts); `None` for the others (their experts, extra norms, per-layer embeddings,
    /// ... are not written out).
    pub(crate) fn module_repr(&self) -> Option<ModuleRepr> {
        let f = &self.family;
        let plain = matches!(
            f.model_type,
            "llama"
                | "mistral"
                | "qwen2"
                | "qwen3"
                | "gemma"
                | "gemma2"
                | "gemma3_text"
                | "phi3"
                | "granite"
                | "smollm3"
                | "olmo2"
                | "olmo3"
                | "mixtral"
                | "qwen2_moe"
                | "qwen3_moe"
                | "olmoe"
                | "gpt_oss"
                | "qwen3_5_text"
                | "gemma3"
                | "gemma4_text"
                | "qwen3_5_moe_text"
        ) && (f.base_model == "model" || f.model_type == "gemma3")
            && self.per_layer.is_none();
        if f.gemma4.is_some() {
            return self.gemma4_module_repr();
        }
        // OLMo 3's sliding layers' RoPE is not a module of its own upstream.
        if !plain || (self.sliding_rotary_emb.is_some() && f.gemma.is_none() && !f.olmo2) {
            return None;
        }
        let (c, p) = (&self.config, f.prefix);
        let (h, head_dim, inner) = (c.hidden_size, c.head_dim(), c.intermediate_size);
        let (q, kv) = (
            c.num_attention_heads * head_dim,
            c.num_key_value_heads() * head_dim,
        );
        let norm = |dim| ModuleRepr::rms_norm(format!("{p}RMSNorm"), dim, c.rms_norm_eps);
        let mut attention = ModuleRepr::new(format!("{p}Attention"));
        attention = match f.phi3 {
            Some(_) => attention
                .child("o_proj", ModuleRepr::linear(q, h, f.o_bias))
                .child("qkv_proj", ModuleRepr::linear(h, q + 2 * kv, f.qkv_bias)),
            // Qwen3.5's query projection also gives each head's output gate.
            None => attention
                .child(
                    "q_proj",
                    ModuleRepr::linear(h, q * if f.qwen3_5.is_some() { 2 } else { 1 }, f.qkv_bias),
                )
                .child("k_proj", ModuleRepr::linear(h, kv, f.qkv_bias))
                .child("v_proj", ModuleRepr::linear(h, kv, f.qkv_bias))
                .child("o_proj", ModuleRepr::linear(q, h, f.o_bias)),
        };
        match f.qk_norm {
            QkNorm::PerHead => {
                attention = attention
                    .child("q_norm", norm(head_dim))
                    .child("k_norm", norm(head_dim));
            }
            QkNorm::Projection => {
                attention = attention.child("q_norm", norm(q)).child("k_norm", norm(kv));
            }
            QkNorm::None => {}
        }
        let act = ModuleRepr::new(self.act.class_name());
        let dense_mlp = |inner| {
            ModuleRepr::new(format!("{p}MLP"))
                .child("gate_proj", ModuleRepr::linear(h, inner, f.mlp_bias))
                .child("up_proj", ModuleRepr::linear(h, inner, f.mlp_bias))
                .child("down_proj", ModuleRepr::linear(inner, h, f.mlp_bias))
                .child("act_fn", ModuleRepr::new(self.act.class_name()))
        };
        // A mixture-of-experts block (the router and the fused experts have no
        // `extra_repr`; Qwen2-MoE's gated shared expert after them).
        // gpt-oss's MLP is the router and the experts, neither with an `extra_repr`.
        let sparse = f.moe.as_ref().map(|moe| {
            if f.gpt_oss.is_some() {
                return ModuleRepr::new(format!("{p}MLP"))
                    .child("router", ModuleRepr::new(format!("{p}TopKRouter")))
                    .child("experts", ModuleRepr::new(format!("{p}Experts")));
            }
            let router = ModuleRepr::new(format!("{p}TopKRouter"));
            let experts = ModuleRepr::new(format!("{p}Experts"))
                .child("act_fn", ModuleRepr::new(self.act.class_name()));
            let mut block = ModuleRepr::new(format!("{p}SparseMoeBlock"));
            block = match moe.router_first {
                true => block.child("gate", router).child("experts", experts),
                false => block.child("experts", experts).child("gate", router),
            };
            if let Some(shared) = moe.shared_expert_intermediate_size {
                block = block
                    .child("shared_expert", dense_mlp(shared))
                    .child("shared_expert_gate", ModuleRepr::linear(h, 1, false));
            }
            block
        });
        let mlp = match f.phi3 {
            Some(_) => ModuleRepr::new(format!("{p}MLP"))
                .child("gate_up_proj", ModuleRepr::linear(h, 2 * inner, f.mlp_bias))
                .child("down_proj", ModuleRepr::linear(inner, h, f.mlp_bias))
                .child("activation_fn", act),
            None => dense_mlp(inner),
        };
        let layer = |i: usize| {
            let mlp = match (&sparse, &f.moe) {
                (Some(block), Some(moe)) if moe.sparse_layers.get(i) == Some(&true) => {
                    block.clone()
                }
                _ => mlp.clone(),
            };
            let mut layer = ModuleRepr::new(format!("{p}DecoderLayer"));
            layer = match &f.qwen3_5 {
                Some(q35) if q35.linear_layers.get(i) == Some(&true) => {
                    layer.child("linear_attn", gated_delta_net_repr(p, &q35.linear))
                }
                _ => layer.child("self_attn", attention.clone()),
            };
            layer = layer.child("mlp", mlp);
            // OLMo 2's layer normalises the attention's and the MLP's outputs, with no
            // input norm.
            if f.olmo2 {
                return layer
                    .child("post_attention_layernorm", norm(h))
                    .child("post_feedforward_layernorm", norm(h));
            }
            layer = layer
                .child("input_layernorm", norm(h))
                .child("post_attention_layernorm", norm(h));
            if f.gemma.as_ref().is_some_and(|g| g.sandwich_norms) {
                layer = layer
                    .child("pre_feedforward_layernorm", norm(h))
                    .child("post_feedforward_layernorm", norm(h));
            }
            if let Some(phi3) = &f.phi3 {
                layer = layer
                    .child("resid_attn_dropout", ModuleRepr::dropout(phi3.resid_pdrop))
                    .child("resid_mlp_dropout", ModuleRepr::dropout(phi3.resid_pdrop));
            }
            layer
        };
        // Gemma's embedding is `<Prefix>TextScaledWordEmbedding` (an `nn.Embedding`'s text),
        // Gemma 3's base model `Gemma3TextModel`.
        let mut embed = ModuleRepr::embedding(c.vocab_size, h, c.pad_token_id);
        let mut model_class = format!("{p}Model");
        let mut rotary_class = format!("{p}RotaryEmbedding");
        if let Some(g) = &f.gemma {
            embed = embed.renamed(format!("{p}TextScaledWordEmbedding"));
            if g.text_model {
                model_class = format!("{p}TextModel");
            }
        }
        if f.qwen3_5.is_some() {
            model_class = format!("{p}TextModel");
            rotary_class = format!("{p}TextRotaryEmbedding");
        }
        Some(
            ModuleRepr::new(model_class)
                .child("embed_tokens", embed)
                .child(
                    "layers",
                    ModuleRepr::module_list((0..self.layers.len()).map(layer).collect()),
                )
                .child("norm", norm(h))
                .child("rotary_emb", ModuleRepr::new(rotary_class)),
        )
    }

    /// What `print` shows of Gemma 4's text model (`None` for the multimodal model, whose
    /// towers are not written out): each layer's own head size, the layers that reuse
    /// another's keys and values without their key / value projections and norms, the full
    /// layers' keys doubling as values (`attention_k_eq_v`: no `v_proj`), the wider MLPs
    /// (`use_double_wide_mlp`), the mixture-of-experts block beside the MLP (its router, the
    /// fused experts and three more norms), the per-layer inputs (the gate and projection
    /// of each layer, the model's packed embedding and projection); `Gemma4RMSNorm` has no
    /// `extra_repr`.
    fn gemma4_module_repr(&self) -> Option<ModuleRepr> {
        let (f, c) = (&self.family, &self.config);
        let g4 = f.gemma4.as_ref()?;
        if f.base_model != "model" {
            return None;
        }
        let (p, h) = (f.prefix, c.hidden_size);
        let norm = || ModuleRepr::new(format!("{p}RMSNorm"));
        let act = || ModuleRepr::new(self.act.class_name());
        let n = self.layers.len();
        let layer = |i: usize| {
            let (head_dim, kv_heads) = g4.layer_heads[i];
            let (q, kv) = (c.num_attention_heads * head_dim, kv_heads * head_dim);
            let full = f.sliding_windows.get(i).is_some_and(Option::is_none);
            let sharing = g4.kv_sharing[i];
            let mut attention = ModuleRepr::new(format!("{p}TextAttention"))
                .child("q_proj", ModuleRepr::linear(h, q, f.qkv_bias))
                .child("q_norm", norm());
            if sharing != KvSharing::Reuse {
                attention = attention
                    .child("k_norm", norm())
                    .child("v_norm", norm())
                    .child("k_proj", ModuleRepr::linear(h, kv, f.qkv_bias));
                if !(g4.attention_k_eq_v && full) {
                    attention = attention.child("v_proj", ModuleRepr::linear(h, kv, f.qkv_bias));
                }
            }
            attention = attention.child("o_proj", ModuleRepr::linear(q, h, f.o_bias));
            let inner = c.intermediate_size
                * if g4.use_double_wide_mlp && sharing == KvSharing::Reuse {
                    2
                } else {
                    1
                };
            let mut layer = ModuleRepr::new(format!("{p}TextDecoderLayer"))
                .child("self_attn", attention)
                .child(
                    "mlp",
                    ModuleRepr::new(format!("{p}TextMLP"))
                        .child("gate_proj", ModuleRepr::linear(h, inner, f.mlp_bias))
                        .child("up_proj", ModuleRepr::linear(h, inner, f.mlp_bias))
                        .child("down_proj", ModuleRepr::linear(inner, h, f.mlp_bias))
                        .child("act_fn", act()),
                )
                .child("input_layernorm", norm())
                .child("post_attention_layernorm", norm())
                .child("pre_feedforward_layernorm", norm())
                .child("post_feedforward_layernorm", norm());
            if let Some((num_experts, _, _)) = g4.moe {
                layer = layer
                    .child(
                        "router",
                        ModuleRepr::new(format!("{p}TextRouter"))
                            .child("norm", norm())
                            .child("proj", ModuleRepr::linear(h, num_experts, false)),
                    )
                    .child(
                        "experts",
                        ModuleRepr::new(format!("{p}TextExperts")).child("act_fn", act()),
                    )
                    .child("post_feedforward_layernorm_1", norm())
                    .child("post_feedforward_layernorm_2", norm())
                    .child("pre_feedforward_layernorm_2", norm());
            }
            if let Some((hp, _)) = g4.per_layer_input {
                layer = layer
                    .child("act_fn", act())
                    .child("per_layer_input_gate", ModuleRepr::linear(h, hp, false))
                    .child("per_layer_projection", ModuleRepr::linear(hp, h, false))
                    .child("post_per_layer_input_norm", norm());
            }
            layer
        };
        let scaled = format!("{p}TextScaledWordEmbedding");
        let mut model = ModuleRepr::new(format!("{p}TextModel"))
            .child(
                "embed_tokens",
                ModuleRepr::embedding(c.vocab_size, h, c.pad_token_id).renamed(scaled.clone()),
            )
            .child(
                "layers",
                ModuleRepr::module_list((0..n).map(layer).collect()),
            )
            .child("norm", norm())
            .child(
                "rotary_emb",
                ModuleRepr::new(format!("{p}TextRotaryEmbedding")),
            );
        if let Some((hp, vocab_pl)) = g4.per_layer_input {
            model = model
                .child(
                    "embed_tokens_per_layer",
                    ModuleRepr::embedding(vocab_pl, n as i64 * hp, c.pad_token_id).renamed(scaled),
                )
                .child(
                    "per_layer_model_projection",
                    ModuleRepr::linear(h, n as i64 * hp, false),
                )
                .child("per_layer_projection_norm", norm());
        }
        Some(model)
    }

    /// Creates the variables under `p` (upstream prefix `model`).
    pub fn new(p: tchtrain_nn::Path<'_>, config: &LlamaConfig) -> Result<Self> {
        Self::with_family(p, config, config.family()?)
    }

    /// [`new`](Self::new) for a Llama-shaped family's layers.
    pub fn with_family(
        p: tchtrain_nn::Path<'_>,
        config: &LlamaConfig,
        family: Family,
    ) -> Result<Self> {
        config.validate()?;
        if family.sliding_windows.len() as i64 != config.num_hidden_layers {
            return Err(Error::InvalidConfig {
                field: "layer_types",
                value: format!("{} windows", family.sliding_windows.len()),
                fix: "give one entry per layer (num_hidden_layers)",
            });
        }
        let classes = Arc::new(Classes::new(&family));
        let g4 = family.gemma4.as_ref();
        // Gemma 4's full layers rotate their own (wider) heads.
        let rope = match g4.and_then(|g| {
            g.layer_heads
                .iter()
                .zip(&family.sliding_windows)
                .find(|(_, w)| w.is_none())
                .map(|(h, _)| h.0)
        }) {
            Some(full_head_dim) => LlamaConfig {
                head_dim: Some(full_head_dim),
                ..config.clone()
            }
            .rope_parameters()?,
            None => config.rope_parameters()?,
        };
        if let Some(g) = g4
            && (g.layer_heads.len() as i64 != config.num_hidden_layers
                || g.kv_sharing.len() as i64 != config.num_hidden_layers)
        {
            return Err(Error::InvalidConfig {
                field: "per_layer_config",
                value: format!("{} layers", g.layer_heads.len()),
                fix: "give one entry per layer (num_hidden_layers)",
            });
        }
        if rope.dim() != config.head_dim()
            && family.phi3.is_none()
            && family.qwen3_5.is_none()
            && g4.is_none()
        {
            // Upstream's Llama-shaped rotary embeddings rotate the whole head.
            return Err(Error::InvalidConfig {
                field: "rope_parameters.partial_rotary_factor",
                value: format!(
                    "rotary dimension {} of head_dim {}",
                    rope.dim(),
                    config.head_dim()
                ),
                fix: "this family rotates whole heads (partial_rotary_factor 1.0); Phi-3 and Qwen3.5 have partial rotary",
            });
        }
        let gemma = family.gemma.as_ref();
        let rms_norm = |p: tchtrain_nn::Path<'_>, dim: i64| match gemma {
            Some(_) if g4.is_some() => {
                RmsNorm::gemma4(p, dim, config.rms_norm_eps, true, classes.rms_norm.clone())
            }
            Some(_) => RmsNorm::gemma(p, dim, config.rms_norm_eps, classes.rms_norm.clone()),
            // Qwen3.5's zero-centred RMSNorm is Gemma's.
            None if family.qwen3_5.is_some() => {
                RmsNorm::gemma(p, dim, config.rms_norm_eps, classes.rms_norm.clone())
            }
            None if family.olmo2 || family.gpt_oss.is_some() => {
                RmsNorm::olmo(p, dim, config.rms_norm_eps, classes.rms_norm.clone())
            }
            None => RmsNorm::new(p, dim, config.rms_norm_eps, classes.rms_norm.clone()),
        };
        let (d, std) = (config.hidden_size, config.initializer_range);
        let act = Activation::parse(&config.hidden_act, "hidden_act")?;
        if let Some(moe) = &family.moe {
            moe.validate(config.num_hidden_layers)?;
        }
        if let Some(q) = &family.qwen3_5
            && q.linear_layers.len() as i64 != config.num_hidden_layers
        {
            return Err(Error::InvalidConfig {
                field: "layer_types",
                value: format!("{} entries", q.linear_layers.len()),
                fix: "give one entry per layer (num_hidden_layers)",
            });
        }
        let (hd, heads, kv) = (
            config.head_dim(),
            config.num_attention_heads,
            config.num_key_value_heads(),
        );
        // Created in upstream's registration order (embed_tokens, layers, norm):
        // `model.parameters()` follows it, and gradient clipping sums the per-parameter norms
        // in that order.
        let embed_tokens = Embedding::with_padding(
            &p / "embed_tokens",
            config.vocab_size,
            d,
            std,
            config.pad_token_id,
        )
        .with_class(classes.embedding.clone());
        let layers = (0..config.num_hidden_layers)
            .map(|i| -> Result<Arc<Shared<DecoderLayer>>> {
                let l = &p / "layers" / i;
                let a = &l / "self_attn";
                let m = &l / "mlp";
                let linear = |p: tchtrain_nn::Path<'_>, i: i64, o: i64, bias: bool| {
                    Linear::in_layer(p, i, o, bias, std)
                };
                let linear_layer = family
                    .qwen3_5
                    .as_ref()
                    .filter(|q| q.linear_layers[i as usize]);
                let self_attn = if let Some(q) = linear_layer {
                    TokenMixer::Linear {
                        net: tchtrain_nn::GatedDeltaNet::new(
                            &l / "linear_attn",
                            q.linear,
                            act,
                            config.rms_norm_eps,
                            std,
                            classes.linear_attention.clone(),
                        )?,
                        idx: i as usize,
                    }
                } else {
                    // Created in upstream's registration order: Phi-3's attention registers
                    // `o_proj` before `qkv_proj`.
                    // gpt-oss's `sinks`: a parameter of the attention itself, so `parameters()`
                    // yields it before the projections' (submodules').
                    let sinks = family.gpt_oss.as_ref().map(|_| {
                        tchtrain_nn::initialization::var(
                            &a,
                            "sinks",
                            &[heads],
                            tchtrain_nn::initialization::normal(std),
                        )
                    });
                    // Gemma 4's layer sizes and projections, in its registration order.
                    let (layer_hd, layer_kv, sharing) = match g4 {
                        Some(g) => (
                            g.layer_heads[i as usize].0,
                            g.layer_heads[i as usize].1,
                            g.kv_sharing[i as usize],
                        ),
                        None => (hd, kv, KvSharing::Own),
                    };
                    let gemma4_projections = g4.map(|g| {
                        let sliding = family.sliding_windows[i as usize].is_some();
                        let norm = |p: tchtrain_nn::Path<'_>, scale: bool| {
                            RmsNorm::gemma4(
                                p,
                                layer_hd,
                                config.rms_norm_eps,
                                scale,
                                classes.rms_norm.clone(),
                            )
                        };
                        let q_proj = linear(&a / "q_proj", d, heads * layer_hd, family.qkv_bias);
                        let q_norm = norm(&a / "q_norm", true);
                        let kv = (sharing != KvSharing::Reuse).then(|| {
                            let k_norm = norm(&a / "k_norm", true);
                            let v_norm = norm(&a / "v_norm", false);
                            let width = layer_kv * layer_hd;
                            let k_proj = linear(&a / "k_proj", d, width, family.qkv_bias);
                            let v_proj = (!g.attention_k_eq_v || sliding)
                                .then(|| linear(&a / "v_proj", d, width, family.qkv_bias));
                            Gemma4KeyValue {
                                k_norm,
                                v_norm,
                                k_proj,
                                v_proj,
                            }
                        });
                        let o_proj = linear(&a / "o_proj", heads * layer_hd, d, family.o_bias);
                        (AttentionProjections::Gemma4 { q_proj, q_norm, kv }, o_proj)
                    });
                    let (projections, o_proj) = match (gemma4_projections, family.phi3.as_ref()) {
                        (Some(p), _) => p,
                        (None, None) => {
                            // Qwen3.5's `q_proj` also yields each head's output gate.
                            let q_width = heads * hd * if family.qwen3_5.is_some() { 2 } else { 1 };
                            let q_proj = linear(&a / "q_proj", d, q_width, family.qkv_bias);
                            let k_proj = linear(&a / "k_proj", d, kv * hd, family.qkv_bias);
                            let v_proj = linear(&a / "v_proj", d, kv * hd, family.qkv_bias);
                            let o_proj = linear(&a / "o_proj", heads * hd, d, family.o_bias);

                            let separate = AttentionProjections::Separate {
                                q_proj,
                                k_proj,
                                v_proj,
                            };
                            (separate, o_proj)
                        }
                        (None, Some(_)) => {
                            let o_proj = linear(&a / "o_proj", heads * hd, d, false);
                            let qkv_proj = linear(&a / "qkv_proj", d, (heads + 2 * kv) * hd, false);
                            (AttentionProjections::Fused { qkv_proj }, o_proj)
                        }
                    };
                    // Registered after `o_proj`, before the MLP, as upstream's Qwen3Attention
                    // (Gemma 4's are its projections').
                    let qk_norm = match family.qk_norm {
                        _ if g4.is_some() => None,
                        QkNorm::None => None,
                        QkNorm::PerHead => {
                            Some((rms_norm(&a / "q_norm", hd), rms_norm(&a / "k_norm", hd)))
                        }
                        QkNorm::Projection => Some((
                            rms_norm(&a / "q_norm", heads * hd),
                            rms_norm(&a / "k_norm", kv * hd),
                        )),
                    };
                    TokenMixer::Attention(SelfAttention {
                        ctx: a.ctx().clone(),
                        projections,
                        o_proj,
                        qk_norm,
                        qk_norm_projection: family.qk_norm == QkNorm::Projection,
                        clip_qkv: family.clip_qkv,
                        sinks,
                        output_gate: family.qwen3_5.is_some(),
                        sliding: family.sliding_windows[i as usize].is_some(),
                        window: family.sliding_windows[i as usize],
                        rotary: family
                            .rope_layers
                            .as_ref()
                            .is_none_or(|r| r.get(i as usize).copied().unwrap_or(true)),
                        head_dim: layer_hd,
                        kv_heads: layer_kv,
                        sharing,
                        idx: i as usize,
                        name: a.name(),
                        class: classes.attention.clone(),
                    })
                };
                let dense = |m: &tchtrain_nn::Path<'_>, inter: i64, class: &str| {
                    let projections = match family.phi3 {
                        None => MlpProjections::Separate {
                            gate_proj: linear(m / "gate_proj", d, inter, family.mlp_bias),
                            up_proj: linear(m / "up_proj", d, inter, family.mlp_bias),
                        },
                        Some(_) => MlpProjections::Fused {
                            gate_up_proj: linear(m / "gate_up_proj", d, 2 * inter, false),
                        },
                    };
                    Mlp {
                        ctx: m.ctx().clone(),
                        projections,
                        down_proj: linear(m / "down_proj", inter, d, family.mlp_bias),
                        name: m.name(),
                        class: class.to_string(),
                    }
                };
                let mlp = match &family.moe {
                    Some(moe) if moe.sparse_layers[i as usize] => {
                        let gate = |p: tchtrain_nn::Path<'_>| {
                            tchtrain_nn::TopKRouter::new(
                                p,
                                moe.num_experts,
                                d,
                                moe.num_experts_per_tok,
                                std,
                                moe.router,
                            )
                        };
                        let experts = |p: tchtrain_nn::Path<'_>| match &family.gpt_oss {
                            Some(g) => tchtrain_nn::Experts::gpt_oss(
                                p,
                                moe.num_experts,
                                d,
                                moe.moe_intermediate_size,
                                g.swiglu_alpha,
                                g.swiglu_limit,
                                std,
                                classes.experts.clone(),
                            ),
                            None => tchtrain_nn::Experts::new(
                                p,
                                moe.num_experts,
                                d,
                                moe.moe_intermediate_size,
                                act,
                                std,
                                classes.experts.clone(),
                            ),
                        };
                        // gpt-oss calls its router `router`.
                        let router = if family.gpt_oss.is_some() {
                            "router"
                        } else {
                            "gate"
                        };
                        // Created in upstream's registration order.
                        let (gate, experts) = if moe.router_first {
                            let gate = gate(&m / router);
                            (gate, experts(&m / "experts"))
                        } else {
                            let experts = experts(&m / "experts");
                            (gate(&m / router), experts)
                        };
                        let shared_expert = moe.shared_expert_intermediate_size.map(|inter| {
                            let shared = dense(&(&m / "shared_expert"), inter, &classes.mlp);
                            (shared, linear(&m / "shared_expert_gate", d, 1, false))
                        });
                        FeedForward::Sparse(SparseMoeBlock {
                            ctx: m.ctx().clone(),
                            gate,
                            experts,
                            shared_expert,
                            jitter_noise: moe.router_jitter_noise,
                            name: m.name(),
                            class: match family.gpt_oss {
                                Some(_) => classes.mlp.clone(),
                                None => classes.sparse_moe_block.clone(),
                            },
                        })
                    }
                    _ => {
                        // Gemma 4's layers that reuse keys and values may have MLPs twice as
                        // wide (`use_double_wide_mlp`).
                        let wide = g4.is_some_and(|g| {
                            g.use_double_wide_mlp && g.kv_sharing[i as usize] == KvSharing::Reuse
                        });
                        let inter = config.intermediate_size * if wide { 2 } else { 1 };
                        FeedForward::Dense(dense(&m, inter, &classes.mlp))
                    }
                };
                Ok(Arc::new(Shared(DecoderLayer {
                    self_attn,
                    mlp,
                    input_layernorm: (!family.olmo2).then(|| rms_norm(&l / "input_layernorm", d)),
                    post_attention_layernorm: rms_norm(&l / "post_attention_layernorm", d),
                    pre_feedforward_layernorm: gemma
                        .filter(|g| g.sandwich_norms)
                        .map(|_| rms_norm(&l / "pre_feedforward_layernorm", d)),
                    post_feedforward_layernorm: (family.olmo2
                        || gemma.is_some_and(|g| g.sandwich_norms))
                    .then(|| rms_norm(&l / "post_feedforward_layernorm", d)),
                    gemma4: g4.map(|g| Gemma4Layer {
                        layer_scalar: l.tch().ones_no_train("layer_scalar", &[1]),
                        per_layer: g.per_layer_input.map(|(ple, _)| {
                            (
                                linear(&l / "per_layer_input_gate", d, ple, false),
                                linear(&l / "per_layer_projection", ple, d, false),
                                rms_norm(&l / "post_per_layer_input_norm", d),
                            )
                        }),
                        moe: g.moe.map(|(experts, top_k, inter)| Gemma4Moe {
                            router: crate::gemma4::Gemma4TextRouter::new(
                                &l / "router",
                                d,
                                experts,
                                top_k,
                                config.rms_norm_eps,
                                std,
                                classes.rms_norm.clone(),
                            ),
                            experts: tchtrain_nn::Experts::new(
                                &l / "experts",
                                experts,
                                d,
                                inter,
                                act,
                                std,
                                classes.experts.clone(),
                            ),
                            post_feedforward_layernorm_1: rms_norm(
                                &l / "post_feedforward_layernorm_1",
                                d,
                            ),
                            post_feedforward_layernorm_2: rms_norm(
                                &l / "post_feedforward_layernorm_2",
                                d,
                            ),
                            pre_feedforward_layernorm_2: rms_norm(
                                &l / "pre_feedforward_layernorm_2",
                                d,
                            ),
                        }),
                        idx: i,
                    }),
                    name: l.name(),
                    ctx: l.ctx().clone(),
                    classes: Arc::clone(&classes),
                })))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            prefix: p.name(),
            ctx: p.ctx().clone(),
            embed_tokens,
            layers,
            norm: rms_norm(&p / "norm", d),
            // Gemma 4's per-layer input embeddings, registered after the final norm.
            per_layer: g4
                .and_then(|g| g.per_layer_input)
                .map(|(ple, vocab)| PerLayerEmbeddings {
                    embed_tokens_per_layer: Embedding::with_padding(
                        &p / "embed_tokens_per_layer",
                        vocab,
                        config.num_hidden_layers * ple,
                        std,
                        config.pad_token_id,
                    )
                    .with_class(classes.embedding.clone()),
                    per_layer_model_projection: Linear::new(
                        &p / "per_layer_model_projection",
                        d,
                        config.num_hidden_layers * ple,
                        false,
                        std,
                    ),
                    per_layer_projection_norm: rms_norm(&p / "per_layer_projection_norm", ple),
                    hidden_size_per_layer_input: ple,
                    vocab_size_per_layer_input: vocab,
                }),
            rotary_emb: RotaryEmbedding::new(rope, p.device())?,
            sliding_rotary_emb: match family.sliding_rope_parameters.as_ref() {
                Some(rope) => {
                    // Gemma 4's sliding layers rotate their own head size.
                    let sliding_head_dim = g4.and_then(|g| {
                        g.layer_heads
                            .iter()
                            .zip(&family.sliding_windows)
                            .find(|(_, w)| w.is_some())
                            .map(|(h, _)| h.0)
                    });
                    let config = LlamaConfig {
                        head_dim: sliding_head_dim.or(config.head_dim),
                        ..config.with_rope(rope)
                    };
                    Some(RotaryEmbedding::new(config.rope_parameters()?, p.device())?)
                }
                None => None,
            },
            act,
            config: config.clone(),
            conversion: family
                .checkpoint_conversion
                .and_then(crate::WeightConversion::fresh),
            family,
            classes,
            ids_positional: false,
            checkpointing: None,
        })
    }

    /// The token embedding matrix (tied to the LM head when `tie_word_embeddings`).
    pub fn embed_tokens(&self) -> &Tensor {
        &self.embed_tokens.ws
    }

    /// The last hidden state `[batch, seq, hidden]`.
    pub fn forward(&self, inputs: &ModelInputs<'_>, train: bool) -> Result<Tensor> {
        Ok(self.forward_with(inputs, train, false, false, None)?.0)
    }

    /// [`forward`](Self::forward), the layers run padding-free when `padding_free`, the
    /// attention mask pads a token and no cache is used (see `crate::padding_free`): the
    /// last hidden state is then the real tokens' `[tokens, hidden]`, with their layout. With
    /// `router_logits`, the sparse layers' router logits `[batch · seq, experts]` in layer
    /// order come back too (padding-free, zeros at the padding).
    #[allow(clippy::type_complexity)]
    pub(crate) fn forward_with(
        &self,
        inputs: &ModelInputs<'_>,
        train: bool,
        padding_free: bool,
        router_logits: bool,
        vision: Option<&dyn ImageEncoder>,
    ) -> Result<(Tensor, Option<crate::padding_free::Unpadded>, Vec<Tensor>)> {
        if router_logits && train && self.checkpointing.is_some() {
            return Err(Error::InvalidArgument {
                field: "output_router_logits",
                detail: format!(
                    "{}: the load-balancing loss reads the router logits of every layer, which checkpointed layers recompute in the backward: not implemented with gradient_checkpointing here; turn one of them off",
                    self.family.model_type
                ),
            });
        }
        let c = &self.config;
        let ids = inputs.ids()?;
        let vocab = match &self.per_layer {
            Some(p) => c.vocab_size.min(p.vocab_size_per_layer_input),
            None => c.vocab_size,
        };
        // A multimodal model's image placeholders: where the image features go; embedded as
        // token 0 when the id is past the text vocabulary (upstream's `llm_input_ids`).
        let image_tokens = match vision {
            Some(v) => Some(ids.f_eq(v.image_token_id())?),
            None => None,
        };
        let llm_ids = match (vision, &image_tokens) {
            (Some(v), Some(mask)) if v.image_token_id() >= vocab => ids.f_masked_fill(mask, 0)?,
            _ => ids.shallow_clone(),
        };
        let (batch, seq) = crate::check_ids(&llm_ids, vocab, i64::MAX)?;
        let device = self.embed_tokens.ws.device();
        let ids = llm_ids.f_to_device(device)?;
        let g4 = self.family.gemma4.as_ref();
        if let Some(g) = g4 {
            // Gemma 4's KV-sharing layers read the storing layer's keys and values, which a
            // checkpointed layer's recomputation would detach.
            if train && self.checkpointing.is_some() && g.kv_sharing.contains(&KvSharing::Reuse) {
                return Err(Error::InvalidArgument {
                    field: "gradient_checkpointing",
                    detail: format!(
                        "{}: the layers that reuse earlier layers' keys and values (num_kv_shared_layers) need those layers' graph, which checkpointed layers recompute: not implemented with gradient_checkpointing here; train without it",
                        self.family.model_type
                    ),
                });
            }
        }
        // `Gemma4ForConditionalGeneration` embeds its image / video / audio placeholders as
        // the pad token (`llm_input_ids`), for both embeddings.
        let ids = match (g4, c.pad_token_id) {
            (Some(g), Some(pad)) if !g.placeholder_ids.is_empty() => {
                let mut placeholder = ids.f_zeros_like()?.f_to_kind(Kind::Bool)?;
                for &id in &g.placeholder_ids {
                    placeholder = placeholder.f_logical_or(&ids.f_eq(id)?)?;
                }
                ids.f_masked_fill(&placeholder, pad)?
            }
            _ => ids,
        };
        let cache = crate::cache_utils::cache_for_layers(
            inputs.past_key_values,
            train,
            self.checkpointing.is_some(),
        );
        let past = cache.map_or(0, crate::DynamicCache::get_seq_length);
        let positions = match inputs.position_ids {
            Some(p) => p.f_to_device(device)?,
            None => Tensor::arange_start(past, past + seq, (Kind::Int64, device)).unsqueeze(0),
        };
        use tchtrain_nn::{Out, Var, join};
        let n = |rest: &str| join(&self.prefix, rest);
        let mut h = self.embed_tokens.lookup(&ids);
        // Gemma's `embed_scale`: `torch.tensor(hidden_size ** 0.5)` (a float32 buffer),
        // applied in the weights' dtype (and to a LoRA adapter's term in its own).
        let embed_scale = self.family.gemma.is_some().then(|| {
            Tensor::scalar_tensor(
                f64::from((c.hidden_size as f64).sqrt() as f32),
                (Kind::Float, device),
            )
        });
        if let Some(scale) = &embed_scale {
            h = h * scale.to_kind(self.embed_tokens.ws.kind());
        }
        // peft scales the adapter's term by the module's buffer, held in the model's dtype.
        let adapter_scale = embed_scale
            .as_ref()
            .map(|s| s.to_kind(self.embed_tokens.ws.kind()));
        let mut h = self
            .embed_tokens
            .input_forward(&ids, h, adapter_scale.as_ref(), train)?;
        // `Gemma3Model`: the image features scattered over the placeholders' embeddings.
        if let (Some(v), Some(mask), Some(_)) = (vision, &image_tokens, inputs.pixel_values) {
            let features = v.image_features(inputs, train)?;
            h = scatter_image_features(&h, &mask.f_to_device(device)?, &features)?;
        }
        // Granite's `inputs_embeds * embedding_multiplier`, outside the embedding module.
        if let Some(g) = &self.family.granite {
            h = h * g.embedding_multiplier;
        }
        // Gemma 4's per-layer inputs: `(norm(projection(embeddings) · hidden ** -0.5) +
        // embed_tokens_per_layer(ids) · √ple) · 2 ** -0.5`, `[batch, seq, layers, ple]`.
        let per_layer_inputs = match &self.per_layer {
            Some(p) => {
                let ple = p.hidden_size_per_layer_input;
                let table = &p.embed_tokens_per_layer;
                let scale = Tensor::scalar_tensor(
                    f64::from((ple as f64).sqrt() as f32),
                    (Kind::Float, device),
                );
                let token = table.lookup(&ids) * scale.to_kind(table.ws.kind());
                let token = token.f_reshape([batch, seq, c.num_hidden_layers, ple])?;
                let projected =
                    p.per_layer_model_projection.forward(&h) * (c.hidden_size as f64).powf(-0.5);
                let projected = projected.f_reshape([batch, seq, c.num_hidden_layers, ple])?;
                let projected = p.per_layer_projection_norm.forward(&projected);
                Some((projected + token) * 2f64.powf(-0.5))
            }
            None => None,
        };
        // Upstream's rotary embedding: float32 frequencies, cos / sin cast to the hidden dtype.
        // OLMo 2 / 3 keep cos / sin in float32.
        let rope_kind = if self.family.olmo2 {
            Kind::Float
        } else {
            h.kind()
        };
        let (cos, sin) = self.rotary_emb.cos_sin(&positions, rope_kind)?;
        let sliding_cos_sin = match &self.sliding_rotary_emb {
            Some(r) => {
                let (cos, sin) = r.cos_sin(&positions, rope_kind)?;
                Some((cos.unsqueeze(1), sin.unsqueeze(1)))
            }
            None => None,
        };
        // Qwen's models call `rotary_emb(hidden_states, position_ids)` positionally, Llama's
        // and Mistral's with `position_ids=` as a keyword.
        let rotary_inputs = [Var::T(&h), Var::T(&positions)];
        let rotary_inputs = if self.family.rotary_positional {
            &rotary_inputs[..]
        } else {
            &rotary_inputs[..1]
        };
        self.ctx.hook(
            || n("rotary_emb"),
            &self.classes.rotary,
            &[],
            rotary_inputs,
            Out::Tuple(&[Var::T(&cos), Var::T(&sin)]),
        );
        let (cos, sin) = (cos.unsqueeze(1), sin.unsqueeze(1));
        let gemma = self.family.gemma.as_ref();
        // Linear attention runs on the padded layout (upstream's torch fallback has no
        // variable-length path): the padding-free layout is off for those families.
        let unpadded = crate::padding_free::Unpadded::for_forward(
            &self.ctx,
            padding_free && self.family.qwen3_5.is_none() && g4.is_none(),
            cache.is_some(),
            inputs.attention_mask,
            device,
        )?;
        if let Some(u) = &unpadded {
            h = u.gather(&h);
        }
        let builds_cache = crate::configuration_utils::forward_builds_cache(
            &c.extra,
            train,
            self.checkpointing.is_some(),
        );
        // The families' layers share one window size (upstream's `sliding_window`).
        let window = self.family.sliding_windows.iter().flatten().next().copied();
        let (mask, sliding_mask) = match (vision, inputs.token_type_ids) {
            // `create_masks_for_vision_model`: each image's tokens see one another.
            (Some(_), Some(token_type_ids)) => attention::blockwise_causal_masks(
                token_type_ids,
                inputs.attention_mask,
                inputs.position_ids.is_some() && inputs.attention_mask.is_none(),
                batch,
                seq,
                past,
                window,
                device,
            )?,
            _ => attention::causal_masks(
                inputs.position_ids,
                inputs.attention_mask,
                inputs.past_key_values.is_some() || builds_cache,
                batch,
                seq,
                past,
                window,
                device,
            )?,
        };
        let x = Arc::new(Shared(LayerInputs {
            cos,
            sin,
            sliding_cos_sin,
            mask,
            sliding_mask,
            batch,
            seq,
            heads: c.num_attention_heads,
            scale: match (
                gemma.and_then(|g| g.query_pre_attn_scalar),
                &self.family.granite,
            ) {
                (Some(s), _) => s.powf(-0.5),
                (None, Some(g)) => g.attention_multiplier,
                // Gemma 4's attention is unscaled (its norms scale the queries and keys).
                (None, None) if g4.is_some() => 1.0,
                (None, None) => (c.head_dim() as f64).powf(-0.5),
            },
            attn_p: if train { c.attention_dropout } else { 0.0 },
            resid_p: self.family.phi3.as_ref().map_or(0.0, |p| p.resid_pdrop),
            residual_multiplier: self.family.granite.as_ref().map(|g| g.residual_multiplier),
            rope_cast_back: self.family.olmo2,
            train,
            act: self.act,
            eager: match (gemma.filter(|g| g.eager_attention), &self.family.gpt_oss) {
                (Some(g), _) => Some((g.attn_logit_softcapping, h.kind())),
                // gpt-oss's attention is the eager one with its sinks.
                (None, Some(_)) => Some((None, h.kind())),
                (None, None) => None,
            },
            // Qwen3.5's layers run through the cache a forward builds (upstream's
            // `DynamicCache(config)` whenever `use_cache`, in training too): the
            // linear layers' convolution and the attention's keys take its path.
            cache: match cache {
                Some(c) => Some(c.clone()),
                None if builds_cache && (self.family.qwen3_5.is_some() || g4.is_some()) => {
                    Some(crate::DynamicCache::new())
                }
                None => None,
            },
            unpadded: unpadded
                .as_ref()
                .map(crate::padding_free::Unpadded::shallow_clone),
            router_logits: router_logits.then(Default::default),
            per_layer_inputs,
            shared_kv: Default::default(),
            linear_mask: match (&self.family.qwen3_5, inputs.attention_mask) {
                (Some(_), Some(m)) if m.dim() == 2 && seq > 1 => {
                    let m = m.f_to_device(device)?;
                    let padded = m.f_ne(1)?.f_any()?.int64_value(&[]) != 0;
                    let len = m.size()[1];
                    match padded {
                        true => Some(m.f_narrow(1, len - seq, seq)?.f_contiguous()?),
                        false => None,
                    }
                }
                _ => None,
            },
        }));
        let h = run_layers(
            &self.ctx,
            &self.layers,
            &x,
            None,
            self.checkpointing.as_ref(),
            train,
            h,
            |l, h, _, x| l.forward(h, x),
        )?;
        let h = self.norm.forward(&h);
        let collected = match &x.router_logits {
            Some(m) => std::mem::take(&mut *m.lock().map_err(|_| Error::InvalidArgument {
                field: "output_router_logits",
                detail: "a layer panicked while recording its router logits".into(),
            })?),
            None => Vec::new(),
        };
        let experts = self.family.moe.as_ref().map_or(0, |m| m.num_experts);
        let collected = match &unpadded {
            Some(u) => collected
                .iter()
                .map(|l| u.scatter(l).reshape([-1, experts]))
                .collect(),
            None => collected,
        };
        // Called with keyword arguments by the causal LM, with `input_ids` positionally by
        // the sequence classifier.
        if !self.prefix.is_empty() {
            self.ctx.hook(
                || self.prefix.clone(),
                &self.classes.model,
                &[],
                &[Var::T(&ids)][..usize::from(self.ids_positional)],
                Out::One(Var::NotTensor),
            );
        }
        Ok((h, unpadded, collected))
    }
}

/// Upstream `inputs_embeds.masked_scatter(special_image_mask, image_features)`, after
/// `get_placeholder_mask`'s check (its message) that the placeholders hold the features.
fn scatter_image_features(h: &Tensor, placeholders: &Tensor, features: &Tensor) -> Result<Tensor> {
    let tokens = placeholders.f_sum(Kind::Int64)?.int64_value(&[]);
    let hidden = h.size().last().copied().unwrap_or(0);
    let size = features.size();
    if tokens * hidden != features.numel() as i64 {
        return Err(Error::InvalidInput {
            name: "input_ids",
            detail: format!(
                "Image features and image tokens do not match, tokens: {tokens}, features: {} (upstream's message): each image needs its placeholder tokens in the text (the processor expands them; a max_length that truncates them is too short)",
                size.first().copied().unwrap_or(0) * size.get(1).copied().unwrap_or(0)
            ),
        });
    }
    let features = features.f_to_device(h.device())?.f_to_kind(h.kind())?;
    Ok(h.f_masked_scatter(&placeholders.f_unsqueeze(-1)?, &features)?)
}

/// Upstream `LlamaForCausalLM`.
pub type LlamaForCausalLM = DecoderForCausalLM<LlamaConfig>;

/// Upstream's `XForCausalLM` of a Llama-shaped family: `model` + `lm_head` (tied to
/// `embed_tokens` when `tie_word_embeddings`). Use the family's alias
/// ([`LlamaForCausalLM`], `Qwen2ForCausalLM`, ...).
#[derive(Debug)]
pub struct DecoderForCausalLM<C: DecoderConfig> {
    vs: nn::VarStore,
    ctx: Context,
    /// A multimodal model's image side (`None` for a text model).
    vision: Option<Box<dyn ImageEncoder>>,
    model: LlamaModel,
    lm_head: Option<Linear>,
    config: C,
    training: bool,
    /// Liger's fused linear cross-entropy (`use_liger_kernel`): the training loss without
    /// the logits.
    fused_linear_cross_entropy: bool,
    /// Run the layers and the head on the real tokens only in training (see
    /// [`TrainableModel::set_padding_free`]; off unless `TCHTRAIN_PADDING_FREE` turns it on).
    padding_free: bool,
    /// `generation_config` (as JSON).
    generation_config: serde_json::Value,
}

impl<C: DecoderConfig> DecoderForCausalLM<C> {
    /// A freshly initialised model, seeded by tch's RNG.
    pub fn new(config: &C, device: Device) -> Result<Self> {
        Self::new_in(config, device, &Context::new())
    }

    /// [`new`](Self::new) with the parts sharing `ctx` (a deferred one in
    /// `from_pretrained`).
    pub(crate) fn new_in(config: &C, device: Device, ctx: &Context) -> Result<Self> {
        let vs = nn::VarStore::new(device);
        let llama = config.llama();
        let family = config.family()?;
        let vision = config.image_encoder(&tchtrain_nn::Path::root(&vs, ctx))?;
        let mut path = tchtrain_nn::Path::root(&vs, ctx);
        for part in family.base_model.split('.') {
            path = path / part;
        }
        let model = LlamaModel::with_family(path, &llama, family)?;
        let lm_head = (!llama.tie_word_embeddings).then(|| {
            Linear::new(
                tchtrain_nn::Path::root(&vs, ctx) / "lm_head",
                llama.hidden_size,
                llama.vocab_size,
                false,
                llama.initializer_range,
            )
        });
        Ok(Self {
            vs,
            ctx: ctx.clone(),
            vision,
            model,
            lm_head,
            config: config.clone(),
            training: false,
            fused_linear_cross_entropy: false,
            padding_free: crate::modeling_utils::padding_free_from_env(),
            // Upstream's `GenerationConfig.from_model_config(config)`.
            generation_config: crate::generation::generation_fields_of(&config.to_json_value()?),
        })
    }

    /// Upstream `from_pretrained` on a resolved local folder.
    pub fn from_pretrained_dir(
        dir: &Path,
        device: Device,
        options: &LoadOptions,
    ) -> Result<Loaded<Self>> {
        let config = C::from_file(&dir.join(loading::CONFIG_NAME))?;
        // A multimodal checkpoint's other towers (vision encoder, projector): carried as
        // frozen variables, loaded and saved with the language model.
        let family = config.family()?;
        let base_model = family.base_model;
        let carried: Vec<(String, Vec<i64>, tch::Kind)> = match base_model {
            "model" => Vec::new(),
            _ => loading::checkpoint_shapes(dir)?
                .into_iter()
                .map(|(k, shape, kind)| {
                    let k = match family.checkpoint_conversion {
                        Some(c) => c.rename(&k),
                        None => k,
                    };
                    (k, shape, kind)
                })
                .filter(|(k, _, _)| {
                    !k.starts_with(&format!("{base_model}.")) && !k.starts_with("lm_head.")
                })
                .collect(),
        };
        let mut loaded = loading::from_pretrained_with(dir, "model", &[], options, |ctx| {
            let model = Self::new_in(&config, device, ctx)?;
            let built = model.vs.variables();
            for (name, shape, kind) in carried.iter().filter(|(n, _, _)| !built.contains_key(n)) {
                let (parent, leaf) = name.rsplit_once('.').unwrap_or(("", name));
                let mut path = model.vs.root();
                for part in parent.split('.').filter(|p| !p.is_empty()) {
                    path = path / part;
                }
                let t = Tensor::f_zeros(shape.as_slice(), (*kind, device))?;
                let _ = path.add(leaf, t, false);
            }
            Ok(model)
        })?;
        loaded.model.generation_config =
            crate::generation::model_generation_config(dir, &config.to_json_value()?)?;
        Ok(loaded)
    }
}

impl<C: DecoderConfig> PreTrainedModel for DecoderForCausalLM<C> {
    fn architecture(&self) -> &'static str {
        self.model.family.causal_lm
    }
    fn config(&self) -> &dyn PretrainedConfig {
        &self.config
    }
    fn generation_config(&self) -> Option<&serde_json::Value> {
        Some(&self.generation_config)
    }
    /// With a vision tower (Gemma 3's `Gemma3ForConditionalGeneration`), `model` is the
    /// multimodal `<Prefix>Model`: the tower, the projector, then `language_model`.
    fn module_repr(&self) -> Option<ModuleRepr> {
        let c = &self.model.config;
        let model = match &self.vision {
            None => self.model.module_repr()?,
            Some(vision) => vision
                .module_repr()?
                .into_iter()
                .fold(
                    ModuleRepr::new(format!("{}Model", self.model.family.prefix)),
                    |m, (key, part)| m.child(key, part),
                )
                .child("language_model", self.model.module_repr()?),
        };
        Some(
            ModuleRepr::new(self.model.family.causal_lm)
                .child("model", model)
                .child(
                    "lm_head",
                    ModuleRepr::linear(c.hidden_size, c.vocab_size, false),
                ),
        )
    }
}

impl<C: DecoderConfig> TrainableModel for DecoderForCausalLM<C> {
    crate::modeling_utils::model_plumbing!(@common);
    set_use_cache!();
    /// In training, when the labels count only real tokens (the loss then reads no
    /// padding position's logits); otherwise the forward runs padded (always with a vision
    /// tower: the image blocks' masks are built on the padded layout).
    fn set_padding_free(&mut self, on: bool) -> Result<()> {
        self.padding_free = on;
        Ok(())
    }
    fn activation_checkpointing_enable(
        &mut self,
        settings: crate::ActivationCheckpointing,
    ) -> Result<()> {
        if let Some(v) = &mut self.vision {
            *v.checkpointing() = Some(settings);
        }
        self.model.checkpointing = Some(settings);
        Ok(())
    }
    fn activation_checkpointing_disable(&mut self) {
        if let Some(v) = &mut self.vision {
            *v.checkpointing() = None;
        }
        self.model.checkpointing = None;
    }
    fn is_activation_checkpointing(&self) -> bool {
        self.model.checkpointing.is_some()
    }
    decoder_head_plumbing!();
    fn loss_type(&self) -> Option<&str> {
        Some("ForCausalLM")
    }
    fn supports_cache(&self) -> bool {
        true
    }
    fn output_embeddings(&self) -> Option<String> {
        Some("lm_head".into())
    }
    fn output_head(&self) -> Option<crate::OutputHead> {
        let weight = match &self.lm_head {
            Some(head) => head.ws.shallow_clone(),
            None => self.model.embed_tokens().shallow_clone(),
        };
        Some(crate::OutputHead {
            weight,
            bias: None,
            logit_scale: self
                .model
                .family
                .granite
                .as_ref()
                .map_or(1.0, |g| 1.0 / g.logits_scaling),
            final_logit_softcapping: self
                .model
                .family
                .gemma
                .as_ref()
                .and_then(|g| g.final_logit_softcapping),
        })
    }
    fn is_causal_lm(&self) -> bool {
        true
    }
    /// The multimodal models' heads (`XForConditionalGeneration`: `accepts_loss_kwargs =
    /// False` upstream) average their loss over each batch, and the Trainer then divides it
    /// by the accumulation steps.
    fn accepts_loss_kwargs(&self) -> bool {
        self.config
            .accepts_loss_kwargs()
            .unwrap_or(self.model.family.base_model == "model")
    }
    // Llama's norms (`*_layernorm`, `norm`) are excluded by the name patterns.
    fn is_embedding_weight(&self, name: &str) -> bool {
        name == format!("{}.embed_tokens.weight", self.model.family.base_model)
            // Gemma 4's per-layer input table (a `Gemma4TextScaledWordEmbedding`).
            || name == format!("{}.embed_tokens_per_layer.weight", self.model.family.base_model)
            // A multimodal checkpoint's SigLIP tower holds one `nn.Embedding` (its position
            // embedding), which upstream's `num_parameters(exclude_embeddings=True)` leaves
            // out as it leaves out every embedding.
            || (self.model.family.base_model != "model"
                && name.starts_with("model.vision_tower.")
                && name.ends_with(".position_embedding.weight"))
    }
    fn tied_weights(&self) -> Vec<(String, String)> {
        if self.lm_head.is_none() {
            vec![(
                "lm_head.weight".into(),
                format!("{}.embed_tokens.weight", self.model.family.base_model),
            )]
        } else {
            vec![]
        }
    }
    fn apply_liger_kernel(
        &mut self,
        liger_kernel_config: Option<&serde_json::Value>,
    ) -> Result<()> {
        let model_type = self.model.family.model_type;
        if self.model.family.moe.is_some() || self.model.family.granite.is_some() {
            return Err(Error::InvalidArgument {
                field: "use_liger_kernel",
                detail: format!(
                    "Liger's kernels for {model_type} (a fused loss with its router's load-balancing term or its logits scaling) are not implemented here; train without use_liger_kernel"
                ),
            });
        }
        if self.model.family.gemma.is_some() {
            return Err(Error::InvalidArgument {
                field: "use_liger_kernel",
                detail: format!(
                    "Liger's kernels for {model_type} (GeGLU, Gemma's RMSNorm, the soft-capped fused loss) are not implemented here; train without use_liger_kernel"
                ),
            });
        }
        let config = crate::LigerKernelConfig::from_json(liger_kernel_config, model_type)?;
        self.fused_linear_cross_entropy = config.fused_linear_cross_entropy;
        Ok(())
    }
    fn forward(&self, inputs: &ModelInputs<'_>) -> Result<ModelOutput> {
        // TRL's fused LM head: the backbone alone (`model.base_model(...)`).
        if inputs.backbone_only {
            if self
                .model
                .family
                .moe
                .as_ref()
                .is_some_and(|m| m.output_router_logits)
            {
                return Err(Error::InvalidArgument {
                    field: "backbone_only",
                    detail: "the router's load-balancing loss beside TRL's fused LM head is not implemented here; set output_router_logits to False (router_aux_loss_coef 0)".into(),
                });
            }
            let (h, _, _) = self.model.forward_with(
                inputs,
                self.training,
                false,
                false,
                self.vision.as_deref(),
            )?;
            self.ctx.model_frame(self.architecture())?;
            return Ok(ModelOutput {
                loss: None,
                logits: None,
                last_hidden_state: Some(h),
                pooler_output: None,
                aux_loss: None,
            });
        }
        // Liger's `lce_forward`: in training with labels (or when asked), the loss without
        // the logits.
        let skip_logits = self.fused_linear_cross_entropy
            && inputs
                .skip_logits
                .unwrap_or(self.training && inputs.labels.is_some());
        // Padding-free in training when the loss reads only real tokens' logits.
        let padding_free = self.padding_free
            && self.vision.is_none()
            && self.training
            && !skip_logits
            && inputs.logits_to_keep.is_none()
            && match (inputs.labels, inputs.attention_mask) {
                (Some(l), Some(m)) => crate::padding_free::causal_loss_reads_only_real_tokens(l, m),
                _ => false,
            };
        let moe = self
            .model
            .family
            .moe
            .as_ref()
            .filter(|m| m.output_router_logits);
        let (h, unpadded, router_logits) = self.model.forward_with(
            inputs,
            self.training,
            padding_free,
            moe.is_some(),
            self.vision.as_deref(),
        )?;
        if skip_logits {
            let labels = inputs.labels.ok_or(Error::InvalidArgument {
                field: "skip_logits",
                detail: "skip_logits is True, but labels and shift_labels are None (Liger's message); pass labels".into(),
            })?;
            let weight = match &self.lm_head {
                Some(head) => &head.ws,
                None => self.model.embed_tokens(),
            };
            let loss = crate::liger::liger_for_causal_lm_loss(
                &h,
                weight,
                labels,
                inputs.num_items_in_batch,
                -100,
            )?;
            self.ctx.model_frame(self.architecture())?;
            return Ok(ModelOutput {
                loss: Some(loss),
                logits: None,
                last_hidden_state: Some(h),
                pooler_output: None,
                aux_loss: None,
            });
        }
        // `logits_to_keep`: the head on the last positions' hidden states alone.
        let kept = crate::modeling_utils::keep_last_positions(&h, inputs.logits_to_keep)?;
        let h_head = kept.as_ref().unwrap_or(&h);
        let logits = match &self.lm_head {
            Some(head) => head.forward(h_head),
            None => {
                let weight = self.model.embed_tokens();
                let h = h_head;
                let logits = h.matmul(&weight.tr());
                self.ctx.leaf(
                    || "lm_head".into(),
                    "Linear",
                    &[("weight", weight)],
                    h,
                    &logits,
                );
                logits
            }
        };
        // Granite's `logits / logits_scaling`.
        let logits = match &self.model.family.granite {
            Some(g) => logits / g.logits_scaling,
            None => logits,
        };
        // Gemma 2 / 3's final soft-capping.
        let logits = match self
            .model
            .family
            .gemma
            .as_ref()
            .and_then(|g| g.final_logit_softcapping)
        {
            Some(cap) => (logits / cap).tanh() * cap,
            None => logits,
        };
        // Padding-free: the real tokens' logits and hidden states back in the padded layout
        // (zeros at the padding, which the loss does not read).
        let (logits, h) = match &unpadded {
            Some(u) => (u.scatter(&logits), u.scatter(&h)),
            None => (logits, h),
        };
        let loss = match inputs.labels {
            Some(labels) => Some(tchtrain_losses::for_causal_lm_loss(
                &logits,
                labels,
                self.model.config.vocab_size,
                inputs.num_items_in_batch,
                -100,
                None,
            )?),
            None => None,
        };
        // Mixture of experts with `output_router_logits`: the load-balancing loss, added to
        // the loss (scaled by `router_aux_loss_coef`) when there are labels.
        let aux_loss = match moe {
            Some(moe) => tchtrain_nn::load_balancing_loss_func(
                &router_logits,
                moe.num_experts,
                moe.num_experts_per_tok,
                inputs.attention_mask,
            )?,
            None => None,
        };
        let loss = match (loss, &aux_loss, moe) {
            (Some(loss), Some(aux), Some(moe)) => {
                Some(loss + aux.to_device(logits.device()) * moe.router_aux_loss_coef)
            }
            (loss, _, _) => loss,
        };
        self.ctx.model_frame(self.architecture())?;
        Ok(ModelOutput {
            loss,
            logits: Some(logits),
            last_hidden_state: Some(h),
            pooler_output: None,
            aux_loss,
        })
    }
}

/// Upstream `LlamaForSequenceClassification`.
pub type LlamaForSequenceClassification = DecoderForSequenceClassification<LlamaConfig>;

/// Upstream's `XForSequenceClassification` of a Llama-shaped family
/// (`GenericForSequenceClassification`): `model` + `score` (no bias), pooled at each row's
/// rightmost token that is not the pad token. As upstream's, the loss is the batch mean
/// (its `loss_function` gets no `num_items_in_batch`) while the forward takes loss kwargs,
/// so the Trainer does not divide it by the accumulation steps either.
#[derive(Debug)]
pub struct DecoderForSequenceClassification<C: DecoderConfig> {
    vs: nn::VarStore,
    ctx: Context,
    model: LlamaModel,
    score: Linear,
    config: C,
    training: bool,
    /// Run the layers and the head on the real tokens only (see
    /// [`TrainableModel::set_padding_free`]; off unless `TCHTRAIN_PADDING_FREE` turns it on).
    padding_free: bool,
}

impl<C: DecoderConfig> DecoderForSequenceClassification<C> {
    /// A freshly initialised model, seeded by tch's RNG.
    pub fn new(config: &C, device: Device) -> Result<Self> {
        Self::new_in(config, device, &Context::new())
    }

    /// [`new`](Self::new) with the parts sharing `ctx` (a deferred one in
    /// `from_pretrained`).
    pub(crate) fn new_in(config: &C, device: Device, ctx: &Context) -> Result<Self> {
        let family = config.family()?;
        if family.sequence_classification.is_none() {
            return Err(Error::UnsupportedArchitecture {
                name: format!("{} for sequence classification", family.model_type),
                supported: "upstream has no sequence classifier for this model type; use the causal LM",
            });
        }
        let vs = nn::VarStore::new(device);
        let llama = config.llama();
        let mut model =
            LlamaModel::with_family(tchtrain_nn::Path::root(&vs, ctx) / "model", &llama, family)?;
        // `GenericForSequenceClassification` calls `self.model(input_ids, ...)`.
        model.ids_positional = true;
        let score = Linear::new(
            tchtrain_nn::Path::root(&vs, ctx) / "score",
            llama.hidden_size,
            config.labels().num_labels(),
            false,
            llama.initializer_range,
        );
        Ok(Self {
            vs,
            ctx: ctx.clone(),
            model,
            score,
            config: config.clone(),
            training: false,
            padding_free: crate::modeling_utils::padding_free_from_env(),
        })
    }

    /// Upstream `from_pretrained(dir, num_labels=...)`: a causal LM's checkpoint gets a new
    /// `score` (drawn as upstream draws it), its `lm_head` left out.
    pub fn from_pretrained_dir(
        dir: &Path,
        num_labels: Option<i64>,
        device: Device,
        options: &LoadOptions,
    ) -> Result<Loaded<Self>> {
        let mut config = C::from_file(&dir.join(loading::CONFIG_NAME))?;
        if let Some(n) = num_labels {
            config.labels_mut().set_num_labels(n)?;
        }
        loading::from_pretrained_with(dir, "model", &["lm_head.weight"], options, |ctx| {
            Self::new_in(&config, device, ctx)
        })
    }
}

impl<C: DecoderConfig> PreTrainedModel for DecoderForSequenceClassification<C> {
    fn architecture(&self) -> &'static str {
        // Checked when the model was built.
        self.model
            .family
            .sequence_classification
            .unwrap_or("GenericForSequenceClassification")
    }
    fn config(&self) -> &dyn PretrainedConfig {
        &self.config
    }
    fn module_repr(&self) -> Option<ModuleRepr> {
        Some(
            ModuleRepr::new(self.architecture())
                .child("model", self.model.module_repr()?)
                .child(
                    "score",
                    ModuleRepr::linear(
                        self.model.config.hidden_size,
                        self.config.labels().num_labels(),
                        false,
                    ),
                ),
        )
    }
}

impl<C: DecoderConfig> TrainableModel for DecoderForSequenceClassification<C> {
    crate::modeling_utils::model_plumbing!(@common);
    crate::modeling_utils::checkpointing_plumbing!(model);
    decoder_head_plumbing!();
    set_use_cache!();
    /// When every row's pooled token (its last non-pad token) is real; otherwise the
    /// forward runs padded.
    fn set_padding_free(&mut self, on: bool) -> Result<()> {
        self.padding_free = on;
        Ok(())
    }
    fn label_check(&self) -> Option<crate::modeling_utils::LabelCheck> {
        Some(crate::modeling_utils::LabelCheck::Sequence {
            num_labels: self.config.labels().num_labels(),
        })
    }
    fn is_embedding_weight(&self, name: &str) -> bool {
        name == "model.embed_tokens.weight"
    }
    /// The config re-read with the new `pad_token_id` (so that every family's config keeps
    /// its own checks), and the pooling's copy set.
    fn set_pad_token_id(&mut self, pad_token_id: Option<i64>) -> Result<()> {
        let mut json = self.config.to_json_value()?;
        if let Some(map) = json.as_object_mut() {
            map.insert("pad_token_id".into(), pad_token_id.into());
        }
        let config: C =
            serde_json::from_value(json).map_err(|e| crate::Error::InvalidArgument {
                field: "pad_token_id",
                detail: format!("the config does not take it back: {e}"),
            })?;
        config.llama().validate()?;
        self.model.config.pad_token_id = pad_token_id;
        self.config = config;
        Ok(())
    }
    fn forward(&self, inputs: &ModelInputs<'_>) -> Result<ModelOutput> {
        // Padding-free when every row's pooled token (its last non-pad token) is real.
        let pad = self.model.config.pad_token_id;
        let padding_free = self.padding_free
            && match (inputs.attention_mask, pad) {
                (Some(m), Some(pad)) => {
                    crate::modeling_utils::last_non_pad_tokens_real(inputs.ids()?, m, pad)?
                }
                _ => false,
            };
        let (h, unpadded, _) =
            self.model
                .forward_with(inputs, self.training, padding_free, false, None)?;
        let logits = self.score.forward(&h);
        // Padding-free: back in the padded layout (zeros at the padding, never pooled).
        let (logits, h) = match &unpadded {
            Some(u) => (u.scatter(&logits), u.scatter(&h)),
            None => (logits, h),
        };
        let pooled = crate::modeling_utils::last_non_pad_logits(
            &logits,
            inputs.ids()?,
            self.model.config.pad_token_id,
        )?;
        let loss = heads::sequence_classification_loss(&pooled, inputs, self.config.labels())?;
        self.ctx.model_frame(self.architecture())?;
        Ok(ModelOutput {
            loss,
            logits: Some(pooled),
            last_hidden_state: Some(h),
            pooler_output: None,
            aux_loss: None,
        })
    }
}

/// Upstream `LlamaForTokenClassification`.
pub type LlamaForTokenClassification = DecoderForTokenClassification<LlamaConfig>;

/// Upstream's `XForTokenClassification` of a Llama-shaped family
/// (`GenericForTokenClassification`): `model`, dropout (`classifier_dropout`, else
/// `hidden_dropout`, else 0.1) and `score` (with a bias) on every token, the loss a mean over
/// the labels that are not -100 (its `loss_function` gets no `num_items_in_batch`, while the
/// forward takes loss kwargs, as the sequence classifier's).
#[derive(Debug)]
pub struct DecoderForTokenClassification<C: DecoderConfig> {
    vs: nn::VarStore,
    ctx: Context,
    model: LlamaModel,
    score: Linear,
    dropout: f64,
    architecture: &'static str,
    config: C,
    training: bool,
}

impl<C: DecoderConfig> DecoderForTokenClassification<C> {
    /// A freshly initialised model, seeded by tch's RNG.
    pub fn new(config: &C, device: Device) -> Result<Self> {
        Self::new_in(config, device, &Context::new())
    }

    /// [`new`](Self::new) with the parts sharing `ctx` (a deferred one in
    /// `from_pretrained`).
    pub(crate) fn new_in(config: &C, device: Device, ctx: &Context) -> Result<Self> {
        let family = config.family()?;
        let architecture = family
            .token_classification
            .ok_or_else(|| Error::UnsupportedArchitecture {
                name: format!("{} for token classification", family.model_type),
                supported: "upstream has no token classifier for this model type; use sequence classification or the causal LM",
            })?;
        let vs = nn::VarStore::new(device);
        let llama = config.llama();
        let mut model =
            LlamaModel::with_family(tchtrain_nn::Path::root(&vs, ctx) / "model", &llama, family)?;
        // `GenericForTokenClassification` calls `self.model(input_ids, ...)`.
        model.ids_positional = true;
        let json = config.to_json_value()?;
        let dropout = ["classifier_dropout", "hidden_dropout"]
            .iter()
            .find_map(|key| json.get(*key).and_then(serde_json::Value::as_f64))
            .unwrap_or(0.1);
        // `getattr(config, "token_classification_bias", True)`
        let bias = json
            .get("token_classification_bias")
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(true);
        let score = Linear::new(
            tchtrain_nn::Path::root(&vs, ctx) / "score",
            llama.hidden_size,
            config.labels().num_labels(),
            bias,
            llama.initializer_range,
        );
        Ok(Self {
            vs,
            ctx: ctx.clone(),
            model,
            score,
            dropout,
            architecture,
            config: config.clone(),
            training: false,
        })
    }

    /// Upstream `from_pretrained(dir, num_labels=...)`: a causal LM's checkpoint gets a new
    /// `score` (drawn as upstream draws it), its `lm_head` left out.
    pub fn from_pretrained_dir(
        dir: &Path,
        num_labels: Option<i64>,
        device: Device,
        options: &LoadOptions,
    ) -> Result<Loaded<Self>> {
        let mut config = C::from_file(&dir.join(loading::CONFIG_NAME))?;
        if let Some(n) = num_labels {
            config.labels_mut().set_num_labels(n)?;
        }
        loading::from_pretrained_with(dir, "model", &["lm_head.weight"], options, |ctx| {
            Self::new_in(&config, device, ctx)
        })
    }
}

impl<C: DecoderConfig> PreTrainedModel for DecoderForTokenClassification<C> {
    fn architecture(&self) -> &'static str {
        self.architecture
    }
    fn config(&self) -> &dyn PretrainedConfig {
        &self.config
    }
}

impl<C: DecoderConfig> TrainableModel for DecoderForTokenClassification<C> {
    crate::modeling_utils::model_plumbing!(@common);
    crate::modeling_utils::checkpointing_plumbing!(model);
    decoder_head_plumbing!();
    set_use_cache!();
    fn label_check(&self) -> Option<crate::modeling_utils::LabelCheck> {
        Some(crate::modeling_utils::LabelCheck::Token {
            num_labels: self.config.labels().num_labels(),
        })
    }
    fn is_embedding_weight(&self, name: &str) -> bool {
        name == "model.embed_tokens.weight"
    }
    fn forward(&self, inputs: &ModelInputs<'_>) -> Result<ModelOutput> {
        let h = self.model.forward(inputs, self.training)?;
        let d = tchtrain_nn::dropout_traced(&self.ctx, &h, self.dropout, self.training, || {
            "dropout".into()
        });
        let logits = self.score.forward(&d);
        let loss =
            heads::token_classification_loss(&logits, inputs, self.config.labels().num_labels())?;
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

/// Upstream `LlamaForQuestionAnswering`.
pub type LlamaForQuestionAnswering = DecoderForQuestionAnswering<LlamaConfig>;

/// Upstream's `XForQuestionAnswering` of a Llama-shaped family
/// (`GenericForQuestionAnswering`): the body under the class's `base_model_prefix`
/// (`transformer` for Llama, Qwen2 and Qwen3, `model` for Mistral) and `qa_outputs`
/// (hidden → 2, with a bias) on every token. The logits are `qa_outputs`' `[batch, seq, 2]`
/// ([`ModelOutput::start_end_logits`] splits them); the loss is upstream's
/// `ForQuestionAnsweringLoss` through `loss_function` (`num_items_in_batch` reaches it).
#[derive(Debug)]
pub struct DecoderForQuestionAnswering<C: DecoderConfig> {
    vs: nn::VarStore,
    ctx: Context,
    model: LlamaModel,
    qa_outputs: Linear,
    class: QuestionAnsweringClass,
    config: C,
    training: bool,
}

impl<C: DecoderConfig> DecoderForQuestionAnswering<C> {
    /// A freshly initialised model, seeded by tch's RNG.
    pub fn new(config: &C, device: Device) -> Result<Self> {
        Self::new_in(config, device, &Context::new())
    }

    /// [`new`](Self::new) with the parts sharing `ctx` (a deferred one in
    /// `from_pretrained`).
    pub(crate) fn new_in(config: &C, device: Device, ctx: &Context) -> Result<Self> {
        let family = config.family()?;
        let class = family
            .question_answering
            .ok_or_else(|| Error::UnsupportedArchitecture {
                name: format!("{} for question answering", family.model_type),
                supported: "upstream has no question-answering head for this model type; use sequence / token classification or the causal LM",
            })?;
        let vs = nn::VarStore::new(device);
        let llama = config.llama();
        let mut model = LlamaModel::with_family(
            tchtrain_nn::Path::root(&vs, ctx) / class.base_model_prefix,
            &llama,
            family,
        )?;
        // `GenericForQuestionAnswering` calls the body with `input_ids` positionally.
        model.ids_positional = true;
        let qa_outputs = Linear::new(
            tchtrain_nn::Path::root(&vs, ctx) / "qa_outputs",
            llama.hidden_size,
            2,
            true,
            llama.initializer_range,
        );
        Ok(Self {
            vs,
            ctx: ctx.clone(),
            model,
            qa_outputs,
            class,
            config: config.clone(),
            training: false,
        })
    }

    /// Upstream `from_pretrained(dir)`: a checkpoint of this class, or a base model's (its
    /// weights at the root), gets a new `qa_outputs` drawn as upstream draws it. A causal
    /// LM's checkpoint of a family whose body is `transformer` is refused (upstream would
    /// draw the whole body anew: its keys are under `model.`).
    pub fn from_pretrained_dir(
        dir: &Path,
        device: Device,
        options: &LoadOptions,
    ) -> Result<Loaded<Self>> {
        let config = C::from_file(&dir.join(loading::CONFIG_NAME))?;
        let prefix = config
            .family()?
            .question_answering
            .map_or("model", |c| c.base_model_prefix);
        let loaded =
            loading::from_pretrained_with(dir, prefix, &["lm_head.weight"], options, |ctx| {
                Self::new_in(&config, device, ctx)
            })?;
        // The report names the checkpoint's keys as they were tried (`transformer.model.…`).
        let info = &loaded.info;
        if prefix != "model"
            && info
                .missing_keys
                .contains(&format!("{prefix}.embed_tokens.weight"))
            && info
                .unexpected_keys
                .iter()
                .any(|k| k.ends_with("model.embed_tokens.weight"))
        {
            return Err(Error::BaseModelPrefix {
                path: dir.to_path_buf(),
                class: loaded.model.class.name,
                expected: prefix,
                found: "model",
            });
        }
        Ok(loaded)
    }
}

impl<C: DecoderConfig> PreTrainedModel for DecoderForQuestionAnswering<C> {
    fn architecture(&self) -> &'static str {
        self.class.name
    }
    fn config(&self) -> &dyn PretrainedConfig {
        &self.config
    }
}

impl<C: DecoderConfig> TrainableModel for DecoderForQuestionAnswering<C> {
    crate::modeling_utils::model_plumbing!(@common);
    crate::modeling_utils::checkpointing_plumbing!(model);
    decoder_head_plumbing!();
    set_use_cache!();
    fn label_names(&self) -> Vec<String> {
        crate::modeling_utils::question_answering_label_names()
    }
    fn is_embedding_weight(&self, name: &str) -> bool {
        name == format!("{}.embed_tokens.weight", self.class.base_model_prefix)
    }
    fn forward(&self, inputs: &ModelInputs<'_>) -> Result<ModelOutput> {
        let h = self.model.forward(inputs, self.training)?;
        let logits = self.qa_outputs.forward(&h);
        let loss = crate::modeling_utils::question_answering_loss(
            &logits,
            inputs,
            inputs.num_items_in_batch,
        )?;
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

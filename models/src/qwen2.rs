//! Qwen2 / Qwen2.5 (upstream `models/qwen2`, generated from Llama's modular file):
//! `Qwen2Config` with upstream's defaults, and `Qwen2ForCausalLM`, Llama's model with biases on
//! `q_proj` / `k_proj` / `v_proj` (none on `o_proj` or the MLP) and the sliding-window layers
//! `layer_types` names (by default the layers from `max_window_layers` on, when
//! `use_sliding_window`).

use serde::{Deserialize, Serialize};

use crate::Result;
use crate::configuration_utils::LabelConfig;
use crate::llama::{
    DecoderConfig, DecoderForCausalLM, DecoderForQuestionAnswering,
    DecoderForSequenceClassification, DecoderForTokenClassification, Family, LlamaConfig, QkNorm,
    QuestionAnsweringClass, sliding_windows,
};

/// Upstream `Qwen2Config` with its defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct Qwen2Config {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    /// `None` means `num_attention_heads`.
    pub num_key_value_heads: Option<i64>,
    /// Not a `Qwen2Config` field, but upstream's attention reads one a `config.json` carries
    /// (`getattr(config, "head_dim", hidden_size // num_attention_heads)`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<i64>,
    pub hidden_act: String,
    pub max_position_embeddings: i64,
    pub initializer_range: f64,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    /// v5 form: `{"rope_type": "default", "rope_theta": ...}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<serde_json::Map<String, serde_json::Value>>,
    /// v4 form of the RoPE base (Qwen2.5 checkpoints: 1e6).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// v4 form of the RoPE scaling dict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<serde_json::Map<String, serde_json::Value>>,
    pub use_sliding_window: bool,
    pub sliding_window: Option<i64>,
    pub max_window_layers: i64,
    /// `full_attention` / `sliding_attention` per layer; `None`: from `max_window_layers`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer_types: Option<Vec<String>>,
    pub attention_dropout: f64,
    pub pad_token_id: Option<i64>,
    pub bos_token_id: Option<i64>,
    pub eos_token_id: Option<serde_json::Value>,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Default for Qwen2Config {
    fn default() -> Self {
        Self {
            vocab_size: 151936,
            hidden_size: 4096,
            intermediate_size: 22016,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_key_value_heads: Some(32),
            head_dim: None,
            hidden_act: "silu".into(),
            max_position_embeddings: 32768,
            initializer_range: 0.02,
            rms_norm_eps: 1e-6,
            tie_word_embeddings: false,
            rope_parameters: None,
            rope_theta: None,
            rope_scaling: None,
            use_sliding_window: false,
            sliding_window: Some(4096),
            max_window_layers: 28,
            layer_types: None,
            attention_dropout: 0.0,
            pad_token_id: None,
            bos_token_id: None,
            eos_token_id: None,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

crate::llama::decoder_config_plumbing!(Qwen2Config, "qwen2");

impl DecoderConfig for Qwen2Config {
    crate::llama::decoder_config_plumbing!(@methods);
    fn llama(&self) -> LlamaConfig {
        crate::llama::to_llama!(self, head_dim: self.head_dim, attention_bias: true)
    }
    fn family(&self) -> Result<Family> {
        Ok(Family {
            model_type: "qwen2",
            causal_lm: "Qwen2ForCausalLM",
            sequence_classification: Some("Qwen2ForSequenceClassification"),
            prefix: "Qwen2",
            qkv_bias: true,
            o_bias: false,
            mlp_bias: false,
            qk_norm: QkNorm::None,
            clip_qkv: None,
            moe: None,
            rotary_positional: true,
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
            token_classification: Some("Qwen2ForTokenClassification"),
            question_answering: Some(QuestionAnsweringClass {
                name: "Qwen2ForQuestionAnswering",
                base_model_prefix: "transformer",
            }),
            sliding_windows: sliding_windows(
                self.layer_types.as_deref(),
                self.num_hidden_layers,
                self.sliding_window.filter(|_| self.use_sliding_window),
                self.max_window_layers,
            )?,
        })
    }
}

/// Upstream `Qwen2ForCausalLM`.
pub type Qwen2ForCausalLM = DecoderForCausalLM<Qwen2Config>;

/// Upstream `Qwen2ForSequenceClassification`.
pub type Qwen2ForSequenceClassification = DecoderForSequenceClassification<Qwen2Config>;

/// Upstream `Qwen2ForTokenClassification`.
pub type Qwen2ForTokenClassification = DecoderForTokenClassification<Qwen2Config>;

/// Upstream `Qwen2ForQuestionAnswering`.
pub type Qwen2ForQuestionAnswering = DecoderForQuestionAnswering<Qwen2Config>;

//! Qwen3 (upstream `models/qwen3`, generated from Qwen2's and Llama's modular files):
//! `Qwen3Config` with upstream's defaults, and `Qwen3ForCausalLM`, Llama's model with a
//! per-head RMSNorm of the queries and keys before RoPE (`q_norm`, `k_norm`), an explicit
//! `head_dim`, `attention_bias` on all four projections, and Qwen2's sliding-window layers.

use serde::{Deserialize, Serialize};

use crate::Result;
use crate::configuration_utils::LabelConfig;
use crate::llama::{
    DecoderConfig, DecoderForCausalLM, DecoderForQuestionAnswering,
    DecoderForSequenceClassification, DecoderForTokenClassification, Family, LlamaConfig, QkNorm,
    QuestionAnsweringClass, sliding_windows,
};

/// Upstream `Qwen3Config` with its defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct Qwen3Config {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    /// `None` means `num_attention_heads`.
    pub num_key_value_heads: Option<i64>,
    pub head_dim: i64,
    pub hidden_act: String,
    pub max_position_embeddings: i64,
    pub initializer_range: f64,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    /// v5 form: `{"rope_type": "default", "rope_theta": ...}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<serde_json::Map<String, serde_json::Value>>,
    /// v4 form of the RoPE base.
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
    pub attention_bias: bool,
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

impl Default for Qwen3Config {
    fn default() -> Self {
        Self {
            vocab_size: 151936,
            hidden_size: 4096,
            intermediate_size: 22016,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_key_value_heads: Some(32),
            head_dim: 128,
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
            attention_bias: false,
            attention_dropout: 0.0,
            pad_token_id: None,
            bos_token_id: None,
            eos_token_id: None,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

crate::llama::decoder_config_plumbing!(Qwen3Config, "qwen3");

impl DecoderConfig for Qwen3Config {
    crate::llama::decoder_config_plumbing!(@methods);
    fn llama(&self) -> LlamaConfig {
        crate::llama::to_llama!(self, head_dim: Some(self.head_dim), attention_bias: self.attention_bias)
    }
    fn family(&self) -> Result<Family> {
        Ok(Family {
            model_type: "qwen3",
            causal_lm: "Qwen3ForCausalLM",
            sequence_classification: Some("Qwen3ForSequenceClassification"),
            prefix: "Qwen3",
            qkv_bias: self.attention_bias,
            o_bias: self.attention_bias,
            mlp_bias: false,
            qk_norm: QkNorm::PerHead,
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
            token_classification: Some("Qwen3ForTokenClassification"),
            question_answering: Some(QuestionAnsweringClass {
                name: "Qwen3ForQuestionAnswering",
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

/// Upstream `Qwen3ForCausalLM`.
pub type Qwen3ForCausalLM = DecoderForCausalLM<Qwen3Config>;

/// Upstream `Qwen3ForSequenceClassification`.
pub type Qwen3ForSequenceClassification = DecoderForSequenceClassification<Qwen3Config>;

/// Upstream `Qwen3ForTokenClassification`.
pub type Qwen3ForTokenClassification = DecoderForTokenClassification<Qwen3Config>;

/// Upstream `Qwen3ForQuestionAnswering`.
pub type Qwen3ForQuestionAnswering = DecoderForQuestionAnswering<Qwen3Config>;

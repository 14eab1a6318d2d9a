//! Mistral (upstream `models/mistral`, generated from Llama's modular file): `MistralConfig`
//! with upstream's defaults, and `MistralForCausalLM`, Llama's model without biases, with an
//! explicit `head_dim` and every layer attending through a `sliding_window` when one is set.

use serde::{Deserialize, Serialize};

use crate::Result;
use crate::configuration_utils::LabelConfig;
use crate::llama::{
    DecoderConfig, DecoderForCausalLM, DecoderForQuestionAnswering,
    DecoderForSequenceClassification, DecoderForTokenClassification, Family, LlamaConfig, QkNorm,
    QuestionAnsweringClass,
};

/// Upstream `MistralConfig` with its defaults (Mistral 7B).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct MistralConfig {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    /// `None` means `num_attention_heads`.
    pub num_key_value_heads: Option<i64>,
    /// `None` means `hidden_size / num_attention_heads`.
    pub head_dim: Option<i64>,
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
    /// Every layer's window; `None`: full causal attention.
    pub sliding_window: Option<i64>,
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

impl Default for MistralConfig {
    fn default() -> Self {
        Self {
            vocab_size: 32000,
            hidden_size: 4096,
            intermediate_size: 14336,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_key_value_heads: Some(8),
            head_dim: None,
            hidden_act: "silu".into(),
            max_position_embeddings: 4096 * 32,
            initializer_range: 0.02,
            rms_norm_eps: 1e-6,
            tie_word_embeddings: false,
            rope_parameters: None,
            rope_theta: None,
            rope_scaling: None,
            sliding_window: Some(4096),
            attention_dropout: 0.0,
            pad_token_id: None,
            bos_token_id: Some(1),
            eos_token_id: Some(2.into()),
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

crate::llama::decoder_config_plumbing!(MistralConfig, "mistral");

impl DecoderConfig for MistralConfig {
    crate::llama::decoder_config_plumbing!(@methods);
    fn llama(&self) -> LlamaConfig {
        crate::llama::to_llama!(self, head_dim: self.head_dim, attention_bias: false)
    }
    fn family(&self) -> Result<Family> {
        Ok(Family {
            model_type: "mistral",
            causal_lm: "MistralForCausalLM",
            sequence_classification: Some("MistralForSequenceClassification"),
            prefix: "Mistral",
            qkv_bias: false,
            o_bias: false,
            mlp_bias: false,
            qk_norm: QkNorm::None,
            clip_qkv: None,
            moe: None,
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
            token_classification: Some("MistralForTokenClassification"),
            question_answering: Some(QuestionAnsweringClass {
                name: "MistralForQuestionAnswering",
                base_model_prefix: "model",
            }),
            sliding_windows: vec![self.sliding_window; self.num_hidden_layers.max(0) as usize],
        })
    }
}

/// Upstream `MistralForCausalLM`.
pub type MistralForCausalLM = DecoderForCausalLM<MistralConfig>;

/// Upstream `MistralForSequenceClassification`.
pub type MistralForSequenceClassification = DecoderForSequenceClassification<MistralConfig>;

/// Upstream `MistralForTokenClassification`.
pub type MistralForTokenClassification = DecoderForTokenClassification<MistralConfig>;

/// Upstream `MistralForQuestionAnswering`.
pub type MistralForQuestionAnswering = DecoderForQuestionAnswering<MistralConfig>;

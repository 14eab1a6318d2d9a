//! Granite (upstream `models/granite`): `GraniteConfig` with upstream's defaults, and
//! `GraniteForCausalLM`, Llama's model with Granite's multipliers: the embeddings times
//! `embedding_multiplier`, the attention scaled by `attention_multiplier`, each block's output
//! times `residual_multiplier` before its residual, the logits divided by `logits_scaling`.
//! Upstream has no other head.

use serde::{Deserialize, Serialize};

use crate::Result;
use crate::configuration_utils::LabelConfig;
use crate::llama::{DecoderConfig, DecoderForCausalLM, Family, Granite, LlamaConfig, QkNorm};

/// Upstream `GraniteConfig` with its defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct GraniteConfig {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub num_key_value_heads: Option<i64>,
    pub hidden_act: String,
    pub max_position_embeddings: i64,
    pub initializer_range: f64,
    pub rms_norm_eps: f64,
    pub pad_token_id: Option<i64>,
    pub bos_token_id: Option<i64>,
    pub eos_token_id: Option<serde_json::Value>,
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
    pub attention_bias: bool,
    pub attention_dropout: f64,
    pub mlp_bias: bool,
    pub embedding_multiplier: f64,
    pub logits_scaling: f64,
    pub residual_multiplier: f64,
    pub attention_multiplier: f64,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Default for GraniteConfig {
    fn default() -> Self {
        Self {
            vocab_size: 32000,
            hidden_size: 4096,
            intermediate_size: 11008,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_key_value_heads: None,
            hidden_act: "silu".into(),
            max_position_embeddings: 2048,
            initializer_range: 0.02,
            rms_norm_eps: 1e-6,
            pad_token_id: None,
            bos_token_id: Some(1),
            eos_token_id: Some(2.into()),
            tie_word_embeddings: false,
            rope_parameters: None,
            rope_theta: None,
            rope_scaling: None,
            attention_bias: false,
            attention_dropout: 0.0,
            mlp_bias: false,
            embedding_multiplier: 1.0,
            logits_scaling: 1.0,
            residual_multiplier: 1.0,
            attention_multiplier: 1.0,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

crate::llama::decoder_config_plumbing!(GraniteConfig, "granite");

impl DecoderConfig for GraniteConfig {
    crate::llama::decoder_config_plumbing!(@methods);
    fn llama(&self) -> LlamaConfig {
        LlamaConfig {
            mlp_bias: self.mlp_bias,
            ..crate::llama::to_llama!(self, head_dim: None, attention_bias: self.attention_bias)
        }
    }
    fn family(&self) -> Result<Family> {
        Ok(Family {
            model_type: "granite",
            causal_lm: "GraniteForCausalLM",
            sequence_classification: None,
            prefix: "Granite",
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
            granite: Some(Granite {
                embedding_multiplier: self.embedding_multiplier,
                residual_multiplier: self.residual_multiplier,
                attention_multiplier: self.attention_multiplier,
                logits_scaling: self.logits_scaling,
            }),
            rope_layers: None,
            sliding_rope_parameters: None,
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

/// Upstream `GraniteForCausalLM`.
pub type GraniteForCausalLM = DecoderForCausalLM<GraniteConfig>;

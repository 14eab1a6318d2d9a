//! Gemma (upstream `models/gemma`): `GemmaConfig` with upstream's defaults (Gemma 7B), and
//! `GemmaForCausalLM`, Llama's model with Gemma's RMSNorm (`1 + weight` in float32, weights
//! initialised to zeros), the embeddings scaled by `√hidden_size`, a GeGLU MLP
//! (`gelu_pytorch_tanh`) and an explicit `head_dim`. Gemma 2 and 3 (`gemma2.rs`,
//! `gemma3.rs`) add to it.

use serde::{Deserialize, Serialize};

use crate::configuration_utils::LabelConfig;
use crate::llama::{
    DecoderConfig, DecoderForCausalLM, DecoderForSequenceClassification,
    DecoderForTokenClassification, Family, Gemma, LlamaConfig, QkNorm,
};
use crate::{Error, Result};

/// Upstream `GemmaConfig` with its defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct GemmaConfig {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub num_key_value_heads: Option<i64>,
    pub head_dim: i64,
    /// `gelu` is read as `gelu_pytorch_tanh`, as upstream's `__post_init__` does (the
    /// official releases' legacy value, meant as the tanh approximation).
    pub hidden_act: String,
    pub max_position_embeddings: i64,
    pub initializer_range: f64,
    pub rms_norm_eps: f64,
    pub pad_token_id: Option<i64>,
    pub eos_token_id: Option<serde_json::Value>,
    pub bos_token_id: Option<i64>,
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
    /// EmbeddingGemma's bidirectional attention: refused (not implemented here).
    pub use_bidirectional_attention: Option<bool>,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Default for GemmaConfig {
    fn default() -> Self {
        Self {
            vocab_size: 256000,
            hidden_size: 3072,
            intermediate_size: 24576,
            num_hidden_layers: 28,
            num_attention_heads: 16,
            num_key_value_heads: Some(16),
            head_dim: 256,
            hidden_act: "gelu_pytorch_tanh".into(),
            max_position_embeddings: 8192,
            initializer_range: 0.02,
            rms_norm_eps: 1e-6,
            pad_token_id: Some(0),
            eos_token_id: Some(1.into()),
            bos_token_id: Some(2),
            tie_word_embeddings: true,
            rope_parameters: None,
            rope_theta: None,
            rope_scaling: None,
            attention_bias: false,
            attention_dropout: 0.0,
            use_bidirectional_attention: None,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

/// Upstream's `GemmaConfig.__post_init__` mapping of the legacy `gelu` to the tanh
/// approximation (Gemma 2 and 3 read `hidden_activation` as it is).
pub(crate) fn gemma_activation(name: &str) -> String {
    match name {
        "gelu" => "gelu_pytorch_tanh".into(),
        other => other.into(),
    }
}

/// Refuses `use_bidirectional_attention` (EmbeddingGemma's encoder mode).
pub(crate) fn refuse_bidirectional(flag: Option<bool>) -> Result<()> {
    if flag == Some(true) {
        return Err(Error::InvalidConfig {
            field: "use_bidirectional_attention",
            value: "true".into(),
            fix: "bidirectional (EmbeddingGemma) attention is not implemented here; use a causal Gemma checkpoint",
        });
    }
    Ok(())
}

crate::llama::decoder_config_plumbing!(GemmaConfig, "gemma");

impl DecoderConfig for GemmaConfig {
    crate::llama::decoder_config_plumbing!(@methods);
    fn llama(&self) -> LlamaConfig {
        crate::llama::to_llama!(self, head_dim: Some(self.head_dim), attention_bias: self.attention_bias,
            hidden_act: gemma_activation(&self.hidden_act))
    }
    fn family(&self) -> Result<Family> {
        refuse_bidirectional(self.use_bidirectional_attention)?;
        Ok(Family {
            model_type: "gemma",
            causal_lm: "GemmaForCausalLM",
            sequence_classification: Some("GemmaForSequenceClassification"),
            prefix: "Gemma",
            qkv_bias: self.attention_bias,
            o_bias: self.attention_bias,
            mlp_bias: false,
            qk_norm: QkNorm::None,
            clip_qkv: None,
            moe: None,
            sliding_windows: vec![None; self.num_hidden_layers.max(0) as usize],
            rotary_positional: false,
            gemma: Some(Gemma {
                sandwich_norms: false,
                query_pre_attn_scalar: None,
                attn_logit_softcapping: None,
                final_logit_softcapping: None,
                eager_attention: false,
                text_model: false,
            }),
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
            token_classification: Some("GemmaForTokenClassification"),
            question_answering: None,
        })
    }
}

/// Upstream `GemmaForCausalLM`.
pub type GemmaForCausalLM = DecoderForCausalLM<GemmaConfig>;

/// Upstream `GemmaForSequenceClassification`.
pub type GemmaForSequenceClassification = DecoderForSequenceClassification<GemmaConfig>;

/// Upstream `GemmaForTokenClassification`.
pub type GemmaForTokenClassification = DecoderForTokenClassification<GemmaConfig>;

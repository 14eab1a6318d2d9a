//! OLMo 2 (upstream `models/olmo2`): `Olmo2Config` with upstream's defaults, and
//! `Olmo2ForCausalLM`, Llama's model with OLMo 2's layer: no input norm, the attention's and
//! the MLP's outputs normalised before their residuals, RMSNorms over the whole query and key
//! projections, OLMo's RMSNorm (weight applied in float32) and the rotary embedding in
//! float32.

use serde::{Deserialize, Serialize};

use crate::Result;
use crate::configuration_utils::LabelConfig;
use crate::llama::{
    DecoderConfig, DecoderForCausalLM, DecoderForSequenceClassification, Family, LlamaConfig,
    QkNorm,
};

/// Upstream `Olmo2Config` with its defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct Olmo2Config {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub num_key_value_heads: Option<i64>,
    pub hidden_act: String,
    pub max_position_embeddings: i64,
    pub initializer_range: f64,
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
    pub rms_norm_eps: f64,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Default for Olmo2Config {
    fn default() -> Self {
        Self {
            vocab_size: 50304,
            hidden_size: 4096,
            intermediate_size: 11008,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_key_value_heads: None,
            hidden_act: "silu".into(),
            max_position_embeddings: 2048,
            initializer_range: 0.02,
            pad_token_id: Some(1),
            bos_token_id: None,
            eos_token_id: Some(50279.into()),
            tie_word_embeddings: false,
            rope_parameters: None,
            rope_theta: None,
            rope_scaling: None,
            attention_bias: false,
            attention_dropout: 0.0,
            rms_norm_eps: 1e-5,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

crate::llama::decoder_config_plumbing!(Olmo2Config, "olmo2");

impl DecoderConfig for Olmo2Config {
    crate::llama::decoder_config_plumbing!(@methods);
    fn llama(&self) -> LlamaConfig {
        crate::llama::to_llama!(self, head_dim: None, attention_bias: self.attention_bias)
    }
    fn family(&self) -> Result<Family> {
        Ok(olmo2_family(
            "olmo2",
            self.attention_bias,
            vec![None; self.num_hidden_layers.max(0) as usize],
            None,
        ))
    }
}

/// OLMo 2's and OLMo 3's [`Family`]: OLMo 2's layer, each layer's window, the sliding
/// layers' own RoPE.
pub(crate) fn olmo2_family(
    model_type: &'static str,
    attention_bias: bool,
    sliding_windows: Vec<Option<i64>>,
    sliding_rope_parameters: Option<serde_json::Map<String, serde_json::Value>>,
) -> Family {
    let (causal_lm, sequence_classification, prefix) = match model_type {
        "olmo3" => (
            "Olmo3ForCausalLM",
            "Olmo3ForSequenceClassification",
            "Olmo3",
        ),
        _ => (
            "Olmo2ForCausalLM",
            "Olmo2ForSequenceClassification",
            "Olmo2",
        ),
    };
    Family {
        model_type,
        causal_lm,
        sequence_classification: Some(sequence_classification),
        prefix,
        qkv_bias: attention_bias,
        o_bias: attention_bias,
        mlp_bias: false,
        qk_norm: QkNorm::Projection,
        clip_qkv: None,
        moe: None,
        sliding_windows,
        rotary_positional: model_type == "olmo3",
        gemma: None,
        phi3: None,
        granite: None,
        rope_layers: None,
        sliding_rope_parameters,
        olmo2: true,
        base_model: "model",
        checkpoint_conversion: None,
        gpt_oss: None,
        qwen3_5: None,
        gemma4: None,
        token_classification: None,
        question_answering: None,
    }
}

/// Upstream `Olmo2ForCausalLM`.
pub type Olmo2ForCausalLM = DecoderForCausalLM<Olmo2Config>;

/// Upstream `Olmo2ForSequenceClassification`.
pub type Olmo2ForSequenceClassification = DecoderForSequenceClassification<Olmo2Config>;

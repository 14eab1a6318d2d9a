//! Gemma 2 (upstream `models/gemma2`): `Gemma2Config` with upstream's defaults (Gemma 2 2B),
//! and `Gemma2ForCausalLM`: Gemma's model with four norms per layer (the attention's and the
//! MLP's outputs normalised before their residuals), the attention scaled by
//! `query_pre_attn_scalar ** -0.5` and its scores soft-capped (`attn_logit_softcapping`),
//! alternating sliding-window layers, and the logits soft-capped
//! (`final_logit_softcapping`). Upstream runs Gemma 2's attention eagerly (its SDPA cannot
//! soft-cap), and so does this one.

use serde::{Deserialize, Serialize};

use crate::configuration_utils::LabelConfig;
use crate::gemma::refuse_bidirectional;
use crate::llama::{
    DecoderConfig, DecoderForCausalLM, DecoderForSequenceClassification,
    DecoderForTokenClassification, Family, Gemma, LlamaConfig, QkNorm, sliding_windows,
};
use crate::{Error, Result};

/// Upstream `Gemma2Config` with its defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct Gemma2Config {
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
    pub query_pre_attn_scalar: i64,
    pub sliding_window: Option<i64>,
    /// `full_attention` / `sliding_attention` per layer; `None`: every other layer sliding,
    /// from the first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer_types: Option<Vec<String>>,
    pub final_logit_softcapping: Option<f64>,
    pub attn_logit_softcapping: Option<f64>,
    /// EmbeddingGemma's bidirectional attention: refused (not implemented here).
    pub use_bidirectional_attention: Option<bool>,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Default for Gemma2Config {
    fn default() -> Self {
        Self {
            vocab_size: 256000,
            hidden_size: 2304,
            intermediate_size: 9216,
            num_hidden_layers: 26,
            num_attention_heads: 8,
            num_key_value_heads: Some(4),
            head_dim: 256,
            hidden_activation: "gelu_pytorch_tanh".into(),
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
            query_pre_attn_scalar: 256,
            sliding_window: Some(4096),
            layer_types: None,
            final_logit_softcapping: Some(30.0),
            attn_logit_softcapping: Some(50.0),
            use_bidirectional_attention: None,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

/// Gemma 2 / 3's layer windows: `layer_types`, or by default every `pattern`-th layer full
/// and the others sliding (upstream's `__post_init__`), each sliding layer over `window`.
pub(crate) fn gemma_windows(
    layer_types: Option<&[String]>,
    num_hidden_layers: i64,
    window: Option<i64>,
    pattern: i64,
) -> Result<Vec<Option<i64>>> {
    if pattern <= 0 {
        return Err(Error::InvalidConfig {
            field: "sliding_window_pattern",
            value: pattern.to_string(),
            fix: "use a positive number of layers per full-attention layer",
        });
    }
    let default: Vec<String> = (0..num_hidden_layers)
        .map(|i| match (i + 1) % pattern {
            0 => "full_attention".into(),
            _ => "sliding_attention".into(),
        })
        .collect();
    sliding_windows(
        Some(layer_types.unwrap_or(&default)),
        num_hidden_layers,
        window,
        0,
    )
}

/// Upstream's `validate_architecture` of Gemma 2 and 3.
pub(crate) fn check_heads(hidden_size: i64, num_attention_heads: i64) -> Result<()> {
    if num_attention_heads <= 0 || hidden_size % num_attention_heads != 0 {
        return Err(Error::InvalidConfig {
            field: "hidden_size",
            value: format!("{hidden_size} (num_attention_heads {num_attention_heads})"),
            fix: "the hidden size must be a multiple of the number of attention heads",
        });
    }
    Ok(())
}

crate::llama::decoder_config_plumbing!(Gemma2Config, "gemma2");

impl DecoderConfig for Gemma2Config {
    crate::llama::decoder_config_plumbing!(@methods);
    fn llama(&self) -> LlamaConfig {
        crate::llama::to_llama!(self, head_dim: Some(self.head_dim), attention_bias: self.attention_bias,
            hidden_act: self.hidden_activation.clone())
    }
    fn family(&self) -> Result<Family> {
        refuse_bidirectional(self.use_bidirectional_attention)?;
        check_heads(self.hidden_size, self.num_attention_heads)?;
        Ok(Family {
            model_type: "gemma2",
            causal_lm: "Gemma2ForCausalLM",
            sequence_classification: Some("Gemma2ForSequenceClassification"),
            prefix: "Gemma2",
            qkv_bias: self.attention_bias,
            o_bias: self.attention_bias,
            mlp_bias: false,
            qk_norm: QkNorm::None,
            clip_qkv: None,
            moe: None,
            sliding_windows: gemma_windows(
                self.layer_types.as_deref(),
                self.num_hidden_layers,
                self.sliding_window,
                2,
            )?,
            rotary_positional: true,
            gemma: Some(Gemma {
                sandwich_norms: true,
                query_pre_attn_scalar: Some(self.query_pre_attn_scalar as f64),
                attn_logit_softcapping: self.attn_logit_softcapping,
                final_logit_softcapping: self.final_logit_softcapping,
                eager_attention: true,
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
            token_classification: Some("Gemma2ForTokenClassification"),
            question_answering: None,
        })
    }
}

/// Upstream `Gemma2ForCausalLM`.
pub type Gemma2ForCausalLM = DecoderForCausalLM<Gemma2Config>;

/// Upstream `Gemma2ForSequenceClassification`.
pub type Gemma2ForSequenceClassification = DecoderForSequenceClassification<Gemma2Config>;

/// Upstream `Gemma2ForTokenClassification`.
pub type Gemma2ForTokenClassification = DecoderForTokenClassification<Gemma2Config>;

//! SmolLM3 (upstream `models/smollm3`): `SmolLM3Config` with upstream's defaults, and
//! `SmolLM3ForCausalLM`, Llama's model whose NoPE layers (`no_rope_layers[i] == 0`; by default
//! every `no_rope_layer_interval`-th) attend without the rotary embedding, and whose other
//! layers may slide (`use_sliding_window`, `layer_types`).

use serde::{Deserialize, Serialize};

use crate::configuration_utils::LabelConfig;
use crate::llama::{
    DecoderConfig, DecoderForCausalLM, DecoderForQuestionAnswering,
    DecoderForSequenceClassification, DecoderForTokenClassification, Family, LlamaConfig, QkNorm,
    QuestionAnsweringClass, sliding_windows,
};
use crate::{Error, Result};

/// Upstream `SmolLM3Config` with its defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct SmolLM3Config {
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
    /// v5 form: `{"rope_type": "default", "rope_theta": ...}`; the base defaults to 2e6.
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
    /// Per layer, 1 where the rotary embedding applies, 0 for a NoPE layer; `None`: every
    /// `no_rope_layer_interval`-th layer is NoPE.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_rope_layers: Option<Vec<i64>>,
    pub no_rope_layer_interval: i64,
    /// `full_attention` / `sliding_attention` per layer; `None`: the NoPE layers slide when
    /// `use_sliding_window` and a window are set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer_types: Option<Vec<String>>,
    pub attention_bias: bool,
    pub attention_dropout: f64,
    pub mlp_bias: bool,
    pub tie_word_embeddings: bool,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Default for SmolLM3Config {
    fn default() -> Self {
        Self {
            vocab_size: 128256,
            hidden_size: 2048,
            intermediate_size: 11008,
            num_hidden_layers: 36,
            num_attention_heads: 16,
            num_key_value_heads: Some(4),
            hidden_act: "silu".into(),
            max_position_embeddings: 32768,
            initializer_range: 0.02,
            rms_norm_eps: 1e-6,
            pad_token_id: Some(128004),
            bos_token_id: Some(128000),
            eos_token_id: Some(128001.into()),
            rope_parameters: None,
            rope_theta: None,
            rope_scaling: None,
            use_sliding_window: false,
            sliding_window: None,
            no_rope_layers: None,
            no_rope_layer_interval: 4,
            layer_types: None,
            attention_bias: false,
            attention_dropout: 0.0,
            mlp_bias: false,
            tie_word_embeddings: true,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

impl SmolLM3Config {
    /// Upstream's `__post_init__` of `no_rope_layers`: 1 (rotary) except every
    /// `no_rope_layer_interval`-th layer.
    fn rope_layers(&self) -> Result<Vec<bool>> {
        let layers = match &self.no_rope_layers {
            Some(l) => l.iter().map(|&x| x != 0).collect::<Vec<_>>(),
            None if self.no_rope_layer_interval <= 0 => {
                return Err(Error::InvalidConfig {
                    field: "no_rope_layer_interval",
                    value: self.no_rope_layer_interval.to_string(),
                    fix: "use a positive number of layers per NoPE layer",
                });
            }
            None => (0..self.num_hidden_layers)
                .map(|i| (i + 1) % self.no_rope_layer_interval != 0)
                .collect(),
        };
        if layers.len() as i64 != self.num_hidden_layers {
            return Err(Error::InvalidConfig {
                field: "no_rope_layers",
                value: format!("{} entries", layers.len()),
                fix: "give one entry per layer (num_hidden_layers)",
            });
        }
        Ok(layers)
    }
}

crate::llama::decoder_config_plumbing!(SmolLM3Config, "smollm3");

impl DecoderConfig for SmolLM3Config {
    crate::llama::decoder_config_plumbing!(@methods);
    fn llama(&self) -> LlamaConfig {
        let mut llama = LlamaConfig {
            mlp_bias: self.mlp_bias,
            ..crate::llama::to_llama!(self, head_dim: None, attention_bias: self.attention_bias)
        };
        // Upstream's default base (`rope_theta = 2e6`) where the file names none.
        if llama.rope_parameters.is_none() && llama.rope_scaling.is_none() {
            llama.rope_theta = Some(self.rope_theta.unwrap_or(2e6));
        }
        llama
    }
    fn family(&self) -> Result<Family> {
        let rope_layers = self.rope_layers()?;
        // Upstream's `__post_init__`: by default the NoPE layers slide, with
        // `use_sliding_window` and a window; a sliding layer's mask slides over
        // `sliding_window` whatever `use_sliding_window` says (the flag only reaches the
        // flash-attention kernels).
        let default: Vec<String> = rope_layers
            .iter()
            .map(|&rotary| {
                if self.use_sliding_window && self.sliding_window.is_some() && !rotary {
                    "sliding_attention".into()
                } else {
                    "full_attention".into()
                }
            })
            .collect();
        let layer_types = self.layer_types.clone().unwrap_or(default);
        Ok(Family {
            model_type: "smollm3",
            causal_lm: "SmolLM3ForCausalLM",
            sequence_classification: Some("SmolLM3ForSequenceClassification"),
            prefix: "SmolLM3",
            qkv_bias: self.attention_bias,
            o_bias: self.attention_bias,
            mlp_bias: self.mlp_bias,
            qk_norm: QkNorm::None,
            clip_qkv: None,
            moe: None,
            sliding_windows: sliding_windows(
                Some(&layer_types),
                self.num_hidden_layers,
                self.sliding_window,
                0,
            )?,
            rotary_positional: true,
            gemma: None,
            phi3: None,
            granite: None,
            rope_layers: Some(rope_layers),
            sliding_rope_parameters: None,
            olmo2: false,
            base_model: "model",
            checkpoint_conversion: None,
            gpt_oss: None,
            qwen3_5: None,
            gemma4: None,
            token_classification: Some("SmolLM3ForTokenClassification"),
            question_answering: Some(QuestionAnsweringClass {
                name: "SmolLM3ForQuestionAnswering",
                base_model_prefix: "transformer",
            }),
        })
    }
}

/// Upstream `SmolLM3ForCausalLM`.
pub type SmolLM3ForCausalLM = DecoderForCausalLM<SmolLM3Config>;

/// Upstream `SmolLM3ForSequenceClassification`.
pub type SmolLM3ForSequenceClassification = DecoderForSequenceClassification<SmolLM3Config>;

/// Upstream `SmolLM3ForTokenClassification`.
pub type SmolLM3ForTokenClassification = DecoderForTokenClassification<SmolLM3Config>;

/// Upstream `SmolLM3ForQuestionAnswering`.
pub type SmolLM3ForQuestionAnswering = DecoderForQuestionAnswering<SmolLM3Config>;

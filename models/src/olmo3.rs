//! OLMo 3 (upstream `models/olmo3`): `Olmo3Config` with upstream's defaults, and
//! `Olmo3ForCausalLM`, OLMo 2's model whose layers slide over `sliding_window` except every
//! fourth (`layer_types`), each layer type with its own RoPE (`rope_parameters` keyed by
//! `sliding_attention` / `full_attention`, both based at 5e5 by default).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::configuration_utils::LabelConfig;
use crate::llama::{
    DecoderConfig, DecoderForCausalLM, DecoderForSequenceClassification, Family, LlamaConfig,
    sliding_windows,
};
use crate::{Error, Result};

/// Upstream `Olmo3Config` with its defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct Olmo3Config {
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
    pub eos_token_id: Option<Value>,
    pub tie_word_embeddings: bool,
    /// Per layer type: `{"sliding_attention": {...}, "full_attention": {...}}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<Map<String, Value>>,
    /// v4 form of the full layers' RoPE base.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// v4 form of the full layers' RoPE scaling dict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<Map<String, Value>>,
    pub attention_bias: bool,
    pub attention_dropout: f64,
    pub rms_norm_eps: f64,
    pub sliding_window: Option<i64>,
    /// `full_attention` / `sliding_attention` per layer; `None`: every fourth layer full.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer_types: Option<Vec<String>>,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Default for Olmo3Config {
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
            sliding_window: Some(4096),
            layer_types: None,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

impl Olmo3Config {
    /// Upstream's `convert_rope_params_to_dict`: the RoPE of each layer type, `rope_scaling`
    /// and `rope_theta` applied to the full layers, the bases defaulting to 5e5.
    pub fn rope_parameters_of(&self, layer_type: &str) -> Result<Map<String, Value>> {
        let mut p = match self
            .rope_parameters
            .as_ref()
            .and_then(|p| p.get(layer_type))
        {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(other) => {
                return Err(Error::InvalidConfig {
                    field: "rope_parameters",
                    value: format!("{layer_type}: {other}"),
                    fix: "give one dict per layer type (sliding_attention, full_attention)",
                });
            }
        };
        p.entry("rope_type").or_insert("default".into());
        let theta = match layer_type {
            "full_attention" => {
                if let Some(scaling) = &self.rope_scaling {
                    p.extend(scaling.clone());
                }
                self.rope_theta.unwrap_or(500_000.0)
            }
            _ => 500_000.0,
        };
        p.entry("rope_theta").or_insert(theta.into());
        Ok(p)
    }
}

crate::llama::decoder_config_plumbing!(Olmo3Config, "olmo3");

impl DecoderConfig for Olmo3Config {
    crate::llama::decoder_config_plumbing!(@methods);
    fn llama(&self) -> LlamaConfig {
        LlamaConfig {
            // Checked by `family()`, which every constructor and `from_file` call.
            rope_parameters: self.rope_parameters_of("full_attention").ok(),
            rope_theta: None,
            rope_scaling: None,
            ..crate::llama::to_llama!(self, head_dim: None, attention_bias: self.attention_bias)
        }
    }
    fn family(&self) -> Result<Family> {
        self.rope_parameters_of("full_attention")?;
        let sliding = self.rope_parameters_of("sliding_attention")?;
        let default: Vec<String> = (0..self.num_hidden_layers)
            .map(|i| match (i + 1) % 4 {
                0 => "full_attention".into(),
                _ => "sliding_attention".into(),
            })
            .collect();
        let windows = sliding_windows(
            Some(self.layer_types.as_deref().unwrap_or(&default)),
            self.num_hidden_layers,
            self.sliding_window,
            0,
        )?;
        Ok(crate::olmo2::olmo2_family(
            "olmo3",
            self.attention_bias,
            windows,
            Some(sliding),
        ))
    }
}

/// Upstream `Olmo3ForCausalLM`.
pub type Olmo3ForCausalLM = DecoderForCausalLM<Olmo3Config>;

/// Upstream `Olmo3ForSequenceClassification`.
pub type Olmo3ForSequenceClassification = DecoderForSequenceClassification<Olmo3Config>;

//! Phi-3 (upstream `models/phi3`): `Phi3Config` with upstream's defaults (Phi-3 mini), and
//! `Phi3ForCausalLM`: Llama's model with the fused `qkv_proj` and `gate_up_proj`, a rotary
//! embedding over part of each head (`partial_rotary_factor`), LongRoPE (v4's `su` / `yarn`
//! read as `longrope`, with the top-level `original_max_position_embeddings`, as upstream),
//! dropout on the attention's and the MLP's outputs (`resid_pdrop`) and an optional sliding
//! window on every layer.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::configuration_utils::LabelConfig;
use crate::llama::{
    DecoderConfig, DecoderForCausalLM, DecoderForSequenceClassification,
    DecoderForTokenClassification, Family, LlamaConfig, Phi3, QkNorm,
};
use crate::{Error, Result};

/// Upstream `Phi3Config` with its defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct Phi3Config {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    /// `None` means `num_attention_heads`.
    pub num_key_value_heads: Option<i64>,
    pub resid_pdrop: f64,
    /// Upstream's Phi-3 does not read it (no embedding dropout): refused unless 0.
    pub embd_pdrop: f64,
    pub attention_dropout: f64,
    pub hidden_act: String,
    pub max_position_embeddings: i64,
    pub original_max_position_embeddings: i64,
    pub initializer_range: f64,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    /// v5 form: `{"rope_type": "longrope", "rope_theta": ..., "short_factor": [...], ...}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<Map<String, Value>>,
    /// v4 form of the RoPE base.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// v4 form of the RoPE scaling dict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<Map<String, Value>>,
    /// v4's top-level form of the rotary fraction of each head.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partial_rotary_factor: Option<f64>,
    pub bos_token_id: Option<i64>,
    pub eos_token_id: Option<Value>,
    pub pad_token_id: Option<i64>,
    pub sliding_window: Option<i64>,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Default for Phi3Config {
    fn default() -> Self {
        Self {
            vocab_size: 32064,
            hidden_size: 3072,
            intermediate_size: 8192,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_key_value_heads: None,
            resid_pdrop: 0.0,
            embd_pdrop: 0.0,
            attention_dropout: 0.0,
            hidden_act: "silu".into(),
            max_position_embeddings: 4096,
            original_max_position_embeddings: 4096,
            initializer_range: 0.02,
            rms_norm_eps: 1e-5,
            tie_word_embeddings: false,
            rope_parameters: None,
            rope_theta: None,
            rope_scaling: None,
            partial_rotary_factor: None,
            bos_token_id: Some(1),
            eos_token_id: Some(32000.into()),
            pad_token_id: Some(32000),
            sliding_window: None,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

impl Phi3Config {
    /// Upstream's `convert_rope_params_to_dict` + `standardize_rope_params`: `rope_scaling`
    /// over `rope_parameters`, `rope_theta` (10 000) and `partial_rotary_factor` (1.0)
    /// defaulted into it, `su` / `yarn` read as `longrope`, whose
    /// `original_max_position_embeddings` is the config's top-level one.
    pub fn standardized_rope_parameters(&self) -> Result<Map<String, Value>> {
        let mut p = self
            .rope_scaling
            .clone()
            .or_else(|| self.rope_parameters.clone())
            .unwrap_or_default();
        p.entry("rope_theta")
            .or_insert(self.rope_theta.unwrap_or(10_000.0).into());
        p.entry("partial_rotary_factor")
            .or_insert(self.partial_rotary_factor.unwrap_or(1.0).into());
        if let Some(t) = p.remove("type") {
            p.entry("rope_type").or_insert(t);
        }
        let rope_type = p
            .get("rope_type")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string();
        let rope_type = match rope_type.as_str() {
            "su" | "yarn" | "longrope" => "longrope",
            "default" => "default",
            other => {
                return Err(Error::InvalidConfig {
                    field: "rope_parameters.rope_type",
                    value: other.to_string(),
                    fix: "Phi-3 takes default or longrope (su / yarn)",
                });
            }
        };
        p.insert("rope_type".into(), rope_type.into());
        if rope_type == "longrope" {
            p.insert(
                "original_max_position_embeddings".into(),
                self.original_max_position_embeddings.into(),
            );
        }
        Ok(p)
    }
}

crate::llama::decoder_config_plumbing!(Phi3Config, "phi3");

impl DecoderConfig for Phi3Config {
    crate::llama::decoder_config_plumbing!(@methods);
    fn llama(&self) -> LlamaConfig {
        LlamaConfig {
            // Checked by `family()`, which every constructor and `from_file` call.
            rope_parameters: self.standardized_rope_parameters().ok(),
            rope_theta: None,
            rope_scaling: None,
            ..crate::llama::to_llama!(self, head_dim: None, attention_bias: false)
        }
    }
    fn family(&self) -> Result<Family> {
        self.standardized_rope_parameters()?;
        if self.embd_pdrop != 0.0 {
            return Err(Error::InvalidConfig {
                field: "embd_pdrop",
                value: self.embd_pdrop.to_string(),
                fix: "upstream's Phi-3 applies no embedding dropout (the key is read by nothing); set it to 0",
            });
        }
        Ok(Family {
            model_type: "phi3",
            causal_lm: "Phi3ForCausalLM",
            sequence_classification: Some("Phi3ForSequenceClassification"),
            prefix: "Phi3",
            qkv_bias: false,
            o_bias: false,
            mlp_bias: false,
            qk_norm: QkNorm::None,
            clip_qkv: None,
            moe: None,
            sliding_windows: vec![self.sliding_window; self.num_hidden_layers.max(0) as usize],
            rotary_positional: false,
            gemma: None,
            phi3: Some(Phi3 {
                resid_pdrop: self.resid_pdrop,
            }),
            granite: None,
            rope_layers: None,
            sliding_rope_parameters: None,
            olmo2: false,
            base_model: "model",
            checkpoint_conversion: None,
            gpt_oss: None,
            qwen3_5: None,
            gemma4: None,
            token_classification: Some("Phi3ForTokenClassification"),
            question_answering: None,
        })
    }
}

/// Upstream `Phi3ForCausalLM`.
pub type Phi3ForCausalLM = DecoderForCausalLM<Phi3Config>;

/// Upstream `Phi3ForSequenceClassification`.
pub type Phi3ForSequenceClassification = DecoderForSequenceClassification<Phi3Config>;

/// Upstream `Phi3ForTokenClassification`.
pub type Phi3ForTokenClassification = DecoderForTokenClassification<Phi3Config>;

//! gpt-oss (upstream `models/gpt_oss`): `GptOssConfig` with upstream's defaults (gpt-oss-20b's
//! shape), and `GptOssForCausalLM`: a mixture of experts on Llama's model with attention sinks
//! (eager attention), alternating sliding-window layers, biases on the attention, OLMo 2's
//! RMSNorm, YaRN RoPE, and `GptOssMLP` — a router with a bias whose top-k logits are
//! softmaxed, transposed experts with biases and the clamped, interleaved SwiGLU
//! (`swiglu_alpha`, `swiglu_limit`). Checkpoints whose experts are quantised to MXFP4
//! (`quantization_config.quant_method` `mxfp4`, the released gpt-oss weights) are dequantised
//! on load as upstream does without its kernels (`Mxfp4Dequantize`); the config read drops
//! the quantization config, as upstream's dequantised model does.

use serde::{Deserialize, Serialize};

use crate::configuration_utils::LabelConfig;
use crate::llama::{
    DecoderConfig, DecoderForCausalLM, DecoderForSequenceClassification,
    DecoderForTokenClassification, Family, GptOss, LlamaConfig, Moe, QkNorm, sliding_windows,
};
use crate::{Error, Result};

/// Upstream `GptOssConfig` with its defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct GptOssConfig {
    pub vocab_size: i64,
    pub hidden_size: i64,
    /// Each expert's intermediate size.
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub head_dim: i64,
    pub num_attention_heads: i64,
    pub num_key_value_heads: Option<i64>,
    pub sliding_window: Option<i64>,
    pub tie_word_embeddings: bool,
    pub hidden_act: String,
    pub initializer_range: f64,
    pub max_position_embeddings: i64,
    pub rms_norm_eps: f64,
    /// `None`: YaRN, factor 32 over 4096 positions (upstream's `__post_init__`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<serde_json::Map<String, serde_json::Value>>,
    /// v4 form of the RoPE base.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// v4 form of the RoPE scaling dict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<serde_json::Map<String, serde_json::Value>>,
    pub attention_dropout: f64,
    #[serde(alias = "num_experts")]
    pub num_local_experts: i64,
    pub num_experts_per_tok: i64,
    pub swiglu_alpha: f64,
    pub swiglu_limit: f64,
    pub router_aux_loss_coef: f64,
    pub output_router_logits: bool,
    /// `full_attention` / `sliding_attention` per layer; `None`: the even layers (from the
    /// first) sliding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer_types: Option<Vec<String>>,
    pub pad_token_id: Option<i64>,
    pub bos_token_id: Option<i64>,
    pub eos_token_id: Option<serde_json::Value>,
    pub attention_bias: bool,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
    /// The checkpoint's experts are MXFP4 (`quantization_config` `mxfp4`, removed from
    /// `extra` when read): `from_pretrained` dequantises them.
    #[serde(skip)]
    pub mxfp4: bool,
}

impl Default for GptOssConfig {
    fn default() -> Self {
        Self {
            vocab_size: 201088,
            hidden_size: 2880,
            intermediate_size: 2880,
            num_hidden_layers: 36,
            head_dim: 64,
            num_attention_heads: 64,
            num_key_value_heads: Some(8),
            sliding_window: Some(128),
            tie_word_embeddings: false,
            hidden_act: "silu".into(),
            initializer_range: 0.02,
            max_position_embeddings: 131072,
            rms_norm_eps: 1e-5,
            rope_parameters: None,
            rope_theta: None,
            rope_scaling: None,
            attention_dropout: 0.0,
            num_local_experts: 128,
            num_experts_per_tok: 4,
            swiglu_alpha: 1.702,
            swiglu_limit: 7.0,
            router_aux_loss_coef: 0.001,
            output_router_logits: false,
            layer_types: None,
            pad_token_id: None,
            bos_token_id: None,
            eos_token_id: None,
            attention_bias: true,
            labels: LabelConfig::default(),
            extra: Default::default(),
            mxfp4: false,
        }
    }
}

crate::llama::decoder_config_plumbing!(GptOssConfig, "gpt_oss");

impl DecoderConfig for GptOssConfig {
    fn from_file(path: &std::path::Path) -> Result<Self> {
        let mut c: Self = crate::configuration_utils::read_config(path)?;
        // Upstream dequantises MXFP4 experts where its kernels cannot run (as here) and the
        // dequantised model's config has no quantization config.
        if let Some(q) = c.extra.get("quantization_config").filter(|q| !q.is_null()) {
            match q.get("quant_method").and_then(serde_json::Value::as_str) {
                Some("mxfp4") => {
                    c.extra.remove("quantization_config");
                    c.mxfp4 = true;
                }
                // bitsandbytes' 4-bit layers: the loader installs them (`crate::bitsandbytes`).
                Some("bitsandbytes") => {}
                _ => {
                    return Err(Error::InvalidConfig {
                        field: "quantization_config",
                        value: q.to_string(),
                        fix: "gpt-oss checkpoints load here in full precision or with MXFP4 experts (quant_method mxfp4, dequantised on load); dequantise other methods with transformers first",
                    });
                }
            }
        }
        c.llama().validate()?;
        c.family()?;
        Ok(c)
    }
    fn extra_mut(&mut self) -> &mut serde_json::Map<String, serde_json::Value> {
        &mut self.extra
    }
    fn labels_mut(&mut self) -> &mut LabelConfig {
        &mut self.labels
    }
    fn llama(&self) -> LlamaConfig {
        let mut llama = crate::llama::to_llama!(self, head_dim: Some(self.head_dim),
            attention_bias: self.attention_bias);
        if llama.rope_parameters.is_none() && llama.rope_scaling.is_none() {
            let yarn = serde_json::json!({
                "rope_type": "yarn",
                "factor": 32.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": false,
                "original_max_position_embeddings": 4096,
            });
            llama.rope_parameters = yarn.as_object().cloned();
        }
        llama
    }
    fn family(&self) -> Result<Family> {
        if self.extra.get("quantization_config").is_some_and(|q| {
            !q.is_null()
                && q.get("quant_method").and_then(serde_json::Value::as_str) != Some("bitsandbytes")
        }) {
            return Err(Error::InvalidConfig {
                field: "quantization_config",
                value: self.extra["quantization_config"].to_string(),
                fix: "read the config with GptOssConfig::from_file (MXFP4 experts are dequantised on load), or remove the key",
            });
        }
        let default: Vec<String> = (0..self.num_hidden_layers)
            .map(|i| match (i + 1) % 2 {
                1 => "sliding_attention".into(),
                _ => "full_attention".into(),
            })
            .collect();
        Ok(Family {
            model_type: "gpt_oss",
            causal_lm: "GptOssForCausalLM",
            sequence_classification: Some("GptOssForSequenceClassification"),
            prefix: "GptOss",
            qkv_bias: self.attention_bias,
            o_bias: self.attention_bias,
            mlp_bias: false,
            qk_norm: QkNorm::None,
            clip_qkv: None,
            moe: Some(Moe {
                num_experts: self.num_local_experts,
                num_experts_per_tok: self.num_experts_per_tok,
                moe_intermediate_size: self.intermediate_size,
                router: tchtrain_nn::RouterKind {
                    norm_topk_prob: false,
                    scores_in_logits_dtype: true,
                    softmax_after_topk: true,
                },
                sparse_layers: vec![true; self.num_hidden_layers.max(0) as usize],
                shared_expert_intermediate_size: None,
                router_first: true,
                output_router_logits: self.output_router_logits,
                router_aux_loss_coef: self.router_aux_loss_coef,
                router_jitter_noise: 0.0,
            }),
            sliding_windows: sliding_windows(
                Some(self.layer_types.as_deref().unwrap_or(&default)),
                self.num_hidden_layers,
                self.sliding_window,
                0,
            )?,
            rotary_positional: true,
            gemma: None,
            phi3: None,
            granite: None,
            rope_layers: None,
            sliding_rope_parameters: None,
            olmo2: false,
            base_model: "model",
            checkpoint_conversion: self.mxfp4.then_some(crate::WeightConversion::Mxfp4),
            gpt_oss: Some(GptOss {
                swiglu_alpha: self.swiglu_alpha,
                swiglu_limit: self.swiglu_limit,
            }),
            qwen3_5: None,
            gemma4: None,
            token_classification: Some("GptOssForTokenClassification"),
            question_answering: None,
        })
    }
}

/// Upstream `GptOssForCausalLM`.
pub type GptOssForCausalLM = DecoderForCausalLM<GptOssConfig>;

/// Upstream `GptOssForSequenceClassification`.
pub type GptOssForSequenceClassification = DecoderForSequenceClassification<GptOssConfig>;

/// Upstream `GptOssForTokenClassification`.
pub type GptOssForTokenClassification = DecoderForTokenClassification<GptOssConfig>;

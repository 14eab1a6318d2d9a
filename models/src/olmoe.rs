//! OLMoE (upstream `models/olmoe`): `OlmoeConfig` with upstream's defaults (OLMoE-1B-7B), and
//! `OlmoeForCausalLM`, Llama's model with RMSNorms over the whole query and key projections
//! (`q_norm` over `hidden_size`, `k_norm` over the key heads' width) and the optional
//! `clip_qkv`, whose MLPs are sparse mixture-of-experts blocks (a softmax top-k router,
//! `norm_topk_prob`, the experts' fused 3-D weights). Upstream has no other head.

use serde::{Deserialize, Serialize};

use crate::Result;
use crate::configuration_utils::LabelConfig;
use crate::llama::{DecoderConfig, DecoderForCausalLM, Family, LlamaConfig, Moe, QkNorm};

/// Upstream `OlmoeConfig` with its defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct OlmoeConfig {
    pub vocab_size: i64,
    pub hidden_size: i64,
    /// Each expert's intermediate size.
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
    /// The query, key and value projections clamped to `[-clip_qkv, clip_qkv]`.
    pub clip_qkv: Option<f64>,
    pub num_experts_per_tok: i64,
    #[serde(alias = "num_local_experts")]
    pub num_experts: i64,
    pub output_router_logits: bool,
    pub router_aux_loss_coef: f64,
    pub norm_topk_prob: bool,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Default for OlmoeConfig {
    fn default() -> Self {
        Self {
            vocab_size: 50304,
            hidden_size: 2048,
            intermediate_size: 2048,
            num_hidden_layers: 16,
            num_attention_heads: 16,
            num_key_value_heads: None,
            hidden_act: "silu".into(),
            max_position_embeddings: 4096,
            initializer_range: 0.02,
            rms_norm_eps: 1e-5,
            pad_token_id: Some(1),
            bos_token_id: None,
            eos_token_id: Some(50279.into()),
            tie_word_embeddings: false,
            rope_parameters: None,
            rope_theta: None,
            rope_scaling: None,
            attention_bias: false,
            attention_dropout: 0.0,
            clip_qkv: None,
            num_experts_per_tok: 8,
            num_experts: 64,
            output_router_logits: false,
            router_aux_loss_coef: 0.01,
            norm_topk_prob: false,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

crate::llama::decoder_config_plumbing!(OlmoeConfig, "olmoe");

impl DecoderConfig for OlmoeConfig {
    crate::llama::decoder_config_plumbing!(@methods);
    fn llama(&self) -> LlamaConfig {
        crate::llama::to_llama!(self, head_dim: None, attention_bias: self.attention_bias)
    }
    fn family(&self) -> Result<Family> {
        Ok(Family {
            model_type: "olmoe",
            causal_lm: "OlmoeForCausalLM",
            sequence_classification: None,
            prefix: "Olmoe",
            qkv_bias: self.attention_bias,
            o_bias: self.attention_bias,
            mlp_bias: false,
            qk_norm: QkNorm::Projection,
            clip_qkv: self.clip_qkv,
            moe: Some(Moe {
                num_experts: self.num_experts,
                num_experts_per_tok: self.num_experts_per_tok,
                moe_intermediate_size: self.intermediate_size,
                router: tchtrain_nn::RouterKind {
                    norm_topk_prob: self.norm_topk_prob,
                    scores_in_logits_dtype: true,
                    softmax_after_topk: false,
                },
                sparse_layers: vec![true; self.num_hidden_layers.max(0) as usize],
                shared_expert_intermediate_size: None,
                router_first: true,
                output_router_logits: self.output_router_logits,
                router_aux_loss_coef: self.router_aux_loss_coef,
                router_jitter_noise: 0.0,
            }),
            rotary_positional: true,
            gemma: None,
            phi3: None,
            granite: None,
            rope_layers: None,
            sliding_rope_parameters: None,
            olmo2: false,
            base_model: "model",
            checkpoint_conversion: Some(crate::WeightConversion::Qwen2Moe),
            gpt_oss: None,
            qwen3_5: None,
            gemma4: None,
            token_classification: None,
            question_answering: None,
            sliding_windows: vec![None; self.num_hidden_layers.max(0) as usize],
        })
    }
}

/// Upstream `OlmoeForCausalLM`.
pub type OlmoeForCausalLM = DecoderForCausalLM<OlmoeConfig>;

//! Qwen3.5-MoE (upstream `models/qwen3_5_moe`): `Qwen3_5MoeTextConfig` with upstream's
//! defaults, and `Qwen3_5MoeForCausalLM` — Qwen3.5's hybrid layers whose MLPs are all sparse
//! mixture-of-experts blocks (a softmax top-k router whose top-k weights are always
//! renormalised, the experts' fused 3-D weights, the shared expert gated by
//! `sigmoid(shared_expert_gate(x))`), `output_router_logits` / `router_aux_loss_coef` as the
//! other mixtures of experts. A `qwen3_5_moe` multimodal checkpoint is read as Qwen3.5's.

use serde::{Deserialize, Serialize};

use crate::Result;
use crate::configuration_utils::LabelConfig;
use crate::llama::{DecoderConfig, DecoderForCausalLM, Family, LlamaConfig, Moe};
use crate::qwen3_5::{hybrid_family, linear_sizes, rope_parameters};

/// Upstream `Qwen3_5MoeTextConfig` with its defaults (Qwen3.5-35B-A3B's shape).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct Qwen3_5MoeTextConfig {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub num_key_value_heads: i64,
    pub hidden_act: String,
    pub max_position_embeddings: i64,
    pub initializer_range: f64,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<serde_json::Map<String, serde_json::Value>>,
    pub attention_bias: bool,
    pub attention_dropout: f64,
    pub head_dim: i64,
    pub linear_conv_kernel_dim: i64,
    pub linear_key_head_dim: i64,
    pub linear_value_head_dim: i64,
    pub linear_num_key_heads: i64,
    pub linear_num_value_heads: i64,
    pub moe_intermediate_size: i64,
    pub shared_expert_intermediate_size: i64,
    pub num_experts_per_tok: i64,
    pub num_experts: i64,
    pub output_router_logits: bool,
    pub router_aux_loss_coef: f64,
    pub layer_types: Option<Vec<String>>,
    pub pad_token_id: Option<i64>,
    pub bos_token_id: Option<i64>,
    pub eos_token_id: Option<serde_json::Value>,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Default for Qwen3_5MoeTextConfig {
    fn default() -> Self {
        Self {
            vocab_size: 248320,
            hidden_size: 2048,
            num_hidden_layers: 40,
            num_attention_heads: 16,
            num_key_value_heads: 2,
            hidden_act: "silu".into(),
            max_position_embeddings: 32768,
            initializer_range: 0.02,
            rms_norm_eps: 1e-6,
            tie_word_embeddings: false,
            rope_parameters: None,
            attention_bias: false,
            attention_dropout: 0.0,
            head_dim: 256,
            linear_conv_kernel_dim: 4,
            linear_key_head_dim: 128,
            linear_value_head_dim: 128,
            linear_num_key_heads: 16,
            linear_num_value_heads: 32,
            moe_intermediate_size: 512,
            shared_expert_intermediate_size: 512,
            num_experts_per_tok: 8,
            num_experts: 256,
            output_router_logits: false,
            router_aux_loss_coef: 0.001,
            layer_types: None,
            pad_token_id: None,
            bos_token_id: None,
            eos_token_id: None,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

crate::llama::decoder_config_plumbing!(Qwen3_5MoeTextConfig, "qwen3_5_moe_text");

crate::qwen3_5::text_llama_fn!(moe_llama, Qwen3_5MoeTextConfig);

impl DecoderConfig for Qwen3_5MoeTextConfig {
    crate::llama::decoder_config_plumbing!(@methods text_of: "qwen3_5_moe");
    fn llama(&self) -> LlamaConfig {
        // Every layer is sparse: the dense size is the experts' (upstream has none).
        moe_llama(self, self.moe_intermediate_size)
    }
    fn family(&self) -> Result<Family> {
        Ok(Family {
            model_type: "qwen3_5_moe_text",
            causal_lm: "Qwen3_5MoeForCausalLM",
            sequence_classification: None,
            prefix: "Qwen3_5Moe",
            moe: Some(Moe {
                num_experts: self.num_experts,
                num_experts_per_tok: self.num_experts_per_tok,
                moe_intermediate_size: self.moe_intermediate_size,
                router: tchtrain_nn::RouterKind {
                    norm_topk_prob: true,
                    scores_in_logits_dtype: true,
                    softmax_after_topk: false,
                },
                sparse_layers: vec![true; self.num_hidden_layers.max(0) as usize],
                shared_expert_intermediate_size: Some(self.shared_expert_intermediate_size),
                router_first: true,
                output_router_logits: self.output_router_logits,
                router_aux_loss_coef: self.router_aux_loss_coef,
                router_jitter_noise: 0.0,
            }),
            checkpoint_conversion: Some(crate::WeightConversion::Qwen3_5MoeText),
            ..hybrid_family(
                self.layer_types.as_deref(),
                self.num_hidden_layers,
                self.attention_bias,
                linear_sizes!(self),
                &self.extra,
            )?
        })
    }
}

/// Upstream `Qwen3_5MoeForCausalLM`.
pub type Qwen3_5MoeForCausalLM = DecoderForCausalLM<Qwen3_5MoeTextConfig>;

//! Qwen3-MoE (upstream `models/qwen3_moe`): `Qwen3MoeConfig` with upstream's defaults, and
//! `Qwen3MoeForCausalLM`, Qwen3's model (per-head q/k RMSNorm) whose MLPs are sparse
//! mixture-of-experts blocks (a softmax top-k router, `norm_topk_prob`, the experts' fused
//! 3-D weights), except the layers in `mlp_only_layers` or off `decoder_sparse_step`.

use serde::{Deserialize, Serialize};

use crate::Result;
use crate::configuration_utils::LabelConfig;
use crate::llama::{
    DecoderConfig, DecoderForCausalLM, DecoderForQuestionAnswering,
    DecoderForSequenceClassification, DecoderForTokenClassification, Family, LlamaConfig, Moe,
    QkNorm, QuestionAnsweringClass,
};

/// Upstream `Qwen3MoeConfig` with its defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct Qwen3MoeConfig {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub num_key_value_heads: Option<i64>,
    /// Not a field of upstream's class: read from `config.json` when there (the released
    /// checkpoints set it), else `hidden_size / num_attention_heads`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<i64>,
    pub hidden_act: String,
    pub max_position_embeddings: i64,
    pub initializer_range: f64,
    pub rms_norm_eps: f64,
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
    pub use_sliding_window: bool,
    pub sliding_window: Option<i64>,
    pub attention_dropout: f64,
    pub decoder_sparse_step: i64,
    pub moe_intermediate_size: i64,
    pub num_experts_per_tok: i64,
    /// Upstream's attribute map saves it as `num_local_experts`.
    #[serde(rename = "num_local_experts", alias = "num_experts")]
    pub num_experts: i64,
    pub norm_topk_prob: bool,
    pub output_router_logits: bool,
    pub router_aux_loss_coef: f64,
    /// `None` means none.
    pub mlp_only_layers: Option<Vec<i64>>,
    pub pad_token_id: Option<i64>,
    pub bos_token_id: Option<i64>,
    pub eos_token_id: Option<serde_json::Value>,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Default for Qwen3MoeConfig {
    fn default() -> Self {
        Self {
            vocab_size: 151936,
            hidden_size: 2048,
            intermediate_size: 6144,
            num_hidden_layers: 24,
            num_attention_heads: 32,
            num_key_value_heads: Some(4),
            head_dim: None,
            hidden_act: "silu".into(),
            max_position_embeddings: 32768,
            initializer_range: 0.02,
            rms_norm_eps: 1e-6,
            tie_word_embeddings: false,
            rope_parameters: None,
            rope_theta: None,
            rope_scaling: None,
            attention_bias: false,
            use_sliding_window: false,
            sliding_window: Some(4096),
            attention_dropout: 0.0,
            decoder_sparse_step: 1,
            moe_intermediate_size: 768,
            num_experts_per_tok: 8,
            num_experts: 128,
            norm_topk_prob: false,
            output_router_logits: false,
            router_aux_loss_coef: 0.001,
            mlp_only_layers: None,
            pad_token_id: None,
            bos_token_id: None,
            eos_token_id: None,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

crate::llama::decoder_config_plumbing!(Qwen3MoeConfig, "qwen3_moe");

impl DecoderConfig for Qwen3MoeConfig {
    crate::llama::decoder_config_plumbing!(@methods);
    fn llama(&self) -> LlamaConfig {
        crate::llama::to_llama!(self, head_dim: self.head_dim, attention_bias: self.attention_bias)
    }
    fn family(&self) -> Result<Family> {
        // Upstream's `__post_init__`: the window only with `use_sliding_window`, then every
        // layer's mask slides over it.
        let window = self.sliding_window.filter(|_| self.use_sliding_window);
        Ok(Family {
            model_type: "qwen3_moe",
            causal_lm: "Qwen3MoeForCausalLM",
            sequence_classification: Some("Qwen3MoeForSequenceClassification"),
            prefix: "Qwen3Moe",
            qkv_bias: self.attention_bias,
            o_bias: self.attention_bias,
            mlp_bias: false,
            qk_norm: QkNorm::PerHead,
            clip_qkv: None,
            moe: Some(Moe {
                num_experts: self.num_experts,
                num_experts_per_tok: self.num_experts_per_tok,
                moe_intermediate_size: self.moe_intermediate_size,
                router: tchtrain_nn::RouterKind {
                    norm_topk_prob: self.norm_topk_prob,
                    scores_in_logits_dtype: true,
                    softmax_after_topk: false,
                },
                sparse_layers: Moe::sparse_layers(
                    self.num_hidden_layers,
                    self.num_experts,
                    self.mlp_only_layers.as_deref().unwrap_or(&[]),
                    self.decoder_sparse_step,
                )?,
                shared_expert_intermediate_size: None,
                router_first: false,
                output_router_logits: self.output_router_logits,
                router_aux_loss_coef: self.router_aux_loss_coef,
                router_jitter_noise: 0.0,
            }),
            rotary_positional: false,
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
            token_classification: Some("Qwen3MoeForTokenClassification"),
            question_answering: Some(QuestionAnsweringClass {
                name: "Qwen3MoeForQuestionAnswering",
                base_model_prefix: "transformer",
            }),
            sliding_windows: vec![window; self.num_hidden_layers.max(0) as usize],
        })
    }
}

/// Upstream `Qwen3MoeForCausalLM`.
pub type Qwen3MoeForCausalLM = DecoderForCausalLM<Qwen3MoeConfig>;

/// Upstream `Qwen3MoeForSequenceClassification`.
pub type Qwen3MoeForSequenceClassification = DecoderForSequenceClassification<Qwen3MoeConfig>;

/// Upstream `Qwen3MoeForTokenClassification`.
pub type Qwen3MoeForTokenClassification = DecoderForTokenClassification<Qwen3MoeConfig>;

/// Upstream `Qwen3MoeForQuestionAnswering`.
pub type Qwen3MoeForQuestionAnswering = DecoderForQuestionAnswering<Qwen3MoeConfig>;

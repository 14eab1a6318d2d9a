//! Mixtral (upstream `models/mixtral`): `MixtralConfig` with upstream's defaults (Mixtral
//! 8x7B), and `MixtralForCausalLM`, Mistral's model whose MLPs are sparse mixture-of-experts
//! blocks: a router whose top-k softmax probabilities are always renormalised and kept in
//! float32, the experts' fused 3-D weights, and the optional `router_jitter_noise`.

use serde::{Deserialize, Serialize};

use crate::Result;
use crate::configuration_utils::LabelConfig;
use crate::llama::{
    DecoderConfig, DecoderForCausalLM, DecoderForQuestionAnswering,
    DecoderForSequenceClassification, DecoderForTokenClassification, Family, LlamaConfig, Moe,
    QkNorm, QuestionAnsweringClass,
};

/// Upstream `MixtralConfig` with its defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct MixtralConfig {
    pub vocab_size: i64,
    pub hidden_size: i64,
    /// Each expert's intermediate size.
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub num_key_value_heads: Option<i64>,
    pub head_dim: Option<i64>,
    pub hidden_act: String,
    pub max_position_embeddings: i64,
    pub initializer_range: f64,
    pub rms_norm_eps: f64,
    pub pad_token_id: Option<i64>,
    pub bos_token_id: Option<i64>,
    pub eos_token_id: Option<serde_json::Value>,
    pub tie_word_embeddings: bool,
    /// v5 form: `{"rope_type": "default", "rope_theta": ...}`; the base defaults to 1e6.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<serde_json::Map<String, serde_json::Value>>,
    /// v4 form of the RoPE base.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// v4 form of the RoPE scaling dict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<serde_json::Map<String, serde_json::Value>>,
    /// Every layer slides over it when set.
    pub sliding_window: Option<i64>,
    pub attention_dropout: f64,
    pub num_experts_per_tok: i64,
    #[serde(alias = "num_experts")]
    pub num_local_experts: i64,
    pub output_router_logits: bool,
    pub router_aux_loss_coef: f64,
    pub router_jitter_noise: f64,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Default for MixtralConfig {
    fn default() -> Self {
        Self {
            vocab_size: 32000,
            hidden_size: 4096,
            intermediate_size: 14336,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_key_value_heads: Some(8),
            head_dim: None,
            hidden_act: "silu".into(),
            max_position_embeddings: 4096 * 32,
            initializer_range: 0.02,
            rms_norm_eps: 1e-5,
            pad_token_id: None,
            bos_token_id: Some(1),
            eos_token_id: Some(2.into()),
            tie_word_embeddings: false,
            rope_parameters: None,
            rope_theta: None,
            rope_scaling: None,
            sliding_window: None,
            attention_dropout: 0.0,
            num_experts_per_tok: 2,
            num_local_experts: 8,
            output_router_logits: false,
            router_aux_loss_coef: 0.001,
            router_jitter_noise: 0.0,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

crate::llama::decoder_config_plumbing!(MixtralConfig, "mixtral");

impl DecoderConfig for MixtralConfig {
    crate::llama::decoder_config_plumbing!(@methods);
    fn llama(&self) -> LlamaConfig {
        let mut llama =
            crate::llama::to_llama!(self, head_dim: self.head_dim, attention_bias: false);
        // Upstream's default base (`rope_theta = 1e6`) where the file names none.
        if llama.rope_parameters.is_none() && llama.rope_scaling.is_none() {
            llama.rope_theta = Some(self.rope_theta.unwrap_or(1e6));
        }
        llama
    }
    fn family(&self) -> Result<Family> {
        if !(0.0..1.0).contains(&self.router_jitter_noise) {
            return Err(crate::Error::InvalidConfig {
                field: "router_jitter_noise",
                value: self.router_jitter_noise.to_string(),
                fix: "use a noise in [0, 1): the input is scaled by U(1 - noise, 1 + noise)",
            });
        }
        Ok(Family {
            model_type: "mixtral",
            causal_lm: "MixtralForCausalLM",
            sequence_classification: Some("MixtralForSequenceClassification"),
            prefix: "Mixtral",
            qkv_bias: false,
            o_bias: false,
            mlp_bias: false,
            qk_norm: QkNorm::None,
            clip_qkv: None,
            moe: Some(Moe {
                num_experts: self.num_local_experts,
                num_experts_per_tok: self.num_experts_per_tok,
                moe_intermediate_size: self.intermediate_size,
                router: tchtrain_nn::RouterKind {
                    norm_topk_prob: true,
                    scores_in_logits_dtype: false,
                    softmax_after_topk: false,
                },
                sparse_layers: vec![true; self.num_hidden_layers.max(0) as usize],
                shared_expert_intermediate_size: None,
                router_first: true,
                output_router_logits: self.output_router_logits,
                router_aux_loss_coef: self.router_aux_loss_coef,
                router_jitter_noise: self.router_jitter_noise,
            }),
            rotary_positional: false,
            gemma: None,
            phi3: None,
            granite: None,
            rope_layers: None,
            sliding_rope_parameters: None,
            olmo2: false,
            base_model: "model",
            checkpoint_conversion: Some(crate::WeightConversion::Mixtral),
            gpt_oss: None,
            qwen3_5: None,
            gemma4: None,
            token_classification: Some("MixtralForTokenClassification"),
            question_answering: Some(QuestionAnsweringClass {
                name: "MixtralForQuestionAnswering",
                base_model_prefix: "model",
            }),
            sliding_windows: vec![self.sliding_window; self.num_hidden_layers.max(0) as usize],
        })
    }
}

/// Upstream `MixtralForCausalLM`.
pub type MixtralForCausalLM = DecoderForCausalLM<MixtralConfig>;

/// Upstream `MixtralForSequenceClassification`.
pub type MixtralForSequenceClassification = DecoderForSequenceClassification<MixtralConfig>;

/// Upstream `MixtralForTokenClassification`.
pub type MixtralForTokenClassification = DecoderForTokenClassification<MixtralConfig>;

/// Upstream `MixtralForQuestionAnswering`.
pub type MixtralForQuestionAnswering = DecoderForQuestionAnswering<MixtralConfig>;

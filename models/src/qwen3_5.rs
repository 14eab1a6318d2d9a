//! Qwen3.5 (upstream `models/qwen3_5`): `Qwen3_5TextConfig` with upstream's defaults, and
//! `Qwen3_5ForCausalLM`, the hybrid decoder — Gated DeltaNet linear-attention layers
//! (`linear_attn`) and gated full-attention layers as `layer_types` says (by default three
//! linear layers, then a full one: `full_attention_interval` 4), the zero-centred RMSNorm,
//! partial rotary embeddings (a quarter of each head).
//!
//! The hub's Qwen3.5 checkpoints are `qwen3_5` (`Qwen3_5ForConditionalGeneration`: the
//! language model under `model.language_model.`, a vision tower beside it, the multi-token
//! prediction head `mtp.*`). `AutoModelForCausalLM` reads them as upstream does: the
//! `text_config`, `Qwen3_5ForCausalLM`, the vision tower and `mtp.*` left out; what it saves
//! is upstream's `qwen3_5_text` checkpoint (weights under `model.language_model.`, as
//! upstream's `PrefixChange` writes them back).

use serde::{Deserialize, Serialize};

use crate::configuration_utils::LabelConfig;
use crate::llama::{
    DecoderConfig, DecoderForCausalLM, DecoderForSequenceClassification, Family, LlamaConfig,
    QkNorm, Qwen3_5,
};
use crate::{Error, Result};

/// The linear layers' sizes of a Qwen3.5 config.
macro_rules! linear_sizes {
    ($c:expr) => {
        tchtrain_nn::GatedDeltaNetSizes {
            hidden_size: $c.hidden_size,
            num_key_heads: $c.linear_num_key_heads,
            num_value_heads: $c.linear_num_value_heads,
            key_head_dim: $c.linear_key_head_dim,
            value_head_dim: $c.linear_value_head_dim,
            conv_kernel_dim: $c.linear_conv_kernel_dim,
        }
    };
}
pub(crate) use linear_sizes;

/// A Qwen3.5 text config's Llama form (`intermediate` the dense MLPs' size).
macro_rules! text_llama_fn {
    ($name:ident, $config:ty) => {
        pub(crate) fn $name(c: &$config, intermediate: i64) -> LlamaConfig {
            LlamaConfig {
                vocab_size: c.vocab_size,
                hidden_size: c.hidden_size,
                intermediate_size: intermediate,
                num_hidden_layers: c.num_hidden_layers,
                num_attention_heads: c.num_attention_heads,
                num_key_value_heads: Some(c.num_key_value_heads),
                head_dim: Some(c.head_dim),
                hidden_act: c.hidden_act.clone(),
                max_position_embeddings: c.max_position_embeddings,
                initializer_range: c.initializer_range,
                rms_norm_eps: c.rms_norm_eps,
                attention_bias: c.attention_bias,
                attention_dropout: c.attention_dropout,
                mlp_bias: false,
                pad_token_id: c.pad_token_id,
                bos_token_id: c.bos_token_id,
                eos_token_id: c.eos_token_id.clone(),
                tie_word_embeddings: c.tie_word_embeddings,
                rope_parameters: Some(rope_parameters(c.rope_parameters.as_ref(), &c.extra)),
                rope_theta: None,
                rope_scaling: None,
                labels: c.labels.clone(),
                extra: c.extra.clone(),
            }
        }
    };
}
/// Upstream `Qwen3_5TextConfig` with its defaults (Qwen3.5-9B's shape).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct Qwen3_5TextConfig {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub num_key_value_heads: i64,
    pub hidden_act: String,
    pub max_position_embeddings: i64,
    pub initializer_range: f64,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    /// `{"rope_type": "default", "rope_theta": ..., "partial_rotary_factor": 0.25, ...}`.
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
    /// `linear_attention` / `full_attention` per layer (`None`: from `full_attention_interval`).
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

impl Default for Qwen3_5TextConfig {
    fn default() -> Self {
        Self {
            vocab_size: 248320,
            hidden_size: 4096,
            intermediate_size: 12288,
            num_hidden_layers: 32,
            num_attention_heads: 16,
            num_key_value_heads: 4,
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
            layer_types: None,
            pad_token_id: None,
            bos_token_id: None,
            eos_token_id: None,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

/// A Qwen3.5 `config.json` as the text config `AutoModelForCausalLM` builds: the file
/// itself, or a multimodal checkpoint's (`model_type` `multimodal`) `text_config`.
pub(crate) fn read_text_config<C: serde::de::DeserializeOwned>(
    path: &std::path::Path,
    multimodal: &str,
) -> Result<C> {
    let value: serde_json::Value = crate::configuration_utils::read_config(path)?;
    let value = match value.get("model_type").and_then(serde_json::Value::as_str) {
        Some(t) if t == multimodal => {
            let mut text = value
                .get("text_config")
                .cloned()
                .unwrap_or_else(|| serde_json::json!({}));
            if let Some(map) = text.as_object_mut() {
                map.remove("model_type");
            }
            text
        }
        _ => value,
    };
    serde_json::from_value(value).map_err(|source| Error::ConfigJson {
        path: path.to_path_buf(),
        source,
    })
}

/// Upstream's `__post_init__`: `layer_types`, or by default every `full_attention_interval`-th
/// layer full attention (`extra` holds the interval when the file sets it), the rest linear.
pub(crate) fn linear_layers(
    layer_types: Option<&[String]>,
    num_hidden_layers: i64,
    extra: &serde_json::Map<String, serde_json::Value>,
) -> Result<Vec<bool>> {
    let Some(types) = layer_types else {
        let interval = extra
            .get("full_attention_interval")
            .and_then(serde_json::Value::as_i64)
            .unwrap_or(4);
        if interval <= 0 {
            return Err(Error::InvalidConfig {
                field: "full_attention_interval",
                value: interval.to_string(),
                fix: "use a positive number of layers per full-attention layer",
            });
        }
        return Ok((0..num_hidden_layers)
            .map(|i| (i + 1) % interval != 0)
            .collect());
    };
    types
        .iter()
        .map(|t| match t.as_str() {
            "linear_attention" => Ok(true),
            "full_attention" => Ok(false),
            other => Err(Error::InvalidConfig {
                field: "layer_types",
                value: other.to_string(),
                fix: "use linear_attention or full_attention",
            }),
        })
        .collect()
}

/// The RoPE dict with upstream's defaults: `rope_theta` 10000 and `partial_rotary_factor`
/// 0.25 (the top-level key when the file has one).
pub(crate) fn rope_parameters(
    rope: Option<&serde_json::Map<String, serde_json::Value>>,
    extra: &serde_json::Map<String, serde_json::Value>,
) -> serde_json::Map<String, serde_json::Value> {
    let mut rope = rope.cloned().unwrap_or_else(|| {
        let mut m = serde_json::Map::new();
        m.insert("rope_type".into(), "default".into());
        m.insert("rope_theta".into(), 10000.0.into());
        m
    });
    if !rope.contains_key("partial_rotary_factor") {
        let factor = extra
            .get("partial_rotary_factor")
            .cloned()
            .unwrap_or_else(|| 0.25.into());
        rope.insert("partial_rotary_factor".into(), factor);
    }
    rope
}

crate::llama::decoder_config_plumbing!(Qwen3_5TextConfig, "qwen3_5_text");

impl DecoderConfig for Qwen3_5TextConfig {
    crate::llama::decoder_config_plumbing!(@methods text_of: "qwen3_5");
    fn llama(&self) -> LlamaConfig {
        text_llama(self, self.intermediate_size)
    }
    fn family(&self) -> Result<Family> {
        Ok(Family {
            model_type: "qwen3_5_text",
            causal_lm: "Qwen3_5ForCausalLM",
            sequence_classification: Some("Qwen3_5TextForSequenceClassification"),
            prefix: "Qwen3_5",
            moe: None,
            checkpoint_conversion: Some(crate::WeightConversion::Qwen3_5Text),
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

text_llama_fn!(text_llama, Qwen3_5TextConfig);
pub(crate) use text_llama_fn;

/// What Qwen3.5 and Qwen3.5-MoE share in their [`Family`] (the caller sets the names, the
/// experts and the checkpoint layout).
pub(crate) fn hybrid_family(
    layer_types: Option<&[String]>,
    num_hidden_layers: i64,
    attention_bias: bool,
    linear: tchtrain_nn::GatedDeltaNetSizes,
    extra: &serde_json::Map<String, serde_json::Value>,
) -> Result<Family> {
    let linear_layers = linear_layers(layer_types, num_hidden_layers, extra)?;
    // The linear sizes' error names the field at fault.
    linear.validate()?;
    Ok(Family {
        model_type: "",
        causal_lm: "",
        sequence_classification: None,
        prefix: "",
        qkv_bias: attention_bias,
        o_bias: attention_bias,
        mlp_bias: false,
        qk_norm: QkNorm::PerHead,
        clip_qkv: None,
        moe: None,
        sliding_windows: vec![None; num_hidden_layers.max(0) as usize],
        // `self.rotary_emb(hidden_states, position_ids)`, positionally.
        rotary_positional: true,
        gemma: None,
        phi3: None,
        granite: None,
        rope_layers: None,
        sliding_rope_parameters: None,
        olmo2: false,
        base_model: "model",
        checkpoint_conversion: None,
        gpt_oss: None,
        qwen3_5: Some(Qwen3_5 {
            linear_layers,
            linear,
        }),
        gemma4: None,
        token_classification: None,
        question_answering: None,
    })
}

/// Upstream `Qwen3_5ForCausalLM`.
pub type Qwen3_5ForCausalLM = DecoderForCausalLM<Qwen3_5TextConfig>;

/// Upstream `Qwen3_5TextForSequenceClassification`.
pub type Qwen3_5TextForSequenceClassification = DecoderForSequenceClassification<Qwen3_5TextConfig>;

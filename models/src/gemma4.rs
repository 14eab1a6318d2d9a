//! Gemma 4's text model (upstream `models/gemma4`, `model_type` `gemma4_text`):
//! `Gemma4TextConfig` with upstream's defaults, and `Gemma4ForCausalLM`: Gemma 3's sandwich
//! layers with Gemma 4's own parts — `Gemma4RMSNorm` (a power `-0.5`, weights scaling as they
//! are), queries, keys and values normalised per head (the values without a scale), the
//! attention unscaled (`scaling = 1.0`), the full layers' wider heads (`global_head_dim`, as
//! `per_layer_config` records it) and proportional RoPE, the values shared with the keys
//! (`attention_k_eq_v`), the last layers reusing earlier layers' keys and values
//! (`num_kv_shared_layers`, their MLPs twice as wide with `use_double_wide_mlp`), per-layer
//! input embeddings (PLE: `embed_tokens_per_layer`, `per_layer_model_projection`, a gated
//! projection in each layer), a mixture of experts beside the MLP (`enable_moe_block`: the
//! router reads the layer's residual, with its scale and per-expert scale), and each layer's
//! output scaled by its `layer_scalar` buffer.
//!
//! `gemma4` checkpoints (`Gemma4ForConditionalGeneration`) train through their text path: the
//! language model under `model.language_model`, the vision and audio towers carried frozen,
//! the image / video / audio placeholder ids embedded as the pad token, as upstream's.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::configuration_utils::{LabelConfig, PretrainedConfig};
use crate::gemma2::check_heads;
use crate::llama::{
    DecoderConfig, DecoderForCausalLM, Family, Gemma, Gemma4, KvSharing, LlamaConfig, QkNorm,
};
use crate::{Error, Result};

/// Upstream `Gemma4TextConfig` with its defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct Gemma4TextConfig {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub num_key_value_heads: i64,
    pub head_dim: i64,
    pub hidden_activation: String,
    pub max_position_embeddings: i64,
    pub initializer_range: f64,
    pub rms_norm_eps: f64,
    pub pad_token_id: Option<i64>,
    pub eos_token_id: Option<Value>,
    pub bos_token_id: Option<i64>,
    pub tie_word_embeddings: bool,
    /// Per layer type: `{"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
    /// "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
    /// "rope_theta": 1e6}}` by default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<Map<String, Value>>,
    pub attention_bias: bool,
    pub attention_dropout: f64,
    pub sliding_window: i64,
    /// `full_attention` / `sliding_attention` per layer; `None`: every sixth layer full. The
    /// last layer is made full, as upstream's `__post_init__` forces it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer_types: Option<Vec<String>>,
    pub final_logit_softcapping: Option<f64>,
    /// `"vision"` (vision tokens attend bidirectionally: no text token is one here) or
    /// `"all"` (refused: bidirectional text attention is not implemented here).
    pub use_bidirectional_attention: Option<String>,
    pub vocab_size_per_layer_input: i64,
    /// `0` / `null`: no per-layer input embeddings.
    pub hidden_size_per_layer_input: Option<i64>,
    pub attention_k_eq_v: bool,
    pub num_kv_shared_layers: i64,
    pub enable_moe_block: bool,
    pub use_double_wide_mlp: bool,
    pub num_experts: Option<i64>,
    pub top_k_experts: Option<i64>,
    pub moe_intermediate_size: Option<i64>,
    /// Upstream's per-layer overrides (`{"05": {"head_dim": 512, "num_key_value_heads": 2}}`);
    /// `None`: the full layers' from `global_head_dim` / `num_global_key_value_heads`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_layer_config: Option<Map<String, Value>>,
    /// The full layers' head size when `per_layer_config` is absent (upstream pops it into
    /// `per_layer_config`; 512 by default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub global_head_dim: Option<i64>,
    /// The full layers' key / value heads with `attention_k_eq_v`, when `per_layer_config`
    /// is absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_global_key_value_heads: Option<i64>,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Default for Gemma4TextConfig {
    fn default() -> Self {
        Self {
            vocab_size: 262_144,
            hidden_size: 2304,
            intermediate_size: 9216,
            num_hidden_layers: 30,
            num_attention_heads: 8,
            num_key_value_heads: 4,
            head_dim: 256,
            hidden_activation: "gelu_pytorch_tanh".into(),
            max_position_embeddings: 131_072,
            initializer_range: 0.02,
            rms_norm_eps: 1e-6,
            pad_token_id: Some(0),
            eos_token_id: Some(1.into()),
            bos_token_id: Some(2),
            tie_word_embeddings: true,
            rope_parameters: None,
            attention_bias: false,
            attention_dropout: 0.0,
            sliding_window: 512,
            layer_types: None,
            final_logit_softcapping: None,
            use_bidirectional_attention: None,
            vocab_size_per_layer_input: 262_144,
            hidden_size_per_layer_input: Some(256),
            attention_k_eq_v: false,
            num_kv_shared_layers: 0,
            enable_moe_block: false,
            use_double_wide_mlp: false,
            num_experts: None,
            top_k_experts: None,
            moe_intermediate_size: None,
            per_layer_config: None,
            global_head_dim: None,
            num_global_key_value_heads: None,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

fn invalid(field: &'static str, value: impl ToString, fix: &'static str) -> Error {
    Error::InvalidConfig {
        field,
        value: value.to_string(),
        fix,
    }
}

impl Gemma4TextConfig {
    /// Upstream's `layer_types` after `__post_init__`: the given ones or five sliding layers
    /// to one full, the last layer full.
    pub fn layer_types(&self) -> Result<Vec<String>> {
        let mut types = match &self.layer_types {
            Some(t) => t.clone(),
            None => (0..self.num_hidden_layers)
                .map(|i| match (i + 1) % 6 {
                    0 => "full_attention".to_string(),
                    _ => "sliding_attention".to_string(),
                })
                .collect(),
        };
        if types.len() as i64 != self.num_hidden_layers {
            return Err(invalid(
                "layer_types",
                format!("{} entries", types.len()),
                "give one entry per layer (num_hidden_layers)",
            ));
        }
        if let Some(t) = types
            .iter()
            .find(|t| !matches!(t.as_str(), "full_attention" | "sliding_attention"))
        {
            return Err(invalid(
                "layer_types",
                t,
                "use full_attention or sliding_attention",
            ));
        }
        if let Some(last) = types.last_mut() {
            *last = "full_attention".into();
        }
        Ok(types)
    }

    /// The RoPE of one layer type: the config's, else upstream's default for it.
    pub fn rope_parameters_of(&self, layer_type: &str) -> Result<Map<String, Value>> {
        let given = self
            .rope_parameters
            .as_ref()
            .and_then(|p| p.get(layer_type));
        let mut p = match given {
            Some(Value::Object(m)) => m.clone(),
            None | Some(Value::Null) => match layer_type {
                "full_attention" => serde_json::json!({"rope_type": "proportional",
                    "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}),
                _ => serde_json::json!({"rope_type": "default", "rope_theta": 10_000.0}),
            }
            .as_object()
            .cloned()
            .unwrap_or_default(),
            Some(other) => {
                return Err(invalid(
                    "rope_parameters",
                    format!("{layer_type}: {other}"),
                    "give one dict per layer type (sliding_attention, full_attention)",
                ));
            }
        };
        p.entry("rope_type").or_insert("default".into());
        Ok(p)
    }

    /// Each layer's `(head_dim, num_key_value_heads)`: upstream's `per_layer_config`, or the
    /// one `__post_init__` builds (the full layers' `global_head_dim`, and with
    /// `attention_k_eq_v` their `num_global_key_value_heads`).
    pub fn layer_heads(&self) -> Result<Vec<(i64, i64)>> {
        let types = self.layer_types()?;
        let base = (self.head_dim, self.num_key_value_heads);
        let mut heads = vec![base; types.len()];
        match &self.per_layer_config {
            Some(overrides) => {
                for (key, value) in overrides {
                    let idx: usize =
                        key.parse()
                            .ok()
                            .filter(|i| *i < types.len())
                            .ok_or_else(|| {
                                invalid(
                                    "per_layer_config",
                                    key,
                                    "key each override by a layer index below num_hidden_layers",
                                )
                            })?;
                    let map = value.as_object().ok_or_else(|| {
                        invalid(
                            "per_layer_config",
                            value,
                            "give each layer's overrides as a dict",
                        )
                    })?;
                    for (k, v) in map {
                        let n = v.as_i64().ok_or_else(|| {
                            invalid(
                                "per_layer_config",
                                format!("{key}.{k}: {v}"),
                                "give an integer",
                            )
                        })?;
                        match k.as_str() {
                            "head_dim" => heads[idx].0 = n,
                            "num_key_value_heads" => heads[idx].1 = n,
                            _ => {
                                return Err(invalid(
                                    "per_layer_config",
                                    format!("{key}.{k}"),
                                    "only head_dim and num_key_value_heads vary by layer in Gemma 4 here",
                                ));
                            }
                        }
                    }
                }
            }
            None => {
                let global = (
                    self.global_head_dim.unwrap_or(512),
                    match (self.attention_k_eq_v, self.num_global_key_value_heads) {
                        (true, Some(kv)) => kv,
                        _ => self.num_key_value_heads,
                    },
                );
                for (h, t) in heads.iter_mut().zip(&types) {
                    if t == "full_attention" {
                        *h = global;
                    }
                }
            }
        }
        // One RoPE per layer type: its layers share a head size.
        for kind in ["full_attention", "sliding_attention"] {
            let dims: Vec<i64> = types
                .iter()
                .zip(&heads)
                .filter(|(t, _)| *t == kind)
                .map(|(_, h)| h.0)
                .collect();
            if dims.windows(2).any(|w| w[0] != w[1]) {
                return Err(invalid(
                    "per_layer_config",
                    format!("{kind} head_dim {dims:?}"),
                    "give the layers of one type one head_dim (their rotary embedding is one)",
                ));
            }
        }
        for &(hd, kv) in &heads {
            if hd <= 0 || hd % 2 != 0 || kv <= 0 || self.num_attention_heads % kv != 0 {
                return Err(invalid(
                    "per_layer_config",
                    format!(
                        "head_dim {hd}, num_key_value_heads {kv} (num_attention_heads {})",
                        self.num_attention_heads
                    ),
                    "use an even positive head_dim and key / value heads dividing num_attention_heads",
                ));
            }
        }
        Ok(heads)
    }

    /// Upstream's `kv_sharing_modes`: the last `num_kv_shared_layers` layers reuse the keys
    /// and values of the last earlier layer of their type, which stores them.
    pub fn kv_sharing_modes(&self) -> Result<Vec<KvSharing>> {
        let types = self.layer_types()?;
        let n = types.len();
        if self.num_kv_shared_layers == 0 {
            return Ok(vec![KvSharing::Own; n]);
        }
        if self.num_kv_shared_layers < 0 || self.num_kv_shared_layers as usize >= n {
            return Err(invalid(
                "num_kv_shared_layers",
                self.num_kv_shared_layers,
                "share the keys and values of fewer layers than num_hidden_layers",
            ));
        }
        let first_shared = n - self.num_kv_shared_layers as usize;
        let mut modes: Vec<KvSharing> = (0..n)
            .map(|i| {
                if i < first_shared {
                    KvSharing::Own
                } else {
                    KvSharing::Reuse
                }
            })
            .collect();
        for kind in ["full_attention", "sliding_attention"] {
            if !types.iter().any(|t| t == kind) {
                continue;
            }
            match types[..first_shared].iter().rposition(|t| t == kind) {
                Some(i) => modes[i] = KvSharing::Store,
                None => {
                    return Err(invalid(
                        "num_kv_shared_layers",
                        self.num_kv_shared_layers,
                        "The set of layer types producing a cache is different than the set of layer types using them (upstream's message)",
                    ));
                }
            }
        }
        Ok(modes)
    }

    /// The bidirectional modes: `None` and `"vision"` attend causally over text.
    fn check_bidirectional(&self) -> Result<()> {
        match self.use_bidirectional_attention.as_deref() {
            None | Some("vision") => Ok(()),
            Some(other) => Err(invalid(
                "use_bidirectional_attention",
                other,
                "bidirectional text attention (\"all\") is not implemented here; use null or \"vision\"",
            )),
        }
    }

    fn family_with(&self, placeholder_ids: Vec<i64>) -> Result<Family> {
        self.check_bidirectional()?;
        check_heads(self.hidden_size, self.num_attention_heads)?;
        let types = self.layer_types()?;
        let heads = self.layer_heads()?;
        let sliding = self.rope_parameters_of("sliding_attention")?;
        self.rope_parameters_of("full_attention")?;
        if self.sliding_window <= 0 {
            return Err(invalid(
                "sliding_window",
                self.sliding_window,
                "use a positive window",
            ));
        }
        let ple = self.hidden_size_per_layer_input.filter(|&h| h != 0);
        if let Some(h) = ple
            && (h < 0 || self.vocab_size_per_layer_input <= 0)
        {
            return Err(invalid(
                "hidden_size_per_layer_input",
                format!(
                    "{h} (vocab_size_per_layer_input {})",
                    self.vocab_size_per_layer_input
                ),
                "use positive per-layer input sizes, or 0 to turn the per-layer inputs off",
            ));
        }
        let moe = match self.enable_moe_block {
            false => None,
            true => {
                let need = |field: &'static str, v: Option<i64>| {
                    v.filter(|v| *v > 0).ok_or_else(|| {
                        invalid(
                            field,
                            format!("{v:?}"),
                            "enable_moe_block needs a positive value",
                        )
                    })
                };
                let experts = need("num_experts", self.num_experts)?;
                let top_k = need("top_k_experts", self.top_k_experts)?;
                if top_k > experts {
                    return Err(invalid(
                        "top_k_experts",
                        format!("{top_k} (num_experts {experts})"),
                        "route each token to at most num_experts experts",
                    ));
                }
                Some((
                    experts,
                    top_k,
                    need("moe_intermediate_size", self.moe_intermediate_size)?,
                ))
            }
        };
        Ok(Family {
            model_type: "gemma4_text",
            causal_lm: "Gemma4ForCausalLM",
            sequence_classification: None,
            prefix: "Gemma4",
            qkv_bias: self.attention_bias,
            o_bias: self.attention_bias,
            mlp_bias: false,
            qk_norm: QkNorm::PerHead,
            clip_qkv: None,
            moe: None,
            sliding_windows: types
                .iter()
                .map(|t| (t == "sliding_attention").then_some(self.sliding_window))
                .collect(),
            rotary_positional: true,
            gemma: Some(Gemma {
                sandwich_norms: true,
                query_pre_attn_scalar: None,
                attn_logit_softcapping: None,
                final_logit_softcapping: self.final_logit_softcapping,
                eager_attention: false,
                text_model: true,
            }),
            phi3: None,
            granite: None,
            rope_layers: None,
            sliding_rope_parameters: Some(sliding),
            olmo2: false,
            base_model: "model",
            checkpoint_conversion: None,
            gpt_oss: None,
            qwen3_5: None,
            gemma4: Some(Gemma4 {
                layer_heads: heads,
                attention_k_eq_v: self.attention_k_eq_v,
                kv_sharing: self.kv_sharing_modes()?,
                use_double_wide_mlp: self.use_double_wide_mlp,
                per_layer_input: ple.map(|h| (h, self.vocab_size_per_layer_input)),
                moe,
                placeholder_ids,
            }),
            token_classification: None,
            question_answering: None,
        })
    }

    /// The config as upstream's `to_dict` writes it: `per_layer_config` spelled out (its keys
    /// zero-padded), `global_head_dim` / `num_global_key_value_heads` folded into it.
    fn to_upstream_json(&self) -> Result<Value> {
        let mut v = crate::configuration_utils::to_value(self)?;
        let heads = self.layer_heads()?;
        if let Some(map) = v.as_object_mut() {
            map.remove("global_head_dim");
            map.remove("num_global_key_value_heads");
            map.insert("layer_types".into(), self.layer_types()?.into());
            let digits = heads.len().saturating_sub(1).to_string().len();
            let mut overrides = Map::new();
            for (i, &(hd, kv)) in heads.iter().enumerate() {
                let mut o = Map::new();
                if hd != self.head_dim {
                    o.insert("head_dim".into(), hd.into());
                }
                if kv != self.num_key_value_heads {
                    o.insert("num_key_value_heads".into(), kv.into());
                }
                if !o.is_empty() {
                    overrides.insert(format!("{i:0digits$}"), o.into());
                }
            }
            map.insert("per_layer_config".into(), overrides.into());
        }
        Ok(v)
    }
}

impl PretrainedConfig for Gemma4TextConfig {
    fn model_type(&self) -> &'static str {
        "gemma4_text"
    }
    fn to_json_value(&self) -> Result<Value> {
        self.to_upstream_json()
    }
    fn labels(&self) -> &LabelConfig {
        &self.labels
    }
}

impl DecoderConfig for Gemma4TextConfig {
    crate::llama::decoder_config_plumbing!(@methods);
    fn llama(&self) -> LlamaConfig {
        LlamaConfig {
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_hidden_layers: self.num_hidden_layers,
            num_attention_heads: self.num_attention_heads,
            num_key_value_heads: Some(self.num_key_value_heads),
            head_dim: Some(self.head_dim),
            hidden_act: self.hidden_activation.clone(),
            max_position_embeddings: self.max_position_embeddings,
            initializer_range: self.initializer_range,
            rms_norm_eps: self.rms_norm_eps,
            attention_bias: self.attention_bias,
            attention_dropout: self.attention_dropout,
            mlp_bias: false,
            pad_token_id: self.pad_token_id,
            bos_token_id: self.bos_token_id,
            eos_token_id: self.eos_token_id.clone(),
            tie_word_embeddings: self.tie_word_embeddings,
            // The full layers' RoPE (for their own head size; the sliding layers' is the
            // family's). Checked by `family()`, which every constructor and `from_file` call.
            rope_parameters: self.rope_parameters_of("full_attention").ok(),
            rope_theta: None,
            rope_scaling: None,
            labels: self.labels.clone(),
            extra: self.extra.clone(),
        }
    }
    fn family(&self) -> Result<Family> {
        self.family_with(Vec::new())
    }
}

/// Upstream `Gemma4ForCausalLM` (the text model).
pub type Gemma4ForCausalLM = DecoderForCausalLM<Gemma4TextConfig>;

/// Upstream `Gemma4Config` (`model_type` `gemma4`, the hub's Gemma 4 checkpoints): the text
/// model's config under `text_config`, the vision and audio towers' kept as they are (they
/// are not run here), the placeholder token ids, a head tied to the text embeddings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct Gemma4Config {
    pub text_config: Gemma4TextConfig,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vision_config: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audio_config: Option<Value>,
    pub boi_token_id: Option<i64>,
    pub eoi_token_id: Option<i64>,
    pub image_token_id: Option<i64>,
    pub video_token_id: Option<i64>,
    pub boa_token_id: Option<i64>,
    pub eoa_token_index: Option<i64>,
    pub audio_token_id: Option<i64>,
    pub initializer_range: Option<f64>,
    pub tie_word_embeddings: bool,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Default for Gemma4Config {
    fn default() -> Self {
        Self {
            text_config: Gemma4TextConfig::default(),
            vision_config: None,
            audio_config: None,
            boi_token_id: Some(255_999),
            eoi_token_id: Some(258_882),
            image_token_id: Some(258_880),
            video_token_id: Some(258_884),
            boa_token_id: Some(256_000),
            eoa_token_index: Some(258_883),
            audio_token_id: Some(258_881),
            initializer_range: Some(0.02),
            tie_word_embeddings: true,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

impl PretrainedConfig for Gemma4Config {
    fn model_type(&self) -> &'static str {
        "gemma4"
    }
    fn to_json_value(&self) -> Result<Value> {
        let mut v = crate::configuration_utils::to_value(self)?;
        if let Some(map) = v.as_object_mut() {
            let mut text = self.text_config.to_upstream_json()?;
            // The nested config names its own type, as upstream's `to_dict` writes it.
            if let Some(t) = text.as_object_mut() {
                t.insert("model_type".into(), "gemma4_text".into());
            }
            map.insert("text_config".into(), text);
        }
        Ok(v)
    }
    fn labels(&self) -> &LabelConfig {
        &self.labels
    }
}

impl DecoderConfig for Gemma4Config {
    crate::llama::decoder_config_plumbing!(@methods);
    fn llama(&self) -> LlamaConfig {
        LlamaConfig {
            tie_word_embeddings: self.tie_word_embeddings,
            labels: self.labels.clone(),
            extra: self.extra.clone(),
            ..self.text_config.llama()
        }
    }
    fn family(&self) -> Result<Family> {
        // Upstream's `get_placeholder_mask`: the image, video and audio token ids.
        let placeholders = [
            self.image_token_id,
            self.video_token_id,
            self.audio_token_id,
        ]
        .into_iter()
        .flatten()
        .collect();
        let text = self.text_config.family_with(placeholders)?;
        Ok(Family {
            model_type: "gemma4",
            causal_lm: "Gemma4ForConditionalGeneration",
            base_model: "model.language_model",
            ..text
        })
    }
}

/// Upstream `Gemma4ForConditionalGeneration`'s text path: the language model
/// (`model.language_model`) and `lm_head`, trained and saved with the checkpoint's vision and
/// audio towers and their embedders carried as frozen variables.
pub type Gemma4ForConditionalGeneration = DecoderForCausalLM<Gemma4Config>;

/// Upstream `Gemma4TextRouter`: the layer's residual normalised without a scale, times
/// `scale` and `hidden_size ** -0.5`, projected (`proj`) to the experts' scores; softmax in
/// float32, the top `top_k_experts` renormalised to sum to 1, times their `per_expert_scale`.
#[derive(Debug)]
pub(crate) struct Gemma4TextRouter {
    norm: tchtrain_nn::RmsNorm,
    scale: tch::Tensor,
    per_expert_scale: tch::Tensor,
    proj: tchtrain_nn::Linear,
    top_k: i64,
    scalar_root_size: f64,
}

impl Gemma4TextRouter {
    /// The router at `p`, created in upstream's parameter order (`scale`, `per_expert_scale`,
    /// then `proj`).
    pub(crate) fn new(
        p: tchtrain_nn::Path<'_>,
        hidden: i64,
        num_experts: i64,
        top_k: i64,
        eps: f64,
        std: f64,
        norm_class: String,
    ) -> Self {
        use tch::nn::Init;
        use tchtrain_nn::initialization::var;
        let scale = var(&p, "scale", &[hidden], Init::Const(1.0));
        let per_expert_scale = var(&p, "per_expert_scale", &[num_experts], Init::Const(1.0));
        Self {
            norm: tchtrain_nn::RmsNorm::gemma4(&p / "norm", hidden, eps, false, norm_class),
            scale,
            per_expert_scale,
            proj: tchtrain_nn::Linear::in_layer(&p / "proj", hidden, num_experts, false, std),
            top_k,
            scalar_root_size: (hidden as f64).powf(-0.5),
        }
    }

    /// `(router_probabilities, top_k_weights, top_k_index)` for the hidden states
    /// `[tokens, hidden]`.
    pub(crate) fn forward(
        &self,
        h: &tch::Tensor,
    ) -> Result<(tch::Tensor, tch::Tensor, tch::Tensor)> {
        let h = self.norm.forward(h) * &self.scale * self.scalar_root_size;
        let scores = self.proj.forward(&h);
        let probs = scores.f_softmax(-1, tch::Kind::Float)?;
        let (top, index) = probs.f_topk(self.top_k, -1, true, true)?;
        let top = top.f_div(&top.f_sum_dim_intlist(-1, true, None::<tch::Kind>)?)?;
        let top = top.f_mul(&self.per_expert_scale.f_index(&[Some(&index)])?)?;
        Ok((probs, top, index))
    }
}

//! Upstream's `GenerationConfig` (`generation/configuration_utils.py` of transformers 5.23):
//! every field unset (`None`) until `generate` fills the global defaults in; read from
//! `generation_config.json` (or derived from `config.json`, `from_model_config`), written
//! back with only the fields that are set.
//!
//! The fields a decoding here reads are the ones below. Every other field upstream knows is
//! refused when set to a value that would change the output (group / constrained beam
//! search, the other warpers and processors, assisted decoding, watermarking...), with the
//! field's name; the
//! ones that change nothing here (`output_attentions`, `cache_implementation`...) are kept
//! as they were read and written back.

use std::path::Path;

use serde_json::{Map, Value};

use crate::{Error, Result};

/// `early_stopping` of beam search: stop when `num_beams` hypotheses are done (`True`),
/// by upstream's heuristic (`False`, the default), or only when no better one can come
/// (`"never"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EarlyStopping {
    /// `False`.
    #[default]
    False,
    /// `True`.
    True,
    /// `"never"`.
    Never,
}

/// The file `save_pretrained` writes.
pub const GENERATION_CONFIG_NAME: &str = "generation_config.json";

/// Upstream's `GenerationConfig`, for greedy decoding, multinomial sampling and beam search.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GenerationConfig {
    /// `max_length`: prompt + new tokens (default 20 new tokens past the prompt, capped at
    /// the model's `max_position_embeddings`).
    pub max_length: Option<i64>,
    /// `max_new_tokens`: takes precedence over `max_length`.
    pub max_new_tokens: Option<i64>,
    /// `min_length` (prompt included): the end-of-sequence tokens are masked before it.
    pub min_length: Option<i64>,
    /// `min_new_tokens`.
    pub min_new_tokens: Option<i64>,
    /// `do_sample` (default false: greedy).
    pub do_sample: Option<bool>,
    /// `num_beams` (default 1: no beam search).
    pub num_beams: Option<i64>,
    /// `length_penalty` of beam search (default 1.0): finished hypotheses score
    /// `sum of log-probabilities / length ** length_penalty`.
    pub length_penalty: Option<f64>,
    /// `early_stopping` of beam search.
    pub early_stopping: Option<EarlyStopping>,
    /// `use_cache` (default true).
    pub use_cache: Option<bool>,
    /// `temperature` (default 1.0).
    pub temperature: Option<f64>,
    /// `top_k` (default 50; 0 turns it off).
    pub top_k: Option<i64>,
    /// `top_p` (default 1.0: off).
    pub top_p: Option<f64>,
    /// `min_p`.
    pub min_p: Option<f64>,
    /// `repetition_penalty` (default 1.0: off).
    pub repetition_penalty: Option<f64>,
    /// `no_repeat_ngram_size` (default 0: off).
    pub no_repeat_ngram_size: Option<i64>,
    /// `num_return_sequences` (default 1).
    pub num_return_sequences: Option<i64>,
    /// `output_scores`.
    pub output_scores: Option<bool>,
    /// `return_dict_in_generate`.
    pub return_dict_in_generate: Option<bool>,
    /// `pad_token_id` (default: the first end-of-sequence token).
    pub pad_token_id: Option<i64>,
    /// `bos_token_id`.
    pub bos_token_id: Option<i64>,
    /// `eos_token_id`: one id or a list.
    pub eos_token_id: Option<Vec<i64>>,
    /// `decoder_start_token_id`: the first decoder token of an encoder-decoder model
    /// (default: `bos_token_id`).
    pub decoder_start_token_id: Option<i64>,
    /// `forced_bos_token_id`: the token forced first after the decoder start (mBART's target
    /// language).
    pub forced_bos_token_id: Option<i64>,
    /// `forced_eos_token_id`: one id or a list, forced at the last position `max_length`
    /// allows (BART).
    pub forced_eos_token_id: Option<Vec<i64>>,
    /// `suppress_tokens`: ids whose scores are always -inf (Whisper's).
    pub suppress_tokens: Option<Vec<i64>>,
    /// `begin_suppress_tokens`: ids whose scores are -inf at the first generated position.
    pub begin_suppress_tokens: Option<Vec<i64>>,
    /// Fields kept as read that change nothing here, written back as they were.
    pub other: Map<String, Value>,
}

/// Upstream fields that change nothing here: versions and provenance, compilation, and
/// what only an assistant model or continuous batching reads (`generate` here takes none of
/// those).
const INERT: [&str; 16] = [
    "_from_model_config",
    "transformers_version",
    "compile_config",
    "disable_compile",
    "is_assistant",
    "num_assistant_tokens",
    "num_assistant_tokens_schedule",
    "assistant_confidence_threshold",
    "assistant_lookbehind",
    "target_lookbehind",
    "assistant_early_exit",
    "assistant_ensemble_weight",
    "prompt_lookup_num_tokens",
    "max_matching_ngram_size",
    "speculation_type",
    "continuous_batching_config",
];

/// The fields of Whisper's `generation_config.json` that `WhisperGenerationMixin.generate`
/// reads (the language and task tokens, timestamps, alignment heads): kept in
/// [`GenerationConfig::other`] for it; any other model's `generate` reads none of them, as
/// upstream's.
pub(crate) const WHISPER_FIELDS: [&str; 11] = [
    "lang_to_id",
    "task_to_id",
    "no_timestamps_token_id",
    "is_multilingual",
    "language",
    "task",
    "return_timestamps",
    "alignment_heads",
    "max_initial_timestamp_index",
    "prev_sot_token_id",
    "forced_decoder_ids",
];

/// Upstream fields with their neutral value: set to anything else they would change the
/// output (or what `generate` returns), which is not implemented here.
fn neutral(key: &str) -> Option<Value> {
    Some(match key {
        "typical_p" | "encoder_repetition_penalty" | "num_beam_groups" | "guidance_scale" => {
            Value::from(1.0)
        }
        "epsilon_cutoff"
        | "eta_cutoff"
        | "encoder_no_repeat_ngram_size"
        | "diversity_penalty"
        | "penalty_alpha" => Value::from(0.0),
        "remove_invalid_values"
        | "renormalize_logits"
        | "low_memory"
        | "output_attentions"
        | "output_hidden_states"
        | "output_logits"
        | "token_healing"
        | "use_mtp" => Value::Bool(false),
        "cache_implementation" => Value::from("dynamic"),
        _ => return None,
    })
}

/// Every field of upstream's `GenerationConfig` (what `from_model_config` takes from a
/// `config.json`).
const GENERATION_FIELDS: [&str; 73] = [
    "assistant_confidence_threshold",
    "assistant_early_exit",
    "assistant_ensemble_weight",
    "assistant_lookbehind",
    "bad_words_ids",
    "begin_suppress_tokens",
    "bos_token_id",
    "cache_config",
    "cache_implementation",
    "compile_config",
    "constraints",
    "continuous_batching_config",
    "decoder_start_token_id",
    "disable_compile",
    "diversity_penalty",
    "do_sample",
    "dola_layers",
    "early_stopping",
    "encoder_no_repeat_ngram_size",
    "encoder_repetition_penalty",
    "eos_token_id",
    "epsilon_cutoff",
    "eta_cutoff",
    "exponential_decay_length_penalty",
    "force_words_ids",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "guidance_scale",
    "is_assistant",
    "length_penalty",
    "low_memory",
    "max_cache_len",
    "max_length",
    "max_matching_ngram_size",
    "max_new_tokens",
    "max_time",
    "min_length",
    "min_new_tokens",
    "min_p",
    "no_repeat_ngram_size",
    "num_assistant_tokens",
    "num_assistant_tokens_schedule",
    "num_beam_groups",
    "num_beams",
    "num_return_sequences",
    "output_attentions",
    "output_hidden_states",
    "output_logits",
    "output_scores",
    "pad_token_id",
    "penalty_alpha",
    "prefill_chunk_size",
    "prompt_lookup_num_tokens",
    "remove_invalid_values",
    "renormalize_logits",
    "repetition_penalty",
    "return_dict_in_generate",
    "sequence_bias",
    "speculation_type",
    "stop_strings",
    "suppress_tokens",
    "target_lookbehind",
    "temperature",
    "token_healing",
    "top_h",
    "top_k",
    "top_p",
    "transformers_version",
    "typical_p",
    "use_cache",
    "use_mtp",
    "watermarking_config",
    "_from_model_config",
];

fn bad(field: &str, detail: impl Into<String>) -> Error {
    Error::InvalidArgument {
        field: "generation_config",
        detail: format!("{field}: {}", detail.into()),
    }
}

/// A model folder's generation configuration as upstream keeps it on a generative model
/// (`model.generation_config`): `generation_config.json` as written, else the generation
/// fields of `config.json` with `_from_model_config` (`GenerationConfig.from_model_config`).
/// Kept as JSON so that loading never refuses a model for an option `generate` here does not
/// implement; [`GenerationConfig::from_json`] reads it when generating.
pub(crate) fn model_generation_config(dir: &Path, config: &Value) -> Result<Value> {
    let file = dir.join(GENERATION_CONFIG_NAME);
    if file.is_file() {
        return crate::configuration_utils::read_config(&file);
    }
    Ok(generation_fields_of(config))
}

/// `from_model_config`'s dictionary: the generation fields `config` sets.
pub(crate) fn generation_fields_of(config: &Value) -> Value {
    let mut fields: serde_json::Map<String, Value> = config
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, v)| {
                    GENERATION_FIELDS.contains(&k.as_str())
                        && k.as_str() != "transformers_version"
                        && !v.is_null()
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    // Upstream's `PretrainedConfig.to_dict()` always holds these three.
    for (k, v) in [
        ("output_attentions", false),
        ("output_hidden_states", false),
        ("use_cache", true),
    ] {
        fields.entry(k).or_insert(Value::Bool(v));
    }
    fields.insert("_from_model_config".into(), Value::Bool(true));
    Value::Object(fields)
}

/// Writes a model's generation configuration into `dir` as upstream's `save_pretrained`:
/// `generation_config.json`, keys sorted, indented by 2, this version of transformers.
pub(crate) fn save_model_generation_config(dir: &Path, value: &Value) -> Result<()> {
    let mut sorted: Vec<(String, Value)> = value
        .as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    sorted.retain(|(k, _)| k != "transformers_version");
    sorted.push((
        "transformers_version".into(),
        Value::from(crate::configuration_utils::TRANSFORMERS_VERSION),
    ));
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let text = serde_json::to_string_pretty(&Value::Object(sorted.into_iter().collect()))
        .unwrap_or_default()
        + "\n";
    let path = dir.join(GENERATION_CONFIG_NAME);
    std::fs::write(&path, text).map_err(|source| Error::Io { path, source })
}

impl GenerationConfig {
    /// A config from upstream's keyword arguments / `generation_config.json` object.
    pub fn from_json(value: &Value) -> Result<Self> {
        let obj = value
            .as_object()
            .ok_or_else(|| bad("generation_config", "expected a JSON object"))?;
        let mut c = Self::default();
        for (key, v) in obj {
            if v.is_null() {
                continue;
            }
            let int = || {
                v.as_i64()
                    .ok_or_else(|| bad(key, format!("expected an integer, got {v}")))
            };
            let float = || {
                v.as_f64()
                    .ok_or_else(|| bad(key, format!("expected a number, got {v}")))
            };
            // One id or a list of ids.
            let ids = || -> Result<Vec<i64>> {
                match v {
                    Value::Array(ids) => ids
                        .iter()
                        .map(|x| {
                            x.as_i64()
                                .ok_or_else(|| bad(key, format!("expected token ids, got {v}")))
                        })
                        .collect(),
                    _ => Ok(vec![int()?]),
                }
            };
            let boolean = || {
                v.as_bool()
                    .ok_or_else(|| bad(key, format!("expected true or false, got {v}")))
            };
            match key.as_str() {
                "max_length" => c.max_length = Some(int()?),
                "max_new_tokens" => c.max_new_tokens = Some(int()?),
                "min_length" => c.min_length = Some(int()?),
                "min_new_tokens" => c.min_new_tokens = Some(int()?),
                "do_sample" => c.do_sample = Some(boolean()?),
                "num_beams" => c.num_beams = Some(int()?),
                "use_cache" => c.use_cache = Some(boolean()?),
                "temperature" => c.temperature = Some(float()?),
                "top_k" => c.top_k = Some(int()?),
                "top_p" => c.top_p = Some(float()?),
                "min_p" => c.min_p = Some(float()?),
                "repetition_penalty" => c.repetition_penalty = Some(float()?),
                "no_repeat_ngram_size" => c.no_repeat_ngram_size = Some(int()?),
                "num_return_sequences" => c.num_return_sequences = Some(int()?),
                "output_scores" => c.output_scores = Some(boolean()?),
                "return_dict_in_generate" => c.return_dict_in_generate = Some(boolean()?),
                "pad_token_id" => c.pad_token_id = Some(int()?),
                "bos_token_id" => c.bos_token_id = Some(int()?),
                "decoder_start_token_id" => c.decoder_start_token_id = Some(int()?),
                "forced_bos_token_id" => c.forced_bos_token_id = Some(int()?),
                "forced_eos_token_id" => c.forced_eos_token_id = Some(ids()?),
                "suppress_tokens" => c.suppress_tokens = Some(ids()?),
                "begin_suppress_tokens" => c.begin_suppress_tokens = Some(ids()?),
                "eos_token_id" => c.eos_token_id = Some(ids()?),
                "length_penalty" => c.length_penalty = Some(float()?),
                "early_stopping" => {
                    c.early_stopping = Some(match v {
                        Value::Bool(true) => EarlyStopping::True,
                        Value::Bool(false) => EarlyStopping::False,
                        Value::String(s) if s == "never" => EarlyStopping::Never,
                        _ => {
                            return Err(bad(
                                key,
                                format!(
                                    "`early_stopping` must be a boolean or 'never', but is {v}."
                                ),
                            ));
                        }
                    })
                }
                k if INERT.contains(&k) || WHISPER_FIELDS.contains(&k) => {
                    c.other.insert(key.clone(), v.clone());
                }
                k if GENERATION_FIELDS.contains(&k) => match neutral(k) {
                    Some(n) if n == *v || (n.as_f64().is_some() && n.as_f64() == v.as_f64()) => {
                        c.other.insert(key.clone(), v.clone());
                    }
                    _ => {
                        return Err(bad(
                            key,
                            format!(
                                "{v}: this generation option is not implemented here (greedy decoding, sampling and beam search with temperature, top_k, top_p, min_p, repetition_penalty, no_repeat_ngram_size, min / max lengths, length_penalty and early_stopping are); leave it unset"
                            ),
                        ));
                    }
                },
                _ => {
                    return Err(bad(
                        key,
                        "not a generation option (upstream would pass it to the model's forward, which takes no such argument)",
                    ));
                }
            }
        }
        c.validate()?;
        Ok(c)
    }

    /// Reads `generation_config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let value: Value = crate::configuration_utils::read_config(path)?;
        Self::from_json(&value).map_err(|e| match e {
            Error::InvalidArgument { detail, .. } => Error::InvalidArgument {
                field: "generation_config",
                detail: format!("{}: {detail}", path.display()),
            },
            other => other,
        })
    }

    /// Upstream's `GenerationConfig.from_model_config`: the generation fields of a model's
    /// `config.json` (its special token ids, and the generation options older configs carry
    /// at their top level), as `from_pretrained` derives them when a model folder has no
    /// `generation_config.json`.
    pub fn from_model_config(config: &Value) -> Result<Self> {
        let fields: serde_json::Map<String, Value> = config
            .as_object()
            .map(|m| {
                m.iter()
                    .filter(|(k, v)| GENERATION_FIELDS.contains(&k.as_str()) && !v.is_null())
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let mut c = Self::from_json(&Value::Object(fields))?;
        c.other
            .insert("_from_model_config".into(), Value::Bool(true));
        Ok(c)
    }

    /// The generation config of a model folder: `generation_config.json`, else derived from
    /// `config.json` (upstream's `from_pretrained` fallback).
    pub fn from_pretrained(dir: &Path) -> Result<Self> {
        let file = dir.join(GENERATION_CONFIG_NAME);
        if file.is_file() {
            return Self::from_file(&file);
        }
        let config: Value =
            crate::configuration_utils::read_config(&dir.join(crate::loading::CONFIG_NAME))?;
        Self::from_model_config(&config)
    }

    /// The fields that are set, as `save_pretrained` writes them (sorted keys, upstream's
    /// `to_diff_dict` plus `transformers_version`).
    pub fn to_json(&self) -> Value {
        let mut m: Map<String, Value> = self.other.clone();
        let mut put = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                m.insert(k.to_string(), v);
            }
        };
        put("max_length", self.max_length.map(Value::from));
        put("max_new_tokens", self.max_new_tokens.map(Value::from));
        put("min_length", self.min_length.map(Value::from));
        put("min_new_tokens", self.min_new_tokens.map(Value::from));
        put("do_sample", self.do_sample.map(Value::from));
        put("num_beams", self.num_beams.map(Value::from));
        put("length_penalty", self.length_penalty.map(Value::from));
        put(
            "early_stopping",
            self.early_stopping.map(|e| match e {
                EarlyStopping::True => Value::Bool(true),
                EarlyStopping::False => Value::Bool(false),
                EarlyStopping::Never => Value::from("never"),
            }),
        );
        put("use_cache", self.use_cache.map(Value::from));
        put("temperature", self.temperature.map(Value::from));
        put("top_k", self.top_k.map(Value::from));
        put("top_p", self.top_p.map(Value::from));
        put("min_p", self.min_p.map(Value::from));
        put(
            "repetition_penalty",
            self.repetition_penalty.map(Value::from),
        );
        put(
            "no_repeat_ngram_size",
            self.no_repeat_ngram_size.map(Value::from),
        );
        put(
            "num_return_sequences",
            self.num_return_sequences.map(Value::from),
        );
        put("output_scores", self.output_scores.map(Value::from));
        put(
            "return_dict_in_generate",
            self.return_dict_in_generate.map(Value::from),
        );
        put("pad_token_id", self.pad_token_id.map(Value::from));
        put("bos_token_id", self.bos_token_id.map(Value::from));
        put(
            "decoder_start_token_id",
            self.decoder_start_token_id.map(Value::from),
        );
        put(
            "forced_bos_token_id",
            self.forced_bos_token_id.map(Value::from),
        );
        let one_or_list = |ids: &Vec<i64>| match ids.as_slice() {
            [one] => Value::from(*one),
            many => Value::from(many.to_vec()),
        };
        put(
            "forced_eos_token_id",
            self.forced_eos_token_id.as_ref().map(one_or_list),
        );
        put(
            "suppress_tokens",
            self.suppress_tokens
                .as_ref()
                .map(|ids| Value::from(ids.clone())),
        );
        put(
            "begin_suppress_tokens",
            self.begin_suppress_tokens
                .as_ref()
                .map(|ids| Value::from(ids.clone())),
        );
        put(
            "eos_token_id",
            self.eos_token_id.as_ref().map(|ids| match ids.as_slice() {
                [one] => Value::from(*one),
                many => Value::from(many.to_vec()),
            }),
        );
        m.insert(
            "transformers_version".into(),
            Value::from(crate::configuration_utils::TRANSFORMERS_VERSION),
        );
        let mut sorted: Vec<(String, Value)> = m.into_iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        Value::Object(sorted.into_iter().collect())
    }

    /// Writes `generation_config.json` into `dir` (indented by 2, as upstream's).
    pub fn save_pretrained(&self, dir: &Path) -> Result<()> {
        let path = dir.join(GENERATION_CONFIG_NAME);
        let text = serde_json::to_string_pretty(&self.to_json()).unwrap_or_default() + "\n";
        std::fs::write(&path, text).map_err(|source| Error::Io { path, source })
    }

    /// `update(**kwargs)`: every field `other` sets overrides this one's.
    pub fn update(&mut self, other: &GenerationConfig) {
        macro_rules! take {
            ($($f:ident),*) => {$(if other.$f.is_some() { self.$f = other.$f.clone(); })*};
        }
        take!(
            max_length,
            max_new_tokens,
            min_length,
            min_new_tokens,
            do_sample,
            num_beams,
            length_penalty,
            early_stopping,
            use_cache,
            temperature,
            top_k,
            top_p,
            min_p,
            repetition_penalty,
            no_repeat_ngram_size,
            num_return_sequences,
            output_scores,
            return_dict_in_generate,
            pad_token_id,
            bos_token_id,
            eos_token_id,
            decoder_start_token_id,
            forced_bos_token_id,
            forced_eos_token_id,
            suppress_tokens,
            begin_suppress_tokens
        );
        for (k, v) in &other.other {
            self.other.insert(k.clone(), v.clone());
        }
    }

    /// Upstream's `validate()`: the combinations it raises on (the ones it only warns
    /// about are logged), and what this crate does not implement.
    pub fn validate(&self) -> Result<()> {
        if let Some(n) = self.max_new_tokens.filter(|n| *n <= 0) {
            return Err(bad(
                "max_new_tokens",
                format!("`max_new_tokens` must be greater than 0, but is {n}."),
            ));
        }
        let beams = self.num_beams.unwrap_or(1);
        if beams < 1 {
            return Err(bad("num_beams", format!("{beams}: at least 1")));
        }
        let sampling = self.do_sample == Some(true);
        if let Some(n) = self.num_return_sequences.filter(|n| *n != 1) {
            if n < 1 {
                return Err(bad("num_return_sequences", format!("{n}: at least 1")));
            }
            if beams > 1 && n > beams {
                return Err(bad(
                    "num_return_sequences",
                    format!(
                        "`num_return_sequences` (={n}) has to be smaller or equal to `num_beams` (={beams})."
                    ),
                ));
            }
            if beams == 1 && !sampling {
                return Err(bad(
                    "num_return_sequences",
                    format!(
                        "Greedy methods without beam search do not support `num_return_sequences` different than 1 (got {n})."
                    ),
                ));
            }
        }
        if let Some(p) = self.repetition_penalty.filter(|p| *p <= 0.0) {
            return Err(bad(
                "repetition_penalty",
                format!("`penalty` has to be a strictly positive float, but is {p}"),
            ));
        }
        if sampling && self.temperature.is_some_and(|t| t <= 0.0) {
            return Err(bad(
                "temperature",
                format!(
                    "`temperature` (={}) has to be a strictly positive float, otherwise your next token scores will be invalid. If you're looking for greedy decoding strategies, set `do_sample=False`.",
                    self.temperature.unwrap_or_default()
                ),
            ));
        }
        if let Some(p) = self.top_p.filter(|p| sampling && *p < 0.0) {
            return Err(bad(
                "top_p",
                format!("`top_p` has to be a float > 0 and < 1, but is {p}"),
            ));
        }
        if let Some(k) = self.top_k.filter(|k| *k < 0) {
            return Err(bad(
                "top_k",
                format!("`top_k` has to be a strictly positive integer, but is {k}"),
            ));
        }
        if let Some(p) = self.min_p.filter(|p| !(0.0..=1.0).contains(p)) {
            return Err(bad(
                "min_p",
                format!("`min_p` has to be a float in the [0, 1] interval, but is {p}"),
            ));
        }
        if let Some(n) = self.no_repeat_ngram_size.filter(|n| *n < 0) {
            return Err(bad(
                "no_repeat_ngram_size",
                format!("`ngram_size` has to be a strictly positive integer, but is {n}"),
            ));
        }
        if beams == 1 {
            let set: Vec<&str> = [
                (
                    "early_stopping",
                    self.early_stopping
                        .is_some_and(|e| e != EarlyStopping::False),
                ),
                (
                    "length_penalty",
                    self.length_penalty.is_some_and(|p| p != 1.0),
                ),
            ]
            .iter()
            .filter(|(_, on)| *on)
            .map(|(n, _)| *n)
            .collect();
            if !set.is_empty() {
                log::warn!(
                    "The following generation flags are not valid and may be ignored: {set:?}. Set `TRANSFORMERS_VERBOSITY=info` for more details."
                );
            }
        }
        if !sampling {
            let set: Vec<&str> = [
                ("temperature", self.temperature.is_some_and(|t| t != 1.0)),
                ("top_p", self.top_p.is_some_and(|p| p != 1.0)),
                ("top_k", self.top_k.is_some_and(|k| k != 50)),
                ("min_p", self.min_p.is_some()),
            ]
            .iter()
            .filter(|(_, on)| *on)
            .map(|(n, _)| *n)
            .collect();
            if !set.is_empty() {
                log::warn!(
                    "The following generation flags are not valid and may be ignored: {set:?}. Set `TRANSFORMERS_VERBOSITY=info` for more details."
                );
            }
        }
        Ok(())
    }
}

//! The value shapes of `TrainingArguments` fields that upstream types as unions
//! (`dict | str`, `str | bool`, `str | list[str]`), and `AcceleratorConfig`.

use serde::{Deserialize, Serialize};

/// A JSON object, as upstream's `dict` fields hold (keys sorted when written).
pub type JsonDict = serde_json::Map<String, serde_json::Value>;

/// A `dict | str` field that is either an inline dict or a path to a JSON file
/// (`fsdp_config`, `deepspeed`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DictOrPath {
    /// The dict itself.
    Dict(JsonDict),
    /// A path to a JSON file holding the dict.
    Path(String),
}

/// A `str | bool` field (`fsdp`: `true` or legacy options; `trackio_static_space_id`: an id or `false`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StrOrBool {
    /// A boolean.
    Bool(bool),
    /// A string.
    Str(String),
}

/// A `str | list[str]` field (`optim_target_modules`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StrOrList {
    /// One name (or regex).
    One(String),
    /// Several names.
    List(Vec<String>),
}

/// The configuration of upstream's Accelerate integration (`trainer_pt_utils.AcceleratorConfig`),
/// as `to_dict()` writes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AcceleratorConfig {
    /// Split each batch across processes instead of giving each process its own batch.
    pub split_batches: bool,
    /// Iterate the dataloader on the main process only and broadcast the batches.
    pub dispatch_batches: Option<bool>,
    /// Duplicate samples so every process sees the same number of batches.
    pub even_batches: bool,
    /// Use a fully seedable random sampler.
    pub use_seedable_sampler: bool,
    /// Use non-blocking host-to-device transfers.
    pub non_blocking: bool,
    /// Extra `GradientAccumulationPlugin` arguments.
    pub gradient_accumulation_kwargs: Option<JsonDict>,
    /// Reuse an already configured accelerator state (upstream pops it before `to_dict()`).
    #[serde(skip_serializing)]
    pub use_configured_state: bool,
}

impl Default for AcceleratorConfig {
    fn default() -> Self {
        Self {
            split_batches: false,
            dispatch_batches: None,
            even_batches: true,
            use_seedable_sampler: true,
            non_blocking: false,
            gradient_accumulation_kwargs: None,
            use_configured_state: false,
        }
    }
}

/// Upstream's `_convert_str_dict`: string values `"true"`/`"false"` become booleans, digit strings
/// integers and one-dot digit strings floats, recursively (applied to dicts parsed from a string).
pub(crate) fn convert_str_dict(dict: &mut JsonDict) {
    for value in dict.values_mut() {
        match value {
            serde_json::Value::Object(inner) => convert_str_dict(inner),
            serde_json::Value::String(s) => {
                let lower = s.to_lowercase();
                let is_digits = |t: &str| !t.is_empty() && t.chars().all(|c| c.is_ascii_digit());
                if lower == "true" || lower == "false" {
                    *value = serde_json::Value::Bool(lower == "true");
                } else if is_digits(s) {
                    if let Ok(i) = s.parse::<u64>() {
                        *value = i.into();
                    }
                } else if is_digits(&s.replacen('.', "", 1))
                    && let Some(n) = s.parse::<f64>().ok().and_then(serde_json::Number::from_f64)
                {
                    *value = serde_json::Value::Number(n);
                }
            }
            _ => {}
        }
    }
}

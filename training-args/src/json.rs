//! JSON for `TrainingArguments`: `to_dict` / `to_json_string` in the form upstream writes
//! (`training_args.json`, field order, Python float text, `hub_token` masked), `to_sanitized_dict`
//! for TensorBoard hparams, and reading JSON back through the same checks as upstream's
//! `HfArgumentParser.parse_json_file`.
//!
//! Numbers: upstream's float-typed step fields (`logging_steps`, `save_steps`, `eval_steps`,
//! `warmup_steps`, `eval_delay`) hold Python ints when given as ints (their defaults are `500`
//! and `0`, and `_validate_args` turns whole step counts above 1 into ints); here they are
//! written as integers whenever they are whole numbers, and as floats otherwise. Other floats are
//! always written as floats (`3.0`). Dict-valued fields are written with sorted keys.

use std::path::Path;

use serde::{Deserialize, Deserializer, Serializer};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::normalize::from_map;
use crate::parsed::ParsedArguments;
use crate::training_args::TrainingArguments;
use crate::values::JsonDict;
use tchtrain_python_json::{python_repr, to_python_json};

const TOKEN_MASK: &str = "<HUB_TOKEN>";

/// Writes a float-typed step count as an integer when it is a whole number (see module docs).
pub(crate) fn ser_steps<S: Serializer>(value: &f64, s: S) -> std::result::Result<S::Ok, S::Error> {
    if value.is_finite() && value.fract() == 0.0 && value.abs() < 9.0e15 {
        s.serialize_i64(*value as i64)
    } else {
        s.serialize_f64(*value)
    }
}

/// [`ser_steps`] for an optional step count.
pub(crate) fn ser_opt_steps<S: Serializer>(
    value: &Option<f64>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    match value {
        Some(v) => ser_steps(v, s),
        None => s.serialize_none(),
    }
}

/// Upstream's `to_dict` masks every `*_token` field as `"<HUB_TOKEN>"`, set or not; so does all
/// serialisation here.
pub(crate) fn ser_token<S: Serializer>(
    _: &Option<String>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(TOKEN_MASK)
}

/// Reads a token back; the mask `"<HUB_TOKEN>"` means "not known" and reads as `None`.
pub(crate) fn de_token<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<String>, D::Error> {
    let v = Option::<String>::deserialize(d)?;
    Ok(v.filter(|t| t != TOKEN_MASK))
}

impl TrainingArguments {
    /// Upstream's `to_dict()`: every field, enums as their string values, `hub_token` masked.
    ///
    /// The map's keys are sorted (serde_json's map); [`TrainingArguments::to_json_string`] keeps
    /// upstream's field order.
    pub fn to_dict(&self) -> JsonDict {
        match serde_json::to_value(self) {
            Ok(Value::Object(map)) => map,
            // Serialising plain fields to a `Value` cannot fail or give a non-object.
            _ => JsonDict::new(),
        }
    }

    /// Upstream's `to_json_string()`: `json.dumps(self.to_dict(), indent=2)`, byte for byte for
    /// the top-level fields (Python float text, field order, `ensure_ascii`).
    pub fn to_json_string(&self) -> String {
        // Every field serialises infallibly (non-finite floats become `null`).
        to_python_json(self).unwrap_or_default()
    }

    /// Writes [`TrainingArguments::to_json_string`] to `path` (upstream's `training_args.json` form).
    pub fn to_json_file(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.to_json_string()).map_err(|source| Error::Io {
            field: "-".to_string(),
            path: path.to_path_buf(),
            source,
        })
    }

    /// Upstream's `to_sanitized_dict()` (TensorBoard hparams): `to_dict()` plus
    /// `train_batch_size` and `eval_batch_size`, with every value that is not a bool, number or
    /// string replaced by its Python `str()` (`None`, `[]`, `{'split_batches': False, ...}`).
    pub fn to_sanitized_dict(&self) -> JsonDict {
        let mut d = self.to_dict();
        d.insert("train_batch_size".into(), self.train_batch_size().into());
        d.insert("eval_batch_size".into(), self.eval_batch_size().into());
        // Upstream prints the AcceleratorConfig dict in its declaration order.
        let a = &self.accelerator_config;
        let py = |v: Value| python_repr(&v);
        let accel = format!(
            "{{'split_batches': {}, 'dispatch_batches': {}, 'even_batches': {}, 'use_seedable_sampler': {}, \
             'non_blocking': {}, 'gradient_accumulation_kwargs': {}}}",
            py(a.split_batches.into()),
            py(a.dispatch_batches.into()),
            py(a.even_batches.into()),
            py(a.use_seedable_sampler.into()),
            py(a.non_blocking.into()),
            py(a.gradient_accumulation_kwargs
                .clone()
                .map_or(Value::Null, Value::Object)),
        );
        d.insert("accelerator_config".into(), Value::String(accel));
        for v in d.values_mut() {
            if matches!(v, Value::Null | Value::Array(_) | Value::Object(_)) {
                *v = Value::String(python_repr(v));
            }
        }
        d
    }

    /// Builds validated arguments from a key/value map, as upstream's `TrainingArguments(**d)` or
    /// `HfArgumentParser.parse_dict(d)`: v4 aliases are mapped (with warnings), unknown keys are
    /// rejected with close matches, union-typed values (`report_to: "tensorboard"`, `debug: "a b"`,
    /// dicts as JSON strings) are normalised, then [`TrainingArguments::post_init`] runs.
    pub fn from_dict(map: JsonDict) -> Result<ParsedArguments> {
        from_map(map)
    }

    /// Parses a JSON object (upstream's `training_args.json`, or a hand-written config).
    pub fn from_json_str(json: &str) -> Result<ParsedArguments> {
        match serde_json::from_str::<Value>(json)? {
            Value::Object(map) => from_map(map),
            other => Err(Error::InvalidValue {
                field: "-".to_string(),
                value: crate::suggest::truncate(&other.to_string(), 60),
                reason: "a TrainingArguments JSON document must be an object".to_string(),
            }),
        }
    }

    /// Reads a JSON file: upstream's `HfArgumentParser.parse_json_file`.
    pub fn from_json_file(path: impl AsRef<Path>) -> Result<ParsedArguments> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            field: "-".to_string(),
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json_str(&text)
    }
}

//! Reading a raw key/value map into `TrainingArguments`: the v4 aliases (`evaluation_strategy`,
//! `warmup_ratio`, `group_by_length`, `gradient_checkpointing`, `logging_dir`) with deprecation
//! warnings, unknown-key errors with close matches, upstream's union-typed inputs normalised to
//! the Rust field types, and type errors attributed to the field that caused them.

use serde_json::Value;

use crate::error::{Error, Result};
use crate::parsed::{ParsedArguments, Warning};
use crate::post_init::{parse_dict_string, read_json_dict};
use crate::training_args::TrainingArguments;
use crate::values::{AcceleratorConfig, JsonDict};

/// The deprecated v4 names still accepted on input, with what they became.
pub const V4_ALIASES: &[(&str, &str)] = &[
    ("evaluation_strategy", "eval_strategy"),
    (
        "warmup_ratio",
        "warmup_steps (a float in [0, 1) is a ratio)",
    ),
    (
        "group_by_length",
        "train_sampling_strategy = \"group_by_length\"",
    ),
    ("gradient_checkpointing", "activation_checkpointing"),
    (
        "logging_dir",
        "the TENSORBOARD_LOGGING_DIR environment variable",
    ),
];

/// The field names of `TrainingArguments`, in declaration order.
pub fn field_names() -> impl Iterator<Item = &'static str> {
    crate::field_table::FIELDS.iter().map(|f| f.name)
}

/// Fields upstream types as `dict | str | None` whose string form must be a JSON object here.
const DICT_ONLY_FIELDS: [&str; 4] = [
    "lr_scheduler_kwargs",
    "activation_checkpointing_kwargs",
    "gradient_checkpointing_kwargs",
    "liger_kernel_config",
];

fn text(v: &Value) -> String {
    v.to_string()
}

/// Builds validated arguments from a key/value map: upstream's `TrainingArguments(**d)` /
/// `HfArgumentParser.parse_dict(d)`. See [`TrainingArguments::from_dict`].
pub(crate) fn from_map(mut map: JsonDict) -> Result<ParsedArguments> {
    let mut warnings = Vec::new();
    let logging_dir = resolve_aliases(&mut map, &mut warnings)?;

    let known: Vec<&str> = field_names().collect();
    if let Some(unknown) = map.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(Error::UnknownField {
            field: unknown.clone(),
            suggestions: crate::suggest::close_matches(unknown, known.iter().copied()),
        });
    }
    normalize_shapes(&mut map)?;

    let mut args = deserialize_attributed(map)?;
    warnings.extend(args.post_init()?);
    Ok(ParsedArguments {
        args,
        warnings,
        logging_dir,
    })
}

/// Maps the v4 names onto their v5 fields; returns the `logging_dir` value, if any.
fn resolve_aliases(map: &mut JsonDict, warnings: &mut Vec<Warning>) -> Result<Option<String>> {
    if let Some(v) = map.remove("evaluation_strategy") {
        warnings.push(Warning::new(
            "evaluation_strategy",
            "`evaluation_strategy` is deprecated (removed in transformers v4.46+/v5); use `eval_strategy` instead.",
        ));
        match map.get("eval_strategy") {
            Some(existing) if existing != &v => {
                return Err(Error::AliasConflict {
                    alias: "evaluation_strategy",
                    field: "eval_strategy",
                    alias_value: text(&v),
                    field_value: text(existing),
                });
            }
            _ => {
                map.insert("eval_strategy".into(), v);
            }
        }
    }

    if let Some(v) = map.remove("warmup_ratio") {
        let ratio = v.as_f64().ok_or_else(|| Error::InvalidValue {
            field: "warmup_ratio".into(),
            value: text(&v),
            reason: "expected a number in [0, 1)".into(),
        })?;
        if !(0.0..1.0).contains(&ratio) {
            return Err(Error::OutOfRange {
                field: "warmup_ratio",
                value: text(&v),
                problem: "`warmup_ratio` (deprecated) maps to `warmup_steps`, where only values in [0, 1) are ratios"
                    .into(),
                fix: "use `warmup_steps` with a ratio in [0, 1) or a whole number of steps".into(),
            });
        }
        warnings.push(Warning::new(
            "warmup_ratio",
            "`warmup_ratio` is deprecated; use `warmup_steps`, where a float in [0, 1) is a ratio of the total steps.",
        ));
        let steps = map
            .get("warmup_steps")
            .and_then(Value::as_f64)
            .unwrap_or(0.0);
        if steps > 0.0 {
            if ratio > 0.0 {
                warnings.push(Warning::new(
                    "warmup_ratio",
                    "both `warmup_steps` and `warmup_ratio` are set; `warmup_steps` takes precedence (as in v4).",
                ));
            }
        } else if ratio > 0.0 {
            map.insert("warmup_steps".into(), v);
        }
    }

    if let Some(v) = map.remove("group_by_length") {
        let on = as_bool(&v).ok_or_else(|| Error::InvalidValue {
            field: "group_by_length".into(),
            value: text(&v),
            reason: "expected true or false".into(),
        })?;
        warnings.push(Warning::new(
            "group_by_length",
            "`group_by_length` is deprecated; use `train_sampling_strategy = \"group_by_length\"` instead.",
        ));
        if on {
            match map.get("train_sampling_strategy").and_then(Value::as_str) {
                Some(s) if s != "group_by_length" => {
                    return Err(Error::AliasConflict {
                        alias: "group_by_length",
                        field: "train_sampling_strategy",
                        alias_value: "true".into(),
                        field_value: format!("{s:?}"),
                    });
                }
                _ => {
                    map.insert("train_sampling_strategy".into(), "group_by_length".into());
                }
            }
        }
    }

    // `gradient_checkpointing*` are still 5.23 fields: an old name given without the new one is
    // taken over here, where "not given" is visible (the typed struct cannot tell unset from false).
    for (old, new) in [
        ("gradient_checkpointing", "activation_checkpointing"),
        (
            "gradient_checkpointing_kwargs",
            "activation_checkpointing_kwargs",
        ),
    ] {
        let new_unset = map.get(new).is_none_or(Value::is_null);
        if let Some(v) = map.get(old).filter(|v| !v.is_null()).cloned()
            && new_unset
        {
            let shape_ok = if old == "gradient_checkpointing" {
                v.is_boolean()
            } else {
                v.is_object() || v.as_str().is_some_and(|s| s.starts_with('{'))
            };
            if !shape_ok {
                return Err(Error::InvalidValue {
                    field: old.into(),
                    value: text(&v),
                    reason: if old == "gradient_checkpointing" {
                        "expected a boolean"
                    } else {
                        "expected a dict"
                    }
                    .into(),
                });
            }
            warnings.push(Warning::new(
                old,
                format!("`{old}` is deprecated and will be removed in v6. Use `{new}` instead."),
            ));
            map.insert(new.into(), v);
        }
        // Once resolved, the old name mirrors the new one (as upstream), so the typed
        // `post_init` sees no lone old name.
        if let Some(v) = map.get(new).cloned() {
            map.insert(old.into(), v);
        }
    }

    let mut logging_dir = None;
    if let Some(v) = map.remove("logging_dir") {
        warnings.push(Warning::new(
            "logging_dir",
            "`logging_dir` was removed in transformers v5; TensorBoard logs go to TENSORBOARD_LOGGING_DIR or \
             `output_dir/runs/...`. Set TENSORBOARD_LOGGING_DIR instead.",
        ));
        match v {
            Value::Null => {}
            Value::String(s) => logging_dir = Some(s),
            other => {
                return Err(Error::InvalidValue {
                    field: "logging_dir".into(),
                    value: text(&other),
                    reason: "expected a path string".into(),
                });
            }
        }
    }
    Ok(logging_dir)
}

fn as_bool(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::Null => Some(false),
        Value::String(s) => crate::cli::string_to_bool(s),
        Value::Number(n) => n.as_i64().map(|i| i != 0),
        _ => None,
    }
}

/// Turns upstream's union-typed inputs into the shapes of the Rust fields.
fn normalize_shapes(map: &mut JsonDict) -> Result<()> {
    // Fields whose `None` upstream resolves in `__post_init__` to a plain value.
    for key in [
        "disable_tqdm",
        "activation_checkpointing",
        "gradient_checkpointing",
        "accelerator_config",
    ] {
        if map.get(key).is_some_and(Value::is_null) {
            map.remove(key);
        }
    }
    if map.get("hub_token").and_then(Value::as_str) == Some("<HUB_TOKEN>") {
        map.insert("hub_token".into(), Value::Null);
    }
    match map.get("report_to").cloned() {
        Some(Value::Null) => {
            map.insert("report_to".into(), Value::Array(vec![]));
        }
        Some(Value::String(s)) => {
            let list = if s == "none" {
                vec![]
            } else {
                vec![Value::String(s)]
            };
            map.insert("report_to".into(), Value::Array(list));
        }
        _ => {}
    }
    match map.get("debug").cloned() {
        Some(Value::Null) => {
            map.insert("debug".into(), Value::Array(vec![]));
        }
        Some(Value::String(s)) => {
            let list = s
                .split_whitespace()
                .map(|w| Value::String(w.to_string()))
                .collect();
            map.insert("debug".into(), Value::Array(list));
        }
        _ => {}
    }
    if let Some(Value::Bool(b)) = map.get("include_num_input_tokens_seen") {
        let s = if *b { "all" } else { "no" };
        map.insert("include_num_input_tokens_seen".into(), s.into());
    }
    if let Some(Value::Array(items)) = map.get("fsdp") {
        let words: Option<Vec<&str>> = items.iter().map(Value::as_str).collect();
        if let Some(words) = words {
            let joined = words.join(" ");
            map.insert("fsdp".into(), joined.into());
        }
    }
    for key in DICT_ONLY_FIELDS {
        if let Some(Value::String(s)) = map.get(key) {
            let s = s.clone();
            if !s.starts_with('{') {
                return Err(Error::InvalidValue {
                    field: key.into(),
                    value: format!("{s:?}"),
                    reason: "expected a dict (a JSON object such as '{\"key\": 1}')".into(),
                });
            }
            map.insert(key.into(), Value::Object(parse_dict_string(key, &s)?));
        }
    }
    if let Some(Value::String(s)) = map.get("accelerator_config") {
        let s = s.clone();
        let dict = if s.starts_with('{') {
            parse_dict_string("accelerator_config", &s)?
        } else {
            read_json_dict("accelerator_config", &s)?
        };
        map.insert("accelerator_config".into(), Value::Object(dict));
    }
    if let Some(Value::Object(dict)) = map.get("accelerator_config") {
        let fields = [
            "split_batches",
            "dispatch_batches",
            "even_batches",
            "use_seedable_sampler",
            "non_blocking",
            "gradient_accumulation_kwargs",
            "use_configured_state",
        ];
        if let Some(unknown) = dict.keys().find(|k| !fields.contains(&k.as_str())) {
            return Err(Error::UnknownField {
                field: format!("accelerator_config.{unknown}"),
                suggestions: crate::suggest::close_matches(unknown, fields),
            });
        }
        let _: AcceleratorConfig =
            serde_json::from_value(Value::Object(dict.clone())).map_err(|e| {
                Error::InvalidValue {
                    field: "accelerator_config".into(),
                    value: Value::Object(dict.clone()).to_string(),
                    reason: e.to_string(),
                }
            })?;
    }
    Ok(())
}

/// Deserialises the normalised map; on a type error, finds the field that caused it.
fn deserialize_attributed(map: JsonDict) -> Result<TrainingArguments> {
    match serde_json::from_value::<TrainingArguments>(Value::Object(map.clone())) {
        Ok(args) => Ok(args),
        Err(whole) => {
            for (key, value) in &map {
                let mut one = JsonDict::new();
                one.insert(key.clone(), value.clone());
                if let Err(e) = serde_json::from_value::<TrainingArguments>(Value::Object(one)) {
                    return Err(Error::InvalidValue {
                        field: key.clone(),
                        value: text(value),
                        reason: e.to_string(),
                    });
                }
            }
            Err(Error::Json(whole))
        }
    }
}

//! The command line of an example script, read as upstream's scripts read it:
//! `HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))`, or, when
//! the only argument ends in `.json`, `parser.parse_json_file(sys.argv[1])`.
//!
//! A script describes its dataclasses as tables of [`FieldSpec`]s (upstream's fields, names,
//! types and defaults); the one parser of `tchtrain-training-args` reads them next to every
//! `TrainingArguments` flag, so the script's flags get the same `--no_<flag>`, prefix
//! abbreviations, did-you-mean, messages and `--help` as the training arguments. The values
//! then fill the script's structs through serde, each field not given taking the table's
//! default: the table is the one place a default is written.
//!
//! Upstream flags a script cannot honour are in its list of [`Refusal`]s: given with a value
//! other than upstream's default they are refused with the reason; given with the default
//! they are what the script does anyway.

use std::collections::BTreeSet;

use serde::de::DeserializeOwned;
use serde_json::Value;
use tchtrain_training_args::{
    Dataclass, DataclassValues, FieldSpec, HfArgumentParser, JsonDict, Nargs, ParsedArguments,
    ParsedSeq2SeqArguments, Seq2SeqTrainingArguments, TrainingArguments, ValueKind, Warning,
};

use crate::error::{Error, Result};

/// An upstream flag the script refuses unless it has upstream's default value.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Refusal {
    /// The field.
    pub(crate) flag: &'static str,
    /// Why, and what to use instead.
    pub(crate) reason: &'static str,
}

/// A script's command line: its dataclasses (in upstream's order, before the training
/// arguments), the flags it refuses, and the first line of its `--help`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ScriptCommandLine {
    /// `run_clm: causal language modelling (...)`.
    pub(crate) title: &'static str,
    /// The dataclasses.
    pub(crate) dataclasses: &'static [&'static Dataclass],
    /// Upstream flags refused unless at their default.
    pub(crate) refused: &'static [Refusal],
}

/// The dataclasses' values, with the defaults of the fields not given filled in.
#[derive(Debug)]
pub(crate) struct ScriptValues {
    values: DataclassValues,
    given: Vec<BTreeSet<String>>,
}

impl ScriptValues {
    /// The dataclasses `which` (indices into the script's list) merged into `T`.
    pub(crate) fn take<T: DeserializeOwned>(&self, which: &[usize]) -> Result<T> {
        let merged = |skip: Option<&str>| {
            let mut map = JsonDict::new();
            for &i in which {
                for (k, v) in &self.values[i] {
                    if skip.is_none_or(|s| s == k) || !self.given[i].contains(k) {
                        map.insert(k.clone(), v.clone());
                    }
                }
            }
            map
        };
        serde_json::from_value(Value::Object(merged(None))).map_err(|e| {
            // Name the flag: the first given value that fails on its own.
            let flag = which
                .iter()
                .flat_map(|&i| self.given[i].iter())
                .find(|k| serde_json::from_value::<T>(Value::Object(merged(Some(k)))).is_err())
                .cloned()
                .unwrap_or_else(|| "(script arguments)".into());
            Error::InvalidFlag {
                flag,
                detail: e.to_string(),
            }
        })
    }
}

/// The parser for `line`'s dataclasses on top of `base` (`TrainingArguments`' or
/// `Seq2SeqTrainingArguments`').
fn parser(base: HfArgumentParser, line: &ScriptCommandLine) -> Result<HfArgumentParser> {
    line.dataclasses
        .iter()
        .try_fold(base, |p, dc| p.with_dataclass(dc))
        .map_err(Error::from)
}

/// `len(sys.argv) == 2 and sys.argv[1].endswith(".json")`.
fn json_file(argv: &[String]) -> Option<&str> {
    match argv {
        [one] if one.ends_with(".json") => Some(one),
        _ => None,
    }
}

/// The help with the script's title in front.
fn with_title(e: tchtrain_training_args::Error, title: &str) -> Error {
    match e {
        tchtrain_training_args::Error::HelpRequested(help) => Error::TrainingArgs(
            tchtrain_training_args::Error::HelpRequested(format!("{title}\n\n{help}")),
        ),
        e => e.into(),
    }
}

/// Parses `argv` (without the program name) into the script's values and
/// `TrainingArguments`; starts the logging as upstream's scripts do.
pub(crate) fn parse<I, S>(
    argv: I,
    line: &ScriptCommandLine,
) -> Result<(ScriptValues, TrainingArguments)>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let argv: Vec<String> = argv.into_iter().map(|a| a.as_ref().to_string()).collect();
    let parser = parser(HfArgumentParser::new(), line)?;
    let (values, parsed): (DataclassValues, ParsedArguments) = match json_file(&argv) {
        Some(file) => parser.parse_json_file_with_dataclasses(file),
        None => parser.parse_args_with_dataclasses(&argv),
    }
    .map_err(|e| with_title(e, line.title))?;
    start_logging(&parsed.args, parsed.warnings());
    Ok((finish(values, line)?, parsed.into_args()))
}

/// [`parse`] for the seq2seq scripts (`Seq2SeqTrainingArguments`).
pub(crate) fn parse_seq2seq<I, S>(
    argv: I,
    line: &ScriptCommandLine,
) -> Result<(ScriptValues, Seq2SeqTrainingArguments)>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let argv: Vec<String> = argv.into_iter().map(|a| a.as_ref().to_string()).collect();
    let parser = parser(HfArgumentParser::for_seq2seq(), line)?;
    let (values, parsed): (DataclassValues, ParsedSeq2SeqArguments) = match json_file(&argv) {
        Some(file) => parser.parse_seq2seq_json_file_with_dataclasses(file),
        None => parser.parse_seq2seq_args_with_dataclasses(&argv),
    }
    .map_err(|e| with_title(e, line.title))?;
    start_logging(&parsed.args.base, parsed.warnings());
    Ok((finish(values, line)?, parsed.into_args()))
}

/// Upstream's scripts: `logging.basicConfig(...)`, then the process's log level; the
/// parser's warnings logged.
fn start_logging(args: &TrainingArguments, warnings: &[Warning]) {
    tchtrain_trainer::init_logging(args);
    for w in warnings {
        log::warn!("{w}");
    }
}

/// Refuses the refused flags given with other values than the default, then fills in the
/// defaults.
fn finish(mut values: DataclassValues, line: &ScriptCommandLine) -> Result<ScriptValues> {
    let mut given = Vec::new();
    for (dc, dict) in line.dataclasses.iter().zip(values.iter_mut()) {
        for refusal in line.refused {
            let Some(spec) = dc.fields.iter().find(|f| f.name == refusal.flag) else {
                continue;
            };
            if let Some(value) = dict.remove(refusal.flag)
                && python_str(&value) != spec.default
            {
                return Err(Error::InvalidFlag {
                    flag: refusal.flag.into(),
                    detail: refusal.reason.into(),
                });
            }
        }
        if let Some(n) = dict.get("preprocessing_num_workers") {
            // A speed knob that changes no number: said once, as the design asks.
            log::info!(
                "--preprocessing_num_workers {n}: tokenization here uses every core (TCHTRAIN_NUM_PROC sets how many), with the same result"
            );
        }
        given.push(dict.keys().cloned().collect());
        for spec in dc.fields {
            let refused = line.refused.iter().any(|r| r.flag == spec.name);
            if !refused
                && !dict.contains_key(spec.name)
                && let Some(default) = default_value(spec)
            {
                dict.insert(spec.name.into(), default);
            }
        }
    }
    Ok(ScriptValues { values, given })
}

/// Python's `str(value)` for the values a flag can take (how argparse shows a default).
fn python_str(value: &Value) -> String {
    match value {
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Null => "None".into(),
        Value::String(s) => s.clone(),
        Value::Number(n) => match n.as_f64() {
            Some(x) if !n.is_i64() && !n.is_u64() => tchtrain_training_args::python_float_repr(x),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

/// A field's default as a JSON value, from the table (`None` for `None`: the field is
/// absent and an `Option` reads it as `None`).
fn default_value(spec: &FieldSpec) -> Option<Value> {
    if spec.default == "None" || spec.required {
        return None;
    }
    if spec.nargs == Nargs::OneOrMore {
        return (spec.default == "[]").then(|| Value::Array(Vec::new()));
    }
    Some(match spec.kind {
        ValueKind::Bool => Value::Bool(spec.default == "True"),
        ValueKind::Int => Value::from(spec.default.parse::<i64>().ok()?),
        ValueKind::Float => Value::from(spec.default.parse::<f64>().ok()?),
        _ => Value::String(spec.default.into()),
    })
}

/// The tables' defaults as `T` (what parsing an empty command line gives), for `Default`.
pub(crate) fn defaults<T: DeserializeOwned>(dataclasses: &[&Dataclass]) -> Result<T> {
    let mut map = JsonDict::new();
    for spec in dataclasses.iter().flat_map(|dc| dc.fields.iter()) {
        if let Some(v) = default_value(spec) {
            map.insert(spec.name.into(), v);
        }
    }
    serde_json::from_value(Value::Object(map)).map_err(|e| Error::InvalidFlag {
        flag: "(defaults)".into(),
        detail: e.to_string(),
    })
}

/// Serde for fields held as a type parsed from a string (`--dtype`, `--packing_strategy`):
/// `#[serde(deserialize_with = "args::from_str")]`.
pub(crate) fn from_str<'de, D, T>(deserializer: D) -> std::result::Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    let s: String = serde::Deserialize::deserialize(deserializer)?;
    s.parse().map_err(serde::de::Error::custom)
}

/// Serde for upstream's comma-separated string fields (`--text_column_names a,b`): the
/// parts, trimmed.
pub(crate) fn comma_separated<'de, D>(deserializer: D) -> std::result::Result<Vec<String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let s: String = serde::Deserialize::deserialize(deserializer)?;
    Ok(s.split(',').map(|p| p.trim().to_string()).collect())
}

/// [`comma_separated`] for an optional field.
pub(crate) fn comma_separated_opt<'de, D>(
    deserializer: D,
) -> std::result::Result<Option<Vec<String>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    comma_separated(deserializer).map(Some)
}

/// The fields every script's `ModelArguments` shares with the others, as upstream declares
/// them.
pub(crate) mod fields {
    use tchtrain_training_args::FieldSpec;

    pub(crate) const MODEL_NAME_OR_PATH: FieldSpec = FieldSpec::str(
        "model_name_or_path",
        "None",
        "The model checkpoint for weights initialization: a folder or a hub id.",
    );
    pub(crate) const MODEL_TYPE: FieldSpec = FieldSpec::str(
        "model_type",
        "None",
        "If training from scratch, the model type (refused here: training from scratch is not supported).",
    );
    pub(crate) const CONFIG_OVERRIDES: FieldSpec = FieldSpec::str(
        "config_overrides",
        "None",
        "Overrides of a from-scratch config (refused here: training from scratch is not supported).",
    );
    pub(crate) const CONFIG_NAME: FieldSpec = FieldSpec::str(
        "config_name",
        "None",
        "Pretrained config name or path if not the same as model_name (only the model's own folder is accepted).",
    );
    pub(crate) const TOKENIZER_NAME: FieldSpec = FieldSpec::str(
        "tokenizer_name",
        "None",
        "Pretrained tokenizer name or path if not the same as model_name.",
    );
    pub(crate) const CACHE_DIR: FieldSpec = FieldSpec::str(
        "cache_dir",
        "None",
        "Where to store the pretrained models downloaded from the hub (default: the HF hub cache).",
    );
    pub(crate) const USE_FAST_TOKENIZER: FieldSpec = FieldSpec::bool(
        "use_fast_tokenizer",
        true,
        "Use a fast tokenizer (backed by the tokenizers library); the only kind here.",
    );
    pub(crate) const MODEL_REVISION: FieldSpec = FieldSpec::str(
        "model_revision",
        "main",
        "The model version to use (a branch name, tag name or commit id).",
    );
    pub(crate) const TOKEN: FieldSpec = FieldSpec::str(
        "token",
        "None",
        "The token for remote files (default: HF_TOKEN, else the `huggingface-cli login` file).",
    );
    pub(crate) const TRUST_REMOTE_CODE: FieldSpec = FieldSpec::bool(
        "trust_remote_code",
        false,
        "Run the hub repository's own modeling code (refused here: no Python code is run).",
    );
    pub(crate) const DTYPE: FieldSpec = FieldSpec::str(
        "dtype",
        "None",
        "Load the model under this dtype; `auto` reads it from the checkpoint.",
    )
    .choices(&["auto", "bfloat16", "float16", "float32"]);
    pub(crate) const IGNORE_MISMATCHED_SIZES: FieldSpec = FieldSpec::bool(
        "ignore_mismatched_sizes",
        false,
        "Re-initialise checkpoint weights whose size differs from the model's (e.g. another number of labels).",
    );
    pub(crate) const DATASET_NAME: FieldSpec = FieldSpec::str(
        "dataset_name",
        "None",
        "The hub dataset to use (a repo id or a local folder), read from its Parquet files through the HF cache.",
    );
    pub(crate) const DATASET_CONFIG_NAME: FieldSpec = FieldSpec::str(
        "dataset_config_name",
        "None",
        "The configuration name of the dataset.",
    );
    pub(crate) const OVERWRITE_CACHE: FieldSpec = FieldSpec::bool(
        "overwrite_cache",
        false,
        "Overwrite the cached training and evaluation sets.",
    );
    pub(crate) const PREPROCESSING_NUM_WORKERS: FieldSpec = FieldSpec::int(
        "preprocessing_num_workers",
        "None",
        "The number of processes for the preprocessing (tokenization here uses every core, TCHTRAIN_NUM_PROC).",
    );
    pub(crate) const MAX_TRAIN_SAMPLES: FieldSpec = FieldSpec::int(
        "max_train_samples",
        "None",
        "Truncate the number of training examples to this value if set.",
    );
    pub(crate) const MAX_EVAL_SAMPLES: FieldSpec = FieldSpec::int(
        "max_eval_samples",
        "None",
        "Truncate the number of evaluation examples to this value if set.",
    );
    pub(crate) const MAX_PREDICT_SAMPLES: FieldSpec = FieldSpec::int(
        "max_predict_samples",
        "None",
        "Truncate the number of prediction examples to this value if set.",
    );
    pub(crate) const TRAIN_FILE: FieldSpec =
        FieldSpec::str("train_file", "None", "The input training data file.");
    pub(crate) const VALIDATION_FILE: FieldSpec = FieldSpec::str(
        "validation_file",
        "None",
        "An optional input evaluation data file.",
    );
    pub(crate) const TEST_FILE: FieldSpec =
        FieldSpec::str("test_file", "None", "An optional input test data file.");
    pub(crate) const PACKING: FieldSpec = FieldSpec::bool(
        "packing",
        false,
        "TRL's packing: whole rows packed into blocks of --block_size tokens (best-fit decreasing), each attending only within itself.",
    );
    pub(crate) const PACKING_STRATEGY: FieldSpec = FieldSpec::str(
        "packing_strategy",
        "bfd",
        "TRL's: truncate (bfd) or split (bfd_split) rows longer than a block.",
    )
    .choices(&["bfd", "bfd_split", "wrapped"]);
    pub(crate) const VALIDATION_SPLIT_PERCENTAGE: FieldSpec = FieldSpec::int(
        "validation_split_percentage",
        "5",
        "The percentage of the train set used as validation set in case there's no validation split.",
    );
}

/// TRL's `SFTConfig` packing flags (not in upstream's scripts).
pub(crate) static PACKING_ARGUMENTS: Dataclass = Dataclass {
    name: "SFTConfig (packing)",
    fields: &[fields::PACKING, fields::PACKING_STRATEGY],
};

/// The refusals every script shares.
pub(crate) mod refusals {
    use super::Refusal;

    pub(crate) const TRUST_REMOTE_CODE: Refusal = Refusal {
        flag: "trust_remote_code",
        reason: "no Python code is run here: a repository's own modeling code cannot be loaded; use a model family tchtrain implements",
    };
    pub(crate) const USE_FAST_TOKENIZER: Refusal = Refusal {
        flag: "use_fast_tokenizer",
        reason: "only fast tokenizers (tokenizer.json, the `tokenizers` library) exist here; leave the flag out",
    };
    pub(crate) const MODEL_TYPE: Refusal = Refusal {
        flag: "model_type",
        reason: "training from scratch is not supported: pass --model_name_or_path with a checkpoint folder or hub id",
    };
    pub(crate) const CONFIG_OVERRIDES: Refusal = Refusal {
        flag: "config_overrides",
        reason: "it overrides a from-scratch config, and training from scratch is not supported: pass --model_name_or_path (edit that folder's config.json to change the model)",
    };
}

/// A length flag that may be `None` (TRL's `max_length`).
pub(crate) fn none_or_usize<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<usize>, D::Error> {
    use serde::Deserialize;
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::Null => Ok(None),
        serde_json::Value::String(s) if s == "None" || s == "null" => Ok(None),
        serde_json::Value::String(s) => s.parse().map(Some).map_err(serde::de::Error::custom),
        v => v
            .as_u64()
            .map(|n| Some(n as usize))
            .ok_or_else(|| serde::de::Error::custom(format!("{v}: a length or None"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_str_matches_argparse_defaults() {
        assert_eq!(python_str(&Value::Bool(true)), "True");
        assert_eq!(python_str(&Value::from(5)), "5");
        assert_eq!(python_str(&Value::from(0.15)), "0.15");
        assert_eq!(python_str(&Value::from("main")), "main");
        let spec = FieldSpec::float("p", "0.15", "");
        assert_eq!(default_value(&spec), Some(Value::from(0.15)));
        assert_eq!(default_value(&FieldSpec::int("n", "None", "")), None);
        assert_eq!(
            default_value(&FieldSpec::bool("b", true, "")),
            Some(Value::Bool(true))
        );
    }
}

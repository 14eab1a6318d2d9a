//! `Seq2SeqTrainingArguments`: upstream's `training_args_seq2seq.py` (transformers 5.23), the
//! five fields `Seq2SeqTrainer` adds to `TrainingArguments` (`sortish_sampler`,
//! `predict_with_generate`, `generation_max_length`, `generation_num_beams`,
//! `generation_config`), their JSON (`to_dict` / `to_json_string` / `to_sanitized_dict` in
//! upstream's key order, reading back through the same checks) and their checks.
//!
//! The command line is `HfArgumentParser::for_seq2seq()` (`cli.rs`), whose extra rows come from
//! `seq2seq_field_table.rs`, generated from upstream's own argparse actions.

use std::ops::{Deref, DerefMut};
use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::normalize::{V4_ALIASES, field_names, from_map};
use crate::parsed::{ParsedSeq2SeqArguments, Warning};
use crate::seq2seq_field_table::SEQ2SEQ_FIELDS;
use crate::training_args::TrainingArguments;
use crate::values::JsonDict;
use tchtrain_python_json::{python_repr, to_python_json};

/// The names of the fields `Seq2SeqTrainingArguments` adds to `TrainingArguments`, in upstream's
/// declaration order (which is also their order in `to_dict()`, after `local_rank`).
pub fn seq2seq_field_names() -> impl Iterator<Item = &'static str> {
    SEQ2SEQ_FIELDS.iter().map(|f| f.name)
}

/// The arguments of a sequence-to-sequence training run: upstream's `Seq2SeqTrainingArguments`
/// (transformers 5.23), i.e. every [`TrainingArguments`] field (in [`Self::base`], reachable
/// through `Deref` / `DerefMut`: `args.learning_rate`) plus the five fields `Seq2SeqTrainer`
/// reads.
///
/// [`Default`] equals upstream's `Seq2SeqTrainingArguments()` after `__post_init__`. Values
/// built by hand should go through [`Seq2SeqTrainingArguments::post_init`] (upstream's
/// `__post_init__` on the base, plus this crate's checks of the five fields); the JSON and
/// command-line readers do so themselves.
///
/// Upstream types the five fields but never checks them (a dataclass); here a wrongly typed
/// value is an error when read, and [`Self::generation_max_length`] /
/// [`Self::generation_num_beams`] must be at least 1 when set (see their docs).
///
/// ```
/// use tchtrain_training_args::{IntervalStrategy, Seq2SeqTrainingArguments, TrainingArguments};
///
/// // From scratch (the base fields through Deref):
/// let mut args = Seq2SeqTrainingArguments::new("out");
/// args.predict_with_generate = true;
/// args.generation_num_beams = Some(4);
/// args.eval_strategy = IntervalStrategy::Epoch;
/// args.post_init().unwrap();
/// assert!(args.do_eval);
///
/// // From existing TrainingArguments:
/// let base = TrainingArguments::new("out");
/// let mut args = Seq2SeqTrainingArguments::from(base);
/// args.generation_max_length = Some(64);
/// args.post_init().unwrap();
///
/// // From JSON (upstream's training_args.json) or a dict:
/// let parsed = Seq2SeqTrainingArguments::from_json_str(
///     r#"{"output_dir": "out", "predict_with_generate": true, "generation_config": "gen_dir"}"#,
/// )
/// .unwrap();
/// assert_eq!(parsed.args.generation_config, Some(serde_json::json!("gen_dir")));
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Seq2SeqTrainingArguments {
    /// Every `TrainingArguments` field (upstream's base class).
    #[serde(flatten)]
    pub base: TrainingArguments,
    /// Whether to use a *sortish sampler* or not (upstream help: "Whether to use SortishSampler or
    /// not."). Default `false`.
    ///
    /// Upstream 5.23 stores this field and never reads it: nothing in transformers looks at it
    /// (the `SortishSampler` its help names is not part of the library). It is kept for parity of
    /// flags and `training_args.json`, and has no effect here either.
    pub sortish_sampler: bool,
    /// Whether to use `generate()` to calculate generative metrics (ROUGE, BLEU): in evaluation
    /// and prediction, `Seq2SeqTrainer` then returns generated token ids as predictions instead
    /// of logits. Default `false`.
    pub predict_with_generate: bool,
    /// The `max_length` to use on each evaluation loop when `predict_with_generate=True`. Will
    /// default to the `max_length` value of the model's generation configuration.
    ///
    /// Must be at least 1 when set. Upstream does not check it (any int is stored) and fails
    /// later, inside `generate()` (for a decoder-only model, "Input length of input_ids is N, but
    /// `max_length` is set to 0"); here the error comes when the arguments are read.
    pub generation_max_length: Option<i64>,
    /// The `num_beams` to use on each evaluation loop when `predict_with_generate=True`. Will
    /// default to the `num_beams` value of the model's generation configuration.
    ///
    /// Must be at least 1 when set. Upstream does not check it (any int is stored) and fails
    /// later, inside `generate()` (`ZeroDivisionError` for 0, a negative-dimension
    /// `RuntimeError` below); here the error comes when the arguments are read.
    pub generation_num_beams: Option<i64>,
    /// A path (string) to a generation config file or folder, or a generation config as a JSON
    /// object.
    ///
    /// Upstream's `str | Path | GenerationConfig | None`: a model id, a path to a
    /// `generation_config.json` (or to the folder holding one), or a `GenerationConfig` object,
    /// which `Seq2SeqTrainer` then sets as the model's generation config. A JSON object here
    /// stands for a `GenerationConfig` object: it is what upstream's `to_dict()` writes for one
    /// (`GenerationConfig.to_dict()`), so a `training_args.json` written by Python reads back.
    /// On the command line the value is always a path (upstream's argparse type is
    /// `pathlib.Path`), even one that looks like JSON.
    pub generation_config: Option<Value>,
}

impl Default for Seq2SeqTrainingArguments {
    fn default() -> Self {
        TrainingArguments::default().into()
    }
}

/// Wraps existing `TrainingArguments` with the five seq2seq fields at upstream's defaults
/// (`false`, `false`, `None`, `None`, `None`). Runs no checks (the base is taken as it is); call
/// [`Seq2SeqTrainingArguments::post_init`] after changing fields.
impl From<TrainingArguments> for Seq2SeqTrainingArguments {
    fn from(base: TrainingArguments) -> Self {
        Self {
            base,
            sortish_sampler: false,
            predict_with_generate: false,
            generation_max_length: None,
            generation_num_beams: None,
            generation_config: None,
        }
    }
}

impl Deref for Seq2SeqTrainingArguments {
    type Target = TrainingArguments;

    fn deref(&self) -> &TrainingArguments {
        &self.base
    }
}

impl DerefMut for Seq2SeqTrainingArguments {
    fn deref_mut(&mut self) -> &mut TrainingArguments {
        &mut self.base
    }
}

/// Reads a JSON value of one of the two bool fields.
fn bool_field(field: &str, v: &Value) -> Result<bool> {
    v.as_bool().ok_or_else(|| Error::InvalidValue {
        field: field.to_string(),
        value: v.to_string(),
        reason: "expected true or false (a JSON boolean)".to_string(),
    })
}

/// Reads a JSON value of one of the two `int | None` fields.
fn int_field(field: &str, v: &Value) -> Result<Option<i64>> {
    match v {
        Value::Null => Ok(None),
        Value::Number(n) if n.as_i64().is_some() => Ok(n.as_i64()),
        other => Err(Error::InvalidValue {
            field: field.to_string(),
            value: other.to_string(),
            reason: "expected a whole number of at least 1, or null to use the model's generation config"
                .to_string(),
        }),
    }
}

/// Checks a `generation_config` value's shape.
fn check_generation_config(v: &Value) -> Result<()> {
    match v {
        Value::Null | Value::String(_) | Value::Object(_) => Ok(()),
        other => Err(Error::InvalidValue {
            field: "generation_config".to_string(),
            value: crate::suggest::truncate(&other.to_string(), 60),
            reason: "expected a path (a string) to a generation config file or folder, a generation config as a \
                     JSON object, or null"
                .to_string(),
        }),
    }
}

/// Checks that an optional count is at least 1.
fn check_at_least_one(field: &'static str, value: Option<i64>, what: &str) -> Result<()> {
    match value {
        Some(n) if n < 1 => Err(Error::OutOfRange {
            field,
            value: n.to_string(),
            problem: format!(
                "`{field}` must be at least 1 when set (upstream stores any int and generate() fails on it later)"
            ),
            fix: format!(
                "use a positive {what}, or leave it unset (null) to use the model's generation config"
            ),
        }),
        _ => Ok(()),
    }
}

/// Builds validated arguments from a key/value map: the five seq2seq keys are taken out and
/// type-checked, the rest goes through `TrainingArguments::from_dict`'s path.
pub(crate) fn from_map_seq2seq(mut map: JsonDict) -> Result<ParsedSeq2SeqArguments> {
    // Unknown keys first, with close matches among both field sets (as upstream's
    // `Seq2SeqTrainingArguments(**d)` rejects them before anything else).
    let is_known = |k: &str| {
        field_names().any(|f| f == k)
            || seq2seq_field_names().any(|f| f == k)
            || V4_ALIASES.iter().any(|(alias, _)| *alias == k)
    };
    if let Some(unknown) = map.keys().find(|k| !is_known(k)) {
        return Err(Error::UnknownField {
            field: unknown.clone(),
            suggestions: crate::suggest::close_matches(
                unknown,
                field_names().chain(seq2seq_field_names()),
            ),
        });
    }
    let mut own = Seq2SeqTrainingArguments::default();
    if let Some(v) = map.remove("sortish_sampler") {
        own.sortish_sampler = bool_field("sortish_sampler", &v)?;
    }
    if let Some(v) = map.remove("predict_with_generate") {
        own.predict_with_generate = bool_field("predict_with_generate", &v)?;
    }
    if let Some(v) = map.remove("generation_max_length") {
        own.generation_max_length = int_field("generation_max_length", &v)?;
    }
    if let Some(v) = map.remove("generation_num_beams") {
        own.generation_num_beams = int_field("generation_num_beams", &v)?;
    }
    if let Some(v) = map.remove("generation_config") {
        check_generation_config(&v)?;
        own.generation_config = Some(v).filter(|v| !v.is_null());
    }
    own.validate_seq2seq()?;
    let parsed = from_map(map)?;
    own.base = parsed.args;
    Ok(ParsedSeq2SeqArguments {
        args: own,
        warnings: parsed.warnings,
        logging_dir: parsed.logging_dir,
    })
}

impl Seq2SeqTrainingArguments {
    /// Upstream's `Seq2SeqTrainingArguments(output_dir)`: the defaults with `output_dir` set.
    pub fn new(output_dir: impl Into<String>) -> Self {
        TrainingArguments::new(output_dir).into()
    }

    /// Upstream's `__post_init__` (that of `TrainingArguments`: the subclass adds none), then the
    /// checks of the five seq2seq fields (see [`Self::validate_args`]). A `generation_config` of
    /// `Some(Value::Null)` becomes `None`. Returns the warnings.
    #[doc(alias = "__post_init__")]
    pub fn post_init(&mut self) -> Result<Vec<Warning>> {
        if self.generation_config.as_ref().is_some_and(Value::is_null) {
            self.generation_config = None;
        }
        let warnings = self.base.post_init()?;
        self.validate_seq2seq()?;
        Ok(warnings)
    }

    /// Upstream's `_validate_args` on the base, then this crate's checks of the seq2seq fields:
    /// `generation_max_length` and `generation_num_beams` at least 1 when set, and
    /// `generation_config` a string, a JSON object or null.
    #[doc(alias = "_validate_args")]
    pub fn validate_args(&self) -> Result<()> {
        self.base.validate_args()?;
        self.validate_seq2seq()
    }

    fn validate_seq2seq(&self) -> Result<()> {
        check_at_least_one(
            "generation_max_length",
            self.generation_max_length,
            "maximum length in tokens",
        )?;
        check_at_least_one(
            "generation_num_beams",
            self.generation_num_beams,
            "number of beams (1 means no beam search)",
        )?;
        if let Some(v) = &self.generation_config {
            check_generation_config(v)?;
        }
        Ok(())
    }

    /// Upstream's `to_dict()`: [`TrainingArguments::to_dict`] plus the five seq2seq fields
    /// (`generation_config` as given: a path as a string, a JSON object as it is, where upstream
    /// writes a `GenerationConfig` object as its `to_dict()`).
    ///
    /// The map's keys are sorted (serde_json's map); [`Self::to_json_string`] keeps upstream's
    /// order (the base fields, then `sortish_sampler`, `predict_with_generate`,
    /// `generation_max_length`, `generation_num_beams`, `generation_config`).
    pub fn to_dict(&self) -> JsonDict {
        match serde_json::to_value(self) {
            Ok(Value::Object(map)) => map,
            // Serialising plain fields to a `Value` cannot fail or give a non-object.
            _ => JsonDict::new(),
        }
    }

    /// Upstream's `to_json_string()`: `json.dumps(self.to_dict(), indent=2)`, byte for byte for
    /// the top-level fields (Python float text, upstream's field order, `ensure_ascii`); the keys
    /// of a `generation_config` object are written sorted.
    ///
    /// Upstream fails here (`TypeError: Object of type PosixPath is not JSON serializable`) when
    /// `generation_config` came from the command line, which makes it a `pathlib.Path`; the path
    /// is written as a string here.
    pub fn to_json_string(&self) -> String {
        // Every field serialises infallibly (non-finite floats become `null`).
        to_python_json(self).unwrap_or_default()
    }

    /// Writes [`Self::to_json_string`] to `path` (upstream's `training_args.json` form).
    pub fn to_json_file(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.to_json_string()).map_err(|source| Error::Io {
            field: "-".to_string(),
            path: path.to_path_buf(),
            source,
        })
    }

    /// Upstream's `to_sanitized_dict()` (TensorBoard hparams): [`TrainingArguments::to_sanitized_dict`]
    /// with the five seq2seq fields, bools and ints as they are, a path as its string, `None` as
    /// `"None"` and a `generation_config` object as its Python `str()` (keys sorted).
    pub fn to_sanitized_dict(&self) -> JsonDict {
        let mut d = self.base.to_sanitized_dict();
        // Upstream's order: to_dict()'s keys (the seq2seq ones last), then the two batch sizes.
        let train = d.remove("train_batch_size");
        let eval = d.remove("eval_batch_size");
        let sanitize = |v: Value| match v {
            Value::Null | Value::Array(_) | Value::Object(_) => Value::String(python_repr(&v)),
            other => other,
        };
        d.insert("sortish_sampler".into(), self.sortish_sampler.into());
        d.insert(
            "predict_with_generate".into(),
            self.predict_with_generate.into(),
        );
        d.insert(
            "generation_max_length".into(),
            sanitize(self.generation_max_length.into()),
        );
        d.insert(
            "generation_num_beams".into(),
            sanitize(self.generation_num_beams.into()),
        );
        d.insert(
            "generation_config".into(),
            sanitize(self.generation_config.clone().unwrap_or(Value::Null)),
        );
        if let Some(v) = train {
            d.insert("train_batch_size".into(), v);
        }
        if let Some(v) = eval {
            d.insert("eval_batch_size".into(), v);
        }
        d
    }

    /// Builds validated arguments from a key/value map, as upstream's
    /// `Seq2SeqTrainingArguments(**d)` or `HfArgumentParser(Seq2SeqTrainingArguments).parse_dict(d)`.
    ///
    /// The five seq2seq keys are type-checked (`sortish_sampler` / `predict_with_generate`: a
    /// JSON boolean; `generation_max_length` / `generation_num_beams`: an integer of at least 1,
    /// or null; `generation_config`: a string, an object, or null), errors naming the field;
    /// everything else is read as [`TrainingArguments::from_dict`] reads it (v4 aliases with
    /// warnings, unknown keys rejected with close matches among both field sets, then
    /// `post_init`).
    pub fn from_dict(map: JsonDict) -> Result<ParsedSeq2SeqArguments> {
        from_map_seq2seq(map)
    }

    /// Parses a JSON object (upstream's `training_args.json` of a `Seq2SeqTrainer` run, or a
    /// hand-written config). A `TrainingArguments` document reads too (the five fields keep
    /// their defaults).
    pub fn from_json_str(json: &str) -> Result<ParsedSeq2SeqArguments> {
        match serde_json::from_str::<Value>(json)? {
            Value::Object(map) => from_map_seq2seq(map),
            other => Err(Error::InvalidValue {
                field: "-".to_string(),
                value: crate::suggest::truncate(&other.to_string(), 60),
                reason: "a Seq2SeqTrainingArguments JSON document must be an object".to_string(),
            }),
        }
    }

    /// Reads a JSON file: upstream's `HfArgumentParser(Seq2SeqTrainingArguments).parse_json_file`.
    pub fn from_json_file(path: impl AsRef<Path>) -> Result<ParsedSeq2SeqArguments> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            field: "-".to_string(),
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json_str(&text)
    }
}

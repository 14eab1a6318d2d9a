//! The command line: upstream's `HfArgumentParser(TrainingArguments)` and
//! `HfArgumentParser(Seq2SeqTrainingArguments)`, reproduced as a table-driven parser over the
//! field tables that `tools/gen_field_table.py` and `tools/gen_seq2seq_field_table.py` extract
//! from upstream's own argparse actions (`field_table.rs`, `seq2seq_field_table.rs`).
//!
//! A table rather than clap: argparse's behaviour is what users' scripts rely on, and it differs
//! from clap's in ways that matter here: `--bf16` / `--bf16 false` / `--bf16=0` on the same flag
//! (`nargs="?"`, `const=True`), `--no_<field>` for bool fields defaulting to true, both
//! `--snake_case` and `--kebab-case` spellings, unique-prefix abbreviations (`--per_device_train`;
//! `--learning` is ambiguous between `--learning_rate` and `--learning-rate`, as upstream),
//! negative numbers as values, `nargs="+"` lists, and the last occurrence of a flag winning.
//!
//! Parsed values go through the same path as JSON (`TrainingArguments::from_dict`), so the v4
//! aliases (`--evaluation_strategy`, `--warmup_ratio`, `--group_by_length`, `--logging_dir`),
//! dicts given as JSON strings (`--lr_scheduler_kwargs '{"num_cycles": 2}'`), file paths
//! (`--fsdp_config file.json`) and every `__post_init__` check apply.
//!
//! Not mirrored: upstream's automatic `<script>.args` file and `args_file_flag`; non-finite
//! floats (`--learning_rate nan`) are rejected, since the values travel as JSON.

use serde_json::Value;

use crate::debug_utils::DebugOption;
use crate::error::{Error, Result};
use crate::field_table::FIELDS;
use crate::normalize::from_map;
use crate::parsed::{ParsedArguments, ParsedSeq2SeqArguments};
use crate::seq2seq::from_map_seq2seq;
use crate::seq2seq_field_table::SEQ2SEQ_FIELDS;
use crate::suggest::close_matches;
use crate::values::JsonDict;

/// How `HfArgumentParser` converts one command-line string for a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    /// `string_to_bool`: yes/no, true/false, t/f, y/n, 1/0, any case.
    Bool,
    /// Python `int()`.
    Int,
    /// Python `float()`.
    Float,
    /// The string itself (checked against `choices` when there are some).
    Str,
    /// `DebugOption(value)`.
    Debug,
    /// A type argparse cannot build from a string (upstream fails with "invalid <type> value").
    Unsupported(&'static str),
}

/// How many command-line values a flag takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nargs {
    /// Exactly one.
    One,
    /// Zero or one; alone it means `true` (`nargs="?"`, `const=True`).
    OptionalConstTrue,
    /// One or more (`nargs="+"`).
    OneOrMore,
}

/// One dataclass field as the command line sees it: the argparse action
/// `HfArgumentParser._parse_dataclass_field` adds for it (see `field_table.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldSpec {
    /// The field's name; the flags are `--name` and, with `_` in it, `--kebab-name`.
    pub name: &'static str,
    /// How a value is converted (argparse's `type`).
    pub kind: ValueKind,
    /// How many values the flag takes.
    pub nargs: Nargs,
    /// The allowed values (argparse's `choices`; `Literal` / `Enum` fields), or none.
    pub choices: &'static [&'static str],
    /// A `--no_<name>` flag setting it to false (bool fields defaulting to true).
    pub no_flag: bool,
    /// The field has no default (argparse's `required=True`).
    pub required: bool,
    /// The default as argparse shows it (`str(default)`: `None`, `True`, `5`, `text`).
    pub default: &'static str,
    /// The help text.
    pub help: &'static str,
}

impl FieldSpec {
    /// An `Optional[str]` / `str` field (`default` as `str(default)`, `None` for none).
    pub const fn str(name: &'static str, default: &'static str, help: &'static str) -> Self {
        Self {
            name,
            kind: ValueKind::Str,
            nargs: Nargs::One,
            choices: &[],
            no_flag: false,
            required: false,
            default,
            help,
        }
    }

    /// An `int` field.
    pub const fn int(name: &'static str, default: &'static str, help: &'static str) -> Self {
        Self {
            kind: ValueKind::Int,
            ..Self::str(name, default, help)
        }
    }

    /// A `float` field.
    pub const fn float(name: &'static str, default: &'static str, help: &'static str) -> Self {
        Self {
            kind: ValueKind::Float,
            ..Self::str(name, default, help)
        }
    }

    /// A `bool` field with a default: `--name` alone means true, `--name false` too
    /// (`nargs="?"`, `const=True`), and a default of true adds `--no_<name>`.
    pub const fn bool(name: &'static str, default: bool, help: &'static str) -> Self {
        Self {
            kind: ValueKind::Bool,
            nargs: Nargs::OptionalConstTrue,
            no_flag: default,
            default: if default { "True" } else { "False" },
            ..Self::str(name, "False", help)
        }
    }

    /// An `Optional[bool] = None` field: one value required after the flag (upstream gives
    /// such fields no `nargs="?"`).
    pub const fn optional_bool(name: &'static str, help: &'static str) -> Self {
        Self {
            kind: ValueKind::Bool,
            ..Self::str(name, "None", help)
        }
    }

    /// A `list[str]` field (`nargs="+"`).
    pub const fn list(name: &'static str, default: &'static str, help: &'static str) -> Self {
        Self {
            nargs: Nargs::OneOrMore,
            ..Self::str(name, default, help)
        }
    }

    /// The same field with argparse `choices`.
    pub const fn choices(self, choices: &'static [&'static str]) -> Self {
        Self { choices, ..self }
    }

    /// The same field without a default (argparse's `required=True`).
    pub const fn required(self) -> Self {
        Self {
            required: true,
            ..self
        }
    }
}

/// A dataclass of fields parsed next to `TrainingArguments`, as upstream's scripts build
/// `HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))`.
#[derive(Debug)]
pub struct Dataclass {
    /// The class name (`ModelArguments`), shown in `--help`.
    pub name: &'static str,
    /// Its fields, in declaration order.
    pub fields: &'static [FieldSpec],
}

/// What [`HfArgumentParser::with_dataclass`] parsers return besides the `TrainingArguments`:
/// for each added dataclass, in the order they were added, the fields that were given, with
/// their values converted as argparse's `type` converts them (bool, int, float, string, or
/// a list for `nargs="+"`). Fields not given are absent: their defaults are the reader's.
pub type DataclassValues = Vec<JsonDict>;

/// The v4 names accepted on the command line (mapped with a warning; see `normalize.rs`).
static ALIAS_FIELDS: &[FieldSpec] = &[
    FieldSpec {
        name: "evaluation_strategy",
        kind: ValueKind::Str,
        nargs: Nargs::One,
        choices: &["no", "steps", "epoch"],
        no_flag: false,
        required: false,
        default: "None",
        help: "Deprecated v4 name of `eval_strategy`.",
    },
    FieldSpec {
        name: "warmup_ratio",
        kind: ValueKind::Float,
        nargs: Nargs::One,
        choices: &[],
        no_flag: false,
        required: false,
        default: "None",
        help: "Deprecated v4 name: sets `warmup_steps` to this ratio in [0, 1).",
    },
    FieldSpec {
        name: "group_by_length",
        kind: ValueKind::Bool,
        nargs: Nargs::OptionalConstTrue,
        choices: &[],
        no_flag: false,
        required: false,
        default: "False",
        help: "Deprecated v4 name: `train_sampling_strategy = \"group_by_length\"`.",
    },
    FieldSpec {
        name: "logging_dir",
        kind: ValueKind::Str,
        nargs: Nargs::One,
        choices: &[],
        no_flag: false,
        required: false,
        default: "None",
        help: "Removed in v5 (TensorBoard reads TENSORBOARD_LOGGING_DIR); accepted with a warning and returned \
               as `ParsedArguments::logging_dir`.",
    },
];

/// Which dataclass a field belongs to: `None` for `TrainingArguments` (or
/// `Seq2SeqTrainingArguments`), else the index among the added dataclasses.
type Owner = Option<usize>;

/// What a flag does.
#[derive(Debug, Clone, Copy)]
enum Target {
    Help,
    Store(&'static FieldSpec, Owner),
    StoreFalse(&'static FieldSpec, Owner),
}

/// One command-line string, classified as argparse does.
#[derive(Debug)]
enum Token {
    /// A known flag (possibly abbreviated), with the value given after `=`.
    Flag {
        target: Target,
        flag: String,
        explicit: Option<String>,
    },
    /// A string starting with `-` that is no known flag.
    Unknown(String),
    /// A value.
    Positional(String),
}

/// Upstream's `string_to_bool`.
pub(crate) fn string_to_bool(s: &str) -> Option<bool> {
    match s.to_lowercase().as_str() {
        "yes" | "true" | "t" | "y" | "1" => Some(true),
        "no" | "false" | "f" | "n" | "0" => Some(false),
        _ => None,
    }
}

/// argparse's `_negative_number_matcher`: `^-\d+$|^-\d*\.\d+$`.
fn looks_like_negative_number(s: &str) -> bool {
    let Some(rest) = s.strip_prefix('-') else {
        return false;
    };
    let digits = |t: &str| !t.is_empty() && t.chars().all(|c| c.is_ascii_digit());
    match rest.split_once('.') {
        None => digits(rest),
        Some((int, frac)) => {
            (int.is_empty() || int.chars().all(|c| c.is_ascii_digit())) && digits(frac)
        }
    }
}

/// `HfArgumentParser(TrainingArguments)` ([`HfArgumentParser::new`]) or
/// `HfArgumentParser(Seq2SeqTrainingArguments)` ([`HfArgumentParser::for_seq2seq`]): parses
/// command lines with upstream's flags.
///
/// ```
/// use tchtrain_training_args::HfArgumentParser;
///
/// let parser = HfArgumentParser::new();
/// let parsed = parser
///     .parse_args_into_dataclasses(["--output_dir", "out", "--per_device_train_batch_size", "4", "--bf16", "--use_cpu"])
///     .unwrap();
/// assert_eq!(parsed.args.per_device_train_batch_size, 4);
/// assert!(parsed.args.bf16);
/// ```
///
/// For `Seq2SeqTrainingArguments`, build the parser with [`HfArgumentParser::for_seq2seq`] and
/// read with the `parse_seq2seq_*` methods:
///
/// ```
/// use tchtrain_training_args::HfArgumentParser;
///
/// let parsed = HfArgumentParser::for_seq2seq()
///     .parse_seq2seq_args_into_dataclasses([
///         "--output_dir", "out", "--predict_with_generate", "--generation_num_beams", "4",
///     ])
///     .unwrap();
/// assert!(parsed.args.predict_with_generate);
/// assert_eq!(parsed.args.generation_num_beams, Some(4));
/// assert_eq!(parsed.args.output_dir(), "out"); // base fields through Deref
/// ```
#[derive(Debug)]
pub struct HfArgumentParser {
    options: Vec<(String, Target)>,
    /// Built for `Seq2SeqTrainingArguments` (its five fields are flags too).
    seq2seq: bool,
    /// The dataclasses parsed beside the training arguments ([`Self::with_dataclass`]).
    dataclasses: Vec<&'static Dataclass>,
}

impl Default for HfArgumentParser {
    fn default() -> Self {
        Self::new()
    }
}

impl HfArgumentParser {
    /// The parser for `TrainingArguments` (plus the v4 alias flags).
    pub fn new() -> Self {
        Self::build(false)
    }

    /// The parser for `Seq2SeqTrainingArguments` (upstream's
    /// `HfArgumentParser(Seq2SeqTrainingArguments)`): `TrainingArguments`' flags, then
    /// `--sortish_sampler [BOOL]`, `--predict_with_generate [BOOL]`, `--generation_max_length N`,
    /// `--generation_num_beams N` and `--generation_config PATH` (plus the v4 alias flags).
    /// Read with [`Self::parse_seq2seq_args_into_dataclasses`] and the other `parse_seq2seq_*`
    /// methods.
    ///
    /// As upstream, the extra flags take part in prefix matching: `--predict_with_gen` means
    /// `--predict_with_generate`, and `--generation` is ambiguous.
    pub fn for_seq2seq() -> Self {
        Self::build(true)
    }

    fn build(seq2seq: bool) -> Self {
        let mut options = vec![
            ("-h".to_string(), Target::Help),
            ("--help".to_string(), Target::Help),
        ];
        for spec in Self::specs(seq2seq) {
            push_options(&mut options, spec, None);
        }
        Self {
            options,
            seq2seq,
            dataclasses: Vec::new(),
        }
    }

    /// Adds a dataclass's fields as flags, as upstream's scripts pass
    /// `HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))`: its
    /// flags share prefix matching, `--no_<flag>`, did-you-mean and `--help` with the
    /// training arguments'. Read with [`Self::parse_args_with_dataclasses`] (or the
    /// `seq2seq` / JSON-file twins), which return the added dataclasses' values in the order
    /// they were added.
    ///
    /// A field whose flag another field already has is [`Error::ConflictingOption`]
    /// (argparse's "conflicting option string").
    ///
    /// ```
    /// use tchtrain_training_args::{Dataclass, FieldSpec, HfArgumentParser};
    ///
    /// static DATA: Dataclass = Dataclass {
    ///     name: "DataTrainingArguments",
    ///     fields: &[
    ///         FieldSpec::str("train_file", "None", "A training file."),
    ///         FieldSpec::bool("keep_linebreaks", true, "Keep line breaks."),
    ///     ],
    /// };
    /// let parser = HfArgumentParser::new().with_dataclass(&DATA)?;
    /// let (values, parsed) = parser.parse_args_with_dataclasses([
    ///     "--train_f", "a.txt", "--no_keep_linebreaks", "--output_dir", "out",
    /// ])?;
    /// assert_eq!(values[0]["train_file"], "a.txt");
    /// assert_eq!(values[0]["keep_linebreaks"], false);
    /// assert_eq!(parsed.args.output_dir(), "out");
    /// # Ok::<(), tchtrain_training_args::Error>(())
    /// ```
    pub fn with_dataclass(mut self, dataclass: &'static Dataclass) -> Result<Self> {
        let owner = Some(self.dataclasses.len());
        for spec in dataclass.fields {
            let mut added = Vec::new();
            push_options(&mut added, spec, owner);
            if let Some((flag, _)) = added
                .iter()
                .find(|(flag, _)| self.options.iter().any(|(o, _)| o == flag))
            {
                return Err(Error::ConflictingOption {
                    flag: flag.clone(),
                    dataclass: dataclass.name.to_string(),
                });
            }
            self.options.extend(added);
        }
        self.dataclasses.push(dataclass);
        Ok(self)
    }

    /// Every field row this parser knows, in `--help` order.
    fn specs(seq2seq: bool) -> impl Iterator<Item = &'static FieldSpec> {
        let extra: &'static [FieldSpec] = if seq2seq { SEQ2SEQ_FIELDS } else { &[] };
        FIELDS.iter().chain(extra).chain(ALIAS_FIELDS)
    }

    fn exact(&self, flag: &str) -> Option<Target> {
        self.options
            .iter()
            .find(|(o, _)| o == flag)
            .map(|(_, t)| *t)
    }

    /// argparse's `_parse_optional`.
    fn classify(&self, arg: &str) -> Result<Token> {
        if !arg.starts_with('-') || arg.len() == 1 {
            return Ok(Token::Positional(arg.to_string()));
        }
        if let Some(target) = self.exact(arg) {
            return Ok(Token::Flag {
                target,
                flag: arg.to_string(),
                explicit: None,
            });
        }
        if let Some((flag, value)) = arg.split_once('=')
            && let Some(target) = self.exact(flag)
        {
            return Ok(Token::Flag {
                target,
                flag: flag.to_string(),
                explicit: Some(value.to_string()),
            });
        }
        if arg.starts_with("--") {
            let (prefix, explicit) = match arg.split_once('=') {
                Some((p, v)) => (p, Some(v.to_string())),
                None => (arg, None),
            };
            let matches: Vec<&(String, Target)> = self
                .options
                .iter()
                .filter(|(o, _)| o.starts_with(prefix))
                .collect();
            if matches.len() > 1 {
                return Err(Error::AmbiguousOption {
                    arg: arg.to_string(),
                    matches: matches.iter().map(|(o, _)| o.clone()).collect(),
                });
            }
            if let Some((flag, target)) = matches.first() {
                return Ok(Token::Flag {
                    target: *target,
                    flag: flag.clone(),
                    explicit,
                });
            }
        }
        if looks_like_negative_number(arg) || arg.contains(' ') {
            return Ok(Token::Positional(arg.to_string()));
        }
        Ok(Token::Unknown(arg.to_string()))
    }

    /// Parses a command line (without the program name) into arguments: upstream's
    /// `parse_args_into_dataclasses`. Strings no flag uses are an error
    /// ([`Error::UnknownArgument`], with close matches); `--help` gives [`Error::HelpRequested`].
    pub fn parse_args_into_dataclasses<I, S>(&self, args: I) -> Result<ParsedArguments>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let (parsed, remaining) = self.parse_known_args(args)?;
        self.reject_remaining(remaining)?;
        Ok(parsed)
    }

    /// Fails with [`Error::UnknownArgument`] (with close matches) when strings are left over.
    fn reject_remaining(&self, remaining: Vec<String>) -> Result<()> {
        if remaining.is_empty() {
            return Ok(());
        }
        let first_flag = remaining.iter().find(|r| r.starts_with("--"));
        let suggestions = first_flag.map_or_else(Vec::new, |f| self.suggest(f));
        Err(Error::UnknownArgument {
            args: remaining,
            suggestions,
        })
    }

    /// Like [`Self::parse_args_into_dataclasses`], but returns the strings no flag used instead
    /// of failing on them (upstream's `return_remaining_strings=True`), for programs that parse
    /// their own flags next to `TrainingArguments`.
    ///
    /// On a [`Self::for_seq2seq`] parser, a seq2seq flag given here is an error (it has no place
    /// in `TrainingArguments`; read with [`Self::parse_seq2seq_known_args`] instead).
    pub fn parse_known_args<I, S>(&self, args: I) -> Result<(ParsedArguments, Vec<String>)>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let (map, _, remaining) = self.collect(args)?;
        self.training_only(map).map(|parsed| (parsed, remaining))
    }

    /// The training arguments of a parsed map, refusing seq2seq fields.
    fn training_only(&self, map: JsonDict) -> Result<ParsedArguments> {
        if let Some(name) = crate::seq2seq::seq2seq_field_names().find(|n| map.contains_key(*n)) {
            return Err(Error::InvalidValue {
                field: name.to_string(),
                value: map[name].to_string(),
                reason: "this is a Seq2SeqTrainingArguments field; read the command line with \
                         `parse_seq2seq_args_into_dataclasses` (or `parse_seq2seq_known_args`)"
                    .to_string(),
            });
        }
        from_map(map)
    }

    /// Upstream's `parse_args_into_dataclasses` on a parser with added dataclasses
    /// ([`Self::with_dataclass`]): their values (see [`DataclassValues`]), then the
    /// training arguments. Strings no flag uses are [`Error::UnknownArgument`], with close
    /// matches among every dataclass's flags; a required field not given is
    /// [`Error::MissingRequired`].
    pub fn parse_args_with_dataclasses<I, S>(
        &self,
        args: I,
    ) -> Result<(DataclassValues, ParsedArguments)>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let (map, values, remaining) = self.collect(args)?;
        self.reject_remaining(remaining)?;
        self.check_required(&values)?;
        Ok((values, self.training_only(map)?))
    }

    /// [`Self::parse_args_with_dataclasses`] for `Seq2SeqTrainingArguments` (a parser from
    /// [`Self::for_seq2seq`]).
    pub fn parse_seq2seq_args_with_dataclasses<I, S>(
        &self,
        args: I,
    ) -> Result<(DataclassValues, ParsedSeq2SeqArguments)>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let (map, values, remaining) = self.collect(args)?;
        self.reject_remaining(remaining)?;
        self.check_required(&values)?;
        Ok((values, from_map_seq2seq(map)?))
    }

    /// Upstream's `parse_json_file` (and `parse_dict`) on a parser with added dataclasses:
    /// each key goes to the dataclass with that field; the rest are the training arguments,
    /// read as [`crate::TrainingArguments::from_dict`] reads them. A key no dataclass has is
    /// an error, as `allow_extra_keys=False` makes it upstream. Values are JSON values of the
    /// field's type (`null` for a field whose default is `None` is the default).
    pub fn parse_json_file_with_dataclasses(
        &self,
        path: impl AsRef<std::path::Path>,
    ) -> Result<(DataclassValues, ParsedArguments)> {
        let (map, values) = self.split_json_file(path.as_ref())?;
        Ok((values, self.training_only(map)?))
    }

    /// [`Self::parse_json_file_with_dataclasses`] for `Seq2SeqTrainingArguments`.
    pub fn parse_seq2seq_json_file_with_dataclasses(
        &self,
        path: impl AsRef<std::path::Path>,
    ) -> Result<(DataclassValues, ParsedSeq2SeqArguments)> {
        let (map, values) = self.split_json_file(path.as_ref())?;
        Ok((values, from_map_seq2seq(map)?))
    }

    /// Reads a JSON file of arguments and hands each key to its dataclass.
    fn split_json_file(&self, path: &std::path::Path) -> Result<(JsonDict, DataclassValues)> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            field: "-".to_string(),
            path: path.to_path_buf(),
            source,
        })?;
        let Value::Object(all) = serde_json::from_str::<Value>(&text)? else {
            return Err(Error::InvalidValue {
                field: path.display().to_string(),
                value: "(the file)".into(),
                reason: "expected a JSON object of argument names and values".into(),
            });
        };
        let mut map = JsonDict::new();
        let mut values: DataclassValues = vec![JsonDict::new(); self.dataclasses.len()];
        for (key, value) in all {
            let owned = self.dataclasses.iter().enumerate().find_map(|(i, dc)| {
                dc.fields
                    .iter()
                    .find(|f| f.name == key)
                    .map(|spec| (i, spec))
            });
            match owned {
                Some((i, spec)) => {
                    if let Some(value) = check_json_value(spec, value)? {
                        values[i].insert(key, value);
                    }
                }
                None => {
                    map.insert(key, value);
                }
            }
        }
        self.check_required(&values)?;
        Ok((map, values))
    }

    /// argparse's "the following arguments are required".
    fn check_required(&self, values: &DataclassValues) -> Result<()> {
        let missing: Vec<String> = self
            .dataclasses
            .iter()
            .zip(values)
            .flat_map(|(dc, given)| {
                dc.fields
                    .iter()
                    .filter(|f| f.required && !given.contains_key(f.name))
                    .map(|f| format!("--{}", f.name))
            })
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(Error::MissingRequired { flags: missing })
        }
    }

    /// Upstream's `HfArgumentParser(Seq2SeqTrainingArguments).parse_args_into_dataclasses`:
    /// [`Self::parse_args_into_dataclasses`] for `Seq2SeqTrainingArguments`. The parser must come
    /// from [`Self::for_seq2seq`]; on one from [`Self::new`] the seq2seq flags are unknown
    /// arguments (as upstream's `HfArgumentParser(TrainingArguments)` would say).
    pub fn parse_seq2seq_args_into_dataclasses<I, S>(
        &self,
        args: I,
    ) -> Result<ParsedSeq2SeqArguments>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let (parsed, remaining) = self.parse_seq2seq_known_args(args)?;
        self.reject_remaining(remaining)?;
        Ok(parsed)
    }

    /// [`Self::parse_known_args`] for `Seq2SeqTrainingArguments`: also returns the strings no
    /// flag used.
    pub fn parse_seq2seq_known_args<I, S>(
        &self,
        args: I,
    ) -> Result<(ParsedSeq2SeqArguments, Vec<String>)>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let (map, _, remaining) = self.collect(args)?;
        Ok((from_map_seq2seq(map)?, remaining))
    }

    /// Turns a command line into the key/value map the readers take, the added dataclasses'
    /// values, and the strings no flag used.
    fn collect<I, S>(&self, args: I) -> Result<(JsonDict, DataclassValues, Vec<String>)>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut tokens = Vec::new();
        let mut remaining = Vec::new();
        let mut iter = args.into_iter();
        for arg in iter.by_ref() {
            let arg = arg.as_ref();
            if arg == "--" {
                break;
            }
            tokens.push(self.classify(arg)?);
        }
        let after_double_dash: Vec<String> = iter.map(|a| a.as_ref().to_string()).collect();

        let mut map = JsonDict::new();
        let mut extra: DataclassValues = vec![JsonDict::new(); self.dataclasses.len()];
        let mut i = 0;
        while i < tokens.len() {
            match &tokens[i] {
                Token::Positional(s) | Token::Unknown(s) => remaining.push(s.clone()),
                Token::Flag {
                    target: Target::Help,
                    ..
                } => return Err(Error::HelpRequested(self.format_help("train"))),
                Token::Flag {
                    target: Target::StoreFalse(spec, owner),
                    flag,
                    explicit,
                } => {
                    if let Some(value) = explicit {
                        return Err(Error::UnexpectedValue {
                            flag: flag.clone(),
                            value: value.clone(),
                        });
                    }
                    let into = owner.map_or(&mut map, |o| &mut extra[o]);
                    into.insert(spec.name.to_string(), Value::Bool(false));
                }
                Token::Flag {
                    target: Target::Store(spec, owner),
                    flag,
                    explicit,
                } => {
                    let mut values: Vec<String> = Vec::new();
                    if let Some(v) = explicit {
                        values.push(v.clone());
                    } else {
                        let take = match spec.nargs {
                            Nargs::One | Nargs::OptionalConstTrue => 1,
                            Nargs::OneOrMore => usize::MAX,
                        };
                        while values.len() < take {
                            match tokens.get(i + 1) {
                                Some(Token::Positional(v)) => {
                                    values.push(v.clone());
                                    i += 1;
                                }
                                _ => break,
                            }
                        }
                    }
                    let value = match (spec.nargs, values.len()) {
                        (Nargs::OptionalConstTrue, 0) => Value::Bool(true),
                        (Nargs::One, 0) => {
                            return Err(Error::MissingValue {
                                flag: self.display_flags(spec),
                                expected: "one argument",
                            });
                        }
                        (Nargs::OneOrMore, 0) => {
                            return Err(Error::MissingValue {
                                flag: self.display_flags(spec),
                                expected: "at least one argument",
                            });
                        }
                        (Nargs::OneOrMore, _) => Value::Array(
                            values
                                .iter()
                                .map(|v| convert(spec, flag, v))
                                .collect::<Result<_>>()?,
                        ),
                        _ => convert(spec, flag, &values[0])?,
                    };
                    let into = owner.map_or(&mut map, |o| &mut extra[o]);
                    into.insert(spec.name.to_string(), value);
                }
            }
            i += 1;
        }
        remaining.extend(after_double_dash);
        Ok((map, extra, remaining))
    }

    /// Parses the process's own command line (`std::env::args`, skipping the program name);
    /// prints the help and exits 0 on `--help`, prints the error and exits 2 on bad input, as
    /// argparse does.
    pub fn parse_args_or_exit(&self) -> ParsedArguments {
        self.or_exit(|argv| self.parse_args_into_dataclasses(argv))
    }

    /// [`Self::parse_args_or_exit`] for `Seq2SeqTrainingArguments` (build the parser with
    /// [`Self::for_seq2seq`]).
    pub fn parse_seq2seq_args_or_exit(&self) -> ParsedSeq2SeqArguments {
        self.or_exit(|argv| self.parse_seq2seq_args_into_dataclasses(argv))
    }

    /// Runs `parse` on the process's arguments; help and errors end the process as argparse does.
    fn or_exit<T>(&self, parse: impl FnOnce(std::env::Args) -> Result<T>) -> T {
        let mut argv = std::env::args();
        let prog = argv.next().unwrap_or_else(|| "train".to_string());
        match parse(argv) {
            Ok(parsed) => parsed,
            Err(Error::HelpRequested(_)) => {
                println!("{}", self.format_help(&prog));
                std::process::exit(0)
            }
            Err(e) => {
                eprintln!("usage: {prog} [-h] [--FIELD VALUE ...]\n{prog}: error: {e}");
                std::process::exit(2)
            }
        }
    }

    /// Upstream's `parse_dict`: see [`crate::TrainingArguments::from_dict`].
    pub fn parse_dict(&self, args: JsonDict) -> Result<ParsedArguments> {
        from_map(args)
    }

    /// Upstream's `parse_json_file`: see [`crate::TrainingArguments::from_json_file`].
    pub fn parse_json_file(&self, path: impl AsRef<std::path::Path>) -> Result<ParsedArguments> {
        crate::TrainingArguments::from_json_file(path)
    }

    /// Upstream's `HfArgumentParser(Seq2SeqTrainingArguments).parse_dict`: see
    /// [`crate::Seq2SeqTrainingArguments::from_dict`].
    pub fn parse_seq2seq_dict(&self, args: JsonDict) -> Result<ParsedSeq2SeqArguments> {
        from_map_seq2seq(args)
    }

    /// Upstream's `HfArgumentParser(Seq2SeqTrainingArguments).parse_json_file`: see
    /// [`crate::Seq2SeqTrainingArguments::from_json_file`].
    pub fn parse_seq2seq_json_file(
        &self,
        path: impl AsRef<std::path::Path>,
    ) -> Result<ParsedSeq2SeqArguments> {
        crate::Seq2SeqTrainingArguments::from_json_file(path)
    }

    /// Close matches among the flags for an unknown flag (compared without dashes).
    fn suggest(&self, arg: &str) -> Vec<String> {
        let name = arg
            .trim_start_matches('-')
            .split('=')
            .next()
            .unwrap_or("")
            .replace('-', "_");
        let names: Vec<String> = self
            .options
            .iter()
            .filter(|(o, _)| o.starts_with("--") && !o[2..].contains('-'))
            .map(|(o, _)| o[2..].to_string())
            .collect();
        close_matches(&name, names.iter().map(String::as_str))
            .into_iter()
            .map(|n| format!("--{n}"))
            .collect()
    }

    fn display_flags(&self, spec: &FieldSpec) -> String {
        if spec.name.contains('_') {
            format!("--{}/--{}", spec.name, spec.name.replace('_', "-"))
        } else {
            format!("--{}", spec.name)
        }
    }

    /// The `--help` text: every flag with its help and default, as `ArgumentDefaultsHelpFormatter` shows them.
    pub fn format_help(&self, prog: &str) -> String {
        let class = if self.seq2seq {
            "Seq2SeqTrainingArguments"
        } else {
            "TrainingArguments"
        };
        let classes: Vec<String> = self
            .dataclasses
            .iter()
            .map(|d| d.name.to_string())
            .chain([format!("transformers.{class} (5.23)")])
            .collect();
        let mut out = format!(
            "usage: {prog} [-h] [--FIELD VALUE ...]\n\n\
             Arguments of {}, parsed as HfArgumentParser parses them.\n\
             Each flag also accepts `--flag=value` and a kebab-case spelling; bool flags alone mean true.\n\n\
             options:\n  -h, --help\n{pad}show this help message and exit\n",
            classes.join(", "),
            pad = " ".repeat(24)
        );
        let extra = self.dataclasses.iter().flat_map(|d| d.fields.iter());
        for spec in extra.chain(Self::specs(self.seq2seq)) {
            let metavar = if spec.choices.is_empty() {
                spec.name.to_uppercase()
            } else {
                format!("{{{}}}", spec.choices.join(","))
            };
            let usage = match spec.nargs {
                Nargs::One => metavar,
                Nargs::OptionalConstTrue => format!("[{metavar}]"),
                Nargs::OneOrMore => format!("{metavar} [{metavar} ...]"),
            };
            out.push_str(&format!("  --{} {usage}\n", spec.name));
            let default = if spec.required {
                "required".to_string()
            } else {
                format!("default: {}", spec.default)
            };
            out.push_str(&wrap(&format!("{} ({default})", spec.help), 24, 100));
            if spec.no_flag {
                out.push_str(&format!("  --no_{}\n", spec.name));
                out.push_str(&wrap(&format!("Set `{}` to false.", spec.name), 24, 100));
            }
        }
        out
    }
}

/// The flags of one field: `--name`, `--kebab-name`, and for a true-by-default bool
/// `--no_name` / `--no-kebab-name`.
fn push_options(options: &mut Vec<(String, Target)>, spec: &'static FieldSpec, owner: Owner) {
    options.push((format!("--{}", spec.name), Target::Store(spec, owner)));
    if spec.name.contains('_') {
        options.push((
            format!("--{}", spec.name.replace('_', "-")),
            Target::Store(spec, owner),
        ));
    }
    if spec.no_flag {
        options.push((
            format!("--no_{}", spec.name),
            Target::StoreFalse(spec, owner),
        ));
        options.push((
            format!("--no-{}", spec.name.replace('_', "-")),
            Target::StoreFalse(spec, owner),
        ));
    }
}

/// A JSON value for a dataclass field: checked against the field's type and choices;
/// `None` for `null` where the default is `None` (the default, so not given).
fn check_json_value(spec: &FieldSpec, value: Value) -> Result<Option<Value>> {
    let invalid = |reason: &str| Error::InvalidValue {
        field: spec.name.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
    };
    let fits = |v: &Value| match spec.kind {
        ValueKind::Bool => v.is_boolean(),
        ValueKind::Int => v.is_i64() || v.is_u64(),
        ValueKind::Float => v.is_number(),
        ValueKind::Str | ValueKind::Debug => v
            .as_str()
            .is_some_and(|s| spec.choices.is_empty() || spec.choices.contains(&s)),
        ValueKind::Unsupported(_) => true,
    };
    if value.is_null() {
        return if spec.default == "None" {
            Ok(None)
        } else {
            Err(invalid("null is not a value of this field"))
        };
    }
    let ok = match (&spec.nargs, &value) {
        (Nargs::OneOrMore, Value::Array(items)) => items.iter().all(fits),
        (Nargs::OneOrMore, _) => false,
        _ => fits(&value),
    };
    if ok {
        Ok(Some(value))
    } else {
        let expected = match (spec.nargs, spec.kind) {
            (Nargs::OneOrMore, _) => "a list of values".to_string(),
            (_, ValueKind::Bool) => "true or false".to_string(),
            (_, ValueKind::Int) => "an integer".to_string(),
            (_, ValueKind::Float) => "a number".to_string(),
            _ if !spec.choices.is_empty() => format!("one of {}", spec.choices.join(", ")),
            _ => "a string".to_string(),
        };
        Err(invalid(&format!("expected {expected}")))
    }
}

/// Converts one command-line string as the field's argparse `type` and `choices` would.
fn convert(spec: &FieldSpec, flag: &str, raw: &str) -> Result<Value> {
    let invalid = |reason: String| Error::InvalidValue {
        field: spec.name.to_string(),
        value: format!("{raw:?} (from {flag})"),
        reason,
    };
    let value = match spec.kind {
        ValueKind::Bool => Value::Bool(string_to_bool(raw).ok_or_else(|| {
            invalid(format!(
                "Truthy value expected: got {raw} but expected one of yes/no, true/false, t/f, y/n, 1/0 (case insensitive)"
            ))
        })?),
        ValueKind::Int => Value::from(raw.trim().parse::<i64>().map_err(|_| invalid(format!("invalid int value: '{raw}'")))?),
        ValueKind::Float => {
            let x = raw.trim().parse::<f64>().map_err(|_| invalid(format!("invalid float value: '{raw}'")))?;
            Value::Number(serde_json::Number::from_f64(x).ok_or_else(|| invalid("expected a finite number".to_string()))?)
        }
        ValueKind::Str => Value::String(raw.to_string()),
        ValueKind::Debug => {
            let option: DebugOption = raw.parse().map_err(|e: Error| invalid(format!("invalid DebugOption value: {e}")))?;
            Value::String(option.as_str().to_string())
        }
        ValueKind::Unsupported(ty) => {
            return Err(invalid(format!(
                "invalid {ty} value: this field cannot be set from the command line (as upstream); set it in a JSON config"
            )));
        }
    };
    if !spec.choices.is_empty() && !spec.choices.contains(&raw) {
        return Err(invalid(format!(
            "invalid choice: '{raw}'{} (choose from {})",
            crate::suggest::did_you_mean(&close_matches(raw, spec.choices.iter().copied())),
            spec.choices
                .iter()
                .map(|c| format!("'{c}'"))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(value)
}

/// Wraps `text` to `width` columns, indenting every line by `indent` spaces.
fn wrap(text: &str, indent: usize, width: usize) -> String {
    let pad = " ".repeat(indent);
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && indent + line.len() + 1 + word.len() > width {
            out.push_str(&format!("{pad}{line}\n"));
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        out.push_str(&format!("{pad}{line}\n"));
    }
    out
}

//! The error type of `tchtrain-training-args`: every variant names the field (or flag), the
//! offending value and how to fix it.

use std::path::PathBuf;

use crate::suggest::did_you_mean;

/// Errors returned by `tchtrain-training-args`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A JSON document could not be read or written as a whole (malformed JSON, not an object).
    #[error("JSON error: {0}")]
    Json(#[from] serde_json::Error),

    /// A file named by the user (a JSON config, `fsdp_config`, `accelerator_config`) could not be read.
    #[error("cannot read {path} (given for `{field}`): {source}; check the path")]
    Io {
        /// The field whose value named the file (`"-"` for a top-level document).
        field: String,
        /// The file.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },

    /// A string is not one of an enum's upstream values.
    #[error(
        "{value:?} is not a valid {enum_name}{}; valid values: {valid}",
        did_you_mean(suggestions)
    )]
    UnknownVariant {
        /// Upstream's enum name (`SchedulerType`, `OptimizerNames`, ...).
        enum_name: &'static str,
        /// The rejected string.
        value: String,
        /// The closest valid values.
        suggestions: Vec<String>,
        /// Every valid value, comma separated.
        valid: String,
    },

    /// A JSON key or dict key is not a `TrainingArguments` field.
    #[error(
        "`{field}` is not a TrainingArguments field{}; remove it or fix its name",
        did_you_mean(suggestions)
    )]
    UnknownField {
        /// The unknown key.
        field: String,
        /// The closest field names.
        suggestions: Vec<String>,
    },

    /// A field holds a value of the wrong type or outside its allowed set.
    #[error("invalid value {value} for `{field}`: {reason}")]
    InvalidValue {
        /// The field.
        field: String,
        /// The rejected value as written (JSON text or the command-line string).
        value: String,
        /// What was expected, with close matches where there are any.
        reason: String,
    },

    /// A field is outside its allowed range (upstream's `__post_init__` / `_validate_args` checks).
    #[error("`{field}` = {value} is out of range: {problem}; {fix}")]
    OutOfRange {
        /// The field.
        field: &'static str,
        /// The rejected value.
        value: String,
        /// Upstream's wording of the problem.
        problem: String,
        /// How to fix it.
        fix: String,
    },

    /// A step count above 1 is not a whole number (upstream: "--logging_steps must be an integer if bigger than 1").
    #[error(
        "--{field} must be an integer if bigger than 1: {value}; use a whole number of steps or a ratio in [0, 1)"
    )]
    StepsNotInteger {
        /// `logging_steps`, `eval_steps` or `save_steps`.
        field: &'static str,
        /// The rejected value.
        value: f64,
    },

    /// Two fields that cannot both be set were both set (fp16 and bf16, ...).
    #[error("`{first}` and `{second}` cannot both be true{context}; keep at most one of them")]
    MutuallyExclusive {
        /// The first field.
        first: &'static str,
        /// The second field.
        second: &'static str,
        /// Extra context (empty or starting with a space).
        context: &'static str,
    },

    /// A setting needs another field to be set in a certain way.
    #[error("`{field}` = {value} requires {requirement}; {fix}")]
    Requires {
        /// The field whose value imposes the requirement.
        field: &'static str,
        /// Its value.
        value: String,
        /// Upstream's wording of what is required.
        requirement: String,
        /// How to fix it.
        fix: String,
    },

    /// `load_best_model_at_end` with save steps that are not a multiple of the eval steps.
    #[error(
        "--load_best_model_at_end requires the saving steps to be a {kind}multiple of the evaluation steps, \
         but `save_steps` = {save_steps} and `eval_steps` = {eval_steps}{detail}; set `save_steps` to a multiple of `eval_steps`"
    )]
    SaveStepsNotMultiple {
        /// `save_steps`.
        save_steps: f64,
        /// `eval_steps`.
        eval_steps: f64,
        /// `"round "` for absolute steps, empty for ratios.
        kind: &'static str,
        /// Extra explanation (mixing ratio and absolute steps).
        detail: &'static str,
    },

    /// A v4 alias and its v5 field were both given with different values.
    #[error(
        "both `{alias}` (deprecated) and `{field}` are set, to {alias_value} and {field_value}; keep only `{field}`"
    )]
    AliasConflict {
        /// The deprecated name.
        alias: &'static str,
        /// The current field.
        field: &'static str,
        /// The alias's value.
        alias_value: String,
        /// The field's value.
        field_value: String,
    },

    /// The optimizer name is valid upstream but tchtrain does not run it.
    #[error(
        "optim {optim:?} is a valid upstream optimizer but tchtrain refuses it: {why}; use {instead:?} instead"
    )]
    UnsupportedOptimizer {
        /// The requested optimizer.
        optim: String,
        /// Why it is refused.
        why: &'static str,
        /// The name to use instead.
        instead: &'static str,
    },

    /// A command-line flag is not known.
    #[error("unrecognized arguments: {}{}", args.join(" "), did_you_mean(suggestions))]
    UnknownArgument {
        /// The unused command-line strings (as `HfArgumentParser` reports them).
        args: Vec<String>,
        /// The closest flags for the first unknown flag.
        suggestions: Vec<String>,
    },

    /// A flag abbreviation matches several flags (argparse's prefix matching).
    #[error("ambiguous option: {arg} could match {}; write the full flag", matches.join(", "))]
    AmbiguousOption {
        /// The abbreviation as given.
        arg: String,
        /// Every flag it could mean.
        matches: Vec<String>,
    },

    /// A flag that takes a value was given none.
    #[error("argument {flag}: expected {expected}; write `{flag} VALUE`")]
    MissingValue {
        /// The flag.
        flag: String,
        /// `"one argument"` or `"at least one argument"`.
        expected: &'static str,
    },

    /// A flag that takes no value was given one with `=`.
    #[error("argument {flag}: ignored explicit argument {value:?}; write `{flag}` alone")]
    UnexpectedValue {
        /// The flag.
        flag: String,
        /// The value given after `=`.
        value: String,
    },

    /// `--help` / `-h` was given: the payload is the help text to print (exit status 0).
    #[error("{0}")]
    HelpRequested(String),

    /// Fields without a default were not given (argparse's message).
    #[error("the following arguments are required: {}", flags.join(", "))]
    MissingRequired {
        /// The flags missing.
        flags: Vec<String>,
    },

    /// A dataclass added to the parser has a field whose flag another field already has
    /// (argparse's "conflicting option string" when the parser is built).
    #[error(
        "argument {flag}: conflicting option string (a field of {dataclass} repeats a flag the parser already has)"
    )]
    ConflictingOption {
        /// The flag.
        flag: String,
        /// The dataclass being added.
        dataclass: String,
    },
}

impl Error {
    /// The field (or flag) this error is about, when there is one.
    pub fn field(&self) -> Option<&str> {
        match self {
            Error::Io { field, .. }
            | Error::UnknownField { field, .. }
            | Error::InvalidValue { field, .. } => Some(field),
            Error::OutOfRange { field, .. }
            | Error::StepsNotInteger { field, .. }
            | Error::Requires { field, .. }
            | Error::AliasConflict { field, .. } => Some(field),
            Error::MutuallyExclusive { first, .. } => Some(first),
            Error::SaveStepsNotMultiple { .. } => Some("save_steps"),
            Error::UnsupportedOptimizer { .. } => Some("optim"),
            Error::MissingValue { flag, .. } | Error::UnexpectedValue { flag, .. } => Some(flag),
            Error::AmbiguousOption { arg, .. } => Some(arg),
            Error::UnknownArgument { args, .. } => args.first().map(String::as_str),
            Error::MissingRequired { flags } => flags.first().map(String::as_str),
            Error::ConflictingOption { flag, .. } => Some(flag),
            Error::Json(_) | Error::UnknownVariant { .. } | Error::HelpRequested(_) => None,
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

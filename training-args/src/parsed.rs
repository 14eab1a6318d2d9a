//! `ParsedArguments` and `ParsedSeq2SeqArguments` (what the JSON and command-line readers
//! return) and `Warning` (deprecations and other non-fatal notices, returned instead of printed).

use crate::seq2seq::Seq2SeqTrainingArguments;
use crate::training_args::TrainingArguments;

/// A non-fatal notice produced while reading or finalising arguments: a deprecated v4 name, a
/// legacy `fsdp` string, a setting that has no effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// The field (or deprecated name) the notice is about.
    pub field: String,
    /// The notice, in upstream's words where upstream has them.
    pub message: String,
}

impl Warning {
    pub(crate) fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Arguments read from JSON or a command line, validated by `post_init`, with the warnings met
/// on the way.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedArguments {
    /// The validated arguments.
    pub args: TrainingArguments,
    /// Deprecations and other notices, in the order they arose.
    pub warnings: Vec<Warning>,
    /// The value of the v4 `logging_dir`, if one was given. Upstream 5.x dropped the field: its
    /// TensorBoard callback reads `TENSORBOARD_LOGGING_DIR` instead, so a logger may honour this.
    pub logging_dir: Option<String>,
}

impl ParsedArguments {
    /// The warnings met while reading and validating.
    pub fn warnings(&self) -> &[Warning] {
        &self.warnings
    }

    /// The arguments, dropping the warnings.
    pub fn into_args(self) -> TrainingArguments {
        self.args
    }
}

/// [`ParsedArguments`] for `Seq2SeqTrainingArguments`: what its JSON and command-line readers
/// return.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedSeq2SeqArguments {
    /// The validated arguments.
    pub args: Seq2SeqTrainingArguments,
    /// Deprecations and other notices, in the order they arose.
    pub warnings: Vec<Warning>,
    /// The value of the v4 `logging_dir`, if one was given (see [`ParsedArguments::logging_dir`]).
    pub logging_dir: Option<String>,
}

impl ParsedSeq2SeqArguments {
    /// The warnings met while reading and validating.
    pub fn warnings(&self) -> &[Warning] {
        &self.warnings
    }

    /// The arguments, dropping the warnings.
    pub fn into_args(self) -> Seq2SeqTrainingArguments {
        self.args
    }
}

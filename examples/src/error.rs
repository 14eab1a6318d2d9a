//! The error type of the example scripts: the lower crates' errors, plus the scripts' own
//! (a bad flag, a bad label, a data file a script parses itself).

use std::path::PathBuf;

/// Errors returned by the example scripts.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An error raised by libtorch.
    #[error(transparent)]
    Torch(#[from] tch::TchError),
    /// An error from the Trainer.
    #[error(transparent)]
    Trainer(#[from] tchtrain_trainer::Error),
    /// An error from TRL's trainers (SFT).
    #[error(transparent)]
    Trl(#[from] tchtrain_trl::Error),
    /// An error from the accelerator (a hand-written loop's step, a collective).
    #[error(transparent)]
    Accelerate(#[from] tchtrain_accelerate::Error),
    /// An error from an optimizer built by the script.
    #[error(transparent)]
    Optim(#[from] tchtrain_optim::Error),
    /// An error from the data loader or a dataset.
    #[error(transparent)]
    Data(#[from] tchtrain_data::Error),
    /// An error reading or preparing data files.
    #[error(transparent)]
    Datasets(#[from] tchtrain_datasets::Error),
    /// An error from the model crate (loading, saving, tokenizers).
    #[error(transparent)]
    Model(#[from] tchtrain_models::Error),
    /// An error from a data collator.
    #[error(transparent)]
    Collator(#[from] tchtrain_collators::Error),
    /// An error from the training arguments (parsing, validation; `--help`).
    #[error(transparent)]
    TrainingArgs(#[from] tchtrain_training_args::Error),
    /// An error from the trainer state (reading `trainer_state.json`).
    #[error(transparent)]
    Callbacks(#[from] tchtrain_callbacks::Error),
    /// Reading or writing a file failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done (`"reading"`, `"writing"`, ...).
        action: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A JSON file could not be parsed or written.
    #[error("JSON in {}: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: serde_json::Error,
    },
    /// A data file the script reads itself could not be parsed.
    #[error("{}:{line}: {detail}", path.display())]
    DataFile {
        /// The file.
        path: PathBuf,
        /// The 1-based line where the problem is.
        line: usize,
        /// What is wrong.
        detail: String,
    },
    /// The tokenizer failed on some text.
    #[error("tokenizing {what}: {detail}")]
    Tokenizer {
        /// Which text (file and line).
        what: String,
        /// The tokenizer's message.
        detail: String,
    },
    /// A dataset has no rows where some are needed.
    #[error("the {what} dataset is empty{hint}")]
    EmptyDataset {
        /// Which dataset (`"training"`, `"evaluation"`).
        what: &'static str,
        /// How to fix it (may be empty).
        hint: String,
    },
    /// A command-line flag of a script is unknown or has a bad value (the binaries print it
    /// with a usage line and exit 2, as argparse does).
    #[error("argument --{flag}: {detail}")]
    InvalidFlag {
        /// The flag, without its dashes.
        flag: String,
        /// What is wrong and how to fix it.
        detail: String,
    },
    /// An argument of a library function is out of its range.
    #[error("invalid `{field}`: {detail}")]
    InvalidArgument {
        /// The argument.
        field: &'static str,
        /// What is wrong and how to fix it.
        detail: String,
    },
    /// A label value that cannot be used (not in the label list, not a number for
    /// regression).
    #[error("label '{label}' in row {row}: {detail}")]
    InvalidLabel {
        /// The value found.
        label: String,
        /// The 0-based row.
        row: usize,
        /// What is wrong and how to fix it.
        detail: String,
    },
}

impl Error {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source,
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

//! The error type of `tchtrain-trl`.

/// Errors returned by `tchtrain-trl`; each names the field, dataset column or row at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A config field or argument has a value the trainer cannot use.
    #[error("invalid `{field}`: {detail}")]
    InvalidArgument {
        /// The field or argument.
        field: &'static str,
        /// What is wrong and what to use instead.
        detail: String,
    },
    /// A dataset row cannot be prepared.
    #[error("{dataset} dataset, row {row}: {detail}")]
    Dataset {
        /// `train` or `eval`.
        dataset: String,
        /// The row's index.
        row: usize,
        /// What is wrong and what to do.
        detail: String,
    },
    /// An error of the Trainer.
    #[error(transparent)]
    Trainer(#[from] tchtrain_trainer::Error),
    /// An error of the models crate (tokenizer, chat template, forward).
    #[error(transparent)]
    Models(#[from] tchtrain_models::Error),
    /// An error of the datasets crate (packing, tables).
    #[error(transparent)]
    Datasets(#[from] tchtrain_datasets::Error),
    /// An error of the accelerator (collectives, autocast).
    #[error(transparent)]
    Accelerate(#[from] tchtrain_accelerate::Error),
    /// An error of the training arguments.
    #[error(transparent)]
    TrainingArgs(#[from] tchtrain_training_args::Error),
    /// An error raised by libtorch.
    #[error(transparent)]
    Torch(#[from] tch::TchError),
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

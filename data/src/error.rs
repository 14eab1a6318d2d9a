//! The error type of `tchtrain-data`.

/// Errors returned by `tchtrain-data`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An error raised by libtorch.
    #[error(transparent)]
    Torch(#[from] tch::TchError),
    /// A data collator failed on a batch.
    #[error(transparent)]
    Collator(#[from] tchtrain_collators::Error),
    /// Reading or preparing rows failed (a data file, the tokenizer).
    #[error(transparent)]
    Datasets(#[from] tchtrain_datasets::Error),
    /// A row index past the end of a dataset.
    #[error("row {index} is out of range for a dataset of {len} rows")]
    IndexOutOfRange {
        /// The index asked for.
        index: usize,
        /// The dataset's length.
        len: usize,
    },
    /// An argument is out of its range.
    #[error("invalid `{field}`: {detail}")]
    InvalidArgument {
        /// The argument.
        field: &'static str,
        /// What is wrong and how to fix it.
        detail: String,
    },
    /// The data loader's prefetch thread could not be started.
    #[error(
        "starting the data loader's prefetch thread failed ({0}): set dataloader_num_workers to 0 to load batches in the training thread"
    )]
    Prefetch(String),
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

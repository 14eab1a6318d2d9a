//! The error type of `tchtrain-datasets`: one typed variant per failure, each naming the
//! file, line, column or argument and how to fix it.

use std::path::PathBuf;

/// Errors returned by `tchtrain-datasets`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading a file failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done (`"reading"`, ...).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A data file (CSV, JSON lines, text) could not be parsed.
    #[error("{}:{line}: {detail}", path.display())]
    DataFile {
        /// The file.
        path: PathBuf,
        /// The 1-based line where the problem is.
        line: usize,
        /// What is wrong.
        detail: String,
    },
    /// A column asked for is not in a data file.
    #[error("column '{column}' is not in {}; its columns are: {available}", path.display())]
    MissingColumn {
        /// The column asked for.
        column: String,
        /// The data file.
        path: PathBuf,
        /// The columns there are.
        available: String,
    },
    /// A row index past the end of a table.
    #[error("row {index} is out of range for a table of {len} rows")]
    IndexOutOfRange {
        /// The index asked for.
        index: usize,
        /// The number of rows.
        len: usize,
    },
    /// The tokenizer failed on some text.
    #[error("tokenizing {what}: {detail}")]
    Tokenizer {
        /// Which text (file and line).
        what: String,
        /// The tokenizer's message.
        detail: String,
    },
    /// Data preparation produced no rows where some are needed.
    #[error("the {what} dataset is empty{hint}")]
    EmptyDataset {
        /// Which dataset (`"training"`, `"evaluation"`).
        what: &'static str,
        /// How to fix it (may be empty).
        hint: String,
    },
    /// An argument of a data function is out of its range.
    #[error("invalid `{field}`: {detail}")]
    InvalidArgument {
        /// The argument.
        field: &'static str,
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

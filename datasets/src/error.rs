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
    /// An image (an `Image` cell or file) could not be decoded.
    #[error("decoding the image {what}: {detail}")]
    Image {
        /// Which image (file, or dataset row).
        what: String,
        /// What is wrong and the fix.
        detail: String,
    },
    /// An audio clip (an `Audio` cell or file) could not be decoded.
    #[error("decoding the audio {what}: {detail}")]
    Audio {
        /// Which clip (file, or dataset row).
        what: String,
        /// What is wrong and the fix.
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
    /// Data preparation produced no rows where some are needed.
    #[error("the {what} dataset is empty{hint}")]
    EmptyDataset {
        /// Which dataset (`"training"`, `"evaluation"`).
        what: &'static str,
        /// How to fix it (may be empty).
        hint: String,
    },
    /// A file is not in the format it is read as (a `.parquet` file that is not Parquet, an
    /// `.arrow` file that is neither an Arrow IPC stream nor an Arrow IPC file).
    #[error("{}: not in the {format} format: {detail}", path.display())]
    NotFormat {
        /// The file.
        path: PathBuf,
        /// The format it was read as: `"Parquet"` or `"Arrow IPC"`.
        format: &'static str,
        /// What gave it away.
        detail: String,
    },
    /// A file in the right format ends before its data does (a copy or download cut short).
    #[error("{}: the {format} file is truncated: {detail}", path.display())]
    Truncated {
        /// The file.
        path: PathBuf,
        /// `"Parquet"` or `"Arrow IPC"`.
        format: &'static str,
        /// What is missing.
        detail: String,
    },
    /// A Parquet or Arrow file whose content cannot be decoded (the decoder's message).
    #[error("{}: the {format} file is corrupt: {detail}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// `"Parquet"` or `"Arrow IPC"`.
        format: &'static str,
        /// The decoder's message.
        detail: String,
    },
    /// A column whose Arrow type has no cell here (cells are JSON values: null, booleans,
    /// numbers, strings, lists and objects).
    #[error(
        "{}: column '{column}' has the Arrow type {data_type}, which has no cell type here \
         (supported: null, bool, integers, floats, strings, lists, fixed-size lists, structs \
         and dictionaries of these); select the other columns or cast it in Python first",
        path.display()
    )]
    UnsupportedType {
        /// The file.
        path: PathBuf,
        /// The column.
        column: String,
        /// The column's Arrow type (or the part of it that is unsupported).
        data_type: String,
    },
    /// A cell that is not what its use needs (a null or a number in the text column).
    #[error("{}: row {row} of column '{column}': {detail}", path.display())]
    InvalidCell {
        /// The file.
        path: PathBuf,
        /// The column.
        column: String,
        /// The 0-based row in the file.
        row: usize,
        /// What is wrong.
        detail: String,
    },
    /// A folder that `load_from_disk` cannot read as `save_to_disk` writes them.
    #[error("{}: {detail}", path.display())]
    InvalidSavedDataset {
        /// The folder (or the file in it that is wrong).
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A split asked for is not in a `DatasetDict`.
    #[error("split '{split}' is not in {}; its splits are: {available}", path.display())]
    MissingSplit {
        /// The split asked for.
        split: String,
        /// The `DatasetDict` folder.
        path: PathBuf,
        /// The splits there are.
        available: String,
    },
    /// An argument of a data function is out of its range.
    #[error("invalid `{field}`: {detail}")]
    InvalidArgument {
        /// The argument.
        field: &'static str,
        /// What is wrong and how to fix it.
        detail: String,
    },
    /// The hub could not give a dataset's files (offline and not cached, unreachable, an
    /// unexpected answer).
    #[error(transparent)]
    Hub(Box<tchtrain_hub::Error>),
    /// A hub dataset, or its revision, does not exist or cannot be accessed (upstream's
    /// `DatasetNotFoundError`).
    #[error("{message}")]
    DatasetNotFound {
        /// Upstream's message (`Dataset 'org/name' doesn't exist on the Hub or cannot be accessed.`).
        message: String,
        /// The hub's answer.
        #[source]
        source: Box<tchtrain_hub::Error>,
    },
    /// No data files where a dataset should have them (upstream's `DataFilesNotFoundError`,
    /// `EmptyDatasetError`, `FileNotFoundError`).
    #[error("{detail}")]
    DataFilesNotFound {
        /// Upstream's message, naming the folder, repository or pattern.
        detail: String,
    },
    /// Data files whose format is not read here, or differs between splits.
    #[error("{detail}")]
    DataFileFormat {
        /// Upstream's message, or which loader the files need.
        detail: String,
    },
    /// A split name that `datasets` refuses (`^\w+(\.\w+)*$`).
    #[error("Split name should match '^\\w+(\\.\\w+)*$' but got '{split}'.")]
    InvalidSplitName {
        /// The name.
        split: String,
    },
    /// The `configs:` of a dataset card (README.md YAML) cannot be used.
    #[error("{card}: {detail}")]
    InvalidMetadata {
        /// The card (`org/name/README.md`).
        card: String,
        /// What is wrong (upstream's message where it has one).
        detail: String,
    },
    /// A dataset with several configurations and none chosen (upstream's message).
    #[error(
        "Config name is missing.\nPlease pick one among the available configs: {}\nExample of usage:\n\t`load_dataset('{dataset}', '{}')`",
        python_list(available),
        available.first().map(String::as_str).unwrap_or_default()
    )]
    ConfigNameMissing {
        /// The dataset.
        dataset: String,
        /// Its configurations.
        available: Vec<String>,
    },
    /// A configuration the dataset does not have (upstream's message).
    #[error(
        "BuilderConfig '{name}' not found. Available: {}",
        python_list(available)
    )]
    ConfigNotFound {
        /// The name asked for.
        name: String,
        /// The configurations there are.
        available: Vec<String>,
    },
    /// A dataset that is a loading script (upstream's message), with no Parquet export to
    /// load instead.
    #[error(
        "Dataset scripts are no longer supported, but found {filename}{}",
        if *parquet_export_tried { " (and the repository has no refs/convert/parquet export to load instead)" } else { "" }
    )]
    DatasetScripts {
        /// The script (`name.py`).
        filename: String,
        /// Whether the hub's Parquet export was looked for.
        parquet_export_tried: bool,
    },
}

impl From<tchtrain_hub::Error> for Error {
    fn from(e: tchtrain_hub::Error) -> Self {
        Self::Hub(Box::new(e))
    }
}

/// A list of names as Python prints it: `['a', 'b']`.
fn python_list(names: &[String]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("'{n}'")).collect();
    format!("[{}]", quoted.join(", "))
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

/// Runs a decoder of outside bytes (the `parquet` and `arrow-ipc` crates) and turns a panic
/// of it into [`Error::Corrupt`]: those crates validate their input but have panicked on some
/// malformed files (an index out of bounds, an arithmetic overflow, a failed assertion), and
/// a library must not panic on bad input. Nothing of the decoder is used after a panic: `f`
/// owns or borrows only what it decodes, and the caller drops it with the error.
pub(crate) fn catch_decoder_panic<T>(
    path: &std::path::Path,
    format: &'static str,
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        Err(Error::Corrupt {
            path: path.to_path_buf(),
            format,
            detail: format!("the {format} decoder failed on it ({message})"),
        })
    })
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

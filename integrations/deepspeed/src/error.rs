//! The error type of `tchtrain-deepspeed`.

use std::path::PathBuf;

/// Errors returned by `tchtrain-deepspeed`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Upstream's mismatch error: the config disagrees with `TrainingArguments`.
    #[error("Please correct the following DeepSpeed config values that mismatch TrainingArguments values:\n{}\nThe easiest method is to set these DeepSpeed config values to 'auto'.", lines.join("\n"))]
    Mismatch {
        /// One `- ds KEY=VAL vs hf KEY=VAL` line per conflict.
        lines: Vec<String>,
    },
    /// `"auto"` bucket sizes need the model's hidden size.
    #[error(
        "The model's config file has neither `hidden_size` nor `hidden_sizes` entry, therefore it's not possible to automatically fill out the following `auto` entries in the DeepSpeed config file: [{}]. You can fix that by replacing `auto` values for these keys with an integer value of your choice.",
        keys.iter().map(|k| format!("'{k}'")).collect::<Vec<_>>().join(", ")
    )]
    NoHiddenSize {
        /// The `auto` keys.
        keys: Vec<String>,
    },
    /// A config value is unusable.
    #[error("DeepSpeed config `{key}` = {value}: {fix}")]
    InvalidConfig {
        /// The dotted key.
        key: String,
        /// The value.
        value: String,
        /// What to do.
        fix: &'static str,
    },
    /// A key or value this build does not implement: which, why, and what to use instead.
    #[error("DeepSpeed config `{key}`: {why}")]
    NotSupported {
        /// The dotted key.
        key: String,
        /// Why, and what to use instead.
        why: String,
    },
    /// `--fp16` / `--bf16` against a config enabling the other dtype (accelerate's
    /// `DeepSpeedPlugin.set_mixed_precision`).
    #[error(
        "`--mixed_precision` arg cannot be set to `{mixed_precision}` when `{other}` is set in the DeepSpeed config file. (accelerate's message: pass the flag of the dtype the config enables, or disable its section)"
    )]
    MixedPrecisionConflict {
        /// `fp16` or `bf16`.
        mixed_precision: String,
        /// The section that is enabled.
        other: &'static str,
    },
    /// A combination upstream rejects.
    #[error("{what}")]
    Unsupported {
        /// Upstream's message.
        what: &'static str,
    },
    /// The config file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The config is not valid JSON.
    #[error("{what}: invalid JSON: {source}")]
    Json {
        /// The file or flag.
        what: String,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// A ZeRO checkpoint that cannot be read or does not fit this model / world.
    #[error("ZeRO checkpoint {}: {detail}", path.display())]
    Checkpoint {
        /// The file or folder.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The ZeRO engine refused (a layout or stage that does not fit).
    #[error(transparent)]
    Accelerate(#[from] tchtrain_accelerate::Error),
    /// A collective failed.
    #[error(transparent)]
    Distributed(#[from] tchtrain_distributed::Error),
    /// The optimizer refused the shards or their state.
    #[error(transparent)]
    Optim(#[from] tchtrain_optim::Error),
    /// An error raised by libtorch.
    #[error(transparent)]
    Torch(#[from] tch::TchError),
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

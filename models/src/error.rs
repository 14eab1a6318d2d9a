//! The error type of `tchtrain-models`.

use std::path::PathBuf;

/// Errors returned by `tchtrain-models`; each names the file, field or input at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A forward pass needs an input that was not given.
    #[error("missing model input `{name}`")]
    MissingInput {
        /// The input's name (`input_ids`, ...).
        name: &'static str,
    },
    /// An input tensor is unusable (shape, dtype or value range).
    #[error("invalid model input `{name}`: {detail}")]
    InvalidInput {
        /// The input's name.
        name: &'static str,
        /// What is wrong and what was expected.
        detail: String,
    },
    /// An argument (e.g. `activation_checkpointing_kwargs`) has a value this crate cannot use.
    #[error("invalid `{field}`: {detail}")]
    InvalidArgument {
        /// The argument.
        field: &'static str,
        /// What is wrong and what to use instead.
        detail: String,
    },
    /// A config field has a value this crate cannot use.
    #[error("config field `{field}` = {value}: {fix}")]
    InvalidConfig {
        /// The config.json key.
        field: &'static str,
        /// The offending value.
        value: String,
        /// What to do.
        fix: &'static str,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A JSON file (config.json, index) is malformed or has wrong types.
    #[error(
        "{path}: invalid JSON: {source}; the file is damaged or is not this kind of file: copy it again from the model's source, or write it again with save_pretrained"
    )]
    ConfigJson {
        /// The file.
        path: PathBuf,
        /// The parser's error (names the line and column).
        #[source]
        source: serde_json::Error,
    },
    /// A required file is missing.
    #[error("{path} is missing: {fix}")]
    MissingFile {
        /// The file that was looked for.
        path: PathBuf,
        /// What to do.
        fix: &'static str,
    },
    /// A safetensors checkpoint could not be read (truncated, corrupt).
    #[error(
        "{path}: cannot read checkpoint ({source}); the file may be truncated or corrupt: re-download or re-save it"
    )]
    Checkpoint {
        /// The checkpoint file.
        path: PathBuf,
        /// libtorch's error.
        #[source]
        source: tch::TchError,
    },
    /// A checkpoint whose base model sits under another attribute than the class's
    /// `base_model_prefix` (a causal LM's `model.` body for Qwen2's question answering,
    /// whose body is `transformer.`).
    #[error(
        "{path}: {class} keeps its base model under `{expected}.` (upstream's base_model_prefix) but this checkpoint's is under `{found}.`; upstream's from_pretrained would load none of it and draw every body weight anew (with only a warning). Start from a {class} checkpoint, or rename the checkpoint's `{found}.` keys to `{expected}.`"
    )]
    BaseModelPrefix {
        /// The checkpoint folder.
        path: PathBuf,
        /// The class being loaded.
        class: &'static str,
        /// Its `base_model_prefix`.
        expected: &'static str,
        /// Where the checkpoint's body is.
        found: &'static str,
    },
    /// A safetensors file could not be written.
    #[error("{path}: cannot write safetensors: {source}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// The safetensors error.
        #[source]
        source: safetensors::SafeTensorError,
    },
    /// Checkpoint shapes differ from the model's (upstream raises the same unless
    /// `ignore_mismatched_sizes=True`).
    #[error("checkpoint shapes do not match the model: {}; pass ignore_mismatched_sizes to re-initialise them", keys.join(", "))]
    MismatchedSizes {
        /// `key: checkpoint [..] vs model [..]` lines.
        keys: Vec<String>,
    },
    /// A tensor dtype safetensors cannot store.
    #[error("dtype {kind} cannot be saved as safetensors")]
    UnsupportedDtype {
        /// The libtorch kind.
        kind: String,
    },
    /// The config names an architecture this crate does not implement.
    #[error("unsupported architecture `{name}`: supported are {supported}")]
    UnsupportedArchitecture {
        /// The `model_type` or class name.
        name: String,
        /// The supported names.
        supported: &'static str,
    },
    /// A model could not be resolved to a local folder (local path, HF cache, download).
    #[error("cannot resolve model `{name}`: {detail}")]
    Resolve {
        /// The name or path given.
        name: String,
        /// Where it was looked for and why it failed.
        detail: String,
    },
    /// A tokenizer file could not be loaded.
    #[error("{path}: cannot load tokenizer: {detail}")]
    Tokenizer {
        /// The tokenizer file.
        path: PathBuf,
        /// The tokenizers crate's message.
        detail: String,
    },
    /// A chat template could not be found, compiled or rendered, or its inputs are unusable
    /// (upstream's `ValueError` / `TemplateError` of `apply_chat_template`).
    #[error("chat template: {detail}")]
    ChatTemplate {
        /// What went wrong, and the fix.
        detail: String,
    },
    /// A layer hook ([`LayerHooks`](crate::LayerHooks)) failed.
    #[error("layer {layer}: {detail}")]
    LayerHook {
        /// The layer's index.
        layer: usize,
        /// The hook's message.
        detail: String,
    },
    /// `debug="underflow_overflow"`: [`DebugUnderflowOverflow`](crate::DebugUnderflowOverflow)
    /// found an inf / nan (its report of the frames before it is printed), or reached
    /// `abort_after_batch_num`; upstream's `ValueError` message.
    #[error("{0}")]
    DebugUnderflowOverflow(String),
    /// The forward computed the loss without materialising the logits.
    #[error(
        "the logits were not computed: with use_liger_kernel the fused linear cross-entropy computes the training loss (and the evaluation loss with prediction_loss_only) chunk by chunk without them; set liger_kernel_config's fused_linear_cross_entropy to false to get them"
    )]
    LogitsSkipped,
    /// An output does not have the shape its reader needs.
    #[error("the {what} have shape {got:?}; expected {expected}")]
    OutputShape {
        /// Which output.
        what: &'static str,
        /// The shape wanted.
        expected: &'static str,
        /// The shape found.
        got: Vec<i64>,
    },
    /// The loss could not be computed.
    #[error(transparent)]
    Loss(#[from] tchtrain_losses::Error),
    /// An error raised by libtorch.
    #[error(transparent)]
    Torch(#[from] tch::TchError),
}

impl From<tchtrain_nn::Error> for Error {
    fn from(e: tchtrain_nn::Error) -> Self {
        match e {
            tchtrain_nn::Error::InvalidConfig { field, value, fix } => {
                Self::InvalidConfig { field, value, fix }
            }
            tchtrain_nn::Error::InvalidArgument { field, detail } => {
                Self::InvalidArgument { field, detail }
            }
            tchtrain_nn::Error::LayerHook { layer, detail } => Self::LayerHook { layer, detail },
            tchtrain_nn::Error::DebugUnderflowOverflow(m) => Self::DebugUnderflowOverflow(m),
            tchtrain_nn::Error::Torch(e) => Self::Torch(e),
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

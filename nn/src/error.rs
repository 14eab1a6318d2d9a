//! The error type of `tchtrain-nn`.

/// Errors returned by `tchtrain-nn`; each names the field, layer or hook at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A config field has a value a part cannot use.
    #[error("config field `{field}` = {value}: {fix}")]
    InvalidConfig {
        /// The config.json key.
        field: &'static str,
        /// The offending value.
        value: String,
        /// What to do.
        fix: &'static str,
    },
    /// An argument has a value a part cannot use.
    #[error("invalid `{field}`: {detail}")]
    InvalidArgument {
        /// The argument.
        field: &'static str,
        /// What is wrong and what to use instead.
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
    /// [`DebugUnderflowOverflow`](crate::DebugUnderflowOverflow) found an inf / nan or
    /// reached `abort_after_batch_num`; upstream's `ValueError` message.
    #[error("{0}")]
    DebugUnderflowOverflow(String),
    /// An error raised by libtorch.
    #[error(transparent)]
    Torch(#[from] tch::TchError),
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

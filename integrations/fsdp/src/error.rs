//! The error type of `tchtrain-fsdp`.

/// Errors returned by `tchtrain-fsdp`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An `fsdp_config` value is unusable.
    #[error("fsdp_config `{key}` = {value}: {fix}")]
    InvalidConfig {
        /// The key.
        key: &'static str,
        /// The value.
        value: String,
        /// What to do.
        fix: &'static str,
    },
    /// A combination upstream rejects, with upstream's message.
    #[error("{0}")]
    Upstream(String),
    /// An error raised by libtorch.
    #[error(transparent)]
    Torch(#[from] tch::TchError),
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

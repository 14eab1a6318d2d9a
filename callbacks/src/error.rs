//! The error type of `tchtrain-callbacks`.

/// Errors returned by `tchtrain-callbacks`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A JSON document could not be read or written.
    #[error("JSON error: {0}")]
    Json(#[from] serde_json::Error),
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

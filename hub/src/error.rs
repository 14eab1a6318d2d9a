//! The error type of `tchtrain-hub`: huggingface_hub's error classes
//! (`RepositoryNotFoundError`, `RevisionNotFoundError`, `EntryNotFoundError`,
//! `GatedRepoError`, `LocalEntryNotFoundError`, ...) as typed variants, each naming the
//! repository and what to do.

use std::path::PathBuf;

use crate::RepoType;

/// Errors returned by `tchtrain-hub`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Offline mode is on (or the hub cannot be reached) and the cache does not hold what
    /// was asked for (`LocalEntryNotFoundError`).
    #[error(
        "{repo_type} repository '{repo_id}' at revision '{revision}'{} is not cached in {} and offline mode is enabled (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE): download it once with the network on, or unset the variable",
        file.as_ref().map(|f| format!(", file '{f}',")).unwrap_or_default(),
        cache_dir.display()
    )]
    NotCached {
        /// The repository id (`org/name`).
        repo_id: String,
        /// Model, dataset or space.
        repo_type: RepoType,
        /// The branch, tag or commit asked for.
        revision: String,
        /// The file, when one file was asked for.
        file: Option<String>,
        /// The hub cache searched.
        cache_dir: PathBuf,
    },
    /// The repository does not exist, or is private and the token cannot see it
    /// (`RepositoryNotFoundError`; the hub answers 401 for both).
    #[error(
        "{repo_type} repository '{repo_id}' not found at {url} (HTTP {status}): check the id and the repository type; for a private or gated repository set HF_TOKEN or run `huggingface-cli login`"
    )]
    RepositoryNotFound {
        /// The repository id.
        repo_id: String,
        /// Model, dataset or space.
        repo_type: RepoType,
        /// The URL asked.
        url: String,
        /// The HTTP status.
        status: u16,
    },
    /// The repository is gated and the token has not been granted access (`GatedRepoError`).
    #[error(
        "{repo_type} repository '{repo_id}' is gated (HTTP {status} for {url}): ask for access on its page and use a token that has it (HF_TOKEN)"
    )]
    GatedRepo {
        /// The repository id.
        repo_id: String,
        /// Model, dataset or space.
        repo_type: RepoType,
        /// The URL asked.
        url: String,
        /// The HTTP status.
        status: u16,
    },
    /// The branch, tag or commit does not exist (`RevisionNotFoundError`).
    #[error("revision '{revision}' does not exist in {repo_type} repository '{repo_id}' ({url})")]
    RevisionNotFound {
        /// The repository id.
        repo_id: String,
        /// Model, dataset or space.
        repo_type: RepoType,
        /// The revision asked for.
        revision: String,
        /// The URL asked.
        url: String,
    },
    /// The file is not in the repository at that revision (`EntryNotFoundError`).
    #[error(
        "file '{file}' is not in {repo_type} repository '{repo_id}' at revision '{revision}' ({url})"
    )]
    EntryNotFound {
        /// The repository id.
        repo_id: String,
        /// Model, dataset or space.
        repo_type: RepoType,
        /// The revision asked for.
        revision: String,
        /// The file asked for.
        file: String,
        /// The URL asked.
        url: String,
    },
    /// Any other HTTP error status (`HfHubHTTPError`).
    #[error("HTTP {status} from {url}: {detail}")]
    Http {
        /// The URL asked.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The hub's `X-Error-Message`, else the start of the body.
        detail: String,
    },
    /// The hub could not be reached (DNS, refused connection, TLS, timeout).
    #[error(
        "could not reach {url}: {detail}; check the network and HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to use the cache"
    )]
    Connection {
        /// The URL asked.
        url: String,
        /// The transport error.
        detail: String,
    },
    /// The hub answered with something that is not what the API documents (bad JSON,
    /// missing fields or headers).
    #[error("unexpected answer from {url}: {detail}")]
    InvalidResponse {
        /// The URL asked.
        url: String,
        /// What is wrong with it.
        detail: String,
    },
    /// A download failed after the request succeeded (hf-hub's own errors: a lock, a part
    /// file, an I/O error in the cache).
    #[error("downloading '{file}' of {repo_type} repository '{repo_id}': {detail}")]
    Download {
        /// The repository id.
        repo_id: String,
        /// Model, dataset or space.
        repo_type: RepoType,
        /// The file.
        file: String,
        /// What went wrong.
        detail: String,
    },
    /// A repository id that the hub cannot have (`validate_repo_id`).
    #[error(
        "'{repo_id}' is not a valid repository id: use 'name' or 'org/name' (letters, digits, '-', '_', '.'; no '--' or '..')"
    )]
    InvalidRepoId {
        /// The id given.
        repo_id: String,
    },
    /// Reading or writing the cache failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done (`"creating"`, `"writing"`, ...).
        action: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Whether the hub could not be reached at all (as opposed to answering "no"): callers
    /// that mirror upstream fall back to the cache then.
    pub fn is_connection(&self) -> bool {
        matches!(self, Self::Connection { .. })
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

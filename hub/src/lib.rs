//! `tchtrain-hub` — the parts of `huggingface_hub` the tchtrain crates share, without
//! libtorch: where the hub cache is and how to reach the hub ([`HubOptions`], read from the
//! environment as `huggingface_hub.constants` reads it: `HF_HOME`, `HF_HUB_CACHE`,
//! `HF_ENDPOINT`, `HF_TOKEN` / the login file, `HF_HUB_OFFLINE`,
//! `HF_HUB_DISABLE_PROGRESS_BARS`), the cache layout Python uses
//! (`models--org--name` / `datasets--org--name`, `refs/<revision>`,
//! `snapshots/<commit>/<path>`), a repository's files at a revision ([`repo_info`]) and one
//! file downloaded into the cache ([`hf_hub_download`], through the `hf-hub` crate), with
//! offline mode answered from the cache. Python's `huggingface_hub` and this crate find each
//! other's downloads.
//!
//! Mirrors `huggingface_hub` (`constants.py`, `file_download.py`, `hf_api.py`,
//! `utils/_http.py`); names follow upstream.
//!
//! ```no_run
//! use tchtrain_hub::{HubOptions, RepoType, hf_hub_download, repo_info};
//! let options = HubOptions::from_env();
//! let info = repo_info("stanfordnlp/imdb", RepoType::Dataset, "main", &options)?;
//! let readme = hf_hub_download("stanfordnlp/imdb", "README.md", RepoType::Dataset, &info.sha, &options)?;
//! println!("{} files at {}; README at {}", info.siblings.len(), info.sha, readme.display());
//! # Ok::<(), tchtrain_hub::Error>(())
//! ```

mod constants;
mod error;
mod file_download;
mod hf_api;
mod upload;

pub use constants::{DEFAULT_ENDPOINT, HubOptions, is_true};
pub use error::{Error, Result};
pub use file_download::{
    RepoType, cached_commit_hash, hf_hub_download, is_commit_hash, is_valid_repo_id,
    repo_cache_dir, repo_folder_name, try_to_load_from_cache,
};
pub use hf_api::{RepoInfo, cached_repo_info, repo_info};
pub use upload::{CommitInfo, UploadFolder, create_repo, fnmatch, upload_folder};

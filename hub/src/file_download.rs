//! The hub cache shared with Python (`huggingface_hub/file_download.py`): the folder of a
//! repository (`models--org--name`, `datasets--org--name`), `refs/<revision>` holding the
//! commit a branch or tag pointed to, `snapshots/<commit>/<path>` linking into `blobs/`,
//! looking a file up there ([`try_to_load_from_cache`]) and downloading one file into it
//! ([`hf_hub_download`], through the `hf-hub` crate, which writes the same layout).

use std::fmt;
use std::path::{Component, Path, PathBuf};

use crate::hf_api::{build_api, map_api_error};
use crate::{Error, HubOptions, Result};

/// The kind of a hub repository (`repo_type=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RepoType {
    /// A model repository (the default).
    Model,
    /// A dataset repository.
    Dataset,
    /// A Space.
    Space,
}

impl RepoType {
    /// Upstream's name: `model`, `dataset`, `space`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Model => "model",
            Self::Dataset => "dataset",
            Self::Space => "space",
        }
    }

    /// The plural used in cache folder names and API paths (`models`, `datasets`, `spaces`).
    pub fn plural(self) -> &'static str {
        match self {
            Self::Model => "models",
            Self::Dataset => "datasets",
            Self::Space => "spaces",
        }
    }

    /// The prefix of the repository in `resolve/` URLs (`REPO_TYPES_URL_PREFIXES`): none
    /// for models, `datasets/`, `spaces/`.
    pub fn url_prefix(self) -> &'static str {
        match self {
            Self::Model => "",
            Self::Dataset => "datasets/",
            Self::Space => "spaces/",
        }
    }

    pub(crate) fn to_hf_hub(self) -> hf_hub::RepoType {
        match self {
            Self::Model => hf_hub::RepoType::Model,
            Self::Dataset => hf_hub::RepoType::Dataset,
            Self::Space => hf_hub::RepoType::Space,
        }
    }
}

impl fmt::Display for RepoType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The cache folder name of a repository (`repo_folder_name`): `datasets--org--name`.
pub fn repo_folder_name(repo_id: &str, repo_type: RepoType) -> String {
    format!("{}--{}", repo_type.plural(), repo_id.replace('/', "--"))
}

/// The cache folder of a repository: `cache_dir/<repo_folder_name>`.
pub fn repo_cache_dir(cache_dir: &Path, repo_id: &str, repo_type: RepoType) -> PathBuf {
    cache_dir.join(repo_folder_name(repo_id, repo_type))
}

/// Whether `repo_id` is one the hub can have (huggingface_hub's `validate_repo_id`): `name`
/// or `org/name`, each part of letters, digits, `-`, `_`, `.`, starting and ending with a
/// letter or digit (or `_`), no `--` or `..`, at most 96 characters.
pub fn is_valid_repo_id(repo_id: &str) -> bool {
    let parts: Vec<&str> = repo_id.split('/').collect();
    let word = |c: char| c.is_alphanumeric() || c == '_';
    repo_id.len() <= 96
        && parts.len() <= 2
        && !repo_id.contains("--")
        && !repo_id.contains("..")
        && parts.iter().all(|p| {
            p.chars().all(|c| word(c) || c == '-' || c == '.')
                && p.chars().next().is_some_and(word)
                && p.chars().next_back().is_some_and(word)
        })
}

pub(crate) fn validate_repo_id(repo_id: &str) -> Result<()> {
    if is_valid_repo_id(repo_id) {
        Ok(())
    } else {
        Err(Error::InvalidRepoId {
            repo_id: repo_id.into(),
        })
    }
}

/// Whether `revision` is a full commit hash (40 hexadecimal digits), which never moves.
pub fn is_commit_hash(revision: &str) -> bool {
    revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A relative path inside a repository that stays inside it (no `..`, not absolute, not
/// empty): what may be joined under `snapshots/<commit>/` or `refs/`.
pub(crate) fn is_safe_relative(path: &str) -> bool {
    !path.is_empty()
        && !path.contains('\\')
        && Path::new(path)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

/// The commit a revision resolves to in the cache: the content of `refs/<revision>`, else
/// the revision itself when `snapshots/<revision>/` exists (a commit hash), else `None`.
pub fn cached_commit_hash(
    cache_dir: &Path,
    repo_id: &str,
    repo_type: RepoType,
    revision: &str,
) -> Option<String> {
    if !is_safe_relative(revision) {
        return None;
    }
    let repo = repo_cache_dir(cache_dir, repo_id, repo_type);
    if let Ok(commit) = std::fs::read_to_string(repo.join("refs").join(revision)) {
        let commit = commit.trim();
        if is_safe_relative(commit) && !commit.contains('/') {
            return Some(commit.to_string());
        }
    }
    repo.join("snapshots")
        .join(revision)
        .is_dir()
        .then(|| revision.to_string())
}

/// The cached copy of one file of a repository at a revision (`try_to_load_from_cache`),
/// if the cache has it.
pub fn try_to_load_from_cache(
    repo_id: &str,
    filename: &str,
    repo_type: RepoType,
    revision: &str,
    cache_dir: &Path,
) -> Option<PathBuf> {
    if !is_safe_relative(filename) {
        return None;
    }
    let commit = cached_commit_hash(cache_dir, repo_id, repo_type, revision)?;
    let path = repo_cache_dir(cache_dir, repo_id, repo_type)
        .join("snapshots")
        .join(commit)
        .join(filename);
    // A symlink into blobs/ whose blob is gone is not a cached file.
    path.is_file().then_some(path)
}

/// Records that `revision` (a branch or tag) points to `commit`: `refs/<revision>`, as
/// huggingface_hub does after a download, so offline lookups of the branch find the snapshot.
pub(crate) fn cache_commit_hash_for_revision(
    cache_dir: &Path,
    repo_id: &str,
    repo_type: RepoType,
    revision: &str,
    commit: &str,
) -> Result<()> {
    if revision == commit || !is_safe_relative(revision) {
        return Ok(());
    }
    let path = repo_cache_dir(cache_dir, repo_id, repo_type)
        .join("refs")
        .join(revision);
    if std::fs::read_to_string(&path).is_ok_and(|c| c.trim() == commit) {
        return Ok(());
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|source| Error::Io {
            action: "creating",
            path: parent.to_path_buf(),
            source,
        })?;
    }
    std::fs::write(&path, commit).map_err(|source| Error::Io {
        action: "writing",
        path,
        source,
    })
}

/// One file of a repository at a revision, from the cache or downloaded into it
/// (`hf_hub_download`); returns its path under `snapshots/<commit>/`.
///
/// Offline ([`HubOptions::offline`]) it only looks in the cache ([`Error::NotCached`] when
/// absent). A commit hash already cached needs no request; a branch or tag is fetched again
/// (hf-hub has no conditional request; pass the commit [`repo_info`](crate::repo_info)
/// returned to reuse the cache). The request carries [`HubOptions::token`].
pub fn hf_hub_download(
    repo_id: &str,
    filename: &str,
    repo_type: RepoType,
    revision: &str,
    options: &HubOptions,
) -> Result<PathBuf> {
    validate_repo_id(repo_id)?;
    let not_cached = || Error::NotCached {
        repo_id: repo_id.into(),
        repo_type,
        revision: revision.into(),
        file: Some(filename.into()),
        cache_dir: options.cache_dir.clone(),
    };
    if !is_safe_relative(filename) || !is_safe_relative(revision) {
        return Err(Error::EntryNotFound {
            repo_id: repo_id.into(),
            repo_type,
            revision: revision.into(),
            file: filename.into(),
            url: String::new(),
        });
    }
    let cached =
        || try_to_load_from_cache(repo_id, filename, repo_type, revision, &options.cache_dir);
    if options.offline {
        return cached().ok_or_else(not_cached);
    }
    if is_commit_hash(revision)
        && let Some(path) = cached()
    {
        return Ok(path);
    }
    let api = build_api(options)?;
    let refs = repo_cache_dir(&options.cache_dir, repo_id, repo_type).join("refs");
    // hf-hub records `refs/<revision>` even for a commit hash; huggingface_hub does not.
    let stray_ref = is_commit_hash(revision) && !refs.join(revision).exists();
    let repo = api.repo(hf_hub::Repo::with_revision(
        repo_id.into(),
        repo_type.to_hf_hub(),
        revision.into(),
    ));
    let url = repo.url(filename);
    let result = repo.download(filename);
    if stray_ref {
        let _ = std::fs::remove_file(refs.join(revision));
    }
    let target = crate::hf_api::Target {
        repo_id,
        repo_type,
        revision,
        file: Some(filename),
    };
    match result.map_err(|e| map_api_error(e, &url, &target)) {
        // Unreachable hub: the cached copy, as huggingface_hub falls back to it.
        Err(e) if e.is_connection() => cached().ok_or(e).inspect(|_| {
            log::warn!("{url} could not be reached; using the cached '{filename}'");
        }),
        other => other,
    }
}

//! What `HfApi.repo_info` / `dataset_info` answer (`GET /api/{models|datasets}/{id}/revision/{rev}`:
//! the commit a revision points to and the repository's files), the same from the cache
//! when offline, and the mapping of the hub's HTTP errors (`hf_raise_for_status`: the
//! `X-Error-Code` header) to typed errors.

use std::path::Path;

use hf_hub::api::sync::{Api, ApiBuilder, ApiError};

use crate::file_download::{
    cache_commit_hash_for_revision, cached_commit_hash, is_safe_relative, repo_cache_dir,
    validate_repo_id,
};
use crate::{Error, HubOptions, RepoType, Result};

/// A repository at one revision (`ModelInfo` / `DatasetInfo`, the fields tchtrain uses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoInfo {
    /// The repository id (`org/name`).
    pub id: String,
    /// The commit the revision points to.
    pub sha: String,
    /// The repository's files at that commit (`siblings[].rfilename`): paths relative to
    /// its root, `/`-separated.
    pub siblings: Vec<String>,
}

/// The repository a request is about, for its error.
pub(crate) struct Target<'a> {
    pub repo_id: &'a str,
    pub repo_type: RepoType,
    pub revision: &'a str,
    pub file: Option<&'a str>,
}

/// The commit `revision` points to and the files there (`HfApi.repo_info`), with
/// [`HubOptions::token`].
///
/// Offline, or when the hub cannot be reached, the answer comes from the cache: the commit
/// of `refs/<revision>` and the files of its snapshot (what was downloaded), else
/// [`Error::NotCached`] (offline) or [`Error::Connection`]. Online, the revision is recorded
/// in `refs/` so that a later offline lookup finds the snapshot.
pub fn repo_info(
    repo_id: &str,
    repo_type: RepoType,
    revision: &str,
    options: &HubOptions,
) -> Result<RepoInfo> {
    validate_repo_id(repo_id)?;
    let target = Target {
        repo_id,
        repo_type,
        revision,
        file: None,
    };
    if !is_safe_relative(revision) {
        return Err(Error::RevisionNotFound {
            repo_id: repo_id.into(),
            repo_type,
            revision: revision.into(),
            url: String::new(),
        });
    }
    let cached = || cached_repo_info(repo_id, repo_type, revision, &options.cache_dir);
    if options.offline {
        return cached().ok_or_else(|| Error::NotCached {
            repo_id: repo_id.into(),
            repo_type,
            revision: revision.into(),
            file: None,
            cache_dir: options.cache_dir.clone(),
        });
    }
    let api = build_api(options)?;
    let request = api
        .repo(hf_hub::Repo::with_revision(
            repo_id.into(),
            repo_type.to_hf_hub(),
            revision.into(),
        ))
        .info_request();
    let url = request.url().to_string();
    let response = match request.call() {
        Ok(response) => response,
        Err(e) => {
            let error = map_ureq_error(e, &url, &target);
            if error.is_connection()
                && let Some(info) = cached()
            {
                log::warn!(
                    "{url} could not be reached; using the cached snapshot {}",
                    info.sha
                );
                return Ok(info);
            }
            return Err(error);
        }
    };
    let invalid = |detail: String| Error::InvalidResponse {
        url: url.clone(),
        detail,
    };
    let body = response
        .into_string()
        .map_err(|e| invalid(format!("reading the body: {e}")))?;
    let info = parse_repo_info(repo_id, &body).map_err(invalid)?;
    cache_commit_hash_for_revision(&options.cache_dir, repo_id, repo_type, revision, &info.sha)?;
    Ok(info)
}

#[derive(serde::Deserialize)]
struct RawRepoInfo {
    sha: String,
    #[serde(default)]
    siblings: Vec<RawSibling>,
}

#[derive(serde::Deserialize)]
struct RawSibling {
    rfilename: String,
}

/// The API's JSON, checked: a commit that can name a folder, file names inside the repository.
fn parse_repo_info(repo_id: &str, body: &str) -> std::result::Result<RepoInfo, String> {
    let raw: RawRepoInfo =
        serde_json::from_str(body).map_err(|e| format!("not repository info JSON ({e})"))?;
    if raw.sha.is_empty() || !raw.sha.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(format!("'sha' is not a commit hash: {:?}", raw.sha));
    }
    let mut siblings = Vec::with_capacity(raw.siblings.len());
    for s in raw.siblings {
        if !is_safe_relative(&s.rfilename) {
            return Err(format!(
                "a file name leaves the repository: {:?}",
                s.rfilename
            ));
        }
        siblings.push(s.rfilename);
    }
    Ok(RepoInfo {
        id: repo_id.into(),
        sha: raw.sha,
        siblings,
    })
}

/// [`repo_info`] from the cache alone: the commit `revision` resolves to there
/// ([`cached_commit_hash`]) and the files of that snapshot, sorted; `None` when the cache has
/// no snapshot for it.
pub fn cached_repo_info(
    repo_id: &str,
    repo_type: RepoType,
    revision: &str,
    cache_dir: &Path,
) -> Option<RepoInfo> {
    let sha = cached_commit_hash(cache_dir, repo_id, repo_type, revision)?;
    let snapshot = repo_cache_dir(cache_dir, repo_id, repo_type)
        .join("snapshots")
        .join(&sha);
    if !snapshot.is_dir() {
        return None;
    }
    let mut siblings = Vec::new();
    list_files(&snapshot, "", &mut siblings);
    siblings.sort();
    Some(RepoInfo {
        id: repo_id.into(),
        sha,
        siblings,
    })
}

/// The files under `dir` (following the snapshot's symlinks into `blobs/`, skipping broken
/// ones), as `/`-separated paths relative to the snapshot.
fn list_files(dir: &Path, prefix: &str, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => list_files(&path, &rel, out),
            Ok(_) if path.is_file() => out.push(rel),
            _ => {}
        }
    }
}

/// An hf-hub client for `options`: its cache, endpoint, token and progress bars, no retries.
pub(crate) fn build_api(options: &HubOptions) -> Result<Api> {
    std::fs::create_dir_all(&options.cache_dir).map_err(|source| Error::Io {
        action: "creating",
        path: options.cache_dir.clone(),
        source,
    })?;
    // `from_cache`, not `new`: hf-hub's default cache panics when there is no home folder.
    ApiBuilder::from_cache(hf_hub::Cache::new(options.cache_dir.clone()))
        .with_endpoint(options.endpoint.clone())
        .with_token(options.token.clone())
        .with_progress(options.progress)
        .with_retries(0)
        .build()
        .map_err(|e| Error::Connection {
            url: options.endpoint.clone(),
            detail: format!("creating the HTTP client: {e}"),
        })
}

/// An hf-hub error as this crate's.
pub(crate) fn map_api_error(error: ApiError, url: &str, target: &Target<'_>) -> Error {
    let invalid = |detail: String| Error::InvalidResponse {
        url: url.into(),
        detail,
    };
    match error {
        ApiError::RequestError(e) => map_ureq_error(*e, url, target),
        ApiError::TooManyRetries(e) => map_api_error(*e, url, target),
        ApiError::MissingHeader(h) => invalid(format!("the response has no {h} header")),
        ApiError::InvalidHeader(h) => invalid(format!("the response's {h} header is invalid")),
        ApiError::ParseIntError(e) => invalid(format!("the file size in Content-Range: {e}")),
        other => Error::Download {
            repo_id: target.repo_id.into(),
            repo_type: target.repo_type,
            file: target.file.unwrap_or_default().into(),
            detail: other.to_string(),
        },
    }
}

/// An HTTP failure as huggingface_hub's `hf_raise_for_status` classifies it.
pub(crate) fn map_ureq_error(error: ureq::Error, url: &str, target: &Target<'_>) -> Error {
    let response = match error {
        ureq::Error::Status(_, response) => response,
        ureq::Error::Transport(t) => {
            return Error::Connection {
                url: url.into(),
                detail: t.to_string(),
            };
        }
    };
    let status = response.status();
    let code = response.header("x-error-code").map(str::to_owned);
    let message = response.header("x-error-message").map(str::to_owned);
    let (repo_id, repo_type, url) = (
        target.repo_id.to_string(),
        target.repo_type,
        url.to_string(),
    );
    match code.as_deref() {
        Some("RevisionNotFound") => Error::RevisionNotFound {
            repo_id,
            repo_type,
            revision: target.revision.into(),
            url,
        },
        Some("EntryNotFound") => Error::EntryNotFound {
            repo_id,
            repo_type,
            revision: target.revision.into(),
            file: target.file.unwrap_or_default().into(),
            url,
        },
        Some("GatedRepo") => Error::GatedRepo {
            repo_id,
            repo_type,
            url,
            status,
        },
        Some("RepoNotFound") => Error::RepositoryNotFound {
            repo_id,
            repo_type,
            url,
            status,
        },
        _ if status == 401
            && message.as_deref() != Some("Invalid credentials in Authorization header") =>
        {
            Error::RepositoryNotFound {
                repo_id,
                repo_type,
                url,
                status,
            }
        }
        _ => {
            let detail = message.unwrap_or_else(|| {
                let body = response.into_string().unwrap_or_default();
                body.chars().take(300).collect()
            });
            Error::Http {
                url,
                status,
                detail,
            }
        }
    }
}

//! Writing to the hub (huggingface_hub's `HfApi.create_repo` and `HfApi.upload_folder`, over
//! `_commit_api.py` and `lfs.py`): a model repository created (or found), a folder's files
//! committed in one commit — the hub's pre-upload answer telling which files go through LFS,
//! those uploaded by the LFS batch API (`basic` transfers: one `PUT` each; `multipart` ones,
//! which the hub asks for large files: a `PUT` of each `chunk_size` part to its numbered URL,
//! then the parts' etags posted to the completion `href`, as `lfs._upload_multi_part`; then
//! `verify` when the server asks), and the commit posted as NDJSON (a header, then `file`
//! entries with the regular files' base64 content and `lfsFile` entries with the LFS files'
//! `sha256` and size). Xet transfers are not offered (the batch request names `basic` and
//! `multipart`, as huggingface_hub without `hf_xet` does).

use std::io::Read;
use std::path::{Path, PathBuf};

use base64::Engine;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::hf_api::{Target, map_ureq_error};
use crate::{Error, HubOptions, RepoType, Result};

/// What `upload_folder` returns (huggingface_hub's `CommitInfo`, the fields used here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitInfo {
    /// The commit's URL on the hub.
    pub commit_url: String,
    /// The commit's hash.
    pub oid: String,
}

/// One file of a commit.
struct Upload {
    path_in_repo: String,
    local: PathBuf,
    size: u64,
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout_connect(std::time::Duration::from_secs(30))
        .build()
}

fn authorized(request: ureq::Request, options: &HubOptions) -> ureq::Request {
    match &options.token {
        Some(t) => request.set("Authorization", &format!("Bearer {t}")),
        None => request,
    }
}

fn target(repo_id: &str) -> Target<'_> {
    Target {
        repo_id,
        repo_type: RepoType::Model,
        revision: "main",
        file: None,
    }
}

fn invalid(url: &str, detail: impl Into<String>) -> Error {
    Error::InvalidResponse {
        url: url.into(),
        detail: detail.into(),
    }
}

fn json_of(response: ureq::Response, url: &str) -> Result<Value> {
    let mut text = String::new();
    response
        .into_reader()
        .read_to_string(&mut text)
        .map_err(|e| invalid(url, e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| invalid(url, format!("not JSON: {e}")))
}

/// `lfs._upload_multi_part`: the part URLs are the header's numbered keys, in number
/// order, one per `chunk_size` bytes (else upstream's "Invalid server response to upload
/// large LFS file"); each part is `PUT` there (no token: they are presigned) and answers
/// with an `ETag`; the etags are then posted to `href`, the hub's completion endpoint, as
/// `{"oid", "parts": [{"partNumber", "etag"}]}`.
fn upload_multi_part(
    header: &serde_json::Map<String, Value>,
    chunk: &Value,
    href: &str,
    oid: &str,
    bytes: &[u8],
    batch_url: &str,
    repo_id: &str,
) -> Result<()> {
    // `int(chunk_size)`: an integer, or a string of one.
    let chunk_size = chunk
        .as_u64()
        .or_else(|| chunk.as_str().and_then(|s| s.trim().parse().ok()))
        .filter(|&c| c > 0)
        .ok_or_else(|| {
            invalid(
                batch_url,
                format!("Malformed response from LFS batch endpoint: `chunk_size` should be an integer. Got '{chunk}'."),
            )
        })? as usize;
    let mut parts: Vec<(u64, &str)> = header
        .iter()
        .filter(|(k, _)| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
        .filter_map(|(k, v)| Some((k.parse().ok()?, v.as_str()?)))
        .collect();
    parts.sort_by_key(|(n, _)| *n);
    if parts.len() != bytes.len().div_ceil(chunk_size) {
        return Err(invalid(
            batch_url,
            format!(
                "Invalid server response to upload large LFS file: {} part URLs for {} bytes in parts of {chunk_size}",
                parts.len(),
                bytes.len()
            ),
        ));
    }
    let mut etags = Vec::with_capacity(parts.len());
    for (i, (_, part_url)) in parts.iter().enumerate() {
        let slice = &bytes[i * chunk_size..((i + 1) * chunk_size).min(bytes.len())];
        let response = agent()
            .put(part_url)
            .send_bytes(slice)
            .map_err(|e| map_ureq_error(e, part_url, &target(repo_id)))?;
        let etag = response
            .header("etag")
            .filter(|e| !e.is_empty())
            .ok_or_else(|| {
                invalid(
                    part_url,
                    format!("Invalid etag (`None`) returned for part {}", i + 1),
                )
            })?;
        etags.push(json!({"partNumber": i + 1, "etag": etag}));
    }
    agent()
        .post(href)
        .set("Accept", "application/vnd.git-lfs+json")
        .set("Content-Type", "application/vnd.git-lfs+json")
        .send_string(&json!({"oid": oid, "parts": etags}).to_string())
        .map_err(|e| map_ureq_error(e, href, &target(repo_id)))?;
    Ok(())
}

/// `HfApi.create_repo(repo_id, private=private, exist_ok=True)`: `POST /api/repos/create`
/// (`name`, `organization`, and `visibility` `private` / `public` when `private` is given:
/// else the namespace's default). An existing repository is accepted: the hub's 409 answer
/// carries its `url`, read as for a new one. Returns the repository id the hub gives (a name
/// alone is put in the token's namespace).
pub fn create_repo(repo_id: &str, private: Option<bool>, options: &HubOptions) -> Result<String> {
    let (organization, name) = match repo_id.split_once('/') {
        Some((org, name)) => (Some(org), name),
        None => (None, repo_id),
    };
    let url = format!("{}/api/repos/create", options.endpoint);
    let mut body = json!({"name": name, "organization": organization});
    if let Some(p) = private {
        body["visibility"] = json!(if p { "private" } else { "public" });
    }
    let request = authorized(agent().post(&url), options);
    let response = match request.send_json(body) {
        Ok(response) => response,
        // `exist_ok=True`: the hub answers 409 for an existing repository.
        Err(ureq::Error::Status(409, response)) => response,
        Err(e) => return Err(map_ureq_error(e, &url, &target(repo_id))),
    };
    let v = json_of(response, &url)?;
    let repo_url = v
        .get("url")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(&url, "no `url` in the answer"))?;
    Ok(repo_url
        .strip_prefix(&options.endpoint)
        .unwrap_or(repo_url)
        .trim_matches('/')
        .to_string())
}

/// `fnmatch.fnmatch(name, pattern)` (`*`, `?`, `[...]`; `*` also matches `/`).
pub fn fnmatch(name: &str, pattern: &str) -> bool {
    fn go(n: &[char], p: &[char]) -> bool {
        match p.first() {
            None => n.is_empty(),
            Some('*') => (0..=n.len()).any(|i| go(&n[i..], &p[1..])),
            Some('?') => !n.is_empty() && go(&n[1..], &p[1..]),
            Some('[') => {
                let Some(close) = p.iter().skip(1).position(|&c| c == ']').map(|i| i + 1) else {
                    return n.first() == Some(&'[') && go(&n[1..], &p[1..]);
                };
                let Some(&c) = n.first() else { return false };
                let set = &p[1..close];
                let (negate, set) = match set.first() {
                    Some('!') => (true, &set[1..]),
                    _ => (false, set),
                };
                let mut hit = false;
                let mut i = 0;
                while i < set.len() {
                    if i + 2 < set.len() && set[i + 1] == '-' {
                        hit |= set[i] <= c && c <= set[i + 2];
                        i += 3;
                    } else {
                        hit |= set[i] == c;
                        i += 1;
                    }
                }
                hit != negate && go(&n[1..], &p[close + 1..])
            }
            Some(&x) => n.first() == Some(&x) && go(&n[1..], &p[1..]),
        }
    }
    let n: Vec<char> = name.chars().collect();
    let p: Vec<char> = pattern.chars().collect();
    go(&n, &p)
}

/// huggingface_hub's `DEFAULT_IGNORE_PATTERNS` (git and cache folders).
const DEFAULT_IGNORE_PATTERNS: [&str; 8] = [
    ".git",
    ".git/*",
    "*/.git",
    "**/.git/**",
    ".cache/huggingface",
    ".cache/huggingface/*",
    "*/.cache/huggingface",
    "**/.cache/huggingface/**",
];

fn list_files(root: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) -> Result<()> {
    let io = |e| Error::Io {
        action: "listing",
        path: dir.to_path_buf(),
        source: e,
    };
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(io)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            list_files(root, &path, out)?;
        } else if path.is_file() {
            let rel = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            out.push((rel, path));
        }
    }
    Ok(())
}

/// What `upload_folder` commits.
#[derive(Debug, Clone)]
pub struct UploadFolder<'a> {
    /// The repository (`org/name`).
    pub repo_id: &'a str,
    /// The local folder.
    pub folder: &'a Path,
    /// Where its files go in the repository (`path_in_repo`; the root by default).
    pub path_in_repo: Option<&'a str>,
    /// `commit_message`.
    pub commit_message: &'a str,
    /// `revision` (`main` by default).
    pub revision: Option<&'a str>,
    /// `ignore_patterns`, matched as `fnmatch` patterns against the paths relative to the
    /// folder (a pattern ending in `/` matches everything under it).
    pub ignore_patterns: &'a [&'a str],
}

/// `HfApi.upload_folder(...)`: every file of the folder not ignored, in one commit.
pub fn upload_folder(args: &UploadFolder<'_>, options: &HubOptions) -> Result<CommitInfo> {
    let revision = args.revision.unwrap_or("main");
    let mut files = Vec::new();
    list_files(args.folder, args.folder, &mut files)?;
    let patterns: Vec<String> = args
        .ignore_patterns
        .iter()
        .map(|p| {
            if p.ends_with('/') {
                format!("{p}*")
            } else {
                p.to_string()
            }
        })
        .chain(DEFAULT_IGNORE_PATTERNS.iter().map(|p| p.to_string()))
        .collect();
    let prefix = args
        .path_in_repo
        .map(|p| p.trim_matches('/'))
        .filter(|p| !p.is_empty());
    let uploads: Vec<Upload> = files
        .into_iter()
        .filter(|(rel, _)| !patterns.iter().any(|p| fnmatch(rel, p)))
        .map(|(rel, local)| {
            let size = std::fs::metadata(&local).map(|m| m.len()).unwrap_or(0);
            Upload {
                path_in_repo: match prefix {
                    Some(p) => format!("{p}/{rel}"),
                    None => rel,
                },
                local,
                size,
            }
        })
        .collect();
    create_commit(
        args.repo_id,
        revision,
        args.commit_message,
        &uploads,
        options,
    )
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::Io {
        action: "reading",
        path: path.to_path_buf(),
        source: e,
    })
}

fn encode_segment(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `HfApi.create_commit` with additions only.
fn create_commit(
    repo_id: &str,
    revision: &str,
    message: &str,
    uploads: &[Upload],
    options: &HubOptions,
) -> Result<CommitInfo> {
    let endpoint = &options.endpoint;
    let rev = encode_segment(revision);
    let b64 = base64::engine::general_purpose::STANDARD;
    // The pre-upload answer: which files go through LFS.
    let mut modes = std::collections::HashMap::new();
    for chunk in uploads.chunks(256) {
        let url = format!("{endpoint}/api/models/{repo_id}/preupload/{rev}");
        let mut files = Vec::new();
        for u in chunk {
            let bytes = read(&u.local)?;
            let sample = &bytes[..bytes.len().min(512)];
            files.push(
                json!({"path": u.path_in_repo, "sample": b64.encode(sample), "size": u.size}),
            );
        }
        let response = authorized(agent().post(&url), options)
            .send_json(json!({"files": files}))
            .map_err(|e| map_ureq_error(e, &url, &target(repo_id)))?;
        let answer = json_of(response, &url)?;
        for f in answer
            .get("files")
            .and_then(Value::as_array)
            .ok_or_else(|| invalid(&url, "no `files` in the pre-upload answer"))?
        {
            let path = f.get("path").and_then(Value::as_str).unwrap_or_default();
            let mode = f
                .get("uploadMode")
                .and_then(Value::as_str)
                .unwrap_or("regular");
            let ignore = f
                .get("shouldIgnore")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            modes.insert(path.to_string(), (mode.to_string(), ignore));
        }
    }
    // LFS files: their sha256, the batch API, one PUT each.
    let mut lfs = Vec::new();
    for u in uploads {
        if modes.get(&u.path_in_repo).is_some_and(|(m, _)| m == "lfs") {
            let bytes = read(&u.local)?;
            let oid = format!("{:x}", Sha256::digest(&bytes));
            lfs.push((u, oid, bytes));
        }
    }
    if !lfs.is_empty() {
        let url = format!("{endpoint}/{repo_id}.git/info/lfs/objects/batch");
        let objects: Vec<Value> = lfs
            .iter()
            .map(|(u, oid, _)| json!({"oid": oid, "size": u.size}))
            .collect();
        let response = authorized(agent().post(&url), options)
            .set("Accept", "application/vnd.git-lfs+json")
            .set("Content-Type", "application/vnd.git-lfs+json")
            .send_string(
                &json!({
                    "operation": "upload",
                    "transfers": ["basic", "multipart"],
                    "objects": objects,
                    "hash_algo": "sha256",
                    "ref": {"name": revision},
                })
                .to_string(),
            )
            .map_err(|e| map_ureq_error(e, &url, &target(repo_id)))?;
        let answer = json_of(response, &url)?;
        let objects = answer
            .get("objects")
            .and_then(Value::as_array)
            .ok_or_else(|| invalid(&url, "no `objects` in the LFS batch answer"))?;
        for (u, oid, bytes) in &lfs {
            let Some(object) = objects
                .iter()
                .find(|o| o.get("oid").and_then(Value::as_str) == Some(oid))
            else {
                return Err(invalid(
                    &url,
                    format!("no LFS object for {}", u.path_in_repo),
                ));
            };
            if let Some(err) = object.get("error") {
                return Err(invalid(
                    &url,
                    format!("LFS refused {}: {err}", u.path_in_repo),
                ));
            }
            // No `upload` action: the hub already has the object.
            let Some(actions) = object.get("actions") else {
                continue;
            };
            if let Some(upload) = actions.get("upload") {
                let href = upload
                    .get("href")
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid(&url, "an LFS upload action without `href`"))?;
                let header = upload.get("header").and_then(Value::as_object);
                match header.and_then(|h| Some((h, h.get("chunk_size")?))) {
                    Some((header, chunk)) => {
                        upload_multi_part(header, chunk, href, oid, bytes, &url, repo_id)?;
                    }
                    None => {
                        let mut put = agent().put(href);
                        for (k, v) in header.into_iter().flatten() {
                            if let Some(v) = v.as_str() {
                                put = put.set(k, v);
                            }
                        }
                        put.send_bytes(bytes)
                            .map_err(|e| map_ureq_error(e, href, &target(repo_id)))?;
                    }
                }
            }
            if let Some(verify) = actions.get("verify") {
                let href = verify
                    .get("href")
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid(&url, "an LFS verify action without `href`"))?;
                authorized(agent().post(href), options)
                    .send_json(json!({"oid": oid, "size": u.size}))
                    .map_err(|e| map_ureq_error(e, href, &target(repo_id)))?;
            }
        }
    }
    // The commit: NDJSON.
    let mut body =
        json!({"key": "header", "value": {"summary": message, "description": ""}}).to_string();
    for u in uploads {
        let (mode, ignore) = modes
            .get(&u.path_in_repo)
            .cloned()
            .unwrap_or(("regular".into(), false));
        if ignore {
            continue;
        }
        body.push('\n');
        if mode == "lfs" {
            let oid = lfs
                .iter()
                .find(|(l, _, _)| l.path_in_repo == u.path_in_repo)
                .map(|(_, oid, _)| oid.clone())
                .unwrap_or_default();
            body.push_str(
                &json!({"key": "lfsFile", "value": {"path": u.path_in_repo, "algo": "sha256", "oid": oid, "size": u.size}})
                    .to_string(),
            );
        } else {
            let bytes = read(&u.local)?;
            body.push_str(
                &json!({"key": "file", "value": {"content": b64.encode(&bytes), "path": u.path_in_repo, "encoding": "base64"}})
                    .to_string(),
            );
        }
    }
    let url = format!("{endpoint}/api/models/{repo_id}/commit/{rev}");
    let response = authorized(agent().post(&url), options)
        .set("Content-Type", "application/x-ndjson")
        .send_string(&body)
        .map_err(|e| map_ureq_error(e, &url, &target(repo_id)))?;
    let answer = json_of(response, &url)?;
    Ok(CommitInfo {
        commit_url: answer
            .get("commitUrl")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        oid: answer
            .get("commitOid")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid(&url, "no `commitOid` in the commit answer"))?
            .to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::fnmatch;

    #[test]
    fn fnmatch_is_pythons() {
        assert!(fnmatch("checkpoint-5/model.safetensors", "checkpoint-*"));
        assert!(fnmatch("_tmp", "_*"));
        assert!(!fnmatch("a/_tmp", "_*"));
        assert!(fnmatch("a.bin", "*.[bc]in"));
        assert!(!fnmatch("a.din", "*.[bc]in"));
        assert!(fnmatch("x/.git/config", "*/.git/*"));
    }
}

//! A minimal Hugging Face hub on 127.0.0.1 for tests ([`HubServer`]): model and dataset
//! repositories served from folders, each revision (branch, tag, `refs/convert/parquet`)
//! a folder with its own commit hash, answering what huggingface_hub and hf-hub ask:
//!
//! - `GET /api/{models|datasets}/{id}[/revision/{rev}]`: `{"id", "sha", "siblings": [{"rfilename"}]}`;
//! - `GET|HEAD /[datasets/]{id}/resolve/{rev}/{path}`: the file, honouring `Range`, with the
//!   headers the clients read (`ETag`, `X-Repo-Commit`, `Content-Range`, `Content-Length`);
//! - errors as the hub sends them: `X-Error-Code: RepoNotFound` (401), `RevisionNotFound`
//!   and `EntryNotFound` (404).
//!
//! Revisions in paths may be percent-encoded (`refs%2Fconvert%2Fparquet`). Every request is
//! logged with its `Authorization` header ([`HubServer::requests`]). The server stops when
//! dropped or on [`HubServer::stop`]; connections are refused after that.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// One revision of one served repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedRevision {
    /// `"model"` or `"dataset"`.
    pub repo_type: &'static str,
    /// `org/name`.
    pub repo_id: String,
    /// The branch or tag name (`main`, `v1`, `refs/convert/parquet`).
    pub revision: String,
    /// Its commit hash (40 hex digits); the revision can be asked for by it too.
    pub commit: String,
    /// The folder holding the repository's files at that revision.
    pub root: PathBuf,
}

/// One request the server received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubRequest {
    /// `GET`, `HEAD`, ...
    pub method: String,
    /// The path as sent (percent-encoding kept), query string included.
    pub path: String,
    /// The `Authorization` header's value, if any.
    pub authorization: Option<String>,
}

/// The repositories a [`HubServer`] will serve.
#[derive(Debug, Default)]
pub struct HubServerBuilder {
    revisions: Vec<ServedRevision>,
}

impl HubServerBuilder {
    /// Serves `root` as model repository `repo_id` at `revision`.
    pub fn model(self, repo_id: &str, revision: &str, root: impl Into<PathBuf>) -> Self {
        self.add("model", repo_id, revision, root.into())
    }

    /// Serves `root` as dataset repository `repo_id` at `revision`.
    pub fn dataset(self, repo_id: &str, revision: &str, root: impl Into<PathBuf>) -> Self {
        self.add("dataset", repo_id, revision, root.into())
    }

    fn add(
        mut self,
        repo_type: &'static str,
        repo_id: &str,
        revision: &str,
        root: PathBuf,
    ) -> Self {
        let commit = commit_hash(&format!("{repo_type}/{repo_id}@{revision}"));
        self.revisions.push(ServedRevision {
            repo_type,
            repo_id: repo_id.into(),
            revision: revision.into(),
            commit,
            root,
        });
        self
    }

    /// Binds 127.0.0.1 on a free port and serves until the server is dropped.
    pub fn start(self) -> HubServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
        let addr = listener.local_addr().expect("the bound address");
        let state = Arc::new(State {
            revisions: self.revisions,
            log: Mutex::new(Vec::new()),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let (state2, stop2) = (state.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(stream) = stream {
                    let _ = state2.handle(stream);
                }
            }
        });
        HubServer {
            endpoint: format!("http://{addr}"),
            state,
            stop,
            thread: Some(thread),
        }
    }
}

/// A running local hub; see the module documentation.
#[derive(Debug)]
pub struct HubServer {
    endpoint: String,
    state: Arc<State>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HubServer {
    /// The repositories to serve.
    pub fn builder() -> HubServerBuilder {
        HubServerBuilder::default()
    }

    /// `http://127.0.0.1:PORT`, for `HF_ENDPOINT`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The requests received so far, in order.
    pub fn requests(&self) -> Vec<HubRequest> {
        self.state
            .log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The commit hash served for `repo_id` at `revision`.
    pub fn commit(&self, repo_id: &str, revision: &str) -> Option<String> {
        self.state
            .revisions
            .iter()
            .find(|r| r.repo_id == repo_id && r.revision == revision)
            .map(|r| r.commit.clone())
    }

    /// Stops serving: later connections are refused.
    pub fn stop(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.stop.store(true, Ordering::SeqCst);
            // Wake the accept loop so that it sees the flag.
            let _ = TcpStream::connect(self.endpoint.trim_start_matches("http://"));
            let _ = thread.join();
        }
    }
}

impl Drop for HubServer {
    fn drop(&mut self) {
        self.stop();
    }
}

#[derive(Debug)]
struct State {
    revisions: Vec<ServedRevision>,
    log: Mutex<Vec<HubRequest>>,
}

/// What a request resolved to.
enum Answer {
    Json(String),
    File { bytes: Vec<u8>, commit: String },
    Error { status: u16, code: &'static str },
}

impl State {
    fn handle(&self, mut stream: TcpStream) -> std::io::Result<()> {
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut request_line = String::new();
        reader.read_line(&mut request_line)?;
        let mut parts = request_line.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let path = parts.next().unwrap_or("/").to_string();
        let (mut range, mut authorization) = (None, None);
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
                break;
            }
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim().to_string();
            match name.trim().to_ascii_lowercase().as_str() {
                "authorization" => authorization = Some(value),
                "range" => range = parse_range(&value),
                _ => {}
            }
        }
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(HubRequest {
                method: method.clone(),
                path: path.clone(),
                authorization,
            });
        let route = path.split('?').next().unwrap_or("");
        let answer = self.route(route);
        let head = method == "HEAD";
        match answer {
            Answer::Json(body) => respond(
                &mut stream,
                200,
                &[("Content-Type", "application/json".into())],
                body.as_bytes(),
                head,
            ),
            Answer::Error { status, code } => {
                let body = format!("{code} for {route}");
                respond(
                    &mut stream,
                    status,
                    &[("X-Error-Code", code.into())],
                    body.as_bytes(),
                    head,
                )
            }
            Answer::File { bytes, commit } => {
                let size = bytes.len();
                let etag = format!("\"{}\"", content_hash(&bytes));
                let mut headers = vec![("ETag", etag), ("X-Repo-Commit", commit)];
                let (status, body) = match range {
                    Some((start, end)) if size > 0 => {
                        let end = end.unwrap_or(size - 1).min(size - 1);
                        let start = start.min(end);
                        headers.push(("Content-Range", format!("bytes {start}-{end}/{size}")));
                        (206, &bytes[start..=end])
                    }
                    Some(_) => {
                        headers.push(("Content-Range", "bytes */0".into()));
                        (206, &bytes[..])
                    }
                    None => (200, &bytes[..]),
                };
                respond(&mut stream, status, &headers, body, head)
            }
        }
    }

    fn find(
        &self,
        repo_type: &str,
        repo_id: &str,
        revision: &str,
    ) -> Result<&ServedRevision, Answer> {
        let mut of_repo = self
            .revisions
            .iter()
            .filter(|r| r.repo_type == repo_type && r.repo_id == repo_id)
            .peekable();
        if of_repo.peek().is_none() {
            return Err(Answer::Error {
                status: 401,
                code: "RepoNotFound",
            });
        }
        of_repo
            .find(|r| r.revision == revision || r.commit == revision)
            .ok_or(Answer::Error {
                status: 404,
                code: "RevisionNotFound",
            })
    }

    fn route(&self, path: &str) -> Answer {
        let not_found = Answer::Error {
            status: 404,
            code: "EntryNotFound",
        };
        if let Some(rest) = path.strip_prefix("/api/") {
            // /api/{models|datasets}/{id}/revision/{rev}
            let Some((kind, rest)) = rest.split_once('/') else {
                return not_found;
            };
            let repo_type = match kind {
                "models" => "model",
                "datasets" => "dataset",
                _ => return not_found,
            };
            // Without `/revision/{rev}` (huggingface_hub's `dataset_info(id)`): `main`.
            let (repo_id, revision) = rest.split_once("/revision/").unwrap_or((rest, "main"));
            return match self.find(
                repo_type,
                &percent_decode(repo_id),
                &percent_decode(revision),
            ) {
                Ok(served) => Answer::Json(repo_info_json(served)),
                Err(answer) => answer,
            };
        }
        // /[datasets/]{id}/resolve/{rev}/{path}: the revision is one (encoded) segment.
        let Some((repo, rest)) = path.split_once("/resolve/") else {
            return not_found;
        };
        let (repo_type, repo_id) = match repo.strip_prefix("/datasets/") {
            Some(id) => ("dataset", id),
            None => ("model", repo.trim_start_matches('/')),
        };
        let Some((revision, file)) = rest.split_once('/') else {
            return not_found;
        };
        let served = match self.find(
            repo_type,
            &percent_decode(repo_id),
            &percent_decode(revision),
        ) {
            Ok(served) => served,
            Err(answer) => return answer,
        };
        let file = percent_decode(file);
        if file
            .split('/')
            .any(|p| p.is_empty() || p == "." || p == "..")
        {
            return not_found;
        }
        match std::fs::read(served.root.join(&file)) {
            Ok(bytes) => Answer::File {
                bytes,
                commit: served.commit.clone(),
            },
            Err(_) => not_found,
        }
    }
}

fn respond(
    stream: &mut TcpStream,
    status: u16,
    headers: &[(&str, String)],
    body: &[u8],
    head_only: bool,
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        206 => "Partial Content",
        401 => "Unauthorized",
        _ => "Not Found",
    };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str("\r\n");
    stream.write_all(out.as_bytes())?;
    if !head_only {
        stream.write_all(body)?;
    }
    stream.flush()
}

/// `bytes=START-[END]`.
fn parse_range(value: &str) -> Option<(usize, Option<usize>)> {
    let (a, b) = value.strip_prefix("bytes=")?.split_once('-')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()))
}

/// The API's answer for one revision: its files, sorted, relative to its root.
fn repo_info_json(served: &ServedRevision) -> String {
    let mut files = Vec::new();
    list_files(&served.root, "", &mut files);
    files.sort();
    let siblings: Vec<serde_json::Value> = files
        .into_iter()
        .map(|f| serde_json::json!({ "rfilename": f }))
        .collect();
    serde_json::json!({
        "_id": served.commit[..24],
        "id": served.repo_id,
        "sha": served.commit,
        "private": false,
        "siblings": siblings,
    })
    .to_string()
}

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
        if entry.path().is_dir() {
            list_files(&entry.path(), &rel, out);
        } else {
            out.push(rel);
        }
    }
}

/// `%XX` sequences decoded (invalid ones kept as they are).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// FNV-1a, 64 bits, from `seed`.
fn fnv(bytes: &[u8], seed: u64) -> u64 {
    bytes.iter().fold(seed, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// A stand-in commit hash (40 hex digits) for a revision.
fn commit_hash(key: &str) -> String {
    let b = key.as_bytes();
    let s = format!(
        "{:016x}{:016x}{:016x}",
        fnv(b, 0xcbf2_9ce4_8422_2325),
        fnv(b, 0x8422_2325_cbf2_9ce4),
        fnv(b, 0x1234_5678_9abc_def0)
    );
    s[..40].to_string()
}

/// A stand-in ETag: the content's length and two hashes (distinct files, distinct blobs).
fn content_hash(bytes: &[u8]) -> String {
    format!(
        "{:x}-{:016x}{:016x}",
        bytes.len(),
        fnv(bytes, 0xcbf2_9ce4_8422_2325),
        fnv(bytes, 0x8422_2325_cbf2_9ce4)
    )
}

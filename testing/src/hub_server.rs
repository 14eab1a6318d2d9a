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
//! and, for pushes (huggingface_hub's `create_repo` / `upload_folder`):
//!
//! - `POST /api/repos/create` (`name`, `organization`, `visibility`): the repository, empty,
//!   at `main` (409 with its `url` when it exists); a name alone goes into the namespace
//!   `tchtrain-user`;
//! - `POST /api/models/{id}/preupload/{rev}`: `lfs` for weights (`*.safetensors`, `*.bin`,
//!   `*.pt`, `*.pth`, ...), files of 10 MiB or more and binary samples, else `regular`;
//! - `POST /{id}.git/info/lfs/objects/batch` and `PUT /lfs-upload/{oid}` (its sha256 checked);
//!   with [`HubServerBuilder::multipart_chunk_size`], an object larger than the chunk size
//!   of a client that offers the `multipart` transfer is asked for in parts, as the hub
//!   does: the upload action's header holds `chunk_size` and the numbered part URLs
//!   (`PUT /lfs-part/{oid}/{n}`, each answered with an `ETag`), and its `href` is the
//!   completion endpoint (`POST /lfs-complete/{oid}`, `{"oid", "parts": [{"partNumber",
//!   "etag"}]}`: the parts and their etags checked, the whole object's sha256 too);
//! - `POST /api/models/{id}/commit/{rev}` (NDJSON: header, `file`, `lfsFile`): the files
//!   written into the revision, which then has a new commit hash and serves them
//!   ([`HubServer::commits`] lists what each commit held; [`HubServer::fail_commits`] makes
//!   commits fail with a 500, as an outage would).
//!
//! Revisions in paths may be percent-encoded (`refs%2Fconvert%2Fparquet`). Every request is
//! logged with its `Authorization` header ([`HubServer::requests`]). The server stops when
//! dropped or on [`HubServer::stop`]; connections are refused after that.

use std::collections::HashMap;
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

/// One commit pushed to the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushedCommit {
    /// The repository.
    pub repo_id: String,
    /// The branch.
    pub revision: String,
    /// The commit's summary (`commit_message`).
    pub message: String,
    /// The files it added, in order (repository paths).
    pub files: Vec<String>,
    /// Those of them uploaded through LFS.
    pub lfs_files: Vec<String>,
    /// Its hash.
    pub oid: String,
}

/// The repositories a [`HubServer`] will serve.
#[derive(Debug, Default)]
pub struct HubServerBuilder {
    revisions: Vec<ServedRevision>,
    multipart_chunk_size: Option<usize>,
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

    /// LFS objects larger than `bytes` are asked for in parts of `bytes` (the hub's
    /// multipart transfer) from clients that offer it.
    pub fn multipart_chunk_size(mut self, bytes: usize) -> Self {
        self.multipart_chunk_size = Some(bytes.max(1));
        self
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
        let pushed_root = std::env::temp_dir().join(format!(
            "tchtrain-hub-server-{}-{}",
            std::process::id(),
            addr.port()
        ));
        let state = Arc::new(State {
            revisions: Mutex::new(self.revisions),
            log: Mutex::new(Vec::new()),
            endpoint: format!("http://{addr}"),
            pushed_root,
            commits: Mutex::new(Vec::new()),
            lfs: Mutex::new(HashMap::new()),
            multipart_chunk_size: self.multipart_chunk_size,
            parts: Mutex::new(HashMap::new()),
            fail_commits: AtomicBool::new(false),
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
            .revisions()
            .iter()
            .find(|r| r.repo_id == repo_id && r.revision == revision)
            .map(|r| r.commit.clone())
    }

    /// The commits pushed so far, in order.
    pub fn commits(&self) -> Vec<PushedCommit> {
        self.state
            .commits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A pushed file's bytes at the head of `revision`.
    pub fn pushed_file(&self, repo_id: &str, revision: &str, path: &str) -> Option<Vec<u8>> {
        let root = self
            .state
            .revisions()
            .into_iter()
            .find(|r| r.repo_id == repo_id && r.revision == revision)?
            .root;
        std::fs::read(root.join(path)).ok()
    }

    /// Makes every later commit fail (HTTP 500) while `fail` is true.
    pub fn fail_commits(&self, fail: bool) {
        self.state.fail_commits.store(fail, Ordering::SeqCst);
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
        let _ = std::fs::remove_dir_all(&self.state.pushed_root);
    }
}

#[derive(Debug)]
struct State {
    revisions: Mutex<Vec<ServedRevision>>,
    log: Mutex<Vec<HubRequest>>,
    endpoint: String,
    /// Where pushed repositories' files are kept.
    pushed_root: PathBuf,
    commits: Mutex<Vec<PushedCommit>>,
    /// LFS objects uploaded, by sha256.
    lfs: Mutex<HashMap<String, Vec<u8>>>,
    /// [`HubServerBuilder::multipart_chunk_size`].
    multipart_chunk_size: Option<usize>,
    /// Parts of multipart uploads not completed yet, by (sha256, part number).
    parts: Mutex<HashMap<(String, usize), Vec<u8>>>,
    fail_commits: AtomicBool,
}

/// What a request resolved to.
enum Answer {
    Json(String),
    File {
        bytes: Vec<u8>,
        commit: String,
    },
    /// An uploaded part, acknowledged with its `ETag`.
    Part {
        etag: String,
    },
    Error {
        status: u16,
        code: &'static str,
    },
    Status {
        status: u16,
        body: String,
    },
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(bytes))
}

/// The hub's LFS rule as its default `.gitattributes` writes it, and its size and binary
/// checks.
fn goes_to_lfs(path: &str, size: u64, sample: &[u8]) -> bool {
    const LFS_SUFFIXES: [&str; 12] = [
        ".safetensors",
        ".bin",
        ".pt",
        ".pth",
        ".ckpt",
        ".h5",
        ".msgpack",
        ".model",
        ".onnx",
        ".pkl",
        ".npy",
        ".parquet",
    ];
    LFS_SUFFIXES.iter().any(|s| path.ends_with(s))
        || size >= 10 * 1024 * 1024
        || sample.contains(&0)
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
        let (mut range, mut authorization, mut length) = (None, None, 0usize);
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
                "content-length" => length = value.parse().unwrap_or(0),
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
        let mut body = vec![0u8; length];
        std::io::Read::read_exact(&mut reader, &mut body)?;
        let route = path.split('?').next().unwrap_or("");
        let answer = match method.as_str() {
            "POST" | "PUT" => self.write_route(&method, route, &body),
            _ => self.route(route),
        };
        let head = method == "HEAD";
        match answer {
            Answer::Json(body) => respond(
                &mut stream,
                200,
                &[("Content-Type", "application/json".into())],
                body.as_bytes(),
                head,
            ),
            Answer::Status { status, body } => respond(
                &mut stream,
                status,
                &[("Content-Type", "application/json".into())],
                body.as_bytes(),
                head,
            ),
            Answer::Part { etag } => respond(&mut stream, 200, &[("ETag", etag)], b"", head),
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

    fn revisions(&self) -> Vec<ServedRevision> {
        self.revisions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn find(
        &self,
        repo_type: &str,
        repo_id: &str,
        revision: &str,
    ) -> Result<ServedRevision, Answer> {
        let revisions = self.revisions();
        let mut of_repo = revisions
            .into_iter()
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

    /// The push endpoints (see the module documentation).
    fn write_route(&self, method: &str, path: &str, body: &[u8]) -> Answer {
        let json = |v: serde_json::Value| Answer::Status {
            status: 200,
            body: v.to_string(),
        };
        let bad = |status: u16, msg: &str| Answer::Status {
            status,
            body: serde_json::json!({ "error": msg }).to_string(),
        };
        let parse = || serde_json::from_slice::<serde_json::Value>(body).ok();
        if method == "PUT" {
            if let Some((oid, n)) = path
                .strip_prefix("/lfs-part/")
                .and_then(|rest| rest.split_once('/'))
            {
                let Ok(n) = n.parse::<usize>() else {
                    return bad(404, "no such part");
                };
                let etag = format!("\"{}\"", sha256_hex(body));
                self.parts
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert((oid.to_string(), n), body.to_vec());
                return Answer::Part { etag };
            }
            let Some(oid) = path.strip_prefix("/lfs-upload/") else {
                return bad(404, "no such endpoint");
            };
            if sha256_hex(body) != oid {
                return bad(400, "the uploaded bytes do not hash to the object id");
            }
            self.lfs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(oid.to_string(), body.to_vec());
            return json(serde_json::json!({}));
        }
        if let Some(oid) = path.strip_prefix("/lfs-complete/") {
            let Some(v) = parse() else {
                return bad(400, "invalid JSON");
            };
            if v["oid"].as_str() != Some(oid) {
                return bad(400, "the completion names another object");
            }
            let listed = v["parts"].as_array().cloned().unwrap_or_default();
            let mut parts = self.parts.lock().unwrap_or_else(|e| e.into_inner());
            let mut whole = Vec::new();
            for (i, part) in listed.iter().enumerate() {
                let n = i + 1;
                if part["partNumber"].as_u64() != Some(n as u64) {
                    return bad(400, "parts out of order");
                }
                let Some(bytes) = parts.get(&(oid.to_string(), n)) else {
                    return bad(400, "a part that was not uploaded");
                };
                if part["etag"].as_str() != Some(format!("\"{}\"", sha256_hex(bytes)).as_str()) {
                    return bad(400, "a part's etag does not match");
                }
                whole.extend_from_slice(bytes);
            }
            if sha256_hex(&whole) != oid {
                return bad(400, "the parts do not hash to the object id");
            }
            parts.retain(|(o, _), _| o != oid);
            self.lfs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(oid.to_string(), whole);
            return json(serde_json::json!({}));
        }
        if path == "/api/repos/create" {
            let Some(v) = parse() else {
                return bad(400, "invalid JSON");
            };
            let name = v["name"].as_str().unwrap_or_default();
            // `organization` null or absent: the token's namespace.
            let org = v["organization"].as_str().unwrap_or("tchtrain-user");
            let repo_id = format!("{org}/{name}");
            let mut revisions = self.revisions.lock().unwrap_or_else(|e| e.into_inner());
            if revisions.iter().any(|r| r.repo_id == repo_id) {
                return Answer::Status {
                    status: 409,
                    body: serde_json::json!({"error": "You already created this model repo", "url": format!("{}/{repo_id}", self.endpoint)}).to_string(),
                };
            }
            let root = self.pushed_root.join(&repo_id).join("main");
            let _ = std::fs::create_dir_all(&root);
            revisions.push(ServedRevision {
                repo_type: "model",
                repo_id: repo_id.clone(),
                revision: "main".into(),
                commit: commit_hash(&format!("model/{repo_id}@main#0")),
                root,
            });
            return json(
                serde_json::json!({"url": format!("{}/{repo_id}", self.endpoint), "name": repo_id}),
            );
        }
        if let Some(repo) = path
            .strip_suffix(".git/info/lfs/objects/batch")
            .map(|r| r.trim_start_matches('/'))
        {
            let Some(v) = parse() else {
                return bad(400, "invalid JSON");
            };
            let stored = self.lfs.lock().unwrap_or_else(|e| e.into_inner());
            let offers_multipart = v["transfers"]
                .as_array()
                .is_some_and(|t| t.iter().any(|x| x.as_str() == Some("multipart")));
            let chunk = self.multipart_chunk_size.filter(|_| offers_multipart);
            let objects: Vec<serde_json::Value> = v["objects"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(|o| {
                    let oid = o["oid"].as_str().unwrap_or_default().to_string();
                    let size = o["size"].as_u64().unwrap_or(0) as usize;
                    let mut answer = serde_json::json!({"oid": oid, "size": o["size"], "authenticated": true});
                    if stored.contains_key(&oid) {
                        return answer;
                    }
                    answer["actions"] = match chunk.filter(|c| size > *c) {
                        Some(c) => {
                            let mut header = serde_json::Map::new();
                            header.insert("chunk_size".into(), serde_json::json!(c.to_string()));
                            for n in 1..=size.div_ceil(c) {
                                header.insert(
                                    n.to_string(),
                                    serde_json::json!(format!("{}/lfs-part/{oid}/{n}", self.endpoint)),
                                );
                            }
                            serde_json::json!({"upload": {
                                "href": format!("{}/lfs-complete/{oid}", self.endpoint),
                                "header": header,
                            }})
                        }
                        None => serde_json::json!({"upload": {"href": format!("{}/lfs-upload/{oid}", self.endpoint)}}),
                    };
                    answer
                })
                .collect();
            let _ = repo;
            let transfer = if chunk.is_some() {
                "multipart"
            } else {
                "basic"
            };
            return json(serde_json::json!({"transfer": transfer, "objects": objects}));
        }
        let Some(rest) = path.strip_prefix("/api/models/") else {
            return bad(404, "no such endpoint");
        };
        if let Some((repo_id, revision)) = rest.split_once("/preupload/") {
            let Some(v) = parse() else {
                return bad(400, "invalid JSON");
            };
            if let Err(answer) = self.find("model", repo_id, &percent_decode(revision)) {
                return answer;
            }
            let files: Vec<serde_json::Value> = v["files"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(|f| {
                    let path = f["path"].as_str().unwrap_or_default().to_string();
                    let sample = decode_base64(f["sample"].as_str().unwrap_or_default());
                    let size = f["size"].as_u64().unwrap_or(0);
                    let mode = if goes_to_lfs(&path, size, &sample) {
                        "lfs"
                    } else {
                        "regular"
                    };
                    serde_json::json!({"path": path, "uploadMode": mode, "shouldIgnore": false})
                })
                .collect();
            return json(serde_json::json!({"files": files, "commitOid": null}));
        }
        let Some((repo_id, revision)) = rest.split_once("/commit/") else {
            return bad(404, "no such endpoint");
        };
        let revision = percent_decode(revision);
        let served = match self.find("model", repo_id, &revision) {
            Ok(s) => s,
            Err(answer) => return answer,
        };
        if self.fail_commits.load(Ordering::SeqCst) {
            return bad(
                500,
                "Internal Error - We're working hard to fix this as soon as possible!",
            );
        }
        let text = String::from_utf8_lossy(body);
        let (mut message, mut files, mut lfs_files) = (String::new(), Vec::new(), Vec::new());
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                return bad(400, "invalid NDJSON line");
            };
            let value = &v["value"];
            match v["key"].as_str() {
                Some("header") => message = value["summary"].as_str().unwrap_or_default().into(),
                Some("file") => {
                    let path = value["path"].as_str().unwrap_or_default().to_string();
                    let bytes = decode_base64(value["content"].as_str().unwrap_or_default());
                    let target = served.root.join(&path);
                    if let Some(parent) = target.parent() {
                        let _ = std::fs::create_dir_all(parent);
                    }
                    if std::fs::write(&target, bytes).is_err() {
                        return bad(500, "writing the file");
                    }
                    files.push(path);
                }
                Some("lfsFile") => {
                    let path = value["path"].as_str().unwrap_or_default().to_string();
                    let oid = value["oid"].as_str().unwrap_or_default();
                    let Some(bytes) = self
                        .lfs
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get(oid)
                        .cloned()
                    else {
                        return bad(422, "an LFS file whose object was not uploaded");
                    };
                    let target = served.root.join(&path);
                    if let Some(parent) = target.parent() {
                        let _ = std::fs::create_dir_all(parent);
                    }
                    if std::fs::write(&target, bytes).is_err() {
                        return bad(500, "writing the file");
                    }
                    files.push(path.clone());
                    lfs_files.push(path);
                }
                _ => return bad(400, "unknown NDJSON key"),
            }
        }
        let mut commits = self.commits.lock().unwrap_or_else(|e| e.into_inner());
        let oid = commit_hash(&format!("{repo_id}@{revision}#{}", commits.len() + 1));
        {
            let mut revisions = self.revisions.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(r) = revisions
                .iter_mut()
                .find(|r| r.repo_id == repo_id && r.revision == revision)
            {
                r.commit = oid.clone();
            }
        }
        commits.push(PushedCommit {
            repo_id: repo_id.to_string(),
            revision: revision.clone(),
            message,
            files,
            lfs_files,
            oid: oid.clone(),
        });
        json(serde_json::json!({
            "commitUrl": format!("{}/{repo_id}/commit/{oid}", self.endpoint),
            "commitOid": oid,
            "success": true,
        }))
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
                Ok(served) => Answer::Json(repo_info_json(&served)),
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

/// Standard base64 (with padding) decoded; invalid input gives what decodes.
fn decode_base64(text: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .unwrap_or_default()
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
        400 => "Bad Request",
        401 => "Unauthorized",
        409 => "Conflict",
        422 => "Unprocessable Entity",
        500 => "Internal Server Error",
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

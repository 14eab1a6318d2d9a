//! The parts of W&B's API a run in online mode uses, as wandb-core (wandb 0.31) uses them:
//! GraphQL's `UpsertBucket` (the run: its name, project, entity, display name, config) and
//! `CreateRunFiles` (upload URLs for the run's files), the file stream
//! (`POST <base>/files/<entity>/<project>/<run>/file_stream`: history lines by offset, the
//! summary, at the end `complete`, `exitcode` and the uploaded files' names), and the uploads
//! themselves (`PUT` to the URLs handed out); for artifacts, the SDK's `ArtifactType` query and
//! wandb-core's `CreateArtifact`, `CreateArtifactManifest`, `CreateArtifactFiles` and
//! `CommitArtifact` (see [`Artifact::upload`](crate::wandb_artifact::Artifact::upload)).
//! Authentication is HTTP basic `api:<API key>`.

use std::time::Duration;

use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::mlflow_rest::base64;

/// wandb-core's `UpsertBucket` mutation.
const UPSERT_BUCKET: &str = "mutation UpsertBucket ($id: String, $name: String, $project: String, $entity: String, $groupName: String, $description: String, $displayName: String, $notes: String, $commit: String, $config: JSONString, $host: String, $debug: Boolean, $program: String, $repo: String, $jobType: String, $state: String, $sweep: String, $tags: [String!], $summaryMetrics: JSONString) {
	upsertBucket(input: {id:$id,name:$name,groupName:$groupName,modelName:$project,entityName:$entity,description:$description,displayName:$displayName,notes:$notes,config:$config,commit:$commit,host:$host,debug:$debug,jobProgram:$program,jobRepo:$repo,jobType:$jobType,state:$state,sweep:$sweep,tags:$tags,summaryMetrics:$summaryMetrics}) {
		bucket {
			id
			name
			displayName
			description
			config
			sweepName
			project {
				id
				name
				entity {
					id
					name
				}
			}
			historyLineCount
		}
		inserted
	}
}";

/// wandb-core's `CreateRunFiles` mutation.
const CREATE_RUN_FILES: &str = "mutation CreateRunFiles ($entity: String!, $project: String!, $run: String!, $files: [String!]!) {
	createRunFiles(input: {entityName:$entity,projectName:$project,runName:$run,files:$files}) {
		runID
		uploadHeaders
		files {
			name
			uploadUrl
		}
	}
}";

/// The SDK's `ArtifactType` query (`run.log_artifact` asks the type of the artifact's latest
/// version first; sent without an operation name, as the SDK sends it).
const ARTIFACT_TYPE: &str = "\nquery ArtifactType($entity: String, $project: String, $name: String!) {\n  project(name: $project, entityName: $entity) {\n    artifact(name: $name) {\n      artifactType {\n        name\n      }\n    }\n  }\n}\n";

/// wandb-core's `CreateArtifact` mutation.
const CREATE_ARTIFACT: &str = "\nmutation CreateArtifact ($input: CreateArtifactInput!) {\n\tcreateArtifact(input: $input) {\n\t\t... CreatedArtifact\n\t}\n}\nfragment CreatedArtifact on CreateArtifactPayload {\n\tartifact {\n\t\tid\n\t\tstate\n\t\tartifactSequence {\n\t\t\tlatestArtifact {\n\t\t\t\tid\n\t\t\t}\n\t\t}\n\t}\n}\n";

/// wandb-core's `CreateArtifactManifest` mutation.
const CREATE_ARTIFACT_MANIFEST: &str = "\nmutation CreateArtifactManifest ($artifactID: ID!, $baseArtifactID: ID, $name: String!, $digest: String!, $entityName: String!, $projectName: String!, $runName: String!, $manifestType: ArtifactManifestType!, $includeUpload: Boolean!) {\n\tcreateArtifactManifest(input: {artifactID:$artifactID,baseArtifactID:$baseArtifactID,name:$name,digest:$digest,entityName:$entityName,projectName:$projectName,runName:$runName,type:$manifestType}) {\n\t\tartifactManifest {\n\t\t\tid\n\t\t\tfile {\n\t\t\t\tid\n\t\t\t\tuploadUrl @include(if: $includeUpload)\n\t\t\t\tuploadHeaders @include(if: $includeUpload)\n\t\t\t}\n\t\t}\n\t}\n}\n";

/// wandb-core's `CreateArtifactFiles` mutation.
const CREATE_ARTIFACT_FILES: &str = "\nmutation CreateArtifactFiles ($input: CreateArtifactFilesInput!) {\n\tcreateArtifactFiles(input: $input) {\n\t\tfiles {\n\t\t\tedges {\n\t\t\t\tnode {\n\t\t\t\t\tstoragePath\n\t\t\t\t\tuploadUrl\n\t\t\t\t\tuploadHeaders\n\t\t\t\t\tuploadMultipartUrls {\n\t\t\t\t\t\tuploadID\n\t\t\t\t\t\tuploadUrlParts {\n\t\t\t\t\t\t\tpartNumber\n\t\t\t\t\t\t\tuploadUrl\n\t\t\t\t\t\t}\n\t\t\t\t\t}\n\t\t\t\t\tartifact {\n\t\t\t\t\t\tid\n\t\t\t\t\t}\n\t\t\t\t}\n\t\t\t}\n\t\t}\n\t}\n}\n";

/// wandb-core's `CommitArtifact` mutation.
const COMMIT_ARTIFACT: &str = "\nmutation CommitArtifact ($artifactID: ID!) {\n\tcommitArtifact(input: {artifactID:$artifactID}) {\n\t\tartifact {\n\t\t\tid\n\t\t\tdigest\n\t\t}\n\t}\n}\n";

/// Where a run lives on the server, from `UpsertBucket`'s answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RunPath {
    pub entity: String,
    pub project: String,
    pub run: String,
}

/// A blocking client for one W&B server.
pub(crate) struct WandbApi {
    base_url: String,
    agent: ureq::Agent,
    authorization: String,
}

impl std::fmt::Debug for WandbApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WandbApi")
            .field("base_url", &self.base_url)
            .finish()
    }
}

impl WandbApi {
    /// A client for `base_url` (`WANDB_BASE_URL`) with `api_key`.
    pub fn new(base_url: &str, api_key: &str, timeout: Duration) -> Self {
        Self {
            base_url: base_url.trim_end_matches('/').to_string(),
            agent: ureq::AgentBuilder::new().timeout(timeout).build(),
            authorization: format!("Basic {}", base64(format!("api:{api_key}").as_bytes())),
        }
    }

    fn error(&self, operation: &str, status: Option<u16>, message: String) -> Error {
        Error::WandbRequest {
            operation: operation.to_string(),
            base_url: self.base_url.clone(),
            status,
            message,
        }
    }

    fn send(&self, operation: &str, url: &str, body: &Value) -> Result<Value> {
        let response = self
            .agent
            .post(url)
            .set("Authorization", &self.authorization)
            .set("Content-Type", "application/json")
            .set(
                "User-Agent",
                concat!("tchtrain/", env!("CARGO_PKG_VERSION")),
            )
            .send_string(&body.to_string());
        match response {
            Ok(r) => {
                let text = r
                    .into_string()
                    .map_err(|e| self.error(operation, None, format!("reading the answer: {e}")))?;
                serde_json::from_str(&text).map_err(|e| {
                    self.error(
                        operation,
                        None,
                        format!("the answer is not JSON ({e}): {text}"),
                    )
                })
            }
            Err(ureq::Error::Status(status, r)) => {
                let text = r.into_string().unwrap_or_default();
                let hint = match status {
                    401 | 403 => " (check WANDB_API_KEY, or `wandb login`)",
                    _ => "",
                };
                Err(self.error(operation, Some(status), format!("{}{hint}", text.trim())))
            }
            Err(ureq::Error::Transport(t)) => Err(self.error(
                operation,
                None,
                format!("cannot reach the W&B server ({t}); is WANDB_BASE_URL right?"),
            )),
        }
    }

    fn graphql(&self, operation: &str, query: &str, variables: Value) -> Result<Value> {
        self.graphql_named(operation, operation, query, variables)
    }

    /// A GraphQL request whose `operationName` (`sent`) may differ from the name errors give
    /// it (the SDK sends `ArtifactType` without one).
    fn graphql_named(
        &self,
        operation: &str,
        sent: &str,
        query: &str,
        variables: Value,
    ) -> Result<Value> {
        let body = json!({"operationName": sent, "query": query, "variables": variables});
        let answer = self.send(operation, &format!("{}/graphql", self.base_url), &body)?;
        if let Some(errors) = answer.get("errors").filter(|e| !e.is_null()) {
            return Err(self.error(operation, None, errors.to_string()));
        }
        Ok(answer["data"].clone())
    }

    /// `UpsertBucket`: creates (or updates) the run; where the server put it.
    pub fn upsert_bucket(&self, variables: Value) -> Result<RunPath> {
        let data = self.graphql("UpsertBucket", UPSERT_BUCKET, variables)?;
        let bucket = &data["upsertBucket"]["bucket"];
        let text = |v: &Value| v.as_str().map(str::to_string);
        match (
            text(&bucket["project"]["entity"]["name"]),
            text(&bucket["project"]["name"]),
            text(&bucket["name"]),
        ) {
            (Some(entity), Some(project), Some(run)) => Ok(RunPath {
                entity,
                project,
                run,
            }),
            _ => Err(self.error(
                "UpsertBucket",
                None,
                format!("the answer names no run, project and entity: {data}"),
            )),
        }
    }

    /// One post to the run's file stream.
    pub fn file_stream(&self, path: &RunPath, body: &Value) -> Result<()> {
        let url = format!(
            "{}/files/{}/{}/{}/file_stream",
            self.base_url, path.entity, path.project, path.run
        );
        self.send("file_stream", &url, body).map(|_| ())
    }

    /// `CreateRunFiles`, then each file `PUT` to the URL handed out (with the headers handed
    /// out).
    pub fn upload_run_files(&self, path: &RunPath, files: &[(&str, Vec<u8>)]) -> Result<()> {
        let names: Vec<&str> = files.iter().map(|(n, _)| *n).collect();
        let data = self.graphql(
            "CreateRunFiles",
            CREATE_RUN_FILES,
            json!({"entity": path.entity, "project": path.project, "run": path.run, "files": names}),
        )?;
        let answer = &data["createRunFiles"];
        let headers = headers(&answer["uploadHeaders"]);
        for (name, bytes) in files {
            let url = answer["files"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|f| f["name"] == *name)
                .and_then(|f| f["uploadUrl"].as_str())
                .ok_or_else(|| {
                    self.error("CreateRunFiles", None, format!("no upload URL for {name}"))
                })?;
            self.put(name, url, &headers, bytes)?;
        }
        Ok(())
    }
}

/// `uploadHeaders` (`Key:Value` texts) as pairs.
fn headers(v: &Value) -> Vec<(String, String)> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| h.as_str()?.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// Where a file goes: the URL handed out and its headers (`None`: the server has it).
pub(crate) type Upload = Option<(String, Vec<(String, String)>)>;

impl WandbApi {
    /// The SDK's `ArtifactType`: the type of `name` (`<collection>:latest`) in the project,
    /// `None` when there is no such artifact.
    pub fn artifact_type(&self, entity: &str, project: &str, name: &str) -> Result<Option<String>> {
        let data = self.graphql_named(
            "ArtifactType",
            "",
            ARTIFACT_TYPE,
            json!({"entity": entity, "project": project, "name": name}),
        )?;
        Ok(data["project"]["artifact"]["artifactType"]["name"]
            .as_str()
            .map(str::to_string))
    }

    /// `CreateArtifact`: the new artifact's id.
    pub fn create_artifact(&self, input: Value) -> Result<String> {
        let data = self.graphql("CreateArtifact", CREATE_ARTIFACT, json!({ "input": input }))?;
        data["createArtifact"]["artifact"]["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| {
                self.error(
                    "CreateArtifact",
                    None,
                    format!("the answer names no artifact: {data}"),
                )
            })
    }

    /// `CreateArtifactManifest`: its id, and where to upload it when `includeUpload`.
    pub fn create_artifact_manifest(&self, variables: Value) -> Result<(String, Upload)> {
        let data = self.graphql(
            "CreateArtifactManifest",
            CREATE_ARTIFACT_MANIFEST,
            variables,
        )?;
        let manifest = &data["createArtifactManifest"]["artifactManifest"];
        let id = manifest["id"].as_str().map(str::to_string).ok_or_else(|| {
            self.error(
                "CreateArtifactManifest",
                None,
                format!("the answer names no manifest: {data}"),
            )
        })?;
        let upload = manifest["file"]["uploadUrl"]
            .as_str()
            .map(|url| (url.to_string(), headers(&manifest["file"]["uploadHeaders"])));
        Ok((id, upload))
    }

    /// `CreateArtifactFiles`: where each file asked for goes, in the order asked.
    pub fn create_artifact_files(&self, input: Value, n: usize) -> Result<Vec<Upload>> {
        let data = self.graphql(
            "CreateArtifactFiles",
            CREATE_ARTIFACT_FILES,
            json!({ "input": input }),
        )?;
        let edges = data["createArtifactFiles"]["files"]["edges"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if edges.len() != n {
            return Err(self.error(
                "CreateArtifactFiles",
                None,
                format!("{} upload URLs for {n} files: {data}", edges.len()),
            ));
        }
        Ok(edges
            .iter()
            .map(|e| {
                let node = &e["node"];
                node["uploadUrl"]
                    .as_str()
                    .map(|url| (url.to_string(), headers(&node["uploadHeaders"])))
            })
            .collect())
    }

    /// `CommitArtifact`.
    pub fn commit_artifact(&self, artifact_id: &str) -> Result<()> {
        self.graphql(
            "CommitArtifact",
            COMMIT_ARTIFACT,
            json!({ "artifactID": artifact_id }),
        )
        .map(|_| ())
    }

    /// `PUT`s the file at `path` (`size` bytes, streamed) to a URL handed out, with its
    /// headers.
    pub fn put_file(
        &self,
        what: &str,
        url: &str,
        headers: &[(String, String)],
        path: &std::path::Path,
        size: u64,
    ) -> Result<()> {
        let file = std::fs::File::open(path).map_err(|e| Error::Io {
            action: "reading",
            path: path.to_path_buf(),
            source: e,
        })?;
        let mut request = self.agent.put(url).set("Content-Length", &size.to_string());
        for (k, v) in headers {
            request = request.set(k, v);
        }
        request
            .send(file)
            .map(|_| ())
            .map_err(|e| self.error(&format!("uploading {what}"), None, e.to_string()))
    }

    /// `PUT`s `bytes` to a URL handed out, with its headers.
    pub fn put(
        &self,
        what: &str,
        url: &str,
        headers: &[(String, String)],
        bytes: &[u8],
    ) -> Result<()> {
        let mut request = self.agent.put(url);
        for (k, v) in headers {
            request = request.set(k, v);
        }
        request
            .send_bytes(bytes)
            .map(|_| ())
            .map_err(|e| self.error(&format!("uploading {what}"), None, e.to_string()))
    }
}

/// A run's file stream: the history lines in order (each sent once, at its offset in
/// `wandb-history.jsonl`), the whole summary with every post, the end of the run last.
#[derive(Debug)]
pub(crate) struct FileStream {
    pub api: WandbApi,
    pub path: RunPath,
    /// Lines the server has taken.
    offset: usize,
    /// Lines not taken yet (a failed post keeps them for the next).
    pending: Vec<String>,
}

impl FileStream {
    pub fn new(api: WandbApi, path: RunPath) -> Self {
        Self {
            api,
            path,
            offset: 0,
            pending: Vec::new(),
        }
    }

    /// A history line to send with the next post.
    pub fn push(&mut self, line: String) {
        self.pending.push(line);
    }

    /// Posts the pending history lines and `summary` (and `end`'s keys: `complete`,
    /// `exitcode`, `uploaded`); on failure the lines stay pending.
    pub fn post(&mut self, summary: &str, end: Option<&Value>) -> Result<()> {
        let mut files = serde_json::Map::new();
        if !self.pending.is_empty() {
            files.insert(
                "wandb-history.jsonl".into(),
                json!({"offset": self.offset, "content": self.pending}),
            );
        }
        files.insert(
            "wandb-summary.json".into(),
            json!({"offset": 0, "content": [summary]}),
        );
        let mut body = json!({ "files": files });
        if let Some(Value::Object(end)) = end {
            for (k, v) in end {
                body[k] = v.clone();
            }
        }
        self.api.file_stream(&self.path, &body)?;
        self.offset += self.pending.len();
        self.pending.clear();
        Ok(())
    }
}

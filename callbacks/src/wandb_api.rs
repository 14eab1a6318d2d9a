//! The parts of W&B's API a run in online mode uses, as wandb-core (wandb 0.31) uses them:
//! GraphQL's `UpsertBucket` (the run: its name, project, entity, display name, config) and
//! `CreateRunFiles` (upload URLs for the run's files), the file stream
//! (`POST <base>/files/<entity>/<project>/<run>/file_stream`: history lines by offset, the
//! summary, at the end `complete`, `exitcode` and the uploaded files' names), and the uploads
//! themselves (`PUT` to the URLs handed out). Authentication is HTTP basic `api:<API key>`.

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
        let body = json!({"operationName": operation, "query": query, "variables": variables});
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
        let headers: Vec<(String, String)> = answer["uploadHeaders"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|h| h.as_str()?.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
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
            let mut request = self.agent.put(url);
            for (k, v) in &headers {
                request = request.set(k, v);
            }
            request
                .send_bytes(bytes)
                .map_err(|e| self.error(&format!("uploading {name}"), None, e.to_string()))?;
        }
        Ok(())
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

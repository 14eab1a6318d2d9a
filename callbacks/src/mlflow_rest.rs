//! A small blocking client for the parts of MLflow's REST API (`/api/2.0/mlflow/...`) that
//! `MLflowCallback` uses: experiments, runs, batched params / metrics / tags.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::error::{Error, Result};

/// MLflow's `MAX_PARAMS_TAGS_PER_BATCH` (mlflow/utils/validation.py).
pub(crate) const MAX_PARAMS_TAGS_PER_BATCH: usize = 100;
/// MLflow's `MAX_METRICS_PER_BATCH`.
pub(crate) const MAX_METRICS_PER_BATCH: usize = 1000;

/// Milliseconds since the Unix epoch (MLflow's timestamps).
pub(crate) fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A metric value as MLflow's protobuf JSON carries it: non-finite values as strings.
fn metric_value(v: f64) -> Value {
    if v.is_nan() {
        json!("NaN")
    } else if v.is_infinite() {
        json!(if v > 0.0 { "Infinity" } else { "-Infinity" })
    } else {
        json!(v)
    }
}

/// Standard base64 (RFC 4648, with padding), for HTTP basic authentication (and W&B's
/// artifact digests).
pub(crate) fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The server's answer to `experiments/get-by-name`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Experiment {
    pub experiment_id: String,
    pub lifecycle_stage: String,
}

/// What `runs/get` says of a run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RunInfo {
    pub experiment_id: String,
    pub lifecycle_stage: String,
    pub end_time: Option<i64>,
}

/// Blocking MLflow REST client over one tracking URI.
pub(crate) struct MlflowRestClient {
    uri: String,
    agent: ureq::Agent,
    authorization: Option<String>,
}

impl std::fmt::Debug for MlflowRestClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MlflowRestClient")
            .field("uri", &self.uri)
            .field("authorization", &self.authorization.as_ref().map(|_| "***"))
            .finish()
    }
}

impl MlflowRestClient {
    /// A client for `uri` (`http(s)://host:port[/prefix]`), with MLflow's credentials when given.
    pub fn new(
        uri: &str,
        timeout: Duration,
        username: Option<&str>,
        password: Option<&str>,
        token: Option<&str>,
    ) -> Self {
        let authorization = match (username, password, token) {
            (Some(u), Some(p), _) => {
                Some(format!("Basic {}", base64(format!("{u}:{p}").as_bytes())))
            }
            (_, _, Some(t)) => Some(format!("Bearer {t}")),
            _ => None,
        };
        Self {
            uri: uri.trim_end_matches('/').to_string(),
            agent: ureq::AgentBuilder::new().timeout(timeout).build(),
            authorization,
        }
    }

    fn url(&self, endpoint: &str) -> String {
        format!("{}/api/2.0/mlflow/{endpoint}", self.uri)
    }

    fn finish(
        &self,
        endpoint: &'static str,
        response: std::result::Result<ureq::Response, ureq::Error>,
    ) -> Result<Value> {
        let error = |status: Option<u16>, error_code: Option<String>, message: String| {
            Error::MlflowRequest {
                endpoint,
                uri: self.uri.clone(),
                status,
                error_code,
                message,
            }
        };
        match response {
            Ok(r) => {
                let text = r
                    .into_string()
                    .map_err(|e| error(None, None, format!("reading the answer: {e}")))?;
                if text.trim().is_empty() {
                    return Ok(Value::Object(Default::default()));
                }
                serde_json::from_str(&text)
                    .map_err(|e| error(None, None, format!("the answer is not JSON ({e}): {text}")))
            }
            Err(ureq::Error::Status(status, r)) => {
                let text = r.into_string().unwrap_or_default();
                let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                let code = body["error_code"].as_str().map(str::to_string);
                let message = body["message"]
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("HTTP {status}: {}", text.trim()));
                Err(error(Some(status), code, message))
            }
            Err(ureq::Error::Transport(t)) => Err(error(
                None,
                None,
                format!(
                    "cannot reach the tracking server ({t}); is `mlflow server` running there?"
                ),
            )),
        }
    }

    fn get(&self, endpoint: &'static str, query: &[(&str, &str)]) -> Result<Value> {
        let mut request = self.agent.get(&self.url(endpoint));
        for (k, v) in query {
            request = request.query(k, v);
        }
        if let Some(a) = &self.authorization {
            request = request.set("Authorization", a);
        }
        self.finish(endpoint, request.call())
    }

    fn post(&self, endpoint: &'static str, body: &Value) -> Result<Value> {
        let mut request = self
            .agent
            .post(&self.url(endpoint))
            .set("Content-Type", "application/json");
        if let Some(a) = &self.authorization {
            request = request.set("Authorization", a);
        }
        self.finish(endpoint, request.send_string(&body.to_string()))
    }

    /// `experiments/get-by-name`; `None` when the server has no such experiment.
    pub fn get_experiment_by_name(&self, name: &str) -> Result<Option<Experiment>> {
        match self.get("experiments/get-by-name", &[("experiment_name", name)]) {
            Ok(v) => Ok(Some(Experiment {
                experiment_id: v["experiment"]["experiment_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                lifecycle_stage: v["experiment"]["lifecycle_stage"]
                    .as_str()
                    .unwrap_or("active")
                    .to_string(),
            })),
            Err(Error::MlflowRequest {
                error_code: Some(code),
                ..
            }) if code == "RESOURCE_DOES_NOT_EXIST" => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `experiments/get`: whether the experiment exists.
    pub fn get_experiment(&self, experiment_id: &str) -> Result<()> {
        self.get("experiments/get", &[("experiment_id", experiment_id)])
            .map(|_| ())
    }

    /// `experiments/create`; the new experiment's id.
    pub fn create_experiment(&self, name: &str) -> Result<String> {
        let v = self.post("experiments/create", &json!({ "name": name }))?;
        Ok(v["experiment_id"].as_str().unwrap_or_default().to_string())
    }

    /// `runs/create`; the new run's id.
    pub fn create_run(
        &self,
        experiment_id: &str,
        user_id: &str,
        run_name: Option<&str>,
        tags: &[(String, String)],
    ) -> Result<String> {
        let mut body = json!({
            "experiment_id": experiment_id,
            "user_id": user_id,
            "start_time": now_millis(),
            "tags": tags.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>(),
        });
        if let Some(name) = run_name {
            body["run_name"] = json!(name);
        }
        let v = self.post("runs/create", &body)?;
        Ok(v["run"]["info"]["run_id"]
            .as_str()
            .unwrap_or_default()
            .to_string())
    }

    /// `runs/get`: the run's experiment, lifecycle stage and end time.
    pub fn get_run(&self, run_id: &str) -> Result<RunInfo> {
        let v = self.get("runs/get", &[("run_id", run_id)])?;
        let info = &v["run"]["info"];
        Ok(RunInfo {
            experiment_id: info["experiment_id"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            lifecycle_stage: info["lifecycle_stage"]
                .as_str()
                .unwrap_or("active")
                .to_string(),
            end_time: info["end_time"].as_i64(),
        })
    }

    /// `runs/update`: the status (`RUNNING`, `FINISHED`, ...), end time and name.
    pub fn update_run(
        &self,
        run_id: &str,
        status: &str,
        end_time: Option<i64>,
        run_name: Option<&str>,
    ) -> Result<()> {
        let mut body = json!({ "run_id": run_id, "status": status });
        if let Some(t) = end_time {
            body["end_time"] = json!(t);
        }
        if let Some(name) = run_name {
            body["run_name"] = json!(name);
        }
        self.post("runs/update", &body).map(|_| ())
    }

    /// `runs/log-batch` with params (at most [`MAX_PARAMS_TAGS_PER_BATCH`]).
    pub fn log_params(&self, run_id: &str, params: &[(String, String)]) -> Result<()> {
        let params: Vec<Value> = params
            .iter()
            .map(|(k, v)| json!({"key": k, "value": v}))
            .collect();
        self.post(
            "runs/log-batch",
            &json!({ "run_id": run_id, "params": params }),
        )
        .map(|_| ())
    }

    /// `runs/log-batch` with tags (at most [`MAX_PARAMS_TAGS_PER_BATCH`]).
    pub fn set_tags(&self, run_id: &str, tags: &[(String, String)]) -> Result<()> {
        let tags: Vec<Value> = tags
            .iter()
            .map(|(k, v)| json!({"key": k, "value": v}))
            .collect();
        self.post("runs/log-batch", &json!({ "run_id": run_id, "tags": tags }))
            .map(|_| ())
    }

    /// `runs/log-batch` with metrics at `step` (at most [`MAX_METRICS_PER_BATCH`]).
    pub fn log_metrics(&self, run_id: &str, metrics: &[(String, f64)], step: i64) -> Result<()> {
        let timestamp = now_millis();
        let metrics: Vec<Value> = metrics
            .iter()
            .map(|(k, v)| json!({"key": k, "value": metric_value(*v), "timestamp": timestamp, "step": step}))
            .collect();
        self.post(
            "runs/log-batch",
            &json!({ "run_id": run_id, "metrics": metrics }),
        )
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (input, want) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(input.as_bytes()), want);
        }
    }

    #[test]
    fn non_finite_metrics_are_protobuf_json_strings() {
        assert_eq!(metric_value(f64::NAN), json!("NaN"));
        assert_eq!(metric_value(f64::INFINITY), json!("Infinity"));
        assert_eq!(metric_value(f64::NEG_INFINITY), json!("-Infinity"));
        assert_eq!(metric_value(0.5), json!(0.5));
    }
}

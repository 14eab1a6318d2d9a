//! `MLflowSettings`: the environment variables upstream's `MLflowCallback` and the `mlflow`
//! package read, checked once, with a typed refusal for what this crate cannot honour.

use std::time::Duration;

use crate::error::{Error, Result};
use tchtrain_training_args::{JsonMap, JsonValue, loads};

/// transformers' `ENV_VARS_TRUE_VALUES`, compared after `upper()`.
fn env_true(value: Option<&str>) -> bool {
    value.is_some_and(|v| matches!(v.to_uppercase().as_str(), "1" | "ON" | "YES" | "TRUE"))
}

/// Upstream `is_mlflow_available`'s analogue, for `report_to="all"`: the integration is not
/// disabled (`DISABLE_MLFLOW_INTEGRATION=TRUE`) and a tracking server is named
/// (`MLFLOW_TRACKING_URI`; upstream asks whether the `mlflow` package is installed).
pub fn is_mlflow_available() -> bool {
    !is_mlflow_disabled(|k| std::env::var(k).ok())
        && std::env::var_os("MLFLOW_TRACKING_URI").is_some()
}

fn is_mlflow_disabled(lookup: impl Fn(&str) -> Option<String>) -> bool {
    lookup("DISABLE_MLFLOW_INTEGRATION").is_some_and(|v| v.to_uppercase() == "TRUE")
}

/// What `MLflowCallback` reads from the environment (upstream `MLflowCallback.setup`, and the
/// `mlflow` package's own variables it relies on). `Debug` hides the password and token.
#[derive(Clone, PartialEq)]
pub struct MLflowSettings {
    /// `MLFLOW_TRACKING_URI`: the tracking server, `http://` or `https://`.
    pub tracking_uri: String,
    /// `MLFLOW_EXPERIMENT_NAME`: the experiment, created when missing; `None` logs into
    /// `experiment_id` or MLflow's `Default` experiment (id `"0"`).
    pub experiment_name: Option<String>,
    /// `MLFLOW_EXPERIMENT_ID` (read by the `mlflow` package): the experiment when no name is given.
    pub experiment_id: Option<String>,
    /// `MLFLOW_RUN_ID`: resume this run (its status goes back to `RUNNING`).
    pub run_id: Option<String>,
    /// `MLFLOW_TAGS`: a JSON object of tags set on the run (values as Python's `str()`).
    pub tags: JsonMap,
    /// `MLFLOW_NESTED_RUN`: start a child run of the active run.
    pub nested_run: bool,
    /// `MLFLOW_FLATTEN_PARAMS`: flatten nested dicts into `parent.child` params.
    pub flatten_params: bool,
    /// `MLFLOW_MAX_LOG_PARAMS`: log at most this many params (upstream ignores a value that is
    /// not all digits).
    pub max_log_params: Option<usize>,
    /// `MLFLOW_TRACKING_USERNAME` / `MLFLOW_TRACKING_PASSWORD`: HTTP basic authentication.
    pub username: Option<String>,
    /// See [`MLflowSettings::username`].
    pub password: Option<String>,
    /// `MLFLOW_TRACKING_TOKEN`: a bearer token (used when no username and password are set).
    pub token: Option<String>,
    /// `MLFLOW_HTTP_REQUEST_TIMEOUT` in seconds (default 120).
    pub timeout: Duration,
}

impl std::fmt::Debug for MLflowSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hidden = |v: &Option<String>| v.as_ref().map(|_| "***");
        f.debug_struct("MLflowSettings")
            .field("tracking_uri", &self.tracking_uri)
            .field("experiment_name", &self.experiment_name)
            .field("experiment_id", &self.experiment_id)
            .field("run_id", &self.run_id)
            .field("tags", &self.tags)
            .field("nested_run", &self.nested_run)
            .field("flatten_params", &self.flatten_params)
            .field("max_log_params", &self.max_log_params)
            .field("username", &self.username)
            .field("password", &hidden(&self.password))
            .field("token", &hidden(&self.token))
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl MLflowSettings {
    /// Settings for the server at `tracking_uri` and nothing else set; refuses URIs that are
    /// not `http(s)`.
    pub fn new(tracking_uri: impl Into<String>) -> Result<Self> {
        let tracking_uri = tracking_uri.into();
        check_tracking_uri(Some(&tracking_uri))?;
        Ok(Self {
            tracking_uri,
            experiment_name: None,
            experiment_id: None,
            run_id: None,
            tags: JsonMap::new(),
            nested_run: false,
            flatten_params: false,
            max_log_params: None,
            username: None,
            password: None,
            token: None,
            timeout: Duration::from_secs(120),
        })
    }

    /// The settings the process environment gives.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// The settings `lookup` gives for each environment variable name (a map in tests, the
    /// environment in [`MLflowSettings::from_env`]). Refuses what this crate cannot honour:
    /// a tracking URI that is not `http(s)`, `HF_MLFLOW_LOG_ARTIFACTS`, TLS settings of the
    /// Python client, `MLFLOW_TAGS` that is not a JSON object.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        if is_mlflow_disabled(&lookup) {
            return Err(Error::MlflowSetting {
                variable: "DISABLE_MLFLOW_INTEGRATION",
                value: lookup("DISABLE_MLFLOW_INTEGRATION").unwrap_or_default(),
                reason: "the MLflow integration is disabled, as upstream's MLflowCallback refuses \
                         (\"MLflowCallback requires mlflow to be installed\"); unset it, or drop \
                         `mlflow` from `report_to`"
                    .into(),
            });
        }
        let uri = lookup("MLFLOW_TRACKING_URI");
        check_tracking_uri(uri.as_deref())?;
        let mut s = Self::new(uri.unwrap_or_default())?;
        let artifacts = lookup("HF_MLFLOW_LOG_ARTIFACTS");
        if env_true(artifacts.as_deref()) {
            return Err(Error::MlflowSetting {
                variable: "HF_MLFLOW_LOG_ARTIFACTS",
                value: artifacts.unwrap_or_default(),
                reason: "upstream logs every checkpoint as an `mlflow.pyfunc` model (an MLmodel \
                         file and a Python environment that only the mlflow Python package \
                         writes), which this crate does not build; unset it and upload \
                         checkpoints with `mlflow artifacts log-artifacts --run-id RUN_ID \
                         --local-dir OUTPUT_DIR/checkpoint-N`"
                    .into(),
            });
        }
        for variable in [
            "MLFLOW_TRACKING_SERVER_CERT_PATH",
            "MLFLOW_TRACKING_CLIENT_CERT_PATH",
        ] {
            if let Some(value) = lookup(variable) {
                return Err(Error::MlflowSetting {
                    variable,
                    value,
                    reason: "custom TLS certificates are not supported by this client (it \
                             trusts the public web roots); unset it, or put a TLS proxy with a \
                             public certificate, or plain http on a trusted network, in front \
                             of the server"
                        .into(),
                });
            }
        }
        if let Some(value) = lookup("MLFLOW_TRACKING_INSECURE_TLS").filter(|v| env_true(Some(v))) {
            return Err(Error::MlflowSetting {
                variable: "MLFLOW_TRACKING_INSECURE_TLS",
                value,
                reason: "this client always verifies TLS certificates; unset it".into(),
            });
        }
        s.experiment_name = lookup("MLFLOW_EXPERIMENT_NAME").filter(|v| !v.is_empty());
        s.experiment_id = lookup("MLFLOW_EXPERIMENT_ID").filter(|v| !v.is_empty());
        s.run_id = lookup("MLFLOW_RUN_ID").filter(|v| !v.is_empty());
        if let Some(text) = lookup("MLFLOW_TAGS").filter(|v| !v.is_empty()) {
            s.tags = match loads(&text) {
                Ok(JsonValue::Object(map)) => map,
                Ok(other) => {
                    return Err(Error::MlflowSetting {
                        variable: "MLFLOW_TAGS",
                        value: text,
                        reason: format!(
                            "must be a JSON object of tags (e.g. {{\"release\": \"RC1\"}}), found a {}",
                            other.type_name()
                        ),
                    });
                }
                Err(e) => {
                    return Err(Error::MlflowSetting {
                        variable: "MLFLOW_TAGS",
                        value: text,
                        reason: format!("is not valid JSON: {e}"),
                    });
                }
            };
        }
        s.nested_run = env_true(lookup("MLFLOW_NESTED_RUN").as_deref());
        s.flatten_params = env_true(lookup("MLFLOW_FLATTEN_PARAMS").as_deref());
        if let Some(v) = lookup("MLFLOW_MAX_LOG_PARAMS") {
            // Upstream: `if self._max_log_params and self._max_log_params.isdigit()`.
            if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
                s.max_log_params = v.parse().ok();
            } else if !v.is_empty() {
                log::warn!(
                    "MLFLOW_MAX_LOG_PARAMS={v:?} is not a whole number; all params are logged, as upstream does"
                );
            }
        }
        s.username = lookup("MLFLOW_TRACKING_USERNAME");
        s.password = lookup("MLFLOW_TRACKING_PASSWORD");
        s.token = lookup("MLFLOW_TRACKING_TOKEN");
        if let Some(v) = lookup("MLFLOW_HTTP_REQUEST_TIMEOUT") {
            let secs: u64 = v.trim().parse().map_err(|_| Error::MlflowSetting {
                variable: "MLFLOW_HTTP_REQUEST_TIMEOUT",
                value: v.clone(),
                reason: "must be a whole number of seconds".into(),
            })?;
            s.timeout = Duration::from_secs(secs);
        }
        Ok(s)
    }
}

fn check_tracking_uri(uri: Option<&str>) -> Result<()> {
    let run_server = "this crate speaks MLflow's REST API to a tracking server: run `mlflow \
                      server --backend-store-uri <your store>` (for instance `sqlite:///mlflow.db`) \
                      and set MLFLOW_TRACKING_URI to its address, e.g. http://127.0.0.1:5000";
    match uri {
        None | Some("") => Err(Error::MlflowSetting {
            variable: "MLFLOW_TRACKING_URI",
            value: String::new(),
            reason: format!(
                "is not set: upstream's mlflow then writes to a local store in the working \
                 directory, which only the mlflow Python package writes; {run_server}"
            ),
        }),
        Some(u) => {
            let lower = u.to_ascii_lowercase();
            let host = lower
                .strip_prefix("http://")
                .or_else(|| lower.strip_prefix("https://"));
            match host {
                Some(h) if !h.is_empty() && !h.starts_with('/') => Ok(()),
                _ => Err(Error::MlflowSetting {
                    variable: "MLFLOW_TRACKING_URI",
                    value: u.to_string(),
                    reason: format!(
                        "only http:// and https:// tracking URIs are supported; {run_server}"
                    ),
                }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(vars: &[(&str, &str)]) -> Result<MLflowSettings> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        MLflowSettings::from_lookup(|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn environment_variables_are_read_as_upstream() {
        let s = settings(&[
            ("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000"),
            ("MLFLOW_EXPERIMENT_NAME", "exp"),
            ("MLFLOW_RUN_ID", "abc"),
            ("MLFLOW_TAGS", r#"{"a": "x", "n": 2}"#),
            ("MLFLOW_NESTED_RUN", "yes"),
            ("MLFLOW_FLATTEN_PARAMS", "On"),
            ("MLFLOW_MAX_LOG_PARAMS", "7"),
            ("HF_MLFLOW_LOG_ARTIFACTS", "false"),
        ])
        .unwrap();
        assert_eq!(s.experiment_name.as_deref(), Some("exp"));
        assert_eq!(s.run_id.as_deref(), Some("abc"));
        assert_eq!(s.tags.get("n"), Some(&JsonValue::Int(2)));
        assert!(s.nested_run && s.flatten_params);
        assert_eq!(s.max_log_params, Some(7));
        let s = settings(&[
            ("MLFLOW_TRACKING_URI", "https://mlflow.example/prefix/"),
            ("MLFLOW_MAX_LOG_PARAMS", "-3"),
            ("MLFLOW_NESTED_RUN", "2"),
        ])
        .unwrap();
        assert_eq!(s.max_log_params, None);
        assert!(!s.nested_run);
    }

    #[test]
    fn local_stores_and_artifacts_are_refused_with_the_fix() {
        for uri in [
            "",
            "file:///tmp/mlruns",
            "sqlite:///mlflow.db",
            "mlruns",
            "databricks",
            "http://",
        ] {
            let mut vars = vec![];
            if !uri.is_empty() {
                vars.push(("MLFLOW_TRACKING_URI", uri));
            }
            let err = settings(&vars).unwrap_err().to_string();
            assert!(
                err.contains("MLFLOW_TRACKING_URI") && err.contains("mlflow server"),
                "{uri}: {err}"
            );
        }
        let err = settings(&[
            ("MLFLOW_TRACKING_URI", "http://127.0.0.1:1"),
            ("HF_MLFLOW_LOG_ARTIFACTS", "TRUE"),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("HF_MLFLOW_LOG_ARTIFACTS=\"TRUE\": "),
            "{err}"
        );
        assert!(err.contains("mlflow.pyfunc"), "{err}");
        let err = settings(&[
            ("MLFLOW_TRACKING_URI", "http://127.0.0.1:1"),
            ("MLFLOW_TAGS", "[1]"),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("MLFLOW_TAGS") && err.contains("JSON object"),
            "{err}"
        );
        let err = settings(&[
            ("MLFLOW_TRACKING_URI", "http://127.0.0.1:1"),
            ("DISABLE_MLFLOW_INTEGRATION", "true"),
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("DISABLE_MLFLOW_INTEGRATION"), "{err}");
    }
}

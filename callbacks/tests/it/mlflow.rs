//! MLflowCallback against a real MLflow tracking server (`mlflow server` from the setup
//! virtualenv, on a free loopback port, with a sqlite store in a temporary folder), read back
//! through MLflow's REST API: the params, metric histories, tags, run name and status must
//! equal what upstream's MLflowCallback logs for the same arguments, model config and logs
//! (scripts/reference/mlflow_callback.py). All comparisons are exact: params and tags are
//! strings, metric values are the same f64 on both sides.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tchtrain_callbacks::{
    Error, JsonMap, JsonValue, MLflowCallback, MLflowSettings, ModelConfig, TrainerCallback,
    TrainerControl, TrainerState, dumps,
};
use tchtrain_training_args::TrainingArguments;

use crate::common::{script_reference, temp_dir};

const SERVER_START_TIMEOUT: Duration = Duration::from_secs(60);

/// `$TCHTRAIN_VENV_PYTHON`'s folder, which holds the `mlflow` command.
fn venv_bin() -> PathBuf {
    let python = std::env::var_os("TCHTRAIN_VENV_PYTHON").unwrap_or_else(|| {
        panic!(
            "TCHTRAIN_VENV_PYTHON is not set: it names the setup virtualenv's python (with mlflow), and \
             `cargo xtask setup` writes it into .cargo/libtorch.toml; run `cargo xtask setup`"
        )
    });
    Path::new(&python)
        .parent()
        .expect("TCHTRAIN_VENV_PYTHON names a file")
        .to_path_buf()
}

/// A running `mlflow server`; dropping it (also when a test panics) stops its process group.
struct MlflowServer {
    child: Child,
    uri: String,
    dir: PathBuf,
}

impl MlflowServer {
    fn start(name: &str) -> Self {
        let mlflow = venv_bin().join("mlflow");
        assert!(
            mlflow.exists(),
            "{} is missing: the setup virtualenv lacks mlflow (xtask/requirements.txt); run `cargo xtask setup`",
            mlflow.display()
        );
        let dir = temp_dir(name);
        let mut last_log = String::new();
        // A port taken between our probe and the server's bind makes it exit: try again.
        for _attempt in 0..3 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free loopback port")
                .port();
            let log_path = dir.join(format!("server-{port}.log"));
            let log = File::create(&log_path).unwrap();
            let child = Command::new(&mlflow)
                .args(["server", "--host", "127.0.0.1", "--port", &port.to_string()])
                .arg("--backend-store-uri")
                .arg(format!("sqlite:///{}", dir.join("mlflow.db").display()))
                .arg("--default-artifact-root")
                .arg(dir.join("artifacts"))
                .args(["--workers", "1"])
                .env("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .process_group(0)
                .spawn()
                .unwrap_or_else(|e| panic!("starting {}: {e}", mlflow.display()));
            let mut server = Self {
                child,
                uri: format!("http://127.0.0.1:{port}"),
                dir: dir.clone(),
            };
            let deadline = Instant::now() + SERVER_START_TIMEOUT;
            loop {
                let health = ureq::get(&format!("{}/health", server.uri))
                    .timeout(Duration::from_secs(2))
                    .call();
                if health.is_ok_and(|r| r.status() == 200) {
                    return server;
                }
                if let Ok(Some(status)) = server.child.try_wait() {
                    last_log = std::fs::read_to_string(&log_path).unwrap_or_default();
                    eprintln!("mlflow server exited ({status}) before answering; retrying");
                    break;
                }
                if Instant::now() > deadline {
                    panic!(
                        "mlflow server did not answer {}/health within {} s; its log:\n{}",
                        server.uri,
                        SERVER_START_TIMEOUT.as_secs(),
                        std::fs::read_to_string(&log_path).unwrap_or_default()
                    );
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        }
        panic!("mlflow server would not start; its last log:\n{last_log}");
    }

    fn api(&self, endpoint: &str) -> String {
        format!("{}/api/2.0/mlflow/{endpoint}", self.uri)
    }

    fn get(&self, endpoint: &str, query: &[(&str, &str)]) -> Value {
        let mut request = ureq::get(&self.api(endpoint));
        for (k, v) in query {
            request = request.query(k, v);
        }
        let text = request
            .call()
            .unwrap_or_else(|e| panic!("GET {endpoint}: {e}"))
            .into_string()
            .unwrap();
        serde_json::from_str(&text).unwrap()
    }

    fn post(&self, endpoint: &str, body: Value) -> Value {
        let text = ureq::post(&self.api(endpoint))
            .set("Content-Type", "application/json")
            .send_string(&body.to_string())
            .unwrap_or_else(|e| panic!("POST {endpoint}: {e}"))
            .into_string()
            .unwrap();
        serde_json::from_str(&text).unwrap()
    }

    fn run(&self, run_id: &str) -> Run {
        let v = self.get("runs/get", &[("run_id", run_id)]);
        let run = &v["run"];
        let pairs = |key: &str| -> BTreeMap<String, String> {
            run["data"][key]
                .as_array()
                .map(|items| {
                    items
                        .iter()
                        .map(|p| {
                            (
                                p["key"].as_str().unwrap().to_string(),
                                p["value"].as_str().unwrap().to_string(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut metrics = BTreeMap::new();
        for m in run["data"]["metrics"].as_array().into_iter().flatten() {
            let key = m["key"].as_str().unwrap();
            let history = self.get(
                "metrics/get-history",
                &[("run_id", run_id), ("metric_key", key)],
            );
            let mut points: Vec<(i64, f64)> = history["metrics"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p["step"].as_i64().unwrap_or(0), metric_value(&p["value"])))
                .collect();
            points.sort_by_key(|p| p.0);
            metrics.insert(key.to_string(), points);
        }
        Run {
            status: run["info"]["status"].as_str().unwrap().to_string(),
            run_name: run["info"]["run_name"].as_str().unwrap_or("").to_string(),
            experiment_id: run["info"]["experiment_id"].as_str().unwrap().to_string(),
            params: pairs("params"),
            tags: pairs("tags"),
            metrics,
        }
    }

    fn experiment_id(&self, name: &str) -> String {
        self.get("experiments/get-by-name", &[("experiment_name", name)])["experiment"]
            ["experiment_id"]
            .as_str()
            .unwrap()
            .to_string()
    }
}

impl Drop for MlflowServer {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let kill = |signal: &str| {
            let _ = Command::new("kill")
                .args([signal, "--", &group])
                .stderr(Stdio::null())
                .status();
        };
        kill("-TERM");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // Whatever of the group is left (uvicorn's worker, or a server that ignored TERM).
        kill("-KILL");
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What a run holds, read back through the REST API.
#[derive(Debug)]
struct Run {
    status: String,
    run_name: String,
    experiment_id: String,
    params: BTreeMap<String, String>,
    tags: BTreeMap<String, String>,
    metrics: BTreeMap<String, Vec<(i64, f64)>>,
}

fn metric_value(v: &Value) -> f64 {
    match v {
        Value::String(s) if s == "NaN" => f64::NAN,
        Value::String(s) if s == "Infinity" => f64::INFINITY,
        Value::String(s) if s == "-Infinity" => f64::NEG_INFINITY,
        other => other.as_f64().unwrap(),
    }
}

fn same_f64(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

fn settings_for(uri: &str, env: &[(String, String)]) -> MLflowSettings {
    let mut vars: Vec<(String, String)> = env.to_vec();
    vars.push(("MLFLOW_TRACKING_URI".into(), uri.into()));
    MLflowSettings::from_lookup(|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
        .unwrap()
}

fn args_from(kwargs: &JsonValue) -> TrainingArguments {
    let json: Value = serde_json::from_str(&dumps(kwargs, None, false)).unwrap();
    TrainingArguments::from_dict(json.as_object().unwrap().clone())
        .unwrap()
        .args
}

/// Drives `callback` as the Trainer does: model config, `on_train_begin`, one `on_log` per
/// entry, `on_train_end`. Returns the run it logged into.
fn drive(
    callback: &mut MLflowCallback,
    args: &TrainingArguments,
    model_config: Option<&ModelConfig>,
    logs: &[(i64, JsonMap)],
) -> String {
    let mut state = TrainerState::default();
    let mut control = TrainerControl::default();
    if let Some(config) = model_config {
        callback.set_model_config(config);
    }
    callback.on_train_begin(args, &state, &mut control).unwrap();
    let run_id = callback.run_id().expect("a run was started").to_string();
    for (step, entry) in logs {
        state.global_step = *step;
        callback.on_log(args, &state, &mut control, entry).unwrap();
    }
    callback.on_train_end(args, &state, &mut control).unwrap();
    assert_eq!(callback.run_id(), None, "the run was ended");
    run_id
}

#[test]
fn mlflow_callback_logs_what_upstream_logs_to_a_real_server() {
    let reference = script_reference("mlflow_callback");
    let server = MlflowServer::start("mlflow-parity");
    let cases = reference.as_object().unwrap().get("cases").unwrap();
    for case in cases.as_array().unwrap() {
        let case = case.as_object().unwrap();
        let name = case.get("name").unwrap().as_str().unwrap();
        let env: Vec<(String, String)> = case
            .get("env")
            .unwrap()
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_str().unwrap().to_string()))
            .collect();
        let args = args_from(case.get("args").unwrap());
        let model_config = match case.get("model_config").unwrap() {
            JsonValue::Object(m) => Some(ModelConfig::from_dict(m.clone())),
            _ => None,
        };
        let logs: Vec<(i64, JsonMap)> = case
            .get("logs")
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let e = e.as_array().unwrap();
                (e[0].as_i64().unwrap(), e[1].as_object().unwrap().clone())
            })
            .collect();
        let mut callback = MLflowCallback::with_settings(settings_for(&server.uri, &env));
        let run_id = drive(&mut callback, &args, model_config.as_ref(), &logs);
        let run = server.run(&run_id);

        // Params: names and Python `str()` values, exactly.
        let want: BTreeMap<String, String> = case
            .get("params")
            .unwrap()
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_str().unwrap().to_string()))
            .collect();
        for (k, v) in &want {
            assert_eq!(run.params.get(k), Some(v), "{name}: param {k}");
        }
        assert_eq!(run.params, want, "{name}: params");

        // Metric histories: same names (sanitised), steps and values.
        let want_metrics = case.get("metrics").unwrap().as_object().unwrap();
        let mut want_names: Vec<&str> = want_metrics.iter().map(|(k, _)| k).collect();
        want_names.sort_unstable();
        assert_eq!(
            run.metrics.keys().map(String::as_str).collect::<Vec<_>>(),
            want_names,
            "{name}: metric names"
        );
        for (key, points) in want_metrics.iter() {
            let want_points: Vec<(i64, f64)> = points
                .as_array()
                .unwrap()
                .iter()
                .map(|p| {
                    let p = p.as_array().unwrap();
                    (p[0].as_i64().unwrap(), p[1].as_f64().unwrap())
                })
                .collect();
            // MLflow's SQL store keeps one row per (key, step, value, timestamp): the same
            // value logged twice at a step (`epoch` in the train and eval logs) within one
            // millisecond is stored once. Compare the histories with such repeats collapsed.
            let mut want_points = want_points;
            want_points.dedup_by(|a, b| a.0 == b.0 && same_f64(a.1, b.1));
            let mut got = run.metrics[key].clone();
            got.dedup_by(|a, b| a.0 == b.0 && same_f64(a.1, b.1));
            let got = &got;
            assert_eq!(got.len(), want_points.len(), "{name}: {key} {got:?}");
            for (g, w) in got.iter().zip(&want_points) {
                assert!(
                    g.0 == w.0 && same_f64(g.1, w.1),
                    "{name}: {key} {got:?} != {want_points:?}"
                );
            }
        }

        // Tags: those upstream sets (MLFLOW_TAGS, mlflow.runName), and the source type.
        let want_tags: BTreeMap<String, String> = case
            .get("tags")
            .unwrap()
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_str().unwrap().to_string()))
            .collect();
        let got_tags: BTreeMap<String, String> = run
            .tags
            .iter()
            .filter(|(k, _)| !k.starts_with("mlflow.user") && !k.starts_with("mlflow.source."))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let want_run_name = case.get("run_name").unwrap().as_str().unwrap();
        if args.run_name.is_some() {
            assert_eq!(got_tags, want_tags, "{name}: tags");
            assert_eq!(run.run_name, want_run_name, "{name}: run name");
        } else {
            // The server names the run (`adjective-animal-N`), as it did upstream's.
            let mut want_tags = want_tags;
            want_tags.insert("mlflow.runName".into(), run.run_name.clone());
            assert_eq!(got_tags, want_tags, "{name}: tags");
            assert_eq!(run.run_name.split('-').count(), 3, "{}", run.run_name);
        }
        assert_eq!(
            run.tags.get("mlflow.source.type").map(String::as_str),
            Some("LOCAL")
        );
        assert!(run.tags.contains_key("mlflow.user"), "{:?}", run.tags);
        assert_eq!(run.status, "FINISHED", "{name}");
        let experiment = env
            .iter()
            .find(|(k, _)| k == "MLFLOW_EXPERIMENT_NAME")
            .map(|(_, v)| server.experiment_id(v))
            .unwrap_or_else(|| "0".into());
        assert_eq!(run.experiment_id, experiment, "{name}");
    }
}

fn short_logs(step: i64, loss: f64) -> Vec<(i64, JsonMap)> {
    let mut logs = JsonMap::new();
    logs.insert("loss", loss);
    vec![(step, logs)]
}

fn named_args(run_name: &str) -> TrainingArguments {
    TrainingArguments {
        run_name: Some(run_name.into()),
        ..Default::default()
    }
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn mlflow_callback_resumes_nests_and_ends_runs_as_upstream() {
    let server = MlflowServer::start("mlflow-runs");
    let uri = server.uri.clone();
    let exp = env(&[("MLFLOW_EXPERIMENT_NAME", "resume")]);

    // A run started and ended by the callback.
    let mut first = MLflowCallback::with_settings(settings_for(&uri, &exp));
    let run_id = drive(&mut first, &named_args("first"), None, &short_logs(1, 2.0));
    assert_eq!(server.run(&run_id).status, "FINISHED");

    // MLFLOW_RUN_ID resumes it: RUNNING again while training, renamed as upstream's
    // start_run(run_name=...) does, metrics appended, FINISHED at the end.
    let mut resume_env = exp.clone();
    resume_env.push(("MLFLOW_RUN_ID".into(), run_id.clone()));
    let mut resumed = MLflowCallback::with_settings(settings_for(&uri, &resume_env));
    let args = named_args("second");
    let mut state = TrainerState::default();
    let mut control = TrainerControl::default();
    resumed.on_train_begin(&args, &state, &mut control).unwrap();
    assert_eq!(resumed.run_id(), Some(run_id.as_str()));
    let during = server.run(&run_id);
    assert_eq!(
        (during.status.as_str(), during.run_name.as_str()),
        ("RUNNING", "second")
    );
    // Params cannot change in MLflow: the batch holding the new `run_name` is refused by the
    // server and, as upstream's asynchronous logging does, only logged as an error.
    assert_eq!(
        during.params.get("run_name").map(String::as_str),
        Some("first")
    );
    state.global_step = 2;
    resumed
        .on_log(&args, &state, &mut control, &short_logs(2, 1.5)[0].1)
        .unwrap();
    resumed.on_train_end(&args, &state, &mut control).unwrap();
    let after = server.run(&run_id);
    assert_eq!(after.status, "FINISHED");
    assert_eq!(after.metrics["loss"], vec![(1, 2.0), (2, 1.5)]);

    // Resuming under another experiment is refused with mlflow's message.
    let mut other = env(&[("MLFLOW_EXPERIMENT_NAME", "other")]);
    other.push(("MLFLOW_RUN_ID".into(), run_id.clone()));
    let err = MLflowCallback::with_settings(settings_for(&uri, &other))
        .on_train_begin(&args, &state, &mut control)
        .unwrap_err();
    assert!(
        matches!(&err, Error::MlflowRun { .. }) && err.to_string().contains("does not match"),
        "{err}"
    );

    // A run the caller started: logged into, and left open (upstream: an active mlflow run).
    let created = server.post(
        "runs/create",
        json!({"experiment_id": "0", "start_time": 1, "run_name": "user-run"}),
    );
    let parent = created["run"]["info"]["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut inside =
        MLflowCallback::with_settings(settings_for(&uri, &[])).with_active_run(&parent);
    let mut state = TrainerState::default();
    inside.on_train_begin(&args, &state, &mut control).unwrap();
    assert_eq!(inside.run_id(), Some(parent.as_str()));
    state.global_step = 3;
    inside
        .on_log(&args, &state, &mut control, &short_logs(3, 0.5)[0].1)
        .unwrap();
    inside.on_train_end(&args, &state, &mut control).unwrap();
    let user_run = server.run(&parent);
    assert_eq!(user_run.status, "RUNNING");
    assert_eq!(user_run.metrics["loss"], vec![(3, 0.5)]);
    assert_eq!(
        user_run.params.get("run_name").map(String::as_str),
        Some("second")
    );

    // MLFLOW_NESTED_RUN: a child run of the active one, ended by the callback.
    let nested = env(&[("MLFLOW_NESTED_RUN", "true")]);
    let mut child_cb =
        MLflowCallback::with_settings(settings_for(&uri, &nested)).with_active_run(&parent);
    let child = drive(
        &mut child_cb,
        &named_args("child"),
        None,
        &short_logs(1, 1.0),
    );
    assert_ne!(child, parent);
    let child_run = server.run(&child);
    assert_eq!(child_run.tags.get("mlflow.parentRunId"), Some(&parent));
    assert_eq!(
        (child_run.status.as_str(), child_run.run_name.as_str()),
        ("FINISHED", "child")
    );
    assert_eq!(server.run(&parent).status, "RUNNING");

    // MLFLOW_RUN_ID while another run is active, not nested: mlflow's "already active".
    let err = MLflowCallback::with_settings(settings_for(
        &uri,
        &env(&[("MLFLOW_RUN_ID", run_id.as_str())]),
    ))
    .with_active_run(&parent)
    .on_train_begin(&args, &TrainerState::default(), &mut control)
    .unwrap_err();
    assert!(err.to_string().contains("is already active"), "{err}");

    // Only the world's main process logs.
    let mut replica = MLflowCallback::with_settings(settings_for(&uri, &[]));
    let replica_state = TrainerState {
        is_world_process_zero: false,
        ..Default::default()
    };
    replica
        .on_train_begin(&args, &replica_state, &mut control)
        .unwrap();
    replica
        .on_log(
            &args,
            &replica_state,
            &mut control,
            &short_logs(1, 1.0)[0].1,
        )
        .unwrap();
    assert_eq!(replica.run_id(), None);

    // Dropping the callback ends the run it started (upstream `__del__`).
    let mut dropped = MLflowCallback::with_settings(settings_for(&uri, &[]));
    dropped
        .on_train_begin(&args, &TrainerState::default(), &mut control)
        .unwrap();
    let dropped_id = dropped.run_id().unwrap().to_string();
    assert_eq!(server.run(&dropped_id).status, "RUNNING");
    drop(dropped);
    assert_eq!(server.run(&dropped_id).status, "FINISHED");

    // A deleted experiment cannot be set; an unknown MLFLOW_EXPERIMENT_ID is named.
    let gone = server.post("experiments/create", json!({"name": "gone"}));
    server.post(
        "experiments/delete",
        json!({"experiment_id": gone["experiment_id"]}),
    );
    let err = MLflowCallback::with_settings(settings_for(
        &uri,
        &env(&[("MLFLOW_EXPERIMENT_NAME", "gone")]),
    ))
    .on_train_begin(&args, &TrainerState::default(), &mut control)
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("Cannot set a deleted experiment 'gone'"),
        "{err}"
    );
    let err = MLflowCallback::with_settings(settings_for(
        &uri,
        &env(&[("MLFLOW_EXPERIMENT_ID", "424242")]),
    ))
    .on_train_begin(&args, &TrainerState::default(), &mut control)
    .unwrap_err();
    assert!(err.to_string().contains("MLFLOW_EXPERIMENT_ID"), "{err}");
}

#[test]
fn mlflow_callback_reports_an_unreachable_server() {
    // A port nothing listens on: bound, then released.
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let uri = format!("http://127.0.0.1:{port}");
    let mut callback = MLflowCallback::with_settings(settings_for(&uri, &[]));
    let err = callback
        .on_train_begin(
            &TrainingArguments::default(),
            &TrainerState::default(),
            &mut TrainerControl::default(),
        )
        .unwrap_err();
    match &err {
        Error::MlflowRequest {
            endpoint, status, ..
        } => assert_eq!((*endpoint, *status), ("runs/create", None)),
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("cannot reach"), "{err}");
}

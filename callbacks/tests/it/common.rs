//! Helpers shared by the integration tests: the reference folder and small builders.

#![allow(dead_code)]

use std::path::PathBuf;

use tchtrain_callbacks::{JsonValue, dumps, loads};
use tchtrain_training_args::{IntervalStrategy, SaveStrategy};

/// The setup virtualenv's python (`TCHTRAIN_VENV_PYTHON`), which has the trackers' packages
/// (wandb, trackio) whose readers the logger tests run.
pub fn venv_python() -> PathBuf {
    PathBuf::from(std::env::var_os("TCHTRAIN_VENV_PYTHON").unwrap_or_else(|| {
        panic!("TCHTRAIN_VENV_PYTHON is not set: it names the setup virtualenv's python (with wandb and trackio); run `cargo xtask setup`")
    }))
}

/// The workspace root (the reference scripts are under its `scripts/reference/`).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `$TCHTRAIN_ASSETS/reference`, else `<crate>/../assets/reference`: one folder per script of
/// scripts/reference/.
pub fn reference_root() -> PathBuf {
    let assets = std::env::var_os("TCHTRAIN_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../assets"));
    assets.join("reference")
}

/// `<reference root>/<script>/<script>.json` (what scripts/reference/<script>.py writes),
/// parsed; fails (never skips) when it is missing.
pub fn script_reference(script: &str) -> JsonValue {
    let path = reference_root().join(script).join(format!("{script}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "reference file {} is missing ({e}); run `cargo xtask setup` (it runs \
             scripts/reference/{script}.py with the pinned packages)",
            path.display()
        )
    });
    loads(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A reference case's `env` (variable -> value) as pairs.
pub fn env_of(case: &JsonValue) -> Vec<(String, String)> {
    at(case, "env")
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.to_string(), v.as_str().unwrap().to_string()))
        .collect()
}

/// The value under `key` of a JSON object; panics naming the key and the object.
pub fn at<'a>(v: &'a JsonValue, key: &str) -> &'a JsonValue {
    v.as_object()
        .and_then(|m| m.get(key))
        .unwrap_or_else(|| panic!("no {key:?} in {}", dumps(v, None, false)))
}

/// `$TCHTRAIN_ASSETS/reference/trainer_callback`, else `<crate>/../assets/reference/trainer_callback`.
pub fn reference_dir() -> PathBuf {
    reference_root().join("trainer_callback")
}

/// The text of a reference file; fails (never skips) when it is missing.
pub fn reference_text(name: &str) -> String {
    let path = reference_dir().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "reference file {} is missing ({e}); run `cargo xtask setup` (it runs \
             scripts/reference/trainer_callback.py with the pinned transformers)",
            path.display()
        )
    })
}

/// A reference file parsed with this crate's Python-compatible JSON reader.
pub fn reference_json(name: &str) -> JsonValue {
    loads(&reference_text(name)).unwrap_or_else(|e| panic!("reference {name}: {e}"))
}

pub fn interval(s: &str) -> IntervalStrategy {
    match s {
        "no" => IntervalStrategy::No,
        "steps" => IntervalStrategy::Steps,
        "epoch" => IntervalStrategy::Epoch,
        other => panic!("unknown IntervalStrategy {other}"),
    }
}

pub fn save_strategy(s: &str) -> SaveStrategy {
    match s {
        "no" => SaveStrategy::No,
        "steps" => SaveStrategy::Steps,
        "epoch" => SaveStrategy::Epoch,
        "best" => SaveStrategy::Best,
        other => panic!("unknown SaveStrategy {other}"),
    }
}

/// A fresh folder under the system temp dir, unique to this process and `name`.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("tchtrain-callbacks-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub trait JsonExt {
    fn at(&self, key: &str) -> &JsonValue;
    fn f64(&self, key: &str) -> f64;
    fn i64(&self, key: &str) -> i64;
    fn str(&self, key: &str) -> &str;
    fn bool(&self, key: &str) -> bool;
}

impl JsonExt for JsonValue {
    fn at(&self, key: &str) -> &JsonValue {
        self.as_object()
            .and_then(|m| m.get(key))
            .unwrap_or_else(|| panic!("reference has no `{key}`"))
    }
    fn f64(&self, key: &str) -> f64 {
        self.at(key)
            .as_f64()
            .unwrap_or_else(|| panic!("`{key}` is not a number"))
    }
    fn i64(&self, key: &str) -> i64 {
        self.at(key)
            .as_i64()
            .unwrap_or_else(|| panic!("`{key}` is not an int"))
    }
    fn str(&self, key: &str) -> &str {
        self.at(key)
            .as_str()
            .unwrap_or_else(|| panic!("`{key}` is not a string"))
    }
    fn bool(&self, key: &str) -> bool {
        self.at(key)
            .as_bool()
            .unwrap_or_else(|| panic!("`{key}` is not a bool"))
    }
}

/// A logger reference case's `args` (TrainingArguments keyword arguments) as arguments.
pub fn case_args(case: &JsonValue) -> tchtrain_training_args::TrainingArguments {
    let serde: serde_json::Value =
        serde_json::from_str(&dumps(at(case, "args"), None, false)).unwrap();
    tchtrain_training_args::TrainingArguments::from_dict(serde.as_object().unwrap().clone())
        .unwrap()
        .args
}

/// Drives a logger through a reference case's events as the reference drove upstream's:
/// `on_train_begin`, `on_log` for each `[global_step, epoch, logs]` of `logs`,
/// `on_train_end`, `on_predict` with `predict`; then drops it.
pub fn replay_case(mut callback: Box<dyn tchtrain_callbacks::TrainerCallback>, case: &JsonValue) {
    use tchtrain_callbacks::{JsonMap, TrainerControl, TrainerState};
    let args = case_args(case);
    let mut state = TrainerState::default();
    let mut control = TrainerControl::default();
    callback
        .on_train_begin(&args, &state, &mut control)
        .unwrap();
    for entry in at(case, "logs").as_array().unwrap() {
        let entry = entry.as_array().unwrap();
        state.global_step = entry[0].as_i64().unwrap();
        state.epoch = entry[1].as_f64().unwrap();
        let logs: JsonMap = entry[2].as_object().unwrap().clone();
        callback.on_log(&args, &state, &mut control, &logs).unwrap();
    }
    callback.on_train_end(&args, &state, &mut control).unwrap();
    let predict: JsonMap = at(case, "predict").as_object().unwrap().clone();
    callback
        .on_predict(&args, &state, &mut control, &predict)
        .unwrap();
}

/// Runs a tracker's reader (`scripts/reference/<script>`, with the tracker's own package) with
/// the setup virtualenv's python and returns the JSON it prints; fails with its stderr.
pub fn run_reader(
    script: &str,
    args: &[&std::ffi::OsStr],
    env: &[(&str, &std::ffi::OsStr)],
) -> JsonValue {
    let mut command = std::process::Command::new(venv_python());
    command
        .arg(repo().join("scripts/reference").join(script))
        .args(args)
        .env("OMP_WAIT_POLICY", "PASSIVE");
    for (k, v) in env {
        command.env(k, v);
    }
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{script} failed on {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    loads(&String::from_utf8_lossy(&out.stdout)).unwrap()
}

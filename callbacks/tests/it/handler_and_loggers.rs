//! CallbackHandler semantics (order, flag resets, add/pop/remove, state restore, errors),
//! ProgressCallback bars, the JSON-lines logger, TensorBoard event files read back by the
//! `tensorboard` Python package, and errors on malformed trainer_state.json files.

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use crate::common::temp_dir;
use indicatif::ProgressDrawTarget;
use tchtrain_callbacks::{
    CallbackHandler, CallbackState, DefaultFlowCallback, EarlyStoppingCallback, Error, JsonMap,
    JsonValue, JsonlLoggerCallback, ModelConfig, PrinterCallback, ProgressCallback, Result,
    TensorBoardCallback, TrainerCallback, TrainerControl, TrainerState,
    get_reporting_integration_callbacks, loads,
};
use tchtrain_training_args::TrainingArguments;

/// Records `name:event` for every event it sees and can fail on one event.
struct Recorder {
    name: &'static str,
    seen: Arc<Mutex<Vec<String>>>,
    fail_on: Option<&'static str>,
}

impl Recorder {
    fn record(&self, event: &'static str) -> Result<()> {
        self.seen
            .lock()
            .unwrap()
            .push(format!("{}:{event}", self.name));
        if self.fail_on == Some(event) {
            return Err(Error::Callback {
                callback: self.name.into(),
                source: "disk full".into(),
            });
        }
        Ok(())
    }
}

impl TrainerCallback for Recorder {
    fn name(&self) -> &str {
        self.name
    }
    fn on_step_begin(
        &mut self,
        _: &TrainingArguments,
        _: &TrainerState,
        c: &mut TrainerControl,
    ) -> Result<()> {
        assert!(
            !c.should_log && !c.should_evaluate && !c.should_save,
            "on_step_begin resets the step flags first"
        );
        self.record("on_step_begin")
    }
    fn on_step_end(
        &mut self,
        _: &TrainingArguments,
        _: &TrainerState,
        _: &mut TrainerControl,
    ) -> Result<()> {
        self.record("on_step_end")
    }
    fn on_log(
        &mut self,
        _: &TrainingArguments,
        _: &TrainerState,
        c: &mut TrainerControl,
        _: &JsonMap,
    ) -> Result<()> {
        assert!(!c.should_log, "on_log resets should_log first");
        self.record("on_log")
    }
}

fn recorder(name: &'static str, seen: &Arc<Mutex<Vec<String>>>) -> Recorder {
    Recorder {
        name,
        seen: seen.clone(),
        fail_on: None,
    }
}

#[test]
fn handler_calls_callbacks_in_order_and_resets_flags() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut handler = CallbackHandler::new(vec![
        Box::new(DefaultFlowCallback),
        Box::new(recorder("a", &seen)),
        Box::new(recorder("b", &seen)),
    ]);
    let args = TrainingArguments::default();
    let state = TrainerState::default();
    let mut control = TrainerControl {
        should_log: true,
        should_evaluate: true,
        should_save: true,
        ..Default::default()
    };
    handler.on_step_begin(&args, &state, &mut control).unwrap();
    control.should_log = true;
    handler
        .on_log(&args, &state, &mut control, &JsonMap::new())
        .unwrap();
    handler.on_step_end(&args, &state, &mut control).unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        [
            "a:on_step_begin",
            "b:on_step_begin",
            "a:on_log",
            "b:on_log",
            "a:on_step_end",
            "b:on_step_end"
        ]
    );

    // The other resets: on_train_begin, on_epoch_begin, on_evaluate, on_save.
    let mut c = TrainerControl {
        should_training_stop: true,
        should_epoch_stop: true,
        should_evaluate: true,
        should_save: true,
        should_log: true,
    };
    handler.on_train_begin(&args, &state, &mut c).unwrap();
    handler.on_epoch_begin(&args, &state, &mut c).unwrap();
    handler
        .on_evaluate(&args, &state, &mut c, &JsonMap::new())
        .unwrap();
    handler.on_save(&args, &state, &mut c).unwrap();
    assert_eq!(
        c,
        TrainerControl {
            should_log: true,
            ..Default::default()
        }
    );
    c.new_step();
    assert_eq!(c, TrainerControl::default());
}

#[test]
fn handler_stops_at_the_first_error() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut handler = CallbackHandler::new(vec![
        Box::new(Recorder {
            name: "a",
            seen: seen.clone(),
            fail_on: Some("on_step_end"),
        }),
        Box::new(recorder("b", &seen)),
    ]);
    let err = handler
        .on_step_end(
            &TrainingArguments::default(),
            &TrainerState::default(),
            &mut TrainerControl::default(),
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("callback a failed: disk full"),
        "{err}"
    );
    assert_eq!(*seen.lock().unwrap(), ["a:on_step_end"]);
}

#[test]
fn handler_add_pop_remove_by_type_and_name() {
    let mut handler = CallbackHandler::new(vec![
        Box::new(DefaultFlowCallback),
        Box::new(PrinterCallback),
    ]);
    handler.add_callback(EarlyStoppingCallback::new(2, 0.1));
    handler.add_callback(EarlyStoppingCallback::new(4, 0.0)); // a duplicate: warns, still added
    assert_eq!(
        handler.callback_list(),
        "DefaultFlowCallback\nPrinterCallback\nEarlyStoppingCallback\nEarlyStoppingCallback"
    );
    let first = handler.pop_callback::<EarlyStoppingCallback>().unwrap();
    assert_eq!(first.early_stopping_patience, 2);
    assert!(handler.remove_callback::<PrinterCallback>());
    assert!(!handler.remove_callback::<PrinterCallback>());
    assert_eq!(
        handler
            .get::<EarlyStoppingCallback>()
            .unwrap()
            .early_stopping_patience,
        4
    );
    handler
        .get_mut::<EarlyStoppingCallback>()
        .unwrap()
        .early_stopping_patience = 5;
    let by_name = handler
        .pop_callback_by_name("EarlyStoppingCallback")
        .unwrap();
    assert_eq!(
        by_name
            .exportable_state()
            .unwrap()
            .args
            .get("early_stopping_patience"),
        Some(&JsonValue::Int(5))
    );
    assert_eq!(handler.callback_list(), "DefaultFlowCallback");
    assert!(handler.pop_callback::<ProgressCallback>().is_none());
}

#[test]
fn restoring_callback_states_moves_restored_callbacks_last() {
    let mut state = CallbackState::default();
    state.args.insert("early_stopping_patience", 7i64);
    state.args.insert("early_stopping_threshold", 0.25);
    state
        .attributes
        .insert("early_stopping_patience_counter", 3i64);
    let mut stored = JsonMap::new();
    stored.insert("EarlyStoppingCallback", state.to_json());
    stored.insert("WandbCallback", JsonMap::new());
    let control_state = TrainerControl {
        should_epoch_stop: true,
        ..Default::default()
    };
    stored.insert(
        "TrainerControl",
        tchtrain_callbacks::ExportableState::state(&control_state).to_json(),
    );

    let mut handler = CallbackHandler::new(vec![
        Box::new(EarlyStoppingCallback::default()),
        Box::new(DefaultFlowCallback),
        Box::new(PrinterCallback),
    ]);
    let mut control = TrainerControl::default();
    let not_found = handler.load_callback_state(&stored, &mut control).unwrap();
    assert_eq!(not_found, ["WandbCallback"]);
    assert_eq!(control, control_state);
    assert_eq!(
        handler.callback_list(),
        "DefaultFlowCallback\nPrinterCallback\nEarlyStoppingCallback"
    );
    let es = handler.get::<EarlyStoppingCallback>().unwrap();
    assert_eq!(
        *es,
        EarlyStoppingCallback {
            early_stopping_patience_counter: 3,
            ..EarlyStoppingCallback::new(7, 0.25)
        }
    );

    // A wrong type in a stored state names the field.
    let mut bad = JsonMap::new();
    let mut s = CallbackState::default();
    s.args.insert("early_stopping_patience", "three");
    bad.insert("EarlyStoppingCallback", s.to_json());
    let err = handler.load_callback_state(&bad, &mut control).unwrap_err();
    assert!(
        err.to_string().contains("args.early_stopping_patience") && err.to_string().contains("str"),
        "{err}"
    );
}

#[test]
fn progress_bars_follow_steps_and_evaluation() {
    let args = TrainingArguments::default();
    let mut state = TrainerState {
        max_steps: 10,
        ..Default::default()
    };
    let mut control = TrainerControl::default();
    let mut progress = ProgressCallback::with_draw_target(100, ProgressDrawTarget::hidden());
    progress
        .on_train_begin(&args, &state, &mut control)
        .unwrap();
    assert_eq!(progress.training_position(), Some((0, 10)));
    for step in 1..=3 {
        state.global_step = step;
        progress.on_step_end(&args, &state, &mut control).unwrap();
    }
    assert_eq!(progress.training_position(), Some((3, 10)));
    // Beside the bar: memory from the start; loss and learning rate once logged; tokens per
    // second once the Trainer counts input tokens.
    let message = progress.training_message().unwrap();
    assert!(
        message.starts_with("mem=") && message.ends_with("iB"),
        "{message}"
    );
    let mut logs = JsonMap::new();
    logs.insert("loss", 2.5);
    logs.insert("learning_rate", 1e-5);
    progress.on_log(&args, &state, &mut control, &logs).unwrap();
    let message = progress.training_message().unwrap();
    assert!(message.starts_with("loss=2.5 lr=1e-05 mem="), "{message}");
    // (Step ends refresh the text at most every 100 ms.)
    std::thread::sleep(std::time::Duration::from_millis(120));
    state.num_input_tokens_seen = 4096;
    state.global_step = 4;
    progress.on_step_end(&args, &state, &mut control).unwrap();
    let message = progress.training_message().unwrap();
    assert!(message.starts_with("loss=2.5 lr=1e-05 tok/s="), "{message}");
    // 4096 tokens in at least 120 ms: more than none, at most 34.1k tokens per second.
    let rate = message
        .split("tok/s=")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap();
    let (digits, scale) = match rate.strip_suffix('k') {
        Some(d) => (d, 1e3),
        None => (rate, 1.0),
    };
    let rate_value = digits.parse::<f64>().unwrap() * scale;
    assert!(rate_value > 0.0 && rate_value <= 34_134.0, "{message}");
    for _ in 0..2 {
        progress
            .on_prediction_step(&args, &state, &mut control, Some(4))
            .unwrap();
    }
    assert_eq!(progress.prediction_position(), Some((2, 4)));
    assert_eq!(progress.training_position(), Some((4, 10)));
    progress
        .on_evaluate(&args, &state, &mut control, &JsonMap::new())
        .unwrap();
    assert_eq!(progress.prediction_position(), None);
    progress.on_train_end(&args, &state, &mut control).unwrap();
    assert_eq!(progress.training_position(), None);

    // Ranks other than 0 draw nothing.
    state.is_world_process_zero = false;
    progress
        .on_train_begin(&args, &state, &mut control)
        .unwrap();
    progress
        .on_prediction_step(&args, &state, &mut control, Some(4))
        .unwrap();
    assert_eq!(
        (progress.training_position(), progress.prediction_position()),
        (None, None)
    );
}

fn sample_logs() -> Vec<(i64, JsonMap)> {
    let mut train = JsonMap::new();
    train.insert("loss", 2.5);
    train.insert("grad_norm", 0.123_456_789);
    train.insert("learning_rate", 1e-5);
    train.insert("epoch", 0.5);
    let mut eval = JsonMap::new();
    eval.insert("eval_loss", 1.75);
    eval.insert("eval_accuracy", 1i64);
    eval.insert("epoch", 1.0);
    let mut other = JsonMap::new();
    other.insert("test_loss", -3.0e-3);
    other.insert("note", "hello");
    other.insert("ignored", JsonValue::Array(vec![]));
    vec![(1, train), (4, eval), (9, other)]
}

#[test]
fn jsonl_logger_writes_log_history_entries() {
    let dir = temp_dir("jsonl");
    let args = TrainingArguments {
        output_dir: Some(dir.display().to_string()),
        ..Default::default()
    };
    let mut handler = CallbackHandler::new(vec![
        Box::new(DefaultFlowCallback),
        Box::new(JsonlLoggerCallback::new()),
    ]);
    let mut state = TrainerState::default();
    let mut control = TrainerControl::default();
    for (step, logs) in sample_logs() {
        state.global_step = step;
        handler.on_log(&args, &state, &mut control, &logs).unwrap();
    }
    handler.on_train_end(&args, &state, &mut control).unwrap();
    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(
        lines[0],
        r#"{"loss": 2.5, "grad_norm": 0.123456789, "learning_rate": 1e-05, "epoch": 0.5, "step": 1}"#
    );
    for ((step, logs), line) in sample_logs().into_iter().zip(lines) {
        let mut want = logs;
        want.insert("step", step);
        assert_eq!(loads(line).unwrap(), JsonValue::Object(want));
    }
}

#[test]
fn report_to_selects_loggers() {
    let names = |v: &[&str]| -> Vec<String> {
        get_reporting_integration_callbacks(v)
            .unwrap()
            .iter()
            .map(|c| c.name().to_string())
            .collect()
    };
    assert_eq!(names(&["none"]), Vec::<String>::new());
    assert_eq!(names(&["tensorboard"]), ["TensorBoardCallback"]);
    // codecarbon: its settings are read when the callback is made, the machine when the
    // Trainer is built (callbacks/tests/it/codecarbon.rs); "all" takes it only when configured.
    if !tchtrain_callbacks::codecarbon_is_configured() {
        assert_eq!(names(&["codecarbon"]), ["CodeCarbonCallback"]);
    }
    // "all": the available ones, in upstream's order; mlflow when a tracking server is named.
    if tchtrain_callbacks::is_mlflow_available() {
        assert_eq!(
            names(&["all"]),
            [
                "MLflowCallback",
                "TensorBoardCallback",
                "JsonlLoggerCallback"
            ]
        );
    } else {
        assert_eq!(
            names(&["all"]),
            ["TensorBoardCallback", "JsonlLoggerCallback"]
        );
        if std::env::var_os("MLFLOW_TRACKING_URI").is_none() {
            let err = get_reporting_integration_callbacks(&["mlflow"])
                .err()
                .unwrap()
                .to_string();
            assert!(
                err.starts_with("MLFLOW_TRACKING_URI=\"\": is not set")
                    && err.contains("mlflow server"),
                "{err}"
            );
        }
    }
    // wandb: online (the default mode) without an API key is refused as wandb refuses it,
    // naming WANDB_API_KEY and `wandb login`.
    let netrc = std::env::var_os("HOME").map(|h| Path::new(&h).join(".netrc"));
    if ["WANDB_MODE", "WANDB_API_KEY", "NETRC"]
        .iter()
        .all(|v| std::env::var_os(v).is_none())
        && !netrc.is_some_and(|n| n.exists())
    {
        let err = get_reporting_integration_callbacks(&["wandb"])
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.starts_with("WANDB_API_KEY=\"\"") && err.contains("wandb login"),
            "{err}"
        );
    }
    // comet_ml: the offline archive only; online mode is refused naming COMET_START_ONLINE.
    if std::env::var_os("COMET_START_ONLINE").is_none() {
        let err = get_reporting_integration_callbacks(&["comet_ml"])
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.starts_with("comet_ml: COMET_START_ONLINE=<unset>") && err.contains("comet upload"),
            "{err}"
        );
    }
    // swanlab: the offline run folder only; cloud mode is refused naming SWANLAB_MODE.
    if std::env::var_os("SWANLAB_MODE").is_none() {
        let err = get_reporting_integration_callbacks(&["swanlab"])
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.starts_with("swanlab: SWANLAB_MODE=<unset>") && err.contains("swanlab sync"),
            "{err}"
        );
    }
    let err = get_reporting_integration_callbacks(&["neptune"])
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("neptune")
            && err.to_string().contains("deprecates")
            && err
                .to_string()
                .contains("trackio, swanlab, kubeflow, jsonl"),
        "{err}"
    );
}

#[test]
fn tensorboard_event_files_read_back_with_tensorboard() {
    let Some(python) = std::env::var_os("TCHTRAIN_VENV_PYTHON") else {
        panic!(
            "TCHTRAIN_VENV_PYTHON is not set: it names the setup virtualenv's python (with tensorboard), and \
             `cargo xtask setup` writes it into .cargo/libtorch.toml; run `cargo xtask setup`"
        );
    };
    let dir = temp_dir("tensorboard");
    let args = TrainingArguments::default();
    let mut handler = CallbackHandler::new(vec![
        Box::new(DefaultFlowCallback),
        Box::new(TensorBoardCallback::with_logging_dir(&dir)),
    ]);
    let mut state = TrainerState::default();
    let mut control = TrainerControl::default();
    handler.on_train_begin(&args, &state, &mut control).unwrap();
    for (step, logs) in sample_logs() {
        state.global_step = step;
        handler.on_log(&args, &state, &mut control, &logs).unwrap();
    }
    handler.on_train_end(&args, &state, &mut control).unwrap();

    let script = r#"
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0, "tensors": 0})
acc.Reload()
tags = acc.Tags()
out = {
    "scalars": {t: [[e.step, e.value] for e in acc.Scalars(t)] for t in tags["scalars"]},
    "texts": {t: [[e.step, e.tensor_proto.string_val[0].decode()] for e in acc.Tensors(t)] for t in tags["tensors"]},
    "file_version": acc.file_version,
}
print(json.dumps(out, sort_keys=True))
"#;
    let out = Command::new(&python)
        .arg("-c")
        .arg(script)
        .arg(&dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "running TCHTRAIN_VENV_PYTHON={}: {e}",
                python.to_string_lossy()
            )
        });
    assert!(
        out.status.success(),
        "tensorboard reader failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read = loads(String::from_utf8(out.stdout).unwrap().trim()).unwrap();
    let obj = read.as_object().unwrap();
    assert_eq!(obj.get("file_version"), Some(&JsonValue::Float(2.0)));

    let scalars = obj.get("scalars").unwrap().as_object().unwrap();
    let mut expected: Vec<(String, i64, f64)> = vec![
        ("train/loss".into(), 1, 2.5),
        ("train/grad_norm".into(), 1, 0.123_456_789),
        ("train/learning_rate".into(), 1, 1e-5),
        ("train/epoch".into(), 1, 0.5),
        ("eval/loss".into(), 4, 1.75),
        ("eval/accuracy".into(), 4, 1.0),
        ("train/epoch".into(), 4, 1.0),
        ("test/loss".into(), 9, -3.0e-3),
    ];
    expected.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut got: Vec<(String, i64, f64)> = Vec::new();
    for (tag, events) in scalars.iter() {
        for e in events.as_array().unwrap() {
            let e = e.as_array().unwrap();
            got.push((
                tag.to_string(),
                e[0].as_i64().unwrap(),
                e[1].as_f64().unwrap(),
            ));
        }
    }
    got.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    assert_eq!(got.len(), expected.len(), "{got:?}");
    for (g, w) in got.iter().zip(&expected) {
        // TensorBoard stores simple_value as float32: the value read back is the f32 rounding.
        assert_eq!((&g.0, g.1, g.2), (&w.0, w.1, w.2 as f32 as f64));
    }

    let texts = obj.get("texts").unwrap().as_object().unwrap();
    let note = texts
        .get("train/note/text_summary")
        .unwrap()
        .as_array()
        .unwrap();
    assert_eq!(
        note[0],
        JsonValue::Array(vec![JsonValue::Int(9), JsonValue::Str("hello".into())])
    );
    let args_text = texts.get("args/text_summary").unwrap().as_array().unwrap()[0]
        .as_array()
        .unwrap()[1]
        .clone();
    assert!(
        args_text.as_str().unwrap().contains("\"logging_steps\""),
        "{args_text:?}"
    );
}

#[test]
fn malformed_trainer_state_files_give_errors_naming_file_and_field() {
    let dir = temp_dir("bad-state");
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let cases: Vec<(&str, &str, Vec<&str>)> = vec![
        (
            "syntax.json",
            "{\n  \"global_step\": 3,\n  \"epoch\" 1.0\n}",
            vec!["syntax.json", "line 3"],
        ),
        (
            "type.json",
            r#"{"global_step": "three"}"#,
            vec!["type.json", "`global_step`", "str"],
        ),
        (
            "history.json",
            r#"{"log_history": [{"loss": 1.0}, 5]}"#,
            vec!["log_history[1]", "int"],
        ),
        (
            "unknown.json",
            r#"{"global_step": 1, "steps_done": 2}"#,
            vec!["unknown.json", "steps_done"],
        ),
        (
            "bool.json",
            r#"{"is_world_process_zero": 1}"#,
            vec!["is_world_process_zero", "bool"],
        ),
        (
            "toplevel.json",
            "[1, 2]",
            vec!["toplevel.json", "JSON object"],
        ),
        (
            "callbacks.json",
            r#"{"stateful_callbacks": []}"#,
            vec!["stateful_callbacks"],
        ),
        (
            "big.json",
            r#"{"global_step": 123456789012345678901234567890}"#,
            vec!["big.json", "64-bit"],
        ),
    ];
    for (name, text, needles) in cases {
        let path = write(name, text);
        let err = TrainerState::load_from_json(&path).unwrap_err().to_string();
        for needle in needles {
            assert!(
                err.contains(needle),
                "{name}: error `{err}` lacks `{needle}`"
            );
        }
    }
    let err = TrainerState::load_from_json(dir.join("missing.json")).unwrap_err();
    assert!(
        matches!(err, Error::Io { .. }) && err.to_string().contains("missing.json"),
        "{err}"
    );

    // Python floats in int fields are kept (e.g. logging_steps=1.0 from the command line).
    let state = TrainerState::from_json_str(
        r#"{"logging_steps": 1.0, "epoch": 0, "total_flos": 2}"#,
        "x",
    )
    .unwrap();
    assert_eq!(
        (state.logging_steps, state.epoch, state.total_flos),
        (1, 0.0, 2.0)
    );
    let text = state.to_json_string();
    assert!(
        text.contains("\"logging_steps\": 1.0,") && text.contains("\"epoch\": 0,"),
        "{text}"
    );
    let mut moved = state;
    moved.epoch = 1.0;
    moved.logging_steps = 4;
    let text = moved.to_json_string();
    assert!(
        text.contains("\"logging_steps\": 4,") && text.contains("\"epoch\": 1.0,"),
        "{text}"
    );
}

/// Reads the event files under `dir` with the reference script's own reader (TensorBoard's
/// EventAccumulator and the hparams plugin's protobufs).
fn read_with_tensorboard(python: &std::ffi::OsStr, dir: &std::path::Path) -> JsonValue {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scripts/reference/tensorboard_callback.py");
    let out = Command::new(python)
        .arg(&script)
        .arg("--read")
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", python.to_string_lossy()));
    assert!(
        out.status.success(),
        "tensorboard reader failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    loads(String::from_utf8(out.stdout).unwrap().trim()).unwrap()
}

#[test]
fn tensorboard_texts_and_hparams_read_back_as_upstreams() {
    let Some(python) = std::env::var_os("TCHTRAIN_VENV_PYTHON") else {
        panic!(
            "TCHTRAIN_VENV_PYTHON is not set: it names the setup virtualenv's python (with tensorboard), and \
             `cargo xtask setup` writes it into .cargo/libtorch.toml; run `cargo xtask setup`"
        );
    };
    let path = crate::common::reference_root()
        .join("tensorboard_callback")
        .join("tensorboard_callback.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "reference file {} is missing ({e}); run `cargo xtask setup` (it runs \
             scripts/reference/tensorboard_callback.py)",
            path.display()
        )
    });
    let reference = loads(&text).unwrap();
    let reference = reference.as_object().unwrap();
    let kwargs: serde_json::Value = serde_json::from_str(&tchtrain_callbacks::dumps(
        reference.get("args").unwrap(),
        None,
        false,
    ))
    .unwrap();
    let args = TrainingArguments::from_dict(kwargs.as_object().unwrap().clone())
        .unwrap()
        .args;
    let config_json = reference
        .get("model_config_json")
        .unwrap()
        .as_str()
        .unwrap();

    let dir = temp_dir("tensorboard-upstream");
    let mut handler = CallbackHandler::new(vec![
        Box::new(DefaultFlowCallback),
        Box::new(TensorBoardCallback::with_logging_dir(&dir).with_hparams()),
    ]);
    handler.set_model_config(ModelConfig::from_json(config_json).unwrap());
    let state = TrainerState::default();
    let mut control = TrainerControl::default();
    handler.on_train_begin(&args, &state, &mut control).unwrap();
    handler.on_train_end(&args, &state, &mut control).unwrap();

    let ours = read_with_tensorboard(&python, &dir);
    let want = reference.get("read").unwrap();
    let (ours_runs, want_runs) = (ours.as_object().unwrap(), want.as_object().unwrap());
    assert_eq!(
        ours_runs.iter().map(|(k, _)| k).collect::<Vec<_>>(),
        want_runs.iter().map(|(k, _)| k).collect::<Vec<_>>()
    );
    for (run, want_run) in want_runs.iter() {
        let ours_run = ours_runs.get(run).unwrap().as_object().unwrap();
        for (key, want_value) in want_run.as_object().unwrap().iter() {
            let got = ours_run.get(key).unwrap();
            if let (JsonValue::Object(g), JsonValue::Object(w)) = (got, want_value) {
                for (tag, w_tag) in w.iter() {
                    assert_eq!(g.get(tag), Some(w_tag), "run {run:?}, {key}, {tag}");
                }
            }
            assert_eq!(got, want_value, "run {run:?}, {key}");
        }
    }
}

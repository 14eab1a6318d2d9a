//! SwanLabCallback against upstream's with swanlab 0.10's offline mode
//! (scripts/reference/swanlab_callback.py: transformers' SwanLabCallback driven with the same
//! arguments, model config, logs and prediction metrics; one case in a named project and
//! workspace with a log folder and a run name long enough to fold in config.yaml, one with the
//! defaults, no run name and resuming from a checkpoint). Both run folders are read with
//! swanlab's own code (`scripts/reference/_swanlab_read.py`, run by the setup virtualenv's
//! python: its DataStoreReader and protobuf records, `swanlab sync`'s start check, PyYAML) and
//! must read the same: the folder's files, every record in order (times, the id and generated
//! name / color aside), the config saves, config.yaml byte for byte. Upstream's records about
//! its own Python process (console lines, metadata, requirements, debug log) are set aside by
//! the reader; ours has none.

use std::path::{Path, PathBuf};

use tchtrain_callbacks::{
    JsonMap, JsonValue, ModelConfig, SwanLabCallback, SwanLabSettings, TrainerCallback,
    TrainerControl, TrainerState, dumps, loads,
};
use tchtrain_training_args::TrainingArguments;

use crate::common::{at, replay_case, run_reader, script_reference, temp_dir};

/// What swanlab reads of the run folder (see `_swanlab_read.py`).
fn read_back(run_dir: &Path, cwd: &Path) -> JsonValue {
    run_reader(
        "_swanlab_read.py",
        &[run_dir.as_os_str(), cwd.as_os_str()],
        &[],
    )
}

/// The one run folder in `log_dir`.
fn run_dir_in(log_dir: &Path) -> PathBuf {
    let runs: Vec<PathBuf> = std::fs::read_dir(log_dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    runs[0].clone()
}

#[test]
fn swanlab_callback_writes_what_upstream_writes() {
    let reference = script_reference("swanlab_callback");
    for case in at(&reference, "cases").as_array().unwrap() {
        let name = at(case, "name").as_str().unwrap();
        let work = temp_dir(&format!("swanlab-{name}"));
        let env: Vec<(String, String)> = at(case, "env")
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_str().unwrap().to_string()))
            .collect();
        let settings = SwanLabSettings::from_vars(&work, None, env).unwrap();
        let mut callback = SwanLabCallback::with_settings(settings.clone());
        callback.set_model_config(
            &ModelConfig::from_dict(at(case, "model_config").as_object().unwrap().clone())
                .with_num_parameters(at(case, "num_parameters").as_i64().unwrap()),
        );
        replay_case(Box::new(callback), case);
        let ours = read_back(&run_dir_in(&settings.log_dir), &work);
        let expected = at(case, "read");
        assert_eq!(
            at(&ours, "set_aside"),
            &JsonValue::Array(Vec::new()),
            "{name}"
        );
        for key in [
            "gitignore",
            "files",
            "run_dir",
            "sync_start",
            "records",
            "config_saves",
            "config_yaml",
            "config",
        ] {
            let (a, b) = (at(&ours, key), at(expected, key));
            if a != b {
                if let (Some(a), Some(b)) = (a.as_array(), b.as_array()) {
                    for (i, (x, y)) in a.iter().zip(b).enumerate() {
                        assert_eq!(
                            dumps(x, None, true),
                            dumps(y, None, true),
                            "{name}: {key}[{i}]"
                        );
                    }
                    assert_eq!(a.len(), b.len(), "{name}: {key}");
                }
                if let (Some(a), Some(b)) = (a.as_str(), b.as_str()) {
                    for (i, (x, y)) in a.lines().zip(b.lines()).enumerate() {
                        assert_eq!(x, y, "{name}: {key} line {}", i + 1);
                    }
                }
                panic!(
                    "{name}: {key}: ours {} upstream {}",
                    dumps(a, None, true),
                    dumps(b, None, true)
                );
            }
        }
        let _ = std::fs::remove_dir_all(&work);
    }
}

#[test]
fn a_second_process_disabled_mode_and_a_crash_are_written_as_swanlab_writes_them() {
    let work = temp_dir("swanlab-silent");
    let vars = |mode: &str| vec![("SWANLAB_MODE".to_string(), mode.to_string())];
    let args = TrainingArguments::default();
    let mut control = TrainerControl::default();
    let rank1 = TrainerState {
        is_world_process_zero: false,
        ..TrainerState::default()
    };
    for (mode, state) in [("offline", &rank1), ("disabled", &TrainerState::default())] {
        let settings = SwanLabSettings::from_vars(&work, None, vars(mode)).unwrap();
        let mut callback = SwanLabCallback::with_settings(settings.clone());
        callback.on_train_begin(&args, state, &mut control).unwrap();
        let mut logs = JsonMap::new();
        logs.insert("loss", 1.0);
        callback.on_log(&args, state, &mut control, &logs).unwrap();
        callback.on_train_end(&args, state, &mut control).unwrap();
        drop(callback);
        assert!(!settings.log_dir.exists(), "{mode}");
    }
    // Dropped during training (an error or an interrupted run): finished as crashed.
    let settings = SwanLabSettings::from_vars(&work, None, vars("offline")).unwrap();
    let mut callback = SwanLabCallback::with_settings(settings.clone());
    let state = TrainerState::default();
    callback
        .on_train_begin(&args, &state, &mut control)
        .unwrap();
    drop(callback);
    let ours = read_back(&run_dir_in(&settings.log_dir), &work);
    let records = at(&ours, "records").as_array().unwrap();
    let finish = at(records.last().unwrap(), "finish");
    assert_eq!(at(finish, "state").as_str(), Some("RUN_STATE_CRASHED"));
    assert_eq!(
        at(&ours, "sync_start"),
        &loads(r#"{"success": true, "message": "success"}"#).unwrap()
    );
    let _ = std::fs::remove_dir_all(&work);
}

//! ClearMLCallback against upstream's with clearml 2.1's offline mode
//! (scripts/reference/clearml_callback.py: transformers' ClearMLCallback driven with the same
//! arguments, model config and logs; one case with the defaults, one in a named project and
//! task with its own cache folder). Both sessions are read the same way
//! (`scripts/reference/_clearml_server.py read`, run by the setup virtualenv's python): the zip's
//! files, task.json, every metric event in order — and imported by clearml's own
//! `Task.import_offline_session` into a stand-in ClearML API server, whose task
//! (hyperparameters, configuration object, status) and scalar events must be the same.
//! Upstream's session also holds what clearml records of its Python process (`script`'s code
//! and packages, console lines in `log.jsonl`); ours names the program and has no console.

use std::path::{Path, PathBuf};

use tchtrain_callbacks::{
    ClearMLCallback, ClearMLSettings, JsonMap, JsonValue, ModelConfig, TrainerCallback,
    TrainerControl, TrainerState, config_dict_to_text, dumps, get_reporting_integration_callbacks,
};
use tchtrain_training_args::TrainingArguments;

use crate::common::{at, case_args, env_of, replay_case, run_reader, script_reference, temp_dir};

/// The one session zip under `<cache>/offline/`.
fn session_zip(cache: &Path) -> PathBuf {
    let zips: Vec<PathBuf> = std::fs::read_dir(cache.join("offline"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "zip"))
        .collect();
    assert_eq!(zips.len(), 1, "{zips:?}");
    zips[0].clone()
}

fn without(v: &JsonValue, keys: &[&str]) -> JsonValue {
    let mut m = v.as_object().unwrap().clone();
    for k in keys {
        m.remove(k);
    }
    JsonValue::Object(m)
}

fn assert_same(name: &str, what: &str, ours: &JsonValue, upstream: &JsonValue) {
    if ours == upstream {
        return;
    }
    if let (Some(a), Some(b)) = (ours.as_object(), upstream.as_object()) {
        for (k, v) in b.iter() {
            assert_same(
                name,
                &format!("{what}.{k}"),
                a.get(k).unwrap_or(&JsonValue::Null),
                v,
            );
        }
        for (k, _) in a.iter() {
            assert!(b.contains_key(k), "{name}: {what}.{k}: ours only");
        }
    }
    if let (Some(a), Some(b)) = (ours.as_array(), upstream.as_array()) {
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert_same(name, &format!("{what}[{i}]"), x, y);
        }
    }
    panic!(
        "{name}: {what}: ours {} upstream {}",
        dumps(ours, None, true),
        dumps(upstream, None, true)
    );
}

#[test]
fn clearml_callback_writes_what_upstream_writes() {
    let reference = script_reference("clearml_callback");
    for case in at(&reference, "cases").as_array().unwrap() {
        let name = at(case, "name").as_str().unwrap();
        let work = temp_dir(&format!("clearml-{name}"));
        let settings = ClearMLSettings::from_vars(&work, Some(&work), env_of(case)).unwrap();
        let mut callback = ClearMLCallback::with_settings(settings.clone());
        callback.set_model_config(&ModelConfig::from_dict(
            at(case, "model_config").as_object().unwrap().clone(),
        ));
        if let Some(error) = case.as_object().unwrap().get("error") {
            // Upstream fails at the first save; ours refuses before training, saying why.
            let err = callback
                .on_train_begin(
                    &case_args(case),
                    &TrainerState::default(),
                    &mut TrainerControl::default(),
                )
                .unwrap_err()
                .to_string();
            let upstream = error.as_str().unwrap();
            let message = upstream.split_once(": ").unwrap().1;
            assert!(err.contains("CLEARML_LOG_MODEL"), "{err}");
            assert!(err.contains(message), "{err} does not quote {upstream}");
            assert!(err.contains("CLEARML_LOG_MODEL=FALSE"), "{err}");
            continue;
        }
        replay_case(Box::new(callback), case);
        let ours = run_reader(
            "_clearml_server.py",
            &[
                "read".as_ref(),
                session_zip(&settings.cache_dir).as_os_str(),
            ],
            &[],
        );
        let (session, expected) = (at(&ours, "session"), at(case, "session"));
        let files: Vec<&JsonValue> = at(expected, "files")
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f.as_str() != Some("log.jsonl"))
            .collect();
        assert_eq!(
            at(session, "files")
                .as_array()
                .unwrap()
                .iter()
                .collect::<Vec<_>>(),
            files,
            "{name}"
        );
        assert_same(
            name,
            "task.json",
            &without(at(session, "task"), &["script"]),
            &without(at(expected, "task"), &["script"]),
        );
        assert_same(
            name,
            "events",
            at(session, "events"),
            at(expected, "events"),
        );
        let script = at(at(session, "task"), "script").as_array().unwrap();
        assert!(script.iter().any(|k| k.as_str() == Some("entry_point")));
        let (imported, expected) = (at(&ours, "imported"), at(case, "imported"));
        assert_same(
            name,
            "imported",
            &without(imported, &["log_events", "script_keys"]),
            &without(expected, &["log_events", "script_keys"]),
        );
        assert_eq!(at(imported, "log_events").as_i64(), Some(0), "{name}");
        let _ = std::fs::remove_dir_all(&work);
    }
    for pair in at(&reference, "hocon").as_array().unwrap() {
        let pair = pair.as_array().unwrap();
        let text = config_dict_to_text(pair[0].as_object().unwrap());
        let expected = pair[1].as_str().unwrap();
        for (i, (a, b)) in text.lines().zip(expected.lines()).enumerate() {
            assert_eq!(a, b, "HOCON line {}", i + 1);
        }
        assert_eq!(text, expected);
    }
}

#[test]
fn report_to_clearml_needs_offline_mode_and_a_rank_one_process_writes_nothing() {
    // report_to's resolution reads the process environment, which no test here sets for
    // clearml: online mode (the default) is refused naming the variable and the way out.
    let err = get_reporting_integration_callbacks(&["clearml"])
        .err()
        .expect("clearml's online mode is refused")
        .to_string();
    assert!(err.contains("CLEARML_OFFLINE_MODE"), "{err}");
    let work = temp_dir("clearml-rank1");
    let vars = vec![
        ("CLEARML_OFFLINE_MODE".to_string(), "1".to_string()),
        ("CLEARML_LOG_MODEL".to_string(), "FALSE".to_string()),
    ];
    let settings = ClearMLSettings::from_vars(&work, Some(&work), vars.clone()).unwrap();
    let args = TrainingArguments::default();
    let mut control = TrainerControl::default();
    let rank1 = TrainerState {
        is_world_process_zero: false,
        ..TrainerState::default()
    };
    let mut callback = ClearMLCallback::with_settings(settings.clone());
    callback
        .on_train_begin(&args, &rank1, &mut control)
        .unwrap();
    let mut logs = JsonMap::new();
    logs.insert("loss", 1.0);
    callback.on_log(&args, &rank1, &mut control, &logs).unwrap();
    callback.on_train_end(&args, &rank1, &mut control).unwrap();
    drop(callback);
    assert!(!settings.cache_dir.exists());
    // Dropped during training (an error or an interrupted run): the session is still zipped,
    // with what was logged.
    let mut callback = ClearMLCallback::with_settings(settings.clone());
    let state = TrainerState {
        global_step: 3,
        ..TrainerState::default()
    };
    callback
        .on_train_begin(&args, &state, &mut control)
        .unwrap();
    callback.on_log(&args, &state, &mut control, &logs).unwrap();
    drop(callback);
    let read = run_reader(
        "_clearml_server.py",
        &[
            "read".as_ref(),
            session_zip(&settings.cache_dir).as_os_str(),
        ],
        &[],
    );
    assert_eq!(
        dumps(at(at(&read, "imported"), "scalars"), None, false),
        r#"[["train", "loss", 3, 1.0]]"#
    );
    // No model config: no configuration object and no model-configuration flag.
    let task = at(at(&read, "imported"), "task");
    assert_eq!(at(task, "configuration"), &JsonValue::Null);
    let params = at(at(task, "hyperparams"), "Transformers")
        .as_object()
        .unwrap();
    assert!(params.contains_key("_ignore_hparams_ui_overrides_"));
    assert!(!params.contains_key("_ignore_model_config_ui_overrides_"));
    // With checkpoints saved, CLEARML_LOG_MODEL's default is refused before training.
    let settings = ClearMLSettings::from_vars(&work, Some(&work), vars[..1].to_vec()).unwrap();
    let mut callback = ClearMLCallback::with_settings(settings);
    let err = callback
        .on_train_begin(&args, &TrainerState::default(), &mut control)
        .unwrap_err()
        .to_string();
    assert!(err.contains("CLEARML_LOG_MODEL=FALSE"), "{err}");
    let _ = std::fs::remove_dir_all(&work);
}

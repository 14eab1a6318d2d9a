//! TrackioCallback against upstream's with trackio's local store
//! (scripts/reference/trackio_callback.py: transformers' TrackioCallback driven through
//! trackio 0.43 with the same arguments, model config, logs and prediction metrics, in the
//! same sessions: a named run logged, then resumed; two unnamed runs). Our project database
//! is read with trackio's own API (`scripts/reference/_trackio_read.py`, run by the setup
//! virtualenv's python) and must hold what upstream's holds: the same schema and version,
//! the same runs by name (trackio's generated names for unnamed runs, the resumed run's
//! steps continued), every run's config and every logged row (times and ids excepted; NaN and
//! infinities as trackio reads them back).

use std::path::Path;
use std::process::Command;

use tchtrain_callbacks::{
    Error, JsonMap, JsonValue, ModelConfig, TrackioCallback, TrackioSettings, TrainerCallback,
    TrainerControl, TrainerState, check_trackio_args, dumps,
};
use tchtrain_training_args::{StrOrBool, TrainingArguments};

use crate::common::{at, run_reader, script_reference, temp_dir, venv_python};

fn serde(v: &JsonValue) -> serde_json::Value {
    serde_json::from_str(&dumps(v, None, false)).unwrap()
}

fn object(v: &JsonValue) -> JsonMap {
    v.as_object().unwrap().clone()
}

/// What trackio's API reads from the project `project` under `dir`.
fn read_back(dir: &Path, project: &str) -> JsonValue {
    run_reader(
        "_trackio_read.py",
        &[std::ffi::OsStr::new(project)],
        &[
            ("TRACKIO_DIR", dir.as_os_str()),
            ("HF_HUB_OFFLINE", std::ffi::OsStr::new("1")),
        ],
    )
}

#[test]
fn trackio_callback_writes_what_upstream_writes() {
    let reference = script_reference("trackio_callback");
    for case in at(&reference, "cases").as_array().unwrap() {
        let name = at(case, "name").as_str().unwrap();
        let dir = temp_dir(&format!("trackio-{name}"));
        let args =
            TrainingArguments::from_dict(serde(at(case, "args")).as_object().unwrap().clone())
                .unwrap()
                .args;
        let config = ModelConfig::from_json_value(&serde(at(case, "model_config")))
            .unwrap()
            .with_num_parameters(at(case, "num_parameters").as_i64().unwrap());
        for session in at(case, "sessions").as_array().unwrap() {
            let mut callback = TrackioCallback::with_settings(TrackioSettings { dir: dir.clone() });
            callback.set_model_config(&config);
            let mut state = TrainerState::default();
            let mut control = TrainerControl::default();
            callback
                .on_train_begin(&args, &state, &mut control)
                .unwrap();
            for entry in at(session, "logs").as_array().unwrap() {
                let entry = entry.as_array().unwrap();
                state.global_step = entry[0].as_i64().unwrap();
                callback
                    .on_log(&args, &state, &mut control, &object(&entry[1]))
                    .unwrap();
            }
            let predict = at(session, "predict");
            if !matches!(predict, JsonValue::Null) {
                callback
                    .on_predict(&args, &state, &mut control, &object(predict))
                    .unwrap();
            }
            let (db, _, _) = callback.run().unwrap();
            assert_eq!(db, dir.join(format!("{}.db", args.project)));
            callback.on_train_end(&args, &state, &mut control).unwrap();
            assert!(callback.run().is_none());
        }
        let ours = dumps(&read_back(&dir, &args.project), Some(1), true);
        let theirs = dumps(at(case, "read"), Some(1), true);
        if ours != theirs {
            let (o, t): (Vec<&str>, Vec<&str>) = (ours.lines().collect(), theirs.lines().collect());
            let first = o
                .iter()
                .zip(&t)
                .position(|(a, b)| a != b)
                .unwrap_or(o.len().min(t.len()));
            panic!(
                "{name}: trackio reads our store differently from upstream's, from line {first}:\nours:   {}\ntheirs: {}",
                o[first.saturating_sub(3)..(first + 3).min(o.len())].join("\n        "),
                t[first.saturating_sub(3)..(first + 3).min(t.len())].join("\n        ")
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn trackio_refuses_the_hub_and_foreign_databases_with_the_reason() {
    let base = || TrainingArguments {
        report_to: vec!["trackio".into()],
        ..TrainingArguments::default()
    };
    let refused = |args: TrainingArguments, field: &str| match check_trackio_args(&args) {
        Err(Error::TrackioSetting {
            field: f, reason, ..
        }) => {
            assert_eq!(f, field, "{reason}");
            assert!(!reason.is_empty());
        }
        other => panic!("{field}: {other:?}"),
    };
    refused(
        TrainingArguments {
            trackio_space_id: Some("me/dashboard".into()),
            ..base()
        },
        "trackio_space_id",
    );
    refused(
        TrainingArguments {
            trackio_bucket_id: Some("me/bucket".into()),
            ..base()
        },
        "trackio_bucket_id",
    );
    refused(
        TrainingArguments {
            push_to_hub: true,
            ..base()
        },
        "trackio_static_space_id",
    );
    check_trackio_args(&TrainingArguments {
        push_to_hub: true,
        trackio_static_space_id: Some(StrOrBool::Bool(false)),
        ..base()
    })
    .unwrap();
    refused(
        TrainingArguments {
            project: "registry-models".into(),
            ..base()
        },
        "project",
    );

    // A project database of another trackio schema is not written into.
    let dir = temp_dir("trackio-foreign");
    let status = Command::new(venv_python())
        .args([
            "-c",
            "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('CREATE TABLE metrics (x)'); c.execute('PRAGMA user_version = 1'); c.commit()",
        ])
        .arg(dir.join("huggingface.db"))
        .status()
        .unwrap();
    assert!(status.success());
    let mut callback = TrackioCallback::with_settings(TrackioSettings { dir: dir.clone() });
    let err = callback
        .on_train_begin(
            &base(),
            &TrainerState::default(),
            &mut TrainerControl::default(),
        )
        .unwrap_err();
    assert!(
        matches!(&err, Error::Trackio { message, .. } if message.contains("schema version 1")),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

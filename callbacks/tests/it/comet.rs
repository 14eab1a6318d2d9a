//! CometCallback against upstream's with comet_ml 3.58's offline mode
//! (scripts/reference/comet_callback.py: transformers' CometCallback driven with the same
//! arguments, model config, logs and prediction metrics, one case with `COMET_MODE=create`,
//! a project, a workspace and a run name, one with the defaults). Both archives are read
//! with comet_ml's own code (`scripts/reference/_comet_read.py`, run by the setup
//! virtualenv's python: the package's JSON schemas for the upload, its message classes,
//! `comet offline --csv`) and must read the same: the archive's name, `experiment.json`
//! (ids and times aside), every parameter, metric and log_other message in order (ids and
//! timestamps aside), and the CSV rows. Upstream's messages about its own Python process
//! (source, packages, console, host, system metrics) are set aside by the reader; ours
//! has none.

use std::path::{Path, PathBuf};

use tchtrain_callbacks::{
    CometCallback, CometSettings, JsonMap, JsonValue, ModelConfig, TrainerCallback, TrainerControl,
    TrainerState, dumps,
};
use tchtrain_training_args::TrainingArguments;

use crate::common::{at, replay_case, run_reader, script_reference, temp_dir};

/// What comet_ml reads of the archive (see `_comet_read.py`).
fn read_back(archive: &Path) -> JsonValue {
    run_reader("_comet_read.py", &[archive.as_os_str()], &[])
}

/// The one archive in `dir`.
fn archive_in(dir: &Path) -> PathBuf {
    let zips: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "zip"))
        .collect();
    assert_eq!(zips.len(), 1, "{zips:?}");
    zips[0].clone()
}

#[test]
fn comet_callback_writes_what_upstream_writes() {
    let reference = script_reference("comet_callback");
    for case in at(&reference, "cases").as_array().unwrap() {
        let name = at(case, "name").as_str().unwrap();
        let work = temp_dir(&format!("comet-{name}"));
        let env: Vec<(String, String)> = at(case, "env")
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_str().unwrap().to_string()))
            .chain([("COMET_START_ONLINE".to_string(), "false".to_string())])
            .chain(
                (name != "defaults_no_run_name")
                    .then(|| ("COMET_OFFLINE_DIRECTORY".into(), "archives".into())),
            )
            .collect();
        let settings = CometSettings::from_lookup(&work, None, |k| {
            env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        })
        .unwrap();
        let mut callback = CometCallback::with_settings(settings.clone());
        callback.set_model_config(&ModelConfig::from_dict(
            at(case, "model_config").as_object().unwrap().clone(),
        ));
        replay_case(Box::new(callback), case);
        let archive = archive_in(&settings.offline_directory);
        let ours = read_back(&archive);
        let expected = at(case, "read");
        assert_eq!(
            at(&ours, "set_aside"),
            &JsonValue::Array(Vec::new()),
            "{name}"
        );
        for key in ["archive_name", "experiment", "messages", "csv"] {
            let (a, b) = (at(&ours, key), at(expected, key));
            if a != b {
                let (a, b) = (a.as_array(), b.as_array());
                if let (Some(a), Some(b)) = (a, b) {
                    for (i, (x, y)) in a.iter().zip(b).enumerate() {
                        assert_eq!(
                            dumps(x, None, true),
                            dumps(y, None, true),
                            "{name}: {key}[{i}]"
                        );
                    }
                    assert_eq!(a.len(), b.len(), "{name}: {key}");
                }
                panic!(
                    "{name}: {key}: ours {} upstream {}",
                    dumps(at(&ours, key), None, true),
                    dumps(at(expected, key), None, true)
                );
            }
        }
        let _ = std::fs::remove_dir_all(&work);
    }
}

#[test]
fn a_second_process_and_an_unknown_mode_write_nothing() {
    let work = temp_dir("comet-silent");
    let settings = CometSettings::from_lookup(&work, None, |k| match k {
        "COMET_START_ONLINE" => Some("off".into()),
        _ => None,
    })
    .unwrap();
    let args = TrainingArguments::default();
    let mut control = TrainerControl::default();
    let rank1 = TrainerState {
        is_world_process_zero: false,
        ..TrainerState::default()
    };
    let mut callback = CometCallback::with_settings(settings.clone());
    callback
        .on_train_begin(&args, &rank1, &mut control)
        .unwrap();
    callback
        .on_log(&args, &rank1, &mut control, &JsonMap::new())
        .unwrap();
    callback.on_train_end(&args, &rank1, &mut control).unwrap();
    drop(callback);
    let disabled = CometSettings {
        mode: None,
        ..settings.clone()
    };
    let mut callback = CometCallback::with_settings(disabled);
    let state = TrainerState::default();
    callback
        .on_train_begin(&args, &state, &mut control)
        .unwrap();
    callback.on_train_end(&args, &state, &mut control).unwrap();
    drop(callback);
    assert!(!settings.offline_directory.exists());
    // A config file beside the run is refused by its path.
    std::fs::write(work.join(".comet.config"), "[comet]\n").unwrap();
    let err = CometSettings::from_lookup(&work, None, |k| match k {
        "COMET_START_ONLINE" => Some("false".into()),
        _ => None,
    })
    .unwrap_err()
    .to_string();
    assert!(
        err.contains(".comet.config") && err.contains("COMET_*"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&work);
}

//! DVCLiveCallback against upstream's with dvclive 3.49 (scripts/reference/dvclive_callback.py:
//! transformers' DVCLiveCallback driven twice in one working directory with the same
//! arguments and logs). Every file under `dvclive/`, and `dvc.yaml`, must be upstream's, byte
//! for byte: the params (ruamel's YAML of `args.to_dict()`, the run name quoted), the metric
//! histories (NaN and infinity as dvclive's strings, a string value quoted by the `csv`
//! module, a list dropped), the summary and the second run having replaced the first's.

use std::collections::BTreeMap;
use std::path::Path;

use tchtrain_callbacks::{
    DVCLiveCallback, DVCLiveSettings, Error, JsonMap, TrainerCallback, TrainerControl,
    TrainerState, dumps, get_available_reporting_integrations,
};
use tchtrain_training_args::TrainingArguments;

use crate::common::{at, script_reference, temp_dir};

/// Every file under `dir/dvclive/` and `dir/dvc.yaml`, by path relative to `dir`.
fn files(dir: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let rel = path
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.insert(rel, std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, &dir.join("dvclive"), &mut out);
    if let Ok(text) = std::fs::read_to_string(dir.join("dvc.yaml")) {
        out.insert("dvc.yaml".into(), text);
    }
    out
}

#[test]
fn dvclive_callback_writes_what_upstream_writes() {
    let reference = script_reference("dvclive_callback");
    let dir = temp_dir("dvclive");
    let serde: serde_json::Value =
        serde_json::from_str(&dumps(at(&reference, "args"), None, false)).unwrap();
    let args = TrainingArguments::from_dict(serde.as_object().unwrap().clone())
        .unwrap()
        .args;
    for run in at(&reference, "runs").as_array().unwrap() {
        let mut callback = DVCLiveCallback::with_settings(DVCLiveSettings::in_dir(&dir));
        let mut state = TrainerState::default();
        let mut control = TrainerControl::default();
        callback
            .on_train_begin(&args, &state, &mut control)
            .unwrap();
        for entry in run.as_array().unwrap() {
            let entry = entry.as_array().unwrap();
            state.global_step = entry[0].as_i64().unwrap();
            let logs: JsonMap = entry[1].as_object().unwrap().clone();
            callback.on_log(&args, &state, &mut control, &logs).unwrap();
        }
        callback.on_train_end(&args, &state, &mut control).unwrap();
    }
    let expected: BTreeMap<String, String> = at(&reference, "files")
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.to_string(), v.as_str().unwrap().to_string()))
        .collect();
    let ours = files(&dir);
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>()
    );
    for (path, text) in &expected {
        assert_eq!(&ours[path], text, "{path}");
    }
    // A second process writes nothing.
    let other = temp_dir("dvclive-rank1");
    let mut callback = DVCLiveCallback::with_settings(DVCLiveSettings::in_dir(&other));
    let state = TrainerState {
        is_world_process_zero: false,
        ..TrainerState::default()
    };
    let mut control = TrainerControl::default();
    callback
        .on_train_begin(&args, &state, &mut control)
        .unwrap();
    callback
        .on_log(&args, &state, &mut control, &JsonMap::new())
        .unwrap();
    callback.on_train_end(&args, &state, &mut control).unwrap();
    assert!(std::fs::read_dir(&other).unwrap().next().is_none());
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&other);
}

#[test]
fn what_dvclive_cannot_do_here_is_refused_by_name() {
    let dir = temp_dir("dvclive-refusals");
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    };
    for (pairs, named) in [
        (
            &[("HF_DVCLIVE_LOG_MODEL", "true")][..],
            "HF_DVCLIVE_LOG_MODEL",
        ),
        (
            &[("HF_DVCLIVE_LOG_MODEL", "all")][..],
            "HF_DVCLIVE_LOG_MODEL",
        ),
        (&[("DVC_ROOT", "/r")][..], "DVC_ROOT"),
        (
            &[("DVC_EXP_BASELINE_REV", "abc")][..],
            "DVC_EXP_BASELINE_REV",
        ),
        (&[("DVC_STUDIO_TOKEN", "t")][..], "DVC_STUDIO_TOKEN"),
        (&[("DVCLIVE_RESUME", "yes")][..], "DVCLIVE_RESUME"),
    ] {
        let err = DVCLiveSettings::from_lookup(&dir, env(pairs)).unwrap_err();
        assert!(
            matches!(&err, Error::DvcliveSetting { setting, .. } if setting.contains(named)),
            "{err}"
        );
    }
    // HF_DVCLIVE_LOG_MODEL false, or anything upstream reads as false, is fine.
    for pairs in [
        &[("HF_DVCLIVE_LOG_MODEL", "false")][..],
        &[("HF_DVCLIVE_LOG_MODEL", "no")][..],
        &[("DVCLIVE_RESUME", "false")][..],
    ] {
        DVCLiveSettings::from_lookup(&dir, env(pairs)).unwrap();
    }
    // Inside a DVC repository dvclive saves an experiment: refused, naming the repository.
    std::fs::create_dir_all(dir.join("repo/.dvc")).unwrap();
    std::fs::create_dir_all(dir.join("repo/sub")).unwrap();
    let err = DVCLiveSettings::from_lookup(dir.join("repo/sub"), env(&[])).unwrap_err();
    assert!(err.to_string().contains("DVC repository"), "{err}");
    // A dvc.yaml with other entries is not merged into: refused at setup, naming it.
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(
        work.join("dvc.yaml"),
        "stages:\n  train:\n    cmd: python train.py\n",
    )
    .unwrap();
    let mut callback = DVCLiveCallback::with_settings(DVCLiveSettings::in_dir(&work));
    let err = callback
        .setup(&TrainingArguments::default(), &TrainerState::default())
        .unwrap_err();
    assert!(err.to_string().contains("dvc.yaml"), "{err}");
    // `report_to="all"` leaves it out (it writes into the working directory).
    assert!(!get_available_reporting_integrations().contains(&"dvclive"));
    let _ = std::fs::remove_dir_all(&dir);
}

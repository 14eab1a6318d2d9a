//! WandbCallback against upstream's in W&B's offline mode (scripts/reference/wandb_callback.py:
//! transformers' WandbCallback driven through wandb 0.31 with the same arguments, model config,
//! logs and prediction metrics). Our run's transaction log (`run-<id>.wandb`) is read with the
//! wandb package's own record definitions (`scripts/reference/_wandb_records.py`, run by the
//! setup virtualenv's python) and must hold what upstream's holds: the run's project and name,
//! the config, the step metric definitions, every history row, the summary and the exit record
//! (timing values excepted); `wandb sync --dry-run` must take the folder as a run to upload.
//! Numbers are compared as floats (wandb-core rewrites `2.0` as `2`).

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use tchtrain_callbacks::{
    JsonValue, ModelConfig, TrainerCallback, TrainerControl, TrainerState, WandbCallback,
    WandbSettings, dumps, loads,
};
use tchtrain_training_args::TrainingArguments;

use tchtrain_testing::WandbStandIn;

use crate::common::{repo, temp_dir, venv_python};

fn reference_dir() -> std::path::PathBuf {
    let assets =
        std::env::var_os("TCHTRAIN_ASSETS").expect("TCHTRAIN_ASSETS names the assets folder");
    Path::new(&assets).join("reference/wandb_callback")
}

fn reference() -> Value {
    let path = reference_dir().join("wandb_callback.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask setup`)", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn args_from(kwargs: &Value) -> TrainingArguments {
    TrainingArguments::from_dict(kwargs.as_object().unwrap().clone())
        .unwrap()
        .args
}

fn json_map(v: &Value) -> tchtrain_callbacks::JsonMap {
    match loads(&v.to_string()).unwrap() {
        JsonValue::Object(m) => m,
        other => panic!("not an object: {}", dumps(&other, None, false)),
    }
}

/// Equal JSON, numbers compared as floats.
fn same(a: &Value, b: &Value, at: &str) -> Result<(), String> {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => (x.as_f64() == y.as_f64())
            .then_some(())
            .ok_or(format!("{at}: {x} vs {y}")),
        (Value::Object(x), Value::Object(y)) => {
            let mut kx: Vec<_> = x.keys().collect();
            let mut ky: Vec<_> = y.keys().collect();
            kx.sort();
            ky.sort();
            if kx != ky {
                return Err(format!("{at}: keys {kx:?} vs {ky:?}"));
            }
            for k in kx {
                same(&x[k], &y[k], &format!("{at}.{k}"))?;
            }
            Ok(())
        }
        (Value::Array(x), Value::Array(y)) => {
            if x.len() != y.len() {
                return Err(format!("{at}: {} items vs {}", x.len(), y.len()));
            }
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                same(p, q, &format!("{at}[{i}]"))?;
            }
            Ok(())
        }
        _ => (a == b).then_some(()).ok_or(format!("{at}: {a} vs {b}")),
    }
}

/// Standard base64 decoded.
fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let (mut bits, mut n, mut out) = (0u32, 0, Vec::new());
    for c in text.bytes().take_while(|c| *c != b'=') {
        let v = ALPHABET.iter().position(|a| *a == c).unwrap() as u32;
        bits = (bits << 6) | v;
        n += 6;
        if n >= 8 {
            n -= 8;
            out.push((bits >> n) as u8);
        }
    }
    out
}

fn settings(env: &[(String, String)]) -> tchtrain_callbacks::Result<WandbSettings> {
    WandbSettings::from_lookup(|k| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
}

#[test]
fn wandb_callback_writes_what_upstream_writes() {
    let reference = reference();
    for case in reference["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let dir = temp_dir(&format!("wandb-{name}"));
        let mut env: Vec<(String, String)> = case["env"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
            .collect();
        let online = case["requests"].is_object();
        let stand_in = online.then(|| WandbStandIn::start(&dir).unwrap());
        match &stand_in {
            Some(s) => env.push(("WANDB_BASE_URL".into(), s.url.clone())),
            None => env.push(("WANDB_MODE".into(), "offline".into())),
        }
        env.push(("WANDB_DIR".into(), dir.display().to_string()));
        env.push((
            "WANDB_DATA_DIR".into(),
            dir.join("data").display().to_string(),
        ));
        env.push((
            "WANDB_CACHE_DIR".into(),
            dir.join("cache").display().to_string(),
        ));
        let mut callback = WandbCallback::with_settings(settings(&env).unwrap());
        let args = args_from(&case["args"]);
        let mut config = ModelConfig::from_json_value(&case["model_config"])
            .unwrap()
            .with_num_parameters(case["num_parameters"].as_i64().unwrap());
        // The `log_model_*` cases: upstream's files (its `print(model)`, the checkpoint, its
        // final save) from the reference's folder; `output_dir` (relative in the logged
        // config) points there when the callback reads checkpoints.
        let log_model = case["log_model"].as_object();
        let files = reference_dir().join(name);
        if log_model.is_some() {
            config = config.with_architecture(
                std::fs::read_to_string(files.join("architecture.txt")).unwrap(),
            );
        }
        let mut saving_args = args.clone();
        saving_args.output_dir = Some(files.display().to_string());
        callback.set_model_config(&config);
        let mut state = TrainerState::default();
        let mut control = TrainerControl::default();
        callback
            .on_train_begin(&args, &state, &mut control)
            .unwrap();
        for entry in case["logs"].as_array().unwrap() {
            state.global_step = entry[0].as_u64().unwrap() as _;
            let logs = json_map(&entry[1]);
            callback.on_log(&args, &state, &mut control, &logs).unwrap();
            if let Some(m) = log_model
                && m["save_at"] == entry[0]
                && logs.get("eval_loss").is_some()
            {
                state.epoch = m["epoch"].as_f64().unwrap();
                callback
                    .on_save(&saving_args, &state, &mut control)
                    .unwrap();
            }
        }
        if let Some(m) = log_model
            && let Some(best) = m.get("best_metric")
        {
            state.best_metric = best.as_f64();
            state.total_flos = m["total_flos"].as_f64().unwrap();
        }
        callback
            .on_predict(&args, &state, &mut control, &json_map(&case["predict"]))
            .unwrap();
        if log_model.is_some() {
            assert!(callback.saves_model_at_train_end(), "{name}");
            callback
                .on_model_saved(&saving_args, &state, &files.join("final_model"))
                .unwrap();
        }
        callback.on_train_end(&args, &state, &mut control).unwrap();
        let run_dir = callback.run_dir().unwrap().to_path_buf();
        drop(callback);
        // wandb's run folders: `run-<time>-<id>` online, `offline-run-...` offline.
        let folder = run_dir.file_name().unwrap().to_string_lossy().to_string();
        assert_eq!(
            folder.split('-').next(),
            Some(if online { "run" } else { "offline" }),
            "{folder}"
        );
        let file = std::fs::read_dir(&run_dir)
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "wandb"))
            .expect("a run-<id>.wandb file");
        let out = Command::new(venv_python())
            .arg(repo().join("scripts/reference/_wandb_records.py"))
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: wandb's reader failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ours: Value = serde_json::from_slice(&out.stdout).unwrap();
        if let Err(e) = same(&ours, &case["run"], name) {
            panic!("{name}: {e}");
        }
        // Online: what the server received, as upstream's run sent it (the same run, config
        // with the metric definitions, every history line once, summary, end of the stream,
        // uploaded files, the artifacts) but for `requirements.txt`, the Python environment's
        // package list.
        if let Some(stand_in) = &stand_in {
            // `output.log` is the Python process's console, which wandb captures (with
            // `WANDB_LOG_MODEL`, save_pretrained's progress bar): no console here.
            let mut wanted = case["requests"].clone();
            for python_only in ["requirements.txt", "output.log"] {
                wanted["files"].as_object_mut().unwrap().remove(python_only);
                wanted["end"]["uploaded"]
                    .as_array_mut()
                    .unwrap()
                    .retain(|f| f != python_only);
            }
            if let Err(e) = same(
                &stand_in.fold().unwrap(),
                &wanted,
                &format!("{name} (requests)"),
            ) {
                panic!("{e}");
            }
            // Uploaded artifacts leave no staged copies; the files that do not skip wandb's
            // cache (the checkpoint's) are in it under their MD5, as wandb-core keeps them.
            if log_model.is_some() {
                let staging = dir.join("data/artifacts/staging");
                let left: Vec<_> = std::fs::read_dir(&staging)
                    .map(|d| d.flatten().map(|e| e.path()).collect())
                    .unwrap_or_default();
                assert!(left.is_empty(), "{name}: staged copies left: {left:?}");
                let entries: Vec<(&String, &Value)> = wanted["artifacts"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .flat_map(|a| a["manifest"]["contents"].as_object().unwrap().iter())
                    .collect();
                for (path, entry) in &entries {
                    let md5 = entry["digest"].as_str().unwrap();
                    let hex: String = base64_decode(md5)
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect();
                    let cached = dir
                        .join("cache/artifacts/obj/md5")
                        .join(&hex[..2])
                        .join(&hex[2..]);
                    // Cached when some artifact holds the same bytes without skipping it.
                    let kept = entries
                        .iter()
                        .any(|(_, e)| e["digest"] == md5 && e["skip_cache"] == false);
                    assert_eq!(cached.is_file(), kept, "{name}: {path} in the cache");
                }
            }
        }
        // `wandb sync` takes the folder as a run to upload.
        let wandb = venv_python().parent().unwrap().join("wandb");
        let out = Command::new(&wandb)
            .args(["sync", "--dry-run", "--include-online"])
            .arg(&run_dir)
            .env("WANDB_MODE", "offline")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(text.contains("Would sync 1 run(s)"), "{name}: {text}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn wandb_settings_refuse_what_is_not_implemented() {
    let env = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    for (pairs, variable) in [
        // Online (the default) without an API key: wandb's refusal.
        (&[][..], "WANDB_API_KEY"),
        (&[("WANDB_MODE", "online")][..], "WANDB_API_KEY"),
        (&[("WANDB_MODE", "shared")][..], "WANDB_MODE"),
        (
            &[("WANDB_API_KEY", "k"), ("WANDB_BASE_URL", "localhost:8080")][..],
            "WANDB_BASE_URL",
        ),
        (
            &[("WANDB_MODE", "offline"), ("WANDB_WATCH", "all")][..],
            "WANDB_WATCH",
        ),
        (
            &[("WANDB_MODE", "offline"), ("WANDB_RESUME", "allow")][..],
            "WANDB_RESUME",
        ),
    ] {
        let err = settings(&env(pairs)).unwrap_err().to_string();
        assert!(err.starts_with(variable), "{pairs:?}: {err}");
    }
    // Upstream's `WandbLogModel` lookup is case-sensitive: `END` and `true` are unrecognised
    // values (a warning, no model logging), not a request for artifacts.
    for value in ["END", "true", "Checkpoint"] {
        assert!(
            settings(&env(&[
                ("WANDB_MODE", "offline"),
                ("WANDB_LOG_MODEL", value)
            ]))
            .is_ok(),
            "WANDB_LOG_MODEL={value}"
        );
    }
    // `WANDB_LOG_MODEL` with a model whose `print(model)` is not written out here (no
    // architecture text): refused when the run starts, naming the model type; a run name
    // W&B refuses as an artifact name: refused too.
    let dir = temp_dir("wandb-log-model-refused");
    for (run_name, architecture, wanted) in [
        (None, None, "WANDB_LOG_MODEL=\"end\""),
        (Some("a/b"), Some("M()"), "W&B artifact \"model-a/b\""),
    ] {
        let s = settings(&env(&[
            ("WANDB_MODE", "offline"),
            ("WANDB_LOG_MODEL", "end"),
            ("WANDB_DIR", &dir.display().to_string()),
            ("WANDB_DATA_DIR", &dir.join("data").display().to_string()),
        ]))
        .unwrap();
        let mut callback = WandbCallback::with_settings(s);
        let mut config =
            ModelConfig::from_json_value(&serde_json::json!({"model_type": "gemma"})).unwrap();
        if let Some(a) = architecture {
            config = config.with_architecture(a);
        }
        callback.set_model_config(&config);
        let args = TrainingArguments {
            run_name: run_name.map(str::to_string),
            ..TrainingArguments::default()
        };
        let err = callback
            .on_train_begin(
                &args,
                &TrainerState::default(),
                &mut TrainerControl::default(),
            )
            .unwrap_err()
            .to_string();
        assert!(err.starts_with(wanted), "{err}");
        if architecture.is_none() {
            assert!(err.contains("\"gemma\""), "{err}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);

    // Disabled: nothing is written.
    let dir = temp_dir("wandb-disabled");
    let s = settings(&env(&[
        ("WANDB_MODE", "disabled"),
        ("WANDB_DIR", &dir.display().to_string()),
    ]))
    .unwrap();
    let mut callback = WandbCallback::with_settings(s);
    let state = TrainerState::default();
    callback
        .on_train_begin(
            &TrainingArguments::default(),
            &state,
            &mut TrainerControl::default(),
        )
        .unwrap();
    assert!(callback.run_dir().is_none());
    assert!(!dir.join("wandb").exists());
}

#[test]
fn wandb_online_settings_read_the_key_and_survive_a_lost_server() {
    let dir = temp_dir("wandb-lost-server");
    // The API key from the netrc entry `wandb login` writes for the server's host.
    let netrc = dir.join("netrc");
    std::fs::write(
        &netrc,
        "machine other.host login user password wrong\nmachine 127.0.0.1\n  login user\n  password from-netrc\n",
    )
    .unwrap();
    let pairs = |extra: &[(&str, &str)]| -> Vec<(String, String)> {
        [("NETRC", netrc.display().to_string().as_str())]
            .iter()
            .chain(extra)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let s = settings(&pairs(&[("WANDB_BASE_URL", "http://127.0.0.1:9/")])).unwrap();
    let online = s.online.unwrap();
    assert_eq!(online.api_key, "from-netrc");
    assert_eq!(online.base_url, "http://127.0.0.1:9");
    assert_eq!(online.app_url(), "http://127.0.0.1:9");
    assert!(!format!("{online:?}").contains("from-netrc"));
    let s = settings(&pairs(&[("WANDB_API_KEY", "from-env")])).unwrap();
    let online = s.online.unwrap();
    assert_eq!(online.api_key, "from-env");
    assert_eq!(online.base_url, "https://api.forge.coreweave.com");
    assert_eq!(online.app_url(), "https://forge.coreweave.com/wandb");
    for (base, app) in [
        ("https://api.wandb.ai", "https://forge.coreweave.com/wandb"),
        ("https://api.example.com", "https://app.example.com"),
    ] {
        let s = settings(&pairs(&[("WANDB_API_KEY", "k"), ("WANDB_BASE_URL", base)])).unwrap();
        assert_eq!(s.online.unwrap().app_url(), app, "{base}");
    }

    // The server goes away during the run: training goes on, the run's folder keeps the
    // whole run (`wandb sync` uploads it) and the checkpoint's artifact, which could not be
    // sent, with its files staged (the architecture's, sent at the start, is not in it).
    let stand_in = WandbStandIn::start(&dir).unwrap();
    let s = settings(&[
        ("WANDB_API_KEY".into(), "k".into()),
        ("WANDB_BASE_URL".into(), stand_in.url.clone()),
        ("WANDB_DIR".into(), dir.display().to_string()),
        (
            "WANDB_DATA_DIR".into(),
            dir.join("data").display().to_string(),
        ),
        (
            "WANDB_CACHE_DIR".into(),
            dir.join("cache").display().to_string(),
        ),
        ("WANDB_LOG_MODEL".into(), "checkpoint".into()),
    ])
    .unwrap();
    let reference = reference();
    let case = reference["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "online_log_model")
        .unwrap();
    let files = reference_dir().join("online_log_model");
    let config = ModelConfig::from_json_value(&case["model_config"])
        .unwrap()
        .with_num_parameters(case["num_parameters"].as_i64().unwrap())
        .with_architecture(std::fs::read_to_string(files.join("architecture.txt")).unwrap());
    let mut callback = WandbCallback::with_settings(s);
    callback.set_model_config(&config);
    let args = TrainingArguments::default();
    let saving_args = TrainingArguments {
        output_dir: Some(files.display().to_string()),
        ..TrainingArguments::default()
    };
    let mut state = TrainerState::default();
    let mut control = TrainerControl::default();
    callback
        .on_train_begin(&args, &state, &mut control)
        .unwrap();
    let log = |loss: f64| json_map(&serde_json::json!({"loss": loss, "epoch": 0.5}));
    state.global_step = 5;
    callback
        .on_log(&args, &state, &mut control, &log(2.0))
        .unwrap();
    drop(stand_in);
    state.global_step = 10;
    callback
        .on_log(&args, &state, &mut control, &log(1.5))
        .unwrap();
    callback
        .on_save(&saving_args, &state, &mut control)
        .unwrap();
    let run_dir = callback.run_dir().unwrap().to_path_buf();
    drop(callback);
    let file = std::fs::read_dir(&run_dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "wandb"))
        .unwrap();
    let out = Command::new(venv_python())
        .arg(repo().join("scripts/reference/_wandb_records.py"))
        .arg(&file)
        .output()
        .unwrap();
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(run["history"].as_array().unwrap().len(), 2, "{run}");
    assert_eq!(run["exit"][0]["exit_code"], 0, "{run}");
    let artifacts = run["artifacts"].as_array().unwrap();
    assert_eq!(artifacts.len(), 1, "{run}");
    assert!(
        artifacts[0]["aliases"]
            .as_array()
            .unwrap()
            .contains(&Value::from("checkpoint_global_step_10")),
        "{run}"
    );
    for entry in artifacts[0]["manifest"]["contents"].as_array().unwrap() {
        assert_eq!(entry["staged"], true, "{entry}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

//! A Trainer run reported to trackio (`report_to trackio`, `TRACKIO_DIR`): trackio's own API
//! (`scripts/reference/_trackio_read.py`) finds the run under its `run_name` in the
//! `project`'s database, its config holding the model's config, the arguments and the
//! parameter count the Trainer counted, and one row per logged step whose `train/loss`,
//! `train/learning_rate` and `train/global_step` are the run's `log_history` entries.
//! (callbacks/tests/it/trackio.rs compares the callback with upstream's row by row.)

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use tchtrain_callbacks::{JsonValue, loads};
use tchtrain_testing::lock;
use tchtrain_trainer::{Trainer, num_parameters};
use tchtrain_training_args::{SaveStrategy, TrainingArguments};

use crate::common::{blocks, initial_model, temp_dir};

/// `f` with the variables set in the process environment (the tracker callbacks read theirs
/// when the Trainer is built), removed after; callers hold the test lock.
fn with_env<T>(vars: &[(&str, &OsStr)], f: impl FnOnce() -> T) -> T {
    for (k, v) in vars {
        #[allow(unsafe_code)]
        // SAFETY: under the test lock; no other thread of this binary reads them meanwhile.
        unsafe {
            std::env::set_var(k, v)
        };
    }
    let out = f();
    for (k, _) in vars {
        #[allow(unsafe_code)]
        // SAFETY: as above.
        unsafe {
            std::env::remove_var(k)
        };
    }
    out
}

fn get<'a>(v: &'a JsonValue, key: &str) -> Option<&'a JsonValue> {
    v.as_object().and_then(|m| m.get(key))
}

#[test]
fn a_run_reported_to_trackio_reads_back_with_trackio() -> Result<()> {
    let _g = lock();
    let dir = temp_dir("trackio-run");
    let store = dir.join("store");
    let mut args = TrainingArguments {
        per_device_train_batch_size: 2,
        max_steps: 4,
        logging_steps: 1.0,
        save_strategy: SaveStrategy::No,
        seed: 3,
        use_cpu: true,
        report_to: vec!["trackio".into()],
        run_name: Some("tiny-run".into()),
        project: "tchtrain-trainer".into(),
        disable_tqdm: true,
        ..TrainingArguments::new(dir.join("out").display().to_string())
    };
    args.post_init()?;
    // The callback reads TRACKIO_DIR when the Trainer is built.
    let (model, data) = (initial_model()?, blocks("train", 8)?);
    let mut trainer = with_env(&[("TRACKIO_DIR", store.as_os_str())], || {
        Trainer::builder(model, args).train_dataset(data).build()
    })?;
    let n_params = num_parameters(trainer.model(), false);
    trainer.train(None)?;
    let steps: Vec<_> = trainer
        .state
        .log_history
        .iter()
        .filter(|e| e.get("loss").is_some())
        .cloned()
        .collect();
    ensure!(steps.len() == 4, "{} logged steps", steps.len());
    drop(trainer);

    let python = std::env::var_os("TCHTRAIN_VENV_PYTHON")
        .context("TCHTRAIN_VENV_PYTHON names the setup virtualenv's python (with trackio)")?;
    let reader =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/reference/_trackio_read.py");
    let out = Command::new(python)
        .arg(reader)
        .arg("tchtrain-trainer")
        .env("TRACKIO_DIR", &store)
        .env("HF_HUB_OFFLINE", "1")
        .output()?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read = loads(&String::from_utf8_lossy(&out.stdout))?;
    let runs = get(&read, "runs")
        .and_then(JsonValue::as_array)
        .context("runs")?;
    ensure!(runs.len() == 1, "{} runs", runs.len());
    let run = &runs[0];
    ensure!(get(run, "name").and_then(JsonValue::as_str) == Some("tiny-run"));
    let config = get(run, "config").context("config")?;
    for (key, want) in [
        ("model/num_parameters", JsonValue::Int(n_params)),
        ("model_type", JsonValue::Str("gpt2".into())),
        ("max_steps", JsonValue::Int(4)),
        ("project", JsonValue::Str("tchtrain-trainer".into())),
        ("allow_val_change", JsonValue::Bool(true)),
    ] {
        ensure!(
            get(config, key) == Some(&want),
            "config {key}: {:?}",
            get(config, key)
        );
    }
    let logs = get(run, "logs")
        .and_then(JsonValue::as_array)
        .context("logs")?;
    // One row per step, then the end-of-training row (its scalars left out but the epoch).
    ensure!(logs.len() == 5, "{} rows", logs.len());
    for (i, (row, entry)) in logs.iter().zip(&steps).enumerate() {
        ensure!(get(row, "step") == Some(&JsonValue::Int(i as i64)));
        for (ours, theirs) in [
            ("train/loss", "loss"),
            ("train/learning_rate", "learning_rate"),
            ("train/grad_norm", "grad_norm"),
            ("train/global_step", "step"),
        ] {
            let a = get(row, ours).and_then(JsonValue::as_f64);
            let b = entry.get(theirs).and_then(|v| v.as_f64());
            ensure!(a.is_some() && a == b, "row {i} {ours}: {a:?} vs {b:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The files of `dir` (recursively), as paths relative to it.
fn files_under(dir: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(dir)?;
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// A Trainer run reported to W&B offline with `WANDB_LOG_MODEL=checkpoint`: wandb's own record
/// definitions (`scripts/reference/_wandb_records.py`) find the artifacts upstream's callback
/// logs, each file staged read-only with its MD5: the architecture (`print(model)`) at the
/// start, each checkpoint folder as the Trainer wrote it, and the final model as `save_model`
/// writes it (the files upstream's final artifact holds for a causal LM, with the arguments as
/// `training_args.json` where upstream pickles `training_args.bin`), and W&B's badge in the
/// model card. The records
/// themselves are compared with upstream's in callbacks/tests/it/wandb.rs.
#[test]
fn a_run_reported_to_wandb_logs_the_model_as_artifacts() -> Result<()> {
    use tchtrain_callbacks::{WandbCallback, WandbLogModel, WandbSettings};
    let _g = lock();
    let dir = temp_dir("wandb-artifacts");
    let out = dir.join("out");
    let mut args = TrainingArguments {
        per_device_train_batch_size: 2,
        max_steps: 4,
        logging_steps: 1.0,
        save_strategy: SaveStrategy::Steps,
        save_steps: 2.0,
        seed: 3,
        use_cpu: true,
        report_to: vec![],
        run_name: Some("tiny-run".into()),
        disable_tqdm: true,
        ..TrainingArguments::new(out.display().to_string())
    };
    args.post_init()?;
    let settings = WandbSettings {
        log_model: WandbLogModel::Checkpoint,
        data_dir: dir.join("data"),
        ..WandbSettings::offline(&dir)
    };
    let model = initial_model()?;
    let architecture = model
        .module_repr()
        .context("GPT-2's print(model)")?
        .to_string();
    let mut trainer = Trainer::builder(model, args)
        .train_dataset(blocks("train", 8)?)
        .callback(WandbCallback::with_settings(settings))
        .build()?;
    trainer.train(None)?;
    // Upstream's setup appends W&B's badge to the model card's comment when it logs the
    // model (the run's URL, `None` offline).
    trainer.create_model_card(Default::default())?;
    let card = std::fs::read_to_string(out.join("README.md"))?;
    ensure!(
        card.contains(concat!(
            "remove this comment. -->\n\n",
            "[<img src=\"https://raw.githubusercontent.com/wandb/assets/main/wandb-github-badge-28.svg\"",
            " alt=\"Visualize in Weights & Biases\" width=\"200\" height=\"32\"/>](None)\n# "
        )),
        "{card}"
    );
    drop(trainer);

    let run_file = std::fs::read_dir(dir.join("wandb"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten())
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "wandb"))
        .context("a run-<id>.wandb file")?;
    let python = std::env::var_os("TCHTRAIN_VENV_PYTHON")
        .context("TCHTRAIN_VENV_PYTHON names the setup virtualenv's python (with wandb)")?;
    let reader =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/reference/_wandb_records.py");
    let read = Command::new(python).arg(reader).arg(&run_file).output()?;
    ensure!(
        read.status.success(),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    let run: serde_json::Value = serde_json::from_slice(&read.stdout)?;
    let artifacts = run["artifacts"].as_array().context("artifacts")?;
    let paths = |a: &serde_json::Value| -> Vec<String> {
        a["manifest"]["contents"]
            .as_array()
            .map(|c| {
                c.iter()
                    .map(|e| e["path"].as_str().unwrap_or_default().to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    let aliases: Vec<serde_json::Value> = artifacts.iter().map(|a| a["aliases"].clone()).collect();
    ensure!(
        aliases
            == [
                serde_json::json!(["base_model", "latest"]),
                serde_json::json!(["checkpoint_global_step_2", "epoch_0.5", "latest"]),
                serde_json::json!(["checkpoint_global_step_4", "epoch_1.0", "latest"]),
                serde_json::json!(["final_model", "latest"]),
            ],
        "aliases {aliases:?}"
    );
    for a in artifacts {
        ensure!(a["name"] == "model-tiny-run" && a["type"] == "model", "{a}");
        ensure!(a["digest_checks"] == true, "{a}");
        for e in a["manifest"]["contents"].as_array().context("contents")? {
            ensure!(e["staged"] == true, "staged copy of {e}");
        }
    }
    ensure!(paths(&artifacts[0]) == ["model_architecture.txt"]);
    let staged_architecture = artifacts[0]["manifest"]["contents"][0]["size"].as_i64();
    ensure!(staged_architecture == Some(architecture.len() as i64 + 1));
    for (a, step) in [(&artifacts[1], 2), (&artifacts[2], 4)] {
        let on_disk = files_under(&out.join(format!("checkpoint-{step}")))?;
        ensure!(
            paths(a) == on_disk,
            "checkpoint-{step}: {:?} vs {on_disk:?}",
            paths(a)
        );
    }
    ensure!(
        paths(&artifacts[3])
            == [
                "config.json",
                "generation_config.json",
                "model.safetensors",
                "model_architecture.txt",
                // Upstream's holds its pickled `training_args.bin`; the Trainer writes the
                // arguments as JSON (see trainer/src/checkpoint.rs).
                "training_args.json",
            ],
        "final model: {:?}",
        paths(&artifacts[3])
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A Trainer run reported to W&B online, against the stand-in W&B server
/// (`scripts/reference/_wandb_server.py`, which wandb 0.31 itself runs against in
/// callbacks/tests/it/wandb.rs): the run created with the arguments, the model's config and
/// the parameter count the Trainer counted; one history line per log, each step's `train/loss`
/// and `train/learning_rate` the run's `log_history` entries; the summary with
/// `train_runtime`; the stream completed with exit code 0 and the run's files uploaded.
#[test]
fn a_run_reported_to_wandb_online_streams_every_log() -> Result<()> {
    use tchtrain_callbacks::{WandbCallback, WandbOnline, WandbSettings};
    let _g = lock();
    let dir = temp_dir("wandb-online");
    let stand_in = tchtrain_testing::WandbStandIn::start(&dir)?;
    let mut args = TrainingArguments {
        per_device_train_batch_size: 2,
        max_steps: 4,
        logging_steps: 1.0,
        seed: 3,
        use_cpu: true,
        report_to: vec![],
        run_name: Some("online-run".into()),
        disable_tqdm: true,
        ..TrainingArguments::new(dir.join("out").display().to_string())
    };
    args.post_init()?;
    let settings = WandbSettings {
        online: Some(WandbOnline {
            base_url: stand_in.url.clone(),
            api_key: "0123456789abcdef0123456789abcdef01234567".into(),
        }),
        ..WandbSettings::offline(&dir)
    };
    let model = initial_model()?;
    let mut trainer = Trainer::builder(model, args)
        .train_dataset(blocks("train", 8)?)
        .callback(WandbCallback::with_settings(settings))
        .build()?;
    trainer.train(None)?;
    let parameters = num_parameters(trainer.model(), false);
    let log_history = trainer.state.log_history.clone();
    drop(trainer);
    let run = stand_in.fold()?;
    ensure!(
        run["api_keys"] == serde_json::json!(["api:0123456789abcdef0123456789abcdef01234567"]),
        "{}",
        run["api_keys"]
    );
    ensure!(run["run"]["displayName"] == "online-run" && run["run"]["project"] == "huggingface");
    let config = &run["config"];
    ensure!(
        config["model/num_parameters"]["value"] == parameters,
        "{config}"
    );
    ensure!(config["model_type"]["value"] == "gpt2" && config["max_steps"]["value"] == 4);
    let history = run["history"].as_array().context("history")?;
    ensure!(history.len() == log_history.len(), "{history:?}");
    for (line, entry) in history.iter().zip(&log_history) {
        let entry: serde_json::Value = serde_json::from_str(&tchtrain_callbacks::dumps(
            &JsonValue::Object(entry.clone()),
            None,
            false,
        ))?;
        for key in ["loss", "learning_rate"] {
            if let Some(v) = entry.get(key) {
                ensure!(
                    line[format!("train/{key}")].as_f64() == v.as_f64(),
                    "{key}: {line} vs {entry}"
                );
            }
        }
        ensure!(
            line["train/global_step"] == entry["step"],
            "{line} vs {entry}"
        );
    }
    ensure!(
        run["summary"]["train_runtime"].is_number(),
        "{}",
        run["summary"]
    );
    ensure!(
        run["end"]["complete"] == true && run["end"]["exitcode"] == 0,
        "{}",
        run["end"]
    );
    ensure!(
        run["end"]["uploaded"]
            == serde_json::json!(["config.yaml", "wandb-metadata.json", "wandb-summary.json"]),
        "{}",
        run["end"]
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A real Trainer run reported to ClearML in offline mode (`report_to` clearml with
/// `CLEARML_OFFLINE_MODE=1`, `CLEARML_LOG_MODEL=FALSE`), its session imported by clearml's own
/// `Task.import_offline_session` into the stand-in ClearML server
/// (`scripts/reference/_clearml_server.py read`): the task completed with the run's arguments
/// and model config, each `log_history` entry's loss, learning rate and grad norm a `train`
/// scalar at its step, the run's summary as single values.
#[test]
fn a_run_reported_to_clearml_offline_imports_with_clearml() -> Result<()> {
    let _g = lock();
    let dir = temp_dir("clearml-run");
    let cache = dir.join("clearml-cache");
    let mut args = TrainingArguments {
        per_device_train_batch_size: 2,
        max_steps: 4,
        logging_steps: 1.0,
        seed: 3,
        use_cpu: true,
        report_to: vec!["clearml".into()],
        disable_tqdm: true,
        ..TrainingArguments::new(dir.join("out").display().to_string())
    };
    args.post_init()?;
    // The callback reads its settings when the Trainer is built.
    let vars = [
        ("CLEARML_OFFLINE_MODE", OsStr::new("1")),
        ("CLEARML_LOG_MODEL", OsStr::new("FALSE")),
        ("CLEARML_PROJECT", OsStr::new("tchtrain-trainer")),
        ("CLEARML_CACHE_DIR", cache.as_os_str()),
    ];
    let (model, data) = (initial_model()?, blocks("train", 8)?);
    let mut trainer = with_env(&vars, || {
        Trainer::builder(model, args).train_dataset(data).build()
    })?;
    trainer.train(None)?;
    let log_history = trainer.state.log_history.clone();
    drop(trainer);
    let zip = std::fs::read_dir(cache.join("offline"))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "zip"))
        .context("the session zip")?;
    let python = std::env::var_os("TCHTRAIN_VENV_PYTHON")
        .context("TCHTRAIN_VENV_PYTHON names the setup virtualenv's python (with clearml)")?;
    let reader =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/reference/_clearml_server.py");
    let out = Command::new(python)
        .arg(reader)
        .arg("read")
        .arg(&zip)
        .output()?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let imported = &read["imported"];
    ensure!(
        imported["project"] == "tchtrain-trainer",
        "{}",
        imported["project"]
    );
    let task = &imported["task"];
    ensure!(
        task["name"] == "Trainer" && task["status"] == "completed",
        "{task}"
    );
    let params = &task["hyperparams"]["Transformers"];
    ensure!(params["max_steps"]["value"] == "4" && params["max_steps"]["type"] == "int");
    ensure!(
        params["report_to"]["value"] == "[\"clearml\"]",
        "{}",
        params["report_to"]
    );
    let config = task["configuration"]["Model Configuration"]["value"]
        .as_str()
        .context("the model configuration")?;
    ensure!(config.contains("model_type = \"gpt2\""), "{config}");
    let scalars = imported["scalars"].as_array().context("scalars")?;
    let mut expected = Vec::new();
    for entry in &log_history {
        let step = entry
            .get("step")
            .and_then(JsonValue::as_i64)
            .context("step")?;
        for (key, v) in entry.iter() {
            let Some(v) = v.as_f64() else { continue };
            let (metric, variant, iter) = match key {
                "step" => continue,
                "epoch"
                | "train_runtime"
                | "train_samples_per_second"
                | "train_steps_per_second"
                | "train_loss"
                | "total_flos" => ("Summary", key, -2_147_483_648_i64),
                _ => ("train", key, step),
            };
            expected.push(serde_json::json!([metric, variant, iter, v]));
        }
    }
    ensure!(scalars == &expected, "{scalars:?}\nvs\n{expected:?}");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A Trainer run reported to codecarbon: `<output_dir>/emissions.csv` holds one row covering
/// the training (its duration the Trainer's `train_runtime`, give or take the callbacks around
/// it), and codecarbon's own tracker appends its row to the file (it backs up a file whose
/// header is not its own) and pandas reads both with the same machine and location.
/// (callbacks/tests/it/codecarbon.rs compares the row with upstream's column by column.)
#[test]
fn a_run_reported_to_codecarbon_appends_a_row_codecarbon_reads() -> Result<()> {
    let _g = lock();
    let dir = temp_dir("codecarbon-run");
    let out_dir = dir.join("out");
    let mut args = TrainingArguments {
        per_device_train_batch_size: 2,
        max_steps: 4,
        logging_steps: 2.0,
        save_strategy: SaveStrategy::No,
        seed: 3,
        use_cpu: true,
        report_to: vec!["codecarbon".into()],
        disable_tqdm: true,
        ..TrainingArguments::new(out_dir.display().to_string())
    };
    args.post_init()?;
    let (model, data) = (initial_model()?, blocks("train", 8)?);
    // The callback reads its settings when the Trainer is built; the tracker is made (and the
    // output folder created) then.
    let mut trainer = with_env(
        &[("CODECARBON_MEASURE_POWER_SECS", OsStr::new("0.2"))],
        || Trainer::builder(model, args).train_dataset(data).build(),
    )?;
    ensure!(
        out_dir.is_dir(),
        "the Trainer creates output_dir before on_init_end"
    );
    trainer.train(None)?;
    let runtime = trainer
        .state
        .log_history
        .last()
        .and_then(|e| e.get("train_runtime"))
        .and_then(|v| v.as_f64())
        .context("train_runtime")?;
    drop(trainer);
    let text = std::fs::read_to_string(out_dir.join("emissions.csv"))?;
    let lines: Vec<&str> = text.lines().collect();
    ensure!(lines.len() == 2, "{text}");
    ensure!(lines[0] == tchtrain_callbacks::EMISSIONS_CSV_COLUMNS.join(","));
    let python = std::env::var_os("TCHTRAIN_VENV_PYTHON")
        .context("TCHTRAIN_VENV_PYTHON names the setup virtualenv's python (with codecarbon)")?;
    let reader =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/reference/_codecarbon_read.py");
    let out = Command::new(python).arg(reader).arg(&out_dir).output()?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read = loads(&String::from_utf8_lossy(&out.stdout))?;
    let backups = get(&read, "backups")
        .and_then(JsonValue::as_array)
        .context("backups")?;
    ensure!(
        backups.is_empty(),
        "codecarbon backed our file up: {backups:?}"
    );
    let parsed = get(&read, "parsed")
        .and_then(JsonValue::as_array)
        .context("parsed")?;
    ensure!(parsed.len() == 2, "{} rows", parsed.len());
    let (ours, theirs) = (&parsed[0], &parsed[1]);
    for col in [
        "project_name",
        "experiment_id",
        "country_name",
        "country_iso_code",
        "region",
        "os",
        "cpu_count",
        "cpu_model",
        "gpu_count",
        "ram_total_size",
        "tracking_mode",
        "on_cloud",
        "pue",
    ] {
        ensure!(
            get(ours, col) == get(theirs, col),
            "{col}: {:?} vs {:?}",
            get(ours, col),
            get(theirs, col)
        );
    }
    let duration = get(ours, "duration")
        .and_then(JsonValue::as_f64)
        .context("duration")?;
    ensure!(
        // codecarbon's window is on_train_begin .. on_train_end, the runtime's the loop's:
        // apart by the callbacks around them (2 s of slack for a loaded machine).
        (duration - runtime).abs() < 2.0,
        "codecarbon's duration {duration} s for a train_runtime of {runtime} s"
    );
    let energy = get(ours, "energy_consumed")
        .and_then(JsonValue::as_f64)
        .context("energy")?;
    let emissions = get(ours, "emissions")
        .and_then(JsonValue::as_f64)
        .context("emissions")?;
    ensure!(
        energy > 0.0 && emissions > 0.0,
        "{energy} kWh, {emissions} kg"
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

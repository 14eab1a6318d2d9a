//! A Trainer run reported to trackio (`report_to trackio`, `TRACKIO_DIR`): trackio's own API
//! (`scripts/reference/_trackio_read.py`) finds the run under its `run_name` in the
//! `project`'s database, its config holding the model's config, the arguments and the
//! parameter count the Trainer counted, and one row per logged step whose `train/loss`,
//! `train/learning_rate` and `train/global_step` are the run's `log_history` entries.
//! (callbacks/tests/it/trackio.rs compares the callback with upstream's row by row.)

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use tchtrain_callbacks::{JsonValue, loads};
use tchtrain_testing::lock;
use tchtrain_trainer::{Trainer, num_parameters};
use tchtrain_training_args::{SaveStrategy, TrainingArguments};

use crate::common::{blocks, initial_model, temp_dir};

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
    let mut trainer = {
        #[allow(unsafe_code)]
        // SAFETY: under the test lock; no other thread of this binary reads it meanwhile.
        unsafe {
            std::env::set_var("TRACKIO_DIR", &store)
        };
        let built = Trainer::builder(initial_model()?, args)
            .train_dataset(blocks("train", 8)?)
            .build();
        #[allow(unsafe_code)]
        // SAFETY: as above.
        unsafe {
            std::env::remove_var("TRACKIO_DIR")
        };
        built?
    };
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

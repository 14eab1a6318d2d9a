//! Whisper trained by the Trainer against transformers 5.23's (`scripts/reference/whisper.py`):
//! the tiny `WhisperForConditionalGeneration` on rows of `input_features` `[8, 60]` and
//! `labels` (-100 at the tails) that the default collator stacks, 20 steps with dropout on
//! (hidden, attention, activation), logged every 5 and evaluated every 10 — every logged
//! number (loss, grad_norm, learning_rate, eval_loss, total_flos counted on
//! `input_features`, upstream's `main_input_name`, the embeddings left out) and the saved
//! model equal upstream's within [`BOUND`] / [`WEIGHT_BOUND`] (the encoder's sinusoidal positions trained too:
//! transformers 5.23's loading leaves them trainable). They were equal to the bit on the
//! Intel machine the test was written on; on AMD EPYC one of Whisper's kernels rounds
//! differently in the two runs (not located yet; measured: losses 1.4e-7, grad norms 3.5e-7,
//! train_loss 3.4e-8 relative), as GaLore's matmuls did before they got upstream's operand
//! layouts.

use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use tch::{Device, Tensor};
use tchtrain_collators::{Column, DefaultDataCollator, Feature, Label};
use tchtrain_data::{Dataset, InMemoryDataset};
use tchtrain_models::{AutoTask, LoadOptions, from_pretrained_dir};
use tchtrain_testing::{assets, compare_within, lock};
use tchtrain_trainer::Trainer;
use tchtrain_training_args::{IntervalStrategy, SaveStrategy, TrainingArguments};

fn dir() -> std::path::PathBuf {
    assets().join("reference/whisper")
}

/// Rows `lo..hi`: `input_features` `[8, 60]` and their `labels`.
fn rows(features: &Tensor, labels: &Tensor, lo: i64, hi: i64) -> Result<Arc<dyn Dataset>> {
    let mut out = Vec::new();
    for i in lo..hi {
        let f = features.get(i);
        out.push(
            Feature::default()
                .with_column(
                    "input_features",
                    Column::Floats {
                        shape: f.size(),
                        values: Vec::<f32>::try_from(f.reshape([-1]))?,
                    },
                )
                .with_labels(Label::Ids(Vec::<i64>::try_from(labels.get(i))?)),
        );
    }
    Ok(InMemoryDataset::new(out).into_shared())
}

/// The relative bound on every logged number (see the module docs).
const BOUND: f64 = 1e-6;
/// The bound on each saved weight, relative to its tensor's largest value: Adam divides the
/// gradients' last-bit differences by their own small second moments, so a near-zero bias
/// moves them up to its step size (measured: 3.9e-6).
const WEIGHT_BOUND: f64 = 1e-5;

#[test]
fn whisper_trains_as_upstream() -> Result<()> {
    let _g = lock();
    let path = dir().join("train.safetensors");
    let data: std::collections::HashMap<String, Tensor> = Tensor::read_safetensors(&path)
        .with_context(|| format!("{} (run `cargo xtask setup`)", path.display()))?
        .into_iter()
        .collect();
    let (features, labels) = (&data["input_features"], &data["labels"]);
    let model = from_pretrained_dir(
        &dir().join("model"),
        AutoTask::SpeechSeq2Seq,
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model;
    let out = crate::common::temp_dir("whisper-trainer");
    let args = TrainingArguments {
        per_device_train_batch_size: 4,
        per_device_eval_batch_size: 4,
        max_steps: 20,
        learning_rate: 1e-3,
        logging_steps: 5.0,
        eval_strategy: IntervalStrategy::Steps,
        eval_steps: Some(10.0),
        save_strategy: SaveStrategy::No,
        seed: 42,
        use_cpu: true,
        report_to: vec!["none".into()],
        disable_tqdm: true,
        ..TrainingArguments::new(out.display().to_string())
    };
    let mut trainer = Trainer::builder(model, args)
        .train_dataset(rows(features, labels, 0, 16)?)
        .eval_dataset(rows(features, labels, 16, 24)?)
        .data_collator(DefaultDataCollator)
        .build()?;
    trainer.train(None)?;
    let expected: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        dir().join("trainer/log_history.json"),
    )?)?;
    let m = compare_within("whisper", &trainer.state.log_history, &expected, BOUND)?;
    for (what, v) in [
        ("loss", m.loss),
        ("grad_norm", m.grad_norm),
        ("learning_rate", m.learning_rate),
        ("eval_loss", m.eval_loss),
    ] {
        ensure!(v <= BOUND, "whisper: {what} differs by {v:e} relative");
    }
    let total_flos = |v: Option<&serde_json::Value>| v.and_then(serde_json::Value::as_f64);
    let theirs = total_flos(
        expected
            .as_array()
            .and_then(|a| a.last())
            .and_then(|e| e.get("total_flos")),
    );
    let ours = trainer
        .state
        .log_history
        .last()
        .and_then(|e| e.get("total_flos"))
        .and_then(|v| v.as_f64());
    ensure!(ours == theirs, "total_flos {ours:?} vs {theirs:?}");
    let saved = trainer.save_model(Some(&out.join("model")))?;
    let read = |p: &std::path::Path| -> Result<std::collections::HashMap<String, Tensor>> {
        Ok(Tensor::read_safetensors(p)?.into_iter().collect())
    };
    let ours = read(&saved.join("model.safetensors"))?;
    let theirs = read(&dir().join("trainer/model/model.safetensors"))?;
    ensure!(
        ours.len() == theirs.len(),
        "{} tensors vs {}",
        ours.len(),
        theirs.len()
    );
    let mut worst = 0.0f64;
    for (n, t) in &theirs {
        let o = ours.get(n).with_context(|| format!("saved {n} missing"))?;
        let scale = t.abs().max().double_value(&[]).max(1e-12);
        let diff = (o - t).abs().max().double_value(&[]) / scale;
        ensure!(
            diff <= WEIGHT_BOUND,
            "saved {n} differs by {diff:e} of its largest value"
        );
        worst = worst.max(diff);
    }
    println!("whisper: saved weights within {worst:.2e} of upstream's");
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

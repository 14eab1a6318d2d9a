//! The image classifiers trained by the Trainer against transformers 5.23's
//! (`scripts/reference/vision.py`): the tiny ViT and SigLIP on their image processor's pixel
//! values (rows whose `pixel_values` column the default collator stacks), 20 steps with
//! dropout on, logged every 5 and evaluated every 10 — every logged number (loss, grad_norm,
//! learning_rate, eval_loss, total_flos counted on `pixel_values`, upstream's
//! `main_input_name`, SigLIP's position embedding left out of the count as an `nn.Embedding`)
//! and the saved model equal upstream's **to the bit** (SigLIP's unused pooling head, which
//! gets no gradient, left as it was, as upstream's AdamW leaves it).

use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use tch::{Device, Tensor};
use tchtrain_collators::{Column, DefaultDataCollator, Feature, Label};
use tchtrain_data::{Dataset, InMemoryDataset};
use tchtrain_models::{AutoTask, LoadOptions, from_pretrained_dir};
use tchtrain_testing::{assert_exact, assets, compare, lock};
use tchtrain_trainer::Trainer;
use tchtrain_training_args::{IntervalStrategy, SaveStrategy, TrainingArguments};

fn dir() -> std::path::PathBuf {
    assets().join("reference/vision")
}

/// Images `lo..hi` as rows: `pixel_values` `[3, 30, 30]` and the class `i % 3`.
fn rows(pixels: &Tensor, lo: i64, hi: i64) -> Result<Arc<dyn Dataset>> {
    let mut out = Vec::new();
    for i in lo..hi {
        let p = pixels.get(i);
        let values = Vec::<f32>::try_from(p.reshape([-1]))?;
        out.push(
            Feature::default()
                .with_column(
                    "pixel_values",
                    Column::Floats {
                        shape: p.size(),
                        values,
                    },
                )
                .with_labels(Label::Class(i % 3)),
        );
    }
    Ok(InMemoryDataset::new(out).into_shared())
}

#[test]
fn vit_trains_as_upstream() -> Result<()> {
    trains_as_upstream("vit")
}

#[test]
fn siglip_trains_as_upstream() -> Result<()> {
    trains_as_upstream("siglip")
}

fn trains_as_upstream(name: &str) -> Result<()> {
    let _g = lock();
    let dir = dir().join(name);
    let path = dir.join("processor/pixel_values.safetensors");
    let pixels: std::collections::HashMap<String, Tensor> = Tensor::read_safetensors(&path)
        .with_context(|| format!("{} (run `cargo xtask setup`)", path.display()))?
        .into_iter()
        .collect();
    let pixels = &pixels["pixel_values"];
    let model = from_pretrained_dir(
        &dir.join("model"),
        AutoTask::ImageClassification { num_labels: None },
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model;
    let out = crate::common::temp_dir(&format!("{name}-trainer"));
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
        .train_dataset(rows(pixels, 0, 16)?)
        .eval_dataset(rows(pixels, 16, 24)?)
        .data_collator(DefaultDataCollator)
        .build()?;
    trainer.train(None)?;
    let expected: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        dir.join("trainer/log_history.json"),
    )?)?;
    assert_exact(name, &compare(name, &trainer.state.log_history, &expected)?);
    let theirs = expected
        .as_array()
        .and_then(|a| a.last())
        .and_then(|e| e.get("total_flos"))
        .and_then(serde_json::Value::as_f64);
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
    let theirs = read(&dir.join("trainer/model/model.safetensors"))?;
    ensure!(
        ours.len() == theirs.len(),
        "{} tensors vs {}",
        ours.len(),
        theirs.len()
    );
    for (n, t) in &theirs {
        ensure!(
            ours.get(n).is_some_and(|o| o.equal(t)),
            "{name}: saved {n} differs"
        );
    }
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

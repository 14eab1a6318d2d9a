//! The Trainer against upstream's: the causal-LM job of scripts/reference/trainer_clm.py
//! (tiny GPT-2, dropout off, hamlet blocks, accumulation 2, cosine with warmup, weight
//! decay, clipping, evaluation every 10 steps) gives the same `log_history`, with the
//! sequential and the random sampler; plus checkpoints, rotation, resume and bad input.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use tch::Device;
use tchtrain_callbacks::{JsonMap, JsonValue};
use tchtrain_collators::{Feature, Label};
use tchtrain_models::{AutoTask, LoadOptions, PreTrainedModel, from_pretrained_dir};
use tchtrain_trainer::{Dataset, InMemoryDataset, Trainer};
use tchtrain_training_args::{IntervalStrategy, SaveStrategy, SchedulerType, TrainingArguments};

fn assets() -> PathBuf {
    std::env::var_os("TCHTRAIN_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets"))
}

fn reference_dir() -> PathBuf {
    assets().join("reference/trainer_clm")
}

fn reference(file: &str) -> Result<serde_json::Value> {
    let path = reference_dir().join(file);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(serde_json::from_str(&text)?)
}

/// libtorch's generator is process-global and the tests run on parallel threads.
static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tchtrain-trainer-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Rows as the reference feeds them: `input_ids` and `labels`, no attention mask.
fn blocks(part: &str) -> Result<Arc<dyn Dataset>> {
    let v = reference("blocks.json")?;
    let rows = v[part]
        .as_array()
        .context("blocks")?
        .iter()
        .map(|row| {
            let ids: Vec<i64> = row
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_i64().unwrap())
                .collect();
            Feature::new(ids.clone()).with_labels(Label::Ids(ids))
        })
        .collect();
    Ok(InMemoryDataset::new(rows).into_shared())
}

fn initial_model() -> Result<Box<dyn PreTrainedModel>> {
    Ok(from_pretrained_dir(
        &reference_dir().join("initial"),
        AutoTask::CausalLm,
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model)
}

/// The reference script's arguments.
fn reference_args(output_dir: &Path, sampling: &str) -> Result<TrainingArguments> {
    let mut args = TrainingArguments {
        per_device_train_batch_size: 4,
        per_device_eval_batch_size: 4,
        gradient_accumulation_steps: 2,
        num_train_epochs: 2.0,
        learning_rate: 1e-3,
        lr_scheduler_type: SchedulerType::Cosine,
        warmup_steps: 3.0,
        weight_decay: 0.01,
        max_grad_norm: 1.0,
        logging_steps: 1.0,
        eval_strategy: IntervalStrategy::Steps,
        eval_steps: Some(10.0),
        save_strategy: SaveStrategy::No,
        seed: 42,
        use_cpu: true,
        report_to: vec![],
        disable_tqdm: true,
        train_sampling_strategy: sampling.into(),
        ..TrainingArguments::new(output_dir.display().to_string())
    };
    args.post_init()?;
    Ok(args)
}

fn num(entry: &JsonMap, key: &str) -> Option<f64> {
    entry.get(key).and_then(JsonValue::as_f64)
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-12)
}

/// Runs the reference job and compares every logged value with upstream's.
fn parity(sampling: &str) -> Result<()> {
    let _g = lock();
    let out = temp_dir(&format!("parity-{sampling}"));
    let mut trainer = Trainer::builder(initial_model()?, reference_args(&out, sampling)?)
        .train_dataset(blocks("train")?)
        .eval_dataset(blocks("eval")?)
        .build()?;
    let result = trainer.train(None)?;
    let expected = reference(&format!("{sampling}/log_history.json"))?;
    let expected = expected.as_array().context("log_history")?;
    let ours = &trainer.state.log_history;
    assert_eq!(ours.len(), expected.len(), "number of log entries");
    let (mut max_loss, mut max_grad, mut max_lr, mut max_eval) = (0f64, 0f64, 0f64, 0f64);
    for (i, (o, e)) in ours.iter().zip(expected).enumerate() {
        let e_num = |k: &str| e.get(k).and_then(serde_json::Value::as_f64);
        assert_eq!(
            o.get("step").and_then(JsonValue::as_i64),
            e["step"].as_i64(),
            "entry {i}: step"
        );
        assert_eq!(num(o, "epoch"), e_num("epoch"), "entry {i}: epoch");
        if let Some(want) = e_num("loss") {
            let got = num(o, "loss").context("loss")?;
            max_loss = max_loss.max(rel(got, want));
            max_grad = max_grad.max(rel(
                num(o, "grad_norm").context("grad_norm")?,
                e_num("grad_norm").unwrap(),
            ));
            max_lr = max_lr.max(rel(
                num(o, "learning_rate").context("lr")?,
                e_num("learning_rate").unwrap(),
            ));
        }
        if let Some(want) = e_num("eval_loss") {
            max_eval = max_eval.max(rel(num(o, "eval_loss").context("eval_loss")?, want));
        }
        if let Some(want) = e_num("train_loss") {
            let got = num(o, "train_loss").context("train_loss")?;
            assert!(rel(got, want) < 1e-5, "train_loss {got} vs {want}");
            assert_eq!(num(o, "total_flos"), e_num("total_flos"), "total_flos");
        }
    }
    println!(
        "{sampling}: max relative difference loss {max_loss:.2e}, grad_norm {max_grad:.2e}, learning_rate {max_lr:.2e}, eval_loss {max_eval:.2e}"
    );
    let summary = reference(&format!("{sampling}/train_output.json"))?;
    assert_eq!(result.global_step, summary["global_step"].as_i64().unwrap());
    assert_eq!(
        tchtrain_trainer::num_parameters(trainer.model(), true),
        summary["num_parameters_exclude_embeddings"]
            .as_i64()
            .unwrap()
    );
    // fp32 on CPU, the same kernels in the same order: differences come only from summation
    // order inside libtorch reductions (a few ulps), amplified by 24 optimizer steps.
    assert!(max_loss < 1e-5, "loss {max_loss}");
    assert!(max_grad < 1e-4, "grad_norm {max_grad}");
    assert!(max_lr < 1e-12, "learning_rate {max_lr}");
    assert!(max_eval < 1e-5, "eval_loss {max_eval}");
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

#[test]
fn parity_with_upstream_sequential_sampler() -> Result<()> {
    parity("sequential")
}

#[test]
fn parity_with_upstream_random_sampler() -> Result<()> {
    parity("random")
}

//! Training orders and libtorch's global generator against upstream's Trainer
//! (scripts/reference/trainer_sampling.py): `train_sampling_strategy="group_by_length"`
//! (upstream's `LengthGroupedSampler`, drawing from the global generator) and a run with
//! dropout on. Both depend on the global generator being in upstream's state at every draw:
//! seeded when the Trainer is built, one base-seed draw per data-loader iteration (torch's
//! `DataLoader.__iter__`), the sampler's `randperm`, then the dropout masks of the steps in
//! upstream's op order.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tchtrain_testing::{assets, lock};

use anyhow::{Context, Result};
use tch::Device;
use tchtrain_callbacks::JsonValue;
use tchtrain_collators::{DataCollatorWithPadding, Feature, Label};
use tchtrain_data::{Dataset, InMemoryDataset, get_length_grouped_indices};
use tchtrain_models::{AutoTask, AutoTokenizer, LoadOptions, from_pretrained_dir};
use tchtrain_trainer::Trainer;
use tchtrain_training_args::{IntervalStrategy, SaveStrategy, SchedulerType, TrainingArguments};

fn reference() -> PathBuf {
    assets().join("reference/trainer_sampling")
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(serde_json::from_str(&text)?)
}

/// A dataset that records the indices the training loader reads.
struct Recording {
    rows: InMemoryDataset,
    order: Mutex<Vec<usize>>,
}

impl Dataset for Recording {
    fn len(&self) -> usize {
        self.rows.len()
    }

    fn get(&self, index: usize) -> tchtrain_data::Result<Feature> {
        self.order.lock().unwrap().push(index);
        self.rows.get(index)
    }
}

fn rows(part: &str) -> Result<InMemoryDataset> {
    let v = read_json(&reference().join("rows.json"))?;
    let ids = |r: &serde_json::Value, k: &str| -> Result<Vec<i64>> {
        Ok(serde_json::from_value(r[k].clone())?)
    };
    let rows = v[part]
        .as_array()
        .context("rows")?
        .iter()
        .map(|r| {
            let mut f = Feature::new(ids(r, "input_ids")?)
                .with_labels(Label::Class(r["labels"].as_i64().context("label")?));
            f.token_type_ids = Some(ids(r, "token_type_ids")?);
            f.attention_mask = Some(ids(r, "attention_mask")?);
            Ok(f)
        })
        .collect::<Result<_>>()?;
    Ok(InMemoryDataset::new(rows))
}

/// Trains as the reference script does; returns the log and the order the training loader
/// read the rows in.
fn train(run: &str, strategy: &str) -> Result<(Vec<tchtrain_callbacks::JsonMap>, Vec<usize>)> {
    let out = std::env::temp_dir().join(format!("tchtrain-sampling-{run}-{}", std::process::id()));
    let mut args = TrainingArguments {
        per_device_train_batch_size: 4,
        per_device_eval_batch_size: 4,
        gradient_accumulation_steps: 2,
        num_train_epochs: 2.0,
        learning_rate: 1e-3,
        lr_scheduler_type: SchedulerType::Linear,
        warmup_steps: 1.0,
        max_grad_norm: 1.0,
        logging_steps: 1.0,
        eval_strategy: IntervalStrategy::Epoch,
        save_strategy: SaveStrategy::No,
        seed: 42,
        use_cpu: true,
        report_to: vec![],
        disable_tqdm: true,
        train_sampling_strategy: strategy.into(),
        ..TrainingArguments::new(out.display().to_string())
    };
    args.post_init()?;
    let model = from_pretrained_dir(
        &reference().join("initial"),
        AutoTask::SequenceClassification { num_labels: None },
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model;
    let train = Arc::new(Recording {
        rows: rows("train")?,
        order: Mutex::new(Vec::new()),
    });
    let info = AutoTokenizer::from_pretrained(assets().join("minilm"))?
        .info()
        .clone();
    let mut trainer = Trainer::builder(model, args)
        .train_dataset(train.clone())
        .eval_dataset(rows("eval")?.into_shared())
        .data_collator(DataCollatorWithPadding::new(info))
        .build()?;
    train.order.lock().unwrap().clear();
    trainer.train(None)?;
    let _ = std::fs::remove_dir_all(&out);
    let order = train.order.lock().unwrap().clone();
    Ok((trainer.state.log_history.clone(), order))
}

/// Every logged value equal to upstream's (relative difference at most `tol`).
fn assert_logs_match(run: &str, ours: &[tchtrain_callbacks::JsonMap], tol: f64) -> Result<()> {
    let want = read_json(&reference().join(run).join("log_history.json"))?;
    let want = want.as_array().context("log_history")?;
    assert_eq!(ours.len(), want.len(), "{run}: log entries");
    let mut worst: f64 = 0.0;
    for (i, (o, w)) in ours.iter().zip(want).enumerate() {
        for key in ["loss", "grad_norm", "learning_rate", "eval_loss"] {
            let Some(wv) = w.get(key).and_then(serde_json::Value::as_f64) else {
                continue;
            };
            let ov = o
                .get(key)
                .and_then(JsonValue::as_f64)
                .with_context(|| format!("{run} entry {i}: {key}"))?;
            let rel = if ov == wv {
                0.0
            } else {
                (ov - wv).abs() / wv.abs().max(1e-12)
            };
            worst = worst.max(rel);
            assert!(rel <= tol, "{run} entry {i}: {key} {ov} vs upstream {wv}");
        }
    }
    println!("{run}: max relative difference {worst:.2e}");
    Ok(())
}

#[test]
fn length_grouped_indices_follow_upstream() {
    let _g = lock();
    // Upstream's get_length_grouped_indices([3, 9, 3, 4, 4, 12, 2, 4, 5], 2,
    // mega_batch_mult=2) with torch.randperm patched to return [2, 0, 1, 3, 4, 5, 6, 7, 8]:
    // megabatches of 4 sorted by decreasing length (ties keep their order), the longest row
    // swapped to the front.
    let lengths = [3, 9, 3, 4, 4, 12, 2, 4, 5];
    let perm = [2, 0, 1, 3, 4, 5, 6, 7, 8];
    assert_eq!(
        get_length_grouped_indices(&lengths, 2, Some(2), &perm),
        [5, 3, 2, 0, 1, 4, 7, 6, 8]
    );
    // (Upstream's argmax fails on an empty dataset; here the order is empty.)
    assert!(get_length_grouped_indices(&[], 4, None, &[]).is_empty());
}

#[test]
fn group_by_length_reads_rows_in_upstreams_order_and_matches_its_run() -> Result<()> {
    let _g = lock();
    let (log, order) = train("group_by_length", "group_by_length")?;
    let want: Vec<usize> =
        serde_json::from_value(read_json(&reference().join("group_by_length/order.json"))?)?;
    // Both sides also read every row up front (the sampler infers the lengths; upstream
    // probes row 0 and the end too): the two epochs are the last 80 reads.
    assert_eq!(order[order.len() - 80..], want[want.len() - 80..]);
    // The same libtorch, op order and threads as upstream: to the bit.
    assert_logs_match("group_by_length", &log, 0.0)
}

#[test]
fn dropout_on_matches_upstream() -> Result<()> {
    let _g = lock();
    let (log, _) = train("random_dropout", "random")?;
    // Dropout masks from the global generator in upstream's order: to the bit.
    assert_logs_match("random_dropout", &log, 0.0)
}

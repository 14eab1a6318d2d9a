//! `custom_loss`: the documentation's weighted-loss `compute_loss` as `TrainerHooks`, on
//! MiniLM sequence classification, against upstream's `CustomTrainer` on the same job
//! (scripts/reference/trainer_parity.py, `minilm_weighted`): every logged value equal.

use anyhow::{Context, Result};
use tch::Device;
use tchtrain_collators::{DataCollatorWithPadding, Feature, Label};
use tchtrain_data::InMemoryDataset;
use tchtrain_examples::custom_loss::WeightedLoss;
use tchtrain_models::{AutoTask, AutoTokenizer, LoadOptions, from_pretrained_dir};
use tchtrain_testing::{assets, lock, temp_dir};
use tchtrain_trainer::Trainer;
use tchtrain_training_args::{IntervalStrategy, SaveStrategy, SchedulerType, TrainingArguments};

use crate::examples_mlm_ner::{assert_exact, compare, read_json};

/// minilm_cls's rows: the reference's token ids, labels by their index in its sorted list.
fn rows(split: &str) -> Result<InMemoryDataset> {
    let dir = assets().join("reference/trainer_parity/minilm_cls");
    let ids = read_json(dir.join("ids.json"))?;
    let names: Vec<String> = serde_json::from_value(ids["labels"].clone())?;
    let ids: Vec<Vec<i64>> = serde_json::from_value(ids[split].clone())?;
    let lines = std::fs::read_to_string(dir.join(format!("{split}.jsonl")))?;
    let rows = ids
        .into_iter()
        .zip(lines.lines())
        .map(|(input_ids, line)| {
            let row: serde_json::Value = serde_json::from_str(line)?;
            let class = names
                .iter()
                .position(|n| Some(n.as_str()) == row["label"].as_str())
                .context("a label outside ids.json's list")?;
            Ok(Feature {
                attention_mask: Some(vec![1; input_ids.len()]),
                token_type_ids: Some(vec![0; input_ids.len()]),
                input_ids,
                labels: Some(Label::Class(class as i64)),
                ..Feature::default()
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(InMemoryDataset::new(rows))
}

#[test]
fn the_documented_weighted_loss_matches_upstreams_custom_trainer() -> Result<()> {
    let _g = lock();
    let reference = assets().join("reference/trainer_parity");
    let out = temp_dir("custom-loss");
    let out = out.path();
    let mut args = TrainingArguments {
        per_device_train_batch_size: 8,
        per_device_eval_batch_size: 8,
        gradient_accumulation_steps: 2,
        num_train_epochs: 3.0,
        learning_rate: 5e-5,
        lr_scheduler_type: SchedulerType::Linear,
        warmup_steps: 2.0,
        weight_decay: 0.01,
        eval_strategy: IntervalStrategy::Epoch,
        logging_steps: 1.0,
        save_strategy: SaveStrategy::No,
        seed: 42,
        use_cpu: true,
        report_to: vec![],
        disable_tqdm: true,
        ..TrainingArguments::new(out.display().to_string())
    };
    args.post_init()?;
    let model = from_pretrained_dir(
        &reference.join("minilm_cls/initial"),
        AutoTask::SequenceClassification { num_labels: None },
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model;
    let info = AutoTokenizer::from_pretrained(assets().join("minilm"))?
        .info()
        .clone();
    let mut trainer = Trainer::builder(model, args)
        .train_dataset(rows("train")?)
        .eval_dataset(rows("eval")?)
        .data_collator(DataCollatorWithPadding::new(info))
        .hooks(WeightedLoss::new(vec![1.0, 3.0]))
        .build()?;
    trainer.train(None)?;
    let m = compare(
        "weighted loss",
        &trainer.state.log_history,
        &read_json(reference.join("minilm_weighted/log_history.json"))?,
    )?;
    assert_exact("weighted loss", &m);

    // One weight per label, or a clear error before any step.
    let model = from_pretrained_dir(
        &reference.join("minilm_cls/initial"),
        AutoTask::SequenceClassification { num_labels: None },
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model;
    let info = AutoTokenizer::from_pretrained(assets().join("minilm"))?
        .info()
        .clone();
    let args = TrainingArguments {
        max_steps: 1,
        use_cpu: true,
        report_to: vec![],
        disable_tqdm: true,
        ..TrainingArguments::new(out.join("bad").display().to_string())
    };
    let err = Trainer::builder(model, args)
        .train_dataset(rows("train")?)
        .data_collator(DataCollatorWithPadding::new(info))
        .hooks(WeightedLoss::new(vec![1.0, 2.0, 3.0]))
        .build()?
        .train(None)
        .expect_err("3 weights for 2 labels");
    assert_eq!(
        err.to_string(),
        "invalid `class_weights`: 3 weights for a head of 2 labels: give one weight per label"
    );
    Ok(())
}

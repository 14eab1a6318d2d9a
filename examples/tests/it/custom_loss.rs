//! `custom_loss`: the documentation's weighted-loss `compute_loss` as `TrainerHooks`, on
//! MiniLM sequence classification, against upstream's `CustomTrainer` on the same job
//! (scripts/reference/trainer_parity.py, `minilm_weighted`): every logged value equal.

use anyhow::Result;
use tch::Device;
use tchtrain_data::InMemoryDataset;
use tchtrain_datasets::Table;
use tchtrain_examples::custom_loss::WeightedLoss;
use tchtrain_examples::{
    ClassificationLabels, TextClassificationOptions, tokenize_text_classification,
};
use tchtrain_models::{
    AutoTask, AutoTokenizer, LoadOptions, PreTrainedModel, PreTrainedTokenizerFast,
    from_pretrained_dir,
};
use tchtrain_testing::{assets, lock, temp_dir};
use tchtrain_trainer::Trainer;
use tchtrain_training_args::{IntervalStrategy, SaveStrategy, SchedulerType, TrainingArguments};

use tchtrain_testing::{assert_exact, compare};

use crate::examples_mlm_ner::read_json;

/// minilm_cls's rows tokenized as run_classification does (upstream's ids: checked by
/// `tokenize_text_classification_gives_upstreams_ids`).
fn rows(split: &str) -> Result<InMemoryDataset> {
    let dir = assets().join("reference/trainer_parity/minilm_cls");
    let tok = AutoTokenizer::from_pretrained(assets().join("minilm"))?;
    let labels = ClassificationLabels::from_table(&Table::read(dir.join("train.jsonl"))?, "label")?;
    let options = TextClassificationOptions {
        max_seq_length: 64,
        pad_to_max_length: false,
        ..TextClassificationOptions::default()
    };
    let table = Table::read(dir.join(format!("{split}.jsonl")))?;
    Ok(tokenize_text_classification(
        &table,
        tok.tokenizer(),
        &labels,
        &options,
    )?)
}

/// MiniLM under minilm_cls's fresh 2-label head, and its tokenizer.
fn model_and_tokenizer() -> Result<(Box<dyn PreTrainedModel>, PreTrainedTokenizerFast)> {
    let model = from_pretrained_dir(
        &assets().join("reference/trainer_parity/minilm_cls/initial"),
        AutoTask::SequenceClassification { num_labels: None },
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model;
    Ok((
        model,
        AutoTokenizer::from_pretrained(assets().join("minilm"))?,
    ))
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
    let (model, tok) = model_and_tokenizer()?;
    let mut trainer = Trainer::builder(model, args)
        .train_dataset(rows("train")?)
        .eval_dataset(rows("eval")?)
        .processing_class(tok)
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
    let (model, tok) = model_and_tokenizer()?;
    let args = TrainingArguments {
        max_steps: 1,
        use_cpu: true,
        report_to: vec![],
        disable_tqdm: true,
        ..TrainingArguments::new(out.join("bad").display().to_string())
    };
    let err = Trainer::builder(model, args)
        .train_dataset(rows("train")?)
        .processing_class(tok)
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

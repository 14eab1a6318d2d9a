//! `Seq2SeqTrainer` against upstream's (`scripts/reference/trainer_seq2seq.py`): a tiny
//! T5 v1.1-style model (dropout 0.1) trained 20 steps with gradient accumulation 2 (T5's
//! per-batch mean loss, not divided by the accumulation steps, as upstream), a linear
//! schedule, weight decay and clipping, padded by `DataCollatorForSeq2Seq` given the model,
//! and evaluated every 10 steps with `predict_with_generate` (`generation_max_length` 10,
//! `generation_num_beams` 2): every logged value (losses, gradient norms, learning rates,
//! evaluation loss, `gen_len` / `exact_match` computed on the generated ids) equals
//! upstream's to the bit. Then `predict` with `max_new_tokens=6, num_beams=1`: the generated
//! ids (padded to the model's generation `max_length` 20 with the pad id, then -100 across
//! batches) and the label ids equal upstream's, and so do the metrics.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use tch::{Device, Kind, Tensor};
use tchtrain_collators::{DataCollatorForSeq2Seq, Feature, Label};
use tchtrain_data::{Dataset, InMemoryDataset};
use tchtrain_models::{
    AutoTask, AutoTokenizer, GenerationConfig, LoadOptions, from_pretrained_dir,
};
use tchtrain_testing::{assert_exact, assets, compare, lock};
use tchtrain_trainer::{EvalPrediction, Metrics, Seq2SeqTrainer, Trainer};
use tchtrain_training_args::{IntervalStrategy, SchedulerType, Seq2SeqTrainingArguments};

fn read_json(path: &Path) -> Result<serde_json::Value> {
    Ok(serde_json::from_str(
        &std::fs::read_to_string(path)
            .with_context(|| format!("{}: run `cargo xtask setup`", path.display()))?,
    )?)
}

/// run_summarization's `gen_len` (mean count of non-pad predicted ids) and `exact_match`
/// (rows whose non-pad ids after the decoder start equal the non-pad labels), pad id 0.
fn gen_metrics(p: &EvalPrediction) -> tchtrain_trainer::Result<Metrics> {
    let preds = p.predictions.concatenated()?;
    let labels = p
        .label_ids
        .as_ref()
        .map(|l| l.concatenated())
        .transpose()?
        .expect("labels");
    let unpad = |t: &Tensor| t.masked_fill(&t.eq(-100), 0);
    let (preds, labels) = (unpad(&preds), unpad(&labels));
    let rows = preds.size()[0];
    let lens = preds
        .ne(0)
        .sum_dim_intlist(&[1i64][..], false, Kind::Double);
    let mut exact = 0.0;
    for r in 0..rows {
        let pr: Vec<i64> = Vec::<i64>::try_from(preds.get(r))
            .unwrap_or_default()
            .into_iter()
            .skip(1)
            .filter(|t| *t != 0)
            .collect();
        let lb: Vec<i64> = Vec::<i64>::try_from(labels.get(r))
            .unwrap_or_default()
            .into_iter()
            .filter(|t| *t != 0)
            .collect();
        exact += f64::from(u8::from(pr == lb));
    }
    Ok(Metrics::from([
        (
            "gen_len".to_string(),
            lens.mean(Kind::Double).double_value(&[]),
        ),
        ("exact_match".to_string(), exact / rows as f64),
    ]))
}

#[test]
fn t5_seq2seq_trainer_trains_evaluates_and_predicts_as_upstream() -> Result<()> {
    let _g = lock();
    let dir = assets().join("reference/trainer_seq2seq/t5");
    let out = std::env::temp_dir().join(format!("tchtrain-seq2seq-{}", std::process::id()));
    let rows = read_json(&dir.join("rows.json"))?;
    let split = |name: &str| -> Result<Arc<dyn Dataset>> {
        let features = rows[name]
            .as_array()
            .context("rows")?
            .iter()
            .map(|r| {
                let ids: Vec<i64> = serde_json::from_value(r["input_ids"].clone())?;
                let labels: Vec<i64> = serde_json::from_value(r["labels"].clone())?;
                Ok(Feature::new(ids).with_labels(Label::Ids(labels)))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Arc::new(InMemoryDataset::new(features)))
    };
    let tokenizer = AutoTokenizer::from_pretrained(dir.join("initial"))?;
    let model = from_pretrained_dir(
        &dir.join("initial"),
        AutoTask::Seq2SeqLm,
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model;
    let collator = DataCollatorForSeq2Seq {
        decoder_start: model.decoder_start()?,
        ..DataCollatorForSeq2Seq::new(tokenizer.info().clone())
    };
    let mut args = Seq2SeqTrainingArguments::new(out.to_string_lossy());
    args.base.logging_steps = 1.0;
    args.base.save_strategy = tchtrain_training_args::SaveStrategy::No;
    args.base.seed = 42;
    args.base.use_cpu = true;
    args.base.report_to = vec!["none".into()];
    args.base.disable_tqdm = true;
    args.base.per_device_train_batch_size = 4;
    args.base.per_device_eval_batch_size = 8;
    args.base.gradient_accumulation_steps = 2;
    args.base.max_steps = 20;
    args.base.learning_rate = 3e-3;
    args.base.lr_scheduler_type = SchedulerType::Linear;
    args.base.warmup_steps = 2.0;
    args.base.weight_decay = 0.01;
    args.base.max_grad_norm = 1.0;
    args.base.eval_strategy = IntervalStrategy::Steps;
    args.base.eval_steps = Some(10.0);
    args.base.post_init()?;
    args.predict_with_generate = true;
    args.generation_max_length = Some(10);
    args.generation_num_beams = Some(2);
    let builder = Trainer::builder(model, args.base.clone())
        .train_dataset(split("train")?)
        .eval_dataset(split("eval")?)
        .data_collator(collator)
        .processing_class(tokenizer)
        .compute_metrics(gen_metrics);
    let mut trainer = Seq2SeqTrainer::new(builder, &args)?;
    trainer.train(None)?;
    let m = compare(
        "t5 seq2seq",
        &trainer.state.log_history,
        &read_json(&dir.join("log_history.json"))?,
    )?;
    assert_exact("t5 seq2seq", &m);
    let gen_kwargs = GenerationConfig {
        max_new_tokens: Some(6),
        num_beams: Some(1),
        ..Default::default()
    };
    let pred = trainer.predict(split("eval")?, "test", Some(gen_kwargs))?;
    let reference: std::collections::HashMap<String, Tensor> =
        Tensor::read_safetensors(dir.join("predict.safetensors"))?
            .into_iter()
            .collect();
    let predictions = pred.predictions.context("predictions")?.concatenated()?;
    let labels = pred.label_ids.context("label ids")?.concatenated()?;
    assert!(
        predictions.equal(&reference["predictions"]),
        "generated ids {:?}, upstream {:?}",
        Vec::<Vec<i64>>::try_from(&predictions)?,
        Vec::<Vec<i64>>::try_from(&reference["predictions"])?
    );
    assert!(labels.equal(&reference["label_ids"]), "label ids differ");
    let metrics = read_json(&dir.join("predict_metrics.json"))?;
    for key in ["test_loss", "test_gen_len", "test_exact_match"] {
        assert_eq!(
            pred.metrics[key],
            metrics[key].as_f64().context(key)?,
            "{key}"
        );
    }
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

/// The run of the DeepSpeed scenario test: the tiny T5 (dropout off, so that the ranks and
/// the single process draw nothing), `--deepspeed` the documentation's ZeRO-2 example, 6
/// updates of micro-batches of `batch` rows with accumulation 2, evaluation every 3; every
/// row's labels cut to their first 5 tokens (each rank then averages as many tokens).
fn t5_zero2_run(
    output_dir: &Path,
    batch: usize,
    average_tokens_across_devices: bool,
) -> Result<Vec<(String, f64, i64)>> {
    let reference = assets().join("reference/trainer_seq2seq/t5");
    // The checkpoint with `dropout_rate` 0.
    let model_dir = output_dir.join("initial");
    std::fs::create_dir_all(&model_dir)?;
    for f in std::fs::read_dir(reference.join("initial"))? {
        let f = f?;
        std::fs::copy(f.path(), model_dir.join(f.file_name()))?;
    }
    let mut config = read_json(&model_dir.join("config.json"))?;
    config["dropout_rate"] = 0.0.into();
    std::fs::write(model_dir.join("config.json"), config.to_string())?;
    let rows = read_json(&reference.join("rows.json"))?;
    let split = |name: &str| -> Result<Arc<dyn Dataset>> {
        let features = rows[name]
            .as_array()
            .context("rows")?
            .iter()
            .map(|r| {
                let ids: Vec<i64> = serde_json::from_value(r["input_ids"].clone())?;
                let mut labels: Vec<i64> = serde_json::from_value(r["labels"].clone())?;
                labels.truncate(5);
                Ok(Feature::new(ids).with_labels(Label::Ids(labels)))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Arc::new(InMemoryDataset::new(features)))
    };
    let tokenizer = AutoTokenizer::from_pretrained(&model_dir)?;
    let model = from_pretrained_dir(
        &model_dir,
        AutoTask::Seq2SeqLm,
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model;
    let collator = DataCollatorForSeq2Seq {
        decoder_start: model.decoder_start()?,
        ..DataCollatorForSeq2Seq::new(tokenizer.info().clone())
    };
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../integrations/deepspeed/tests/fixtures/ds_config_zero2.json");
    let mut args = Seq2SeqTrainingArguments::new(output_dir.join("out").to_string_lossy());
    args.base.per_device_train_batch_size = batch;
    args.base.per_device_eval_batch_size = batch;
    args.base.gradient_accumulation_steps = 2;
    args.base.max_steps = 6;
    args.base.learning_rate = 1e-3;
    args.base.warmup_steps = 2.0;
    args.base.weight_decay = 0.01;
    args.base.max_grad_norm = 1.0;
    args.base.logging_steps = 1.0;
    args.base.eval_strategy = IntervalStrategy::Steps;
    args.base.eval_steps = Some(3.0);
    args.base.save_strategy = tchtrain_training_args::SaveStrategy::No;
    args.base.seed = 42;
    args.base.use_cpu = true;
    args.base.report_to = vec![];
    args.base.disable_tqdm = true;
    args.base.average_tokens_across_devices = average_tokens_across_devices;
    args.base.deepspeed = Some(tchtrain_training_args::DictOrPath::Path(
        fixture.display().to_string(),
    ));
    args.base.post_init()?;
    let builder = Trainer::builder(model, args.base.clone())
        .train_dataset(split("train")?)
        .eval_dataset(split("eval")?)
        .data_collator(collator);
    let mut trainer = Seq2SeqTrainer::new(builder, &args)?;
    trainer.train(None)?;
    assert_eq!(trainer.zero_stage(), Some(2), "a ZeRO-2 run");
    let mut out = Vec::new();
    for e in &trainer.state.log_history {
        let step = e.get("step").and_then(|v| v.as_i64()).unwrap_or(-1);
        for key in [
            "loss",
            "grad_norm",
            "learning_rate",
            "eval_loss",
            "train_loss",
        ] {
            if let Some(v) = e.get(key).and_then(|v| v.as_f64()) {
                out.push((key.to_string(), v, step));
            }
        }
    }
    Ok(out)
}

/// The largest relative difference per logged key between a 2-rank log (bits) and the
/// single process's, the ranks' values divided by `scale` first.
fn worst_by_key(
    ranks: &[(String, u64, i64)],
    single: &[(String, f64, i64)],
    scale: f64,
) -> std::collections::BTreeMap<String, f64> {
    assert_eq!(ranks.len(), single.len(), "logged values");
    let mut worst = std::collections::BTreeMap::<String, f64>::new();
    for ((k, b, s), (k1, v1, s1)) in ranks.iter().zip(single) {
        assert_eq!((k, s), (k1, s1), "log entry");
        let v = f64::from_bits(*b) / if k == "learning_rate" { 1.0 } else { scale };
        let d = (v - v1).abs() / v1.abs().max(1e-12);
        let w = worst.entry(k.clone()).or_default();
        *w = w.max(d);
    }
    worst
}

/// The DeepSpeed documentation's first Trainer example, here: T5 fine-tuned with its ZeRO-2
/// config file (`integrations/deepspeed/tests/fixtures/ds_config_zero2.json`: every
/// Trainer value `"auto"`, DeepSpeed's AdamW and WarmupLR, the optimizer offloaded to the
/// CPU) on 2 ranks of 2 rows against one process of 4 rows under the same file.
///
/// - With `average_tokens_across_devices=false` the two runs log the same losses, gradient
///   norms, learning rates and evaluation losses (fp32: the ranks sum partial batches, so
///   the last bits differ).
/// - With upstream's default (`true`), upstream multiplies the loss by the number of
///   processes for a model that takes loss kwargs, expecting it to be a sum over
///   `num_items_in_batch`; T5 takes them (its forward has `**kwargs`) but returns a mean,
///   so on 2 ranks its training and evaluation losses and gradient norms come out twice
///   the single process's (the clipped AdamW steps are the same). The Trainer here does
///   what upstream's does.
#[test]
fn t5_with_the_zero2_documentation_config_on_two_ranks_equals_one_process() -> Result<()> {
    use crate::common::{launch, rank, role, temp_dir, test_dir, wait_codes};
    const TEST: &str = "t5_with_the_zero2_documentation_config_on_two_ranks_equals_one_process";
    let _g = lock();
    if role().is_some() {
        let r = rank();
        for average in [false, true] {
            let log = t5_zero2_run(&test_dir().join(format!("rank{r}-{average}")), 2, average)?;
            std::fs::write(
                test_dir().join(format!("log-rank{r}-{average}.json")),
                serde_json::to_string(
                    &log.iter()
                        .map(|(k, v, s)| (k, v.to_bits(), s))
                        .collect::<Vec<_>>(),
                )?,
            )?;
        }
        return Ok(());
    }
    let dir = temp_dir("t5-zero2");
    let codes = wait_codes(
        launch(TEST, 2, &dir, "rank"),
        std::time::Duration::from_secs(600),
    );
    assert_eq!(codes, [Some(0), Some(0)], "rank exit codes");
    for (average, scale) in [(false, 1.0), (true, 2.0)] {
        let single = t5_zero2_run(&dir.join(format!("single-{average}")), 4, average)?;
        let ranks: Vec<(String, u64, i64)> = serde_json::from_str(&std::fs::read_to_string(
            dir.join(format!("log-rank0-{average}.json")),
        )?)?;
        let worst = worst_by_key(&ranks, &single, scale);
        println!(
            "T5 ZeRO-2 (average_tokens_across_devices {average}), 2 ranks x 2 rows / {scale} vs 1 process x 4 rows: max relative differences {worst:?}"
        );
        assert!(worst["loss"] < 1e-5, "{average}: {worst:?}");
        assert!(worst["eval_loss"] < 1e-5, "{average}: {worst:?}");
        assert!(worst["train_loss"] < 1e-5, "{average}: {worst:?}");
        assert!(worst["grad_norm"] < 1e-4, "{average}: {worst:?}");
        assert!(worst["learning_rate"] < 1e-12, "{average}: {worst:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

//! The Trainer against upstream's: the causal-LM job of scripts/reference/trainer_clm.py
//! (tiny GPT-2, dropout off, hamlet blocks, accumulation 2, cosine with warmup, weight
//! decay, clipping, evaluation every 10 steps) gives the same `log_history`, with the
//! sequential and the random sampler; plus checkpoints, rotation, resume and bad input.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use tchtrain_testing::{assets, lock};

use anyhow::{Context, Result};
use tch::Device;
use tchtrain_callbacks::{JsonMap, JsonValue};
use tchtrain_collators::{Feature, Label};
use tchtrain_data::{Dataset, InMemoryDataset};
use tchtrain_models::{AutoTask, LoadOptions, PreTrainedModel, from_pretrained_dir};
use tchtrain_trainer::Trainer;
use tchtrain_training_args::{IntervalStrategy, SaveStrategy, SchedulerType, TrainingArguments};

fn reference_dir() -> PathBuf {
    assets().join("reference/trainer_clm")
}

fn reference(file: &str) -> Result<serde_json::Value> {
    let path = reference_dir().join(file);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(serde_json::from_str(&text)?)
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

pub(crate) fn initial_model() -> Result<Box<dyn PreTrainedModel>> {
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
            assert_eq!(got, want, "train_loss");
            assert_eq!(num(o, "total_flos"), e_num("total_flos"), "total_flos");
        }
    }
    println!(
        "{sampling}: max relative difference loss {max_loss:.2e}, grad_norm {max_grad:.2e}, learning_rate {max_lr:.2e}, eval_loss {max_eval:.2e}"
    );
    let summary = reference(&format!("{sampling}/train_output.json"))?;
    assert_eq!(result.global_step, summary["global_step"].as_i64().unwrap());
    // Upstream's PrinterCallback (disable_tqdm) pops `total_flos` from the returned metrics.
    let mut keys: Vec<&str> = result.metrics.keys().map(String::as_str).collect();
    keys.sort_unstable();
    let want: Vec<&str> = summary["metrics_keys"]
        .as_array()
        .context("metrics_keys")?
        .iter()
        .filter_map(serde_json::Value::as_str)
        .collect();
    assert_eq!(keys, want, "the keys of the metrics train() returns");
    assert_eq!(
        tchtrain_trainer::num_parameters(trainer.model(), true),
        summary["num_parameters_exclude_embeddings"]
            .as_i64()
            .unwrap()
    );
    // fp32 on CPU with the very same libtorch, op order and thread count as upstream: every
    // logged value of the 24 steps to the bit.
    assert!(max_loss == 0.0, "loss {max_loss}");
    assert!(max_grad == 0.0, "grad_norm {max_grad}");
    assert!(max_lr == 0.0, "learning_rate {max_lr}");
    assert!(max_eval == 0.0, "eval_loss {max_eval}");
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

#[test]
fn parity_with_upstream_sequential_sampler() -> Result<()> {
    let _g = lock();
    parity("sequential")
}

#[test]
fn parity_with_upstream_random_sampler() -> Result<()> {
    let _g = lock();
    parity("random")
}

pub(crate) fn small_args(output_dir: &Path) -> Result<TrainingArguments> {
    let mut args = TrainingArguments {
        per_device_train_batch_size: 4,
        gradient_accumulation_steps: 2,
        max_steps: 10,
        learning_rate: 1e-3,
        warmup_steps: 2.0,
        logging_steps: 1.0,
        save_strategy: SaveStrategy::Steps,
        save_steps: 4.0,
        save_total_limit: Some(2),
        seed: 7,
        use_cpu: true,
        report_to: vec![],
        disable_tqdm: true,
        ..TrainingArguments::new(output_dir.display().to_string())
    };
    args.post_init()?;
    Ok(args)
}

pub(crate) fn small_train() -> Result<Arc<dyn Dataset>> {
    let all = blocks("train")?;
    Ok(InMemoryDataset::new((0..38).map(|i| all.get(i)).collect::<Result<_, _>>()?).into_shared())
}

pub(crate) fn losses(history: &[JsonMap]) -> Vec<(i64, f64)> {
    history
        .iter()
        .filter_map(|e| Some((e.get("step")?.as_i64()?, num(e, "loss")?)))
        .collect()
}

/// `fp16` on the CPU trains in fp32: accelerate turns on neither float16 autocast nor a loss
/// scaler there (`native_amp` is off), so upstream's logs with and without `--fp16
/// --use_cpu` are identical (checked with transformers 5.23.0 on tiny GPT-2). The same
/// numbers as without it, to the bit.
#[test]
fn fp16_on_the_cpu_trains_in_fp32_as_upstream() -> Result<()> {
    let _g = lock();
    let out = temp_dir("fp16-cpu");
    let mut runs = Vec::new();
    for fp16 in [false, true] {
        let mut args = small_args(&out)?;
        args.fp16 = fp16;
        args.save_strategy = SaveStrategy::No;
        args.max_steps = 3;
        let mut t = Trainer::builder(initial_model()?, args)
            .train_dataset(small_train()?)
            .build()?;
        t.train(None)?;
        let logged: Vec<(Option<f64>, Option<f64>)> = t
            .state
            .log_history
            .iter()
            .filter(|e| e.contains_key("loss"))
            .map(|e| (num(e, "loss"), num(e, "grad_norm")))
            .collect();
        runs.push(logged);
    }
    assert_eq!(runs[0].len(), 3, "3 logged steps");
    assert_eq!(runs[1], runs[0], "fp16 vs fp32 on the CPU");
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

/// fp16 with a loss scaler (`grad_scaler`, the GPU recipe on the CPU): the scaler's state
/// goes into each checkpoint as `scaler.json` and a resumed run continues with it, so the
/// resumed steps and the final scale equal the uninterrupted run's (with `--fsdp` the scaler
/// runs over the shards: `fsdp_half.rs`).
#[test]
fn fp16_loss_scaler_state_is_checkpointed_and_resumed() -> Result<()> {
    let _g = lock();
    let out = temp_dir("fp16-scaler");
    // trainer_fp16.py's tiny GPT-2 cut to 1024 tokens (float16 GEMMs are slow on a CPU), on
    // the first 32 of its train blocks (4 steps of 2 x 4 rows).
    let fp16 = assets().join("reference/trainer_fp16");
    let model = || crate::parity::load(&fp16.join("gpt2_initial"), AutoTask::CausalLm);
    let train = || -> Result<Arc<dyn Dataset>> {
        let all = crate::parity::lm_blocks(&fp16.join("gpt2_blocks.json"), "train")?;
        Ok(
            InMemoryDataset::new((0..32).map(|i| all.get(i)).collect::<Result<_, _>>()?)
                .into_shared(),
        )
    };
    let kwargs = tchtrain_optim::GradScalerKwargs {
        init_scale: 2f64.powi(20),
        growth_interval: 2,
        ..Default::default()
    };
    let args = |max_steps: i64| -> Result<TrainingArguments> {
        let mut a = small_args(&out)?;
        a.fp16 = true;
        a.max_steps = max_steps;
        a.save_steps = 2.0;
        a.save_total_limit = None;
        Ok(a)
    };
    let trained = |t: &Trainer| -> (Vec<(i64, f64)>, Option<f64>) {
        let scale = t.grad_scaler().map(|s| s.get_scale().unwrap());
        (losses(&t.state.log_history), scale)
    };
    let mut full = Trainer::builder(model()?, args(4)?)
        .train_dataset(train()?)
        .grad_scaler(kwargs)
        .build()?;
    full.train(None)?;
    let (full_losses, full_scale) = trained(&full);
    let ckpt = out.join("checkpoint-2");
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ckpt.join("scaler.json"))?)?;
    assert_eq!(saved["growth_interval"], 2, "{saved}");
    let mut resumed = Trainer::builder(model()?, args(4)?)
        .train_dataset(train()?)
        .grad_scaler(tchtrain_optim::GradScalerKwargs::default())
        .build()?;
    resumed.train(Some(tchtrain_trainer::ResumeFrom::Path(ckpt)))?;
    let (resumed_losses, resumed_scale) = trained(&resumed);
    // Steps 1-2 come back from the checkpoint's log history, 3-4 are trained again.
    assert_eq!(resumed_losses.len(), 4);
    assert_eq!(resumed_losses, full_losses, "steps 3-4 after resuming");
    assert_eq!(resumed_scale, full_scale, "the scale after resuming");
    assert!(
        full_scale.is_some_and(|s| s != 2f64.powi(20)),
        "the scale moved"
    );
    // DeepSpeed's fp16 brings its own scaler: explicit GradScalerKwargs are refused by name.
    let mut a = args(4)?;
    a.deepspeed = Some(tchtrain_training_args::DictOrPath::Dict(
        serde_json::json!({"zero_optimization": {"stage": 2}})
            .as_object()
            .cloned()
            .unwrap_or_default(),
    ));
    let mut t = Trainer::builder(model()?, a)
        .train_dataset(train()?)
        .grad_scaler(kwargs)
        .build()?;
    let err = t.train(None).unwrap_err().to_string();
    assert!(
        err.contains("grad_scaler") && err.contains("fp16 section"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

#[test]
fn checkpoints_rotate_and_resume_exactly() -> Result<()> {
    let _g = lock();
    // 38 rows, batches of 4: 10 batches, 5 update steps per epoch; 10 steps = 2 epochs of
    // the random sampler. Saves at 4, 8 and 10; save_total_limit 2 keeps 8 and 10.
    let out = temp_dir("resume");
    let mut full = Trainer::builder(initial_model()?, small_args(&out)?)
        .train_dataset(small_train()?)
        .build()?;
    full.train(None)?;
    let mut kept: Vec<String> = std::fs::read_dir(&out)?
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    kept.sort();
    assert_eq!(kept, ["checkpoint-10", "checkpoint-8"]);
    let ckpt = out.join("checkpoint-8");
    for file in [
        "model.safetensors",
        "config.json",
        "trainer_state.json",
        "training_args.json",
        "optimizer.safetensors",
        "optimizer.json",
        "scheduler.json",
        "rng_state.json",
    ] {
        assert!(ckpt.join(file).is_file(), "checkpoint-8 lacks {file}");
    }
    let state = tchtrain_callbacks::TrainerState::load_from_json(ckpt.join("trainer_state.json"))?;
    assert_eq!(state.global_step, 8);
    assert_eq!(state.log_history.len(), 8);

    // A fresh Trainer on the initial weights resumes from checkpoint-8 (mid-epoch 1).
    let out2 = temp_dir("resume-b");
    std::fs::create_dir_all(&out2)?;
    let mut resumed = Trainer::builder(initial_model()?, small_args(&out2)?)
        .train_dataset(small_train()?)
        .build()?;
    let result = resumed.train(Some(tchtrain_trainer::ResumeFrom::Path(ckpt)))?;
    assert_eq!(result.global_step, 10);
    // Dropout is off, so the resumed steps must equal the uninterrupted ones bit for bit.
    assert_eq!(
        losses(&resumed.state.log_history),
        losses(&full.state.log_history)
    );
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(&out2);
    Ok(())
}

#[test]
fn rotation_keeps_the_newest_and_the_best() -> Result<()> {
    let _g = lock();
    let dir = temp_dir("rotate");
    for step in [1, 2, 3, 4, 5, 10] {
        std::fs::create_dir_all(dir.join(format!("checkpoint-{step}")))?;
    }
    std::fs::create_dir_all(dir.join("tmp-checkpoint-11"))?;
    let best = dir.join("checkpoint-2").display().to_string();
    let sorted = tchtrain_trainer::sort_checkpoints(&dir, Some(&best))?;
    let names: Vec<_> = sorted
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "checkpoint-1",
            "checkpoint-3",
            "checkpoint-4",
            "checkpoint-5",
            "checkpoint-2",
            "checkpoint-10"
        ]
    );
    tchtrain_trainer::rotate_checkpoints(&dir, Some(2), Some(&best))?;
    let mut kept: Vec<_> = std::fs::read_dir(&dir)?
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    kept.sort();
    assert_eq!(kept, ["checkpoint-10", "checkpoint-2", "tmp-checkpoint-11"]);
    assert_eq!(
        tchtrain_trainer::get_last_checkpoint(&dir)?,
        Some(dir.join("checkpoint-10"))
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[test]
fn bad_input_is_reported_before_training() -> Result<()> {
    use tchtrain_trainer::{Error, ResumeFrom};
    let _g = lock();
    let out = temp_dir("bad");
    // An evaluation strategy without evaluation data.
    let mut args = small_args(&out)?;
    args.eval_strategy = IntervalStrategy::Steps;
    args.eval_steps = Some(2.0);
    let mut t = Trainer::builder(initial_model()?, args)
        .train_dataset(small_train()?)
        .build()?;
    assert!(matches!(
        t.train(None),
        Err(Error::MissingDataset {
            dataset: "eval",
            ..
        })
    ));
    // An empty training set; no training set.
    let mut t = Trainer::builder(initial_model()?, small_args(&out)?)
        .train_dataset(InMemoryDataset::default().into_shared())
        .build()?;
    assert!(matches!(
        t.train(None),
        Err(Error::EmptyDataset {
            what: "training",
            ..
        })
    ));
    let mut t = Trainer::builder(initial_model()?, small_args(&out)?).build()?;
    assert!(matches!(
        t.train(None),
        Err(Error::MissingDataset {
            dataset: "train",
            ..
        })
    ));
    // Resuming "last" where there is no checkpoint; from a checkpoint of another model.
    let mut t = Trainer::builder(initial_model()?, small_args(&out)?)
        .train_dataset(small_train()?)
        .build()?;
    assert!(matches!(
        t.train(Some(ResumeFrom::Last)),
        Err(Error::NoCheckpoint { .. })
    ));
    let err = t
        .train(Some(ResumeFrom::Path(assets().join("tiny-llama"))))
        .unwrap_err();
    assert!(matches!(err, Error::InvalidCheckpoint { .. }), "{err}");
    assert_eq!(t.state.global_step, 0, "nothing was trained");
    // Labels missing from the batch: the model returns no loss.
    let rows: Vec<Feature> = (0..4).map(|i| Feature::new(vec![i + 1; 8])).collect();
    let mut t = Trainer::builder(initial_model()?, small_args(&out)?)
        .train_dataset(InMemoryDataset::new(rows).into_shared())
        .build()?;
    assert!(matches!(t.train(None), Err(Error::MissingLoss { .. })));
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

#[test]
fn evaluate_prefixes_compute_metrics_and_preprocesses_logits() -> Result<()> {
    use tchtrain_trainer::{EvalPrediction, Metrics};
    let _g = lock();
    let out = temp_dir("eval");
    let mut args = small_args(&out)?;
    args.per_device_eval_batch_size = 4;
    let mut trainer = Trainer::builder(initial_model()?, args)
        .eval_dataset(blocks("eval")?)
        // Keep only the argmax of each position, as upstream's examples do.
        .preprocess_logits_for_metrics(|logits: &tch::Tensor, _: Option<&tch::Tensor>| {
            Ok(logits.f_argmax(-1, false)?)
        })
        .compute_metrics(Box::new(|p: &EvalPrediction| {
            let labels = p.label_ids.as_ref().expect("labels").array()?;
            let predictions = p.predictions.array()?;
            assert_eq!(predictions.size(), [14, 64]);
            let preds = predictions.narrow(1, 0, 63);
            let targets = labels.narrow(1, 1, 63);
            let acc = preds
                .eq_tensor(&targets)
                .to_kind(tch::Kind::Float)
                .mean(tch::Kind::Float);
            Ok(Metrics::from([(
                "accuracy".to_string(),
                acc.double_value(&[]),
            )]))
        }))
        .build()?;
    let metrics = trainer.evaluate(None, "eval")?;
    for key in ["eval_loss", "eval_accuracy", "eval_runtime", "epoch"] {
        assert!(metrics.contains_key(key), "{key} missing from {metrics:?}");
    }
    // An untrained 50257-way model: the loss is near ln(50257) = 10.8.
    assert!((metrics["eval_loss"] - 10.8).abs() < 0.2, "{metrics:?}");
    let logged = trainer.state.log_history.last().context("eval log")?;
    assert_eq!(num(logged, "eval_loss"), Some(metrics["eval_loss"]));

    // batch_eval_metrics: the same accuracy from per-batch calls (4, 4, 4, 2 rows), the
    // result returned by the call with compute_result, the logits never concatenated.
    let mut args = small_args(&out)?;
    args.per_device_eval_batch_size = 4;
    args.batch_eval_metrics = true;
    let seen = std::sync::Arc::new(std::sync::Mutex::new((Vec::new(), 0.0f64, 0i64)));
    let acc_state = seen.clone();
    let mut batched = Trainer::builder(initial_model()?, args)
        .eval_dataset(blocks("eval")?)
        .preprocess_logits_for_metrics(|logits: &tch::Tensor, _: Option<&tch::Tensor>| {
            Ok(logits.f_argmax(-1, false)?)
        })
        .compute_metrics(Box::new(move |p: &EvalPrediction| {
            let mut st = acc_state.lock().unwrap();
            let labels = p.label_ids.as_ref().expect("labels").array()?;
            let predictions = p.predictions.array()?;
            st.0.push((predictions.size()[0], p.compute_result));
            let hits = predictions
                .narrow(1, 0, 63)
                .eq_tensor(&labels.narrow(1, 1, 63))
                .sum(tch::Kind::Int64)
                .int64_value(&[]);
            st.1 += hits as f64;
            st.2 += labels.size()[0] * 63;
            if !p.compute_result {
                return Ok(Metrics::new());
            }
            Ok(Metrics::from([(
                "accuracy".to_string(),
                st.1 / st.2 as f64,
            )]))
        }))
        .build()?;
    let batched_metrics = batched.evaluate(None, "eval")?;
    assert_eq!(
        seen.lock().unwrap().0,
        [(4, false), (4, false), (4, false), (2, true)]
    );
    // (The unbatched accuracy is an f32 mean.)
    assert!((batched_metrics["eval_accuracy"] - metrics["eval_accuracy"]).abs() < 1e-6);
    assert_eq!(batched_metrics["eval_loss"], metrics["eval_loss"]);
    Ok(())
}

#[test]
fn class_ids_outside_num_labels_are_refused_before_training() -> Result<()> {
    let _g = lock();
    use tchtrain_trainer::Error;
    // Class ids outside the model's num_labels (2): refused before the first step.
    let minilm = assets().join("reference/trainer_parity/minilm_cls/initial");
    let out = temp_dir("bad-labels");
    for (bad, row) in [(2, 2), (-1, 1)] {
        let model = from_pretrained_dir(
            &minilm,
            AutoTask::SequenceClassification { num_labels: None },
            Device::Cpu,
            &LoadOptions::default(),
        )?
        .model;
        let classes = match bad {
            2 => [0, 1, 2, 1],
            _ => [0, -1, 1, 1],
        };
        let rows: Vec<Feature> = classes
            .iter()
            .map(|&c| Feature::new(vec![101, 2204, 102]).with_labels(Label::Class(c)))
            .collect();
        let mut t = Trainer::builder(model, small_args(&out)?)
            .train_dataset(InMemoryDataset::new(rows).into_shared())
            .build()?;
        let err = t.train(None).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidLabel { label, row: r, .. } if *label == bad.to_string() && *r == row),
            "{err}"
        );
        assert!(err.to_string().contains("outside the 2 labels"), "{err}");
        assert_eq!(t.state.global_step, 0);
    }
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

#[test]
fn predict_returns_predictions_labels_and_test_metrics() -> Result<()> {
    use tchtrain_trainer::{EvalPrediction, Metrics};
    let _g = lock();
    let out = temp_dir("predict");
    let mut args = small_args(&out)?;
    args.per_device_eval_batch_size = 4;
    let all = blocks("eval")?;
    let test =
        InMemoryDataset::new((0..6).map(|i| all.get(i)).collect::<Result<_, _>>()?).into_shared();
    let mut trainer = Trainer::builder(initial_model()?, args)
        .preprocess_logits_for_metrics(|logits: &tch::Tensor, _: Option<&tch::Tensor>| {
            Ok(logits.f_argmax(-1, false)?)
        })
        .compute_metrics(Box::new(|p: &EvalPrediction| {
            Ok(Metrics::from([(
                "rows".to_string(),
                p.predictions.array()?.size()[0] as f64,
            )]))
        }))
        .build()?;
    let history_before = trainer.state.log_history.len();
    let output = trainer.predict(Arc::clone(&test), "test")?;
    // 6 rows in batches of 4 (the last of 2): every row's argmax and labels, in order.
    let preds = output.predictions.context("predictions")?.concatenated()?;
    let labels = output.label_ids.context("label_ids")?.concatenated()?;
    assert_eq!(preds.size(), [6, 64]);
    assert_eq!(labels.size(), [6, 64]);
    assert_eq!(Vec::<i64>::try_from(labels.get(5))?, test.get(5)?.input_ids);
    for key in [
        "test_loss",
        "test_rows",
        "test_runtime",
        "test_samples_per_second",
        "test_steps_per_second",
    ] {
        assert!(
            output.metrics.contains_key(key),
            "{key} missing from {:?}",
            output.metrics
        );
    }
    assert_eq!(output.metrics["test_rows"], 6.0);
    assert!(!output.metrics.contains_key("epoch"));
    assert_eq!(
        trainer.state.log_history.len(),
        history_before,
        "predict logs nothing"
    );
    // The same loop as evaluate: the same loss.
    let metrics = trainer.evaluate(Some(test), "eval")?;
    assert_eq!(metrics["eval_loss"], output.metrics["test_loss"]);
    assert_eq!(metrics["eval_rows"], 6.0);
    Ok(())
}

/// Counts the optimizer steps it saw; its count is saved in checkpoints.
#[derive(Debug, Default)]
struct StepCounter {
    seen: i64,
}

impl tchtrain_callbacks::TrainerCallback for StepCounter {
    fn exportable_state(&self) -> Option<tchtrain_callbacks::CallbackState> {
        let mut attributes = JsonMap::new();
        attributes.insert("seen", self.seen);
        Some(tchtrain_callbacks::CallbackState {
            args: JsonMap::new(),
            attributes,
        })
    }

    fn load_state(
        &mut self,
        state: &tchtrain_callbacks::CallbackState,
    ) -> tchtrain_callbacks::Result<bool> {
        self.seen = state
            .attributes
            .get("seen")
            .and_then(JsonValue::as_i64)
            .unwrap_or(0);
        Ok(true)
    }

    fn on_step_end(
        &mut self,
        _: &TrainingArguments,
        _: &tchtrain_callbacks::TrainerState,
        _: &mut tchtrain_callbacks::TrainerControl,
    ) -> tchtrain_callbacks::Result<()> {
        self.seen += 1;
        Ok(())
    }
}

/// Upstream's `restore_callback_states_from_checkpoint` (default false): a resumed run's
/// callbacks start fresh unless it is set; then they continue from the checkpoint's states.
#[test]
fn callback_states_are_restored_only_when_asked() -> Result<()> {
    let _g = lock();
    let out = temp_dir("callback-states");
    let seen_after_resume = |restore: bool| -> Result<i64> {
        let mut args = small_args(&out.join(format!("resumed-{restore}")))?;
        args.restore_callback_states_from_checkpoint = restore;
        let mut trainer = Trainer::builder(initial_model()?, args)
            .train_dataset(small_train()?)
            .callback(StepCounter::default())
            .build()?;
        trainer.train(Some(tchtrain_trainer::ResumeFrom::Path(
            out.join("checkpoint-4"),
        )))?;
        let states = trainer.callback_handler.exportable_states(&trainer.control);
        let (_, state) = states
            .iter()
            .find(|(name, _)| name == "StepCounter")
            .context("the counter's state")?;
        state
            .as_object()
            .and_then(|m| m.get("attributes"))
            .and_then(JsonValue::as_object)
            .and_then(|a| a.get("seen"))
            .and_then(JsonValue::as_i64)
            .context("seen")
    };
    // The full run saves checkpoint-4 with the counter at 4 (and keeps it).
    let mut args = small_args(&out)?;
    args.save_total_limit = None;
    let mut trainer = Trainer::builder(initial_model()?, args)
        .train_dataset(small_train()?)
        .callback(StepCounter::default())
        .build()?;
    trainer.train(None)?;
    // Steps 5..=10 after the resume: 6 fresh, or 4 + 6 restored.
    assert_eq!(seen_after_resume(false)?, 6);
    assert_eq!(seen_after_resume(true)?, 10);
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

/// Arguments this build cannot honour are refused by name when the Trainer is built, not
/// accepted and ignored.
#[test]
fn unavailable_or_incomplete_arguments_are_refused_by_name() -> Result<()> {
    let _g = lock();
    let dir = temp_dir("refused");
    std::fs::create_dir_all(&dir)?;
    type Set = fn(&mut TrainingArguments);
    let cases: [(&str, Set); 3] = [
        ("torch_compile", |a| a.torch_compile = true),
        // post_init turns torch_compile on when a backend is named, as upstream.
        ("torch_compile", |a| {
            a.torch_compile_backend = Some("inductor".into());
        }),
        // Upstream's Trainer.__init__: "best" checkpoints need a metric.
        ("metric_for_best_model", |a| {
            a.save_strategy = SaveStrategy::Best;
            a.eval_strategy = IntervalStrategy::Steps;
            a.eval_steps = Some(2.0);
        }),
    ];
    for (field, set) in cases {
        let mut args = small_args(&dir)?;
        set(&mut args);
        args.post_init()?;
        let err = Trainer::builder(initial_model()?, args)
            .train_dataset(small_train()?)
            .build()
            .expect_err(field);
        assert!(
            err.to_string().starts_with(&format!("invalid `{field}`: ")),
            "{err}"
        );
    }
    Ok(())
}

/// `--activation_checkpointing` (upstream's `activation_checkpointing_enable` at `train`):
/// tiny GPT-2 with its dropout on trains to the same log, bit for bit, as without (the
/// recompute replays the dropout masks), and `gradient_checkpointing` is its alias.
#[test]
fn activation_checkpointing_trains_as_the_plain_run() -> Result<()> {
    let _g = lock();
    let dir = temp_dir("checkpointing");
    let run = |checkpointing: Option<&str>| -> Result<(Vec<(i64, f64)>, bool)> {
        let mut args = small_args(&dir)?;
        args.save_strategy = SaveStrategy::No;
        args.eval_strategy = IntervalStrategy::Steps;
        args.eval_steps = Some(5.0);
        match checkpointing {
            Some("activation") => {
                args.activation_checkpointing = true;
                args.activation_checkpointing_kwargs = serde_json::json!({"use_reentrant": false})
                    .as_object()
                    .cloned();
            }
            Some(_) => args.gradient_checkpointing = true,
            None => {}
        }
        args.post_init()?;
        // The asset's config: embedding, attention and residual dropout 0.1.
        let model = from_pretrained_dir(
            &assets().join("tiny-gpt2"),
            AutoTask::CausalLm,
            Device::Cpu,
            &LoadOptions::default(),
        )?
        .model;
        let mut trainer = Trainer::builder(model, args)
            .train_dataset(small_train()?)
            .eval_dataset(small_train()?)
            .build()?;
        trainer.train(None)?;
        let evals: Vec<(i64, f64)> = trainer
            .state
            .log_history
            .iter()
            .filter_map(|e| Some((e.get("step")?.as_i64()?, e.get("eval_loss")?.as_f64()?)))
            .collect();
        let mut all = losses(&trainer.state.log_history);
        all.extend(evals);
        Ok((all, trainer.model().is_activation_checkpointing()))
    };
    let (plain, off) = run(None)?;
    assert!(!off);
    assert_eq!(plain.len(), 12, "10 losses and 2 evaluations");
    for how in ["activation", "gradient"] {
        let (with, on) = run(Some(how))?;
        assert!(on, "{how}: the model checkpoints its layers");
        let bits = |l: &[(i64, f64)]| l.iter().map(|(s, x)| (*s, x.to_bits())).collect::<Vec<_>>();
        assert_eq!(bits(&with), bits(&plain), "{how} checkpointing");
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Rows for the out-of-memory test: the 90 training blocks twice over.
fn many_rows() -> Result<Arc<dyn Dataset>> {
    let all = blocks("train")?;
    let rows = (0..180)
        .map(|i| all.get(i % all.len()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(InMemoryDataset::new(rows).into_shared())
}

/// 3 steps of batch `batch` on [`many_rows`], with `auto_find_batch_size`.
fn auto_batch_args(dir: &Path, batch: usize) -> Result<TrainingArguments> {
    let mut args = small_args(dir)?;
    args.per_device_train_batch_size = batch;
    args.gradient_accumulation_steps = 1;
    args.max_steps = 3;
    args.save_strategy = SaveStrategy::No;
    args.auto_find_batch_size = true;
    args.post_init()?;
    Ok(args)
}

/// `auto_find_batch_size` (accelerate's `find_executable_batch_size`): in a child process
/// whose heap is capped (`prlimit --data`) 1.2 GB above what it holds, tiny GPT-2 with 64
/// rows per batch (~70 MB of logits and their gradients per row) runs out of memory; the
/// Trainer lowers the batch by 0.9 each time until it fits and trains. The run equals, to
/// the bit, a plain run started with the batch size it found, which is recorded in the state.
#[test]
fn auto_find_batch_size_lowers_the_batch_after_an_allocation_failure() -> Result<()> {
    let _g = lock();
    const TEST: &str = "auto_find_batch_size_lowers_the_batch_after_an_allocation_failure";
    if std::env::var_os(crate::common::ISOLATED).is_some() {
        let dir = crate::common::test_dir();
        let status = std::fs::read_to_string("/proc/self/status")?;
        let data_kb: u64 = status
            .lines()
            .find(|l| l.starts_with("VmData:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .context("VmData")?;
        let cap = data_kb * 1024 + 1200 * (1 << 20);
        let ok = std::process::Command::new("prlimit")
            .args([
                "--pid",
                &std::process::id().to_string(),
                &format!("--data={cap}"),
            ])
            .status()
            .context("prlimit (util-linux) caps this process's heap")?;
        anyhow::ensure!(ok.success(), "prlimit failed");
        let mut trainer = Trainer::builder(initial_model()?, auto_batch_args(&dir, 64)?)
            .train_dataset(many_rows()?)
            .build()?;
        trainer.train(None)?;
        let out = serde_json::json!({
            "train_batch_size": trainer.state.train_batch_size,
            "losses": losses(&trainer.state.log_history),
        });
        std::fs::write(dir.join("result.json"), out.to_string())?;
        return Ok(());
    }
    let dir = temp_dir("auto-batch");
    std::fs::create_dir_all(&dir)?;
    let child = std::process::Command::new(std::env::current_exe()?)
        .args([
            "--exact",
            &crate::common::test_path(TEST),
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(crate::common::ISOLATED, "1")
        .env(crate::common::DIR, &dir)
        .env(tchtrain_trainer::CPU_CACHE_LIMIT_ENV, "0")
        .output()?;
    let stderr = String::from_utf8_lossy(&child.stderr);
    assert!(child.status.success(), "the capped child failed:\n{stderr}");
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("result.json"))?)?;
    let found = result["train_batch_size"]
        .as_u64()
        .context("train_batch_size")? as usize;
    // 64, then int(x * 0.9) each time: 57, 51, 45, 40, 36, 32, 28, 25, 22, 19, 17, 15, ...
    let mut tried = vec![64usize];
    while *tried.last().unwrap_or(&0) > found {
        let next = (*tried.last().unwrap_or(&0) as f64 * 0.9) as usize;
        tried.push(next);
    }
    assert_eq!(
        tried.last(),
        Some(&found),
        "{found} is on accelerate's 0.9 ladder"
    );
    assert!(found < 64, "the cap forced at least one retry");
    assert!(
        stderr.contains("out of memory with 64 rows per batch"),
        "the retry is said:\n{stderr}"
    );
    // The same training as one started with that batch size (no cap).
    let plain_dir = temp_dir("auto-batch-plain");
    let mut args = auto_batch_args(&plain_dir, found)?;
    args.auto_find_batch_size = false;
    let mut plain = Trainer::builder(initial_model()?, args)
        .train_dataset(many_rows()?)
        .build()?;
    plain.train(None)?;
    let want: Vec<(i64, f64)> = serde_json::from_value(result["losses"].clone())?;
    assert_eq!(want.len(), 3);
    assert_eq!(losses(&plain.state.log_history), want);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&plain_dir);
    Ok(())
}

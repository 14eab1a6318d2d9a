//! Checkpoints end to end on tiny GPT-2 (dropout off): a run stopped at step k and resumed
//! from its checkpoint logs exactly the uninterrupted run's values (mid-epoch and at an
//! epoch boundary, with gradient accumulation over uneven windows and a cosine schedule
//! with warmup); rotation with `save_total_limit` keeps the best and the newest for
//! `greater_is_better` both ways; `load_best_model_at_end` reloads the best weights; and
//! bad checkpoints and labels are typed errors before the first step.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use tchtrain_testing::{assets, lock};

use crate::common::{block_ids, small_vocab_initial};

use anyhow::{Context, Result};
use tch::{Device, Tensor};
use tchtrain_callbacks::{JsonMap, JsonValue, TrainerCallback, TrainerControl, TrainerState};
use tchtrain_collators::{Feature, Label};
use tchtrain_data::{Dataset, InMemoryDataset};
use tchtrain_models::{
    AutoTask, LoadOptions, PreTrainedModel, TrainableModel, from_pretrained_dir,
};
use tchtrain_trainer::{
    Error, EvalPrediction, Metrics, RNG_GENERATOR_STATE_NAME, ResumeFrom, Trainer,
};
use tchtrain_training_args::{
    IntervalStrategy, OptimizerNames, SaveStrategy, SchedulerType, TrainingArguments,
};

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tchtrain-ckpt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// The first `n` hamlet blocks in the small vocabulary (`input_ids`, `labels`): these tests
/// compare our runs with our runs (common::small_vocab_initial).
fn blocks(part: &str, n: usize) -> Result<Arc<dyn Dataset>> {
    let rows = block_ids(part, n)?
        .into_iter()
        .map(|ids| Feature::new(ids.clone()).with_labels(Label::Ids(ids)))
        .collect();
    Ok(InMemoryDataset::new(rows).into_shared())
}

fn initial_model() -> Result<Box<dyn PreTrainedModel>> {
    model_from(&small_vocab_initial())
}

fn model_from(dir: &Path) -> Result<Box<dyn PreTrainedModel>> {
    Ok(from_pretrained_dir(
        dir,
        AutoTask::CausalLm,
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model)
}

/// The small-vocabulary tiny GPT-2 with every dropout at 0.1 (a copy in a temp folder).
fn dropout_model_dir(name: &str) -> Result<PathBuf> {
    let dir = temp_dir(&format!("{name}-initial"));
    std::fs::create_dir_all(&dir)?;
    let initial = small_vocab_initial();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(initial.join("config.json"))?)?;
    for key in ["attn_pdrop", "embd_pdrop", "resid_pdrop"] {
        config[key] = serde_json::json!(0.1);
    }
    std::fs::write(dir.join("config.json"), serde_json::to_string(&config)?)?;
    std::fs::copy(
        initial.join("model.safetensors"),
        dir.join("model.safetensors"),
    )?;
    Ok(dir)
}

/// 38 rows in batches of 4: 10 batches; accumulation 3 makes windows of 3, 3, 3 and 1
/// batches (4 update steps per epoch); 3 epochs = 12 steps; cosine with 2 warmup steps;
/// a checkpoint every `save_steps`.
fn resume_args(output_dir: &Path, save_steps: f64) -> Result<TrainingArguments> {
    let mut args = TrainingArguments {
        per_device_train_batch_size: 4,
        gradient_accumulation_steps: 3,
        num_train_epochs: 3.0,
        learning_rate: 1e-3,
        lr_scheduler_type: SchedulerType::Cosine,
        warmup_steps: 2.0,
        weight_decay: 0.01,
        logging_steps: 1.0,
        save_strategy: SaveStrategy::Steps,
        save_steps,
        seed: 11,
        use_cpu: true,
        report_to: vec![],
        disable_tqdm: true,
        ..TrainingArguments::new(output_dir.display().to_string())
    };
    args.post_init()?;
    Ok(args)
}

/// Stops the training after step `k` (as a crash or a kill would, once checkpoint-k is
/// written: the save happens in the same step's `_maybe_log_save_evaluate`).
struct StopAt(i64);

impl TrainerCallback for StopAt {
    fn on_step_end(
        &mut self,
        _: &TrainingArguments,
        state: &TrainerState,
        control: &mut TrainerControl,
    ) -> tchtrain_callbacks::Result<()> {
        if state.global_step == self.0 {
            control.should_training_stop = true;
        }
        Ok(())
    }
}

/// `(step, loss, grad_norm, learning_rate)` of every training log entry.
fn step_logs(history: &[JsonMap]) -> Vec<(i64, f64, f64, f64)> {
    let num = |e: &JsonMap, k: &str| e.get(k).and_then(JsonValue::as_f64);
    history
        .iter()
        .filter_map(|e| {
            Some((
                e.get("step")?.as_i64()?,
                num(e, "loss")?,
                num(e, "grad_norm")?,
                num(e, "learning_rate")?,
            ))
        })
        .collect()
}

/// Trains uninterrupted, then stops a second run at step `k` and resumes it in a fresh
/// Trainer (on the initial weights) from the last checkpoint: the logged values after the
/// resume equal the uninterrupted ones bit for bit.
fn stop_and_resume(name: &str, k: i64) -> Result<()> {
    stop_and_resume_with(name, k, &small_vocab_initial())
}

fn stop_and_resume_with(name: &str, k: i64, model_dir: &Path) -> Result<()> {
    let initial_model = || model_from(model_dir);
    let full_dir = temp_dir(&format!("{name}-full"));
    let mut full = Trainer::builder(initial_model()?, resume_args(&full_dir, k as f64)?)
        .train_dataset(blocks("train", 38)?)
        .build()?;
    full.train(None)?;
    let expected = step_logs(&full.state.log_history);
    assert_eq!(expected.len(), 12);

    let dir = temp_dir(name);
    let mut stopped = Trainer::builder(initial_model()?, resume_args(&dir, k as f64)?)
        .train_dataset(blocks("train", 38)?)
        .callback(StopAt(k))
        .build()?;
    stopped.train(None)?;
    assert_eq!(stopped.state.global_step, k);
    assert_eq!(
        tchtrain_trainer::get_last_checkpoint(&dir)?,
        Some(dir.join(format!("checkpoint-{k}")))
    );

    let mut resumed = Trainer::builder(initial_model()?, resume_args(&dir, k as f64)?)
        .train_dataset(blocks("train", 38)?)
        .build()?;
    let out = resumed.train(Some(ResumeFrom::Last))?;
    assert_eq!(out.global_step, 12);
    let got = step_logs(&resumed.state.log_history);
    // The data order is a function of the seed and the epoch, and the checkpoint restores
    // libtorch's generator (dropout masks): exact.
    assert_eq!(got, expected, "{name}: resumed log differs");
    assert!(
        dir.join(format!("checkpoint-{k}/{RNG_GENERATOR_STATE_NAME}"))
            .is_file()
    );
    let _ = std::fs::remove_dir_all(&full_dir);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[test]
fn resume_mid_epoch_with_uneven_accumulation_and_cosine_warmup() -> Result<()> {
    let _g = lock();
    // Step 6: the second update step of epoch 1 (6 batches of that epoch to skip).
    stop_and_resume("mid-epoch", 6)
}

#[test]
fn resume_at_an_epoch_boundary() -> Result<()> {
    let _g = lock();
    // Step 4: the end of epoch 0 (after its one-batch last window); epoch 1 starts afresh.
    stop_and_resume("epoch-boundary", 4)
}

#[test]
fn resume_with_dropout_restores_the_generator_mid_epoch() -> Result<()> {
    let _g = lock();
    let dir = dropout_model_dir("dropout-mid-epoch")?;
    stop_and_resume_with("dropout-mid-epoch", 6, &dir)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[test]
fn resume_with_dropout_restores_the_generator_at_an_epoch_boundary() -> Result<()> {
    let _g = lock();
    let dir = dropout_model_dir("dropout-epoch-boundary")?;
    stop_and_resume_with("dropout-epoch-boundary", 4, &dir)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// [`resume_args`] with `schedule_free_adamw` and an evaluation at every checkpoint (after
/// it, as upstream's `_maybe_log_save_evaluate` evaluates before it saves).
fn schedule_free_args(output_dir: &Path, k: i64) -> Result<TrainingArguments> {
    let mut args = TrainingArguments {
        optim: OptimizerNames::ScheduleFreeAdamw,
        per_device_train_batch_size: 4,
        per_device_eval_batch_size: 2,
        gradient_accumulation_steps: 3,
        num_train_epochs: 3.0,
        learning_rate: 1e-3,
        lr_scheduler_type: SchedulerType::Cosine,
        warmup_steps: 2.0,
        weight_decay: 0.01,
        logging_steps: 1.0,
        eval_strategy: IntervalStrategy::Steps,
        eval_steps: Some(k as f64),
        save_strategy: SaveStrategy::Steps,
        save_steps: k as f64,
        seed: 11,
        use_cpu: true,
        report_to: vec![],
        disable_tqdm: true,
        ..TrainingArguments::new(output_dir.display().to_string())
    };
    args.post_init()?;
    Ok(args)
}

/// `(step, eval_loss)` of every evaluation log entry.
fn eval_logs(history: &[JsonMap]) -> Vec<(i64, f64)> {
    history
        .iter()
        .filter_map(|e| Some((e.get("step")?.as_i64()?, e.get("eval_loss")?.as_f64()?)))
        .collect()
}

/// `schedule_free_adamw`: the Trainer puts the optimizer in train mode for every training
/// step and in eval mode for every evaluation, so the checkpoint at step 6, written after
/// that step's evaluation, holds the average `x` and an optimizer in eval mode. A fresh
/// Trainer resumed from it moves the parameters back with `train()` at its first step: its
/// training and evaluation logs and its final weights equal the uninterrupted run's exactly.
#[test]
fn resume_schedule_free_adamw_from_a_checkpoint_taken_in_eval_mode() -> Result<()> {
    let _g = lock();
    let k = 6;
    let build = |dir: &Path| -> Result<tchtrain_trainer::TrainerBuilder> {
        Ok(
            Trainer::builder(initial_model()?, schedule_free_args(dir, k)?)
                .train_dataset(blocks("train", 38)?)
                .eval_dataset(blocks("eval", 2)?),
        )
    };
    let full_dir = temp_dir("schedule-free-full");
    let mut full = build(&full_dir)?.build()?;
    full.train(None)?;
    let expected = step_logs(&full.state.log_history);
    let expected_eval = eval_logs(&full.state.log_history);
    assert_eq!(expected.len(), 12);
    assert_eq!(
        expected_eval.iter().map(|e| e.0).collect::<Vec<_>>(),
        [6, 12]
    );
    assert_eq!(
        full.optimizer().map(|o| o.name()),
        Some("schedule_free_adamw")
    );

    let dir = temp_dir("schedule-free");
    let mut stopped = build(&dir)?.callback(StopAt(k)).build()?;
    stopped.train(None)?;
    let ckpt = dir.join(format!("checkpoint-{k}"));
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ckpt.join("optimizer.json"))?)?;
    let modes: Vec<_> = saved["defaults"]["group_state"]
        .as_array()
        .context("group_state")?
        .iter()
        .map(|g| (g["k"].as_u64(), g["train_mode"].as_bool()))
        .collect();
    assert_eq!(modes, [(Some(6), Some(false)); 2], "{saved}");

    let mut resumed = build(&dir)?.build()?;
    let out = resumed.train(Some(ResumeFrom::Last))?;
    assert_eq!(out.global_step, 12);
    assert_eq!(step_logs(&resumed.state.log_history), expected);
    assert_eq!(eval_logs(&resumed.state.log_history), expected_eval);
    assert_weights_equal(resumed.model(), &full_dir.join("checkpoint-12"))?;
    let _ = std::fs::remove_dir_all(&full_dir);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A metric scripted by evaluation index, to put the best checkpoint where a test wants it.
fn scripted_score(values: Vec<f64>) -> tchtrain_trainer::ComputeMetrics {
    let mut i = 0;
    Box::new(move |_: &EvalPrediction| {
        let v = values[i.min(values.len() - 1)];
        i += 1;
        Ok(Metrics::from([("score".to_string(), v)]))
    })
}

fn checkpoint_names(dir: &Path) -> Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
        .filter(|n: &Result<String>| n.as_ref().map_or(true, |n| n.starts_with("checkpoint-")))
        .collect::<Result<_>>()?;
    names.sort_by_key(|n| n[11..].parse::<i64>().unwrap_or(0));
    Ok(names)
}

/// Evaluation and a save every 2 steps for 10 steps, `save_total_limit` 2, the best by the
/// scripted `score`, the best weights reloaded at the end.
fn best_model_run(
    name: &str,
    greater_is_better: bool,
    scores: Vec<f64>,
) -> Result<(Trainer, PathBuf)> {
    let dir = temp_dir(name);
    let mut args = TrainingArguments {
        per_device_train_batch_size: 4,
        per_device_eval_batch_size: 2,
        max_steps: 10,
        learning_rate: 1e-3,
        logging_steps: 1.0,
        eval_strategy: IntervalStrategy::Steps,
        eval_steps: Some(2.0),
        save_strategy: SaveStrategy::Steps,
        save_steps: 2.0,
        save_total_limit: Some(2),
        load_best_model_at_end: true,
        metric_for_best_model: Some("score".into()),
        greater_is_better: Some(greater_is_better),
        seed: 3,
        use_cpu: true,
        report_to: vec![],
        disable_tqdm: true,
        ..TrainingArguments::new(dir.display().to_string())
    };
    args.post_init()?;
    let mut trainer = Trainer::builder(initial_model()?, args)
        .train_dataset(blocks("train", 24)?)
        .eval_dataset(blocks("eval", 2)?)
        .preprocess_logits_for_metrics(|logits: &tch::Tensor, _: Option<&tch::Tensor>| {
            Ok(logits.f_argmax(-1, false)?)
        })
        .compute_metrics(scripted_score(scores))
        .build()?;
    trainer.train(None)?;
    Ok((trainer, dir))
}

/// The model's weights equal those saved in `ckpt` (every tensor, exactly).
fn assert_weights_equal(model: &dyn TrainableModel, ckpt: &Path) -> Result<()> {
    let saved = tchtrain_models::read_checkpoint(ckpt)?;
    let vars = model.var_store().variables();
    assert!(!saved.is_empty());
    for (name, t) in &saved {
        let v = vars
            .get(name)
            .with_context(|| format!("{name} not in the model"))?;
        assert!(v.equal(t), "{name} differs from {}", ckpt.display());
    }
    Ok(())
}

fn assert_weights_differ(model: &dyn TrainableModel, ckpt: &Path) -> Result<()> {
    let saved = tchtrain_models::read_checkpoint(ckpt)?;
    let vars = model.var_store().variables();
    let same = saved
        .iter()
        .all(|(name, t)| vars.get(name).is_some_and(|v: &Tensor| v.equal(t)));
    assert!(!same, "the model still has {}'s weights", ckpt.display());
    Ok(())
}

#[test]
fn rotation_keeps_best_and_newest_and_reloads_best_greater_is_better() -> Result<()> {
    let _g = lock();
    // Evaluations at steps 2, 4, 6, 8, 10: the highest score is at step 4.
    let (trainer, dir) = best_model_run("best-greater", true, vec![0.5, 0.9, 0.7, 0.6, 0.8])?;
    assert_eq!(checkpoint_names(&dir)?, ["checkpoint-4", "checkpoint-10"]);
    let best = dir.join("checkpoint-4");
    assert_eq!(
        trainer.state.best_model_checkpoint.as_deref(),
        Some(best.display().to_string().as_str())
    );
    assert_eq!(trainer.state.best_metric, Some(0.9));
    assert_eq!(trainer.state.best_global_step, Some(4));
    assert_weights_equal(trainer.model(), &best)?;
    assert_weights_differ(trainer.model(), &dir.join("checkpoint-10"))?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[test]
fn rotation_keeps_best_and_newest_and_reloads_best_lower_is_better() -> Result<()> {
    let _g = lock();
    // The lowest score is at step 6.
    let (trainer, dir) = best_model_run("best-lower", false, vec![0.5, 0.9, 0.2, 0.6, 0.8])?;
    assert_eq!(checkpoint_names(&dir)?, ["checkpoint-6", "checkpoint-10"]);
    let best = dir.join("checkpoint-6");
    assert_eq!(trainer.state.best_metric, Some(0.2));
    assert_eq!(trainer.state.best_global_step, Some(6));
    assert_weights_equal(trainer.model(), &best)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A Trainer saving a checkpoint at step 2 (resume sources for the bad-input tests).
fn saved_checkpoint(dir: &Path) -> Result<PathBuf> {
    let mut args = resume_args(dir, 2.0)?;
    args.max_steps = 2;
    let mut t = Trainer::builder(initial_model()?, args)
        .train_dataset(blocks("train", 12)?)
        .build()?;
    t.train(None)?;
    Ok(dir.join("checkpoint-2"))
}

/// Resumes from `ckpt` and expects an [`Error::InvalidCheckpoint`] naming `needle`, before
/// any step and with the model's weights untouched.
fn expect_invalid_checkpoint(ckpt: &Path, needle: &str) -> Result<()> {
    let out = temp_dir("bad-resume-out");
    let mut t = Trainer::builder(initial_model()?, resume_args(&out, 2.0)?)
        .train_dataset(blocks("train", 12)?)
        .build()?;
    let err = t
        .train(Some(ResumeFrom::Path(ckpt.to_path_buf())))
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidCheckpoint { .. }) && err.to_string().contains(needle),
        "{err}"
    );
    assert_eq!(t.state.global_step, 0, "nothing was trained");
    assert_weights_equal(t.model(), &small_vocab_initial())?;
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

#[test]
fn bad_checkpoints_are_typed_errors_before_training() -> Result<()> {
    let _g = lock();
    let dir = temp_dir("bad-ckpt");
    let ckpt = saved_checkpoint(&dir)?;

    // A truncated model.safetensors (an interrupted copy).
    let broken = dir.join("truncated");
    std::fs::create_dir_all(&broken)?;
    for entry in std::fs::read_dir(&ckpt)? {
        let entry = entry?;
        std::fs::copy(entry.path(), broken.join(entry.file_name()))?;
    }
    let weights = broken.join("model.safetensors");
    let bytes = std::fs::read(&weights)?;
    std::fs::write(&weights, &bytes[..bytes.len() / 2])?;
    expect_invalid_checkpoint(&broken, "model.safetensors: truncated")?;
    std::fs::write(&weights, &bytes[..4])?;
    expect_invalid_checkpoint(&broken, "model.safetensors: truncated")?;
    std::fs::write(&weights, &bytes)?;

    // trainer_state.json from another version (an unknown field), or not JSON at all.
    let state_path = broken.join("trainer_state.json");
    let state: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&state_path)?)?;
    let mut newer = state.clone();
    newer["field_of_a_future_version"] = serde_json::json!(1);
    std::fs::write(&state_path, serde_json::to_string(&newer)?)?;
    expect_invalid_checkpoint(&broken, "trainer_state.json")?;
    std::fs::write(&state_path, "{\"global_step\": ")?;
    expect_invalid_checkpoint(&broken, "trainer_state.json")?;
    let mut wrong_type = state.clone();
    wrong_type["global_step"] = serde_json::json!("two");
    std::fs::write(&state_path, serde_json::to_string(&wrong_type)?)?;
    expect_invalid_checkpoint(&broken, "trainer_state.json")?;
    // An older version's state (keys it did not have yet are missing) is fine.
    let mut older = state.clone();
    for key in ["best_global_step", "stateful_callbacks"] {
        older.as_object_mut().unwrap().remove(key);
    }
    std::fs::write(&state_path, serde_json::to_string(&older)?)?;
    let out = temp_dir("older-state-out");
    let mut t = Trainer::builder(initial_model()?, resume_args(&out, 100.0)?)
        .train_dataset(blocks("train", 12)?)
        .build()?;
    t.train(Some(ResumeFrom::Path(broken.clone())))?;
    assert_eq!(t.state.global_step, 3);

    // The checkpoint of another model (tiny Llama's weights): named, model untouched.
    expect_invalid_checkpoint(
        &assets().join("tiny-llama"),
        "config.json describes a LlamaForCausalLM",
    )?;
    // A GPT-2 checkpoint whose position table is shorter: a shape mismatch, model untouched.
    let other = dir.join("shorter");
    std::fs::create_dir_all(&other)?;
    let tensors: Vec<(String, Tensor)> = tchtrain_models::read_checkpoint(&ckpt)?
        .into_iter()
        .map(|(n, t)| {
            let t = if n == "transformer.wpe.weight" {
                t.narrow(0, 0, 8)
            } else {
                t
            };
            (n, t)
        })
        .collect();
    Tensor::write_safetensors(&tensors, other.join("model.safetensors"))?;
    expect_invalid_checkpoint(&other, "shape")?;
    // Not a folder.
    expect_invalid_checkpoint(&dir.join("checkpoint-999"), "not a folder")?;
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

/// Returns a NaN loss from the `nan_at`-th forward on (counted from 1).
struct NanFrom {
    calls: std::sync::atomic::AtomicUsize,
    nan_at: usize,
}

impl tchtrain_trainer::TrainerHooks for NanFrom {
    fn compute_loss(
        &self,
        ctx: &tchtrain_trainer::StepContext<'_>,
        model: &dyn TrainableModel,
        inputs: &tchtrain_collators::Batch,
        num_items_in_batch: Option<&Tensor>,
    ) -> tchtrain_trainer::Result<(Tensor, tchtrain_models::ModelOutput)> {
        let calls = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        let (loss, out) =
            tchtrain_trainer::default_compute_loss(ctx, model, inputs, num_items_in_batch)?;
        let loss = if calls >= self.nan_at {
            loss * f64::NAN
        } else {
            loss
        };
        Ok((loss, out))
    }
}

#[test]
fn non_finite_loss_stops_with_a_checkpoint_of_the_last_good_state() -> Result<()> {
    let _g = lock();
    // Accumulation 3: the 7th forward is the first micro-batch of optimizer step 3.
    let dir = temp_dir("non-finite");
    let mut t = Trainer::builder(initial_model()?, resume_args(&dir, 100.0)?)
        .train_dataset(blocks("train", 38)?)
        .hooks(NanFrom {
            calls: Default::default(),
            nan_at: 7,
        })
        .stop_on_non_finite(true)
        .build()?;
    let err = t.train(None).unwrap_err();
    let ckpt = dir.join("checkpoint-2");
    match &err {
        Error::NonFiniteLoss {
            step,
            grad_norm,
            checkpoint,
        } => {
            assert_eq!(*step, 3);
            assert!(grad_norm.is_nan());
            assert_eq!(checkpoint, &ckpt);
        }
        other => panic!("expected NonFiniteLoss, got {other}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("step 3") && text.contains("checkpoint-2"),
        "{text}"
    );
    // The bad step was not applied: the weights are step 2's, finite, and saved.
    assert_eq!(t.state.global_step, 2);
    assert_weights_equal(t.model(), &ckpt)?;
    for (name, w) in t.model().var_store().variables() {
        assert_eq!(w.isfinite().all().int64_value(&[]), 1, "{name}");
    }
    // The checkpoint resumes, and the resumed run (without NaNs) trains to the end.
    let mut resumed = Trainer::builder(initial_model()?, resume_args(&dir, 100.0)?)
        .train_dataset(blocks("train", 38)?)
        .build()?;
    assert_eq!(resumed.train(Some(ResumeFrom::Path(ckpt)))?.global_step, 12);

    // Without the option, upstream's behaviour: the update is applied (the weights turn
    // NaN) and the logged loss is filtered (logging_nan_inf_filter).
    let dir2 = temp_dir("non-finite-default");
    let mut t = Trainer::builder(initial_model()?, resume_args(&dir2, 100.0)?)
        .train_dataset(blocks("train", 38)?)
        .hooks(NanFrom {
            calls: Default::default(),
            nan_at: 7,
        })
        .build()?;
    t.train(None)?;
    assert_eq!(t.state.global_step, 12);
    let losses = step_logs(&t.state.log_history);
    assert!(losses[..2].iter().all(|l| l.1.is_finite()));
    assert!(
        losses[2..].iter().all(|l| l.2.is_nan()),
        "grad norms after the NaN"
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&dir2);
    Ok(())
}

#[test]
fn prefetching_workers_give_the_same_run() -> Result<()> {
    let _g = lock();
    let mut logs = Vec::new();
    for workers in [0, 2] {
        let dir = temp_dir(&format!("prefetch-{workers}"));
        let mut args = resume_args(&dir, 100.0)?;
        args.dataloader_num_workers = workers;
        args.num_train_epochs = 1.0;
        let mut t = Trainer::builder(initial_model()?, args)
            .train_dataset(blocks("train", 38)?)
            .build()?;
        t.train(None)?;
        logs.push(step_logs(&t.state.log_history));
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert_eq!(logs[0].len(), 4);
    assert_eq!(logs[0], logs[1]);
    Ok(())
}

#[test]
fn profile_reports_where_the_time_goes() -> Result<()> {
    let _g = lock();
    let dir = temp_dir("profile");
    let mut args = resume_args(&dir, 100.0)?;
    args.num_train_epochs = 1.0;
    args.save_strategy = SaveStrategy::No;
    let mut t = Trainer::builder(initial_model()?, args)
        .train_dataset(blocks("train", 38)?)
        .profile(true)
        .build()?;
    t.train(None)?;
    let p: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("profile.json"))?)?;
    assert_eq!(p["steps"], 4);
    let phases = [
        "data",
        "forward",
        "backward",
        "optimizer",
        "callbacks",
        "log_save_evaluate",
        "other",
    ];
    let total: f64 = phases
        .iter()
        .map(|k| p[k]["seconds"].as_f64().unwrap())
        .sum();
    assert!((total - p["seconds"].as_f64().unwrap()).abs() < 1e-9);
    // A GPT-2 step on CPU: forward, backward and the optimizer take real time.
    for k in ["forward", "backward", "optimizer"] {
        assert!(p[k]["seconds"].as_f64().unwrap() > 0.0, "{k}: {p}");
    }
    assert!(p["backward"]["share"].as_f64().unwrap() > 0.1, "{p}");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

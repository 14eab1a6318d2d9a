//! `TrainerHooks` beyond the step: the data loaders, `create_optimizer_and_scheduler`, `log`,
//! `evaluate` overridden as upstream's subclass overrides them (`super()` being the
//! `default_*` functions), and a hook calling back into the Trainer (`evaluate` from `log`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Result;
use tchtrain_data::{DataLoader, Dataset, SequentialSampler};
use tchtrain_testing::{lock, temp_dir};
use tchtrain_trainer::{
    Metrics, Result as TrainerResult, Trainer, TrainerHooks,
    default_create_optimizer_and_scheduler, default_evaluate, default_log,
};

use crate::common::{initial_model, small_train};
use crate::trainer::{losses, small_args};

/// What the overrides saw.
#[derive(Debug, Default)]
struct Seen {
    num_training_steps: Option<usize>,
    train_loaders: usize,
    logs: usize,
}

/// Sequential batches of 4 rows, a tag in every log entry, one more metric per evaluation.
struct Overrides(Arc<Mutex<Seen>>);

impl TrainerHooks for Overrides {
    fn get_train_dataloader(&self, trainer: &Trainer) -> TrainerResult<DataLoader> {
        self.0.lock().unwrap().train_loaders += 1;
        let dataset = trainer.train_dataset().expect("a training set").clone();
        Ok(DataLoader::new(
            dataset,
            trainer.data_collator().clone(),
            Arc::new(SequentialSampler),
            trainer.args().train_batch_size(),
            false,
        )?)
    }

    fn create_optimizer_and_scheduler(
        &self,
        trainer: &mut Trainer,
        num_training_steps: usize,
    ) -> TrainerResult<()> {
        self.0.lock().unwrap().num_training_steps = Some(num_training_steps);
        default_create_optimizer_and_scheduler(trainer, num_training_steps)
    }

    fn log(
        &self,
        trainer: &mut Trainer,
        mut logs: Vec<(String, f64)>,
        start_time: Option<Instant>,
    ) -> TrainerResult<()> {
        self.0.lock().unwrap().logs += 1;
        logs.push(("tagged".into(), 1.0));
        default_log(trainer, logs, start_time)
    }

    fn evaluate(
        &self,
        trainer: &mut Trainer,
        eval_dataset: Option<Arc<dyn Dataset>>,
        metric_key_prefix: &str,
    ) -> TrainerResult<Metrics> {
        let mut metrics = default_evaluate(self, trainer, eval_dataset, metric_key_prefix)?;
        metrics.insert(format!("{metric_key_prefix}_extra"), 42.0);
        Ok(metrics)
    }
}

#[test]
fn trainer_level_hooks_override_upstreams_methods() -> Result<()> {
    let _g = lock();
    let dir = temp_dir("hooks");
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut args = small_args(&dir.path().join("hooks"))?;
    args.save_strategy = tchtrain_training_args::SaveStrategy::No;
    let mut trainer = Trainer::builder(initial_model()?, args)
        .train_dataset(small_train()?)
        .eval_dataset(small_train()?)
        .hooks(Overrides(seen.clone()))
        .build()?;
    trainer.train(None)?;
    let metrics = trainer.evaluate(None, "eval")?;
    assert_eq!(metrics.get("eval_extra"), Some(&42.0));
    let overridden = losses(&trainer.state.log_history);
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.num_training_steps, Some(10));
        assert_eq!(seen.train_loaders, 1);
        // 10 step logs, the final train metrics, the evaluation's.
        assert_eq!(seen.logs, 12);
    }
    assert!(
        trainer
            .state
            .log_history
            .iter()
            .all(|e| e.get("tagged").and_then(|v| v.as_f64()) == Some(1.0)),
        "every entry went through the overridden log"
    );

    // The overridden loader is the sequential order: the same losses as asking for it.
    let mut args = small_args(&dir.path().join("sequential"))?;
    args.save_strategy = tchtrain_training_args::SaveStrategy::No;
    args.train_sampling_strategy = "sequential".into();
    let mut plain = Trainer::builder(initial_model()?, args)
        .train_dataset(small_train()?)
        .build()?;
    plain.train(None)?;
    assert_eq!(overridden, losses(&plain.state.log_history));
    Ok(())
}

/// Calls the Trainer's own `evaluate` from inside `log` after each training log, as an
/// upstream override calling `self.evaluate()` would.
struct EvaluateOnLog {
    nested: Arc<AtomicUsize>,
}

impl TrainerHooks for EvaluateOnLog {
    fn log(
        &self,
        trainer: &mut Trainer,
        logs: Vec<(String, f64)>,
        start_time: Option<Instant>,
    ) -> TrainerResult<()> {
        let training = logs.iter().any(|(k, _)| k == "loss");
        default_log(trainer, logs, start_time)?;
        if training {
            self.nested.fetch_add(1, Ordering::SeqCst);
            trainer.evaluate(None, "nested")?;
        }
        Ok(())
    }
}

#[test]
fn a_hook_calls_back_into_the_trainer() -> Result<()> {
    let _g = lock();
    let dir = temp_dir("hooks-reentry");
    let mut args = small_args(dir.path())?;
    args.save_strategy = tchtrain_training_args::SaveStrategy::No;
    let nested = Arc::new(AtomicUsize::new(0));
    let mut trainer = Trainer::builder(initial_model()?, args)
        .train_dataset(small_train()?)
        .eval_dataset(small_train()?)
        .hooks(EvaluateOnLog {
            nested: Arc::clone(&nested),
        })
        .build()?;
    trainer.train(None)?;
    // Each training log is followed by the nested evaluation's log (its own `log` call
    // through the same hooks, which does not evaluate again).
    let history = &trainer.state.log_history;
    let has = |i: usize, key: &str| history.get(i).is_some_and(|e| e.contains_key(key));
    let trained: Vec<usize> = (0..history.len()).filter(|&i| has(i, "loss")).collect();
    assert!(!trained.is_empty(), "{history:?}");
    for &i in &trained {
        assert!(
            has(i + 1, "nested_loss"),
            "entry {i} is not followed by the nested evaluation: {history:?}"
        );
    }
    assert_eq!(nested.load(Ordering::SeqCst), trained.len());
    assert!(trainer.get_train_dataloader().is_ok());
    Ok(())
}

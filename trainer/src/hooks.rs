//! The `default_*` functions: upstream's behaviour of each [`TrainerHooks`] method, callable
//! from an override as upstream's override calls `super()`.
//!
//! ```
//! use tch::Tensor;
//! use tchtrain_collators::Batch;
//! use tchtrain_models::{ModelOutput, TrainableModel};
//! use tchtrain_trainer::{StepContext, TrainerHooks, default_compute_loss};
//!
//! /// Doubles the model's loss (and says it is a per-batch mean, so the Trainer still
//! /// divides it by the gradient-accumulation steps).
//! struct DoubleLoss;
//!
//! impl TrainerHooks for DoubleLoss {
//!     fn compute_loss(
//!         &self,
//!         ctx: &StepContext<'_>,
//!         model: &dyn TrainableModel,
//!         inputs: &Batch,
//!         num_items_in_batch: Option<&Tensor>,
//!     ) -> tchtrain_trainer::Result<(Tensor, ModelOutput)> {
//!         let (loss, out) = default_compute_loss(ctx, model, inputs, None)?;
//!         Ok((loss * 2.0, out))
//!     }
//!
//!     fn loss_is_scaled_for_ga(&self) -> Option<bool> {
//!         Some(false)
//!     }
//! }
//! ```
//!
//! The documentation's weighted-loss `compute_loss` is the tested example
//! `tchtrain_examples::custom_loss`.

use std::sync::Arc;
use std::time::Instant;

use tch::Tensor;
use tchtrain_collators::Batch;
use tchtrain_data::{DataLoader, Dataset};
use tchtrain_models::TrainableModel;

use crate::error::Result;
use crate::metrics::{Metrics, PredictionOutput};
use crate::step::{
    PredictionStepOutput, StepContext, count_num_items_in_batch, model_forward, model_inputs,
};
use crate::trainer::{Trainer, TrainerHooks};

impl StepContext<'_> {
    /// [`default_training_step`] (what [`TrainerHooks::training_step`] runs by default).
    pub(crate) fn run_training_step<H: TrainerHooks + ?Sized>(
        &self,
        hooks: &H,
        model: &mut dyn TrainableModel,
        inputs: &Batch,
        num_items_in_batch: Option<&Tensor>,
    ) -> Result<Tensor> {
        model.train();
        let t0 = std::time::Instant::now();
        let (loss, _) = hooks.compute_loss(self, &*model, inputs, num_items_in_batch)?;
        if let Some(forward) = self.forward_time {
            forward.set(forward.get() + t0.elapsed());
        }
        let scaled = hooks
            .loss_is_scaled_for_ga()
            .unwrap_or(self.model_accepts_loss_kwargs && num_items_in_batch.is_some());
        let loss = if scaled {
            loss
        } else {
            loss.f_div_scalar(self.current_gradient_accumulation_steps.max(1) as f64)?
        };
        self.backward(&loss)?;
        Ok(loss.detach())
    }

    /// [`default_prediction_step`] (what [`TrainerHooks::prediction_step`] runs by default).
    pub(crate) fn run_prediction_step<H: TrainerHooks + ?Sized>(
        &self,
        hooks: &H,
        model: &dyn TrainableModel,
        inputs: &Batch,
        prediction_loss_only: bool,
    ) -> Result<PredictionStepOutput> {
        let has_labels =
            !self.label_names.is_empty() && self.label_names.iter().all(|k| inputs.contains(k));
        // Upstream keeps a tuple of the label tensors (one tensor for one name); several
        // (question answering's `start_positions`, `end_positions`) are stacked along a new
        // last dimension, `[batch, 2]`, so that they concatenate as one array.
        let labels = if has_labels {
            let tensors: Vec<Tensor> = self
                .label_names
                .iter()
                .filter_map(|k| inputs.get(k))
                .map(Tensor::detach)
                .collect();
            match tensors.len() {
                1 => tensors.into_iter().next(),
                _ => Some(Tensor::f_stack(&tensors, -1)?),
            }
        } else {
            None
        };
        // Upstream: `inputs = {**inputs, "skip_logits": True}` with Liger when only the loss
        // is kept.
        let ctx = StepContext {
            skip_logits: (self.args.use_liger_kernel && prediction_loss_only).then_some(true),
            ..*self
        };
        let (loss, output) = tch::no_grad(|| -> Result<_> {
            if has_labels {
                let num_items = count_num_items_in_batch(std::slice::from_ref(inputs), self)?;
                let (loss, out) = hooks.compute_loss(&ctx, model, inputs, num_items.as_ref())?;
                // Upstream `loss.mean().detach()`: in the loss's own dtype (FSDP's
                // half-precision outputs stay half).
                Ok((Some(loss.detach().f_mean(loss.kind())?), out))
            } else {
                Ok((None, model_forward(self, model, &model_inputs(inputs))?))
            }
        })?;
        if prediction_loss_only {
            return Ok(PredictionStepOutput {
                loss,
                ..Default::default()
            });
        }
        Ok(PredictionStepOutput {
            loss,
            logits: output.logits.as_ref().map(Tensor::detach),
            labels,
        })
    }
}

/// Upstream's default `training_step`, the rule for gradient accumulation included:
///
/// the loss counts as already normalised over the accumulation window ("scaled for GA")
/// when `hooks.loss_is_scaled_for_ga()` says so, or else when the model accepts loss
/// kwargs **and** `num_items_in_batch` was counted (the batch has labels); otherwise it is
/// divided by `ctx.current_gradient_accumulation_steps`. Then the accelerator's
/// `backward()`.
pub fn default_training_step<H: TrainerHooks + ?Sized>(
    hooks: &H,
    ctx: &StepContext<'_>,
    model: &mut dyn TrainableModel,
    inputs: &Batch,
    num_items_in_batch: Option<&Tensor>,
) -> Result<Tensor> {
    ctx.run_training_step(hooks, model, inputs, num_items_in_batch)
}

/// Upstream's default `prediction_step` (no context parallelism, no SageMaker).
pub fn default_prediction_step<H: TrainerHooks + ?Sized>(
    hooks: &H,
    ctx: &StepContext<'_>,
    model: &dyn TrainableModel,
    inputs: &Batch,
    prediction_loss_only: bool,
) -> Result<PredictionStepOutput> {
    ctx.run_prediction_step(hooks, model, inputs, prediction_loss_only)
}

/// Upstream's default `get_train_dataloader`: `train_batch_size` rows per batch in the
/// order of the sampler (`train_sampling_strategy`: `"random"`, `"sequential"` or
/// `"group_by_length"`, or the one given to the builder), `dataloader_drop_last`, this
/// process's shard in a data-parallel run (the accelerator's `prepare_data_loader`).
pub fn default_get_train_dataloader(trainer: &Trainer) -> Result<DataLoader> {
    trainer.default_train_dataloader()
}

/// Upstream's default `get_eval_dataloader`: `eval_batch_size` rows of `eval_dataset` (or
/// the Trainer's) per batch, in order.
pub fn default_get_eval_dataloader(
    trainer: &Trainer,
    eval_dataset: Option<Arc<dyn Dataset>>,
) -> Result<DataLoader> {
    trainer.default_eval_dataloader(eval_dataset)
}

/// Upstream's default `get_test_dataloader`: as the evaluation's, over `test_dataset`.
pub fn default_get_test_dataloader(
    trainer: &Trainer,
    test_dataset: Arc<dyn Dataset>,
) -> Result<DataLoader> {
    trainer.default_eval_dataloader(Some(test_dataset))
}

/// Upstream's default `create_optimizer_and_scheduler`: `create_optimizer`, then
/// `create_scheduler(num_training_steps)`.
pub fn default_create_optimizer_and_scheduler(
    trainer: &mut Trainer,
    num_training_steps: usize,
) -> Result<()> {
    trainer.create_optimizer()?;
    trainer.create_scheduler(num_training_steps)
}

/// Upstream's default `log`: adds `epoch` (and the tokens seen, when tracked), appends the
/// entry with its `step` to `log_history`, and calls `on_log`.
pub fn default_log(
    trainer: &mut Trainer,
    logs: Vec<(String, f64)>,
    start_time: Option<Instant>,
) -> Result<()> {
    trainer.default_log(logs, start_time)
}

/// Upstream's default `evaluate`, with `hooks` for its data loader, steps and log (see
/// [`Trainer::evaluate`]).
pub fn default_evaluate<H: TrainerHooks + ?Sized>(
    hooks: &H,
    trainer: &mut Trainer,
    eval_dataset: Option<Arc<dyn Dataset>>,
    metric_key_prefix: &str,
) -> Result<Metrics> {
    trainer.evaluate_with(hooks, eval_dataset, metric_key_prefix)
}

/// Upstream's default `predict`, with `hooks` for its data loader and steps (see
/// [`Trainer::predict`]).
pub fn default_predict<H: TrainerHooks + ?Sized>(
    hooks: &H,
    trainer: &mut Trainer,
    test_dataset: Arc<dyn Dataset>,
    metric_key_prefix: &str,
) -> Result<PredictionOutput> {
    trainer.predict_with(hooks, test_dataset, metric_key_prefix)
}

//! The `TrainerCallback` trait: the 16 events of the training loop, each a no-op by default.
//!
//! Policy apart from mechanism: a callback inspects the state and flips [`TrainerControl`]
//! flags; the training loop, which owns the state, carries the decisions out. Upstream also
//! passes the model, tokenizer, optimizer, scheduler and dataloaders as keyword arguments;
//! this crate does not depend on tch, so events carry only the data that is not a tensor
//! (logs, metrics, the evaluation dataloader's length).

use std::any::Any;

use tchtrain_training_args::TrainingArguments;

use crate::error::Result;
use crate::exportable_state::CallbackState;
use crate::model_config::ModelConfig;
use crate::trainer_control::TrainerControl;
use crate::trainer_state::TrainerState;
use tchtrain_training_args::JsonMap;

/// The last path segment of a type name, without generic arguments (`DefaultFlowCallback`).
pub(crate) fn short_type_name(full: &'static str) -> &'static str {
    let base = full.split('<').next().unwrap_or(full);
    base.rsplit("::").next().unwrap_or(base)
}

/// Upstream `TrainerCallback`: inspects the training loop at its events and takes decisions
/// through [`TrainerControl`]. Every event defaults to doing nothing.
///
/// Events return `Result` so a callback that writes files (TensorBoard, JSON lines) or checks
/// the arguments (early stopping) reports failure instead of panicking; the
/// [`CallbackHandler`](crate::CallbackHandler) stops at the first error, as an exception would.
#[allow(unused_variables)]
pub trait TrainerCallback: Any + Send {
    /// The callback's class name, as stored in `stateful_callbacks` and shown in warnings
    /// (upstream `callback.__class__.__name__`). Defaults to the Rust type's name.
    fn name(&self) -> &str {
        short_type_name(std::any::type_name::<Self>())
    }

    /// The state to save in checkpoints when the callback is an
    /// [`ExportableState`](crate::ExportableState) (upstream `isinstance(cb, ExportableState)`);
    /// `None` for stateless callbacks.
    fn exportable_state(&self) -> Option<CallbackState> {
        None
    }

    /// Restores the callback from a saved state (upstream `_load_callback_state`, which
    /// rebuilds it with `from_state`). Returns `Ok(false)` for stateless callbacks.
    fn load_state(&mut self, state: &CallbackState) -> Result<bool> {
        Ok(false)
    }

    /// Receives the model's configuration before training (upstream passes `model` to every
    /// event, and loggers read `model.config`); see
    /// [`CallbackHandler::set_model_config`](crate::CallbackHandler::set_model_config).
    fn set_model_config(&mut self, config: &ModelConfig) {}

    /// Whether this callback needs the final model saved at the end of training (upstream's
    /// callbacks that save the `model` they are handed, as W&B's `WANDB_LOG_MODEL` does):
    /// the Trainer then saves it once into a temporary folder and calls
    /// [`on_model_saved`](Self::on_model_saved) before `on_train_end`.
    fn saves_model_at_train_end(&self) -> bool {
        false
    }

    /// At the end of training, before `on_train_end`, when
    /// [`saves_model_at_train_end`](Self::saves_model_at_train_end): `dir` holds the model as
    /// the Trainer's `save_model` writes it (weights, config, processing class, training
    /// arguments) and is removed when this returns.
    fn on_model_saved(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        dir: &std::path::Path,
    ) -> Result<()> {
        Ok(())
    }

    /// At the end of the initialization of the Trainer.
    fn on_init_end(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        control: &mut TrainerControl,
    ) -> Result<()> {
        Ok(())
    }

    /// At the beginning of training.
    fn on_train_begin(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        control: &mut TrainerControl,
    ) -> Result<()> {
        Ok(())
    }

    /// At the end of training.
    fn on_train_end(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        control: &mut TrainerControl,
    ) -> Result<()> {
        Ok(())
    }

    /// At the beginning of an epoch.
    fn on_epoch_begin(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        control: &mut TrainerControl,
    ) -> Result<()> {
        Ok(())
    }

    /// At the end of an epoch.
    fn on_epoch_end(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        control: &mut TrainerControl,
    ) -> Result<()> {
        Ok(())
    }

    /// At the beginning of a training step (one step may take several batches with gradient accumulation).
    fn on_step_begin(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        control: &mut TrainerControl,
    ) -> Result<()> {
        Ok(())
    }

    /// Before the optimizer step, after gradient clipping.
    fn on_pre_optimizer_step(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        control: &mut TrainerControl,
    ) -> Result<()> {
        Ok(())
    }

    /// After the optimizer step, before gradients are zeroed.
    fn on_optimizer_step(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        control: &mut TrainerControl,
    ) -> Result<()> {
        Ok(())
    }

    /// At the end of a substep during gradient accumulation.
    fn on_substep_end(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        control: &mut TrainerControl,
    ) -> Result<()> {
        Ok(())
    }

    /// At the end of a training step.
    fn on_step_end(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        control: &mut TrainerControl,
    ) -> Result<()> {
        Ok(())
    }

    /// After an evaluation phase, with its `metrics`.
    fn on_evaluate(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        control: &mut TrainerControl,
        metrics: &JsonMap,
    ) -> Result<()> {
        Ok(())
    }

    /// After a successful prediction, with its `metrics`.
    fn on_predict(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        control: &mut TrainerControl,
        metrics: &JsonMap,
    ) -> Result<()> {
        Ok(())
    }

    /// After a checkpoint save.
    fn on_save(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        control: &mut TrainerControl,
    ) -> Result<()> {
        Ok(())
    }

    /// After logging `logs` (already appended, with `"step"`, to `state.log_history`).
    fn on_log(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        control: &mut TrainerControl,
        logs: &JsonMap,
    ) -> Result<()> {
        Ok(())
    }

    /// After a prediction step; `eval_dataloader_len` is the number of evaluation batches
    /// when known (upstream passes the dataloader).
    fn on_prediction_step(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        control: &mut TrainerControl,
        eval_dataloader_len: Option<usize>,
    ) -> Result<()> {
        Ok(())
    }

    /// Before pushing the model to the hub.
    fn on_push_begin(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        control: &mut TrainerControl,
    ) -> Result<()> {
        Ok(())
    }
}

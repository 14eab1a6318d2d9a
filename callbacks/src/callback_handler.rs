//! `CallbackHandler`: the ordered list of callbacks the Trainer calls at each event.

use std::any::Any;

use tchtrain_training_args::TrainingArguments;

use crate::default_flow::DefaultFlowCallback;
use crate::error::Result;
use crate::exportable_state::{CallbackState, ExportableState};
use crate::model_config::ModelConfig;
use crate::trainer_callback::TrainerCallback;
use crate::trainer_control::TrainerControl;
use crate::trainer_state::TrainerState;
use tchtrain_training_args::{JsonMap, JsonValue};

/// Upstream `CallbackHandler`: calls each callback, in the order they were added, at every
/// event, after resetting the flags upstream resets for that event.
///
/// The training loop owns the [`TrainerState`] and [`TrainerControl`] and lends them to each
/// event; a callback's error stops the event there and is returned.
#[derive(Default)]
pub struct CallbackHandler {
    callbacks: Vec<Box<dyn TrainerCallback>>,
    /// Number of batches of the training dataloader, when known (upstream `train_dataloader`).
    pub train_dataloader_len: Option<usize>,
    /// Number of batches of the current evaluation dataloader, when known (upstream
    /// `eval_dataloader`); passed to `on_prediction_step`.
    pub eval_dataloader_len: Option<usize>,
    /// The model's configuration (upstream's handler holds the `model`; its integrations read
    /// `model.config`), set with [`CallbackHandler::set_model_config`].
    model_config: Option<ModelConfig>,
}

impl std::fmt::Debug for CallbackHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallbackHandler")
            .field(
                "callbacks",
                &self.callbacks.iter().map(|c| c.name()).collect::<Vec<_>>(),
            )
            .field("train_dataloader_len", &self.train_dataloader_len)
            .field("eval_dataloader_len", &self.eval_dataloader_len)
            .field("model_config", &self.model_config.is_some())
            .finish()
    }
}

macro_rules! simple_events {
    ($($(#[$doc:meta])* $name:ident [$($flag:ident),*])*) => {$(
        $(#[$doc])*
        pub fn $name(&mut self, args: &TrainingArguments, state: &TrainerState, control: &mut TrainerControl) -> Result<()> {
            $(control.$flag = false;)*
            for cb in &mut self.callbacks {
                cb.$name(args, state, control)?;
            }
            Ok(())
        }
    )*};
}

impl CallbackHandler {
    /// A handler holding `callbacks` in order; warns, as upstream does, when none is a
    /// [`DefaultFlowCallback`] (the Trainer would then never log, evaluate, save or stop).
    pub fn new(callbacks: Vec<Box<dyn TrainerCallback>>) -> Self {
        let mut handler = Self::default();
        for cb in callbacks {
            handler.add_boxed_callback(cb);
        }
        if handler.get::<DefaultFlowCallback>().is_none() {
            log::warn!(
                "The Trainer will not work properly if you don't have a `DefaultFlowCallback` in its callbacks. You\n\
                 should add one before training with `trainer.add_callback(DefaultFlowCallback). The current list of\
                 callbacks is\n:{}",
                handler.callback_list()
            );
        }
        handler
    }

    /// Appends `callback` (upstream `add_callback`); warns when one of the same type is already there.
    pub fn add_callback<T: TrainerCallback>(&mut self, callback: T) {
        self.add_boxed_callback(Box::new(callback));
    }

    /// Appends an already boxed callback; warns when one of the same type is already there.
    pub fn add_boxed_callback(&mut self, callback: Box<dyn TrainerCallback>) {
        let id = (*callback).type_id();
        if self.callbacks.iter().any(|c| (**c).type_id() == id) {
            log::warn!(
                "You are adding a {} to the callbacks of this Trainer, but there is already one. The current\
                 list of callbacks is\n:{}",
                callback.name(),
                self.callback_list()
            );
        }
        let mut callback = callback;
        if let Some(config) = &self.model_config {
            callback.set_model_config(config);
        }
        self.callbacks.push(callback);
    }

    /// Hands the model's configuration to every callback, now and as they are added (upstream
    /// passes `model` to every event; MLflow and TensorBoard read `model.config`). The Trainer
    /// calls it once, before training, for a model that has a config.
    pub fn set_model_config(&mut self, config: ModelConfig) {
        for cb in &mut self.callbacks {
            cb.set_model_config(&config);
        }
        self.model_config = Some(config);
    }

    /// What the callbacks append to the model card's comment, in calling order
    /// ([`TrainerCallback::model_card_comment`]).
    pub fn model_card_comments(&self) -> Vec<String> {
        self.callbacks
            .iter()
            .filter_map(|c| c.model_card_comment())
            .collect()
    }

    /// Whether a callback needs the final model saved at the end of training
    /// ([`TrainerCallback::saves_model_at_train_end`]).
    pub fn saves_model_at_train_end(&self) -> bool {
        self.callbacks.iter().any(|c| c.saves_model_at_train_end())
    }

    /// Hands the folder the final model was saved to to the callbacks that asked for it
    /// ([`TrainerCallback::on_model_saved`]).
    pub fn on_model_saved(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        dir: &std::path::Path,
    ) -> Result<()> {
        for cb in &mut self.callbacks {
            if cb.saves_model_at_train_end() {
                cb.on_model_saved(args, state, dir)?;
            }
        }
        Ok(())
    }

    /// The model's configuration, when one was set.
    pub fn model_config(&self) -> Option<&ModelConfig> {
        self.model_config.as_ref()
    }

    /// Removes and returns the first callback of type `T` (upstream `pop_callback(cls)`).
    pub fn pop_callback<T: TrainerCallback>(&mut self) -> Option<Box<T>> {
        let i = self.position::<T>()?;
        let cb: Box<dyn Any> = self.callbacks.remove(i);
        cb.downcast::<T>().ok()
    }

    /// Removes and returns the first callback whose [`name`](TrainerCallback::name) is `name`.
    pub fn pop_callback_by_name(&mut self, name: &str) -> Option<Box<dyn TrainerCallback>> {
        let i = self.callbacks.iter().position(|c| c.name() == name)?;
        Some(self.callbacks.remove(i))
    }

    /// Removes the first callback of type `T` (upstream `remove_callback(cls)`); returns whether one was found.
    pub fn remove_callback<T: TrainerCallback>(&mut self) -> bool {
        self.pop_callback::<T>().is_some()
    }

    fn position<T: TrainerCallback>(&self) -> Option<usize> {
        self.callbacks
            .iter()
            .position(|c| (**c).type_id() == std::any::TypeId::of::<T>())
    }

    /// The first callback of type `T`.
    pub fn get<T: TrainerCallback>(&self) -> Option<&T> {
        let cb: &dyn Any = &**self.callbacks.get(self.position::<T>()?)?;
        cb.downcast_ref::<T>()
    }

    /// The first callback of type `T`, mutably.
    pub fn get_mut<T: TrainerCallback>(&mut self) -> Option<&mut T> {
        let i = self.position::<T>()?;
        let cb: &mut dyn Any = &mut *self.callbacks[i];
        cb.downcast_mut::<T>()
    }

    /// The callbacks, in calling order.
    pub fn callbacks(&self) -> &[Box<dyn TrainerCallback>] {
        &self.callbacks
    }

    /// The callbacks' names, one per line (upstream `callback_list`).
    pub fn callback_list(&self) -> String {
        self.callbacks
            .iter()
            .map(|c| c.name())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The `(class name, state)` of every exportable callback, then of `control`, as upstream
    /// collects `callbacks + [control]` for [`TrainerState::with_stateful_callbacks`] and
    /// [`TrainerState::update_stateful_callbacks`].
    pub fn exportable_states(&self, control: &TrainerControl) -> Vec<(String, JsonValue)> {
        let mut out: Vec<(String, JsonValue)> = self
            .callbacks
            .iter()
            .filter_map(|c| {
                c.exportable_state()
                    .map(|s| (c.name().to_string(), s.to_json()))
            })
            .collect();
        out.push(("TrainerControl".into(), control.state().to_json()));
        out
    }

    /// Restores callback states saved under `stateful_callbacks` (upstream
    /// `Trainer._load_callback_state`): the i-th stored state of a class goes to the i-th
    /// callback of that name, `TrainerControl` into `control`; restored callbacks move to the
    /// end of the list, as upstream's remove-then-add does. Returns the stored names that
    /// match no callback (upstream warns about them).
    pub fn load_callback_state(
        &mut self,
        stateful_callbacks: &JsonMap,
        control: &mut TrainerControl,
    ) -> Result<Vec<String>> {
        let mut not_found = Vec::new();
        let mut restored = Vec::new();
        for (name, data) in stateful_callbacks.iter() {
            let data: Vec<&JsonValue> = match data {
                JsonValue::Array(items) => items.iter().collect(),
                other => vec![other],
            };
            let what = format!("stateful_callbacks.{name}");
            if name == "TrainerControl" {
                if let Some(first) = data.first() {
                    *control =
                        TrainerControl::from_state(&CallbackState::from_json(first, &what)?)?;
                }
                continue;
            }
            let mut matched = 0;
            for (i, cb) in self.callbacks.iter_mut().enumerate() {
                if cb.name() != name || restored.contains(&i) {
                    continue;
                }
                let Some(item) = data.get(matched) else { break };
                matched += 1;
                if cb.load_state(&CallbackState::from_json(item, &what)?)? {
                    restored.push(i);
                }
            }
            if matched == 0 {
                not_found.push(name.to_string());
            }
        }
        if !not_found.is_empty() {
            log::warn!(
                "Checkpoint included callbacks not included in current configuration. Ignoring. ({})",
                not_found.join(", ")
            );
        }
        restored.sort_unstable();
        let mut moved = Vec::new();
        for i in restored.into_iter().rev() {
            moved.push(self.callbacks.remove(i));
        }
        self.callbacks.extend(moved.into_iter().rev());
        Ok(not_found)
    }

    simple_events! {
        /// Event at the end of the Trainer's initialization.
        on_init_end []
        /// Event at the beginning of training; first resets `should_training_stop`.
        on_train_begin [should_training_stop]
        /// Event at the end of training.
        on_train_end []
        /// Event at the beginning of an epoch; first resets `should_epoch_stop`.
        on_epoch_begin [should_epoch_stop]
        /// Event at the end of an epoch.
        on_epoch_end []
        /// Event at the beginning of a step; first resets `should_log`, `should_evaluate`, `should_save`.
        on_step_begin [should_log, should_evaluate, should_save]
        /// Event before the optimizer step.
        on_pre_optimizer_step []
        /// Event after the optimizer step.
        on_optimizer_step []
        /// Event at the end of a gradient-accumulation substep.
        on_substep_end []
        /// Event at the end of a step.
        on_step_end []
        /// Event after a checkpoint save; first resets `should_save`.
        on_save [should_save]
        /// Event before pushing to the hub.
        on_push_begin []
    }

    /// Event after an evaluation; first resets `should_evaluate`.
    pub fn on_evaluate(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        control: &mut TrainerControl,
        metrics: &JsonMap,
    ) -> Result<()> {
        control.should_evaluate = false;
        for cb in &mut self.callbacks {
            cb.on_evaluate(args, state, control, metrics)?;
        }
        Ok(())
    }

    /// Event after a prediction.
    pub fn on_predict(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        control: &mut TrainerControl,
        metrics: &JsonMap,
    ) -> Result<()> {
        for cb in &mut self.callbacks {
            cb.on_predict(args, state, control, metrics)?;
        }
        Ok(())
    }

    /// Event after logging; first resets `should_log`.
    pub fn on_log(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        control: &mut TrainerControl,
        logs: &JsonMap,
    ) -> Result<()> {
        control.should_log = false;
        for cb in &mut self.callbacks {
            cb.on_log(args, state, control, logs)?;
        }
        Ok(())
    }

    /// Event after a prediction step; passes [`eval_dataloader_len`](Self::eval_dataloader_len).
    pub fn on_prediction_step(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        control: &mut TrainerControl,
    ) -> Result<()> {
        let len = self.eval_dataloader_len;
        for cb in &mut self.callbacks {
            cb.on_prediction_step(args, state, control, len)?;
        }
        Ok(())
    }
}

//! `EarlyStoppingCallback`: stops training when the evaluation metric stops improving.

use tchtrain_training_args::{IntervalStrategy, TrainingArguments};

use crate::error::{Error, Result};
use crate::exportable_state::{CallbackState, ExportableState};
use crate::trainer_callback::TrainerCallback;
use crate::trainer_control::TrainerControl;
use crate::trainer_state::TrainerState;
use tchtrain_training_args::{JsonMap, JsonValue};

/// Upstream `EarlyStoppingCallback`: sets `should_training_stop` once `metric_for_best_model`
/// has failed to improve on `state.best_metric` by more than `early_stopping_threshold` for
/// `early_stopping_patience` evaluations in a row.
///
/// Needs `metric_for_best_model` and an evaluation strategy; `state.best_metric` is kept by
/// the Trainer (upstream `_determine_best_metric`, run after `on_evaluate`).
#[derive(Debug, Clone, PartialEq)]
pub struct EarlyStoppingCallback {
    /// Number of evaluations without improvement before stopping.
    pub early_stopping_patience: i64,
    /// How much the metric must improve to count as an improvement. Upstream's type allows
    /// `None`, which raises `TypeError` at the first comparison; here it is always a number.
    pub early_stopping_threshold: f64,
    /// Number of evaluations in a row that failed to improve.
    pub early_stopping_patience_counter: i64,
}

impl Default for EarlyStoppingCallback {
    fn default() -> Self {
        Self::new(1, 0.0)
    }
}

impl EarlyStoppingCallback {
    /// A callback with upstream's arguments (defaults: patience 1, threshold 0.0).
    pub fn new(early_stopping_patience: i64, early_stopping_threshold: f64) -> Self {
        Self {
            early_stopping_patience,
            early_stopping_threshold,
            early_stopping_patience_counter: 0,
        }
    }

    /// Upstream `check_metric_value`: resets the counter on an improvement larger than the
    /// threshold (or when there is no best metric yet), else counts one more miss.
    pub fn check_metric_value(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        metric_value: f64,
    ) {
        // `greater_is_better=None` is falsy upstream: lower is better.
        let better = match state.best_metric {
            None => true,
            Some(best) => {
                let improves = if args.greater_is_better == Some(true) {
                    metric_value > best
                } else {
                    metric_value < best
                };
                improves && (metric_value - best).abs() > self.early_stopping_threshold
            }
        };
        if better {
            self.early_stopping_patience_counter = 0;
        } else {
            self.early_stopping_patience_counter += 1;
        }
    }
}

/// `metric_for_best_model` with upstream's `eval_` prefix.
fn metric_to_check(metric: &str) -> String {
    if metric.starts_with("eval_") {
        metric.to_string()
    } else {
        format!("eval_{metric}")
    }
}

impl TrainerCallback for EarlyStoppingCallback {
    fn exportable_state(&self) -> Option<CallbackState> {
        Some(self.state())
    }

    fn load_state(&mut self, state: &CallbackState) -> Result<bool> {
        *self = Self::from_state(state)?;
        Ok(true)
    }

    fn on_train_begin(
        &mut self,
        args: &TrainingArguments,
        _: &TrainerState,
        _: &mut TrainerControl,
    ) -> Result<()> {
        if !args.load_best_model_at_end {
            log::warn!(
                "Using EarlyStoppingCallback without load_best_model_at_end=True. Once training is finished, the best \
                 model will not be loaded automatically."
            );
        }
        if args.metric_for_best_model.is_none() {
            return Err(Error::CallbackRequirement {
                callback: "EarlyStoppingCallback",
                requirement: "metric_for_best_model to be defined",
                fix: "set TrainingArguments.metric_for_best_model (e.g. \"loss\")",
            });
        }
        if args.eval_strategy == IntervalStrategy::No {
            return Err(Error::CallbackRequirement {
                callback: "EarlyStoppingCallback",
                requirement: "IntervalStrategy of steps or epoch",
                fix: "set TrainingArguments.eval_strategy to \"steps\" or \"epoch\"",
            });
        }
        Ok(())
    }

    fn on_evaluate(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        control: &mut TrainerControl,
        metrics: &JsonMap,
    ) -> Result<()> {
        let Some(metric) = args.metric_for_best_model.as_deref() else {
            return Err(Error::CallbackRequirement {
                callback: "EarlyStoppingCallback",
                requirement: "metric_for_best_model to be defined",
                fix: "set TrainingArguments.metric_for_best_model (e.g. \"loss\")",
            });
        };
        let key = metric_to_check(metric);
        let Some(value) = metrics.get(&key).and_then(JsonValue::as_f64) else {
            log::warn!(
                "early stopping required metric_for_best_model, but did not find {key} so early stopping is disabled"
            );
            return Ok(());
        };
        self.check_metric_value(args, state, value);
        if self.early_stopping_patience_counter >= self.early_stopping_patience {
            control.should_training_stop = true;
        }
        Ok(())
    }
}

impl ExportableState for EarlyStoppingCallback {
    fn state(&self) -> CallbackState {
        let mut s = CallbackState::default();
        s.args
            .insert("early_stopping_patience", self.early_stopping_patience);
        s.args
            .insert("early_stopping_threshold", self.early_stopping_threshold);
        s.attributes.insert(
            "early_stopping_patience_counter",
            self.early_stopping_patience_counter,
        );
        s
    }

    fn from_state(state: &CallbackState) -> Result<Self> {
        const WHAT: &str = "EarlyStoppingCallback state";
        for (part, map, known) in [
            (
                "args",
                &state.args,
                &["early_stopping_patience", "early_stopping_threshold"][..],
            ),
            (
                "attributes",
                &state.attributes,
                &["early_stopping_patience_counter"][..],
            ),
        ] {
            if let Some((key, _)) = map.iter().find(|(k, _)| !known.contains(k)) {
                return Err(Error::UnknownField {
                    what: WHAT.into(),
                    field: format!("{part}.{key}"),
                });
            }
        }
        let mut cb = Self::new(
            state
                .field(
                    WHAT,
                    "args",
                    "early_stopping_patience",
                    "an integer",
                    JsonValue::as_i64,
                )?
                .unwrap_or(1),
            state
                .field(
                    WHAT,
                    "args",
                    "early_stopping_threshold",
                    "a number",
                    JsonValue::as_f64,
                )?
                .unwrap_or(0.0),
        );
        if let Some(c) = state.field(
            WHAT,
            "attributes",
            "early_stopping_patience_counter",
            "an integer",
            JsonValue::as_i64,
        )? {
            cb.early_stopping_patience_counter = c;
        }
        Ok(cb)
    }
}

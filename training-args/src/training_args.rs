//! `TrainingArguments`: upstream `training_args.py`.
//!
//! Work in progress: the fields below are the ones the flow callbacks read; the rest of
//! upstream's 5.23 fields, `__post_init__` checks, JSON and CLI parsing are being added.

use serde::{Deserialize, Serialize};

use crate::trainer_utils::{IntervalStrategy, SaveStrategy};

/// The arguments of a training run, with upstream's field names and defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TrainingArguments {
    /// Where checkpoints and outputs go (upstream default: `"trainer_output"`).
    pub output_dir: Option<String>,
    /// Total number of training epochs to perform.
    pub num_train_epochs: f64,
    /// If > 0: total number of training steps to perform; overrides `num_train_epochs`.
    pub max_steps: i64,
    /// The logging strategy to use.
    pub logging_strategy: IntervalStrategy,
    /// Log every X update steps; a float in `[0, 1)` is a ratio of total training steps.
    pub logging_steps: f64,
    /// Log the first `global_step`.
    pub logging_first_step: bool,
    /// The evaluation strategy to use.
    pub eval_strategy: IntervalStrategy,
    /// Run an evaluation every X steps; falls back to `logging_steps` when unset.
    pub eval_steps: Option<f64>,
    /// Number of epochs or steps to wait before the first evaluation.
    pub eval_delay: f64,
    /// The checkpoint save strategy to use.
    pub save_strategy: SaveStrategy,
    /// Save a checkpoint every X update steps; a float in `[0, 1)` is a ratio.
    pub save_steps: f64,
    /// Load the best checkpoint found during training at the end of training.
    pub load_best_model_at_end: bool,
    /// The metric used to compare models.
    pub metric_for_best_model: Option<String>,
    /// Whether `metric_for_best_model` should be maximized.
    pub greater_is_better: Option<bool>,
    /// Random seed set at the beginning of training.
    pub seed: u64,
}

impl Default for TrainingArguments {
    fn default() -> Self {
        Self {
            output_dir: None,
            num_train_epochs: 3.0,
            max_steps: -1,
            logging_strategy: IntervalStrategy::Steps,
            logging_steps: 500.0,
            logging_first_step: false,
            eval_strategy: IntervalStrategy::No,
            eval_steps: None,
            eval_delay: 0.0,
            save_strategy: SaveStrategy::Steps,
            save_steps: 500.0,
            load_best_model_at_end: false,
            metric_for_best_model: None,
            greater_is_better: None,
            seed: 42,
        }
    }
}

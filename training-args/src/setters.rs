//! Upstream's grouped `set_*` builders (`set_training`, `set_evaluate`, `set_testing`,
//! `set_save`, `set_logging`, `set_push_to_hub`, `set_optimizer`, `set_lr_scheduler`,
//! `set_dataloader`). Python keyword arguments become a parameter struct whose `Default` holds
//! upstream's keyword defaults; as upstream, every parameter not given is reset to that default.
//!
//! ```
//! use tchtrain_training_args::{SetTraining, TrainingArguments};
//!
//! let args = TrainingArguments::new("working_dir")
//!     .set_training(SetTraining { learning_rate: 1e-4, batch_size: 32, ..Default::default() });
//! assert_eq!(args.learning_rate, 1e-4);
//! assert!(args.do_train);
//! ```

use crate::error::{Error, Result};
use crate::optimizer_names::OptimizerNames;
use crate::trainer_utils::{HubStrategy, IntervalStrategy, SaveStrategy, SchedulerType};
use crate::training_args::TrainingArguments;

/// Parameters of [`TrainingArguments::set_training`] (defaults: upstream's keyword defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct SetTraining {
    /// `learning_rate` (5e-5).
    pub learning_rate: f64,
    /// `per_device_train_batch_size` (8).
    pub batch_size: usize,
    /// `weight_decay` (0).
    pub weight_decay: f64,
    /// `num_train_epochs` (3).
    pub num_epochs: f64,
    /// `max_steps` (-1).
    pub max_steps: i64,
    /// `gradient_accumulation_steps` (1).
    pub gradient_accumulation_steps: usize,
    /// `seed` (42).
    pub seed: u64,
    /// `activation_checkpointing` (false).
    pub activation_checkpointing: bool,
    /// Deprecated alias of `activation_checkpointing`; overrides it when set.
    pub gradient_checkpointing: Option<bool>,
}

impl Default for SetTraining {
    fn default() -> Self {
        Self {
            learning_rate: 5e-5,
            batch_size: 8,
            weight_decay: 0.0,
            num_epochs: 3.0,
            max_steps: -1,
            gradient_accumulation_steps: 1,
            seed: 42,
            activation_checkpointing: false,
            gradient_checkpointing: None,
        }
    }
}

/// Parameters of [`TrainingArguments::set_evaluate`].
#[derive(Debug, Clone, PartialEq)]
pub struct SetEvaluate {
    /// `eval_strategy` ("no").
    pub strategy: IntervalStrategy,
    /// `eval_steps` (500).
    pub steps: f64,
    /// `per_device_eval_batch_size` (8).
    pub batch_size: usize,
    /// `eval_accumulation_steps` (None).
    pub accumulation_steps: Option<usize>,
    /// `eval_delay` (None, stored as 0).
    pub delay: Option<f64>,
    /// `prediction_loss_only` (false).
    pub loss_only: bool,
}

impl Default for SetEvaluate {
    fn default() -> Self {
        Self {
            strategy: IntervalStrategy::No,
            steps: 500.0,
            batch_size: 8,
            accumulation_steps: None,
            delay: None,
            loss_only: false,
        }
    }
}

/// Parameters of [`TrainingArguments::set_testing`].
#[derive(Debug, Clone, PartialEq)]
pub struct SetTesting {
    /// `per_device_eval_batch_size` (8).
    pub batch_size: usize,
    /// `prediction_loss_only` (false).
    pub loss_only: bool,
}

impl Default for SetTesting {
    fn default() -> Self {
        Self {
            batch_size: 8,
            loss_only: false,
        }
    }
}

/// Parameters of [`TrainingArguments::set_save`].
#[derive(Debug, Clone, PartialEq)]
pub struct SetSave {
    /// `save_strategy` ("steps").
    pub strategy: SaveStrategy,
    /// `save_steps` (500).
    pub steps: f64,
    /// `save_total_limit` (None).
    pub total_limit: Option<i64>,
    /// `save_on_each_node` (false).
    pub on_each_node: bool,
}

impl Default for SetSave {
    fn default() -> Self {
        Self {
            strategy: SaveStrategy::Steps,
            steps: 500.0,
            total_limit: None,
            on_each_node: false,
        }
    }
}

/// Parameters of [`TrainingArguments::set_logging`] (note upstream's `nan_inf_filter` and
/// `on_each_node` keyword defaults are `False`, unlike the fields' defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct SetLogging {
    /// `logging_strategy` ("steps").
    pub strategy: IntervalStrategy,
    /// `logging_steps` (500).
    pub steps: f64,
    /// `report_to` ("none", i.e. empty).
    pub report_to: Vec<String>,
    /// `log_level` ("passive").
    pub level: String,
    /// `logging_first_step` (false).
    pub first_step: bool,
    /// `logging_nan_inf_filter` (false).
    pub nan_inf_filter: bool,
    /// `log_on_each_node` (false).
    pub on_each_node: bool,
    /// `log_level_replica` ("passive").
    pub replica_level: String,
}

impl Default for SetLogging {
    fn default() -> Self {
        Self {
            strategy: IntervalStrategy::Steps,
            steps: 500.0,
            report_to: Vec::new(),
            level: "passive".to_string(),
            first_step: false,
            nan_inf_filter: false,
            on_each_node: false,
            replica_level: "passive".to_string(),
        }
    }
}

/// Parameters of [`TrainingArguments::set_push_to_hub`] (`model_id` is required upstream).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SetPushToHub {
    /// `hub_model_id`.
    pub model_id: String,
    /// `hub_strategy` ("every_save").
    pub strategy: HubStrategy,
    /// `hub_token` (None).
    pub token: Option<String>,
    /// `hub_private_repo` (None).
    pub private_repo: Option<bool>,
    /// `hub_always_push` (false).
    pub always_push: bool,
    /// `hub_revision` (None).
    pub revision: Option<String>,
}

/// Parameters of [`TrainingArguments::set_optimizer`] (upstream's keyword default for `name`
/// is `"adamw_torch"`, not the field's `"adamw_torch_fused"`).
#[derive(Debug, Clone, PartialEq)]
pub struct SetOptimizer {
    /// `optim` ("adamw_torch").
    pub name: OptimizerNames,
    /// `learning_rate` (5e-5).
    pub learning_rate: f64,
    /// `weight_decay` (0).
    pub weight_decay: f64,
    /// `adam_beta1` (0.9).
    pub beta1: f64,
    /// `adam_beta2` (0.999).
    pub beta2: f64,
    /// `adam_epsilon` (1e-8).
    pub epsilon: f64,
    /// `optim_args` (None).
    pub args: Option<String>,
}

impl Default for SetOptimizer {
    fn default() -> Self {
        Self {
            name: OptimizerNames::AdamwTorch,
            learning_rate: 5e-5,
            weight_decay: 0.0,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
            args: None,
        }
    }
}

/// Parameters of [`TrainingArguments::set_lr_scheduler`].
#[derive(Debug, Clone, PartialEq)]
pub struct SetLrScheduler {
    /// `lr_scheduler_type` ("linear").
    pub name: SchedulerType,
    /// `num_train_epochs` (3.0).
    pub num_epochs: f64,
    /// `max_steps` (-1).
    pub max_steps: i64,
    /// `warmup_steps` (0; a value in [0, 1) is a ratio).
    pub warmup_steps: f64,
}

impl Default for SetLrScheduler {
    fn default() -> Self {
        Self {
            name: SchedulerType::Linear,
            num_epochs: 3.0,
            max_steps: -1,
            warmup_steps: 0.0,
        }
    }
}

/// Parameters of [`TrainingArguments::set_dataloader`].
#[derive(Debug, Clone, PartialEq)]
pub struct SetDataloader {
    /// `per_device_train_batch_size` (8).
    pub train_batch_size: usize,
    /// `per_device_eval_batch_size` (8).
    pub eval_batch_size: usize,
    /// `dataloader_drop_last` (false).
    pub drop_last: bool,
    /// `dataloader_num_workers` (0).
    pub num_workers: usize,
    /// `dataloader_pin_memory` (true).
    pub pin_memory: bool,
    /// `dataloader_persistent_workers` (false).
    pub persistent_workers: bool,
    /// `dataloader_prefetch_factor` (None).
    pub prefetch_factor: Option<usize>,
    /// `dataloader_multiprocessing_context` (None).
    pub multiprocessing_context: Option<String>,
    /// `dataloader_in_order` (true).
    pub in_order: bool,
    /// `auto_find_batch_size` (false).
    pub auto_find_batch_size: bool,
    /// `ignore_data_skip` (false).
    pub ignore_data_skip: bool,
    /// `data_seed` (None).
    pub sampler_seed: Option<u64>,
}

impl Default for SetDataloader {
    fn default() -> Self {
        Self {
            train_batch_size: 8,
            eval_batch_size: 8,
            drop_last: false,
            num_workers: 0,
            pin_memory: true,
            persistent_workers: false,
            prefetch_factor: None,
            multiprocessing_context: None,
            in_order: true,
            auto_find_batch_size: false,
            ignore_data_skip: false,
            sampler_seed: None,
        }
    }
}

/// Upstream's "Setting `strategy` as 'steps' requires a positive value for `steps`."
fn steps_required(field: &'static str, strategy_is_steps: bool, steps: f64) -> Result<()> {
    if strategy_is_steps && steps == 0.0 {
        return Err(Error::Requires {
            field,
            value: "\"steps\"".to_string(),
            requirement: "a positive value for `steps`".to_string(),
            fix: "pass a non-zero `steps`".to_string(),
        });
    }
    Ok(())
}

impl TrainingArguments {
    /// Upstream `set_training`: the basic training arguments; sets `do_train`.
    pub fn set_training(mut self, p: SetTraining) -> Self {
        self.do_train = true;
        self.learning_rate = p.learning_rate;
        self.per_device_train_batch_size = p.batch_size;
        self.weight_decay = p.weight_decay;
        self.num_train_epochs = p.num_epochs;
        self.max_steps = p.max_steps;
        self.gradient_accumulation_steps = p.gradient_accumulation_steps;
        self.seed = p.seed;
        let on = p
            .gradient_checkpointing
            .unwrap_or(p.activation_checkpointing);
        self.activation_checkpointing = on;
        self.gradient_checkpointing = on;
        self
    }

    /// Upstream `set_evaluate`: the evaluation arguments; sets `do_eval` unless the strategy is "no".
    pub fn set_evaluate(mut self, p: SetEvaluate) -> Result<Self> {
        steps_required(
            "eval_strategy",
            p.strategy == IntervalStrategy::Steps,
            p.steps,
        )?;
        self.eval_strategy = p.strategy;
        self.do_eval = p.strategy != IntervalStrategy::No;
        self.eval_steps = Some(p.steps);
        self.per_device_eval_batch_size = p.batch_size;
        self.eval_accumulation_steps = p.accumulation_steps;
        self.eval_delay = p.delay.unwrap_or(0.0);
        self.prediction_loss_only = p.loss_only;
        Ok(self)
    }

    /// Upstream `set_testing`: prediction on a held-out set; sets `do_predict`.
    pub fn set_testing(mut self, p: SetTesting) -> Self {
        self.do_predict = true;
        self.per_device_eval_batch_size = p.batch_size;
        self.prediction_loss_only = p.loss_only;
        self
    }

    /// Upstream `set_save`: the checkpoint-saving arguments.
    pub fn set_save(mut self, p: SetSave) -> Result<Self> {
        steps_required("save_strategy", p.strategy == SaveStrategy::Steps, p.steps)?;
        self.save_strategy = p.strategy;
        self.save_steps = p.steps;
        self.save_total_limit = p.total_limit;
        self.save_on_each_node = p.on_each_node;
        Ok(self)
    }

    /// Upstream `set_logging`: the logging arguments.
    pub fn set_logging(mut self, p: SetLogging) -> Result<Self> {
        steps_required(
            "logging_strategy",
            p.strategy == IntervalStrategy::Steps,
            p.steps,
        )?;
        self.logging_strategy = p.strategy;
        self.logging_steps = p.steps;
        self.report_to = p.report_to.into_iter().filter(|r| r != "none").collect();
        self.log_level = p.level;
        self.logging_first_step = p.first_step;
        self.logging_nan_inf_filter = p.nan_inf_filter;
        self.log_on_each_node = p.on_each_node;
        self.log_level_replica = p.replica_level;
        Ok(self)
    }

    /// Upstream `set_push_to_hub`: the Hub arguments; sets `push_to_hub`.
    pub fn set_push_to_hub(mut self, p: SetPushToHub) -> Self {
        self.push_to_hub = true;
        self.hub_model_id = Some(p.model_id);
        self.hub_strategy = p.strategy;
        self.hub_token = p.token;
        self.hub_private_repo = p.private_repo;
        self.hub_always_push = p.always_push;
        self.hub_revision = p.revision;
        self
    }

    /// Upstream `set_optimizer`: the optimizer and its hyperparameters.
    pub fn set_optimizer(mut self, p: SetOptimizer) -> Self {
        self.optim = p.name;
        self.learning_rate = p.learning_rate;
        self.weight_decay = p.weight_decay;
        self.adam_beta1 = p.beta1;
        self.adam_beta2 = p.beta2;
        self.adam_epsilon = p.epsilon;
        self.optim_args = p.args;
        self
    }

    /// Upstream `set_lr_scheduler`: the scheduler and the training length it depends on.
    pub fn set_lr_scheduler(mut self, p: SetLrScheduler) -> Self {
        self.lr_scheduler_type = p.name;
        self.num_train_epochs = p.num_epochs;
        self.max_steps = p.max_steps;
        self.warmup_steps = p.warmup_steps;
        self
    }

    /// Upstream `set_dataloader`: the dataloader arguments.
    pub fn set_dataloader(mut self, p: SetDataloader) -> Self {
        self.per_device_train_batch_size = p.train_batch_size;
        self.per_device_eval_batch_size = p.eval_batch_size;
        self.dataloader_drop_last = p.drop_last;
        self.dataloader_num_workers = p.num_workers;
        self.dataloader_pin_memory = p.pin_memory;
        self.dataloader_persistent_workers = p.persistent_workers;
        self.dataloader_prefetch_factor = p.prefetch_factor;
        self.dataloader_multiprocessing_context = p.multiprocessing_context;
        self.dataloader_in_order = p.in_order;
        self.auto_find_batch_size = p.auto_find_batch_size;
        self.ignore_data_skip = p.ignore_data_skip;
        self.data_seed = p.sampler_seed;
        self
    }
}

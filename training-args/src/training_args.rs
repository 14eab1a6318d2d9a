//! `TrainingArguments`: the fields of upstream `training_args.py` (transformers 5.23), their
//! defaults, and the small derived helpers (`get_warmup_steps`, `mixed_precision`).
//!
//! The checks of `__post_init__` live in `post_init.rs`, JSON in `json.rs`, the command line in
//! `cli.rs`, the `set_*` builders in `setters.rs`, and the process/world helpers in `distributed.rs`.

use serde::{Deserialize, Serialize};

use crate::debug_utils::DebugOption;
use crate::optimizer_names::OptimizerNames;
use crate::trainer_utils::{HubStrategy, IntervalStrategy, SaveStrategy, SchedulerType};
use crate::values::{AcceleratorConfig, DictOrPath, JsonDict, StrOrBool, StrOrList};

/// The arguments of a training run: every field of upstream's `TrainingArguments` (5.23), in
/// upstream's order, with upstream's names.
///
/// [`Default`] equals upstream's `TrainingArguments()` *after* `__post_init__` (so
/// `output_dir` is `"trainer_output"`, `report_to` is empty, `accelerator_config` is filled in).
/// Values built by hand should go through [`TrainingArguments::post_init`], which applies
/// upstream's derivations and checks; the JSON and command-line readers do so themselves.
///
/// Field types are upstream's post-`__post_init__` types: union-typed inputs (`report_to` as a
/// string, `debug` as a space-separated string, `include_num_input_tokens_seen` as a bool, dict
/// fields as JSON strings) are normalised when reading JSON or the command line.
///
/// ```
/// use tchtrain_training_args::{IntervalStrategy, TrainingArguments};
///
/// let mut args = TrainingArguments::new("out");
/// args.eval_strategy = IntervalStrategy::Steps;
/// args.logging_steps = 50.0;
/// args.post_init().unwrap();
/// assert_eq!(args.eval_steps, Some(50.0)); // falls back to logging_steps
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainingArguments {
    /// The output directory where the model predictions and checkpoints will be written.
    pub output_dir: Option<String>,
    /// The batch size per device for training.
    pub per_device_train_batch_size: usize,
    /// Total number of training epochs to perform.
    pub num_train_epochs: f64,
    /// Overrides `num_train_epochs`. If set to a positive number, the total number of training
    /// steps to perform. Must be set when the training dataset does not implement `__len__` (e.g. a
    /// streaming dataset).
    pub max_steps: i64,
    /// The initial learning rate for the optimizer.
    pub learning_rate: f64,
    /// The learning rate scheduler type to use. See `SchedulerType` for all possible values.
    pub lr_scheduler_type: SchedulerType,
    /// The extra arguments for the lr_scheduler. See the documentation of each scheduler for
    /// possible values.
    pub lr_scheduler_kwargs: Option<JsonDict>,
    /// Number of steps for a linear warmup from 0 to `learning_rate`. Can be an integer (exact
    /// steps) or a float in [0, 1) (ratio of total steps).
    #[serde(serialize_with = "crate::json::ser_steps")]
    pub warmup_steps: f64,
    /// The optimizer to use. See `OptimizerNames` for the complete list.
    pub optim: OptimizerNames,
    /// Optional arguments supplied to optimizers such as AnyPrecisionAdamW, AdEMAMix, and GaLore.
    pub optim_args: Option<String>,
    /// Weight decay coefficient applied by the optimizer. Automatically excluded from bias and
    /// LayerNorm parameters.
    pub weight_decay: f64,
    /// The exponential decay rate for the first moment estimates (momentum) in Adam-based
    /// optimizers.
    pub adam_beta1: f64,
    /// The exponential decay rate for the second moment estimates (variance) in Adam-based
    /// optimizers.
    pub adam_beta2: f64,
    /// Epsilon value for numerical stability in Adam-based optimizers.
    pub adam_epsilon: f64,
    /// The target modules to optimize. Currently used for the GaLore and APOLLO algorithms.
    pub optim_target_modules: Option<StrOrList>,
    /// Number of update steps to accumulate gradients before performing a backward/update pass.
    /// Effective batch size = per_device_train_batch_size * num_devices *
    /// gradient_accumulation_steps.
    pub gradient_accumulation_steps: usize,
    /// Whether or not to average tokens across devices. If enabled, will use all_reduce to
    /// synchronize num_tokens_in_batch for precise loss calculation. Reference:
    /// https://github.com/huggingface/transformers/issues/34242
    pub average_tokens_across_devices: bool,
    /// Maximum gradient norm for gradient clipping. Set to 0 to disable.
    pub max_grad_norm: f64,
    /// Label smoothing factor to prevent overconfidence. Zero means no smoothing.
    pub label_smoothing_factor: f64,
    /// Enable bfloat16 (BF16) mixed precision training. Generally preferred over FP16 due to better
    /// numerical stability.
    pub bf16: bool,
    /// Enable float16 (FP16) mixed precision training. Consider using BF16 instead if your hardware
    /// supports it.
    pub fp16: bool,
    /// Use full BF16 precision for evaluation (not just mixed precision). Faster and saves memory.
    pub bf16_full_eval: bool,
    /// Use full FP16 precision for evaluation (not just mixed precision). Faster and saves memory.
    pub fp16_full_eval: bool,
    /// Enable TF32 mode on Ampere and newer GPUs. Provides up to 8x speedup with negligible
    /// accuracy loss.
    pub tf32: Option<bool>,
    /// Enable activation checkpointing to trade compute for memory. Reduces memory at the cost of
    /// ~20% slower training.
    pub activation_checkpointing: bool,
    /// Keyword arguments passed to `activation_checkpointing_enable()`. `every_n_layers`
    /// checkpoints only every n-th decoder layer instead of all of them; `1` is the usual all-or-
    /// nothing behavior, and larger values give some memory back to speed. `offload` holds the
    /// saved activations in pinned host memory, which frees device memory and makes the step
    /// slower. Any other key is forwarded to `torch.utils.checkpoint.checkpoint`.
    pub activation_checkpointing_kwargs: Option<JsonDict>,
    /// Deprecated alias of `activation_checkpointing`, will be removed in v6.
    pub gradient_checkpointing: bool,
    /// Deprecated alias of `activation_checkpointing_kwargs`, will be removed in v6.
    pub gradient_checkpointing_kwargs: Option<JsonDict>,
    /// Compile the model using `torch.compile()` for faster training.
    pub torch_compile: bool,
    /// Backend for `torch.compile()`. If set, automatically enables `torch_compile`.
    pub torch_compile_backend: Option<String>,
    /// Compilation mode for `torch.compile()`. If set, automatically enables `torch_compile`.
    pub torch_compile_mode: Option<String>,
    /// Enable Liger Kernel optimizations. Increases throughput by ~20% and reduces memory by ~60%.
    pub use_liger_kernel: bool,
    /// Configuration for Liger Kernel. Passed as kwargs to `_apply_liger_kernel_to_instance()`. If
    /// None, uses default configuration.
    pub liger_kernel_config: Option<JsonDict>,
    /// Whether or not to use cache for the model For training, this is usually not needed apart
    /// from some PEFT methods that uses `past_key_values`.
    pub use_cache: bool,
    /// If not None, activates NEFTune noise embeddings. Can drastically improve performance for
    /// instruction fine-tuning. Typical range: [5.0, 15.0].
    pub neftune_noise_alpha: Option<f64>,
    /// Number of steps to wait before calling `torch.<device>.empty_cache()`. Helps avoid CUDA OOM
    /// at a cost of ~10% slower performance. If None, cache will not be emptied.
    pub torch_empty_cache_steps: Option<i64>,
    /// Whether to find a training batch size that will fit into memory automatically through
    /// exponential decay, avoiding CUDA Out-of-Memory errors. The evaluation batch size is not
    /// adjusted.
    pub auto_find_batch_size: bool,
    /// The logging strategy to adopt during training. Options: 'no', 'epoch', 'steps'.
    pub logging_strategy: IntervalStrategy,
    /// Log every X updates steps. Should be an integer or a float in range `[0,1)`. If smaller than
    /// 1, will be interpreted as ratio of total training steps.
    #[serde(serialize_with = "crate::json::ser_steps")]
    pub logging_steps: f64,
    /// Whether to log the first `global_step` or not.
    pub logging_first_step: bool,
    /// When doing a multinode distributed training, whether to log once per node or just once on
    /// the main node.
    pub log_on_each_node: bool,
    /// Filter out NaN and Inf training and evaluation losses when logging. Does not affect gradient
    /// computation, only logging.
    pub logging_nan_inf_filter: bool,
    /// Whether to track the number of input tokens seen. Must be one of [`all`, `non_padding`,
    /// `no`] or a boolean value which map to `all` or `no`
    pub include_num_input_tokens_seen: String,
    /// Logging level for the main process. Options: 'debug', 'info', 'warning', 'error',
    /// 'critical', 'passive'.
    pub log_level: String,
    /// Logging level for replica processes in distributed training. Same options as `log_level`.
    pub log_level_replica: String,
    /// Disable tqdm progress bars. Defaults to True if log_level is warning or lower.
    pub disable_tqdm: bool,
    /// The list of integrations to report the results and logs to. Use 'all' for all installed
    /// integrations, 'none' for no integrations.
    pub report_to: Vec<String>,
    /// An optional descriptor for the run. Notably used for trackio, wandb, mlflow comet and
    /// swanlab logging.
    pub run_name: Option<String>,
    /// The name of the project to use for logging. Currently, only used by Trackio.
    pub project: String,
    /// Hugging Face Space id for live Gradio-based Trackio logging (read/write Bucket access). Use
    /// 'username/reponame', 'orgname/reponame', or 'reponame' (current user's namespace). None: log
    /// only locally, no Space. Prefer trackio_static_space_id for stable post-training dashboard
    /// links. Public unless hub_private_repo=True or org default.
    pub trackio_space_id: Option<String>,
    /// Optional HF Bucket id when using a Trackio Space; if unset, Trackio picks a default.
    pub trackio_bucket_id: Option<String>,
    /// Static read-only Trackio Space over the Bucket (stable model-card links). False: no static
    /// sync on Hub push and no freeze after training. None/str: allow static Space; for local-only
    /// logging, Hub push runs sync(static); after training, freeze runs only if trackio_space_id
    /// was set (Gradio Space). str sets explicit static Space id. Public unless
    /// hub_private_repo=True or org default.
    pub trackio_static_space_id: Option<StrOrBool>,
    /// When to run evaluation. Options: 'no', 'steps', 'epoch'.
    pub eval_strategy: IntervalStrategy,
    /// Number of update steps between evaluations if `eval_strategy='steps'`. Defaults to
    /// `logging_steps` if not set. Should be an integer or a float in range `[0,1)`. If smaller
    /// than 1, will be interpreted as ratio of total training steps.
    #[serde(serialize_with = "crate::json::ser_opt_steps")]
    pub eval_steps: Option<f64>,
    /// Number of epochs or steps to wait for before the first evaluation can be performed,
    /// depending on the eval_strategy.
    #[serde(serialize_with = "crate::json::ser_steps")]
    pub eval_delay: f64,
    /// The batch size per device (GPU/TPU core/CPU) for evaluation.
    pub per_device_eval_batch_size: usize,
    /// When performing evaluation and generating predictions, only returns the loss.
    pub prediction_loss_only: bool,
    /// Whether to run through the entire `evaluation` step at the very beginning of training as a
    /// sanity check.
    pub eval_on_start: bool,
    /// Whether to recursively concat inputs/losses/labels/predictions across batches. If `False`,
    /// will instead store them as lists, with each batch kept separate.
    pub eval_do_concat_batches: bool,
    /// Whether to run recursively gather object in a nested list/tuple/dictionary of objects from
    /// all devices.
    pub eval_use_gather_object: bool,
    /// Number of predictions steps to accumulate the output tensors for, before moving the results
    /// to the CPU. If unset, predictions are accumulated on the accelerator before being moved to
    /// the CPU.
    pub eval_accumulation_steps: Option<usize>,
    /// Include additional data in the `compute_metrics` function. Options: 'inputs', 'loss'.
    pub include_for_metrics: Vec<String>,
    /// Break eval metrics calculation into batches to save memory.
    pub batch_eval_metrics: bool,
    /// Save only model weights, not optimizer/scheduler/RNG state. Prevents resuming training from
    /// checkpoint.
    pub save_only_model: bool,
    /// The checkpoint save strategy to adopt during training. Options: 'no', 'epoch', 'steps',
    /// 'best'.
    pub save_strategy: SaveStrategy,
    /// Save checkpoint every X updates steps. Should be an integer or a float in range `[0,1)`. If
    /// smaller than 1, will be interpreted as ratio of total training steps.
    #[serde(serialize_with = "crate::json::ser_steps")]
    pub save_steps: f64,
    /// When doing multi-node distributed training, whether to save models and checkpoints on each
    /// node, or only on the main one
    pub save_on_each_node: bool,
    /// Maximum number of checkpoints to keep. Deletes older checkpoints in `output_dir`. The best
    /// checkpoint is always retained when `load_best_model_at_end=True`.
    pub save_total_limit: Option<i64>,
    /// Enable JIT checkpointing on SIGTERM signal for graceful termination on preemptible
    /// workloads. Configure your orchestrator's graceful shutdown period accordingly.
    pub enable_jit_checkpoint: bool,
    /// Whether or not to push the model to the Hub every time the model is saved.
    pub push_to_hub: bool,
    /// The token to use to push the model to the Hub. Defaults to the token from `hf auth login`.
    #[serde(
        serialize_with = "crate::json::ser_token",
        deserialize_with = "crate::json::de_token"
    )]
    pub hub_token: Option<String>,
    /// Whether to make the repo private. If `None` (default), the repo will be public unless the
    /// organization's default is private. This value is ignored if the repo already exists. If
    /// reporting to Trackio Spaces created or synced (including on Hub push when `trackio_space_id`
    /// is None) use the same logic for whether the Space is private.
    pub hub_private_repo: Option<bool>,
    /// The name of the repository to keep in sync with the local `output_dir`.
    pub hub_model_id: Option<String>,
    /// Defines what and when to push to Hub. Options: 'end', 'every_save', 'checkpoint',
    /// 'all_checkpoints'.
    pub hub_strategy: HubStrategy,
    /// Unless `True`, the Trainer will skip pushes if the previous one wasn't finished yet.
    pub hub_always_push: bool,
    /// The revision to use when pushing to the Hub. Can be a branch name, a tag, or a commit hash.
    pub hub_revision: Option<String>,
    /// Load the best checkpoint at the end of training. Requires `eval_strategy` to be set.
    pub load_best_model_at_end: bool,
    /// Metric to use for comparing models when `load_best_model_at_end=True`. Defaults to 'loss'.
    pub metric_for_best_model: Option<String>,
    /// Whether higher metric values are better. Defaults based on `metric_for_best_model`.
    pub greater_is_better: Option<bool>,
    /// When resuming training, skip fast-forwarding through the dataset to reach the previous
    /// state. If True, training starts from the beginning of the dataset.
    pub ignore_data_skip: bool,
    /// Whether to restore the callback states from the checkpoint. If `True`, will override
    /// callbacks passed to the `Trainer` if they exist in the checkpoint.
    pub restore_callback_states_from_checkpoint: bool,
    /// Whether to call enable_full_determinism instead of set_seed for reproducibility in
    /// distributed training. Important: this will negatively impact the performance, so only use it
    /// for debugging.
    pub full_determinism: bool,
    /// Random seed that will be set at the beginning of training.
    pub seed: u64,
    /// Random seed to be used with data samplers. If not set, uses the same seed as `seed`.
    pub data_seed: Option<u64>,
    /// Whether or not to use cpu. If set to False, we will use the available torch device/backend.
    pub use_cpu: bool,
    /// Configuration for the internal Accelerate integration. Can be a path to a JSON config file
    /// or a dict.
    pub accelerator_config: AcceleratorConfig,
    /// Parallelism configuration for the training run. Requires Accelerate `1.10.1`.
    pub parallelism_config: Option<serde_json::Value>,
    /// Drop the last incomplete batch if it is not divisible by the batch size.
    pub dataloader_drop_last: bool,
    /// Number of subprocesses to use for data loading (PyTorch only). 0 means that the data will be
    /// loaded in the main process.
    pub dataloader_num_workers: usize,
    /// Whether or not to pin memory for DataLoader.
    pub dataloader_pin_memory: bool,
    /// If True, the data loader will not shut down the worker processes after a dataset has been
    /// consumed once. This allows to maintain the workers Dataset instances alive. Can potentially
    /// speed up training, but will increase RAM usage.
    pub dataloader_persistent_workers: bool,
    /// Number of batches loaded in advance by each worker. 2 means there will be a total of 2 *
    /// num_workers batches prefetched across all workers.
    pub dataloader_prefetch_factor: Option<usize>,
    /// The multiprocessing start method to use for data loading workers ('fork', 'spawn', or
    /// 'forkserver'). Defaults to PyTorch's default, except on MPS with dataloader_num_workers > 1,
    /// where it defaults to 'fork'. Use 'spawn' when streaming from sources whose objects are not
    /// fork-safe (e.g. HDFS via pyarrow). Under 'spawn', any custom collate_fn / dataset code must
    /// be importable at module level (no lambdas/closures).
    pub dataloader_multiprocessing_context: Option<String>,
    /// If True (default), the data loader yields batches in the order workers were dispatched. Set
    /// to False to yield batches as soon as they are ready, reducing tail latency for
    /// IterableDataset streaming workloads. Requires PyTorch >= 2.6.
    pub dataloader_in_order: bool,
    /// Whether or not to automatically remove the columns unused by the model forward method.
    pub remove_unused_columns: bool,
    /// The list of keys in your dictionary of inputs that correspond to the labels.
    pub label_names: Option<Vec<String>>,
    /// Sampler for training: 'random' (default), 'sequential', 'group_by_length', or
    /// 'batch_rebalance'.
    pub train_sampling_strategy: String,
    /// Column name for precomputed lengths. Ignored unless `train_sampling_strategy` is
    /// 'group_by_length' or 'batch_rebalance'.
    pub length_column_name: String,
    /// When using distributed training, the value of the flag `find_unused_parameters` passed to
    /// `DistributedDataParallel`.
    pub ddp_find_unused_parameters: Option<bool>,
    /// When using distributed training, the value of the flag `bucket_cap_mb` passed to
    /// `DistributedDataParallel`.
    pub ddp_bucket_cap_mb: Option<i64>,
    /// When using distributed training, the value of the flag `broadcast_buffers` passed to
    /// `DistributedDataParallel`.
    pub ddp_broadcast_buffers: Option<bool>,
    /// When using distributed training, the value of the flag `static_graph` passed to
    /// `DistributedDataParallel`.
    pub ddp_static_graph: Option<bool>,
    /// The backend to use for distributed training. Must be one of 'nccl', 'mpi', 'xccl', 'gloo',
    /// 'hccl'.
    pub ddp_backend: Option<String>,
    /// The timeout for `torch.distributed.init_process_group` calls (in seconds).
    pub ddp_timeout: i64,
    /// Enable PyTorch Fully Sharded Data Parallel (FSDP) for distributed training. Pass `--fsdp`
    /// (or `fsdp=True`) to turn FSDP on.
    pub fsdp: Option<StrOrBool>,
    /// Tuning for FSDP (used only when `fsdp` is enabled). Either a path to a JSON config file
    /// (e.g., `fsdp_config.json`) or an already loaded dict.
    pub fsdp_config: Option<DictOrPath>,
    /// Enable DeepSpeed integration. Value is a path to a JSON config file or a dict.
    pub deepspeed: Option<DictOrPath>,
    /// Enable one or more debug features. Options: 'underflow_overflow' (detect overflow in model
    /// I/O), 'tpu_metrics_debug' (print TPU metrics).
    pub debug: Vec<DebugOption>,
    /// Whether to skip adding memory profiler reports to metrics. Skipped by default because it
    /// slows down training.
    pub skip_memory_metrics: bool,
    /// Whether to run training. Not directly used by Trainer; intended for training/evaluation
    /// scripts.
    pub do_train: bool,
    /// Whether to run evaluation. Not directly used by Trainer; intended for training/evaluation
    /// scripts.
    pub do_eval: bool,
    /// Whether to run predictions on the test set. Not directly used by Trainer; intended for
    /// training/evaluation scripts.
    pub do_predict: bool,
    /// Path to a folder with a valid checkpoint for your model. Not directly used by Trainer;
    /// intended for training/evaluation scripts.
    pub resume_from_checkpoint: Option<String>,
    /// When using torch.distributed.launch (Deprecated), it will pass `local_rank` in the script,
    /// so we need this for the parser. To get the local rank, prefer using the property
    /// `local_process_index`
    pub local_rank: i64,
}

impl Default for TrainingArguments {
    fn default() -> Self {
        Self {
            output_dir: Some("trainer_output".to_string()),
            per_device_train_batch_size: 8,
            num_train_epochs: 3.0,
            max_steps: -1,
            learning_rate: 5e-5,
            lr_scheduler_type: SchedulerType::Linear,
            lr_scheduler_kwargs: None,
            warmup_steps: 0.0,
            optim: OptimizerNames::AdamwTorchFused,
            optim_args: None,
            weight_decay: 0.0,
            adam_beta1: 0.9,
            adam_beta2: 0.999,
            adam_epsilon: 1e-8,
            optim_target_modules: None,
            gradient_accumulation_steps: 1,
            average_tokens_across_devices: true,
            max_grad_norm: 1.0,
            label_smoothing_factor: 0.0,
            bf16: false,
            fp16: false,
            bf16_full_eval: false,
            fp16_full_eval: false,
            tf32: None,
            activation_checkpointing: false,
            activation_checkpointing_kwargs: None,
            gradient_checkpointing: false,
            gradient_checkpointing_kwargs: None,
            torch_compile: false,
            torch_compile_backend: None,
            torch_compile_mode: None,
            use_liger_kernel: false,
            liger_kernel_config: None,
            use_cache: false,
            neftune_noise_alpha: None,
            torch_empty_cache_steps: None,
            auto_find_batch_size: false,
            logging_strategy: IntervalStrategy::Steps,
            logging_steps: 500.0,
            logging_first_step: false,
            log_on_each_node: true,
            logging_nan_inf_filter: true,
            include_num_input_tokens_seen: "no".to_string(),
            log_level: "passive".to_string(),
            log_level_replica: "warning".to_string(),
            disable_tqdm: false,
            report_to: Vec::new(),
            run_name: None,
            project: "huggingface".to_string(),
            trackio_space_id: None,
            trackio_bucket_id: None,
            trackio_static_space_id: None,
            eval_strategy: IntervalStrategy::No,
            eval_steps: None,
            eval_delay: 0.0,
            per_device_eval_batch_size: 8,
            prediction_loss_only: false,
            eval_on_start: false,
            eval_do_concat_batches: true,
            eval_use_gather_object: false,
            eval_accumulation_steps: None,
            include_for_metrics: Vec::new(),
            batch_eval_metrics: false,
            save_only_model: false,
            save_strategy: SaveStrategy::Steps,
            save_steps: 500.0,
            save_on_each_node: false,
            save_total_limit: None,
            enable_jit_checkpoint: false,
            push_to_hub: false,
            hub_token: None,
            hub_private_repo: None,
            hub_model_id: None,
            hub_strategy: HubStrategy::EverySave,
            hub_always_push: false,
            hub_revision: None,
            load_best_model_at_end: false,
            metric_for_best_model: None,
            greater_is_better: None,
            ignore_data_skip: false,
            restore_callback_states_from_checkpoint: false,
            full_determinism: false,
            seed: 42,
            data_seed: None,
            use_cpu: false,
            accelerator_config: AcceleratorConfig::default(),
            parallelism_config: None,
            dataloader_drop_last: false,
            dataloader_num_workers: 0,
            dataloader_pin_memory: true,
            dataloader_persistent_workers: false,
            dataloader_prefetch_factor: None,
            dataloader_multiprocessing_context: None,
            dataloader_in_order: true,
            remove_unused_columns: true,
            label_names: None,
            train_sampling_strategy: "random".to_string(),
            length_column_name: "length".to_string(),
            ddp_find_unused_parameters: None,
            ddp_bucket_cap_mb: None,
            ddp_broadcast_buffers: None,
            ddp_static_graph: None,
            ddp_backend: None,
            ddp_timeout: 1800,
            fsdp: None,
            fsdp_config: None,
            deepspeed: None,
            debug: Vec::new(),
            skip_memory_metrics: true,
            do_train: false,
            do_eval: false,
            do_predict: false,
            resume_from_checkpoint: None,
            local_rank: -1,
        }
    }
}

impl TrainingArguments {
    /// Upstream's `TrainingArguments(output_dir)`: the defaults with `output_dir` set.
    pub fn new(output_dir: impl Into<String>) -> Self {
        Self {
            output_dir: Some(output_dir.into()),
            ..Self::default()
        }
    }

    /// The output directory (`"trainer_output"` when unset, as upstream's `__post_init__` does).
    pub fn output_dir(&self) -> &str {
        self.output_dir.as_deref().unwrap_or("trainer_output")
    }

    /// Number of steps of the linear warmup: upstream `get_warmup_steps`.
    ///
    /// `warmup_steps >= 1` is a step count (truncated to an integer, as upstream's `int()`);
    /// a value in `[0, 1)` is a ratio of `num_training_steps`, rounded up.
    pub fn get_warmup_steps(&self, num_training_steps: usize) -> usize {
        if self.warmup_steps >= 1.0 {
            self.warmup_steps as usize
        } else {
            (num_training_steps as f64 * self.warmup_steps)
                .ceil()
                .max(0.0) as usize
        }
    }

    /// Upstream's non-field `mixed_precision`: `"fp16"`, `"bf16"`, or else the
    /// `ACCELERATE_MIXED_PRECISION` environment variable (default `"no"`).
    pub fn mixed_precision(&self) -> String {
        if self.fp16 {
            "fp16".to_string()
        } else if self.bf16 {
            "bf16".to_string()
        } else {
            std::env::var("ACCELERATE_MIXED_PRECISION").unwrap_or_else(|_| "no".to_string())
        }
    }

    /// The seed of the data samplers: `data_seed`, or `seed` when unset.
    pub fn sampler_seed(&self) -> u64 {
        self.data_seed.unwrap_or(self.seed)
    }

    /// `ddp_timeout` as a `Duration` (upstream `ddp_timeout_delta`); negative values give zero.
    pub fn ddp_timeout_delta(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.ddp_timeout.max(0) as u64)
    }
}

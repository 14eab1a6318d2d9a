//! What this Trainer does with each `TrainingArguments` field: one row per field of
//! upstream's table ([`tchtrain_training_args::field_names`]), in its order. A field is
//!
//! - **honoured**: it does what upstream does; the row names the tests that see its effect;
//! - **inert**: accepted, and no value of it changes a number or a file here (each row says
//!   why, e.g. a knob of worker processes this loader does not have, or a setting only the Hub
//!   upload reads); a non-default value is said once in the log at build;
//! - **partly honoured**: some values honoured, the others refused (the row says which);
//! - **refused**: any value but upstream's default is an [`Error::InvalidArgument`] naming
//!   the field, why, and what to use instead, when the Trainer is built.
//!
//! Nothing is accepted and ignored. `trainer/tests/it/fields.rs` walks every field with a
//! non-default value, and the field table in docs/fields.md is rendered from these rows
//! ([`markdown_table`]).

use serde_json::Value;
use tch::Device;
use tchtrain_training_args::{AcceleratorConfig, TrainingArguments};

use crate::error::{Error, Result};

/// How the Trainer treats one field (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// Does what upstream does; the tests that observe it.
    Honoured(&'static [&'static str]),
    /// Accepted; no value changes a result here, for the reason given.
    Inert(&'static str),
    /// The values honoured (seen by the tests named) and those refused, as described.
    Partly(&'static [&'static str], &'static str),
    /// Only upstream's default is accepted: why, and what to use instead.
    Refused(&'static str),
}

/// One row of [`FIELD_SUPPORT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldSupport {
    /// The `TrainingArguments` field.
    pub field: &'static str,
    /// What the Trainer does with it.
    pub support: Support,
}

const fn h(field: &'static str, tests: &'static [&'static str]) -> FieldSupport {
    FieldSupport {
        field,
        support: Support::Honoured(tests),
    }
}
const fn inert(field: &'static str, why: &'static str) -> FieldSupport {
    FieldSupport {
        field,
        support: Support::Inert(why),
    }
}
const fn partly(
    field: &'static str,
    tests: &'static [&'static str],
    which: &'static str,
) -> FieldSupport {
    FieldSupport {
        field,
        support: Support::Partly(tests, which),
    }
}
const fn refused(field: &'static str, why: &'static str) -> FieldSupport {
    FieldSupport {
        field,
        support: Support::Refused(why),
    }
}

/// Every `TrainingArguments` field and what the Trainer does with it, in upstream's order.
pub static FIELD_SUPPORT: &[FieldSupport] = &[
    h("output_dir", &["checkpoints_rotate_and_resume_exactly"]),
    h(
        "per_device_train_batch_size",
        &["tiny_gpt2_gradient_accumulation_4_cosine_warmup_random_sampler"],
    ),
    h(
        "num_train_epochs",
        &["prefetching_workers_give_the_same_run"],
    ),
    h(
        "max_steps",
        &["resume_with_dropout_restores_the_generator_at_an_epoch_boundary"],
    ),
    h(
        "learning_rate",
        &["two_nodes_of_two_ranks_equal_one_process_with_four_times_the_batch"],
    ),
    h(
        "lr_scheduler_type",
        &["tiny_gpt2_gradient_accumulation_4_cosine_warmup_random_sampler"],
    ),
    h(
        "lr_scheduler_kwargs",
        &["every_scheduler_matches_transformers_at_every_step"],
    ),
    h(
        "warmup_steps",
        &["tiny_gpt2_gradient_accumulation_4_cosine_warmup_random_sampler"],
    ),
    partly(
        "optim",
        &[
            "every_optimizer_matches_torch_for_50_steps",
            "package_optimizers_match_their_packages_for_50_steps",
            "every_working_optim_resumes_exactly_through_the_trainer",
        ],
        "37 of upstream's 41 names, each equal to its package (the optim table in docs/optimizers.md); the other 4 are refused when the optimizer is created, with the reason and the name to use instead",
    ),
    h(
        "optim_args",
        &["optim_args_and_factory_follow_trainer_optimizer"],
    ),
    h("weight_decay", &["tiny_llama_with_weight_decay"]),
    h("adam_beta1", &["adam_hyperparameters_reach_the_optimizer"]),
    h("adam_beta2", &["adam_hyperparameters_reach_the_optimizer"]),
    h(
        "adam_epsilon",
        &["adam_hyperparameters_reach_the_optimizer"],
    ),
    h(
        "optim_target_modules",
        &[
            "galore_and_apollo_match_their_packages_for_50_steps",
            "low_rank_optimizers_refuse_missing_or_unmatched_target_modules_as_upstream",
        ],
    ),
    h(
        "gradient_accumulation_steps",
        &["tiny_gpt2_gradient_accumulation_4_cosine_warmup_random_sampler"],
    ),
    h(
        "average_tokens_across_devices",
        &["two_nodes_of_two_ranks_equal_one_process_with_four_times_the_batch"],
    ),
    h("max_grad_norm", &["clip_grad_norm_nonfinite_and_disabled"]),
    h("label_smoothing_factor", &["tiny_gpt2_label_smoothing"]),
    h("bf16", &["tiny_gpt2_bf16_autocast_on_cpu"]),
    h(
        "fp16",
        &["tiny_gpt2_fp16_with_loss_scaling_holds_the_scheduler_on_skipped_steps"],
    ),
    h(
        "bf16_full_eval",
        &["bf16_and_fp16_full_eval_cast_the_model_as_upstream"],
    ),
    h(
        "fp16_full_eval",
        &["bf16_and_fp16_full_eval_cast_the_model_as_upstream"],
    ),
    h("tf32", &["tf32_and_full_determinism_set_the_backends"]),
    h(
        "activation_checkpointing",
        &["activation_checkpointing_trains_as_the_plain_run"],
    ),
    h(
        "activation_checkpointing_kwargs",
        &[
            "activation_checkpointing_trains_as_the_plain_run",
            "checkpointing_settings_are_read_from_the_trainer_kwargs",
        ],
    ),
    h(
        "gradient_checkpointing",
        &[
            "activation_checkpointing_trains_as_the_plain_run",
            "v4_aliases_are_accepted_with_warnings",
        ],
    ),
    h(
        "gradient_checkpointing_kwargs",
        &["activation_checkpointing_trains_as_the_plain_run"],
    ),
    refused(
        "torch_compile",
        "torch.compile (TorchDynamo and its backends) is Python-only: libtorch has no graph compiler to run the model through; remove --torch_compile (and --torch_compile_backend / --torch_compile_mode)",
    ),
    refused(
        "torch_compile_backend",
        "torch.compile is Python-only (no TorchDynamo in libtorch); remove --torch_compile_backend",
    ),
    refused(
        "torch_compile_mode",
        "torch.compile is Python-only (no TorchDynamo in libtorch); remove --torch_compile_mode",
    ),
    partly(
        "use_liger_kernel",
        &[
            "liger_fused_linear_cross_entropy_equals_the_plain_loss",
            "tiny_llama_with_liger_fused_linear_cross_entropy",
        ],
        "Liger's fused linear + cross-entropy for Llama (the loss chunk by chunk, no logits in training); Liger's RoPE / RMSNorm / SwiGLU kernels compute the functions the model already computes; a model type Liger has no kernels for is left as it is (as upstream)",
    ),
    h(
        "liger_kernel_config",
        &[
            "tiny_llama_with_liger_fused_linear_cross_entropy",
            "options_follow_liger",
        ],
    ),
    h("use_cache", &["use_cache_is_written_into_the_saved_config"]),
    h("neftune_noise_alpha", &["tiny_llama_with_neftune"]),
    partly(
        "torch_empty_cache_steps",
        &["tf32_and_full_determinism_set_the_backends"],
        "on CUDA the caching allocator is emptied every N steps, as upstream; on the CPU upstream's `clear_device_cache` only runs Python's garbage collector, which Rust has no need of",
    ),
    h(
        "auto_find_batch_size",
        &["auto_find_batch_size_lowers_the_batch_after_an_allocation_failure"],
    ),
    h(
        "logging_strategy",
        &["default_flow_decisions_match_upstream_for_the_whole_grid"],
    ),
    h("logging_steps", &["parity_with_upstream_random_sampler"]),
    h(
        "logging_first_step",
        &["default_flow_decisions_match_upstream_for_the_whole_grid"],
    ),
    h("log_on_each_node", &["process_log_levels_follow_upstream"]),
    h(
        "logging_nan_inf_filter",
        &["non_finite_loss_stops_with_a_checkpoint_of_the_last_good_state"],
    ),
    h(
        "include_num_input_tokens_seen",
        &["two_nodes_of_two_ranks_equal_one_process_with_four_times_the_batch"],
    ),
    h(
        "log_level",
        &["warnings_reach_stderr_at_the_asked_log_level"],
    ),
    h("log_level_replica", &["process_log_levels_follow_upstream"]),
    h("disable_tqdm", &["run_clm_fine_tunes_tiny_gpt2_on_hamlet"]),
    partly(
        "report_to",
        &[
            "report_to_selects_loggers",
            "mlflow_callback_logs_what_upstream_logs_to_a_real_server",
            "wandb_callback_writes_what_upstream_writes",
            "trackio_callback_writes_what_upstream_writes",
            "dvclive_callback_writes_what_upstream_writes",
            "comet_callback_writes_what_upstream_writes",
            "swanlab_callback_writes_what_upstream_writes",
            "clearml_callback_writes_what_upstream_writes",
            "codecarbon_callback_writes_what_upstream_writes",
            "kubeflow_callback_sends_what_upstream_sends",
        ],
        "`comet_ml` (Comet's offline archive that `comet upload` sends; online mode, resuming and assets refused), `dvclive` (its files outside a DVC repository; experiments, Studio and model artifacts refused; not in `all`), `mlflow` (to a tracking server over HTTP), `tensorboard`, `wandb` (online, to the server in `WANDB_BASE_URL` as the run goes, or offline runs that `wandb sync` uploads; `WANDB_LOG_MODEL`'s model artifacts either way), `codecarbon` (codecarbon 3.3's `emissions.csv` row in `output_dir`, from its CPU-load and RAM estimates and its carbon-intensity tables; its API, Prometheus, Logfire and HTTP outputs, Electricity Maps, and machines whose RAPL counters or GPUs it would read refused), `trackio` (trackio's local store; Spaces and Buckets refused), `swanlab` (the offline run folder that `swanlab sync` uploads; cloud and local modes refused), `clearml` (the offline session that clearml's `Task.import_offline_session` uploads; online mode refused, `CLEARML_LOG_MODEL` refused when checkpoints are saved: clearml cannot store models offline), `kubeflow` (progress to the Kubeflow Trainer controller over HTTP(S)) and `jsonl`; the other integrations upstream knows (neptune, dagshub, ...) are refused by name, each with its reason",
    ),
    h(
        "run_name",
        &["mlflow_callback_resumes_nests_and_ends_runs_as_upstream"],
    ),
    h("project", &["trackio_callback_writes_what_upstream_writes"]),
    partly(
        "trackio_space_id",
        &["trackio_refuses_the_hub_and_foreign_databases_with_the_reason"],
        "None (trackio's local store) only: with `report_to` trackio a Space is refused (logging to the Hub is not implemented); without trackio upstream reads it nowhere",
    ),
    partly(
        "trackio_bucket_id",
        &["trackio_refuses_the_hub_and_foreign_databases_with_the_reason"],
        "None only: with `report_to` trackio a Bucket is refused; without trackio upstream reads it nowhere",
    ),
    partly(
        "trackio_static_space_id",
        &["trackio_refuses_the_hub_and_foreign_databases_with_the_reason"],
        "read by upstream's Trackio logger when pushing to the Hub (it syncs the project to a static Space) and after a Space run (freeze): with `report_to` trackio and `push_to_hub`, anything but False is refused; with the local store nothing is frozen, as upstream",
    ),
    h(
        "eval_strategy",
        &["tiny_gpt2_gradient_accumulation_4_cosine_warmup_random_sampler"],
    ),
    h("eval_steps", &["tiny_llama_with_weight_decay"]),
    h(
        "eval_delay",
        &["default_flow_decisions_match_upstream_for_the_whole_grid"],
    ),
    h(
        "per_device_eval_batch_size",
        &["minilm_sequence_classification"],
    ),
    h(
        "prediction_loss_only",
        &["prediction_loss_only_and_drop_last_shape_the_loops"],
    ),
    h(
        "eval_on_start",
        &["zero3_layer_by_layer_on_llama_equals_ddp"],
    ),
    h(
        "eval_do_concat_batches",
        &[
            "eval_do_concat_batches_false_keeps_one_tensor_per_batch",
            "unconcatenated_batches_are_gathered_step_by_step",
        ],
    ),
    partly(
        "eval_use_gather_object",
        &["accelerator_config_and_gather_object_across_processes"],
        "one process: predictions are not gathered, so nothing differs (as upstream); gathering Python objects across processes is refused",
    ),
    inert(
        "eval_accumulation_steps",
        "moves predictions to the CPU every N steps upstream to free device memory: here each batch's outputs go to the CPU as they come, which changes no value",
    ),
    h(
        "include_for_metrics",
        &["include_for_metrics_hands_inputs_and_losses_to_compute_metrics"],
    ),
    h(
        "batch_eval_metrics",
        &["evaluate_prefixes_compute_metrics_and_preprocesses_logits"],
    ),
    h(
        "save_only_model",
        &["a_conflicting_deepspeed_config_fails_before_training_with_upstreams_message"],
    ),
    h(
        "save_strategy",
        &["trainer_level_hooks_override_upstreams_methods"],
    ),
    h("save_steps", &["checkpoints_rotate_and_resume_exactly"]),
    h("save_on_each_node", &["process_log_levels_follow_upstream"]),
    h(
        "save_total_limit",
        &["checkpoints_rotate_and_resume_exactly"],
    ),
    h(
        "enable_jit_checkpoint",
        &["sigterm_saves_a_checkpoint_at_the_step_boundary_and_exits_0"],
    ),
    h(
        "push_to_hub",
        &[
            "push_to_hub_commits_as_each_hub_strategy",
            "a_failed_push_leaves_training_and_local_files_intact",
        ],
    ),
    h("hub_token", &["push_to_hub_commits_as_each_hub_strategy"]),
    h(
        "hub_private_repo",
        &["push_to_hub_commits_as_each_hub_strategy"],
    ),
    h(
        "hub_model_id",
        &["push_to_hub_commits_as_each_hub_strategy"],
    ),
    h(
        "hub_strategy",
        &["push_to_hub_commits_as_each_hub_strategy"],
    ),
    inert(
        "hub_always_push",
        "pushes run synchronously here (upstream's checkpoint pushes run in the background), so no push is ever in progress to skip or wait for",
    ),
    h(
        "hub_revision",
        &["push_to_hub_commits_as_each_hub_strategy"],
    ),
    h(
        "load_best_model_at_end",
        &["rotation_keeps_best_and_newest_and_reloads_best_lower_is_better"],
    ),
    h(
        "metric_for_best_model",
        &["rotation_keeps_best_and_newest_and_reloads_best_lower_is_better"],
    ),
    h(
        "greater_is_better",
        &["early_stopping_decisions_match_upstream"],
    ),
    h(
        "ignore_data_skip",
        &["ignore_data_skip_starts_the_epoch_over"],
    ),
    h(
        "restore_callback_states_from_checkpoint",
        &["callback_states_are_restored_only_when_asked"],
    ),
    h(
        "full_determinism",
        &["tf32_and_full_determinism_set_the_backends"],
    ),
    h(
        "seed",
        &["resume_with_dropout_restores_the_generator_at_an_epoch_boundary"],
    ),
    h(
        "data_seed",
        &["data_seed_orders_the_data_and_seed_the_model"],
    ),
    h("use_cpu", &["run_clm_fine_tunes_tiny_gpt2_on_hamlet"]),
    partly(
        "accelerator_config",
        &[
            "accelerator_config_and_gather_object_across_processes",
            "every_field_is_honoured_inert_or_refused",
        ],
        "the defaults, and `non_blocking` (host-to-device copies only, no number changes); in one process `split_batches`, `dispatch_batches` and `even_batches` change nothing, as upstream; across processes each non-default value is refused, as are `use_seedable_sampler: false`, `use_configured_state` and `gradient_accumulation_kwargs`",
    ),
    refused(
        "parallelism_config",
        "accelerate's ParallelismConfig (tensor / context / sequence parallel meshes) is a Python object with no JSON form; use --fsdp or --deepspeed for sharding",
    ),
    h(
        "dataloader_drop_last",
        &["prediction_loss_only_and_drop_last_shape_the_loops"],
    ),
    h(
        "dataloader_num_workers",
        &["prefetching_workers_give_the_same_run"],
    ),
    inert(
        "dataloader_pin_memory",
        "on CUDA each batch is copied to page-locked memory before it goes to the device (asynchronously with `accelerator_config.non_blocking`), as torch's `DataLoader(pin_memory=True)` feeds upstream's loop; on the CPU pinning does nothing (upstream warns and skips it); no number changes",
    ),
    inert(
        "dataloader_persistent_workers",
        "the loader's worker is a thread started per epoch; keeping worker processes alive between epochs only saves their start-up",
    ),
    h(
        "dataloader_prefetch_factor",
        &["prefetching_workers_give_the_same_run"],
    ),
    inert(
        "dataloader_multiprocessing_context",
        "the loader's workers are threads, so no process start method (fork / spawn / forkserver) applies",
    ),
    inert(
        "dataloader_in_order",
        "`false` lets workers deliver batches out of order; the loader's worker thread delivers them in order, which `false` allows",
    ),
    inert(
        "remove_unused_columns",
        "the model takes its inputs from the batch by name (`input_ids`, `attention_mask`, `labels`, ...), so other columns never reach its forward, and every column the collator builds stays in the batch the hooks see: the two upstream values give the same run here",
    ),
    h("label_names", &["label_names_name_the_label_columns"]),
    partly(
        "train_sampling_strategy",
        &["trainer_level_hooks_override_upstreams_methods"],
        "`random`, `sequential` and `group_by_length`; other values are refused when the training data loader is built",
    ),
    inert(
        "length_column_name",
        "rows here have no free columns: `group_by_length` measures `input_ids`, which is what upstream does when the dataset lacks the column",
    ),
    h(
        "ddp_find_unused_parameters",
        &["unused_parameters_count_as_zeros_with_find_unused_parameters"],
    ),
    h(
        "ddp_bucket_cap_mb",
        &["two_nodes_of_two_ranks_equal_one_process_with_four_times_the_batch"],
    ),
    inert(
        "ddp_broadcast_buffers",
        "no model here has a buffer training changes (no batch norm): every rank's buffers are equal from the start",
    ),
    inert(
        "ddp_static_graph",
        "an optimisation of torch's DDP reducer for graphs that never change (the first iteration's all-reduce delayed, unused parameters recorded once instead of searched for); the reducer here runs without it, with the same gradients",
    ),
    h("ddp_backend", &["backend_defaults_and_refusals"]),
    h(
        "ddp_timeout",
        &["a_dead_rank_makes_the_other_fail_within_ddp_timeout"],
    ),
    partly(
        "fsdp",
        &["zero_and_fsdp_runs_equal_ddp_with_sharded_memory"],
        "`full_shard`, `shard_grad_op`, `no_shard`, `offload`, `auto_wrap`; hybrid sharding and XLA are refused",
    ),
    partly(
        "fsdp_config",
        &["typed_plugin_and_trainer_checks"],
        "the keys of the FSDP table in docs/fields.md; the others are refused",
    ),
    partly(
        "deepspeed",
        &["a_conflicting_deepspeed_config_fails_before_training_with_upstreams_message"],
        "the keys of the DeepSpeed table in docs/fields.md; the others are refused",
    ),
    partly(
        "debug",
        &[
            "debug_underflow_overflow_stops_training_at_the_first_inf",
            "debug_underflow_overflow_reports_as_upstream_gpt2",
            "debug_underflow_overflow_reports_as_upstream_llama",
            "debug_underflow_overflow_reports_as_upstream_bert",
        ],
        "`underflow_overflow`: upstream's DebugUnderflowOverflow report and error; `tpu_metrics_debug` is refused (it prints XLA's metrics report, and this build has no TPU)",
    ),
    partly(
        "skip_memory_metrics",
        &["memory_metrics_are_reported_as_upstream"],
        "`false`: upstream's `{init,train,eval,test}_mem_cpu_{alloc,peaked}_delta` and `before_init_mem_cpu` from the process's resident memory, and where CUDA is available `*_mem_gpu_*` and `before_init_mem_gpu` from the CUDA caching allocator's counters (`memory_allocated`, `max_memory_allocated`; compiled, and checked only by `cargo xtask test --gpu`)",
    ),
    h("do_train", &["run_ner_matches_upstream_trainer"]),
    h("do_eval", &["run_ner_matches_upstream_trainer"]),
    h("do_predict", &["run_ner_matches_upstream_trainer"]),
    h(
        "resume_from_checkpoint",
        &["a_user_model_learns_and_resumes_exactly"],
    ),
    h("local_rank", &["nccl_without_its_device_is_a_typed_error"]),
];

/// The row of `field`, if it is a `TrainingArguments` field.
pub fn field_support(field: &str) -> Option<&'static FieldSupport> {
    FIELD_SUPPORT.iter().find(|r| r.field == field)
}

const DS_PERF: &str = "tunes DeepSpeed's communication buckets, overlap or memory reuse; no value changes a number (the engine here gathers whole shards, and with `overlap_comm` reduces stages 1 and 2 in `reduce_bucket_size` buckets during the backward)";
const DS_HALF: &[&str] = &[
    "deepspeed_fp16_and_bf16_train_as_deepspeeds_engine",
    "loss_scaler_trajectories_equal_deepspeeds",
];
const DS_OWN_LOGS: &str = "DeepSpeed's own console output; the Trainer logs as usual";
const DS_SECTIONS: &[&str] = &["the_config_optimizer_and_scheduler_replace_the_trainers"];
const DS_SCHEDULES: &[&str] = &[
    "deepspeed_schedules_equal_deepspeeds_own_at_every_step",
    "the_config_optimizer_and_scheduler_replace_the_trainers",
];
const DS_FILLED: &[&str] =
    &["a_conflicting_deepspeed_config_fails_before_training_with_upstreams_message"];
const DS_OFFLOAD: &[&str] = &[
    "offload_the_engine_lacks_is_refused_naming_the_key",
    "the_documentation_examples_train_on_two_ranks_with_the_optimizer_offloaded",
];

/// The DeepSpeed config keys (dotted; `.*` covers a section's keys) and what the Trainer
/// does with each; any other key is refused by name when training starts.
pub static DEEPSPEED_KEY_SUPPORT: &[FieldSupport] = &[
    h("train_batch_size", DS_FILLED),
    h("train_micro_batch_size_per_gpu", DS_FILLED),
    h("gradient_accumulation_steps", DS_FILLED),
    h("gradient_clipping", DS_FILLED),
    h("fp16.enabled", DS_HALF),
    partly(
        "fp16.auto_cast",
        DS_HALF,
        "casts the model's floating-point inputs to float16; the models here take token ids (integers), which DeepSpeed leaves as they are",
    ),
    h("fp16.loss_scale", DS_HALF),
    h("fp16.loss_scale_window", DS_HALF),
    h("fp16.initial_scale_power", DS_HALF),
    h("fp16.hysteresis", DS_HALF),
    h("fp16.consecutive_hysteresis", DS_HALF),
    h("fp16.min_loss_scale", DS_HALF),
    partly(
        "fp16.fp16_master_weights_and_grads",
        DS_HALF,
        "`false`; `true` (fp16 masters, with DeepSpeed's CPU Adam only) is refused",
    ),
    h("bf16.enabled", DS_HALF),
    h("bf16.check_grad_overflow", DS_HALF),
    inert(
        "bf16.immediate_grad_update",
        "read by DeepSpeed's BF16_Optimizer (ZeRO stage 0) only; its ZeRO-1/2/3 optimizers, the ones that run here, do not read it",
    ),
    partly(
        "bf16.bf16_master_weights_and_grads",
        DS_HALF,
        "`false`; bf16 masters are refused (the masters here are fp32)",
    ),
    partly(
        "bf16.bf16_optimizer_states",
        DS_HALF,
        "`false`; bf16 optimizer states are refused",
    ),
    partly(
        "data_types.grad_accum_dtype",
        &["grad_accum_dtype_as_deepspeeds_engine_reads_it"],
        "as DeepSpeed's engine reads it: any dtype under ZeRO (its ZeRO optimizers do not read it), the model's own without ZeRO; bf16 with `\"fp32\"` at stage 1 without optimizer offload (DeepSpeed's BF16_Optimizer) is refused",
    ),
    h(
        "communication_data_type",
        &[
            "deepspeed_fp16_and_bf16_train_as_deepspeeds_engine",
            "communication_data_type_as_deepspeed_parses_it",
        ],
    ),
    partly(
        "optimizer.type",
        DS_SECTIONS,
        "`Adam` and `AdamW` (torch's update over one group of every parameter, as upstream hands DeepSpeed `model.parameters()`); other DeepSpeed optimizers are refused",
    ),
    partly(
        "optimizer.params.*",
        DS_SECTIONS,
        "`lr`, `betas`, `eps`, `weight_decay`, `adam_w_mode`, `torch_adam`; `bias_correction: false`, `amsgrad: true` and other keys are refused",
    ),
    partly(
        "scheduler.type",
        DS_SCHEDULES,
        "`WarmupLR`, `WarmupDecayLR`, `WarmupCosineLR`, equal to DeepSpeed's own; `OneCycle` and `LRRangeTest` are refused",
    ),
    h("scheduler.params.*", DS_SCHEDULES),
    h(
        "zero_optimization.stage",
        &["zero_and_fsdp_runs_equal_ddp_with_sharded_memory"],
    ),
    h(
        "zero_optimization.cpu_offload",
        &["deprecated_offload_keys_map_as_deepspeeds"],
    ),
    h(
        "zero_optimization.cpu_offload_param",
        &["deprecated_offload_keys_map_as_deepspeeds"],
    ),
    inert(
        "zero_optimization.cpu_offload_use_pin_memory",
        "deprecated: DeepSpeed warns and reads nothing from it (use the `pin_memory` of offload_optimizer / offload_param)",
    ),
    partly(
        "zero_optimization.offload_optimizer.device",
        DS_OFFLOAD,
        "`cpu` and `none`; `nvme` is refused",
    ),
    partly(
        "zero_optimization.offload_param.device",
        DS_OFFLOAD,
        "`cpu` and `none` (stage 3); `nvme` is refused",
    ),
    inert(
        "zero_optimization.offload_optimizer.pin_memory",
        "page-locks the offloaded buffers for faster copies to a GPU; no number changes",
    ),
    inert(
        "zero_optimization.offload_param.pin_memory",
        "page-locks the offloaded buffers for faster copies to a GPU; no number changes",
    ),
    inert(
        "zero_optimization.offload_optimizer.*",
        "NVMe / partial-offload tuning (`nvme_path`, `buffer_count`, `ratio`, ...): NVMe offload is refused and the rest tunes transfers",
    ),
    inert(
        "zero_optimization.offload_param.*",
        "NVMe offload tuning (`nvme_path`, `buffer_count`, `buffer_size`, `max_in_cpu`): NVMe offload is refused",
    ),
    inert("zero_optimization.allgather_partitions", DS_PERF),
    inert("zero_optimization.allgather_bucket_size", DS_PERF),
    h(
        "zero_optimization.overlap_comm",
        &["zero_and_fsdp_runs_equal_ddp_with_sharded_memory"],
    ),
    inert("zero_optimization.reduce_scatter", DS_PERF),
    h(
        "zero_optimization.reduce_bucket_size",
        &[
            "zero_and_fsdp_runs_equal_ddp_with_sharded_memory",
            "deepspeed_fp16_and_bf16_train_as_deepspeeds_engine",
        ],
    ),
    inert("zero_optimization.contiguous_gradients", DS_PERF),
    inert("zero_optimization.sub_group_size", DS_PERF),
    inert("zero_optimization.round_robin_gradients", DS_PERF),
    inert("zero_optimization.stage3_prefetch_bucket_size", DS_PERF),
    inert(
        "zero_optimization.stage3_param_persistence_threshold",
        DS_PERF,
    ),
    inert("zero_optimization.stage3_max_live_parameters", DS_PERF),
    inert("zero_optimization.stage3_max_reuse_distance", DS_PERF),
    inert(
        "zero_optimization.ignore_unused_parameters",
        "an unused parameter's gradient is reduced as zeros here, so a run with unused parameters works with either value",
    ),
    inert(
        "zero_optimization.load_from_fp32_weights",
        "the masters are fp32 and so are the weights here: either source gives the same values",
    ),
    inert(
        "zero_optimization.elastic_checkpoint",
        "checkpoints here are read by the world size that wrote them",
    ),
    partly(
        "zero_optimization.stage3_gather_16bit_weights_on_model_save",
        &["zero3_on_four_ranks_equals_ddp_with_a_quarter_of_the_memory"],
        "`true`: the model is gathered into `model.safetensors` on save; `false` (DeepSpeed then saves only its shards) is refused",
    ),
    partly(
        "zero_optimization.stage3_gather_fp16_weights_on_model_save",
        &["zero3_on_four_ranks_equals_ddp_with_a_quarter_of_the_memory"],
        "the old name of `stage3_gather_16bit_weights_on_model_save`, the same values",
    ),
    h("checkpoint.use_node_local_storage", DS_FILLED),
    inert(
        "zero_allow_untested_optimizer",
        "DeepSpeed's guard around client optimizers; the Trainer's optimizers run under ZeRO here",
    ),
    inert(
        "zero_force_ds_cpu_optimizer",
        "DeepSpeed's guard requiring its CPU Adam with offload; the offloaded optimizer here is torch's, on the CPU",
    ),
    inert("steps_per_print", DS_OWN_LOGS),
    inert("wall_clock_breakdown", DS_OWN_LOGS),
    inert("dump_state", DS_OWN_LOGS),
];

const FSDP_WRAP: &[&str] = &[
    "zero_and_fsdp_runs_equal_ddp_with_sharded_memory",
    "typed_plugin_and_trainer_checks",
];
const FSDP_OVERLAP: &str = "only orders or overlaps the gathers on a GPU; the engine here gathers each unit before its forward and backward, and no number changes";

/// The `fsdp_config` keys (upstream's `fsdp_config`, the `fsdp_` prefix stripped) and what
/// the Trainer does with each; any other key is refused by name when training starts.
pub static FSDP_KEY_SUPPORT: &[FieldSupport] = &[
    h("version", FSDP_WRAP),
    h("min_num_params", FSDP_WRAP),
    h("transformer_layer_cls_to_wrap", FSDP_WRAP),
    h("auto_wrap_policy", FSDP_WRAP),
    h("cpu_offload", FSDP_WRAP),
    h("reshard_after_forward", FSDP_WRAP),
    h("state_dict_type", FSDP_WRAP),
    inert(
        "cpu_ram_efficient_loading",
        "every rank reads the same checkpoint itself; rank 0 reading it and broadcasting gives the same weights",
    ),
    inert(
        "sync_module_states",
        "every rank builds the model from the same checkpoint and seed, so rank 0's weights are everyone's already",
    ),
    inert("forward_prefetch", FSDP_OVERLAP),
    inert("backward_prefetch", FSDP_OVERLAP),
    inert("limit_all_gathers", FSDP_OVERLAP),
    inert(
        "use_orig_params",
        "the optimizer here always sees the original parameters (in their decay / no-decay groups)",
    ),
    h(
        "activation_checkpointing",
        &["activation_checkpointing_trains_as_the_plain_run"],
    ),
    partly(
        "mixed_precision",
        &["fsdp_mixed_precision_key_follows_the_flag"],
        "upstream's Trainer does not read it (--bf16 / --fp16 decide): a value naming the flag's dtype is accepted with a log line saying so, one that contradicts the flag is refused",
    ),
    refused(
        "mixed_precision_policy",
        "transformers' Trainer does not pass this key to accelerate: FSDP's policy comes from --bf16 / --fp16 (parameters, gradient reduction and outputs all in that dtype, float32 shards); pass the flag and remove the key",
    ),
    refused(
        "xla",
        "XLA (TPU) FSDP is not available: libtorch here runs on the CPU or CUDA; remove it",
    ),
    refused("xla_fsdp_v2", "XLA (TPU) FSDP is not available; remove it"),
    refused(
        "xla_fsdp_grad_ckpt",
        "XLA (TPU) FSDP is not available; remove it",
    ),
    refused(
        "xla_fsdp_settings",
        "XLA (TPU) FSDP is not available; remove it",
    ),
];

/// Applies [`FSDP_KEY_SUPPORT`] to a normalised `fsdp_config`: an unknown key or a refused
/// key set to a true value is an [`Error::InvalidArgument`] of `fsdp_config` naming it;
/// inert keys are logged once.
pub fn check_fsdp_keys(config: &serde_json::Map<String, Value>) -> Result<()> {
    for (key, value) in config {
        let Some(row) = FSDP_KEY_SUPPORT.iter().find(|r| r.field == key) else {
            return Err(Error::InvalidArgument {
                field: "fsdp_config",
                detail: format!(
                    "`{key}`: not an FSDP setting this build implements (see the FSDP table in docs/fields.md); remove it"
                ),
            });
        };
        match row.support {
            Support::Refused(why) if truthy(value) => {
                return Err(Error::InvalidArgument {
                    field: "fsdp_config",
                    detail: format!("`{key}`: {why}"),
                });
            }
            Support::Inert(why) => {
                log::info!("fsdp_config `{key}`={value}: accepted, changes nothing here: {why}")
            }
            _ => {}
        }
    }
    Ok(())
}

/// The `fsdp_config` key `mixed_precision` (written by some guides, e.g. `"bf16"`), which
/// upstream's Trainer does not read: the run's precision is `--bf16` / `--fp16`
/// (`args.mixed_precision()`). A value naming that precision is accepted with a log line
/// saying the flag decides; another is refused, naming both.
pub fn check_fsdp_mixed_precision(
    config: &serde_json::Map<String, Value>,
    args: &TrainingArguments,
) -> Result<()> {
    let Some(value) = config.get("mixed_precision") else {
        return Ok(());
    };
    let named = match value {
        Value::String(s) => s.to_lowercase(),
        Value::Bool(false) | Value::Null => "no".into(),
        other => other.to_string(),
    };
    let named = match named.as_str() {
        "bfloat16" => "bf16".to_string(),
        "float16" | "half" => "fp16".to_string(),
        "fp32" | "float32" | "none" => "no".to_string(),
        _ => named,
    };
    let flag = args.mixed_precision();
    if named == flag {
        log::info!(
            "fsdp_config `mixed_precision`={value}: upstream's Trainer does not read this key; the run's precision comes from --bf16 / --fp16 (here {flag}), which it agrees with"
        );
        return Ok(());
    }
    Err(Error::InvalidArgument {
        field: "fsdp_config",
        detail: format!(
            "`mixed_precision`={value} contradicts the run's precision `{flag}` (--bf16 / --fp16): upstream's Trainer does not read this key and would train in `{flag}`; pass the flag you mean (--bf16 for \"bf16\") or remove the key"
        ),
    })
}

/// Python's truth value of a JSON value, with upstream's `str_to_bool` for strings.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !matches!(
            s.to_lowercase().as_str(),
            "" | "n" | "no" | "f" | "false" | "off" | "0"
        ),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// Whether the dotted `key` matches `pattern` (exactly, or under a `.*` section).
fn key_matches(pattern: &str, key: &str) -> bool {
    match pattern.strip_suffix(".*") {
        Some(prefix) => key
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('.')),
        None => pattern == key,
    }
}

/// Every leaf of `config` as `(dotted key, value)`; objects are walked, anything else is a leaf.
fn leaves<'a>(
    prefix: &str,
    config: &'a serde_json::Map<String, Value>,
    out: &mut Vec<(String, &'a Value)>,
) {
    for (k, v) in config {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            Value::Object(inner) if !inner.is_empty() => leaves(&key, inner, out),
            _ => out.push((key, v)),
        }
    }
}

/// The row of a DeepSpeed key: an exact row before a `.*` one.
pub fn deepspeed_key_support(key: &str) -> Option<&'static FieldSupport> {
    let rows = DEEPSPEED_KEY_SUPPORT;
    rows.iter()
        .find(|r| r.field == key)
        .or_else(|| rows.iter().find(|r| key_matches(r.field, key)))
}

/// Applies [`DEEPSPEED_KEY_SUPPORT`] to a processed DeepSpeed config: an unknown key or a
/// refused value is an [`Error::InvalidArgument`] of `deepspeed` naming the key; inert keys
/// are logged once. (The values of the `fp16` / `bf16` sections are checked where they are
/// read, `HfTrainerDeepSpeedConfig::zero_mixed_precision`.)
pub fn check_deepspeed_keys(config: &serde_json::Map<String, Value>) -> Result<()> {
    let refuse = |key: &str, why: &str| {
        Err(Error::InvalidArgument {
            field: "deepspeed",
            detail: format!("`{key}`: {why}"),
        })
    };
    let mut all = Vec::new();
    leaves("", config, &mut all);
    for (key, value) in all {
        let Some(row) = deepspeed_key_support(&key) else {
            return refuse(
                &key,
                "this DeepSpeed key is not implemented by the engine here (see the DeepSpeed table in docs/fields.md); remove it",
            );
        };
        let is_true = truthy(value);
        match (row.field, row.support) {
            (_, Support::Refused(why)) if is_true => return refuse(&key, why),
            (_, Support::Inert(why)) => {
                log::info!("DeepSpeed `{key}`={value}: accepted, changes nothing here: {why}")
            }
            (
                "zero_optimization.stage3_gather_16bit_weights_on_model_save"
                | "zero_optimization.stage3_gather_fp16_weights_on_model_save",
                _,
            ) if value.as_bool() == Some(false) => {
                return refuse(
                    &key,
                    "saving only DeepSpeed's shards (no model.safetensors) is not implemented: the model is always gathered on save; set it to true or remove it",
                );
            }
            _ => {}
        }
    }
    Ok(())
}

/// The fields whose value differs from upstream's default (`TrainingArguments::default()`,
/// compared in the JSON form upstream's `to_dict()` writes).
fn non_default_fields(args: &TrainingArguments) -> Result<Vec<(&'static str, Value)>> {
    let to_map = |a: &TrainingArguments| match serde_json::to_value(a) {
        Ok(Value::Object(m)) => Ok(m),
        other => Err(Error::InvalidArgument {
            field: "TrainingArguments",
            detail: format!("could not be written as JSON: {other:?}"),
        }),
    };
    let now = to_map(args)?;
    let default = to_map(&TrainingArguments::default())?;
    Ok(FIELD_SUPPORT
        .iter()
        .filter_map(|row| {
            let value = now.get(row.field).cloned().unwrap_or(Value::Null);
            let base = default.get(row.field).cloned().unwrap_or(Value::Null);
            (value != base).then_some((row.field, value))
        })
        .collect())
}

/// Applies [`FIELD_SUPPORT`] to `args` for a run on `device` with `world_size` processes:
/// the first refused non-default value is an error naming its field; inert ones are logged.
pub(crate) fn check_field_support(
    args: &TrainingArguments,
    device: Device,
    world_size: usize,
) -> Result<()> {
    for (field, value) in non_default_fields(args)? {
        let row = field_support(field).expect("non_default_fields reads FIELD_SUPPORT");
        match row.support {
            Support::Refused(why) => {
                return Err(Error::InvalidArgument {
                    field,
                    detail: why.to_string(),
                });
            }
            Support::Inert(why) => {
                log::info!("{field}={value}: accepted, changes nothing here: {why}");
            }
            Support::Partly(..) | Support::Honoured(_) => {}
        }
    }
    check_tf32(args, device)?;
    // accelerate's `DeepSpeedPlugin` checks the config when the arguments are made.
    crate::sharding::deepspeed_config(args)?;
    if args.use_liger_kernel {
        let config = args
            .liger_kernel_config
            .clone()
            .map(serde_json::Value::Object);
        tchtrain_models::LigerKernelConfig::from_json(config.as_ref(), "the model")?;
    }
    if args
        .debug
        .contains(&tchtrain_training_args::DebugOption::TpuMetricsDebug)
    {
        return Err(Error::InvalidArgument {
            field: "debug",
            detail: "`tpu_metrics_debug` prints the XLA metrics report of a TPU run (upstream fails at the first evaluation without torch_xla); this build has no TPU: remove it from --debug".into(),
        });
    }
    check_accelerator_config(&args.accelerator_config, world_size)?;
    if args.eval_use_gather_object && world_size > 1 {
        return Err(Error::InvalidArgument {
            field: "eval_use_gather_object",
            detail: "gathering evaluation outputs as Python objects across processes is not implemented (predictions are tensors, gathered with padding); remove --eval_use_gather_object".into(),
        });
    }
    if args.torch_empty_cache_steps.is_some() && device != Device::Cpu {
        // Checked here so that a run asking for it on a device without a caching
        // allocator fails at build, not at step N.
        tchtrain_accelerate::clear_device_cache(device)?;
    }
    Ok(())
}

/// Upstream `__post_init__`'s TF32 block: `tf32=True` needs an Ampere (or newer) CUDA device
/// and raises otherwise; `tf32=False` turns TF32 off where it exists.
fn check_tf32(args: &TrainingArguments, device: Device) -> Result<()> {
    let Some(tf32) = args.tf32 else {
        return Ok(());
    };
    let available = device != Device::Cpu && tchtrain_accelerate::is_torch_tf32_available();
    if tf32 && !available {
        return Err(Error::InvalidArgument {
            field: "tf32",
            detail: "--tf32 requires Ampere or a newer GPU arch, cuda>=11 and torch>=1.7 (upstream's message); this run has no such device: remove --tf32".into(),
        });
    }
    if available {
        tchtrain_accelerate::enable_tf32(tf32)?;
    }
    Ok(())
}

/// The `accelerator_config` keys (see its row in [`FIELD_SUPPORT`]).
fn check_accelerator_config(config: &AcceleratorConfig, world_size: usize) -> Result<()> {
    let default = AcceleratorConfig::default();
    let refuse = |key: &str, why: &str| {
        Err(Error::InvalidArgument {
            field: "accelerator_config",
            detail: format!("`{key}`: {why}"),
        })
    };
    if config.use_seedable_sampler != default.use_seedable_sampler {
        return refuse(
            "use_seedable_sampler",
            "`false` draws the order from torch's RandomSampler without accelerate's seedable wrapper; only the seedable order (upstream's default) is implemented: remove the key",
        );
    }
    if config.use_configured_state {
        return refuse(
            "use_configured_state",
            "there is no accelerator state configured outside the Trainer to reuse; remove the key",
        );
    }
    if config.gradient_accumulation_kwargs.is_some() {
        return refuse(
            "gradient_accumulation_kwargs",
            "accelerate's GradientAccumulationPlugin options are not implemented (the Trainer syncs gradients on the last batch of each window); use --gradient_accumulation_steps and remove the key",
        );
    }
    if world_size > 1 {
        if config.split_batches != default.split_batches {
            return refuse(
                "split_batches",
                "splitting one batch across processes is not implemented: each process draws its own per_device_train_batch_size; remove the key",
            );
        }
        if config.dispatch_batches != default.dispatch_batches {
            return refuse(
                "dispatch_batches",
                "reading the data on the main process and broadcasting the batches is not implemented: each process reads its own shard; remove the key",
            );
        }
        if config.even_batches != default.even_batches {
            return refuse(
                "even_batches",
                "uneven evaluation batches across processes are not implemented: the last batch is padded as with upstream's default; remove the key",
            );
        }
    }
    Ok(())
}

fn test_list(tests: &[&str]) -> String {
    tests
        .iter()
        .map(|t| format!("`{t}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A markdown table (docs/fields.md) of `rows` (`what`: the first column's title): name, status, notes.
pub fn markdown_table(rows: &[FieldSupport], what: &str) -> String {
    let mut out = format!("| {what} | here | notes |\n|---|---|---|\n");
    for row in rows {
        let (status, note) = match row.support {
            Support::Honoured(tests) => ("honoured", format!("seen by {}", test_list(tests))),
            Support::Inert(why) => ("inert", why.to_string()),
            Support::Partly(tests, which) => {
                ("partly", format!("{which} (seen by {})", test_list(tests)))
            }
            Support::Refused(why) => ("refused", why.to_string()),
        };
        out.push_str(&format!(
            "| `{}` | {status} | {} |\n",
            row.field,
            note.replace('|', "\\|")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accelerator_config_and_gather_object_across_processes() {
        let mut config = AcceleratorConfig::default();
        assert!(check_accelerator_config(&config, 2).is_ok());
        config.non_blocking = true;
        config.split_batches = true;
        config.even_batches = false;
        config.dispatch_batches = Some(false);
        // One process: the batch is not split, dispatched nor evened out, as upstream.
        assert!(check_accelerator_config(&config, 1).is_ok());
        let err = check_accelerator_config(&config, 2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`split_batches`"), "{err}");
        config.split_batches = false;
        let err = check_accelerator_config(&config, 2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`dispatch_batches`"), "{err}");
        config.dispatch_batches = None;
        let err = check_accelerator_config(&config, 2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`even_batches`"), "{err}");

        let args = TrainingArguments {
            eval_use_gather_object: true,
            ..TrainingArguments::default()
        };
        assert!(check_field_support(&args, Device::Cpu, 1).is_ok());
        let err = check_field_support(&args, Device::Cpu, 2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`eval_use_gather_object`"), "{err}");
    }
}

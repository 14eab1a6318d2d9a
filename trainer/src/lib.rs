//! `tchtrain-trainer` — The Trainer loop of transformers 5.23 (trainer.py) on tch.
//!
//! Owns the [`Trainer`]: [`train`](Trainer::train) (epochs or `max_steps`, gradient
//! accumulation with upstream's `num_items_in_batch` normalisation, clipping, scheduler,
//! logging / evaluation / saving through the callbacks, resume), [`evaluate`](Trainer::evaluate), [`predict`](Trainer::predict),
//! checkpoints in upstream's layout with rotation. The data it drives comes from
//! `tchtrain-data` (datasets, samplers, the data loader); the example scripts live in
//! `tchtrain-examples`.
//! [`TrainerHooks`] is the Rust form of subclassing `Trainer`: every method upstream
//! documents for it (`compute_loss`, `training_step`, `prediction_step`, the data loaders,
//! `create_optimizer_and_scheduler`, `log`, `evaluate`, `predict`) with `default_*` as
//! `super()`. The step runs on the accelerator (`tchtrain-accelerate`: device, mixed
//! precision, DDP or the ZeRO engine): `accelerator.backward`, `clip_grad_norm_`,
//! `optimizer_step`, as upstream's `training_step` and `_inner_training_loop`.
//!
//! Mirrors upstream transformers/trainer.py (and trainer_pt_utils.py, trainer_utils.py);
//! names follow upstream so a transformers user finds each concept where they expect it.

mod checkpoint;
mod error;
mod evaluation;
mod field_support;
mod hooks;
mod logging;
mod memory_tracker;
mod metrics;
mod model_info;
mod modelcard;
mod numpy_mean;
mod prediction;
mod preflight;
mod profile;
mod push;
mod results;
mod save_failure;
mod seq2seq;
mod sharding;
mod signals;
mod step;
mod torch_checkpoint;
mod train_loop;
mod trainer;
mod zero;

pub use checkpoint::{
    PREFIX_CHECKPOINT_DIR, RNG_GENERATOR_STATE_NAME, RNG_STATE_NAME, RngState, TRAINER_STATE_NAME,
    TRAINING_ARGS_NAME, get_last_checkpoint, load_model_weights, rotate_checkpoints,
    sort_checkpoints,
};
pub use error::{Error, Result};
pub use field_support::{
    DEEPSPEED_KEY_SUPPORT, FIELD_SUPPORT, FSDP_KEY_SUPPORT, FieldSupport, Support,
    check_deepspeed_keys, check_fsdp_keys, check_fsdp_mixed_precision, deepspeed_key_support,
    field_support, markdown_table,
};
pub use hooks::{
    default_create_optimizer_and_scheduler, default_evaluate, default_get_eval_dataloader,
    default_get_test_dataloader, default_get_train_dataloader, default_log, default_predict,
    default_prediction_step, default_training_step,
};
pub use logging::{get_process_log_level, init_logging};
pub use metrics::{
    ComputeMetrics, EvalArrays, EvalPrediction, Metrics, PredictionOutput, PreprocessLogits,
    TrainOutput, speed_metrics,
};
pub use model_info::{floating_point_ops, named_parameters, num_parameters, parameters};
pub use modelcard::{
    ModelCardOptions, TrainingSummary, extract_hyperparameters, make_markdown_table,
    parse_log_history, task_of_class,
};
pub use results::metrics_format;
pub use save_failure::{SaveFailure, SaveFailureKind};
pub use seq2seq::{Seq2SeqHooks, Seq2SeqTrainer};
pub use step::{
    FusedBackward, PredictionStepOutput, StepContext, count_num_items_in_batch,
    default_compute_loss, model_forward, model_inputs,
};
pub use tchtrain_sys::cpu_cache::{
    CpuMemoryCache, CpuMemoryCacheStats, DEFAULT_LIMIT_MB as CPU_CACHE_DEFAULT_LIMIT_MB,
    LIMIT_ENV as CPU_CACHE_LIMIT_ENV,
};
pub use torch_checkpoint::{TORCH_RNG_STATE_NAME, TORCH_TRAINING_ARGS_NAME};
pub use train_loop::ResumeFrom;
pub use trainer::{DefaultHooks, Trainer, TrainerBuilder, TrainerHooks};

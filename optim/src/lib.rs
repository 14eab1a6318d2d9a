//! `tchtrain-optim` — Optimizers with exportable state and every transformers LR scheduler, on tch.
//!
//! Owns optimizers written over tensors with `state_dict()` / `load_state_dict()` (AdamW incl.
//! the fused kernel, Adam, SGD, Adagrad, RMSprop, Adafactor, and the optimizers of the
//! packages upstream's `optim` names load: bitsandbytes' 32- and 8-bit ones, schedule-free,
//! GaLore, APOLLO, torchao's 4- / 8-bit AdamW, LOMO / AdaLomo, StableAdamW, GrokAdamW, each
//! equal to its package), the factory that builds them from `optim` as upstream's
//! `trainer_optimizer.py` does ([`create_optimizer`]), every `SchedulerType`,
//! decay / no-decay parameter groups, `optim_args` parsing, global grad-norm clipping and
//! [`set_grad`] (torch's `p.grad = g`, to step on gradients computed elsewhere) and
//! [`GradScaler`] (torch's dynamic loss scaling for float16).
//!
//! Mirrors upstream transformers/optimization.py, trainer_optimizer.py and torch.optim; names
//! follow upstream so a transformers user finds each concept where they expect it. On CPU the
//! optimizers run torch.optim's default single-tensor path op for op (bit-identical results);
//! `fused: true` calls libtorch's fused kernels through a small C++ shim.
//!
//! A training step:
//!
//! ```no_run
//! use tch::{nn, Device};
//! use tchtrain_optim::{
//!     clip_grad_norm_if_enabled, create_optimizer, decay_param_groups, get_scheduler,
//!     LrScheduler, OptimizerArgs,
//! };
//! # fn main() -> Result<(), tchtrain_optim::Error> {
//! let vs = nn::VarStore::new(Device::Cpu);
//! // ... build the model under vs.root() ...
//! let named: Vec<_> = vs.variables().into_iter().collect();
//! let params: Vec<_> = named.iter().map(|(_, t)| t.shallow_clone()).collect();
//! let groups = decay_param_groups(named, 0.01, &["transformer.ln_f"]);
//! let mut opt = create_optimizer(&OptimizerArgs { learning_rate: 5e-5, ..Default::default() }, groups)?;
//! let mut sched = get_scheduler("linear", opt.as_mut(), Some(100), Some(1000), None)?;
//! // loss.backward();
//! clip_grad_norm_if_enabled(&params, 1.0)?;
//! opt.step()?;
//! sched.step(opt.as_mut())?;
//! opt.zero_grad();
//! opt.save(std::path::Path::new("checkpoint-1"))?;
//! sched.save(std::path::Path::new("checkpoint-1"))?;
//! # Ok(()) }
//! ```

mod adafactor;
mod adagrad;
mod adam;
mod adamw;
mod apollo;
mod bitsandbytes;
mod blockwise;
mod clip;
mod decay;
mod error;
mod ffi;
mod galore;
mod galore_8bit;
mod grad;
mod grad_scaler;
mod grokadamw;
mod layerwise;
mod lomo;
mod low_rank;
mod optim_args;
mod optimizer;
mod plateau;
mod rmsprop;
mod schedule_free;
mod scheduler;
mod schedules;
mod sgd;
mod stable_adamw;
mod torch_state;
mod torchao;
mod trainer_optimizer;

pub use adafactor::{Adafactor, AdafactorConfig};
pub use adagrad::{Adagrad, AdagradConfig};
pub use adam::{Adam, AdamConfig};
pub use adamw::{AdamW, AdamWConfig};
pub use apollo::{ApolloAdamW, ApolloAdamWConfig, ApolloGroup, ApolloProjection, ScaleType};
pub use bitsandbytes::{BnbAlgorithm, BnbConfig, BnbOptimizer};
pub use blockwise::{BLOCKSIZE, create_dynamic_map, dequantize_blockwise, quantize_blockwise};
pub use clip::{
    clip_grad_norm, clip_grad_norm_if_enabled, clip_grad_value, clip_grads_with_norm,
    get_total_norm, vector_norm,
};
pub use decay::{
    FORBIDDEN_NAME_PATTERNS, decay_param_groups, get_decay_parameter_names, is_decay_parameter,
    matches_forbidden_name,
};
pub use error::{Error, Result};
pub use ffi::add_;
pub use galore::{GaLoreAdafactor, GaLoreAdafactorConfig, GaLoreAdamW, GaLoreAdamWConfig};
pub use galore_8bit::{GaLoreAdamW8bit, GaLoreAdamW8bitConfig};
pub use grad::set_grad;
pub use grad_scaler::{GradScaler, GradScalerKwargs, GradScalerState, SCALER_NAME};
pub use grokadamw::{GrokAdamW, GrokAdamWConfig};
pub use layerwise::LayerWise;
pub use lomo::{AdaLomo, AdaLomoConfig, Lomo, LomoConfig};
pub use low_rank::{
    ProjType, Projection, ProjectorKind, check_target_module_exists, low_rank_target_names,
};
pub use optim_args::parse_optim_args;
pub use optimizer::{
    GroupSpec, OPTIMIZER_STATE_NAME, OPTIMIZER_TENSORS_NAME, Optimizer, OptimizerStateDict,
    OptimizerStateMeta, ParamGroup, ParamGroupState, ParamState, ParamStateMeta,
};
pub use plateau::{GreedyLR, PlateauMode, ReduceLROnPlateau, StreamingAverage, ThresholdMode};
pub use rmsprop::{RmsProp, RmsPropConfig};
pub use schedule_free::{
    AdamWScheduleFree, AdamWScheduleFreeConfig, RAdamScheduleFree, RAdamScheduleFreeConfig,
    ScheduleFreeGroupState, SgdScheduleFree, SgdScheduleFreeConfig,
};
pub use scheduler::{
    LambdaLR, LrScheduler, SCHEDULER_NAME, SCHEDULER_TYPES, SchedulerKwargs, get_scheduler,
};
pub use schedules::{
    LrLambda, WsdCurve, WsdOptions, get_constant_schedule, get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup, get_cosine_with_hard_restarts_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup_lr_rate, get_inverse_sqrt_schedule,
    get_linear_schedule_with_warmup, get_polynomial_decay_schedule_with_warmup, get_wsd_schedule,
};
pub use sgd::{Sgd, SgdConfig};
pub use stable_adamw::{StableAdamW, StableAdamWConfig};
pub use torch_state::{
    TORCH_OPTIMIZER_NAME, TORCH_SCALER_NAME, TORCH_SCHEDULER_NAME, grad_scaler_from_torch,
    grad_scaler_to_torch, load_torch_file, optimizer_from_torch, optimizer_to_torch,
    scheduler_from_torch, scheduler_to_torch, tensor_from_torch, tensor_to_torch,
};
pub use torchao::{LOW_BIT_MIN_SIZE, LowBitAdamW, LowBitAdamWConfig, StateBits};
pub use trainer_optimizer::{
    OptimizerArgs, create_optimizer, create_scheduler, supported_optimizers,
};

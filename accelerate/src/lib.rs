//! `tchtrain-accelerate` — Hugging Face accelerate's `Accelerator` on tch: what the
//! Trainer (or a hand-written loop) needs to run one step on any setup.
//!
//! Owns the [`Accelerator`]: the device; mixed precision (`bf16` / `fp16` autocast around
//! the forward, the fp16 loss scaler); the [`DistributedType`] with what it owns — DDP's
//! gradient all-reduce ([`Accelerator::prepare_model`]) or the ZeRO engine of DeepSpeed and
//! FSDP ([`ZeroEngine`]: flat buffers, stages 1/2/3, CPU offload, ZeRO-3 layer-by-layer
//! gathering); and upstream's step methods: [`prepare_data_loader`](Accelerator::prepare_data_loader),
//! [`autocast`](Accelerator::autocast), [`backward`](Accelerator::backward),
//! [`clip_grad_norm_`](Accelerator::clip_grad_norm_), [`optimizer_step`](Accelerator::optimizer_step),
//! [`gather_for_metrics`](Accelerator::gather_for_metrics), [`reduce`](Accelerator::reduce),
//! [`wait_for_everyone`](Accelerator::wait_for_everyone), [`save_state`](Accelerator::save_state) /
//! [`load_state`](Accelerator::load_state). [`PartialState`] holds the process's rank and
//! torch.distributed's default process group.
//!
//! The DeepSpeed and FSDP crates keep the policy (config files, `"auto"` values, checks,
//! the shard file format, `zero_to_fp32`) and hand the engine a [`ZeroPlugin`].
//!
//! ```no_run
//! use tch::{Kind, Tensor, nn, nn::Module};
//! use tchtrain_accelerate::{Accelerator, AcceleratorOptions};
//! use tchtrain_optim::{GroupSpec, Optimizer, Sgd, SgdConfig};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let accelerator = Accelerator::new(AcceleratorOptions { cpu: true, ..Default::default() })?;
//! let vs = nn::VarStore::new(accelerator.device());
//! let linear = nn::linear(vs.root(), 4, 1, Default::default());
//! let params = vs.trainable_variables();
//! let config = SgdConfig { lr: 0.1, ..Default::default() };
//! let group = GroupSpec::unnamed(params.iter().map(Tensor::shallow_clone).collect());
//! let mut optimizer = Sgd::new(vec![group], config)?;
//! let x = Tensor::randn([8, 4], (Kind::Float, accelerator.device()));
//! for _ in 0..3 {
//!     let loss = linear.forward(&x).square().mean(Kind::Float);
//!     accelerator.backward(&loss)?;
//!     accelerator.clip_grad_norm_(&params, 1.0, &optimizer)?;
//!     accelerator.optimizer_step(&mut optimizer)?;
//!     optimizer.zero_grad();
//! }
//! # Ok(()) }
//! ```
//!
//! Mirrors upstream accelerate (`accelerator.py`, `state.py`, `utils/operations.py`) and
//! DeepSpeed's ZeRO optimizers; names follow upstream.

mod accelerator;
mod autocast;
mod backends;
mod error;
mod ffi;
mod flat;
mod grad_boundary;
mod loss_scaler;
mod mixed_precision_policy;
mod operations;
mod random;
mod state;
mod zero;
mod zero_layers;

pub use accelerator::{
    Accelerator, AcceleratorOptions, DistributedType, ForwardScope, MixedPrecision, Reduction,
    ZeroPlugin, cpu_has_native_bf16,
};
pub use autocast::AutocastGuard;
pub use backends::{
    are_deterministic_algorithms_enabled, clear_device_cache, cuda_major, enable_tf32,
    is_torch_tf32_available, memory_allocated, reset_peak_memory_stats,
    use_deterministic_algorithms,
};
pub use error::{Error, Result};
pub use flat::{FlatBuffer, FlatLayout, FlatParamInfo, dtype_name};
pub use loss_scaler::{DynamicLossArgs, DynamicLossScaler, LossScaler};
pub use mixed_precision_policy::{GradientDivideFactors, MixedPrecisionPolicy};
pub use operations::concat_padded;
pub use random::{get_rng_state, set_rng_state};
pub use state::{PartialState, backend_for, default_device, device_for_rank};
pub use zero::{
    ShardMemory, ZeroEngine, ZeroMixedPrecision, ZeroStage, optimizer_state_bytes, unit_of,
};

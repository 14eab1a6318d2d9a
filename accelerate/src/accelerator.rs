//! [`Accelerator`]: accelerate's `Accelerator` as transformers' Trainer drives it — the
//! device, mixed precision (autocast and the fp16 loss scaler), and the distributed type
//! with what it owns (DDP's gradient buckets, or the ZeRO engine of DeepSpeed / FSDP).
//!
//! | upstream (accelerate) | here |
//! |---|---|
//! | `Accelerator(cpu=, mixed_precision=, kwargs_handlers=[GradScalerKwargs, InitProcessGroupKwargs, DistributedDataParallelKwargs])` | [`Accelerator::new`] with [`AcceleratorOptions`] |
//! | `accelerator.state` / `PartialState` | [`Accelerator::state`], [`PartialState`] |
//! | `accelerator.distributed_type` | [`Accelerator::distributed_type`] |
//! | `prepare_data_loader` (`DataLoaderShard` over `BatchSamplerShard`) | [`Accelerator::prepare_data_loader`] |
//! | `prepare_model` (`DistributedDataParallel(model, bucket_cap_mb=...)`) | [`Accelerator::prepare_model`] |
//! | `prepare` with a `DeepSpeedPlugin` / `FullyShardedDataParallelPlugin` (the engine) | [`Accelerator::prepare_zero`] |
//! | `autocast()` | [`Accelerator::autocast`] |
//! | `gradient_state._set_sync_gradients`, `no_sync` | [`Accelerator::set_sync_gradients`] |
//! | `backward(loss)`: `scaler.scale(loss).backward()`, DDP's all-reduce on a sync step | [`Accelerator::backward`] |
//! | `clip_grad_norm_(parameters, max_norm)` (unscale first; DeepSpeed's engine clips itself) | [`Accelerator::clip_grad_norm_`] |
//! | `AcceleratedOptimizer.step()` (`scaler.step`, `scaler.update`, `optimizer_step_was_skipped`) | [`Accelerator::optimizer_step`] |
//! | `gather_for_metrics`, `reduce`, `wait_for_everyone` | [`Accelerator::gather_for_metrics`], [`Accelerator::reduce`], [`Accelerator::wait_for_everyone`] |
//! | `save_state` / `load_state` (the scaler's part) | [`Accelerator::save_state`], [`Accelerator::load_state`] |
//!
//! DDP here reduces the gradients once per accumulation window (after the window's last
//! backward), as DDP under `no_sync` does; the ranks' parameters are broadcast from rank 0
//! when the model is prepared (buffers are not: the models here keep no trained buffers).
//! `find_unused_parameters` is not supported: every trainable parameter must receive a
//! gradient in each window (DDP's default).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tch::{Device, Kind, Tensor};
use tchtrain_data::{BatchSamplerShard, DataLoader};
use tchtrain_distributed::{DEFAULT_TIMEOUT, DistributedDataParallel, ProcessGroup, ReduceOp};
use tchtrain_optim::{GradScaler, GradScalerKwargs, GroupSpec, Optimizer};

use crate::autocast::AutocastGuard;
use crate::error::{Error, Result};
use crate::mixed_precision_policy::MixedPrecisionPolicy;
use crate::operations::{concat_padded, gather_in_batch_order};
use crate::state::PartialState;
use crate::zero::{ShardMemory, ZeroEngine, ZeroMixedPrecision, ZeroStage};
use crate::zero_layers::{LayerGather, lock_engine};

/// accelerate's `PrecisionType`: `mixed_precision="no" | "fp16" | "bf16"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MixedPrecision {
    /// float32.
    #[default]
    No,
    /// float16 autocast with a loss scaler (off the CPU, or with [`AcceleratorOptions::grad_scaler`]).
    Fp16,
    /// bfloat16 autocast.
    Bf16,
}

/// accelerate's `DistributedType` (the kinds this crate runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DistributedType {
    /// One process.
    No,
    /// Several processes on CPUs (Gloo): DDP.
    MultiCpu,
    /// Several processes on GPUs (NCCL): DDP.
    MultiGpu,
    /// DeepSpeed ZeRO (the engine, on one process or several).
    DeepSpeed,
    /// FSDP (`shard_grad_op` / `full_shard` on the ZeRO engine).
    Fsdp,
}

/// The settings of an [`Accelerator`]: upstream's constructor arguments and kwargs handlers.
#[derive(Debug, Clone)]
pub struct AcceleratorOptions {
    /// `cpu=True`: run on the CPU even when CUDA is present.
    pub cpu: bool,
    /// `mixed_precision`.
    pub mixed_precision: MixedPrecision,
    /// `GradScalerKwargs`: the loss scaler's settings. accelerate turns float16 mixed
    /// precision on only off the CPU (on the CPU, `fp16` trains in fp32); giving kwargs here
    /// asks for it on the CPU too, the GPU recipe run there.
    pub grad_scaler: Option<GradScalerKwargs>,
    /// `InitProcessGroupKwargs(backend=...)` (`ddp_backend`); `None`: NCCL for CUDA when
    /// built, else Gloo.
    pub backend: Option<String>,
    /// `InitProcessGroupKwargs(timeout=...)` (`ddp_timeout`).
    pub timeout: Duration,
    /// `DistributedDataParallelKwargs(bucket_cap_mb=...)`; `None`: DDP's 25 MB.
    pub bucket_cap_mb: Option<f64>,
    /// `DistributedDataParallelKwargs(find_unused_parameters=...)` (DDP's default false).
    pub find_unused_parameters: bool,
}

impl Default for AcceleratorOptions {
    fn default() -> Self {
        Self {
            cpu: false,
            mixed_precision: MixedPrecision::No,
            grad_scaler: None,
            backend: None,
            timeout: DEFAULT_TIMEOUT,
            bucket_cap_mb: None,
            find_unused_parameters: false,
        }
    }
}

/// What [`Accelerator::prepare_zero`] builds the engine from: the plugin's stage, units and
/// offload (the DeepSpeed config or FSDP plugin is read by their crates).
#[derive(Debug, Clone)]
pub struct ZeroPlugin {
    /// [`DistributedType::DeepSpeed`] or [`DistributedType::Fsdp`].
    pub distributed_type: DistributedType,
    /// The ZeRO stage.
    pub stage: ZeroStage,
    /// The wrap units (parameter-name prefixes); empty: the root unit only.
    pub units: Vec<String>,
    /// `offload_param`: `(device, pin_memory)`.
    pub offload_param: Option<(Device, bool)>,
    /// `offload_optimizer`: `(device, pin_memory)`.
    pub offload_optimizer: Option<(Device, bool)>,
    /// DeepSpeed's `fp16` / `bf16` regime: the model's parameters are already float16 /
    /// bfloat16, the engine keeps float32 masters and steps with this loss scaler, and
    /// the accelerator's own autocast and `GradScaler` are off (accelerate's `native_amp`
    /// is false under DeepSpeed).
    pub mixed_precision: Option<ZeroMixedPrecision>,
    /// FSDP's mixed-precision policy (accelerate's `set_mixed_precision` on the FSDP plugin):
    /// float32 shards, parameters gathered in `param_dtype`, gradients reduced in
    /// `reduce_dtype`, the model's outputs cast to `output_dtype`; the accelerator's
    /// autocast and `GradScaler` stay as they are (accelerate's `native_amp`).
    pub mp_policy: Option<MixedPrecisionPolicy>,
    /// FSDP2: shard every parameter along dim 0 as `fully_shard` does
    /// ([`ZeroEngine::new_per_parameter`]); the names are the model's trainable parameters
    /// in its `parameters()` order. `None`: DeepSpeed's / FSDP1's contiguous flat shards.
    pub per_parameter_order: Option<Vec<String>>,
    /// DeepSpeed's `communication_data_type` and the dtype the reduced gradients are kept
    /// in ([`ZeroEngine::set_communication_data_type`]).
    pub communication_data_type: Option<(Kind, Kind)>,
    /// At stages 1 and 2 with several processes: the gradients reduced in buckets during the
    /// backward ([`ZeroEngine::overlap_reduction`]; DeepSpeed's `overlap_comm`, FSDP always),
    /// else after it.
    pub overlap_comm: bool,
    /// The gradient elements per bucket of that reduction (DeepSpeed's
    /// `reduce_bucket_size`); `None`: DDP's 25 MiB buckets (FSDP's `SHARD_GRAD_OP`).
    pub reduce_bucket_size: Option<i64>,
}

/// The engine of a sharded run.
#[derive(Debug)]
struct Zero {
    /// Shared with the per-layer hooks of a stage-3 step ([`LayerGather`]).
    engine: Arc<Mutex<ZeroEngine>>,
    /// Stage 3 with one unit per transformer layer: gathered layer by layer.
    per_layer: bool,
    distributed_type: DistributedType,
}

/// accelerate's `Accelerator` (see the module documentation for the mapping).
#[derive(Debug)]
pub struct Accelerator {
    state: Arc<PartialState>,
    mixed_precision: MixedPrecision,
    autocast: Option<Kind>,
    scaler: Option<Mutex<GradScaler>>,
    /// Whether the scaler's settings were given (`GradScalerKwargs`), not accelerate's default.
    scaler_kwargs_given: bool,
    /// `DistributedDataParallelKwargs(bucket_cap_mb=...)`, `None` for DDP's default buckets.
    bucket_cap_mb: Option<f64>,
    find_unused_parameters: bool,
    ddp: Option<DistributedDataParallel>,
    zero: Option<Zero>,
    /// `gradient_state.sync_gradients`: whether the next backward ends a window.
    sync_gradients: AtomicBool,
    /// Whether this window's gradients were reduced across processes already.
    gradients_reduced: AtomicBool,
}

impl Accelerator {
    /// An accelerator on the CPU (`cpu`), else on this process's CUDA device
    /// (`cuda:LOCAL_RANK`, [`crate::default_device`]) when there is one.
    pub fn new(options: AcceleratorOptions) -> Result<Self> {
        let device = crate::state::default_device(options.cpu)?;
        Self::on_device(device, options)
    }

    /// An accelerator computing on `device` (`options.cpu` is not read).
    pub fn on_device(device: Device, options: AcceleratorOptions) -> Result<Self> {
        // accelerate's `native_amp` for fp16: off the CPU, or asked for with a scaler's kwargs.
        let scaler_kwargs_given = options.grad_scaler.is_some();
        let native_fp16 = options.mixed_precision == MixedPrecision::Fp16
            && (device != Device::Cpu || scaler_kwargs_given);
        let scaler = if native_fp16 {
            Some(Mutex::new(GradScaler::new(
                options.grad_scaler.unwrap_or_default(),
            )?))
        } else {
            None
        };
        let autocast = match options.mixed_precision {
            MixedPrecision::Bf16 => Some(Kind::BFloat16),
            MixedPrecision::Fp16 if native_fp16 => Some(Kind::Half),
            _ => None,
        };
        if autocast == Some(Kind::BFloat16) && device == Device::Cpu {
            warn_bf16_without_native_instructions();
        }
        Ok(Self {
            state: Arc::new(PartialState::new(device, options.backend, options.timeout)),
            mixed_precision: options.mixed_precision,
            autocast,
            scaler,
            scaler_kwargs_given,
            bucket_cap_mb: options.bucket_cap_mb,
            find_unused_parameters: options.find_unused_parameters,
            ddp: None,
            zero: None,
            sync_gradients: AtomicBool::new(true),
            gradients_reduced: AtomicBool::new(false),
        })
    }

    /// `accelerator.state`.
    pub fn state(&self) -> &PartialState {
        &self.state
    }

    /// `accelerator.device`.
    pub fn device(&self) -> Device {
        self.state.device()
    }

    /// `accelerator.num_processes`.
    pub fn num_processes(&self) -> usize {
        self.state.num_processes()
    }

    /// `accelerator.process_index`.
    pub fn process_index(&self) -> usize {
        self.state.process_index()
    }

    /// `accelerator.is_main_process`.
    pub fn is_main_process(&self) -> bool {
        self.state.is_main_process()
    }

    /// `accelerator.distributed_type`.
    pub fn distributed_type(&self) -> DistributedType {
        if let Some(z) = &self.zero {
            return z.distributed_type;
        }
        match (self.num_processes() > 1, self.device().is_cuda()) {
            (false, _) => DistributedType::No,
            (true, false) => DistributedType::MultiCpu,
            (true, true) => DistributedType::MultiGpu,
        }
    }

    /// `accelerator.mixed_precision`.
    pub fn mixed_precision(&self) -> MixedPrecision {
        self.mixed_precision
    }

    /// The dtype the model's forward autocasts to (`None`: fp32): bfloat16 with `bf16`,
    /// float16 with native fp16.
    pub fn autocast_dtype(&self) -> Option<Kind> {
        self.autocast
    }

    /// `accelerator.autocast()`: the open region while the guard lives; `None` in fp32.
    pub fn autocast(&self) -> Result<Option<AutocastGuard>> {
        self.autocast
            .map(|dtype| AutocastGuard::enter(self.device(), dtype))
            .transpose()
    }

    /// `accelerator.scaler`: the loss scaler of float16 mixed precision, when there is one.
    pub fn scaler(&self) -> Option<MutexGuard<'_, GradScaler>> {
        self.scaler
            .as_ref()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// `prepare_data_loader`: in a data-parallel run, this process's shard of `loader`
    /// (see [`BatchSamplerShard`]); the loader itself otherwise.
    pub fn prepare_data_loader(&self, loader: DataLoader) -> DataLoader {
        let world = self.num_processes();
        if world <= 1 {
            return loader;
        }
        loader.sharded(BatchSamplerShard::new(world, self.process_index()))
    }

    /// `prepare_model` for DDP: in a multi-process run without a sharded engine, wraps the
    /// trainable `parameters` in [`DistributedDataParallel`] (rank 0's values broadcast to
    /// every rank); nothing otherwise.
    pub fn prepare_model(&mut self, parameters: Vec<Tensor>) -> Result<()> {
        if self.zero.is_some() {
            return Ok(());
        }
        let (cap, find_unused) = (self.bucket_cap_mb, self.find_unused_parameters);
        self.ddp = self.state.with_process_group(|pg| {
            Ok(DistributedDataParallel::new(
                pg,
                parameters,
                cap,
                find_unused,
            )?)
        })?;
        Ok(())
    }

    /// `prepare` with a DeepSpeed / FSDP plugin: builds the [`ZeroEngine`] over the
    /// optimizer's parameter `groups` (every rank calls it), with the plugin's offload, and
    /// returns the groups of shards the optimizer is to be built over. Stage 3 gathers the
    /// full parameters for the first forward unless the units are exactly the transformer
    /// layers, in order (then they are gathered one by one during each step).
    pub fn prepare_zero(
        &mut self,
        plugin: ZeroPlugin,
        groups: Vec<GroupSpec>,
    ) -> Result<Vec<GroupSpec>> {
        if self.num_processes() <= 1 {
            log::info!(
                "ZeRO stage {} on a single process: the engine runs over a world of one (nothing is sharded; offload_optimizer applies)",
                plugin.stage.number()
            );
        }
        if plugin.mixed_precision.is_some() && self.scaler_kwargs_given && self.scaler.is_some() {
            return Err(Error::InvalidArgument {
                field: "grad_scaler",
                detail: "GradScalerKwargs with DeepSpeed's fp16: DeepSpeed's own loss scaler replaces accelerate's GradScaler; set its settings in the config's fp16 section (initial_scale_power, loss_scale_window, hysteresis, min_loss_scale) and drop the kwargs".into(),
            });
        }
        let per_layer = plugin.stage == ZeroStage::Weights
            && !plugin.units.is_empty()
            && plugin
                .units
                .iter()
                .enumerate()
                .all(|(i, p)| p.ends_with(&format!(".{i}.")));
        let engine = self
            .state
            .with_sharding_group(|pg| {
                let mut engine = match &plugin.per_parameter_order {
                    Some(order) => ZeroEngine::new_per_parameter(
                        pg,
                        plugin.stage,
                        groups,
                        &plugin.units,
                        order,
                    )?,
                    None => ZeroEngine::new(pg, plugin.stage, groups, &plugin.units)?,
                };
                if let Some(mp) = plugin.mixed_precision.clone() {
                    engine.set_mixed_precision(mp)?;
                }
                if let Some(policy) = plugin.mp_policy {
                    engine.set_mp_policy(policy)?;
                }
                if let Some((kind, accumulate)) = plugin.communication_data_type {
                    engine.set_communication_data_type(kind, accumulate);
                }
                if plugin.stage != ZeroStage::Weights && plugin.overlap_comm {
                    engine.overlap_reduction(pg, plugin.reduce_bucket_size)?;
                }
                if let Some((device, pin_memory)) = plugin.offload_param {
                    engine.offload_param(device, pin_memory)?;
                }
                if let Some((device, pin_memory)) = plugin.offload_optimizer {
                    engine.offload_optimizer(device, pin_memory)?;
                }
                if !per_layer {
                    engine.gather(pg)?;
                }
                Ok(engine)
            })?
            .ok_or(Error::InvalidArgument {
                field: "WORLD_SIZE",
                detail: "no process group could be created for the sharded run".into(),
            })?;
        let shard_groups = engine.shard_groups();
        if plugin.mixed_precision.is_some() {
            // The model computes in its own half dtype; the engine scales the loss.
            self.autocast = None;
            self.scaler = None;
        }
        self.ddp = None;
        self.zero = Some(Zero {
            engine: Arc::new(Mutex::new(engine)),
            per_layer,
            distributed_type: plugin.distributed_type,
        });
        Ok(shard_groups)
    }

    /// Drops what [`prepare_model`](Self::prepare_model) and
    /// [`prepare_zero`](Self::prepare_zero) built (a new training run prepares again).
    pub fn free_memory(&mut self) {
        self.ddp = None;
        self.zero = None;
        self.sync_gradients.store(true, Ordering::Relaxed);
        self.gradients_reduced.store(false, Ordering::Relaxed);
    }

    /// The ZeRO engine, when the run is sharded (no lock is held across a step).
    pub fn zero_engine(&self) -> Option<MutexGuard<'_, ZeroEngine>> {
        self.zero.as_ref().map(|z| lock_engine(&z.engine))
    }

    /// Runs `f` with the sharded run's process group and engine (a collective when `f`
    /// makes one: every rank calls it); `None` outside a sharded run. `f`'s own error type
    /// comes back as it is (the shard files of `tchtrain-deepspeed`, a caller's I/O).
    pub fn with_zero_engine<T, E: From<Error>>(
        &self,
        f: impl FnOnce(&mut ProcessGroup, &mut ZeroEngine) -> std::result::Result<T, E>,
    ) -> std::result::Result<Option<T>, E> {
        let mut failed: Option<E> = None;
        let out = self.zero_op(|pg, engine| match f(pg, engine) {
            Ok(v) => Ok(Some(v)),
            Err(e) => {
                failed = Some(e);
                Ok(None)
            }
        })?;
        match failed {
            Some(e) => Err(e),
            None => Ok(out.flatten()),
        }
    }

    /// [`with_zero_engine`](Self::with_zero_engine) with this crate's errors.
    fn zero_op<T>(
        &self,
        f: impl FnOnce(&mut ProcessGroup, &mut ZeroEngine) -> Result<T>,
    ) -> Result<Option<T>> {
        let Some(z) = &self.zero else {
            return Ok(None);
        };
        self.state
            .with_sharding_group(|pg| f(pg, &mut lock_engine(&z.engine)))
    }

    /// Whether the sharded engine runs DeepSpeed's half-precision regime (its loss scaler
    /// skips overflowed steps: a non-finite gradient norm is a skipped step there).
    pub fn loss_scaled_engine(&self) -> bool {
        self.zero_engine()
            .is_some_and(|e| e.loss_scaler().is_some())
    }

    /// The memory the sharded engine holds on this rank (`None` outside a sharded run).
    pub fn sharded_memory(&self) -> Option<ShardMemory> {
        self.zero_engine().map(|e| e.memory())
    }

    /// The parameters ready for a forward (and, when `training`, its backward): nothing to
    /// do outside ZeRO-3. At stage 3 the full parameters are gathered, or, layer by layer,
    /// the root unit now and each layer while it runs (DeepSpeed's module hooks). Run the
    /// forward (and backward) inside [`ForwardScope::run`].
    pub fn forward_scope(&self, training: bool) -> Result<ForwardScope> {
        let Some(z) = &self.zero else {
            return Ok(ForwardScope { hooks: None });
        };
        self.state.with_sharding_group(|pg| {
            let mut engine = lock_engine(&z.engine);
            if z.per_layer {
                // Layers gathered for an evaluation, a save or at setup are released first.
                let root = engine.layer_units();
                for unit in 0..root {
                    engine.release_unit(unit)?;
                }
                Ok(engine.gather_unit(pg, root)?)
            } else {
                Ok(engine.gather(pg)?)
            }
        })?;
        let hooks = z.per_layer.then(|| {
            let (engine, state) = (z.engine.clone(), self.state.clone());
            Arc::new(if training {
                LayerGather::new(engine, state)
            } else {
                LayerGather::for_evaluation(engine, state)
            })
        });
        Ok(ForwardScope { hooks })
    }

    /// Stage 3: gathers the full parameters into the model (a collective; nothing otherwise),
    /// as `GatheredParameters` / `unwrap_model` before the model is read whole.
    pub fn gather_parameters(&self) -> Result<()> {
        self.zero_op(|pg, engine| engine.gather(pg))?;
        Ok(())
    }

    /// Stage 3: releases the full parameters, keeping only this rank's shards (nothing
    /// otherwise).
    pub fn release_parameters(&self) -> Result<()> {
        if let Some(mut engine) = self.zero_engine() {
            engine.release()?;
        }
        Ok(())
    }

    /// `gradient_state._set_sync_gradients`: whether the next backward ends an accumulation
    /// window (its gradients are then reduced across processes; the others run under DDP's
    /// `no_sync`). `true` until set.
    pub fn set_sync_gradients(&self, sync: bool) {
        self.sync_gradients.store(sync, Ordering::Relaxed);
    }

    /// `accelerator.sync_gradients`.
    pub fn sync_gradients(&self) -> bool {
        self.sync_gradients.load(Ordering::Relaxed)
    }

    /// `accelerator.backward(loss)`: `loss.backward()`, the loss first multiplied by the
    /// fp16 loss scale when there is a scaler (`scaler.scale(loss).backward()`); on a sync
    /// step the gradients are reduced across processes (DDP's bucket all-reduces during
    /// the backward; ZeRO-1 / 2's bucket reductions during it, sliced into the shards after
    /// it; stage 3's reduce-scatter after each layer's backward or after the backward).
    pub fn backward(&self, loss: &Tensor) -> Result<()> {
        let scale = match self.scaler() {
            Some(mut s) => s.scale_tensor(loss.device())?,
            None => None,
        };
        // DeepSpeed's half-precision engine: `loss_scaler.backward(loss)`, `loss * cur_scale`.
        // ZeRO-1 / 2 with `overlap_comm`: the engine's buckets reduced as their gradients
        // become ready (the engine's lock is not held during the backward).
        let (engine_scale, overlapped) = match self.zero_engine() {
            Some(engine) => (
                engine.loss_scale(),
                engine.prepare_backward(self.sync_gradients())?,
            ),
            None => (1.0, false),
        };
        // DDP: the reducer armed as DDP's forward arms it; on a sync step the backward then
        // all-reduces the buckets as their gradients become ready.
        if let Some(ddp) = &self.ddp {
            ddp.prepare_for_backward(&[loss], self.sync_gradients())?;
        }
        if engine_scale != 1.0 {
            loss.f_mul_scalar(engine_scale)?.f_backward()?;
        } else {
            match scale {
                Some(scale) => loss
                    .f_mul(&scale.f_to_device(loss.device())?)?
                    .f_backward()?,
                None => loss.f_backward()?,
            }
        }
        if let Some(ddp) = self.ddp.as_ref().filter(|_| self.sync_gradients()) {
            ddp.finish_backward()?;
            self.gradients_reduced.store(true, Ordering::Relaxed);
        }
        if overlapped {
            if let Some(mut engine) = self.zero_engine() {
                engine.finish_backward()?;
            }
        }
        if self.sync_gradients() {
            self.reduce_gradients()?;
        }
        Ok(())
    }

    /// The window's gradient reduction across processes, once: DDP's bucketed all-reduce
    /// (averaged) when the backward did not already reduce through DDP's reducer, or the
    /// ZeRO engine's reduce into the shards. Also run by
    /// [`clip_grad_norm_`](Self::clip_grad_norm_) and
    /// [`optimizer_step`](Self::optimizer_step) when the backward did not (a loss whose
    /// backward was called directly). Nothing in a single-process run without an engine.
    fn reduce_gradients(&self) -> Result<()> {
        if self.gradients_reduced.swap(true, Ordering::Relaxed) {
            return Ok(());
        }
        if let Some(ddp) = &self.ddp {
            self.state
                .with_process_group(|pg| Ok(ddp.all_reduce_gradients(pg)?))?;
        }
        self.zero_op(|pg, engine| engine.reduce_gradients(pg))?;
        Ok(())
    }

    /// `accelerator.clip_grad_norm_(parameters, max_norm)`: the total L2 norm of the
    /// gradients before clipping, left on the device; clipping only when `max_norm > 0`.
    /// With fp16 the gradients of `optimizer` are unscaled first; a sharded run clips the
    /// shards with the global norm (the engine's own clipping, as DeepSpeed's).
    pub fn clip_grad_norm_(
        &self,
        parameters: &[Tensor],
        max_norm: f64,
        optimizer: &dyn Optimizer,
    ) -> Result<Tensor> {
        self.reduce_gradients()?;
        self.unscale_shards(optimizer)?;
        if let Some(norm) = self.zero_op(|pg, engine| engine.clip_grad_norm(pg, max_norm))? {
            return Ok(Tensor::from(norm));
        }
        if let Some(mut s) = self.scaler() {
            s.unscale_(optimizer)?;
        }
        let max_norm = if max_norm > 0.0 {
            max_norm
        } else {
            f64::INFINITY
        };
        Ok(tchtrain_optim::clip_grad_norm(
            parameters, max_norm, 2.0, false,
        )?)
    }

    /// The accelerated optimizer's `step()`: through the `GradScaler` of an fp16 run (the
    /// update skipped when a gradient overflowed, then the scale updated); a sharded run then
    /// gathers the updated shards (stages 1 and 2) and clears the variables' gradients.
    /// Returns accelerate's `optimizer_step_was_skipped`, which keeps the LR scheduler from
    /// stepping: true only when the update was skipped and the optimizer is not one whose
    /// kernel takes the inf check itself (the fused ones, which torch calls anyway, so
    /// accelerate counts the step as taken).
    pub fn optimizer_step(&self, optimizer: &mut dyn Optimizer) -> Result<bool> {
        self.reduce_gradients()?;
        // DeepSpeed's half-precision engine: an overflowed step is skipped (its
        // `optimizer.overflow`, which accelerate reports as `optimizer_step_was_skipped`).
        if self.zero_op(|pg, engine| engine.prepare_step(pg))? == Some(true) {
            self.zero_op(|_, engine| engine.zero_grad())?;
            self.gradients_reduced.store(false, Ordering::Relaxed);
            return Ok(true);
        }
        self.unscale_shards(optimizer)?;
        let skipped = match self.scaler() {
            None => {
                optimizer.step()?;
                false
            }
            Some(mut scaler) => {
                let stepped = scaler.step(optimizer)?;
                scaler.update()?;
                !stepped && !optimizer.step_supports_amp_scaling()
            }
        };
        self.zero_op(|pg, engine| {
            engine.after_step(pg)?;
            engine.zero_grad()
        })?;
        self.gradients_reduced.store(false, Ordering::Relaxed);
        Ok(skipped)
    }

    /// A sharded run with a `GradScaler` (FSDP with fp16 on an accelerator): the shards'
    /// gradients unscaled once per step, and the inf flag reduced with MAX across the
    /// ranks (DTensor's `found_inf_reduce_handler`), so that every rank skips the same
    /// steps. Nothing otherwise.
    fn unscale_shards(&self, optimizer: &dyn Optimizer) -> Result<()> {
        if self.zero.is_none() {
            return Ok(());
        }
        let Some(mut scaler) = self.scaler() else {
            return Ok(());
        };
        if scaler.is_unscaled() {
            return Ok(());
        }
        scaler.unscale_(optimizer)?;
        if let Some(found) = scaler.found_inf_mut() {
            self.state.with_sharding_group(|pg| {
                let mut flag = found.f_to_device(pg.device())?.f_contiguous()?.copy();
                pg.all_reduce(&mut flag, ReduceOp::Max)?;
                found.f_copy_(&flag)?;
                Ok(())
            })?;
        }
        Ok(())
    }

    /// The dtype the model's floating outputs are cast to after the forward: FSDP's
    /// `output_dtype` under its mixed-precision policy (`None` otherwise).
    pub fn output_dtype(&self) -> Option<Kind> {
        self.zero_engine()
            .and_then(|e| e.mp_policy())
            .and_then(|p| p.output_dtype)
    }

    /// `accelerator.reduce(tensor, reduction)` for a float tensor: summed (or averaged) over
    /// the processes, a float32 copy; the tensor itself in a single-process run.
    pub fn reduce(&self, tensor: &Tensor, reduction: Reduction) -> Result<Tensor> {
        let world = self.num_processes();
        let reduced = self.state.with_process_group(|pg| {
            let mut all = tensor.f_to_kind(Kind::Float)?.f_contiguous()?.copy();
            all = all.f_to_device(pg.device())?;
            pg.all_reduce(&mut all, ReduceOp::Sum)?;
            Ok(match reduction {
                Reduction::Sum => all,
                Reduction::Mean => all.f_div_scalar(world as f64)?,
            })
        })?;
        Ok(reduced.unwrap_or_else(|| tensor.shallow_clone()))
    }

    /// `value` reduced over every process with `op`, in float64 (itself in a
    /// single-process run): `gather(value).sum()` of a count.
    pub fn reduce_scalar(&self, value: f64, op: ReduceOp) -> Result<f64> {
        self.state.reduce_scalar(value, op)
    }

    /// `wait_for_everyone`: a barrier (nothing in a single-process run).
    pub fn wait_for_everyone(&self) -> Result<()> {
        self.state.wait_for_everyone()
    }

    /// accelerate's `gather(tensor)`: every process's tensor (the same shape on each)
    /// concatenated along dim 0 in rank order (a scalar stacked), on this tensor's device;
    /// the tensor itself in a single-process run.
    pub fn gather(&self, tensor: &Tensor) -> Result<Tensor> {
        let rows = tensor.size().first().copied().unwrap_or(1);
        let gathered = self
            .state
            .with_process_group(|pg| gather_in_batch_order(pg, tensor, rows, None))?;
        match gathered {
            Some(g) => Ok(g.f_to_device(tensor.device())?),
            None => Ok(tensor.shallow_clone()),
        }
    }

    /// `gather_for_metrics` over a whole evaluation: every process's losses, predictions and
    /// labels gathered in the global batch order (step by step, rank by rank), padded along
    /// dim 1 with -100 to the longest across processes as `pad_across_processes`, and cut to
    /// the dataset's length unless `drop_last` (the padding rows of the last step).
    ///
    /// With `concat_batches` (upstream's `eval_do_concat_batches=True`) each list is
    /// concatenated per process first and then holds one tensor. Without it each batch is
    /// gathered on its own, as upstream's loop calls `gather_for_metrics` batch by batch,
    /// and the list keeps one tensor per global step. Nothing in a single-process run.
    pub fn gather_for_metrics<const N: usize>(
        &self,
        lists: [&mut Vec<Tensor>; N],
        loader: &DataLoader,
        drop_last: bool,
        concat_batches: bool,
    ) -> Result<()> {
        if self.num_processes() <= 1 {
            return Ok(());
        }
        let rows_per_batch = loader.batch_size() as i64;
        let keep = (!drop_last).then(|| loader.num_examples() as i64);
        for list in lists {
            // Every process has items in the same lists (they run the same number of full
            // batches), so the collectives below pair up.
            let has = i64::from(!list.is_empty());
            let has = self.state.with_process_group(|pg| {
                let mut t = Tensor::f_from_slice(&[has])?.f_to_device(pg.device())?;
                pg.all_reduce(&mut t, ReduceOp::Min)?;
                Ok(t.f_int64_value(&[0])?)
            })?;
            if has == Some(0) {
                list.clear();
                continue;
            }
            if concat_batches {
                let local = concat_padded(list)?;
                let gathered = self.state.with_process_group(|pg| {
                    gather_in_batch_order(pg, &local, rows_per_batch, keep)
                })?;
                if let Some(g) = gathered {
                    *list = vec![g];
                }
                continue;
            }
            let mut seen = 0i64;
            let mut batches = Vec::with_capacity(list.len());
            for local in list.iter() {
                let keep_here = keep.map(|k| (k - seen).max(0));
                let gathered = self.state.with_process_group(|pg| {
                    gather_in_batch_order(pg, local, rows_per_batch, keep_here)
                })?;
                if let Some(g) = gathered {
                    seen += g.size().first().copied().unwrap_or(1);
                    batches.push(g);
                }
            }
            *list = batches;
        }
        Ok(())
    }

    /// `save_state` for what the accelerator itself holds: the fp16 loss scaler's state
    /// (`scaler.json`, upstream's `scaler.pt`). The model, optimizer, scheduler and
    /// generator states are the Trainer's checkpoint; a sharded engine's files are written by
    /// `tchtrain-deepspeed`.
    pub fn save_state(&self, dir: &Path) -> Result<()> {
        if let Some(scaler) = self.scaler() {
            scaler.save(dir)?;
        }
        Ok(())
    }

    /// `load_state` for the scaler's part, when `dir` has it.
    pub fn load_state(&self, dir: &Path) -> Result<()> {
        if let Some(mut scaler) = self.scaler()
            && dir.join(tchtrain_optim::SCALER_NAME).is_file()
        {
            scaler.load(dir)?;
        }
        Ok(())
    }
}

/// Says once per process that bf16 runs on a CPU without native bfloat16 instructions
/// (upstream says nothing; training goes on as asked).
fn warn_bf16_without_native_instructions() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    if cpu_has_native_bf16() == Some(false) {
        ONCE.call_once(|| {
            log::warn!(
                "bf16 on a CPU without native bfloat16 instructions (no AVX512-BF16 / AMX-BF16): \
                 libtorch emulates bfloat16 there, and a bf16 step is typically an order of \
                 magnitude slower than the same step in fp32 (upstream's Trainer is as slow); \
                 training continues as asked"
            );
        });
    }
}

/// Whether this CPU has native bfloat16 arithmetic (x86's `avx512_bf16` / `amx_bf16`, Arm's
/// `bf16`), from `/proc/cpuinfo`; `None` where that cannot be read.
pub fn cpu_has_native_bf16() -> Option<bool> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    Some(cpuinfo_has_native_bf16(&info))
}

/// [`cpu_has_native_bf16`] on the text of `/proc/cpuinfo` (x86 `flags`, Arm `Features`).
fn cpuinfo_has_native_bf16(info: &str) -> bool {
    info.lines()
        .filter(|l| l.starts_with("flags") || l.starts_with("Features"))
        .filter_map(|l| l.split_once(':').map(|(_, v)| v))
        .flat_map(str::split_whitespace)
        .any(|f| matches!(f, "avx512_bf16" | "amx_bf16" | "bf16"))
}

/// `reduction` of [`Accelerator::reduce`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    /// The sum over the processes.
    Sum,
    /// The sum divided by the number of processes.
    Mean,
}

/// What [`Accelerator::forward_scope`] prepared: at ZeRO-3 layer by layer, the hooks that
/// gather each layer while it runs; nothing otherwise.
pub struct ForwardScope {
    hooks: Option<Arc<LayerGather>>,
}

impl std::fmt::Debug for ForwardScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForwardScope")
            .field("layer_by_layer", &self.hooks.is_some())
            .finish()
    }
}

impl ForwardScope {
    /// Runs `f` (the forward, and in training the backward) with the hooks in place on the
    /// model whose parts share `model`. An error a hook met (a dead peer, a timeout) is
    /// the one returned, rather than the model's generic report of it.
    pub fn run<T, E: From<Error>>(
        &self,
        model: &tchtrain_nn::Context,
        f: impl FnOnce() -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        let Some(g) = &self.hooks else {
            return f();
        };
        let out = model.with_layer_hooks(g.clone(), f);
        match g.take_error() {
            Some(e) => Err(e.into()),
            None => out,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_bf16_from_cpuinfo_flags() {
        let avx2 = "model name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma\n";
        assert!(!cpuinfo_has_native_bf16(avx2));
        let sapphire = "flags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n";
        assert!(cpuinfo_has_native_bf16(sapphire));
        let graviton3 = "Features\t: fp asimd sve bf16 i8mm\n";
        assert!(cpuinfo_has_native_bf16(graviton3));
        assert!(!cpuinfo_has_native_bf16("flags\t\t: avx512f avx512bw\n"));
    }
}

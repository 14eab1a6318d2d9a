//! `Trainer::train`: upstream's `_inner_training_loop`, `_run_epoch`,
//! `_maybe_log_save_evaluate` and `_finalize_training`.
//!
//! One update step takes `gradient_accumulation_steps` batches (fewer at the end of an
//! epoch that does not divide evenly). `num_items_in_batch` is counted over the whole
//! window before its first forward (upstream's `get_batch_samples`); see
//! [`default_training_step`](crate::default_training_step) for when the loss is divided by
//! the window's length.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tch::{Device, Kind, Tensor};
use tchtrain_callbacks::{TrainerState, TrainingReferences};
use tchtrain_collators::Batch;
use tchtrain_training_args::{IntervalStrategy, SaveStrategy};

use crate::checkpoint::{self, get_last_checkpoint};
use crate::error::{Error, Result};
use crate::metrics::{Metrics, TrainOutput, metric_key, speed_metrics};
use crate::model_info::{floating_point_ops, parameters};
use crate::profile::{Phase, StepProfile};
use crate::step::{FusedBackward, StepContext, count_num_items_in_batch};
use crate::trainer::Trainer;
use tchtrain_accelerate::Reduction;
use tchtrain_data::DataLoader;
use tchtrain_distributed::ReduceOp;

/// An iterator that reads one item ahead (accelerate's `DataLoaderShard.__iter__`: `next_batch
/// = next(dataloader_iter)` before `yield current_batch`).
struct LookAhead<I: Iterator> {
    inner: I,
    ahead: Option<I::Item>,
    started: bool,
}

impl<I: Iterator> LookAhead<I> {
    fn new(inner: I) -> Self {
        Self {
            inner,
            ahead: None,
            started: false,
        }
    }
}

impl<I: Iterator> Iterator for LookAhead<I> {
    type Item = I::Item;

    fn next(&mut self) -> Option<I::Item> {
        if !self.started {
            self.started = true;
            self.ahead = self.inner.next();
        }
        let current = self.ahead.take()?;
        self.ahead = self.inner.next();
        Some(current)
    }
}

/// Where `train` resumes from (upstream's `resume_from_checkpoint`: a path, or `True`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResumeFrom {
    /// The `checkpoint-N` folder with the largest N in `output_dir`.
    Last,
    /// This checkpoint folder.
    Path(PathBuf),
}

/// accelerate's `should_reduce_batch_size`: whether an error's message is an out-of-memory
/// one (CUDA / HIP / XPU, MPS, the CPU allocator) or cuDNN's unsupported-size error.
pub(crate) fn should_reduce_batch_size(message: &str) -> bool {
    [
        " out of memory.",
        "MPS backend out of memory",
        "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
        "DefaultCPUAllocator: can't allocate memory",
        "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed",
    ]
    .iter()
    .any(|s| message.contains(s))
}

/// The numbers `set_initial_training_values` computes.
struct TrainingValues {
    num_train_epochs: usize,
    num_update_steps_per_epoch: usize,
    num_train_samples: f64,
    steps_in_epoch: usize,
    max_steps: usize,
}

/// Where the resumed epoch starts.
struct ResumePoint {
    resumed: bool,
    epochs_trained: usize,
    steps_trained_in_current_epoch: usize,
    /// The checkpoint's generator states, restored where upstream's `_load_rng_state` does.
    generator_states: Option<Vec<(String, Tensor)>>,
}

/// One epoch's progress (the locals of upstream's `_run_epoch`).
struct EpochRun<'a> {
    /// The epoch (from 0).
    epoch: usize,
    /// Its batches.
    steps_in_epoch: i64,
    /// The parameters clipping reads.
    params: &'a [Tensor],
    /// When training started (for the speed metrics of the logs).
    start: Instant,
    /// The last batch stepped (-1 before the first).
    step: i64,
    /// The last update's gradient norm, kept as a tensor until a log reads it (upstream's
    /// `.item()` in `_maybe_log_save_evaluate`): no host synchronisation per step for it.
    grad_norm: Option<Tensor>,
    /// The learning rate of the last update.
    learning_rate: Option<f64>,
}

impl Trainer {
    /// Upstream `train`: runs the training loop (resuming from a checkpoint when asked) and
    /// returns the final metrics. Bad arguments and data are reported before the first step.
    ///
    /// With `enable_jit_checkpoint`, a SIGINT or SIGTERM received during the call finishes
    /// the current optimizer step, saves a checkpoint at that step and returns normally; a
    /// second signal exits the process at once (status 130 / 143). The previous handlers
    /// are restored when `train` returns.
    ///
    /// While it runs, libtorch's CPU allocator keeps freed large blocks for reuse
    /// ([`CpuMemoryCache`](crate::CpuMemoryCache); `TCHTRAIN_CPU_CACHE_MB=0` turns it off).
    pub fn train(&mut self, resume_from_checkpoint: Option<ResumeFrom>) -> Result<TrainOutput> {
        if self.args.enable_jit_checkpoint {
            let guard = crate::signals::StopSignals::install().map_err(Error::Signal)?;
            self.loop_state.stop_signals = Some(guard);
        }
        self.diagnostics.memory_tracker.start("train");
        // Upstream `activate_neftune` / `deactivate_neftune` around the training.
        let neftune = self
            .args
            .neftune_noise_alpha
            .map(|alpha| self.model.context().activate_neftune(alpha));
        // Upstream: `apply_liger_kernel(self.model, self.args.liger_kernel_config)`.
        if self.args.use_liger_kernel {
            let config = self
                .args
                .liger_kernel_config
                .clone()
                .map(serde_json::Value::Object);
            self.model.apply_liger_kernel(config.as_ref())?;
        }
        // Upstream registers `DebugUnderflowOverflow(self.model)` at each `train()`.
        if self
            .args
            .debug
            .contains(&tchtrain_training_args::DebugOption::UnderflowOverflow)
        {
            self.diagnostics.debug_overflow = Some(Arc::new(Mutex::new(
                tchtrain_models::DebugUnderflowOverflow::default(),
            )));
        }
        let out = self.traced(|t| {
            if t.args.auto_find_batch_size {
                t.train_finding_batch_size(resume_from_checkpoint)
            } else {
                let cache = tchtrain_sys::cpu_cache::CpuMemoryCache::from_env();
                let out = t.train_inner(resume_from_checkpoint);
                drop(cache);
                out
            }
        });
        drop(neftune);
        // Dropping the guard restores the previous handlers.
        self.loop_state.stop_signals = None;
        out
    }

    /// `auto_find_batch_size` (upstream's `find_executable_batch_size` around the inner
    /// loop, accelerate's rule): the training runs from its start with the current batch
    /// size; after an out-of-memory error (a libtorch allocation failure, returned as an error
    /// or raised as a panic by tch's infallible ops: accelerate's `should_reduce_batch_size`
    /// messages) the batch size is multiplied by 0.9 and the training starts again; at 0, a
    /// typed error. Resuming, the checkpoint's `train_batch_size` is the start.
    ///
    /// An attempt can run out of memory after it stepped the optimizer (the first step
    /// fits, a later one adds the optimizer's state and does not). Upstream's retry then
    /// continues from the weights that attempt trained and with its optimizer's moments and
    /// step counts; here it starts again from the weights the training started with (kept
    /// as a copy in host memory while the search runs) and a fresh optimizer and scheduler
    /// (unless the caller passed them), so that the run equals one started with the batch
    /// size found.
    fn train_finding_batch_size(&mut self, resume: Option<ResumeFrom>) -> Result<TrainOutput> {
        if let Some(ckpt) = match &resume {
            Some(ResumeFrom::Path(p)) => Some(p.clone()),
            Some(ResumeFrom::Last) => get_last_checkpoint(&PathBuf::from(self.args.output_dir()))?,
            None => None,
        } {
            let saved = TrainerState::load_from_json(ckpt.join(checkpoint::TRAINER_STATE_NAME))?;
            if let Some(b) = saved.train_batch_size.and_then(|b| usize::try_from(b).ok()) {
                self.data.train_batch_size = b;
            }
        }
        let start: Vec<(Tensor, Tensor)> = tch::no_grad(|| {
            self.model
                .var_store()
                .trainable_variables()
                .into_iter()
                .map(|v| {
                    let copy = v.f_to_device(Device::Cpu)?.f_detach_copy()?;
                    Ok((v, copy))
                })
                .collect::<std::result::Result<_, tch::TchError>>()
        })?;
        loop {
            if self.data.train_batch_size == 0 {
                return Err(Error::InvalidArgument {
                    field: "auto_find_batch_size",
                    detail: "No executable batch size found, reached zero. (accelerate's message): even one row per batch runs out of memory; use a smaller model or block size, or more memory".into(),
                });
            }
            // A cache per attempt: dropping it hands the freed blocks back before the next.
            let cache = tchtrain_sys::cpu_cache::CpuMemoryCache::from_env();
            let attempt = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.train_inner(resume.clone())
            }));
            drop(cache);
            let message = match attempt {
                Ok(Ok(out)) => return Ok(out),
                Ok(Err(e)) => {
                    let text = e.to_string();
                    if !should_reduce_batch_size(&text) {
                        return Err(e);
                    }
                    text
                }
                Err(panic) => {
                    let text = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    if !should_reduce_batch_size(&text) {
                        std::panic::resume_unwind(panic);
                    }
                    text
                }
            };
            self.loop_state.is_in_train = false;
            self.accelerator.free_memory();
            tch::no_grad(|| {
                start
                    .iter()
                    .try_for_each(|(v, copy)| v.shallow_clone().f_copy_(copy))
            })?;
            if !self.optimization.optimizers_passed {
                // The attempt's optimizer state (moments, step counts) goes with it: the
                // next attempt builds a fresh one, as a run started at that size would.
                self.optimization.optimizer = None;
                self.optimization.lr_scheduler = None;
                self.optimization.created_lr_scheduler = false;
            }
            tchtrain_accelerate::clear_device_cache(self.device())?;
            let smaller = (self.data.train_batch_size as f64 * 0.9) as usize;
            log::warn!(
                "out of memory with {} rows per batch ({}); trying {smaller} (auto_find_batch_size)",
                self.data.train_batch_size,
                message.lines().next().unwrap_or_default()
            );
            self.data.train_batch_size = smaller;
        }
    }

    /// [`train`](Self::train) once the stop-signal handler is in place (when asked for).
    fn train_inner(&mut self, resume_from_checkpoint: Option<ResumeFrom>) -> Result<TrainOutput> {
        let resume = match resume_from_checkpoint {
            None => None,
            Some(ResumeFrom::Path(p)) => Some(p),
            Some(ResumeFrom::Last) => {
                let dir = PathBuf::from(self.args.output_dir());
                Some(get_last_checkpoint(&dir)?.ok_or(Error::NoCheckpoint { dir })?)
            }
        };
        self.check_before_training()?;
        self.check_train_labels()?;
        // Upstream `train`: `activation_checkpointing_enable` with `every_n_layers` and
        // `offload` taken out of the kwargs, the rest for torch's checkpoint.
        if self.args.activation_checkpointing {
            let settings = tchtrain_models::ActivationCheckpointing::from_kwargs(
                self.args.activation_checkpointing_kwargs.as_ref(),
            )?;
            self.model.activation_checkpointing_enable(settings)?;
        }
        // What the previous `train` prepared (DDP, the ZeRO engine) is built again.
        self.accelerator.free_memory();
        if let Some(ckpt) = &resume {
            self.check_resume_checkpoint(ckpt)?;
            // SHARDED_STATE_DICT: the shards restore the weights once the engine exists.
            if !crate::sharding::weights_only_in_shards(ckpt) {
                checkpoint::load_model_weights(&mut *self.model, ckpt)?;
            }
        }
        self.loop_state.is_in_train = true;
        let loader = self.get_train_dataloader()?;
        let values = self.set_initial_training_values(&loader)?;
        let point = self.init_training_state(&values, resume.as_deref())?;
        if self.optimization.created_lr_scheduler {
            self.optimization.lr_scheduler = None;
            self.optimization.created_lr_scheduler = false;
        }
        // ZeRO / FSDP: config checks, then the optimizer over the shards (zero.rs).
        let sharded = self.setup_sharding(values.max_steps)?;
        self.create_optimizer_and_scheduler(values.max_steps)?;
        if let Some(ckpt) = &resume {
            self.load_optimizer_and_scheduler(ckpt)?;
        }
        if !sharded {
            // DDP in a multi-process run: rank 0's parameters broadcast, buckets by name.
            let named = crate::model_info::named_parameters(&*self.model);
            self.accelerator
                .prepare_model(named.into_iter().map(|(_, t)| t).collect())?;
        }
        self.callback_handler.train_dataloader_len = Some(loader.len());

        let start = Instant::now();
        self.loop_state.start_time = Some(start);
        self.loop_state.initial_num_input_tokens_seen = self.state.num_input_tokens_seen;
        let initial_global_step = self.state.global_step;
        self.loop_state.tr_loss = Tensor::f_zeros([], (Kind::Float, self.device()))?;
        self.loop_state.total_loss_scalar = 0.0;
        self.loop_state.globalstep_last_logged = self.state.global_step;
        if let Some(opt) = self.optimization.optimizer.as_mut() {
            opt.zero_grad();
        }
        self.callback_handler
            .on_train_begin(&self.args, &self.state, &mut self.control)?;
        if self.args.eval_on_start {
            self.evaluate_during_training(true)?;
        }
        let params = parameters(&*self.model);
        self.loop_state.profile = (self.diagnostics.profile || crate::profile::requested())
            .then(|| StepProfile::start(self.device()));
        for epoch in point.epochs_trained..values.num_train_epochs {
            self.callback_handler
                .on_epoch_begin(&self.args, &self.state, &mut self.control)?;
            self.run_epoch(&loader, epoch, &values, &point, &params, start)?;
            if self.control.should_training_stop {
                break;
            }
        }
        if let Some(profile) = self.loop_state.profile.take() {
            self.write_profile(&profile)?;
        }
        self.finalize_training(&values, start, initial_global_step)
    }

    /// Bad input caught before training starts: no or empty training data, an evaluation
    /// strategy without evaluation data, options not implemented yet.
    fn check_before_training(&self) -> Result<()> {
        if self.data.train_stream.is_some() {
            if self.args.max_steps <= 0 {
                return Err(Error::InvalidArgument {
                    field: "max_steps",
                    detail: format!(
                        "must be set to a positive value when the training data is a stream (it has no length), was {}",
                        self.args.max_steps
                    ),
                });
            }
        } else if let Some(train) = &self.data.train_dataset {
            if train.is_empty() {
                return Err(Error::EmptyDataset {
                    what: "training",
                    hint: String::new(),
                });
            }
        } else {
            return Err(Error::MissingDataset {
                what: "training".into(),
                dataset: "train",
                fix: "pass one with TrainerBuilder::train_dataset",
            });
        }
        if self.args.eval_strategy != IntervalStrategy::No && self.data.eval_dataset.is_none() {
            return Err(Error::MissingDataset {
                what: format!("eval_strategy=\"{}\"", self.args.eval_strategy.as_str()),
                dataset: "eval",
                fix: "pass one with TrainerBuilder::eval_dataset or set eval_strategy to \"no\"",
            });
        }
        if self.args.gradient_accumulation_steps == 0 {
            return Err(Error::InvalidArgument {
                field: "gradient_accumulation_steps",
                detail: "must be at least 1".into(),
            });
        }
        if self.args.max_steps <= 0 && self.args.num_train_epochs <= 0.0 {
            return Err(Error::InvalidArgument {
                field: "num_train_epochs",
                detail: "must be positive when max_steps is not set".into(),
            });
        }
        if self.args.fp16
            && self.accelerator.scaler().is_none()
            && self.args.deepspeed.is_none()
            && !crate::sharding::fsdp_requested(&self.args)
        {
            // As accelerate: fp16 enables autocast and loss scaling on accelerators only.
            log::warn!(
                "fp16 has no effect on the CPU (accelerate enables float16 autocast and loss \
                 scaling only on accelerators): training runs in float32, as upstream's does; \
                 use --bf16 for mixed precision on the CPU"
            );
        }
        Ok(())
    }

    /// Upstream `set_initial_training_values`.
    fn set_initial_training_values(&self, loader: &DataLoader) -> Result<TrainingValues> {
        let ga = self.args.gradient_accumulation_steps;
        if loader.is_stream() {
            // No length: rely on max_steps, as many passes over the stream as needed.
            let max_steps = self.args.max_steps.max(1) as usize;
            let total_batch = self.data.train_batch_size * ga * self.args.world_size();
            return Ok(TrainingValues {
                num_train_epochs: usize::MAX,
                num_update_steps_per_epoch: max_steps,
                num_train_samples: (max_steps * total_batch) as f64,
                steps_in_epoch: max_steps * ga,
                max_steps,
            });
        }
        let len = loader.len();
        if len == 0 {
            return Err(Error::EmptyDataset {
                what: "training",
                hint: ": dataloader_drop_last leaves no full batch".into(),
            });
        }
        let per_epoch = (len / ga + usize::from(!len.is_multiple_of(ga))).max(1);
        let max_steps = if self.args.max_steps > 0 {
            self.args.max_steps as usize
        } else {
            (self.args.num_train_epochs * per_epoch as f64).ceil() as usize
        };
        let total_batch = self.data.train_batch_size * ga * self.args.world_size();
        let (num_train_epochs, num_train_samples) = if self.args.max_steps > 0 {
            (
                max_steps / per_epoch + usize::from(max_steps % per_epoch > 0),
                (max_steps * total_batch) as f64,
            )
        } else {
            (
                self.args.num_train_epochs.ceil() as usize,
                loader.num_examples() as f64 * self.args.num_train_epochs,
            )
        };
        Ok(TrainingValues {
            num_train_epochs,
            num_update_steps_per_epoch: per_epoch,
            num_train_samples,
            steps_in_epoch: len,
            max_steps,
        })
    }

    /// Upstream `_init_training_state`.
    fn init_training_state(
        &mut self,
        values: &TrainingValues,
        resume: Option<&std::path::Path>,
    ) -> Result<ResumePoint> {
        self.state = TrainerState::with_stateful_callbacks(
            self.callback_handler.exportable_states(&self.control),
        );
        self.state.train_batch_size = Some(self.data.train_batch_size as i64);
        self.state
            .compute_steps(&self.args, values.max_steps as i64);
        let mut point = ResumePoint {
            resumed: resume.is_some(),
            epochs_trained: 0,
            steps_trained_in_current_epoch: 0,
            generator_states: None,
        };
        if let Some(ckpt) = resume {
            let path = ckpt.join(checkpoint::TRAINER_STATE_NAME);
            if path.is_file() {
                self.state = TrainerState::load_from_json(&path)?;
                if let Some(best) = &self.state.best_model_checkpoint
                    && !std::path::Path::new(best).is_dir()
                {
                    log::warn!(
                        "The best checkpoint {best} recorded in the resumed state does not exist anymore. Ignoring it for this run."
                    );
                    self.state.best_model_checkpoint = None;
                }
                checkpoint::check_rng_state(ckpt, self)?;
                point.generator_states = checkpoint::read_generator_states(
                    ckpt,
                    self.device(),
                    self.args.world_size(),
                    self.args.process_index(),
                )?;
                // Upstream `_load_callback_state`: only with
                // `restore_callback_states_from_checkpoint` (default false); the stored states
                // stay in `stateful_callbacks` either way.
                if self.args.restore_callback_states_from_checkpoint {
                    let stateful = self.state.stateful_callbacks.clone();
                    self.callback_handler
                        .load_callback_state(&stateful, &mut self.control)?;
                }
                let step = self.state.global_step.max(0) as usize;
                point.epochs_trained = step / values.num_update_steps_per_epoch;
                if !self.args.ignore_data_skip {
                    point.steps_trained_in_current_epoch = (step
                        % values.num_update_steps_per_epoch)
                        * self.args.gradient_accumulation_steps;
                }
            }
        }
        self.state.init_training_references(TrainingReferences {
            max_steps: values.max_steps as i64,
            num_train_epochs: values.num_train_epochs as i64,
            is_local_process_zero: self.is_local_process_zero(),
            is_world_process_zero: self.is_world_process_zero(),
            trial_name: None,
            trial_params: None,
        });
        Ok(point)
    }

    /// Upstream `_run_epoch`: the accumulation windows of one epoch, each batch's training
    /// step, and after each window the optimizer update ([`EpochRun`] holds the epoch's
    /// progress).
    fn run_epoch(
        &mut self,
        loader: &DataLoader,
        epoch: usize,
        values: &TrainingValues,
        point: &ResumePoint,
        params: &[Tensor],
        start: Instant,
    ) -> Result<()> {
        let ga = self.args.gradient_accumulation_steps;
        let mut run = EpochRun {
            epoch,
            steps_in_epoch: values.steps_in_epoch as i64,
            params,
            start,
            step: -1,
            grad_norm: None,
            learning_rate: None,
        };
        let (mut batches, first_update, mut rng_to_sync) =
            self.epoch_batches(loader, point, &mut run)?;
        let remainder = match values.steps_in_epoch % ga {
            0 => ga,
            r => r,
        };
        for update_step in first_update..values.num_update_steps_per_epoch {
            let num_batches = if update_step + 1 != values.num_update_steps_per_epoch {
                ga
            } else {
                remainder
            };
            let window: Vec<Batch> = batches
                .by_ref()
                .take(num_batches)
                .map(|b| self.batch_to_device(&b?))
                .collect::<Result<_>>()?;
            let current_ga = window.len();
            if let Some(states) = rng_to_sync.take() {
                checkpoint::restore_generator_states(states, self.device())?;
            }
            let num_items = count_num_items_in_batch(&window, &self.step_context(current_ga))?;
            self.prof_mark(Phase::Data);
            for inputs in &window {
                run.step += 1;
                let do_sync_step =
                    (run.step + 1) % ga as i64 == 0 || run.step + 1 == run.steps_in_epoch;
                // Upstream's `gradient_state._set_sync_gradients(do_sync_step)`: the other
                // batches' backward runs under DDP's `no_sync`.
                self.accelerator.set_sync_gradients(do_sync_step);
                if run.step % ga as i64 == 0 {
                    self.callback_handler.on_step_begin(
                        &self.args,
                        &self.state,
                        &mut self.control,
                    )?;
                }
                self.prof_mark(Phase::Callbacks);
                let tr_loss_step =
                    self.run_training_step(inputs, num_items.as_ref(), current_ga)?;
                self.after_training_step(inputs, &tr_loss_step)?;
                if do_sync_step {
                    self.optimizer_update(&mut run)?;
                } else {
                    self.callback_handler.on_substep_end(
                        &self.args,
                        &self.state,
                        &mut self.control,
                    )?;
                    self.prof_mark(Phase::Callbacks);
                }
                if self.control.should_epoch_stop || self.control.should_training_stop {
                    break;
                }
            }
            if self.control.should_epoch_stop || self.control.should_training_stop {
                break;
            }
        }
        self.end_epoch(&run)
    }

    /// The epoch's batches: on the epoch a run resumes in, the batches already trained are
    /// skipped (`run.step` set after them) and the generators restored, before the first
    /// batch is drawn when none are skipped, else after the first window is fetched (the
    /// states returned, with the first update step). With `dataloader_num_workers > 0` the
    /// batches are read and collated on a background thread, `dataloader_prefetch_factor`
    /// (default 2) ahead.
    #[allow(clippy::type_complexity)]
    fn epoch_batches<'p>(
        &self,
        loader: &DataLoader,
        point: &'p ResumePoint,
        run: &mut EpochRun<'_>,
    ) -> Result<(
        Box<dyn Iterator<Item = Result<Batch>>>,
        usize,
        Option<&'p [(String, Tensor)]>,
    )> {
        let resuming_here = point.resumed && run.epoch == point.epochs_trained;
        let skip = if resuming_here {
            point.steps_trained_in_current_epoch
        } else {
            0
        };
        if resuming_here
            && skip == 0
            && let Some(states) = &point.generator_states
        {
            checkpoint::restore_generator_states(states, self.device())?;
        }
        let mut batches = loader.epoch(run.epoch as u64);
        let (mut first_update, mut rng_to_sync) = (0, None);
        if skip > 0 {
            batches.skip_batches(skip);
            run.step = skip as i64 - 1;
            first_update = skip / self.args.gradient_accumulation_steps;
            rng_to_sync = point.generator_states.as_deref();
        }
        let batches: Box<dyn Iterator<Item = Result<Batch>>> =
            if self.args.dataloader_num_workers > 0 {
                let depth = self.args.dataloader_prefetch_factor.unwrap_or(2).max(1);
                Box::new(batches.prefetch(depth).map(|b| b.map_err(Error::from)))
            } else {
                // accelerate's `DataLoaderShard` reads the next batch before it hands out the
                // current one: a dataset or collator that draws from the global generator
                // when a row is fetched (run_image_classification's random crops) draws in
                // upstream's order.
                Box::new(LookAhead::new(batches.map(|b| b.map_err(Error::from))))
            };
        Ok((batches, first_update, rng_to_sync))
    }

    /// One batch's training step through the hooks (upstream's `self.training_step(model,
    /// inputs, num_items_in_batch)`), in the accelerator's forward scope; the detached loss.
    fn run_training_step(
        &mut self,
        inputs: &Batch,
        num_items: Option<&Tensor>,
        current_ga: usize,
    ) -> Result<Tensor> {
        // Upstream's `training_step` starts with `optimizer.train()` (schedule-free
        // optimizers move the parameters to the point the gradient is taken at; a no-op for
        // the others). The hook gets no optimizer, so the loop calls it just before the hook,
        // every micro-step as upstream.
        if let Some(opt) = self.optimization.optimizer.as_mut() {
            opt.train()?;
        }
        // LOMO / AdaLomo: upstream's training_step passes `learning_rate=
        // self._get_learning_rate()` to `accelerator.backward`, which runs the optimizer's
        // `fused_backward(loss, lr)`.
        let fused_lr = self
            .optimization
            .optimizer
            .as_deref()
            .is_some_and(|o| o.fuses_backward())
            .then(|| self.get_learning_rate());
        // The default training step adds its forward's time here when profiling.
        let forward_time = std::cell::Cell::new(std::time::Duration::ZERO);
        let tokens_seen = std::cell::Cell::new(self.state.num_input_tokens_seen);
        let loss = {
            let scope = self.accelerator.forward_scope(true)?;
            let hooks = Arc::clone(&self.hooks);
            let optimizer = std::cell::RefCell::new(self.optimization.optimizer.as_deref_mut());
            let fused = |loss: &Tensor| -> Result<()> {
                let mut opt = optimizer
                    .try_borrow_mut()
                    .map_err(|_| Error::InvalidArgument {
                        field: "training_step",
                        detail: "the fused backward (LOMO / AdaLomo) was called from inside itself"
                            .into(),
                    })?;
                match (opt.as_deref_mut(), fused_lr) {
                    (Some(opt), Some(lr)) => Ok(opt.fused_backward(loss, lr)?),
                    _ => Ok(()),
                }
            };
            let mut ctx = StepContext::new(
                &self.args,
                &self.facts,
                &self.accelerator,
                current_ga,
                self.state.global_step,
            );
            if fused_lr.is_some() {
                ctx.fused_backward = Some(FusedBackward(&fused));
            }
            if self.loop_state.profile.is_some() {
                ctx.forward_time = Some(&forward_time);
            }
            ctx.num_input_tokens_seen = Some(&tokens_seen);
            let model = &mut *self.model;
            let parts = model.context().clone();
            scope.run(&parts, || {
                hooks.training_step(&ctx, model, inputs, num_items)
            })?
        };
        if let Some(p) = self.loop_state.profile.as_mut() {
            p.mark_training_step(forward_time.get());
        }
        self.state.num_input_tokens_seen = tokens_seen.get();
        Ok(loss)
    }

    /// What follows each training step: the device cache emptied every
    /// `torch_empty_cache_steps` (checked after every micro-step, at the current global
    /// step, as upstream), the loss accumulated, the FLOs and input tokens counted.
    fn after_training_step(&mut self, inputs: &Batch, tr_loss_step: &Tensor) -> Result<()> {
        if let Some(n) = self.args.torch_empty_cache_steps
            && n > 0
            && self.state.global_step % n == 0
        {
            tchtrain_accelerate::clear_device_cache(self.accelerator.device())?;
        }
        self.accumulate_loss(tr_loss_step)?;
        self.loop_state.current_flos += floating_point_ops(
            self.loop_state.num_params_without_embeddings,
            inputs,
            self.loop_state.main_input_name,
        );
        self.track_num_input_tokens(inputs)?;
        self.prof_mark(Phase::Other);
        Ok(())
    }

    /// The update at the end of an accumulation window: clipping (a non-finite norm stops
    /// the run when asked, unless loss scaling skips the step), the optimizer step, the
    /// learning rate read and the scheduler stepped in upstream's order, the global step,
    /// the step's callbacks, a stop signal, then logging / saving / evaluation.
    fn optimizer_update(&mut self, run: &mut EpochRun<'_>) -> Result<()> {
        let norm = self.accelerator.clip_grad_norm_(
            run.params,
            self.args.max_grad_norm,
            self.created_optimizer()?,
        )?;
        // With loss scaling a non-finite norm is a skipped step, not a divergence.
        if self.diagnostics.stop_on_non_finite
            && self.accelerator.scaler().is_none()
            && !self.accelerator.loss_scaled_engine()
        {
            let value = norm.f_double_value(&[])?;
            if !value.is_finite() {
                return Err(self.stop_non_finite(value));
            }
        }
        run.grad_norm = Some(norm);
        self.callback_handler
            .on_pre_optimizer_step(&self.args, &self.state, &mut self.control)?;
        let step_was_skipped = match self.optimization.optimizer.as_deref_mut() {
            Some(opt) => self.accelerator.optimizer_step(opt)?,
            None => false,
        };
        self.callback_handler
            .on_optimizer_step(&self.args, &self.state, &mut self.control)?;
        // Upstream reads the lr before stepping the scheduler, except when DeepSpeed owns it
        // (a `scheduler` or `optimizer` section: the `DummyScheduler` its `engine.step()`
        // steps inside `accelerator.backward`), which has stepped by then.
        let stepped_by_deepspeed = self.deepspeed_steps_scheduler();
        if !stepped_by_deepspeed {
            run.learning_rate = Some(self.get_learning_rate());
        }
        if let (Some(sched), Some(opt)) = (
            self.optimization.lr_scheduler.as_mut(),
            self.optimization.optimizer.as_mut(),
        ) && !sched.steps_on_metric()
            && !step_was_skipped
        {
            sched.step(opt.as_mut())?;
        }
        if stepped_by_deepspeed {
            run.learning_rate = Some(self.get_learning_rate());
        }
        if let Some(opt) = self.optimization.optimizer.as_mut() {
            opt.zero_grad();
        }
        self.prof_mark(Phase::Optimizer);
        self.state.global_step += 1;
        self.state.epoch = run.epoch as f64 + (run.step + 1) as f64 / run.steps_in_epoch as f64;
        self.callback_handler
            .on_step_end(&self.args, &self.state, &mut self.control)?;
        if let Some(sig) = self.agreed_stop_signal()? {
            // enable_jit_checkpoint: checkpoint at this step boundary, then stop.
            log::warn!(
                "{} received: saving a checkpoint at step {} and stopping (send it again to exit at once)",
                crate::signals::name(sig),
                self.state.global_step
            );
            self.control.should_save = true;
            self.control.should_training_stop = true;
        }
        self.prof_mark(Phase::Callbacks);
        self.maybe_log_save_evaluate(run.grad_norm.as_ref(), run.learning_rate, run.start)?;
        self.prof_mark(Phase::LogSaveEvaluate);
        if let Some(p) = self.loop_state.profile.as_mut() {
            p.step_done();
        }
        Ok(())
    }

    /// The end of an epoch: a warning and a stop when it had no batch, `on_epoch_end`, then
    /// logging / saving / evaluation.
    fn end_epoch(&mut self, run: &EpochRun<'_>) -> Result<()> {
        if run.step < 0 {
            log::warn!(
                "There seems not to be a single sample in your epoch_iterator, stopping training at step {}!",
                self.state.global_step
            );
            self.control.should_training_stop = true;
        }
        self.callback_handler
            .on_epoch_end(&self.args, &self.state, &mut self.control)?;
        self.prof_mark(Phase::Callbacks);
        self.maybe_log_save_evaluate(run.grad_norm.as_ref(), run.learning_rate, run.start)?;
        self.prof_mark(Phase::LogSaveEvaluate);
        Ok(())
    }

    /// The stop signal (SIGINT / SIGTERM) received with `enable_jit_checkpoint`, agreed on by
    /// every process: in a data-parallel run the ranks see a signal at different steps (or
    /// only some get one), so at each step boundary they sum their flags (one scalar
    /// all-reduce per step, only with `enable_jit_checkpoint`) and all stop and save at the
    /// same step when any of them was signalled. The signal reported is this process's, or
    /// SIGTERM when only another process got one.
    fn agreed_stop_signal(&mut self) -> Result<Option<i32>> {
        let Some(guard) = self.loop_state.stop_signals.as_ref() else {
            return Ok(None);
        };
        let local = guard.received();
        if self.args.world_size() <= 1 {
            return Ok(local);
        }
        let any = self
            .accelerator
            .reduce_scalar(f64::from(u8::from(local.is_some())), ReduceOp::Sum)?;
        Ok(match local {
            Some(sig) => Some(sig),
            None if any > 0.0 => Some(crate::signals::SIGTERM),
            None => None,
        })
    }

    /// Charges the time since the last mark to `phase` when profiling (`TCHTRAIN_PROFILE`).
    fn prof_mark(&mut self, phase: Phase) {
        if let Some(p) = self.loop_state.profile.as_mut() {
            p.mark(phase);
        }
    }

    /// `_tr_loss += tr_loss_step`, with upstream's `logging_nan_inf_filter`.
    ///
    /// Computed on the device (a `where` between the two sums) instead of reading the step's
    /// loss to the host: no synchronisation per micro-batch.
    fn accumulate_loss(&mut self, step_loss: &Tensor) -> Result<()> {
        let step_loss = step_loss
            .f_to_kind(Kind::Float)?
            .f_to_device(self.device())?;
        let ls = &mut self.loop_state;
        let added = ls.tr_loss.f_add(&step_loss)?;
        ls.tr_loss = if self.args.logging_nan_inf_filter {
            let n = 1 + self.state.global_step - ls.globalstep_last_logged;
            let filtered = ls.tr_loss.f_add(&ls.tr_loss.f_div_scalar(n as f64)?)?;
            added.f_where_self(&step_loss.f_isfinite()?, &filtered)?
        } else {
            added
        };
        Ok(())
    }

    /// [`TrainerBuilder::stop_on_non_finite`](crate::TrainerBuilder::stop_on_non_finite):
    /// drops the step's gradients, saves the state after the previous step and returns the
    /// error that stops the run (the save's, when it fails).
    fn stop_non_finite(&mut self, grad_norm: f64) -> Error {
        if let Some(opt) = self.optimization.optimizer.as_mut() {
            opt.zero_grad();
        }
        let run_dir = std::path::PathBuf::from(self.args.output_dir());
        let checkpoint = run_dir.join(format!(
            "{}-{}",
            checkpoint::PREFIX_CHECKPOINT_DIR,
            self.state.global_step
        ));
        if let Err(e) = self.save_checkpoint() {
            return e;
        }
        Error::NonFiniteLoss {
            step: self.state.global_step + 1,
            grad_norm,
            checkpoint,
        }
    }

    /// Prints the profile to stderr and writes `output_dir/profile.json` (main process).
    fn write_profile(&self, profile: &StepProfile) -> Result<()> {
        let (text, json) = profile.report();
        eprint!("{text}");
        if self.is_world_process_zero() {
            let dir = std::path::PathBuf::from(self.args.output_dir());
            std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating", &dir, e))?;
            let path = dir.join("profile.json");
            let body = serde_json::to_string_pretty(&json).map_err(|source| Error::Json {
                path: path.clone(),
                source,
            })?;
            std::fs::write(&path, body).map_err(|e| Error::io("writing", &path, e))?;
        }
        Ok(())
    }

    /// The optimizer, which `train` creates before the first step.
    fn created_optimizer(&self) -> Result<&dyn tchtrain_optim::Optimizer> {
        self.optimization
            .optimizer
            .as_deref()
            .ok_or(Error::InvalidArgument {
                field: "optimizers",
                detail: "no optimizer: train creates one unless given".into(),
            })
    }

    /// Upstream `_track_num_input_tokens` (`include_num_input_tokens_seen`).
    fn track_num_input_tokens(&mut self, inputs: &Batch) -> Result<()> {
        let mode = self.args.include_num_input_tokens_seen.as_str();
        if mode == "no" {
            return Ok(());
        }
        let Some(ids) = inputs.get("input_ids") else {
            log::warn!("Tried to track the number of tokens seen, but the batch has no input_ids.");
            return Ok(());
        };
        let n = match (mode, inputs.get("attention_mask")) {
            ("non_padding", Some(mask)) => mask.f_sum(Kind::Int64)?.f_int64_value(&[])?,
            _ => ids.numel() as i64,
        };
        let n = self.accelerator.reduce_scalar(n as f64, ReduceOp::Sum)? as i64;
        self.state.num_input_tokens_seen += n;
        Ok(())
    }

    /// Upstream `_maybe_log_save_evaluate`.
    fn maybe_log_save_evaluate(
        &mut self,
        grad_norm: Option<&Tensor>,
        learning_rate: Option<f64>,
        start: Instant,
    ) -> Result<()> {
        if self.control.should_log
            && self.state.global_step > self.loop_state.globalstep_last_logged
        {
            // Upstream `self._nested_gather(tr_loss).mean().item()`.
            let tr_loss_scalar = self
                .accelerator
                .reduce(&self.loop_state.tr_loss, Reduction::Mean)?
                .f_double_value(&[])?;
            self.loop_state.tr_loss = Tensor::f_zeros([], (Kind::Float, self.device()))?;
            let steps = self.state.global_step - self.loop_state.globalstep_last_logged;
            let mut logs = vec![("loss".to_string(), tr_loss_scalar / steps as f64)];
            if let Some(g) = grad_norm {
                logs.push(("grad_norm".into(), g.f_double_value(&[])?));
            }
            logs.push((
                "learning_rate".into(),
                learning_rate.unwrap_or_else(|| self.get_learning_rate()),
            ));
            self.loop_state.total_loss_scalar += tr_loss_scalar;
            self.loop_state.globalstep_last_logged = self.state.global_step;
            self.store_flos()?;
            self.log(logs, Some(start))?;
        }
        if self.control.should_evaluate {
            let metrics = self.evaluate_during_training(false)?;
            let is_new_best = self.determine_best_metric(&metrics)?;
            if self.args.save_strategy == SaveStrategy::Best {
                self.control.should_save = is_new_best;
            }
        }
        if self.control.should_save {
            // ZeRO-3 gathers rank 0's model file unit by unit (`save_sharded_state`).
            self.save_checkpoint()?;
            self.callback_handler
                .on_save(&self.args, &self.state, &mut self.control)?;
        }
        // ZeRO-3: only the shards are kept between steps.
        Ok(self.accelerator.release_parameters()?)
    }

    /// Upstream `_determine_best_metric`: whether `metrics` holds a new best
    /// `metric_for_best_model` (recorded in the state with its step).
    fn determine_best_metric(&mut self, metrics: &Metrics) -> Result<bool> {
        let Some(name) = &self.args.metric_for_best_model else {
            return Ok(false);
        };
        let key = metric_key(name);
        let value = *metrics.get(&key).ok_or_else(|| Error::MetricNotFound {
            metric: key.clone(),
            available: metrics.keys().cloned().collect::<Vec<_>>().join(", "),
        })?;
        let greater = self
            .args
            .greater_is_better
            .unwrap_or(!key.ends_with("loss"));
        let best = self.state.best_metric.unwrap_or(if greater {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        });
        let better = if greater { value > best } else { value < best };
        if better {
            self.state.best_metric = Some(value);
            if self.args.save_strategy != SaveStrategy::No {
                self.state.best_global_step = Some(self.state.global_step);
            }
        }
        Ok(better)
    }

    /// Upstream `_finalize_training`.
    fn finalize_training(
        &mut self,
        values: &TrainingValues,
        start: Instant,
        initial_global_step: i64,
    ) -> Result<TrainOutput> {
        self.loop_state.total_loss_scalar += self.loop_state.tr_loss.f_double_value(&[])?;
        // A sharded run ends with the full parameters in the model.
        self.accelerator.gather_parameters()?;
        let steps = self.state.global_step - initial_global_step;
        let train_loss = self.loop_state.total_loss_scalar / (steps as f64).max(0.001);
        let mut metrics = speed_metrics(
            "train",
            start,
            Some(values.num_train_samples * steps as f64 / (values.max_steps.max(1)) as f64),
            Some(steps as f64),
            None,
        );
        self.store_flos()?;
        metrics.push(("total_flos".into(), self.state.total_flos));
        metrics.push(("train_loss".into(), train_loss));
        let mut memory = Metrics::new();
        self.diagnostics
            .memory_tracker
            .stop_and_update_metrics("train", Some(&mut memory));
        metrics.extend(memory);
        self.log(metrics.clone(), None)?;
        if self.args.load_best_model_at_end
            && let Some(best) = self.state.best_model_checkpoint.clone()
        {
            // Every process waits until rank 0 has written its checkpoints.
            self.accelerator.wait_for_everyone()?;
            checkpoint::load_model_weights(&mut *self.model, std::path::Path::new(&best))?;
        }
        self.delete_all_but_best()?;
        // Callbacks that save the final model themselves upstream (W&B's
        // `WANDB_LOG_MODEL=end`, a throwaway Trainer's `save_model` into a temporary folder):
        // saved once here, on every rank (the save may gather), for them to read.
        if self.callback_handler.saves_model_at_train_end() {
            let dir = std::env::temp_dir().join(format!(
                "tchtrain-final-model-{}-{}",
                std::process::id(),
                self.state.global_step
            ));
            let _ = std::fs::remove_dir_all(&dir);
            let handed = self.save_model(Some(&dir)).and_then(|_| {
                Ok(self
                    .callback_handler
                    .on_model_saved(&self.args, &self.state, &dir)?)
            });
            let _ = std::fs::remove_dir_all(&dir);
            handed?;
        }
        self.callback_handler
            .on_train_end(&self.args, &self.state, &mut self.control)?;
        self.loop_state.is_in_train = false;
        let mut out: Metrics = metrics.into_iter().collect();
        out.insert("epoch".into(), self.state.epoch);
        // Upstream hands this very dict to `on_log`, and its PrinterCallback (the progress
        // callback under `disable_tqdm`) pops `total_flos` from it there: the returned
        // metrics (a script's `train_results.json`) lack it then; the log history keeps it.
        if self
            .callback_handler
            .get::<tchtrain_callbacks::PrinterCallback>()
            .is_some()
        {
            out.remove("total_flos");
        }
        Ok(TrainOutput {
            global_step: self.state.global_step,
            training_loss: train_loss,
            metrics: out,
        })
    }
}

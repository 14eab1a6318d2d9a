//! `Trainer`: the model, arguments, data, callbacks, optimizer and scheduler of one
//! training, built with [`TrainerBuilder`]. The loop is in `train_loop.rs`, evaluation in
//! `evaluation.rs`, checkpoints in `checkpoint.rs`.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use tch::{Device, Kind, Tensor};
use tchtrain_accelerate::{Accelerator, AcceleratorOptions, MixedPrecision};
use tchtrain_callbacks::{
    CallbackHandler, DefaultFlowCallback, JsonMap, ModelConfig, PrinterCallback, ProgressCallback,
    TrainerCallback, TrainerControl, TrainerState, check_trackio_args,
    get_reporting_integration_callbacks, reporting_integrations,
};
use tchtrain_collators::{
    Batch, DataCollator, DataCollatorWithPadding, DefaultDataCollator, Feature,
};
use tchtrain_data::{
    DataLoader, Dataset, IterableDataset, LengthGroupedSampler, RandomSampler, Sampler,
    SequentialSampler, SharedCollator, shared_collator,
};
use tchtrain_models::{ModelOutput, PreTrainedTokenizerFast, TrainableModel};
use tchtrain_optim::{GradScaler, GradScalerKwargs, LrScheduler, Optimizer};
use tchtrain_training_args::TrainingArguments;

use crate::error::{Error, Result};
use crate::metrics::PredictionOutput;
use crate::metrics::{ComputeMetrics, EvalPrediction, Metrics, PreprocessLogits};
use crate::model_info;
use crate::step::{PredictionStepOutput, StepContext, StepFacts, default_compute_loss};

/// Customisation points of the Trainer: the Rust form of subclassing `Trainer` and
/// overriding the methods upstream documents for it. Each method defaults to upstream's
/// behaviour, which the `default_*` functions of this crate run (an override's `super()`).
///
/// The step methods (`compute_loss`, `training_step`, `prediction_step`) get a
/// [`StepContext`] and the model; the others get the Trainer itself, whose entry points a
/// hook may call as an upstream override calls `self.evaluate()` (they dispatch to the same
/// hooks). An override's `super()` is the matching `default_*` function. The methods take
/// `&self`, as the Trainer shares its hooks with the calls it makes from inside one: state a
/// hook keeps goes in a `Mutex` or an atomic.
pub trait TrainerHooks: Send + Sync {
    /// Upstream `compute_loss`: runs the model on `inputs` (with `num_items_in_batch` when
    /// the model accepts loss kwargs) and returns its loss and outputs.
    fn compute_loss(
        &self,
        ctx: &StepContext<'_>,
        model: &dyn TrainableModel,
        inputs: &Batch,
        num_items_in_batch: Option<&Tensor>,
    ) -> Result<(Tensor, ModelOutput)> {
        default_compute_loss(ctx, model, inputs, num_items_in_batch)
    }

    /// Upstream's `loss_is_scaled_for_ga` attribute: `Some(false)` when an overridden
    /// [`compute_loss`](Self::compute_loss) returns a per-batch mean (the Trainer then divides
    /// it by the accumulation steps), `Some(true)` when it is already normalised over the
    /// whole accumulated batch, `None` (default) for upstream's rule (see
    /// [`default_training_step`](crate::default_training_step)).
    fn loss_is_scaled_for_ga(&self) -> Option<bool> {
        None
    }

    /// Upstream `training_step`: forward, loss scaling for gradient accumulation, backward;
    /// returns the detached loss that is logged. The Trainer calls the optimizer's
    /// [`train`](tchtrain_optim::Optimizer::train) just before (upstream's `training_step`
    /// starts with it), so an override need not.
    fn training_step(
        &self,
        ctx: &StepContext<'_>,
        model: &mut dyn TrainableModel,
        inputs: &Batch,
        num_items_in_batch: Option<&Tensor>,
    ) -> Result<Tensor> {
        ctx.run_training_step(self, model, inputs, num_items_in_batch)
    }

    /// Upstream `prediction_step`: the loss (when the batch has every label), and unless
    /// `prediction_loss_only`, the logits and labels; no gradients.
    fn prediction_step(
        &self,
        ctx: &StepContext<'_>,
        model: &dyn TrainableModel,
        inputs: &Batch,
        prediction_loss_only: bool,
    ) -> Result<PredictionStepOutput> {
        ctx.run_prediction_step(self, model, inputs, prediction_loss_only)
    }

    /// Upstream `get_train_dataloader`: the training batches (see
    /// [`default_get_train_dataloader`](crate::default_get_train_dataloader)).
    fn get_train_dataloader(&self, trainer: &Trainer) -> Result<DataLoader> {
        trainer.default_train_dataloader()
    }

    /// Upstream `get_eval_dataloader`: the evaluation batches of `eval_dataset` or the
    /// Trainer's (see [`default_get_eval_dataloader`](crate::default_get_eval_dataloader)).
    fn get_eval_dataloader(
        &self,
        trainer: &Trainer,
        eval_dataset: Option<Arc<dyn Dataset>>,
    ) -> Result<DataLoader> {
        trainer.default_eval_dataloader(eval_dataset)
    }

    /// Upstream `get_test_dataloader`: the batches `predict` runs over.
    fn get_test_dataloader(
        &self,
        trainer: &Trainer,
        test_dataset: Arc<dyn Dataset>,
    ) -> Result<DataLoader> {
        trainer.default_eval_dataloader(Some(test_dataset))
    }

    /// Upstream `create_optimizer_and_scheduler`: the optimizer and the learning-rate
    /// scheduler of a run of `num_training_steps` steps (see
    /// [`Trainer::create_optimizer`], [`Trainer::create_scheduler`]).
    fn create_optimizer_and_scheduler(
        &self,
        trainer: &mut Trainer,
        num_training_steps: usize,
    ) -> Result<()> {
        trainer.create_optimizer()?;
        trainer.create_scheduler(num_training_steps)
    }

    /// Upstream `log`: records `logs` in the state's `log_history` and calls `on_log`
    /// (see [`default_log`](crate::default_log)).
    fn log(
        &self,
        trainer: &mut Trainer,
        logs: Vec<(String, f64)>,
        start_time: Option<Instant>,
    ) -> Result<()> {
        trainer.default_log(logs, start_time)
    }

    /// Upstream `evaluate` (see [`default_evaluate`](crate::default_evaluate)).
    fn evaluate(
        &self,
        trainer: &mut Trainer,
        eval_dataset: Option<Arc<dyn Dataset>>,
        metric_key_prefix: &str,
    ) -> Result<Metrics> {
        trainer.evaluate_with(self, eval_dataset, metric_key_prefix)
    }

    /// Upstream `predict` (see [`default_predict`](crate::default_predict)).
    fn predict(
        &self,
        trainer: &mut Trainer,
        test_dataset: Arc<dyn Dataset>,
        metric_key_prefix: &str,
    ) -> Result<PredictionOutput> {
        trainer.predict_with(self, test_dataset, metric_key_prefix)
    }
}

/// The hooks of a plain `Trainer`: every method as upstream.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultHooks;

impl TrainerHooks for DefaultHooks {}

/// Upstream's `Trainer`: trains and evaluates a [`TrainableModel`] (a hub model, or one of
/// the user's own) with the knobs of
/// [`TrainingArguments`], reporting to callbacks and writing upstream's checkpoint layout.
///
/// ```no_run
/// use std::path::Path;
/// use tch::Device;
/// use tchtrain_models::{AutoTask, LoadOptions, from_pretrained_dir};
/// use tchtrain_data::InMemoryDataset;
/// use tchtrain_datasets::causal_lm_blocks_from_file;
/// use tchtrain_trainer::Trainer;
/// use tchtrain_training_args::TrainingArguments;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let model = from_pretrained_dir(Path::new("assets/tiny-gpt2"), AutoTask::CausalLm, Device::Cpu,
///     &LoadOptions::default())?.model;
/// let tokenizer = tchtrain_models::AutoTokenizer::from_pretrained("assets/gpt2-tokenizer")?;
/// let blocks = causal_lm_blocks_from_file("assets/text/hamlet.txt", tokenizer.tokenizer(), 64)?;
/// let args = TrainingArguments { max_steps: 10, use_cpu: true, ..TrainingArguments::new("out") };
/// let mut trainer = Trainer::builder(model, args).train_dataset(InMemoryDataset::new(blocks)).build()?;
/// let output = trainer.train(None)?;
/// println!("loss {}", output.training_loss);
/// # Ok(()) }
/// ```
pub struct Trainer {
    pub(crate) model: Box<dyn TrainableModel>,
    pub(crate) args: TrainingArguments,
    /// The datasets, the collator and the batch size.
    pub(crate) data: TrainerData,
    /// The callbacks, in calling order.
    pub callback_handler: CallbackHandler,
    /// The state of the training loop (saved as `trainer_state.json`).
    pub state: TrainerState,
    /// The flags callbacks set.
    pub control: TrainerControl,
    /// The optimizer and its schedule.
    pub(crate) optimization: Optimization,
    /// What evaluation makes of the predictions.
    pub(crate) evaluation: EvaluationSetup,
    /// The overrides (shared with the calls a hook makes back into the Trainer).
    pub(crate) hooks: Arc<dyn TrainerHooks>,
    /// What the steps read about the model (see [`StepContext`]).
    pub(crate) facts: StepFacts,
    /// The profile, the memory tracker, the non-finite stop and the overflow tracer.
    pub(crate) diagnostics: Diagnostics,
    pub(crate) loop_state: LoopState,
    /// Device, mixed precision, DDP or the ZeRO engine (upstream's `self.accelerator`).
    pub(crate) accelerator: Accelerator,
    /// The DeepSpeed config or FSDP plugin of a sharded run (`zero.rs`).
    pub(crate) sharding: Option<crate::sharding::ShardingSource>,
    /// The hub repository pushes go to (`init_hf_repo`).
    pub(crate) hub_model_id: Option<String>,
}

impl TrainerData {
    /// Upstream `_save`'s `processing_class.save_pretrained(dir)`: the processor when one was
    /// given, else the tokenizer.
    pub(crate) fn save_processing_class(&self, dir: &std::path::Path) -> Result<()> {
        if let Some(p) = &self.processor {
            p.save_pretrained(dir)?;
        } else if let Some(tok) = &self.processing_class {
            tok.save_pretrained(dir)?;
        }
        Ok(())
    }
}

/// What the Trainer reads its batches from (upstream's `train_dataset`, `eval_dataset`,
/// `data_collator`, `processing_class`).
pub(crate) struct TrainerData {
    pub train_dataset: Option<Arc<dyn Dataset>>,
    /// The training stream, when training reads an [`IterableDataset`].
    pub train_stream: Option<Arc<dyn IterableDataset>>,
    pub eval_dataset: Option<Arc<dyn Dataset>>,
    pub collator: SharedCollator,
    /// Upstream `processing_class`: the tokenizer saved with the model.
    pub processing_class: Option<PreTrainedTokenizerFast>,
    /// A processor given as `processing_class` (a vision-language model's): saved in its
    /// place.
    pub processor: Option<tchtrain_models::Gemma3Processor>,
    pub train_sampler: Option<Arc<dyn Sampler>>,
    /// Rows per training batch on this process (upstream `_train_batch_size`): the
    /// arguments', lowered by `auto_find_batch_size` after an out-of-memory error.
    pub train_batch_size: usize,
}

/// The optimizer and its learning-rate schedule (upstream's `optimizer`, `lr_scheduler`).
pub(crate) struct Optimization {
    pub optimizer: Option<Box<dyn Optimizer>>,
    pub lr_scheduler: Option<Box<dyn LrScheduler>>,
    pub created_lr_scheduler: bool,
    /// Upstream's `optimizers=(...)`: an optimizer or a scheduler came from the builder.
    pub optimizers_passed: bool,
    /// The processed DeepSpeed config of a `--deepspeed` run (any stage), once `train`
    /// has read it: its `optimizer` / `scheduler` sections replace the Trainer's.
    pub deepspeed: Option<Box<tchtrain_deepspeed::HfTrainerDeepSpeedConfig>>,
}

/// How evaluation turns predictions into metrics.
pub(crate) struct EvaluationSetup {
    pub compute_metrics: Option<ComputeMetrics>,
    pub preprocess_logits_for_metrics: Option<PreprocessLogits>,
    /// Upstream's `gather_function`: `accelerator.gather_for_metrics` (true: the last
    /// batch's repeated loss is cut to its rows) or, as `Seq2SeqTrainer.evaluate` /
    /// `predict` set it, `accelerator.gather` (false: every batch's loss counts
    /// `eval_batch_size` times, a short last batch's too).
    pub gather_for_metrics: bool,
}

/// What the Trainer watches besides the loss.
pub(crate) struct Diagnostics {
    /// See [`TrainerBuilder::stop_on_non_finite`].
    pub stop_on_non_finite: bool,
    /// See [`TrainerBuilder::profile`].
    pub profile: bool,
    /// Upstream `_memory_tracker` (`skip_memory_metrics=False`).
    pub memory_tracker: crate::memory_tracker::TrainerMemoryTracker,
    /// `debug="underflow_overflow"`: the tracer `train` registers (upstream's hooks stay on
    /// the model afterwards, so evaluations and predictions after it are traced too).
    pub debug_overflow: Option<Arc<Mutex<tchtrain_models::DebugUnderflowOverflow>>>,
}

/// Bookkeeping of the running loop (upstream's `_tr_loss`, `_total_loss_scalar`, ...).
pub(crate) struct LoopState {
    /// Loss summed since the last log, a float32 tensor on the device as upstream's `_tr_loss`.
    pub tr_loss: Tensor,
    pub total_loss_scalar: f64,
    pub globalstep_last_logged: i64,
    pub current_flos: f64,
    pub initial_num_input_tokens_seen: i64,
    pub is_in_train: bool,
    pub start_time: Option<Instant>,
    pub num_params_without_embeddings: i64,
    /// The model's `main_input_name` (what the FLOs count).
    pub main_input_name: &'static str,
    /// The SIGINT / SIGTERM guard while `train` runs with `enable_jit_checkpoint`.
    pub stop_signals: Option<crate::signals::StopSignals>,
    /// The per-phase profile while `train` runs with `TCHTRAIN_PROFILE` set.
    pub profile: Option<crate::profile::StepProfile>,
}

impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("model", &self.model.model_name())
            .field("output_dir", &self.args.output_dir())
            .field("callbacks", &self.callback_handler)
            .field("global_step", &self.state.global_step)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Trainer`] (upstream's `Trainer(...)` keyword arguments).
pub struct TrainerBuilder {
    model: Box<dyn TrainableModel>,
    args: TrainingArguments,
    train_dataset: Option<Arc<dyn Dataset>>,
    train_stream: Option<Arc<dyn IterableDataset>>,
    eval_dataset: Option<Arc<dyn Dataset>>,
    collator: Option<SharedCollator>,
    processing_class: Option<PreTrainedTokenizerFast>,
    processor: Option<tchtrain_models::Gemma3Processor>,
    callbacks: Vec<Box<dyn TrainerCallback>>,
    optimizer: Option<Box<dyn Optimizer>>,
    lr_scheduler: Option<Box<dyn LrScheduler>>,
    compute_metrics: Option<ComputeMetrics>,
    preprocess_logits_for_metrics: Option<PreprocessLogits>,
    hooks: Option<Arc<dyn TrainerHooks>>,
    train_sampler: Option<Arc<dyn Sampler>>,
    model_accepts_loss_kwargs: Option<bool>,
    stop_on_non_finite: bool,
    profile: bool,
    grad_scaler: Option<GradScalerKwargs>,
}

impl std::fmt::Debug for TrainerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrainerBuilder")
            .field("model", &self.model.model_name())
            .finish_non_exhaustive()
    }
}

impl TrainerBuilder {
    /// The training rows (`train_dataset`): any [`Dataset`], an `Arc<dyn Dataset>` included.
    pub fn train_dataset(mut self, dataset: impl Dataset + 'static) -> Self {
        self.train_stream = None;
        self.train_dataset = Some(Arc::new(dataset));
        self
    }

    /// Trains on a stream instead of a dataset (upstream: a `train_dataset` that is an
    /// `IterableDataset`): rows in the stream's order, `max_steps` required, a new pass
    /// whenever the stream ends first. Replaces a `train_dataset`.
    pub fn train_stream(mut self, stream: impl IterableDataset + 'static) -> Self {
        self.train_dataset = None;
        self.train_stream = Some(Arc::new(stream));
        self
    }

    /// The evaluation rows (`eval_dataset`): any [`Dataset`], an `Arc<dyn Dataset>` included.
    pub fn eval_dataset(mut self, dataset: impl Dataset + 'static) -> Self {
        self.eval_dataset = Some(Arc::new(dataset));
        self
    }

    /// Upstream's `processing_class`: the tokenizer saved with the model (`save_model` and
    /// every checkpoint write it with `save_pretrained`), and without a
    /// [`data_collator`](Self::data_collator) the default collator becomes
    /// `DataCollatorWithPadding` over it, as upstream's.
    pub fn processing_class(mut self, tokenizer: PreTrainedTokenizerFast) -> Self {
        self.processing_class = Some(tokenizer);
        self
    }

    /// `processing_class` as a processor (a vision-language model's): its tokenizer is the
    /// [`processing_class`](Self::processing_class), and `save_model` and every checkpoint
    /// write the whole processor (`processor_config.json` beside the tokenizer's files).
    pub fn processor(mut self, processor: tchtrain_models::Gemma3Processor) -> Self {
        self.processing_class = Some(processor.tokenizer.clone());
        self.processor = Some(processor);
        self
    }

    /// The collator (`data_collator`; default [`DefaultDataCollator`], upstream's
    /// `default_data_collator`, or `DataCollatorWithPadding` with a
    /// [`processing_class`](Self::processing_class)).
    pub fn data_collator(mut self, collator: impl DataCollator<Feature> + Send + 'static) -> Self {
        self.collator = Some(shared_collator(collator));
        self
    }

    /// A collator already shared with other code.
    pub fn shared_data_collator(mut self, collator: SharedCollator) -> Self {
        self.collator = Some(collator);
        self
    }

    /// A callback added after the default ones (`callbacks=[...]`).
    pub fn callback(mut self, callback: impl TrainerCallback) -> Self {
        self.callbacks.push(Box::new(callback));
        self
    }

    /// Callbacks added after the default ones.
    pub fn callbacks(mut self, callbacks: Vec<Box<dyn TrainerCallback>>) -> Self {
        self.callbacks.extend(callbacks);
        self
    }

    /// An optimizer built by the caller over the model's parameters (`optimizers=(opt, None)`);
    /// by default the Trainer builds one from `optim`, `learning_rate`, `weight_decay`, ...
    pub fn optimizer(mut self, optimizer: Box<dyn Optimizer>) -> Self {
        self.optimizer = Some(optimizer);
        self
    }

    /// A scheduler built by the caller (`optimizers=(opt, scheduler)`).
    pub fn lr_scheduler(mut self, scheduler: Box<dyn LrScheduler>) -> Self {
        self.lr_scheduler = Some(scheduler);
        self
    }

    /// `compute_metrics`, called on the whole evaluation set's predictions (a closure, or
    /// an already boxed [`ComputeMetrics`]).
    pub fn compute_metrics(
        mut self,
        f: impl FnMut(&EvalPrediction) -> Result<Metrics> + Send + 'static,
    ) -> Self {
        let f: ComputeMetrics = Box::new(f);
        self.compute_metrics = Some(f);
        self
    }

    /// `preprocess_logits_for_metrics`, applied to each evaluation batch's logits (a
    /// closure, or an already boxed [`PreprocessLogits`]).
    pub fn preprocess_logits_for_metrics(
        mut self,
        f: impl FnMut(&Tensor, Option<&Tensor>) -> Result<Tensor> + Send + 'static,
    ) -> Self {
        let f: PreprocessLogits = Box::new(f);
        self.preprocess_logits_for_metrics = Some(f);
        self
    }

    /// The overrides of upstream's subclassable methods ([`TrainerHooks`]).
    pub fn hooks(mut self, hooks: impl TrainerHooks + 'static) -> Self {
        self.hooks = Some(Arc::new(hooks));
        self
    }

    /// The training order, instead of the one `train_sampling_strategy` names
    /// (upstream: override `_get_train_sampler`).
    pub fn train_sampler(mut self, sampler: Arc<dyn Sampler>) -> Self {
        self.train_sampler = Some(sampler);
        self
    }

    /// Upstream's `model.accepts_loss_kwargs` attribute: `false` makes the Trainer keep
    /// `num_items_in_batch` from the model and divide its loss by the accumulation steps.
    /// Default: the model's [`accepts_loss_kwargs`](tchtrain_models::TrainableModel::accepts_loss_kwargs).
    pub fn model_accepts_loss_kwargs(mut self, accepts: bool) -> Self {
        self.model_accepts_loss_kwargs = Some(accepts);
        self
    }

    /// Stops training at the first optimizer step whose gradient norm is not finite (a NaN or
    /// infinite loss, or gradients that overflowed): that step's update is not applied, a
    /// checkpoint of the last good state (the weights, optimizer and scheduler after the
    /// previous step) is saved as `checkpoint-{global_step}`, and `train` returns
    /// [`Error::NonFiniteLoss`](crate::Error::NonFiniteLoss) naming the step and the
    /// checkpoint. Off by default: upstream's Trainer applies the update (and only filters
    /// the logged loss, `logging_nan_inf_filter`).
    pub fn stop_on_non_finite(mut self, stop: bool) -> Self {
        self.stop_on_non_finite = stop;
        self
    }

    /// accelerate's `GradScalerKwargs`: the settings of the loss scaler `fp16` uses (torch's
    /// defaults otherwise). accelerate turns float16 mixed precision on only off the CPU
    /// (float16 autocast and a `GradScaler`; on the CPU `fp16` trains in fp32); passing
    /// kwargs here asks for it on the CPU too, the GPU recipe run on the CPU. Without `fp16`
    /// they have no effect, as upstream.
    pub fn grad_scaler(mut self, kwargs: GradScalerKwargs) -> Self {
        self.grad_scaler = Some(kwargs);
        self
    }

    /// Profiles `train`: the time of each phase of the loop (data, forward, backward,
    /// optimizer, callbacks, logging / saving / evaluation) printed to stderr at the end and
    /// written to `output_dir/profile.json`. Also turned on by the environment variable
    /// `TCHTRAIN_PROFILE=1`.
    pub fn profile(mut self, profile: bool) -> Self {
        self.profile = profile;
        self
    }

    /// The Trainer. Callbacks are upstream's defaults (`DefaultFlowCallback`, the
    /// `report_to` loggers), then the given ones, then `ProgressCallback` (or
    /// `PrinterCallback` with `disable_tqdm`). Moves the model to CUDA when one is present
    /// and `use_cpu` is false.
    pub fn build(self) -> Result<Trainer> {
        // Before any thread of the Trainer's starts (the memory tracker's poller), as the
        // environment is written.
        if self.args.full_determinism {
            enable_full_determinism()?;
        }
        // Its GPU counters are the device's the run will use (upstream's current device,
        // which `TrainingArguments.device` set); a device error is reported below.
        let mut memory_tracker = crate::memory_tracker::TrainerMemoryTracker::new(
            self.args.skip_memory_metrics,
            tchtrain_accelerate::default_device(self.args.use_cpu).unwrap_or(Device::Cpu),
        );
        memory_tracker.start("init");
        refuse_unavailable(&self.args)?;
        // Upstream: `logging.set_verbosity(args.get_process_log_level())`.
        crate::logging::init_logging(&self.args);
        let mut model = self.model;
        // Upstream `Trainer.__init__`: a quantized model trains through its adapters only.
        if tchtrain_models::is_quantized(&*model) && !model.has_adapter() {
            return Err(Error::InvalidArgument {
                field: "model",
                detail: "You cannot perform fine-tuning on purely quantized models. Please attach trainable adapters on top of the quantized model to correctly perform fine-tuning. (upstream's message); wrap it with get_peft_model (LoRA), as QLoRA does".into(),
            });
        }
        if tchtrain_models::is_quantized(&*model)
            && (self.args.deepspeed.is_some() || crate::sharding::fsdp_requested(&self.args))
        {
            return Err(Error::InvalidArgument {
                field: if self.args.deepspeed.is_some() {
                    "deepspeed"
                } else {
                    "fsdp"
                },
                detail: "sharding a 4-bit model's packed weights (DeepSpeed ZeRO / FSDP over bitsandbytes' layers) is not implemented here; train the quantized model with DDP or on one process".into(),
            });
        }
        // Upstream `TrainingArguments.device`: the CPU with `use_cpu`, else `cuda:LOCAL_RANK`
        // when there is a CUDA device (the one ProcessGroupNCCL binds this rank to), else the
        // CPU.
        let device = tchtrain_accelerate::default_device(self.args.use_cpu)?;
        if model.var_store().device() != device && self.optimizer.is_none() {
            model.var_store_mut().set_device(device);
        }
        let device = model.var_store().device();
        crate::field_support::check_field_support(&self.args, device, self.args.world_size())?;
        // Upstream `Trainer.__init__`: `self.model.config.use_cache = self.args.use_cache`.
        model.set_use_cache(self.args.use_cache);
        let mut callbacks: Vec<Box<dyn TrainerCallback>> = vec![Box::new(DefaultFlowCallback)];
        if reporting_integrations(&self.args.report_to)?.contains(&"trackio") {
            check_trackio_args(&self.args)?;
        }
        callbacks.extend(get_reporting_integration_callbacks(&self.args.report_to)?);
        callbacks.extend(self.callbacks);
        if self.args.disable_tqdm {
            callbacks.push(Box::new(PrinterCallback));
        } else {
            callbacks.push(Box::new(ProgressCallback::default()));
        }
        let accepts = self
            .model_accepts_loss_kwargs
            .unwrap_or_else(|| model.accepts_loss_kwargs());
        let loss_shifts_labels = model.loss_shifts_labels();
        let is_causal_lm = model.is_causal_lm();
        let num_params_without_embeddings = model_info::num_parameters(&*model, true);
        let main_input_name = model.main_input_name();
        // Upstream: `find_labels(model.__class__)` unless `label_names` is set.
        let label_names = self
            .args
            .label_names
            .clone()
            .unwrap_or_else(|| model.label_names());
        let pretrained = model.as_pretrained().is_some();
        // Upstream passes `model` to every event; the loggers read `model.config`.
        let mut callback_handler = CallbackHandler::new(callbacks);
        if let Some(pretrained) = model.as_pretrained() {
            let config = pretrained.config().to_json_value()?;
            let mut model_config =
                ModelConfig::from_json_value(&config)?.with_num_parameters(model.num_parameters());
            // `print(model)`, for W&B's model artifacts.
            if let Some(tree) = pretrained.module_repr() {
                model_config = model_config.with_architecture(tree.to_string());
            }
            callback_handler.set_model_config(model_config);
        }
        let accelerator = create_accelerator(&self.args, device, self.grad_scaler, pretrained)?;
        let mut trainer = Trainer {
            model,
            data: TrainerData {
                train_dataset: self.train_dataset,
                train_stream: self.train_stream,
                eval_dataset: self.eval_dataset,
                collator: match (self.collator, &self.processing_class) {
                    (Some(c), _) => c,
                    (None, Some(tok)) => {
                        shared_collator(DataCollatorWithPadding::new(tok.info().clone()))
                    }
                    (None, None) => shared_collator(DefaultDataCollator),
                },
                processing_class: self.processing_class,
                processor: self.processor,
                train_sampler: self.train_sampler,
                train_batch_size: self.args.train_batch_size(),
            },
            callback_handler,
            state: TrainerState::default(),
            control: TrainerControl::default(),
            optimization: Optimization {
                created_lr_scheduler: false,
                optimizers_passed: self.optimizer.is_some() || self.lr_scheduler.is_some(),
                optimizer: self.optimizer,
                lr_scheduler: self.lr_scheduler,
                deepspeed: None,
            },
            evaluation: EvaluationSetup {
                compute_metrics: self.compute_metrics,
                preprocess_logits_for_metrics: self.preprocess_logits_for_metrics,
                gather_for_metrics: true,
            },
            hooks: self.hooks.unwrap_or_else(|| Arc::new(DefaultHooks)),
            facts: StepFacts {
                model_accepts_loss_kwargs: accepts,
                loss_shifts_labels,
                is_causal_lm,
                label_names,
            },
            diagnostics: Diagnostics {
                stop_on_non_finite: self.stop_on_non_finite,
                profile: self.profile,
                memory_tracker,
                debug_overflow: None,
            },
            loop_state: LoopState {
                tr_loss: Tensor::zeros([], (Kind::Float, device)),
                total_loss_scalar: 0.0,
                globalstep_last_logged: 0,
                current_flos: 0.0,
                initial_num_input_tokens_seen: 0,
                is_in_train: false,
                start_time: None,
                num_params_without_embeddings,
                main_input_name,
                stop_signals: None,
                profile: None,
            },
            accelerator,
            sharding: None,
            hub_model_id: None,
            args: self.args,
        };
        trainer.state.is_local_process_zero = trainer.is_local_process_zero();
        trainer.state.is_world_process_zero = trainer.is_world_process_zero();
        // Upstream: `enable_full_determinism(seed)` if `full_determinism` else `set_seed(seed)`
        // (the switches were set first thing in `build`).
        tch::manual_seed(trainer.args.seed as i64);
        // Upstream's `__init__`: the repository when pushing.
        if trainer.args.push_to_hub {
            trainer.init_hf_repo()?;
        }
        // Upstream creates the output folder on the saving process before `on_init_end`
        // (CodeCarbonCallback's tracker writes there).
        if trainer.args.should_save() {
            let dir = std::path::PathBuf::from(trainer.args.output_dir());
            std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating", &dir, e))?;
        }
        trainer.callback_handler.on_init_end(
            &trainer.args,
            &trainer.state,
            &mut trainer.control,
        )?;
        trainer
            .diagnostics
            .memory_tracker
            .stop_and_update_metrics("init", None);
        Ok(trainer)
    }
}

impl Trainer {
    /// A builder for a Trainer of `model` with `args`.
    pub fn builder(model: Box<dyn TrainableModel>, args: TrainingArguments) -> TrainerBuilder {
        TrainerBuilder {
            model,
            args,
            train_dataset: None,
            train_stream: None,
            eval_dataset: None,
            collator: None,
            processing_class: None,
            processor: None,
            callbacks: Vec::new(),
            optimizer: None,
            lr_scheduler: None,
            compute_metrics: None,
            preprocess_logits_for_metrics: None,
            hooks: None,
            train_sampler: None,
            model_accepts_loss_kwargs: None,
            stop_on_non_finite: false,
            profile: false,
            grad_scaler: None,
        }
    }

    /// The model.
    pub fn model(&self) -> &dyn TrainableModel {
        &*self.model
    }

    /// The model, mutably.
    pub fn model_mut(&mut self) -> &mut dyn TrainableModel {
        &mut *self.model
    }

    /// Takes the model back.
    pub fn into_model(self) -> Box<dyn TrainableModel> {
        self.model
    }

    /// The training arguments.
    pub fn args(&self) -> &TrainingArguments {
        &self.args
    }

    /// `train_dataset` (`None` for a stream or without training data).
    pub fn train_dataset(&self) -> Option<&Arc<dyn Dataset>> {
        self.data.train_dataset.as_ref()
    }

    /// `eval_dataset`.
    pub fn eval_dataset(&self) -> Option<&Arc<dyn Dataset>> {
        self.data.eval_dataset.as_ref()
    }

    /// `data_collator`.
    pub fn data_collator(&self) -> &SharedCollator {
        &self.data.collator
    }

    /// `processing_class`, when one was given.
    pub fn processing_class(&self) -> Option<&PreTrainedTokenizerFast> {
        self.data.processing_class.as_ref()
    }

    /// The device batches run on.
    pub fn device(&self) -> Device {
        self.accelerator.device()
    }

    /// A loader's batch on [`device`](Self::device), as upstream's loaders hand it over: on
    /// CUDA page-locked first with `dataloader_pin_memory` (the default) and copied
    /// asynchronously with `accelerator_config.non_blocking`.
    pub(crate) fn batch_to_device(
        &self,
        batch: &tchtrain_collators::Batch,
    ) -> Result<tchtrain_collators::Batch> {
        Ok(batch.to_device_with(
            self.device(),
            self.args.dataloader_pin_memory,
            self.args.accelerator_config.non_blocking,
        )?)
    }

    /// Upstream's `trainer.accelerator`: device, mixed precision, DDP or the ZeRO engine.
    pub fn accelerator(&self) -> &Accelerator {
        &self.accelerator
    }

    /// Upstream `is_world_process_zero`: whether this process is rank 0 of the run (the
    /// one that writes checkpoints and whose callbacks print).
    pub fn is_world_process_zero(&self) -> bool {
        self.args.process_index() == 0
    }

    /// Upstream `is_local_process_zero`: whether this process is rank 0 on its machine.
    pub fn is_local_process_zero(&self) -> bool {
        self.args.local_process_index() == 0
    }

    /// The optimizer, once created.
    pub fn optimizer(&self) -> Option<&dyn Optimizer> {
        self.optimization.optimizer.as_deref()
    }

    /// The learning-rate scheduler, once created.
    pub fn lr_scheduler(&self) -> Option<&dyn LrScheduler> {
        self.optimization.lr_scheduler.as_deref()
    }

    /// The loss scaler of float16 mixed precision (accelerate's `scaler`), when `fp16` runs
    /// with one.
    pub fn grad_scaler(&self) -> Option<std::sync::MutexGuard<'_, GradScaler>> {
        self.accelerator.scaler()
    }

    /// Upstream `add_callback`.
    pub fn add_callback(&mut self, callback: impl TrainerCallback) {
        self.callback_handler.add_callback(callback);
    }

    pub(crate) fn step_context(
        &self,
        current_gradient_accumulation_steps: usize,
    ) -> StepContext<'_> {
        StepContext::new(
            &self.args,
            &self.facts,
            &self.accelerator,
            current_gradient_accumulation_steps,
            self.state.global_step,
        )
    }

    /// The training order's name and seed, as checkpoints record them (`"none"` without
    /// training data), without building the sampler (`group_by_length` would read every
    /// row for its lengths at each save).
    pub(crate) fn train_order(&self) -> (String, Option<u64>) {
        if self.data.train_stream.is_some() {
            return ("stream".into(), None);
        }
        if self.data.train_dataset.is_none() {
            return ("none".into(), None);
        }
        match &self.data.train_sampler {
            Some(s) => (s.name().to_string(), s.seed()),
            None => match self.args.train_sampling_strategy.as_str() {
                "random" => ("random".into(), Some(self.args.sampler_seed())),
                other => (other.to_string(), None),
            },
        }
    }

    /// Runs `f` with the hooks and the Trainer (the hooks are shared, so that a hook can call
    /// back into the Trainer).
    pub(crate) fn with_hooks<T>(
        &mut self,
        f: impl FnOnce(&dyn TrainerHooks, &mut Trainer) -> Result<T>,
    ) -> Result<T> {
        let hooks = Arc::clone(&self.hooks);
        self.traced(|t| f(&*hooks, t))
    }

    /// Runs `f` with the `debug="underflow_overflow"` tracer, when there is one, reporting
    /// the model's forwards.
    pub(crate) fn traced<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> T {
        match self.diagnostics.debug_overflow.clone() {
            Some(d) => {
                let model = self.model.context().clone();
                model.with_tracer(&d, || f(self))
            }
            None => f(self),
        }
    }

    /// Upstream `get_train_dataloader`, through the hooks ([`TrainerHooks::get_train_dataloader`]).
    pub fn get_train_dataloader(&mut self) -> Result<DataLoader> {
        self.with_hooks(|h, t| h.get_train_dataloader(t))
    }

    /// Upstream `get_eval_dataloader`, through the hooks ([`TrainerHooks::get_eval_dataloader`]).
    pub fn get_eval_dataloader(
        &mut self,
        eval_dataset: Option<Arc<dyn Dataset>>,
    ) -> Result<DataLoader> {
        self.with_hooks(|h, t| h.get_eval_dataloader(t, eval_dataset))
    }

    /// Upstream `get_test_dataloader`, through the hooks ([`TrainerHooks::get_test_dataloader`]).
    pub fn get_test_dataloader(&mut self, test_dataset: Arc<dyn Dataset>) -> Result<DataLoader> {
        self.with_hooks(|h, t| h.get_test_dataloader(t, test_dataset))
    }

    /// Upstream `create_optimizer_and_scheduler`, through the hooks
    /// ([`TrainerHooks::create_optimizer_and_scheduler`]).
    pub fn create_optimizer_and_scheduler(&mut self, num_training_steps: usize) -> Result<()> {
        self.with_hooks(|h, t| h.create_optimizer_and_scheduler(t, num_training_steps))
    }

    /// Upstream `log`, through the hooks ([`TrainerHooks::log`]).
    pub fn log(&mut self, logs: Vec<(String, f64)>, start_time: Option<Instant>) -> Result<()> {
        self.with_hooks(|h, t| h.log(t, logs, start_time))
    }

    /// Upstream's base `get_train_dataloader`: `train_batch_size` rows per batch in the
    /// order of the sampler (`train_sampling_strategy`: `"random"`, `"sequential"` or
    /// `"group_by_length"`, or the one given to the builder), `dataloader_drop_last`, this
    /// process's shard in a data-parallel run.
    pub(crate) fn default_train_dataloader(&self) -> Result<DataLoader> {
        if let Some(stream) = &self.data.train_stream {
            if self.args.world_size() > 1 {
                return Err(Error::InvalidArgument {
                    field: "train_dataset",
                    detail: "a streamed training set in a data-parallel run is not supported yet: give each process a dataset, or train on one process".into(),
                });
            }
            return Ok(DataLoader::streaming(
                Arc::clone(stream),
                Arc::clone(&self.data.collator),
                self.data.train_batch_size,
                self.args.dataloader_drop_last,
            )?);
        }
        let dataset = self
            .data
            .train_dataset
            .clone()
            .ok_or(Error::MissingDataset {
                what: "training".into(),
                dataset: "train",
                fix: "pass one with TrainerBuilder::train_dataset",
            })?;
        let sampler: Arc<dyn Sampler> = match &self.data.train_sampler {
            Some(s) => Arc::clone(s),
            None => match self.args.train_sampling_strategy.as_str() {
                "random" => Arc::new(RandomSampler::new(self.args.sampler_seed())),
                "sequential" => Arc::new(SequentialSampler),
                "group_by_length" => Arc::new(LengthGroupedSampler::from_dataset(
                    self.data.train_batch_size * self.args.gradient_accumulation_steps,
                    &*dataset,
                )?),
                other => {
                    return Err(Error::InvalidArgument {
                        field: "train_sampling_strategy",
                        detail: format!(
                            "'{other}' is not implemented yet; use 'random', 'sequential' or 'group_by_length', or pass a sampler to TrainerBuilder::train_sampler"
                        ),
                    });
                }
            },
        };
        self.get_dataloader(dataset, sampler, self.data.train_batch_size)
    }

    /// Upstream `_get_dataloader(dataset, batch_size=..., sampler_fn=...)`, as a trainer that
    /// overrides `get_train_dataloader` / `get_eval_dataloader` calls it: `batch_size` rows of
    /// `dataset` per batch in `sampler`'s order, through the Trainer's collator,
    /// `dataloader_drop_last`, this process's shard in a data-parallel run.
    pub fn get_dataloader(
        &self,
        dataset: Arc<dyn Dataset>,
        sampler: Arc<dyn Sampler>,
        batch_size: usize,
    ) -> Result<DataLoader> {
        DataLoader::new(
            dataset,
            Arc::clone(&self.data.collator),
            sampler,
            batch_size,
            self.args.dataloader_drop_last,
        )
        .map(|l| self.accelerator.prepare_data_loader(l))
        .map_err(Error::from)
    }

    /// Upstream's base `get_eval_dataloader`: `eval_batch_size` rows per batch, in order.
    pub(crate) fn default_eval_dataloader(
        &self,
        dataset: Option<Arc<dyn Dataset>>,
    ) -> Result<DataLoader> {
        let dataset =
            dataset
                .or_else(|| self.data.eval_dataset.clone())
                .ok_or(Error::MissingDataset {
                    what: "evaluation".into(),
                    dataset: "eval",
                    fix: "pass one with TrainerBuilder::eval_dataset or to evaluate()",
                })?;
        DataLoader::new(
            dataset,
            Arc::clone(&self.data.collator),
            Arc::new(SequentialSampler),
            self.args.eval_batch_size(),
            self.args.dataloader_drop_last,
        )
        .map(|l| self.accelerator.prepare_data_loader(l))
        .map_err(Error::from)
    }

    /// Upstream `create_optimizer`: unless one was given, the optimizer `optim` names over
    /// two groups, `weight_decay` for every parameter but biases and norms, 0 for those.
    pub fn create_optimizer(&mut self) -> Result<()> {
        if self.optimization.optimizer.is_some() {
            return Ok(());
        }
        let groups = self.optimizer_param_groups()?;
        self.optimization.optimizer = Some(self.build_optimizer(groups)?);
        Ok(())
    }

    /// Upstream `create_scheduler`: unless one was given, `lr_scheduler_type` with
    /// `get_warmup_steps(num_training_steps)` warmup steps.
    pub fn create_scheduler(&mut self, num_training_steps: usize) -> Result<()> {
        if self.optimization.lr_scheduler.is_some() {
            return Ok(());
        }
        self.create_optimizer()?;
        let Some(opt) = self.optimization.optimizer.as_mut() else {
            return Ok(());
        };
        if let Some(section) = self
            .optimization
            .deepspeed
            .as_ref()
            .and_then(|ds| ds.config.get("scheduler"))
        {
            // Upstream `deepspeed_optim_sched`: the section's scheduler, built by DeepSpeed.
            let sched = tchtrain_deepspeed::DeepSpeedLR::from_config(section, opt.as_mut())?;
            self.optimization.lr_scheduler = Some(Box::new(sched));
            self.optimization.created_lr_scheduler = true;
            return Ok(());
        }
        self.optimization.lr_scheduler = Some(tchtrain_optim::create_scheduler(
            &self.args,
            opt.as_mut(),
            num_training_steps,
        )?);
        self.optimization.created_lr_scheduler = true;
        Ok(())
    }

    /// Upstream `_get_learning_rate`: the scheduler's last lr (the first group's), or the
    /// optimizer's for metric-driven schedulers.
    pub(crate) fn get_learning_rate(&self) -> f64 {
        match (
            &self.optimization.lr_scheduler,
            &self.optimization.optimizer,
        ) {
            (Some(s), _) if !s.steps_on_metric() => s.get_last_lr().first().copied().unwrap_or(0.0),
            (_, Some(o)) => o.lrs().first().copied().unwrap_or(0.0),
            _ => 0.0,
        }
    }

    /// Upstream's base `log`: adds `epoch` (and the tokens seen, when tracked), appends the
    /// entry with its `step` to `log_history`, and calls `on_log`.
    pub(crate) fn default_log(
        &mut self,
        logs: Vec<(String, f64)>,
        start_time: Option<Instant>,
    ) -> Result<()> {
        let mut map = JsonMap::new();
        for (k, v) in logs {
            map.insert(k, v);
        }
        map.insert("epoch", self.state.epoch);
        if self.args.include_num_input_tokens_seen != "no" {
            map.insert("num_input_tokens_seen", self.state.num_input_tokens_seen);
            if let Some(start) = start_time {
                let tokens = self.state.num_input_tokens_seen
                    - self.loop_state.initial_num_input_tokens_seen;
                for (k, v) in
                    crate::metrics::speed_metrics("train", start, None, None, Some(tokens as f64))
                {
                    map.insert(k, v);
                }
            }
        }
        let mut entry = map.clone();
        entry.insert("step", self.state.global_step);
        self.state.log_history.push(entry);
        self.callback_handler
            .on_log(&self.args, &self.state, &mut self.control, &map)?;
        Ok(())
    }

    /// Upstream `store_flos`: moves the flos counted since the last call (summed over the
    /// processes of a data-parallel run) into the state.
    pub(crate) fn store_flos(&mut self) -> Result<()> {
        self.state.total_flos += self
            .accelerator
            .state()
            .reduce_sum_f32(self.loop_state.current_flos)?;
        self.loop_state.current_flos = 0.0;
        Ok(())
    }
}

/// Upstream `create_accelerator_and_postprocess`: the [`Accelerator`] of `args` on `device`
/// (mixed precision from `bf16` / `fp16`, the process group's `ddp_backend` and
/// `ddp_timeout`, DDP's `ddp_bucket_cap_mb`, the loss scaler's kwargs).
fn create_accelerator(
    args: &TrainingArguments,
    device: Device,
    grad_scaler: Option<GradScalerKwargs>,
    pretrained: bool,
) -> Result<Accelerator> {
    let mixed_precision = if args.bf16 {
        MixedPrecision::Bf16
    } else if args.fp16 {
        MixedPrecision::Fp16
    } else {
        MixedPrecision::No
    };
    Ok(Accelerator::on_device(
        device,
        AcceleratorOptions {
            cpu: device == Device::Cpu,
            mixed_precision,
            grad_scaler,
            backend: args.ddp_backend.clone(),
            timeout: args.ddp_timeout_delta(),
            bucket_cap_mb: args.ddp_bucket_cap_mb.map(|mb| mb as f64),
            // Upstream: `ddp_find_unused_parameters`, else for a PreTrainedModel true unless
            // activation checkpointing is on, else true.
            find_unused_parameters: args
                .ddp_find_unused_parameters
                .unwrap_or(!(pretrained && args.activation_checkpointing)),
        },
    )?)
}

/// Upstream `enable_full_determinism` (less the seeding the caller does): the CUDA / cuBLAS /
/// flash-attention environment variables for deterministic kernels, then
/// `torch.use_deterministic_algorithms(True)` with cuDNN deterministic and not benchmarking.
#[allow(unsafe_code)]
fn enable_full_determinism() -> Result<()> {
    for (key, value) in [
        ("CUDA_LAUNCH_BLOCKING", "1"),
        ("CUBLAS_WORKSPACE_CONFIG", ":16:8"),
        ("ASCEND_LAUNCH_BLOCKING", "1"),
        ("HCCL_DETERMINISTIC", "1"),
        ("FLASH_ATTENTION_DETERMINISTIC", "1"),
    ] {
        // SAFETY: set first thing in `TrainerBuilder::build`, before the Trainer starts a
        // thread, as upstream's `os.environ[...] = ...` at `Trainer.__init__`.
        unsafe { std::env::set_var(key, value) };
    }
    Ok(tchtrain_accelerate::use_deterministic_algorithms(
        true, false,
    )?)
}

/// Upstream's `Trainer.__init__` check that "best" checkpoints have a metric (the fields
/// this build cannot honour are refused by `field_support.rs`).
fn refuse_unavailable(args: &TrainingArguments) -> Result<()> {
    // Upstream `Trainer.__init__`: without a metric, "best" would never save.
    if (args.save_strategy == tchtrain_training_args::SaveStrategy::Best
        || args.load_best_model_at_end)
        && args.metric_for_best_model.is_none()
    {
        return Err(Error::InvalidArgument {
            field: "metric_for_best_model",
            detail: "`args.metric_for_best_model` must be provided when using 'best' save_strategy or if `args.load_best_model_at_end` is set to `True`. (upstream's message); name the metric to compare, e.g. \"loss\" or \"accuracy\"".into(),
        });
    }
    Ok(())
}

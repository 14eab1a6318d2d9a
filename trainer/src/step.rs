//! What one step of the Trainer reads and runs: the [`StepContext`] a hook gets, the model
//! inputs of a batch, the model's forward under the accelerator's autocast, upstream's
//! default `compute_loss` and the count of label tokens (`num_items_in_batch`).

use tch::{Device, Kind, Tensor};
use tchtrain_accelerate::Accelerator;
use tchtrain_collators::Batch;
use tchtrain_distributed::ReduceOp;
use tchtrain_losses::LabelSmoother;
use tchtrain_models::{ModelInputs, ModelOutput, TrainableModel};
use tchtrain_training_args::TrainingArguments;

use crate::error::{Error, Result};

/// The facts about the model and labels a [`StepContext`] carries, fixed when the Trainer
/// is built.
#[derive(Debug, Clone)]
pub(crate) struct StepFacts {
    pub model_accepts_loss_kwargs: bool,
    pub loss_shifts_labels: bool,
    /// The model is a causal LM (upstream: its class is in `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`).
    pub is_causal_lm: bool,
    pub label_names: Vec<String>,
}

/// The backward of a step whose optimizer takes its update inside it (LOMO, AdaLomo):
/// upstream's `accelerator.backward(loss, learning_rate=lr)`, which calls the optimizer's
/// `fused_backward(loss, lr)` instead of `loss.backward()`. Built by the Trainer's loop.
#[derive(Clone, Copy)]
pub struct FusedBackward<'a>(pub(crate) &'a dyn Fn(&Tensor) -> Result<()>);

impl std::fmt::Debug for FusedBackward<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FusedBackward(..)")
    }
}

/// What a hook may read about the Trainer at a step.
#[derive(Debug, Clone, Copy)]
pub struct StepContext<'a> {
    /// The training arguments.
    pub args: &'a TrainingArguments,
    /// `state.global_step` when the step runs (the optimizer steps taken so far).
    pub global_step: i64,
    /// Upstream `model_accepts_loss_kwargs`: whether `num_items_in_batch` is passed to the
    /// model's forward (see [`TrainerBuilder::model_accepts_loss_kwargs`](crate::TrainerBuilder::model_accepts_loss_kwargs)).
    pub model_accepts_loss_kwargs: bool,
    /// Number of batches in the current accumulation window (fewer than
    /// `gradient_accumulation_steps` at the end of an epoch that does not divide evenly).
    pub current_gradient_accumulation_steps: usize,
    /// The device batches are moved to.
    pub device: Device,
    /// Names of the label tensors in a batch (`label_names`, default the model's
    /// [`TrainableModel::label_names`](tchtrain_models::TrainableModel::label_names)).
    pub label_names: &'a [String],
    /// Upstream `_loss_shifts_labels`: the model's loss is `ForCausalLM` (it predicts
    /// `labels[..., 1:]`), so `num_items_in_batch` counts `labels[..., 1:]`.
    pub loss_shifts_labels: bool,
    /// The model is a causal LM (upstream: its class name is in
    /// `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`, `GPT2LMHeadModel` included): the label smoother
    /// then shifts the labels.
    pub is_causal_lm: bool,
    /// The Trainer's accelerator (upstream's `self.accelerator`): mixed precision, the fp16
    /// loss scale, the gradient reduction of a data-parallel or sharded run.
    pub accelerator: &'a Accelerator,
    /// Upstream's `skip_logits` input: `Some(true)` in a prediction step that keeps only
    /// the loss with `use_liger_kernel` (the model then computes it without the logits).
    pub skip_logits: Option<bool>,
    /// `Some` in a training step whose optimizer fuses its update into the backward (LOMO,
    /// AdaLomo): [`StepContext::backward`] runs it.
    pub fused_backward: Option<FusedBackward<'a>>,
    /// Where the default training step adds its forward's time, when the loop is
    /// profiled (`TCHTRAIN_PROFILE`).
    pub forward_time: Option<&'a std::cell::Cell<std::time::Duration>>,
    /// The state's `num_input_tokens_seen` (upstream's `self.state.num_input_tokens_seen`),
    /// which a step may read and, in training, add to (TRL's GRPO counts the tokens it
    /// generates): the Trainer's state takes the value back after a training step.
    pub num_input_tokens_seen: Option<&'a std::cell::Cell<i64>>,
}

impl<'a> StepContext<'a> {
    /// The context of a step over `current_gradient_accumulation_steps` batches at
    /// `global_step`: the one place the Trainer builds it.
    pub(crate) fn new(
        args: &'a TrainingArguments,
        facts: &'a StepFacts,
        accelerator: &'a Accelerator,
        current_gradient_accumulation_steps: usize,
        global_step: i64,
    ) -> Self {
        Self {
            args,
            global_step,
            model_accepts_loss_kwargs: facts.model_accepts_loss_kwargs,
            current_gradient_accumulation_steps,
            device: accelerator.device(),
            label_names: &facts.label_names,
            loss_shifts_labels: facts.loss_shifts_labels,
            is_causal_lm: facts.is_causal_lm,
            accelerator,
            skip_logits: None,
            fused_backward: None,
            forward_time: None,
            num_input_tokens_seen: None,
        }
    }

    /// Upstream's `self.accelerator.backward(loss)`: `loss.backward()`, the loss first
    /// multiplied by the fp16 loss scale when there is one, and on the accumulation window's
    /// last batch the gradients reduced across processes; with LOMO / AdaLomo the
    /// optimizer's `fused_backward(loss, lr)` at the scheduler's current rate. A custom
    /// [`TrainerHooks::training_step`](crate::TrainerHooks::training_step) calls it instead of `loss.backward()`.
    pub fn backward(&self, loss: &Tensor) -> Result<()> {
        if let Some(FusedBackward(fused)) = self.fused_backward {
            return fused(loss);
        }
        Ok(self.accelerator.backward(loss)?)
    }
}

/// What [`TrainerHooks::prediction_step`](crate::TrainerHooks::prediction_step) returns: upstream's `(loss, logits, labels)`.
#[derive(Debug, Default)]
pub struct PredictionStepOutput {
    /// The batch's loss (a 0-d tensor), when the batch had labels.
    pub loss: Option<Tensor>,
    /// The logits, unless only the loss was asked for.
    pub logits: Option<Tensor>,
    /// The labels, unless only the loss was asked for.
    pub labels: Option<Tensor>,
}

/// The model inputs found in `batch` (`input_ids`, `attention_mask`, `token_type_ids`,
/// `position_ids`, `labels`, question answering's `start_positions` / `end_positions`,
/// encoder-decoder models' `decoder_input_ids` / `decoder_attention_mask`);
/// other keys are ignored, as upstream's
/// `remove_unused_columns` drops columns the forward does not take.
pub fn model_inputs(batch: &Batch) -> ModelInputs<'_> {
    ModelInputs {
        pixel_values: batch.get("pixel_values"),
        input_features: batch.get("input_features"),
        input_ids: batch.get("input_ids"),
        attention_mask: batch.get("attention_mask"),
        token_type_ids: batch.get("token_type_ids"),
        position_ids: batch.get("position_ids"),
        labels: batch.get("labels"),
        start_positions: batch.get("start_positions"),
        end_positions: batch.get("end_positions"),
        num_items_in_batch: None,
        skip_logits: None,
        logits_to_keep: None,
        past_key_values: None,
        decoder_input_ids: batch.get("decoder_input_ids"),
        decoder_attention_mask: batch.get("decoder_attention_mask"),
        encoder_outputs: None,
        backbone_only: false,
    }
}

/// The model's forward as the Trainer calls it (upstream: the model accelerate prepared):
/// with `bf16` (or native `fp16`) inside the accelerator's `autocast()` region, its floating outputs
/// converted back to fp32 afterwards (accelerate's `convert_outputs_to_fp32`); a plain forward
/// in fp32. Under FSDP's mixed-precision policy the floating outputs are then cast to its
/// `output_dtype` (FSDP2's post-forward hook on the root module, which runs after the
/// forward accelerate wrapped): the loss the Trainer sees is bfloat16 with `--bf16`.
pub fn model_forward(
    ctx: &StepContext<'_>,
    model: &dyn TrainableModel,
    inputs: &ModelInputs<'_>,
) -> Result<ModelOutput> {
    let out = if ctx.accelerator.autocast_dtype().is_none() {
        model.forward(inputs)?
    } else {
        let out = {
            let _autocast = ctx.accelerator.autocast()?;
            model.forward(inputs)?
        };
        cast_outputs(out, Kind::Float)?
    };
    match ctx.accelerator.output_dtype() {
        Some(kind) => cast_outputs(out, kind),
        None => Ok(out),
    }
}

/// `out`'s floating-point tensors in `kind` (accelerate's `convert_outputs_to_fp32` for
/// float32 casts only half-precision ones; FSDP2's `output_dtype` casts every floating one).
fn cast_outputs(out: ModelOutput, kind: Kind) -> Result<ModelOutput> {
    let cast = |t: Tensor| -> Result<Tensor> {
        let floating = matches!(
            t.kind(),
            Kind::BFloat16 | Kind::Half | Kind::Float | Kind::Double
        );
        let from_half = matches!(t.kind(), Kind::BFloat16 | Kind::Half);
        Ok(
            if floating && t.kind() != kind && (kind != Kind::Float || from_half) {
                t.f_to_kind(kind)?
            } else {
                t
            },
        )
    };
    Ok(ModelOutput {
        loss: out.loss.map(cast).transpose()?,
        logits: out.logits.map(cast).transpose()?,
        last_hidden_state: out.last_hidden_state.map(cast).transpose()?,
        pooler_output: out.pooler_output.map(cast).transpose()?,
        aux_loss: out.aux_loss.map(cast).transpose()?,
    })
}

/// Upstream's default `compute_loss`: `outputs = model(**inputs, num_items_in_batch=...)`
/// (the count passed only when `ctx.model_accepts_loss_kwargs`), loss = `outputs.loss`;
/// a model that returns no loss is [`Error::MissingLoss`]. With `label_smoothing_factor`,
/// the labels are kept from the model and upstream's `LabelSmoother` turns its (fp32) logits
/// into the loss, shifting the labels for a causal LM. In a data-parallel run with
/// `average_tokens_across_devices` and a counted `num_items_in_batch`, the loss is
/// multiplied by the world size, as upstream.
pub fn default_compute_loss(
    ctx: &StepContext<'_>,
    model: &dyn TrainableModel,
    inputs: &Batch,
    num_items_in_batch: Option<&Tensor>,
) -> Result<(Tensor, ModelOutput)> {
    let mut mi = model_inputs(inputs);
    mi.skip_logits = ctx.skip_logits;
    if ctx.model_accepts_loss_kwargs {
        mi.num_items_in_batch = num_items_in_batch;
    }
    // Upstream pops the labels when a label smoother is set and smooths the model's logits.
    let smoothed_labels = match mi.labels {
        Some(labels) if ctx.args.label_smoothing_factor != 0.0 => {
            mi.labels = None;
            Some(labels)
        }
        _ => None,
    };
    let mut out = model_forward(ctx, model, &mi)?;
    let mut loss = match smoothed_labels {
        Some(labels) => LabelSmoother::new(ctx.args.label_smoothing_factor).compute(
            out.logits()?,
            labels,
            ctx.is_causal_lm,
            num_items_in_batch,
        )?,
        None => out.loss.take().ok_or_else(|| Error::MissingLoss {
            keys: inputs.keys().collect::<Vec<_>>().join(", "),
        })?,
    };
    let world = ctx.args.world_size();
    if world > 1
        && ctx.args.average_tokens_across_devices
        && ctx.model_accepts_loss_kwargs
        && num_items_in_batch.is_some()
    {
        // `num_items_in_batch` counts every process's tokens and DDP averages the
        // gradients: scale back to the sum over the processes (upstream's
        // `loss *= num_processes`).
        loss = loss.f_mul_scalar(world as f64)?;
    }
    Ok((loss, out))
}

/// Upstream `_get_num_items_in_batch`: the number of label tokens `!= -100` over `batches`
/// (the whole accumulation window), counted over `labels[..., 1:]` when the model's loss
/// shifts labels (`ctx.loss_shifts_labels`), or `None` when the model does not accept loss
/// kwargs or the batches have no `labels`. A float tensor on `ctx.device`, as upstream's
/// (`count / (tp * cp * sp)`). In a data-parallel run with `average_tokens_across_devices`
/// the count is summed over the processes (a collective: every process must call it).
pub fn count_num_items_in_batch(
    batches: &[Batch],
    ctx: &StepContext<'_>,
) -> Result<Option<Tensor>> {
    if !ctx.model_accepts_loss_kwargs || batches.first().is_none_or(|b| !b.contains("labels")) {
        return Ok(None);
    }
    let mut count: i64 = 0;
    for b in batches {
        let Some(labels) = b.get("labels") else {
            continue;
        };
        let labels = if ctx.loss_shifts_labels {
            let last = labels.dim().saturating_sub(1) as i64;
            let len = labels.size().last().copied().unwrap_or(0);
            labels.f_narrow(last, 1.min(len), (len - 1).max(0))?
        } else {
            labels.shallow_clone()
        };
        count += labels.f_ne(-100)?.f_sum(Kind::Int64)?.f_int64_value(&[])?;
    }
    if ctx.args.average_tokens_across_devices {
        count = ctx.accelerator.reduce_scalar(count as f64, ReduceOp::Sum)? as i64;
    }
    Ok(Some(
        Tensor::f_from_slice(&[count as f32])?
            .f_reshape([] as [i64; 0])?
            .f_to_device(ctx.device)?,
    ))
}

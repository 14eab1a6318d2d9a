//! Metrics: `EvalPrediction` and the `compute_metrics` callback type, `speed_metrics`, and
//! what `train()` returns (`TrainOutput`), as upstream's trainer_utils.py.

use std::collections::BTreeMap;
use std::time::Instant;

use tch::Tensor;

use crate::error::Result;

/// Metrics by name (`eval_loss`, `train_runtime`, ...).
pub type Metrics = BTreeMap<String, f64>;

/// What the evaluation loop keeps of one output (predictions, labels, inputs or losses):
/// upstream's `EvalLoopContainer.get_arrays()`, on the CPU.
#[derive(Debug)]
pub enum EvalArrays {
    /// One tensor: every batch's rows concatenated along the first dimension (padded with
    /// -100 along the second when lengths differ), as upstream's default
    /// `eval_do_concat_batches=True`; with `batch_eval_metrics`, the one batch's.
    Array(Tensor),
    /// `eval_do_concat_batches=False`: one tensor per evaluation step (gathered across
    /// processes step by step), never concatenated or padded, as upstream's list of arrays.
    Batches(Vec<Tensor>),
}

impl EvalArrays {
    /// The single tensor; an error naming `eval_do_concat_batches` when the evaluation kept
    /// one tensor per batch (where upstream's `compute_metrics` would get a list).
    pub fn array(&self) -> Result<&Tensor> {
        match self {
            Self::Array(t) => Ok(t),
            Self::Batches(b) => Err(crate::Error::BatchesNotConcatenated { batches: b.len() }),
        }
    }

    /// The tensors batch by batch (one item for [`EvalArrays::Array`]).
    pub fn batches(&self) -> Vec<&Tensor> {
        match self {
            Self::Array(t) => vec![t],
            Self::Batches(b) => b.iter().collect(),
        }
    }

    /// Upstream's `nested_concat`: the batches concatenated (padded with -100 along the
    /// second dimension when lengths differ); the tensor itself for an `Array`.
    pub fn concatenated(&self) -> Result<Tensor> {
        match self {
            Self::Array(t) => Ok(t.shallow_clone()),
            Self::Batches(b) => Ok(tchtrain_accelerate::concat_padded(b)?),
        }
    }

    /// From the loop's per-batch list: `None` when empty, else one tensor or the batches.
    pub(crate) fn from_batches(batches: Vec<Tensor>, concat: bool) -> Result<Option<Self>> {
        Ok(match (batches.is_empty(), concat) {
            (true, _) => None,
            (false, true) => Some(Self::Array(tchtrain_accelerate::concat_padded(&batches)?)),
            (false, false) => Some(Self::Batches(batches)),
        })
    }

    /// The same tensors (sharing storage), as `Tensor::shallow_clone`.
    pub fn shallow_clone(&self) -> Self {
        match self {
            Self::Array(t) => Self::Array(t.shallow_clone()),
            Self::Batches(b) => Self::Batches(b.iter().map(Tensor::shallow_clone).collect()),
        }
    }
}

/// Upstream `EvalPrediction`: every evaluation batch's predictions and labels on the CPU,
/// concatenated (or, with `eval_do_concat_batches=False`, batch by batch; see
/// [`EvalArrays`]); with `batch_eval_metrics`, one batch's (on the device), so that the
/// logits of the whole evaluation set are never held.
#[derive(Debug)]
pub struct EvalPrediction {
    /// The logits (or what `preprocess_logits_for_metrics` made of them).
    pub predictions: EvalArrays,
    /// The labels, when the batches had them.
    pub label_ids: Option<EvalArrays>,
    /// With `include_for_metrics` naming `"inputs"`: the main input (`input_ids`) of every
    /// row, kept as the predictions are (concatenated rows padded with -100, or batches).
    /// With `batch_eval_metrics`, the batch's `input_ids` (upstream hands `compute_metrics`
    /// the whole batch dict; the other columns are not passed here).
    pub inputs: Option<EvalArrays>,
    /// With `include_for_metrics` naming `"loss"`: each row's batch loss (upstream repeats a
    /// batch's loss once per row), in row order.
    pub losses: Option<EvalArrays>,
    /// Upstream's `compute_result` argument: with `batch_eval_metrics`, `compute_metrics`
    /// sees one batch at a time and this is `true` only for the last batch, whose returned
    /// metrics are the evaluation's (earlier calls accumulate); `true` otherwise.
    pub compute_result: bool,
}

/// Upstream's `compute_metrics`: metrics from an [`EvalPrediction`]; the Trainer prefixes
/// each name with `eval_` unless it already has the prefix.
pub type ComputeMetrics = Box<dyn FnMut(&EvalPrediction) -> Result<Metrics> + Send>;

/// Upstream's `preprocess_logits_for_metrics(logits, labels)`: applied to each evaluation
/// batch before it is kept (e.g. `argmax` so that whole logits are never held).
pub type PreprocessLogits = Box<dyn FnMut(&Tensor, Option<&Tensor>) -> Result<Tensor> + Send>;

/// What [`Trainer::train`](crate::Trainer::train) returns (upstream `TrainOutput`).
#[derive(Debug, Clone, PartialEq)]
pub struct TrainOutput {
    /// The last update step.
    pub global_step: i64,
    /// The average training loss of this `train()` call.
    pub training_loss: f64,
    /// `train_runtime`, `train_samples_per_second`, `train_steps_per_second`,
    /// `total_flos`, `train_loss`, `epoch`.
    pub metrics: Metrics,
}

/// Python's `round(x, ndigits)` for the magnitudes speed metrics have.
fn round_to(x: f64, ndigits: i32) -> f64 {
    let scale = 10f64.powi(ndigits);
    let r = (x * scale).round_ties_even() / scale;
    if r.is_finite() { r } else { x }
}

/// Upstream `speed_metrics`: `{split}_runtime` (seconds since `start`, 4 decimals) and,
/// when given, `{split}_samples_per_second`, `{split}_steps_per_second`,
/// `{split}_tokens_per_second` (3 decimals). Nothing but the runtime when it is zero.
pub fn speed_metrics(
    split: &str,
    start: Instant,
    num_samples: Option<f64>,
    num_steps: Option<f64>,
    num_tokens: Option<f64>,
) -> Vec<(String, f64)> {
    let runtime = start.elapsed().as_secs_f64();
    let mut out = vec![(format!("{split}_runtime"), round_to(runtime, 4))];
    if runtime == 0.0 {
        return out;
    }
    for (name, value) in [
        ("samples", num_samples),
        ("steps", num_steps),
        ("tokens", num_tokens),
    ] {
        if let Some(v) = value {
            out.push((
                format!("{split}_{name}_per_second"),
                round_to(v / runtime, 3),
            ));
        }
    }
    out
}

/// `metric_for_best_model` with upstream's `eval_` prefix added when missing.
pub(crate) fn metric_key(name: &str) -> String {
    if name.starts_with("eval_") {
        name.to_string()
    } else {
        format!("eval_{name}")
    }
}

/// Upstream `PredictionOutput`: what [`Trainer::predict`] returns.
#[derive(Debug)]
pub struct PredictionOutput {
    /// The logits of every row (after `preprocess_logits_for_metrics`), on the CPU, kept
    /// as [`EvalArrays`] says; `None` with `prediction_loss_only`.
    pub predictions: Option<EvalArrays>,
    /// The labels of every row, when the dataset has labels.
    pub label_ids: Option<EvalArrays>,
    /// `{prefix}_loss` (when the rows have labels), the `compute_metrics` results and the
    /// speed metrics (`{prefix}_runtime`, `{prefix}_samples_per_second`,
    /// `{prefix}_steps_per_second`), each named `{prefix}_...` (default prefix `test`).
    pub metrics: Metrics,
}

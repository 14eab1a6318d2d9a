//! `Trainer::evaluate`: upstream's `evaluate`, `evaluation_loop` and `_evaluate` (the
//! evaluation during training, which also steps metric-driven schedulers).

use std::sync::Arc;
use std::time::Instant;

use tch::{Device, Kind, Tensor};
use tchtrain_callbacks::JsonMap;

use crate::error::{Error, Result};
use crate::metrics::{EvalArrays, EvalPrediction, Metrics, metric_key, speed_metrics};
use crate::step::StepContext;
use crate::trainer::{Trainer, TrainerHooks};
use tchtrain_data::Dataset;

impl Trainer {
    /// Upstream `evaluate`: runs the model over `eval_dataset` (or the Trainer's) in batches
    /// of `per_device_eval_batch_size` and returns `{prefix}_loss` (the mean of the batch
    /// losses, each weighted by its number of rows: upstream repeats each loss
    /// `batch_size` times and accelerate's `gather_for_metrics` cuts the last batch's
    /// repeats to the dataset's remainder; a `Seq2SeqTrainer`'s plain `gather` does not,
    /// so there a short last batch weighs as a full one),
    /// the `compute_metrics` results and the speed metrics, each named `{prefix}_...`, plus
    /// `epoch`. The metrics are logged and passed to `on_evaluate`. Runs through the hooks
    /// ([`TrainerHooks::evaluate`]).
    pub fn evaluate(
        &mut self,
        eval_dataset: Option<Arc<dyn Dataset>>,
        metric_key_prefix: &str,
    ) -> Result<Metrics> {
        self.with_hooks(|h, t| h.evaluate(t, eval_dataset, metric_key_prefix))
    }

    /// Upstream's base `evaluate` with `hooks` for its steps, data loader and log.
    pub(crate) fn evaluate_with<H: TrainerHooks + ?Sized>(
        &mut self,
        hooks: &H,
        eval_dataset: Option<Arc<dyn Dataset>>,
        metric_key_prefix: &str,
    ) -> Result<Metrics> {
        let _cache = tchtrain_sys::cpu_cache::CpuMemoryCache::from_env();
        self.diagnostics.memory_tracker.start("eval");
        let loader = hooks.get_eval_dataloader(self, eval_dataset)?;
        let start = Instant::now();
        // Upstream: `prediction_loss_only=True if self.evaluation.compute_metrics is None else None`.
        let prediction_loss_only =
            self.evaluation.compute_metrics.is_none() || self.args.prediction_loss_only;
        let output = self.evaluation_loop(
            hooks,
            &loader,
            prediction_loss_only,
            metric_key_prefix,
            true,
        )?;
        let mut metrics = output.metrics;
        let total_batch_size = (self.args.eval_batch_size() * self.args.world_size()).max(1);
        let speed = speed_metrics(
            metric_key_prefix,
            start,
            Some(output.num_samples as f64),
            Some(output.num_samples.div_ceil(total_batch_size) as f64),
            None,
        );
        let mut logs: Vec<(String, f64)> = metrics.iter().map(|(k, v)| (k.clone(), *v)).collect();
        for (k, v) in speed {
            metrics.insert(k.clone(), v);
            logs.push((k, v));
        }
        hooks.log(self, logs, None)?;
        metrics.insert("epoch".into(), self.state.epoch);
        let map: JsonMap = metrics.iter().map(|(k, v)| (k.clone(), *v)).collect();
        self.callback_handler
            .on_evaluate(&self.args, &self.state, &mut self.control, &map)?;
        self.diagnostics
            .memory_tracker
            .stop_and_update_metrics("eval", Some(&mut metrics));
        Ok(metrics)
    }

    /// Upstream `evaluation_loop`, shared by [`evaluate`](Self::evaluate) and
    /// [`predict`](Self::predict): runs `prediction_step` over `loader`, gathers losses,
    /// (preprocessed) logits and labels, calls `compute_metrics`, and returns the
    /// predictions, labels and the metrics named `{metric_key_prefix}_...` (the loss as
    /// `{metric_key_prefix}_loss`), without speed metrics. With `batch_eval_metrics` and
    /// `batch_metrics` (an evaluation, not a prediction), `compute_metrics` runs on each
    /// batch as it comes (`compute_result` on the last) and nothing but the losses is kept.
    pub(crate) fn evaluation_loop<H: TrainerHooks + ?Sized>(
        &mut self,
        hooks: &H,
        loader: &tchtrain_data::DataLoader,
        prediction_loss_only: bool,
        metric_key_prefix: &str,
        batch_metrics: bool,
    ) -> Result<EvalLoopOutput> {
        let batch_metrics = batch_metrics && self.args.batch_eval_metrics;
        let num_batches = loader.len();
        let mut batch_index = 0;
        let mut batch_result: Option<Metrics> = None;
        if loader.num_examples() == 0 {
            return Err(Error::EmptyDataset {
                what: "evaluation",
                hint: String::new(),
            });
        }
        self.callback_handler.eval_dataloader_len = Some(loader.len());
        // Upstream: outside `train`, `fp16_full_eval` / `bf16_full_eval` cast the model
        // (`model.to(dtype=...)`, its floating parameters), and it stays cast.
        if !self.loop_state.is_in_train {
            if (self.args.fp16_full_eval || self.args.bf16_full_eval)
                && tchtrain_models::is_quantized(&*self.model)
            {
                return Err(Error::InvalidArgument {
                    field: if self.args.fp16_full_eval {
                        "fp16_full_eval"
                    } else {
                        "bf16_full_eval"
                    },
                    detail: "`.to` is not supported for `4-bit` or `8-bit` bitsandbytes models. Please use the model as it is, since the model has already been set to the correct devices and casted to the correct `dtype`. (upstream's message); evaluate without it".into(),
                });
            }
            if self.args.fp16_full_eval {
                self.model.var_store_mut().half();
            } else if self.args.bf16_full_eval {
                self.model.var_store_mut().bfloat16();
            }
        }
        self.model.eval();
        // Upstream: `optimizer.eval()` when the optimizer has one (schedule-free optimizers
        // move the parameters to their average; a no-op for the others).
        if let Some(opt) = self.optimization.optimizer.as_mut() {
            opt.eval()?;
        }
        let mut losses: Vec<Tensor> = Vec::new();
        let mut preds: Vec<Tensor> = Vec::new();
        let mut labels: Vec<Tensor> = Vec::new();
        let mut inputs: Vec<Tensor> = Vec::new();
        let include = |what: &str| self.args.include_for_metrics.iter().any(|w| w == what);
        let (include_inputs, include_loss) = (include("inputs"), include("loss"));
        let batch_size = loader.batch_size() as i64;
        for batch in loader.epoch(0) {
            let batch = self.batch_to_device(&batch?)?;
            let rows = batch
                .iter()
                .next()
                .and_then(|(_, t)| t.size().first().copied())
                .unwrap_or(batch_size);
            let out = {
                let tokens_seen = std::cell::Cell::new(self.state.num_input_tokens_seen);
                let mut ctx = StepContext::new(
                    &self.args,
                    &self.facts,
                    &self.accelerator,
                    1,
                    self.state.global_step,
                );
                ctx.num_input_tokens_seen = Some(&tokens_seen);
                hooks.prediction_step(&ctx, &*self.model, &batch, prediction_loss_only)?
            };
            let batch_losses = match out.loss {
                // float32, as `nested_numpify` (which converts bfloat16) and numpy keep
                // it, except float16, which numpy keeps.
                Some(loss) => Some(
                    loss.f_to_kind(if loss.kind() == Kind::Half {
                        Kind::Half
                    } else {
                        Kind::Float
                    })?
                    .f_reshape([1])?
                    .f_repeat([if self.evaluation.gather_for_metrics {
                        rows
                    } else {
                        batch_size
                    }])?
                    .f_to_device(Device::Cpu)?,
                ),
                None => None,
            };
            if let Some(l) = &batch_losses {
                losses.push(l.shallow_clone());
            }
            let batch_inputs = match (include_inputs, batch.get("input_ids")) {
                (true, Some(ids)) => Some(ids.f_to_device(Device::Cpu)?),
                _ => None,
            };
            if let (false, Some(ids)) = (batch_metrics, &batch_inputs) {
                inputs.push(ids.shallow_clone());
            }
            let logits = match (
                out.logits,
                self.evaluation.preprocess_logits_for_metrics.as_mut(),
            ) {
                (Some(logits), Some(f)) => Some(f(&logits, out.labels.as_ref())?),
                (logits, _) => logits,
            };
            if !batch_metrics {
                if let Some(logits) = &logits {
                    preds.push(logits.f_to_device(Device::Cpu)?);
                }
                if let Some(l) = &out.labels {
                    labels.push(l.f_to_device(Device::Cpu)?);
                }
            }
            self.callback_handler
                .on_prediction_step(&self.args, &self.state, &mut self.control)?;
            batch_index += 1;
            if batch_metrics
                && let (Some(f), Some(p), Some(l)) =
                    (self.evaluation.compute_metrics.as_mut(), logits, out.labels)
            {
                let is_last_step = batch_index == num_batches;
                let metrics = f(&EvalPrediction {
                    predictions: EvalArrays::Array(p),
                    label_ids: Some(EvalArrays::Array(l)),
                    inputs: batch_inputs.map(EvalArrays::Array),
                    losses: batch_losses.filter(|_| include_loss).map(EvalArrays::Array),
                    compute_result: is_last_step,
                })?;
                if is_last_step {
                    batch_result = Some(metrics);
                }
            }
        }
        let concat = self.args.eval_do_concat_batches;
        self.accelerator.gather_for_metrics(
            [&mut losses, &mut preds, &mut labels, &mut inputs],
            loader,
            self.args.dataloader_drop_last,
            concat,
        )?;
        let num_samples = loader.num_examples();
        let mut metrics = batch_result.unwrap_or_default();
        let predictions = EvalArrays::from_batches(preds, concat)?;
        let label_ids = EvalArrays::from_batches(labels, concat)?;
        if let (Some(f), Some(p), Some(l)) = (
            self.evaluation.compute_metrics.as_mut(),
            &predictions,
            &label_ids,
        ) {
            let prediction = EvalPrediction {
                predictions: p.shallow_clone(),
                label_ids: Some(l.shallow_clone()),
                inputs: EvalArrays::from_batches(inputs, concat)?,
                losses: match include_loss {
                    true => EvalArrays::from_batches(
                        losses.iter().map(Tensor::shallow_clone).collect(),
                        concat,
                    )?,
                    false => None,
                },
                compute_result: true,
            };
            metrics = f(&prediction)?;
        }
        if !losses.is_empty() {
            let mut all = Tensor::f_cat(&losses, 0)?;
            let finite = all.f_isfinite()?;
            if self.args.logging_nan_inf_filter && finite.f_any()?.f_int64_value(&[])? != 0 {
                all = all.f_masked_select(&finite)?;
            }
            // Upstream `losses.mean().item()` on the float32 numpy array: numpy's pairwise
            // float32 sum, so the loss is upstream's to the bit when the rows' losses are.
            // A float16 array (FSDP's fp16 outputs; `nested_numpify` converts only bfloat16
            // to float32): numpy's float16 `mean` sums in float32 and rounds the mean to
            // float16.
            let values = Vec::<f32>::try_from(all.f_to_kind(Kind::Float)?.f_contiguous()?)?;
            let mut mean = crate::numpy_mean::numpy_mean_f32(&values);
            if all.kind() == Kind::Half {
                mean = Tensor::from(mean as f32)
                    .f_to_kind(Kind::Half)?
                    .f_double_value(&[])?;
            }
            metrics.insert(format!("{metric_key_prefix}_loss"), mean);
        }
        let prefix = format!("{metric_key_prefix}_");
        let metrics: Metrics = metrics
            .into_iter()
            .map(|(k, v)| {
                if k.starts_with(&prefix) {
                    (k, v)
                } else {
                    (format!("{prefix}{k}"), v)
                }
            })
            .collect();
        Ok(EvalLoopOutput {
            predictions,
            label_ids,
            metrics,
            num_samples,
        })
    }

    /// Upstream `_evaluate`: [`evaluate`](Self::evaluate), then a metric-driven scheduler
    /// (`reduce_lr_on_plateau`, `greedy`) steps on `metric_for_best_model`.
    pub(crate) fn evaluate_during_training(&mut self, skip_scheduler: bool) -> Result<Metrics> {
        // ZeRO-3 layer by layer: each layer gathered only while it runs; other sharded runs
        // evaluate the gathered model.
        let scope = self.accelerator.forward_scope(false)?;
        let model = self.model.context().clone();
        let metrics = scope.run(&model, || self.evaluate(None, "eval"))?;
        if !skip_scheduler
            && let (Some(sched), Some(opt)) = (
                self.optimization.lr_scheduler.as_mut(),
                self.optimization.optimizer.as_mut(),
            )
            && sched.steps_on_metric()
        {
            let key = metric_key(self.args.metric_for_best_model.as_deref().unwrap_or("loss"));
            let value = *metrics.get(&key).ok_or_else(|| Error::MetricNotFound {
                metric: key.clone(),
                available: metrics.keys().cloned().collect::<Vec<_>>().join(", "),
            })?;
            sched.step_with_metric(opt.as_mut(), value)?;
        }
        Ok(metrics)
    }
}

/// What [`Trainer::evaluation_loop`] returns (upstream `EvalLoopOutput`).
pub(crate) struct EvalLoopOutput {
    /// The (preprocessed) logits of every row, unless only the loss was asked for.
    pub predictions: Option<EvalArrays>,
    /// The labels of every row, when the rows had labels and logits were kept.
    pub label_ids: Option<EvalArrays>,
    /// `{prefix}_loss` and the `compute_metrics` results, prefixed.
    pub metrics: Metrics,
    /// Number of rows evaluated.
    pub num_samples: usize,
}

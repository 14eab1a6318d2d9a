//! What TRL's trainers share (`trl/trainer/base_trainer.py`'s `_BaseTrainer` and the code
//! each trainer repeats): the logged metrics (`self._metrics[mode]`, averaged into `log`), the
//! tokens a trainer reads (`eos_token`, `pad_token`), `chat_template_path`, rows of a table.

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use serde_json::{Map, Value};
use tch::Tensor;
use tchtrain_collators::{Column, Feature};
use tchtrain_datasets::Table;
use tchtrain_models::PreTrainedTokenizerFast;
use tchtrain_trainer::{Trainer, TrainerBuilder};

use crate::error::{Error, Result};

/// The logged metrics of one mode (TRL's `_metrics[mode]`: each key's values since the last
/// log, in first-seen order).
#[derive(Debug, Default)]
pub(crate) struct ModeMetrics(Vec<(String, Vec<f64>)>);

impl ModeMetrics {
    /// `_metrics[mode][key].append(value)`.
    pub(crate) fn push(&mut self, key: &str, value: f64) {
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => v.push(value),
            None => self.0.push((key.to_string(), vec![value])),
        }
    }

    /// `_metrics[mode][key] = [value]`.
    pub(crate) fn set(&mut self, key: &str, value: f64) {
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = vec![value],
            None => self.0.push((key.to_string(), vec![value])),
        }
    }

    /// `{key: sum(val) / len(val)}`, then cleared; with `skip_nan` (GRPO's `log`), over the
    /// non-NaN values, NaN (logged as `null`, upstream's `None`) when there are none.
    fn take_means(&mut self, skip_nan: bool) -> Vec<(String, f64)> {
        std::mem::take(&mut self.0)
            .into_iter()
            .map(|(k, v)| {
                let v: Vec<f64> = v
                    .into_iter()
                    .filter(|x| !(skip_nan && x.is_nan()))
                    .collect();
                let n = v.len() as f64;
                let mean = if n == 0.0 {
                    f64::NAN
                } else {
                    v.into_iter().fold(0.0, |a, x| a + x) / n
                };
                (k, mean)
            })
            .collect()
    }
}

/// `self._metrics` and `self._total_train_tokens`.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    pub(crate) train: ModeMetrics,
    pub(crate) eval: ModeMetrics,
    pub(crate) total_train_tokens: i64,
}

impl Metrics {
    /// `self._metrics[mode]`.
    pub(crate) fn mode(&mut self, training: bool) -> &mut ModeMetrics {
        if training {
            &mut self.train
        } else {
            &mut self.eval
        }
    }
}

/// The metrics a trainer's hooks share with its `log`.
#[derive(Debug, Default, Clone)]
pub(crate) struct SharedMetrics(Arc<Mutex<Metrics>>);

impl SharedMetrics {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Metrics> {
        match self.0.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// TRL's `log`: the mode's metrics averaged since the last log (`eval_`-prefixed in
    /// evaluation) added to `logs` (replacing a key the Trainer set), then the Trainer's
    /// `log`.
    pub(crate) fn log(
        &self,
        trainer: &mut Trainer,
        logs: Vec<(String, f64)>,
        start_time: Option<Instant>,
    ) -> tchtrain_trainer::Result<()> {
        self.log_means(trainer, logs, start_time, false)
    }

    /// [`log`](Self::log) averaging each metric over its non-NaN values (GRPO's `log`).
    pub(crate) fn log_skipping_nan(
        &self,
        trainer: &mut Trainer,
        logs: Vec<(String, f64)>,
        start_time: Option<Instant>,
    ) -> tchtrain_trainer::Result<()> {
        self.log_means(trainer, logs, start_time, true)
    }

    fn log_means(
        &self,
        trainer: &mut Trainer,
        mut logs: Vec<(String, f64)>,
        start_time: Option<Instant>,
        skip_nan: bool,
    ) -> tchtrain_trainer::Result<()> {
        let training = trainer.model().is_training();
        let metrics = self.lock().mode(training).take_means(skip_nan);
        for (k, v) in metrics {
            let k = if training { k } else { format!("eval_{k}") };
            match logs.iter_mut().find(|(name, _)| *name == k) {
                Some((_, old)) => *old = v,
                None => logs.push((k, v)),
            }
        }
        tchtrain_trainer::default_log(trainer, logs, start_time)
    }
}

/// A `compute_loss` hook's result for a loss computed without model outputs: the loss, and
/// a [`ModelOutput`](tchtrain_models::ModelOutput) carrying only it.
pub(crate) fn loss_only(loss: tch::Tensor) -> (tch::Tensor, tchtrain_models::ModelOutput) {
    (
        loss.shallow_clone(),
        tchtrain_models::ModelOutput {
            loss: Some(loss),
            logits: None,
            last_hidden_state: None,
            pooler_output: None,
            aux_loss: None,
        },
    )
}

/// This crate's error as the Trainer's (what a hook returns).
pub(crate) fn hook_error(e: Error) -> tchtrain_trainer::Error {
    match e {
        Error::Trainer(e) => e,
        Error::Torch(e) => tchtrain_trainer::Error::Torch(e),
        Error::Models(e) => tchtrain_trainer::Error::Model(e),
        Error::Accelerate(e) => tchtrain_trainer::Error::Accelerate(e),
        other => tchtrain_trainer::Error::InvalidArgument {
            field: "trl",
            detail: other.to_string(),
        },
    }
}

/// Row `i` of `table` as an object.
pub(crate) fn row(table: &Table, i: usize, dataset: &str) -> Result<Map<String, Value>> {
    if i >= table.len() {
        return Err(Error::Dataset {
            dataset: dataset.into(),
            row: i,
            detail: "the dataset is empty".into(),
        });
    }
    let mut m = Map::new();
    for c in table.columns() {
        m.insert(c.clone(), table.cell(i, c)?.clone());
    }
    Ok(m)
}

/// Column `name` of row `index` as ids (the collators' error when the row lacks it).
pub(crate) fn ids_column<'a>(
    f: &'a Feature,
    index: usize,
    name: &'static str,
) -> tchtrain_collators::Result<&'a [i64]> {
    match f.column(name) {
        Some(Column::Ids(ids)) => Ok(ids),
        _ => Err(tchtrain_collators::Error::InconsistentFeatures {
            key: name,
            index,
            presence: "lacks",
            other: "does not",
        }),
    }
}

/// A JSON list of ids.
pub(crate) fn ids_of(v: Option<&Value>) -> Option<Vec<i64>> {
    v?.as_array()?.iter().map(Value::as_i64).collect()
}

/// `pad(tensors, padding_value, padding_side="right", pad_to_multiple_of)` of TRL's
/// `trainer/utils.py`, for rows of ids: `[rows, longest]` (rounded up to the multiple).
pub(crate) fn pad_rows(rows: &[Vec<i64>], value: i64, multiple: Option<usize>) -> Result<Tensor> {
    let mut len = rows.iter().map(Vec::len).max().unwrap_or(0);
    if let Some(m) = multiple {
        len = len.div_ceil(m) * m;
    }
    let mut flat = Vec::with_capacity(rows.len() * len);
    for r in rows {
        flat.extend_from_slice(r);
        flat.extend(std::iter::repeat_n(value, len - r.len()));
    }
    Ok(Tensor::from_slice(&flat).f_reshape([rows.len() as i64, len as i64])?)
}

/// [`pad_rows`] with the collators' error.
pub(crate) fn pad_batch(
    rows: &[Vec<i64>],
    value: i64,
    multiple: Option<usize>,
) -> tchtrain_collators::Result<Tensor> {
    pad_rows(rows, value, multiple)
        .map_err(|e| tchtrain_collators::Error::Torch(tch::TchError::Torch(e.to_string())))
}

/// `chat_template_path`: a `.jinja` / `.j2` file whose template replaces the tokenizer's
/// (cloning another tokenizer's template and tokens, `clone_chat_template`, is refused).
pub(crate) fn set_chat_template_path(
    tokenizer: &mut PreTrainedTokenizerFast,
    path: Option<&Path>,
) -> Result<()> {
    let Some(path) = path else {
        return Ok(());
    };
    let is_template = path.is_file() && path.extension().is_some_and(|e| e == "jinja" || e == "j2");
    if !is_template {
        return Err(Error::InvalidArgument {
            field: "chat_template_path",
            detail: format!(
                "{}: cloning another model's chat template and tokens (clone_chat_template) is not implemented here; give a .jinja or .j2 file",
                path.display()
            ),
        });
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::InvalidArgument {
        field: "chat_template_path",
        detail: format!("{}: {e}", path.display()),
    })?;
    tokenizer.set_chat_template(Some(tchtrain_models::ChatTemplate::Single(text)));
    Ok(())
}

/// The tokens a TRL trainer reads: `eos_token` (the config's, checked against the
/// vocabulary, else the tokenizer's) and `pad_token` (the config's, else the tokenizer's,
/// else the EOS token) with its id.
#[derive(Debug, Clone)]
pub(crate) struct TrainerTokens {
    pub(crate) eos_token: Option<String>,
    pub(crate) pad_token_id: i64,
}

impl TrainerTokens {
    pub(crate) fn resolve(
        tokenizer: &PreTrainedTokenizerFast,
        eos_token: Option<&str>,
        pad_token: Option<&str>,
    ) -> Result<Self> {
        let vocab_id = |token: &str, field: &'static str| -> Result<i64> {
            tokenizer
                .tokenizer()
                .token_to_id(token)
                .map(i64::from)
                .ok_or_else(|| Error::InvalidArgument {
                    field,
                    detail: format!(
                        "The specified `{field}` ('{token}') is not found in the vocabulary of the given `processing_class`. (TRL's message)"
                    ),
                })
        };
        let special = tokenizer.special_tokens_map();
        let special_token = |name: &str| {
            special
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let eos_token = match eos_token {
            Some(t) => {
                vocab_id(t, "eos_token")?;
                Some(t.to_string())
            }
            None => special_token("eos_token"),
        };
        let pad_token = pad_token
            .map(str::to_string)
            .or_else(|| special_token("pad_token"))
            .or_else(|| eos_token.clone())
            .ok_or_else(|| Error::InvalidArgument {
                field: "pad_token",
                detail: "the tokenizer has neither a pad token nor an EOS token; set pad_token"
                    .into(),
            })?;
        let pad_token_id = vocab_id(&pad_token, "pad_token")?;
        Ok(Self {
            eos_token,
            pad_token_id,
        })
    }
}

/// What every TRL trainer's builder takes besides the model, config and tokenizer.
#[derive(Default)]
pub(crate) struct TrainerInputs {
    pub(crate) train_dataset: Option<Table>,
    pub(crate) eval_dataset: Option<Table>,
    pub(crate) peft_config: Option<tchtrain_models::LoraConfig>,
    pub(crate) configure: Vec<Box<dyn FnOnce(TrainerBuilder) -> TrainerBuilder>>,
}

impl TrainerInputs {
    /// `train_dataset`, which every trainer requires.
    pub(crate) fn take_train(&mut self) -> Result<Table> {
        self.train_dataset
            .take()
            .ok_or_else(|| Error::InvalidArgument {
                field: "train_dataset",
                detail: "`train_dataset` is required (TRL's message)".into(),
            })
    }

    /// The Trainer's builder with the caller's other arguments set.
    pub(crate) fn configure(&mut self, mut builder: TrainerBuilder) -> TrainerBuilder {
        for f in std::mem::take(&mut self.configure) {
            builder = f(builder);
        }
        builder
    }
}

/// The builder methods every TRL trainer shares (over its `inputs: TrainerInputs`).
macro_rules! trainer_input_methods {
    () => {
        /// `train_dataset` (required).
        pub fn train_dataset(mut self, table: tchtrain_datasets::Table) -> Self {
            self.inputs.train_dataset = Some(table);
            self
        }

        /// `eval_dataset`.
        pub fn eval_dataset(mut self, table: tchtrain_datasets::Table) -> Self {
            self.inputs.eval_dataset = Some(table);
            self
        }

        /// `peft_config`: the model wrapped with `get_peft_model` before training.
        pub fn peft_config(mut self, config: tchtrain_models::LoraConfig) -> Self {
            self.inputs.peft_config = Some(config);
            self
        }

        /// Any other Trainer argument (callbacks, optimizer, ...), set on the Trainer's
        /// builder.
        pub fn configure(
            mut self,
            f: impl FnOnce(tchtrain_trainer::TrainerBuilder) -> tchtrain_trainer::TrainerBuilder
            + 'static,
        ) -> Self {
            self.inputs.configure.push(Box::new(f));
            self
        }
    };
}
pub(crate) use trainer_input_methods;

/// A TRL trainer: a [`Trainer`] reached through `Deref`, and `into_trainer`.
macro_rules! trl_trainer {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        pub struct $name {
            trainer: tchtrain_trainer::Trainer,
        }

        impl std::ops::Deref for $name {
            type Target = tchtrain_trainer::Trainer;
            fn deref(&self) -> &tchtrain_trainer::Trainer {
                &self.trainer
            }
        }

        impl std::ops::DerefMut for $name {
            fn deref_mut(&mut self) -> &mut tchtrain_trainer::Trainer {
                &mut self.trainer
            }
        }

        impl $name {
            /// The underlying Trainer.
            pub fn into_trainer(self) -> tchtrain_trainer::Trainer {
                self.trainer
            }
        }
    };
}
pub(crate) use trl_trainer;

/// The `model` argument of the trainers that load it themselves: a loaded model, or a
/// checkpoint folder loaded at build (after TRL's `set_seed`).
pub(crate) enum ModelArg {
    Model(Box<dyn tchtrain_models::PreTrainedModel>),
    Path(std::path::PathBuf),
}

/// `get_peft_model(model, peft_config)` as TRL's trainers call it: input gradients enabled
/// under gradient checkpointing; a quantized base refused (TRL casts the trainable
/// parameters to bfloat16, which is not reproduced here); with `refuse_lm_head`, an adapter
/// on `lm_head` refused with TRL's message (the fused head reads `lm_head.weight` itself).
pub(crate) fn wrap_with_adapter(
    model: Box<dyn tchtrain_models::PreTrainedModel>,
    peft_config: Option<tchtrain_models::LoraConfig>,
    gradient_checkpointing: bool,
    trainer: &str,
    refuse_lm_head: bool,
) -> Result<Box<dyn tchtrain_models::TrainableModel>> {
    let Some(lora) = peft_config else {
        return Ok(model);
    };
    if tchtrain_models::is_quantized(&*model) {
        return Err(Error::InvalidArgument {
            field: "peft_config",
            detail: format!(
                "a quantized base under {trainer} (TRL casts the adapter to bfloat16) is not implemented here; train the quantized model's adapter with the Trainer, or the float model here"
            ),
        });
    }
    use tchtrain_models::TrainableModel as _;
    let m = tchtrain_models::get_peft_model(model, lora)?;
    if refuse_lm_head && m.lora_layers().iter().any(|l| l.module == "lm_head") {
        return Err(Error::InvalidArgument {
            field: "target_modules",
            detail: "Applying a PEFT adapter to `lm_head` is not supported: the log-probabilities are computed from `lm_head.weight` directly, so the adapter would never be trained. Remove `'lm_head'` from your `target_modules`. (TRL's message)".into(),
        });
    }
    if gradient_checkpointing {
        m.context().enable_input_require_grads();
    }
    Ok(Box::new(m))
}

/// TRL's `prediction_step` of the fused-head trainers: the loss (computed by `loss`, without
/// gradients); the logits, when asked for, from an extra forward without the fused head (as
/// TRL recomputes them for `compute_metrics`), with the batch's `labels_key` as labels.
pub(crate) fn fused_prediction_step(
    ctx: &tchtrain_trainer::StepContext<'_>,
    model: &dyn tchtrain_models::TrainableModel,
    inputs: &tchtrain_collators::Batch,
    prediction_loss_only: bool,
    labels_key: &str,
    loss: impl FnOnce() -> tchtrain_trainer::Result<Tensor>,
) -> tchtrain_trainer::Result<tchtrain_trainer::PredictionStepOutput> {
    tch::no_grad(|| {
        let loss = Some(loss()?.detach());
        if prediction_loss_only {
            return Ok(tchtrain_trainer::PredictionStepOutput {
                loss,
                ..Default::default()
            });
        }
        let mut mi = tchtrain_trainer::model_inputs(inputs);
        mi.labels = None;
        let out = tchtrain_trainer::model_forward(ctx, model, &mi)?;
        Ok(tchtrain_trainer::PredictionStepOutput {
            loss,
            logits: out.logits.as_ref().map(Tensor::detach),
            labels: inputs.get(labels_key).map(Tensor::detach),
        })
    })
}

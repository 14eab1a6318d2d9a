//! `trl/trainer/reward_trainer.py`: `RewardTrainer` (outcome reward models) over the Trainer,
//! and TRL's `DataCollatorForPreference`.
//!
//! The datasets are tables of preference pairs in TRL's formats — implicit prompt (`chosen`,
//! `rejected`), explicit prompt (`prompt` + `chosen` / `rejected`), as text or as messages
//! rendered by the tokenizer's chat template (with the row's `tools` and
//! `chat_template_kwargs`), or already tokenized (`chosen_ids`, `rejected_ids`; the legacy
//! `chosen_input_ids` / `rejected_input_ids` read as those) — with an optional `margin`
//! column, prepared as `_prepare_dataset` prepares them: EOS appended to text rows, the prompt
//! prepended, tokenized, pairs longer than `max_length` dropped. Each batch runs the chosen
//! rows then the rejected rows through a sequence classifier with one label (the reward):
//! the loss `-logsigmoid(r_chosen - r_rejected [- margin]).mean()` (plus
//! `center_rewards_coefficient · mean((r_chosen + r_rejected)²)`), and TRL's logged
//! `num_tokens`, `min_reward`, `mean_reward`, `max_reward`, `accuracy`, `margin`.
//!
//! The model is a decoder family's sequence classifier (`AutoModelForSequenceClassification`
//! with `num_labels=1`; [`RewardTrainer::builder_from_pretrained`] loads a causal LM's
//! checkpoint as one, drawing `score` after the seed as TRL does); its `pad_token_id` is set
//! to the tokenizer's, as TRL sets it. Refused, naming the field: a quantized model with
//! `peft_config`, `activation_offloading`, length-grouped sampling, an `eos_token` that is not the
//! tokenizer's (TRL rewrites the model's `eos_token_id`, which is not done here).

use std::path::PathBuf;
use std::time::Instant;

use serde_json::{Map, Value};
use tch::{Device, Kind, Tensor};
use tchtrain_collators::{Batch, Column, DataCollator, Feature};
use tchtrain_data::InMemoryDataset;
use tchtrain_datasets::Table;
use tchtrain_models::{
    AutoTask, LoadOptions, ModelOutput, PreTrainedModel, PreTrainedTokenizerFast, TrainableModel,
    from_pretrained_dir,
};
use tchtrain_trainer::{
    PredictionStepOutput, StepContext, Trainer, TrainerHooks, model_forward, model_inputs,
};

use crate::data_utils::{is_conversational, tokenize_messages};
use crate::error::{Error, Result};
use crate::trainer::base_trainer::{
    ModelArg, SharedMetrics, TrainerInputs, TrainerTokens, hook_error, ids_column, ids_of,
    pad_batch, row, set_chat_template_path, trainer_input_methods, trl_trainer, wrap_with_adapter,
};
use crate::trainer::reward_config::RewardConfig;

/// TRL's `DataCollatorForPreference` (the reward trainer's): the rows' `chosen_ids` then
/// their `rejected_ids` as one batch of `input_ids`, padded on the right with `pad_token_id`
/// to the longest (rounded up to `pad_to_multiple_of`), their `attention_mask`, and `margin`
/// (float32) when the first row has one.
#[derive(Debug, Clone)]
pub struct DataCollatorForPreference {
    /// `pad_token_id`.
    pub pad_token_id: i64,
    /// `pad_to_multiple_of`.
    pub pad_to_multiple_of: Option<usize>,
}

impl DataCollator<Feature> for DataCollatorForPreference {
    fn collate(&mut self, features: &[Feature]) -> tchtrain_collators::Result<Batch> {
        if features.is_empty() {
            return Err(tchtrain_collators::Error::EmptyBatch);
        }
        let mut rows = Vec::with_capacity(2 * features.len());
        for (i, f) in features.iter().enumerate() {
            rows.push(ids_column(f, i, "chosen_ids")?.to_vec());
        }
        for (i, f) in features.iter().enumerate() {
            rows.push(ids_column(f, i, "rejected_ids")?.to_vec());
        }
        let masks: Vec<Vec<i64>> = rows.iter().map(|r| vec![1; r.len()]).collect();
        let mut batch = Batch::new();
        batch.insert(
            "input_ids",
            pad_batch(&rows, self.pad_token_id, self.pad_to_multiple_of)?,
        );
        batch.insert(
            "attention_mask",
            pad_batch(&masks, 0, self.pad_to_multiple_of)?,
        );
        if features[0].column("margin").is_some() {
            let mut margins = Vec::with_capacity(features.len());
            for (index, f) in features.iter().enumerate() {
                match f.column("margin") {
                    Some(Column::Float(m)) => margins.push(*m as f32),
                    _ => {
                        return Err(tchtrain_collators::Error::InconsistentFeatures {
                            key: "margin",
                            index,
                            presence: "lacks",
                            other: "does",
                        });
                    }
                }
            }
            batch.insert("margin", Tensor::from_slice(&margins));
        }
        Ok(batch)
    }
}

/// The reward trainer's overrides of the Trainer (`compute_loss`, `prediction_step`, `log`).
struct RewardHooks {
    metrics: SharedMetrics,
    center_rewards_coefficient: Option<f64>,
}

impl RewardHooks {
    /// `RewardTrainer.compute_loss`: the forward (accelerate's: autocast, outputs in float32),
    /// the pairwise loss and the metrics recorded.
    fn loss(
        &self,
        ctx: &StepContext<'_>,
        model: &dyn TrainableModel,
        inputs: &Batch,
    ) -> Result<(Tensor, ModelOutput)> {
        let training = model.is_training();
        let out = model_forward(ctx, model, &model_inputs(inputs))?;
        let logits = out.logits.as_ref().ok_or_else(|| Error::InvalidArgument {
            field: "model",
            detail: format!("{} returned no logits", model.model_name()),
        })?;
        let rewards = logits.f_squeeze_dim(-1)?;
        let half = rewards.size()[0] / 2;
        let chosen = rewards.f_narrow(0, 0, half)?;
        let rejected = rewards.f_narrow(0, half, half)?;
        let diff = chosen.f_sub(&rejected)?;
        let mut loss = match inputs.get("margin") {
            Some(m) => diff.f_sub(m)?,
            None => diff.shallow_clone(),
        }
        .f_log_sigmoid()?
        .f_mean(None)?
        .f_neg()?;
        if let Some(coef) = self.center_rewards_coefficient {
            let center = chosen
                .f_add(&rejected)?
                .f_pow_tensor_scalar(2)?
                .f_mean(None)?
                .f_mul_scalar(coef)?;
            loss = loss.f_add(&center)?;
        }
        let mut state = self.metrics.lock();
        if training {
            let mask = inputs
                .get("attention_mask")
                .ok_or_else(|| Error::InvalidArgument {
                    field: "attention_mask",
                    detail: "the batch has no attention_mask (DataCollatorForPreference builds it)"
                        .into(),
                })?;
            // Summed over the processes (`gather_for_metrics(...).sum()`).
            let local = mask.f_sum(Kind::Int64)?;
            let summed = ctx.accelerator.gather(&local)?;
            state.total_train_tokens += summed.f_sum(Kind::Int64)?.int64_value(&[]);
        }
        let total = state.total_train_tokens as f64;
        let (min, mean, max, accuracy, margin) = tch::no_grad(|| -> Result<_> {
            let all = ctx.accelerator.gather(&logits.f_detach()?)?;
            let accuracy = chosen
                .f_gt_tensor(&rejected)?
                .f_to_kind(Kind::Float)?
                .f_mean(None)?;
            let accuracy = ctx.accelerator.gather(&accuracy)?.f_mean(None)?;
            let margin = diff.f_detach()?.f_mean(None)?;
            let margin = ctx.accelerator.gather(&margin)?.f_mean(None)?;
            Ok((
                all.f_min()?.double_value(&[]),
                all.f_mean(None)?.double_value(&[]),
                all.f_max()?.double_value(&[]),
                accuracy.double_value(&[]),
                margin.double_value(&[]),
            ))
        })?;
        let metrics = state.mode(training);
        metrics.set("num_tokens", total);
        metrics.push("min_reward", min);
        metrics.push("mean_reward", mean);
        metrics.push("max_reward", max);
        metrics.push("accuracy", accuracy);
        metrics.push("margin", margin);
        Ok((loss, out))
    }
}

impl TrainerHooks for RewardHooks {
    fn compute_loss(
        &self,
        ctx: &StepContext<'_>,
        model: &dyn TrainableModel,
        inputs: &Batch,
        _num_items_in_batch: Option<&Tensor>,
    ) -> tchtrain_trainer::Result<(Tensor, ModelOutput)> {
        self.loss(ctx, model, inputs).map_err(hook_error)
    }

    /// `loss_is_scaled_for_ga = False`: the loss is a per-batch mean, which the Trainer
    /// divides by the accumulation steps.
    fn loss_is_scaled_for_ga(&self) -> Option<bool> {
        Some(false)
    }

    /// The Trainer's `prediction_step` with `can_return_loss=True` and no label names: the
    /// loss from `compute_loss` (its metrics recorded in evaluation), the rewards as the
    /// logits, no labels.
    fn prediction_step(
        &self,
        ctx: &StepContext<'_>,
        model: &dyn TrainableModel,
        inputs: &Batch,
        prediction_loss_only: bool,
    ) -> tchtrain_trainer::Result<PredictionStepOutput> {
        tch::no_grad(|| {
            let (loss, out) = self.loss(ctx, model, inputs).map_err(hook_error)?;
            Ok(PredictionStepOutput {
                loss: Some(loss.detach()),
                logits: if prediction_loss_only {
                    None
                } else {
                    out.logits.as_ref().map(Tensor::detach)
                },
                labels: None,
            })
        })
    }

    fn log(
        &self,
        trainer: &mut Trainer,
        logs: Vec<(String, f64)>,
        start_time: Option<Instant>,
    ) -> tchtrain_trainer::Result<()> {
        self.metrics.log(trainer, logs, start_time)
    }
}

trl_trainer!(
    /// TRL's `RewardTrainer`: a [`Trainer`] (reached through `Deref`) whose datasets, collator,
    /// loss and logs are TRL's.
    RewardTrainer
);

/// The arguments of `RewardTrainer(model, args, train_dataset, eval_dataset,
/// processing_class, peft_config, ...)`.
pub struct RewardTrainerBuilder {
    model: ModelArg,
    model_init_kwargs: LoadOptions,
    config: RewardConfig,
    tokenizer: PreTrainedTokenizerFast,
    inputs: TrainerInputs,
}

impl RewardTrainer {
    /// `RewardTrainer(model, args, processing_class=tokenizer)` with a loaded sequence
    /// classifier of one label; the datasets and the rest are set on the builder.
    pub fn builder(
        model: Box<dyn PreTrainedModel>,
        config: RewardConfig,
        tokenizer: PreTrainedTokenizerFast,
    ) -> RewardTrainerBuilder {
        Self::with_model(ModelArg::Model(model), config, tokenizer)
    }

    /// `RewardTrainer(model="path", ...)`: the checkpoint loaded at build, after the seed, as
    /// `AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)` (a causal LM's checkpoint gets a freshly drawn `score` and drops its LM
    /// head, as TRL loads it).
    pub fn builder_from_pretrained(
        path: impl Into<PathBuf>,
        config: RewardConfig,
        tokenizer: PreTrainedTokenizerFast,
    ) -> RewardTrainerBuilder {
        Self::with_model(ModelArg::Path(path.into()), config, tokenizer)
    }

    fn with_model(
        model: ModelArg,
        config: RewardConfig,
        tokenizer: PreTrainedTokenizerFast,
    ) -> RewardTrainerBuilder {
        RewardTrainerBuilder {
            model,
            model_init_kwargs: LoadOptions::default(),
            config,
            tokenizer,
            inputs: TrainerInputs::default(),
        }
    }
}

impl RewardTrainerBuilder {
    /// `model_init_kwargs` (and `quantization_config`): how a model given by path is loaded
    /// (`dtype`, 4- / 8-bit quantization; transformers' defaults otherwise).
    pub fn model_init_kwargs(mut self, options: LoadOptions) -> Self {
        self.model_init_kwargs = options;
        self
    }

    trainer_input_methods!();

    /// `RewardTrainer.__init__`: the config resolved, the model loaded or checked and given
    /// the pad token, wrapped in its adapter, the datasets prepared, the Trainer built.
    pub fn build(self) -> Result<RewardTrainer> {
        let Self {
            model,
            model_init_kwargs,
            mut config,
            tokenizer,
            mut inputs,
        } = self;
        config.post_init()?;
        let train = inputs.take_train()?;
        // TRL's `set_seed(args.seed)`, before the model is loaded (its new head drawn).
        tch::manual_seed(config.base.seed as i64);
        let mut model = match model {
            ModelArg::Path(path) => {
                // TRL's `create_model_from_path` passes no dtype unless asked: "auto".
                let options = model_init_kwargs;
                let task = AutoTask::SequenceClassification {
                    num_labels: Some(1),
                };
                from_pretrained_dir(&path, task, Device::Cpu, &options)?.model
            }
            ModelArg::Model(model) => {
                let num_labels = model.config().labels().num_labels();
                if num_labels != 1 {
                    return Err(Error::InvalidArgument {
                        field: "model",
                        detail: format!(
                            "The model has `num_labels={num_labels}`, but reward models require `num_labels=1` to output a single scalar reward per sequence. Please instantiate your model with `num_labels=1` or pass a model name as a string to have it configured automatically. (TRL's message)"
                        ),
                    });
                }
                model
            }
        };
        let mut tokenizer = tokenizer;
        let tokens = TrainerTokens::resolve(&tokenizer, None, config.pad_token.as_deref())?;
        if let Some(eos) = &config.eos_token
            && tokens.eos_token.as_deref() != Some(eos.as_str())
        {
            TrainerTokens::resolve(&tokenizer, Some(eos), None)?;
            return Err(Error::InvalidArgument {
                field: "eos_token",
                detail: format!(
                    "'{eos}' is not the tokenizer's EOS token: TRL then rewrites the model's eos_token_id, which is not done here; set the tokenizer's eos_token (tokenizer_config.json) instead"
                ),
            });
        }
        set_chat_template_path(&mut tokenizer, config.chat_template_path.as_deref())?;
        // `model.config.pad_token_id = processing_class.pad_token_id`: the classifier pools
        // each row's last non-pad token.
        model.set_pad_token_id(Some(tokens.pad_token_id))?;
        let prep = Preparer {
            tokenizer: &tokenizer,
            eos_token: tokens.eos_token.as_deref(),
            max_length: config.max_length,
        };
        let train_rows = prep.prepare(&train, "train")?;
        let eval_rows = match &inputs.eval_dataset {
            Some(t) => Some(prep.prepare(t, "eval")?),
            None => None,
        };
        let model = wrap_with_adapter(
            model,
            inputs.peft_config.take(),
            config.base.gradient_checkpointing,
            "RewardTrainer",
            false,
        )?;
        let mut builder = Trainer::builder(model, config.base.clone())
            .processing_class(tokenizer.clone())
            .data_collator(DataCollatorForPreference {
                pad_token_id: tokens.pad_token_id,
                pad_to_multiple_of: config.pad_to_multiple_of,
            })
            .hooks(RewardHooks {
                metrics: SharedMetrics::default(),
                center_rewards_coefficient: config.center_rewards_coefficient,
            })
            .train_dataset(InMemoryDataset::new(train_rows));
        if let Some(rows) = eval_rows {
            builder = builder.eval_dataset(InMemoryDataset::new(rows));
        }
        let builder = inputs.configure(builder);
        Ok(RewardTrainer {
            trainer: builder.build()?,
        })
    }
}

/// `_prepare_dataset`'s state.
struct Preparer<'a> {
    tokenizer: &'a PreTrainedTokenizerFast,
    eos_token: Option<&'a str>,
    max_length: Option<usize>,
}

impl Preparer<'_> {
    fn bad(&self, dataset: &str, row: usize, detail: impl Into<String>) -> Error {
        Error::Dataset {
            dataset: dataset.into(),
            row,
            detail: detail.into(),
        }
    }

    /// `tokenize_fn`: the prompt prepended, then `_tokenize` (the chat template for
    /// messages, the tokenizer for text).
    fn tokenize(
        &self,
        example: &Map<String, Value>,
        dataset: &str,
        i: usize,
    ) -> Result<(Vec<i64>, Vec<i64>)> {
        let conversational = is_conversational(example);
        let side = |key: &str| -> Result<Vec<i64>> {
            let value = example
                .get(key)
                .ok_or_else(|| self.bad(dataset, i, format!("the row has no `{key}`")))?;
            let prompt = example.get("prompt");
            if conversational {
                let mut messages = match prompt {
                    Some(Value::Array(p)) => p.clone(),
                    Some(_) => {
                        return Err(self.bad(dataset, i, "`prompt` is not a list of messages"));
                    }
                    None => Vec::new(),
                };
                let Some(turns) = value.as_array() else {
                    return Err(self.bad(dataset, i, format!("`{key}` is not a list of messages")));
                };
                messages.extend(turns.iter().cloned());
                return Ok(tokenize_messages(
                    self.tokenizer,
                    &Value::Array(messages),
                    example,
                    false,
                    false,
                )?
                .0);
            }
            let text = |v: &Value, k: &str| -> Result<String> {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| self.bad(dataset, i, format!("`{k}` is not a string")))
            };
            let mut s = match prompt {
                Some(p) => text(p, "prompt")?,
                None => String::new(),
            };
            s.push_str(&text(value, key)?);
            Ok(self.tokenizer.encode(&s, true)?)
        };
        Ok((side("chosen")?, side("rejected")?))
    }

    /// `_prepare_dataset(dataset, processing_class, args, name)`: rows with `chosen_ids`,
    /// `rejected_ids` and, when the table has it, `margin`.
    fn prepare(&self, table: &Table, dataset: &str) -> Result<Vec<Feature>> {
        let columns = table.columns();
        let has = |c: &str| columns.iter().any(|x| x == c);
        let (chosen_col, rejected_col) = if has("chosen_ids") && has("rejected_ids") {
            (Some("chosen_ids"), Some("rejected_ids"))
        } else if has("chosen_input_ids") && has("rejected_input_ids") {
            (Some("chosen_input_ids"), Some("rejected_input_ids"))
        } else {
            (None, None)
        };
        let first_conversational = is_conversational(&row(table, 0, dataset)?);
        let mut out = Vec::with_capacity(table.len());
        for i in 0..table.len() {
            let mut example = row(table, i, dataset)?;
            let (chosen, rejected) = match (chosen_col, rejected_col) {
                (Some(c), Some(r)) => {
                    let get = |k: &str| {
                        ids_of(example.get(k)).ok_or_else(|| {
                            self.bad(dataset, i, format!("`{k}` is not a list of ids"))
                        })
                    };
                    (get(c)?, get(r)?)
                }
                _ => {
                    // `add_eos`: the text completions end with the EOS token.
                    if !first_conversational && let Some(eos) = self.eos_token {
                        for key in ["chosen", "rejected"] {
                            if let Some(Value::String(s)) = example.get_mut(key)
                                && !s.ends_with(eos)
                            {
                                s.push_str(eos);
                            }
                        }
                    }
                    self.tokenize(&example, dataset, i)?
                }
            };
            if let Some(max) = self.max_length
                && (chosen.len() > max || rejected.len() > max)
            {
                continue;
            }
            let mut f = Feature::default()
                .with_column("chosen_ids", Column::Ids(chosen))
                .with_column("rejected_ids", Column::Ids(rejected));
            match example.get("margin") {
                None => {}
                Some(Value::Number(n)) => {
                    let m = n.as_f64().unwrap_or(f64::NAN);
                    f = f.with_column("margin", Column::Float(m));
                }
                Some(_) => return Err(self.bad(dataset, i, "`margin` is not a number")),
            }
            out.push(f);
        }
        Ok(out)
    }
}

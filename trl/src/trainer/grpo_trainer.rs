//! `trl/trainer/grpo_trainer.py`'s `GRPOTrainer` (trl 1.16): Group Relative Policy
//! Optimization. Each generation round samples `num_generations` completions per prompt
//! with the policy's own [`generate`](tchtrain_models::generate) (left-padded prompts,
//! TRL's sampling settings over the model's generation config), scores them with the reward
//! functions (Rust closures, or sequence-classification reward models), normalises the
//! rewards in each group into advantages, and trains on the clipped importance-weighted
//! advantages, with a KL term to a reference (a frozen copy, or the policy with its adapter
//! disabled) when `beta` is not 0.
//!
//! As upstream: the training loader yields one generation batch (`per_device_train_batch_size
//! × steps_per_generation` rows, from [`RepeatSampler`]) per micro-step; every
//! `steps_per_generation × num_iterations` micro-steps the batch is generated, scored,
//! shuffled with `torch.randperm` on the global generator and split into
//! `steps_per_generation` micro-batches, which the following micro-steps train on. The old
//! log-probabilities are computed when generation and optimizer steps are misaligned
//! (`gradient_accumulation_steps % (steps_per_generation × num_iterations) != 0`). Evaluation
//! generates for each batch (`num_generations_eval` per prompt) and reports the loss.
//!
//! Not implemented, each refused naming the field: vLLM, continuous batching, tools and
//! environments, `rollout_func`, vision inputs, the completions table (`log_completions`),
//! the adaptive entropy controller, `sync_ref_model`, a mixture-of-experts router loss,
//! VESPO, and data-parallel runs (one process).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use serde_json::{Map, Value};
use tch::{Device, Kind, Tensor};
use tchtrain_collators::{Batch, DataCollator, Feature};
use tchtrain_data::Dataset;
use tchtrain_datasets::Table;
use tchtrain_models::{
    AutoTask, GenerationConfig, LoadOptions, ModelInputs, ModelOutput, PreTrainedModel,
    PreTrainedTokenizerFast, TrainableModel, from_pretrained_dir,
};
use tchtrain_trainer::{
    PredictionStepOutput, StepContext, Trainer, TrainerHooks, default_training_step,
};

use crate::data_utils::{is_conversational, tokenize_messages};
use crate::error::{Error, Result};
use crate::kernels::LogProbOutputs;
use crate::trainer::base_trainer::{
    ModelArg, SharedMetrics, TrainerInputs, TrainerTokens, hook_error, loss_only, pad_rows, row,
    trainer_input_methods, trl_trainer, wrap_with_adapter,
};
use crate::trainer::grpo_config::{
    GRPOConfig, GrpoLossType, ImportanceSamplingLevel, MultiObjectiveAggregation, ScaleRewards,
};
use crate::trainer::utils::{RepeatSampler, fused_lm_head_forward_at, nanmax, nanmin, nanstd};

/// What a reward function reads (upstream's keyword arguments): one entry per completion.
#[derive(Debug)]
pub struct RewardInputs<'a> {
    /// `prompts`: the rows' prompts (text, or a list of messages).
    pub prompts: &'a [Value],
    /// `completions`: the decoded completions (text, or `[{"role": "assistant", "content":
    /// text}]` for conversations).
    pub completions: &'a [Value],
    /// `completion_ids`: the completions' token ids (up to and including the first EOS).
    pub completion_ids: &'a [Vec<i64>],
    /// The rows' other columns by name (upstream passes each as a keyword argument).
    pub columns: &'a BTreeMap<String, Vec<Value>>,
    /// `trainer_state.global_step`.
    pub global_step: i64,
}

/// A reward function's error.
pub type RewardError = Box<dyn std::error::Error + Send + Sync>;

/// A reward function: one reward per completion, `None` where it does not apply (upstream's
/// `None`, NaN in the rewards).
pub type RewardFn =
    dyn Fn(&RewardInputs<'_>) -> std::result::Result<Vec<Option<f64>>, RewardError> + Send + Sync;

/// One of `reward_funcs`: a function, or a reward model (a one-label sequence classifier
/// scoring prompt + completion).
pub enum RewardFunc {
    /// A function and the name its metrics are logged under (upstream: its `__name__`).
    Function {
        /// `rewards/{name}/mean` ...
        name: String,
        /// The function.
        func: Arc<RewardFn>,
    },
    /// A reward model and its tokenizer.
    Model {
        /// The checkpoint folder's name (upstream: the last part of `_name_or_path`).
        name: String,
        /// The classifier (run in evaluation mode, without gradients).
        model: Mutex<Box<dyn TrainableModel>>,
        /// Its tokenizer (the padding token defaults to its EOS token).
        tokenizer: Box<PreTrainedTokenizerFast>,
    },
}

impl RewardFunc {
    /// A reward function named `name`.
    pub fn function(
        name: impl Into<String>,
        func: impl Fn(&RewardInputs<'_>) -> std::result::Result<Vec<Option<f64>>, RewardError>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        Self::Function {
            name: name.into(),
            func: Arc::new(func),
        }
    }

    /// Upstream's `reward_funcs=["path"]`: `AutoModelForSequenceClassification
    /// .from_pretrained(path, num_labels=1)` and `AutoTokenizer.from_pretrained(path)`.
    pub fn from_pretrained(path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        let model = from_pretrained_dir(
            &path,
            AutoTask::SequenceClassification {
                num_labels: Some(1),
            },
            Device::Cpu,
            &LoadOptions::default(),
        )?
        .model;
        let tokenizer = tchtrain_models::AutoTokenizer::from_pretrained(&path)?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string());
        Self::model(name, model, tokenizer)
    }

    /// A loaded reward model named `name` with its tokenizer.
    pub fn model(
        name: impl Into<String>,
        model: Box<dyn PreTrainedModel>,
        tokenizer: PreTrainedTokenizerFast,
    ) -> Result<Self> {
        if model.config().labels().num_labels() != 1 {
            return Err(Error::InvalidArgument {
                field: "reward_funcs",
                detail: format!(
                    "{} is not a one-label sequence classifier: a reward model outputs one score per sequence",
                    model.model_name()
                ),
            });
        }
        let mut model: Box<dyn TrainableModel> = model;
        let pad = TrainerTokens::resolve(&tokenizer, None, None)?.pad_token_id;
        model.set_pad_token_id(Some(pad))?;
        model.set_training(false);
        for (_, v) in model.var_store().variables() {
            let _ = v.set_requires_grad(false);
        }
        Ok(Self::Model {
            name: name.into(),
            model: Mutex::new(model),
            tokenizer: Box::new(tokenizer),
        })
    }

    fn name(&self) -> &str {
        match self {
            Self::Function { name, .. } | Self::Model { name, .. } => name,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// The prompts of one dataset (the rows as objects), which the loader visits by index.
struct PromptRows {
    table_id: i64,
    rows: Arc<Vec<Map<String, Value>>>,
}

impl Dataset for PromptRows {
    fn len(&self) -> usize {
        self.rows.len()
    }

    fn get(&self, index: usize) -> tchtrain_data::Result<Feature> {
        if index >= self.rows.len() {
            return Err(tchtrain_data::Error::IndexOutOfRange {
                index,
                len: self.rows.len(),
            });
        }
        Ok(Feature::new(vec![self.table_id, index as i64]))
    }
}

/// Upstream's `identity` collator: the batch is the rows themselves, here their
/// `(dataset, index)` pairs as `prompt_index` `[rows, 2]`.
#[derive(Debug, Clone, Copy)]
struct PromptIndexCollator;

impl DataCollator<Feature> for PromptIndexCollator {
    fn collate(&mut self, features: &[Feature]) -> tchtrain_collators::Result<Batch> {
        let flat: Vec<i64> = features.iter().flat_map(|f| f.input_ids.clone()).collect();
        let index = Tensor::from_slice(&flat)
            .f_reshape([features.len() as i64, 2])
            .map_err(tchtrain_collators::Error::Torch)?;
        let mut batch = Batch::new();
        batch.insert("prompt_index", index);
        Ok(batch)
    }
}

/// What the hooks read and never change.
struct Shared {
    config: GRPOConfig,
    tokenizer: PreTrainedTokenizerFast,
    pad_token_id: i64,
    eos_token_ids: Vec<i64>,
    generation_config: GenerationConfig,
    max_position_embeddings: Option<i64>,
    reward_funcs: Vec<RewardFunc>,
    reward_weights: Vec<f64>,
    reference: Reference,
    tables: Vec<Arc<Vec<Map<String, Value>>>>,
}

/// The reference model of the KL term.
enum Reference {
    /// `beta == 0`: none.
    None,
    /// A frozen copy of the initial policy.
    Model(Mutex<Box<dyn TrainableModel>>),
    /// The policy with its adapter disabled.
    DisabledAdapter,
}

/// What the hooks change as training runs.
#[derive(Default)]
struct State {
    /// `self._step`: micro-steps run (forward + backward), gradient accumulation included.
    step: usize,
    /// `self._buffered_inputs`: the current generation's micro-batches.
    buffered: Option<Vec<Batch>>,
    /// The accumulation window's training-step time so far.
    step_time: f64,
}

struct GrpoHooks {
    shared: Arc<Shared>,
    metrics: SharedMetrics,
    state: Mutex<State>,
}

fn tensor_error(e: tch::TchError) -> Error {
    Error::Torch(e)
}

/// `pad(rows, padding_value, padding_side="left", pad_to_multiple_of)`.
fn pad_left(rows: &[Vec<i64>], value: i64, multiple: Option<usize>) -> Result<Tensor> {
    let reversed: Vec<Vec<i64>> = rows
        .iter()
        .map(|r| r.iter().rev().copied().collect())
        .collect();
    Ok(pad_rows(&reversed, value, multiple)?.f_flip([1])?)
}

fn ones_like_rows(rows: &[Vec<i64>]) -> Vec<Vec<i64>> {
    rows.iter().map(|r| vec![1; r.len()]).collect()
}

fn item(t: &Tensor) -> Result<f64> {
    f64::try_from(t).map_err(tensor_error)
}

fn batch_tensor<'a>(inputs: &'a Batch, key: &'static str) -> Result<&'a Tensor> {
    inputs.get(key).ok_or_else(|| Error::InvalidArgument {
        field: "inputs",
        detail: format!("the GRPO batch has no `{key}`"),
    })
}

impl GrpoHooks {
    fn rows_of(&self, inputs: &Batch) -> Result<Vec<Map<String, Value>>> {
        let index = batch_tensor(inputs, "prompt_index")?;
        let flat = Vec::<i64>::try_from(index.f_reshape([-1])?).map_err(tensor_error)?;
        flat.chunks_exact(2)
            .map(|p| {
                self.shared
                    .tables
                    .get(p[0] as usize)
                    .and_then(|t| t.get(p[1] as usize))
                    .cloned()
                    .ok_or_else(|| Error::InvalidArgument {
                        field: "prompt_index",
                        detail: format!("no row {} in dataset {}", p[1], p[0]),
                    })
            })
            .collect()
    }

    /// `_get_per_token_logps_and_entropies`: the completion tokens' log-probabilities (and
    /// entropies) at the sampling temperature, `batch_size` rows per forward, in the
    /// accelerator's autocast region.
    #[allow(clippy::too_many_arguments)]
    fn per_token_logps(
        &self,
        ctx: &StepContext<'_>,
        model: &dyn TrainableModel,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        logits_to_keep: i64,
        batch_size: Option<i64>,
        compute_entropy: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let rows = input_ids.size()[0];
        let batch_size = batch_size.unwrap_or(rows).max(1);
        let (mut logps, mut entropies) = (Vec::new(), Vec::new());
        let seq = input_ids.size()[1];
        let mut start = 0;
        while start < rows {
            let n = batch_size.min(rows - start);
            let ids = input_ids.f_narrow(0, start, n)?;
            let mask = attention_mask.f_narrow(0, start, n)?;
            let labels = ids.f_masked_fill(&mask.f_eq(0)?, -100)?;
            let _ = labels.f_narrow(1, 0, seq - logits_to_keep)?.f_fill_(-100)?;
            let out = {
                let _autocast = ctx.accelerator.autocast()?;
                fused_lm_head_forward_at(
                    model,
                    &ModelInputs {
                        input_ids: Some(&ids),
                        attention_mask: Some(&mask),
                        ..ModelInputs::default()
                    },
                    &labels,
                    LogProbOutputs {
                        entropy: compute_entropy,
                        ..LogProbOutputs::default()
                    },
                    self.shared.config.temperature,
                )?
            };
            let width = out.log_probs.size()[1];
            logps.push(
                out.log_probs
                    .f_narrow(1, width - logits_to_keep, logits_to_keep)?,
            );
            if let Some(e) = out.entropy {
                entropies.push(e.f_narrow(1, width - logits_to_keep, logits_to_keep)?);
            }
            start += n;
        }
        let logps = Tensor::f_cat(&logps, 0)?;
        let entropies = if compute_entropy {
            Some(Tensor::f_cat(&entropies, 0)?)
        } else {
            None
        };
        Ok((logps, entropies))
    }

    /// `_tokenize_prompts`: the chat template with the generation prompt for conversations,
    /// else the tokenizer with its special tokens.
    fn tokenize_prompts(&self, prompts: &[Value], conversational: bool) -> Result<Vec<Vec<i64>>> {
        let s = &self.shared;
        let mut example = Map::new();
        if let Some(kw) = &s.config.chat_template_kwargs {
            example.insert("chat_template_kwargs".into(), Value::Object(kw.clone()));
        }
        prompts
            .iter()
            .map(|p| {
                if conversational {
                    Ok(tokenize_messages(&s.tokenizer, p, &example, true, false)?.0)
                } else {
                    let text = p.as_str().ok_or_else(|| Error::InvalidArgument {
                        field: "prompt",
                        detail: "a prompt must be text or a list of messages".into(),
                    })?;
                    Ok(s.tokenizer.encode(text, true)?)
                }
            })
            .collect()
    }

    /// `_generate_single_turn` (the regular generation path): the prompts left-padded and
    /// generated from with TRL's configuration; each completion cut after its first EOS.
    fn generate(
        &self,
        ctx: &StepContext<'_>,
        model: &dyn TrainableModel,
        prompt_ids: &[Vec<i64>],
    ) -> Result<Vec<Vec<i64>>> {
        let s = &self.shared;
        let multiple = s.config.pad_to_multiple_of;
        let ids = pad_left(prompt_ids, s.pad_token_id, multiple)?.f_to_device(ctx.device)?;
        let mask = pad_left(&ones_like_rows(prompt_ids), 0, multiple)?.f_to_device(ctx.device)?;
        let sequences = {
            // accelerate's forward wrapper (`convert_outputs_to_fp32(autocast(forward))`),
            // which `unwrap_model_for_generation` keeps.
            let _autocast = ctx.accelerator.autocast()?;
            tchtrain_models::generate(
                model,
                &ids,
                Some(&mask),
                &s.generation_config,
                s.max_position_embeddings,
            )?
            .sequences
        };
        let prompt_len = ids.size()[1];
        let total = sequences.size()[1];
        let completions = sequences
            .f_narrow(1, prompt_len, total - prompt_len)?
            .f_to_device(Device::Cpu)?;
        let rows = Vec::<Vec<i64>>::try_from(&completions).map_err(tensor_error)?;
        Ok(rows
            .into_iter()
            .map(
                |r| match r.iter().position(|t| s.eos_token_ids.contains(t)) {
                    Some(i) => r[..=i].to_vec(),
                    None => r,
                },
            )
            .collect())
    }

    /// `_calculate_rewards`: `[rows, functions]` float32, NaN where a function returned
    /// `None`.
    fn calculate_rewards(
        &self,
        ctx: &StepContext<'_>,
        rows: &[Map<String, Value>],
        prompts: &[Value],
        completions: &[Value],
        completion_ids: &[Vec<i64>],
        conversational: bool,
    ) -> Result<Tensor> {
        let s = &self.shared;
        let n = prompts.len();
        let mut columns: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for r in rows {
            for (k, v) in r {
                if !matches!(k.as_str(), "prompt" | "completion" | "completion_ids") {
                    columns.entry(k.clone()).or_default().push(v.clone());
                }
            }
        }
        let mut per_func = Vec::with_capacity(s.reward_funcs.len());
        for f in &s.reward_funcs {
            let values: Vec<f32> = match f {
                RewardFunc::Function { name, func } => {
                    let out = func(&RewardInputs {
                        prompts,
                        completions,
                        completion_ids,
                        columns: &columns,
                        global_step: ctx.global_step,
                    })
                    .map_err(|e| Error::InvalidArgument {
                        field: "reward_funcs",
                        detail: format!("the reward function '{name}' failed: {e}"),
                    })?;
                    if out.len() != n {
                        return Err(Error::InvalidArgument {
                            field: "reward_funcs",
                            detail: format!(
                                "The reward function '{name}' returned {} rewards, but {n} were expected (one per prompt-completion pair). Make sure the reward function returns exactly one reward per completion. (TRL's message)",
                                out.len()
                            ),
                        });
                    }
                    out.into_iter()
                        .map(|r| r.map_or(f32::NAN, |x| x as f32))
                        .collect()
                }
                RewardFunc::Model {
                    model, tokenizer, ..
                } => self.reward_model_scores(
                    ctx,
                    &**lock(model),
                    tokenizer,
                    prompts,
                    completions,
                    conversational,
                )?,
            };
            per_func.push(Tensor::from_slice(&values));
        }
        if per_func.is_empty() {
            return Ok(Tensor::f_zeros([n as i64, 0], (Kind::Float, Device::Cpu))?);
        }
        let rewards = Tensor::f_stack(&per_func, 1)?;
        let all_nan = rewards.f_isnan()?.f_all_dims(Some(&[1][..]), false)?;
        if bool::try_from(all_nan.f_any()?).map_err(tensor_error)? {
            log::warn!(
                "All reward functions returned None for a row. Please ensure that at least one reward function returns a valid reward."
            );
        }
        Ok(rewards)
    }

    /// A reward model's scores: prompt + completion (the chat template's text for
    /// conversations) tokenized without special tokens, right-padded, `logits[:, 0]`.
    fn reward_model_scores(
        &self,
        ctx: &StepContext<'_>,
        model: &dyn TrainableModel,
        tokenizer: &PreTrainedTokenizerFast,
        prompts: &[Value],
        completions: &[Value],
        conversational: bool,
    ) -> Result<Vec<f32>> {
        let mut rows = Vec::with_capacity(prompts.len());
        for (p, c) in prompts.iter().zip(completions) {
            let text = if conversational {
                let mut messages = p.as_array().cloned().unwrap_or_default();
                messages.extend(c.as_array().cloned().unwrap_or_default());
                let options = tchtrain_models::ChatTemplateOptions {
                    template_kwargs: self
                        .shared
                        .config
                        .chat_template_kwargs
                        .clone()
                        .unwrap_or_default(),
                    ..tchtrain_models::ChatTemplateOptions::default()
                };
                tokenizer.apply_chat_template_text(&Value::Array(messages).to_string(), &options)?
            } else {
                format!("{}{}", p.as_str().unwrap_or(""), c.as_str().unwrap_or(""))
            };
            rows.push(tokenizer.encode(&text, false)?);
        }
        let pad = TrainerTokens::resolve(tokenizer, None, None)?.pad_token_id;
        let ids = pad_rows(&rows, pad, None)?.f_to_device(ctx.device)?;
        let mask = pad_rows(&ones_like_rows(&rows), 0, None)?.f_to_device(ctx.device)?;
        let logits = tch::no_grad(|| -> Result<Tensor> {
            let _autocast = ctx.accelerator.autocast()?;
            let out = model.forward(&ModelInputs {
                input_ids: Some(&ids),
                attention_mask: Some(&mask),
                ..ModelInputs::default()
            })?;
            Ok(out.logits()?.f_to_kind(Kind::Float)?)
        })?;
        let scores = logits.f_select(1, 0)?.f_to_device(Device::Cpu)?;
        Vec::<f32>::try_from(&scores).map_err(tensor_error)
    }

    /// `_generate_and_score_completions`: the generation batch with its advantages (and old
    /// / reference log-probabilities), the metrics recorded.
    fn generate_and_score(
        &self,
        ctx: &StepContext<'_>,
        model: &dyn TrainableModel,
        rows: &[Map<String, Value>],
    ) -> Result<Batch> {
        let s = &self.shared;
        let c = &s.config;
        let training = model.is_training();
        let prompts: Vec<Value> = rows
            .iter()
            .map(|r| r.get("prompt").cloned().unwrap_or(Value::Null))
            .collect();
        let first = Map::from_iter([("prompt".to_string(), prompts[0].clone())]);
        let conversational = is_conversational(&first);
        let prompt_ids_list = self.tokenize_prompts(&prompts, conversational)?;
        let completion_ids_list = self.generate(ctx, model, &prompt_ids_list)?;
        let texts = completion_ids_list
            .iter()
            .map(|ids| s.tokenizer.decode(ids, true, None))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let completions: Vec<Value> = texts
            .into_iter()
            .map(|t| {
                if conversational {
                    serde_json::json!([{"role": "assistant", "content": t}])
                } else {
                    Value::String(t)
                }
            })
            .collect();

        // Lengths and their metrics.
        let lengths =
            |rows: &[Vec<i64>]| -> Vec<i64> { rows.iter().map(|r| r.len() as i64).collect() };
        let prompt_lengths = Tensor::from_slice(&lengths(&prompt_ids_list));
        let completion_lengths = Tensor::from_slice(&lengths(&completion_ids_list));
        let tokens_seen = ctx.num_input_tokens_seen;
        if training && let Some(cell) = tokens_seen {
            let total = item(
                &prompt_lengths
                    .f_sum(Kind::Int64)?
                    .f_add(&completion_lengths.f_sum(Kind::Int64)?)?,
            )?;
            cell.set(cell.get() + total as i64);
        }
        let mut metrics = self.metrics.lock();
        let m = metrics.mode(training);
        m.set(
            "num_tokens",
            tokens_seen.map_or(0.0, |cell| cell.get() as f64),
        );
        let lengths_f = completion_lengths.f_to_kind(Kind::Float)?;
        m.push(
            "completions/mean_length",
            item(&lengths_f.f_mean(Kind::Float)?)?,
        );
        m.push("completions/min_length", item(&lengths_f.f_min()?)?);
        m.push("completions/max_length", item(&lengths_f.f_max()?)?);
        let mut eos_and_pad = s.eos_token_ids.clone();
        eos_and_pad.push(s.pad_token_id);
        let truncated: Vec<bool> = completion_ids_list
            .iter()
            .map(|ids| ids.last().is_none_or(|t| !eos_and_pad.contains(t)))
            .collect();
        let is_truncated = Tensor::from_slice(&truncated);
        m.push(
            "completions/clipped_ratio",
            item(&is_truncated.f_to_kind(Kind::Float)?.f_mean(Kind::Float)?)?,
        );
        let mut term = completion_lengths.f_masked_select(&is_truncated.f_logical_not()?)?;
        if term.numel() == 0 {
            term = Tensor::f_zeros([1], (Kind::Int64, Device::Cpu))?;
        }
        let term = term.f_to_kind(Kind::Float)?;
        m.push(
            "completions/mean_terminated_length",
            item(&term.f_mean(Kind::Float)?)?,
        );
        m.push("completions/min_terminated_length", item(&term.f_min()?)?);
        m.push("completions/max_terminated_length", item(&term.f_max()?)?);
        drop(metrics);

        // The padded batch.
        let multiple = c.pad_to_multiple_of;
        let device = ctx.device;
        let prompt_ids =
            pad_left(&prompt_ids_list, s.pad_token_id, multiple)?.f_to_device(device)?;
        let prompt_mask =
            pad_left(&ones_like_rows(&prompt_ids_list), 0, multiple)?.f_to_device(device)?;
        let completion_ids =
            pad_rows(&completion_ids_list, s.pad_token_id, multiple)?.f_to_device(device)?;
        let mut completion_mask =
            pad_rows(&ones_like_rows(&completion_ids_list), 0, multiple)?.f_to_device(device)?;
        if c.mask_truncated_completions {
            let keep = is_truncated
                .f_logical_not()?
                .f_unsqueeze(1)?
                .f_to_kind(Kind::Int)?
                .f_to_device(device)?;
            completion_mask = completion_mask.f_mul(&keep)?;
        }
        let num_items_in_batch = completion_mask.f_sum(Kind::Int64)?;
        let prompt_completion_ids = Tensor::f_cat(&[&prompt_ids, &completion_ids], 1)?;
        let attention_mask = Tensor::f_cat(&[&prompt_mask, &completion_mask], 1)?;
        let logits_to_keep = completion_ids.size()[1];
        let batch_size = if training {
            c.base.per_device_train_batch_size
        } else {
            c.base.per_device_eval_batch_size
        } as i64;

        let (old, reference) = tch::no_grad(|| -> Result<(Option<Tensor>, Option<Tensor>)> {
            let generate_every = c.steps_per_generation() * c.num_iterations;
            let old = if !c
                .base
                .gradient_accumulation_steps
                .is_multiple_of(generate_every)
            {
                Some(
                    self.per_token_logps(
                        ctx,
                        model,
                        &prompt_completion_ids,
                        &attention_mask,
                        logits_to_keep,
                        Some(batch_size),
                        false,
                    )?
                    .0,
                )
            } else {
                None
            };
            let reference = match &s.reference {
                Reference::None => None,
                Reference::Model(r) => Some(
                    self.per_token_logps(
                        ctx,
                        &**lock(r),
                        &prompt_completion_ids,
                        &attention_mask,
                        logits_to_keep,
                        Some(batch_size),
                        false,
                    )?
                    .0,
                ),
                Reference::DisabledAdapter => {
                    model.set_adapters_disabled(true)?;
                    let out = self.per_token_logps(
                        ctx,
                        model,
                        &prompt_completion_ids,
                        &attention_mask,
                        logits_to_keep,
                        Some(batch_size),
                        false,
                    );
                    model.set_adapters_disabled(false)?;
                    Some(out?.0)
                }
            };
            Ok((old, reference))
        })?;

        // Rewards and advantages.
        let rewards_per_func = self.calculate_rewards(
            ctx,
            rows,
            &prompts,
            &completions,
            &completion_ids_list,
            conversational,
        )?;
        let g = if training {
            c.num_generations
        } else {
            c.num_generations_eval.unwrap_or(c.num_generations)
        } as i64;
        let nf = rewards_per_func.size()[1];
        let weights = Tensor::from_slice(
            &s.reward_weights
                .iter()
                .map(|&w| w as f32)
                .collect::<Vec<_>>(),
        )
        .f_unsqueeze(0)?;
        let unscorable = rewards_per_func
            .f_isnan()?
            .f_all_dims(Some(&[1][..]), false)?;
        let (advantages, is_std_zero) = match c.multi_objective_aggregation {
            MultiObjectiveAggregation::SumThenNormalize => {
                let rewards = rewards_per_func
                    .f_mul(&weights)?
                    .f_nansum(Some(&[1][..]), false, None::<Kind>)?
                    .f_masked_fill(&unscorable, f64::NAN)?;
                let grouped = rewards.f_view([-1, g])?;
                let mean = grouped
                    .f_nanmean(Some(&[1][..]), false, None::<Kind>)?
                    .f_repeat_interleave_self_int(g, Some(0), None)?;
                let std = match c.scale_rewards {
                    ScaleRewards::Group | ScaleRewards::None => {
                        if g > 1 {
                            nanstd(&grouped, Some(1), false)?.f_repeat_interleave_self_int(
                                g,
                                Some(0),
                                None,
                            )?
                        } else {
                            rewards.f_zeros_like()?
                        }
                    }
                    ScaleRewards::Batch => {
                        if rewards.numel() > 1 {
                            nanstd(&rewards, None, false)?.f_expand_as(&rewards)?
                        } else {
                            rewards.f_zeros_like()?
                        }
                    }
                };
                let mut adv = rewards.f_sub(&mean)?;
                if c.scale_rewards != ScaleRewards::None {
                    adv = adv.f_div(&std.f_add_scalar(1e-4)?)?;
                }
                let zero = std.f_isclose(&std.f_zeros_like()?, 1e-5, 1e-8, false)?;
                (adv, zero)
            }
            MultiObjectiveAggregation::NormalizeThenSum => {
                let grouped = rewards_per_func.f_view([-1, g, nf])?;
                let mean_k = grouped.f_nanmean(Some(&[1][..]), true, None::<Kind>)?;
                let std_k = if g > 1 {
                    nanstd(&grouped, Some(1), true)?
                } else {
                    mean_k.f_zeros_like()?
                };
                let reward_k = grouped
                    .f_sub(&mean_k)?
                    .f_div(&std_k.f_add_scalar(1e-4)?)?
                    .f_view([-1, nf])?;
                let rewards = reward_k
                    .f_mul(&weights)?
                    .f_nansum(Some(&[1][..]), false, None::<Kind>)?
                    .f_masked_fill(&unscorable, f64::NAN)?;
                let std = if rewards.numel() > 1 {
                    nanstd(&rewards, None, false)?.f_expand_as(&rewards)?
                } else {
                    rewards.f_zeros_like()?
                };
                let all: Vec<i64> = vec![0];
                let adv = rewards
                    .f_sub(&rewards.f_nanmean(Some(&all[..]), false, None::<Kind>)?)?
                    .f_div(&std.f_add_scalar(1e-4)?)?;
                let zero = std.f_isclose(&std.f_zeros_like()?, 1e-5, 1e-8, false)?;
                (adv, zero)
            }
        };
        let advantages = advantages.f_nan_to_num(Some(0.0), None, None)?;
        {
            let mut metrics = self.metrics.lock();
            let m = metrics.mode(training);
            for (i, f) in s.reward_funcs.iter().enumerate() {
                let col = rewards_per_func.f_select(1, i as i64)?;
                m.push(
                    &format!("rewards/{}/mean", f.name()),
                    item(&col.f_nanmean(Some(&[0][..]), false, None::<Kind>)?)?,
                );
                m.push(
                    &format!("rewards/{}/std", f.name()),
                    item(&nanstd(&col, None, false)?)?,
                );
            }
            let rewards = rewards_per_func
                .f_mul(&weights)?
                .f_nansum(Some(&[1][..]), false, None::<Kind>)?
                .f_masked_fill(&unscorable, f64::NAN)?;
            m.push(
                "reward",
                item(&rewards.f_nanmean(Some(&[0][..]), false, None::<Kind>)?)?,
            );
            m.push("reward_std", item(&nanstd(&rewards, None, false)?)?);
            m.push(
                "frac_reward_zero_std",
                item(&is_std_zero.f_to_kind(Kind::Float)?.f_mean(Kind::Float)?)?,
            );
        }
        let mut batch = Batch::new();
        batch.insert("prompt_ids", prompt_ids);
        batch.insert("prompt_mask", prompt_mask);
        batch.insert("completion_ids", completion_ids);
        batch.insert("completion_mask", completion_mask);
        batch.insert("advantages", advantages.f_to_device(device)?);
        batch.insert("num_items_in_batch", num_items_in_batch);
        if let Some(o) = old {
            batch.insert("old_per_token_logps", o);
        }
        if let Some(r) = reference {
            batch.insert("ref_per_token_logps", r);
        }
        Ok(batch)
    }

    /// `_prepare_inputs`: in training, the buffered micro-batch of this step (generating,
    /// shuffling and splitting a new generation batch every `steps_per_generation ×
    /// num_iterations` steps); in evaluation, the batch generated and scored.
    fn prepare_inputs(
        &self,
        ctx: &StepContext<'_>,
        model: &dyn TrainableModel,
        inputs: &Batch,
    ) -> Result<Batch> {
        let rows = self.rows_of(inputs)?;
        if !model.is_training() {
            return self.generate_and_score(ctx, model, &rows);
        }
        let c = &self.shared.config;
        let spg = c.steps_per_generation();
        let generate_every = spg * c.num_iterations;
        let step = lock(&self.state).step;
        let needs = step.is_multiple_of(generate_every) || lock(&self.state).buffered.is_none();
        if needs {
            let batch = self.generate_and_score(ctx, model, &rows)?;
            // shuffle_sequence_dict: one permutation of the rows from the global generator.
            let n = batch_tensor(&batch, "prompt_ids")?.size()[0];
            let perm = Tensor::f_randperm(n, (Kind::Int64, Device::Cpu))?;
            let mut chunks: Vec<Batch> = (0..spg).map(|_| Batch::new()).collect();
            let chunk = n / spg as i64;
            for (k, t) in batch.iter() {
                if t.dim() == 0 {
                    for b in &mut chunks {
                        b.insert(k, t.shallow_clone());
                    }
                    continue;
                }
                let shuffled = t.f_index_select(0, &perm.f_to_device(t.device())?)?;
                for (i, b) in chunks.iter_mut().enumerate() {
                    b.insert(k, shuffled.f_narrow(0, i as i64 * chunk, chunk)?);
                }
            }
            lock(&self.state).buffered = Some(chunks);
        }
        let state = lock(&self.state);
        let buffered = state
            .buffered
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument {
                field: "inputs",
                detail: "no generation buffered".into(),
            })?;
        let mut out = Batch::new();
        for (k, t) in buffered[step % spg].iter() {
            out.insert(k, t.shallow_clone());
        }
        Ok(out)
    }

    /// `_compute_loss`.
    fn loss(
        &self,
        ctx: &StepContext<'_>,
        model: &dyn TrainableModel,
        inputs: &Batch,
    ) -> Result<Tensor> {
        let c = &self.shared.config;
        let training = model.is_training();
        let prompt_ids = batch_tensor(inputs, "prompt_ids")?;
        let prompt_mask = batch_tensor(inputs, "prompt_mask")?;
        let completion_ids = batch_tensor(inputs, "completion_ids")?;
        let mask = batch_tensor(inputs, "completion_mask")?;
        let input_ids = Tensor::f_cat(&[prompt_ids, completion_ids], 1)?;
        let attention_mask = Tensor::f_cat(&[prompt_mask, mask], 1)?;
        let logits_to_keep = completion_ids.size()[1];
        let (per_token_logps, entropies) = self.per_token_logps(
            ctx,
            model,
            &input_ids,
            &attention_mask,
            logits_to_keep,
            None,
            true,
        )?;
        let entropies = entropies.ok_or_else(|| Error::InvalidArgument {
            field: "entropy",
            detail: "not computed".into(),
        })?;
        let entropy_mask = if c.top_entropy_quantile < 1.0 {
            Some(high_entropy_mask(
                &entropies,
                mask,
                1.0 - c.top_entropy_quantile,
            )?)
        } else {
            None
        };
        let mut advantages = batch_tensor(inputs, "advantages")?.shallow_clone();
        if advantages.dim() == 1 {
            advantages = advantages.f_unsqueeze(1)?;
        }
        let old = match inputs.get("old_per_token_logps") {
            Some(o) => o.shallow_clone(),
            None => per_token_logps.f_detach()?,
        };
        let off_policy_mask = match c.off_policy_mask_threshold {
            Some(threshold) => {
                let kl =
                    old.f_sub(&per_token_logps.f_detach()?)?
                        .f_nan_to_num(Some(0.0), None, None)?;
                let seq_sum =
                    kl.f_mul(mask)?
                        .f_sum_dim_intlist(Some(&[1][..]), true, None::<Kind>)?;
                let avg = seq_sum.f_div(
                    &mask
                        .f_sum_dim_intlist(Some(&[1][..]), true, None::<Kind>)?
                        .f_clamp_min(1.0)?,
                )?;
                let keep = advantages.f_ge(0.0)?.f_logical_or(&avg.f_le(threshold)?)?;
                Some(keep.f_to_kind(mask.kind())?)
            }
            None => None,
        };
        let log_ratio = per_token_logps.f_sub(&old)?;
        let log_importance_weights = match c.importance_sampling_level {
            ImportanceSamplingLevel::Token => log_ratio.shallow_clone(),
            ImportanceSamplingLevel::Sequence => log_ratio
                .f_mul(mask)?
                .f_sum_dim_intlist(Some(&[-1][..]), false, None::<Kind>)?
                .f_div(
                    &mask
                        .f_sum_dim_intlist(Some(&[-1][..]), false, None::<Kind>)?
                        .f_clamp_min(1.0)?,
                )?
                .f_unsqueeze(-1)?,
        };
        let mut coef_1 = log_importance_weights.f_exp()?;
        let per_token_kl = if c.beta != 0.0 {
            let r = batch_tensor(inputs, "ref_per_token_logps")?;
            let d = r.f_sub(&per_token_logps)?;
            let mut kl = d.f_exp()?.f_sub(&d)?.f_sub_scalar(1)?;
            if c.use_bias_correction_kl {
                kl = kl.f_mul(&coef_1)?;
            }
            Some(kl)
        } else {
            None
        };
        let epsilon_low = c.epsilon;
        let epsilon_high = c.epsilon_high.unwrap_or(c.epsilon);
        let mut per_token_loss = match c.loss_type {
            GrpoLossType::Cispo => coef_1
                .f_clamp_max(epsilon_high)?
                .f_detach()?
                .f_neg()?
                .f_mul(&advantages)?
                .f_mul(&per_token_logps)?,
            GrpoLossType::Sapo => {
                let temperatures = Tensor::f_where_scalar(
                    &advantages.f_gt(0.0)?,
                    c.sapo_temperature_pos,
                    c.sapo_temperature_neg,
                )?;
                let soft = temperatures
                    .f_mul(&coef_1.f_sub_scalar(1)?)?
                    .f_sigmoid()?
                    .f_mul_scalar(4)?
                    .f_div(&temperatures)?;
                soft.f_neg()?.f_mul(&advantages)?
            }
            _ => {
                let coef_2 = coef_1.f_clamp(1.0 - epsilon_low, 1.0 + epsilon_high)?;
                if let Some(delta) = c.delta {
                    coef_1 = coef_1.f_clamp_max(delta)?;
                }
                let l1 = coef_1.f_mul(&advantages)?;
                let l2 = coef_2.f_mul(&advantages)?;
                l1.f_minimum(&l2)?.f_neg()?
            }
        };
        if let Some(keep) = &off_policy_mask {
            per_token_loss = per_token_loss.f_mul(keep)?;
        }
        if let Some(e) = &entropy_mask {
            per_token_loss = per_token_loss.f_mul(e)?;
        }
        if let Some(kl) = &per_token_kl {
            per_token_loss = per_token_loss.f_add(&kl.f_mul_scalar(c.beta)?)?;
        }
        let ga = if training {
            ctx.current_gradient_accumulation_steps.max(1) as f64
        } else {
            1.0
        };
        let masked = per_token_loss.f_mul(mask)?;
        let (mut loss, policy_loss) = match c.loss_type {
            GrpoLossType::Grpo | GrpoLossType::Sapo => {
                let l = masked
                    .f_sum_dim_intlist(Some(&[-1][..]), false, None::<Kind>)?
                    .f_div(
                        &mask
                            .f_sum_dim_intlist(Some(&[-1][..]), false, None::<Kind>)?
                            .f_clamp_min(1.0)?,
                    )?
                    .f_mean(Kind::Float)?;
                (l.f_div_scalar(ga)?, l.f_detach()?)
            }
            GrpoLossType::Bnpo => {
                let l = masked
                    .f_sum(Kind::Float)?
                    .f_div(&mask.f_sum(Kind::Int64)?.f_clamp_min(1.0)?)?;
                (l.f_div_scalar(ga)?, l.f_detach()?)
            }
            GrpoLossType::DrGrpo => {
                let denominator =
                    (per_token_loss.size()[0] * c.max_completion_length as i64) as f64;
                let l = masked.f_sum(Kind::Float)?.f_div_scalar(denominator)?;
                (l.f_div_scalar(ga)?, l.f_detach()?)
            }
            GrpoLossType::Dapo | GrpoLossType::Cispo => {
                let mut normalizer = batch_tensor(inputs, "num_items_in_batch")?
                    .f_clamp_min(1.0)?
                    .f_div_scalar(1.0)?;
                if training {
                    normalizer = normalizer
                        .f_mul_scalar(ctx.current_gradient_accumulation_steps.max(1) as f64)?
                        .f_div_scalar(c.steps_per_generation() as f64)?;
                }
                let l = masked.f_sum(Kind::Float)?.f_div(&normalizer)?;
                let d = l.f_detach()?;
                (l, d)
            }
            GrpoLossType::Luspo => {
                let l = masked
                    .f_sum_dim_intlist(Some(&[-1][..]), false, None::<Kind>)?
                    .f_mean(Kind::Float)?;
                (l.f_div_scalar(ga)?, l.f_detach()?)
            }
        };
        let mut metrics = self.metrics.lock();
        let m = metrics.mode(training);
        if c.entropy_coef != 0.0 {
            let effective = match &entropy_mask {
                Some(e) => mask.f_mul(e)?,
                None => mask.shallow_clone(),
            };
            let entropy_loss = entropies
                .f_mul(&effective)?
                .f_sum(Kind::Float)?
                .f_div(&effective.f_sum(Kind::Int64)?.f_clamp_min(1.0)?)?
                .f_div_scalar(ga)?;
            loss = loss.f_sub(&entropy_loss.f_mul_scalar(c.entropy_coef)?)?;
            m.push("policy_loss", item(&policy_loss)?);
            if training && ctx.accelerator.sync_gradients() {
                m.push("entropy_coef", c.entropy_coef);
            }
        }
        let global_masked_mean = |x: &Tensor| -> Result<f64> {
            let (sum, count) = if x.size()[1] == 1 {
                (x.f_sum(Kind::Float)?, Tensor::from(x.size()[0] as f32))
            } else {
                (
                    x.f_mul(mask)?.f_sum(Kind::Float)?,
                    mask.f_sum(Kind::Int64)?.f_to_kind(Kind::Float)?,
                )
            };
            let totals = Tensor::f_stack(&[sum, count], 0)?;
            item(
                &totals
                    .f_get(0)?
                    .f_div(&totals.f_get(1)?.f_clamp_min(1.0)?)?,
            )
        };
        let masked_seq_mean = |x: &Tensor| -> Result<Tensor> {
            if x.size()[1] == 1 {
                return Ok(x.f_squeeze_dim(1)?);
            }
            Ok(x.f_mul(mask)?
                .f_sum_dim_intlist(Some(&[-1][..]), false, None::<Kind>)?
                .f_div(&mask.f_sum_dim_intlist(Some(&[-1][..]), false, None::<Kind>)?)?)
        };
        if let Some(kl) = &per_token_kl {
            m.push("kl", global_masked_mean(&kl.f_detach()?)?);
        }
        m.push("entropy", global_masked_mean(&entropies.f_detach()?)?);
        match c.loss_type {
            GrpoLossType::Cispo => {
                let clipped = coef_1
                    .f_gt(epsilon_high)?
                    .f_logical_and(&advantages.f_gt(0.0)?)?
                    .f_to_kind(Kind::Float)?;
                m.push("cispo_clip_ratio", global_masked_mean(&clipped)?);
            }
            GrpoLossType::Sapo => {}
            _ => {
                let coef = coef_1.f_detach()?;
                let low = coef
                    .f_lt(1.0 - epsilon_low)?
                    .f_logical_and(&advantages.f_lt(0.0)?)?;
                let high = coef
                    .f_gt(1.0 + epsilon_high)?
                    .f_logical_and(&advantages.f_gt(0.0)?)?;
                let region = low.f_logical_or(&high)?;
                let (low, high, region) = (
                    low.f_to_kind(Kind::Float)?,
                    high.f_to_kind(Kind::Float)?,
                    region.f_to_kind(Kind::Float)?,
                );
                m.push("clip_ratio/low_mean", global_masked_mean(&low)?);
                m.push("clip_ratio/high_mean", global_masked_mean(&high)?);
                m.push("clip_ratio/region_mean", global_masked_mean(&region)?);
                m.push("clip_ratio/low_min", nanmin(&masked_seq_mean(&low)?)?);
                m.push("clip_ratio/high_max", nanmax(&masked_seq_mean(&high)?)?);
            }
        }
        Ok(loss)
    }
}

/// `get_high_entropy_mask`: the tokens whose entropy reaches the `threshold` quantile of
/// the completion tokens' entropies.
fn high_entropy_mask(entropies: &Tensor, mask: &Tensor, threshold: f64) -> Result<Tensor> {
    let bool_mask = mask.f_to_kind(Kind::Bool)?;
    let local = entropies
        .f_detach()?
        .f_masked_select(&bool_mask)?
        .f_to_kind(Kind::Float)?;
    if local.numel() == 0 {
        return Ok(entropies.f_zeros_like()?.f_to_kind(Kind::Bool)?);
    }
    let q = local.f_quantile_scalar(threshold, None::<i64>, false, "linear")?;
    let masked = entropies.f_detach()?.f_mul(&mask.f_to_kind(Kind::Float)?)?;
    Ok(masked.f_ge_tensor(&q)?.f_logical_and(&bool_mask)?)
}

impl TrainerHooks for GrpoHooks {
    fn compute_loss(
        &self,
        ctx: &StepContext<'_>,
        model: &dyn TrainableModel,
        inputs: &Batch,
        _num_items_in_batch: Option<&Tensor>,
    ) -> tchtrain_trainer::Result<(Tensor, ModelOutput)> {
        let loss = self.loss(ctx, model, inputs).map_err(hook_error)?;
        Ok(loss_only(loss))
    }

    /// `loss_is_scaled_for_ga = True`: each loss type scales itself.
    fn loss_is_scaled_for_ga(&self) -> Option<bool> {
        Some(true)
    }

    /// `training_step`: the micro-batch prepared (generating when due), the Trainer's
    /// step, `_step` counted and `step_time` recorded at each optimizer step.
    fn training_step(
        &self,
        ctx: &StepContext<'_>,
        model: &mut dyn TrainableModel,
        inputs: &Batch,
        num_items_in_batch: Option<&Tensor>,
    ) -> tchtrain_trainer::Result<Tensor> {
        let t0 = Instant::now();
        model.train();
        let inputs = self
            .prepare_inputs(ctx, &*model, inputs)
            .map_err(hook_error)?;
        let out = default_training_step(self, ctx, model, &inputs, num_items_in_batch)?;
        let mut state = lock(&self.state);
        state.step += 1;
        state.step_time += t0.elapsed().as_secs_f64();
        if state
            .step
            .is_multiple_of(ctx.current_gradient_accumulation_steps.max(1))
        {
            let t = std::mem::take(&mut state.step_time);
            self.metrics.lock().train.push("step_time", t);
        }
        Ok(out)
    }

    /// `prediction_step`: the batch generated and scored, its loss without gradients.
    fn prediction_step(
        &self,
        ctx: &StepContext<'_>,
        model: &dyn TrainableModel,
        inputs: &Batch,
        _prediction_loss_only: bool,
    ) -> tchtrain_trainer::Result<PredictionStepOutput> {
        let run = || -> Result<Tensor> {
            let inputs = self.prepare_inputs(ctx, model, inputs)?;
            tch::no_grad(|| self.loss(ctx, model, &inputs))
        };
        let loss = run().map_err(hook_error)?;
        Ok(PredictionStepOutput {
            loss: Some(loss.f_mean(loss.kind())?.f_detach()?),
            ..Default::default()
        })
    }

    /// `get_train_dataloader`: generation batches (`per_device_train_batch_size ×
    /// steps_per_generation` rows) in [`RepeatSampler`]'s order.
    fn get_train_dataloader(
        &self,
        trainer: &Trainer,
    ) -> tchtrain_trainer::Result<tchtrain_data::DataLoader> {
        let c = &self.shared.config;
        let dataset =
            trainer
                .train_dataset()
                .cloned()
                .ok_or(tchtrain_trainer::Error::MissingDataset {
                    what: "training".into(),
                    dataset: "train",
                    fix: "pass one with GRPOTrainerBuilder::train_dataset",
                })?;
        let spg = c.steps_per_generation();
        let sampler = RepeatSampler::new(
            c.num_generations,
            c.generation_batch_size.unwrap_or(0) / c.num_generations,
            c.num_iterations * spg,
            c.shuffle_dataset,
            c.base.seed,
        );
        trainer.get_dataloader(
            dataset,
            Arc::new(sampler),
            c.base.per_device_train_batch_size * spg,
        )
    }

    /// `get_eval_dataloader`: each prompt `num_generations_eval` times, in a seeded random
    /// order.
    fn get_eval_dataloader(
        &self,
        trainer: &Trainer,
        eval_dataset: Option<Arc<dyn Dataset>>,
    ) -> tchtrain_trainer::Result<tchtrain_data::DataLoader> {
        let c = &self.shared.config;
        let dataset = eval_dataset
            .or_else(|| trainer.eval_dataset().cloned())
            .ok_or(tchtrain_trainer::Error::MissingDataset {
                what: "evaluation".into(),
                dataset: "eval",
                fix: "pass one with GRPOTrainerBuilder::eval_dataset",
            })?;
        let sampler = RepeatSampler::new(
            c.num_generations_eval.unwrap_or(c.num_generations),
            1,
            1,
            true,
            c.base.seed,
        );
        trainer.get_dataloader(
            dataset,
            Arc::new(sampler),
            c.base.per_device_eval_batch_size,
        )
    }

    /// TRL's `log`: the metrics averaged over their non-NaN values (`None` when none).
    fn log(
        &self,
        trainer: &mut Trainer,
        logs: Vec<(String, f64)>,
        start_time: Option<Instant>,
    ) -> tchtrain_trainer::Result<()> {
        self.metrics.log_skipping_nan(trainer, logs, start_time)
    }
}

trl_trainer!(
    /// TRL's `GRPOTrainer`: a [`Trainer`] (reached through `Deref`) that generates, scores
    /// and trains on completions as TRL does.
    GRPOTrainer
);

/// The arguments of `GRPOTrainer(model, reward_funcs, args, train_dataset, eval_dataset,
/// processing_class, peft_config, ...)`.
pub struct GRPOTrainerBuilder {
    model: ModelArg,
    model_init_kwargs: LoadOptions,
    reward_funcs: Vec<RewardFunc>,
    config: GRPOConfig,
    tokenizer: PreTrainedTokenizerFast,
    inputs: TrainerInputs,
}

impl GRPOTrainer {
    /// `GRPOTrainer(model, reward_funcs, args=config, processing_class=tokenizer)` with a
    /// loaded causal LM (a reference for `beta != 0` without an adapter is then refused:
    /// TRL loads it again from the path, see
    /// [`builder_from_pretrained`](Self::builder_from_pretrained)).
    pub fn builder(
        model: Box<dyn PreTrainedModel>,
        reward_funcs: Vec<RewardFunc>,
        config: GRPOConfig,
        tokenizer: PreTrainedTokenizerFast,
    ) -> GRPOTrainerBuilder {
        Self::with_model(ModelArg::Model(model), reward_funcs, config, tokenizer)
    }

    /// `GRPOTrainer(model="path", ...)`: the policy (and the reference, when `beta != 0`
    /// without an adapter) loaded from the checkpoint at build, after the seed.
    pub fn builder_from_pretrained(
        path: impl Into<PathBuf>,
        reward_funcs: Vec<RewardFunc>,
        config: GRPOConfig,
        tokenizer: PreTrainedTokenizerFast,
    ) -> GRPOTrainerBuilder {
        Self::with_model(ModelArg::Path(path.into()), reward_funcs, config, tokenizer)
    }

    fn with_model(
        model: ModelArg,
        reward_funcs: Vec<RewardFunc>,
        config: GRPOConfig,
        tokenizer: PreTrainedTokenizerFast,
    ) -> GRPOTrainerBuilder {
        GRPOTrainerBuilder {
            model,
            model_init_kwargs: LoadOptions::default(),
            reward_funcs,
            config,
            tokenizer,
            inputs: TrainerInputs::default(),
        }
    }
}

fn load_causal_lm(
    path: &std::path::Path,
    options: &LoadOptions,
) -> Result<Box<dyn PreTrainedModel>> {
    Ok(from_pretrained_dir(path, AutoTask::CausalLm, Device::Cpu, options)?.model)
}

fn table_rows(table: &Table, dataset: &str) -> Result<Vec<Map<String, Value>>> {
    let rows = (0..table.len())
        .map(|i| row(table, i, dataset))
        .collect::<Result<Vec<_>>>()?;
    for (i, r) in rows.iter().enumerate() {
        if r.contains_key("image") || r.contains_key("images") {
            return Err(Error::Dataset {
                dataset: dataset.into(),
                row: i,
                detail: "vision inputs (an `image` / `images` column) are not supported here: a vision-language model is not implemented".into(),
            });
        }
        match r.get("prompt") {
            Some(Value::String(_)) | Some(Value::Array(_)) => {}
            _ => {
                return Err(Error::Dataset {
                    dataset: dataset.into(),
                    row: i,
                    detail: "GRPO reads a `prompt` column: text, or a list of messages".into(),
                });
            }
        }
    }
    Ok(rows)
}

impl GRPOTrainerBuilder {
    /// `model_init_kwargs` (and `quantization_config`): how a model given by path is loaded.
    pub fn model_init_kwargs(mut self, options: LoadOptions) -> Self {
        self.model_init_kwargs = options;
        self
    }

    trainer_input_methods!();

    /// `GRPOTrainer.__init__`.
    pub fn build(self) -> Result<GRPOTrainer> {
        let Self {
            model,
            model_init_kwargs,
            reward_funcs,
            mut config,
            tokenizer,
            mut inputs,
        } = self;
        config.post_init()?;
        let refuse = |field: &'static str, detail: &str| Error::InvalidArgument {
            field,
            detail: detail.into(),
        };
        if config.base.world_size() > 1 {
            return Err(refuse(
                "world_size",
                "GRPO in a data-parallel run (rewards gathered across processes) is not implemented here; train on one process",
            ));
        }
        if config.sync_ref_model {
            return Err(refuse(
                "sync_ref_model",
                "TR-DPO's reference sync under GRPO is not implemented here; leave it False",
            ));
        }
        if let Some(w) = &config.reward_weights
            && w.len() != reward_funcs.len()
        {
            return Err(Error::InvalidArgument {
                field: "reward_weights",
                detail: format!(
                    "Number of reward weights ({}) must match number of reward functions ({}) (TRL's message)",
                    w.len(),
                    reward_funcs.len()
                ),
            });
        }
        let train = inputs.take_train()?;
        let train_rows = Arc::new(table_rows(&train, "train")?);
        let eval_rows = match &inputs.eval_dataset {
            Some(t) => Some(Arc::new(table_rows(t, "eval")?)),
            None => None,
        };
        tch::manual_seed(config.base.seed as i64);
        let (mut model, path) = match model {
            ModelArg::Path(p) => (load_causal_lm(&p, &model_init_kwargs)?, Some(p)),
            ModelArg::Model(m) => (m, None),
        };
        if model.output_head().is_none() {
            return Err(Error::InvalidArgument {
                field: "model",
                detail: format!(
                    "{} has no fused LM head here (TRL scores completions through it): GRPO takes the decoder families' causal LMs (Llama, Qwen, Mistral, Gemma, ...)",
                    model.model_name()
                ),
            });
        }
        if model.has_adapter() && config.beta != 0.0 {
            return Err(refuse(
                "model",
                "the model already holds an adapter, which TRL copies into a frozen 'ref' adapter: not implemented here; give the base model with peft_config, or beta=0.0",
            ));
        }
        let model_config = model.config().to_json_value()?;
        if let Some(coef) = config.router_aux_loss_coef
            && coef != 0.0
        {
            return Err(Error::InvalidArgument {
                field: "router_aux_loss_coef",
                detail: format!(
                    "`router_aux_loss_coef` is set to {coef}: the load-balancing loss of a mixture-of-experts model is not implemented here (TRL: only for a model that returns its router logits)"
                ),
            });
        }
        let tokens = TrainerTokens::resolve(&tokenizer, None, None)?;
        if model.set_pad_token_id(Some(tokens.pad_token_id)).is_err() {
            log::debug!("the model keeps its config's pad_token_id");
        }
        // Every EOS id the model's generation config declares ends a completion, the
        // tokenizer's first.
        let model_generation = match model.generation_config() {
            Some(v) => GenerationConfig::from_json(v)?,
            None => GenerationConfig::from_model_config(&model_config)?,
        };
        let mut eos_token_ids = model_generation.eos_token_id.clone().unwrap_or_default();
        let tokenizer_eos = tokens
            .eos_token
            .as_deref()
            .and_then(|t| tokenizer.tokenizer().token_to_id(t))
            .map(i64::from);
        if let Some(e) = tokenizer_eos
            && !eos_token_ids.contains(&e)
        {
            eos_token_ids.insert(0, e);
        }
        let bos = tokenizer
            .special_tokens_map()
            .into_iter()
            .find(|(k, _)| k == "bos_token")
            .and_then(|(_, t)| tokenizer.tokenizer().token_to_id(&t))
            .map(i64::from);
        let mut generation_config = model_generation;
        generation_config.pad_token_id = Some(tokens.pad_token_id);
        let mut training = GenerationConfig {
            max_new_tokens: Some(config.max_completion_length as i64),
            do_sample: Some(true),
            pad_token_id: Some(tokens.pad_token_id),
            bos_token_id: bos,
            eos_token_id: Some(eos_token_ids.clone()),
            temperature: Some(config.temperature),
            top_p: Some(config.top_p),
            top_k: Some(config.top_k),
            min_p: config.min_p,
            repetition_penalty: Some(config.repetition_penalty),
            ..GenerationConfig::default()
        };
        if let Some(kw) = &config.generation_kwargs {
            let extra = GenerationConfig::from_json(&Value::Object(kw.clone()))?;
            training.update(&extra);
        }
        if bos.is_none() {
            generation_config.bos_token_id = None;
        }
        generation_config.update(&training);
        generation_config.validate()?;
        let max_position_embeddings = model_config
            .get("max_position_embeddings")
            .and_then(Value::as_i64);
        let peft = inputs.peft_config.is_some();
        let reference = if config.beta == 0.0 || peft {
            None
        } else {
            match &path {
                Some(p) => Some(load_causal_lm(p, &model_init_kwargs)?),
                None => {
                    return Err(refuse(
                        "model",
                        "with beta != 0, TRL loads the reference again from the model's path: build with GRPOTrainer::builder_from_pretrained, or set beta=0.0",
                    ));
                }
            }
        };
        let policy = wrap_with_adapter(
            model,
            inputs.peft_config.take(),
            config.base.gradient_checkpointing,
            "GRPOTrainer",
            true,
        )?;
        let reference = match reference {
            Some(r) => {
                let mut r: Box<dyn TrainableModel> = r;
                r.set_training(false);
                for (_, v) in r.var_store().variables() {
                    let _ = v.set_requires_grad(false);
                }
                Reference::Model(Mutex::new(r))
            }
            None if config.beta != 0.0 => Reference::DisabledAdapter,
            None => Reference::None,
        };
        let reward_weights = config
            .reward_weights
            .clone()
            .unwrap_or_else(|| vec![1.0; reward_funcs.len()]);
        let mut tables = vec![train_rows.clone()];
        if let Some(e) = &eval_rows {
            tables.push(e.clone());
        }
        let shared = Arc::new(Shared {
            config: config.clone(),
            tokenizer: tokenizer.clone(),
            pad_token_id: tokens.pad_token_id,
            eos_token_ids,
            generation_config,
            max_position_embeddings,
            reward_funcs,
            reward_weights,
            reference,
            tables,
        });
        let mut builder = Trainer::builder(policy, config.base.clone())
            .processing_class(tokenizer)
            .data_collator(PromptIndexCollator)
            .hooks(GrpoHooks {
                shared: shared.clone(),
                metrics: SharedMetrics::default(),
                state: Mutex::new(State::default()),
            })
            .train_dataset(PromptRows {
                table_id: 0,
                rows: train_rows,
            });
        if let Some(rows) = eval_rows {
            builder = builder.eval_dataset(PromptRows { table_id: 1, rows });
        }
        let builder = inputs.configure(builder);
        let trainer = builder.build()?;
        let device = trainer.device();
        if let Reference::Model(m) = &shared.reference {
            lock(m).var_store_mut().set_device(device);
        }
        for f in &shared.reward_funcs {
            if let RewardFunc::Model { model, .. } = f {
                lock(model).var_store_mut().set_device(device);
            }
        }
        // `set_seed(args.seed, device_specific=True)` at the end of `__init__`.
        tch::manual_seed(config.base.seed as i64);
        Ok(GRPOTrainer { trainer })
    }
}

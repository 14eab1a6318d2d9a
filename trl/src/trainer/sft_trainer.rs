//! `trl/trainer/sft_trainer.py`: `SFTTrainer` over the Trainer, and TRL's
//! `DataCollatorForLanguageModeling`.
//!
//! The datasets are tables (`tchtrain_datasets::Table`: JSON lines, Parquet, CSV) in TRL's
//! formats — language modeling (`text`, or `messages` rendered by the tokenizer's chat
//! template, with `tools` and `chat_template_kwargs` when the row has them) and
//! prompt-completion (`prompt` / `completion`, as text or as messages) — prepared as
//! `_prepare_dataset` prepares them: EOS appended to text rows, tokenized, `labels` built
//! from the completion mask (`completion_only_loss`), truncated to `max_length`
//! (`keep_start` / `keep_end`, fully masked rows dropped) or packed (BFD, with the rows'
//! `seq_lengths`). Every batch is scored through the fused LM head
//! ([`fused_lm_head_forward`]): the loss (`nll` or `dft`) and TRL's logged `entropy`,
//! `mean_token_accuracy` and `num_tokens`.
//!
//! `assistant_only_loss` keeps the tokens of the chat template's `{% generation %}` blocks
//! (transformers' `return_assistant_tokens_mask`); a template without the markers is refused
//! with the fix (TRL patches the templates it knows, `get_training_chat_template`, which is
//! not reproduced here: pass TRL's `*_training.jinja` as `chat_template_path`).
//!
//! Vision datasets (`images` / `image` beside `messages` or text) go through the model's
//! processor ([`SFTTrainer::builder_with_processor`], see [`crate::trainer::vision_language`]).
//!
//! Refused, naming the field: ShareGPT `conversations`, a quantized model with `peft_config`,
//! `shuffle_dataset`. The logits `compute_metrics` needs come from an extra forward without
//! the fused head, as TRL recomputes them.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Map, Value};
use tch::{Kind, Tensor};
use tchtrain_collators::{Batch, DataCollator, Feature, Label};
use tchtrain_data::InMemoryDataset;
use tchtrain_datasets::{Table, pack_dataset};
use tchtrain_models::{
    Gemma3Processor, ModelOutput, PreTrainedModel, PreTrainedTokenizerFast, TrainableModel,
};
use tchtrain_trainer::{PredictionStepOutput, StepContext, Trainer, TrainerHooks, model_inputs};

use crate::data_utils::{
    common_prefix_length, is_conversational, is_conversational_from_value, tokenize_messages,
};
use crate::error::{Error, Result};
use crate::kernels::LogProbOutputs;
use crate::trainer::base_trainer::{
    SharedMetrics, TrainerInputs, TrainerTokens, fused_prediction_step, hook_error, ids_of,
    pad_batch, row, set_chat_template_path, trainer_input_methods, trl_trainer, wrap_with_adapter,
};
use crate::trainer::sft_config::{SFTConfig, SftLossType, TruncationMode};
use crate::trainer::utils::{FusedCausalLMOutput, count, fused_lm_head_forward};
use crate::trainer::vision_language::{DataCollatorForVisionLanguageModeling, VisionRows};

/// TRL's `DataCollatorForLanguageModeling`: rows padded on the right to the batch's longest
/// (`pad_token_id`; labels with -100; `attention_mask`), or with `padding_free` flattened
/// into one row with `position_ids` restarting at each row (or each packed document, from
/// `seq_lengths`) and the first label of each sequence -100.
#[derive(Debug, Clone)]
pub struct DataCollatorForLanguageModeling {
    /// `pad_token_id`.
    pub pad_token_id: i64,
    /// `padding_free`.
    pub padding_free: bool,
    /// `pad_to_multiple_of`.
    pub pad_to_multiple_of: Option<usize>,
}

impl DataCollator<Feature> for DataCollatorForLanguageModeling {
    fn collate(&mut self, features: &[Feature]) -> tchtrain_collators::Result<Batch> {
        if features.is_empty() {
            return Err(tchtrain_collators::Error::EmptyBatch);
        }
        let ids: Vec<Vec<i64>> = features.iter().map(|f| f.input_ids.clone()).collect();
        let mut labels = Vec::with_capacity(features.len());
        for (index, f) in features.iter().enumerate() {
            labels.push(match &f.labels {
                None => f.input_ids.clone(),
                Some(Label::Ids(l)) if l.len() == f.input_ids.len() => l.clone(),
                Some(_) => {
                    return Err(tchtrain_collators::Error::LabelKind {
                        index,
                        expected: "token ids as long as input_ids",
                    });
                }
            });
        }
        let pad = |rows: &[Vec<i64>], v: i64| pad_batch(rows, v, self.pad_to_multiple_of);
        let mut batch = Batch::new();
        if self.padding_free {
            // `get_position_ids_from_packed_seq_lengths`, or each row from 0.
            let mut positions = Vec::new();
            for f in features {
                match &f.seq_lengths {
                    Some(lengths) => {
                        for &l in lengths {
                            positions.extend(0..l.max(0));
                        }
                    }
                    None => positions.extend(0..f.input_ids.len() as i64),
                }
            }
            let flat_ids: Vec<i64> = ids.concat();
            let mut flat_labels: Vec<i64> = labels.concat();
            if positions.len() != flat_ids.len() {
                return Err(tchtrain_collators::Error::FieldLengthMismatch {
                    index: 0,
                    key: "seq_lengths",
                    len: positions.len(),
                    input_len: flat_ids.len(),
                });
            }
            for (l, &p) in flat_labels.iter_mut().zip(&positions) {
                if p == 0 {
                    *l = -100;
                }
            }
            batch.insert("input_ids", pad(&[flat_ids], self.pad_token_id)?);
            batch.insert("labels", pad(&[flat_labels], -100)?);
            batch.insert("position_ids", pad(&[positions], 0)?);
        } else {
            let masks: Vec<Vec<i64>> = ids.iter().map(|r| vec![1; r.len()]).collect();
            batch.insert("input_ids", pad(&ids, self.pad_token_id)?);
            batch.insert("labels", pad(&labels, -100)?);
            batch.insert("attention_mask", pad(&masks, 0)?);
        }
        Ok(batch)
    }
}

/// The SFT trainer's overrides of the Trainer (`compute_loss`, `prediction_step`, `log`).
struct SftHooks {
    metrics: SharedMetrics,
    loss_type: SftLossType,
}

impl SftHooks {
    /// `SFTTrainer.compute_loss`: the fused forward, the per-token loss summed over
    /// `num_items_in_batch` (or the batch's label count), and the metrics recorded.
    fn loss(
        &self,
        ctx: &StepContext<'_>,
        model: &dyn TrainableModel,
        inputs: &Batch,
        num_items_in_batch: Option<&Tensor>,
    ) -> Result<Tensor> {
        let training = model.is_training();
        let labels = inputs.get("labels").ok_or_else(|| Error::InvalidArgument {
            field: "labels",
            detail: "the batch has no labels (the SFT collator always builds them)".into(),
        })?;
        let mi = model_inputs(inputs);
        let out: FusedCausalLMOutput = {
            let _autocast = ctx.accelerator.autocast()?;
            let outputs = LogProbOutputs {
                entropy: true,
                is_top1: true,
                ..LogProbOutputs::default()
            };
            fused_lm_head_forward(model, &mi, labels, outputs)?
        };
        let mut per_token_loss = out.log_probs.f_neg()?;
        if self.loss_type == SftLossType::Dft {
            per_token_loss = per_token_loss.f_mul(&out.log_probs.f_exp()?.f_detach()?)?;
        }
        let num_valid = count(&out.label_mask)?;
        let num_tokens = match num_items_in_batch {
            Some(n) => n.shallow_clone(),
            None => num_valid.shallow_clone(),
        };
        let mut loss = per_token_loss
            .f_sum(Kind::Float)?
            .f_div(&num_tokens.f_clamp_min(1)?)?;
        let world = ctx.accelerator.num_processes();
        if ctx.args.average_tokens_across_devices && num_items_in_batch.is_some() && world > 1 {
            loss = loss.f_mul_scalar(world as f64)?;
        }
        // Entropy and token accuracy (zero on the ignored positions).
        let valid = num_valid.int64_value(&[]);
        let entropy_sum = FusedCausalLMOutput::required(&out.entropy, "entropy")?
            .f_detach()?
            .f_sum(Kind::Float)?;
        let num_correct =
            FusedCausalLMOutput::required(&out.is_top1, "is_top1")?.f_sum(Kind::Int64)?;
        let (entropy, accuracy) = if valid > 0 {
            (
                entropy_sum.f_div(&num_valid)?.double_value(&[]),
                num_correct.f_div(&num_valid)?.double_value(&[]),
            )
        } else {
            (0.0, 0.0)
        };
        let mut state = self.metrics.lock();
        let tokens_in_batch = if training {
            match (inputs.get("attention_mask"), inputs.get("position_ids")) {
                (Some(mask), _) => Some(mask.f_sum(Kind::Int64)?.int64_value(&[])),
                (None, Some(p)) => Some(p.size()[1]),
                (None, None) => {
                    return Err(Error::InvalidArgument {
                        field: "inputs",
                        detail:
                            "Expected 'attention_mask' or 'position_ids' in inputs. (TRL's message)"
                                .into(),
                    });
                }
            }
        } else {
            None
        };
        if let Some(n) = tokens_in_batch {
            state.total_train_tokens += n;
        }
        let total = state.total_train_tokens as f64;
        let metrics = state.mode(training);
        metrics.push("entropy", entropy);
        metrics.push("mean_token_accuracy", accuracy);
        metrics.set("num_tokens", total);
        Ok(loss)
    }
}

impl TrainerHooks for SftHooks {
    fn compute_loss(
        &self,
        ctx: &StepContext<'_>,
        model: &dyn TrainableModel,
        inputs: &Batch,
        num_items_in_batch: Option<&Tensor>,
    ) -> tchtrain_trainer::Result<(Tensor, ModelOutput)> {
        let loss = self
            .loss(ctx, model, inputs, num_items_in_batch)
            .map_err(hook_error)?;
        Ok((
            loss.shallow_clone(),
            ModelOutput {
                loss: Some(loss),
                logits: None,
                last_hidden_state: None,
                pooler_output: None,
                aux_loss: None,
            },
        ))
    }

    /// TRL's `prediction_step`: the loss without `num_items_in_batch`; the logits, when
    /// asked for, from an extra forward without the fused head (as TRL recomputes them).
    fn prediction_step(
        &self,
        ctx: &StepContext<'_>,
        model: &dyn TrainableModel,
        inputs: &Batch,
        prediction_loss_only: bool,
    ) -> tchtrain_trainer::Result<PredictionStepOutput> {
        fused_prediction_step(ctx, model, inputs, prediction_loss_only, "labels", || {
            Ok(self.compute_loss(ctx, model, inputs, None)?.0)
        })
    }

    /// TRL's `log`: the mode's metrics averaged since the last log (`eval_`-prefixed in
    /// evaluation) added to `logs`, then the Trainer's `log`.
    fn log(
        &self,
        trainer: &mut Trainer,
        logs: Vec<(String, f64)>,
        start_time: Option<Instant>,
    ) -> tchtrain_trainer::Result<()> {
        self.metrics.log(trainer, logs, start_time)
    }
}

/// A formatting function (`formatting_func`): a row to the text it trains on.
pub type FormattingFunc = Box<dyn Fn(&Map<String, Value>) -> String + Send + Sync>;

trl_trainer!(
    /// TRL's `SFTTrainer`: a [`Trainer`] (reached through `Deref`) whose datasets, collator,
    /// loss and logs are TRL's.
    SFTTrainer
);

/// The arguments of `SFTTrainer(model, args, train_dataset, eval_dataset, processing_class,
/// peft_config, formatting_func, ...)`.
pub struct SFTTrainerBuilder {
    model: Box<dyn PreTrainedModel>,
    config: SFTConfig,
    tokenizer: PreTrainedTokenizerFast,
    /// `processing_class` as a processor (a vision-language model's).
    processor: Option<Arc<Gemma3Processor>>,
    inputs: TrainerInputs,
    formatting_func: Option<FormattingFunc>,
}

impl SFTTrainer {
    /// `SFTTrainer(model, args, processing_class=tokenizer)`; the datasets and the rest are
    /// set on the builder.
    pub fn builder(
        model: Box<dyn PreTrainedModel>,
        config: SFTConfig,
        tokenizer: PreTrainedTokenizerFast,
    ) -> SFTTrainerBuilder {
        SFTTrainerBuilder {
            model,
            config,
            tokenizer,
            processor: None,
            inputs: TrainerInputs::default(),
            formatting_func: None,
        }
    }

    /// `SFTTrainer(model, args, processing_class=processor)` for a vision-language model: the
    /// processor's tokenizer is the tokenizer, and vision datasets are processed by it.
    pub fn builder_with_processor(
        model: Box<dyn PreTrainedModel>,
        config: SFTConfig,
        processor: Gemma3Processor,
    ) -> SFTTrainerBuilder {
        let mut builder = Self::builder(model, config, processor.tokenizer.clone());
        builder.processor = Some(Arc::new(processor));
        builder
    }
}

impl SFTTrainerBuilder {
    trainer_input_methods!();

    /// `formatting_func`: each row's training text (language modeling).
    pub fn formatting_func(mut self, f: FormattingFunc) -> Self {
        self.formatting_func = Some(f);
        self
    }

    /// `SFTTrainer.__init__`: the config resolved, the model wrapped in its adapter, the
    /// datasets prepared, the collator and hooks set, the Trainer built.
    pub fn build(self) -> Result<SFTTrainer> {
        let Self {
            model,
            mut config,
            tokenizer,
            processor,
            mut inputs,
            formatting_func,
        } = self;
        config.post_init()?;
        // TRL's `set_seed(args.seed)`, before the adapter is drawn.
        tch::manual_seed(config.base.seed as i64);
        let train = inputs.take_train()?;
        if model.output_head().is_none() {
            return Err(Error::InvalidArgument {
                field: "model",
                detail: format!(
                    "{} has no fused LM head here (TRL scores every batch through it): SFT takes the decoder families' causal LMs (Llama, Qwen, Mistral, Gemma, ...)",
                    model.model_name()
                ),
            });
        }
        let first = row(&train, 0, "train")?;
        let mut tokenizer = tokenizer;
        set_chat_template_path(&mut tokenizer, config.chat_template_path.as_deref())?;
        if first.contains_key("image") || first.contains_key("images") {
            let Some(processor) = processor else {
                return Err(Error::InvalidArgument {
                    field: "train_dataset",
                    detail: "The dataset appears to be vision-related (contains 'image' or 'images' keys), but the provided model does not seem to be a vision-language model. Please check your model and dataset. (TRL's message) Pass the model's processor (SFTTrainer::builder_with_processor)".into(),
                });
            };
            // The chat template TRL renders with is the processor's (`chat_template_path`
            // replaces it).
            let mut processor = Arc::unwrap_or_clone(processor);
            processor.tokenizer = tokenizer;
            return build_vision(model, config, Arc::new(processor), inputs, train, &first);
        }
        if config.assistant_only_loss {
            if !is_conversational(&first) {
                return Err(Error::InvalidArgument {
                    field: "assistant_only_loss",
                    detail: "You set `assistant_only_loss=True`, but the dataset is not conversational. This option is only supported for conversational datasets. (TRL's message)".into(),
                });
            }
            let template = tokenizer
                .chat_template()
                .and_then(|t| t.select(None, false).ok().map(str::to_string))
                .unwrap_or_default();
            if !tchtrain_models::has_generation_markers(&template) {
                return Err(Error::InvalidArgument {
                    field: "assistant_only_loss",
                    detail: "the chat template has no `{% generation %}` markers, and TRL's patching of the templates it knows (get_training_chat_template) is not implemented here; pass a template with the markers as chat_template_path (TRL ships them as trl/chat_templates/*_training.jinja)".into(),
                });
            }
        }
        let completion_only_loss = config
            .completion_only_loss
            .unwrap_or(first.contains_key("prompt") && first.contains_key("completion"));
        if completion_only_loss && formatting_func.is_some() && !config.skip_prepare_dataset {
            return Err(Error::InvalidArgument {
                field: "completion_only_loss",
                detail: "A formatting function was provided while `completion_only_loss=True`, which is incompatible. (TRL's message) Apply the formatting function before passing the dataset, or set completion_only_loss=False".into(),
            });
        }
        let padding_free = config.padding_free
            || (config.packing
                && matches!(
                    config.packing_strategy,
                    tchtrain_datasets::PackingStrategy::Bfd
                        | tchtrain_datasets::PackingStrategy::BfdSplit
                ));
        if config.padding_free && !config.packing && config.max_length.is_some() {
            return Err(Error::InvalidArgument {
                field: "padding_free",
                detail: "When `padding_free=True` without packing, `max_length` is not enforced. Either enable packing (e.g., `packing=True, packing_strategy='bfd'`), provide already truncated inputs, or set `max_length=None`. (TRL's message)".into(),
            });
        }
        let tokens = TrainerTokens::resolve(
            &tokenizer,
            config.eos_token.as_deref(),
            config.pad_token.as_deref(),
        )?;
        let pad_token_id = tokens.pad_token_id;
        let prep = Preparer {
            tokenizer: &tokenizer,
            config: &config,
            eos_token: tokens.eos_token.as_deref(),
            completion_only_loss,
            formatting_func: formatting_func.as_ref(),
        };
        let train_rows = prep.prepare(&train, config.packing, "train")?;
        let eval_rows = match &inputs.eval_dataset {
            Some(t) => {
                Some(prep.prepare(t, config.eval_packing.unwrap_or(config.packing), "eval")?)
            }
            None => None,
        };
        let trainer = Trainer::builder(
            wrap_model(model, &mut inputs, &config)?,
            config.base.clone(),
        )
        .processing_class(tokenizer.clone())
        .data_collator(DataCollatorForLanguageModeling {
            pad_token_id,
            padding_free,
            pad_to_multiple_of: config.pad_to_multiple_of,
        });
        finish(
            trainer,
            &config,
            inputs,
            InMemoryDataset::new(train_rows),
            eval_rows.map(InMemoryDataset::new),
        )
    }
}

/// The model in its adapter (`peft_config`), checkpointed as the config asks.
fn wrap_model(
    model: Box<dyn PreTrainedModel>,
    inputs: &mut TrainerInputs,
    config: &SFTConfig,
) -> Result<Box<dyn TrainableModel>> {
    wrap_with_adapter(
        model,
        inputs.peft_config.take(),
        config.base.gradient_checkpointing,
        "SFTTrainer",
        false,
    )
}

/// The Trainer with SFT's hooks, the datasets and the caller's other arguments.
fn finish(
    builder: tchtrain_trainer::TrainerBuilder,
    config: &SFTConfig,
    mut inputs: TrainerInputs,
    train: impl tchtrain_data::Dataset + 'static,
    eval: Option<impl tchtrain_data::Dataset + 'static>,
) -> Result<SFTTrainer> {
    let mut builder = builder
        .hooks(SftHooks {
            metrics: SharedMetrics::default(),
            loss_type: config.loss_type,
        })
        .train_dataset(train);
    if let Some(rows) = eval {
        builder = builder.eval_dataset(rows);
    }
    let builder = inputs.configure(builder);
    Ok(SFTTrainer {
        trainer: builder.build()?,
    })
}

/// `SFTTrainer.__init__` on a vision dataset: TRL's checks, the rows processed when
/// fetched, `DataCollatorForVisionLanguageModeling`.
fn build_vision(
    model: Box<dyn PreTrainedModel>,
    mut config: SFTConfig,
    processor: Arc<Gemma3Processor>,
    mut inputs: TrainerInputs,
    train: Table,
    first: &Map<String, Value>,
) -> Result<SFTTrainer> {
    let refuse = |field: &'static str, detail: &str| {
        Err(Error::InvalidArgument {
            field,
            detail: detail.into(),
        })
    };
    if config.packing {
        return refuse(
            "packing",
            "Packing is not supported for vision datasets. Please set `packing=False` in the SFTConfig. (TRL's message)",
        );
    }
    if config.padding_free {
        return refuse(
            "padding_free",
            "Padding-free training is yet not supported for vision datasets. Please set `padding_free=False` in the `SFTConfig`. (TRL's message)",
        );
    }
    if config.max_length.is_some() && config.truncation_mode == TruncationMode::KeepEnd {
        return refuse(
            "truncation_mode",
            "truncation_mode='keep_end' is not supported for vision datasets. Image tokens reside inside the prompt portion of the sequence; depending on the example, keep_end may silently drop them. Use truncation_mode='keep_start' (the default) or set max_length=None. (TRL's message)",
        );
    }
    if config.assistant_only_loss {
        return refuse(
            "assistant_only_loss",
            "the assistant-only loss on vision datasets (the processor's assistant masks) is not implemented here; set assistant_only_loss=False",
        );
    }
    if first.contains_key("prompt")
        && first.contains_key("completion")
        && !first.contains_key("messages")
    {
        return refuse(
            "train_dataset",
            "prompt-completion vision datasets (TRL's `_collate_prompt_completion`: prompts padded on the left, flushed) are not implemented here; give `messages` (or text) with the images",
        );
    }
    if config.completion_only_loss == Some(true) {
        return refuse(
            "completion_only_loss",
            "The `completion_only_loss` argument is not supported for language modeling datasets. (TRL's message)",
        );
    }
    // A text-only batch leaves the vision tower without gradients: TRL has DDP look for
    // unused parameters unless reentrant checkpointing is asked.
    let reentrant = config
        .base
        .gradient_checkpointing_kwargs
        .as_ref()
        .and_then(|k| k.get("use_reentrant"))
        .is_some_and(|v| v == &Value::Bool(true));
    if config.base.ddp_find_unused_parameters.is_none() && !reentrant {
        config.base.ddp_find_unused_parameters = Some(true);
    }
    let tokens = TrainerTokens::resolve(
        &processor.tokenizer,
        config.eos_token.as_deref(),
        config.pad_token.as_deref(),
    )?;
    let rows = |table: Table, dataset: &'static str| VisionRows {
        table,
        processor: processor.clone(),
        max_length: config.max_length,
        dataset_text_field: config.dataset_text_field.clone(),
        dataset,
    };
    let train_rows = rows(train, "train");
    let eval_rows = inputs.eval_dataset.take().map(|t| rows(t, "eval"));
    let trainer = Trainer::builder(
        wrap_model(model, &mut inputs, &config)?,
        config.base.clone(),
    )
    .processor((*processor).clone())
    .data_collator(DataCollatorForVisionLanguageModeling {
        pad_token_id: tokens.pad_token_id,
        pad_to_multiple_of: config.pad_to_multiple_of,
    });
    finish(trainer, &config, inputs, train_rows, eval_rows)
}

/// One tokenized row before its labels: `input_ids`, and the completion mask of a
/// prompt-completion row.
struct Tokenized {
    input_ids: Vec<i64>,
    completion_mask: Option<Vec<i64>>,
    assistant_masks: Option<Vec<i64>>,
}

/// `_prepare_dataset`'s state.
struct Preparer<'a> {
    tokenizer: &'a PreTrainedTokenizerFast,
    config: &'a SFTConfig,
    eos_token: Option<&'a str>,
    completion_only_loss: bool,
    formatting_func: Option<&'a FormattingFunc>,
}

impl Preparer<'_> {
    fn bad(&self, dataset: &str, row: usize, detail: impl Into<String>) -> Error {
        Error::Dataset {
            dataset: dataset.into(),
            row,
            detail: detail.into(),
        }
    }

    /// `processing_class(text=...)` (special tokens added as the tokenizer adds them).
    fn text(&self, text: &str) -> Result<Vec<i64>> {
        Ok(self.tokenizer.encode(text, true)?)
    }

    /// `apply_chat_template(messages, tokenize=True, ...)`, with the assistant mask when
    /// `with_mask` (`return_assistant_tokens_mask`).
    fn chat(
        &self,
        messages: &Value,
        example: &Map<String, Value>,
        add_generation_prompt: bool,
        with_mask: bool,
    ) -> Result<(Vec<i64>, Option<Vec<i64>>)> {
        tokenize_messages(
            self.tokenizer,
            messages,
            example,
            add_generation_prompt,
            with_mask,
        )
    }

    fn tokenize(&self, example: &Map<String, Value>, dataset: &str, i: usize) -> Result<Tokenized> {
        let str_of = |key: &str| -> Result<String> {
            example
                .get(key)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| self.bad(dataset, i, format!("`{key}` is not a string")))
        };
        if example.contains_key("prompt") {
            if !example.contains_key("completion") {
                return Err(self.bad(
                    dataset,
                    i,
                    "a `prompt` without a `completion`: SFT takes prompt-completion rows",
                ));
            }
            let (prompt_ids, ids, assistant_masks) = if is_conversational(example) {
                let prompt = &example["prompt"];
                let mut both = prompt.as_array().cloned().unwrap_or_default();
                both.extend(
                    example["completion"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default(),
                );
                let (prompt_ids, _) = self.chat(prompt, example, true, false)?;
                let (ids, masks) = self.chat(
                    &Value::Array(both),
                    example,
                    false,
                    self.config.assistant_only_loss,
                )?;
                (prompt_ids, ids, masks)
            } else {
                let prompt = str_of("prompt")?;
                let completion = str_of("completion")?;
                (
                    self.text(&prompt)?,
                    self.text(&(prompt + &completion))?,
                    None,
                )
            };
            let prompt_len = common_prefix_length(&prompt_ids, &ids);
            let mut mask = vec![0; prompt_len];
            mask.resize(ids.len(), 1);
            return Ok(Tokenized {
                input_ids: ids,
                completion_mask: Some(mask),
                assistant_masks,
            });
        }
        if is_conversational(example) {
            let (input_ids, assistant_masks) = self.chat(
                &example["messages"],
                example,
                false,
                self.config.assistant_only_loss,
            )?;
            return Ok(Tokenized {
                input_ids,
                completion_mask: None,
                assistant_masks,
            });
        }
        let field = &self.config.dataset_text_field;
        Ok(Tokenized {
            input_ids: self.text(&str_of(field)?)?,
            completion_mask: None,
            assistant_masks: None,
        })
    }

    /// `_prepare_dataset(dataset, processing_class, args, packing, formatting_func, name)`.
    fn prepare(&self, table: &Table, packing: bool, dataset: &str) -> Result<Vec<Feature>> {
        let columns = table.columns();
        let processed = columns.iter().any(|c| c == "input_ids");
        let mut rows: Vec<(Vec<i64>, Vec<i64>)> = Vec::with_capacity(table.len());
        for i in 0..table.len() {
            let mut example = row(table, i, dataset)?;
            if processed {
                let ids = ids_of(example.get("input_ids"))
                    .ok_or_else(|| self.bad(dataset, i, "`input_ids` is not a list of ids"))?;
                let labels = match example.get("labels") {
                    Some(v) => ids_of(Some(v))
                        .ok_or_else(|| self.bad(dataset, i, "`labels` is not a list of ids"))?,
                    None => ids.clone(),
                };
                rows.push((ids, labels));
                continue;
            }
            if self.config.skip_prepare_dataset {
                return Err(self.bad(
                    dataset,
                    i,
                    "skip_prepare_dataset is set but the rows have no `input_ids`: give tokenized rows (`input_ids`, `labels`)",
                ));
            }
            if let Some(f) = self.formatting_func {
                let text = f(&example);
                example.insert("text".into(), Value::String(text));
            }
            if is_conversational_from_value(&example) {
                return Err(self.bad(
                    dataset,
                    i,
                    "ShareGPT `conversations` ({\"from\", \"value\"}) are not converted here; give `messages` of {\"role\", \"content\"}",
                ));
            }
            // `add_eos`: non-conversational rows end with the EOS token.
            if !is_conversational(&example)
                && let Some(eos) = self.eos_token
            {
                let field = self.config.dataset_text_field.as_str();
                let key = if example.get(field).is_some_and(Value::is_string) {
                    Some(field)
                } else if example.get("completion").is_some_and(Value::is_string) {
                    Some("completion")
                } else {
                    None
                };
                if let Some(key) = key
                    && let Some(Value::String(s)) = example.get_mut(key)
                    && !s.ends_with(eos)
                {
                    s.push_str(eos);
                }
            }
            let t = self.tokenize(&example, dataset, i)?;
            if t.assistant_masks.as_ref().is_some_and(|m| !m.contains(&1)) {
                return Err(self.bad(
                    dataset,
                    i,
                    "You're using `assistant_only_loss=True`, but at least one example has no assistant tokens. This usually means the tokenizer's chat template doesn't generate assistant masks — it may be missing the `{% generation %}` keyword. Please check the template and ensure it's correctly configured to support assistant masking. (TRL's message)",
                ));
            }
            // `build_labels`: a token trains when every applicable mask keeps it (the
            // completion mask with `completion_only_loss`, the assistant mask always).
            let masks: Vec<&Vec<i64>> = [
                t.completion_mask
                    .as_ref()
                    .filter(|_| self.completion_only_loss),
                t.assistant_masks.as_ref(),
            ]
            .into_iter()
            .flatten()
            .collect();
            let labels = t
                .input_ids
                .iter()
                .enumerate()
                .map(|(j, &id)| {
                    if masks.iter().all(|m| m.get(j) != Some(&0)) {
                        id
                    } else {
                        -100
                    }
                })
                .collect();
            rows.push((t.input_ids, labels));
        }
        if let Some(max) = self.config.max_length
            && !packing
        {
            // `truncate`, then the fully masked rows dropped.
            for (ids, labels) in rows.iter_mut() {
                if ids.len() > max {
                    match self.config.truncation_mode {
                        TruncationMode::KeepStart => {
                            ids.truncate(max);
                            labels.truncate(max);
                        }
                        TruncationMode::KeepEnd => {
                            ids.drain(..ids.len() - max);
                            labels.drain(..labels.len() - max);
                        }
                    }
                }
            }
            rows.retain(|(_, labels)| labels.iter().any(|&l| l != -100));
        }
        if packing {
            let max = self.config.max_length.unwrap_or(usize::MAX);
            let (ids, labels): (Vec<Vec<i64>>, Vec<Vec<i64>>) = rows.into_iter().unzip();
            // `Dataset.map`'s default batch of 1000 rows.
            let packed = pack_dataset(&[ids, labels], max, self.config.packing_strategy, 1000)?;
            let mut columns = packed.columns.into_iter();
            let ids = columns.next().unwrap_or_default();
            let labels = columns.next().unwrap_or_default();
            let lengths = packed.seq_lengths;
            return Ok(ids
                .into_iter()
                .zip(labels)
                .enumerate()
                .map(|(i, (ids, labels))| Feature {
                    input_ids: ids,
                    labels: Some(Label::Ids(labels)),
                    seq_lengths: lengths.as_ref().map(|l| l[i].clone()),
                    ..Feature::default()
                })
                .collect());
        }
        Ok(rows
            .into_iter()
            .map(|(ids, labels)| Feature::new(ids).with_labels(Label::Ids(labels)))
            .collect())
    }
}

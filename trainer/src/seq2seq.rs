//! Upstream's `Seq2SeqTrainer` (`trainer_seq2seq.py` of transformers 5.23): a [`Trainer`]
//! whose evaluation and prediction generate (`predict_with_generate`), so that
//! `compute_metrics` sees generated token ids (BLEU, ROUGE) instead of logits.
//!
//! As upstream's:
//! - `evaluate` / `predict` take generation options (`gen_kwargs`); without `max_length` /
//!   `max_new_tokens` they get `generation_max_length`, without `num_beams`
//!   `generation_num_beams`. Evaluation during training runs with those fallbacks alone.
//! - `prediction_step` generates from `input_ids` / `attention_mask` (the batch's
//!   `decoder_input_ids` are left out when they are the labels' shift), then computes the
//!   loss with a plain forward on the whole batch (labels included, no
//!   `num_items_in_batch`; the label smoother when `label_smoothing_factor` is set).
//! - The generated ids and the labels are padded with the pad id (the tokenizer's, else its
//!   end-of-sequence id; without a tokenizer the model config's) to the **model's**
//!   generation `max_length` (or `max_new_tokens + 1`), not the call's; the evaluation loop
//!   then pads across batches with -100.
//! - The first generating step fills the model's generation config with upstream's global
//!   defaults (`max_length` 20, ...): an encoder-decoder model without a `max_length`
//!   generates 21 tokens (decoder start included) in the first batch and 20 afterwards.
//!   Here the filled configuration is kept by the trainer; the model's
//!   `generation_config.json` written by `save_model` stays as loaded (upstream's would hold
//!   the filled defaults).
//! - `evaluate` / `predict` gather with `accelerator.gather`, not `gather_for_metrics`: the
//!   evaluation loss repeats a short last batch's loss `eval_batch_size` times, as a full
//!   batch's (the mean of the batch losses when every batch but the last is full).
//! - `args.generation_config` (a file, a folder holding `generation_config.json`, or the
//!   options as a JSON object) replaces the model's generation configuration, checked as
//!   upstream's `validate(strict=True)`.

use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::sync::{Arc, Mutex};

use tch::{Kind, Tensor};
use tchtrain_collators::Batch;
use tchtrain_data::Dataset;
use tchtrain_losses::LabelSmoother;
use tchtrain_models::{GENERATION_CONFIG_NAME, GenerationConfig, TrainableModel, generate};
use tchtrain_training_args::Seq2SeqTrainingArguments;

use crate::step::{PredictionStepOutput, StepContext, model_forward, model_inputs};
use crate::{
    DefaultHooks, Error, Metrics, PredictionOutput, Result, Trainer, TrainerBuilder, TrainerHooks,
    default_evaluate, default_predict, default_prediction_step,
};

/// What the prediction steps share with the trainer: the generation configuration and the
/// options of the running `evaluate` / `predict`.
#[derive(Debug)]
struct GenerationState {
    predict_with_generate: bool,
    generation_max_length: Option<i64>,
    generation_num_beams: Option<i64>,
    /// The model's generation configuration (upstream `model.generation_config`), filled
    /// with the global defaults by the first generating step.
    generation_config: GenerationConfig,
    /// Whether the configuration still says `_from_model_config` (the first step clears it).
    filled: bool,
    /// `self._gen_kwargs`: the options of the running evaluation / prediction.
    gen_kwargs: GenerationConfig,
    /// The options the next `evaluate` / `predict` was called with.
    pending: Option<GenerationConfig>,
    /// The id `_pad_tensors_to_max_len` pads with.
    pad_token_id: Option<i64>,
    /// The model config's `max_position_embeddings` (caps the default length).
    max_position_embeddings: Option<i64>,
}

type Shared = Arc<Mutex<GenerationState>>;

fn missing_loss(inputs: &Batch) -> Error {
    Error::MissingLoss {
        keys: inputs.keys().collect::<Vec<_>>().join(", "),
    }
}

fn lock(state: &Shared) -> std::sync::MutexGuard<'_, GenerationState> {
    match state.lock() {
        Ok(s) => s,
        Err(p) => p.into_inner(),
    }
}

/// The hooks of a [`Seq2SeqTrainer`]: upstream's `evaluate`, `predict` and
/// `prediction_step` overrides around `inner` (the user's own hooks, or [`DefaultHooks`]),
/// which gets every other method.
pub struct Seq2SeqHooks<H: TrainerHooks = DefaultHooks> {
    inner: H,
    state: Shared,
}

/// Upstream `Seq2SeqTrainer`: a [`Trainer`] (it dereferences to one) built from a
/// [`TrainerBuilder`] made with `args.base`, whose `evaluate` / `predict` take generation
/// options.
pub struct Seq2SeqTrainer {
    trainer: Trainer,
    state: Shared,
}

impl Deref for Seq2SeqTrainer {
    type Target = Trainer;
    fn deref(&self) -> &Trainer {
        &self.trainer
    }
}

impl DerefMut for Seq2SeqTrainer {
    fn deref_mut(&mut self) -> &mut Trainer {
        &mut self.trainer
    }
}

/// Upstream's `load_generation_config`: a file, or a folder's `generation_config.json` (no
/// fallback to `config.json`), or the options themselves; then `validate(strict=True)`.
fn load_generation_config(arg: &serde_json::Value) -> Result<GenerationConfig> {
    let config = match arg {
        serde_json::Value::String(path) => {
            let path = Path::new(path);
            let file = if path.is_dir() {
                path.join(GENERATION_CONFIG_NAME)
            } else {
                path.to_path_buf()
            };
            if !file.is_file() {
                return Err(Error::InvalidArgument {
                    field: "generation_config",
                    detail: format!(
                        "{}: no such generation config file (hub ids are not resolved here); give a generation_config.json, a folder holding one, or the options as a JSON object",
                        file.display()
                    ),
                });
            }
            GenerationConfig::from_file(&file)?
        }
        serde_json::Value::Object(_) => GenerationConfig::from_json(arg)?,
        other => {
            return Err(Error::InvalidArgument {
                field: "generation_config",
                detail: format!("{other}: expected a path or a JSON object of generation options"),
            });
        }
    };
    strict_check(&config).map_err(|detail| Error::InvalidArgument {
        field: "generation_config",
        detail: format!("{detail}\n\nFix these issues to train your model."),
    })?;
    Ok(config)
}

/// The "minor issues" upstream's `validate(strict=True)` raises on (its plain `validate`
/// only warns about them).
fn strict_check(c: &GenerationConfig) -> std::result::Result<(), String> {
    let mut issues = Vec::new();
    if c.pad_token_id.is_some_and(|p| p < 0) {
        issues.push(format!(
            "`pad_token_id`: `pad_token_id` should be positive but got {}.",
            c.pad_token_id.unwrap_or_default()
        ));
    }
    if c.do_sample != Some(true) {
        let flag = "`do_sample` is set to `False`. However, `{0}` is set to `{1}` -- this flag is only used in sample-based generation modes. You should set `do_sample=True` or unset `{0}`.";
        let mut sampling = |name: &str, value: String| {
            issues.push(format!(
                "`{name}`: {}",
                flag.replace("{0}", name).replace("{1}", &value)
            ));
        };
        if let Some(t) = c.temperature.filter(|t| *t != 1.0) {
            sampling("temperature", t.to_string());
        }
        if let Some(p) = c.top_p.filter(|p| *p != 1.0) {
            sampling("top_p", p.to_string());
        }
        if let Some(p) = c.min_p {
            sampling("min_p", p.to_string());
        }
        if let Some(k) = c.top_k.filter(|k| *k != 50) {
            sampling("top_k", k.to_string());
        }
    }
    if c.num_beams.is_none_or(|n| n == 1) {
        let flag = "`num_beams` is set to 1. However, `{0}` is set to `{1}` -- this flag is only used in beam-based generation modes. You should set `num_beams>1` or unset `{0}`.";
        if let Some(e) = c
            .early_stopping
            .filter(|e| *e != tchtrain_models::EarlyStopping::False)
        {
            let value = match e {
                tchtrain_models::EarlyStopping::True => "True".to_string(),
                _ => "never".to_string(),
            };
            issues.push(format!(
                "`early_stopping`: {}",
                flag.replace("{0}", "early_stopping").replace("{1}", &value)
            ));
        }
        if let Some(p) = c.length_penalty.filter(|p| *p != 1.0) {
            issues.push(format!(
                "`length_penalty`: {}",
                flag.replace("{0}", "length_penalty")
                    .replace("{1}", &p.to_string())
            ));
        }
    }
    if c.return_dict_in_generate != Some(true) && c.output_scores == Some(true) {
        issues.push("`output_scores`: `return_dict_in_generate` is NOT set to `True`, but `output_scores` is. When `return_dict_in_generate` is not `True`, `output_scores` is ignored.".into());
    }
    if issues.is_empty() {
        return Ok(());
    }
    Err(format!(
        "GenerationConfig is invalid: \n- {}\nIf you're using a pretrained model, note that some of these attributes may be set through the model's `generation_config.json` file.",
        issues.join("\n- ")
    ))
}

/// `_get_default_generation_params()` applied to the unset fields (`update(...,
/// defaults_only=True)`).
fn fill_defaults(c: &mut GenerationConfig) {
    c.max_length.get_or_insert(20);
    c.min_length.get_or_insert(0);
    c.do_sample.get_or_insert(false);
    c.use_cache.get_or_insert(true);
    c.early_stopping
        .get_or_insert(tchtrain_models::EarlyStopping::False);
    c.num_beams.get_or_insert(1);
    c.temperature.get_or_insert(1.0);
    c.top_k.get_or_insert(50);
    c.top_p.get_or_insert(1.0);
    c.repetition_penalty.get_or_insert(1.0);
    c.length_penalty.get_or_insert(1.0);
    c.no_repeat_ngram_size.get_or_insert(0);
    c.num_return_sequences.get_or_insert(1);
    c.output_scores.get_or_insert(false);
    c.return_dict_in_generate.get_or_insert(false);
}

impl Seq2SeqTrainer {
    /// Upstream `Seq2SeqTrainer(model, args, ...)`: `builder` made with
    /// `Trainer::builder(model, args.base.clone())` and the rest of the Trainer's arguments.
    pub fn new(builder: TrainerBuilder, args: &Seq2SeqTrainingArguments) -> Result<Self> {
        Self::with_hooks(builder, args, DefaultHooks)
    }

    /// [`new`](Self::new) with the user's own hooks for every method but `evaluate`,
    /// `predict` and `prediction_step`.
    pub fn with_hooks<H: TrainerHooks + 'static>(
        builder: TrainerBuilder,
        args: &Seq2SeqTrainingArguments,
        inner: H,
    ) -> Result<Self> {
        let state: Shared = Arc::new(Mutex::new(GenerationState {
            predict_with_generate: args.predict_with_generate,
            generation_max_length: args.generation_max_length,
            generation_num_beams: args.generation_num_beams,
            generation_config: GenerationConfig::default(),
            filled: false,
            gen_kwargs: GenerationConfig::default(),
            pending: None,
            pad_token_id: None,
            max_position_embeddings: None,
        }));
        let mut trainer = builder
            .hooks(Seq2SeqHooks {
                inner,
                state: Arc::clone(&state),
            })
            .build()?;
        // `evaluate` / `predict` set `self.gather_function = self.accelerator.gather`, and
        // every evaluation (those during training too) goes through them.
        trainer.evaluation.gather_for_metrics = false;
        if *trainer.args() != args.base {
            return Err(Error::InvalidArgument {
                field: "args",
                detail: "the TrainerBuilder was made with other TrainingArguments than args.base: build it with Trainer::builder(model, args.base.clone())".into(),
            });
        }
        let pretrained = trainer.model().as_pretrained();
        let config_json = pretrained.map(|m| m.config().to_json_value()).transpose()?;
        let generation_config = match &args.generation_config {
            Some(arg) => load_generation_config(arg)?,
            None => match pretrained.and_then(|m| m.generation_config()) {
                Some(json) => GenerationConfig::from_json(json)?,
                None => GenerationConfig::default(),
            },
        };
        // `_pad_tensors_to_max_len`: the tokenizer's pad id, else its end-of-sequence id;
        // without a tokenizer the model config's pad id.
        let pad_token_id = match trainer.processing_class() {
            Some(tok) => tok.info().pad_token_id.or_else(|| {
                tok.special_tokens_map()
                    .into_iter()
                    .find(|(k, _)| k == "eos_token")
                    .and_then(|(_, t)| tok.tokenizer().token_to_id(&t))
                    .map(i64::from)
            }),
            None => config_json
                .as_ref()
                .and_then(|c| c["pad_token_id"].as_i64()),
        };
        let max_position_embeddings = config_json.as_ref().and_then(|c| {
            c["max_position_embeddings"]
                .as_i64()
                .or(c["n_positions"].as_i64())
        });
        {
            let mut s = lock(&state);
            s.generation_config = generation_config;
            s.pad_token_id = pad_token_id;
            s.max_position_embeddings = max_position_embeddings;
        }
        Ok(Self { trainer, state })
    }

    /// Upstream `evaluate(eval_dataset, metric_key_prefix, **gen_kwargs)`.
    pub fn evaluate(
        &mut self,
        eval_dataset: Option<Arc<dyn Dataset>>,
        metric_key_prefix: &str,
        gen_kwargs: Option<GenerationConfig>,
    ) -> Result<Metrics> {
        lock(&self.state).pending = gen_kwargs;
        self.trainer.evaluate(eval_dataset, metric_key_prefix)
    }

    /// Upstream `predict(test_dataset, metric_key_prefix, **gen_kwargs)`.
    pub fn predict(
        &mut self,
        test_dataset: Arc<dyn Dataset>,
        metric_key_prefix: &str,
        gen_kwargs: Option<GenerationConfig>,
    ) -> Result<PredictionOutput> {
        lock(&self.state).pending = gen_kwargs;
        self.trainer.predict(test_dataset, metric_key_prefix)
    }

    /// The generation configuration the prediction steps use (the model's, or
    /// `args.generation_config`; filled with upstream's defaults after a first generating
    /// step).
    pub fn generation_config(&self) -> GenerationConfig {
        lock(&self.state).generation_config.clone()
    }

    /// The Trainer inside.
    pub fn into_inner(self) -> Trainer {
        self.trainer
    }
}

impl<H: TrainerHooks> Seq2SeqHooks<H> {
    /// `evaluate` / `predict`'s fallbacks: `generation_max_length` without a length,
    /// `generation_num_beams` without a beam count; kept as `_gen_kwargs`.
    fn set_gen_kwargs(&self) {
        let mut s = lock(&self.state);
        let mut kw = s.pending.take().unwrap_or_default();
        if kw.max_length.is_none() && kw.max_new_tokens.is_none() {
            kw.max_length = s.generation_max_length;
        }
        if kw.num_beams.is_none() {
            kw.num_beams = s.generation_num_beams;
        }
        s.gen_kwargs = kw;
    }

    /// `_pad_tensors_to_max_len(tensor, max_length)`.
    fn pad_to(t: &Tensor, len: i64, pad: Option<i64>) -> Result<Tensor> {
        let pad = pad.ok_or_else(|| Error::InvalidArgument {
            field: "pad_token_id",
            detail: "Pad_token_id must be set in the configuration of the model, in order to pad tensors (upstream's message)".into(),
        })?;
        let padded = Tensor::f_full([t.size()[0], len], pad, (t.kind(), t.device()))?;
        padded.f_narrow(1, 0, t.size()[1])?.f_copy_(t)?;
        Ok(padded)
    }

    /// Upstream's two padding rules: to `max_length`, else to `max_new_tokens + 1`.
    fn pad_like_upstream(
        t: &Tensor,
        config: &GenerationConfig,
        pad: Option<i64>,
    ) -> Result<Tensor> {
        let len = t.size()[1];
        match (config.max_length, config.max_new_tokens) {
            (Some(m), _) if len < m => Self::pad_to(t, m, pad),
            (_, Some(n)) if len < n + 1 => Self::pad_to(t, n + 1, pad),
            _ => Ok(t.shallow_clone()),
        }
    }
}

impl<H: TrainerHooks> TrainerHooks for Seq2SeqHooks<H> {
    fn compute_loss(
        &self,
        ctx: &StepContext<'_>,
        model: &dyn TrainableModel,
        inputs: &Batch,
        num_items_in_batch: Option<&Tensor>,
    ) -> Result<(Tensor, tchtrain_models::ModelOutput)> {
        self.inner
            .compute_loss(ctx, model, inputs, num_items_in_batch)
    }
    fn loss_is_scaled_for_ga(&self) -> Option<bool> {
        self.inner.loss_is_scaled_for_ga()
    }
    fn training_step(
        &self,
        ctx: &StepContext<'_>,
        model: &mut dyn TrainableModel,
        inputs: &Batch,
        num_items_in_batch: Option<&Tensor>,
    ) -> Result<Tensor> {
        self.inner
            .training_step(ctx, model, inputs, num_items_in_batch)
    }
    fn get_train_dataloader(&self, trainer: &Trainer) -> Result<tchtrain_data::DataLoader> {
        self.inner.get_train_dataloader(trainer)
    }
    fn get_eval_dataloader(
        &self,
        trainer: &Trainer,
        eval_dataset: Option<Arc<dyn Dataset>>,
    ) -> Result<tchtrain_data::DataLoader> {
        self.inner.get_eval_dataloader(trainer, eval_dataset)
    }
    fn get_test_dataloader(
        &self,
        trainer: &Trainer,
        test_dataset: Arc<dyn Dataset>,
    ) -> Result<tchtrain_data::DataLoader> {
        self.inner.get_test_dataloader(trainer, test_dataset)
    }
    fn create_optimizer_and_scheduler(
        &self,
        trainer: &mut Trainer,
        num_training_steps: usize,
    ) -> Result<()> {
        self.inner
            .create_optimizer_and_scheduler(trainer, num_training_steps)
    }
    fn log(
        &self,
        trainer: &mut Trainer,
        logs: Vec<(String, f64)>,
        start_time: Option<std::time::Instant>,
    ) -> Result<()> {
        self.inner.log(trainer, logs, start_time)
    }

    fn evaluate(
        &self,
        trainer: &mut Trainer,
        eval_dataset: Option<Arc<dyn Dataset>>,
        metric_key_prefix: &str,
    ) -> Result<Metrics> {
        self.set_gen_kwargs();
        default_evaluate(self, trainer, eval_dataset, metric_key_prefix)
    }

    fn predict(
        &self,
        trainer: &mut Trainer,
        test_dataset: Arc<dyn Dataset>,
        metric_key_prefix: &str,
    ) -> Result<PredictionOutput> {
        self.set_gen_kwargs();
        default_predict(self, trainer, test_dataset, metric_key_prefix)
    }

    fn prediction_step(
        &self,
        ctx: &StepContext<'_>,
        model: &dyn TrainableModel,
        inputs: &Batch,
        prediction_loss_only: bool,
    ) -> Result<PredictionStepOutput> {
        let predict_with_generate = lock(&self.state).predict_with_generate;
        if !predict_with_generate || prediction_loss_only {
            return default_prediction_step(self, ctx, model, inputs, prediction_loss_only);
        }
        let has_labels = inputs.contains("labels");
        // The decoder inputs are left out when they are the labels' shift; other decoder
        // prompts are not generated from here.
        if let Some(d) = inputs.get("decoder_input_ids") {
            let shift = inputs.get("labels").is_some_and(|l| l.size() == d.size());
            if !shift {
                return Err(Error::InvalidArgument {
                    field: "decoder_input_ids",
                    detail: "predict_with_generate: the batch's decoder_input_ids are not the labels' shift; generating after a decoder prompt is not implemented here (drop the column)".into(),
                });
            }
        }
        let (config, pad, max_positions) = {
            let s = lock(&self.state);
            let mut config = s.generation_config.clone();
            config.update(&s.gen_kwargs);
            (config, s.pad_token_id, s.max_position_embeddings)
        };
        let generated = {
            let _autocast = match ctx.accelerator.autocast_dtype() {
                Some(_) => Some(ctx.accelerator.autocast()?),
                None => None,
            };
            // A model with its own `generate` (Whisper) reads its main input; the others
            // generate from `input_ids`.
            let features = inputs
                .get("input_features")
                .map(|f| f.f_to_device(ctx.device))
                .transpose()?;
            let own = model.own_generate(
                &tchtrain_models::ModelInputs {
                    input_features: features.as_ref(),
                    ..Default::default()
                },
                &config,
            );
            match own {
                Some(generated) => generated?,
                None => {
                    let input_ids = inputs.get("input_ids").ok_or(Error::InvalidArgument {
                        field: "input_ids",
                        detail: "predict_with_generate needs the batch's input_ids".into(),
                    })?;
                    let input_ids = input_ids.f_to_device(ctx.device)?;
                    let mask = inputs
                        .get("attention_mask")
                        .map(|m| m.f_to_device(ctx.device))
                        .transpose()?;
                    generate(model, &input_ids, mask.as_ref(), &config, max_positions)?.sequences
                }
            }
        };
        // Upstream fills the model's generation config with the global defaults here.
        let model_config = {
            let mut s = lock(&self.state);
            if !s.filled {
                s.generation_config
                    .other
                    .insert("_from_model_config".into(), false.into());
                fill_defaults(&mut s.generation_config);
                s.filled = true;
            }
            s.generation_config.clone()
        };
        let generated = Self::pad_like_upstream(&generated, &model_config, pad)?;
        let loss = if has_labels {
            tch::no_grad(|| -> Result<Tensor> {
                let out = model_forward(ctx, model, &model_inputs(inputs))?;
                let loss = if ctx.args.label_smoothing_factor != 0.0 {
                    let labels = inputs.get("labels").ok_or_else(|| missing_loss(inputs))?;
                    LabelSmoother::new(ctx.args.label_smoothing_factor).compute(
                        out.logits()?,
                        labels,
                        false,
                        None,
                    )?
                } else {
                    out.loss.ok_or_else(|| missing_loss(inputs))?
                };
                Ok(loss.detach().f_mean(Kind::Float)?)
            })
            .map(Some)?
        } else {
            None
        };
        if ctx.args.prediction_loss_only {
            return Ok(PredictionStepOutput {
                loss,
                ..Default::default()
            });
        }
        let labels = match inputs.get("labels").filter(|_| has_labels) {
            Some(l) => Some(Self::pad_like_upstream(
                &l.f_to_device(ctx.device)?,
                &model_config,
                pad,
            )?),
            None => None,
        };
        Ok(PredictionStepOutput {
            loss,
            logits: Some(generated),
            labels,
        })
    }
}

//! Upstream `examples/pytorch/speech-recognition/run_speech_recognition_seq2seq.py`:
//! fine-tunes a speech encoder-decoder (Whisper) on a dataset of audio clips and their
//! transcripts, and scores its generated transcripts by word error rate.
//!
//! Steps as upstream's script: the `--dataset_name` splits (`--train_split_name`,
//! `--eval_split_name`; a hub dataset repository or a local folder laid out as one, Parquet
//! files with `datasets`' `Audio` column); the config (`forced_decoder_ids`,
//! `suppress_tokens`, `apply_spec_augment`, `use_cache=False` with gradient checkpointing),
//! feature extractor, tokenizer and `AutoModelForSpeechSeq2Seq`; `--freeze_feature_encoder`
//! (Whisper has none: upstream raises, and so does this script — pass
//! `--freeze_feature_encoder False`), `--freeze_encoder`; on a multilingual checkpoint
//! `tokenizer.set_prefix_tokens(language, task)` and the generation config's `language` /
//! `task`; the audio decoded at the feature extractor's rate ([`tchtrain_datasets::
//! audio_from_cell`]); `--max_train_samples` / `--max_eval_samples`; `prepare_dataset`:
//! the log-mel `input_features`, `input_length`, the lower-cased (`--do_lower_case`)
//! transcript's ids as `labels`; the clips kept when `min_duration < length < max_duration`;
//! the feature extractor, tokenizer and config saved in `--output_dir`;
//! `DataCollatorSpeechSeq2SeqWithPadding`; `Seq2SeqTrainer`; train (`train_samples`); the
//! final evaluation generating with `--generation_max_length` / `--generation_num_beams`,
//! `wer` ([`crate::wer`], evaluate's) of the decoded predictions against the decoded labels.
//!
//! Refused: `--freeze_feature_encoder` on Whisper (upstream's AttributeError), SpecAugment in
//! training (the model refuses it: numpy's masks), `--preprocessing_only` (no on-disk cache
//! of the features here), `--text_column` (upstream's unused field) and `--trust_remote_code`.
//! `--preprocessing_num_workers` and `--overwrite_cache` are accepted without effect (the
//! features are computed in process each run).

use std::path::PathBuf;

use serde_json::Value;
use tch::Device;
use tchtrain_collators::{Column, DataCollatorSpeechSeq2SeqWithPadding, Feature, Label};
use tchtrain_data::InMemoryDataset;
use tchtrain_datasets::{Table, audio_from_cell, cell_text};
use tchtrain_models::{
    AutoTokenizer, GenerationConfig, LoadOptions, PreTrainedTokenizerFast, TrainableModel,
    WhisperFeatureExtractor, WhisperForConditionalGeneration,
};
use tchtrain_trainer::{EvalPrediction, Metrics, Seq2SeqTrainer, Trainer};
use tchtrain_training_args::{Dataclass, FieldSpec, Seq2SeqTrainingArguments};

use super::ExampleOutput;
use super::args::{self, Refusal, ScriptCommandLine, fields, refusals};
use super::common;
use crate::error::{Error, Result};

/// The script's arguments (upstream's `ModelArguments` and `DataTrainingArguments`).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[allow(missing_docs)]
pub struct SpeechRecognitionArguments {
    pub model_name_or_path: Option<String>,
    pub config_name: Option<String>,
    pub tokenizer_name: Option<String>,
    pub feature_extractor_name: Option<String>,
    pub cache_dir: Option<String>,
    pub model_revision: String,
    pub token: Option<String>,
    pub freeze_feature_encoder: bool,
    pub freeze_encoder: bool,
    /// A JSON list of `[index, token id]` pairs.
    pub forced_decoder_ids: Option<String>,
    /// A JSON list of token ids.
    pub suppress_tokens: Option<String>,
    pub apply_spec_augment: bool,
    pub dataset_name: Option<String>,
    pub dataset_config_name: Option<String>,
    pub overwrite_cache: bool,
    pub preprocessing_num_workers: Option<usize>,
    pub max_train_samples: Option<usize>,
    pub max_eval_samples: Option<usize>,
    pub audio_column_name: String,
    pub text_column_name: String,
    pub max_duration_in_seconds: f64,
    pub min_duration_in_seconds: f64,
    pub train_split_name: String,
    pub eval_split_name: String,
    pub do_lower_case: bool,
    pub language: Option<String>,
    pub task: String,
}

impl Default for SpeechRecognitionArguments {
    fn default() -> Self {
        args::defaults(COMMAND_LINE)
            .unwrap_or_else(|e| unreachable!("run_speech_recognition_seq2seq's defaults read: {e}"))
    }
}

static MODEL_ARGUMENTS: Dataclass = Dataclass {
    name: "ModelArguments",
    fields: &[
        fields::MODEL_NAME_OR_PATH.required(),
        fields::CONFIG_NAME,
        fields::TOKENIZER_NAME,
        FieldSpec::str(
            "feature_extractor_name",
            "None",
            "feature extractor name or path if not the same as model_name",
        ),
        fields::CACHE_DIR,
        fields::USE_FAST_TOKENIZER,
        fields::MODEL_REVISION,
        fields::TOKEN,
        fields::TRUST_REMOTE_CODE,
        FieldSpec::bool(
            "freeze_feature_encoder",
            true,
            "Whether to freeze the feature encoder layers of the model.",
        ),
        FieldSpec::bool(
            "freeze_encoder",
            false,
            "Whether to freeze the entire encoder of the seq2seq model.",
        ),
        FieldSpec::str(
            "forced_decoder_ids",
            "None",
            "Deprecated. Please use the `language` and `task` arguments instead. (a JSON list of [index, token id] pairs)",
        ),
        FieldSpec::str(
            "suppress_tokens",
            "None",
            "Deprecated. The use of `suppress_tokens` should not be required for the majority of fine-tuning examples. (a JSON list of token ids)",
        ),
        FieldSpec::bool(
            "apply_spec_augment",
            false,
            "Whether to apply *SpecAugment* data augmentation to the input features. This is currently only relevant for Wav2Vec2, HuBERT, WavLM and Whisper models.",
        ),
    ],
};

static DATA_TRAINING_ARGUMENTS: Dataclass = Dataclass {
    name: "DataTrainingArguments",
    fields: &[
        fields::DATASET_NAME,
        fields::DATASET_CONFIG_NAME,
        FieldSpec::str(
            "text_column",
            "None",
            "The name of the column in the datasets containing the full texts (for summarization).",
        ),
        fields::OVERWRITE_CACHE,
        fields::PREPROCESSING_NUM_WORKERS,
        fields::MAX_TRAIN_SAMPLES,
        fields::MAX_EVAL_SAMPLES,
        FieldSpec::str(
            "audio_column_name",
            "audio",
            "The name of the dataset column containing the audio data. Defaults to 'audio'",
        ),
        FieldSpec::str(
            "text_column_name",
            "text",
            "The name of the dataset column containing the text data. Defaults to 'text'",
        ),
        FieldSpec::float(
            "max_duration_in_seconds",
            "20.0",
            "Truncate audio files that are longer than `max_duration_in_seconds` seconds to 'max_duration_in_seconds`",
        ),
        FieldSpec::float(
            "min_duration_in_seconds",
            "0.0",
            "Filter audio files that are shorter than `min_duration_in_seconds` seconds",
        ),
        FieldSpec::bool(
            "preprocessing_only",
            false,
            "Whether to only do data preprocessing and skip training.",
        ),
        FieldSpec::str(
            "train_split_name",
            "train",
            "The name of the training data set split to use (via the datasets library). Defaults to 'train'",
        ),
        FieldSpec::str(
            "eval_split_name",
            "test",
            "The name of the training data set split to use (via the datasets library). Defaults to 'train'",
        ),
        FieldSpec::bool(
            "do_lower_case",
            true,
            "Whether the target text should be lower cased.",
        ),
        FieldSpec::str(
            "language",
            "None",
            "Language for multilingual fine-tuning. This argument should be set for multilingual fine-tuning only. For English speech recognition, it should be set to `None`.",
        ),
        FieldSpec::str(
            "task",
            "transcribe",
            "Task, either `transcribe` for speech recognition or `translate` for speech translation.",
        ),
    ],
};

/// The command line: upstream's dataclasses.
pub const COMMAND_LINE: &[&Dataclass] = &[&MODEL_ARGUMENTS, &DATA_TRAINING_ARGUMENTS];

const REFUSED: [Refusal; 4] = [
    refusals::USE_FAST_TOKENIZER,
    refusals::TRUST_REMOTE_CODE,
    Refusal {
        flag: "preprocessing_only",
        reason: "the features are computed in process at each run here (no on-disk cache of them to fill beforehand); run without --preprocessing_only",
    },
    Refusal {
        flag: "text_column",
        reason: "upstream's script declares it and never reads it; name the transcripts with --text_column_name",
    },
];

const LINE: ScriptCommandLine = ScriptCommandLine {
    title: "run_speech_recognition_seq2seq: speech recognition with an encoder-decoder model (upstream examples/pytorch/speech-recognition/run_speech_recognition_seq2seq.py)",
    dataclasses: COMMAND_LINE,
    refused: &REFUSED,
};

/// Parses a command line (without the program name).
pub fn parse_args<I, S>(argv: I) -> Result<(SpeechRecognitionArguments, Seq2SeqTrainingArguments)>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let (values, training) = args::parse_seq2seq(argv, &LINE)?;
    let flags: SpeechRecognitionArguments = values.take(&[0, 1])?;
    Ok((flags, training))
}

/// Runs the script on `argv` (the command line without the program name).
pub fn main_with_args<I, S>(argv: I) -> Result<ExampleOutput>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let (flags, training) = parse_args(argv)?;
    run(&flags, training)
}

/// One split's rows, prepared (`prepare_dataset`, then the duration filter).
struct Prepared {
    rows: Vec<Feature>,
}

/// Upstream's `prepare_dataset` over a split's rows and the duration filter.
fn prepare_split(
    table: &Table,
    flags: &SpeechRecognitionArguments,
    extractor: &WhisperFeatureExtractor,
    tokenizer: &PreTrainedTokenizerFast,
    max: Option<usize>,
) -> Result<Prepared> {
    for column in [&flags.audio_column_name, &flags.text_column_name] {
        if !table.columns().iter().any(|c| c == column) {
            let flag = if *column == flags.audio_column_name {
                "audio_column_name"
            } else {
                "text_column_name"
            };
            return Err(Error::InvalidFlag {
                flag: flag.into(),
                detail: format!(
                    "--{flag} '{column}' not found in dataset '{}'. Make sure to set `--{flag}` to the correct column - one of {}.",
                    flags.dataset_name.as_deref().unwrap_or_default(),
                    table.columns().join(", ")
                ),
            });
        }
    }
    let rate = extractor.config.sampling_rate;
    let max_input = flags.max_duration_in_seconds * rate as f64;
    let min_input = flags.min_duration_in_seconds * rate as f64;
    let n = max.map_or(table.len(), |m| m.min(table.len()));
    let mut rows = Vec::with_capacity(n);
    for i in 0..n {
        let what = format!("row {i} of {}", table.path().display());
        let base = table.path().parent();
        let audio = audio_from_cell(
            table.cell(i, &flags.audio_column_name)?,
            base,
            &what,
            Some(rate as u32),
        )?;
        let length = audio.array.len() as f64;
        let features = extractor.call(&[audio.array], audio.sampling_rate as usize)?;
        let features = features.get(0);
        let text = cell_text(table.cell(i, &flags.text_column_name)?);
        let text = if flags.do_lower_case {
            text.to_lowercase()
        } else {
            text
        };
        let labels = tokenizer.encode(&text, true)?;
        // `is_audio_in_length_range`.
        if !(length > min_input && length < max_input) {
            continue;
        }
        rows.push(
            Feature::default()
                .with_column(
                    "input_features",
                    Column::Floats {
                        shape: features.size(),
                        values: Vec::<f32>::try_from(features.reshape([-1]))?,
                    },
                )
                .with_labels(Label::Ids(labels)),
        );
    }
    Ok(Prepared { rows })
}

/// Upstream's `compute_metrics`: the label padding (-100) made the pad id, predictions and
/// labels decoded without special tokens, evaluate's `wer`.
fn wer_metrics(
    tokenizer: PreTrainedTokenizerFast,
) -> impl FnMut(&EvalPrediction) -> tchtrain_trainer::Result<Metrics> + Send + 'static {
    move |p: &EvalPrediction| {
        let pad = tokenizer.info().pad_token_id.unwrap_or(0);
        let decode = |t: &tch::Tensor| -> tchtrain_trainer::Result<Vec<String>> {
            let rows = crate::seq2seq_example::unpadded_rows(t, pad)?;
            crate::seq2seq_example::batch_decode(&tokenizer, &rows, None)
        };
        let preds = decode(&p.predictions.concatenated()?)?;
        let labels =
            p.label_ids
                .as_ref()
                .ok_or_else(|| tchtrain_trainer::Error::InvalidArgument {
                    field: "compute_metrics",
                    detail: "the evaluation has no labels to score the word error rate against"
                        .into(),
                })?;
        let labels = decode(&labels.concatenated()?)?;
        let wer = crate::wer::compute(&preds, &labels).map_err(|e| {
            tchtrain_trainer::Error::InvalidArgument {
                field: "compute_metrics",
                detail: e.to_string(),
            }
        })?;
        Ok(Metrics::from([("wer".to_string(), wer)]))
    }
}

/// A JSON-valued flag.
fn json_flag<T: serde::de::DeserializeOwned>(
    flag: &str,
    value: &Option<String>,
) -> Result<Option<T>> {
    value
        .as_deref()
        .map(|v| {
            serde_json::from_str(v).map_err(|e| Error::InvalidFlag {
                flag: flag.into(),
                detail: format!("{v}: {e} (a JSON list)"),
            })
        })
        .transpose()
}

/// Runs the script with parsed arguments.
pub fn run(
    flags: &SpeechRecognitionArguments,
    training: Seq2SeqTrainingArguments,
) -> Result<ExampleOutput> {
    let b = &training.base;
    let output_dir = PathBuf::from(b.output_dir());
    let forced_decoder_ids: Option<Vec<Vec<Option<i64>>>> =
        json_flag("forced_decoder_ids", &flags.forced_decoder_ids)?;
    let suppress_tokens: Option<Vec<i64>> = json_flag("suppress_tokens", &flags.suppress_tokens)?;
    let name = flags.dataset_name.as_deref().ok_or_else(|| Error::InvalidFlag {
        flag: "dataset_name".into(),
        detail: "required: the dataset (a hub repository or a local folder of its files) to load with load_dataset".into(),
    })?;
    let splits = common::load_dataset_splits(
        name,
        flags.dataset_config_name.as_deref(),
        flags.token.as_deref(),
    )?;
    let split_table = |split: &str| -> Result<Table> {
        let files = splits.get(split).ok_or_else(|| Error::InvalidFlag {
            flag: if split == flags.train_split_name {
                "train_split_name"
            } else {
                "eval_split_name"
            }
            .into(),
            detail: format!("the dataset {name} has no {split} split"),
        })?;
        common::concat_files(files)
    };
    let train_table = b
        .do_train
        .then(|| split_table(&flags.train_split_name))
        .transpose()?;
    let eval_table = b
        .do_eval
        .then(|| split_table(&flags.eval_split_name))
        .transpose()?;

    // Config, feature extractor, tokenizer, model.
    let (hub, dir) = common::resolve_model!(flags)?;
    let extractor_dir = match &flags.feature_extractor_name {
        Some(n) => common::model_dir(Some(n), None, &hub)?,
        None => dir.clone(),
    };
    let extractor = WhisperFeatureExtractor::from_pretrained(&extractor_dir)?;
    let mut tokenizer = match &flags.tokenizer_name {
        Some(t) => common::load_example_tokenizer(&dir, Some(t), &hub)?,
        None => AutoTokenizer::from_pretrained(&dir)?,
    };
    tch::manual_seed(b.seed as i64);
    let mut model = WhisperForConditionalGeneration::from_pretrained_dir(
        &dir,
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model;
    // `config.update({"forced_decoder_ids": ..., "suppress_tokens": ...})`, Whisper's
    // `apply_spec_augment`, `use_cache=False` with gradient checkpointing.
    {
        let config = model.whisper_config_mut();
        config.apply_spec_augment = flags.apply_spec_augment;
        config.suppress_tokens = suppress_tokens.as_ref().map(|t| Value::from(t.clone()));
        config.extra.insert(
            "forced_decoder_ids".into(),
            serde_json::to_value(&forced_decoder_ids).unwrap_or(Value::Null),
        );
        if b.gradient_checkpointing {
            config.extra.insert("use_cache".into(), Value::Bool(false));
        }
    }
    if model.whisper_config().decoder_start_token_id.is_none() {
        return Err(Error::InvalidArgument {
            field: "config.decoder_start_token_id",
            detail: "Make sure that `config.decoder_start_token_id` is correctly defined".into(),
        });
    }
    if flags.freeze_feature_encoder {
        return Err(Error::InvalidFlag {
            flag: "freeze_feature_encoder".into(),
            detail: "WhisperForConditionalGeneration has no feature encoder to freeze (upstream's `model.freeze_feature_encoder()` raises AttributeError on it): pass --freeze_feature_encoder False (or --freeze_encoder to freeze the whole encoder)".into(),
        });
    }
    if flags.freeze_encoder {
        model.freeze_encoder();
    }
    // The generation config: the deprecated overrides, then language and task.
    {
        let g = model.generation_config_mut();
        let obj = g.as_object_mut().ok_or_else(|| Error::InvalidArgument {
            field: "generation_config",
            detail: "not a JSON object".into(),
        })?;
        match &forced_decoder_ids {
            Some(ids) => {
                log::warn!(
                    "The use of `forced_decoder_ids` is deprecated and will be removed in v4.39.Please use the `language` and `task` arguments instead"
                );
                obj.insert(
                    "forced_decoder_ids".into(),
                    serde_json::to_value(ids).unwrap_or(Value::Null),
                );
            }
            None => {
                obj.remove("forced_decoder_ids");
            }
        }
        if let Some(t) = &suppress_tokens {
            log::warn!(
                "The use of `suppress_tokens` is deprecated and will be removed in v4.39.Should you need `suppress_tokens`, please manually update them in the fine-tuning script directly beforehand."
            );
            obj.insert("suppress_tokens".into(), Value::from(t.clone()));
        }
        let multilingual = obj.get("is_multilingual").and_then(Value::as_bool) == Some(true);
        if multilingual {
            tokenizer.set_prefix_tokens(flags.language.as_deref(), Some(&flags.task), None)?;
            obj.insert(
                "language".into(),
                flags.language.clone().map_or(Value::Null, Value::from),
            );
            obj.insert("task".into(), Value::from(flags.task.clone()));
        } else if flags.language.is_some() {
            return Err(Error::InvalidFlag {
                flag: "language".into(),
                detail: "Setting language token for an English-only checkpoint is not permitted. The language argument should only be set for multilingual checkpoints.".into(),
            });
        }
    }

    // The splits' features.
    let train = train_table
        .as_ref()
        .map(|t| prepare_split(t, flags, &extractor, &tokenizer, flags.max_train_samples))
        .transpose()?;
    let eval = eval_table
        .as_ref()
        .map(|t| prepare_split(t, flags, &extractor, &tokenizer, flags.max_eval_samples))
        .transpose()?;

    // Saved before training, as upstream's (main process): feature extractor, tokenizer,
    // config.
    if b.should_save() {
        std::fs::create_dir_all(&output_dir).map_err(|e| Error::io("creating", &output_dir, e))?;
        let src = extractor_dir.join("preprocessor_config.json");
        let dst = output_dir.join("preprocessor_config.json");
        std::fs::copy(&src, &dst).map_err(|e| Error::io("copying", &src, e))?;
        tokenizer.save_pretrained(&output_dir)?;
        model.save_config(&output_dir)?;
    }
    let decoder_start_token_id = model
        .whisper_config()
        .decoder_start_token_id
        .unwrap_or_default();
    let mut builder = Trainer::builder(Box::new(model) as Box<dyn TrainableModel>, b.clone())
        .data_collator(DataCollatorSpeechSeq2SeqWithPadding {
            decoder_start_token_id,
        });
    if training.predict_with_generate {
        builder = builder.compute_metrics(Box::new(wer_metrics(tokenizer.clone())));
    }
    let n_train = train.as_ref().map(|p| p.rows.len());
    if let Some(p) = train {
        builder = builder.train_dataset(InMemoryDataset::new(p.rows).into_shared());
    }
    let n_eval = eval.as_ref().map_or(0, |p| p.rows.len());
    if let Some(p) = eval {
        builder = builder.eval_dataset(InMemoryDataset::new(p.rows).into_shared());
    }
    let mut trainer = Seq2SeqTrainer::new(builder, &training)?;
    let mut out = ExampleOutput {
        output_dir: output_dir.clone(),
        ..ExampleOutput::default()
    };
    if b.do_train {
        out.train_metrics = Some(common::do_train(&mut trainer, n_train, |_| Ok(()))?);
    }
    if b.do_eval {
        log::info!("*** Evaluate ***");
        let gen_kwargs = GenerationConfig {
            max_length: training.generation_max_length,
            num_beams: training.generation_num_beams,
            ..GenerationConfig::default()
        };
        let mut metrics = trainer.evaluate(None, "eval", Some(gen_kwargs))?;
        metrics.insert("eval_samples".into(), n_eval as f64);
        trainer.log_metrics("eval", &metrics);
        trainer.save_metrics("eval", &metrics, true)?;
        out.eval_metrics = Some(metrics);
    }
    let mut card = common::card_options(
        flags.model_name_or_path.as_deref(),
        "automatic-speech-recognition",
        flags.dataset_name.as_deref(),
        flags.dataset_config_name.as_deref(),
    );
    if let (Some(name), Some(config)) = (&flags.dataset_name, &flags.dataset_config_name)
        && name.contains("common_voice")
    {
        card.language = vec![config.split('-').next().unwrap_or(config).to_string()];
    }
    common::push_or_write_model_card(&mut trainer, card)?;
    Ok(out)
}

//! What `run_translation` and `run_summarization` share: upstream's common
//! `ModelArguments` / `DataTrainingArguments` flags, the model and tokenizer with the
//! scripts' checks, the tokenization of inputs and targets (through the dataset cache), the
//! collator, the decoding of generated ids, and the train / evaluate / predict driver around
//! [`Seq2SeqTrainer`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use tch::{Device, Tensor};
use tchtrain_collators::{DataCollatorForSeq2Seq, DefaultDataCollator, Feature, Label};
use tchtrain_data::InMemoryDataset;
use tchtrain_datasets::{DataFilesDict, Fingerprint, MapCache, Table, map_cached};
use tchtrain_models::{
    AutoTask, BartForConditionalGeneration, GenerationConfig, LoadOptions, PreTrainedTokenizerFast,
    TrainableModel, from_pretrained_dir,
};
use tchtrain_trainer::{EvalPrediction, Metrics, Seq2SeqTrainer, Trainer};
use tchtrain_training_args::Seq2SeqTrainingArguments;
use tokenizers::{PaddingParams, PaddingStrategy, TruncationParams};

use super::ExampleOutput;
use super::args::{Refusal, fields, refusals};
use super::common::{self, load_example_tokenizer, tokenizer_json};
use crate::error::{Error, Result};
use crate::sacrebleu::py_isspace;
use tchtrain_training_args::FieldSpec;

/// The flags `run_translation` and `run_summarization` share (upstream's `ModelArguments`
/// and `DataTrainingArguments` fields of both scripts; defaults from their tables).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct Seq2SeqDataArguments {
    /// `--model_name_or_path`: a model folder or hub id (required).
    pub model_name_or_path: Option<String>,
    /// `--config_name`: only the model's own folder is accepted.
    pub config_name: Option<String>,
    /// `--tokenizer_name`: a tokenizer folder or hub id when the model folder has none.
    pub tokenizer_name: Option<String>,
    /// `--cache_dir`: the hub cache downloads go to (default: the HF hub cache).
    pub cache_dir: Option<String>,
    /// `--model_revision` (default `main`).
    pub model_revision: String,
    /// `--token`: the hub token (default: `HF_TOKEN`, else the login file).
    pub token: Option<String>,
    /// `--dataset_name`: a hub dataset repository (or a local folder of data files) whose
    /// `train` / `validation` / `test` splits replace the file flags.
    pub dataset_name: Option<String>,
    /// `--dataset_config_name`: the dataset's configuration.
    pub dataset_config_name: Option<String>,
    /// `--train_file`.
    pub train_file: Option<String>,
    /// `--validation_file`.
    pub validation_file: Option<String>,
    /// `--test_file`.
    pub test_file: Option<String>,
    /// The splits' files of `--dataset_name` ([`Self::resolve_dataset`]).
    #[serde(skip)]
    pub dataset_splits: Option<DataFilesDict>,
    /// `--overwrite_cache`: tokenize again instead of loading the cached rows.
    pub overwrite_cache: bool,
    /// `--preprocessing_num_workers`: accepted; tokenization uses every core
    /// (`TCHTRAIN_NUM_PROC`), with the same result.
    pub preprocessing_num_workers: Option<usize>,
    /// `--max_source_length` (default 1024): inputs truncated to N tokens.
    pub max_source_length: usize,
    /// `--max_target_length` (default 128): training targets truncated to N tokens.
    pub max_target_length: usize,
    /// `--val_max_target_length` (default: `max_target_length`): evaluation and prediction
    /// targets truncated to N tokens; also the generation `max_length`.
    pub val_max_target_length: Option<usize>,
    /// `--pad_to_max_length`: pad every row to the maximum lengths.
    pub pad_to_max_length: bool,
    /// `--max_train_samples`.
    pub max_train_samples: Option<usize>,
    /// `--max_eval_samples`.
    pub max_eval_samples: Option<usize>,
    /// `--max_predict_samples`.
    pub max_predict_samples: Option<usize>,
    /// `--num_beams` (default 1): beams of the scripts' generation.
    pub num_beams: Option<i64>,
    /// `--ignore_pad_token_for_loss` (default true): padded label positions are -100.
    pub ignore_pad_token_for_loss: bool,
    /// `--source_prefix`: text put before every input (T5's `translate ...: `).
    pub source_prefix: Option<String>,
    /// `--forced_bos_token`: refused with a multilingual tokenizer (setting the model's
    /// `forced_bos_token_id` is not implemented); the others ignore it, as upstream's script.
    pub forced_bos_token: Option<String>,
}

impl Default for Seq2SeqDataArguments {
    /// Upstream's defaults (the tables').
    fn default() -> Self {
        crate::run_translation::TranslationArguments::default().data
    }
}

/// The `ModelArguments` fields both scripts declare (run_summarization.py adds
/// `resize_position_embeddings`).
pub(crate) const MODEL_FIELDS: [FieldSpec; 8] = [
    fields::MODEL_NAME_OR_PATH.required(),
    fields::CONFIG_NAME,
    fields::TOKENIZER_NAME,
    fields::CACHE_DIR,
    fields::USE_FAST_TOKENIZER,
    fields::MODEL_REVISION,
    fields::TOKEN,
    fields::TRUST_REMOTE_CODE,
];

/// The `DataTrainingArguments` fields both scripts declare after their own
/// (`source_lang` ... / `lang` ...) and the file flags.
pub(crate) const DATA_FIELDS: [FieldSpec; 13] = [
    fields::OVERWRITE_CACHE,
    fields::PREPROCESSING_NUM_WORKERS,
    FieldSpec::int(
        "max_source_length",
        "1024",
        "The maximum total input sequence length after tokenization.",
    ),
    FieldSpec::int(
        "max_target_length",
        "128",
        "The maximum total sequence length for target text after tokenization.",
    ),
    FieldSpec::int(
        "val_max_target_length",
        "None",
        "The maximum total sequence length for validation target text (default: max_target_length); also the generation max_length.",
    ),
    FieldSpec::bool(
        "pad_to_max_length",
        false,
        "Whether to pad all samples to model maximum sentence length.",
    ),
    fields::MAX_TRAIN_SAMPLES,
    fields::MAX_EVAL_SAMPLES,
    fields::MAX_PREDICT_SAMPLES,
    FieldSpec::int(
        "num_beams",
        "1",
        "Number of beams to use for evaluation (evaluate and predict).",
    ),
    FieldSpec::bool(
        "ignore_pad_token_for_loss",
        true,
        "Whether to ignore the tokens corresponding to padded labels in the loss computation or not.",
    ),
    FieldSpec::str(
        "source_prefix",
        "None",
        "A prefix to add before every source text (useful for T5 models).",
    ),
    FieldSpec::str(
        "forced_bos_token",
        "None",
        "The token to force as the first generated token (multilingual models; refused here).",
    ),
];

/// The refusals both scripts share.
pub(crate) const REFUSED: [Refusal; 2] =
    [refusals::USE_FAST_TOKENIZER, refusals::TRUST_REMOTE_CODE];

/// The T5 checkpoints upstream warns about without a `--source_prefix`.
const T5_MODELS: [&str; 5] = [
    "google-t5/t5-small",
    "google-t5/t5-base",
    "google-t5/t5-large",
    "google-t5/t5-3b",
    "google-t5/t5-11b",
];

impl Seq2SeqDataArguments {
    /// Upstream's `__post_init__`: `val_max_target_length` defaults to
    /// `max_target_length`; without `--dataset_name` a file must be given; the files given
    /// must end in one of `extensions` (`message` names them).
    pub(crate) fn post_init(
        &mut self,
        need_message: &str,
        with_test: bool,
        extensions: &[&str],
        ext_message: &str,
        script_checks: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let any = self.train_file.is_some()
            || self.validation_file.is_some()
            || (with_test && self.test_file.is_some());
        if self.dataset_name.is_none() && !any {
            return Err(Error::InvalidFlag {
                flag: "train_file".into(),
                detail: need_message.into(),
            });
        }
        script_checks()?;
        let mut files = vec![
            ("train_file", &self.train_file),
            ("validation_file", &self.validation_file),
        ];
        if with_test {
            files.push(("test_file", &self.test_file));
        }
        for (flag, file) in files {
            if let Some(f) = file {
                let ext = f.rsplit('.').next().unwrap_or_default();
                if !extensions.contains(&ext) {
                    return Err(Error::InvalidFlag {
                        flag: flag.into(),
                        detail: format!("`{flag}` should be {ext_message}."),
                    });
                }
            }
        }
        if self.val_max_target_length.is_none() {
            self.val_max_target_length = Some(self.max_target_length);
        }
        Ok(())
    }

    /// `val_max_target_length` (`max_target_length` before `post_init`).
    pub(crate) fn val_max_target_length(&self) -> usize {
        self.val_max_target_length.unwrap_or(self.max_target_length)
    }

    /// Upstream's warning for a T5 checkpoint without `--source_prefix` (`example` is the
    /// script's suggestion).
    pub(crate) fn warn_t5_prefix(&self, expected: &str) {
        if self.source_prefix.is_none()
            && self
                .model_name_or_path
                .as_deref()
                .is_some_and(|m| T5_MODELS.contains(&m))
        {
            log::warn!("You're running a t5 model but didn't provide a source prefix, {expected}");
        }
    }

    /// `load_dataset(--dataset_name, --dataset_config_name)`: each split's data files, which
    /// [`Self::split_table`] then reads instead of the file flags (upstream loads the
    /// dataset and ignores the files). Nothing without `--dataset_name`.
    pub(crate) fn resolve_dataset(&mut self) -> Result<()> {
        if let Some(name) = &self.dataset_name {
            self.dataset_splits = Some(common::load_dataset_splits(
                name,
                self.dataset_config_name.as_deref(),
                self.token.as_deref(),
            )?);
        }
        Ok(())
    }

    /// The rows of split `split` (`train`, `validation` or `test`): the dataset's files of
    /// that split concatenated, or the split's file flag.
    pub(crate) fn split_table(&self, split: &str) -> Result<Table> {
        if let Some(splits) = &self.dataset_splits {
            let files = splits.get(split).ok_or_else(|| Error::InvalidFlag {
                flag: "dataset_name".into(),
                detail: format!(
                    "the dataset {} has no {split} split",
                    self.dataset_name.as_deref().unwrap_or_default()
                ),
            })?;
            return common::concat_files(files);
        }
        let file = match split {
            "train" => &self.train_file,
            "validation" => &self.validation_file,
            _ => &self.test_file,
        };
        Ok(Table::read(file.as_deref().unwrap_or_default())?)
    }

    /// The files (or the dataset's splits) each requested step needs (upstream's
    /// "--do_train requires a train dataset", ...), checked before any is read.
    pub(crate) fn check_steps(&self, training: &Seq2SeqTrainingArguments) -> Result<()> {
        let base = &training.base;
        if let Some(splits) = &self.dataset_splits {
            for (wanted, split, what) in [
                (
                    base.do_train,
                    "train",
                    "--do_train requires a train dataset",
                ),
                (
                    base.do_eval,
                    "validation",
                    "--do_eval requires a validation dataset",
                ),
                (
                    base.do_predict,
                    "test",
                    "--do_predict requires a test dataset",
                ),
            ] {
                if wanted && splits.get(split).is_none() {
                    return Err(Error::InvalidFlag {
                        flag: "dataset_name".into(),
                        detail: format!(
                            "{what}: the dataset {} has no {split} split",
                            self.dataset_name.as_deref().unwrap_or_default()
                        ),
                    });
                }
            }
            return Ok(());
        }
        for (wanted, file, flag, what) in [
            (
                base.do_train,
                &self.train_file,
                "train_file",
                "--do_train requires a train dataset",
            ),
            (
                base.do_eval,
                &self.validation_file,
                "validation_file",
                "--do_eval requires a validation dataset",
            ),
            (
                base.do_predict,
                &self.test_file,
                "test_file",
                "--do_predict requires a test dataset",
            ),
        ] {
            if wanted && file.is_none() {
                return Err(Error::InvalidFlag {
                    flag: flag.into(),
                    detail: format!("{what} (pass --{flag} FILE)"),
                });
            }
        }
        Ok(())
    }
}

/// Whether the run has something to do; logs upstream's message when not.
pub(crate) fn something_to_do(training: &Seq2SeqTrainingArguments) -> bool {
    let b = &training.base;
    if b.do_train || b.do_eval || b.do_predict {
        return true;
    }
    log::info!("There is nothing to do. Please pass `do_train`, `do_eval` and/or `do_predict`.");
    false
}

/// The model and its tokenizer, after upstream's checks.
pub(crate) struct LoadedSeq2Seq {
    pub(crate) tokenizer: PreTrainedTokenizerFast,
    pub(crate) model: Box<dyn TrainableModel>,
}

/// How a script treats a model with fewer position embeddings than `max_source_length`.
pub(crate) enum PositionCheck {
    /// run_translation: refuse unless the model has relative attention (T5).
    Translation,
    /// run_summarization: upstream would resize the embeddings (`--resize_position_embeddings`
    /// true or unset), which BART and T5 do not implement; refuse either way.
    Summarization {
        /// `--resize_position_embeddings`.
        resize: Option<bool>,
    },
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io("reading", path, e))?;
    serde_json::from_str(&text).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// Upstream's `AutoConfig` / `AutoTokenizer` / `AutoModelForSeq2SeqLM.from_pretrained`, the
/// embedding-size check, `decoder_start_token_id` and the position-embedding check.
/// `decoder_start_lang` is the language code an mBART tokenizer's model starts decoding with
/// when its config names no `decoder_start_token_id` (run_translation's `--target_lang`).
pub(crate) fn load_model(
    data: &Seq2SeqDataArguments,
    training: &Seq2SeqTrainingArguments,
    positions: PositionCheck,
    decoder_start_lang: Option<&str>,
) -> Result<LoadedSeq2Seq> {
    let (hub, dir) = common::resolve_model!(data)?;
    let tokenizer = load_example_tokenizer(&dir, data.tokenizer_name.as_deref(), &hub)?;
    let class = tokenizer
        .config()
        .get("tokenizer_class")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if class == "M2M100Tokenizer" {
        return Err(Error::InvalidFlag {
            flag: "model_name_or_path".into(),
            detail: format!(
                "{class}: M2M100's tokenizer has no fast form upstream (a SentencePiece model, no tokenizer.json), which this build reads; mBART, mBART-50 and NLLB tokenizers work"
            ),
        });
    }
    let config = read_json(&dir.join("config.json"))?;
    let embedding_size = config["vocab_size"].as_i64().unwrap_or(i64::MAX);
    let len_tokenizer = tokenizer.tokenizer().get_vocab_size(true) as i64;
    if len_tokenizer > embedding_size {
        return Err(Error::InvalidFlag {
            flag: "tokenizer_name".into(),
            detail: format!(
                "the tokenizer has {len_tokenizer} tokens but the model's embeddings only {embedding_size}; upstream resizes the embeddings (`model.resize_token_embeddings`), which is not implemented here: use a tokenizer of the model"
            ),
        });
    }
    // Upstream: `if model.config.decoder_start_token_id is None and isinstance(tokenizer,
    // (MBartTokenizer, MBartTokenizerFast))`, the target language's id
    // (`convert_tokens_to_ids`: the unknown token's id for a code the vocabulary lacks).
    let decoder_start = match (
        config["decoder_start_token_id"].as_i64(),
        class.as_str(),
        decoder_start_lang,
    ) {
        (None, "MBartTokenizer" | "MBartTokenizerFast", Some(lang)) => {
            let tok = tokenizer.tokenizer();
            let unk = tokenizer
                .config()
                .get("unk_token")
                .and_then(Value::as_str)
                .and_then(|u| tok.token_to_id(u));
            tok.token_to_id(lang).or(unk).map(i64::from)
        }
        _ => None,
    };
    if config["decoder_start_token_id"].as_i64().is_none() && decoder_start.is_none() {
        return Err(Error::InvalidArgument {
            field: "config.decoder_start_token_id",
            detail: "Make sure that `config.decoder_start_token_id` is correctly defined".into(),
        });
    }
    if let Some(m) = config["max_position_embeddings"].as_u64()
        && (m as usize) < data.max_source_length
    {
        let n = data.max_source_length;
        match positions {
            PositionCheck::Translation => {
                if config.get("relative_attention_max_distance").is_none() {
                    return Err(Error::InvalidFlag {
                        flag: "max_source_length".into(),
                        detail: format!(
                            "`--max_source_length` is set to {n}, but the model only has {m} position encodings. Consider either reducing `--max_source_length` to {m} or using a model with larger position embeddings"
                        ),
                    });
                }
            }
            PositionCheck::Summarization { resize } => {
                if resize.is_none() {
                    log::warn!(
                        "Increasing the model's number of position embedding vectors from {m} to {n}."
                    );
                }
                let detail = if resize == Some(false) {
                    format!(
                        "`--max_source_length` is set to {n}, but the model only has {m} position encodings. Consider either reducing `--max_source_length` to {m} or to automatically resize the model's position encodings by passing `--resize_position_embeddings`."
                    )
                } else {
                    format!(
                        "`--max_source_length` is set to {n}, but the model only has {m} position encodings; resizing them (`model.resize_position_embeddings`) is not implemented for this model (upstream raises NotImplementedError for BART and T5): pass --max_source_length {m} or less"
                    )
                };
                return Err(Error::InvalidFlag {
                    flag: "max_source_length".into(),
                    detail,
                });
            }
        }
    }
    tch::manual_seed(training.base.seed as i64);
    let model: Box<dyn TrainableModel> = match decoder_start {
        None => {
            from_pretrained_dir(
                &dir,
                AutoTask::Seq2SeqLm,
                Device::Cpu,
                &LoadOptions::default(),
            )?
            .model
        }
        Some(id) => {
            let model_type = config["model_type"].as_str().unwrap_or_default();
            if !matches!(model_type, "mbart" | "bart") {
                return Err(Error::InvalidArgument {
                    field: "config.decoder_start_token_id",
                    detail: format!(
                        "the config names none and upstream would set it to the target language's id ({id}) on this `{model_type}` model; that is implemented for mBART / BART models: set `decoder_start_token_id` in config.json"
                    ),
                });
            }
            let mut loaded = BartForConditionalGeneration::from_pretrained_dir(
                &dir,
                Device::Cpu,
                &LoadOptions::default(),
            )?;
            loaded.model.set_decoder_start_token_id(id);
            Box::new(loaded.model)
        }
    };
    Ok(LoadedSeq2Seq { tokenizer, model })
}

/// The scripts' `preprocess_function` once the inputs and targets are picked: inputs (with
/// the prefix) truncated to `max_source_length`, targets tokenized as `text_target`
/// truncated to `max_target_length`, both padded to those lengths with
/// `--pad_to_max_length` (label padding -100 with `--ignore_pad_token_for_loss`), the target
/// ids as `labels`.
pub(crate) struct Seq2SeqTokenization<'a> {
    pub(crate) tokenizer: &'a PreTrainedTokenizerFast,
    pub(crate) prefix: String,
    pub(crate) max_source_length: usize,
    pub(crate) pad_to_max_length: bool,
    pub(crate) ignore_pad_token_for_loss: bool,
    /// The name of the script's function (the cache fingerprint's).
    pub(crate) function: &'static str,
}

impl Seq2SeqTokenization<'_> {
    /// The backend tokenizer for sources, or for targets (`text_target`: a multilingual
    /// tokenizer's `tgt_lang` code), truncating to `max_length` (and padding to it with
    /// `--pad_to_max_length`).
    fn configured(&self, max_length: usize, target: bool) -> Result<tokenizers::Tokenizer> {
        let mut tok = if target {
            self.tokenizer.target_tokenizer()?
        } else {
            self.tokenizer.tokenizer().clone()
        };
        tok.with_truncation(Some(TruncationParams {
            max_length,
            ..TruncationParams::default()
        }))
        .map_err(|e| Error::Tokenizer {
            what: "settings".into(),
            detail: e.to_string(),
        })?;
        if self.pad_to_max_length {
            tok.with_padding(Some(PaddingParams {
                strategy: PaddingStrategy::Fixed(max_length),
                pad_id: self.pad_id() as u32,
                pad_token: self
                    .tokenizer
                    .tokenizer()
                    .id_to_token(self.pad_id() as u32)
                    .unwrap_or_default(),
                ..PaddingParams::default()
            }));
        } else {
            tok.with_padding(None);
        }
        Ok(tok)
    }

    fn pad_id(&self) -> i64 {
        self.tokenizer.info().pad_token_id.unwrap_or(0)
    }

    /// The rows for `inputs` / `targets` (without the prefix).
    pub(crate) fn features(
        &self,
        inputs: &[String],
        targets: &[String],
        max_target_length: usize,
    ) -> Result<Vec<Feature>> {
        let source = self.configured(self.max_source_length, false)?;
        let target = self.configured(max_target_length, true)?;
        let pad = self.pad_id();
        inputs
            .iter()
            .zip(targets)
            .enumerate()
            .map(|(i, (input, t))| {
                let text = format!("{}{input}", self.prefix);
                let enc = source
                    .encode(text.as_str(), true)
                    .map_err(|e| Error::Tokenizer {
                        what: format!("input of row {i}"),
                        detail: e.to_string(),
                    })?;
                let mut feature = Feature::from_encoding(&enc, false);
                feature.special_tokens_mask = None;
                feature.offset_mapping = None;
                let labels = target
                    .encode(t.as_str(), true)
                    .map_err(|e| Error::Tokenizer {
                        what: format!("target of row {i}"),
                        detail: e.to_string(),
                    })?;
                let mut ids: Vec<i64> = labels.get_ids().iter().map(|&x| i64::from(x)).collect();
                if self.pad_to_max_length && self.ignore_pad_token_for_loss {
                    for id in &mut ids {
                        if *id == pad {
                            *id = -100;
                        }
                    }
                }
                feature.labels = Some(Label::Ids(ids));
                Ok(feature)
            })
            .collect()
    }

    /// [`features`](Self::features) through the dataset cache.
    pub(crate) fn dataset(
        &self,
        inputs: &[String],
        targets: &[String],
        max_target_length: usize,
        cache: Option<&MapCache>,
        overwrite: bool,
    ) -> Result<InMemoryDataset> {
        let mut fingerprint = Fingerprint::new(self.function);
        fingerprint
            .update(tokenizer_json(self.tokenizer.tokenizer())?)
            .update(&self.prefix)
            .update((self.max_source_length as u64).to_le_bytes())
            .update((max_target_length as u64).to_le_bytes())
            .update([
                u8::from(self.pad_to_max_length),
                u8::from(self.ignore_pad_token_for_loss),
            ]);
        if self.tokenizer.language_codes().is_some() {
            // The targets' language code.
            fingerprint.update(tokenizer_json(&self.tokenizer.target_tokenizer()?)?);
        }
        for (i, t) in inputs.iter().zip(targets) {
            fingerprint
                .update((i.len() as u64).to_le_bytes())
                .update(i)
                .update((t.len() as u64).to_le_bytes())
                .update(t);
        }
        let features = map_cached(cache, &fingerprint, overwrite, || {
            self.features(inputs, targets, max_target_length)
        })?;
        Ok(InMemoryDataset::new(features))
    }
}

/// Python's `round(x, 4)`: the double nearest the exact decimal value of `x` rounded to 4
/// places, ties to even (Rust's formatting rounds the exact binary value the same way).
pub(crate) fn py_round(x: f64) -> f64 {
    if !x.is_finite() {
        return x;
    }
    format!("{x:.4}").parse().unwrap_or(x)
}

/// Generated (or label) ids with -100 replaced by the pad id (upstream's `np.where(preds !=
/// -100, preds, tokenizer.pad_token_id)`), as rows.
pub(crate) fn unpadded_rows(ids: &Tensor, pad: i64) -> tchtrain_trainer::Result<Vec<Vec<i64>>> {
    let ids = ids.f_masked_fill(&ids.f_eq(-100)?, pad)?;
    Ok(Vec::<Vec<i64>>::try_from(&ids)?)
}

/// `tokenizer.batch_decode(rows, skip_special_tokens=True, clean_up_tokenization_spaces=...)`.
pub(crate) fn batch_decode(
    tokenizer: &PreTrainedTokenizerFast,
    rows: &[Vec<i64>],
    clean_up_tokenization_spaces: Option<bool>,
) -> tchtrain_trainer::Result<Vec<String>> {
    rows.iter()
        .map(|r| {
            tokenizer
                .decode(r, true, clean_up_tokenization_spaces)
                .map_err(tchtrain_trainer::Error::from)
        })
        .collect()
}

/// `np.mean([np.count_nonzero(pred != pad) for pred in preds])`.
pub(crate) fn gen_len(rows: &[Vec<i64>], pad: i64) -> f64 {
    let total: usize = rows
        .iter()
        .map(|r| r.iter().filter(|&&t| t != pad).count())
        .sum();
    total as f64 / rows.len() as f64
}

/// The predictions and labels of an evaluation as decoded text (`skip_special_tokens`,
/// the tokenizer's own clean-up setting) and the `gen_len` of the predictions.
pub(crate) fn decoded(
    tokenizer: &PreTrainedTokenizerFast,
    p: &EvalPrediction,
) -> tchtrain_trainer::Result<(Vec<String>, Vec<String>, f64)> {
    let pad = tokenizer.info().pad_token_id.unwrap_or(0);
    let preds = unpadded_rows(&p.predictions.concatenated()?, pad)?;
    let labels = match &p.label_ids {
        Some(l) => unpadded_rows(&l.concatenated()?, pad)?,
        None => Vec::new(),
    };
    Ok((
        batch_decode(tokenizer, &preds, None)?,
        batch_decode(tokenizer, &labels, None)?,
        gen_len(&preds, pad),
    ))
}

/// A split ready for the trainer: its rows and the count upstream reports as
/// `{split}_samples`.
pub(crate) struct Split {
    pub(crate) dataset: InMemoryDataset,
    pub(crate) samples: usize,
}

/// What the driver needs besides the datasets.
pub(crate) struct Drive {
    /// Generation options of the final `evaluate` (translation) or none (summarization).
    pub(crate) eval_gen: Option<GenerationConfig>,
    /// Generation options of `predict`.
    pub(crate) predict_gen: Option<GenerationConfig>,
    /// `compute_metrics` (only with `--predict_with_generate`).
    pub(crate) metrics: Option<tchtrain_trainer::ComputeMetrics>,
    /// Use `default_data_collator` (translation with `--pad_to_max_length`).
    pub(crate) default_collator: bool,
    /// `--ignore_pad_token_for_loss`.
    pub(crate) ignore_pad_token_for_loss: bool,
    /// The model card's arguments (`kwargs`), for `push_to_hub` / `create_model_card` at the end.
    pub(crate) card: tchtrain_trainer::ModelCardOptions,
}

/// The scripts' trainer and steps: `DataCollatorForSeq2Seq` given the model (labels
/// padded with -100 unless `--ignore_pad_token_for_loss false`, multiples of 8 with fp16),
/// `Seq2SeqTrainer`, train (`train_samples`, model, state), evaluate (`eval_samples`),
/// predict (`predict_samples`, `predict_results.json`, `generated_predictions.txt`).
pub(crate) fn drive(
    training: &Seq2SeqTrainingArguments,
    loaded: LoadedSeq2Seq,
    train: Option<Split>,
    eval: Option<Split>,
    test: Option<Split>,
    options: Drive,
) -> Result<ExampleOutput> {
    let output_dir = PathBuf::from(training.base.output_dir());
    let LoadedSeq2Seq {
        tokenizer, model, ..
    } = loaded;
    let pad = tokenizer.info().pad_token_id.unwrap_or(0);
    let decoder_start = model.decoder_start()?;
    let mut builder =
        Trainer::builder(model, training.base.clone()).processing_class(tokenizer.clone());
    builder = if options.default_collator {
        builder.data_collator(DefaultDataCollator)
    } else {
        builder.data_collator(DataCollatorForSeq2Seq {
            decoder_start,
            label_pad_token_id: if options.ignore_pad_token_for_loss {
                -100
            } else {
                pad
            },
            pad_to_multiple_of: training.base.fp16.then_some(8),
            ..DataCollatorForSeq2Seq::new(tokenizer.info().clone())
        })
    };
    if let Some(f) = options.metrics {
        builder = builder.compute_metrics(f);
    }
    let n_train = train.as_ref().map(|s| s.samples);
    if let Some(s) = train {
        builder = builder.train_dataset(s.dataset);
    }
    let n_eval = eval.as_ref().map_or(0, |s| s.samples);
    if let Some(s) = eval {
        builder = builder.eval_dataset(s.dataset);
    }
    let mut trainer = Seq2SeqTrainer::new(builder, training)?;
    let mut out = ExampleOutput {
        output_dir: output_dir.clone(),
        ..ExampleOutput::default()
    };
    if training.base.do_train {
        out.train_metrics = Some(common::do_train(&mut trainer, n_train, |_| Ok(()))?);
    }
    if training.base.do_eval {
        log::info!("*** Evaluate ***");
        let mut metrics = trainer.evaluate(None, "eval", options.eval_gen)?;
        metrics.insert("eval_samples".into(), n_eval as f64);
        trainer.log_metrics("eval", &metrics);
        trainer.save_metrics("eval", &metrics, true)?;
        out.eval_metrics = Some(metrics);
    }
    if let Some(s) = test {
        log::info!("*** Predict ***");
        let prediction = trainer.predict(Arc::new(s.dataset), "predict", options.predict_gen)?;
        let mut metrics: Metrics = prediction.metrics;
        metrics.insert("predict_samples".into(), s.samples as f64);
        trainer.log_metrics("predict", &metrics);
        trainer.save_metrics("predict", &metrics, true)?;
        if trainer.is_world_process_zero()
            && training.predict_with_generate
            && let Some(p) = &prediction.predictions
        {
            let rows = unpadded_rows(&p.concatenated()?, pad)?;
            let text: Vec<String> = batch_decode(&tokenizer, &rows, Some(true))?
                .into_iter()
                .map(|t| t.trim_matches(py_isspace).to_string())
                .collect();
            std::fs::create_dir_all(&output_dir)
                .map_err(|e| Error::io("creating", &output_dir, e))?;
            let path = output_dir.join("generated_predictions.txt");
            std::fs::write(&path, text.join("\n")).map_err(|e| Error::io("writing", &path, e))?;
        }
        out.predict_metrics = Some(metrics);
    }
    crate::common::push_or_write_model_card(&mut trainer, options.card)?;
    Ok(out)
}

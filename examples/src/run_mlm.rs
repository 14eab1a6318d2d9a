//! Upstream `examples/pytorch/language-modeling/run_mlm.py`: fine-tunes a masked LM (BERT)
//! on a text file (or the `text` column of a CSV / JSON-lines file).
//!
//! Steps as upstream: the file's lines (the `datasets` text loader: line breaks dropped), a
//! validation split of the first `--validation_split_percentage` % of lines when no
//! `--validation_file` is given; then either `--line_by_line` (each non-blank line one row,
//! truncated to `--max_seq_length`, padded to it with `--pad_to_max_length`) or every line
//! tokenized and `group_texts` cutting the concatenation into `--max_seq_length` blocks
//! (per chunk of 1000 lines, each chunk's remainder dropped); `--max_train_samples` /
//! `--max_eval_samples`; `DataCollatorForLanguageModeling` masking `--mlm_probability` of
//! the tokens (80 % `[MASK]`, 10 % random, 10 % kept); the masked-token accuracy as the
//! evaluation metric (argmax of the logits against the labels that are not -100);
//! `--do_train` saves the model, `train_results.json` and `trainer_state.json`;
//! `--do_eval` adds `perplexity = exp(eval_loss)` and writes `eval_results.json` (both
//! merged into `all_results.json`).
//!
//! One flag upstream's script does not have: `--mlm_seed N` gives the collator its own
//! generator (`DataCollatorForLanguageModeling(seed=N)` upstream, whose masks it
//! reproduces bit for bit); without it the masks come from libtorch's global generator, as
//! upstream's script draws them from torch's.
//!
//! ```no_run
//! use tchtrain_examples::run_mlm;
//! let out = run_mlm::main_with_args([
//!     "--model_name_or_path", "assets/tiny-bert", "--tokenizer_name", "assets/minilm",
//!     "--train_file", "assets/text/hamlet.txt", "--max_seq_length", "64", "--do_train",
//!     "--do_eval", "--max_steps", "10", "--output_dir", "out/mlm",
//! ])?;
//! println!("{:?}", out.eval_metrics);
//! # Ok::<(), tchtrain_examples::Error>(())
//! ```

use std::path::Path;
use std::sync::Arc;

use tch::{Device, Kind, Tensor};
use tchtrain_collators::{DataCollatorForLanguageModeling, Feature, LanguageModelingOptions};
use tchtrain_models::{
    AutoTask, LoadDtype, LoadOptions, Tokenizer, from_pretrained_dir, read_model_type,
};
use tchtrain_training_args::{Dataclass, FieldSpec, TrainingArguments};
use tokenizers::{PaddingParams, PaddingStrategy, TruncationParams};

use super::ExampleOutput;
use super::args::{self, Refusal, ScriptCommandLine, fields, refusals};
use super::common::{self, load_example_tokenizer, tokenizer_json};
use super::peft_args::{self, PeftArguments};
use crate::error::{Error, Result};
use tchtrain_data::{Dataset, InMemoryDataset};
use tchtrain_datasets::DEFAULT_MAP_BATCH_SIZE;
use tchtrain_datasets::{Fingerprint, MapCache, map_cached};
use tchtrain_trainer::Trainer;
use tchtrain_trainer::{EvalPrediction, Metrics};

/// The script's own arguments: upstream's `ModelArguments` and `DataTrainingArguments`
/// (the flags tchtrain honours; see [`COMMAND_LINE`] for the ones it refuses), `--mlm_seed`,
/// and TRL's LoRA flags.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MlmArguments {
    /// `--model_name_or_path`: a model folder or hub id (required here: no training from
    /// scratch).
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
    /// `--dtype`: the dtype the model is loaded in (`auto`, the default as in
    /// transformers 5, reads it from the checkpoint).
    #[serde(default, deserialize_with = "args::from_str")]
    pub dtype: LoadDtype,
    /// `--dataset_name`: a hub dataset repository (or a local folder of data files).
    pub dataset_name: Option<String>,
    /// `--dataset_config_name`: the dataset's configuration.
    pub dataset_config_name: Option<String>,
    /// `--train_file`: `.txt` (one row per line), `.csv` / `.json` / `.jsonl`, `.parquet`.
    pub train_file: Option<String>,
    /// `--validation_file`.
    pub validation_file: Option<String>,
    /// `--overwrite_cache`: tokenize again instead of loading the cached rows
    /// ([`MapCache`](tchtrain_datasets::MapCache)).
    pub overwrite_cache: bool,
    /// `--validation_split_percentage`: the share of lines held out when there is no
    /// validation file (default 5).
    pub validation_split_percentage: usize,
    /// `--max_seq_length`: tokens per row (default `min(1024, model_max_length)`).
    pub max_seq_length: Option<usize>,
    /// `--preprocessing_num_workers`: accepted; tokenization uses every core
    /// (`TCHTRAIN_NUM_PROC`), with the same result.
    pub preprocessing_num_workers: Option<usize>,
    /// `--mlm_probability` (default 0.15).
    pub mlm_probability: f64,
    /// `--line_by_line`: each non-blank line is one row (default: grouped blocks).
    pub line_by_line: bool,
    /// `--pad_to_max_length`: with `--line_by_line`, pad every row to `max_seq_length`.
    pub pad_to_max_length: bool,
    /// `--max_train_samples`: keep the first N training rows.
    pub max_train_samples: Option<usize>,
    /// `--max_eval_samples`: keep the first N evaluation rows.
    pub max_eval_samples: Option<usize>,
    /// `--mlm_seed` (not upstream): seed of the collator's own masking generator.
    pub mlm_seed: Option<u64>,
    /// TRL's LoRA flags (`--use_peft`, `--lora_r`, ...).
    #[serde(skip)]
    pub peft: PeftArguments,
}

impl Default for MlmArguments {
    /// Upstream's defaults (the tables').
    fn default() -> Self {
        let mut mlm: Self =
            args::defaults(&[&MODEL_ARGUMENTS, &DATA_TRAINING_ARGUMENTS, &SEED_ARGUMENTS])
                .unwrap_or_else(|e| unreachable!("run_mlm's defaults read: {e}"));
        mlm.peft = PeftArguments::default();
        mlm
    }
}

/// Upstream's `ModelArguments` of run_mlm.py.
static MODEL_ARGUMENTS: Dataclass = Dataclass {
    name: "ModelArguments",
    fields: &[
        fields::MODEL_NAME_OR_PATH,
        fields::MODEL_TYPE,
        fields::CONFIG_OVERRIDES,
        fields::CONFIG_NAME,
        fields::TOKENIZER_NAME,
        fields::CACHE_DIR,
        fields::USE_FAST_TOKENIZER,
        fields::MODEL_REVISION,
        fields::TOKEN,
        fields::TRUST_REMOTE_CODE,
        fields::DTYPE,
    ],
};

/// Upstream's `DataTrainingArguments` of run_mlm.py.
static DATA_TRAINING_ARGUMENTS: Dataclass = Dataclass {
    name: "DataTrainingArguments",
    fields: &[
        fields::DATASET_NAME,
        fields::DATASET_CONFIG_NAME,
        fields::TRAIN_FILE,
        fields::VALIDATION_FILE,
        fields::OVERWRITE_CACHE,
        fields::VALIDATION_SPLIT_PERCENTAGE,
        FieldSpec::int(
            "max_seq_length",
            "None",
            "The maximum total input sequence length after tokenization (default: min(1024, model_max_length)).",
        ),
        fields::PREPROCESSING_NUM_WORKERS,
        FieldSpec::float(
            "mlm_probability",
            "0.15",
            "Ratio of tokens to mask for masked language modeling loss.",
        ),
        FieldSpec::bool(
            "line_by_line",
            false,
            "Whether distinct lines of text in the dataset are to be handled as distinct sequences.",
        ),
        FieldSpec::bool(
            "pad_to_max_length",
            false,
            "Whether to pad all samples to `max_seq_length` (with --line_by_line).",
        ),
        fields::MAX_TRAIN_SAMPLES,
        fields::MAX_EVAL_SAMPLES,
        FieldSpec::bool(
            "streaming",
            false,
            "Enable streaming mode (refused here: run_clm streams).",
        ),
    ],
};

/// `--mlm_seed` (not upstream).
static SEED_ARGUMENTS: Dataclass = Dataclass {
    name: "tchtrain",
    fields: &[FieldSpec::int(
        "mlm_seed",
        "None",
        "Seed of the collator's own masking generator (DataCollatorForLanguageModeling(seed=N)); default: torch's global generator.",
    )],
};

/// The command line: upstream's dataclasses, `--mlm_seed`, TRL's packing flags (refused)
/// and LoRA flags.
pub const COMMAND_LINE: &[&Dataclass] = &[
    &MODEL_ARGUMENTS,
    &DATA_TRAINING_ARGUMENTS,
    &SEED_ARGUMENTS,
    &args::PACKING_ARGUMENTS,
    &peft_args::LORA_ARGUMENTS,
];

const PACKING_REFUSED: &str = "packing keeps packed documents apart through the causal mask's packed-sequence detection (upstream's `find_packed_sequence_indices`); the encoders' bidirectional attention has none, so packed documents would attend to each other. Use the default grouping (group_texts, which concatenates as upstream does) or --line_by_line with padding; run_clm takes --packing";

const LINE: ScriptCommandLine = ScriptCommandLine {
    title: "run_mlm: masked language modelling (upstream examples/pytorch/language-modeling/run_mlm.py)",
    dataclasses: COMMAND_LINE,
    refused: &[
        refusals::MODEL_TYPE,
        refusals::CONFIG_OVERRIDES,
        refusals::USE_FAST_TOKENIZER,
        refusals::TRUST_REMOTE_CODE,
        Refusal {
            flag: "streaming",
            reason: "run_mlm reads its files whole here; run_clm --streaming streams a training file",
        },
        Refusal {
            flag: "packing",
            reason: PACKING_REFUSED,
        },
        Refusal {
            flag: "packing_strategy",
            reason: PACKING_REFUSED,
        },
    ],
};

/// Parses a command line (without the program name) into the script's flags and
/// `TrainingArguments`.
pub fn parse_args<I, S>(argv: I) -> Result<(MlmArguments, TrainingArguments)>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let (values, training) = args::parse(argv, &LINE)?;
    let mut mlm: MlmArguments = values.take(&[0, 1, 2])?;
    mlm.peft = values.take(&[4])?;
    mlm.peft.check()?;
    if mlm.validation_split_percentage > 100 {
        return Err(Error::InvalidFlag {
            flag: "validation_split_percentage".into(),
            detail: "must be between 0 and 100".into(),
        });
    }
    if !(0.0..=1.0).contains(&mlm.mlm_probability) {
        return Err(Error::InvalidFlag {
            flag: "mlm_probability".into(),
            detail: "must be between 0 and 1".into(),
        });
    }
    Ok((mlm, training))
}

/// Runs the script on `argv` (the command line without the program name).
pub fn main_with_args<I, S>(argv: I) -> Result<ExampleOutput>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let (mlm, training) = parse_args(argv)?;
    run(&mlm, training)
}

/// Python's `str.isspace()` (true for a non-empty all-whitespace string).
fn is_blank(line: &str) -> bool {
    line.chars()
        .all(|c| c.is_whitespace() || ('\x1c'..='\x1f').contains(&c))
}

/// How text becomes rows.
struct Tokenization<'a> {
    tokenizer: &'a Tokenizer,
    with_token_type_ids: bool,
    max_seq_length: usize,
    line_by_line: bool,
    pad_to_max_length: bool,
    pad_id: u32,
    overwrite_cache: bool,
}

impl Tokenization<'_> {
    fn encode(&self, tokenizer: &Tokenizer, line: &str, index: usize) -> Result<Feature> {
        let enc = tokenizer.encode(line, true).map_err(|e| Error::Tokenizer {
            what: format!("line {}", index + 1),
            detail: e.to_string(),
        })?;
        let mut f = Feature::from_encoding(&enc, self.with_token_type_ids);
        f.offset_mapping = None;
        Ok(f)
    }

    /// Upstream's `tokenize_function` (+ `group_texts` unless line by line), then the
    /// first `max_samples` rows. The rows come from the dataset cache when an earlier run
    /// prepared the same lines with the same tokenizer and settings.
    fn rows(&self, lines: &[String], max_samples: Option<usize>) -> Result<InMemoryDataset> {
        let mut fingerprint = Fingerprint::new("run_mlm.tokenize_function");
        fingerprint
            .update(tokenizer_json(self.tokenizer)?)
            .update(format!(
                "{} {} {} {} {}",
                self.with_token_type_ids,
                self.max_seq_length,
                self.line_by_line,
                self.pad_to_max_length,
                self.pad_id
            ));
        for line in lines {
            fingerprint.update(line);
        }
        let cache = MapCache::from_env()?;
        let rows = map_cached(cache.as_ref(), &fingerprint, self.overwrite_cache, || {
            self.tokenize(lines)
        })?;
        let ds = InMemoryDataset::new(rows);
        Ok(match max_samples {
            Some(n) => ds.take(n),
            None => ds,
        })
    }

    /// [`rows`](Self::rows) without the cache.
    fn tokenize(&self, lines: &[String]) -> Result<Vec<Feature>> {
        Ok(if self.line_by_line {
            let mut tok = self.tokenizer.clone();
            tok.with_truncation(Some(TruncationParams {
                max_length: self.max_seq_length,
                ..TruncationParams::default()
            }))
            .map_err(|e| Error::Tokenizer {
                what: "settings".into(),
                detail: e.to_string(),
            })?;
            if self.pad_to_max_length {
                tok.with_padding(Some(PaddingParams {
                    strategy: PaddingStrategy::Fixed(self.max_seq_length),
                    pad_id: self.pad_id,
                    ..PaddingParams::default()
                }));
            }
            lines
                .iter()
                .enumerate()
                .filter(|(_, l)| !is_blank(l))
                .map(|(i, l)| self.encode(&tok, l, i))
                .collect::<Result<Vec<_>>>()?
        } else {
            let tokenized = lines
                .iter()
                .enumerate()
                .map(|(i, l)| self.encode(self.tokenizer, l, i))
                .collect::<Result<Vec<_>>>()?;
            group_features(&tokenized, self.max_seq_length)
        })
    }
}

/// run_mlm's `group_texts` through `map(batched=True)`: per chunk of 1000 tokenized lines,
/// every field concatenated and cut into `block` long rows, the remainder dropped.
fn group_features(rows: &[Feature], block: usize) -> Vec<Feature> {
    fn cat(rows: &[Feature], field: impl Fn(&Feature) -> Option<&Vec<i64>>) -> Option<Vec<i64>> {
        rows.iter()
            .map(|r| field(r).cloned())
            .collect::<Option<Vec<_>>>()
            .map(|v| v.concat())
    }
    fn cut(v: &Option<Vec<i64>>, at: usize, block: usize) -> Option<Vec<i64>> {
        v.as_ref().map(|v| v[at..at + block].to_vec())
    }
    let mut out = Vec::new();
    for chunk in rows.chunks(DEFAULT_MAP_BATCH_SIZE) {
        let ids: Vec<i64> = chunk.iter().flat_map(|r| r.input_ids.clone()).collect();
        let types = cat(chunk, |r| r.token_type_ids.as_ref());
        let mask = cat(chunk, |r| r.attention_mask.as_ref());
        let special = cat(chunk, |r| r.special_tokens_mask.as_ref());
        let total = ids.len() / block * block;
        for at in (0..total).step_by(block) {
            out.push(Feature {
                input_ids: ids[at..at + block].to_vec(),
                token_type_ids: cut(&types, at, block),
                attention_mask: cut(&mask, at, block),
                special_tokens_mask: cut(&special, at, block),
                ..Feature::default()
            });
        }
    }
    out
}

/// Upstream's `compute_metrics`: accuracy of the argmax ids (from
/// `preprocess_logits_for_metrics`) where the label is not -100.
fn masked_accuracy(p: &EvalPrediction) -> tchtrain_trainer::Result<Metrics> {
    let mut m = Metrics::new();
    let Some(labels) = &p.label_ids else {
        return Ok(m);
    };
    let labels = labels.array()?.f_reshape([-1])?;
    let preds = p.predictions.array()?.f_reshape([-1])?;
    let valid = labels.f_ne(-100)?;
    let correct = preds
        .f_eq_tensor(&labels)?
        .f_logical_and(&valid)?
        .f_sum(Kind::Int64)?
        .f_int64_value(&[])?;
    let total = valid.f_sum(Kind::Int64)?.f_int64_value(&[])?;
    m.insert("accuracy".into(), correct as f64 / total.max(1) as f64);
    Ok(m)
}

/// Runs the script with parsed arguments.
pub fn run(mlm: &MlmArguments, training: TrainingArguments) -> Result<ExampleOutput> {
    let output_dir = Path::new(training.output_dir()).to_path_buf();
    if !training.do_train && !training.do_eval {
        log::warn!("neither --do_train nor --do_eval was given: nothing to do");
    }
    let (hub, dir) = common::resolve_model!(mlm)?;
    let tok = load_example_tokenizer(&dir, mlm.tokenizer_name.as_deref(), &hub)?;
    let model_max_length = tok.info().model_max_length.unwrap_or(usize::MAX);
    let max_seq_length = match mlm.max_seq_length {
        None => {
            if model_max_length > 1024 {
                log::warn!(
                    "The tokenizer picked seems to have a very large `model_max_length` ({model_max_length}). Picking 1024 instead. You can change that default value by passing --max_seq_length xxx."
                );
            }
            model_max_length.min(1024)
        }
        Some(n) => {
            if n > model_max_length {
                log::warn!(
                    "The max_seq_length passed ({n}) is larger than the maximum length for the model ({model_max_length}). Using max_seq_length={model_max_length}."
                );
            }
            n.min(model_max_length)
        }
    };
    if max_seq_length == 0 {
        return Err(Error::InvalidFlag {
            flag: "max_seq_length".into(),
            detail: "must be at least 1".into(),
        });
    }

    let dataset = match &mlm.dataset_name {
        Some(name) => Some(common::dataset_text_splits(
            name,
            mlm.dataset_config_name.as_deref(),
            mlm.token.as_deref(),
            mlm.validation_split_percentage,
        )?),
        None => None,
    };
    let has_train = mlm.train_file.is_some() || dataset.as_ref().is_some_and(|d| d.0.is_some());
    let (train_lines, eval_lines) = match (&mlm.train_file, &mlm.validation_file) {
        _ if dataset.is_some() => {
            let (train, eval) = dataset.unwrap_or_default();
            (train.unwrap_or_default(), eval)
        }
        (None, None) => {
            return Err(Error::InvalidFlag {
                flag: "train_file".into(),
                detail: "Need either a dataset name or a training/validation file (--train_file, --validation_file)".into(),
            });
        }
        (Some(train), Some(valid)) => (
            common::read_text_rows(train, false)?,
            common::read_text_rows(valid, false)?,
        ),
        (Some(train), None) => {
            let mut lines = common::read_text_rows(train, false)?;
            let cut = common::split_boundary(mlm.validation_split_percentage, lines.len());
            let train_part = lines.split_off(cut);
            (train_part, lines)
        }
        (None, Some(valid)) => (Vec::new(), common::read_text_rows(valid, false)?),
    };

    let tokenization = Tokenization {
        tokenizer: tok.tokenizer(),
        with_token_type_ids: read_model_type(&dir.join("config.json"))? == "bert",
        max_seq_length,
        line_by_line: mlm.line_by_line,
        pad_to_max_length: mlm.pad_to_max_length,
        pad_id: tok.info().pad_token_id.unwrap_or(0).max(0) as u32,
        overwrite_cache: mlm.overwrite_cache,
    };
    // Upstream's Trainer drops the `special_tokens_mask` column (the model's forward does
    // not take it) unless `remove_unused_columns` is off: the collator then finds the
    // special tokens from the tokenizer's special ids.
    let prepare = |lines: &[String], max: Option<usize>| -> Result<InMemoryDataset> {
        let ds = tokenization.rows(lines, max)?;
        if !training.remove_unused_columns {
            return Ok(ds);
        }
        Ok(InMemoryDataset::new(
            ds.rows()
                .iter()
                .cloned()
                .map(|mut f| {
                    f.special_tokens_mask = None;
                    f
                })
                .collect(),
        ))
    };
    let train_ds = if training.do_train {
        if !has_train {
            return Err(Error::InvalidFlag {
                flag: "train_file".into(),
                detail: "--do_train requires a train file".into(),
            });
        }
        let ds = prepare(&train_lines, mlm.max_train_samples)?;
        if ds.is_empty() {
            return Err(Error::EmptyDataset {
                what: "training",
                hint: format!(
                    ": fewer than max_seq_length = {max_seq_length} tokens per 1000 lines (or no non-blank line with --line_by_line)"
                ),
            });
        }
        Some(ds)
    } else {
        None
    };
    let eval_ds = if training.do_eval {
        let ds = prepare(&eval_lines, mlm.max_eval_samples)?;
        if ds.is_empty() {
            return Err(Error::EmptyDataset {
                what: "evaluation",
                hint: format!(
                    ": the validation text has fewer than max_seq_length = {max_seq_length} tokens; raise --validation_split_percentage or lower --max_seq_length"
                ),
            });
        }
        Some(ds)
    } else {
        None
    };

    let loaded = from_pretrained_dir(
        &dir,
        AutoTask::MaskedLm,
        Device::Cpu,
        &LoadOptions {
            dtype: mlm.dtype,
            quantization_config: mlm.peft.quantization_config(mlm.dtype)?,
            ..LoadOptions::default()
        },
    )?;
    if !loaded.info.is_clean() {
        log::warn!("loading {}: {:?}", dir.display(), loaded.info);
    }
    let pad_to_multiple_of_8 = mlm.line_by_line && training.fp16 && !mlm.pad_to_max_length;
    let collator = DataCollatorForLanguageModeling::new(
        tok.info().clone(),
        LanguageModelingOptions {
            mlm_probability: mlm.mlm_probability,
            pad_to_multiple_of: pad_to_multiple_of_8.then_some(8),
            seed: mlm.mlm_seed,
            ..LanguageModelingOptions::default()
        },
    )?;
    let n_train = train_ds.as_ref().map_or(0, InMemoryDataset::len);
    let n_eval = eval_ds.as_ref().map_or(0, InMemoryDataset::len);
    // TRL: `get_peft_model(model, peft_config)` on the loaded model.
    let model = mlm
        .peft
        .wrap(loaded.model, mlm.model_name_or_path.as_deref())?;
    let mut builder = Trainer::builder(model, training.clone())
        .processing_class(tok.clone())
        .data_collator(collator);
    if let Some(ds) = train_ds {
        builder = builder.train_dataset(Arc::new(ds));
    }
    if let Some(ds) = eval_ds {
        builder = builder
            .eval_dataset(Arc::new(ds))
            .preprocess_logits_for_metrics(|logits: &Tensor, _: Option<&Tensor>| {
                Ok(logits.f_argmax(-1, false)?)
            })
            .compute_metrics(masked_accuracy);
    }
    let mut trainer = builder.build()?;
    let mut out = ExampleOutput {
        output_dir: output_dir.clone(),
        ..ExampleOutput::default()
    };

    if training.do_train {
        out.train_metrics = Some(common::do_train(&mut trainer, Some(n_train), |_| Ok(()))?);
    }

    if training.do_eval {
        out.eval_metrics = Some(common::do_eval(&mut trainer, n_eval, true)?);
    }
    let card = common::card_options(
        mlm.model_name_or_path.as_deref(),
        "fill-mask",
        mlm.dataset_name.as_deref(),
        mlm.dataset_config_name.as_deref(),
    );
    common::push_or_write_model_card(&mut trainer, card)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_texts_keeps_every_field_aligned() {
        let row = |ids: Vec<i64>| Feature {
            token_type_ids: Some(vec![0; ids.len()]),
            attention_mask: Some(vec![1; ids.len()]),
            special_tokens_mask: Some(
                ids.iter()
                    .map(|&i| i64::from(i == 101 || i == 102))
                    .collect(),
            ),
            input_ids: ids,
            ..Feature::default()
        };
        let rows = [
            row(vec![101, 5, 6, 102]),
            row(vec![101, 102]),
            row(vec![101, 7, 102]),
        ];
        let blocks = group_features(&rows, 4);
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[1].input_ids, [101, 102, 101, 7]);
        assert_eq!(blocks[1].special_tokens_mask, Some(vec![1, 1, 1, 0]));
        assert_eq!(blocks[1].attention_mask, Some(vec![1; 4]));
        assert!(blocks[1].labels.is_none());
    }

    #[test]
    fn blank_lines_as_python_isspace() {
        assert!(is_blank(" \t\x1c"));
        assert!(!is_blank(" a "));
        assert_eq!(common::split_boundary(10, 300), 30);
        let (mlm, t) = parse_args([
            "--line_by_line",
            "--mlm_probability",
            "0.2",
            "--mlm_seed=7",
            "--overwrite_cache",
            "--max_steps",
            "2",
        ])
        .unwrap();
        assert!(mlm.line_by_line);
        assert_eq!((mlm.mlm_probability, mlm.mlm_seed), (0.2, Some(7)));
        assert_eq!(t.max_steps, 2);
        assert!(parse_args(["--mlm_probability", "2"]).is_err());
    }
}

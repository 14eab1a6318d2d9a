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
use tchtrain_training_args::TrainingArguments;
use tokenizers::{PaddingParams, PaddingStrategy, TruncationParams};

use super::ExampleOutput;
use super::args::{self, ScriptFlags};
use super::common::{self, load_example_tokenizer, tokenizer_json};
use super::peft_args::{self, PeftArguments};
use crate::error::{Error, Result};
use tchtrain_data::{Dataset, InMemoryDataset};
use tchtrain_datasets::DEFAULT_MAP_BATCH_SIZE;
use tchtrain_datasets::{Fingerprint, MapCache, map_cached};
use tchtrain_trainer::Trainer;
use tchtrain_trainer::{EvalPrediction, Metrics};

/// The script's own flags (upstream's `ModelArguments` and `DataTrainingArguments`).
#[derive(Debug, Clone, PartialEq)]
pub struct MlmArguments {
    /// `--model_name_or_path`: a model folder or hub id (required).
    pub model_name_or_path: Option<String>,
    /// `--dtype` (v4 `--torch_dtype`): the dtype the model is loaded in (`auto`, the
    /// default as in transformers 5, reads it from the checkpoint).
    pub dtype: LoadDtype,
    /// `--config_name`: only the model folder itself is supported.
    pub config_name: Option<String>,
    /// `--tokenizer_name`: a tokenizer folder when the model folder has none.
    pub tokenizer_name: Option<String>,
    /// `--train_file`: `.txt` (one row per line), `.csv` / `.json` / `.jsonl`.
    pub train_file: Option<String>,
    /// `--validation_file`.
    pub validation_file: Option<String>,
    /// `--validation_split_percentage`: the share of lines held out when there is no
    /// validation file (default 5).
    pub validation_split_percentage: usize,
    /// `--max_seq_length`: tokens per row (default `min(1024, model_max_length)`).
    pub max_seq_length: Option<usize>,
    /// `--line_by_line`: each non-blank line is one row (default: grouped blocks).
    pub line_by_line: bool,
    /// `--pad_to_max_length`: with `--line_by_line`, pad every row to `max_seq_length`.
    pub pad_to_max_length: bool,
    /// `--mlm_probability` (default 0.15).
    pub mlm_probability: f64,
    /// `--mlm_seed` (not upstream): seed of the collator's own masking generator.
    pub mlm_seed: Option<u64>,
    /// `--max_train_samples`: keep the first N training rows.
    pub max_train_samples: Option<usize>,
    /// `--max_eval_samples`: keep the first N evaluation rows.
    pub max_eval_samples: Option<usize>,
    /// `--overwrite_cache`: tokenize again instead of loading the cached rows
    /// ([`MapCache`](tchtrain_datasets::MapCache)).
    pub overwrite_cache: bool,
    /// TRL's LoRA flags (`--use_peft`, `--lora_r`, ...).
    pub peft: PeftArguments,
}

impl Default for MlmArguments {
    fn default() -> Self {
        Self {
            model_name_or_path: None,
            dtype: LoadDtype::Auto,
            config_name: None,
            tokenizer_name: None,
            train_file: None,
            validation_file: None,
            validation_split_percentage: 5,
            max_seq_length: None,
            line_by_line: false,
            pad_to_max_length: false,
            mlm_probability: 0.15,
            mlm_seed: None,
            max_train_samples: None,
            max_eval_samples: None,
            overwrite_cache: false,
            peft: PeftArguments::default(),
        }
    }
}

const HELP: &str = "\
run_mlm: masked language modelling (upstream examples/pytorch/language-modeling/run_mlm.py)

script flags:
  --model_name_or_path PATH   model folder or hub id (required)
  --dtype auto|bfloat16|float16|float32
                              load the model in this dtype (default: auto, the checkpoint's)
  --tokenizer_name PATH       tokenizer folder (tokenizer.json)
  --train_file FILE           .txt, .csv, .json or .jsonl training text
  --validation_file FILE      evaluation text (default: a split of the training file)
  --validation_split_percentage N
                              % of training lines held out without a validation file (default: 5)
  --max_seq_length N          tokens per row (default: min(1024, model_max_length))
  --line_by_line BOOL         each non-blank line is a row (default: lines grouped into blocks)
  --pad_to_max_length BOOL    with --line_by_line, pad every row to max_seq_length
  --mlm_probability P         share of tokens masked (default: 0.15)
  --mlm_seed N                seed of the masking generator (not upstream; default: torch's)
  --max_train_samples N       keep the first N training rows
  --max_eval_samples N        keep the first N evaluation rows
  --overwrite_cache [BOOL]    tokenize again instead of loading the cached rows
  --preprocessing_num_workers N
                              accepted for upstream's command lines; no effect here
";

impl ScriptFlags for MlmArguments {
    fn apply(&mut self, name: &str, value: Option<&str>) -> Result<bool> {
        match name {
            "model_name_or_path" => self.model_name_or_path = Some(args::string(name, value)?),
            "dtype" | "torch_dtype" => {
                self.dtype = LoadDtype::parse(&args::string(name, value)?).map_err(|e| {
                    Error::InvalidFlag {
                        flag: name.into(),
                        detail: e.to_string(),
                    }
                })?
            }
            "config_name" => self.config_name = Some(args::string(name, value)?),
            "tokenizer_name" => self.tokenizer_name = Some(args::string(name, value)?),
            "train_file" => self.train_file = Some(args::string(name, value)?),
            "validation_file" => self.validation_file = Some(args::string(name, value)?),
            "validation_split_percentage" => {
                self.validation_split_percentage = args::number(name, value)?;
                if self.validation_split_percentage > 100 {
                    return Err(Error::InvalidFlag {
                        flag: name.into(),
                        detail: "must be between 0 and 100".into(),
                    });
                }
            }
            "max_seq_length" => self.max_seq_length = Some(args::number(name, value)?),
            "line_by_line" => self.line_by_line = args::boolean(name, value)?,
            "pad_to_max_length" => self.pad_to_max_length = args::boolean(name, value)?,
            "mlm_probability" => {
                self.mlm_probability = args::number(name, value)?;
                if !(0.0..=1.0).contains(&self.mlm_probability) {
                    return Err(Error::InvalidFlag {
                        flag: name.into(),
                        detail: "must be between 0 and 1".into(),
                    });
                }
            }
            "mlm_seed" => self.mlm_seed = Some(args::number(name, value)?),
            "max_train_samples" => self.max_train_samples = Some(args::number(name, value)?),
            "max_eval_samples" => self.max_eval_samples = Some(args::number(name, value)?),
            "overwrite_cache" => self.overwrite_cache = args::boolean(name, value)?,
            "preprocessing_num_workers" => {
                args::number::<usize>(name, value)?;
            }
            "packing" | "packing_strategy" => {
                return Err(Error::InvalidFlag {
                    flag: name.into(),
                    detail: "packing keeps packed documents apart through the causal mask's packed-sequence detection (upstream's `find_packed_sequence_indices`); the encoders' bidirectional attention has none, so packed documents would attend to each other. Use the default grouping (group_texts, which concatenates as upstream does) or --line_by_line with padding; run_clm takes --packing".into(),
                });
            }
            _ => return self.peft.apply(name, value),
        }
        Ok(true)
    }
    fn list_flags(&self) -> &'static [&'static str] {
        &peft_args::LIST_FLAGS
    }
}

/// Parses a command line (without the program name) into the script's flags and
/// `TrainingArguments`.
pub fn parse_args<I, S>(argv: I) -> Result<(MlmArguments, TrainingArguments)>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut mlm = MlmArguments::default();
    let training = args::parse(argv, &format!("{HELP}\n{}", peft_args::HELP), &mut mlm)?;
    mlm.peft.check()?;
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
    let dir = common::model_dir(mlm.model_name_or_path.as_deref())?;
    if let Some(c) = &mlm.config_name
        && Path::new(c) != dir
    {
        return Err(Error::InvalidFlag {
            flag: "config_name".into(),
            detail: "a config apart from the model folder is not supported; put it in --model_name_or_path".into(),
        });
    }
    let tok = load_example_tokenizer(&dir, mlm.tokenizer_name.as_deref())?;
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

    let (train_lines, eval_lines) = match (&mlm.train_file, &mlm.validation_file) {
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
        if mlm.train_file.is_none() {
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

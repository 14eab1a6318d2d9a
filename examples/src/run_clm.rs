//! Upstream `examples/pytorch/language-modeling/run_clm.py`: fine-tunes a causal LM on a
//! text file (or the `text` column of a CSV / JSON-lines file).
//!
//! Steps as upstream: the file's lines (`--keep_linebreaks`, default true), a validation
//! split of the first `--validation_split_percentage` % of lines when no
//! `--validation_file` is given, tokenization, `group_texts` into `--block_size` blocks,
//! `--max_train_samples` / `--max_eval_samples`; `Trainer` with next-token accuracy as the
//! evaluation metric; `--do_train` saves the model, `train_results.json` and
//! `trainer_state.json`; `--do_eval` adds `perplexity = exp(eval_loss)` and writes
//! `eval_results.json` (both merged into `all_results.json`).
//!
//! `--packing` (TRL's `SFTConfig.packing`, not in upstream's script) replaces `group_texts`
//! with TRL's `pack_dataset` (`--packing_strategy bfd` or `bfd_split`) and TRL's
//! padding-free collator: each document stays whole and attends only within itself.
//!
//! ```no_run
//! use tchtrain_examples::run_clm;
//! let out = run_clm::main_with_args([
//!     "--model_name_or_path", "assets/tiny-gpt2", "--tokenizer_name", "assets/gpt2-tokenizer",
//!     "--train_file", "assets/text/hamlet.txt", "--block_size", "64", "--do_train", "--do_eval",
//!     "--max_steps", "10", "--output_dir", "out/clm",
//! ])?;
//! println!("{:?}", out.eval_metrics);
//! # Ok::<(), tchtrain_examples::Error>(())
//! ```

use std::path::Path;
use std::sync::Arc;

use tch::{Device, Kind, Tensor};
use tchtrain_collators::{DataCollatorWithFlattening, DefaultDataCollator, Feature};
use tchtrain_models::{AutoTask, LoadDtype, LoadOptions, Tokenizer, from_pretrained_dir};
use tchtrain_training_args::{Dataclass, FieldSpec, TrainingArguments};

use super::ExampleOutput;
use super::args::{self, ScriptCommandLine, fields, refusals};
use super::common::{self, load_example_tokenizer, tokenizer_json};
use super::peft_args::{self, PeftArguments};
use crate::error::{Error, Result};
use tchtrain_data::{Dataset, InMemoryDataset};
use tchtrain_datasets::{
    CausalLmTextStream, PackingStrategy, group_texts, pack_dataset, tokenize_lines,
};
use tchtrain_datasets::{Fingerprint, MapCache, map_cached};
use tchtrain_trainer::Trainer;
use tchtrain_trainer::{EvalPrediction, Metrics};

/// The script's own arguments: upstream's `ModelArguments` and `DataTrainingArguments`
/// (the flags tchtrain honours; see [`COMMAND_LINE`] for the ones it refuses), TRL's packing
/// flags, and TRL's LoRA flags.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClmArguments {
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
    /// `--max_train_samples`: keep the first N training blocks.
    pub max_train_samples: Option<usize>,
    /// `--max_eval_samples`: keep the first N evaluation blocks.
    pub max_eval_samples: Option<usize>,
    /// `--streaming`: read the training file as a stream (1000 lines at a time, as the
    /// training goes); needs `--max_steps`.
    pub streaming: bool,
    /// `--block_size`: tokens per training row (default `min(1024, model_max_length)`).
    pub block_size: Option<usize>,
    /// `--overwrite_cache`: tokenize again instead of loading the cached tokens
    /// ([`MapCache`](tchtrain_datasets::MapCache)).
    pub overwrite_cache: bool,
    /// `--validation_split_percentage`: the share of lines held out when there is no
    /// validation file (default 5).
    pub validation_split_percentage: usize,
    /// `--preprocessing_num_workers`: accepted; tokenization uses every core
    /// (`TCHTRAIN_NUM_PROC`), with the same result.
    pub preprocessing_num_workers: Option<usize>,
    /// `--keep_linebreaks`: keep line breaks in `.txt` rows (default true).
    pub keep_linebreaks: bool,
    /// `--packing` (TRL's `SFTConfig.packing`): pack the tokenized rows into rows of at most
    /// `--block_size` tokens instead of `group_texts`' blocks, each document kept whole and
    /// attending only within itself (`position_ids` restarting per document, padding-free
    /// batches as TRL's collator makes them).
    pub packing: bool,
    /// `--packing_strategy` (TRL's, default `bfd`): `bfd` truncates a row longer than a
    /// block, `bfd_split` splits it into blocks.
    #[serde(deserialize_with = "args::from_str")]
    pub packing_strategy: PackingStrategy,
    /// TRL's LoRA flags (`--use_peft`, `--lora_r`, ...).
    #[serde(skip)]
    pub peft: PeftArguments,
}

impl Default for ClmArguments {
    /// Upstream's defaults (the tables').
    fn default() -> Self {
        let mut clm: Self = args::defaults(&COMMAND_LINE[..3])
            .unwrap_or_else(|e| unreachable!("run_clm's defaults read: {e}"));
        clm.peft = PeftArguments::default();
        clm
    }
}

/// Upstream's `ModelArguments` of run_clm.py.
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

/// Upstream's `DataTrainingArguments` of run_clm.py.
static DATA_TRAINING_ARGUMENTS: Dataclass = Dataclass {
    name: "DataTrainingArguments",
    fields: &[
        fields::DATASET_NAME,
        fields::DATASET_CONFIG_NAME,
        fields::TRAIN_FILE,
        fields::VALIDATION_FILE,
        fields::MAX_TRAIN_SAMPLES,
        fields::MAX_EVAL_SAMPLES,
        FieldSpec::bool(
            "streaming",
            false,
            "Enable streaming mode: the training file is read as the training goes.",
        ),
        FieldSpec::int(
            "block_size",
            "None",
            "Optional input sequence length after tokenization (default: the model max input length for single sentence inputs).",
        ),
        fields::OVERWRITE_CACHE,
        fields::VALIDATION_SPLIT_PERCENTAGE,
        fields::PREPROCESSING_NUM_WORKERS,
        FieldSpec::bool(
            "keep_linebreaks",
            true,
            "Whether to keep line breaks when using TXT files or not.",
        ),
    ],
};

/// The command line: upstream's dataclasses, TRL's packing and LoRA flags, and the flags
/// refused.
pub const COMMAND_LINE: &[&Dataclass] = &[
    &MODEL_ARGUMENTS,
    &DATA_TRAINING_ARGUMENTS,
    &args::PACKING_ARGUMENTS,
    &peft_args::LORA_ARGUMENTS,
];

const LINE: ScriptCommandLine = ScriptCommandLine {
    title: "run_clm: causal language modelling (upstream examples/pytorch/language-modeling/run_clm.py)",
    dataclasses: COMMAND_LINE,
    refused: &[
        refusals::MODEL_TYPE,
        refusals::CONFIG_OVERRIDES,
        refusals::USE_FAST_TOKENIZER,
        refusals::TRUST_REMOTE_CODE,
    ],
};

/// Parses a command line (without the program name) into the script's flags and
/// `TrainingArguments`.
pub fn parse_args<I, S>(argv: I) -> Result<(ClmArguments, TrainingArguments)>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let (values, training) = args::parse(argv, &LINE)?;
    let mut clm: ClmArguments = values.take(&[0, 1, 2])?;
    clm.peft = values.take(&[3])?;
    clm.peft.check()?;
    if clm.validation_split_percentage > 100 {
        return Err(Error::InvalidFlag {
            flag: "validation_split_percentage".into(),
            detail: "must be between 0 and 100".into(),
        });
    }
    if clm.packing_strategy == PackingStrategy::Wrapped {
        return Err(Error::InvalidFlag {
            flag: "packing_strategy".into(),
            detail: "`wrapped` concatenates the rows and cuts them every block, document boundaries ignored: that is run_clm's default grouping (group_texts); leave out --packing for it".into(),
        });
    }
    Ok((clm, training))
}

/// Tokenized, grouped blocks of `lines` (or, with `packing`, the rows packed into blocks
/// by TRL's `pack_dataset`, their documents' lengths in `seq_lengths`), the first
/// `max_samples` kept. The tokens come from the dataset cache when an earlier run tokenized
/// the same lines with the same tokenizer.
fn blocks(
    lines: &[String],
    tokenizer: &Tokenizer,
    block_size: usize,
    max_samples: Option<usize>,
    overwrite_cache: bool,
    packing: Option<PackingStrategy>,
) -> Result<InMemoryDataset> {
    let mut fingerprint = Fingerprint::new("run_clm.tokenize_function");
    fingerprint.update(tokenizer_json(tokenizer)?);
    for line in lines {
        fingerprint.update(line);
    }
    let cache = MapCache::from_env()?;
    let rows = map_cached(cache.as_ref(), &fingerprint, overwrite_cache, || {
        Ok::<_, Error>(
            tokenize_lines(tokenizer, lines)?
                .into_iter()
                .map(Feature::new)
                .collect(),
        )
    })?;
    let ids: Vec<Vec<i64>> = rows.into_iter().map(|r| r.input_ids).collect();
    let ds = match packing {
        None => InMemoryDataset::new(group_texts(&ids, block_size, None)?),
        Some(strategy) => {
            // TRL: `pack_dataset(dataset, max_length, strategy, map_kwargs)` with `datasets`'
            // default batch of 1000 rows.
            let packed = pack_dataset(&[ids], block_size, strategy, 1000)?;
            let lengths = packed.seq_lengths.unwrap_or_default();
            let rows = packed.columns.into_iter().next().unwrap_or_default();
            InMemoryDataset::new(
                rows.into_iter()
                    .zip(lengths)
                    .map(|(input_ids, seq_lengths)| Feature {
                        input_ids,
                        seq_lengths: Some(seq_lengths),
                        ..Feature::default()
                    })
                    .collect(),
            )
        }
    };
    Ok(match max_samples {
        Some(n) => ds.take(n),
        None => ds,
    })
}

/// Upstream's `compute_metrics`: next-token accuracy, predictions (argmax ids) shifted
/// against the labels; label `-100` is left out.
fn next_token_accuracy(p: &EvalPrediction) -> tchtrain_trainer::Result<Metrics> {
    let mut m = Metrics::new();
    let Some(labels) = &p.label_ids else {
        return Ok(m);
    };
    let labels = labels.array()?;
    let len = labels.size().last().copied().unwrap_or(0);
    if len < 2 {
        return Ok(m);
    }
    let labels = labels.f_narrow(-1, 1, len - 1)?;
    let preds = p.predictions.array()?.f_narrow(-1, 0, len - 1)?;
    let valid = labels.f_ne(-100)?;
    let correct = preds
        .f_eq_tensor(&labels)?
        .f_logical_and(&valid)?
        .f_sum(Kind::Int64)?
        .f_int64_value(&[])?;
    let total = valid.f_sum(Kind::Int64)?.f_int64_value(&[])?;
    m.insert("accuracy".into(), correct as f64 / (total.max(1)) as f64);
    Ok(m)
}

/// What `--streaming` needs: a `.txt` training file with line breaks kept, `--max_steps`,
/// and a `--validation_file` for evaluation (a stream has no length to hold a share out of).
fn check_streaming(clm: &ClmArguments, training: &TrainingArguments) -> Result<()> {
    let refuse = |flag: &str, detail: &str| {
        Err(Error::InvalidFlag {
            flag: flag.into(),
            detail: detail.into(),
        })
    };
    if training.do_train {
        match &clm.train_file {
            Some(f) if f.ends_with(".txt") || f.ends_with(".parquet") => {}
            _ => {
                return refuse(
                    "streaming",
                    "streams a .txt or .parquet --train_file (a Parquet file one row group at a time); load CSV / JSON files without --streaming",
                );
            }
        }
        if training.max_steps <= 0 {
            return refuse(
                "max_steps",
                "must be set to a positive value with --streaming (a stream has no length)",
            );
        }
        if clm.max_train_samples.is_some() {
            return refuse(
                "max_train_samples",
                "is not supported with --streaming: limit the training with --max_steps",
            );
        }
        if !clm.keep_linebreaks {
            return refuse(
                "keep_linebreaks",
                "--streaming keeps line breaks (as the text loader does by default)",
            );
        }
    }
    if training.do_eval && clm.validation_file.is_none() {
        return refuse(
            "validation_file",
            "--do_eval with --streaming needs a --validation_file: a share of a stream cannot be held out",
        );
    }
    Ok(())
}

/// Runs the script on `argv` (the command line without the program name).
pub fn main_with_args<I, S>(argv: I) -> Result<ExampleOutput>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let (clm, training) = parse_args(argv)?;
    run(&clm, training)
}

/// Runs the script with parsed arguments.
pub fn run(clm: &ClmArguments, training: TrainingArguments) -> Result<ExampleOutput> {
    let output_dir = Path::new(training.output_dir()).to_path_buf();
    if !training.do_train && !training.do_eval {
        log::warn!("neither --do_train nor --do_eval was given: nothing to do");
    }
    let (hub, dir) = common::resolve_model!(clm)?;
    let tok = load_example_tokenizer(&dir, clm.tokenizer_name.as_deref(), &hub)?;
    let model_max_length = tok.info().model_max_length.unwrap_or(usize::MAX);
    let block_size = match clm.block_size {
        None => {
            if model_max_length > 1024 {
                log::warn!(
                    "The tokenizer picked seems to have a very large `model_max_length` ({model_max_length}); using block_size 1024 (override with --block_size)."
                );
            }
            model_max_length.min(1024)
        }
        Some(b) => {
            if b > model_max_length {
                log::warn!(
                    "The block_size passed ({b}) is larger than the maximum length for the model ({model_max_length}). Using block_size={model_max_length}."
                );
            }
            b.min(model_max_length)
        }
    };

    if clm.streaming {
        check_streaming(clm, &training)?;
        if clm.packing {
            return Err(Error::InvalidFlag {
                flag: "packing".into(),
                detail: "packs a loaded dataset (best fit needs every row of a batch of 1000); leave out --streaming or --packing".into(),
            });
        }
    }
    let packing = clm.packing.then_some(clm.packing_strategy);
    let dataset = match &clm.dataset_name {
        Some(name) if clm.streaming => {
            return Err(Error::InvalidFlag {
                flag: "streaming".into(),
                detail: format!(
                    "streams a local --train_file; load {name} without --streaming (its files are read from the hub cache)"
                ),
            });
        }
        Some(name) => Some(common::dataset_text_splits(
            name,
            clm.dataset_config_name.as_deref(),
            clm.token.as_deref(),
            clm.validation_split_percentage,
        )?),
        None => None,
    };
    let has_train = clm.train_file.is_some() || dataset.as_ref().is_some_and(|d| d.0.is_some());
    let (train_lines, eval_lines) = match (&clm.train_file, &clm.validation_file) {
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
        (Some(_), Some(valid)) if clm.streaming => (
            Vec::new(),
            common::read_text_rows(valid, clm.keep_linebreaks)?,
        ),
        (Some(train), Some(valid)) => (
            common::read_text_rows(train, clm.keep_linebreaks)?,
            common::read_text_rows(valid, clm.keep_linebreaks)?,
        ),
        (Some(train), None) => {
            let mut lines = common::read_text_rows(train, clm.keep_linebreaks)?;
            let cut = common::split_boundary(clm.validation_split_percentage, lines.len());
            let train_part = lines.split_off(cut);
            (train_part, lines)
        }
        (None, Some(valid)) => (
            Vec::new(),
            common::read_text_rows(valid, clm.keep_linebreaks)?,
        ),
    };

    let train_ds = if training.do_train && !clm.streaming {
        if !has_train {
            return Err(Error::InvalidFlag {
                flag: "train_file".into(),
                detail: "--do_train requires a train file".into(),
            });
        }
        let ds = blocks(
            &train_lines,
            tok.tokenizer(),
            block_size,
            clm.max_train_samples,
            clm.overwrite_cache,
            packing,
        )?;
        if ds.is_empty() {
            return Err(Error::EmptyDataset {
                what: "training",
                hint: format!(": fewer than block_size = {block_size} tokens per 1000 lines"),
            });
        }
        Some(ds)
    } else {
        None
    };
    let eval_ds = if training.do_eval {
        let ds = blocks(
            &eval_lines,
            tok.tokenizer(),
            block_size,
            clm.max_eval_samples,
            clm.overwrite_cache,
            packing,
        )?;
        if ds.is_empty() {
            return Err(Error::EmptyDataset {
                what: "evaluation",
                hint: format!(
                    ": the validation text has fewer than block_size = {block_size} tokens; raise --validation_split_percentage or lower --block_size"
                ),
            });
        }
        Some(ds)
    } else {
        None
    };

    let loaded = from_pretrained_dir(
        &dir,
        AutoTask::CausalLm,
        Device::Cpu,
        &LoadOptions {
            dtype: clm.dtype,
            quantization_config: clm.peft.quantization_config(clm.dtype)?,
            ..LoadOptions::default()
        },
    )?;
    if !loaded.info.is_clean() {
        log::warn!("loading {}: {:?}", dir.display(), loaded.info);
    }
    let n_train = train_ds.as_ref().map_or(0, InMemoryDataset::len);
    let n_eval = eval_ds.as_ref().map_or(0, InMemoryDataset::len);
    // Upstream: `processing_class=tokenizer, data_collator=default_data_collator`.
    // TRL: `get_peft_model(model, peft_config)` on the loaded model.
    let model = clm
        .peft
        .wrap(loaded.model, clm.model_name_or_path.as_deref())?;
    let mut builder = Trainer::builder(model, training.clone()).processing_class(tok.clone());
    // TRL's `DataCollatorForLanguageModeling(padding_free=True)` for packed rows: the batch
    // flattened into one row, positions restarting per document (the models' packed-sequence
    // detection keeps the documents apart), each document's first label -100.
    builder = if clm.packing {
        builder.data_collator(DataCollatorWithFlattening::default())
    } else {
        builder.data_collator(DefaultDataCollator)
    };
    if let Some(ds) = train_ds {
        builder = builder.train_dataset(Arc::new(ds));
    }
    if let (true, true, Some(train)) = (clm.streaming, training.do_train, &clm.train_file) {
        let stream = CausalLmTextStream::new(train, Arc::new(tok.tokenizer().clone()), block_size)?;
        builder = builder.train_stream(Arc::new(stream));
    }
    if let Some(ds) = eval_ds {
        builder = builder
            .eval_dataset(Arc::new(ds))
            .preprocess_logits_for_metrics(|logits: &Tensor, _: Option<&Tensor>| {
                Ok(logits.f_argmax(-1, false)?)
            })
            .compute_metrics(next_token_accuracy);
    }
    let mut trainer = builder.build()?;
    let mut out = ExampleOutput {
        output_dir: output_dir.clone(),
        ..ExampleOutput::default()
    };

    if training.do_train {
        // A stream has no length to report.
        let samples =
            (!clm.streaming).then(|| clm.max_train_samples.map_or(n_train, |m| m.min(n_train)));
        out.train_metrics = Some(common::do_train(&mut trainer, samples, |_| Ok(()))?);
    }

    if training.do_eval {
        let samples = clm.max_eval_samples.map_or(n_eval, |m| m.min(n_eval));
        out.eval_metrics = Some(common::do_eval(&mut trainer, samples, true)?);
    }
    let card = common::card_options(
        clm.model_name_or_path.as_deref(),
        "text-generation",
        clm.dataset_name.as_deref(),
        clm.dataset_config_name.as_deref(),
    );
    common::push_or_write_model_card(&mut trainer, card)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_split_rounds_like_datasets() {
        assert_eq!(common::split_boundary(5, 100), 5);
        assert_eq!(common::split_boundary(5, 50), 2); // 2.5 rounds to even
        assert_eq!(common::split_boundary(5, 70), 4); // 3.5 rounds to even
        assert_eq!(common::split_boundary(0, 70), 0);
    }

    #[test]
    fn script_flags_and_training_flags_are_split() {
        let (clm, t) = parse_args([
            "--model_name_or_path",
            "m",
            "--block_size=32",
            "--max_steps",
            "3",
            "--keep_linebreaks",
            "false",
            "--output_dir",
            "o",
        ])
        .unwrap();
        assert_eq!(clm.model_name_or_path.as_deref(), Some("m"));
        assert_eq!(clm.block_size, Some(32));
        assert!(!clm.keep_linebreaks);
        assert_eq!(t.max_steps, 3);
        assert!(matches!(
            parse_args(["--blok_size", "3"]),
            Err(Error::TrainingArgs(_))
        ));
    }
}

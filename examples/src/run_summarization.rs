//! Upstream `examples/pytorch/summarization/run_summarization.py`: fine-tunes a
//! sequence-to-sequence model (T5, BART...) on CSV / JSON files of texts and their
//! summaries and scores its generated summaries with ROUGE.
//!
//! Steps as upstream: the files (`--train_file`, `--validation_file`, `--test_file`: `.csv`
//! or `.json`, JSON lines or an array); the text column (`--text_column`, else the first
//! column of the first file the run uses) and the summary column (`--summary_column`, else
//! the second); `--max_train_samples` / `--max_eval_samples` / `--max_predict_samples`;
//! rows whose text or summary is empty dropped; the inputs with `--source_prefix` in front
//! truncated to `--max_source_length`, the summaries (`text_target`) to
//! `--max_target_length` (evaluation and prediction: `--val_max_target_length`), padded to
//! those lengths with `--pad_to_max_length` (label padding -100 unless
//! `--ignore_pad_token_for_loss false`); `DataCollatorForSeq2Seq` given the model;
//! `Seq2SeqTrainer` with `generation_max_length` (else `--val_max_target_length`) and
//! `generation_num_beams` set from `--num_beams`, so that every evaluation and the
//! prediction generate with them. With `--predict_with_generate` the metrics are `rouge1`,
//! `rouge2`, `rougeL`, `rougeLsum` (of the stripped decoded texts with each sentence on its
//! own line by nltk's `sent_tokenize`, [`crate::punkt`]; stemmed, [`crate::rouge`]) in
//! percent rounded to 4 places, and `gen_len` (the mean count of non-pad generated ids);
//! `--do_predict` writes `predict_results.json` and `generated_predictions.txt`.
//!
//! ROUGE is the mean over the pairs, where upstream's `evaluate` reports the median of a
//! bootstrap resampling (an estimate of the same mean; see [`crate::rouge`]).
//!
//! nltk's `punkt_tab` model is needed with `--predict_with_generate`: `--nltk_data DIR`
//! (this port's flag), else nltk's search (`NLTK_DATA`, `~/nltk_data`, ...), else
//! `$TCHTRAIN_ASSETS/nltk_data` ([`crate::punkt::find_punkt_tab`]).
//!
//! `--dataset_name` / `--dataset_config_name` read a hub dataset repository's (or a local
//! folder's) `train` / `validation` / `test` splits, each split's files concatenated, in
//! place of the file flags, as upstream's `load_dataset`.
//!
//! Not supported (refused with an error): multilingual
//! tokenizers (mBART: language codes), a tokenizer larger than the model's embeddings and a
//! model with fewer position embeddings than `--max_source_length` (upstream resizes
//! them; BART and T5 do not implement it there either). `--lang`, `--forced_bos_token` and
//! `--preprocessing_num_workers` are accepted without effect.
//!
//! ```no_run
//! use tchtrain_examples::run_summarization;
//! let out = run_summarization::main_with_args([
//!     "--model_name_or_path", "t5-tiny", "--source_prefix", "summarize: ",
//!     "--train_file", "train.csv", "--validation_file", "dev.csv",
//!     "--do_train", "--do_eval", "--predict_with_generate", "--output_dir", "out/sum",
//! ])?;
//! println!("{:?}", out.eval_metrics);
//! # Ok::<(), tchtrain_examples::Error>(())
//! ```

use std::path::PathBuf;

use tchtrain_datasets::{MapCache, Table, cell_text};
use tchtrain_models::PreTrainedTokenizerFast;
use tchtrain_trainer::{EvalPrediction, Metrics};
use tchtrain_training_args::{Dataclass, FieldSpec, Seq2SeqTrainingArguments};

use super::ExampleOutput;
use super::args::{self, ScriptCommandLine, fields};
use super::punkt::{PunktSentenceTokenizer, find_punkt_tab};
use super::rouge;
use super::seq2seq_example::{
    self as s2s, Drive, PositionCheck, Seq2SeqDataArguments, Seq2SeqTokenization, Split,
};
use crate::error::{Error, Result};
use crate::sacrebleu::py_isspace;

/// The script's own arguments (upstream's `ModelArguments` and `DataTrainingArguments`,
/// and `--nltk_data`; see [`COMMAND_LINE`]).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct SummarizationArguments {
    /// The flags `run_translation` has too.
    #[serde(flatten)]
    pub data: Seq2SeqDataArguments,
    /// `--lang`: accepted (only multilingual tokenizers, refused here, use it).
    pub lang: Option<String>,
    /// `--text_column` (default: the first column).
    pub text_column: Option<String>,
    /// `--summary_column` (default: the second column).
    pub summary_column: Option<String>,
    /// `--resize_position_embeddings`.
    pub resize_position_embeddings: Option<bool>,
    /// `--nltk_data DIR`: where nltk's `tokenizers/punkt_tab` is (this port's flag).
    pub nltk_data: Option<PathBuf>,
}

impl Default for SummarizationArguments {
    /// Upstream's defaults (the tables').
    fn default() -> Self {
        args::defaults(COMMAND_LINE)
            .unwrap_or_else(|e| unreachable!("run_summarization's defaults read: {e}"))
    }
}

/// Upstream's `ModelArguments` of run_summarization.py.
static MODEL_ARGUMENTS: Dataclass = Dataclass {
    name: "ModelArguments",
    fields: &[
        s2s::MODEL_FIELDS[0],
        s2s::MODEL_FIELDS[1],
        s2s::MODEL_FIELDS[2],
        s2s::MODEL_FIELDS[3],
        s2s::MODEL_FIELDS[4],
        s2s::MODEL_FIELDS[5],
        s2s::MODEL_FIELDS[6],
        s2s::MODEL_FIELDS[7],
        FieldSpec::optional_bool(
            "resize_position_embeddings",
            "Whether to automatically resize the position embeddings if `max_source_length` exceeds the model's (resizing is not supported: such a model is refused).",
        ),
    ],
};

/// Upstream's `DataTrainingArguments` of run_summarization.py.
static DATA_TRAINING_ARGUMENTS: Dataclass = Dataclass {
    name: "DataTrainingArguments",
    fields: &[
        FieldSpec::str(
            "lang",
            "None",
            "Language id for summarization (multilingual tokenizers, refused here).",
        ),
        fields::DATASET_NAME,
        fields::DATASET_CONFIG_NAME,
        FieldSpec::str(
            "text_column",
            "None",
            "The name of the column in the datasets containing the full texts (default: the first column).",
        ),
        FieldSpec::str(
            "summary_column",
            "None",
            "The name of the column in the datasets containing the summaries (default: the second column).",
        ),
        FieldSpec::str(
            "train_file",
            "None",
            "The input training data file (a jsonlines or csv file).",
        ),
        FieldSpec::str(
            "validation_file",
            "None",
            "An optional input evaluation data file to evaluate the metrics (rouge) on (a jsonlines or csv file).",
        ),
        FieldSpec::str(
            "test_file",
            "None",
            "An optional input test data file to evaluate the metrics (rouge) on (a jsonlines or csv file).",
        ),
        s2s::DATA_FIELDS[0],
        s2s::DATA_FIELDS[1],
        s2s::DATA_FIELDS[2],
        s2s::DATA_FIELDS[3],
        s2s::DATA_FIELDS[4],
        s2s::DATA_FIELDS[5],
        s2s::DATA_FIELDS[6],
        s2s::DATA_FIELDS[7],
        s2s::DATA_FIELDS[8],
        s2s::DATA_FIELDS[9],
        s2s::DATA_FIELDS[10],
        s2s::DATA_FIELDS[11],
        s2s::DATA_FIELDS[12],
    ],
};

/// `--nltk_data` (not upstream: upstream downloads punkt at import).
static NLTK_ARGUMENTS: Dataclass = Dataclass {
    name: "tchtrain",
    fields: &[FieldSpec::str(
        "nltk_data",
        "None",
        "Folder holding nltk's tokenizers/punkt_tab (default: NLTK_DATA, ~/nltk_data, /usr/share/nltk_data, ..., $TCHTRAIN_ASSETS/nltk_data).",
    )],
};

/// The command line: upstream's dataclasses and `--nltk_data`.
pub const COMMAND_LINE: &[&Dataclass] =
    &[&MODEL_ARGUMENTS, &DATA_TRAINING_ARGUMENTS, &NLTK_ARGUMENTS];

const LINE: ScriptCommandLine = ScriptCommandLine {
    title: "run_summarization: sequence-to-sequence summarization (upstream examples/pytorch/summarization/run_summarization.py)",
    dataclasses: COMMAND_LINE,
    refused: &s2s::REFUSED,
};

/// Parses a command line (without the program name) into the script's flags and
/// `Seq2SeqTrainingArguments`, with upstream's `__post_init__` checks.
pub fn parse_args<I, S>(argv: I) -> Result<(SummarizationArguments, Seq2SeqTrainingArguments)>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let (values, training) = args::parse_seq2seq(argv, &LINE)?;
    let mut flags: SummarizationArguments = values.take(&[0, 1, 2])?;
    flags.data.post_init(
        "Need either a dataset name or a training, validation, or test file.",
        true,
        &["csv", "json"],
        "a csv or a json file",
        || Ok(()),
    )?;
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

/// The text column and the summary column, as upstream picks them from `columns`.
fn pick_columns(flags: &SummarizationArguments, columns: &[String]) -> Result<(String, String)> {
    let pick = |flag: &str, given: &Option<String>, index: usize| -> Result<String> {
        match given {
            None => columns
                .get(index)
                .cloned()
                .ok_or_else(|| Error::InvalidFlag {
                    flag: flag.into(),
                    detail: format!(
                        "the data has {} column(s) ({}); name the column with --{flag}",
                        columns.len(),
                        columns.join(", ")
                    ),
                }),
            Some(c) if columns.contains(c) => Ok(c.clone()),
            Some(c) => Err(Error::InvalidFlag {
                flag: flag.into(),
                detail: format!(
                    "--{flag}' value '{c}' needs to be one of: {}",
                    columns.join(", ")
                ),
            }),
        }
    };
    Ok((
        pick("text_column", &flags.text_column, 0)?,
        pick("summary_column", &flags.summary_column, 1)?,
    ))
}

/// The texts and summaries of the first `max` rows of a split, rows with an empty text or
/// summary left out.
fn read_rows(
    table: &Table,
    text_column: &str,
    summary_column: &str,
    max: Option<usize>,
) -> Result<(Vec<String>, Vec<String>)> {
    let n = max.map_or(table.len(), |m| m.min(table.len()));
    let (mut inputs, mut targets) = (Vec::new(), Vec::new());
    for row in 0..n {
        let text = cell_text(table.cell(row, text_column)?);
        let summary = cell_text(table.cell(row, summary_column)?);
        if !text.is_empty() && !summary.is_empty() {
            inputs.push(text);
            targets.push(summary);
        }
    }
    Ok((inputs, targets))
}

/// Upstream's `compute_metrics`: ROUGE of the stripped decoded texts with one sentence a
/// line, in percent rounded to 4 places, and `gen_len`.
fn summarization_metrics(
    tokenizer: PreTrainedTokenizerFast,
    punkt: PunktSentenceTokenizer,
) -> impl FnMut(&EvalPrediction) -> tchtrain_trainer::Result<Metrics> + Send + 'static {
    move |p: &EvalPrediction| {
        let (preds, labels, gen_len) = s2s::decoded(&tokenizer, p)?;
        let lines = |v: Vec<String>| -> Vec<String> {
            v.iter()
                .map(|t| punkt.tokenize(t.trim_matches(py_isspace)).join("\n"))
                .collect()
        };
        let (preds, labels) = (lines(preds), lines(labels));
        let r = rouge::compute(&preds, &labels, true);
        let pct = |v: f64| s2s::py_round(v * 100.0);
        Ok(Metrics::from([
            ("rouge1".to_string(), pct(r.rouge1)),
            ("rouge2".to_string(), pct(r.rouge2)),
            ("rougeL".to_string(), pct(r.rouge_l)),
            ("rougeLsum".to_string(), pct(r.rouge_lsum)),
            ("gen_len".to_string(), gen_len),
        ]))
    }
}

/// Runs the script with parsed arguments.
pub fn run(
    flags: &SummarizationArguments,
    mut training: Seq2SeqTrainingArguments,
) -> Result<ExampleOutput> {
    let mut data = flags.data.clone();
    data.resolve_dataset()?;
    let data = &data;
    data.check_steps(&training)?;
    let punkt = if training.predict_with_generate {
        Some(PunktSentenceTokenizer::load(&find_punkt_tab(
            flags.nltk_data.as_deref(),
            "english",
        )?)?)
    } else {
        None
    };
    let loaded = s2s::load_model(
        data,
        &training,
        PositionCheck::Summarization {
            resize: flags.resize_position_embeddings,
        },
        None,
    )?;
    data.warn_t5_prefix("which is the expected, e.g. with `--source_prefix 'summarize: ' `");
    let b = &training.base;
    let first_split = if b.do_train {
        "train"
    } else if b.do_eval {
        "validation"
    } else if b.do_predict {
        "test"
    } else {
        s2s::something_to_do(&training);
        return Ok(ExampleOutput {
            output_dir: training.base.output_dir().into(),
            ..ExampleOutput::default()
        });
    };
    let columns = data.split_table(first_split)?.columns().to_vec();
    let (text_column, summary_column) = pick_columns(flags, &columns)?;
    let tok = Seq2SeqTokenization {
        tokenizer: &loaded.tokenizer,
        prefix: data.source_prefix.clone().unwrap_or_default(),
        max_source_length: data.max_source_length,
        pad_to_max_length: data.pad_to_max_length,
        ignore_pad_token_for_loss: data.ignore_pad_token_for_loss,
        function: "run_summarization.preprocess_function",
    };
    let cache = MapCache::from_env()?;
    let split = |split: &str, max: Option<usize>, target_len: usize| -> Result<Split> {
        let table = data.split_table(split)?;
        let (inputs, targets) = read_rows(&table, &text_column, &summary_column, max)?;
        let dataset = tok.dataset(
            &inputs,
            &targets,
            target_len,
            cache.as_ref(),
            data.overwrite_cache,
        )?;
        let samples = inputs.len();
        Ok(Split { dataset, samples })
    };
    let val_len = data.val_max_target_length();
    let train = b
        .do_train
        .then(|| split("train", data.max_train_samples, data.max_target_length))
        .transpose()?;
    let eval = b
        .do_eval
        .then(|| split("validation", data.max_eval_samples, val_len))
        .transpose()?;
    let test = b
        .do_predict
        .then(|| split("test", data.max_predict_samples, val_len))
        .transpose()?;
    training.generation_max_length = training.generation_max_length.or(Some(val_len as i64));
    training.generation_num_beams = data.num_beams.or(training.generation_num_beams);
    let metrics = punkt.map(|punkt| {
        Box::new(summarization_metrics(loaded.tokenizer.clone(), punkt))
            as tchtrain_trainer::ComputeMetrics
    });
    s2s::drive(
        &training,
        loaded,
        train,
        eval,
        test,
        Drive {
            eval_gen: None,
            predict_gen: None,
            metrics,
            default_collator: false,
            ignore_pad_token_for_loss: data.ignore_pad_token_for_loss,
            card: crate::common::card_options(
                data.model_name_or_path.as_deref(),
                "summarization",
                data.dataset_name.as_deref(),
                data.dataset_config_name.as_deref(),
            ),
        },
    )
}

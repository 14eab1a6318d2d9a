//! Upstream `examples/pytorch/token-classification/run_ner.py`: fine-tunes a token
//! classifier (NER, POS, ...) on JSON-lines (or CSV) files of pre-split words and their
//! tags.
//!
//! Steps as upstream: the files (`--train_file`, `--validation_file`, `--test_file`); the
//! word column (`--text_column_name`, else `tokens` when present, else the first column)
//! and the tag column (`--label_column_name`, else `{task_name}_tags` when present, else the
//! second column); the label list (the sorted distinct training tags, strings or integers;
//! the model's own `label2id` order when the checkpoint names the same labels);
//! `--max_train_samples` / `--max_eval_samples` / `--max_predict_samples`; tokenization of
//! the words as pre-split input (`is_split_into_words`), truncated to `--max_seq_length`
//! (default: the tokenizer's `model_max_length`), with the labels aligned to the tokens:
//! -100 for special tokens and, unless `--label_all_tokens`, for every sub-word after a
//! word's first (with it, a `B-` tag continues as its `I-` tag);
//! `DataCollatorForTokenClassification`; the seqeval metrics (`precision`, `recall`, `f1`,
//! `accuracy`; per entity type with `--return_entity_level_metrics`); `--do_predict`
//! writes `predict_results.json` and `predictions.txt` (one line of tags per row).
//!
//! In a CSV file a word or tag cell is a JSON list (`["EU", "rejects"]`) or, unlike
//! upstream (which would read the text as characters), words separated by spaces.
//!
//! ```no_run
//! use tchtrain_examples::run_ner;
//! let out = run_ner::main_with_args([
//!     "--model_name_or_path", "assets/tiny-bert", "--tokenizer_name", "assets/minilm",
//!     "--train_file", "train.json", "--validation_file", "dev.json",
//!     "--do_train", "--do_eval", "--output_dir", "out/ner",
//! ])?;
//! println!("{:?}", out.eval_metrics);
//! # Ok::<(), tchtrain_examples::Error>(())
//! ```

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use tch::{Device, Kind};
use tchtrain_collators::{DataCollatorForTokenClassification, Feature, Label};
use tchtrain_models::{AutoTask, LoadOptions, Tokenizer, from_pretrained_dir, read_model_type};
use tchtrain_training_args::{Dataclass, FieldSpec, TrainingArguments};
use tokenizers::{PaddingParams, PaddingStrategy, TruncationParams};

use super::ExampleOutput;
use super::args::{self, ScriptCommandLine, fields, refusals};
use super::common::{self, load_example_tokenizer, tokenizer_json};
use super::peft_args::{self, PeftArguments};
use super::seqeval;
use crate::error::{Error, Result};
use tchtrain_data::{Dataset, InMemoryDataset};
use tchtrain_datasets::{Fingerprint, MapCache, map_cached};
use tchtrain_datasets::{Table, cell_text};
use tchtrain_trainer::Trainer;
use tchtrain_trainer::{EvalPrediction, Metrics};

/// The script's own arguments: upstream's `ModelArguments` and `DataTrainingArguments`
/// (the flags tchtrain honours; see [`COMMAND_LINE`] for the ones it refuses) and TRL's
/// LoRA flags.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NerArguments {
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
    /// `--ignore_mismatched_sizes`: re-initialise the weights whose shapes differ from the
    /// checkpoint's (a classifier with another number of labels) instead of refusing the
    /// checkpoint.
    pub ignore_mismatched_sizes: bool,
    /// `--task_name` (default `ner`, lower-cased as upstream): the tag column defaults to
    /// `{task_name}_tags`.
    pub task_name: String,
    /// `--dataset_name`: a hub dataset repository (or a local folder of data files).
    pub dataset_name: Option<String>,
    /// `--dataset_config_name`: the dataset's configuration.
    pub dataset_config_name: Option<String>,
    /// `--train_file`: `.json` / `.jsonl` (JSON lines), `.csv` or `.parquet`.
    pub train_file: Option<String>,
    /// `--validation_file`.
    pub validation_file: Option<String>,
    /// `--test_file` (for `--do_predict`).
    pub test_file: Option<String>,
    /// `--text_column_name`: the column of words (default `tokens`, else the first).
    pub text_column_name: Option<String>,
    /// `--label_column_name`: the column of tags (default `{task_name}_tags`, else the
    /// second).
    pub label_column_name: Option<String>,
    /// `--overwrite_cache`: tokenize again instead of loading the cached rows
    /// ([`MapCache`](tchtrain_datasets::MapCache)).
    pub overwrite_cache: bool,
    /// `--preprocessing_num_workers`: accepted; tokenization uses every core
    /// (`TCHTRAIN_NUM_PROC`), with the same result.
    pub preprocessing_num_workers: Option<usize>,
    /// `--max_seq_length`: truncate to N tokens (default: the tokenizer's maximum).
    pub max_seq_length: Option<usize>,
    /// `--pad_to_max_length` (default false: the collator pads each batch).
    pub pad_to_max_length: bool,
    /// `--max_train_samples`.
    pub max_train_samples: Option<usize>,
    /// `--max_eval_samples`.
    pub max_eval_samples: Option<usize>,
    /// `--max_predict_samples`.
    pub max_predict_samples: Option<usize>,
    /// `--label_all_tokens`: label every sub-word, not only a word's first.
    pub label_all_tokens: bool,
    /// `--return_entity_level_metrics`: per-type precision / recall / f1 / number too.
    pub return_entity_level_metrics: bool,
    /// TRL's LoRA flags (`--use_peft`, `--lora_r`, ...).
    #[serde(skip)]
    pub peft: PeftArguments,
}

impl Default for NerArguments {
    /// Upstream's defaults (the tables').
    fn default() -> Self {
        let mut ner: Self = args::defaults(&COMMAND_LINE[..2])
            .unwrap_or_else(|e| unreachable!("run_ner's defaults read: {e}"));
        ner.peft = PeftArguments::default();
        ner
    }
}

/// Upstream's `ModelArguments` of run_ner.py (it has no `use_fast_tokenizer`: the script
/// needs a fast tokenizer).
static MODEL_ARGUMENTS: Dataclass = Dataclass {
    name: "ModelArguments",
    fields: &[
        fields::MODEL_NAME_OR_PATH.required(),
        fields::CONFIG_NAME,
        fields::TOKENIZER_NAME,
        fields::CACHE_DIR,
        fields::MODEL_REVISION,
        fields::TOKEN,
        fields::TRUST_REMOTE_CODE,
        fields::IGNORE_MISMATCHED_SIZES,
    ],
};

/// Upstream's `DataTrainingArguments` of run_ner.py.
static DATA_TRAINING_ARGUMENTS: Dataclass = Dataclass {
    name: "DataTrainingArguments",
    fields: &[
        FieldSpec::str("task_name", "ner", "The name of the task (ner, pos...)."),
        fields::DATASET_NAME,
        fields::DATASET_CONFIG_NAME,
        fields::TRAIN_FILE,
        fields::VALIDATION_FILE,
        fields::TEST_FILE,
        FieldSpec::str(
            "text_column_name",
            "None",
            "The column name of text to input in the file (default: tokens, else the first column).",
        ),
        FieldSpec::str(
            "label_column_name",
            "None",
            "The column name of label to input in the file (default: {task_name}_tags, else the second column).",
        ),
        fields::OVERWRITE_CACHE,
        fields::PREPROCESSING_NUM_WORKERS,
        FieldSpec::int(
            "max_seq_length",
            "None",
            "The maximum total input sequence length after tokenization.",
        ),
        FieldSpec::bool(
            "pad_to_max_length",
            false,
            "Whether to pad all samples to model maximum sentence length.",
        ),
        fields::MAX_TRAIN_SAMPLES,
        fields::MAX_EVAL_SAMPLES,
        fields::MAX_PREDICT_SAMPLES,
        FieldSpec::bool(
            "label_all_tokens",
            false,
            "Whether to put the label for one word on all tokens generated by that word or just on the one.",
        ),
        FieldSpec::bool(
            "return_entity_level_metrics",
            false,
            "Whether to return all the entity levels during evaluation or just the overall ones.",
        ),
    ],
};

/// The command line: upstream's dataclasses and TRL's LoRA flags.
pub const COMMAND_LINE: &[&Dataclass] = &[
    &MODEL_ARGUMENTS,
    &DATA_TRAINING_ARGUMENTS,
    &peft_args::LORA_ARGUMENTS,
];

const LINE: ScriptCommandLine = ScriptCommandLine {
    title: "run_ner: token classification (upstream examples/pytorch/token-classification/run_ner.py)",
    dataclasses: COMMAND_LINE,
    refused: &[refusals::TRUST_REMOTE_CODE],
};

/// Parses a command line (without the program name) into the script's flags and
/// `TrainingArguments`.
pub fn parse_args<I, S>(argv: I) -> Result<(NerArguments, TrainingArguments)>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let (values, training) = args::parse(argv, &LINE)?;
    let mut ner: NerArguments = values.take(&[0, 1])?;
    ner.peft = values.take(&[2])?;
    ner.peft.check()?;
    // Upstream's `DataTrainingArguments.__post_init__`: `self.task_name = self.task_name.lower()`.
    ner.task_name = ner.task_name.to_lowercase();
    Ok((ner, training))
}

/// Runs the script on `argv` (the command line without the program name).
pub fn main_with_args<I, S>(argv: I) -> Result<ExampleOutput>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let (ner, training) = parse_args(argv)?;
    run(&ner, training)
}

/// The 1-based line of data row `row` (CSV files have a header line).
fn line_of(path: &Path, row: usize) -> usize {
    let csv = path
        .to_string_lossy()
        .to_ascii_lowercase()
        .trim_end_matches(".bz2")
        .ends_with(".csv");
    row + 1 + usize::from(csv)
}

/// The list in a word or tag cell: a JSON array, or (CSV) a JSON array written as text or
/// words separated by spaces.
fn cell_list(cell: &Value, column: &str, row: usize, path: &Path) -> Result<Vec<Value>> {
    match cell {
        Value::Array(items) => Ok(items.clone()),
        Value::String(s) if s.trim_start().starts_with('[') => {
            serde_json::from_str::<Vec<Value>>(s).map_err(|e| Error::DataFile {
                path: path.to_path_buf(),
                line: line_of(path, row),
                detail: format!("column '{column}': not a JSON list: {e}"),
            })
        }
        Value::String(s) => Ok(s
            .split_whitespace()
            .map(|w| Value::String(w.into()))
            .collect()),
        other => Err(Error::DataFile {
            path: path.to_path_buf(),
            line: line_of(path, row),
            detail: format!(
                "column '{column}' must hold a list of words or tags per row, got {other}"
            ),
        }),
    }
}

/// The word and tag columns of a file, as upstream picks them; a named column that is
/// not there is a flag error that names the columns there are.
fn pick_columns(ner: &NerArguments, table: &Table) -> Result<(String, String)> {
    let columns = table.columns();
    let named = |flag: &str, name: &str| -> Result<String> {
        if columns.iter().any(|c| c == name) {
            Ok(name.to_string())
        } else {
            Err(Error::InvalidFlag {
                flag: flag.into(),
                detail: format!(
                    "column '{name}' is not in {}; its columns are: {}. Pass --{flag} with one of them",
                    table.path().display(),
                    columns.join(", ")
                ),
            })
        }
    };
    let text = match &ner.text_column_name {
        Some(c) => named("text_column_name", c)?,
        None if columns.iter().any(|c| c == "tokens") => "tokens".into(),
        None => named(
            "text_column_name",
            columns.first().map_or("tokens", String::as_str),
        )?,
    };
    let tags = format!("{}_tags", ner.task_name);
    let label = match &ner.label_column_name {
        Some(c) => named("label_column_name", c)?,
        None if columns.contains(&tags) => tags,
        None => named(
            "label_column_name",
            columns.get(1).map_or(tags.as_str(), String::as_str),
        )?,
    };
    Ok((text, label))
}

/// A tag as a label-list entry: strings as they are, integers as their digits.
fn tag_name(tag: &Value, row: usize) -> Result<String> {
    match tag {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) if n.is_i64() || n.is_u64() => Ok(n.to_string()),
        other => Err(Error::InvalidLabel {
            label: other.to_string(),
            row,
            detail: "tags must be strings (\"B-PER\") or integers".into(),
        }),
    }
}

/// The rows of one file: words and tag names.
#[derive(Debug, Clone)]
struct NerRows {
    words: Vec<Vec<String>>,
    tags: Vec<Vec<String>>,
    /// Whether every tag was an integer (sorted as numbers).
    integer_tags: bool,
    /// The tag column's `ClassLabel` names, when the file records them (a Parquet file
    /// written by `datasets`): the tags are then those names, and the label list is them.
    class_names: Option<Vec<String>>,
}

/// The name of class id `tag` of a `ClassLabel` column.
fn class_name(tag: &Value, names: &[String], column: &str, row: usize) -> Result<String> {
    tag.as_u64()
        .and_then(|id| names.get(usize::try_from(id).ok()?))
        .cloned()
        .ok_or_else(|| Error::InvalidLabel {
            label: tag.to_string(),
            row,
            detail: format!(
                "'{column}' is a ClassLabel of {} names, so its cells must be class ids 0..{}",
                names.len(),
                names.len().saturating_sub(1)
            ),
        })
}

fn read_rows(ner: &NerArguments, flag: &str, file: &str, max: Option<usize>) -> Result<NerRows> {
    let table = Table::read(file)?;
    let (text_col, label_col) = pick_columns(ner, &table)?;
    // Upstream: `if isinstance(features[label_column_name].feature, ClassLabel): label_list
    // = features[label_column_name].feature.names`.
    let class_names = tchtrain_datasets::class_label_names(file, &label_col)?;
    let n = max.map_or(table.len(), |m| m.min(table.len()));
    let mut rows = NerRows {
        words: Vec::with_capacity(n),
        tags: Vec::with_capacity(n),
        integer_tags: class_names.is_none(),
        class_names: class_names.clone(),
    };
    for row in 0..n {
        let words: Vec<String> =
            cell_list(table.cell(row, &text_col)?, &text_col, row, table.path())?
                .iter()
                .map(cell_text)
                .collect();
        let tag_cells = cell_list(table.cell(row, &label_col)?, &label_col, row, table.path())?;
        if tag_cells.len() != words.len() {
            return Err(Error::DataFile {
                path: table.path().to_path_buf(),
                line: line_of(table.path(), row),
                detail: format!(
                    "{} words in '{text_col}' but {} tags in '{label_col}' (--{flag}): each word needs one tag",
                    words.len(),
                    tag_cells.len()
                ),
            });
        }
        rows.integer_tags &= tag_cells.iter().all(Value::is_number);
        rows.tags.push(match &class_names {
            Some(names) => tag_cells
                .iter()
                .map(|t| class_name(t, names, &label_col, row))
                .collect::<Result<_>>()?,
            None => tag_cells
                .iter()
                .map(|t| tag_name(t, row))
                .collect::<Result<_>>()?,
        });
        rows.words.push(words);
    }
    Ok(rows)
}

/// Upstream's label list: a `ClassLabel` column's names, else `get_label_list`, the sorted
/// distinct tags (as numbers when all are integers).
fn label_list(rows: &NerRows) -> Vec<String> {
    if let Some(names) = &rows.class_names {
        return names.clone();
    }
    let set: BTreeSet<&String> = rows.tags.iter().flatten().collect();
    let mut list: Vec<String> = set.into_iter().cloned().collect();
    if rows.integer_tags {
        list.sort_by_key(|s| s.parse::<i128>().unwrap_or(0));
    }
    list
}

/// The checkpoint's own label order, when its `label2id` names exactly `labels`
/// (upstream: "Model has labels -> use them").
fn model_label_order(config: &Path, labels: &[String]) -> Result<Option<Vec<String>>> {
    let text = std::fs::read_to_string(config).map_err(|e| Error::io("reading", config, e))?;
    let json: Value = serde_json::from_str(&text).map_err(|source| Error::Json {
        path: config.to_path_buf(),
        source,
    })?;
    let Some(id2label) = json.get("id2label").and_then(Value::as_object) else {
        return Ok(None);
    };
    let mut by_id: Vec<(i64, String)> = id2label
        .iter()
        .filter_map(|(k, v)| Some((k.parse().ok()?, v.as_str()?.to_string())))
        .collect();
    by_id.sort();
    let names: Vec<String> = by_id.into_iter().map(|(_, n)| n).collect();
    let default = names
        .iter()
        .enumerate()
        .all(|(i, n)| *n == format!("LABEL_{i}"));
    if default {
        return Ok(None);
    }
    let (mut a, mut b) = (names.clone(), labels.to_vec());
    a.sort();
    b.sort();
    if a == b {
        return Ok(Some(names));
    }
    log::warn!(
        "Your model seems to have been trained with labels, but they don't match the dataset: model labels: {a:?}, dataset labels: {b:?}. Ignoring the model labels as a result."
    );
    Ok(None)
}

/// How words become token rows.
struct Alignment<'a> {
    tokenizer: Tokenizer,
    labels: &'a [String],
    /// For each label id, the id a continued sub-word gets with `label_all_tokens`
    /// (`B-X` -> `I-X` when the list has it).
    b_to_i: Vec<i64>,
    label_all_tokens: bool,
    with_token_type_ids: bool,
}

impl<'a> Alignment<'a> {
    fn new(
        tokenizer: &Tokenizer,
        labels: &'a [String],
        label_all_tokens: bool,
        padding: Option<u32>,
        max_length: usize,
        with_token_type_ids: bool,
    ) -> Result<Self> {
        let mut tokenizer = tokenizer.clone();
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length,
                ..TruncationParams::default()
            }))
            .map_err(|e| Error::Tokenizer {
                what: "settings".into(),
                detail: e.to_string(),
            })?;
        if let Some(pad_id) = padding {
            tokenizer.with_padding(Some(PaddingParams {
                strategy: PaddingStrategy::Fixed(max_length),
                pad_id,
                ..PaddingParams::default()
            }));
        }
        let b_to_i = labels
            .iter()
            .enumerate()
            .map(|(i, l)| {
                l.strip_prefix("B-")
                    .and_then(|t| labels.iter().position(|x| *x == format!("I-{t}")))
                    .unwrap_or(i) as i64
            })
            .collect();
        Ok(Self {
            tokenizer,
            labels,
            b_to_i,
            label_all_tokens,
            with_token_type_ids,
        })
    }

    /// Upstream's `tokenize_and_align_labels` on one row.
    fn row(&self, words: &[String], tags: &[String], row: usize) -> Result<Feature> {
        let pieces: Vec<&str> = words.iter().map(String::as_str).collect();
        let enc = self
            .tokenizer
            .encode(pieces.as_slice(), true)
            .map_err(|e| Error::Tokenizer {
                what: format!("row {row}"),
                detail: e.to_string(),
            })?;
        let mut feature = Feature::from_encoding(&enc, self.with_token_type_ids);
        feature.special_tokens_mask = None;
        feature.offset_mapping = None;
        let mut ids = Vec::with_capacity(enc.len());
        let mut previous = None;
        for word in enc.get_word_ids() {
            let id = match *word {
                None => -100,
                Some(w) => {
                    let tag = &tags[w as usize];
                    let label = self.labels.iter().position(|l| l == tag).ok_or_else(|| {
                        Error::InvalidLabel {
                            label: tag.clone(),
                            row,
                            detail: format!(
                                "not among the training tags {:?}; add rows with it to the training file",
                                self.labels
                            ),
                        }
                    })? as i64;
                    if previous != Some(w) {
                        label
                    } else if self.label_all_tokens {
                        self.b_to_i[label as usize]
                    } else {
                        -100
                    }
                }
            };
            ids.push(id);
            previous = *word;
        }
        feature.labels = Some(Label::Ids(ids));
        Ok(feature)
    }

    fn features(&self, rows: &NerRows) -> Result<Vec<Feature>> {
        rows.words
            .iter()
            .zip(&rows.tags)
            .enumerate()
            .map(|(i, (w, t))| self.row(w, t, i))
            .collect()
    }

    /// [`features`](Self::features) through the dataset cache: the same rows, tokenizer
    /// (with its truncation and padding), label list and options load the stored rows.
    fn dataset(
        &self,
        rows: &NerRows,
        cache: Option<&MapCache>,
        overwrite: bool,
    ) -> Result<InMemoryDataset> {
        let mut fingerprint = Fingerprint::new("run_ner.tokenize_and_align_labels");
        fingerprint
            .update(tokenizer_json(&self.tokenizer)?)
            .update(format!("{:?}", self.labels))
            .update([
                u8::from(self.label_all_tokens),
                u8::from(self.with_token_type_ids),
            ]);
        for (words, tags) in rows.words.iter().zip(&rows.tags) {
            // A row's tags are as many as its words (read_rows checks it).
            fingerprint.update((words.len() as u64).to_le_bytes());
            for part in words.iter().chain(tags) {
                fingerprint.update(part);
            }
        }
        let features = map_cached(cache, &fingerprint, overwrite, || self.features(rows))?;
        Ok(InMemoryDataset::new(features))
    }
}

/// Upstream's `tokenize_and_align_labels` on rows of words and their tags: each row
/// tokenized as pre-split words (truncated to `max_seq_length`, BERT's `token_type_ids`
/// kept), `labels` = the index in `label_list` of each token's word tag, -100 for special
/// tokens and for the later sub-words of a word (with `label_all_tokens`, the word's tag,
/// `B-X` continued as `I-X`).
///
/// ```no_run
/// use tchtrain_collators::Label;
/// use tchtrain_data::Dataset;
/// use tchtrain_examples::run_ner::tokenize_and_align_labels;
/// let tok = tchtrain_models::AutoTokenizer::from_pretrained("assets/minilm")?;
/// let tokenizer = tok.tokenizer();
/// let labels = ["B-PER".to_string(), "I-PER".into(), "O".into()];
/// let words = vec![vec!["Olufemi".to_string(), "left".into()]];
/// let tags = vec![vec!["B-PER".to_string(), "O".into()]];
/// let rows = tokenize_and_align_labels(tokenizer, &words, &tags, &labels, true, 128)?;
/// // [CLS] ol ##uf ##emi left [SEP]
/// assert_eq!(rows.get(0)?.labels, Some(Label::Ids(vec![-100, 0, 1, 1, 2, -100])));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn tokenize_and_align_labels(
    tokenizer: &Tokenizer,
    words: &[Vec<String>],
    tags: &[Vec<String>],
    label_list: &[String],
    label_all_tokens: bool,
    max_seq_length: usize,
) -> Result<InMemoryDataset> {
    let align = Alignment::new(
        tokenizer,
        label_list,
        label_all_tokens,
        None,
        max_seq_length,
        true,
    )?;
    let features = align.features(&NerRows {
        words: words.to_vec(),
        tags: tags.to_vec(),
        integer_tags: false,
        class_names: None,
    })?;
    Ok(InMemoryDataset::new(features))
}

/// One list of tags per row.
type TagRows = Vec<Vec<String>>;

/// Predicted and true tags of every row, positions labelled -100 left out (upstream's
/// `true_predictions` / `true_labels`).
fn tag_lists(
    predictions: &tch::Tensor,
    labels: &tch::Tensor,
    names: &[String],
) -> tchtrain_trainer::Result<(TagRows, TagRows)> {
    let preds = predictions.f_argmax(-1, false)?;
    let (rows, len) = (labels.size()[0], labels.size()[1]);
    let preds: Vec<i64> = Vec::<i64>::try_from(&preds.f_reshape([-1])?)?;
    let labels: Vec<i64> = Vec::<i64>::try_from(&labels.f_to_kind(Kind::Int64)?.f_reshape([-1])?)?;
    let name = |i: i64| names.get(i as usize).cloned().unwrap_or_default();
    let (mut p_out, mut l_out) = (Vec::new(), Vec::new());
    for r in 0..rows as usize {
        let (mut p, mut l) = (Vec::new(), Vec::new());
        for c in 0..len as usize {
            let k = r * len as usize + c;
            if labels[k] != -100 {
                p.push(name(preds[k]));
                l.push(name(labels[k]));
            }
        }
        p_out.push(p);
        l_out.push(l);
    }
    Ok((p_out, l_out))
}

/// Upstream's `compute_metrics`: seqeval on the argmax tags.
fn ner_metrics(
    names: Vec<String>,
    entity_level: bool,
) -> impl FnMut(&EvalPrediction) -> tchtrain_trainer::Result<Metrics> {
    move |p: &EvalPrediction| {
        let mut m = Metrics::new();
        let Some(labels) = &p.label_ids else {
            return Ok(m);
        };
        let (preds, truth) = tag_lists(p.predictions.array()?, labels.array()?, &names)?;
        let r = seqeval::compute(&preds, &truth);
        if entity_level {
            for (t, s) in &r.per_type {
                m.insert(format!("{t}_precision"), s.precision);
                m.insert(format!("{t}_recall"), s.recall);
                m.insert(format!("{t}_f1"), s.f1);
                m.insert(format!("{t}_number"), s.number as f64);
            }
            m.insert("overall_precision".into(), r.overall_precision);
            m.insert("overall_recall".into(), r.overall_recall);
            m.insert("overall_f1".into(), r.overall_f1);
            m.insert("overall_accuracy".into(), r.overall_accuracy);
        } else {
            m.insert("precision".into(), r.overall_precision);
            m.insert("recall".into(), r.overall_recall);
            m.insert("f1".into(), r.overall_f1);
            m.insert("accuracy".into(), r.overall_accuracy);
        }
        Ok(m)
    }
}

/// Writes the label names and the task into the saved `config.json` (upstream sets
/// `model.config.label2id` / `id2label` and `finetuning_task` before training).
fn write_label_names(dir: &Path, labels: &[String], task: &str) -> Result<()> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io("reading", &path, e))?;
    let json_err = |source| Error::Json {
        path: path.clone(),
        source,
    };
    let mut config: Value = serde_json::from_str(&text).map_err(json_err)?;
    if let Some(obj) = config.as_object_mut() {
        let id2label: serde_json::Map<String, Value> = labels
            .iter()
            .enumerate()
            .map(|(i, l)| (i.to_string(), l.clone().into()))
            .collect();
        let label2id: serde_json::Map<String, Value> = labels
            .iter()
            .enumerate()
            .map(|(i, l)| (l.clone(), (i as i64).into()))
            .collect();
        obj.insert("id2label".into(), id2label.into());
        obj.insert("label2id".into(), label2id.into());
        obj.insert("finetuning_task".into(), task.into());
    }
    let text = serde_json::to_string_pretty(&config).map_err(json_err)?;
    std::fs::write(&path, text + "\n").map_err(|e| Error::io("writing", &path, e))
}

/// `--dataset_name`: the arguments with the dataset's `train` / `validation` / `test`
/// files (from the hub cache) as the file flags. A split of several files is refused (read
/// it as one file with `--train_file` etc.). Tags are read as the files hold them: a
/// `ClassLabel` column of a Parquet file gives its class names (the file's `huggingface`
/// features metadata), other integer tags are named by their integers.
fn dataset_files(ner: &NerArguments, name: &str) -> Result<NerArguments> {
    let splits = common::load_dataset_splits(
        name,
        ner.dataset_config_name.as_deref(),
        ner.token.as_deref(),
    )?;
    let file = |split: &str| -> Result<Option<String>> {
        match splits.get(split) {
            None => Ok(None),
            Some([one]) => Ok(Some(one.display().to_string())),
            Some(many) => Err(Error::InvalidFlag {
                flag: "dataset_name".into(),
                detail: format!(
                    "the {split} split of {name} has {} files; run_ner reads one file per split: pass them as --train_file / --validation_file / --test_file",
                    many.len()
                ),
            }),
        }
    };
    Ok(NerArguments {
        train_file: file("train")?,
        validation_file: file("validation")?,
        test_file: file("test")?,
        dataset_name: None,
        ..ner.clone()
    })
}

fn required(flag: &str, file: Option<&String>, why: &str) -> Result<String> {
    file.cloned().ok_or_else(|| Error::InvalidFlag {
        flag: flag.into(),
        detail: format!("{why} requires --{flag} FILE (.json / .jsonl JSON lines, or .csv)"),
    })
}

/// Runs the script with parsed arguments.
pub fn run(ner: &NerArguments, training: TrainingArguments) -> Result<ExampleOutput> {
    let with_dataset;
    let ner = match &ner.dataset_name {
        Some(name) => {
            with_dataset = dataset_files(ner, name)?;
            &with_dataset
        }
        None => ner,
    };
    let output_dir = PathBuf::from(training.output_dir());
    if ner.train_file.is_none() && ner.validation_file.is_none() && ner.test_file.is_none() {
        return Err(Error::InvalidFlag {
            flag: "train_file".into(),
            detail: "Need either a dataset name or a training/validation file (--train_file, --validation_file)".into(),
        });
    }
    let (hub, dir) = common::resolve_model!(ner)?;
    // The files each step needs, checked before any is read.
    if training.do_train {
        required("train_file", ner.train_file.as_ref(), "--do_train")?;
    }
    if training.do_eval {
        required("validation_file", ner.validation_file.as_ref(), "--do_eval")?;
    }
    if training.do_predict {
        required("test_file", ner.test_file.as_ref(), "--do_predict")?;
    }
    let tok = load_example_tokenizer(&dir, ner.tokenizer_name.as_deref(), &hub)?;

    let train_rows = match (&ner.train_file, training.do_train) {
        (_, true) => Some(read_rows(
            ner,
            "train_file",
            &required("train_file", ner.train_file.as_ref(), "--do_train")?,
            ner.max_train_samples,
        )?),
        (Some(f), false) => Some(read_rows(ner, "train_file", f, None)?),
        (None, false) => None,
    };
    let eval_rows = if training.do_eval {
        let f = required("validation_file", ner.validation_file.as_ref(), "--do_eval")?;
        Some(read_rows(ner, "validation_file", &f, ner.max_eval_samples)?)
    } else {
        None
    };
    let test_rows = if training.do_predict {
        let f = required("test_file", ner.test_file.as_ref(), "--do_predict")?;
        Some(read_rows(ner, "test_file", &f, ner.max_predict_samples)?)
    } else {
        None
    };
    // The label list comes from the whole training file (upstream reads
    // raw_datasets["train"]); without one, from the validation file.
    let label_source = match (&ner.train_file, &eval_rows) {
        (Some(f), _) => read_rows(ner, "train_file", f, None)?,
        (None, Some(rows)) => rows.clone(),
        (None, None) => {
            return Err(Error::InvalidFlag {
                flag: "train_file".into(),
                detail: "the label list comes from the training file: pass --train_file".into(),
            });
        }
    };
    let mut labels = label_list(&label_source);
    if labels.is_empty() {
        return Err(Error::EmptyDataset {
            what: "training",
            hint: ": no tags found to make the label list from".into(),
        });
    }
    if let Some(order) = model_label_order(&dir.join("config.json"), &labels)? {
        labels = order;
    }
    log::info!("labels: {labels:?}");

    let model_max_length = tok.info().model_max_length.unwrap_or(usize::MAX);
    let max_length = ner.max_seq_length.unwrap_or(model_max_length);
    if max_length == 0 || max_length == usize::MAX {
        return Err(Error::InvalidFlag {
            flag: "max_seq_length".into(),
            detail: "needs a positive length (the tokenizer states no model_max_length)".into(),
        });
    }
    let with_token_type_ids = read_model_type(&dir.join("config.json"))? == "bert";
    let pad_id = tok.info().pad_token_id.unwrap_or(0).max(0) as u32;
    let align = Alignment::new(
        tok.tokenizer(),
        &labels,
        ner.label_all_tokens,
        ner.pad_to_max_length.then_some(pad_id),
        max_length,
        with_token_type_ids,
    )?;
    let cache = MapCache::from_env()?;
    let prepare = |rows: &NerRows| align.dataset(rows, cache.as_ref(), ner.overwrite_cache);
    let train_ds = match (&train_rows, training.do_train) {
        (Some(rows), true) => Some(prepare(rows)?),
        _ => None,
    };
    let eval_ds = eval_rows.as_ref().map(prepare).transpose()?;
    let test_ds = test_rows.as_ref().map(prepare).transpose()?;

    tch::manual_seed(training.seed as i64);
    let loaded = from_pretrained_dir(
        &dir,
        AutoTask::TokenClassification {
            num_labels: Some(labels.len() as i64),
        },
        Device::Cpu,
        &LoadOptions {
            ignore_mismatched_sizes: ner.ignore_mismatched_sizes,
            quantization_config: ner
                .peft
                .quantization_config(tchtrain_models::LoadDtype::Auto)?,
            ..LoadOptions::default()
        },
    )?;
    if !loaded.info.missing_keys.is_empty() {
        log::info!(
            "newly initialised (train them): {}",
            loaded.info.missing_keys.join(", ")
        );
    }
    let n_train = train_ds.as_ref().map_or(0, InMemoryDataset::len);
    let n_eval = eval_ds.as_ref().map_or(0, InMemoryDataset::len);
    let mut collator = DataCollatorForTokenClassification::new(tok.info().clone());
    if training.fp16 {
        collator.pad_to_multiple_of = Some(8);
    }
    // TRL: `get_peft_model(model, peft_config)` on the loaded model.
    let model = ner
        .peft
        .wrap(loaded.model, ner.model_name_or_path.as_deref())?;
    let mut builder = Trainer::builder(model, training.clone())
        .processing_class(tok.clone())
        .data_collator(collator)
        .compute_metrics(Box::new(ner_metrics(
            labels.clone(),
            ner.return_entity_level_metrics,
        )));
    if let Some(ds) = train_ds {
        builder = builder.train_dataset(Arc::new(ds));
    }
    if let Some(ds) = eval_ds {
        builder = builder.eval_dataset(Arc::new(ds));
    }
    let mut trainer = builder.build()?;
    let mut out = ExampleOutput {
        output_dir: output_dir.clone(),
        ..ExampleOutput::default()
    };

    if training.do_train {
        out.train_metrics = Some(common::do_train(&mut trainer, Some(n_train), |saved| {
            write_label_names(saved, &labels, &ner.task_name)
        })?);
    }
    if training.do_eval {
        out.eval_metrics = Some(common::do_eval(&mut trainer, n_eval, false)?);
    }
    if let Some(ds) = test_ds {
        let prediction = trainer.predict(Arc::new(ds), "predict")?;
        trainer.log_metrics("predict", &prediction.metrics);
        trainer.save_metrics("predict", &prediction.metrics, true)?;
        if let (Some(p), Some(l)) = (&prediction.predictions, &prediction.label_ids)
            && training.should_save()
        {
            let (tags, _) = tag_lists(p.array()?, l.array()?, &labels)?;
            let text: String = tags.iter().map(|t| t.join(" ") + "\n").collect();
            std::fs::create_dir_all(&output_dir)
                .map_err(|e| Error::io("creating", &output_dir, e))?;
            let path = output_dir.join("predictions.txt");
            std::fs::write(&path, text).map_err(|e| Error::io("writing", &path, e))?;
        }
        out.predict_metrics = Some(prediction.metrics);
    }
    let card = common::card_options(
        ner.model_name_or_path.as_deref(),
        "token-classification",
        ner.dataset_name.as_deref(),
        ner.dataset_config_name.as_deref(),
    );
    common::push_or_write_model_card(&mut trainer, card)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_lists_sort_as_python() {
        let rows = NerRows {
            words: vec![],
            tags: vec![vec!["O".into(), "B-PER".into()], vec!["I-PER".into()]],
            integer_tags: false,
            class_names: None,
        };
        assert_eq!(label_list(&rows), ["B-PER", "I-PER", "O"]);
        let ints = NerRows {
            words: vec![],
            tags: vec![vec!["10".into(), "2".into()], vec!["0".into()]],
            integer_tags: true,
            class_names: None,
        };
        assert_eq!(label_list(&ints), ["0", "2", "10"]);
        // A ClassLabel column: its names, in their order, whatever the tags seen.
        let named = NerRows {
            words: vec![],
            tags: vec![vec!["O".into()]],
            integer_tags: false,
            class_names: Some(vec!["O".into(), "B-X".into(), "A".into()]),
        };
        assert_eq!(label_list(&named), ["O", "B-X", "A"]);
    }

    #[test]
    fn csv_cells_are_lists() {
        let p = Path::new("x.csv");
        let words = cell_list(&Value::String("[\"a\", \"b\"]".into()), "t", 0, p).unwrap();
        assert_eq!(words, [Value::from("a"), Value::from("b")]);
        let words = cell_list(&Value::String("a b".into()), "t", 0, p).unwrap();
        assert_eq!(words.len(), 2);
        assert!(cell_list(&Value::from(3), "t", 0, p).is_err());
    }
}

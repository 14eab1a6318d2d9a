//! Upstream `examples/pytorch/text-classification/run_classification.py`: fine-tunes a
//! sequence classifier on a CSV or JSON-lines file with text and label columns.
//!
//! Steps as upstream: the files (`--train_file`, `--validation_file`, `.bz2` accepted),
//! `--shuffle_train_dataset` (seeded by `--shuffle_seed`), the label list (sorted distinct
//! training labels, extended by the validation file's; a float column means regression),
//! `--text_column_names` joined by `--text_column_delimiter`, tokenization truncated to
//! `--max_seq_length` (padded to it unless `--pad_to_max_length false`),
//! `--max_train_samples` / `--max_eval_samples`; accuracy (mean squared error for
//! regression) as the metric. The saved `config.json` names the labels (`id2label`).
//!
//! Two flags upstream's script does not have, for one labelled file such as the Rotten
//! Tomatoes corpus: `--label_filter fresh,rotten` keeps only the rows with those labels
//! (in both files, before the label list is made), and `--validation_split_percentage P`
//! holds out P % of the training file's rows (a permutation seeded by `--shuffle_seed`)
//! as the validation set when there is no `--validation_file`. The model is loaded after
//! `set_seed(--seed)`, as upstream, so a new classification head starts the same each run.
//!
//! The shuffle is a seeded permutation (libtorch's `randperm` order), not the numpy
//! generator `datasets.shuffle` uses: the same seed gives a different order than upstream.
//!
//! ```no_run
//! use tchtrain_examples::run_classification;
//! let out = run_classification::main_with_args([
//!     "--model_name_or_path", "assets/minilm", "--train_file", "train.csv",
//!     "--validation_file", "valid.csv", "--text_column_names", "text",
//!     "--label_column_name", "category", "--do_train", "--do_eval", "--output_dir", "out/cls",
//! ])?;
//! println!("{:?}", out.eval_metrics);
//! # Ok::<(), tchtrain_examples::Error>(())
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tch::{Device, Kind};
use tchtrain_collators::{DefaultDataCollator, TorchGenerator};
use tchtrain_models::{AutoTask, LoadOptions, from_pretrained_dir, read_model_type};
use tchtrain_training_args::{Dataclass, FieldSpec, TrainingArguments};

use super::ExampleOutput;
use super::args::{self, ScriptCommandLine, fields, refusals};
use super::common::{self, load_example_tokenizer, tokenizer_json};
use super::peft_args::{self, PeftArguments};
use super::split;
use crate::error::{Error, Result};
use crate::text_classification::{
    ClassificationLabels, TextClassificationOptions, tokenize_text_classification,
};
use tchtrain_data::randperm;
use tchtrain_data::{Dataset, InMemoryDataset};
use tchtrain_datasets::Table;
use tchtrain_datasets::{Fingerprint, MapCache, map_cached};
use tchtrain_trainer::Trainer;
use tchtrain_trainer::{EvalPrediction, Metrics};

/// The script's own arguments: upstream's `ModelArguments` and `DataTrainingArguments`
/// (the flags tchtrain honours; see [`COMMAND_LINE`] for the ones it refuses), two flags of
/// tchtrain's, and TRL's LoRA flags.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassificationArguments {
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
    /// `--dataset_name`: a hub dataset repository (or a local folder of data files).
    pub dataset_name: Option<String>,
    /// `--dataset_config_name`: the dataset's configuration.
    pub dataset_config_name: Option<String>,
    /// `--do_regression`: treat the labels as numbers whatever their type (default: a
    /// float label column means regression).
    pub do_regression: Option<bool>,
    /// `--text_column_names`: comma-separated text columns (default `sentence`).
    #[serde(
        default = "default_text_columns",
        deserialize_with = "args::comma_separated"
    )]
    pub text_column_names: Vec<String>,
    /// `--text_column_delimiter`: joins the text columns (default `" "`).
    pub text_column_delimiter: String,
    /// `--train_split_name`: the dataset's split used for training (default `train`).
    pub train_split_name: Option<String>,
    /// `--validation_split_name`: the dataset's split used for evaluation (default
    /// `validation`).
    pub validation_split_name: Option<String>,
    /// `--remove_splits`: comma-separated splits dropped from the dataset.
    #[serde(default, deserialize_with = "args::comma_separated")]
    pub remove_splits: Vec<String>,
    /// `--remove_columns`: comma-separated columns dropped from the dataset.
    #[serde(default, deserialize_with = "args::comma_separated")]
    pub remove_columns: Vec<String>,
    /// `--label_column_name` (default `label`).
    #[serde(default = "default_label_column")]
    pub label_column_name: String,
    /// `--max_seq_length` (default 128).
    pub max_seq_length: usize,
    /// `--preprocessing_num_workers`: accepted; tokenization uses every core
    /// (`TCHTRAIN_NUM_PROC`), with the same result.
    pub preprocessing_num_workers: Option<usize>,
    /// `--overwrite_cache`: tokenize again instead of loading the cached rows
    /// ([`MapCache`](tchtrain_datasets::MapCache)).
    pub overwrite_cache: bool,
    /// `--pad_to_max_length` (default true).
    pub pad_to_max_length: bool,
    /// `--shuffle_train_dataset` (default false).
    pub shuffle_train_dataset: bool,
    /// `--shuffle_seed` (default 42).
    pub shuffle_seed: u64,
    /// `--max_train_samples`.
    pub max_train_samples: Option<usize>,
    /// `--max_eval_samples`.
    pub max_eval_samples: Option<usize>,
    /// `--metric_name`: `accuracy` (classification) or `mse` (regression), the metrics the
    /// script computes without `evaluate`.
    pub metric_name: Option<String>,
    /// `--train_file`: `.csv`, `.json`, `.jsonl` (optionally `.bz2`) or `.parquet`.
    pub train_file: Option<String>,
    /// `--validation_file`.
    pub validation_file: Option<String>,
    /// `--test_file`: the rows `--do_predict` predicts (same extension as `--train_file`).
    pub test_file: Option<String>,
    /// `--test_split_name`: the dataset's split `--do_predict` predicts (default `test`).
    pub test_split_name: Option<String>,
    /// `--max_predict_samples`.
    pub max_predict_samples: Option<usize>,
    /// `--label_filter A,B` (not upstream): keep only the rows with these labels.
    #[serde(default, deserialize_with = "args::comma_separated_opt")]
    pub label_filter: Option<Vec<String>>,
    /// `--validation_split_percentage P` (not upstream; run_clm's flag): without
    /// `--validation_file`, hold out P % of the training rows (seeded by `shuffle_seed`).
    pub validation_split_percentage: Option<usize>,
    /// TRL's LoRA flags (`--use_peft`, `--lora_r`, ...; `--lora_task_type SEQ_CLS` keeps
    /// the new classifier trained and saved with the adapter).
    #[serde(skip)]
    pub peft: PeftArguments,
}

fn default_text_columns() -> Vec<String> {
    vec!["sentence".into()]
}

fn default_label_column() -> String {
    "label".into()
}

impl Default for ClassificationArguments {
    /// Upstream's defaults (the tables').
    fn default() -> Self {
        let mut cls: Self = args::defaults(&COMMAND_LINE[..3])
            .unwrap_or_else(|e| unreachable!("run_classification's defaults read: {e}"));
        cls.peft = PeftArguments::default();
        cls
    }
}

/// Upstream's `ModelArguments` of run_classification.py.
static MODEL_ARGUMENTS: Dataclass = Dataclass {
    name: "ModelArguments",
    fields: &[
        fields::MODEL_NAME_OR_PATH.required(),
        fields::CONFIG_NAME,
        fields::TOKENIZER_NAME,
        fields::CACHE_DIR,
        fields::USE_FAST_TOKENIZER,
        fields::MODEL_REVISION,
        fields::TOKEN,
        fields::TRUST_REMOTE_CODE,
        fields::IGNORE_MISMATCHED_SIZES,
    ],
};

/// Upstream's `DataTrainingArguments` of run_classification.py.
static DATA_TRAINING_ARGUMENTS: Dataclass = Dataclass {
    name: "DataTrainingArguments",
    fields: &[
        fields::DATASET_NAME,
        fields::DATASET_CONFIG_NAME,
        FieldSpec::optional_bool(
            "do_regression",
            "Whether to do regression instead of classification (default: a float label column means regression).",
        ),
        FieldSpec::str(
            "text_column_names",
            "None",
            "The name of the text column(s), comma-separated (default: sentence).",
        ),
        FieldSpec::str(
            "text_column_delimiter",
            " ",
            "The delimiter joining the text columns.",
        ),
        FieldSpec::str(
            "train_split_name",
            "None",
            "The dataset split used for training (default: train).",
        ),
        FieldSpec::str(
            "validation_split_name",
            "None",
            "The dataset split used for validation (default: validation).",
        ),
        FieldSpec::str(
            "test_split_name",
            "None",
            "The dataset split used for prediction (default: test).",
        ),
        FieldSpec::str(
            "remove_splits",
            "None",
            "Splits to remove from the dataset, comma-separated.",
        ),
        FieldSpec::str(
            "remove_columns",
            "None",
            "Columns to remove from the dataset, comma-separated.",
        ),
        FieldSpec::str(
            "label_column_name",
            "None",
            "The name of the label column (default: label).",
        ),
        FieldSpec::int(
            "max_seq_length",
            "128",
            "The maximum total input sequence length after tokenization.",
        ),
        fields::PREPROCESSING_NUM_WORKERS,
        fields::OVERWRITE_CACHE,
        FieldSpec::bool(
            "pad_to_max_length",
            true,
            "Whether to pad all samples to `max_seq_length`.",
        ),
        FieldSpec::bool(
            "shuffle_train_dataset",
            false,
            "Whether to shuffle the train dataset or not.",
        ),
        FieldSpec::int(
            "shuffle_seed",
            "42",
            "Random seed that will be used to shuffle the train dataset.",
        ),
        fields::MAX_TRAIN_SAMPLES,
        fields::MAX_EVAL_SAMPLES,
        fields::MAX_PREDICT_SAMPLES,
        FieldSpec::str(
            "metric_name",
            "None",
            "The metric to use for evaluation (accuracy or mse here).",
        ),
        fields::TRAIN_FILE,
        fields::VALIDATION_FILE,
        fields::TEST_FILE,
    ],
};

/// Two flags of tchtrain's, for one labelled file such as the Rotten Tomatoes corpus.
static EXTRA_ARGUMENTS: Dataclass = Dataclass {
    name: "tchtrain",
    fields: &[
        FieldSpec::str(
            "label_filter",
            "None",
            "Keep only the rows with these labels, comma-separated (both files).",
        ),
        FieldSpec::int(
            "validation_split_percentage",
            "None",
            "Without --validation_file: hold out this % of the training rows, drawn with --shuffle_seed.",
        ),
    ],
};

/// The command line: upstream's dataclasses, tchtrain's two flags, TRL's LoRA flags.
pub const COMMAND_LINE: &[&Dataclass] = &[
    &MODEL_ARGUMENTS,
    &DATA_TRAINING_ARGUMENTS,
    &EXTRA_ARGUMENTS,
    &peft_args::LORA_ARGUMENTS,
];

const LINE: ScriptCommandLine = ScriptCommandLine {
    title: "run_classification: sequence classification (upstream examples/pytorch/text-classification/run_classification.py)",
    dataclasses: COMMAND_LINE,
    refused: &[refusals::USE_FAST_TOKENIZER, refusals::TRUST_REMOTE_CODE],
};

/// Parses a command line (without the program name) into the script's flags and
/// `TrainingArguments`.
pub fn parse_args<I, S>(argv: I) -> Result<(ClassificationArguments, TrainingArguments)>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let (values, training) = args::parse(argv, &LINE)?;
    let mut cls: ClassificationArguments = values.take(&[0, 1, 2])?;
    cls.peft = values.take(&[3])?;
    cls.peft.check()?;
    if let Some(metric) = &cls.metric_name
        && metric != "accuracy"
        && metric != "mse"
    {
        return Err(Error::InvalidFlag {
            flag: "metric_name".into(),
            detail: format!(
                "{metric:?}: the script computes accuracy (classification) or mse (regression) itself, without `evaluate`; leave the flag out or name one of those"
            ),
        });
    }
    Ok((cls, training))
}

/// Runs the script on `argv` (the command line without the program name).
pub fn main_with_args<I, S>(argv: I) -> Result<ExampleOutput>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let (cls, training) = parse_args(argv)?;
    run(&cls, training)
}

/// Accuracy of the argmax of the logits (mean squared error for regression).
fn classification_metrics(
    regression: bool,
) -> impl FnMut(&EvalPrediction) -> tchtrain_trainer::Result<Metrics> {
    move |p: &EvalPrediction| {
        let mut m = Metrics::new();
        let Some(labels) = &p.label_ids else {
            return Ok(m);
        };
        let labels = labels.array()?;
        if regression {
            let preds = p
                .predictions
                .array()?
                .f_reshape([-1])?
                .f_to_kind(Kind::Double)?;
            let mse = (preds - labels.f_reshape([-1])?.f_to_kind(Kind::Double)?)
                .f_square()?
                .f_mean(Kind::Double)?
                .f_double_value(&[])?;
            m.insert("mse".into(), mse);
        } else {
            let preds = p.predictions.array()?.f_argmax(-1, false)?;
            let acc = preds
                .f_eq_tensor(labels)?
                .f_to_kind(Kind::Double)?
                .f_mean(Kind::Double)?
                .f_double_value(&[])?;
            m.insert("accuracy".into(), acc);
        }
        Ok(m)
    }
}

/// Writes the label names into the saved `config.json` (upstream sets
/// `model.config.label2id` / `id2label` before training).
fn write_labels(dir: &Path, labels: &ClassificationLabels) -> Result<()> {
    let ClassificationLabels::Classes(list) = labels else {
        return Ok(());
    };
    write_label_names(dir, list)
}

/// Writes `id2label` / `label2id` of the class names `list` into `dir`'s `config.json`.
pub(crate) fn write_label_names(dir: &Path, list: &[String]) -> Result<()> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io("reading", &path, e))?;
    let json_err = |source| Error::Json {
        path: path.clone(),
        source,
    };
    let mut config: serde_json::Value = serde_json::from_str(&text).map_err(json_err)?;
    if let Some(obj) = config.as_object_mut() {
        let id2label: serde_json::Map<String, serde_json::Value> = list
            .iter()
            .enumerate()
            .map(|(i, l)| (i.to_string(), l.clone().into()))
            .collect();
        let label2id: serde_json::Map<String, serde_json::Value> = list
            .iter()
            .enumerate()
            .map(|(i, l)| (l.clone(), (i as i64).into()))
            .collect();
        obj.insert("id2label".into(), id2label.into());
        obj.insert("label2id".into(), label2id.into());
    }
    let text = serde_json::to_string_pretty(&config).map_err(json_err)?;
    std::fs::write(&path, text + "\n").map_err(|e| Error::io("writing", &path, e))
}

/// The training, validation and test tables of `--dataset_name` (`load_dataset(name,
/// config)`): the splits `--train_split_name` / `--validation_split_name` /
/// `--test_split_name` (default `train` / `validation` / `test`) unless `--remove_splits`
/// names them, each split's files concatenated.
fn dataset_tables(cls: &ClassificationArguments, name: &str) -> Result<Tables> {
    let splits = common::load_dataset_splits(
        name,
        cls.dataset_config_name.as_deref(),
        cls.token.as_deref(),
    )?;
    let table = |split: &str| -> Result<Option<Table>> {
        if cls.remove_splits.iter().any(|r| r == split) {
            return Ok(None);
        }
        let Some(files) = splits.get(split) else {
            return Ok(None);
        };
        let tables = files
            .iter()
            .map(Table::read)
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(Some(Table::concat(tables)?))
    };
    Ok((
        table(cls.train_split_name.as_deref().unwrap_or("train"))?,
        table(cls.validation_split_name.as_deref().unwrap_or("validation"))?,
        table(cls.test_split_name.as_deref().unwrap_or("test"))?,
    ))
}

/// The training, validation and test tables, each when there is one.
type Tables = (Option<Table>, Option<Table>, Option<Table>);

/// The test table of the files (`--test_file`), read only with `--do_predict` as upstream:
/// its extension must be the training file's (upstream asserts it), and `--do_predict`
/// without one is upstream's "Need either a dataset name or a test file".
fn test_file_table(cls: &ClassificationArguments, do_predict: bool) -> Result<Option<Table>> {
    if !do_predict {
        if cls.test_file.is_some() {
            // Upstream loads the test file only under --do_predict and then raises
            // "--do_predict requires a test dataset".
            return Err(Error::InvalidFlag {
                flag: "test_file".into(),
                detail: "--do_predict requires a test dataset: the test file is read only with --do_predict; pass it, or leave --test_file out".into(),
            });
        }
        return Ok(None);
    }
    let Some(test) = &cls.test_file else {
        return Err(Error::InvalidFlag {
            flag: "test_file".into(),
            detail: "Need either a dataset name or a test file for `do_predict`: pass --test_file FILE or --dataset_name".into(),
        });
    };
    if let Some(train) = &cls.train_file {
        let extension = |f: &str| f.rsplit('.').next().unwrap_or_default().to_string();
        if extension(test) != extension(train) {
            return Err(Error::InvalidFlag {
                flag: "test_file".into(),
                detail: format!(
                    "`test_file` should have the same extension (csv or json) as `train_file` ({test} against {train})"
                ),
            });
        }
    }
    Ok(Some(Table::read(test)?))
}

/// `model.config.id2label` after upstream's `AutoConfig.from_pretrained(num_labels=N)`: the
/// names `config.json` gives when it names exactly `num_labels` classes, else transformers'
/// default `LABEL_{i}` (a config of another size is given new default names).
fn config_id2label(dir: &Path, num_labels: usize) -> Result<Vec<String>> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io("reading", &path, e))?;
    let config: serde_json::Value = serde_json::from_str(&text).map_err(|source| Error::Json {
        path: path.clone(),
        source,
    })?;
    let given = config
        .get("id2label")
        .and_then(serde_json::Value::as_object)
        .filter(|m| m.len() == num_labels);
    Ok((0..num_labels)
        .map(|i| {
            given
                .and_then(|m| m.get(&i.to_string()))
                .and_then(serde_json::Value::as_str)
                .map_or_else(|| format!("LABEL_{i}"), str::to_string)
        })
        .collect())
}

/// Upstream's `predict_results.txt`: `index\tprediction` and a line per row, the argmax's
/// label name (`model.config.id2label`), or the value as `{:3.3f}` for regression.
fn predict_results(predictions: &tch::Tensor, names: Option<&[String]>) -> Result<String> {
    let mut text = String::from("index\tprediction\n");
    match names {
        None => {
            let values =
                Vec::<f64>::try_from(predictions.f_reshape([-1])?.f_to_kind(Kind::Double)?)?;
            for (i, v) in values.iter().enumerate() {
                text.push_str(&format!("{i}\t{v:3.3}\n"));
            }
        }
        Some(names) => {
            let ids = Vec::<i64>::try_from(predictions.f_argmax(-1, false)?)?;
            for (i, id) in ids.iter().enumerate() {
                let name = usize::try_from(*id)
                    .ok()
                    .and_then(|id| names.get(id))
                    .ok_or_else(|| Error::InvalidArgument {
                        field: "id2label",
                        detail: format!("class {id} has no name in the model's id2label"),
                    })?;
                text.push_str(&format!("{i}\t{name}\n"));
            }
        }
    }
    Ok(text)
}

fn read_table(flag: &str, file: Option<&String>) -> Result<Table> {
    let file = file.ok_or_else(|| Error::InvalidFlag {
        flag: flag.into(),
        detail: format!("required: --{flag} FILE (.csv, .json or .jsonl)"),
    })?;
    Ok(Table::read(file)?)
}

/// Runs the script with parsed arguments.
pub fn run(cls: &ClassificationArguments, training: TrainingArguments) -> Result<ExampleOutput> {
    let output_dir = PathBuf::from(training.output_dir());
    let (hub, dir) = common::resolve_model!(cls)?;
    let tok = load_example_tokenizer(&dir, cls.tokenizer_name.as_deref(), &hub)?;

    // The label list comes from the training file, as upstream; without training, from the
    // validation file.
    let (mut train_table, dataset_validation, test_table) = match &cls.dataset_name {
        Some(name) => dataset_tables(cls, name)?,
        None => (
            match (&cls.train_file, training.do_train) {
                (Some(_), _) | (None, true) => {
                    Some(read_table("train_file", cls.train_file.as_ref())?)
                }
                (None, false) => None,
            },
            None,
            test_file_table(cls, training.do_predict)?,
        ),
    };
    if training.do_predict && test_table.is_none() {
        return Err(Error::InvalidFlag {
            flag: "test_split_name".into(),
            detail: "--do_predict requires a test dataset: the dataset has no such split".into(),
        });
    }
    if training.do_train && train_table.is_none() {
        return Err(Error::InvalidFlag {
            flag: "train_split_name".into(),
            detail: "--do_train requires a train dataset: the dataset has no such split".into(),
        });
    }
    let remove = |t: Option<Table>| -> Result<Option<Table>> {
        Ok(match t {
            Some(t) if !cls.remove_columns.is_empty() => {
                Some(t.remove_columns(&cls.remove_columns)?)
            }
            t => t,
        })
    };
    let (train_split, eval_table) = split::prepare_tables(
        cls,
        remove(train_table)?,
        remove(dataset_validation)?,
        training.do_eval,
    )?;
    let eval_table = remove(eval_table)?;
    let test_table = remove(test_table)?;
    train_table = train_split;
    let label_source = train_table
        .as_ref()
        .or(eval_table.as_ref())
        .ok_or_else(|| Error::InvalidFlag {
            flag: "train_file".into(),
            detail: "Need either a training or a validation file (--train_file, --validation_file)"
                .into(),
        })?;
    let mut labels = match cls.do_regression {
        Some(true) => ClassificationLabels::Regression,
        _ => ClassificationLabels::from_table(label_source, &cls.label_column_name)?,
    };
    // Upstream extends the list with the validation and test splits' labels (a test split
    // without a label column adds none).
    if let Some(t) = &eval_table {
        labels.extend_from(t, &cls.label_column_name)?;
    }
    if let Some(t) = &test_table
        && t.column_index(&cls.label_column_name).is_ok()
    {
        labels.extend_from(t, &cls.label_column_name)?;
    }
    // Without training, upstream maps the labels through the checkpoint's own `label2id`
    // ("using label infos in the model config"): a fine-tuned model's class ids, in its
    // order. A label the checkpoint does not name is upstream's KeyError, said here; a
    // checkpoint with default names (`LABEL_0` ...) keeps the data's list, where upstream
    // fails on the first label.
    if !training.do_train
        && let ClassificationLabels::Classes(list) = &labels
    {
        let names = config_id2label(&dir, list.len())?;
        let default = names
            .iter()
            .enumerate()
            .all(|(i, n)| *n == format!("LABEL_{i}"));
        if !default {
            if let Some(unknown) = list.iter().find(|l| !names.contains(l)) {
                return Err(Error::InvalidLabel {
                    label: unknown.clone(),
                    row: 0,
                    detail: format!(
                        "without --do_train the labels are the model's own (label2id {names:?}), and this one is not among them: train with --do_train, or evaluate data labelled as the model is"
                    ),
                });
            }
            log::info!("using label infos in the model config: {names:?}");
            labels = ClassificationLabels::Classes(names);
        }
    }
    let regression = labels == ClassificationLabels::Regression;
    let computed = if regression { "mse" } else { "accuracy" };
    if let Some(metric) = cls.metric_name.as_deref()
        && metric != computed
    {
        return Err(Error::InvalidFlag {
            flag: "metric_name".into(),
            detail: format!(
                "{metric:?}: this is a {} run, whose metric is {computed}; leave the flag out or pass {computed}",
                if regression {
                    "regression"
                } else {
                    "classification"
                }
            ),
        });
    }
    if let ClassificationLabels::Classes(list) = &labels {
        log::info!("labels: {list:?}");
    }

    if cls.shuffle_train_dataset
        && let Some(t) = &train_table
    {
        let order = randperm(t.len(), &mut TorchGenerator::new(cls.shuffle_seed));
        train_table = Some(t.select(&order)?);
    }
    let with_token_type_ids = read_model_type(&dir.join("config.json"))? == "bert";
    let options = TextClassificationOptions {
        text_column_names: cls.text_column_names.clone(),
        text_column_delimiter: cls.text_column_delimiter.clone(),
        label_column_name: Some(cls.label_column_name.clone()),
        max_seq_length: cls.max_seq_length,
        pad_to_max_length: cls.pad_to_max_length,
        with_token_type_ids,
        pad_token_id: tok.info().pad_token_id.unwrap_or(0).max(0) as u32,
    };
    let cache = MapCache::from_env()?;
    let prepare = |table: &Table,
                   max: Option<usize>,
                   options: &TextClassificationOptions|
     -> Result<InMemoryDataset> {
        let table = match max {
            Some(n) => table.select(&(0..n.min(table.len())).collect::<Vec<_>>())?,
            None => table.clone(),
        };
        let mut fingerprint = Fingerprint::new("run_classification.preprocess_function");
        fingerprint
            .update(tokenizer_json(tok.tokenizer())?)
            .update(format!("{labels:?}"))
            .update(format!("{options:?}"));
        table.fingerprint_into(&mut fingerprint);
        let rows = map_cached(cache.as_ref(), &fingerprint, cls.overwrite_cache, || {
            Ok::<_, Error>(
                tokenize_text_classification(&table, tok.tokenizer(), &labels, options)?
                    .rows()
                    .to_vec(),
            )
        })?;
        Ok(InMemoryDataset::new(rows))
    };
    let train_ds = match (&train_table, training.do_train) {
        (Some(t), true) => Some(prepare(t, cls.max_train_samples, &options)?),
        _ => None,
    };
    let eval_ds = match &eval_table {
        Some(t) => Some(prepare(t, cls.max_eval_samples, &options)?),
        None => None,
    };
    // Upstream removes the label column before predicting (it may hold -1).
    let test_options = TextClassificationOptions {
        label_column_name: None,
        ..options.clone()
    };
    let test_ds = match (&test_table, training.do_predict) {
        (Some(t), true) => Some(prepare(t, cls.max_predict_samples, &test_options)?),
        _ => None,
    };

    let num_labels = labels.num_labels() as i64;
    tch::manual_seed(training.seed as i64);
    let loaded = from_pretrained_dir(
        &dir,
        AutoTask::SequenceClassification {
            num_labels: Some(num_labels),
        },
        Device::Cpu,
        &LoadOptions {
            ignore_mismatched_sizes: cls.ignore_mismatched_sizes,
            quantization_config: cls
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
    // Upstream: `processing_class=tokenizer`, and `default_data_collator` with
    // `--pad_to_max_length` (otherwise the Trainer's default, `DataCollatorWithPadding`).
    // TRL: `get_peft_model(model, peft_config)` on the loaded model.
    let model = cls
        .peft
        .wrap(loaded.model, cls.model_name_or_path.as_deref())?;
    let mut builder = Trainer::builder(model, training.clone())
        .processing_class(tok.clone())
        .compute_metrics(Box::new(classification_metrics(regression)));
    if cls.pad_to_max_length {
        builder = builder.data_collator(DefaultDataCollator);
    }
    if let Some(ds) = train_ds {
        builder = builder.train_dataset(Arc::new(ds));
    }
    if let Some(ds) = eval_ds {
        builder = builder.eval_dataset(Arc::new(ds));
    }
    let mut trainer = builder.build()?;
    let mut out = ExampleOutput {
        output_dir,
        ..ExampleOutput::default()
    };

    if training.do_train {
        out.train_metrics = Some(common::do_train(&mut trainer, Some(n_train), |saved| {
            write_labels(saved, &labels)
        })?);
    }
    if training.do_eval {
        out.eval_metrics = Some(common::do_eval(&mut trainer, n_eval, false)?);
    }
    if let Some(ds) = test_ds {
        // Upstream names the classes by `model.config.id2label`: the label list when this
        // run trained, else the loaded config's.
        let names = match &labels {
            ClassificationLabels::Regression => None,
            ClassificationLabels::Classes(list) if training.do_train => Some(list.clone()),
            ClassificationLabels::Classes(list) => Some(config_id2label(&dir, list.len())?),
        };
        let prediction = trainer.predict(Arc::new(ds), "predict")?;
        if let Some(p) = &prediction.predictions
            && trainer.is_world_process_zero()
        {
            let text = predict_results(&p.concatenated()?, names.as_deref())?;
            std::fs::create_dir_all(&out.output_dir)
                .map_err(|e| Error::io("creating", &out.output_dir, e))?;
            let path = out.output_dir.join("predict_results.txt");
            std::fs::write(&path, text).map_err(|e| Error::io("writing", &path, e))?;
            log::info!("Predict results saved at {}", path.display());
        }
        out.predict_metrics = Some(prediction.metrics);
    }
    let card = common::card_options(
        cls.model_name_or_path.as_deref(),
        "text-classification",
        cls.dataset_name.as_deref(),
        cls.dataset_config_name.as_deref(),
    );
    common::push_or_write_model_card(&mut trainer, card)?;
    Ok(out)
}

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
use tchtrain_training_args::TrainingArguments;

use super::ExampleOutput;
use super::args::{self, ScriptFlags};
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

/// The script's own flags (upstream's `ModelArguments` and `DataTrainingArguments`).
#[derive(Debug, Clone, PartialEq)]
pub struct ClassificationArguments {
    /// `--model_name_or_path`: a model folder or hub id (required).
    pub model_name_or_path: Option<String>,
    /// `--tokenizer_name`: a tokenizer folder when the model folder has none.
    pub tokenizer_name: Option<String>,
    /// `--train_file`: `.csv`, `.json` or `.jsonl` (optionally `.bz2`).
    pub train_file: Option<String>,
    /// `--validation_file`.
    pub validation_file: Option<String>,
    /// `--text_column_names`: comma-separated text columns (default `sentence`).
    pub text_column_names: Vec<String>,
    /// `--text_column_delimiter`: joins the text columns (default `" "`).
    pub text_column_delimiter: String,
    /// `--label_column_name` (default `label`).
    pub label_column_name: String,
    /// `--do_regression`: treat the labels as numbers whatever their type.
    pub do_regression: Option<bool>,
    /// `--max_seq_length` (default 128).
    pub max_seq_length: usize,
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
    /// `--label_filter A,B` (not upstream): keep only the rows with these labels.
    pub label_filter: Option<Vec<String>>,
    /// `--validation_split_percentage P` (not upstream; run_clm's flag): without
    /// `--validation_file`, hold out P % of the training rows (seeded by `shuffle_seed`).
    pub validation_split_percentage: Option<usize>,
    /// `--overwrite_cache`: tokenize again instead of loading the cached rows
    /// ([`MapCache`](tchtrain_datasets::MapCache)).
    pub overwrite_cache: bool,
    /// `--ignore_mismatched_sizes` (upstream's `ModelArguments`): re-initialise the weights
    /// whose shapes differ from the checkpoint's (a classifier with another number of
    /// labels) instead of refusing the checkpoint.
    pub ignore_mismatched_sizes: bool,
    /// TRL's LoRA flags (`--use_peft`, `--lora_r`, ...; `--lora_task_type SEQ_CLS` keeps
    /// the new classifier trained and saved with the adapter).
    pub peft: PeftArguments,
}

impl Default for ClassificationArguments {
    fn default() -> Self {
        Self {
            model_name_or_path: None,
            tokenizer_name: None,
            train_file: None,
            validation_file: None,
            text_column_names: vec!["sentence".into()],
            text_column_delimiter: " ".into(),
            label_column_name: "label".into(),
            do_regression: None,
            max_seq_length: 128,
            pad_to_max_length: true,
            shuffle_train_dataset: false,
            shuffle_seed: 42,
            max_train_samples: None,
            max_eval_samples: None,
            label_filter: None,
            validation_split_percentage: None,
            overwrite_cache: false,
            ignore_mismatched_sizes: false,
            peft: PeftArguments::default(),
        }
    }
}

const HELP: &str = "\
run_classification: sequence classification (upstream examples/pytorch/text-classification/run_classification.py)

script flags:
  --model_name_or_path PATH   model folder or hub id (required)
  --tokenizer_name PATH       tokenizer folder (tokenizer.json, or vocab.json + merges.txt)
  --train_file FILE           .csv, .json or .jsonl (optionally .bz2)
  --validation_file FILE      evaluation rows (needed for --do_eval)
  --text_column_names A,B     text columns, joined (default: sentence)
  --text_column_delimiter S   joins the text columns (default: a space)
  --label_column_name NAME    label column (default: label)
  --do_regression BOOL        numeric labels, mean squared error
  --max_seq_length N          truncate to N tokens (default: 128)
  --pad_to_max_length BOOL    pad every row to max_seq_length (default: true)
  --shuffle_train_dataset     shuffle the training rows before --max_train_samples
  --shuffle_seed N            seed of that shuffle (default: 42)
  --max_train_samples N       keep the first N training rows
  --max_eval_samples N        keep the first N evaluation rows
  --label_filter A,B          keep only the rows labelled A or B (both files; not upstream)
  --validation_split_percentage P
                              without --validation_file: hold out P% of the training rows,
                              drawn with --shuffle_seed, for evaluation (not upstream)
  --overwrite_cache [BOOL]    tokenize again instead of loading the cached rows
  --ignore_mismatched_sizes [BOOL]
                              re-initialise weights whose shapes differ from the checkpoint's
  --preprocessing_num_workers N
                              accepted; tokenization uses every core (TCHTRAIN_NUM_PROC)
";

impl ScriptFlags for ClassificationArguments {
    fn apply(&mut self, name: &str, value: Option<&str>) -> Result<bool> {
        match name {
            "model_name_or_path" => self.model_name_or_path = Some(args::string(name, value)?),
            "tokenizer_name" => self.tokenizer_name = Some(args::string(name, value)?),
            "train_file" => self.train_file = Some(args::string(name, value)?),
            "validation_file" => self.validation_file = Some(args::string(name, value)?),
            "text_column_names" => {
                self.text_column_names = args::string(name, value)?
                    .split(',')
                    .map(|s| s.trim().to_string())
                    .collect();
            }
            "text_column_delimiter" => self.text_column_delimiter = args::string(name, value)?,
            "label_column_name" => self.label_column_name = args::string(name, value)?,
            "do_regression" => self.do_regression = Some(args::boolean(name, value)?),
            "max_seq_length" => self.max_seq_length = args::number(name, value)?,
            "pad_to_max_length" => self.pad_to_max_length = args::boolean(name, value)?,
            "shuffle_train_dataset" => self.shuffle_train_dataset = args::boolean(name, value)?,
            "shuffle_seed" => self.shuffle_seed = args::number(name, value)?,
            "max_train_samples" => self.max_train_samples = Some(args::number(name, value)?),
            "max_eval_samples" => self.max_eval_samples = Some(args::number(name, value)?),
            "label_filter" => {
                let labels = args::string(name, value)?;
                self.label_filter = Some(labels.split(',').map(|s| s.trim().to_string()).collect());
            }
            "validation_split_percentage" => {
                self.validation_split_percentage = Some(args::number(name, value)?);
            }
            "overwrite_cache" => self.overwrite_cache = args::boolean(name, value)?,
            "ignore_mismatched_sizes" => {
                self.ignore_mismatched_sizes = args::boolean(name, value)?;
            }
            "preprocessing_num_workers" => {
                args::number::<usize>(name, value)?;
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
pub fn parse_args<I, S>(argv: I) -> Result<(ClassificationArguments, TrainingArguments)>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut cls = ClassificationArguments::default();
    let training = args::parse(argv, &format!("{HELP}\n{}", peft_args::HELP), &mut cls)?;
    cls.peft.check()?;
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
fn write_label_names(dir: &Path, labels: &ClassificationLabels) -> Result<()> {
    let ClassificationLabels::Classes(list) = labels else {
        return Ok(());
    };
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
    if training.do_predict {
        return Err(Error::InvalidArgument {
            field: "do_predict",
            detail: "run_classification does not predict on a test file yet; use --do_eval with --validation_file".into(),
        });
    }
    let dir = common::model_dir(cls.model_name_or_path.as_deref())?;
    let tok = load_example_tokenizer(&dir, cls.tokenizer_name.as_deref())?;

    // The label list comes from the training file, as upstream; without training, from the
    // validation file.
    let mut train_table = match (&cls.train_file, training.do_train) {
        (Some(_), _) | (None, true) => Some(read_table("train_file", cls.train_file.as_ref())?),
        (None, false) => None,
    };
    let (train_split, eval_table) = split::prepare_tables(cls, train_table, training.do_eval)?;
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
    if let Some(t) = &eval_table {
        labels.extend_from(t, &cls.label_column_name)?;
    }
    let regression = labels == ClassificationLabels::Regression;
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
    let prepare = |table: &Table, max: Option<usize>| -> Result<InMemoryDataset> {
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
                tokenize_text_classification(&table, tok.tokenizer(), &labels, &options)?
                    .rows()
                    .to_vec(),
            )
        })?;
        Ok(InMemoryDataset::new(rows))
    };
    let train_ds = match (&train_table, training.do_train) {
        (Some(t), true) => Some(prepare(t, cls.max_train_samples)?),
        _ => None,
    };
    let eval_ds = match &eval_table {
        Some(t) => Some(prepare(t, cls.max_eval_samples)?),
        None => None,
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
            write_label_names(saved, &labels)
        })?);
    }
    if training.do_eval {
        out.eval_metrics = Some(common::do_eval(&mut trainer, n_eval, false)?);
    }
    Ok(out)
}

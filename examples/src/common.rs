//! What the example scripts share: finding the model folder and the tokenizer
//! (`AutoTokenizer.from_pretrained(tokenizer_name or model_name_or_path)`), and the
//! checkpoint to resume from (upstream's "Checkpoint detected, resuming training").

use std::path::{Path, PathBuf};

use tchtrain_models::{AutoTokenizer, HubOptions, PreTrainedTokenizerFast, Tokenizer, resolve};
use tchtrain_training_args::TrainingArguments;

use crate::error::{Error, Result};
use tchtrain_trainer::ResumeFrom;
use tchtrain_trainer::get_last_checkpoint;

/// The hub options of upstream's `ModelArguments`: `--cache_dir`, `--model_revision` and
/// `--token` over the environment's (`HF_HUB_CACHE`, `HF_TOKEN`, ...).
pub(crate) fn hub_options(
    cache_dir: Option<&str>,
    model_revision: &str,
    token: Option<&str>,
) -> HubOptions {
    let env = HubOptions::from_env();
    HubOptions {
        cache_dir: cache_dir.map_or(env.cache_dir.clone(), PathBuf::from),
        revision: model_revision.to_string(),
        token: token.map(str::to_string).or(env.token.clone()),
        ..env
    }
}

/// The hub options and model folder of a script's `ModelArguments` (`--model_name_or_path`,
/// `--config_name`, `--cache_dir`, `--model_revision`, `--token`): [`hub_options`], then
/// [`model_dir`]. `resolve_model!(args)` passes those fields of `args`.
pub(crate) fn resolve_model_dir(
    name_or_path: Option<&str>,
    config_name: Option<&str>,
    cache_dir: Option<&str>,
    model_revision: &str,
    token: Option<&str>,
) -> Result<(HubOptions, PathBuf)> {
    let hub = hub_options(cache_dir, model_revision, token);
    let dir = model_dir(name_or_path, config_name, &hub)?;
    Ok((hub, dir))
}

/// [`resolve_model_dir`] with the fields of a script's arguments.
macro_rules! resolve_model {
    ($args:expr) => {
        $crate::common::resolve_model_dir(
            $args.model_name_or_path.as_deref(),
            $args.config_name.as_deref(),
            $args.cache_dir.as_deref(),
            &$args.model_revision,
            $args.token.as_deref(),
        )
    };
}
pub(crate) use resolve_model;

/// A tokenizer folder: a local folder as it is (it need not hold a model), else a hub id
/// resolved through the cache or a download.
fn tokenizer_dir(name: &str, hub: &HubOptions) -> Result<PathBuf> {
    let local = Path::new(name);
    if local.is_dir() {
        return Ok(local.to_path_buf());
    }
    Ok(resolve(name, hub)?)
}

/// Resolves `--model_name_or_path` (a local folder, the hub cache, or a download). A
/// `--config_name` other than that folder is refused: the config is the checkpoint's.
pub(crate) fn model_dir(
    name_or_path: Option<&str>,
    config_name: Option<&str>,
    hub: &HubOptions,
) -> Result<PathBuf> {
    let name = name_or_path.ok_or_else(|| Error::InvalidFlag {
        flag: "model_name_or_path".into(),
        detail: "required: a model folder (e.g. assets/tiny-gpt2) or a hub id; training from scratch is not supported".into(),
    })?;
    let dir = resolve(name, hub)?;
    if let Some(c) = config_name
        && c != name
        && Path::new(c) != dir
    {
        return Err(Error::InvalidFlag {
            flag: "config_name".into(),
            detail: "a config apart from the model folder is not supported; put it in --model_name_or_path".into(),
        });
    }
    Ok(dir)
}

/// Upstream `AutoTokenizer.from_pretrained(tokenizer_name or model_name_or_path)`:
/// `tokenizer_name` (`--tokenizer_name`, a folder or hub id) wins over the model folder; a
/// folder without a tokenizer names the flag to fix.
pub fn load_example_tokenizer(
    model_dir: &Path,
    tokenizer_name: Option<&str>,
    hub: &HubOptions,
) -> Result<PreTrainedTokenizerFast> {
    let dir = match tokenizer_name {
        Some(name) => tokenizer_dir(name, hub)?,
        None => model_dir.to_path_buf(),
    };
    match AutoTokenizer::from_pretrained(&dir) {
        Err(tchtrain_models::Error::MissingFile { .. }) => Err(Error::InvalidFlag {
            flag: if tokenizer_name.is_some() {
                "tokenizer_name".into()
            } else {
                "model_name_or_path".into()
            },
            detail: format!(
                "{} has no tokenizer.json (nor vocab.json + merges.txt); pass --tokenizer_name with a folder that has one",
                dir.display()
            ),
        }),
        other => Ok(other?),
    }
}

/// The checkpoint `train` resumes from: `--resume_from_checkpoint`, else the last
/// `checkpoint-N` already in `output_dir` (upstream's scripts resume from it).
pub(crate) fn resume_point(args: &TrainingArguments) -> Result<Option<ResumeFrom>> {
    if let Some(path) = &args.resume_from_checkpoint {
        return Ok(Some(match path.as_str() {
            "True" | "true" => ResumeFrom::Last,
            p => ResumeFrom::Path(PathBuf::from(p)),
        }));
    }
    let dir = Path::new(args.output_dir());
    if args.do_train
        && dir.is_dir()
        && let Some(last) = get_last_checkpoint(dir)?
    {
        log::info!(
            "Checkpoint detected, resuming training at {}. To avoid this behavior, change the `--output_dir` or delete it.",
            last.display()
        );
        return Ok(Some(ResumeFrom::Path(last)));
    }
    Ok(None)
}

/// The `--do_train` part every script shares: train (resuming as
/// `--resume_from_checkpoint` says), save the model, then `save_extra` (what a script writes
/// beside it, e.g. label names) when this process saves (the Trainer saves the tokenizer,
/// its `processing_class`, with the model), then log and write `train_results.json` (with
/// `train_samples` when known) and `trainer_state.json`.
pub(crate) fn do_train(
    trainer: &mut tchtrain_trainer::Trainer,
    train_samples: Option<usize>,
    save_extra: impl FnOnce(&Path) -> Result<()>,
) -> Result<tchtrain_trainer::Metrics> {
    let resume = resume_point(trainer.args())?;
    let result = trainer.train(resume)?;
    let saved = trainer.save_model(None)?;
    // Upstream's `save_model` pushes when `push_to_hub` is set ("Model save"); ours does not
    // push by itself, so the scripts do it here.
    if trainer.args().push_to_hub {
        trainer.push_to_hub(
            Some("Model save"),
            tchtrain_trainer::ModelCardOptions::default(),
        )?;
    }
    if trainer.args().should_save() {
        save_extra(&saved)?;
    }
    let mut metrics = result.metrics;
    if let Some(n) = train_samples {
        metrics.insert("train_samples".into(), n as f64);
    }
    trainer.log_metrics("train", &metrics);
    trainer.save_metrics("train", &metrics, true)?;
    trainer.save_state()?;
    Ok(metrics)
}

/// The model card's arguments every script passes (`kwargs`): `finetuned_from` the model,
/// the script's task, and with `--dataset_name` its tags (`dataset_tags`, `dataset_args`,
/// `dataset` as `"<name> <config>"`).
pub(crate) fn card_options(
    model_name_or_path: Option<&str>,
    task: &str,
    dataset_name: Option<&str>,
    dataset_config_name: Option<&str>,
) -> tchtrain_trainer::ModelCardOptions {
    let mut o = tchtrain_trainer::ModelCardOptions {
        finetuned_from: model_name_or_path.map(str::to_string),
        tasks: vec![task.to_string()],
        ..Default::default()
    };
    if let Some(name) = dataset_name {
        o.dataset_tags = vec![name.to_string()];
        match dataset_config_name {
            Some(config) => {
                o.dataset_args = vec![config.to_string()];
                o.dataset = vec![format!("{name} {config}")];
            }
            None => o.dataset = vec![name.to_string()],
        }
    }
    o
}

/// The scripts' end: `trainer.push_to_hub(**kwargs)` with `--push_to_hub`, else
/// `trainer.create_model_card(**kwargs)` (README.md in `output_dir`).
pub(crate) fn push_or_write_model_card(
    trainer: &mut tchtrain_trainer::Trainer,
    options: tchtrain_trainer::ModelCardOptions,
) -> Result<()> {
    if trainer.args().push_to_hub {
        trainer.push_to_hub(None, options)?;
    } else {
        trainer.create_model_card(options)?;
    }
    Ok(())
}

/// The `--do_eval` part every script shares: evaluate, add `eval_samples` (and the
/// perplexity for language models), log and write `eval_results.json`.
pub(crate) fn do_eval(
    trainer: &mut tchtrain_trainer::Trainer,
    eval_samples: usize,
    perplexity: bool,
) -> Result<tchtrain_trainer::Metrics> {
    let mut metrics = trainer.evaluate(None, "eval")?;
    metrics.insert("eval_samples".into(), eval_samples as f64);
    if perplexity && let Some(loss) = metrics.get("eval_loss").copied() {
        metrics.insert("perplexity".into(), loss.exp());
    }
    trainer.log_metrics("eval", &metrics);
    trainer.save_metrics("eval", &metrics, true)?;
    Ok(metrics)
}

/// The rows of a text data file for the language-modelling scripts: the lines of a `.txt`
/// (or `.txt.bz2`; the `datasets` text loader, line breaks kept as asked), else the `text`
/// column (or the first one) of a CSV / JSON file.
pub(crate) fn read_text_rows(path: &str, keep_linebreaks: bool) -> Result<Vec<String>> {
    let lower = path.to_ascii_lowercase();
    if lower.ends_with(".txt.bz2") {
        let text = tchtrain_datasets::read_text_maybe_bz2(path)?;
        return Ok(tchtrain_datasets::split_lines(&text, keep_linebreaks));
    }
    if lower.ends_with(".txt") {
        return Ok(tchtrain_datasets::load_text_lines(path, keep_linebreaks)?);
    }
    let table = tchtrain_datasets::Table::read(path)?;
    let column = if table.columns().iter().any(|c| c == "text") {
        "text".to_string()
    } else {
        table
            .columns()
            .first()
            .cloned()
            .ok_or_else(|| Error::EmptyDataset {
                what: "training",
                hint: format!(": {path} has no columns"),
            })?
    };
    Ok(table
        .column(&column)?
        .into_iter()
        .map(tchtrain_datasets::cell_text)
        .collect())
}

/// `datasets`' percent slice boundary (`rounding="closest"`): `round(p * n / 100)`.
pub(crate) fn split_boundary(percent: usize, n: usize) -> usize {
    (percent as f64 * n as f64 / 100.0).round_ties_even() as usize
}

/// `load_dataset(--dataset_name, --dataset_config_name, token=--token)`: each split's data
/// files, resolved as `datasets` resolves a hub dataset repository (its own data files, or
/// its `refs/convert/parquet` export) or a local folder, downloaded into the HF hub cache
/// (`HF_HUB_OFFLINE` / `HF_DATASETS_OFFLINE` honoured). `--cache_dir` is not passed, on
/// purpose: upstream passes it to `load_dataset`, where it places `datasets`' own Arrow
/// cache, while datasets 5.2 downloads a repository's files with `hf_hub_download` into the
/// HF hub cache whatever it says (`utils/file_utils.py`, `cached_path`); the tokenized rows'
/// cache here is `MapCache`'s.
pub(crate) fn load_dataset_splits(
    name: &str,
    config_name: Option<&str>,
    token: Option<&str>,
) -> Result<tchtrain_datasets::DataFilesDict> {
    let mut options = tchtrain_datasets::hub_options_from_env();
    if let Some(t) = token {
        options.token = Some(t.to_string());
    }
    let files = tchtrain_datasets::load_dataset_files(name, config_name, None, &options)?;
    log::info!(
        "dataset {name} (config {}): {}",
        files.config_name,
        files
            .data_files
            .iter()
            .map(|(split, f)| format!("{split}: {} file(s)", f.len()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(files.data_files)
}

/// A dataset split's files read and concatenated in order (one table).
pub(crate) fn concat_files(files: &[PathBuf]) -> Result<tchtrain_datasets::Table> {
    let tables = files
        .iter()
        .map(tchtrain_datasets::Table::read)
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(tchtrain_datasets::Table::concat(tables)?)
}

/// The text rows of a dataset split's files, in order ([`read_text_rows`] of each; the
/// `text` builder of `load_dataset(name)` drops line breaks, as `keep_linebreaks` is passed
/// for local files only upstream).
pub(crate) fn split_text_rows(files: &[PathBuf]) -> Result<Vec<String>> {
    let mut rows = Vec::new();
    for f in files {
        rows.extend(read_text_rows(&f.display().to_string(), false)?);
    }
    Ok(rows)
}

/// The language-modelling scripts' rows of `--dataset_name`: the `train` split's text
/// rows and the `validation` split's, or, without a validation split, upstream's
/// `train[:N%]` as validation and `train[N%:]` as training. `None` for the training rows
/// when the dataset has no `train` split.
pub(crate) fn dataset_text_splits(
    name: &str,
    config_name: Option<&str>,
    token: Option<&str>,
    validation_split_percentage: usize,
) -> Result<(Option<Vec<String>>, Vec<String>)> {
    let splits = load_dataset_splits(name, config_name, token)?;
    let mut train = splits.get("train").map(split_text_rows).transpose()?;
    let eval = match (splits.get("validation"), train.as_mut()) {
        (Some(files), _) => split_text_rows(files)?,
        (None, Some(rows)) => {
            let cut = split_boundary(validation_split_percentage, rows.len());
            let rest = rows.split_off(cut);
            std::mem::replace(rows, rest)
        }
        (None, None) => Vec::new(),
    };
    Ok((train, eval))
}

/// The tokenizer's JSON (`tokenizer.json`'s content), part of a dataset-cache fingerprint.
pub(crate) fn tokenizer_json(tokenizer: &Tokenizer) -> Result<String> {
    tokenizer.to_string(false).map_err(|e| Error::Tokenizer {
        what: "serializing the tokenizer for the dataset cache".into(),
        detail: e.to_string(),
    })
}

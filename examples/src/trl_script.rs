//! What TRL's scripts (`trl sft`, `trl reward`, `trl dpo`) share: `ScriptArguments` and the
//! model fields of `ModelConfig`, TRL's defaults for the Trainer's flags, the dataset splits,
//! the model folder and tokenizer, and the run's end (train, resuming from
//! `--resume_from_checkpoint`, then save).

use std::path::{Path, PathBuf};

use tchtrain_datasets::Table;
use tchtrain_models::{LoadDtype, PreTrainedTokenizerFast};
use tchtrain_trainer::Trainer;
use tchtrain_training_args::{Dataclass, FieldSpec, IntervalStrategy, TrainingArguments};

use super::ExampleOutput;
use super::args::{self, refusals};
use super::common;
use crate::error::{Error, Result};

/// TRL's `ScriptArguments` and the model fields of `ModelConfig`.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrlScriptArguments {
    /// `--dataset_name`: a local folder of data files or a hub dataset.
    pub dataset_name: Option<String>,
    /// `--dataset_config`.
    pub dataset_config: Option<String>,
    /// `--dataset_train_split` (`train`).
    pub dataset_train_split: String,
    /// `--dataset_test_split` (`test`).
    pub dataset_test_split: String,
    /// `--dataset_streaming` (refused).
    pub dataset_streaming: bool,
    /// `--model_name_or_path`.
    pub model_name_or_path: Option<String>,
    /// `--model_revision` (`main`).
    pub model_revision: String,
    /// `--dtype` (`auto`: as the checkpoint).
    #[serde(default, deserialize_with = "args::from_str")]
    pub dtype: LoadDtype,
}

/// TRL's `ScriptArguments`.
pub(crate) static SCRIPT_ARGUMENTS: Dataclass = Dataclass {
    name: "ScriptArguments",
    fields: &[
        FieldSpec::str(
            "dataset_name",
            "None",
            "Path or name of the dataset to load (a local folder of data files, or a hub dataset).",
        ),
        FieldSpec::str("dataset_config", "None", "Dataset configuration name."),
        FieldSpec::str(
            "dataset_train_split",
            "train",
            "Dataset split to use for training.",
        ),
        FieldSpec::str(
            "dataset_test_split",
            "test",
            "Dataset split to use for evaluation.",
        ),
        FieldSpec::bool(
            "dataset_streaming",
            false,
            "Whether to stream the dataset (not supported here).",
        ),
    ],
};

/// TRL's `ModelConfig` (the model fields; its LoRA and quantization flags are
/// [`peft_args::LORA_ARGUMENTS`]).
pub(crate) static MODEL_CONFIG: Dataclass = Dataclass {
    name: "ModelConfig",
    fields: &[
        FieldSpec::str(
            "model_name_or_path",
            "None",
            "Model checkpoint for weights initialization.",
        ),
        FieldSpec::str("model_revision", "main", "Specific model version to use."),
        FieldSpec::str(
            "dtype",
            "auto",
            "Override the default `torch.dtype` and load the model under this dtype.",
        ),
        FieldSpec::bool(
            "trust_remote_code",
            false,
            "Whether to allow for custom models defined on the Hub in their own modeling files.",
        ),
        FieldSpec::str(
            "attn_implementation",
            "None",
            "Which attention implementation to use (the models' own here).",
        ),
    ],
};

/// The fields every TRL trainer's config has, as one group of flags.
pub(crate) static COMMON_CONFIG: Dataclass = Dataclass {
    name: "the trainer's config (shared fields)",
    fields: &[
        FieldSpec::str("pad_token", "None", "Token used for padding (deprecated)."),
        FieldSpec::str(
            "pad_to_multiple_of",
            "auto",
            "Pad the batches to a multiple of this value (auto: 128 on Neuron, none elsewhere).",
        ),
        FieldSpec::bool(
            "activation_offloading",
            false,
            "Whether to offload the activations to the CPU (not supported here).",
        ),
        FieldSpec::int(
            "dataset_num_proc",
            "None",
            "Number of processes to use for processing the dataset.",
        ),
    ],
};

/// The values of [`COMMON_CONFIG`].
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrlCommonArguments {
    /// `--pad_token`.
    pub pad_token: Option<String>,
    /// `--pad_to_multiple_of` (`auto`: none on the CPU).
    pub pad_to_multiple_of: Option<String>,
    /// `--activation_offloading` (refused by the trainers).
    pub activation_offloading: bool,
    /// `--dataset_num_proc` (a speed knob: the preparation runs in this process).
    pub dataset_num_proc: Option<usize>,
}

impl TrlCommonArguments {
    /// `--pad_to_multiple_of`'s value.
    pub fn pad_to_multiple_of(&self) -> Result<Option<usize>> {
        pad_to_multiple_of(self.pad_to_multiple_of.as_deref())
    }
}

/// The flags of `ModelConfig` refused here.
pub(crate) const REFUSED: &[args::Refusal] = &[
    refusals::TRUST_REMOTE_CODE,
    args::Refusal {
        flag: "attn_implementation",
        reason: "the models run their own attention here (sdpa's numbers); leave it unset",
    },
];

/// The script and model arguments of a parsed command line (its dataclasses 0 and 1).
pub(crate) fn script_arguments(values: &args::ScriptValues) -> Result<TrlScriptArguments> {
    let script: TrlScriptArguments = values.take(&[0, 1])?;
    if script.dataset_streaming {
        return Err(Error::InvalidFlag {
            flag: "dataset_streaming".into(),
            detail: "TRL's trainers prepare the whole dataset (tokenized) before training here; leave it out".into(),
        });
    }
    Ok(script)
}

/// TRL's defaults for the Trainer's flags (`_BaseConfig` and the trainer's config: its
/// `learning_rate`), put before the given ones so that a flag given wins (the last value of a
/// flag is the one kept); `--bf16` unless `--fp16` is given (`bf16=None` resolves to `not
/// fp16`). A JSON file is read as it is.
pub(crate) fn with_trl_defaults(argv: Vec<String>, learning_rate: &str) -> Vec<String> {
    if argv.len() == 1 && argv[0].ends_with(".json") {
        return argv;
    }
    let mut out: Vec<String> = [
        "--learning_rate",
        learning_rate,
        "--logging_steps",
        "10",
        "--gradient_checkpointing",
        "True",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let fp16 = argv
        .iter()
        .any(|a| a == "--fp16" || a.starts_with("--fp16="));
    if !fp16 {
        out.extend(["--bf16".to_string(), "True".to_string()]);
    }
    out.extend(argv);
    out
}

/// `--pad_to_multiple_of`: `auto` (TRL's default: 128 on Neuron, which this machine is not,
/// so none), `None`, or a positive multiple.
pub(crate) fn pad_to_multiple_of(value: Option<&str>) -> Result<Option<usize>> {
    match value {
        None | Some("auto") => Ok(None),
        Some(v) if v.eq_ignore_ascii_case("none") || v == "null" => Ok(None),
        Some(v) => match v.parse::<usize>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(Error::InvalidFlag {
                flag: "pad_to_multiple_of".into(),
                detail: format!("{v}: give a positive integer, None or auto"),
            }),
        },
    }
}

/// `--dataset_num_proc` is a speed knob: the preparation runs in this process, with the same
/// rows.
pub(crate) fn note_dataset_num_proc(n: Option<usize>) {
    if n.is_some() {
        log::info!(
            "--dataset_num_proc: the dataset is prepared in this process, with the same result"
        );
    }
}

/// The split's rows: its files read and concatenated.
fn split(files: &tchtrain_datasets::DataFilesDict, name: &str) -> Result<Option<Table>> {
    let Some(paths) = files.get(name) else {
        return Ok(None);
    };
    let tables = paths
        .iter()
        .map(Table::read)
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(Some(Table::concat(tables)?))
}

/// `load_dataset(dataset_name, name=dataset_config)`: the train split, and the test split
/// when `--eval_strategy` is not `no`.
pub(crate) fn load_splits(
    script: &TrlScriptArguments,
    training: &TrainingArguments,
) -> Result<(Table, Option<Table>)> {
    let name = script.dataset_name.as_deref().ok_or_else(|| Error::InvalidFlag {
        flag: "dataset_name".into(),
        detail: "Either `datasets` or `dataset_name` must be provided. (TRL's message; `datasets` mixtures are not read here)".into(),
    })?;
    let files = common::load_dataset_splits(name, script.dataset_config.as_deref(), None)?;
    let train = split(&files, &script.dataset_train_split)?.ok_or_else(|| Error::InvalidFlag {
        flag: "dataset_train_split".into(),
        detail: format!(
            "{name} has no split {:?} (its splits: {:?})",
            script.dataset_train_split,
            files.split_names().collect::<Vec<_>>()
        ),
    })?;
    let eval = if training.eval_strategy != IntervalStrategy::No {
        Some(
            split(&files, &script.dataset_test_split)?.ok_or_else(|| Error::InvalidFlag {
                flag: "dataset_test_split".into(),
                detail: format!(
                    "--eval_strategy is not `no` but {name} has no split {:?}",
                    script.dataset_test_split
                ),
            })?,
        )
    } else {
        None
    };
    Ok((train, eval))
}

/// `--model_name_or_path`'s folder (a hub model downloaded) and its tokenizer.
pub(crate) fn model_and_tokenizer(
    script: &TrlScriptArguments,
) -> Result<(PathBuf, PreTrainedTokenizerFast)> {
    let (hub, dir) = common::resolve_model_dir(
        script.model_name_or_path.as_deref(),
        None,
        None,
        &script.model_revision,
        None,
    )?;
    let tokenizer = common::load_example_tokenizer(&dir, None, &hub)?;
    Ok((dir, tokenizer))
}

/// TRL's scripts end with `trainer.push_to_hub(dataset_name=...)`, whose model card is TRL's
/// own (`trl/templates/lm_model_card.md`), not implemented here: `--push_to_hub` is refused
/// before training (the Trainer's own pushes work in a program that builds the trainer).
pub(crate) fn refuse_push_to_hub(training: &TrainingArguments) -> Result<()> {
    if training.push_to_hub {
        return Err(Error::InvalidFlag {
            flag: "push_to_hub".into(),
            detail: "TRL's scripts push with TRL's own model card (its template), which is not implemented here; train without --push_to_hub and upload output_dir (`hf upload`), or build the trainer in a program and call push_to_hub (transformers' card)".into(),
        });
    }
    Ok(())
}

/// `AutoProcessor.from_pretrained(dir)` where it gives a processor: a folder with
/// `processor_config.json` naming `Gemma3Processor` (another processor class is refused);
/// `None` for a tokenizer-only folder.
pub(crate) fn processor(dir: &Path) -> Result<Option<tchtrain_models::Gemma3Processor>> {
    let path = dir.join(tchtrain_models::PROCESSOR_NAME);
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).map_err(|e| Error::InvalidFlag {
        flag: "model_name_or_path".into(),
        detail: format!("{}: {e}", path.display()),
    })?;
    let config: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::InvalidFlag {
            flag: "model_name_or_path".into(),
            detail: format!("{}: {e}", path.display()),
        })?;
    match config
        .get("processor_class")
        .and_then(serde_json::Value::as_str)
    {
        Some("Gemma3Processor") | None => Ok(Some(
            tchtrain_models::Gemma3Processor::from_pretrained(dir)?,
        )),
        Some(other) => Err(Error::InvalidFlag {
            flag: "model_name_or_path".into(),
            detail: format!(
                "{}: the processor {other} is not implemented here (Gemma3Processor is)",
                path.display()
            ),
        }),
    }
}

/// TRL's scripts' end: `trainer.train(resume_from_checkpoint=...)`, then
/// `trainer.save_model(output_dir)`.
pub(crate) fn train_and_save(trainer: &mut Trainer) -> Result<ExampleOutput> {
    let output_dir = Path::new(trainer.args().output_dir()).to_path_buf();
    let resume = trainer
        .args()
        .resume_from_checkpoint
        .as_ref()
        .map(|p| tchtrain_trainer::ResumeFrom::Path(p.into()));
    let result = trainer.train(resume)?;
    trainer.save_model(None)?;
    log::info!(
        "Training completed. Model saved to {}.",
        output_dir.display()
    );
    Ok(ExampleOutput {
        output_dir,
        train_metrics: Some(result.metrics),
        ..ExampleOutput::default()
    })
}

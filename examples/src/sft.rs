//! TRL's `trl sft` (`trl/scripts/sft.py`): supervised fine-tuning of a causal LM with
//! [`SFTTrainer`](tchtrain_trl::SFTTrainer), read as TRL reads its command line —
//! `TrlParser((ScriptArguments, SFTConfig, ModelConfig))`, or a JSON file of the same keys.
//!
//! `--dataset_name` is a local folder of data files (JSON lines, Parquet, CSV: its
//! `train` / `test` splits by file name, as `load_dataset(folder)`) or a hub dataset; the
//! rows are in TRL's formats (`text`, `messages`, `prompt` / `completion`). The SFT flags
//! (`--max_length`, `--packing`, `--completion_only_loss`, `--assistant_only_loss`,
//! `--chat_template_path`, `--loss_type`, ...) and TRL's LoRA / quantization flags are
//! TRL's; the Trainer's flags are the Trainer's, with TRL's defaults (`--learning_rate`
//! 2e-5, `--logging_steps` 10, `--gradient_checkpointing`, `--bf16` unless `--fp16`). The
//! run trains (resuming from `--resume_from_checkpoint`), evaluates on `--dataset_test_split`
//! when `--eval_strategy` is not `no`, and saves the model in `--output_dir`.
//!
//! ```no_run
//! let out = tchtrain_examples::sft::main_with_args([
//!     "--model_name_or_path", "assets/tiny-llama", "--dataset_name", "data/chat",
//!     "--max_steps", "10", "--output_dir", "out/sft",
//! ])?;
//! println!("{:?}", out.train_metrics);
//! # Ok::<(), tchtrain_examples::Error>(())
//! ```

use std::path::Path;

use tch::Device;
use tchtrain_datasets::{PackingStrategy, Table};
use tchtrain_models::{AutoTask, LoadDtype, LoadOptions, from_pretrained_dir};
use tchtrain_training_args::{Dataclass, FieldSpec, IntervalStrategy, TrainingArguments};
use tchtrain_trl::{SFTConfig, SFTTrainer, SftLossType, TruncationMode};

use super::ExampleOutput;
use super::args::{self, ScriptCommandLine, refusals};
use super::common;
use super::peft_args::{self, PeftArguments};
use crate::error::{Error, Result};

/// TRL's `ScriptArguments` and `ModelConfig` (the model fields) and the SFT fields of
/// `SFTConfig`.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SftArguments {
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
    /// `--dtype` (`auto`... as the checkpoint).
    #[serde(default, deserialize_with = "args::from_str")]
    pub dtype: LoadDtype,
    /// `--dataset_text_field` (`text`).
    pub dataset_text_field: String,
    /// `--max_length` (1024; `None`: no truncation).
    #[serde(deserialize_with = "none_or_usize")]
    pub max_length: Option<usize>,
    /// `--truncation_mode` (`keep_start`).
    pub truncation_mode: String,
    /// `--packing`.
    pub packing: bool,
    /// `--packing_strategy` (`bfd`).
    #[serde(deserialize_with = "args::from_str")]
    pub packing_strategy: PackingStrategy,
    /// `--padding_free`.
    pub padding_free: bool,
    /// `--eval_packing`.
    pub eval_packing: Option<bool>,
    /// `--completion_only_loss`.
    pub completion_only_loss: Option<bool>,
    /// `--assistant_only_loss`.
    pub assistant_only_loss: bool,
    /// `--loss_type` (`nll`).
    pub loss_type: String,
    /// `--eos_token`.
    pub eos_token: Option<String>,
    /// `--pad_token`.
    pub pad_token: Option<String>,
    /// `--chat_template_path`.
    pub chat_template_path: Option<String>,
    /// `--shuffle_dataset`.
    pub shuffle_dataset: bool,
    /// `--activation_offloading`.
    pub activation_offloading: bool,
    /// `--dataset_num_proc` (a speed knob: the preparation runs in this process).
    pub dataset_num_proc: Option<usize>,
    /// TRL's LoRA and quantization flags.
    #[serde(skip)]
    pub peft: PeftArguments,
}

fn none_or_usize<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<usize>, D::Error> {
    use serde::Deserialize;
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::Null => Ok(None),
        serde_json::Value::String(s) if s == "None" || s == "null" => Ok(None),
        serde_json::Value::String(s) => s.parse().map(Some).map_err(serde::de::Error::custom),
        v => v
            .as_u64()
            .map(|n| Some(n as usize))
            .ok_or_else(|| serde::de::Error::custom(format!("{v}: a length or None"))),
    }
}

/// TRL's `ScriptArguments`.
static SCRIPT_ARGUMENTS: Dataclass = Dataclass {
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
static MODEL_CONFIG: Dataclass = Dataclass {
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

/// The SFT fields of TRL's `SFTConfig`.
static SFT_CONFIG: Dataclass = Dataclass {
    name: "SFTConfig",
    fields: &[
        FieldSpec::str(
            "dataset_text_field",
            "text",
            "Name of the column that contains text data in the dataset.",
        ),
        FieldSpec::int(
            "max_length",
            "1024",
            "Maximum length of the tokenized sequence (None: no truncation).",
        ),
        FieldSpec::str(
            "truncation_mode",
            "keep_start",
            "Truncation mode to use when the sequence exceeds `max_length`.",
        )
        .choices(&["keep_start", "keep_end"]),
        FieldSpec::bool(
            "packing",
            false,
            "Whether to group multiple sequences into fixed-length blocks.",
        ),
        FieldSpec::str(
            "packing_strategy",
            "bfd",
            "Strategy for packing sequences: bfd, bfd_split or wrapped.",
        ),
        FieldSpec::bool(
            "padding_free",
            false,
            "Whether to perform forward passes without padding by flattening all sequences in the batch.",
        ),
        FieldSpec::optional_bool(
            "eval_packing",
            "Whether to pack the eval dataset (default: as packing).",
        ),
        FieldSpec::optional_bool(
            "completion_only_loss",
            "Whether to compute loss only on the completion part of the sequence (default: for prompt-completion datasets).",
        ),
        FieldSpec::bool(
            "assistant_only_loss",
            false,
            "Whether to compute loss only on the assistant part of the sequence.",
        ),
        FieldSpec::str("loss_type", "nll", "Type of loss to use: nll or dft.").choices(&[
            "nll",
            "dft",
            "chunked_nll",
        ]),
        FieldSpec::str(
            "eos_token",
            "None",
            "Token used to indicate the end of a turn or sequence.",
        ),
        FieldSpec::str("pad_token", "None", "Token used for padding (deprecated)."),
        FieldSpec::str(
            "chat_template_path",
            "None",
            "A .jinja / .j2 chat template file replacing the tokenizer's.",
        ),
        FieldSpec::bool(
            "shuffle_dataset",
            false,
            "Whether to shuffle the dataset (not supported here).",
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

/// The command line: TRL's dataclasses and LoRA flags.
pub const COMMAND_LINE: &[&Dataclass] = &[
    &SCRIPT_ARGUMENTS,
    &MODEL_CONFIG,
    &SFT_CONFIG,
    &peft_args::LORA_ARGUMENTS,
];

const LINE: ScriptCommandLine = ScriptCommandLine {
    title: "sft: supervised fine-tuning (TRL's trl sft, trl/scripts/sft.py)",
    dataclasses: COMMAND_LINE,
    refused: &[
        refusals::TRUST_REMOTE_CODE,
        args::Refusal {
            flag: "attn_implementation",
            reason: "the models run their own attention here (sdpa's numbers); leave it unset",
        },
    ],
};

/// TRL's defaults for the Trainer's flags (`_BaseConfig`, `SFTConfig`), put before the given
/// ones so that a flag given wins (the last value of a flag is the one kept); `--bf16` unless
/// `--fp16` is given (`bf16=None` resolves to `not fp16`). A JSON file is read as it is.
fn with_trl_defaults(argv: Vec<String>) -> Vec<String> {
    if argv.len() == 1 && argv[0].ends_with(".json") {
        return argv;
    }
    let mut out: Vec<String> = [
        "--learning_rate",
        "2e-5",
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

/// Parses a command line (without the program name).
pub fn parse_args<I, S>(argv: I) -> Result<(SftArguments, TrainingArguments)>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let argv: Vec<String> = argv.into_iter().map(|a| a.as_ref().to_string()).collect();
    let (values, training) = args::parse(with_trl_defaults(argv), &LINE)?;
    let mut sft: SftArguments = values.take(&[0, 1, 2])?;
    sft.peft = values.take(&[3])?;
    if sft.dataset_streaming {
        return Err(Error::InvalidFlag {
            flag: "dataset_streaming".into(),
            detail: "SFT prepares the whole dataset (tokenized, packed) before training here; leave it out".into(),
        });
    }
    if sft.dataset_num_proc.is_some() {
        log::info!(
            "--dataset_num_proc: the dataset is prepared in this process, with the same result"
        );
    }
    Ok((sft, training))
}

/// Runs the script on `argv` (the command line without the program name).
pub fn main_with_args<I, S>(argv: I) -> Result<ExampleOutput>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let (sft, training) = parse_args(argv)?;
    run(&sft, training)
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

/// Runs the script with parsed arguments.
pub fn run(sft: &SftArguments, training: TrainingArguments) -> Result<ExampleOutput> {
    let output_dir = Path::new(training.output_dir()).to_path_buf();
    let name = sft.dataset_name.as_deref().ok_or_else(|| Error::InvalidFlag {
        flag: "dataset_name".into(),
        detail: "Either `datasets` or `dataset_name` must be provided. (TRL's message; `datasets` mixtures are not read here)".into(),
    })?;
    let files = common::load_dataset_splits(name, sft.dataset_config.as_deref(), None)?;
    let train = split(&files, &sft.dataset_train_split)?.ok_or_else(|| Error::InvalidFlag {
        flag: "dataset_train_split".into(),
        detail: format!(
            "{name} has no split {:?} (its splits: {:?})",
            sft.dataset_train_split,
            files.split_names().collect::<Vec<_>>()
        ),
    })?;
    let eval = if training.eval_strategy != IntervalStrategy::No {
        Some(
            split(&files, &sft.dataset_test_split)?.ok_or_else(|| Error::InvalidFlag {
                flag: "dataset_test_split".into(),
                detail: format!(
                    "--eval_strategy is not `no` but {name} has no split {:?}",
                    sft.dataset_test_split
                ),
            })?,
        )
    } else {
        None
    };
    let (hub, dir) = common::resolve_model_dir(
        sft.model_name_or_path.as_deref(),
        None,
        None,
        &sft.model_revision,
        None,
    )?;
    let tokenizer = common::load_example_tokenizer(&dir, None, &hub)?;
    let loaded = from_pretrained_dir(
        &dir,
        AutoTask::CausalLm,
        Device::Cpu,
        &LoadOptions {
            dtype: sft.dtype,
            quantization_config: sft.peft.quantization_config(sft.dtype)?,
            ..LoadOptions::default()
        },
    )?;
    if !loaded.info.is_clean() {
        log::warn!("loading {}: {:?}", dir.display(), loaded.info);
    }
    let mut config = SFTConfig::new(training.output_dir());
    config.base = training.clone();
    config.bf16 = Some(training.bf16);
    config.dataset_text_field = sft.dataset_text_field.clone();
    config.max_length = sft.max_length;
    config.truncation_mode = match sft.truncation_mode.as_str() {
        "keep_end" => TruncationMode::KeepEnd,
        _ => TruncationMode::KeepStart,
    };
    config.packing = sft.packing;
    config.packing_strategy = sft.packing_strategy;
    config.padding_free = sft.padding_free;
    config.eval_packing = sft.eval_packing;
    config.completion_only_loss = sft.completion_only_loss;
    config.assistant_only_loss = sft.assistant_only_loss;
    config.loss_type = SftLossType::parse(&sft.loss_type)?;
    config.eos_token = sft.eos_token.clone();
    config.pad_token = sft.pad_token.clone();
    config.chat_template_path = sft.chat_template_path.as_ref().map(Into::into);
    config.shuffle_dataset = sft.shuffle_dataset;
    config.activation_offloading = sft.activation_offloading;
    let mut builder = SFTTrainer::builder(loaded.model, config, tokenizer).train_dataset(train);
    if let Some(e) = eval {
        builder = builder.eval_dataset(e);
    }
    if let Some(lora) = sft.peft.lora_config() {
        builder = builder.peft_config(lora);
    }
    let mut trainer = builder.build()?;
    // TRL's script: `trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)`.
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

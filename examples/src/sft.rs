//! TRL's `trl sft` (`trl/scripts/sft.py`): supervised fine-tuning of a causal LM with
//! [`SFTTrainer`](tchtrain_trl::SFTTrainer), read as TRL reads its command line —
//! `TrlParser((ScriptArguments, SFTConfig, ModelConfig))`, or a JSON file of the same keys.
//!
//! `--dataset_name` is a local folder of data files (JSON lines, Parquet, CSV: its
//! `train` / `test` splits by file name, as `load_dataset(folder)`) or a hub dataset; the
//! rows are in TRL's formats (`text`, `messages`, `prompt` / `completion`), or for a
//! vision-language model whose folder has a processor (`processor_config.json`, Gemma 3's)
//! `messages` / text with `images`. The SFT flags
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

use tch::Device;
use tchtrain_datasets::PackingStrategy;
use tchtrain_models::{AutoTask, LoadOptions, from_pretrained_dir};
use tchtrain_training_args::{Dataclass, FieldSpec, TrainingArguments};
use tchtrain_trl::{SFTConfig, SFTTrainer, SftLossType, TruncationMode};

use super::ExampleOutput;
use super::args::{self, ScriptCommandLine};
use super::peft_args::{self, PeftArguments};
use super::trl_script::{self, TrlCommonArguments, TrlScriptArguments};
use crate::error::Result;

/// TRL's `ScriptArguments` and `ModelConfig` (the model fields), and the SFT fields of
/// `SFTConfig`.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SftArguments {
    /// TRL's `ScriptArguments` and the model fields of `ModelConfig`.
    #[serde(skip)]
    pub script: TrlScriptArguments,
    /// `--dataset_text_field` (`text`).
    pub dataset_text_field: String,
    /// `--max_length` (1024; `None`: no truncation).
    #[serde(deserialize_with = "args::none_or_usize")]
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
    /// `--chat_template_path`.
    pub chat_template_path: Option<String>,
    /// `--shuffle_dataset`.
    pub shuffle_dataset: bool,
    /// The fields every TRL config has (`pad_token`, `pad_to_multiple_of`, ...).
    #[serde(skip)]
    pub common: TrlCommonArguments,
    /// TRL's LoRA and quantization flags.
    #[serde(skip)]
    pub peft: PeftArguments,
}

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
    ],
};

/// The command line: TRL's dataclasses and LoRA flags.
pub const COMMAND_LINE: &[&Dataclass] = &[
    &trl_script::SCRIPT_ARGUMENTS,
    &trl_script::MODEL_CONFIG,
    &SFT_CONFIG,
    &trl_script::COMMON_CONFIG,
    &peft_args::LORA_ARGUMENTS,
];

const LINE: ScriptCommandLine = ScriptCommandLine {
    title: "sft: supervised fine-tuning (TRL's trl sft, trl/scripts/sft.py)",
    dataclasses: COMMAND_LINE,
    refused: trl_script::REFUSED,
};

/// Parses a command line (without the program name).
pub fn parse_args<I, S>(argv: I) -> Result<(SftArguments, TrainingArguments)>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let argv: Vec<String> = argv.into_iter().map(|a| a.as_ref().to_string()).collect();
    let (values, training) = args::parse(trl_script::with_trl_defaults(argv, "2e-5"), &LINE)?;
    let mut sft: SftArguments = values.take(&[2])?;
    sft.script = trl_script::script_arguments(&values)?;
    sft.common = values.take(&[3])?;
    sft.peft = values.take(&[4])?;
    trl_script::note_dataset_num_proc(sft.common.dataset_num_proc);
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

/// Runs the script with parsed arguments.
pub fn run(sft: &SftArguments, training: TrainingArguments) -> Result<ExampleOutput> {
    trl_script::refuse_push_to_hub(&training)?;
    let (train, eval) = trl_script::load_splits(&sft.script, &training)?;
    let (dir, tokenizer) = trl_script::model_and_tokenizer(&sft.script)?;
    let loaded = from_pretrained_dir(
        &dir,
        AutoTask::CausalLm,
        Device::Cpu,
        &LoadOptions {
            dtype: sft.script.dtype,
            quantization_config: sft.peft.quantization_config(sft.script.dtype)?,
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
    config.chat_template_path = sft.chat_template_path.as_ref().map(Into::into);
    config.shuffle_dataset = sft.shuffle_dataset;
    config.pad_token = sft.common.pad_token.clone();
    config.pad_to_multiple_of = sft.common.pad_to_multiple_of()?;
    config.activation_offloading = sft.common.activation_offloading;
    // TRL's `AutoProcessor.from_pretrained(model)`: a vision-language model's processor when
    // the folder has one, else the tokenizer.
    let processor = trl_script::processor(&dir)?;
    let mut builder = match processor {
        Some(p) => SFTTrainer::builder_with_processor(loaded.model, config, p),
        None => SFTTrainer::builder(loaded.model, config, tokenizer),
    }
    .train_dataset(train);
    if let Some(e) = eval {
        builder = builder.eval_dataset(e);
    }
    if let Some(lora) = sft.peft.lora_config() {
        builder = builder.peft_config(lora);
    }
    let mut trainer = builder.build()?;
    trl_script::train_and_save(&mut trainer)
}

//! TRL's `trl reward` (`trl/scripts/reward.py`): an outcome reward model trained on preference
//! pairs with [`RewardTrainer`](tchtrain_trl::RewardTrainer), read as TRL reads its command
//! line — `TrlParser((ScriptArguments, RewardConfig, ModelConfig))`, or a JSON file of the
//! same keys.
//!
//! `--dataset_name` is a local folder of data files (its `train` / `test` splits by file name)
//! or a hub dataset of preference pairs (`chosen` / `rejected`, with or without `prompt`, as
//! text or messages; an optional `margin`). `--model_name_or_path` is loaded as a sequence
//! classifier of one label (a causal LM's checkpoint gets a new `score` head). The reward
//! flags (`--max_length`, `--center_rewards_coefficient`, `--chat_template_path`, ...) and
//! TRL's LoRA / quantization flags are TRL's; the Trainer's flags are the Trainer's, with
//! TRL's defaults (`--learning_rate` 1e-4, `--logging_steps` 10, `--gradient_checkpointing`,
//! `--bf16` unless `--fp16`).
//!
//! ```no_run
//! let out = tchtrain_examples::reward::main_with_args([
//!     "--model_name_or_path", "assets/tiny-llama", "--dataset_name", "data/pairs",
//!     "--max_steps", "10", "--output_dir", "out/reward",
//! ])?;
//! println!("{:?}", out.train_metrics);
//! # Ok::<(), tchtrain_examples::Error>(())
//! ```

use tchtrain_models::LoadOptions;
use tchtrain_training_args::{Dataclass, FieldSpec, TrainingArguments};
use tchtrain_trl::{RewardConfig, RewardTrainer};

use super::ExampleOutput;
use super::args::{self, ScriptCommandLine};
use super::peft_args::{self, PeftArguments};
use super::trl_script::{self, TrlCommonArguments, TrlScriptArguments};
use crate::error::Result;

/// TRL's `ScriptArguments` and `ModelConfig` (the model fields), and the reward fields of
/// `RewardConfig`.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardArguments {
    /// TRL's `ScriptArguments` and the model fields of `ModelConfig`.
    #[serde(skip)]
    pub script: TrlScriptArguments,
    /// `--max_length` (1024; `None`: no filtering).
    #[serde(deserialize_with = "args::none_or_usize")]
    pub max_length: Option<usize>,
    /// `--center_rewards_coefficient`.
    pub center_rewards_coefficient: Option<f64>,
    /// `--disable_dropout` (true).
    pub disable_dropout: bool,
    /// `--eos_token`.
    pub eos_token: Option<String>,
    /// `--chat_template_path`.
    pub chat_template_path: Option<String>,
    /// The fields every TRL config has (`pad_token`, `pad_to_multiple_of`, ...).
    #[serde(skip)]
    pub common: TrlCommonArguments,
    /// TRL's LoRA and quantization flags.
    #[serde(skip)]
    pub peft: PeftArguments,
}

/// The reward fields of TRL's `RewardConfig`.
static REWARD_CONFIG: Dataclass = Dataclass {
    name: "RewardConfig",
    fields: &[
        FieldSpec::int(
            "max_length",
            "1024",
            "Maximum length of the tokenized sequence; longer pairs are dropped (None: no filtering).",
        ),
        FieldSpec::float(
            "center_rewards_coefficient",
            "None",
            "Coefficient to incentivize the reward model to output mean-zero rewards (recommended 0.01).",
        ),
        FieldSpec::bool(
            "disable_dropout",
            true,
            "Whether to disable dropout in the model.",
        ),
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
    ],
};

/// The command line: TRL's dataclasses and LoRA flags.
pub const COMMAND_LINE: &[&Dataclass] = &[
    &trl_script::SCRIPT_ARGUMENTS,
    &trl_script::MODEL_CONFIG,
    &REWARD_CONFIG,
    &trl_script::COMMON_CONFIG,
    &peft_args::LORA_ARGUMENTS,
];

const LINE: ScriptCommandLine = ScriptCommandLine {
    title: "reward: reward modelling on preference pairs (TRL's trl reward, trl/scripts/reward.py)",
    dataclasses: COMMAND_LINE,
    refused: trl_script::REFUSED,
};

/// Parses a command line (without the program name).
pub fn parse_args<I, S>(argv: I) -> Result<(RewardArguments, TrainingArguments)>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let argv: Vec<String> = argv.into_iter().map(|a| a.as_ref().to_string()).collect();
    let (values, training) = args::parse(trl_script::with_trl_defaults(argv, "1e-4"), &LINE)?;
    let mut reward: RewardArguments = values.take(&[2])?;
    reward.script = trl_script::script_arguments(&values)?;
    reward.common = values.take(&[3])?;
    reward.peft = values.take(&[4])?;
    trl_script::note_dataset_num_proc(reward.common.dataset_num_proc);
    Ok((reward, training))
}

/// Runs the script on `argv` (the command line without the program name).
pub fn main_with_args<I, S>(argv: I) -> Result<ExampleOutput>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let (reward, training) = parse_args(argv)?;
    run(&reward, training)
}

/// Runs the script with parsed arguments.
pub fn run(reward: &RewardArguments, training: TrainingArguments) -> Result<ExampleOutput> {
    trl_script::refuse_push_to_hub(&training)?;
    let (train, eval) = trl_script::load_splits(&reward.script, &training)?;
    let (dir, tokenizer) = trl_script::model_and_tokenizer(&reward.script)?;
    let mut config = RewardConfig::new(training.output_dir());
    config.bf16 = Some(training.bf16);
    config.base = training;
    config.max_length = reward.max_length;
    config.center_rewards_coefficient = reward.center_rewards_coefficient;
    config.disable_dropout = reward.disable_dropout;
    config.eos_token = reward.eos_token.clone();
    config.chat_template_path = reward.chat_template_path.as_ref().map(Into::into);
    config.pad_token = reward.common.pad_token.clone();
    config.pad_to_multiple_of = reward.common.pad_to_multiple_of()?;
    config.activation_offloading = reward.common.activation_offloading;
    let dtype = reward.script.dtype;
    let mut builder = RewardTrainer::builder_from_pretrained(dir, config, tokenizer)
        .model_init_kwargs(LoadOptions {
            dtype,
            quantization_config: reward.peft.quantization_config(dtype)?,
            ..LoadOptions::default()
        })
        .train_dataset(train);
    if let Some(e) = eval {
        builder = builder.eval_dataset(e);
    }
    if let Some(lora) = reward.peft.lora_config() {
        builder = builder.peft_config(lora);
    }
    let mut trainer = builder.build()?;
    trl_script::train_and_save(&mut trainer)
}

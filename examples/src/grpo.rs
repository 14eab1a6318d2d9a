//! TRL's `trl grpo` (`trl/scripts/grpo.py`): Group Relative Policy Optimization of a causal LM
//! with [`GRPOTrainer`](tchtrain_trl::GRPOTrainer), read as TRL reads its command line —
//! `TrlParser((GRPOScriptArguments, GRPOConfig, ModelConfig))`, or a JSON file of the same
//! keys.
//!
//! `--dataset_name` is a local folder of data files (its `train` / `test` splits by file name)
//! or a hub dataset with a `prompt` column (text or messages). The rewards are
//! `--reward_model_name_or_path` (a one-label sequence classifier) and `--reward_funcs` from
//! TRL's registry (`think_format_reward`, `get_soft_overlong_punishment`; the math-verifying
//! accuracy rewards and Python import paths are refused — write a Rust
//! [`RewardFunc`](tchtrain_trl::RewardFunc) and call the trainer instead). The GRPO flags are
//! TRL's; the Trainer's flags are the Trainer's, with TRL's defaults (`--learning_rate` 1e-6,
//! `--logging_steps` 10, `--gradient_checkpointing`, `--bf16` unless `--fp16`).
//!
//! ```no_run
//! let out = tchtrain_examples::grpo::main_with_args([
//!     "--model_name_or_path", "assets/tiny-llama", "--dataset_name", "data/prompts",
//!     "--reward_model_name_or_path", "assets/tiny-reward", "--num_generations", "4",
//!     "--max_completion_length", "32", "--max_steps", "10", "--output_dir", "out/grpo",
//! ])?;
//! println!("{:?}", out.train_metrics);
//! # Ok::<(), tchtrain_examples::Error>(())
//! ```

use tchtrain_models::LoadOptions;
use tchtrain_training_args::{Dataclass, FieldSpec, TrainingArguments};
use tchtrain_trl::{
    GRPOConfig, GRPOTrainer, GrpoLossType, ImportanceSamplingLevel, MultiObjectiveAggregation,
    RewardFunc, ScaleRewards,
};

use super::ExampleOutput;
use super::args::{self, ScriptCommandLine};
use super::peft_args::{self, PeftArguments};
use super::trl_script::{self, TrlScriptArguments};
use crate::error::{Error, Result};

/// `GRPOScriptArguments`' own fields.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpoScriptArguments {
    /// `--reward_model_name_or_path`: a reward model folder.
    pub reward_model_name_or_path: Option<String>,
    /// `--reward_funcs NAME...`: TRL's registry names.
    pub reward_funcs: Option<Vec<String>>,
}

/// The GRPO fields of `GRPOConfig`, as flags.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpoArguments {
    /// TRL's `ScriptArguments` and the model fields of `ModelConfig`.
    #[serde(skip)]
    pub script: TrlScriptArguments,
    /// `GRPOScriptArguments`' reward flags.
    #[serde(skip)]
    pub rewards: GrpoScriptArguments,
    /// TRL's LoRA and quantization flags.
    #[serde(skip)]
    pub peft: PeftArguments,
    /// `--disable_dropout`.
    pub disable_dropout: bool,
    /// `--cast_lm_head_to_fp32` (refused).
    pub cast_lm_head_to_fp32: bool,
    /// `--router_aux_loss_coef`.
    pub router_aux_loss_coef: Option<f64>,
    /// `--num_generations` (8).
    pub num_generations: usize,
    /// `--num_generations_eval`.
    pub num_generations_eval: Option<usize>,
    /// `--max_completion_length` (512).
    pub max_completion_length: usize,
    /// `--shuffle_dataset` (true).
    pub shuffle_dataset: bool,
    /// `--pad_to_multiple_of` (`auto`).
    pub pad_to_multiple_of: Option<String>,
    /// `--generation_batch_size`.
    pub generation_batch_size: Option<usize>,
    /// `--steps_per_generation`.
    pub steps_per_generation: Option<usize>,
    /// `--temperature` (1.0).
    pub temperature: f64,
    /// `--top_p` (1.0).
    pub top_p: f64,
    /// `--top_k` (0).
    pub top_k: i64,
    /// `--min_p`.
    pub min_p: Option<f64>,
    /// `--repetition_penalty` (1.0).
    pub repetition_penalty: f64,
    /// `--generation_kwargs` (a JSON object).
    pub generation_kwargs: Option<String>,
    /// `--chat_template_kwargs` (a JSON object).
    pub chat_template_kwargs: Option<String>,
    /// `--cache_implementation`.
    pub cache_implementation: Option<String>,
    /// `--use_vllm` (refused).
    pub use_vllm: bool,
    /// `--use_transformers_continuous_batching` (refused).
    pub use_transformers_continuous_batching: bool,
    /// `--beta` (0.0).
    pub beta: f64,
    /// `--num_iterations` (1).
    pub num_iterations: usize,
    /// `--epsilon` (0.2).
    pub epsilon: f64,
    /// `--delta`.
    pub delta: Option<f64>,
    /// `--epsilon_high`.
    pub epsilon_high: Option<f64>,
    /// `--sapo_temperature_neg` (1.05).
    pub sapo_temperature_neg: f64,
    /// `--sapo_temperature_pos` (1.0).
    pub sapo_temperature_pos: f64,
    /// `--importance_sampling_level` (`token`).
    pub importance_sampling_level: String,
    /// `--reward_weights W...`.
    pub reward_weights: Option<Vec<String>>,
    /// `--multi_objective_aggregation` (`sum_then_normalize`).
    pub multi_objective_aggregation: String,
    /// `--scale_rewards` (`group`).
    pub scale_rewards: String,
    /// `--loss_type` (`dapo`).
    pub loss_type: String,
    /// `--mask_truncated_completions`.
    pub mask_truncated_completions: bool,
    /// `--sync_ref_model` (refused).
    pub sync_ref_model: bool,
    /// `--top_entropy_quantile` (1.0).
    pub top_entropy_quantile: f64,
    /// `--entropy_coef` (0.0).
    pub entropy_coef: f64,
    /// `--use_adaptive_entropy` (refused).
    pub use_adaptive_entropy: bool,
    /// `--off_policy_mask_threshold`.
    pub off_policy_mask_threshold: Option<f64>,
    /// `--use_bias_correction_kl` (true).
    pub use_bias_correction_kl: bool,
    /// `--log_completions` (refused).
    pub log_completions: bool,
}

/// `GRPOScriptArguments`' reward flags.
static GRPO_SCRIPT_ARGUMENTS: Dataclass = Dataclass {
    name: "GRPOScriptArguments",
    fields: &[
        FieldSpec::str(
            "reward_model_name_or_path",
            "None",
            "Reward model folder (a one-label sequence classifier).",
        ),
        FieldSpec::list(
            "reward_funcs",
            "None",
            "Reward functions: think_format_reward, get_soft_overlong_punishment (accuracy_reward and import paths are refused).",
        ),
    ],
};

/// The GRPO fields of TRL's `GRPOConfig`.
static GRPO_CONFIG: Dataclass = Dataclass {
    name: "GRPOConfig",
    fields: &[
        FieldSpec::bool(
            "disable_dropout",
            false,
            "Whether to disable dropout in the model.",
        ),
        FieldSpec::bool(
            "cast_lm_head_to_fp32",
            false,
            "Whether to cast the LM head to float32 (not supported here).",
        ),
        FieldSpec::float(
            "router_aux_loss_coef",
            "None",
            "Weight of a mixture-of-experts model's load-balancing loss.",
        ),
        FieldSpec::int("num_generations", "8", "Completions generated per prompt."),
        FieldSpec::int(
            "num_generations_eval",
            "None",
            "Completions per prompt in evaluation (default num_generations).",
        ),
        FieldSpec::int(
            "max_completion_length",
            "512",
            "Maximum length of the generated completion.",
        ),
        FieldSpec::bool(
            "shuffle_dataset",
            true,
            "Whether to shuffle the training dataset.",
        ),
        FieldSpec::str(
            "pad_to_multiple_of",
            "auto",
            "Pad the batches to a multiple of this value (auto: 128 on Neuron, none elsewhere).",
        ),
        FieldSpec::int(
            "generation_batch_size",
            "None",
            "Rows generated at once (or set steps_per_generation).",
        ),
        FieldSpec::int(
            "steps_per_generation",
            "None",
            "Micro-steps each generation serves (default gradient_accumulation_steps).",
        ),
        FieldSpec::float("temperature", "1.0", "Sampling temperature."),
        FieldSpec::float("top_p", "1.0", "Nucleus sampling's cumulative probability."),
        FieldSpec::int("top_k", "0", "Top-k sampling (0: off)."),
        FieldSpec::float(
            "min_p",
            "None",
            "Minimum token probability, scaled by the top one.",
        ),
        FieldSpec::float("repetition_penalty", "1.0", "Repetition penalty."),
        FieldSpec::str(
            "generation_kwargs",
            "None",
            "More generation settings, as a JSON object of GenerationConfig fields.",
        ),
        FieldSpec::str(
            "chat_template_kwargs",
            "None",
            "Extra variables for the chat template, as a JSON object.",
        ),
        FieldSpec::str(
            "cache_implementation",
            "None",
            "The cache implementation (the dynamic cache here).",
        ),
        FieldSpec::bool(
            "use_vllm",
            false,
            "Whether to generate with vLLM (not supported here).",
        ),
        FieldSpec::bool(
            "use_transformers_continuous_batching",
            false,
            "Whether to generate with continuous batching (not supported here).",
        ),
        FieldSpec::float("beta", "0.0", "KL coefficient (0: no reference model)."),
        FieldSpec::int(
            "num_iterations",
            "1",
            "Optimisation passes over each generation.",
        ),
        FieldSpec::float("epsilon", "0.2", "Lower clipping bound."),
        FieldSpec::float(
            "delta",
            "None",
            "Upper clip of the unclipped ratio (two-sided GRPO).",
        ),
        FieldSpec::float(
            "epsilon_high",
            "None",
            "Upper clipping bound (default epsilon).",
        ),
        FieldSpec::float(
            "sapo_temperature_neg",
            "1.05",
            "SAPO's temperature for negative advantages.",
        ),
        FieldSpec::float(
            "sapo_temperature_pos",
            "1.0",
            "SAPO's temperature for positive advantages.",
        ),
        FieldSpec::str(
            "importance_sampling_level",
            "token",
            "Importance ratios per token or per sequence.",
        )
        .choices(&["token", "sequence"]),
        FieldSpec::list("reward_weights", "None", "Weights of the reward functions."),
        FieldSpec::str(
            "multi_objective_aggregation",
            "sum_then_normalize",
            "How several rewards make one advantage.",
        )
        .choices(&["sum_then_normalize", "normalize_then_sum"]),
        FieldSpec::str(
            "scale_rewards",
            "group",
            "What the advantages are divided by: group, batch or none.",
        ),
        FieldSpec::str("loss_type", "dapo", "The loss formulation.").choices(&[
            "grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo",
        ]),
        FieldSpec::bool(
            "mask_truncated_completions",
            false,
            "Whether to leave completions without an EOS out of the loss.",
        ),
        FieldSpec::bool(
            "sync_ref_model",
            false,
            "Whether to sync the reference model (not supported here).",
        ),
        FieldSpec::float(
            "top_entropy_quantile",
            "1.0",
            "Train only on the tokens of this top quantile of entropy.",
        ),
        FieldSpec::float("entropy_coef", "0.0", "Entropy bonus coefficient."),
        FieldSpec::bool(
            "use_adaptive_entropy",
            false,
            "Adaptive entropy control (not supported here).",
        ),
        FieldSpec::float(
            "off_policy_mask_threshold",
            "None",
            "Off-policy sequence masking threshold.",
        ),
        FieldSpec::bool(
            "use_bias_correction_kl",
            true,
            "Whether to weight the KL term by the importance ratio.",
        ),
        FieldSpec::bool(
            "log_completions",
            false,
            "Whether to log a completions table (not supported here).",
        ),
    ],
};

/// The command line: TRL's dataclasses and LoRA flags.
pub const COMMAND_LINE: &[&Dataclass] = &[
    &trl_script::SCRIPT_ARGUMENTS,
    &trl_script::MODEL_CONFIG,
    &GRPO_CONFIG,
    &GRPO_SCRIPT_ARGUMENTS,
    &peft_args::LORA_ARGUMENTS,
];

const LINE: ScriptCommandLine = ScriptCommandLine {
    title: "grpo: group relative policy optimization (TRL's trl grpo, trl/scripts/grpo.py)",
    dataclasses: COMMAND_LINE,
    refused: trl_script::REFUSED,
};

/// Parses a command line (without the program name).
pub fn parse_args<I, S>(argv: I) -> Result<(GrpoArguments, TrainingArguments)>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let argv: Vec<String> = argv.into_iter().map(|a| a.as_ref().to_string()).collect();
    let (values, training) = args::parse(trl_script::with_trl_defaults(argv, "1e-6"), &LINE)?;
    let mut grpo: GrpoArguments = values.take(&[2])?;
    grpo.script = trl_script::script_arguments(&values)?;
    grpo.rewards = values.take(&[3])?;
    grpo.peft = values.take(&[4])?;
    Ok((grpo, training))
}

/// Runs the script on `argv` (the command line without the program name).
pub fn main_with_args<I, S>(argv: I) -> Result<ExampleOutput>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let (grpo, training) = parse_args(argv)?;
    run(&grpo, training)
}

fn json_object(
    flag: &str,
    value: Option<&str>,
) -> Result<Option<serde_json::Map<String, serde_json::Value>>> {
    let Some(text) = value else {
        return Ok(None);
    };
    match serde_json::from_str(text) {
        Ok(serde_json::Value::Object(m)) => Ok(Some(m)),
        _ => Err(Error::InvalidFlag {
            flag: flag.into(),
            detail: format!("{text}: give a JSON object"),
        }),
    }
}

/// The GRPO config of the parsed flags.
pub fn grpo_config(grpo: &GrpoArguments, training: TrainingArguments) -> Result<GRPOConfig> {
    let mut c = GRPOConfig::new(training.output_dir());
    c.bf16 = Some(training.bf16);
    c.base = training;
    c.disable_dropout = grpo.disable_dropout;
    c.cast_lm_head_to_fp32 = grpo.cast_lm_head_to_fp32;
    c.router_aux_loss_coef = grpo.router_aux_loss_coef;
    c.num_generations = grpo.num_generations;
    c.num_generations_eval = grpo.num_generations_eval;
    c.max_completion_length = grpo.max_completion_length;
    c.shuffle_dataset = grpo.shuffle_dataset;
    c.pad_to_multiple_of = trl_script::pad_to_multiple_of(grpo.pad_to_multiple_of.as_deref())?;
    c.generation_batch_size = grpo.generation_batch_size;
    c.steps_per_generation = grpo.steps_per_generation;
    c.temperature = grpo.temperature;
    c.top_p = grpo.top_p;
    c.top_k = grpo.top_k;
    c.min_p = grpo.min_p;
    c.repetition_penalty = grpo.repetition_penalty;
    c.generation_kwargs = json_object("generation_kwargs", grpo.generation_kwargs.as_deref())?;
    c.chat_template_kwargs =
        json_object("chat_template_kwargs", grpo.chat_template_kwargs.as_deref())?;
    c.cache_implementation = grpo.cache_implementation.clone();
    c.use_vllm = grpo.use_vllm;
    c.use_transformers_continuous_batching = grpo.use_transformers_continuous_batching;
    c.beta = grpo.beta;
    c.num_iterations = grpo.num_iterations;
    c.epsilon = grpo.epsilon;
    c.delta = grpo.delta;
    c.epsilon_high = grpo.epsilon_high;
    c.sapo_temperature_neg = grpo.sapo_temperature_neg;
    c.sapo_temperature_pos = grpo.sapo_temperature_pos;
    c.importance_sampling_level = ImportanceSamplingLevel::parse(&grpo.importance_sampling_level)?;
    c.reward_weights = match &grpo.reward_weights {
        None => None,
        Some(w) => Some(
            w.iter()
                .flat_map(|v| v.split(','))
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|x| {
                    x.parse::<f64>().map_err(|e| Error::InvalidFlag {
                        flag: "reward_weights".into(),
                        detail: format!("{x}: {e}"),
                    })
                })
                .collect::<Result<_>>()?,
        ),
    };
    c.multi_objective_aggregation =
        MultiObjectiveAggregation::parse(&grpo.multi_objective_aggregation)?;
    c.scale_rewards = ScaleRewards::parse(&grpo.scale_rewards)?;
    c.loss_type = GrpoLossType::parse(&grpo.loss_type)?;
    c.mask_truncated_completions = grpo.mask_truncated_completions;
    c.sync_ref_model = grpo.sync_ref_model;
    c.top_entropy_quantile = grpo.top_entropy_quantile;
    c.entropy_coef = grpo.entropy_coef;
    c.use_adaptive_entropy = grpo.use_adaptive_entropy;
    c.off_policy_mask_threshold = grpo.off_policy_mask_threshold;
    c.use_bias_correction_kl = grpo.use_bias_correction_kl;
    c.log_completions = grpo.log_completions;
    Ok(c)
}

/// The reward functions of the flags, in the script's order: the reward model first, then
/// `--reward_funcs`.
pub fn reward_funcs(rewards: &GrpoScriptArguments) -> Result<Vec<RewardFunc>> {
    let mut out = Vec::new();
    if let Some(path) = &rewards.reward_model_name_or_path {
        out.push(RewardFunc::from_pretrained(path)?);
    }
    for name in rewards.reward_funcs.iter().flatten() {
        out.push(tchtrain_trl::rewards::by_name(name)?);
    }
    Ok(out)
}

/// Runs the script with parsed arguments.
pub fn run(grpo: &GrpoArguments, training: TrainingArguments) -> Result<ExampleOutput> {
    trl_script::refuse_push_to_hub(&training)?;
    let (train, eval) = trl_script::load_splits(&grpo.script, &training)?;
    let (dir, tokenizer) = trl_script::model_and_tokenizer(&grpo.script)?;
    let config = grpo_config(grpo, training)?;
    let rewards = reward_funcs(&grpo.rewards)?;
    let dtype = grpo.script.dtype;
    let mut builder = GRPOTrainer::builder_from_pretrained(dir, rewards, config, tokenizer)
        .model_init_kwargs(LoadOptions {
            dtype,
            quantization_config: grpo.peft.quantization_config(dtype)?,
            ..LoadOptions::default()
        })
        .train_dataset(train);
    if let Some(e) = eval {
        builder = builder.eval_dataset(e);
    }
    if let Some(lora) = grpo.peft.lora_config() {
        builder = builder.peft_config(lora);
    }
    let mut trainer = builder.build()?;
    trl_script::train_and_save(&mut trainer)
}

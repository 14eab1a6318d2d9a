//! TRL's `trl dpo` (`trl/scripts/dpo.py`): direct preference optimization of a causal LM with
//! [`DPOTrainer`](tchtrain_trl::DPOTrainer), read as TRL reads its command line —
//! `TrlParser((ScriptArguments, DPOConfig, ModelConfig))`, or a JSON file of the same keys.
//!
//! `--dataset_name` is a local folder of data files (its `train` / `test` splits by file name)
//! or a hub dataset of preference pairs (`chosen` / `rejected`, with or without `prompt`, as
//! text or messages). The reference is `--model_name_or_path` loaded again (full fine-tuning),
//! the base model with the adapter disabled (TRL's LoRA flags), or log-probabilities
//! precomputed before training (`--precompute_ref_log_probs`). The DPO flags (`--beta`,
//! `--loss_type` (several, with `--loss_weights`), `--label_smoothing`, `--ld_alpha`,
//! `--f_divergence_type`, `--use_weighting`, `--max_length`, `--truncation_mode`, ...) are
//! TRL's; the Trainer's flags are the Trainer's, with TRL's defaults (`--learning_rate` 1e-6,
//! `--logging_steps` 10, `--gradient_checkpointing`, `--bf16` unless `--fp16`).
//!
//! ```no_run
//! let out = tchtrain_examples::dpo::main_with_args([
//!     "--model_name_or_path", "assets/tiny-llama", "--dataset_name", "data/pairs",
//!     "--beta", "0.1", "--max_steps", "10", "--output_dir", "out/dpo",
//! ])?;
//! println!("{:?}", out.train_metrics);
//! # Ok::<(), tchtrain_examples::Error>(())
//! ```

use tchtrain_models::LoadOptions;
use tchtrain_training_args::{Dataclass, FieldSpec, TrainingArguments};
use tchtrain_trl::{DPOConfig, DPOTrainer, DpoLossType, FDivergenceType, TruncationMode};

use super::ExampleOutput;
use super::args::{self, ScriptCommandLine};
use super::peft_args::{self, PeftArguments};
use super::trl_script::{self, TrlCommonArguments, TrlScriptArguments};
use crate::error::{Error, Result};

/// TRL's `ScriptArguments` and `ModelConfig` (the model fields), and the DPO fields of
/// `DPOConfig`.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DpoArguments {
    /// TRL's `ScriptArguments` and the model fields of `ModelConfig`.
    #[serde(skip)]
    pub script: TrlScriptArguments,
    /// `--beta` (0.1).
    pub beta: f64,
    /// `--loss_type TYPE...` (`sigmoid`; several, as TRL's `list[str]`, or separated by
    /// commas).
    pub loss_type: Option<Vec<String>>,
    /// `--loss_weights W...` (one per loss type).
    pub loss_weights: Option<Vec<String>>,
    /// `--label_smoothing` (0.0).
    pub label_smoothing: f64,
    /// `--ld_alpha`.
    pub ld_alpha: Option<f64>,
    /// `--f_divergence_type` (`reverse_kl`).
    pub f_divergence_type: String,
    /// `--f_alpha_divergence_coef` (0.5).
    pub f_alpha_divergence_coef: f64,
    /// `--use_weighting`.
    pub use_weighting: bool,
    /// `--discopop_tau` (0.05).
    pub discopop_tau: f64,
    /// `--max_length` (1024; `None`: no truncation).
    #[serde(deserialize_with = "args::none_or_usize")]
    pub max_length: Option<usize>,
    /// `--truncation_mode` (`keep_start`).
    pub truncation_mode: String,
    /// `--padding_free` (refused).
    pub padding_free: bool,
    /// `--precompute_ref_log_probs`.
    pub precompute_ref_log_probs: bool,
    /// `--precompute_ref_batch_size`.
    pub precompute_ref_batch_size: Option<usize>,
    /// `--disable_dropout` (true).
    pub disable_dropout: bool,
    /// `--sync_ref_model`: TR-DPO's reference updates.
    pub sync_ref_model: bool,
    /// `--ref_model_mixup_alpha` (0.6).
    pub ref_model_mixup_alpha: f64,
    /// `--ref_model_sync_steps` (512).
    pub ref_model_sync_steps: usize,
    /// `--router_aux_loss_coef`.
    pub router_aux_loss_coef: Option<f64>,
    /// The fields every TRL config has (`pad_token`, `pad_to_multiple_of`, ...).
    #[serde(skip)]
    pub common: TrlCommonArguments,
    /// TRL's LoRA and quantization flags.
    #[serde(skip)]
    pub peft: PeftArguments,
}

/// The DPO fields of TRL's `DPOConfig`.
static DPO_CONFIG: Dataclass = Dataclass {
    name: "DPOConfig",
    fields: &[
        FieldSpec::float(
            "beta",
            "0.1",
            "Parameter controlling the deviation from the reference model.",
        ),
        FieldSpec::list(
            "loss_type",
            "None",
            "Types of loss to use (default sigmoid); several are combined with loss_weights.",
        ),
        FieldSpec::list(
            "loss_weights",
            "None",
            "Weights of the loss types (one per loss type; default 1.0 each).",
        ),
        FieldSpec::float("label_smoothing", "0.0", "Label smoothing (robust, exo_pair, aot)."),
        FieldSpec::float(
            "ld_alpha",
            "None",
            "LD-DPO's weight of the verbose part of the longer completion.",
        ),
        FieldSpec::str(
            "f_divergence_type",
            "reverse_kl",
            "The f-divergence regularizer: reverse_kl, forward_kl, js_divergence or alpha_divergence.",
        )
        .choices(&[
            "reverse_kl",
            "forward_kl",
            "js_divergence",
            "alpha_divergence",
        ]),
        FieldSpec::float(
            "f_alpha_divergence_coef",
            "0.5",
            "The alpha of the alpha divergence.",
        ),
        FieldSpec::bool(
            "use_weighting",
            false,
            "Whether to weight the pairs as WPO does.",
        ),
        FieldSpec::float("discopop_tau", "0.05", "DiscoPOP's temperature."),
        FieldSpec::int(
            "max_length",
            "1024",
            "Maximum length of the tokenized prompt + completion (None: no truncation).",
        ),
        FieldSpec::str(
            "truncation_mode",
            "keep_start",
            "Truncation mode to use when the sequence exceeds `max_length`.",
        )
        .choices(&["keep_start", "keep_end"]),
        FieldSpec::bool(
            "padding_free",
            false,
            "Padding-free batches (disabled in trl 1.16; not supported here).",
        ),
        FieldSpec::bool(
            "precompute_ref_log_probs",
            false,
            "Whether to precompute the reference log-probabilities before training.",
        ),
        FieldSpec::int(
            "precompute_ref_batch_size",
            "None",
            "Batch size of the precomputation (default: the per-device batch size).",
        ),
        FieldSpec::bool(
            "disable_dropout",
            true,
            "Whether to disable dropout in the model and the reference.",
        ),
        FieldSpec::bool(
            "sync_ref_model",
            false,
            "Whether to mix the reference with the policy every ref_model_sync_steps steps (TR-DPO).",
        ),
        FieldSpec::float(
            "ref_model_mixup_alpha",
            "0.6",
            "TR-DPO's mix-up weight.",
        ),
        FieldSpec::int(
            "ref_model_sync_steps",
            "512",
            "TR-DPO's steps between reference updates.",
        ),
        FieldSpec::float(
            "router_aux_loss_coef",
            "None",
            "Weight of a mixture-of-experts model's load-balancing loss.",
        ),
    ],
};

/// The command line: TRL's dataclasses and LoRA flags.
pub const COMMAND_LINE: &[&Dataclass] = &[
    &trl_script::SCRIPT_ARGUMENTS,
    &trl_script::MODEL_CONFIG,
    &DPO_CONFIG,
    &trl_script::COMMON_CONFIG,
    &peft_args::LORA_ARGUMENTS,
];

const LINE: ScriptCommandLine = ScriptCommandLine {
    title: "dpo: direct preference optimization (TRL's trl dpo, trl/scripts/dpo.py)",
    dataclasses: COMMAND_LINE,
    refused: trl_script::REFUSED,
};

/// Parses a command line (without the program name).
pub fn parse_args<I, S>(argv: I) -> Result<(DpoArguments, TrainingArguments)>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let argv: Vec<String> = argv.into_iter().map(|a| a.as_ref().to_string()).collect();
    let (values, training) = args::parse(trl_script::with_trl_defaults(argv, "1e-6"), &LINE)?;
    let mut dpo: DpoArguments = values.take(&[2])?;
    dpo.script = trl_script::script_arguments(&values)?;
    dpo.common = values.take(&[3])?;
    dpo.peft = values.take(&[4])?;
    trl_script::note_dataset_num_proc(dpo.common.dataset_num_proc);
    Ok((dpo, training))
}

/// Runs the script on `argv` (the command line without the program name).
pub fn main_with_args<I, S>(argv: I) -> Result<ExampleOutput>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let (dpo, training) = parse_args(argv)?;
    run(&dpo, training)
}

/// A list flag's values, each also split at commas.
fn list(values: &[String]) -> Vec<&str> {
    values
        .iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

/// The DPO config of the parsed flags.
pub fn dpo_config(dpo: &DpoArguments, training: TrainingArguments) -> Result<DPOConfig> {
    let mut config = DPOConfig::new(training.output_dir());
    config.bf16 = Some(training.bf16);
    config.base = training;
    config.beta = dpo.beta;
    config.loss_type = match &dpo.loss_type {
        None => vec![DpoLossType::Sigmoid],
        Some(types) => list(types)
            .into_iter()
            .map(DpoLossType::parse)
            .collect::<tchtrain_trl::Result<_>>()?,
    };
    config.loss_weights = match &dpo.loss_weights {
        None => None,
        Some(w) => Some(
            list(w)
                .into_iter()
                .map(|x| {
                    x.parse::<f64>().map_err(|e| Error::InvalidFlag {
                        flag: "loss_weights".into(),
                        detail: format!("{x}: {e}"),
                    })
                })
                .collect::<Result<_>>()?,
        ),
    };
    config.label_smoothing = dpo.label_smoothing;
    config.ld_alpha = dpo.ld_alpha;
    config.f_divergence_type = FDivergenceType::parse(&dpo.f_divergence_type)?;
    config.f_alpha_divergence_coef = dpo.f_alpha_divergence_coef;
    config.use_weighting = dpo.use_weighting;
    config.discopop_tau = dpo.discopop_tau;
    config.max_length = dpo.max_length;
    config.truncation_mode = match dpo.truncation_mode.as_str() {
        "keep_end" => TruncationMode::KeepEnd,
        _ => TruncationMode::KeepStart,
    };
    config.padding_free = dpo.padding_free;
    config.precompute_ref_log_probs = dpo.precompute_ref_log_probs;
    config.precompute_ref_batch_size = dpo.precompute_ref_batch_size;
    config.disable_dropout = dpo.disable_dropout;
    config.sync_ref_model = dpo.sync_ref_model;
    config.ref_model_mixup_alpha = dpo.ref_model_mixup_alpha;
    config.ref_model_sync_steps = dpo.ref_model_sync_steps;
    config.router_aux_loss_coef = dpo.router_aux_loss_coef;
    config.pad_token = dpo.common.pad_token.clone();
    config.pad_to_multiple_of = dpo.common.pad_to_multiple_of()?;
    config.activation_offloading = dpo.common.activation_offloading;
    Ok(config)
}

/// Runs the script with parsed arguments.
pub fn run(dpo: &DpoArguments, training: TrainingArguments) -> Result<ExampleOutput> {
    trl_script::refuse_push_to_hub(&training)?;
    let (train, eval) = trl_script::load_splits(&dpo.script, &training)?;
    let (dir, tokenizer) = trl_script::model_and_tokenizer(&dpo.script)?;
    let config = dpo_config(dpo, training)?;
    let dtype = dpo.script.dtype;
    let mut builder = DPOTrainer::builder_from_pretrained(dir, config, tokenizer)
        .model_init_kwargs(LoadOptions {
            dtype,
            quantization_config: dpo.peft.quantization_config(dtype)?,
            ..LoadOptions::default()
        })
        .train_dataset(train);
    if let Some(e) = eval {
        builder = builder.eval_dataset(e);
    }
    if let Some(lora) = dpo.peft.lora_config() {
        builder = builder.peft_config(lora);
    }
    let mut trainer = builder.build()?;
    trl_script::train_and_save(&mut trainer)
}

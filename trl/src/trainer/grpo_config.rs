//! `trl/trainer/grpo_config.py`'s `GRPOConfig`: the Trainer's arguments with TRL's defaults
//! (`learning_rate` 1e-6, `logging_steps` 10, gradient checkpointing on, `bf16` on unless
//! `fp16`), plus the GRPO fields. Generation runs on this project's `generate()`: vLLM,
//! transformers' continuous batching, tools and environments are refused, naming the field.

use tchtrain_training_args::TrainingArguments;

use crate::error::{Error, Result};
use crate::trainer::base_config;

/// One of `loss_type`'s values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrpoLossType {
    /// `"grpo"`: each sequence's token mean, then the batch mean (the GRPO paper).
    Grpo,
    /// `"bnpo"`: the token mean over the local batch.
    Bnpo,
    /// `"dr_grpo"`: the token sum over `batch × max_completion_length` (Dr. GRPO).
    DrGrpo,
    /// `"dapo"` (default): the token sum over the generation batch's tokens (DAPO).
    Dapo,
    /// `"cispo"`: REINFORCE with the ratio clipped and detached (MiniMax-M1's CISPO).
    Cispo,
    /// `"sapo"`: the soft, temperature-gated ratio (SAPO).
    Sapo,
    /// `"luspo"`: the sequence sums averaged over sequences (LUSPO).
    Luspo,
}

impl GrpoLossType {
    /// TRL's names (`vespo` is refused: its gamma weights are not implemented here).
    pub fn parse(name: &str) -> Result<Self> {
        Ok(match name {
            "grpo" => Self::Grpo,
            "bnpo" => Self::Bnpo,
            "dr_grpo" => Self::DrGrpo,
            "dapo" => Self::Dapo,
            "cispo" => Self::Cispo,
            "sapo" => Self::Sapo,
            "luspo" => Self::Luspo,
            "vespo" => {
                return Err(Error::InvalidArgument {
                    field: "loss_type",
                    detail: "'vespo' (VESPO's gamma-weighted sequences) is not implemented here; use 'dapo', 'grpo', 'bnpo', 'dr_grpo', 'cispo', 'sapo' or 'luspo'".into(),
                });
            }
            other => {
                return Err(Error::InvalidArgument {
                    field: "loss_type",
                    detail: format!(
                        "Unknown loss type: {other}. Possible values are 'grpo', 'bnpo', 'dr_grpo', 'dapo', 'cispo', 'sapo', 'luspo' and 'vespo'. (TRL's message)"
                    ),
                });
            }
        })
    }

    /// TRL's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Grpo => "grpo",
            Self::Bnpo => "bnpo",
            Self::DrGrpo => "dr_grpo",
            Self::Dapo => "dapo",
            Self::Cispo => "cispo",
            Self::Sapo => "sapo",
            Self::Luspo => "luspo",
        }
    }
}

/// `scale_rewards`: what the advantages are divided by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleRewards {
    /// `"group"` (or `True`, the default): each group's standard deviation.
    Group,
    /// `"batch"`: the whole batch's.
    Batch,
    /// `"none"` (or `False`): not scaled (Dr. GRPO).
    None,
}

impl ScaleRewards {
    /// TRL's names, `"true"` / `"false"` included (the CLI's booleans).
    pub fn parse(name: &str) -> Result<Self> {
        Ok(match name.to_ascii_lowercase().as_str() {
            "group" | "true" => Self::Group,
            "batch" => Self::Batch,
            "none" | "false" => Self::None,
            _ => {
                return Err(Error::InvalidArgument {
                    field: "scale_rewards",
                    detail: format!(
                        "Invalid value for scale_rewards: {name}. Must be one of 'batch', 'group', or 'none'. (TRL's message)"
                    ),
                });
            }
        })
    }
}

/// `multi_objective_aggregation`: how several reward functions make one advantage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MultiObjectiveAggregation {
    /// `"sum_then_normalize"` (default): the weighted sum, normalised in its group.
    SumThenNormalize,
    /// `"normalize_then_sum"`: each reward normalised in its group, the weighted sum
    /// normalised over the batch (GDPO).
    NormalizeThenSum,
}

impl MultiObjectiveAggregation {
    /// TRL's names.
    pub fn parse(name: &str) -> Result<Self> {
        Ok(match name {
            "sum_then_normalize" => Self::SumThenNormalize,
            "normalize_then_sum" => Self::NormalizeThenSum,
            other => {
                return Err(Error::InvalidArgument {
                    field: "multi_objective_aggregation",
                    detail: format!(
                        "Invalid multi_objective_aggregation: {other}. Must be 'sum_then_normalize' or 'normalize_then_sum'. (TRL's message)"
                    ),
                });
            }
        })
    }
}

/// `importance_sampling_level`: the ratio per token or per sequence (GSPO).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImportanceSamplingLevel {
    /// `"token"` (default).
    Token,
    /// `"sequence"`: the mean log-ratio of the sequence's tokens.
    Sequence,
}

impl ImportanceSamplingLevel {
    /// TRL's names.
    pub fn parse(name: &str) -> Result<Self> {
        Ok(match name {
            "token" => Self::Token,
            "sequence" => Self::Sequence,
            other => {
                return Err(Error::InvalidArgument {
                    field: "importance_sampling_level",
                    detail: format!(
                        "Unknown importance sampling level: {other}. Possible values are 'token' and 'sequence'. (TRL's message)"
                    ),
                });
            }
        })
    }
}

/// TRL's `GRPOConfig`.
#[derive(Debug, Clone)]
pub struct GRPOConfig {
    /// The Trainer's arguments (TRL's defaults set by [`GRPOConfig::new`]; `bf16` is
    /// resolved from [`GRPOConfig::bf16`] at [`GRPOConfig::post_init`]).
    pub base: TrainingArguments,
    /// TRL's `bf16=None`: `None` resolves to `!fp16` at [`GRPOConfig::post_init`].
    pub bf16: Option<bool>,
    /// `disable_dropout` (false): every dropout probability set to 0 (the decoder families
    /// taken here have no dropout modules, so it changes nothing, as upstream).
    pub disable_dropout: bool,
    /// `cast_lm_head_to_fp32` (refused when true).
    pub cast_lm_head_to_fp32: bool,
    /// `router_aux_loss_coef`: a mixture-of-experts model's load-balancing loss weight
    /// (refused unless 0 or unset on a dense model).
    pub router_aux_loss_coef: Option<f64>,
    /// `num_generations` (8): completions per prompt (the group size, at least 2).
    pub num_generations: usize,
    /// `num_generations_eval`: completions per prompt in evaluation (default
    /// `num_generations`).
    pub num_generations_eval: Option<usize>,
    /// `max_completion_length` (512): new tokens per completion.
    pub max_completion_length: usize,
    /// `shuffle_dataset` (true): the prompts in a random order each epoch.
    pub shuffle_dataset: bool,
    /// `pad_to_multiple_of` (`"auto"`: none on the CPU).
    pub pad_to_multiple_of: Option<usize>,
    /// `generation_batch_size`: rows generated at once (set this or
    /// `steps_per_generation`; default `per_device_train_batch_size × world size ×
    /// steps_per_generation`).
    pub generation_batch_size: Option<usize>,
    /// `steps_per_generation`: micro-steps each generation serves (default
    /// `gradient_accumulation_steps`).
    pub steps_per_generation: Option<usize>,
    /// `temperature` (1.0).
    pub temperature: f64,
    /// `top_p` (1.0).
    pub top_p: f64,
    /// `top_k` (0: off).
    pub top_k: i64,
    /// `min_p`.
    pub min_p: Option<f64>,
    /// `repetition_penalty` (1.0).
    pub repetition_penalty: f64,
    /// `generation_kwargs`: more generation settings, over the ones above (a JSON object
    /// of `GenerationConfig` fields).
    pub generation_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// `chat_template_kwargs`: extra variables for the chat template.
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// `cache_implementation` (refused unless unset or `"dynamic"`).
    pub cache_implementation: Option<String>,
    /// `use_vllm` (refused when true).
    pub use_vllm: bool,
    /// `use_transformers_continuous_batching` (refused when true).
    pub use_transformers_continuous_batching: bool,
    /// `beta` (0.0): the KL coefficient; 0 loads no reference model.
    pub beta: f64,
    /// `num_iterations` (1): optimisation passes over each generation (μ).
    pub num_iterations: usize,
    /// `epsilon` (0.2): the lower clipping bound (and the upper one without
    /// `epsilon_high`).
    pub epsilon: f64,
    /// `delta`: the upper clip of the unclipped ratio (two-sided GRPO).
    pub delta: Option<f64>,
    /// `epsilon_high`: the upper clipping bound (DAPO's 0.28); CISPO's ratio cap.
    pub epsilon_high: Option<f64>,
    /// `sapo_temperature_neg` (1.05).
    pub sapo_temperature_neg: f64,
    /// `sapo_temperature_pos` (1.0).
    pub sapo_temperature_pos: f64,
    /// `importance_sampling_level` (`"token"`).
    pub importance_sampling_level: ImportanceSamplingLevel,
    /// `reward_weights`: one weight per reward function (default all 1).
    pub reward_weights: Option<Vec<f64>>,
    /// `multi_objective_aggregation` (`"sum_then_normalize"`).
    pub multi_objective_aggregation: MultiObjectiveAggregation,
    /// `scale_rewards` (`"group"`).
    pub scale_rewards: ScaleRewards,
    /// `loss_type` (`"dapo"`).
    pub loss_type: GrpoLossType,
    /// `mask_truncated_completions` (false): completions without an EOS left out of the
    /// loss.
    pub mask_truncated_completions: bool,
    /// `sync_ref_model` (false): TR-DPO's reference mixing, every `ref_model_sync_steps`.
    pub sync_ref_model: bool,
    /// `ref_model_mixup_alpha` (0.6).
    pub ref_model_mixup_alpha: f64,
    /// `ref_model_sync_steps` (512).
    pub ref_model_sync_steps: usize,
    /// `top_entropy_quantile` (1.0): only the tokens of the top quantile of entropy
    /// train.
    pub top_entropy_quantile: f64,
    /// `entropy_coef` (0.0): the entropy bonus.
    pub entropy_coef: f64,
    /// `use_adaptive_entropy` (refused when true).
    pub use_adaptive_entropy: bool,
    /// `off_policy_mask_threshold`: off-policy sequence masking (OPSM).
    pub off_policy_mask_threshold: Option<f64>,
    /// `use_bias_correction_kl` (true): the KL term weighted by the importance ratio.
    pub use_bias_correction_kl: bool,
    /// `log_completions` (refused when true: the completions table is a Parquet file
    /// this project does not write).
    pub log_completions: bool,
    /// `max_tool_calling_iterations` (refused when set: tool calling is not implemented
    /// here).
    pub max_tool_calling_iterations: Option<usize>,
}

impl GRPOConfig {
    /// `GRPOConfig(output_dir)`: TRL's defaults.
    pub fn new(output_dir: impl Into<String>) -> Self {
        Self {
            base: base_config::base_arguments(output_dir, 1e-6),
            bf16: None,
            disable_dropout: false,
            cast_lm_head_to_fp32: false,
            router_aux_loss_coef: None,
            num_generations: 8,
            num_generations_eval: None,
            max_completion_length: 512,
            shuffle_dataset: true,
            pad_to_multiple_of: None,
            generation_batch_size: None,
            steps_per_generation: None,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: None,
            repetition_penalty: 1.0,
            generation_kwargs: None,
            chat_template_kwargs: None,
            cache_implementation: None,
            use_vllm: false,
            use_transformers_continuous_batching: false,
            beta: 0.0,
            num_iterations: 1,
            epsilon: 0.2,
            delta: None,
            epsilon_high: None,
            sapo_temperature_neg: 1.05,
            sapo_temperature_pos: 1.0,
            importance_sampling_level: ImportanceSamplingLevel::Token,
            reward_weights: None,
            multi_objective_aggregation: MultiObjectiveAggregation::SumThenNormalize,
            scale_rewards: ScaleRewards::Group,
            loss_type: GrpoLossType::Dapo,
            mask_truncated_completions: false,
            sync_ref_model: false,
            ref_model_mixup_alpha: 0.6,
            ref_model_sync_steps: 512,
            top_entropy_quantile: 1.0,
            entropy_coef: 0.0,
            use_adaptive_entropy: false,
            off_policy_mask_threshold: None,
            use_bias_correction_kl: true,
            log_completions: false,
            max_tool_calling_iterations: None,
        }
    }

    /// The micro-steps one generation serves (resolved at [`post_init`](Self::post_init)).
    pub fn steps_per_generation(&self) -> usize {
        self.steps_per_generation.unwrap_or(1)
    }

    /// `__post_init__`: `bf16` resolved, the Trainer's `__post_init__`, then the
    /// generation batch resolved and checked as TRL does; what is not implemented here is
    /// refused, naming the field.
    pub fn post_init(&mut self) -> Result<()> {
        base_config::post_init(&mut self.base, self.bf16)?;
        let refuse = |field: &'static str, detail: String| -> Result<()> {
            Err(Error::InvalidArgument { field, detail })
        };
        if self.use_vllm {
            refuse(
                "use_vllm",
                "vLLM is not available here; completions are generated with the model's own generate() (use_vllm=False)".into(),
            )?;
        }
        if self.use_transformers_continuous_batching {
            refuse(
                "use_transformers_continuous_batching",
                "transformers' continuous batching engine is not implemented here; completions are generated with generate()".into(),
            )?;
        }
        if self.cast_lm_head_to_fp32 {
            refuse(
                "cast_lm_head_to_fp32",
                "casting the LM head to float32 is not implemented here; leave it False".into(),
            )?;
        }
        if self.use_adaptive_entropy {
            refuse(
                "use_adaptive_entropy",
                "the adaptive entropy controller is not implemented here; use a fixed entropy_coef"
                    .into(),
            )?;
        }
        if self.log_completions {
            refuse(
                "log_completions",
                "the completions table (a Parquet file per log, and W&B / Trackio tables) is not written here; leave it False".into(),
            )?;
        }
        if self.max_tool_calling_iterations.is_some() {
            refuse(
                "max_tool_calling_iterations",
                "tool calling during generation is not implemented here".into(),
            )?;
        }
        if let Some(c) = &self.cache_implementation
            && c != "dynamic"
        {
            refuse(
                "cache_implementation",
                format!("'{c}': only the dynamic cache is implemented here; leave it unset"),
            )?;
        }
        if self.base.auto_find_batch_size {
            refuse(
                "auto_find_batch_size",
                "auto_find_batch_size is not supported by GRPO, because the generation batch must contain full prompt groups of num_generations completions, and reducing the batch size on out-of-memory breaks this invariant. Set auto_find_batch_size=False and lower per_device_train_batch_size instead. (TRL's message)".into(),
            )?;
        }
        if self.pad_to_multiple_of == Some(0) {
            refuse("pad_to_multiple_of", "must be at least 1 (or None)".into())?;
        }
        let num_processes = self.base.world_size().max(1);
        let global = self.base.per_device_train_batch_size * num_processes;
        match (self.generation_batch_size, self.steps_per_generation) {
            (None, None) => {
                let spg = self.base.gradient_accumulation_steps;
                self.steps_per_generation = Some(spg);
                self.generation_batch_size = Some(global * spg);
            }
            (Some(g), None) => {
                if global == 0 || g % global != 0 {
                    refuse(
                        "generation_batch_size",
                        format!(
                            "generation_batch_size ({g}) must be divisible by the global batch size ({global}). (TRL's message)"
                        ),
                    )?;
                }
                self.steps_per_generation = Some(g / global);
            }
            (None, Some(s)) => self.generation_batch_size = Some(global * s),
            (Some(_), Some(_)) => refuse(
                "generation_batch_size",
                "'generation_batch_size' and 'steps_per_generation' can not be both configured at the same time (TRL's message)".into(),
            )?,
        }
        if self.base.do_eval
            && self.base.eval_strategy != tchtrain_training_args::IntervalStrategy::No
        {
            let n = self.num_generations_eval.unwrap_or(self.num_generations);
            let eval_global = self.base.per_device_eval_batch_size * num_processes;
            if n == 0 || !eval_global.is_multiple_of(n) {
                refuse(
                    "num_generations_eval",
                    format!(
                        "The global eval batch size ({} * {num_processes}) must be divisible by the number of generations used for evaluation ({n}). (TRL's message)",
                        self.base.per_device_eval_batch_size
                    ),
                )?;
            }
        }
        let generation_batch_size = self.generation_batch_size.unwrap_or(0);
        if self.num_generations == 0 || !generation_batch_size.is_multiple_of(self.num_generations)
        {
            refuse(
                "generation_batch_size",
                format!(
                    "generation_batch_size ({generation_batch_size}) must be divisible by num_generations ({}). (TRL's message)",
                    self.num_generations
                ),
            )?;
        }
        if self.num_generations < 2 {
            refuse(
                "num_generations",
                format!(
                    "GRPO requires at least 2 generations per prompt to calculate the advantages. You provided {}, which is less than the minimum required. (TRL's message)",
                    self.num_generations
                ),
            )?;
        }
        if self.num_iterations == 0 {
            refuse("num_iterations", "must be at least 1".into())?;
        }
        if !(0.0..=1.0).contains(&self.top_entropy_quantile) {
            refuse(
                "top_entropy_quantile",
                format!("{} must be in [0, 1]", self.top_entropy_quantile),
            )?;
        }
        if matches!(
            self.base.train_sampling_strategy.as_str(),
            "group_by_length" | "batch_rebalance"
        ) {
            refuse(
                "train_sampling_strategy",
                "GRPO samples prompt groups with its RepeatSampler; leave train_sampling_strategy at its default".into(),
            )?;
        }
        Ok(())
    }
}

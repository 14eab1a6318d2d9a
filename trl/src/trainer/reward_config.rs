//! `trl/trainer/reward_config.py`'s `RewardConfig`: the Trainer's arguments with TRL's
//! defaults (`learning_rate` 1e-4, `logging_steps` 10, gradient checkpointing on, `bf16` on
//! unless `fp16`), plus the reward-modelling fields.

use tchtrain_training_args::TrainingArguments;

use crate::error::{Error, Result};
use crate::trainer::base_config;

/// TRL's `RewardConfig`.
#[derive(Debug, Clone)]
pub struct RewardConfig {
    /// The Trainer's arguments (TRL's defaults set by [`RewardConfig::new`]; `bf16` is
    /// resolved from [`RewardConfig::bf16`] at [`RewardConfig::post_init`]).
    pub base: TrainingArguments,
    /// TRL's `bf16=None`: `None` resolves to `!fp16` at [`RewardConfig::post_init`].
    pub bf16: Option<bool>,
    /// `chat_template_path`: a `.jinja` / `.j2` file whose template replaces the tokenizer's
    /// (cloning another model's template and tokens is refused).
    pub chat_template_path: Option<std::path::PathBuf>,
    /// `disable_dropout` (true): every dropout module's probability set to 0. The decoder
    /// families this trainer takes have no dropout modules (their attention dropout is
    /// functional, as upstream's, and TRL's `disable_dropout_in_model` leaves it), so it
    /// changes nothing there, as upstream.
    pub disable_dropout: bool,
    /// `eos_token`: the token appended to non-conversational rows (default the tokenizer's).
    pub eos_token: Option<String>,
    /// `max_length` (1024): pairs whose chosen or rejected row is longer are dropped; `None`:
    /// no filtering.
    pub max_length: Option<usize>,
    /// `pad_to_multiple_of` (`"auto"`: none on the CPU).
    pub pad_to_multiple_of: Option<usize>,
    /// `center_rewards_coefficient`: `coef · mean((r_chosen + r_rejected)²)` added to the
    /// loss (Eq. 2 of arXiv:2312.09244; 0.01 recommended).
    pub center_rewards_coefficient: Option<f64>,
    /// `activation_offloading` (refused when true).
    pub activation_offloading: bool,
    /// `pad_token` (deprecated upstream): the padding token (default the tokenizer's, else
    /// its EOS).
    pub pad_token: Option<String>,
}

impl RewardConfig {
    /// `RewardConfig(output_dir)`: TRL's defaults.
    pub fn new(output_dir: impl Into<String>) -> Self {
        Self {
            base: base_config::base_arguments(output_dir, 1e-4),
            bf16: None,
            chat_template_path: None,
            disable_dropout: true,
            eos_token: None,
            max_length: Some(1024),
            pad_to_multiple_of: None,
            center_rewards_coefficient: None,
            activation_offloading: false,
            pad_token: None,
        }
    }

    /// `__post_init__`: `bf16` resolved (`not fp16` when unset), then the Trainer's
    /// `__post_init__`; what is not implemented here is refused, naming the field.
    pub fn post_init(&mut self) -> Result<()> {
        base_config::post_init(&mut self.base, self.bf16)?;
        let refuse = |field: &'static str, detail: &str| -> Result<()> {
            Err(Error::InvalidArgument {
                field,
                detail: detail.into(),
            })
        };
        if self.activation_offloading {
            refuse(
                "activation_offloading",
                "offloading activations to the host is not implemented here; use gradient_checkpointing",
            )?;
        }
        if self.pad_to_multiple_of == Some(0) {
            refuse("pad_to_multiple_of", "must be at least 1 (or None)")?;
        }
        if matches!(
            self.base.train_sampling_strategy.as_str(),
            "group_by_length" | "batch_rebalance"
        ) {
            refuse(
                "train_sampling_strategy",
                "the preference rows have no `input_ids` to group by (upstream: \"Can only automatically infer lengths for datasets whose items are dictionaries with an 'input_ids' key.\"); leave it False",
            )?;
        }
        Ok(())
    }
}

//! `trl/trainer/sft_config.py`'s `SFTConfig` (and `base_config.py`'s `_BaseConfig`): the
//! Trainer's arguments with TRL's defaults (`learning_rate` 2e-5, `logging_steps` 10,
//! `gradient_checkpointing` on, `bf16` on unless `fp16`), plus the SFT fields.

use tchtrain_datasets::PackingStrategy;
use tchtrain_training_args::TrainingArguments;

use crate::error::{Error, Result};
use crate::trainer::base_config;

/// `truncation_mode`: which end of a too-long row `max_length` keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TruncationMode {
    /// `"keep_start"` (the default).
    #[default]
    KeepStart,
    /// `"keep_end"` (deprecated upstream).
    KeepEnd,
}

/// `loss_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SftLossType {
    /// `"nll"` (and its deprecated alias `"chunked_nll"`): the negative log-likelihood.
    #[default]
    Nll,
    /// `"dft"`: Dynamic Fine-Tuning, each token's loss weighted by its (detached) probability.
    Dft,
}

impl SftLossType {
    /// TRL's names (`"chunked_nll"` is read as `"nll"`, as its `__post_init__` does).
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "nll" | "chunked_nll" => Ok(Self::Nll),
            "dft" => Ok(Self::Dft),
            other => Err(Error::InvalidArgument {
                field: "loss_type",
                detail: format!(
                    "Invalid `loss_type` {other} passed. Supported values are 'nll' and 'dft'. (TRL's message)"
                ),
            }),
        }
    }
}

/// TRL's `SFTConfig`.
#[derive(Debug, Clone)]
pub struct SFTConfig {
    /// The Trainer's arguments (TRL's defaults set by [`SFTConfig::new`]; `bf16` is resolved
    /// from [`SFTConfig::bf16`] at [`SFTConfig::post_init`]).
    pub base: TrainingArguments,
    /// TRL's `bf16=None`: `None` resolves to `!fp16` at [`SFTConfig::post_init`].
    pub bf16: Option<bool>,
    /// `dataset_text_field` (`"text"`): the column of language-modeling text.
    pub dataset_text_field: String,
    /// `max_length` (1024): rows are truncated to it (or packed into it); `None`: no limit.
    pub max_length: Option<usize>,
    /// `truncation_mode`.
    pub truncation_mode: TruncationMode,
    /// `shuffle_dataset` (refused when true: it draws from `datasets`' own generator).
    pub shuffle_dataset: bool,
    /// `packing`: rows packed into `max_length`-long rows.
    pub packing: bool,
    /// `packing_strategy` (`"bfd"`).
    pub packing_strategy: PackingStrategy,
    /// `padding_free`: each batch flattened into one row with restarting positions.
    pub padding_free: bool,
    /// `pad_to_multiple_of` (`"auto"`: none on the CPU).
    pub pad_to_multiple_of: Option<usize>,
    /// `eval_packing` (`None`: as `packing`).
    pub eval_packing: Option<bool>,
    /// `completion_only_loss` (`None`: on for prompt-completion datasets).
    pub completion_only_loss: Option<bool>,
    /// `assistant_only_loss` (the chat template's `{% generation %}` masks).
    pub assistant_only_loss: bool,
    /// `loss_type`.
    pub loss_type: SftLossType,
    /// `eos_token`: the token appended to non-conversational rows (default the tokenizer's).
    pub eos_token: Option<String>,
    /// `pad_token` (deprecated upstream): the padding token (default the tokenizer's, else
    /// its EOS).
    pub pad_token: Option<String>,
    /// `chat_template_path`: a `.jinja` / `.j2` file whose template replaces the tokenizer's
    /// (cloning another model's template and tokens is refused).
    pub chat_template_path: Option<std::path::PathBuf>,
    /// `activation_offloading` (refused when true).
    pub activation_offloading: bool,
    /// `dataset_kwargs={"skip_prepare_dataset": True}`: the datasets are already tokenized
    /// (`input_ids`, `labels`).
    pub skip_prepare_dataset: bool,
}

impl SFTConfig {
    /// `SFTConfig(output_dir)`: TRL's defaults.
    pub fn new(output_dir: impl Into<String>) -> Self {
        Self {
            base: base_config::base_arguments(output_dir, 2e-5),
            bf16: None,
            dataset_text_field: "text".into(),
            max_length: Some(1024),
            truncation_mode: TruncationMode::KeepStart,
            shuffle_dataset: false,
            packing: false,
            packing_strategy: PackingStrategy::Bfd,
            padding_free: false,
            pad_to_multiple_of: None,
            eval_packing: None,
            completion_only_loss: None,
            assistant_only_loss: false,
            loss_type: SftLossType::Nll,
            eos_token: None,
            pad_token: None,
            chat_template_path: None,
            activation_offloading: false,
            skip_prepare_dataset: false,
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
        if self.shuffle_dataset {
            refuse(
                "shuffle_dataset",
                "shuffling the prepared dataset draws from `datasets`' own generator, which is not reproduced here; leave it False (the Trainer's sampler shuffles every epoch)",
            )?;
        }
        if self.activation_offloading {
            refuse(
                "activation_offloading",
                "offloading activations to the host is not implemented here; use gradient_checkpointing",
            )?;
        }
        if self.packing && self.max_length.is_none() {
            refuse(
                "max_length",
                "When packing is enabled, `max_length` can't be `None`. (TRL's message)",
            )?;
        }
        if self.pad_to_multiple_of == Some(0) {
            refuse("pad_to_multiple_of", "must be at least 1 (or None)")?;
        }
        Ok(())
    }
}

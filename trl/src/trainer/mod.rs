//! `trl/trainer/`: the trainers, their configs and their utilities.

pub mod sft_config;
pub mod sft_trainer;
pub mod utils;

pub use sft_config::{SFTConfig, SftLossType, TruncationMode};
pub use sft_trainer::{
    DataCollatorForLanguageModeling, FormattingFunc, SFTTrainer, SFTTrainerBuilder,
};
pub use utils::{FusedCausalLMOutput, fused_lm_head_forward};

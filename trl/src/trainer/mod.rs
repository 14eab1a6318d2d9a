//! `trl/trainer/`: the trainers, their configs and their utilities.

pub(crate) mod base_config;
pub(crate) mod base_trainer;
pub mod dpo_config;
pub mod dpo_trainer;
pub mod grpo_config;
pub mod grpo_trainer;
pub mod reward_config;
pub mod reward_trainer;
pub mod sft_config;
pub mod sft_trainer;
pub mod utils;
pub mod vision_language;

pub use dpo_config::{DPOConfig, DpoLossType, FDivergenceType};
pub use dpo_trainer::{DPOTrainer, DPOTrainerBuilder};
pub use grpo_config::{
    GRPOConfig, GrpoLossType, ImportanceSamplingLevel, MultiObjectiveAggregation, ScaleRewards,
};
pub use grpo_trainer::{
    GRPOTrainer, GRPOTrainerBuilder, RewardError, RewardFn, RewardFunc, RewardInputs,
};
pub use reward_config::RewardConfig;
pub use reward_trainer::{RewardTrainer, RewardTrainerBuilder};
pub use sft_config::{SFTConfig, SftLossType, TruncationMode};
pub use sft_trainer::{
    DataCollatorForLanguageModeling, FormattingFunc, SFTTrainer, SFTTrainerBuilder,
};
pub use utils::{
    FusedCausalLMOutput, RepeatSampler, fused_lm_head_forward, fused_lm_head_forward_at, nanmax,
    nanmin, nanstd,
};
pub use vision_language::DataCollatorForVisionLanguageModeling;

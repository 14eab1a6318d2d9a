//! `tchtrain-trl` — TRL 1.16's trainers (`trl`) over the tchtrain Trainer, computed as trl
//! computes them: `SFTTrainer` (supervised fine-tuning on text, prompt-completion and
//! conversational datasets, with TRL's fused LM head, loss and logged metrics) and
//! `RewardTrainer` (reward models on preference pairs) and `DPOTrainer` (direct preference
//! optimization against a reference model, its loss types).
//!
//! | module | trl |
//! |---|---|
//! | [`trainer::sft_config`] | `trainer/sft_config.py` (`SFTConfig`, TRL's defaults) |
//! | [`trainer::sft_trainer`] | `trainer/sft_trainer.py` (`SFTTrainer`, `DataCollatorForLanguageModeling`) |
//! | [`trainer::vision_language`] | `trainer/sft_trainer.py` (`DataCollatorForVisionLanguageModeling`, the vision datasets' path) |
//! | [`trainer::dpo_config`] | `trainer/dpo_config.py` (`DPOConfig`) |
//! | [`trainer::dpo_trainer`] | `trainer/dpo_trainer.py` (`DPOTrainer`, `DataCollatorForPreference`) |
//! | [`trainer::reward_config`] | `trainer/reward_config.py` (`RewardConfig`) |
//! | [`trainer::reward_trainer`] | `trainer/reward_trainer.py` (`RewardTrainer`, `DataCollatorForPreference`) |
//! | [`trainer::utils`] | `trainer/utils.py` (`add_fused_lm_head`'s forward) |
//! | [`kernels`] | `kernels/chunked_logprob.py` (`ChunkedLogProbFunction`) |
//! | [`data_utils`] | `data_utils.py` (dataset formats) |

pub mod data_utils;
pub mod error;
pub mod kernels;
pub mod rewards;
pub mod trainer;

pub use error::{Error, Result};
pub use trainer::{
    DPOConfig, DPOTrainer, DPOTrainerBuilder, DataCollatorForLanguageModeling,
    DataCollatorForVisionLanguageModeling, DpoLossType, FDivergenceType, GRPOConfig, GRPOTrainer,
    GRPOTrainerBuilder, GrpoLossType, ImportanceSamplingLevel, MultiObjectiveAggregation,
    RepeatSampler, RewardConfig, RewardError, RewardFn, RewardFunc, RewardInputs, RewardTrainer,
    RewardTrainerBuilder, SFTConfig, SFTTrainer, SFTTrainerBuilder, ScaleRewards, SftLossType,
    TruncationMode,
};

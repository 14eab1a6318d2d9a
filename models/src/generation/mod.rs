//! Text generation (transformers' `generation/` package): [`GenerationConfig`] with
//! `generation_config.json`, the logits processors and warpers, and [`generate`] for
//! decoder-only models (greedy decoding, multinomial sampling, beam search and beam sampling).

mod beam_search;
mod configuration_utils;
mod logits_process;
mod utils;

pub use configuration_utils::{EarlyStopping, GENERATION_CONFIG_NAME, GenerationConfig};
pub(crate) use configuration_utils::{
    generation_fields_of, model_generation_config, save_model_generation_config,
};
pub use logits_process::{LogitsProcessor, logits_processors};
pub(crate) use utils::generate_from_encoder;
pub use utils::{GenerateOutput, generate};

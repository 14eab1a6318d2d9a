//! peft's LoRA (`peft/tuners/lora`, `peft_model.py`, `utils/save_and_load.py` of peft
//! 0.21.2): [`LoraConfig`], [`get_peft_model`] over any model here, [`PeftModel`]'s
//! forward, `save_pretrained` / `from_pretrained` with peft's adapter files, and
//! `merge_and_unload`.

mod config;
mod lora;
mod other;
mod peft_model;

pub use config::{
    ADAPTER_CONFIG_NAME, ADAPTER_SAFE_WEIGHTS_NAME, InitLoraWeights, LayerIndices, LoraBias,
    LoraConfig, PEFT_VERSION, TargetModules,
};
pub use lora::{LoraLayer, ParameterTarget};
pub use other::prepare_model_for_kbit_training;
pub use peft_model::{PeftModel, get_peft_model};

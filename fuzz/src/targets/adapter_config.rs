//! peft's `adapter_config.json`: `LoraConfig::from_json` on any JSON (an error, never a
//! panic), what it reads written back by `to_json` and read again to the same config (but
//! `inference_mode`, which peft writes true), and,
//! for a small config that reads, `get_peft_model` on a tiny Llama (target resolution by
//! names, regular expressions, layer indices, rank / alpha patterns; the adapters drawn) and
//! one forward: any outcome but a panic.

use tch::{Device, Tensor};
use tchtrain_models::{
    LlamaConfig, LlamaForCausalLM, LoraConfig, ModelInputs, TrainableModel, get_peft_model,
};

/// One input.
pub fn run(data: &[u8]) {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let Ok(config) = LoraConfig::from_json(&value) else {
        return;
    };
    let again = LoraConfig::from_json(&config.to_json()).expect("a written config reads back");
    // peft writes `inference_mode: true` whatever the model's.
    let again = LoraConfig {
        inference_mode: config.inference_mode,
        ..again
    };
    assert_eq!(again, config, "adapter_config.json round trip");
    let ranks = config.rank_pattern.values().copied().chain([config.r]);
    if ranks.into_iter().any(|r| r > 64) {
        return;
    }
    let llama: LlamaConfig = serde_json::from_value(serde_json::json!({
        "vocab_size": 16, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 8,
    }))
    .expect("tiny Llama config");
    let Ok(base) = LlamaForCausalLM::new(&llama, Device::Cpu) else {
        return;
    };
    let Ok(model) = get_peft_model(Box::new(base), config) else {
        return;
    };
    let ids = Tensor::from_slice(&[1i64, 2, 3, 4]).view([1, 4]);
    let _ = model.forward(&ModelInputs::new(&ids));
}

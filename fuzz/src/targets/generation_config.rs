//! `generation_config.json` and `config.json`'s generation fields: `GenerationConfig::from_json`
//! / `from_model_config` on any JSON (an error, never a panic), what reads written back by
//! `to_json` and read again to the same config, and, for a config that reads, `generate` on
//! a tiny Llama for a few tokens: any outcome but a panic.

use tch::{Device, Tensor};
use tchtrain_models::{GenerationConfig, LlamaConfig, LlamaForCausalLM, generate};

/// One input.
pub fn run(data: &[u8]) {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let _ = GenerationConfig::from_model_config(&value);
    let Ok(mut config) = GenerationConfig::from_json(&value) else {
        return;
    };
    let again =
        GenerationConfig::from_json(&config.to_json()).expect("a written config reads back");
    assert_eq!(
        again.to_json(),
        config.to_json(),
        "generation_config.json round trip"
    );
    // A few tokens at most, a handful of beams, on a tiny model.
    config.max_new_tokens = Some(config.max_new_tokens.unwrap_or(3).clamp(1, 4));
    config.max_length = None;
    if config.num_beams.unwrap_or(1) > 4 || config.num_return_sequences.unwrap_or(1) > 4 {
        return;
    }
    let llama: LlamaConfig = serde_json::from_value(serde_json::json!({
        "vocab_size": 16, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 16,
    }))
    .expect("tiny Llama config");
    let Ok(model) = LlamaForCausalLM::new(&llama, Device::Cpu) else {
        return;
    };
    let ids = Tensor::from_slice(&[1i64, 5, 7]).unsqueeze(0);
    let _ = generate(&model, &ids, None, &config, Some(16));
}

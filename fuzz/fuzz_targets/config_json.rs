//! A model folder's `config.json`: `read_model_type` and the GPT-2, BERT and Llama configs'
//! `from_file` (parsing and validation). A config that validates and is small enough to
//! build cheaply (every size at most 256, at most 2 layers; negative sizes included) must
//! also build its model: sizes `validate` lets through must never make libtorch fail.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tch::Device;
use tchtrain_models::{
    BertConfig, BertForMaskedLM, BertForSequenceClassification, GPT2Config,
    GPT2ForSequenceClassification, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
    PretrainedConfig, read_model_type,
};

fn check(config: &dyn PretrainedConfig) {
    let _ = config.to_json_value();
    let _ = config.num_labels();
    let _ = config.labels().problem_type();
}

/// Small enough to build on every input: sizes up to 256 (anything below, negative
/// included, goes through) and at most 2 layers.
fn small(sizes: &[i64], layers: i64) -> bool {
    sizes.iter().all(|&s| s <= 256) && layers <= 2
}

fuzz_target!(|data: &[u8]| {
    let path = tchtrain_fuzz::scratch_file("config.json", data);
    let _ = read_model_type(&path);
    if let Ok(c) = GPT2Config::from_file(&path) {
        check(&c);
        let sizes = [
            c.vocab_size,
            c.n_positions,
            c.n_embd,
            c.n_inner.unwrap_or(0),
            c.num_labels(),
        ];
        if small(&sizes, c.n_layer) {
            let _ = GPT2LMHeadModel::new(&c, Device::Cpu);
            let _ = GPT2ForSequenceClassification::new(&c, Device::Cpu);
        }
    }
    if let Ok(c) = BertConfig::from_file(&path) {
        check(&c);
        let sizes = [
            c.vocab_size,
            c.hidden_size,
            c.intermediate_size,
            c.max_position_embeddings,
            c.type_vocab_size,
            c.num_labels(),
        ];
        if small(&sizes, c.num_hidden_layers) {
            let _ = BertForMaskedLM::new(&c, Device::Cpu);
            let _ = BertForSequenceClassification::new(&c, Device::Cpu);
        }
    }
    if let Ok(c) = LlamaConfig::from_file(&path) {
        let _ = c.head_dim();
        let _ = c.num_key_value_heads();
        check(&c);
        let sizes = [
            c.vocab_size,
            c.hidden_size,
            c.intermediate_size,
            c.max_position_embeddings,
            c.head_dim() * c.num_attention_heads,
        ];
        if small(&sizes, c.num_hidden_layers) {
            let _ = LlamaForCausalLM::new(&c, Device::Cpu);
        }
    }
});

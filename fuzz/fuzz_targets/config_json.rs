//! A model folder's `config.json`: `read_model_type` and the GPT-2, BERT and Llama configs'
//! `from_file` (parsing and validation).

#![no_main]

use libfuzzer_sys::fuzz_target;
use tchtrain_models::{
    BertConfig, GPT2Config, LlamaConfig, PretrainedConfig, read_model_type,
};

fn check(config: &dyn PretrainedConfig) {
    let _ = config.to_json_value();
    let _ = config.num_labels();
    let _ = config.labels().problem_type();
}

fuzz_target!(|data: &[u8]| {
    let path = tchtrain_fuzz::scratch_file("config.json", data);
    let _ = read_model_type(&path);
    if let Ok(c) = GPT2Config::from_file(&path) {
        check(&c);
    }
    if let Ok(c) = BertConfig::from_file(&path) {
        check(&c);
    }
    if let Ok(c) = LlamaConfig::from_file(&path) {
        let _ = c.head_dim();
        let _ = c.num_key_value_heads();
        check(&c);
    }
});

//! A model folder's `config.json`: `read_model_type` and every config's `from_file`
//! (parsing and validation: GPT-2, BERT, RoBERTa, DistilBERT, DeBERTa-v2, ModernBERT and the
//! Llama-shaped families, RoPE parameters included). A config that validates and is small enough to
//! build cheaply (every size at most 256, at most 2 layers; negative sizes included) must
//! also build its model: sizes `validate` lets through must never make libtorch fail.

use tch::Device;
use tchtrain_models::{
    BertConfig, BertForMaskedLM, BertForSequenceClassification, DebertaV2Config,
    DebertaV2ForMaskedLM, DecoderConfig, DecoderForCausalLM, DistilBertConfig,
    DistilBertForMaskedLM, EncoderConfig, GPT2Config, GPT2ForSequenceClassification,
    GPT2LMHeadModel, Gemma2Config, Gemma3TextConfig, GemmaConfig, LlamaConfig, LlamaForCausalLM,
    MistralConfig, ModernBertConfig, ModernBertForMaskedLM, Phi3Config, PretrainedConfig,
    Qwen2Config, Qwen3Config, RobertaConfig, RobertaForMaskedLM, XLMRobertaConfig,
    XLMRobertaForMaskedLM, read_model_type,
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

/// A Llama-shaped family's config: read, and its causal LM built when small.
fn decoder<C: DecoderConfig>(path: &std::path::Path) {
    if let Ok(c) = C::from_file(path) {
        check(&c);
        let l = c.llama();
        let sizes = [
            l.vocab_size,
            l.hidden_size,
            l.intermediate_size,
            l.max_position_embeddings,
            l.head_dim() * l.num_attention_heads,
        ];
        if small(&sizes, l.num_hidden_layers) {
            let _ = DecoderForCausalLM::<C>::new(&c, Device::Cpu);
        }
    }
}

/// A RoBERTa-shaped config: read, and its masked LM built (by `build`) when small.
fn roberta<C: EncoderConfig>(path: &std::path::Path, build: impl Fn(&C)) {
    if let Ok(c) = C::from_file(path) {
        check(&c);
        let b = c.bert();
        let sizes = [
            b.vocab_size,
            b.hidden_size,
            b.intermediate_size,
            b.max_position_embeddings,
            b.type_vocab_size,
        ];
        if small(&sizes, b.num_hidden_layers) {
            build(&c);
        }
    }
}

/// One input.
pub fn run(data: &[u8]) {
    let path = crate::scratch_file("config.json", data);
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
    decoder::<Qwen2Config>(&path);
    decoder::<Qwen3Config>(&path);
    decoder::<MistralConfig>(&path);
    decoder::<GemmaConfig>(&path);
    decoder::<Gemma2Config>(&path);
    decoder::<Gemma3TextConfig>(&path);
    decoder::<Phi3Config>(&path);
    roberta::<RobertaConfig>(&path, |c| {
        let _ = RobertaForMaskedLM::new(c, Device::Cpu);
    });
    roberta::<XLMRobertaConfig>(&path, |c| {
        let _ = XLMRobertaForMaskedLM::new(c, Device::Cpu);
    });
    if let Ok(c) = DistilBertConfig::from_file(&path) {
        check(&c);
        let sizes = [c.vocab_size, c.dim, c.hidden_dim, c.max_position_embeddings];
        if small(&sizes, c.n_layers) {
            let _ = DistilBertForMaskedLM::new(&c, Device::Cpu);
        }
    }
    if let Ok(c) = ModernBertConfig::from_file(&path) {
        check(&c);
        let sizes = [
            c.vocab_size,
            c.hidden_size,
            c.intermediate_size,
            c.max_position_embeddings,
        ];
        if small(&sizes, c.num_hidden_layers) {
            let _ = ModernBertForMaskedLM::new(&c, Device::Cpu);
        }
    }
    if let Ok(c) = DebertaV2Config::from_file(&path) {
        check(&c);
        let sizes = [
            c.vocab_size,
            c.hidden_size,
            c.intermediate_size,
            c.max_position_embeddings,
            c.type_vocab_size,
            c.max_relative_positions,
            c.position_buckets.unwrap_or(0),
        ];
        if small(&sizes, c.num_hidden_layers) {
            let _ = DebertaV2ForMaskedLM::new(&c, Device::Cpu);
        }
    }
}

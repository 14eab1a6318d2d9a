//! Inputs the fuzz targets found to panic, each now a typed error.
//!
//! * `fuzz/fuzz_targets/tokenizer_json.rs`: tokenizer.json files the tokenizers crate reads
//!   without complaint (or panics while reading), then panics in `encode`; now
//!   `Error::Tokenizer` from `AutoTokenizer::from_pretrained`.
//! * `fuzz/fuzz_targets/config_json.rs`: config.json files with a negative size, which
//!   libtorch refused with a panic while the model was created; now `Error::InvalidConfig`
//!   from `from_file` and from the models' `new`.

use std::path::PathBuf;
use tchtrain_testing::lock;

use tch::Device;
use tchtrain_models::{
    AutoTokenizer, BertConfig, BertForMaskedLM, Error, GPT2Config, GPT2LMHeadModel, LlamaConfig,
    LlamaForCausalLM, Tokenizer,
};

/// A minimal word-level tokenizer.json with the given post-processor and decoder.
fn tokenizer_json(post_processor: &str, decoder: &str) -> String {
    format!(
        r#"{{"version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
  "normalizer": null, "pre_tokenizer": {{"type": "Whitespace"}},
  "post_processor": {post_processor},
  "decoder": {decoder},
  "model": {{"type": "WordLevel", "vocab": {{"[CLS]": 0, "[SEP]": 1, "[UNK]": 2, "hello": 3}},
            "unk_token": "[UNK]"}}}}"#
    )
}

const SPECIAL_TOKENS: &str = r#"{"[CLS]": {"id": "[CLS]", "ids": [0], "tokens": ["[CLS]"]},
                                 "[SEP]": {"id": "[SEP]", "ids": [1], "tokens": ["[SEP]"]}}"#;

fn template(single: &str, special_tokens: &str) -> String {
    format!(
        r#"{{"type": "TemplateProcessing", "single": {single},
  "pair": [{{"Sequence": {{"id": "A", "type_id": 0}}}}, {{"Sequence": {{"id": "B", "type_id": 1}}}}],
  "special_tokens": {special_tokens}}}"#
    )
}

fn write(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "tchtrain-models-fuzz-regressions-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// A folder named after `name` holding `text` as its tokenizer.json.
fn tokenizer_dir(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "tchtrain-models-fuzz-regressions-{}/{name}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tokenizer.json"), text).unwrap();
    dir
}

/// `AutoTokenizer::from_pretrained` refuses the folder's tokenizer.json with a tokenizer
/// error whose text contains `needle`.
fn assert_refused(name: &str, text: &str, needle: &str) {
    let path = tokenizer_dir(name, text);
    match AutoTokenizer::from_pretrained(&path) {
        Err(e @ Error::Tokenizer { .. }) => {
            let message = e.to_string();
            assert!(message.contains(needle), "{message}");
            assert!(
                message.contains(name),
                "the error names the file: {message}"
            );
        }
        Err(other) => panic!("expected Error::Tokenizer, got {other:?}"),
        Ok(_) => panic!("{name} was accepted"),
    }
}

#[test]
fn the_minimal_tokenizer_itself_loads_and_encodes() {
    let _g = lock();
    let single = r#"[{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 0}}]"#;
    let path = tokenizer_dir(
        "good",
        &tokenizer_json(&template(single, SPECIAL_TOKENS), "null"),
    );
    let tok = AutoTokenizer::from_pretrained(&path).unwrap();
    let tok = tok.tokenizer();
    let enc = tok.encode("hello", true).unwrap();
    assert_eq!(enc.get_ids(), [0, 3, 1]);
}

/// Found by the fuzzer: `[CLs]` in the template, `[CLS]` in `special_tokens`; the
/// tokenizers crate loaded it and panicked in every `encode` ("no entry found for key").
#[test]
fn template_special_token_missing_from_special_tokens() {
    let _g = lock();
    let single = r#"[{"SpecialToken": {"id": "[CLs]", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}}]"#;
    let text = tokenizer_json(&template(single, SPECIAL_TOKENS), "null");
    assert!(
        text.parse::<Tokenizer>().is_ok(),
        "the tokenizers crate reads it"
    );
    assert_refused("missing_special.json", &text, "`[CLs]`");
    // Also inside a processor Sequence.
    let nested = format!(
        r#"{{"type": "Sequence", "processors": [{{"type": "ByteLevel", "add_prefix_space": false,
             "trim_offsets": false, "use_regex": true}}, {}]}}"#,
        template(single, SPECIAL_TOKENS)
    );
    assert_refused(
        "missing_special_nested.json",
        &tokenizer_json(&nested, "null"),
        "`[CLs]`",
    );
}

/// `$B` in the `single` template indexes a second sequence that a single text lacks.
#[test]
fn single_template_using_the_second_sequence() {
    let _g = lock();
    let single = r#"[{"Sequence": {"id": "B", "type_id": 0}}]"#;
    let text = tokenizer_json(&template(single, SPECIAL_TOKENS), "null");
    assert!(text.parse::<Tokenizer>().is_ok());
    assert_refused("single_b.json", &text, "`$B`");
}

/// A special token with more ids than tokens (the crate's own builder refuses it).
#[test]
fn special_token_ids_and_tokens_differ_in_length() {
    let _g = lock();
    let single = r#"[{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}}]"#;
    let special = r#"{"[CLS]": {"id": "[CLS]", "ids": [0, 1], "tokens": ["[CLS]"]}}"#;
    assert_refused(
        "ids_tokens.json",
        &tokenizer_json(&template(single, special), "null"),
        "2 ids and 1 tokens",
    );
}

/// Found by the fuzzer: a JSON syntax error inside `decoder` (a number as an object key)
/// made the tokenizers crate panic while reading ("Helper: key must be a string").
#[test]
fn syntax_error_inside_the_decoder() {
    let _g = lock();
    let text = tokenizer_json("null", r#"{"type": "WordPiece", 1: 2}"#);
    assert_refused("decoder_syntax.json", &text, "key must be a string");
}

/// Found by the fuzzer: a tiny config.json with `"vocab_size": -3` (or any other negative
/// size) passed validation and libtorch panicked creating `[-3, 64]` weights
/// ("Trying to create tensor with negative dimension").
#[test]
fn negative_or_zero_sizes_in_config_json() {
    let _g = lock();
    let gpt2 = r#"{"model_type": "gpt2", "vocab_size": 100, "n_positions": 32, "n_embd": 16,
                   "n_layer": 1, "n_head": 2}"#;
    let bert = r#"{"model_type": "bert", "vocab_size": 100, "hidden_size": 16,
                   "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32,
                   "max_position_embeddings": 32, "type_vocab_size": 2}"#;
    let llama = r#"{"model_type": "llama", "vocab_size": 100, "hidden_size": 16,
                    "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                    "max_position_embeddings": 32}"#;
    let with = |base: &str, field: &str, value: i64| {
        let mut v: serde_json::Value = serde_json::from_str(base).unwrap();
        v[field] = value.into();
        v.to_string()
    };
    let refused = |result: Result<(), Error>, field: &str| match result {
        Err(Error::InvalidConfig { field: f, .. }) => assert_eq!(f, field),
        other => panic!("{field}: expected InvalidConfig, got {other:?}"),
    };
    // The unchanged configs build.
    let path = write("gpt2_ok.json", gpt2);
    GPT2LMHeadModel::new(&GPT2Config::from_file(&path).unwrap(), Device::Cpu).unwrap();
    let path = write("bert_ok.json", bert);
    BertForMaskedLM::new(&BertConfig::from_file(&path).unwrap(), Device::Cpu).unwrap();
    let path = write("llama_ok.json", llama);
    LlamaForCausalLM::new(&LlamaConfig::from_file(&path).unwrap(), Device::Cpu).unwrap();
    for value in [-3, 0] {
        for field in ["vocab_size", "n_positions", "n_embd", "n_inner"] {
            let path = write("gpt2.json", &with(gpt2, field, value));
            refused(GPT2Config::from_file(&path).map(drop), field);
        }
        for field in [
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        ] {
            let path = write("bert.json", &with(bert, field, value));
            refused(BertConfig::from_file(&path).map(drop), field);
        }
        for field in [
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "max_position_embeddings",
            "head_dim",
        ] {
            let path = write("llama.json", &with(llama, field, value));
            refused(LlamaConfig::from_file(&path).map(drop), field);
        }
    }
    for (base, field) in [
        (gpt2, "n_layer"),
        (bert, "num_hidden_layers"),
        (llama, "num_hidden_layers"),
    ] {
        let path = write("layers.json", &with(base, field, -1));
        let result = match base {
            b if b == gpt2 => GPT2Config::from_file(&path).map(drop),
            b if b == bert => BertConfig::from_file(&path).map(drop),
            _ => LlamaConfig::from_file(&path).map(drop),
        };
        refused(result, field);
    }
    // A config built in code (not read from a file) is checked by the model's `new`.
    let mut c = GPT2Config::from_file(&write("gpt2_ok.json", gpt2)).unwrap();
    c.vocab_size = -3;
    refused(
        GPT2LMHeadModel::new(&c, Device::Cpu).map(drop),
        "vocab_size",
    );
}

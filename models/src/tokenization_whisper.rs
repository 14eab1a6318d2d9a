//! `WhisperTokenizer` (upstream `models/whisper/tokenization_whisper.py`): the GPT-2 byte-level
//! BPE of `tokenizer.json` with Whisper's prefix tokens. `set_prefix_tokens(language, task,
//! predict_timestamps)` rewrites the post-processor as upstream's does
//! (`<|startoftranscript|> <|lang|> <|task|> <|notimestamps|> $A <|endoftext|>`; the language
//! token's id is `<|startoftranscript|>`'s + 1 + the language's index in `LANGUAGES`), and
//! loading applies the `language` / `task` / `predict_timestamps` of `tokenizer_config.json`.
//! Decoding with `skip_special_tokens` drops a `<|startofprev|>` prompt up to
//! `<|startoftranscript|>`, and timestamp tokens (`<|1.08|>`) are removed from the text, as
//! upstream's `decode`.

use serde_json::Value;
use tokenizers::processors::template::TemplateProcessing;

use crate::auto_tokenizer::PreTrainedTokenizerFast;
use crate::generation_whisper::TO_LANGUAGE_CODE;
use crate::{Error, Result};

/// Upstream `LANGUAGES` has 100 codes: the first 100 values of `TO_LANGUAGE_CODE`, in order.
const LANGUAGES: usize = 100;

/// Upstream `TASK_IDS`.
const TASK_IDS: [&str; 2] = ["translate", "transcribe"];

fn invalid(name: &'static str, detail: String) -> Error {
    Error::InvalidInput { name, detail }
}

impl PreTrainedTokenizerFast {
    /// Whether this is a `WhisperTokenizer` (its `tokenizer_class`).
    pub fn is_whisper(&self) -> bool {
        self.config()
            .get("tokenizer_class")
            .and_then(Value::as_str)
            .is_some_and(|c| c.trim_end_matches("Fast") == "WhisperTokenizer")
    }

    fn token_id(&self, token: &str) -> Result<u32> {
        self.tokenizer().token_to_id(token).ok_or_else(|| {
            invalid(
                "tokenizer",
                format!("`{token}` is not a token of this tokenizer (a Whisper tokenizer has it)"),
            )
        })
    }

    /// Upstream `prefix_tokens`: `<|startoftranscript|>`, the language's token, the task's,
    /// and `<|notimestamps|>` unless timestamps are predicted.
    pub fn whisper_prefix_tokens(&self) -> Result<Vec<u32>> {
        let config = self.config();
        let text = |k: &str| config.get(k).and_then(Value::as_str).map(str::to_lowercase);
        let bos = self.token_id("<|startoftranscript|>")?;
        let mut out = vec![bos];
        if let Some(language) = text("language") {
            let code = TO_LANGUAGE_CODE
                .iter()
                .find(|(name, _)| *name == language)
                .map(|(_, code)| *code)
                .or_else(|| {
                    TO_LANGUAGE_CODE
                        .iter()
                        .find(|(_, code)| *code == language)
                        .map(|(_, code)| *code)
                })
                .ok_or_else(|| {
                    let listed: Vec<String> = if language.chars().count() == 2 {
                        TO_LANGUAGE_CODE
                            .iter()
                            .map(|(_, c)| format!("'{c}'"))
                            .collect()
                    } else {
                        TO_LANGUAGE_CODE
                            .iter()
                            .map(|(n, _)| format!("'{n}'"))
                            .collect()
                    };
                    invalid(
                        "language",
                        format!(
                            "Unsupported language: {language}. Language should be one of: [{}].",
                            listed.join(", ")
                        ),
                    )
                })?;
            let index = TO_LANGUAGE_CODE[..LANGUAGES]
                .iter()
                .position(|(_, c)| *c == code)
                .unwrap_or(0);
            out.push(bos + 1 + index as u32);
        }
        if let Some(task) = config.get("task").and_then(Value::as_str) {
            if !TASK_IDS.contains(&task) {
                return Err(invalid(
                    "task",
                    format!(
                        "Unsupported task: {task}. Task should be in: ['translate', 'transcribe']"
                    ),
                ));
            }
            out.push(self.token_id(if task == "transcribe" {
                "<|transcribe|>"
            } else {
                "<|translate|>"
            })?);
        }
        if config.get("predict_timestamps").and_then(Value::as_bool) != Some(true) {
            out.push(self.token_id("<|notimestamps|>")?);
        }
        Ok(out)
    }

    /// Upstream `set_prefix_tokens(language, task, predict_timestamps)`: the given settings
    /// replace the tokenizer's (`None` keeps it), and texts are encoded as `prefix tokens +
    /// text + <|endoftext|>` from now on.
    pub fn set_prefix_tokens(
        &mut self,
        language: Option<&str>,
        task: Option<&str>,
        predict_timestamps: Option<bool>,
    ) -> Result<()> {
        let mut next = self.clone();
        if let Some(l) = language {
            next.config_mut()
                .insert("language".into(), l.to_lowercase().into());
        }
        if let Some(t) = task {
            next.config_mut().insert("task".into(), t.into());
        }
        if let Some(p) = predict_timestamps {
            next.config_mut()
                .insert("predict_timestamps".into(), p.into());
        }
        let prefix = next.whisper_prefix_tokens()?;
        let eos = next
            .config()
            .get("eos_token")
            .and_then(Value::as_str)
            .unwrap_or("<|endoftext|>")
            .to_string();
        let eos_id = next.token_id(&eos)?;
        let mut special = vec![(eos.clone(), eos_id)];
        let mut names = Vec::new();
        for id in &prefix {
            let token = next.tokenizer().id_to_token(*id).ok_or_else(|| {
                invalid(
                    "tokenizer",
                    format!("the prefix token id {id} is not in the vocabulary"),
                )
            })?;
            names.push(format!("{token}:0"));
            special.push((token, *id));
        }
        let prefix_template = names.join(" ");
        let template = TemplateProcessing::builder()
            .try_single(format!("{prefix_template} $A:0 {eos}:0").as_str())
            .and_then(|b| b.try_pair(format!("{prefix_template} $A:0 $B:1 {eos}:1").as_str()))
            .map_err(|e| invalid("tokenizer", e.to_string()))?
            .special_tokens(special)
            .build()
            .map_err(|e| invalid("tokenizer", e.to_string()))?;
        next.tokenizer_mut().with_post_processor(Some(template));
        *self = next;
        Ok(())
    }

    /// Upstream `WhisperTokenizer.decode(ids, skip_special_tokens)`: a `<|startofprev|>`
    /// prompt dropped (up to `<|startoftranscript|>`) when skipping special tokens, the
    /// backend's decoding, then the timestamp tokens' text removed.
    pub(crate) fn whisper_decode(&self, ids: &[i64], skip_special_tokens: bool) -> Result<String> {
        let mut ids = ids;
        if skip_special_tokens && !ids.is_empty() {
            let prev = self.token_id("<|startofprev|>")?;
            let start = self.token_id("<|startoftranscript|>")?;
            if ids[0] == i64::from(prev) {
                ids = match ids.iter().position(|&t| t == i64::from(start)) {
                    Some(p) => &ids[p..],
                    None => &[],
                };
            }
        }
        let text = self.backend_decode(ids, skip_special_tokens)?;
        Ok(remove_timestamps(&text))
    }
}

/// `re.sub(r"<\|(\d+\.\d+)\|>", "", text)`.
fn remove_timestamps(text: &str) -> String {
    static PATTERN: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let re =
        PATTERN.get_or_init(|| regex::Regex::new(r"<\|(\d+\.\d+)\|>").expect("a valid pattern"));
    re.replace_all(text, "").into_owned()
}

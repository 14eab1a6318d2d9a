//! `AutoTokenizer`: upstream's `AutoTokenizer.from_pretrained` / `save_pretrained` for the
//! fast tokenizers the models here use — a folder (or hub repository) with `tokenizer.json`
//! (and its `tokenizer_config.json` / `special_tokens_map.json`), or GPT-2's `vocab.json` +
//! `merges.txt` (`GPT2TokenizerFast(vocab_file, merges_file)`). The one way to get a
//! tokenizer: the Trainer's `processing_class`, the collators' [`TokenizerInfo`] and the
//! example scripts all start here.

use std::path::Path;

use serde_json::{Map, Value};
use tchtrain_collators::{TokenizerInfo, read_tokenizer_config, special_tokens_map};
use tokenizers::Tokenizer;

use crate::chat_template::{ChatTemplate, ChatTemplateOptions, render_jinja_template};
use crate::hub::{HubOptions, resolve};
use crate::tokenization::{QwenPattern, gpt2_tokenizer, load_tokenizer, qwen2_tokenizer};
use crate::{Error, Result};

/// `tokenizer.json`.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// `tokenizer_config.json`.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

/// GPT-2's one special token (`bos_token`, `eos_token` and `unk_token` of
/// `GPT2TokenizerFast`).
const GPT2_SPECIAL: &str = "<|endoftext|>";

/// Upstream's `PreTrainedTokenizerFast`: a `tokenizers` tokenizer with its configuration
/// (`tokenizer_config.json`) and the facts the collators read ([`TokenizerInfo`]). As
/// upstream's `tokenizer(text)`, the tokenizer neither pads nor truncates unless asked.
#[derive(Debug, Clone)]
pub struct PreTrainedTokenizerFast {
    tokenizer: Tokenizer,
    config: Map<String, Value>,
    info: TokenizerInfo,
    chat_template: Option<ChatTemplate>,
}

impl PreTrainedTokenizerFast {
    /// A tokenizer with `config` (`tokenizer_config.json`'s keys: special tokens,
    /// `padding_side`, `model_max_length`, ...).
    /// A `chat_template` key in `config` becomes the tokenizer's chat template (an error
    /// when it is neither a string nor a list of `{name, template}`).
    pub fn new(tokenizer: Tokenizer, mut config: Map<String, Value>) -> Result<Self> {
        let chat_template = ChatTemplate::from_config(
            config.remove("chat_template"),
            Path::new(TOKENIZER_CONFIG_FILE),
        )?;
        let info = TokenizerInfo::from_tokenizer_config(&tokenizer, &Value::Object(config.clone()));
        Ok(Self {
            tokenizer,
            config,
            info,
            chat_template,
        })
    }

    /// Upstream's `tokenizer.chat_template`: the template(s) `tokenizer_config.json` or the
    /// folder's `.jinja` files gave.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// Sets (or removes) the chat template, as assigning `tokenizer.chat_template`.
    pub fn set_chat_template(&mut self, template: Option<ChatTemplate>) {
        self.chat_template = template;
    }

    /// Upstream's `special_tokens_map`: the named special tokens that are set, as text
    /// ([`tchtrain_collators::special_tokens_map`] of the configuration).
    pub fn special_tokens_map(&self) -> Vec<(String, String)> {
        special_tokens_map(&self.config)
    }

    /// Upstream's `apply_chat_template(conversation, tokenize=False)`: the conversation (JSON
    /// text of a list of messages) rendered by the tokenizer's template (or the one
    /// `options.chat_template` names or gives), with the special tokens as variables.
    pub fn apply_chat_template_text(
        &self,
        conversation: &str,
        options: &ChatTemplateOptions,
    ) -> Result<String> {
        let template = match (&self.chat_template, options.chat_template.as_deref()) {
            // Upstream: `tools is not None`.
            (Some(t), given) => {
                let tools = options.tools.as_deref().is_some_and(|t| t.trim() != "null");
                t.select(given, tools)?
            }
            (None, Some(text)) => text,
            (None, None) => {
                return Err(Error::ChatTemplate {
                    detail: "this tokenizer has no chat template (tokenizer_config.json's chat_template or chat_template.jinja) and none was passed; set one with set_chat_template or pass options.chat_template".into(),
                });
            }
        };
        render_jinja_template(template, conversation, options, &self.special_tokens_map())
    }

    /// Upstream's `apply_chat_template(conversation)` (`tokenize=True`, `return_dict=True`):
    /// the rendered text tokenized without adding special tokens (the template writes
    /// them), as a row with `input_ids` and `attention_mask`.
    pub fn apply_chat_template(
        &self,
        conversation: &str,
        options: &ChatTemplateOptions,
    ) -> Result<tchtrain_collators::Feature> {
        let text = self.apply_chat_template_text(conversation, options)?;
        let encoding =
            self.tokenizer
                .encode(text.as_str(), false)
                .map_err(|e| Error::ChatTemplate {
                    detail: format!("the rendered chat does not tokenize: {e}"),
                })?;
        let ids = |v: &[u32]| v.iter().map(|&x| i64::from(x)).collect::<Vec<_>>();
        Ok(tchtrain_collators::Feature {
            input_ids: ids(encoding.get_ids()),
            attention_mask: Some(ids(encoding.get_attention_mask())),
            ..Default::default()
        })
    }

    /// The template [`apply_chat_template_text`](Self::apply_chat_template_text) renders with.
    fn template_for<'a>(&'a self, options: &'a ChatTemplateOptions) -> Result<&'a str> {
        match (&self.chat_template, options.chat_template.as_deref()) {
            (Some(t), given) => {
                let tools = options.tools.as_deref().is_some_and(|t| t.trim() != "null");
                t.select(given, tools)
            }
            (None, Some(text)) => Ok(text),
            (None, None) => Err(Error::ChatTemplate {
                detail: "this tokenizer has no chat template (tokenizer_config.json's chat_template or chat_template.jinja) and none was passed; set one with set_chat_template or pass options.chat_template".into(),
            }),
        }
    }

    /// Upstream's `apply_chat_template(conversation, return_dict=True,
    /// return_assistant_tokens_mask=True)`: the row and its `assistant_masks` — 1 for the
    /// tokens from the one holding a `{% generation %}` block's first character to the one
    /// holding its last (to the end when that last token is the first, as upstream's `if
    /// end_token` reads 0 as missing), the rest 0.
    pub fn apply_chat_template_with_assistant_mask(
        &self,
        conversation: &str,
        options: &ChatTemplateOptions,
    ) -> Result<(tchtrain_collators::Feature, Vec<i64>)> {
        let template = self.template_for(options)?;
        let (text, spans) = crate::chat_template::render_jinja_template_with_generation_indices(
            template,
            conversation,
            options,
            &self.special_tokens_map(),
        )?;
        let encoding = self
            .tokenizer
            .encode_char_offsets(text.as_str(), false)
            .map_err(|e| Error::ChatTemplate {
                detail: format!("the rendered chat does not tokenize: {e}"),
            })?;
        let n = encoding.get_ids().len();
        let mut mask = vec![0i64; n];
        for (start, end) in spans {
            let Some(first) = encoding.char_to_token(start, 0) else {
                break;
            };
            let last = if end == 0 {
                None
            } else {
                encoding.char_to_token(end - 1, 0)
            };
            let stop = match last {
                Some(t) if t != 0 => t + 1,
                _ => n,
            };
            for m in mask.iter_mut().take(stop).skip(first) {
                *m = 1;
            }
        }
        let ids = |v: &[u32]| v.iter().map(|&x| i64::from(x)).collect::<Vec<_>>();
        Ok((
            tchtrain_collators::Feature {
                input_ids: ids(encoding.get_ids()),
                attention_mask: Some(ids(encoding.get_attention_mask())),
                ..Default::default()
            },
            mask,
        ))
    }

    /// Upstream `tokenizer.encode(text, add_special_tokens=...)`: the token ids.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<i64>> {
        let enc = self
            .tokenizer
            .encode(text, add_special_tokens)
            .map_err(|e| Error::InvalidInput {
                name: "text",
                detail: format!("the tokenizer failed: {e}"),
            })?;
        Ok(enc.get_ids().iter().map(|&i| i64::from(i)).collect())
    }

    /// Upstream `tokenizer.decode(ids, skip_special_tokens, clean_up_tokenization_spaces)`
    /// of a fast tokenizer: the backend's decoding, then (asked for, or the tokenizer's
    /// `clean_up_tokenization_spaces`, default false) upstream's `clean_up_tokenization`,
    /// which a BPE tokenizer skips with upstream's warning (it would strip real spaces).
    pub fn decode(
        &self,
        ids: &[i64],
        skip_special_tokens: bool,
        clean_up_tokenization_spaces: Option<bool>,
    ) -> Result<String> {
        if self.is_whisper() {
            // Whisper's `decode` (its own prompt stripping and timestamp filtering); its
            // tokenizer_config carries clean_up_tokenization_spaces false.
            return self.whisper_decode(ids, skip_special_tokens);
        }
        self.backend_decode_cleaned(ids, skip_special_tokens, clean_up_tokenization_spaces)
    }

    /// The backend's decoding of `ids`.
    pub(crate) fn backend_decode(&self, ids: &[i64], skip_special_tokens: bool) -> Result<String> {
        let ids: Vec<u32> = ids
            .iter()
            .map(|&i| {
                u32::try_from(i).map_err(|_| Error::InvalidInput {
                    name: "token_ids",
                    detail: format!("{i} is not a token id"),
                })
            })
            .collect::<Result<_>>()?;
        self.tokenizer
            .decode(&ids, skip_special_tokens)
            .map_err(|e| Error::InvalidInput {
                name: "token_ids",
                detail: format!("the tokenizer failed: {e}"),
            })
    }

    fn backend_decode_cleaned(
        &self,
        ids: &[i64],
        skip_special_tokens: bool,
        clean_up_tokenization_spaces: Option<bool>,
    ) -> Result<String> {
        let text = self.backend_decode(ids, skip_special_tokens)?;
        let clean = clean_up_tokenization_spaces.unwrap_or_else(|| {
            self.config
                .get("clean_up_tokenization_spaces")
                .and_then(Value::as_bool)
                .unwrap_or(false)
        });
        if !clean {
            return Ok(text);
        }
        if matches!(self.tokenizer.get_model(), tokenizers::ModelWrapper::BPE(_)) {
            log::warn!(
                "Ignoring clean_up_tokenization_spaces=True for BPE tokenizer PreTrainedTokenizerFast. The clean_up_tokenization post-processing step is designed for WordPiece tokenizers and is destructive for BPE (it strips spaces before punctuation)."
            );
            return Ok(text);
        }
        Ok(text
            .replace(" .", ".")
            .replace(" ?", "?")
            .replace(" !", "!")
            .replace(" ,", ",")
            .replace(" ' ", "'")
            .replace(" n't", "n't")
            .replace(" 'm", "'m")
            .replace(" 's", "'s")
            .replace(" 've", "'ve")
            .replace(" 're", "'re"))
    }

    /// The `tokenizers` tokenizer (`backend_tokenizer`).
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Pad / mask ids, padding side, `model_max_length`, special ids: what the collators
    /// read off upstream's tokenizer.
    pub fn info(&self) -> &TokenizerInfo {
        &self.info
    }

    /// The configuration (`tokenizer_config.json` over `special_tokens_map.json`).
    pub fn config(&self) -> &Map<String, Value> {
        &self.config
    }

    /// The backend tokenizer, to change (a multilingual tokenizer's post-processor).
    pub(crate) fn tokenizer_mut(&mut self) -> &mut Tokenizer {
        &mut self.tokenizer
    }

    /// The configuration, to change (`src_lang`, `tgt_lang`).
    pub(crate) fn config_mut(&mut self) -> &mut Map<String, Value> {
        &mut self.config
    }

    /// Upstream `save_pretrained`: `tokenizer.json` and `tokenizer_config.json` in `dir`
    /// (created if needed), which [`AutoTokenizer::from_pretrained`] and upstream's read back.
    pub fn save_pretrained(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let file = dir.join(TOKENIZER_FILE);
        self.tokenizer
            .save(&file, true)
            .map_err(|e| Error::Tokenizer {
                path: file.clone(),
                detail: e.to_string(),
            })?;
        if let Some(template) = &self.chat_template {
            template.save(dir)?;
        }
        let mut config = self.config.clone();
        config
            .entry("tokenizer_class")
            .or_insert_with(|| Value::from("PreTrainedTokenizerFast"));
        let path = dir.join(TOKENIZER_CONFIG_FILE);
        let text =
            serde_json::to_string_pretty(&Value::Object(config)).map_err(|e| Error::Tokenizer {
                path: path.clone(),
                detail: e.to_string(),
            })?;
        std::fs::write(&path, text + "\n").map_err(|source| Error::Io { path, source })
    }
}

/// Upstream's `TOKENIZER_MAPPING_NAMES` for the model types here: the tokenizer class a
/// model type registers (`None`: none, the file's own).
fn registered_tokenizer_class(model_type: &str) -> Option<&'static str> {
    Some(match model_type {
        "qwen2" | "qwen3" | "qwen2_moe" | "qwen3_moe" => "Qwen2Tokenizer",
        "qwen3_5" | "qwen3_5_text" | "qwen3_5_moe" | "qwen3_5_moe_text" => "Qwen3_5Tokenizer",
        "gpt2" => "GPT2Tokenizer",
        "gemma" | "gemma2" | "gemma3" | "gemma3_text" => "GemmaTokenizer",
        "olmoe" => "GPTNeoXTokenizer",
        "bert" | "distilbert" => "BertTokenizer",
        "roberta" | "bart" => "RobertaTokenizer",
        "deberta-v2" => "DebertaV2Tokenizer",
        "xlm-roberta" => "XLMRobertaTokenizer",
        "t5" => "T5Tokenizer",
        "mbart" => "MBartTokenizer",
        "whisper" => "WhisperTokenizer",
        "mistral" | "mixtral" | "phi3" | "olmo2" | "olmo3" | "granite" | "modernbert" => {
            "TokenizersBackend"
        }
        _ => return None,
    })
}

/// Upstream's `MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS` among the model types here: their
/// registered class wins over the one the folder names.
const MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS: &[&str] = &[
    "qwen2",
    "phi3",
    "modernbert",
    "qwen3_5",
    "qwen3_5_moe",
    "qwen3_5_moe_text",
];

/// The tokenizer class upstream's `AutoTokenizer.from_pretrained` (transformers 5.23)
/// instantiates for a folder of `model_type` whose `tokenizer_config.json` (or `config.json`)
/// names `hub_class`: the hub's class, unless the model type registers a specific class
/// that differs and the hub's is known to be wrong for it (`qwen2` folders that say
/// `GPT2Tokenizer` load as `Qwen2Tokenizer`); with no class named, the registered one.
pub fn tokenizer_class(model_type: Option<&str>, hub_class: Option<&str>) -> Option<String> {
    let registered = model_type.and_then(registered_tokenizer_class);
    let bare = |c: &str| c.strip_suffix("Fast").unwrap_or(c).to_string();
    match (hub_class, registered) {
        (Some(hub), Some(registered)) if bare(hub) != bare(registered) => {
            let generic = [
                "TokenizersBackend",
                "PythonBackend",
                "PreTrainedTokenizerFast",
            ];
            let wrong_hub =
                model_type.is_some_and(|t| MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS.contains(&t));
            match generic.contains(&registered) {
                false if wrong_hub => Some(registered.to_string()),
                _ => Some(bare(hub)),
            }
        }
        (Some(hub), _) => Some(bare(hub)),
        (None, registered) => registered.map(str::to_string),
    }
}

/// Upstream's `AutoTokenizer`.
#[derive(Debug, Clone, Copy)]
pub struct AutoTokenizer;

impl AutoTokenizer {
    /// Upstream `AutoTokenizer.from_pretrained(name_or_path)`: a local folder, else a hub
    /// repository id (the cache, or a download as for models). The folder's
    /// `tokenizer.json` with its configuration, or GPT-2's `vocab.json` + `merges.txt`
    /// (byte-level BPE without a prefix space; `<|endoftext|>` as its bos / eos / unk token).
    /// A folder with neither is [`Error::MissingFile`] naming `tokenizer.json`.
    pub fn from_pretrained(name_or_path: impl AsRef<Path>) -> Result<PreTrainedTokenizerFast> {
        let given = name_or_path.as_ref();
        let dir = if given.is_dir() {
            given.to_path_buf()
        } else {
            let name = given.to_str().ok_or_else(|| Error::Resolve {
                name: given.display().to_string(),
                detail: "not a folder, and not UTF-8 (so not a hub repository id)".into(),
            })?;
            resolve(name, &HubOptions::from_env())?
        };
        let mut config = match read_tokenizer_config(&dir).map_err(|e| Error::Tokenizer {
            path: dir.join(TOKENIZER_CONFIG_FILE),
            detail: e.to_string(),
        })? {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        let chat_template = ChatTemplate::load(&dir, &mut config)?;
        let with_template = |mut t: PreTrainedTokenizerFast| {
            t.chat_template = chat_template.clone();
            t
        };
        // The class upstream picks from the model type and the class the folder names; a
        // class with its own pipeline rebuilds it over the file's vocabulary.
        let model_config = read_model_config(&dir)?;
        let hub_class = config
            .get("tokenizer_class")
            .or_else(|| model_config.get("tokenizer_class"))
            .and_then(Value::as_str);
        let model_type = model_config.get("model_type").and_then(Value::as_str);
        match tokenizer_class(model_type, hub_class).as_deref() {
            Some("Qwen2Tokenizer") => {
                return Ok(with_template(qwen2_from(&dir, config, QwenPattern::Qwen2)?));
            }
            Some("Qwen3_5Tokenizer") => {
                return Ok(with_template(qwen2_from(
                    &dir,
                    config,
                    QwenPattern::Qwen3_5,
                )?));
            }
            _ => {}
        }
        let whisper = tokenizer_class(model_type, hub_class).as_deref() == Some("WhisperTokenizer");
        if dir.join(TOKENIZER_FILE).is_file() {
            let mut tokenizer = PreTrainedTokenizerFast::new(load_tokenizer(&dir)?, config)?;
            if whisper {
                // Upstream's `__init__` ends with `set_prefix_tokens()`: the post-processor
                // follows the config's language / task / predict_timestamps.
                tokenizer
                    .config_mut()
                    .insert("tokenizer_class".into(), "WhisperTokenizer".into());
                tokenizer.set_prefix_tokens(None, None, None)?;
            }
            return Ok(with_template(tokenizer));
        }
        let (vocab, merges) = (dir.join("vocab.json"), dir.join("merges.txt"));
        if vocab.is_file() && merges.is_file() {
            let tokenizer = gpt2_tokenizer(&vocab, &merges)?;
            let mut config = config;
            if tokenizer.token_to_id(GPT2_SPECIAL).is_some() {
                for key in ["bos_token", "eos_token", "unk_token"] {
                    config
                        .entry(key)
                        .or_insert_with(|| Value::from(GPT2_SPECIAL));
                }
            }
            config
                .entry("tokenizer_class")
                .or_insert_with(|| Value::from("GPT2Tokenizer"));
            return Ok(with_template(PreTrainedTokenizerFast::new(
                tokenizer, config,
            )?));
        }
        Err(missing_tokenizer(&dir))
    }
}

fn missing_tokenizer(dir: &Path) -> Error {
    Error::MissingFile {
        path: dir.join(TOKENIZER_FILE),
        fix: "a tokenizer folder needs tokenizer.json (or GPT-2's vocab.json and merges.txt); save one with `tokenizer.save_pretrained(dir)`",
    }
}

/// The folder's `config.json` as an object (empty when there is none: a tokenizer-only
/// folder).
fn read_model_config(dir: &Path) -> Result<Map<String, Value>> {
    let path = dir.join(crate::CONFIG_NAME);
    if !path.is_file() {
        return Ok(Map::new());
    }
    let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
        path: path.clone(),
        source,
    })?;
    match serde_json::from_str(&text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Ok(Map::new()),
        Err(source) => Err(Error::ConfigJson { path, source }),
    }
}

/// Upstream `Qwen2Tokenizer.from_pretrained(dir)` (and `Qwen3_5Tokenizer`'s, the same but for
/// its pattern): the vocabulary and merges of the folder's `tokenizer.json` (its
/// post-processor and added tokens kept) or of `vocab.json` + `merges.txt`, under Qwen's
/// pipeline; `<|endoftext|>` the unknown, end and padding token unless the configuration
/// names others.
fn qwen2_from(
    dir: &Path,
    mut config: Map<String, Value>,
    pattern: QwenPattern,
) -> Result<PreTrainedTokenizerFast> {
    let (source, file) = if dir.join(TOKENIZER_FILE).is_file() {
        (load_tokenizer(dir)?, dir.join(TOKENIZER_FILE))
    } else {
        let (vocab, merges) = (dir.join("vocab.json"), dir.join("merges.txt"));
        if !(vocab.is_file() && merges.is_file()) {
            return Err(missing_tokenizer(dir));
        }
        (gpt2_tokenizer(&vocab, &merges)?, vocab)
    };
    for key in ["unk_token", "eos_token", "pad_token"] {
        config
            .entry(key)
            .or_insert_with(|| Value::from(GPT2_SPECIAL));
    }
    // `all_special_tokens`: the named ones that are set, then the extra ones.
    let mut special: Vec<String> = special_tokens_map(&config)
        .into_iter()
        .map(|(_, token)| token)
        .collect();
    special.dedup();
    let tokenizer = qwen2_tokenizer(&source, &file, &special, pattern)?;
    PreTrainedTokenizerFast::new(tokenizer, config)
}

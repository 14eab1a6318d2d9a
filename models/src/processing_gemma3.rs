//! `Gemma3Processor` (upstream `models/gemma3/processing_gemma3.py`, transformers 5.23): Gemma
//! 3's tokenizer and image processor together.
//!
//! Each `<start_of_image>` (the tokenizer's `boi_token`) in the text becomes
//! `"\n\n<start_of_image>" + <image_soft_token> × image_seq_length + "<end_of_image>\n\n"`, the
//! text is tokenized, and `token_type_ids` are 1 on the image tokens (upstream's
//! `mm_token_type_ids`); the images go through the image processor on upstream's default
//! backend when torchvision is installed, torchvision's
//! ([`ImageProcessor::process_torchvision`]). Pan-and-scan (`do_pan_and_scan`) is refused.
//!
//! ```no_run
//! use tchtrain_models::Gemma3Processor;
//! let processor = Gemma3Processor::from_pretrained("assets/tiny-gemma3".as_ref())?;
//! let image = tchtrain_datasets::open_image("cat.png".as_ref())?;
//! let messages = r#"[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}]"#;
//! let text = processor.tokenizer.apply_chat_template_text(messages, &Default::default())?;
//! let row = processor.call(&text, &[image], None)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::path::Path;

use serde_json::{Map, Value};
use tchtrain_datasets::DecodedImage;

use crate::auto_tokenizer::{AutoTokenizer, PreTrainedTokenizerFast};
use crate::image_processing::{ImageProcessor, ImageProcessorConfig};
use crate::{Error, Result};

/// `processor_config.json`'s name.
pub const PROCESSOR_NAME: &str = "processor_config.json";

/// One processed example: what `processor(text=..., images=...)` returns for a row.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessedExample {
    /// `input_ids`.
    pub input_ids: Vec<i64>,
    /// `token_type_ids`: 1 on the image tokens.
    pub token_type_ids: Vec<i64>,
    /// The images' `pixel_values`, `[images, channels, height, width]` (`None` without
    /// images).
    pub pixel_values: Option<(Vec<i64>, Vec<f32>)>,
}

/// Upstream `Gemma3Processor`.
#[derive(Debug, Clone)]
pub struct Gemma3Processor {
    /// The tokenizer (its chat template renders the conversations).
    pub tokenizer: PreTrainedTokenizerFast,
    /// The image processor (torchvision backend).
    pub image_processor: ImageProcessor,
    /// `image_seq_length`: image tokens per image (256 in Gemma 3's checkpoints).
    pub image_seq_length: usize,
    /// The tokenizer's `boi_token` (`<start_of_image>`): where an image goes in the text.
    pub boi_token: String,
    /// `"\n\n" + boi + image_token × image_seq_length + eoi + "\n\n"`.
    full_image_sequence: String,
    /// The tokenizer's `image_token`, and its id.
    image_token: (String, i64),
    /// `processor_config.json` as read (written back by `save_pretrained`).
    raw_config: Map<String, Value>,
}

fn named_token(config: &Map<String, Value>, key: &'static str) -> Result<String> {
    match config.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Object(o)) => o
            .get("content")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or(Error::InvalidConfig {
                field: key,
                value: Value::Object(o.clone()).to_string(),
                fix: "give the token's text",
            }),
        _ => Err(Error::InvalidConfig {
            field: key,
            value: "missing".into(),
            fix: "Gemma 3's tokenizer_config.json names boi_token, eoi_token and image_token (<start_of_image>, <end_of_image>, <image_soft_token>)",
        }),
    }
}

impl Gemma3Processor {
    /// `AutoProcessor.from_pretrained(dir)` for a Gemma 3 folder: `processor_config.json`
    /// (its `image_processor` and `image_seq_length`; or `preprocessor_config.json`), the
    /// tokenizer and its chat template.
    pub fn from_pretrained(dir: &Path) -> Result<Self> {
        let tokenizer = AutoTokenizer::from_pretrained(dir)?;
        let mut raw_config = Map::new();
        let (mut image, image_seq_length) = match dir.join(PROCESSOR_NAME) {
            p if p.is_file() => {
                let config: Map<String, Value> = crate::configuration_utils::read_config(&p)?;
                raw_config = config.clone();
                let image = match config.get("image_processor") {
                    Some(Value::Object(m)) => m.clone(),
                    _ => {
                        return Err(Error::InvalidConfig {
                            field: "image_processor",
                            value: format!("missing in {}", p.display()),
                            fix: "save the processor with its image processor (Gemma3Processor.save_pretrained)",
                        });
                    }
                };
                (image, config.get("image_seq_length").cloned())
            }
            _ => {
                let p = dir.join(crate::image_processing::IMAGE_PROCESSOR_NAME);
                let image: Map<String, Value> = crate::configuration_utils::read_config(&p)?;
                let length = image.get("image_seq_length").cloned();
                raw_config.insert("image_processor".into(), Value::Object(image.clone()));
                raw_config.insert(
                    "image_seq_length".into(),
                    length.clone().unwrap_or(Value::from(256)),
                );
                raw_config.insert("processor_class".into(), "Gemma3Processor".into());
                (image, length)
            }
        };
        let image_seq_length = match image_seq_length {
            None | Some(Value::Null) => 256,
            Some(v) => v.as_u64().ok_or_else(|| Error::InvalidConfig {
                field: "image_seq_length",
                value: v.to_string(),
                fix: "give the number of image tokens per image",
            })? as usize,
        };
        // Pan-and-scan's keys: read when it is on, which is refused.
        if image
            .get("do_pan_and_scan")
            .is_some_and(|v| v == &Value::Bool(true))
        {
            return Err(Error::InvalidConfig {
                field: "do_pan_and_scan",
                value: "true".into(),
                fix: "Gemma 3's pan-and-scan crops are not implemented here; set it to false",
            });
        }
        for key in [
            "do_pan_and_scan",
            "pan_and_scan_min_crop_size",
            "pan_and_scan_max_num_crops",
            "pan_and_scan_min_ratio_to_activate",
            "image_seq_length",
        ] {
            image.remove(key);
        }
        let mut config: ImageProcessorConfig = serde_json::from_value(Value::Object(image))
            .map_err(|e| Error::InvalidConfig {
                field: "image_processor",
                value: e.to_string(),
                fix: "give Gemma3ImageProcessor's fields",
            })?;
        // Gemma3Processor's `images_kwargs`: `do_convert_rgb` True where the file has null.
        config.do_convert_rgb.get_or_insert(true);
        let image_processor = ImageProcessor::new(config)?;
        let boi_token = named_token(tokenizer.config(), "boi_token")?;
        let eoi_token = named_token(tokenizer.config(), "eoi_token")?;
        let image_token = named_token(tokenizer.config(), "image_token")?;
        let image_token_id = tokenizer
            .tokenizer()
            .token_to_id(&image_token)
            .ok_or_else(|| Error::InvalidConfig {
                field: "image_token",
                value: image_token.clone(),
                fix: "the image token must be in the tokenizer's vocabulary",
            })?;
        let full_image_sequence = format!(
            "\n\n{boi_token}{}{eoi_token}\n\n",
            image_token.repeat(image_seq_length)
        );
        Ok(Self {
            tokenizer,
            image_processor,
            image_seq_length,
            boi_token,
            full_image_sequence,
            image_token: (image_token, i64::from(image_token_id)),
            raw_config,
        })
    }

    /// `save_pretrained(dir)`: `processor_config.json` and the tokenizer's files (its chat
    /// template included).
    pub fn save_pretrained(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::Io {
            path: dir.to_path_buf(),
            source: e,
        })?;
        let text =
            serde_json::to_string_pretty(&Value::Object(self.raw_config.clone())).map_err(|e| {
                Error::InvalidConfig {
                    field: "processor_config.json",
                    value: e.to_string(),
                    fix: "report this: the configuration read does not serialise",
                }
            })?;
        let path = dir.join(PROCESSOR_NAME);
        std::fs::write(&path, text + "\n").map_err(|e| Error::Io { path, source: e })?;
        self.tokenizer.save_pretrained(dir)
    }

    /// The image token's id (`image_token_id`).
    pub fn image_token_id(&self) -> i64 {
        self.image_token.1
    }

    /// `processor(text=text, images=images, add_special_tokens=False, truncation=max_length
    /// is not None, max_length=max_length)` for one row: the `<start_of_image>`s expanded,
    /// tokenized (cut to `max_length`), `token_type_ids`, the images' `pixel_values`.
    /// Upstream's errors: a count of `<start_of_image>` other than the images', and image
    /// tokens cut by `max_length`.
    pub fn call(
        &self,
        text: &str,
        images: &[DecodedImage],
        max_length: Option<usize>,
    ) -> Result<ProcessedExample> {
        let in_text = text.matches(self.boi_token.as_str()).count();
        if in_text != images.len() {
            return Err(Error::InvalidInput {
                name: "images",
                detail: format!(
                    "The number of {} tokens in each prompt should be the same as the number of images passed. Found [{in_text}] {} tokens and [{}] images per sample. (upstream's message)",
                    self.boi_token,
                    self.boi_token,
                    images.len()
                ),
            });
        }
        let expanded = if images.is_empty() {
            text.to_string()
        } else {
            text.replace(self.boi_token.as_str(), &self.full_image_sequence)
        };
        let mut input_ids = self.tokenizer.encode(&expanded, false)?;
        if let Some(m) = max_length {
            input_ids.truncate(m);
        }
        let (image_token, image_id) = (&self.image_token.0, self.image_token.1);
        let in_ids = input_ids.iter().filter(|&&i| i == image_id).count();
        let in_expanded = expanded.matches(image_token.as_str()).count();
        if in_ids != in_expanded {
            return Err(Error::InvalidInput {
                name: "max_length",
                detail: format!(
                    "Mismatch in `image` token count between text and `input_ids`. Got ids=[{in_ids}] and text=[{in_expanded}]. Likely due to `truncation='max_length'`. Please disable truncation or increase `max_length`. (upstream's message)"
                ),
            });
        }
        let token_type_ids = input_ids
            .iter()
            .map(|&i| i64::from(i == image_id))
            .collect();
        let pixel_values = match images {
            [] => None,
            _ => Some(self.image_processor.preprocess_torchvision(images)?),
        };
        Ok(ProcessedExample {
            input_ids,
            token_type_ids,
            pixel_values,
        })
    }
}

//! `tchtrain-collators` — Every data collator of transformers 5.23 (data/data_collator.py) on tch.
//!
//! Owns the [`DataCollator`] trait (over the row type [`Feature`] of `tchtrain-datasets`,
//! re-exported here), the output [`Batch`], the
//! tokenizer facts the collators need ([`TokenizerInfo`], read from a Hugging Face
//! tokenizer folder with the `tokenizers` crate or given explicitly), and the collators:
//! [`default_data_collator`], [`DataCollatorWithPadding`],
//! [`DataCollatorForTokenClassification`], [`DataCollatorForMultipleChoice`],
//! [`DataCollatorForSeq2Seq`], [`DataCollatorForLanguageModeling`] (token and whole-word
//! masking, upstream's seeded generator reproduced by [`TorchGenerator`]) and
//! [`DataCollatorWithFlattening`].
//!
//! Mirrors upstream transformers/data/data_collator.py; names follow upstream so a transformers user finds each
//! concept where they expect it.
//!
//! ```no_run
//! use tchtrain_collators::{DataCollator, DataCollatorForLanguageModeling, Feature,
//!     LanguageModelingOptions, TokenizerInfo, read_tokenizer_config};
//! // (tchtrain_models::AutoTokenizer::from_pretrained("assets/minilm") does these three.)
//! let tokenizer = tokenizers::Tokenizer::from_file("assets/minilm/tokenizer.json").unwrap();
//! let config = read_tokenizer_config("assets/minilm".as_ref())?;
//! let info = TokenizerInfo::from_tokenizer_config(&tokenizer, &config);
//! let rows: Vec<Feature> = ["a first sentence", "and a second, longer one"]
//!     .iter()
//!     .map(|text| Feature::from_encoding(&tokenizer.encode(*text, true).unwrap(), true))
//!     .collect();
//! let options = LanguageModelingOptions { seed: Some(42), ..Default::default() };
//! let mut collator = DataCollatorForLanguageModeling::new(info, options)?;
//! let batch = collator.collate(&rows)?; // input_ids, token_type_ids, attention_mask, labels
//! # Ok::<(), tchtrain_collators::Error>(())
//! ```

mod batch;
mod data_collator;
mod default;
mod error;
mod flattening;
mod language_modeling;
mod multiple_choice;
mod padding;
mod seq2seq;
mod speech_seq2seq;
mod token_classification;
mod tokenizer_info;
mod torch_generator;
mod whole_word_mask;

pub use batch::Batch;
pub use data_collator::DataCollator;
pub use default::{DefaultDataCollator, default_data_collator};
pub use error::{Error, Result};
pub use flattening::DataCollatorWithFlattening;
pub use language_modeling::{DataCollatorForLanguageModeling, LanguageModelingOptions};
pub use multiple_choice::{DataCollatorForMultipleChoice, MultipleChoiceFeature};
pub use padding::{DataCollatorWithPadding, PaddingSide, PaddingStrategy};
pub use seq2seq::{
    DataCollatorForSeq2Seq, DecoderStart, mbart_shift_tokens_right, shift_tokens_right,
};
pub use speech_seq2seq::DataCollatorSpeechSeq2SeqWithPadding;
pub use tchtrain_datasets::{Column, Feature, Label};
pub use token_classification::DataCollatorForTokenClassification;
pub use tokenizer_info::{
    SPECIAL_TOKENS_ATTRIBUTES, TokenizerInfo, read_tokenizer_config, special_tokens_map,
};
pub use torch_generator::TorchGenerator;

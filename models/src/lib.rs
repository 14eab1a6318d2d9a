//! `tchtrain-models` — Load, run and save Hugging Face checkpoints (BERT, GPT-2, Llama) on tch.
//!
//! Owns the `PreTrainedModel` trait, safetensors loading and saving, `config.json`, hub resolution, and the BERT, GPT-2 and Llama architectures.
//!
//! Mirrors upstream transformers/modeling_utils.py and the BERT, GPT-2 and Llama model files; names follow upstream so a transformers user finds each
//! concept where they expect it.

mod error;

pub use error::{Error, Result};

//! `tchtrain-losses` — The LOSS_MAPPING of transformers 5.23 (loss/loss_utils.py) on tch.
//!
//! Owns `fixed_cross_entropy` and the causal-LM, masked-LM, sequence / token
//! classification and question-answering losses, normalised by `num_items_in_batch`,
//! plus the Trainer's `LabelSmoother` (trainer_pt_utils.py).
//!
//! Mirrors upstream transformers/loss/loss_utils.py; names follow upstream (PascalCase
//! functions in snake_case, with the upstream name as a doc alias) so a transformers
//! user finds each concept where they expect it. Every function checks shapes, dtypes
//! and label ranges before calling libtorch and returns a typed [`Error`].
//!
//! ```
//! use tch::{Kind, Tensor};
//! use tchtrain_losses::{LossType, for_causal_lm_loss, loss_mapping, loss_type_for_model_class};
//!
//! let key = loss_type_for_model_class("GPT2LMHeadModel").unwrap_or("ForCausalLM");
//! assert_eq!(loss_mapping(key)?, LossType::CausalLm);
//! let logits = Tensor::randn([2, 4, 10], (Kind::Float, tch::Device::Cpu));
//! let labels = Tensor::from_slice(&[1i64, 2, 3, -100, 4, 5, 6, 7]).reshape([2, 4]);
//! let num_items = Tensor::from(6i64); // label tokens in the accumulation window
//! let loss = for_causal_lm_loss(&logits, &labels, 10, Some(&num_items), -100, None)?;
//! assert_eq!(loss.size(), Vec::<i64>::new());
//! # Ok::<(), tchtrain_losses::Error>(())
//! ```

mod causal_lm;
mod cross_entropy;
mod error;
mod label_smoother;
mod loss_mapping;
mod masked_lm;
mod question_answering;
mod sequence_classification;
mod token_classification;
mod validate;

pub use causal_lm::for_causal_lm_loss;
pub use cross_entropy::{IGNORE_INDEX, fixed_cross_entropy};
pub use error::{Error, Result};
pub use label_smoother::LabelSmoother;
pub use loss_mapping::{LOSS_MAPPING_KEYS, LossType, loss_mapping, loss_type_for_model_class};
pub use masked_lm::for_masked_lm_loss;
pub use question_answering::for_question_answering_loss;
pub use sequence_classification::{ProblemType, for_sequence_classification_loss};
pub use token_classification::for_token_classification;

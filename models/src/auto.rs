//! Upstream's `AutoModelFor...` classes: pick the architecture from `config.json`'s
//! `model_type`, resolve the name through the hub logic, load the weights.

use std::path::Path;

use tch::Device;

use crate::bert::{
    BertBaseModel, BertForMaskedLM, BertForSequenceClassification, BertForTokenClassification,
};
use crate::configuration_utils::read_model_type;
use crate::gemma::{GemmaForCausalLM, GemmaForSequenceClassification};
use crate::gemma2::{Gemma2ForCausalLM, Gemma2ForSequenceClassification};
use crate::gemma3::{Gemma3ForCausalLM, Gemma3TextForSequenceClassification};
use crate::gpt2::{GPT2ForSequenceClassification, GPT2LMHeadModel};
use crate::hub::{HubOptions, resolve};
use crate::llama::{LlamaForCausalLM, LlamaForSequenceClassification};
use crate::loading::{CONFIG_NAME, LoadOptions};
use crate::mistral::{MistralForCausalLM, MistralForSequenceClassification};
use crate::modeling_utils::{Loaded, PreTrainedModel};
use crate::phi3::{Phi3ForCausalLM, Phi3ForSequenceClassification};
use crate::qwen2::{Qwen2ForCausalLM, Qwen2ForSequenceClassification};
use crate::qwen3::{Qwen3ForCausalLM, Qwen3ForSequenceClassification};
use crate::{Error, Result};

/// The head to put on the body, as upstream's Auto classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoTask {
    /// `AutoModel`: the base model.
    Base,
    /// `AutoModelForCausalLM`.
    CausalLm,
    /// `AutoModelForMaskedLM`.
    MaskedLm,
    /// `AutoModelForSequenceClassification` (`num_labels` overrides the config).
    SequenceClassification {
        /// Number of labels, when the checkpoint's config does not say.
        num_labels: Option<i64>,
    },
    /// `AutoModelForTokenClassification`.
    TokenClassification {
        /// Number of labels, when the checkpoint's config does not say.
        num_labels: Option<i64>,
    },
}

/// A loaded model behind the trait object the Trainer drives.
pub type AutoModel = Loaded<Box<dyn PreTrainedModel>>;

fn boxed<M: PreTrainedModel + 'static>(l: Loaded<M>) -> AutoModel {
    Loaded {
        model: Box::new(l.model),
        info: l.info,
    }
}

/// Loads `name_or_path` (folder, cache or download) with the head `task` asks for.
pub fn from_pretrained(
    name_or_path: &str,
    task: AutoTask,
    device: Device,
    hub: &HubOptions,
    options: &LoadOptions,
) -> Result<AutoModel> {
    let dir = resolve(name_or_path, hub)?;
    from_pretrained_dir(&dir, task, device, options)
}

/// [`from_pretrained`] on an already resolved folder.
pub fn from_pretrained_dir(
    dir: &Path,
    task: AutoTask,
    device: Device,
    options: &LoadOptions,
) -> Result<AutoModel> {
    let model_type = read_model_type(&dir.join(CONFIG_NAME))?;
    let unsupported = || Error::UnsupportedArchitecture {
        name: format!("{model_type} for {task:?}"),
        supported: "gpt2 (causal LM, sequence classification), bert (base, masked LM, sequence / token classification), llama, qwen2, qwen3, mistral, gemma, gemma2, gemma3_text, phi3 (causal LM, sequence classification)",
    };
    Ok(match (model_type.as_str(), task) {
        ("gpt2", AutoTask::CausalLm) => {
            boxed(GPT2LMHeadModel::from_pretrained_dir(dir, device, options)?)
        }
        ("gpt2", AutoTask::SequenceClassification { num_labels }) => boxed(
            GPT2ForSequenceClassification::from_pretrained_dir(dir, num_labels, device, options)?,
        ),
        ("bert", AutoTask::Base) => boxed(BertBaseModel::from_pretrained_dir(
            dir, None, device, options,
        )?),
        ("bert", AutoTask::MaskedLm) => boxed(BertForMaskedLM::from_pretrained_dir(
            dir, None, device, options,
        )?),
        ("bert", AutoTask::SequenceClassification { num_labels }) => boxed(
            BertForSequenceClassification::from_pretrained_dir(dir, num_labels, device, options)?,
        ),
        ("bert", AutoTask::TokenClassification { num_labels }) => boxed(
            BertForTokenClassification::from_pretrained_dir(dir, num_labels, device, options)?,
        ),
        ("llama", AutoTask::CausalLm) => {
            boxed(LlamaForCausalLM::from_pretrained_dir(dir, device, options)?)
        }
        ("qwen2", AutoTask::CausalLm) => {
            boxed(Qwen2ForCausalLM::from_pretrained_dir(dir, device, options)?)
        }
        ("qwen3", AutoTask::CausalLm) => {
            boxed(Qwen3ForCausalLM::from_pretrained_dir(dir, device, options)?)
        }
        ("mistral", AutoTask::CausalLm) => boxed(MistralForCausalLM::from_pretrained_dir(
            dir, device, options,
        )?),
        ("llama", AutoTask::SequenceClassification { num_labels }) => boxed(
            LlamaForSequenceClassification::from_pretrained_dir(dir, num_labels, device, options)?,
        ),
        ("qwen2", AutoTask::SequenceClassification { num_labels }) => boxed(
            Qwen2ForSequenceClassification::from_pretrained_dir(dir, num_labels, device, options)?,
        ),
        ("qwen3", AutoTask::SequenceClassification { num_labels }) => boxed(
            Qwen3ForSequenceClassification::from_pretrained_dir(dir, num_labels, device, options)?,
        ),
        ("mistral", AutoTask::SequenceClassification { num_labels }) => {
            boxed(MistralForSequenceClassification::from_pretrained_dir(
                dir, num_labels, device, options,
            )?)
        }
        ("gemma", AutoTask::CausalLm) => {
            boxed(GemmaForCausalLM::from_pretrained_dir(dir, device, options)?)
        }
        ("gemma2", AutoTask::CausalLm) => boxed(Gemma2ForCausalLM::from_pretrained_dir(
            dir, device, options,
        )?),
        ("gemma3_text", AutoTask::CausalLm) => boxed(Gemma3ForCausalLM::from_pretrained_dir(
            dir, device, options,
        )?),
        ("gemma", AutoTask::SequenceClassification { num_labels }) => boxed(
            GemmaForSequenceClassification::from_pretrained_dir(dir, num_labels, device, options)?,
        ),
        ("gemma2", AutoTask::SequenceClassification { num_labels }) => boxed(
            Gemma2ForSequenceClassification::from_pretrained_dir(dir, num_labels, device, options)?,
        ),
        ("gemma3_text", AutoTask::SequenceClassification { num_labels }) => {
            boxed(Gemma3TextForSequenceClassification::from_pretrained_dir(
                dir, num_labels, device, options,
            )?)
        }
        ("phi3", AutoTask::CausalLm) => {
            boxed(Phi3ForCausalLM::from_pretrained_dir(dir, device, options)?)
        }
        ("phi3", AutoTask::SequenceClassification { num_labels }) => boxed(
            Phi3ForSequenceClassification::from_pretrained_dir(dir, num_labels, device, options)?,
        ),
        _ => return Err(unsupported()),
    })
}

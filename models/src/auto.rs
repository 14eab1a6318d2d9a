//! Upstream's `AutoModelFor...` classes: pick the architecture from `config.json`'s
//! `model_type`, resolve the name through the hub logic, load the weights.

use std::path::Path;

use tch::Device;

use crate::bart::BartForConditionalGeneration;
use crate::bert::BertConfig;
use crate::configuration_utils::read_model_type;
use crate::deberta_v2::DebertaV2Config;
use crate::distilbert::DistilBertConfig;
use crate::encoder::{EncoderArchitecture, EncoderFor};
use crate::gemma::GemmaConfig;
use crate::gemma2::Gemma2Config;
use crate::gemma3::{Gemma3Config, Gemma3TextConfig};
use crate::gemma4::{Gemma4Config, Gemma4TextConfig};
use crate::gpt_oss::GptOssConfig;
use crate::gpt2::{GPT2ForQuestionAnswering, GPT2ForSequenceClassification, GPT2LMHeadModel};
use crate::granite::GraniteConfig;
use crate::heads;
use crate::hub::{HubOptions, resolve};
use crate::llama::{
    DecoderConfig, DecoderForCausalLM, DecoderForQuestionAnswering,
    DecoderForSequenceClassification, DecoderForTokenClassification, LlamaConfig,
};
use crate::loading::{CONFIG_NAME, LoadOptions};
use crate::mistral::MistralConfig;
use crate::mixtral::MixtralConfig;
use crate::modeling_utils::{Loaded, PreTrainedModel};
use crate::modernbert::ModernBertConfig;
use crate::olmo2::Olmo2Config;
use crate::olmo3::Olmo3Config;
use crate::olmoe::OlmoeConfig;
use crate::phi3::Phi3Config;
use crate::qwen2::Qwen2Config;
use crate::qwen2_moe::Qwen2MoeConfig;
use crate::qwen3::Qwen3Config;
use crate::qwen3_5::Qwen3_5TextConfig;
use crate::qwen3_5_moe::Qwen3_5MoeTextConfig;
use crate::qwen3_moe::Qwen3MoeConfig;
use crate::roberta::{RobertaConfig, XLMRobertaConfig};
use crate::smollm3::SmolLM3Config;
use crate::t5::T5ForConditionalGeneration;
use crate::whisper::WhisperForConditionalGeneration;
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
    /// `AutoModelForQuestionAnswering` (extractive: start and end logits per token).
    QuestionAnswering,
    /// `AutoModelForImageClassification` (`num_labels` overrides the config).
    ImageClassification {
        /// Number of labels, when the checkpoint's config does not say.
        num_labels: Option<i64>,
    },
    /// `AutoModelForSeq2SeqLM` (encoder-decoder with a language-modeling head).
    Seq2SeqLm,
    /// `AutoModelForSpeechSeq2Seq` (a speech encoder and a text decoder: Whisper).
    SpeechSeq2Seq,
}

/// What the Auto classes load, for the error on anything else.
const SUPPORTED: &str = "gpt2 (causal LM, sequence classification, question answering), bert, roberta, xlm-roberta, distilbert, deberta-v2, modernbert (base, masked LM, sequence / token classification, question answering), vit (base, image classification), siglip (image classification), llama, qwen2, qwen3, mistral (causal LM, sequence / token classification, question answering), gemma, gemma2, phi3 (causal LM, sequence / token classification), gemma3_text (causal LM, sequence classification), gemma3 (Gemma3ForConditionalGeneration's text path: causal LM), gemma4_text (causal LM), gemma4 (Gemma4ForConditionalGeneration's text path: causal LM), qwen2_moe, qwen3_moe, mixtral (causal LM, sequence / token classification, question answering), olmo2, olmo3 (causal LM, sequence classification), gpt_oss (causal LM, sequence / token classification), olmoe, granite (causal LM), qwen3_5_text (causal LM, sequence classification), qwen3_5 (its language model: causal LM), qwen3_5_moe_text, qwen3_5_moe (causal LM), smollm3 (causal LM, sequence / token classification, question answering), t5, bart, mbart (seq2seq LM), whisper (speech seq2seq)";

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

/// [`from_pretrained`] on an already resolved folder. A folder holding a LoRA adapter
/// (`adapter_config.json`, no `config.json`) loads its `base_model_name_or_path` with the
/// adapter on it, frozen and in evaluation mode (transformers' PEFT integration: an
/// adapter folder given to `from_pretrained`).
pub fn from_pretrained_dir(
    dir: &Path,
    task: AutoTask,
    device: Device,
    options: &LoadOptions,
) -> Result<AutoModel> {
    let adapter_config = dir.join(crate::ADAPTER_CONFIG_NAME);
    if adapter_config.is_file() && !dir.join(CONFIG_NAME).is_file() {
        let config = crate::LoraConfig::from_file(&adapter_config)?;
        let Some(base) = config.base_model_name_or_path.as_deref() else {
            return Err(Error::InvalidArgument {
                field: "base_model_name_or_path",
                detail: format!(
                    "{} names no base model: load the base model and use PeftModel::from_pretrained(base, adapter folder)",
                    adapter_config.display()
                ),
            });
        };
        let base_dir = resolve(base, &HubOptions::from_env())?;
        if !base_dir.join(CONFIG_NAME).is_file() {
            return Err(Error::InvalidArgument {
                field: "base_model_name_or_path",
                detail: format!(
                    "{}: {base} is itself an adapter folder; name the base model the adapter was trained on",
                    adapter_config.display()
                ),
            });
        }
        let base = from_pretrained_dir(&base_dir, task, device, options)?;
        let model = crate::PeftModel::from_pretrained(base.model, dir, false)?;
        return Ok(Loaded {
            model: Box::new(model),
            info: base.info,
        });
    }
    let model_type = read_model_type(&dir.join(CONFIG_NAME))?;
    let unsupported = || Error::UnsupportedArchitecture {
        name: format!("{model_type} for {task:?}"),
        supported: SUPPORTED,
    };
    Ok(match (model_type.as_str(), task) {
        ("gpt2", AutoTask::CausalLm) => {
            boxed(GPT2LMHeadModel::from_pretrained_dir(dir, device, options)?)
        }
        ("gpt2", AutoTask::SequenceClassification { num_labels }) => boxed(
            GPT2ForSequenceClassification::from_pretrained_dir(dir, num_labels, device, options)?,
        ),
        ("gpt2", AutoTask::QuestionAnswering) => boxed(
            GPT2ForQuestionAnswering::from_pretrained_dir(dir, device, options)?,
        ),
        ("bert", task) => encoder::<BertConfig>(dir, task, device, options)?,
        ("roberta", task) => encoder::<RobertaConfig>(dir, task, device, options)?,
        ("xlm-roberta", task) => encoder::<XLMRobertaConfig>(dir, task, device, options)?,
        ("deberta-v2", task) => encoder::<DebertaV2Config>(dir, task, device, options)?,
        ("distilbert", task) => encoder::<DistilBertConfig>(dir, task, device, options)?,
        ("modernbert", task) => encoder::<ModernBertConfig>(dir, task, device, options)?,
        ("vit", AutoTask::Base) => boxed(crate::vit::ViTBaseModel::from_pretrained_dir(
            dir, None, device, options,
        )?),
        ("siglip", AutoTask::ImageClassification { num_labels }) => boxed(
            crate::siglip::SiglipForImageClassification::from_pretrained_dir(
                dir, num_labels, device, options,
            )?,
        ),
        ("vit", AutoTask::ImageClassification { num_labels }) => {
            boxed(crate::vit::ViTForImageClassification::from_pretrained_dir(
                dir, num_labels, device, options,
            )?)
        }
        ("llama", task) => decoder::<LlamaConfig>(dir, task, device, options)?,
        ("qwen2", task) => decoder::<Qwen2Config>(dir, task, device, options)?,
        ("qwen3", task) => decoder::<Qwen3Config>(dir, task, device, options)?,
        ("mistral", task) => decoder::<MistralConfig>(dir, task, device, options)?,
        ("gemma", task) => decoder::<GemmaConfig>(dir, task, device, options)?,
        ("gemma2", task) => decoder::<Gemma2Config>(dir, task, device, options)?,
        ("gemma3_text", task) => decoder::<Gemma3TextConfig>(dir, task, device, options)?,
        ("gemma3", AutoTask::CausalLm) => {
            decoder::<Gemma3Config>(dir, AutoTask::CausalLm, device, options)?
        }
        ("gemma4_text", AutoTask::CausalLm) => {
            decoder::<Gemma4TextConfig>(dir, AutoTask::CausalLm, device, options)?
        }
        ("gemma4", AutoTask::CausalLm) => {
            decoder::<Gemma4Config>(dir, AutoTask::CausalLm, device, options)?
        }
        ("phi3", task) => decoder::<Phi3Config>(dir, task, device, options)?,
        ("qwen2_moe", task) => decoder::<Qwen2MoeConfig>(dir, task, device, options)?,
        ("qwen3_moe", task) => decoder::<Qwen3MoeConfig>(dir, task, device, options)?,
        ("mixtral", task) => decoder::<MixtralConfig>(dir, task, device, options)?,
        ("qwen3_5_text", AutoTask::CausalLm | AutoTask::SequenceClassification { .. }) => {
            decoder::<Qwen3_5TextConfig>(dir, task, device, options)?
        }
        // A multimodal checkpoint's language model, as upstream's `AutoModelForCausalLM`
        // ("VLM compatibility"): its text config, the vision tower left out.
        ("qwen3_5", AutoTask::CausalLm) => {
            decoder::<Qwen3_5TextConfig>(dir, AutoTask::CausalLm, device, options)?
        }
        ("qwen3_5_moe_text" | "qwen3_5_moe", AutoTask::CausalLm) => {
            decoder::<Qwen3_5MoeTextConfig>(dir, AutoTask::CausalLm, device, options)?
        }
        ("olmo2", AutoTask::CausalLm | AutoTask::SequenceClassification { .. }) => {
            decoder::<Olmo2Config>(dir, task, device, options)?
        }
        ("olmo3", AutoTask::CausalLm | AutoTask::SequenceClassification { .. }) => {
            decoder::<Olmo3Config>(dir, task, device, options)?
        }
        (
            "gpt_oss",
            AutoTask::CausalLm
            | AutoTask::SequenceClassification { .. }
            | AutoTask::TokenClassification { .. },
        ) => decoder::<GptOssConfig>(dir, task, device, options)?,
        ("smollm3", task) => decoder::<SmolLM3Config>(dir, task, device, options)?,
        ("granite", AutoTask::CausalLm) => {
            decoder::<GraniteConfig>(dir, AutoTask::CausalLm, device, options)?
        }
        ("olmoe", AutoTask::CausalLm) => {
            decoder::<OlmoeConfig>(dir, AutoTask::CausalLm, device, options)?
        }
        ("bart" | "mbart", AutoTask::Seq2SeqLm) => boxed(
            BartForConditionalGeneration::from_pretrained_dir(dir, device, options)?,
        ),
        ("t5", AutoTask::Seq2SeqLm) => boxed(T5ForConditionalGeneration::from_pretrained_dir(
            dir, device, options,
        )?),
        ("whisper", AutoTask::SpeechSeq2Seq) => boxed(
            WhisperForConditionalGeneration::from_pretrained_dir(dir, device, options)?,
        ),
        _ => return Err(unsupported()),
    })
}

/// An encoder family's head for `task` (base, masked LM, sequence or token
/// classification, question answering).
fn encoder<C: EncoderArchitecture>(
    dir: &Path,
    task: AutoTask,
    device: Device,
    options: &LoadOptions,
) -> Result<AutoModel> {
    Ok(match task {
        AutoTask::Base => boxed(EncoderFor::<C, heads::Base>::from_pretrained_dir(
            dir, None, device, options,
        )?),
        AutoTask::MaskedLm => boxed(EncoderFor::<C, heads::MaskedLm>::from_pretrained_dir(
            dir, None, device, options,
        )?),
        AutoTask::SequenceClassification { num_labels } => boxed(EncoderFor::<
            C,
            heads::SequenceClassification,
        >::from_pretrained_dir(
            dir, num_labels, device, options,
        )?),
        AutoTask::TokenClassification { num_labels } => boxed(EncoderFor::<
            C,
            heads::TokenClassification,
        >::from_pretrained_dir(
            dir, num_labels, device, options
        )?),
        AutoTask::QuestionAnswering => boxed(
            EncoderFor::<C, heads::QuestionAnswering>::from_pretrained_dir(
                dir, None, device, options,
            )?,
        ),
        AutoTask::CausalLm
        | AutoTask::Seq2SeqLm
        | AutoTask::SpeechSeq2Seq
        | AutoTask::ImageClassification { .. } => {
            return Err(Error::UnsupportedArchitecture {
                name: format!("{} for {task:?}", read_model_type(&dir.join(CONFIG_NAME))?),
                supported: SUPPORTED,
            });
        }
    })
}

/// A Llama-shaped family's head for `task` (causal LM, sequence or token classification).
fn decoder<C: DecoderConfig>(
    dir: &Path,
    task: AutoTask,
    device: Device,
    options: &LoadOptions,
) -> Result<AutoModel> {
    Ok(match task {
        AutoTask::CausalLm => boxed(DecoderForCausalLM::<C>::from_pretrained_dir(
            dir, device, options,
        )?),
        AutoTask::SequenceClassification { num_labels } => {
            boxed(DecoderForSequenceClassification::<C>::from_pretrained_dir(
                dir, num_labels, device, options,
            )?)
        }
        AutoTask::TokenClassification { num_labels } => {
            boxed(DecoderForTokenClassification::<C>::from_pretrained_dir(
                dir, num_labels, device, options,
            )?)
        }
        AutoTask::QuestionAnswering => boxed(
            DecoderForQuestionAnswering::<C>::from_pretrained_dir(dir, device, options)?,
        ),
        AutoTask::Base
        | AutoTask::MaskedLm
        | AutoTask::Seq2SeqLm
        | AutoTask::SpeechSeq2Seq
        | AutoTask::ImageClassification { .. } => {
            return Err(Error::UnsupportedArchitecture {
                name: format!("{} for {task:?}", read_model_type(&dir.join(CONFIG_NAME))?),
                supported: SUPPORTED,
            });
        }
    })
}

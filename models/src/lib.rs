//! `tchtrain-models` — load, run and save Hugging Face checkpoints (BERT, GPT-2, Llama) on tch.
//!
//! Owns the [`TrainableModel`] trait the Trainer drives (the facts upstream keeps on a model
//! as its methods) and [`PreTrainedModel`] (a config and `save_pretrained` on top), safetensors loading (sharded
//! index, tied weights, base-model prefix mapping, upstream's loading report) and
//! `save_pretrained`, `config.json`, hub resolution, tokenizers, and the GPT-2, BERT and
//! Llama architectures with upstream's parameter names. Every model reports its modules'
//! forwards to upstream's `DebugUnderflowOverflow` tracer (debug_utils.py) under upstream's
//! module names.
//!
//! Mirrors upstream transformers/modeling_utils.py and the model files; names follow
//! upstream (`GPT2LMHeadModel`, `BertForSequenceClassification`, ...) so a transformers
//! user finds each concept where they expect it.

mod attention;
pub mod audio_utils;
mod auto;
mod auto_tokenizer;
mod bart;
mod bert;
mod bitsandbytes;
mod cache_utils;
mod chat_template;
mod checkpoint;
mod configuration_utils;
mod conversion_mapping;
mod deberta_v2;
mod distilbert;
mod encoder;
mod error;
mod feature_extraction_whisper;
mod gemma;
mod gemma2;
mod gemma3;
mod gemma4;
mod generation;
mod generation_whisper;
mod gpt2;
mod gpt_oss;
mod granite;
mod heads;
mod hub;
mod image_processing;
mod liger;
mod llama;
mod loading;
mod mistral;
mod mixtral;
mod modeling_utils;
mod modernbert;
mod multilingual;
mod olmo2;
mod olmo3;
mod olmoe;
mod padding_free;
mod peft;
mod phi3;
pub mod pil_resize;
mod processing_gemma3;
mod qwen2;
mod qwen2_moe;
mod qwen3;
mod qwen3_5;
mod qwen3_5_moe;
mod qwen3_moe;
mod roberta;
mod rope;
mod siglip;
mod smollm3;
mod t5;
mod tokenization;
mod tokenization_whisper;
pub mod transforms;
mod vit;
mod whisper;

pub use auto::{AutoModel, AutoTask, from_pretrained, from_pretrained_dir};
pub use auto_tokenizer::{
    AutoTokenizer, PreTrainedTokenizerFast, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, tokenizer_class,
};
pub use bart::{BartConfig, BartForConditionalGeneration, MBartForConditionalGeneration};
pub use bert::{
    Bert, BertBaseModel, BertConfig, BertForMaskedLM, BertForQuestionAnswering,
    BertForSequenceClassification, BertForTokenClassification, BertModel, EncoderConfig,
    EncoderFamily,
};
pub use bitsandbytes::{BitsAndBytesConfig, is_quantized, quantize_model, quantized_modules};
pub use cache_utils::DynamicCache;
pub use chat_template::{
    ADDITIONAL_CHAT_TEMPLATES_DIR, CHAT_TEMPLATE_FILE, ChatTemplate, ChatTemplateOptions,
    has_generation_markers, render_jinja_template, render_jinja_template_with_generation_indices,
};
pub use checkpoint::ActivationCheckpointing;
pub use configuration_utils::{
    LabelConfig, PretrainedConfig, TRANSFORMERS_VERSION, read_model_type,
};
pub use conversion_mapping::WeightConversion;
pub use deberta_v2::{
    DebertaV2, DebertaV2BaseModel, DebertaV2Config, DebertaV2ForMaskedLM,
    DebertaV2ForQuestionAnswering, DebertaV2ForSequenceClassification,
    DebertaV2ForTokenClassification, DebertaV2Model,
};
pub use distilbert::{
    DistilBert, DistilBertBaseModel, DistilBertConfig, DistilBertForMaskedLM,
    DistilBertForQuestionAnswering, DistilBertForSequenceClassification,
    DistilBertForTokenClassification, DistilBertModel,
};
pub use encoder::{EncoderArchitecture, EncoderFor};
pub use error::{Error, Result};
pub use feature_extraction_whisper::{WhisperFeatureExtractor, WhisperFeatureExtractorConfig};
pub use gemma::{
    GemmaConfig, GemmaForCausalLM, GemmaForSequenceClassification, GemmaForTokenClassification,
};
pub use gemma2::{
    Gemma2Config, Gemma2ForCausalLM, Gemma2ForSequenceClassification, Gemma2ForTokenClassification,
};
pub use gemma3::{
    Gemma3Config, Gemma3ForCausalLM, Gemma3ForConditionalGeneration, Gemma3TextConfig,
    Gemma3TextForSequenceClassification, Gemma3Vision,
};
pub use gemma4::{
    Gemma4Config, Gemma4ForCausalLM, Gemma4ForConditionalGeneration, Gemma4TextConfig,
};
pub use generation::{
    EarlyStopping, GENERATION_CONFIG_NAME, GenerateOutput, GenerationConfig, LogitsProcessor,
    generate, logits_processors,
};
pub use generation_whisper::whisper_generate;
pub use gpt_oss::{
    GptOssConfig, GptOssForCausalLM, GptOssForSequenceClassification, GptOssForTokenClassification,
};
pub use gpt2::{
    GPT2Config, GPT2ForQuestionAnswering, GPT2ForSequenceClassification, GPT2LMHeadModel, GPT2Model,
};
pub use granite::{GraniteConfig, GraniteForCausalLM};
pub use heads::{
    Base, HeadKind, MaskedLm, QuestionAnswering, SequenceClassification, TaskHead,
    TokenClassification,
};
pub use hub::{HubOptions, OPTIONAL_FILES, cached_snapshot, resolve};
pub use image_processing::{IMAGE_PROCESSOR_NAME, ImageProcessor, ImageProcessorConfig, SizeDict};
pub use liger::{LigerKernelConfig, fused_linear_cross_entropy, liger_for_causal_lm_loss};
pub use llama::{
    DecoderConfig, DecoderForCausalLM, DecoderForQuestionAnswering,
    DecoderForSequenceClassification, DecoderForTokenClassification, Family, Gemma, Gemma4, GptOss,
    Granite, ImageEncoder, KvSharing, LlamaConfig, LlamaForCausalLM, LlamaForQuestionAnswering,
    LlamaForSequenceClassification, LlamaForTokenClassification, LlamaModel, Moe, Phi3, QkNorm,
    QuestionAnsweringClass,
};
pub use loading::{
    CONFIG_NAME, LoadDtype, LoadOptions, LoadingInfo, SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME,
    checkpoint_files, load_into, read_checkpoint, save_pretrained, save_pretrained_state_dict,
    save_state_dict, write_safetensors,
};
pub use mistral::{
    MistralConfig, MistralForCausalLM, MistralForQuestionAnswering,
    MistralForSequenceClassification, MistralForTokenClassification,
};
pub use mixtral::{
    MixtralConfig, MixtralForCausalLM, MixtralForQuestionAnswering,
    MixtralForSequenceClassification, MixtralForTokenClassification,
};
pub use modeling_utils::{
    LabelCheck, LinearModule, Loaded, ModelInputs, ModelOutput, OutputHead, PADDING_FREE_ENV,
    PreTrainedModel, TrainableModel, ordered_variable_names,
};
pub use modernbert::{
    ModernBert, ModernBertBaseModel, ModernBertConfig, ModernBertForMaskedLM,
    ModernBertForQuestionAnswering, ModernBertForSequenceClassification,
    ModernBertForTokenClassification, ModernBertModel,
};
pub use multilingual::LanguageCodes;
pub use olmo2::{Olmo2Config, Olmo2ForCausalLM, Olmo2ForSequenceClassification};
pub use olmo3::{Olmo3Config, Olmo3ForCausalLM, Olmo3ForSequenceClassification};
pub use olmoe::{OlmoeConfig, OlmoeForCausalLM};
pub use padding_free::EncoderHead;
pub use peft::{
    ADAPTER_CONFIG_NAME, ADAPTER_SAFE_WEIGHTS_NAME, InitLoraWeights, LayerIndices, LoraBias,
    LoraConfig, LoraLayer, PEFT_VERSION, ParameterTarget, PeftModel, TargetModules, get_peft_model,
    prepare_model_for_kbit_training,
};
pub use phi3::{
    Phi3Config, Phi3ForCausalLM, Phi3ForSequenceClassification, Phi3ForTokenClassification,
};
pub use processing_gemma3::{Gemma3Processor, PROCESSOR_NAME, ProcessedExample};
pub use qwen2::{
    Qwen2Config, Qwen2ForCausalLM, Qwen2ForQuestionAnswering, Qwen2ForSequenceClassification,
    Qwen2ForTokenClassification,
};
pub use qwen2_moe::{
    Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen2MoeForQuestionAnswering,
    Qwen2MoeForSequenceClassification, Qwen2MoeForTokenClassification,
};
pub use qwen3::{
    Qwen3Config, Qwen3ForCausalLM, Qwen3ForQuestionAnswering, Qwen3ForSequenceClassification,
    Qwen3ForTokenClassification,
};
pub use qwen3_5::{Qwen3_5ForCausalLM, Qwen3_5TextConfig, Qwen3_5TextForSequenceClassification};
pub use qwen3_5_moe::{Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig};
pub use qwen3_moe::{
    Qwen3MoeConfig, Qwen3MoeForCausalLM, Qwen3MoeForQuestionAnswering,
    Qwen3MoeForSequenceClassification, Qwen3MoeForTokenClassification,
};
pub use roberta::{
    RobertaConfig, RobertaForMaskedLM, RobertaForQuestionAnswering,
    RobertaForSequenceClassification, RobertaForTokenClassification, RobertaModel,
    XLMRobertaConfig, XLMRobertaForMaskedLM, XLMRobertaForQuestionAnswering,
    XLMRobertaForSequenceClassification, XLMRobertaForTokenClassification, XLMRobertaModel,
};
pub use siglip::{
    Siglip, SiglipConfig, SiglipForImageClassification, SiglipVisionConfig, SiglipVisionTransformer,
};
pub use smollm3::{
    SmolLM3Config, SmolLM3ForCausalLM, SmolLM3ForQuestionAnswering,
    SmolLM3ForSequenceClassification, SmolLM3ForTokenClassification,
};
pub use t5::{T5Config, T5ForConditionalGeneration};
/// bitsandbytes' functional parts (`bitsandbytes.functional`), from `tchtrain-nn`.
pub use tchtrain_nn::bitsandbytes::{
    NestedState, QuantState, QuantType, create_dynamic_map, dequantize_blockwise,
    int8_linear_matmul, int8_mm_dequant, int8_vectorwise_dequant, int8_vectorwise_quant,
    quantize_4bit, quantize_blockwise,
};
pub use tchtrain_nn::{
    Context, DebugUnderflowOverflow, LayerHooks, Linear4bit, Linear8bitLt, NeftuneGuard,
    QuantizedWeight, dropout, dropout_fast_path,
};
pub use tokenizers::Tokenizer;
pub use vit::{Size2, ViT, ViTBaseModel, ViTConfig, ViTForImageClassification, ViTModel};
pub use whisper::{WhisperConfig, WhisperForConditionalGeneration, sinusoids};

/// Checks `input_ids`: int64 `[batch, seq]`, ids in `0..vocab`, `seq <= max_positions`.
pub(crate) fn check_ids(ids: &tch::Tensor, vocab: i64, max_positions: i64) -> Result<(i64, i64)> {
    let size = ids.size();
    if size.len() != 2 {
        return Err(Error::InvalidInput {
            name: "input_ids",
            detail: format!("expected [batch, seq], got shape {size:?}"),
        });
    }
    if ids.kind() != tch::Kind::Int64 {
        return Err(Error::InvalidInput {
            name: "input_ids",
            detail: format!("expected int64 token ids, got {:?}", ids.kind()),
        });
    }
    if size[0] == 0 || size[1] == 0 {
        return Err(Error::InvalidInput {
            name: "input_ids",
            detail: "empty batch".into(),
        });
    }
    if size[1] > max_positions {
        return Err(Error::InvalidInput {
            name: "input_ids",
            detail: format!(
                "sequence length {} exceeds max_position_embeddings {max_positions}",
                size[1]
            ),
        });
    }
    // One read of both ends (a single device synchronisation when the ids are on a GPU).
    let ends = tch::Tensor::stack(&[ids.min(), ids.max()], 0).to_device(tch::Device::Cpu);
    let (min, max) = (ends.int64_value(&[0]), ends.int64_value(&[1]));
    if min < 0 || max >= vocab {
        return Err(Error::InvalidInput {
            name: "input_ids",
            detail: format!("token ids must be in 0..{vocab}, got range {min}..={max}"),
        });
    }
    Ok((size[0], size[1]))
}

//! `PreTrainedModel::module_repr` against upstream's `print(model)`
//! (`scripts/reference/module_reprs.py`): each tiny model loaded from the folder the
//! reference saved, its text equal to upstream's byte for byte; the peft cases load their
//! adapters (a second one from `adapter/second/`) over the base.

use anyhow::{Context, Result};
use tch::Device;
use tchtrain_models::{AutoTask, LoadOptions, PeftModel, PreTrainedModel, from_pretrained_dir};
use tchtrain_testing::{lock, reference_dir};

/// The reference's cases, in its order.
const CASES: [&str; 61] = [
    "gpt2_lm",
    "gpt2_cls",
    "llama",
    "llama_bias_cls",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen3_cls",
    "gemma",
    "gemma2_cls",
    "gemma3_text",
    "phi3",
    "phi3_cls",
    "t5",
    "flan_t5",
    "bart",
    "mbart",
    "distilbert_cls",
    "distilbert_mlm",
    "distilbert_qa",
    "distilbert_ner",
    "granite",
    "smollm3",
    "olmo2",
    "olmo3",
    "gpt_oss",
    "qwen3_5_text",
    "gemma4_text",
    "gemma4_text_moe",
    "qwen3_5_moe_text",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "olmoe",
    "modernbert_cls",
    "modernbert_mlm",
    "modernbert_ner",
    "deberta_v3_cls",
    "deberta_v3_mlm",
    "deberta_v3_ner",
    "deberta_v2_cls",
    "deberta_v2_c2p_ner",
    "deberta_v3_new_head_mlm",
    "vit_img",
    "vit_base",
    "siglip_img",
    "gemma3_vlm",
    "whisper",
    "bert_base",
    "bert_cls",
    "bert_mlm",
    "bert_ner",
    "bert_qa",
    "roberta_mlm",
    "roberta_cls",
    "xlm_roberta_ner",
    "xlm_roberta_cls",
    "peft_llama",
    "peft_bert_cls_dora",
    "peft_roberta_cls",
    "peft_gpt2",
];

/// The head a case's model has, from its name (an `img`, `cls`, `ner`, `mlm`, `qa` or `base` part,
/// the sequence-to-sequence families; a causal LM otherwise).
fn task(case: &str) -> AutoTask {
    let parts: Vec<&str> = case.split('_').collect();
    let has = |p: &str| parts.contains(&p);
    if has("img") {
        AutoTask::ImageClassification { num_labels: None }
    } else if has("cls") {
        AutoTask::SequenceClassification { num_labels: None }
    } else if has("ner") {
        AutoTask::TokenClassification { num_labels: None }
    } else if has("mlm") {
        AutoTask::MaskedLm
    } else if has("qa") {
        AutoTask::QuestionAnswering
    } else if has("base") {
        AutoTask::Base
    } else if matches!(case, "t5" | "flan_t5" | "bart" | "mbart") {
        AutoTask::Seq2SeqLm
    } else if case == "whisper" {
        AutoTask::SpeechSeq2Seq
    } else {
        AutoTask::CausalLm
    }
}

#[test]
fn module_repr_equals_upstreams_print() -> Result<()> {
    // Building each model draws its initial weights from the global generator.
    let _g = lock();
    let dir = reference_dir("module_reprs");
    for case in CASES {
        let folder = dir.join(case);
        let base = from_pretrained_dir(&folder, task(case), Device::Cpu, &LoadOptions::default())
            .with_context(|| case.to_string())?
            .model;
        let adapters = folder.join("adapter");
        let ours = match adapters.exists() {
            false => base.module_repr(),
            true => {
                let mut model = PeftModel::from_pretrained(base, &adapters, false)?;
                if adapters.join("second").exists() {
                    model.load_adapter(&adapters.join("second"), "second", false)?;
                }
                model.module_repr()
            }
        }
        .with_context(|| format!("{case}: no module_repr"))?
        .to_string();
        let theirs = std::fs::read_to_string(folder.join("repr.txt"))?;
        assert_eq!(ours, theirs, "{case}");
    }
    Ok(())
}

//! `PreTrainedModel::module_repr` against upstream's `print(model)`
//! (`scripts/reference/module_reprs.py`): each tiny model loaded from the folder the
//! reference saved, its text equal to upstream's byte for byte.

use anyhow::{Context, Result};
use tch::Device;
use tchtrain_models::{AutoTask, LoadOptions, PeftModel, PreTrainedModel, from_pretrained_dir};
use tchtrain_testing::reference_dir;

#[test]
fn module_repr_equals_upstreams_print() -> Result<()> {
    let dir = reference_dir("module_reprs");
    let cases = [
        ("gpt2_lm", AutoTask::CausalLm),
        (
            "gpt2_cls",
            AutoTask::SequenceClassification { num_labels: None },
        ),
        ("llama", AutoTask::CausalLm),
        (
            "llama_bias_cls",
            AutoTask::SequenceClassification { num_labels: None },
        ),
        ("mistral", AutoTask::CausalLm),
        ("qwen2", AutoTask::CausalLm),
        ("qwen3", AutoTask::CausalLm),
        (
            "qwen3_cls",
            AutoTask::SequenceClassification { num_labels: None },
        ),
        ("gemma", AutoTask::CausalLm),
        (
            "gemma2_cls",
            AutoTask::SequenceClassification { num_labels: None },
        ),
        ("gemma3_text", AutoTask::CausalLm),
        ("phi3", AutoTask::CausalLm),
        (
            "phi3_cls",
            AutoTask::SequenceClassification { num_labels: None },
        ),
        ("t5", AutoTask::Seq2SeqLm),
        ("flan_t5", AutoTask::Seq2SeqLm),
        ("bart", AutoTask::Seq2SeqLm),
        ("mbart", AutoTask::Seq2SeqLm),
        (
            "distilbert_cls",
            AutoTask::SequenceClassification { num_labels: None },
        ),
        ("distilbert_mlm", AutoTask::MaskedLm),
        ("distilbert_qa", AutoTask::QuestionAnswering),
        (
            "distilbert_ner",
            AutoTask::TokenClassification { num_labels: None },
        ),
        ("granite", AutoTask::CausalLm),
        ("smollm3", AutoTask::CausalLm),
        ("olmo2", AutoTask::CausalLm),
        ("mixtral", AutoTask::CausalLm),
        ("qwen2_moe", AutoTask::CausalLm),
        ("qwen3_moe", AutoTask::CausalLm),
        ("olmoe", AutoTask::CausalLm),
        (
            "modernbert_cls",
            AutoTask::SequenceClassification { num_labels: None },
        ),
        ("modernbert_mlm", AutoTask::MaskedLm),
        (
            "modernbert_ner",
            AutoTask::TokenClassification { num_labels: None },
        ),
        (
            "deberta_v3_cls",
            AutoTask::SequenceClassification { num_labels: None },
        ),
        ("deberta_v3_mlm", AutoTask::MaskedLm),
        (
            "deberta_v3_ner",
            AutoTask::TokenClassification { num_labels: None },
        ),
        ("bert_base", AutoTask::Base),
        (
            "bert_cls",
            AutoTask::SequenceClassification { num_labels: None },
        ),
        ("bert_mlm", AutoTask::MaskedLm),
        (
            "bert_ner",
            AutoTask::TokenClassification { num_labels: None },
        ),
        ("bert_qa", AutoTask::QuestionAnswering),
        ("roberta_mlm", AutoTask::MaskedLm),
        (
            "roberta_cls",
            AutoTask::SequenceClassification { num_labels: None },
        ),
        (
            "xlm_roberta_ner",
            AutoTask::TokenClassification { num_labels: None },
        ),
        (
            "xlm_roberta_cls",
            AutoTask::SequenceClassification { num_labels: None },
        ),
    ];
    for (case, task) in cases {
        let folder = dir.join(case);
        let model = from_pretrained_dir(&folder, task, Device::Cpu, &LoadOptions::default())
            .with_context(|| case.to_string())?
            .model;
        let ours = model
            .module_repr()
            .with_context(|| format!("{case}: no module_repr"))?
            .to_string();
        let theirs = std::fs::read_to_string(folder.join("repr.txt"))?;
        assert_eq!(ours, theirs, "{case}");
    }
    // peft models: the adapters (a second one in `second/`) over the base.
    for (case, task) in [
        ("peft_llama", AutoTask::CausalLm),
        (
            "peft_bert_cls_dora",
            AutoTask::SequenceClassification { num_labels: None },
        ),
        (
            "peft_roberta_cls",
            AutoTask::SequenceClassification { num_labels: None },
        ),
        ("peft_gpt2", AutoTask::CausalLm),
    ] {
        let folder = dir.join(case);
        let base = from_pretrained_dir(&folder, task, Device::Cpu, &LoadOptions::default())
            .with_context(|| case.to_string())?
            .model;
        let adapters = folder.join("adapter");
        let mut model = PeftModel::from_pretrained(base, &adapters, false)?;
        if adapters.join("second").exists() {
            model.load_adapter(&adapters.join("second"), "second", false)?;
        }
        let ours = model
            .module_repr()
            .with_context(|| format!("{case}: no module_repr"))?
            .to_string();
        let theirs = std::fs::read_to_string(folder.join("repr.txt"))?;
        assert_eq!(ours, theirs, "{case}");
    }
    Ok(())
}

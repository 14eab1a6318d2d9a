//! `SFTTrainer` against trl 1.16 + transformers 5.23 (`scripts/reference/trl_sft.py`): the
//! prepared rows (`input_ids`, `labels`, `seq_lengths`) equal TRL's, and 8 steps log every
//! value TRL logs — loss, grad_norm, learning_rate, entropy, mean_token_accuracy, num_tokens,
//! and their `eval_` counterparts — to the bit, for text, conversational, prompt-completion
//! (text and messages), packed (BFD, padding-free), DFT and LoRA-under-TRL's-defaults (bf16
//! autocast, gradient checkpointing) runs.

use anyhow::{Context, Result, ensure};
use tch::Device;
use tchtrain_datasets::Table;
use tchtrain_models::{AutoTask, LoadOptions, LoraConfig, from_pretrained_dir};
use tchtrain_testing::{assets, lock, temp_dir};
use tchtrain_trl::{SFTConfig, SFTTrainer, SftLossType};

use crate::common::{assert_logs_equal, assert_resumed_logs, lora_q_v, reference_arguments};

fn dir() -> std::path::PathBuf {
    assets().join("reference/trl_sft")
}

fn table(name: &str) -> Result<Table> {
    let path = dir().join("data").join(name);
    Table::read(&path).with_context(|| format!("{} (run `cargo xtask setup`)", path.display()))
}

/// The reference's settings: batches of 4, 8 steps at lr 1e-3, logs every 2 steps and an
/// evaluation every 4, `max_length` 80, seed 42, float32 without checkpointing (the cases
/// change what they test).
fn reference_config(out: &std::path::Path) -> SFTConfig {
    let mut config = SFTConfig::new(out.display().to_string());
    reference_arguments(&mut config.base);
    config.max_length = Some(80);
    config.bf16 = Some(false);
    config
}

/// `SFTTrainer(initial model, config, SmolLM2's tokenizer cut to 1024 tokens)`.
fn builder(config: SFTConfig) -> Result<tchtrain_trl::SFTTrainerBuilder> {
    let model = from_pretrained_dir(
        &dir().join("initial"),
        AutoTask::CausalLm,
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model;
    let tokenizer = tchtrain_models::AutoTokenizer::from_pretrained(dir().join("tokenizer"))?;
    Ok(SFTTrainer::builder(model, config, tokenizer))
}

fn run(
    case: &str,
    data: &str,
    set: impl FnOnce(&mut SFTConfig),
    lora: Option<LoraConfig>,
) -> Result<()> {
    let _g = lock();
    let out = temp_dir(&format!("sft-{case}"));
    let mut config = reference_config(&out);
    set(&mut config);
    let mut builder = builder(config)?
        .train_dataset(table(&format!("{data}.jsonl"))?)
        .eval_dataset(table(&format!("{data}.eval.jsonl"))?);
    if let Some(l) = lora {
        builder = builder.peft_config(l);
    }
    let mut trainer = builder.build()?;
    // The prepared rows.
    let prepared: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        dir().join(case).join("prepared.json"),
    )?)?;
    let prepared = prepared.as_array().context("prepared")?;
    let rows = trainer.train_dataset().context("train dataset")?;
    ensure!(
        rows.len() == prepared.len(),
        "{case}: {} prepared rows vs TRL's {}",
        rows.len(),
        prepared.len()
    );
    for (i, p) in prepared.iter().enumerate() {
        let f = rows.get(i)?;
        let ids = |k: &str| -> Option<Vec<i64>> {
            p.get(k)?
                .as_array()?
                .iter()
                .map(serde_json::Value::as_i64)
                .collect()
        };
        ensure!(
            Some(f.input_ids.clone()) == ids("input_ids"),
            "{case} row {i}: input_ids"
        );
        let labels = match &f.labels {
            Some(tchtrain_collators::Label::Ids(l)) => Some(l.clone()),
            _ => None,
        };
        ensure!(labels == ids("labels"), "{case} row {i}: labels");
        ensure!(
            f.seq_lengths == ids("seq_lengths"),
            "{case} row {i}: seq_lengths"
        );
    }
    trainer.train(None)?;
    let expected: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        dir().join(case).join("log_history.json"),
    )?)?;
    assert_logs_equal(case, &trainer.state.log_history, &expected)?;
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

#[test]
fn sft_text_equals_trl() -> Result<()> {
    run("text", "text", |_| {}, None)
}

#[test]
fn sft_messages_equals_trl() -> Result<()> {
    run("messages", "messages", |_| {}, None)
}

#[test]
fn sft_prompt_completion_equals_trl() -> Result<()> {
    run("prompt_completion", "prompt_completion", |_| {}, None)?;
    run(
        "chat_prompt_completion",
        "chat_prompt_completion",
        |_| {},
        None,
    )
}

#[test]
fn sft_packing_equals_trl() -> Result<()> {
    run("packing", "text", |c| c.packing = true, None)
}

#[test]
fn sft_dft_equals_trl() -> Result<()> {
    run("dft", "messages", |c| c.loss_type = SftLossType::Dft, None)
}

/// `assistant_only_loss` under SmolLM2's template with `{% generation %}` markers, and under
/// TRL's own Qwen3 training template on tool-calling conversations (`tools` as JSON text):
/// the assistant masks, hence the labels, equal TRL's, and so does every logged value.
#[test]
fn sft_assistant_only_loss_equals_trl() -> Result<()> {
    run(
        "assistant_smollm2",
        "messages",
        |c| {
            c.assistant_only_loss = true;
            c.chat_template_path = Some(dir().join("data/smollm2_training.jinja"));
        },
        None,
    )?;
    run(
        "assistant_qwen3_tools",
        "tool_messages",
        |c| {
            c.assistant_only_loss = true;
            c.max_length = Some(560);
            c.chat_template_path = Some(dir().join("data/qwen3_training.jinja"));
        },
        None,
    )
}

/// TRL's defaults: bf16 autocast (`bf16=None` on the CPU), gradient checkpointing, with a LoRA
/// adapter (input gradients enabled for the checkpointed layers).
#[test]
fn sft_lora_with_trl_defaults_equals_trl() -> Result<()> {
    run(
        "lora_defaults",
        "messages",
        |c| {
            c.bf16 = None;
            c.base.gradient_checkpointing = true;
        },
        Some(lora_q_v("CAUSAL_LM")),
    )
}

/// The text run saved at step 4 and resumed by a new trainer: every later value TRL logs for
/// the uninterrupted run, `num_tokens` counted from the resumption on (TRL keeps the count on
/// the trainer, not in the checkpoint, so a resumed run counts from zero).
#[test]
fn sft_resumes_bit_exactly() -> Result<()> {
    let _g = lock();
    let out = temp_dir("sft-resume");
    let trainer = |steps_saved: bool| -> Result<SFTTrainer> {
        let mut config = reference_config(&out);
        if steps_saved {
            config.base.save_strategy = tchtrain_training_args::SaveStrategy::Steps;
            config.base.save_steps = 4.0;
        }
        Ok(builder(config)?
            .train_dataset(table("text.jsonl")?)
            .eval_dataset(table("text.eval.jsonl")?)
            .build()?)
    };
    trainer(true)?.train(None)?;
    let mut resumed = trainer(false)?;
    resumed.train(Some(tchtrain_trainer::ResumeFrom::Path(
        out.join("checkpoint-4"),
    )))?;
    assert_resumed_logs(
        &resumed.state.log_history,
        &dir().join("text/log_history.json"),
    )?;
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

/// The refusals name their field.
#[test]
fn sft_refuses_what_is_not_implemented() -> Result<()> {
    let _g = lock();
    let tokenizer = tchtrain_models::AutoTokenizer::from_pretrained(dir().join("tokenizer"))?;
    let model = || {
        from_pretrained_dir(
            &dir().join("initial"),
            AutoTask::CausalLm,
            Device::Cpu,
            &LoadOptions::default(),
        )
        .map(|l| l.model)
    };
    // SmolLM2's own template has no generation markers.
    let mut config = SFTConfig::new("unused");
    config.assistant_only_loss = true;
    config.base.use_cpu = true;
    let err = SFTTrainer::builder(model()?, config, tokenizer.clone())
        .train_dataset(table("messages.jsonl")?)
        .build()
        .err()
        .context("assistant_only_loss without generation markers was accepted")?;
    ensure!(err.to_string().contains("chat_template_path"), "{err}");
    // Nor on a dataset that is not conversational.
    let mut config = SFTConfig::new("unused");
    config.assistant_only_loss = true;
    config.base.use_cpu = true;
    let err = SFTTrainer::builder(model()?, config, tokenizer.clone())
        .train_dataset(table("text.jsonl")?)
        .build()
        .err()
        .context("assistant_only_loss on text rows was accepted")?;
    ensure!(err.to_string().contains("not conversational"), "{err}");
    let mut config = SFTConfig::new("unused");
    config.base.use_cpu = true;
    config.padding_free = true;
    let err = SFTTrainer::builder(model()?, config, tokenizer)
        .train_dataset(table("text.jsonl")?)
        .build()
        .err()
        .context("padding_free with max_length and no packing was accepted")?;
    ensure!(err.to_string().contains("padding_free"), "{err}");
    Ok(())
}

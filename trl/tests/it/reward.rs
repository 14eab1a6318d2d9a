//! `RewardTrainer` against trl 1.16 + transformers 5.23 (`scripts/reference/trl_reward.py`):
//! the tiny Llama causal LM loaded as a one-label sequence classifier after the seed (its
//! `score` drawn as TRL draws it), the prepared pairs (`chosen_ids`, `rejected_ids`,
//! `margin`) equal TRL's, 8 steps log every value TRL logs — loss, grad_norm, learning_rate,
//! num_tokens, min / mean / max reward, accuracy, margin and their `eval_` counterparts — to
//! the bit, and the saved model (or adapter) equals TRL's tensor for tensor, for implicit and
//! explicit prompts, margins with `center_rewards_coefficient`, conversations, and LoRA under
//! TRL's defaults (bf16 autocast, gradient checkpointing).

use anyhow::{Context, Result, ensure};
use tchtrain_collators::Column;
use tchtrain_datasets::Table;
use tchtrain_models::LoraConfig;
use tchtrain_testing::{assets, lock, temp_dir};
use tchtrain_trl::{RewardConfig, RewardTrainer};

use crate::common::{
    assert_logs_equal, assert_resumed_logs, assert_same_tensors, lora_q_v, reference_arguments,
};

fn dir() -> std::path::PathBuf {
    assets().join("reference/trl_reward")
}

fn table(name: &str) -> Result<Table> {
    let path = dir().join("data").join(name);
    Table::read(&path).with_context(|| format!("{} (run `cargo xtask setup`)", path.display()))
}

/// The reference's settings: batches of 4, 8 steps at lr 1e-3, logs every 2 steps and an
/// evaluation every 4, `max_length` 48, seed 42, float32 without checkpointing.
fn reference_config(out: &std::path::Path) -> RewardConfig {
    let mut config = RewardConfig::new(out.display().to_string());
    reference_arguments(&mut config.base);
    config.max_length = Some(48);
    config.bf16 = Some(false);
    config
}

/// `RewardTrainer(model="initial/", config, SmolLM2's tokenizer cut to 1024 tokens)`.
fn builder(config: RewardConfig) -> Result<tchtrain_trl::RewardTrainerBuilder> {
    let tokenizer = tchtrain_models::AutoTokenizer::from_pretrained(dir().join("tokenizer"))?;
    Ok(RewardTrainer::builder_from_pretrained(
        dir().join("initial"),
        config,
        tokenizer,
    ))
}

fn run(
    case: &str,
    data: &str,
    set: impl FnOnce(&mut RewardConfig),
    lora: Option<LoraConfig>,
) -> Result<()> {
    let _g = lock();
    let out = temp_dir(&format!("reward-{case}"));
    let mut config = reference_config(&out);
    set(&mut config);
    let mut builder = builder(config)?
        .train_dataset(table(&format!("{data}.jsonl"))?)
        .eval_dataset(table(&format!("{data}.eval.jsonl"))?);
    let adapter = lora.is_some();
    if let Some(l) = lora {
        builder = builder.peft_config(l);
    }
    let mut trainer = builder.build()?;
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
        for key in ["chosen_ids", "rejected_ids"] {
            let want: Option<Vec<i64>> = p
                .get(key)
                .and_then(|v| v.as_array())
                .and_then(|a| a.iter().map(serde_json::Value::as_i64).collect());
            let got = match f.column(key) {
                Some(Column::Ids(ids)) => Some(ids.clone()),
                _ => None,
            };
            ensure!(got == want, "{case} row {i}: {key}");
        }
        let margin = match f.column("margin") {
            Some(Column::Float(m)) => Some(*m),
            _ => None,
        };
        ensure!(
            margin == p.get("margin").and_then(serde_json::Value::as_f64),
            "{case} row {i}: margin"
        );
    }
    trainer.train(None)?;
    let expected: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        dir().join(case).join("log_history.json"),
    )?)?;
    assert_logs_equal(case, &trainer.state.log_history, &expected)?;
    // The trained model (or adapter) as TRL saves it.
    let saved = trainer.save_model(Some(&out.join("model")))?;
    let file = if adapter {
        "adapter_model.safetensors"
    } else {
        "model.safetensors"
    };
    assert_same_tensors(
        case,
        &saved.join(file),
        &dir().join(case).join("model").join(file),
    )?;
    if !adapter {
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(saved.join("config.json"))?)?;
        let want: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
            dir().join(case).join("model/config.json"),
        )?)?;
        for key in ["architectures", "pad_token_id", "id2label"] {
            ensure!(
                config[key] == want[key],
                "{case}: config.json {key} = {}, TRL's {}",
                config[key],
                want[key]
            );
        }
    }
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

#[test]
fn reward_standard_equals_trl() -> Result<()> {
    run("standard", "standard", |_| {}, None)
}

#[test]
fn reward_explicit_prompt_equals_trl() -> Result<()> {
    run("explicit", "explicit", |_| {}, None)
}

#[test]
fn reward_margin_and_centering_equal_trl() -> Result<()> {
    run(
        "margin_center",
        "margin",
        |c| c.center_rewards_coefficient = Some(0.01),
        None,
    )
}

#[test]
fn reward_conversational_equals_trl() -> Result<()> {
    run(
        "conversational",
        "conversational",
        |c| c.max_length = Some(100),
        None,
    )
}

/// TRL's defaults: bf16 autocast (`bf16=None` on the CPU), gradient checkpointing, with a LoRA
/// adapter whose SEQ_CLS task trains `score` in full.
#[test]
fn reward_lora_with_trl_defaults_equals_trl() -> Result<()> {
    run(
        "lora_defaults",
        "conversational",
        |c| {
            c.bf16 = None;
            c.base.gradient_checkpointing = true;
            c.max_length = Some(100);
        },
        Some(lora_q_v("SEQ_CLS")),
    )
}

/// The standard run saved at step 4 and resumed by a new trainer: every later value TRL logs
/// for the uninterrupted run (`num_tokens` counted from the resumption, as TRL keeps it on the
/// trainer), and the final model equal to TRL's.
#[test]
fn reward_resumes_bit_exactly() -> Result<()> {
    let _g = lock();
    let out = temp_dir("reward-resume");
    let trainer = |steps_saved: bool| -> Result<RewardTrainer> {
        let mut config = reference_config(&out);
        if steps_saved {
            config.base.save_strategy = tchtrain_training_args::SaveStrategy::Steps;
            config.base.save_steps = 4.0;
        }
        Ok(builder(config)?
            .train_dataset(table("standard.jsonl")?)
            .eval_dataset(table("standard.eval.jsonl")?)
            .build()?)
    };
    trainer(true)?.train(None)?;
    let mut resumed = trainer(false)?;
    resumed.train(Some(tchtrain_trainer::ResumeFrom::Path(
        out.join("checkpoint-4"),
    )))?;
    assert_resumed_logs(
        &resumed.state.log_history,
        &dir().join("standard/log_history.json"),
    )?;
    let saved = resumed.save_model(Some(&out.join("model")))?;
    assert_same_tensors(
        "resumed",
        &saved.join("model.safetensors"),
        &dir().join("standard/model/model.safetensors"),
    )?;
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

/// A classifier of more than one label is refused with TRL's message; so is an `eos_token`
/// that is not the tokenizer's (TRL rewrites the model's `eos_token_id`).
#[test]
fn reward_refuses_what_is_not_implemented() -> Result<()> {
    let _g = lock();
    let tokenizer = tchtrain_models::AutoTokenizer::from_pretrained(dir().join("tokenizer"))?;
    let model = tchtrain_models::from_pretrained_dir(
        &dir().join("initial"),
        tchtrain_models::AutoTask::SequenceClassification {
            num_labels: Some(2),
        },
        tch::Device::Cpu,
        &tchtrain_models::LoadOptions::default(),
    )?
    .model;
    let mut config = RewardConfig::new("unused");
    config.base.use_cpu = true;
    let err = RewardTrainer::builder(model, config, tokenizer.clone())
        .train_dataset(table("standard.jsonl")?)
        .build()
        .err()
        .context("a two-label classifier was accepted")?;
    ensure!(err.to_string().contains("num_labels=2"), "{err}");
    let mut config = RewardConfig::new("unused");
    config.base.use_cpu = true;
    config.eos_token = Some("<|endoftext|>".into());
    let err = RewardTrainer::builder_from_pretrained(dir().join("initial"), config, tokenizer)
        .train_dataset(table("standard.jsonl")?)
        .build()
        .err()
        .context("another eos_token was accepted")?;
    ensure!(err.to_string().contains("eos_token"), "{err}");
    Ok(())
}

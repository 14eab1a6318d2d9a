//! `DPOTrainer` against trl 1.16 + transformers 5.23 (`scripts/reference/trl_dpo.py`): the
//! prepared rows (`prompt_ids`, `chosen_ids`, `rejected_ids`, and the precomputed reference
//! log-probabilities) equal TRL's, and every value TRL logs — loss, grad_norm,
//! learning_rate, entropy, num_tokens, logits / rewards / logps of the chosen and rejected
//! completions, mean_token_accuracy, and their `eval_` counterparts — equals TRL's to the bit,
//! as does the saved model (or adapter), for implicit and explicit prompts, truncation from
//! either end, conversations, several weighted losses (MPO), LD-DPO with WPO weights and the
//! JS divergence, the alpha divergence, precomputed reference log-probabilities, LoRA with the
//! adapter disabled as reference under TRL's defaults (bf16 autocast, gradient
//! checkpointing), TR-DPO's reference sync, and every other loss type.

use anyhow::{Context, Result, ensure};
use tchtrain_collators::Column;
use tchtrain_datasets::Table;
use tchtrain_models::LoraConfig;
use tchtrain_testing::{assets, lock, temp_dir};
use tchtrain_trl::{DPOConfig, DPOTrainer, DpoLossType, FDivergenceType, TruncationMode};

use crate::common::{assert_logs_equal, assert_same_tensors, lora_q_v, reference_arguments};

fn dir() -> std::path::PathBuf {
    assets().join("reference/trl_dpo")
}

fn table(name: &str) -> Result<Table> {
    let path = dir().join("data").join(name);
    Table::read(&path).with_context(|| format!("{} (run `cargo xtask setup`)", path.display()))
}

/// The reference's settings: batches of 4, 8 steps at lr 1e-3, logs every 2 steps and an
/// evaluation every 4, `max_length` 48, seed 42, float32 without checkpointing.
fn reference_config(out: &std::path::Path) -> DPOConfig {
    let mut config = DPOConfig::new(out.display().to_string());
    reference_arguments(&mut config.base);
    config.max_length = Some(48);
    config.bf16 = Some(false);
    config
}

struct Case<'a> {
    name: &'a str,
    data: &'a str,
    evaluate: bool,
    save: bool,
    lora: Option<LoraConfig>,
}

impl<'a> Case<'a> {
    fn new(name: &'a str, data: &'a str) -> Self {
        Self {
            name,
            data,
            evaluate: true,
            save: true,
            lora: None,
        }
    }
}

fn run(case: Case<'_>, set: impl FnOnce(&mut DPOConfig)) -> Result<()> {
    let _g = lock();
    let name = case.name;
    let out = temp_dir(&format!("dpo-{name}"));
    let mut config = reference_config(&out);
    if !case.evaluate {
        config.base.eval_strategy = tchtrain_training_args::IntervalStrategy::No;
    }
    set(&mut config);
    let tokenizer = tchtrain_models::AutoTokenizer::from_pretrained(dir().join("tokenizer"))?;
    let mut builder = DPOTrainer::builder_from_pretrained(dir().join("initial"), config, tokenizer)
        .train_dataset(table(&format!("{}.jsonl", case.data))?);
    if case.evaluate {
        builder = builder.eval_dataset(table(&format!("{}.eval.jsonl", case.data))?);
    }
    let adapter = case.lora.is_some();
    if let Some(l) = case.lora {
        builder = builder.peft_config(l);
    }
    let mut trainer = builder.build()?;
    let prepared: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        dir().join(name).join("prepared.json"),
    )?)?;
    let prepared = prepared.as_array().context("prepared")?;
    let rows = trainer.train_dataset().context("train dataset")?;
    ensure!(
        rows.len() == prepared.len(),
        "{name}: {} prepared rows vs TRL's {}",
        rows.len(),
        prepared.len()
    );
    for (i, p) in prepared.iter().enumerate() {
        let f = rows.get(i)?;
        for key in ["prompt_ids", "chosen_ids", "rejected_ids"] {
            let want: Option<Vec<i64>> = p
                .get(key)
                .and_then(|v| v.as_array())
                .and_then(|a| a.iter().map(serde_json::Value::as_i64).collect());
            let got = match f.column(key) {
                Some(Column::Ids(ids)) => Some(ids.clone()),
                _ => None,
            };
            ensure!(
                got == want,
                "{name} row {i}: {key} {got:?} vs TRL's {want:?}"
            );
        }
        for key in ["ref_chosen_logps", "ref_rejected_logps"] {
            let got = match f.column(key) {
                Some(Column::Float(v)) => Some(*v),
                _ => None,
            };
            let want = p.get(key).and_then(serde_json::Value::as_f64);
            ensure!(
                got == want,
                "{name} row {i}: {key} {got:?} vs TRL's {want:?}"
            );
        }
    }
    trainer.train(None)?;
    let expected: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        dir().join(name).join("log_history.json"),
    )?)?;
    assert_logs_equal(name, &trainer.state.log_history, &expected)?;
    if case.save {
        let saved = trainer.save_model(Some(&out.join("model")))?;
        let file = if adapter {
            "adapter_model.safetensors"
        } else {
            "model.safetensors"
        };
        assert_same_tensors(
            name,
            &saved.join(file),
            &dir().join(name).join("model").join(file),
        )?;
    }
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

#[test]
fn dpo_sigmoid_implicit_prompt_equals_trl() -> Result<()> {
    run(Case::new("sigmoid", "standard"), |_| {})
}

/// `max_length` 20: the collator truncates prompt + completion, from the start or the end.
#[test]
fn dpo_truncation_equals_trl() -> Result<()> {
    run(Case::new("explicit", "explicit"), |c| {
        c.max_length = Some(20)
    })?;
    run(Case::new("keep_end", "explicit"), |c| {
        c.max_length = Some(20);
        c.truncation_mode = TruncationMode::KeepEnd;
    })
}

#[test]
fn dpo_conversational_equals_trl() -> Result<()> {
    run(Case::new("conversational", "conversational"), |c| {
        c.max_length = Some(96)
    })
}

/// MPO's weighted losses; LD-DPO with WPO weights and the JS divergence; the alpha
/// divergence under the hinge loss.
#[test]
fn dpo_loss_combinations_equal_trl() -> Result<()> {
    run(Case::new("mpo", "explicit"), |c| {
        c.loss_type = vec![DpoLossType::Sigmoid, DpoLossType::BcoPair, DpoLossType::Sft];
        c.loss_weights = Some(vec![0.8, 0.2, 1.0]);
    })?;
    run(Case::new("variants", "explicit"), |c| {
        c.ld_alpha = Some(0.5);
        c.use_weighting = true;
        c.f_divergence_type = FDivergenceType::JsDivergence;
    })?;
    run(Case::new("alpha_div", "explicit"), |c| {
        c.loss_type = vec![DpoLossType::Hinge];
        c.f_divergence_type = FDivergenceType::AlphaDivergence;
        c.f_alpha_divergence_coef = 0.3;
    })
}

/// TR-DPO: the reference mixed with the policy (α = 0.6) every 2 steps.
#[test]
fn dpo_sync_ref_model_equals_trl() -> Result<()> {
    run(Case::new("sync", "explicit"), |c| {
        c.sync_ref_model = true;
        c.ref_model_sync_steps = 2;
        c.ref_model_mixup_alpha = 0.6;
    })
}

/// The reference log-probabilities computed before training by the policy itself, in
/// batches of 3.
#[test]
fn dpo_precomputed_reference_equals_trl() -> Result<()> {
    run(Case::new("precompute", "explicit"), |c| {
        c.precompute_ref_log_probs = true;
        c.precompute_ref_batch_size = Some(3);
    })
}

/// TRL's defaults (bf16 autocast, gradient checkpointing) with a LoRA adapter: the reference
/// is the base model with the adapter disabled.
#[test]
fn dpo_lora_with_trl_defaults_equals_trl() -> Result<()> {
    let lora = lora_q_v("CAUSAL_LM");
    let case = Case {
        lora: Some(lora),
        ..Case::new("lora_defaults", "conversational")
    };
    run(case, |c| {
        c.bf16 = None;
        c.base.gradient_checkpointing = true;
        c.max_length = Some(96);
    })
}

/// Every other loss type, 4 steps (label smoothing 0.1 where the loss takes it).
#[test]
fn dpo_every_loss_type_equals_trl() -> Result<()> {
    let types = [
        "hinge",
        "ipo",
        "exo_pair",
        "nca_pair",
        "robust",
        "bco_pair",
        "sppo_hard",
        "aot",
        "aot_unpaired",
        "apo_zero",
        "apo_down",
        "discopop",
        "sft",
        "sigmoid_norm",
    ];
    for t in types {
        let name = format!("loss_{t}");
        let case = Case {
            evaluate: false,
            save: false,
            ..Case::new(&name, "explicit")
        };
        run(case, |c| {
            c.base.max_steps = 4;
            c.loss_type = vec![DpoLossType::parse(t).unwrap_or(DpoLossType::Sigmoid)];
            if matches!(t, "robust" | "exo_pair" | "aot" | "aot_unpaired") {
                c.label_smoothing = 0.1;
            }
        })?;
    }
    Ok(())
}

/// TRL's refusals keep its messages; what is not implemented here names its field.
#[test]
fn dpo_refuses_what_is_not_implemented() -> Result<()> {
    let _g = lock();
    let tokenizer = tchtrain_models::AutoTokenizer::from_pretrained(dir().join("tokenizer"))?;
    let build = |set: &dyn Fn(&mut DPOConfig)| -> Result<String> {
        let mut config = DPOConfig::new("unused");
        config.base.use_cpu = true;
        set(&mut config);
        let err =
            DPOTrainer::builder_from_pretrained(dir().join("initial"), config, tokenizer.clone())
                .train_dataset(table("explicit.jsonl")?)
                .build()
                .err()
                .context("accepted")?;
        Ok(err.to_string())
    };
    let e = build(&|c| {
        c.loss_type = vec![DpoLossType::ExoPair];
    })?;
    ensure!(e.contains("label_smoothing"), "{e}");
    let e = build(&|c| {
        c.loss_type = vec![DpoLossType::Aot];
        c.f_divergence_type = FDivergenceType::ForwardKl;
    })?;
    ensure!(e.contains("f_divergence_type"), "{e}");
    let e = build(&|c| c.loss_weights = Some(vec![1.0, 2.0]))?;
    ensure!(e.contains("loss_weights"), "{e}");
    let e = build(&|c| {
        c.sync_ref_model = true;
        c.precompute_ref_log_probs = true;
    })?;
    ensure!(e.contains("sync_ref_model"), "{e}");
    let e = build(&|c| c.router_aux_loss_coef = Some(0.1))?;
    ensure!(e.contains("not a Mixture-of-Experts"), "{e}");
    Ok(())
}

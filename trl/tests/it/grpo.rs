//! `GRPOTrainer` against trl 1.16 + transformers 5.23 (`scripts/reference/trl_grpo.py`):
//! with the same seed the same completions are sampled (the reference also writes each
//! generation round's prompt ids, completion ids and advantages to `rounds.json`, to diagnose
//! a difference), and every value TRL logs but the timings (`step_time`) —
//! loss, grad_norm, num_tokens, the completion lengths, each reward's mean and std, reward,
//! reward_std, frac_reward_zero_std, kl, entropy, the clip ratios, and their `eval_`
//! counterparts — and the saved model (or adapter) equal TRL's to the bit: text and
//! conversational prompts, the default DAPO loss, GRPO with a KL term to the reference
//! reloaded, two optimisation passes per generation (old log-probabilities), asymmetric
//! clipping, weighted rewards scaled over the batch, sampling at temperature 0.7 with top-k
//! and top-p, rewards that return `None` under `normalize_then_sum`, a reward model, Dr.
//! GRPO with `delta`, LoRA with the disabled adapter as reference under TRL's defaults (bf16
//! autocast, gradient checkpointing), CISPO, SAPO, LUSPO at the sequence level, generations
//! reused over optimizer steps, and a run resumed from TRL's own `checkpoint-2`.

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use tchtrain_datasets::Table;
use tchtrain_models::LoraConfig;
use tchtrain_testing::{assets, lock, temp_dir};
use tchtrain_trl::{
    GRPOConfig, GRPOTrainer, GrpoLossType, ImportanceSamplingLevel, MultiObjectiveAggregation,
    RewardFunc, RewardInputs, ScaleRewards,
};

use crate::common::{assert_logs_equal, assert_same_tensors, lora_q_v};

fn dir() -> std::path::PathBuf {
    assets().join("reference/trl_grpo")
}

fn table(name: &str) -> Result<Table> {
    let path = dir().join("data").join(name);
    Table::read(&path).with_context(|| format!("{} (run `cargo xtask setup`)", path.display()))
}

fn text_of(c: &Value) -> String {
    match c {
        Value::Array(m) => m[0]["content"].as_str().unwrap_or("").to_string(),
        other => other.as_str().unwrap_or("").to_string(),
    }
}

type Rewards = std::result::Result<Vec<Option<f64>>, tchtrain_trl::RewardError>;

/// The reference's reward functions.
fn length_reward() -> RewardFunc {
    RewardFunc::function("length_reward", |i: &RewardInputs<'_>| -> Rewards {
        Ok(i.completions
            .iter()
            .map(|c| Some(text_of(c).chars().count() as f64 / 10.0))
            .collect())
    })
}

fn token_reward() -> RewardFunc {
    RewardFunc::function("token_reward", |i: &RewardInputs<'_>| -> Rewards {
        Ok(i.completion_ids
            .iter()
            .map(|ids| Some((ids.iter().sum::<i64>() % 7) as f64))
            .collect())
    })
}

fn target_reward() -> RewardFunc {
    RewardFunc::function("target_reward", |i: &RewardInputs<'_>| -> Rewards {
        let targets = i.columns.get("target").ok_or("no target column")?;
        Ok(i.completion_ids
            .iter()
            .zip(targets)
            .map(|(ids, t)| {
                Some(if Some(ids[0] % 5) == t.as_i64() {
                    1.0
                } else {
                    0.0
                })
            })
            .collect())
    })
}

fn sometimes_none() -> RewardFunc {
    RewardFunc::function("sometimes_none", |i: &RewardInputs<'_>| -> Rewards {
        Ok(i.completion_ids
            .iter()
            .map(|ids| (ids[0] % 2 != 0).then_some(ids.len() as f64))
            .collect())
    })
}

/// The reference's settings: batches of 4 (one prompt's 4 generations), accumulation 2,
/// completions of up to 8 tokens, 4 steps at lr 1e-3 logged every step, an evaluation every
/// 2, seed 42, float32 without checkpointing.
fn reference_config(out: &std::path::Path) -> GRPOConfig {
    let mut c = GRPOConfig::new(out.display().to_string());
    let b = &mut c.base;
    b.per_device_train_batch_size = 4;
    b.per_device_eval_batch_size = 4;
    b.gradient_accumulation_steps = 2;
    b.max_steps = 4;
    b.learning_rate = 1e-3;
    b.logging_steps = 1.0;
    b.eval_strategy = tchtrain_training_args::IntervalStrategy::Steps;
    b.eval_steps = Some(2.0);
    b.save_strategy = tchtrain_training_args::SaveStrategy::No;
    b.seed = 42;
    b.use_cpu = true;
    b.report_to = vec!["none".into()];
    b.disable_tqdm = true;
    b.gradient_checkpointing = false;
    c.num_generations = 4;
    c.max_completion_length = 8;
    c.bf16 = Some(false);
    c
}

struct Case<'a> {
    name: &'a str,
    data: &'a str,
    rewards: Vec<RewardFunc>,
    evaluate: bool,
    lora: Option<LoraConfig>,
}

impl<'a> Case<'a> {
    fn new(name: &'a str, data: &'a str, rewards: Vec<RewardFunc>) -> Self {
        Self {
            name,
            data,
            rewards,
            evaluate: true,
            lora: None,
        }
    }
}

fn build(
    case: Case<'_>,
    out: &std::path::Path,
    set: impl FnOnce(&mut GRPOConfig),
) -> Result<GRPOTrainer> {
    let mut config = reference_config(out);
    if !case.evaluate {
        config.base.eval_strategy = tchtrain_training_args::IntervalStrategy::No;
    }
    set(&mut config);
    let tokenizer = tchtrain_models::AutoTokenizer::from_pretrained(dir().join("tokenizer"))?;
    let mut builder = GRPOTrainer::builder_from_pretrained(
        dir().join("initial"),
        case.rewards,
        config,
        tokenizer,
    )
    .train_dataset(table(&format!("{}.jsonl", case.data))?);
    if case.evaluate {
        builder = builder.eval_dataset(table(&format!("{}.eval.jsonl", case.data))?);
    }
    if let Some(l) = case.lora {
        builder = builder.peft_config(l);
    }
    Ok(builder.build()?)
}

/// Every logged value equal to TRL's but the timings (and `step_time`).
fn assert_grpo_logs(case: &str, ours: &[tchtrain_training_args::JsonMap]) -> Result<()> {
    let expected: Value = serde_json::from_str(&std::fs::read_to_string(
        dir().join(case).join("log_history.json"),
    )?)?;
    let strip = |v: &Value| -> Value {
        let mut v = v.clone();
        if let Some(a) = v.as_array_mut() {
            for e in a {
                if let Some(o) = e.as_object_mut() {
                    o.remove("step_time");
                }
            }
        }
        v
    };
    let ours: Vec<tchtrain_training_args::JsonMap> = ours
        .iter()
        .map(|e| {
            let mut e = e.clone();
            e.remove("step_time");
            e
        })
        .collect();
    assert_logs_equal(case, &ours, &strip(&expected))
}

fn run(case: Case<'_>, save: bool, set: impl FnOnce(&mut GRPOConfig)) -> Result<()> {
    let _g = lock();
    let name = case.name;
    let adapter = case.lora.is_some();
    let out = temp_dir(&format!("grpo-{name}"));
    let mut trainer = build(case, &out, set)?;
    trainer.train(None)?;
    assert_grpo_logs(name, &trainer.state.log_history)?;
    if save {
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

/// Text prompts, two reward functions, TRL's default loss (`dapo`): the rounds' completions
/// and advantages, the logs and the model.
#[test]
fn grpo_standard_equals_trl() -> Result<()> {
    run(
        Case::new(
            "standard",
            "standard",
            vec![length_reward(), token_reward()],
        ),
        true,
        |_| {},
    )
}

/// Conversations; GRPO's loss with a KL term to the reloaded reference, two passes per
/// generation, DAPO's asymmetric clipping, weighted rewards scaled over the batch, sampling
/// at temperature 0.7 with top-k 20 and top-p 0.9.
#[test]
fn grpo_kl_iterations_and_sampling_equal_trl() -> Result<()> {
    run(
        Case::new(
            "grpo_kl",
            "conversational",
            vec![length_reward(), token_reward()],
        ),
        true,
        |c| {
            c.loss_type = GrpoLossType::Grpo;
            c.beta = 0.04;
            c.num_iterations = 2;
            c.epsilon_high = Some(0.28);
            c.reward_weights = Some(vec![1.0, 0.5]);
            c.scale_rewards = ScaleRewards::Batch;
            c.temperature = 0.7;
            c.top_k = 20;
            c.top_p = 0.9;
        },
    )
}

/// A dataset column read by a reward function, rewards that are `None` for some
/// completions, `normalize_then_sum`, unscaled advantages, BNPO.
#[test]
fn grpo_none_rewards_equal_trl() -> Result<()> {
    run(
        Case::new(
            "none_rewards",
            "standard",
            vec![target_reward(), sometimes_none()],
        ),
        true,
        |c| {
            c.multi_objective_aggregation = MultiObjectiveAggregation::NormalizeThenSum;
            c.scale_rewards = ScaleRewards::None;
            c.loss_type = GrpoLossType::Bnpo;
        },
    )
}

/// A reward model (a one-label Llama classifier and its tokenizer) beside a function, on
/// conversations; Dr. GRPO with a KL term and `delta`.
#[test]
fn grpo_reward_model_equals_trl() -> Result<()> {
    let rm = RewardFunc::from_pretrained(dir().join("reward"))?;
    run(
        Case::new("reward_model", "conversational", vec![rm, token_reward()]),
        true,
        |c| {
            c.loss_type = GrpoLossType::DrGrpo;
            c.beta = 0.02;
            c.delta = Some(1.5);
        },
    )
}

/// LoRA under TRL's defaults (bf16 autocast, gradient checkpointing) with `beta` 0.04: the
/// reference is the policy with its adapter disabled.
#[test]
fn grpo_lora_defaults_equal_trl() -> Result<()> {
    let mut case = Case::new(
        "lora_defaults",
        "standard",
        vec![length_reward(), token_reward()],
    );
    case.lora = Some(lora_q_v("CAUSAL_LM"));
    run(case, true, |c| {
        c.bf16 = None;
        c.base.gradient_checkpointing = true;
        c.beta = 0.04;
    })
}

/// CISPO, SAPO, LUSPO (sequence-level ratios) and GRPO over generations reused across
/// optimizer steps (`steps_per_generation` 4 with accumulation 2), 2 steps each.
#[test]
fn grpo_other_losses_equal_trl() -> Result<()> {
    for (loss, sequence, spg) in [
        (GrpoLossType::Cispo, false, None),
        (GrpoLossType::Sapo, false, None),
        (GrpoLossType::Luspo, true, None),
        (GrpoLossType::Grpo, false, Some(4)),
    ] {
        let name = format!("loss_{}", loss.name());
        let mut case = Case::new(&name, "standard", vec![length_reward(), token_reward()]);
        case.evaluate = false;
        run(case, false, |c| {
            c.base.max_steps = 2;
            c.loss_type = loss;
            if sequence {
                c.importance_sampling_level = ImportanceSamplingLevel::Sequence;
            }
            c.steps_per_generation = spg;
        })?;
    }
    Ok(())
}

/// A run resumed from TRL's own `checkpoint-2` (its `trainer_state.json`, optimizer,
/// scheduler and RNG states): every entry after step 2 equals TRL's uninterrupted run, but
/// the summary's mean loss (over the resumed steps only, upstream's too).
#[test]
fn grpo_resumes_from_trls_checkpoint() -> Result<()> {
    let _g = lock();
    let out = temp_dir("grpo-resume");
    let checkpoint = out.join("checkpoint-2");
    copy_dir(&dir().join("resume").join("checkpoint-2"), &checkpoint)?;
    let case = Case::new("resume", "standard", vec![length_reward(), token_reward()]);
    let mut trainer = build(case, &out, |_| {})?;
    trainer.train(Some(tchtrain_trainer::ResumeFrom::Path(checkpoint)))?;
    let expected: Value = serde_json::from_str(&std::fs::read_to_string(
        dir().join("resume").join("log_history.json"),
    )?)?;
    let expected = expected.as_array().context("log_history")?;
    let ours = &trainer.state.log_history;
    ensure!(
        ours.len() == expected.len(),
        "{} entries vs TRL's {}",
        ours.len(),
        expected.len()
    );
    let mut bad = Vec::new();
    for (i, (o, e)) in ours.iter().zip(expected).enumerate().skip(3) {
        for (k, v) in e.as_object().context("entry")? {
            let timing = k.ends_with("_runtime") || k.ends_with("_per_second") || k == "step_time";
            if timing || k == "train_loss" {
                continue;
            }
            let got = o.get(k).and_then(|x| x.as_f64());
            if got != v.as_f64() {
                bad.push(format!("entry {i}: {k} = {got:?}, TRL's {:?}", v.as_f64()));
            }
        }
    }
    ensure!(bad.is_empty(), "resumed: {}", bad.join("\n"));
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let target = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &target)?;
        } else {
            std::fs::copy(e.path(), target)?;
        }
    }
    Ok(())
}

/// The configuration's checks and refusals, with TRL's messages.
#[test]
fn grpo_config_validates_as_trl() -> Result<()> {
    let mut c = GRPOConfig::new("out");
    c.num_generations = 3;
    c.base.per_device_train_batch_size = 4;
    let e = c
        .post_init()
        .err()
        .context("4 rows do not hold groups of 3")?;
    ensure!(
        e.to_string()
            .contains("must be divisible by num_generations (3)"),
        "{e}"
    );
    let mut c = GRPOConfig::new("out");
    c.generation_batch_size = Some(16);
    c.steps_per_generation = Some(2);
    ensure!(
        c.post_init().is_err(),
        "both generation_batch_size and steps_per_generation"
    );
    let mut c = GRPOConfig::new("out");
    c.use_vllm = true;
    let e = c.post_init().err().context("use_vllm")?;
    ensure!(e.to_string().contains("use_vllm"), "{e}");
    let mut c = GRPOConfig::new("out");
    c.base.per_device_train_batch_size = 8;
    c.base.gradient_accumulation_steps = 3;
    c.post_init()?;
    ensure!(c.steps_per_generation == Some(3) && c.generation_batch_size == Some(24));
    ensure!(
        GrpoLossType::parse("vespo").is_err() && GrpoLossType::parse("dapo")? == GrpoLossType::Dapo
    );
    Ok(())
}

//! Every working `optim` name through the Trainer: a run of tiny Llama (cut to 1024 tokens)
//! checkpointed at step 3 and resumed from there ends with the weights of the uninterrupted
//! run, bit for bit (the optimizer's state, step counts and modes, the scheduler and the RNG
//! restored); the
//! layer-wise optimizers' place in the loop (updates before the clip, the scheduled rates);
//! and the Trainer-level refusals (LOMO with fp16).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use tch::Tensor;
use tchtrain_models::{AutoTask, TrainableModel};
use tchtrain_testing::{assets, lock};
use tchtrain_trainer::{ResumeFrom, Trainer};
use tchtrain_training_args::{
    OptimizerNames, SaveStrategy, SchedulerType, StrOrList, TrainingArguments,
};

use crate::parity::{lm_blocks, load};

fn args(out: &Path, optim: OptimizerNames) -> Result<TrainingArguments> {
    let mut args = TrainingArguments {
        optim,
        per_device_train_batch_size: 4,
        max_steps: 6,
        learning_rate: 2e-3,
        lr_scheduler_type: SchedulerType::Linear,
        warmup_steps: 1.0,
        weight_decay: 0.1,
        max_grad_norm: 1.0,
        optim_target_modules: Some(StrOrList::One("all-linear".into())),
        save_strategy: SaveStrategy::Steps,
        save_steps: 3.0,
        logging_steps: 1.0,
        seed: 7,
        use_cpu: true,
        report_to: vec![],
        disable_tqdm: true,
        ..TrainingArguments::new(out.display().to_string())
    };
    args.post_init()?;
    Ok(args)
}

/// Tokens of [`small_llama`]: the resume test compares our runs with our runs, and the
/// 49,152-token head was most of each step's and each optimizer's work.
const SMALL_VOCAB: i64 = 1024;

/// `trainer_parity`'s `llama_wd` job (tiny Llama, tied embeddings) cut to its first
/// [`SMALL_VOCAB`] tokens, with the blocks' ids mapped into them (`id % SMALL_VOCAB`), as
/// `trainer_clm.py`'s `small_vocab_model` does for GPT-2: `initial/` and `blocks.json` in a
/// new temporary folder.
fn small_llama() -> Result<PathBuf> {
    let job = assets().join("reference/trainer_parity/llama_wd");
    let dir =
        std::env::temp_dir().join(format!("tchtrain-optim-small-llama-{}", std::process::id()));
    let initial = dir.join("initial");
    std::fs::create_dir_all(&initial)?;
    let tensors: Vec<(String, Tensor)> =
        Tensor::read_safetensors(job.join("initial/model.safetensors"))?
            .into_iter()
            .map(|(n, t)| {
                let t = if n == "model.embed_tokens.weight" || n == "lm_head.weight" {
                    t.narrow(0, 0, SMALL_VOCAB)
                } else {
                    t
                };
                (n, t)
            })
            .collect();
    Tensor::write_safetensors(&tensors, initial.join("model.safetensors"))?;
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(job.join("initial/config.json"))?)?;
    config["vocab_size"] = SMALL_VOCAB.into();
    std::fs::write(initial.join("config.json"), serde_json::to_string(&config)?)?;
    let mut blocks: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(job.join("blocks.json"))?)?;
    for part in ["train", "eval"] {
        for row in blocks[part].as_array_mut().context("blocks")? {
            for id in row.as_array_mut().context("block")? {
                *id = (id.as_i64().context("token id")? % SMALL_VOCAB).into();
            }
        }
    }
    std::fs::write(dir.join("blocks.json"), serde_json::to_string(&blocks)?)?;
    Ok(dir)
}

fn trainer(job: &Path, out: &Path, optim: OptimizerNames) -> Result<Trainer> {
    Ok(Trainer::builder(
        load(&job.join("initial"), AutoTask::CausalLm)?,
        args(out, optim)?,
    )
    .train_dataset(lm_blocks(&job.join("blocks.json"), "train")?)
    .build()?)
}

fn weights(model: &dyn TrainableModel) -> Vec<(String, tch::Tensor)> {
    model
        .var_store()
        .variables()
        .into_iter()
        .map(|(n, t)| (n, t.detach().copy()))
        .collect::<std::collections::BTreeMap<_, _>>()
        .into_iter()
        .collect()
}

#[test]
fn every_working_optim_resumes_exactly_through_the_trainer() -> Result<()> {
    let _g = lock();
    let job = small_llama()?;
    let initial = weights(&*load(&job.join("initial"), AutoTask::CausalLm)?);
    for optim in OptimizerNames::supported() {
        let name = optim.as_str();
        let full_dir = std::env::temp_dir().join(format!("tchtrain-optim-full-{name}"));
        let _ = std::fs::remove_dir_all(&full_dir);
        let mut full = trainer(&job, &full_dir, optim)?;
        full.train(None)?;
        let expected = weights(full.model());

        let mut resumed = trainer(&job, &full_dir, optim)?;
        let ckpt = full_dir.join("checkpoint-3");
        let out = resumed.train(Some(ResumeFrom::Path(ckpt)))?;
        assert_eq!(out.global_step, 6, "{name}");
        for ((n, a), (_, b)) in weights(resumed.model()).iter().zip(&expected) {
            assert!(
                a.equal(b),
                "{name}: {n} differs after resuming from checkpoint-3"
            );
        }
        let moved = expected
            .iter()
            .zip(&initial)
            .any(|((_, a), (_, b))| !a.equal(b));
        assert!(moved, "{name}: training left every weight unchanged");
        let _ = std::fs::remove_dir_all(&full_dir);
    }
    let _ = std::fs::remove_dir_all(&job);
    Ok(())
}

#[test]
fn lomo_with_fp16_is_refused_naming_the_way_out() -> Result<()> {
    let _g = lock();
    let dir = std::env::temp_dir().join("tchtrain-optim-lomo-fp16");
    let mut a = args(&dir, OptimizerNames::Lomo)?;
    a.fp16 = true;
    let model_dir = assets().join("reference/trainer_parity/llama_wd");
    let built = Trainer::builder(load(&model_dir.join("initial"), AutoTask::CausalLm)?, a)
        .train_dataset(lm_blocks(&model_dir.join("blocks.json"), "train")?)
        .build();
    let err = match built {
        Ok(mut t) => t.train(None).err().map(|e| e.to_string()),
        Err(e) => Some(e.to_string()),
    };
    let err = err.unwrap_or_default();
    assert!(err.contains("lomo") && err.contains("bf16"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// `(grad_norm, learning_rate)` of every training log entry.
fn norms_and_rates(trainer: &Trainer) -> Vec<(f64, f64)> {
    trainer
        .state
        .log_history
        .iter()
        .filter_map(|e| {
            Some((
                e.get("grad_norm")?.as_f64()?,
                e.get("learning_rate")?.as_f64()?,
            ))
        })
        .collect()
}

#[test]
fn layer_wise_galore_trains_as_galore_unclipped_and_logs_a_zero_grad_norm() -> Result<()> {
    let _g = lock();
    let run = |optim: OptimizerNames, max_grad_norm: f64| -> Result<Trainer> {
        let dir = std::env::temp_dir().join(format!(
            "tchtrain-optim-layerwise-{}-{max_grad_norm}",
            optim.as_str()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let model_dir = assets().join("reference/trainer_parity/llama_wd");
        let mut a = args(&dir, optim)?;
        a.max_grad_norm = max_grad_norm;
        let mut t = Trainer::builder(load(&model_dir.join("initial"), AutoTask::CausalLm)?, a)
            .train_dataset(lm_blocks(&model_dir.join("blocks.json"), "train")?)
            .build()?;
        t.train(None)?;
        let _ = std::fs::remove_dir_all(&dir);
        Ok(t)
    };
    // Upstream's hooks take each update from the full gradient, before the Trainer's clip:
    // without clipping, layer-wise GaLore is GaLore, the scheduled rates included.
    let whole = run(OptimizerNames::GaloreAdamw, 0.0)?;
    let layered = run(OptimizerNames::GaloreAdamwLayerwise, 0.0)?;
    for ((n, a), (_, b)) in weights(whole.model()).iter().zip(&weights(layered.model())) {
        assert!(a.equal(b), "{n} differs from galore_adamw");
    }
    let rates = |t: &Trainer| -> Vec<f64> { norms_and_rates(t).iter().map(|x| x.1).collect() };
    assert_eq!(rates(&layered), rates(&whole));
    assert_eq!(rates(&layered).len(), 6);
    // With clipping on, the clip finds no gradient: a norm of 0 every step, as upstream's.
    let clipped = run(OptimizerNames::GaloreAdamwLayerwise, 1.0)?;
    let logs = norms_and_rates(&clipped);
    assert_eq!(logs.len(), 6);
    assert!(logs.iter().all(|&(norm, _)| norm == 0.0), "{logs:?}");
    for ((n, a), (_, b)) in weights(clipped.model())
        .iter()
        .zip(&weights(layered.model()))
    {
        assert!(a.equal(b), "{n}: the clip changed a layer-wise update");
    }
    Ok(())
}

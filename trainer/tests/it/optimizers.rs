//! Every working `optim` name through the Trainer: a run of tiny Llama checkpointed at step 3
//! and resumed from there ends with the weights of the uninterrupted run, bit for bit (the
//! optimizer's state, step counts and modes, the scheduler and the RNG restored); and the
//! Trainer-level refusals (LOMO with fp16).

use std::path::Path;

use anyhow::Result;
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

fn trainer(out: &Path, optim: OptimizerNames) -> Result<Trainer> {
    let dir = assets().join("reference/trainer_parity/llama_wd");
    Ok(Trainer::builder(
        load(&dir.join("initial"), AutoTask::CausalLm)?,
        args(out, optim)?,
    )
    .train_dataset(lm_blocks(&dir.join("blocks.json"), "train")?)
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
    for optim in OptimizerNames::supported() {
        let name = optim.as_str();
        let full_dir = std::env::temp_dir().join(format!("tchtrain-optim-full-{name}"));
        let _ = std::fs::remove_dir_all(&full_dir);
        let mut full = trainer(&full_dir, optim)?;
        full.train(None)?;
        let expected = weights(full.model());

        let mut resumed = trainer(&full_dir, optim)?;
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
            .zip(weights(&*load(
                &assets().join("reference/trainer_parity/llama_wd/initial"),
                AutoTask::CausalLm,
            )?))
            .any(|((_, a), (_, b))| !a.equal(&b));
        assert!(moved, "{name}: training left every weight unchanged");
        let _ = std::fs::remove_dir_all(&full_dir);
    }
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

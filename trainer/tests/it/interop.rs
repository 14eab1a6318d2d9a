//! Checkpoints passed between upstream's Trainer and ours in torch's own files
//! (scripts/reference/trainer_interop.py: tiny GPT-2 cut to 1024 tokens, dropout on, batch 4
//! over 24 hamlet blocks, 10 steps, cosine schedule with 2 warmup steps, checkpoint at step
//! 5 mid-epoch):
//! - Python -> us: we resume upstream's `checkpoint-5/` (`optimizer.pt`, `scheduler.pt`,
//!   `rng_state.pth`, `scaler.pt`, `trainer_state.json`) and log steps 6-10 as upstream's
//!   uninterrupted run does;
//! - us -> Python: upstream's Trainer (the setup virtualenv's python,
//!   `TCHTRAIN_VENV_PYTHON`) resumes the `checkpoint-5/` we wrote and logs steps 6-10 as its
//!   uninterrupted run does.
//!
//! Each for AdamW unfused and fused, fused AdamW under bf16 autocast, and fp16 with a CPU
//! `GradScaler` (as trainer_fp16.py).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use anyhow::{Context, Result};
use tch::Device;
use tchtrain_collators::{Feature, Label};
use tchtrain_data::{Dataset, InMemoryDataset};
use tchtrain_models::{AutoTask, LoadOptions, from_pretrained_dir};
use tchtrain_optim::GradScalerKwargs;
use tchtrain_testing::{assets, lock, rel};
use tchtrain_trainer::{ResumeFrom, TORCH_RNG_STATE_NAME, Trainer};
use tchtrain_training_args::{OptimizerNames, SaveStrategy, SchedulerType, TrainingArguments};

fn reference_dir() -> PathBuf {
    assets().join("reference/trainer_interop")
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tchtrain-interop-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn rows() -> Result<Arc<dyn Dataset>> {
    let path = reference_dir().join("blocks.json");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let rows = v["train"]
        .as_array()
        .context("blocks")?
        .iter()
        .map(|row| {
            let ids: Vec<i64> = serde_json::from_value(row.clone())?;
            Ok(Feature::new(ids.clone()).with_labels(Label::Ids(ids)))
        })
        .collect::<Result<_>>()?;
    Ok(InMemoryDataset::new(rows).into_shared())
}

/// The reference script's `trainer_for(run, ...)`.
fn trainer(run: &str, out: &Path) -> Result<Trainer> {
    let mut args = TrainingArguments {
        per_device_train_batch_size: 4,
        max_steps: 10,
        learning_rate: 1e-3,
        lr_scheduler_type: SchedulerType::Cosine,
        warmup_steps: 2.0,
        weight_decay: 0.01,
        max_grad_norm: 1.0,
        logging_steps: 1.0,
        save_strategy: SaveStrategy::Steps,
        save_steps: 5.0,
        seed: 42,
        use_cpu: true,
        report_to: vec![],
        disable_tqdm: true,
        optim: match run {
            "adamw_torch" | "fp16" => OptimizerNames::AdamwTorch,
            _ => OptimizerNames::AdamwTorchFused,
        },
        bf16: run == "bf16_fused",
        fp16: run == "fp16",
        ..TrainingArguments::new(out.display().to_string())
    };
    args.post_init()?;
    let model = from_pretrained_dir(
        &reference_dir().join("initial"),
        AutoTask::CausalLm,
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model;
    let mut builder = Trainer::builder(model, args).train_dataset(rows()?);
    if run == "fp16" {
        builder = builder.grad_scaler(GradScalerKwargs {
            init_scale: 2f64.powi(20),
            growth_interval: 4,
            ..Default::default()
        });
    }
    Ok(builder.build()?)
}

/// The largest relative differences of (loss, grad_norm, learning_rate) over the training
/// log entries of steps 6 to 10, which both logs must have.
fn after_resume(
    name: &str,
    ours: &serde_json::Value,
    theirs: &serde_json::Value,
) -> Result<[f64; 3]> {
    let pick = |log: &serde_json::Value| -> Vec<(i64, [f64; 3])> {
        let num = |e: &serde_json::Value, k: &str| {
            e.get(k).and_then(|v| {
                v.as_f64()
                    .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            })
        };
        log.as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| {
                let step = e.get("step").and_then(serde_json::Value::as_f64)? as i64;
                Some((
                    step,
                    [
                        num(e, "loss")?,
                        num(e, "grad_norm")?,
                        num(e, "learning_rate")?,
                    ],
                ))
            })
            .filter(|(step, _)| *step > 5)
            .collect()
    };
    let (a, b) = (pick(ours), pick(theirs));
    let steps = |v: &[(i64, [f64; 3])]| v.iter().map(|(s, _)| *s).collect::<Vec<_>>();
    assert_eq!(steps(&a), (6..=10).collect::<Vec<_>>(), "{name}: our steps");
    assert_eq!(steps(&a), steps(&b), "{name}: steps");
    let mut m = [0f64; 3];
    for ((_, x), (_, y)) in a.iter().zip(&b) {
        for k in 0..3 {
            m[k] = m[k].max(rel(x[k], y[k]));
        }
    }
    Ok(m)
}

/// The numeric entries of a log, as JSON.
fn numbers(log: &[tchtrain_callbacks::JsonMap]) -> serde_json::Value {
    log.iter()
        .map(|e| -> serde_json::Value {
            e.iter()
                .filter_map(|(k, v)| Some((k.to_string(), serde_json::json!(v.as_f64()?))))
                .collect::<serde_json::Map<_, _>>()
                .into()
        })
        .collect()
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(serde_json::from_str(&text)?)
}

/// We resume upstream's `checkpoint-5/` of `run` and train to step 10.
fn python_to_us(run: &str) -> Result<[f64; 3]> {
    let _g = lock();
    let out = temp_dir(&format!("from-python-{run}"));
    let ckpt = reference_dir().join(run).join("checkpoint-5");
    let mut t = trainer(run, &out)?;
    let result = t.train(Some(ResumeFrom::Path(ckpt)))?;
    assert_eq!(result.global_step, 10);
    let m = after_resume(
        run,
        &numbers(&t.state.log_history),
        &read_json(&reference_dir().join(run).join("log_history.json"))?,
    )?;
    println!("python -> us {run}: max rel (loss, grad_norm, lr) = {m:?}");
    let _ = std::fs::remove_dir_all(&out);
    Ok(m)
}

/// We train each of `runs` to step 10 with a checkpoint at 5; upstream's Trainer resumes
/// those checkpoints to step 10, all in one Python process (its imports take ~13 s). Returns
/// each run's max relative differences with upstream's uninterrupted run.
fn us_to_python(runs: &[&str]) -> Result<Vec<[f64; 3]>> {
    let python = std::env::var_os("TCHTRAIN_VENV_PYTHON").context(
        "TCHTRAIN_VENV_PYTHON is not set: it names the setup virtualenv's python (with transformers); run `cargo xtask setup` (it writes .cargo/libtorch.toml) or set it by hand",
    )?;
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/reference/trainer_interop.py");
    let mut command = Command::new(&python);
    command
        .arg(&script)
        .arg("resume")
        .env("TCHTRAIN_ASSETS", assets())
        .env("OMP_NUM_THREADS", "2");
    let mut outs = Vec::new();
    for run in runs {
        let out = temp_dir(&format!("to-python-{run}"));
        {
            let _g = lock();
            let mut t = trainer(run, &out)?;
            t.train(None)?;
        }
        let ckpt = out.join("checkpoint-5");
        for file in ["optimizer.pt", "scheduler.pt", TORCH_RNG_STATE_NAME] {
            assert!(ckpt.join(file).is_file(), "{run}: {file} written");
        }
        assert_eq!(ckpt.join("scaler.pt").is_file(), *run == "fp16");
        let py_out = out.join("python");
        std::fs::create_dir_all(&py_out)?;
        command.arg(&py_out).arg(&ckpt).arg(run);
        outs.push(out);
    }
    let status = command
        .output()
        .with_context(|| format!("running TCHTRAIN_VENV_PYTHON={}", python.to_string_lossy()))?;
    assert!(
        status.status.success(),
        "{runs:?}: upstream's Trainer could not resume our checkpoints: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let mut max_rel = Vec::new();
    for (run, out) in runs.iter().zip(&outs) {
        let theirs_resumed = read_json(&out.join("python/log_history.json"))?;
        let m = after_resume(
            run,
            &theirs_resumed,
            &read_json(&reference_dir().join(run).join("log_history.json"))?,
        )?;
        println!("us -> python {run}: max rel (loss, grad_norm, lr) = {m:?}");
        let _ = std::fs::remove_dir_all(out);
        max_rel.push(m);
    }
    Ok(max_rel)
}

/// Within 1e-6 relative (the bound); the runs are expected to agree exactly.
fn assert_close(name: &str, m: [f64; 3]) {
    assert!(
        m.iter().all(|&x| x <= 1e-6),
        "{name}: max relative differences (loss, grad_norm, lr) {m:?}"
    );
}

#[test]
fn python_checkpoint_resumes_here_adamw() -> Result<()> {
    assert_close("adamw_torch", python_to_us("adamw_torch")?);
    Ok(())
}

#[test]
fn python_checkpoint_resumes_here_adamw_fused() -> Result<()> {
    assert_close("adamw_torch_fused", python_to_us("adamw_torch_fused")?);
    Ok(())
}

#[test]
fn python_checkpoint_resumes_here_bf16() -> Result<()> {
    assert_close("bf16_fused", python_to_us("bf16_fused")?);
    Ok(())
}

#[test]
fn python_checkpoint_resumes_here_fp16_scaler() -> Result<()> {
    assert_close("fp16", python_to_us("fp16")?);
    Ok(())
}

/// The four runs' checkpoints (AdamW, fused AdamW, bf16, fp16 with its scaler) resumed by
/// upstream's Trainer.
#[test]
fn our_checkpoints_resume_in_python() -> Result<()> {
    let runs = ["adamw_torch", "adamw_torch_fused", "bf16_fused", "fp16"];
    for (run, m) in runs.iter().zip(us_to_python(&runs)?) {
        assert_close(run, m);
    }
    Ok(())
}

//! `accelerate_loop`: a hand-written loop on the `Accelerator` alone trains the user model
//! of `custom_model` exactly as the Trainer does (the same losses and gradient norms to the
//! bit, fp32 and bf16, with gradient accumulation), and on 2 ranks (`cargo xtask launch`)
//! exactly as one process accumulating the two ranks' batches, its evaluation gathered in
//! the dataset's order.

use std::path::Path;

use anyhow::{Context, Result, ensure};
use tchtrain_examples::{accelerate_loop, custom_model};
use tchtrain_testing::{lock, temp_dir};

/// `(step, loss, grad_norm)` of every optimizer step.
type Steps = Vec<(usize, f64, f64)>;

/// `(step, loss, grad_norm)` of the Trainer's logged steps.
fn trainer_steps(out: &Path) -> Result<Steps> {
    Ok(crate::custom_model::steps(out)?
        .into_iter()
        .map(|(step, loss, grad_norm, _)| (step as usize, loss, grad_norm))
        .collect())
}

fn loop_steps(out: &accelerate_loop::AccelerateLoopOutput) -> Steps {
    out.steps
        .iter()
        .map(|s| (s.step, s.loss, s.grad_norm))
        .collect()
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

#[test]
fn the_loop_on_the_accelerator_is_the_trainers_step() -> Result<()> {
    let _g = lock();
    let dir = temp_dir("accelerate-loop");
    for (name, precision) in [("fp32", None), ("bf16", Some("bf16"))] {
        let out = dir.join(name);
        let out_arg = out.display().to_string();
        let mut trainer_args = strings(&[
            "--do_train",
            "--learning_rate",
            "0.05",
            "--lr_scheduler_type",
            "constant",
            "--per_device_train_batch_size",
            "4",
            "--gradient_accumulation_steps",
            "2",
            "--max_steps",
            "12",
            "--logging_steps",
            "1",
            "--seed",
            "7",
            "--use_cpu",
            "--save_strategy",
            "no",
            "--report_to",
            "none",
            "--disable_tqdm",
            "true",
            "--output_dir",
            &out_arg,
        ]);
        let mut loop_args = strings(&[
            "--cpu",
            "--learning_rate",
            "0.05",
            "--per_device_train_batch_size",
            "4",
            "--gradient_accumulation_steps",
            "2",
            "--max_steps",
            "12",
            "--seed",
            "7",
        ]);
        if let Some(p) = precision {
            trainer_args.push(format!("--{p}"));
            loop_args.extend(strings(&["--mixed_precision", p]));
        }
        custom_model::main_with_args(&trainer_args)?;
        let by_trainer = trainer_steps(&out)?;
        let by_loop = loop_steps(&accelerate_loop::main_with_args(&loop_args)?);
        assert_eq!(by_trainer.len(), 12, "{name}");
        assert_eq!(
            by_loop, by_trainer,
            "{name}: the loop and the Trainer differ"
        );
    }
    Ok(())
}

#[test]
fn the_loop_on_two_ranks_equals_one_process_accumulating_their_batches() -> Result<()> {
    let _g = lock();
    let dir = temp_dir("accelerate-loop-ddp");
    let ddp = dir.join("ddp");
    let output = std::process::Command::new(crate::launch::xtask()?)
        .args([
            "launch",
            "--nproc-per-node",
            "2",
            "--master-port",
            "0",
            "--",
        ])
        .arg(env!("CARGO_BIN_EXE_accelerate_loop"))
        .args([
            "--cpu",
            "--per_device_train_batch_size",
            "4",
            "--max_steps",
            "8",
            "--output_dir",
        ])
        .arg(&ddp)
        .output()?;
    ensure!(
        output.status.success(),
        "accelerate_loop on 2 ranks failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ddp.join("steps.json"))?)?;
    let two: Steps = json["steps"]
        .as_array()
        .context("steps")?
        .iter()
        .map(|s| {
            let num = |k: &str| s[k].as_f64().context(k.to_string());
            Ok((num("step")? as usize, num("loss")?, num("grad_norm")?))
        })
        .collect::<Result<_>>()?;
    // One process accumulating the same two batches per step (rank p takes batches p,
    // p + 2, ...): each micro-batch loss is halved, exactly, so g1/2 + g2/2 is DDP's
    // (g1 + g2) / 2 to the bit; the logged loss is the two halves' sum either way.
    let single = accelerate_loop::main_with_args(strings(&[
        "--cpu",
        "--per_device_train_batch_size",
        "4",
        "--gradient_accumulation_steps",
        "2",
        "--max_steps",
        "8",
    ]))?;
    assert_eq!(two.len(), 8);
    assert_eq!(two, loop_steps(&single));
    // gather_for_metrics: both ranks' predictions, in the dataset's order, none twice.
    assert_eq!(json["eval_accuracy"].as_f64(), Some(single.eval_accuracy));
    Ok(())
}

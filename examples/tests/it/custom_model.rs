//! A model the user wrote (`custom_model::BagOfWords`, a `TrainableModel` of a few lines)
//! through the Trainer: it learns, its checkpoint (the variables as `model.safetensors`, no
//! config) resumes the run exactly, and on 2 ranks (`cargo xtask launch`) it trains exactly
//! as one process accumulating the two ranks' batches.

use std::path::Path;

use anyhow::{Context, Result, ensure};
use tchtrain_callbacks::TrainerState;
use tchtrain_examples::custom_model;
use tchtrain_testing::{lock, temp_dir};

/// `(step, loss, grad_norm, learning_rate)` of every logged training step.
pub(crate) type Steps = Vec<(i64, f64, f64, f64)>;

pub(crate) fn steps(out: &Path) -> Result<Steps> {
    let state = TrainerState::load_from_json(out.join("trainer_state.json"))?;
    state
        .log_history
        .iter()
        .filter(|e| e.get("loss").is_some())
        .map(|e| {
            let num = |k: &str| e.get(k).and_then(|v| v.as_f64()).context(k.to_string());
            Ok((
                num("step")? as i64,
                num("loss")?,
                num("grad_norm")?,
                num("learning_rate")?,
            ))
        })
        .collect()
}

fn argv(out: &Path, extra: &[&str]) -> Vec<String> {
    [
        "--do_train",
        "--learning_rate",
        "0.05",
        "--logging_steps",
        "1",
        "--seed",
        "7",
        "--use_cpu",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
        "--output_dir",
        &out.display().to_string(),
    ]
    .iter()
    .chain(extra)
    .map(|s| s.to_string())
    .collect()
}

#[test]
fn a_user_model_learns_and_resumes_exactly() -> Result<()> {
    let _g = lock();
    let dir = temp_dir("custom-model");
    let full = dir.join("full");
    let extra = [
        "--max_steps",
        "24",
        "--save_strategy",
        "steps",
        "--save_steps",
        "12",
    ];
    custom_model::main_with_args(argv(&full, &extra))?;
    let run = steps(&full)?;
    assert_eq!(run.len(), 24);
    // It learns to spot the marker token: the mean loss of the last 6 steps is well below
    // that of the first 6 (ln 2 = 0.69 at chance).
    let mean = |s: &[(i64, f64, f64, f64)]| s.iter().map(|x| x.1).sum::<f64>() / s.len() as f64;
    let (first, last) = (mean(&run[..6]), mean(&run[18..]));
    ensure!(last < 0.8 * first, "loss {first} -> {last}");

    // A model that is not a PreTrainedModel is saved as its state dict alone.
    let ckpt = full.join("checkpoint-12");
    ensure!(
        ckpt.join("model.safetensors").is_file(),
        "no weights in {}",
        ckpt.display()
    );
    ensure!(
        !ckpt.join("config.json").exists(),
        "a config for a model without one"
    );
    let mut names: Vec<String> = tch::Tensor::read_safetensors(ckpt.join("model.safetensors"))?
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    names.sort();
    assert_eq!(names, ["embed.weight", "head.bias", "head.weight"]);

    // Resumed from step 12 into another folder: the state carries the checkpoint's history
    // (steps 1-12, as upstream's), and steps 13-24 are the full run's to the bit.
    let resumed = dir.join("resumed");
    let ckpt_arg = ckpt.display().to_string();
    let extra = [
        "--max_steps",
        "24",
        "--save_strategy",
        "no",
        "--resume_from_checkpoint",
        &ckpt_arg,
    ];
    custom_model::main_with_args(argv(&resumed, &extra))?;
    let again = steps(&resumed)?;
    assert_eq!(again, run);

    // A flag the script cannot honour is refused, not ignored.
    let err = custom_model::main_with_args(argv(&dir.join("predict"), &["--do_predict"]))
        .err()
        .context("--do_predict was accepted")?;
    assert!(err.to_string().contains("--do_predict"), "{err}");
    Ok(())
}

#[test]
fn a_user_model_on_two_ranks_equals_one_process_accumulating_their_batches() -> Result<()> {
    let _g = lock();
    let dir = temp_dir("custom-model-ddp");
    // Two ranks of 4 rows each: every step averages the two batches' gradients.
    let ddp = dir.join("ddp");
    let extra = [
        "--per_device_train_batch_size",
        "4",
        "--max_steps",
        "8",
        "--save_strategy",
        "no",
    ];
    let output = std::process::Command::new(crate::launch::xtask()?)
        .args([
            "launch",
            "--nproc-per-node",
            "2",
            "--master-port",
            "0",
            "--",
        ])
        .arg(env!("CARGO_BIN_EXE_custom_model"))
        .args(argv(&ddp, &extra))
        .output()?;
    ensure!(
        output.status.success(),
        "custom_model on 2 ranks failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // One process accumulating the same two batches per step (the sampler's order cut in
    // batches of 4: rank p takes batches p, p + 2, ..., one process takes them in pairs).
    // The model's loss is a per-batch mean the Trainer halves over the two micro-batches;
    // halving is exact in binary floating point, so g1/2 + g2/2 is DDP's (g1 + g2) / 2 to
    // the bit, and so is every step after.
    let single = dir.join("single");
    let extra = [
        "--per_device_train_batch_size",
        "4",
        "--gradient_accumulation_steps",
        "2",
        "--max_steps",
        "8",
        "--save_strategy",
        "no",
    ];
    custom_model::main_with_args(argv(&single, &extra))?;
    let (two, one) = (steps(&ddp)?, steps(&single)?);
    assert_eq!(two.len(), 8);
    assert_eq!(two, one);
    Ok(())
}

/// The process's log (`log_level`): a script's warnings reach stderr — here the Trainer's
/// note that `--fp16` trains in fp32 on the CPU, as upstream's — and `--log_level error`
/// silences them.
#[test]
fn warnings_reach_stderr_at_the_asked_log_level() -> Result<()> {
    let _g = lock();
    let dir = temp_dir("custom-model-log");
    let run = |name: &str, extra: &[&str]| -> Result<String> {
        let mut args = argv(
            &dir.join(name),
            &["--max_steps", "1", "--save_strategy", "no", "--fp16"],
        );
        args.extend(extra.iter().map(|s| s.to_string()));
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_custom_model"))
            .args(&args)
            .env_remove("RUST_LOG")
            .output()?;
        ensure!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(String::from_utf8_lossy(&output.stderr).into_owned())
    };
    let warned = run("default", &[])?;
    assert!(
        warned.contains("WARN - tchtrain_trainer::train_loop - fp16 has no effect on the CPU"),
        "{warned}"
    );
    let quiet = run("quiet", &["--log_level", "error"])?;
    assert!(!quiet.contains("fp16 has no effect"), "{quiet}");
    Ok(())
}

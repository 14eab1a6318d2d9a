//! `cargo xtask demo --clm`: a causal-LM training job, end to end, on the real SmolLM2-135M
//! (plain `cargo xtask demo` runs the sentiment job of `demo_sentiment`).
//!
//! `setup`, a release build of the `run_clm` example, then three runs of it into
//! `target/demo/` (all on CPU):
//!
//! 1. `before/`: the evaluation loss of the pretrained SmolLM2-135M on the held-out first
//!    5 % of `hamlet.txt`;
//! 2. `train/`: fine-tuning on the rest of `hamlet.txt` (`--max_steps` steps of
//!    `--per_device_train_batch_size` blocks of `--block_size` tokens, AdamW, cosine
//!    schedule with warmup), logging every few steps, evaluating half-way and at the end,
//!    and saving `checkpoint-N/` plus the final model;
//! 3. `reloaded/`: the saved `checkpoint-N/` loaded back and evaluated again;
//!
//! and a continuation of a fixed prompt from the held-out part of the play, sampled with the
//! same seed from the pretrained model and from the fine-tuned one (`run_generation`).
//!
//! It fails (non-zero exit) unless the evaluation loss went down and the reloaded
//! checkpoint gives the loss the training run measured.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use crate::cmd;
use crate::paths;
use crate::setup;

/// Command-line options of `demo`.
#[derive(Debug, PartialEq, Eq)]
pub struct Options {
    /// Optimizer steps of the fine-tuning.
    steps: usize,
    /// Tokens per training row.
    block_size: usize,
    /// Rows per step.
    batch_size: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            steps: 30,
            block_size: 128,
            batch_size: 4,
        }
    }
}

/// A positive integer option value, with an error naming the option.
pub(crate) fn positive(option: &str, value: Option<&String>) -> Result<usize, String> {
    let value = value.ok_or_else(|| format!("{option} needs a number"))?;
    match value.parse() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "{option}: expected a positive number, got `{value}`"
        )),
    }
}

impl Options {
    /// Parses `demo`'s arguments.
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let mut o = Options::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--steps" => o.steps = positive(a, it.next())?,
                "--block-size" => o.block_size = positive(a, it.next())?,
                "--batch-size" => o.batch_size = positive(a, it.next())?,
                other => {
                    return Err(format!(
                        "demo: unknown option `{other}` (known: --steps N, --block-size N, --batch-size N)"
                    ));
                }
            }
        }
        Ok(o)
    }
}

/// The number after `"key":` in a flat JSON object (the `*_results.json` files).
pub(crate) fn json_number(text: &str, key: &str) -> Option<f64> {
    let pattern = format!("\"{key}\"");
    let at = text.find(&pattern)? + pattern.len();
    let rest = text[at..].trim_start().strip_prefix(':')?.trim_start();
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E')))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// Reads `key` from `dir/file`.
pub(crate) fn read_metric(dir: &Path, file: &str, key: &str) -> Result<f64, String> {
    let path = dir.join(file);
    let text =
        std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    json_number(&text, key).ok_or_else(|| format!("no `{key}` in {}", path.display()))
}

/// Runs an example binary with `args`, echoing the command.
pub(crate) fn run_example(
    exe: &Path,
    root: &Path,
    what: &str,
    args: &[String],
) -> Result<(), String> {
    let mut c = Command::new(exe);
    c.current_dir(root).args(args);
    println!("\ndemo: {what}\ndemo: {}", cmd::display(&c));
    cmd::status(&mut c, what)
}

/// `--clm`: runs setup, builds the example and runs the three stages; `--lora`: the LoRA
/// demo (`demo_lora`); `--qlora`: the same on the base loaded in 4 bits; otherwise the
/// sentiment demo.
pub fn run(args: &[String]) -> Result<(), String> {
    for (flag, qlora) in [("--lora", false), ("--qlora", true)] {
        if args.iter().any(|a| a == flag) {
            let args: Vec<String> = args.iter().filter(|a| *a != flag).cloned().collect();
            return crate::demo_lora::run(&args, qlora);
        }
    }
    if !args.iter().any(|a| a == "--clm") {
        return crate::demo_sentiment::run(args);
    }
    let args: Vec<String> = args.iter().filter(|a| *a != "--clm").cloned().collect();
    let o = Options::parse(&args)?;
    let t0 = Instant::now();
    let s = setup::run(&setup::Options::default())?;
    let root = paths::workspace_root();
    let release =
        crate::build_examples::build_examples(&s, true, &["run_clm", "run_generation"], "demo")?;
    let target = paths::target_dir();
    let exe = release.join("run_clm");
    let run_generation = release.join("run_generation");
    let out = target.join("demo");
    if out.exists() {
        std::fs::remove_dir_all(&out)
            .map_err(|e| format!("cannot clear {}: {e}", out.display()))?;
    }
    let model = s.assets.join("smollm2-135m");
    let hamlet = s.assets.join("text").join("hamlet.txt");
    let model_arg = model.display().to_string();
    let common: Vec<String> = [
        "--train_file",
        &hamlet.display().to_string(),
        "--block_size",
        &o.block_size.to_string(),
        "--per_device_eval_batch_size",
        "4",
        "--use_cpu",
        "--report_to",
        "none",
        "--seed",
        "42",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let with = |extra: &[&str]| -> Vec<String> {
        common
            .iter()
            .cloned()
            .chain(extra.iter().map(|s| s.to_string()))
            .collect()
    };

    let t_job = Instant::now();
    let before = out.join("before");
    run_example(
        &exe,
        &root,
        "1/3 evaluating the pretrained SmolLM2-135M on the held-out 5% of hamlet.txt",
        &with(&[
            "--model_name_or_path",
            &model_arg,
            "--do_eval",
            "--output_dir",
            &before.display().to_string(),
        ]),
    )?;

    let trained = out.join("train");
    let steps = o.steps.to_string();
    let half = o.steps.div_ceil(2).to_string();
    let warmup = (o.steps / 10).to_string();
    run_example(
        &exe,
        &root,
        "2/3 fine-tuning on the other 95% (log every 5 steps, evaluate every half, save at the end)",
        &with(&[
            "--model_name_or_path",
            &model_arg,
            "--do_train",
            "--do_eval",
            "--max_steps",
            &steps,
            "--per_device_train_batch_size",
            &o.batch_size.to_string(),
            "--learning_rate",
            "5e-5",
            "--lr_scheduler_type",
            "cosine",
            "--warmup_steps",
            &warmup,
            "--weight_decay",
            "0.01",
            "--logging_steps",
            "5",
            "--eval_strategy",
            "steps",
            "--eval_steps",
            &half,
            "--save_strategy",
            "steps",
            "--save_steps",
            &steps,
            "--output_dir",
            &trained.display().to_string(),
        ]),
    )?;

    let checkpoint = trained.join(format!("checkpoint-{}", o.steps));
    let reloaded = out.join("reloaded");
    run_example(
        &exe,
        &root,
        "3/3 reloading the saved checkpoint and evaluating it again",
        &with(&[
            "--do_eval",
            "--model_name_or_path",
            &checkpoint.display().to_string(),
            "--tokenizer_name",
            &model_arg,
            "--output_dir",
            &reloaded.display().to_string(),
        ]),
    )?;
    println!("\ndemo: a continuation before and after fine-tuning (the same seed)");
    let text_before = crate::demo_lora::continuation(&run_generation, &root, &model, 40)?;
    let text_after = crate::demo_lora::continuation(&run_generation, &root, &trained, 40)?;
    let job_secs = t_job.elapsed().as_secs_f64();

    let loss_before = read_metric(&before, "eval_results.json", "eval_loss")?;
    let loss_after = read_metric(&trained, "eval_results.json", "eval_loss")?;
    let loss_reloaded = read_metric(&reloaded, "eval_results.json", "eval_loss")?;
    let train_loss = read_metric(&trained, "train_results.json", "train_loss")?;
    let train_runtime = read_metric(&trained, "train_results.json", "train_runtime")?;
    println!("\n===== demo: SmolLM2-135M fine-tuned on hamlet.txt =====");
    println!(
        "  train: {} steps x {} rows x {} tokens in {train_runtime:.0}s, train_loss {train_loss:.4}",
        o.steps, o.batch_size, o.block_size
    );
    println!(
        "  eval loss (held-out 5%): {loss_before:.4} before -> {loss_after:.4} after (perplexity {:.2} -> {:.2})",
        loss_before.exp(),
        loss_after.exp()
    );
    println!(
        "  reloaded {}: eval loss {loss_reloaded:.4}",
        checkpoint.display()
    );
    println!(
        "  model, trainer_state.json, *_results.json: {}",
        trained.display()
    );
    println!(
        "  continuation before:\n{}",
        crate::demo_lora::indent(&text_before)
    );
    println!(
        "  continuation after:\n{}",
        crate::demo_lora::indent(&text_after)
    );
    println!(
        "  demo job {job_secs:.0}s (three runs), {:.0}s in all with setup and build",
        t0.elapsed().as_secs_f64()
    );
    if loss_after >= loss_before {
        return Err(format!(
            "the evaluation loss did not decrease ({loss_before:.4} -> {loss_after:.4})"
        ));
    }
    // The reloaded weights are the trained ones; the same evaluation gives the same loss up
    // to float summation order.
    if (loss_reloaded - loss_after).abs() > 1e-4 * loss_after.abs().max(1.0) {
        return Err(format!(
            "the reloaded checkpoint evaluates to {loss_reloaded:.6}, the trained model to {loss_after:.6}"
        ));
    }
    println!("demo: OK (loss decreased, checkpoint reloads to the same loss)");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_numbers_from_results_json() {
        let text = "{\n    \"eval_loss\": 3.25,\n    \"eval_runtime\": 1e-3,\n    \"x\": -2\n}";
        assert_eq!(json_number(text, "eval_loss"), Some(3.25));
        assert_eq!(json_number(text, "eval_runtime"), Some(1e-3));
        assert_eq!(json_number(text, "x"), Some(-2.0));
        assert_eq!(json_number(text, "y"), None);
    }

    #[test]
    fn parses_options() {
        let o = Options::parse(&["--steps".into(), "8".into()]).unwrap();
        assert_eq!(o.steps, 8);
        assert!(Options::parse(&["--steps".into(), "0".into()]).is_err());
        assert!(Options::parse(&["--what".into()]).is_err());
    }
}

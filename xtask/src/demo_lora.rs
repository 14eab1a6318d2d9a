//! `cargo xtask demo --lora`: a LoRA adapter trained on the real SmolLM2-135M, as a
//! transformers + peft user trains one (TRL's flags on `run_clm`), and what it writes before
//! and after.
//!
//! `setup`, a release build of the `run_clm` and `run_generation` examples, then, all on
//! CPU and under `target/demo-lora/`:
//!
//! 1. `before/`: the evaluation loss of the pretrained model on the held-out first 5 % of
//!    `hamlet.txt`, and a continuation of a fixed prompt from that part of the play
//!    (`run_generation`: seeded sampling, temperature 0.7, top-k 50);
//! 2. `train/`: `run_clm --use_peft --lora_target_modules all-linear` (r 16, alpha 32,
//!    dropout 0.05) on the rest: the base frozen, the adapter trained (`--max_steps`
//!    steps of `--per_device_train_batch_size` blocks of `--block_size` tokens, AdamW at
//!    2e-4, cosine schedule), evaluated at the end; `train/` then holds the adapter as peft
//!    writes it (`adapter_config.json`, `adapter_model.safetensors`), no full model;
//! 3. the same continuation from the adapter folder (loaded with its base model, as
//!    transformers' PEFT integration loads one).
//!
//! It fails (non-zero exit) unless the evaluation loss went down and the adapter folder
//! holds the adapter alone.
//!
//! `cargo xtask demo --qlora` is QLoRA: the same under `target/demo-qlora/` with the base
//! loaded in 4 bits for training (TRL's `--load_in_4bit --bnb_4bit_quant_type nf4
//! --use_bnb_nested_quant`: bitsandbytes' NF4 with double quantization); the continuation
//! after loads the adapter onto the float base, as peft users merge or serve it.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use crate::cmd;
use crate::demo::{positive, read_metric, run_example};
use crate::paths;
use crate::setup;

/// The prompt: lines of the held-out part of the play, ending where Bernardo speaks.
const PROMPT: &str = "MARCELLUS\nWhat, has this thing appear'd again to-night?\nBERNARDO\n";

/// Command-line options of the LoRA demo.
#[derive(Debug, PartialEq, Eq)]
pub struct Options {
    /// Optimizer steps.
    steps: usize,
    /// Tokens per training row.
    block_size: usize,
    /// Rows per step.
    batch_size: usize,
    /// New tokens of each continuation.
    length: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            steps: 30,
            block_size: 128,
            batch_size: 4,
            length: 40,
        }
    }
}

impl Options {
    /// Parses the demo's arguments (without `--lora`).
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let mut o = Options::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--steps" => o.steps = positive(a, it.next())?,
                "--block-size" => o.block_size = positive(a, it.next())?,
                "--batch-size" => o.batch_size = positive(a, it.next())?,
                "--length" => o.length = positive(a, it.next())?,
                other => {
                    return Err(format!(
                        "demo --lora: unknown option `{other}` (known: --steps N, --block-size N, --batch-size N, --length N)"
                    ));
                }
            }
        }
        Ok(o)
    }
}

/// Runs `run_generation` on `model` and returns the continuation it printed.
pub(crate) fn continuation(
    exe: &Path,
    root: &Path,
    model: &Path,
    length: usize,
) -> Result<String, String> {
    let mut c = Command::new(exe);
    c.current_dir(root).args([
        "--model_type",
        "llama",
        "--model_name_or_path",
        &model.display().to_string(),
        "--prompt",
        PROMPT,
        "--length",
        &length.to_string(),
        "--temperature",
        "0.7",
        "--k",
        "50",
        "--seed",
        "42",
    ]);
    println!("demo: {}", cmd::display(&c));
    let out = cmd::output(&mut c, "generating a continuation")?;
    let text = out
        .split_once("=== GENERATED SEQUENCE 1 ===\n")
        .map_or(out.as_str(), |(_, t)| t)
        .trim_end();
    Ok(text.to_string())
}

/// Runs the demo (`qlora`: the base loaded in 4 bits for training).
pub fn run(args: &[String], qlora: bool) -> Result<(), String> {
    let o = Options::parse(args)?;
    let t0 = Instant::now();
    let s = setup::run(&setup::Options::default())?;
    let root = paths::workspace_root();
    let release =
        crate::build_examples::build_examples(&s, true, &["run_clm", "run_generation"], "demo")?;
    let target = paths::target_dir();
    let run_clm = release.join("run_clm");
    let run_generation = release.join("run_generation");
    let out = target.join(if qlora { "demo-qlora" } else { "demo-lora" });
    if out.exists() {
        std::fs::remove_dir_all(&out)
            .map_err(|e| format!("cannot clear {}: {e}", out.display()))?;
    }
    let model = s.assets.join("smollm2-135m");
    let model_arg = model.display().to_string();
    let hamlet = s
        .assets
        .join("text")
        .join("hamlet.txt")
        .display()
        .to_string();
    let common = |extra: &[&str]| -> Vec<String> {
        [
            "--model_name_or_path",
            &model_arg,
            "--train_file",
            &hamlet,
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
        .chain(extra)
        .map(|s| s.to_string())
        .collect()
    };

    let t_job = Instant::now();
    let before = out.join("before");
    run_example(
        &run_clm,
        &root,
        "1/3 evaluating the pretrained SmolLM2-135M on the held-out 5% of hamlet.txt",
        &common(&["--do_eval", "--output_dir", &before.display().to_string()]),
    )?;
    let text_before = continuation(&run_generation, &root, &model, o.length)?;

    let trained = out.join("train");
    let steps = o.steps.to_string();
    let quantized: &[&str] = if qlora {
        &[
            "--load_in_4bit",
            "--bnb_4bit_quant_type",
            "nf4",
            "--use_bnb_nested_quant",
        ]
    } else {
        &[]
    };
    let stage = if qlora {
        "2/3 training a LoRA adapter on every linear layer of the 4-bit base (NF4, frozen) on the other 95%"
    } else {
        "2/3 training a LoRA adapter on every linear layer (the base frozen) on the other 95%"
    };
    run_example(
        &run_clm,
        &root,
        stage,
        &common(
            &[
                quantized,
                &[
                    "--use_peft",
                    "--lora_r",
                    "16",
                    "--lora_alpha",
                    "32",
                    "--lora_dropout",
                    "0.05",
                    "--lora_target_modules",
                    "all-linear",
                    "--do_train",
                    "--do_eval",
                    "--max_steps",
                    &steps,
                    "--per_device_train_batch_size",
                    &o.batch_size.to_string(),
                    "--learning_rate",
                    "2e-4",
                    "--lr_scheduler_type",
                    "cosine",
                    "--warmup_steps",
                    &(o.steps / 10).to_string(),
                    "--logging_steps",
                    "5",
                    "--save_strategy",
                    "no",
                    "--output_dir",
                    &trained.display().to_string(),
                ],
            ]
            .concat(),
        ),
    )?;
    println!("\ndemo: 3/3 the same continuation from the adapter folder");
    let text_after = continuation(&run_generation, &root, &trained, o.length)?;
    let job_secs = t_job.elapsed().as_secs_f64();

    let loss_before = read_metric(&before, "eval_results.json", "eval_loss")?;
    let loss_after = read_metric(&trained, "eval_results.json", "eval_loss")?;
    let train_runtime = read_metric(&trained, "train_results.json", "train_runtime")?;
    let mut files: Vec<(String, u64)> = std::fs::read_dir(&trained)
        .map_err(|e| format!("reading {}: {e}", trained.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_file())
        .map(|e| {
            let size = e.metadata().map(|m| m.len()).unwrap_or(0);
            (e.file_name().to_string_lossy().into_owned(), size)
        })
        .collect();
    files.sort();

    println!(
        "\n===== demo: a {}LoRA adapter for SmolLM2-135M on hamlet.txt =====",
        if qlora { "Q" } else { "" }
    );
    println!(
        "  train: {} steps x {} rows x {} tokens in {train_runtime:.0}s (r 16 on every linear layer)",
        o.steps, o.batch_size, o.block_size
    );
    println!(
        "  eval loss (held-out 5%): {loss_before:.4} before -> {loss_after:.4} after (perplexity {:.2} -> {:.2})",
        loss_before.exp(),
        loss_after.exp()
    );
    println!("  adapter folder {}:", trained.display());
    for (name, size) in &files {
        println!("    {name:<32} {size:>12} bytes");
    }
    println!("  continuation before:\n{}", indent(&text_before));
    println!("  continuation after:\n{}", indent(&text_after));
    println!(
        "  demo job {job_secs:.0}s, {:.0}s in all with setup and build",
        t0.elapsed().as_secs_f64()
    );
    if loss_after >= loss_before {
        return Err(format!(
            "the evaluation loss did not decrease ({loss_before:.4} -> {loss_after:.4})"
        ));
    }
    let has = |n: &str| files.iter().any(|(f, _)| f == n);
    if !has("adapter_config.json") || !has("adapter_model.safetensors") || has("model.safetensors")
    {
        return Err(format!(
            "{} should hold the adapter alone (adapter_config.json, adapter_model.safetensors)",
            trained.display()
        ));
    }
    println!("demo: OK (loss decreased, the adapter saved alone and loaded back for generation)");
    Ok(())
}

pub(crate) fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("    | {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_options() {
        let o = Options::parse(&["--steps".into(), "8".into()]).unwrap();
        assert_eq!(o.steps, 8);
        assert_eq!(o.length, 40);
        assert!(Options::parse(&["--what".into()]).is_err());
    }
}

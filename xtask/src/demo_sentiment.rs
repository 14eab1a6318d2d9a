//! `cargo xtask demo` (the default job): the real MiniLM-L6 checkpoint fine-tuned as a
//! fresh / rotten sentiment classifier on the Rotten Tomatoes corpus.
//!
//! `setup`, a release build of the `run_classification` and `plot_log_history` binaries,
//! then, all on CPU and under `target/demo/`:
//!
//! 1. `train/`: `run_classification` on `rotten_tomatoes_corpus.csv.bz2` keeping the
//!    `fresh` and `rotten` rows (`--label_filter`), 10 % of them held out for evaluation by
//!    a seeded permutation (`--validation_split_percentage 10 --shuffle_seed 42`). It
//!    evaluates the new classification head before the first step (`--eval_on_start`: the
//!    accuracy before), trains with progress bars and TensorBoard logs (`runs/`),
//!    evaluates at the last step (so that `trainer_state.json` and the plot hold both
//!    evaluations) and once more after training (the accuracy after), and saves the model
//!    with its tokenizer;
//! 2. `train/loss_lr.png`: training loss and learning rate against the step, drawn from
//!    `trainer_state.json` by the `plot_log_history` example;
//! 3. `reloaded/`: the saved model loaded back and evaluated on the same held-out rows.
//!
//! It fails (non-zero exit) unless the accuracy after reaches [`MIN_ACCURACY`], rose, and
//! the reloaded model scores what the trained one did.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::demo::{json_number, positive, read_metric, run_example};
use crate::paths;
use crate::setup;

/// The accuracy the fine-tuned model must reach on the held-out rows (chance is about 0.5:
/// the two classes are nearly balanced, 2455 fresh / 2411 rotten).
pub const MIN_ACCURACY: f64 = 0.6;

/// Command-line options of the sentiment demo.
#[derive(Debug, PartialEq, Eq)]
pub struct Options {
    /// Optimizer steps.
    steps: usize,
    /// Reviews per step.
    batch_size: usize,
    /// Tokens kept per review.
    max_seq_length: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            steps: 120,
            batch_size: 16,
            max_seq_length: 64,
        }
    }
}

impl Options {
    /// Parses the demo's arguments.
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let mut o = Options::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--steps" => o.steps = positive(a, it.next())?,
                "--batch-size" => o.batch_size = positive(a, it.next())?,
                "--max-seq-length" => o.max_seq_length = positive(a, it.next())?,
                other => {
                    return Err(format!(
                        "demo: unknown option `{other}` (known: --steps N, --batch-size N, --max-seq-length N; --clm for the causal-LM demo)"
                    ));
                }
            }
        }
        Ok(o)
    }
}

/// The first `eval_accuracy` of `trainer_state.json`: its `log_history` is in step order,
/// so with `--eval_on_start` that is the evaluation before the first step.
fn accuracy_before(dir: &Path) -> Result<f64, String> {
    let path = dir.join("trainer_state.json");
    let text =
        std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    json_number(&text, "eval_accuracy")
        .ok_or_else(|| format!("no `eval_accuracy` in {}", path.display()))
}

/// The TensorBoard run folder (`runs/<date>_<host>`) under `dir`, or `runs/` itself.
fn tensorboard_dir(dir: &Path) -> PathBuf {
    let runs = dir.join("runs");
    std::fs::read_dir(&runs)
        .ok()
        .and_then(|entries| entries.flatten().map(|e| e.path()).find(|p| p.is_dir()))
        .unwrap_or(runs)
}

/// Runs setup, builds the examples and runs the job.
pub fn run(args: &[String]) -> Result<(), String> {
    let o = Options::parse(args)?;
    let t0 = Instant::now();
    let s = setup::run(&setup::Options::default())?;
    let root = paths::workspace_root();
    let examples = crate::build_examples::build_examples(
        &s,
        true,
        &["run_classification", "plot_log_history"],
        "demo",
    )?;
    let target = paths::target_dir();
    let out = target.join("demo");
    if out.exists() {
        std::fs::remove_dir_all(&out)
            .map_err(|e| format!("cannot clear {}: {e}", out.display()))?;
    }
    let model = s.assets.join("minilm").display().to_string();
    let corpus = s.assets.join("text").join("rotten_tomatoes_corpus.csv.bz2");
    // The same rows for every run: fresh / rotten only, 10 % held out by a seeded permutation.
    let data: Vec<String> = [
        "--train_file",
        &corpus.display().to_string(),
        "--text_column_names",
        "text",
        "--label_column_name",
        "category",
        "--label_filter",
        "fresh,rotten",
        "--validation_split_percentage",
        "10",
        "--shuffle_seed",
        "42",
        "--max_seq_length",
        &o.max_seq_length.to_string(),
        "--pad_to_max_length",
        "false",
        "--per_device_eval_batch_size",
        "64",
        "--use_cpu",
        "--seed",
        "42",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let with = |extra: &[&str]| -> Vec<String> {
        data.iter()
            .cloned()
            .chain(extra.iter().map(|s| s.to_string()))
            .collect()
    };

    let t_job = Instant::now();
    let trained = out.join("train");
    let steps = o.steps.to_string();
    let warmup = (o.steps / 10).to_string();
    let logging = (o.steps / 24).max(1).to_string();
    run_example(
        &examples.join("run_classification"),
        &root,
        "1/3 evaluating the new head, fine-tuning MiniLM on fresh vs rotten, evaluating again",
        &with(&[
            "--model_name_or_path",
            &model,
            "--do_train",
            "--do_eval",
            "--eval_on_start",
            "--eval_strategy",
            "steps",
            "--eval_steps",
            &steps,
            "--shuffle_train_dataset",
            "--max_steps",
            &steps,
            "--per_device_train_batch_size",
            &o.batch_size.to_string(),
            "--learning_rate",
            "1e-4",
            "--lr_scheduler_type",
            "linear",
            "--warmup_steps",
            &warmup,
            "--weight_decay",
            "0.01",
            "--logging_steps",
            &logging,
            "--save_strategy",
            "no",
            "--report_to",
            "tensorboard",
            "--output_dir",
            &trained.display().to_string(),
        ]),
    )?;
    let train_secs = t_job.elapsed().as_secs_f64();

    let plot = trained.join("loss_lr.png");
    run_example(
        &examples.join("plot_log_history"),
        &root,
        "2/3 plotting training loss and learning rate from trainer_state.json",
        &[
            trained.join("trainer_state.json").display().to_string(),
            plot.display().to_string(),
            "--title".into(),
            "MiniLM-L6 on Rotten Tomatoes: fresh vs rotten".into(),
        ],
    )?;

    let reloaded = out.join("reloaded");
    run_example(
        &examples.join("run_classification"),
        &root,
        "3/3 reloading the saved model and evaluating it on the same held-out rows",
        &with(&[
            "--model_name_or_path",
            &trained.display().to_string(),
            "--do_eval",
            "--report_to",
            "none",
            "--disable_tqdm",
            "true",
            "--output_dir",
            &reloaded.display().to_string(),
        ]),
    )?;
    let job_secs = t_job.elapsed().as_secs_f64();

    let before = accuracy_before(&trained)?;
    let after = read_metric(&trained, "eval_results.json", "eval_accuracy")?;
    let loss_after = read_metric(&trained, "eval_results.json", "eval_loss")?;
    let n_eval = read_metric(&trained, "eval_results.json", "eval_samples")?;
    let again = read_metric(&reloaded, "eval_results.json", "eval_accuracy")?;
    let loss_again = read_metric(&reloaded, "eval_results.json", "eval_loss")?;
    let train_loss = read_metric(&trained, "train_results.json", "train_loss")?;
    let train_runtime = read_metric(&trained, "train_results.json", "train_runtime")?;
    println!("\n===== demo: MiniLM-L6 fine-tuned on Rotten Tomatoes (fresh vs rotten) =====");
    println!(
        "  train: {} steps x {} reviews (<= {} tokens) in {train_runtime:.0}s, train_loss {train_loss:.4}",
        o.steps, o.batch_size, o.max_seq_length
    );
    println!(
        "  accuracy on {n_eval:.0} held-out reviews: {before:.4} before -> {after:.4} after (eval loss {loss_after:.4})"
    );
    println!("  reloaded model: accuracy {again:.4}, eval loss {loss_again:.4}");
    println!(
        "  model + tokenizer, trainer_state.json, *_results.json: {}",
        trained.display()
    );
    println!("  loss / learning-rate plot: {}", plot.display());
    println!(
        "  TensorBoard logs: {}  (tensorboard --logdir {})",
        tensorboard_dir(&trained).display(),
        trained.join("runs").display()
    );
    println!(
        "  demo job {job_secs:.0}s (training run {train_secs:.0}s), {:.0}s in all with setup and build",
        t0.elapsed().as_secs_f64()
    );
    if after < MIN_ACCURACY || after <= before {
        return Err(format!(
            "the accuracy after fine-tuning is {after:.4} (before {before:.4}); expected at least {MIN_ACCURACY} and a rise"
        ));
    }
    // Same weights, same rows and batches: the same loss up to float summation order, and at
    // most one borderline prediction flipped by it.
    if (loss_again - loss_after).abs() > 1e-4 * loss_after.abs().max(1.0)
        || (again - after).abs() > 1.0 / n_eval.max(1.0) + 1e-9
    {
        return Err(format!(
            "the reloaded model scores {again:.4} (loss {loss_again:.6}), the trained one {after:.4} (loss {loss_after:.6})"
        ));
    }
    println!(
        "demo: OK (accuracy above {MIN_ACCURACY} and up from before; the saved model reloads to the same scores)"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_options() {
        assert_eq!(Options::parse(&[]).unwrap(), Options::default());
        let o = Options::parse(&["--max-seq-length".into(), "32".into()]).unwrap();
        assert_eq!(o.max_seq_length, 32);
        assert!(Options::parse(&["--steps".into(), "0".into()]).is_err());
        assert!(Options::parse(&["--block-size".into(), "8".into()]).is_err());
    }

    #[test]
    fn first_accuracy_is_the_one_before_training() {
        let dir = std::env::temp_dir().join(format!("xtask-demo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("trainer_state.json"),
            "{\"log_history\": [{\"eval_accuracy\": 0.5, \"step\": 0}, {\"eval_accuracy\": 0.75, \"step\": 9}]}",
        )
        .unwrap();
        assert_eq!(accuracy_before(&dir), Ok(0.5));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

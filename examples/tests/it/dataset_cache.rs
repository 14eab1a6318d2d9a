//! The example scripts' use of the tokenized-dataset cache: `run_clm` and `run_ner` run
//! twice with the same data tokenize once and train / evaluate identically, and
//! `--overwrite_cache` tokenizes again. Each run is the script's binary in a child process
//! whose environment points `TCHTRAIN_DATASETS_CACHE` at a fresh folder.

use std::path::Path;

use anyhow::{Context, Result, ensure};
use tchtrain_datasets::DATASETS_CACHE_ENV;
use tchtrain_testing::{assets, temp_dir};

/// A script's command line: `flags` (`@name` is the asset `name`), then the output folder,
/// no reports, no saves, the CPU and, with `overwrite`, `--overwrite_cache`.
fn script_argv(flags: &[&str], out: &Path, overwrite: bool) -> Vec<String> {
    let mut argv: Vec<String> = flags
        .iter()
        .map(|f| match f.strip_prefix('@') {
            Some(rel) => assets().join(rel).display().to_string(),
            None => f.to_string(),
        })
        .collect();
    argv.extend(["--output_dir".into(), out.display().to_string()]);
    argv.extend(["--report_to", "none", "--save_strategy", "no", "--use_cpu"].map(String::from));
    if overwrite {
        argv.push("--overwrite_cache".into());
    }
    argv
}

/// Runs the script binary `bin` with `argv`, the dataset cache in `cache_dir`; the number
/// `key` of `{split}_results.json` in `out`.
fn run_script(
    bin: &str,
    argv: Vec<String>,
    cache_dir: &Path,
    out: &Path,
    split: &str,
    key: &str,
) -> Result<f64> {
    let status = std::process::Command::new(bin)
        .args(argv)
        .env(DATASETS_CACHE_ENV, cache_dir)
        .stdout(std::process::Stdio::null())
        .status()?;
    ensure!(status.success(), "{bin} failed: {status}");
    let path = out.join(format!("{split}_results.json"));
    let results: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    results[key]
        .as_f64()
        .with_context(|| format!("{key} in {}", path.display()))
}

/// `run_clm` on Hamlet (train only): the training loss.
fn run_clm_once(cache_dir: &Path, out: &Path, overwrite: bool) -> Result<f64> {
    let flags = [
        "--model_name_or_path",
        "@tiny-gpt2",
        "--tokenizer_name",
        "@gpt2-tokenizer",
        "--train_file",
        "@text/hamlet.txt",
        "--block_size",
        "32",
        "--do_train",
        "--max_steps",
        "3",
        "--per_device_train_batch_size",
        "2",
    ];
    let argv = script_argv(&flags, out, overwrite);
    run_script(
        env!("CARGO_BIN_EXE_run_clm"),
        argv,
        cache_dir,
        out,
        "train",
        "train_loss",
    )
}

/// `run_ner` on the reference NER files (train and evaluate): the evaluation loss.
fn run_ner_once(cache_dir: &Path, out: &Path, overwrite: bool) -> Result<f64> {
    let flags = [
        "--model_name_or_path",
        "@reference/trainer_mlm_ner/ner/initial",
        "--tokenizer_name",
        "@minilm",
        "--train_file",
        "@reference/trainer_mlm_ner/ner/train.json",
        "--validation_file",
        "@reference/trainer_mlm_ner/ner/validation.json",
        "--do_train",
        "--do_eval",
        "--max_steps",
        "2",
        "--per_device_train_batch_size",
        "4",
    ];
    let argv = script_argv(&flags, out, overwrite);
    run_script(
        env!("CARGO_BIN_EXE_run_ner"),
        argv,
        cache_dir,
        out,
        "eval",
        "eval_loss",
    )
}

/// A script run twice with the same data tokenizes once (`files` cache files, read the
/// second time, not rewritten) and gives the same number; `--overwrite_cache` tokenizes
/// again (rewriting the files) with the same number.
fn tokenizes_once(
    cache_dir: &Path,
    files: usize,
    run: impl Fn(&Path, &Path, bool) -> Result<f64>,
) -> Result<()> {
    let out = temp_dir(&format!("dataset-cache-out-{files}"));
    // A file's inode: a rewrite (written to a temporary name, renamed) makes a new one; a
    // load only marks the file used (its modification time, for the cache's LRU eviction).
    let stamps = || -> Result<Vec<u64>> {
        use std::os::unix::fs::MetadataExt;
        let mut entries: Vec<_> = std::fs::read_dir(cache_dir)?.collect::<std::io::Result<_>>()?;
        entries.sort_by_key(|e| e.file_name());
        entries.iter().map(|e| Ok(e.metadata()?.ino())).collect()
    };
    let first = run(cache_dir, &out, false)?;
    let written = stamps()?;
    assert_eq!(written.len(), files, "cache files");
    let second = run(cache_dir, &out, false)?;
    assert_eq!(first, second, "running from the cached rows is identical");
    assert_eq!(
        stamps()?,
        written,
        "the cache files were read, not rewritten"
    );
    assert_eq!(run(cache_dir, &out, true)?, first);
    let rewritten = stamps()?;
    assert!(
        rewritten.iter().zip(&written).all(|(a, b)| a != b),
        "--overwrite_cache rewrites every file"
    );
    Ok(())
}

#[test]
fn run_clm_tokenizes_once_and_trains_the_same_from_the_cache() -> Result<()> {
    let cache_dir = temp_dir("dataset-cache-clm");
    // Only --do_train: the training lines' tokens, one file.
    tokenizes_once(&cache_dir, 1, run_clm_once)
}

#[test]
fn run_ner_tokenizes_once_and_evaluates_the_same_from_the_cache() -> Result<()> {
    let cache_dir = temp_dir("dataset-cache-ner");
    // The training and the validation rows: two files.
    tokenizes_once(&cache_dir, 2, run_ner_once)
}

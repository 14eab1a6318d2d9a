//! `cargo xtask bench --datasets [--datasets-mb N]`: a large Parquet text column (hamlet.txt's
//! lines repeated to N MB of text, default 1024; row groups of 100,000 rows, snappy) read and
//! tokenised with the GPT-2 tokenizer, tchtrain (`examples/src/bin/bench_datasets.rs`: one
//! row group at a time, batches of 1000 rows on every core) against `datasets`
//! (`scripts/bench/bench_datasets.py`: `load_dataset("parquet")` then `map(batched=True)`, as
//! run_clm does). Each side in its own process, so the peak RSS (`VmHWM`) is its own; both
//! must count the same tokens. The file and `datasets`' cache are removed afterwards.

use std::path::Path;
use std::process::Command;

use super::JsonLine;
use crate::cmd;

/// One side's figures.
struct Run {
    tokens: f64,
    seconds: f64,
    tokens_per_s: f64,
    peak_rss_mb: f64,
}

fn run_one(c: &mut Command, what: &str) -> Result<Run, String> {
    let line = JsonLine::run(c, what)?;
    Ok(Run {
        tokens: line.num("tokens")?,
        seconds: line.num("seconds")?,
        tokens_per_s: line.num("tokens_per_s")?,
        peak_rss_mb: line.num("peak_rss_mb")?,
    })
}

/// Makes the file, runs both sides, prints the report.
pub fn run(
    exe: &Path,
    python: &Path,
    script: &Path,
    assets: &Path,
    work: &Path,
    threads: &str,
    mb: usize,
) -> Result<(), String> {
    let _ = std::fs::remove_dir_all(work);
    std::fs::create_dir_all(work).map_err(|e| format!("creating {}: {e}", work.display()))?;
    let file = work.join(format!("text-{mb}mb.parquet"));
    let mut make = Command::new(python);
    make.arg(script)
        .arg("--make")
        .arg(&file)
        .args(["--mb", &mb.to_string()])
        .env("TCHTRAIN_ASSETS", assets);
    cmd::output(&mut make, "making the Parquet file")?;
    let mut ours = Command::new(exe);
    ours.arg("--file")
        .arg(&file)
        .env("TCHTRAIN_ASSETS", assets)
        .env("TCHTRAIN_NUM_PROC", threads);
    let ours = run_one(&mut ours, "tchtrain")?;
    let mut theirs = Command::new(python);
    theirs
        .arg(script)
        .arg("--file")
        .arg(&file)
        .args(["--threads", threads])
        .arg("--cache_dir")
        .arg(work.join("datasets-cache"))
        .env("TCHTRAIN_ASSETS", assets)
        .env("RAYON_NUM_THREADS", threads);
    let theirs = run_one(&mut theirs, "python")?;
    let file_mb = std::fs::metadata(&file).map_or(0.0, |m| m.len() as f64 / 1048576.0);
    let _ = std::fs::remove_dir_all(work);
    println!();
    println!(
        "Parquet text column tokenised (GPT-2 BPE), {mb} MB of text ({file_mb:.0} MB file), {threads} threads:"
    );
    println!();
    println!("| impl | tokens | seconds | tokens/s | peak RSS MB |");
    println!("|---|---:|---:|---:|---:|");
    for (name, r) in [("tchtrain", &ours), ("datasets.map", &theirs)] {
        println!(
            "| {name} | {:.0} | {:.1} | {:.0} | {:.0} |",
            r.tokens, r.seconds, r.tokens_per_s, r.peak_rss_mb
        );
    }
    println!();
    println!(
        "tchtrain / datasets: {:.2}x the tokens/s, {:.2}x the peak RSS",
        ours.tokens_per_s / theirs.tokens_per_s,
        ours.peak_rss_mb / theirs.peak_rss_mb
    );
    if ours.tokens != theirs.tokens {
        return Err(format!(
            "the two sides counted different tokens ({} / {}): they did not tokenise the same rows",
            ours.tokens, theirs.tokens
        ));
    }
    Ok(())
}

//! `cargo xtask bench --datasets`: tokenising a large Parquet text column, tchtrain against
//! `datasets` (`scripts/bench/bench_datasets.py`).
//!
//! Reads `--file`'s text column (`text`, else the first: run_clm's rule) one row group at a
//! time ([`ParquetFile::iter_column`]), tokenises each row group's rows in batches of 1000
//! (run_clm's `tokenize_function` through `map(batched=True)`'s batch) with the GPT-2
//! tokenizer on every core, and counts the tokens; the token ids of a batch are dropped once
//! counted, so memory stays bounded by one row group. Prints one flat JSON line:
//! `{"bench":"datasets/parquet_tokenize","impl":"tchtrain","rows":..,"tokens":..,
//! "file_mb":..,"seconds":..,"tokens_per_s":..,"peak_rss_mb":..}` (`peak_rss_mb`: `VmHWM`).
//!
//! ```sh
//! TCHTRAIN_NUM_PROC=2 cargo run --release -p tchtrain-examples --bin bench_datasets -- --file F.parquet
//! ```
//! The tokenising threads are `TCHTRAIN_NUM_PROC`'s (default: every core).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::json;
use tchtrain_datasets::{ParquetFile, cell_text, clm_text_column, tokenize_lines};
use tchtrain_models::AutoTokenizer;

/// Rows per tokenised batch (`datasets`' default `map` batch).
const BATCH: usize = 1000;

/// Peak resident set size in MiB (`VmHWM` of /proc/self/status).
fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn main() -> Result<()> {
    let mut file = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--file" => file = args.next().map(PathBuf::from),
            other => bail!("bench_datasets: unknown argument {other} (--file F)"),
        }
    }
    let file = file.context("--file F.parquet is required")?;
    let assets =
        std::env::var_os("TCHTRAIN_ASSETS").map_or_else(|| PathBuf::from("assets"), PathBuf::from);
    let tok = AutoTokenizer::from_pretrained(assets.join("gpt2-tokenizer"))?;
    let t0 = Instant::now();
    let parquet = ParquetFile::open(&file)?;
    let column = clm_text_column(&parquet.columns(), &file)?;
    let (mut rows, mut tokens) = (0usize, 0usize);
    for chunk in parquet.iter_column(&column)? {
        let lines: Vec<String> = chunk?.iter().map(cell_text).collect();
        for batch in lines.chunks(BATCH) {
            let ids = tokenize_lines(tok.tokenizer(), batch)?;
            tokens += ids.iter().map(Vec::len).sum::<usize>();
        }
        rows += lines.len();
    }
    let seconds = t0.elapsed().as_secs_f64();
    let file_mb = std::fs::metadata(&file)?.len() as f64 / 1048576.0;
    println!(
        "{}",
        json!({
            "bench": "datasets/parquet_tokenize",
            "impl": "tchtrain",
            "rows": rows,
            "tokens": tokens,
            "file_mb": file_mb,
            "seconds": seconds,
            "tokens_per_s": tokens as f64 / seconds,
            "peak_rss_mb": peak_rss_mb(),
        })
    );
    Ok(())
}

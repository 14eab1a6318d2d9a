//! `cargo xtask bench --activation-memory`: activation checkpointing's memory and time on
//! SmolLM2-135M (block 512), tchtrain (`examples/src/bin/bench_checkpointing.rs`) against
//! upstream (`scripts/bench/bench_checkpointing.py`), each setting in its own process so that
//! the peak RSS is its own. Prints a table and each side's activation drop.
//!
//! Then Liger's fused linear + cross-entropy (`use_liger_kernel`, a 49152-token vocabulary)
//! against the plain loss, both with checkpointing, on 4 rows (2048 tokens, where the
//! `[tokens, vocab]` logits outweigh the `[vocab, hidden]` head; with one row they are about
//! the same size and the fused loss saves little). Upstream's Liger kernels need a GPU, so
//! that comparison is tchtrain's alone.

use std::path::Path;
use std::process::Command;

use super::JsonLine;

/// One run's figures.
struct Run {
    peak_rss_mb: f64,
    activation_mb: f64,
    median_step_ms: f64,
}

fn run_one(c: &mut Command, what: &str) -> Result<Run, String> {
    let line = JsonLine::run(c, what)?;
    Ok(Run {
        peak_rss_mb: line.num("peak_rss_mb")?,
        activation_mb: line.num("activation_mb")?,
        median_step_ms: line.num("median_step_ms")?,
    })
}

/// Runs both sides with and without checkpointing and prints the report.
pub fn run(
    exe: &Path,
    python: &Path,
    script: &Path,
    assets: &Path,
    threads: &str,
) -> Result<(), String> {
    let mut rows = Vec::new();
    for side in ["tchtrain", "python"] {
        let mut runs = Vec::new();
        for checkpointing in [false, true] {
            let mut c = if side == "tchtrain" {
                Command::new(exe)
            } else {
                let mut c = Command::new(python);
                c.arg(script);
                c
            };
            c.args(["--threads", threads, "--steps", "3", "--batch", "1"])
                .env("TCHTRAIN_ASSETS", assets);
            if checkpointing {
                c.arg("--activation_checkpointing");
            }
            let what = format!(
                "{side}, activation checkpointing {}",
                if checkpointing { "on" } else { "off" }
            );
            runs.push(run_one(&mut c, &what)?);
        }
        rows.push((side, runs));
    }
    println!();
    println!(
        "activation checkpointing, SmolLM2-135M, fp32, batch 1 x 512 tokens, forward + backward, {threads} threads:"
    );
    println!();
    println!(
        "| impl | checkpointing | peak RSS MB | activation MB (peak - loaded - gradients) | median step ms |"
    );
    println!("|---|---|---:|---:|---:|");
    for (side, runs) in &rows {
        for (r, on) in runs.iter().zip(["off", "on"]) {
            println!(
                "| {side} | {on} | {:.0} | {:.0} | {:.0} |",
                r.peak_rss_mb, r.activation_mb, r.median_step_ms
            );
        }
    }
    println!();
    for (side, runs) in &rows {
        let (off, on) = (&runs[0], &runs[1]);
        println!(
            "{side}: activation memory {:.0} -> {:.0} MB ({:.0}% less), step {:.0} -> {:.0} ms ({:+.0}%)",
            off.activation_mb,
            on.activation_mb,
            100.0 * (1.0 - on.activation_mb / off.activation_mb),
            off.median_step_ms,
            on.median_step_ms,
            100.0 * (on.median_step_ms / off.median_step_ms - 1.0)
        );
    }
    liger(exe, assets, threads)
}

/// Liger's fused linear + cross-entropy against the plain loss (see the module documentation).
fn liger(exe: &Path, assets: &Path, threads: &str) -> Result<(), String> {
    let mut runs = Vec::new();
    for liger in [false, true] {
        let mut c = Command::new(exe);
        c.args(["--threads", threads, "--steps", "2", "--batch", "4"])
            .arg("--activation_checkpointing")
            .env("TCHTRAIN_ASSETS", assets);
        if liger {
            c.arg("--use_liger_kernel");
        }
        let what = format!("tchtrain, batch 4, checkpointing on, use_liger_kernel {liger}");
        runs.push(run_one(&mut c, &what)?);
    }
    let (plain, fused) = (&runs[0], &runs[1]);
    println!();
    println!(
        "use_liger_kernel, SmolLM2-135M (vocabulary 49152), fp32, batch 4 x 512 tokens, activation checkpointing on, {threads} threads:"
    );
    println!();
    println!("| loss | peak RSS MB | activation MB | median step ms |");
    println!("|---|---:|---:|---:|");
    for (r, name) in [
        (plain, "plain cross-entropy"),
        (fused, "Liger fused linear + cross-entropy"),
    ] {
        println!(
            "| {name} | {:.0} | {:.0} | {:.0} |",
            r.peak_rss_mb, r.activation_mb, r.median_step_ms
        );
    }
    println!();
    println!(
        "liger: activation memory {:.0} -> {:.0} MB ({:.0}% less), step {:.0} -> {:.0} ms ({:+.0}%)",
        plain.activation_mb,
        fused.activation_mb,
        100.0 * (1.0 - fused.activation_mb / plain.activation_mb),
        plain.median_step_ms,
        fused.median_step_ms,
        100.0 * (fused.median_step_ms / plain.median_step_ms - 1.0)
    );
    Ok(())
}

//! `cargo xtask bench --activation-memory`: activation checkpointing's memory and time on
//! SmolLM2-135M (block 512), tchtrain (`examples/src/bin/bench_checkpointing.rs`) against
//! upstream (`scripts/bench/bench_checkpointing.py`), each setting in its own process so that
//! the peak RSS is its own; and tchtrain with `use_liger_kernel` (Liger's fused linear +
//! cross-entropy, a 49152-token vocabulary), which upstream cannot run without a GPU. Prints
//! a table and each setting's activation drop.

use std::path::Path;
use std::process::Command;

use super::{Value, parse_flat_json};
use crate::cmd;

/// One run's figures.
struct Run {
    peak_rss_mb: f64,
    activation_mb: f64,
    median_step_ms: f64,
}

fn run_one(c: &mut Command, what: &str) -> Result<Run, String> {
    println!("bench: {what}: {}", cmd::display(c));
    let out = cmd::output(c, what)?;
    let fields = out
        .lines()
        .rev()
        .find_map(parse_flat_json)
        .ok_or_else(|| format!("{what}: no JSON line in its output:\n{out}"))?;
    let num = |k: &str| match fields.get(k) {
        Some(Value::Num(x)) => Ok(*x),
        _ => Err(format!("{what}: no number `{k}` in its line")),
    };
    Ok(Run {
        peak_rss_mb: num("peak_rss_mb")?,
        activation_mb: num("activation_mb")?,
        median_step_ms: num("median_step_ms")?,
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
    for side in ["tchtrain", "tchtrain + liger", "python"] {
        let mut runs = Vec::new();
        for checkpointing in [false, true] {
            let mut c = if side.starts_with("tchtrain") {
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
            if side.ends_with("liger") {
                c.arg("--use_liger_kernel");
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
        if side.ends_with("liger") {
            let plain = &rows[0].1;
            for (p, l, what) in [(&plain[0], off, "off"), (&plain[1], on, "on")] {
                println!(
                    "liger fused linear + cross-entropy (checkpointing {what}): activation memory {:.0} -> {:.0} MB ({:.0}% less), step {:.0} -> {:.0} ms ({:+.0}%)",
                    p.activation_mb,
                    l.activation_mb,
                    100.0 * (1.0 - l.activation_mb / p.activation_mb),
                    p.median_step_ms,
                    l.median_step_ms,
                    100.0 * (l.median_step_ms / p.median_step_ms - 1.0)
                );
            }
            continue;
        }
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
    Ok(())
}

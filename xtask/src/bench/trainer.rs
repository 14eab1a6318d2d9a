//! `cargo xtask bench` (the default suite): our Trainer against upstream's Python Trainer on
//! the same training jobs, and against a bare tch loop doing the same work.
//!
//! `scripts/bench/bench_trainer.py --prepare` writes each job's starting weights, rows and
//! settings once into `target/bench-trainer/`; then, per round, job and precision, the Rust
//! example `examples/src/bin/bench_trainer.rs` (our Trainer, then `--bare`) and the Python
//! script (upstream's Trainer) run one after the other, in an order that rotates each
//! round, with the same intra-op thread count. A matmul probe (`--peak`) runs before the
//! first and after the last round; the best of the two is the machine's peak. Every run's
//! JSON line is kept in `target/bench-trainer/runs.jsonl`.
//!
//! With `--ranks N` (N > 1) each side runs on N processes, data-parallel over Gloo on this
//! machine: ours under `xtask launch`, upstream's under `torchrun` (`torch.distributed.run`),
//! both `--standalone`; the bare loop, which has no DDP, is left out. A run's tokens/s is
//! the sum over its ranks, its step times and peak memory the slowest / largest rank's.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use super::{load_average, machine, median};
use crate::cmd;
use crate::json::Json;

/// The jobs `bench_trainer.py` prepares, in table order.
pub const JOBS: [&str; 13] = [
    "gpt2_tiny",
    "gpt2_tiny_v1k",
    "gpt2_6x384",
    "minilm_cls",
    "qwen2_tiny",
    "qwen2_padded",
    "qwen3_moe_tiny",
    "qwen3_5_tiny",
    "smollm2_lora",
    "smollm2_qlora",
    "smollm2_qlora8",
    "smollm2_sft_packed",
    "smollm2_dpo",
];
/// The precisions: fp32, and bf16 autocast (`bf16=True`).
pub const PRECISIONS: [&str; 2] = ["fp32", "bf16"];
/// The three sides, in the first round's order.
const IMPLS: [&str; 3] = ["tchtrain", "python", "bare"];

/// One run's JSON line.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub job: String,
    pub precision: String,
    pub implementation: String,
    /// Why the run measured nothing (a configuration refused), else `None`.
    pub error: Option<String>,
    pub tokens_per_s: f64,
    /// The real (non-padding) tokens per second; NaN where the line has none.
    pub real_tokens_per_s: f64,
    pub median_step_ms: f64,
    pub min_step_ms: f64,
    pub peak_rss_mb: f64,
    pub tokens: f64,
    pub threads: f64,
    /// Achieved matmul FLOP/s (Rust runs only).
    pub matmul_flops_per_s: Option<f64>,
}

impl Run {
    pub fn from_line(line: &str) -> Option<Self> {
        let m = Json::object_line(line)?;
        let text = |k: &str| m.get(k).and_then(Json::as_str).map(str::to_string);
        let num = |k: &str| match m.get(k) {
            Some(Json::Num(x)) => Some(*x),
            _ => None,
        };
        let error = text("error");
        let measured = |k: &str| match &error {
            Some(_) => Some(f64::NAN),
            None => num(k),
        };
        Some(Self {
            job: text("job")?,
            precision: text("precision")?,
            implementation: text("impl")?,
            tokens_per_s: measured("tokens_per_s")?,
            real_tokens_per_s: measured("real_tokens_per_s").unwrap_or(f64::NAN),
            median_step_ms: measured("median_step_ms")?,
            min_step_ms: measured("min_step_ms")?,
            peak_rss_mb: measured("peak_rss_mb")?,
            tokens: measured("tokens")?,
            threads: measured("threads")?,
            matmul_flops_per_s: num("matmul_flops_per_s"),
            error,
        })
    }
}

impl Run {
    /// One run of several ranks from their lines: tokens (and FLOP/s) summed, step times and
    /// peak memory the slowest / largest rank's; an error when any rank has one.
    fn of_ranks(mut runs: Vec<Run>) -> Run {
        let mut run = runs.remove(0);
        for r in runs {
            run.error = run.error.or(r.error);
            run.tokens_per_s += r.tokens_per_s;
            run.real_tokens_per_s += r.real_tokens_per_s;
            run.tokens += r.tokens;
            run.median_step_ms = run.median_step_ms.max(r.median_step_ms);
            run.min_step_ms = run.min_step_ms.max(r.min_step_ms);
            run.peak_rss_mb = run.peak_rss_mb.max(r.peak_rss_mb);
            run.matmul_flops_per_s = match (run.matmul_flops_per_s, r.matmul_flops_per_s) {
                (Some(a), Some(b)) => Some(a + b),
                _ => None,
            };
        }
        run
    }
}

/// A line of `xtask launch`'s output without its `[rank N] ` prefix.
fn without_rank_prefix(line: &str) -> &str {
    match line
        .strip_prefix("[rank ")
        .and_then(|rest| rest.split_once("] "))
    {
        Some((rank, rest)) if rank.bytes().all(|b| b.is_ascii_digit()) => rest,
        _ => line,
    }
}

/// The matmul probe's line: (fp32, bf16) FLOP/s, NaN for a precision not probed.
fn peak_from_line(line: &str) -> Option<(f64, f64)> {
    let m = Json::object_line(line)?;
    if !m.contains_key("probe") {
        return None;
    }
    let num = |k: &str| match m.get(k) {
        Some(Json::Num(x)) => *x,
        _ => f64::NAN,
    };
    Some((num("fp32_flops_per_s"), num("bf16_flops_per_s")))
}

/// Runs one side and returns its line; a failed process becomes a run with an error, so
/// that one refused configuration does not end the whole bench.
/// The raw line is appended to `raw`.
fn run_one(
    c: &mut Command,
    job: &str,
    precision: &str,
    implementation: &str,
    ranks: usize,
    raw: &mut Vec<String>,
) -> Run {
    let t0 = Instant::now();
    let what = format!("{implementation} {job} {precision}");
    let failed = |error: String| Run {
        job: job.into(),
        precision: precision.into(),
        implementation: implementation.into(),
        error: Some(error),
        tokens_per_s: f64::NAN,
        real_tokens_per_s: f64::NAN,
        median_step_ms: f64::NAN,
        min_step_ms: f64::NAN,
        peak_rss_mb: f64::NAN,
        tokens: f64::NAN,
        threads: f64::NAN,
        matmul_flops_per_s: None,
    };
    let run = match cmd::output(c, &what) {
        Ok(stdout) => {
            // One line per rank (`[rank N] ` before it under `xtask launch`).
            let lines: Vec<&str> = stdout
                .lines()
                .map(without_rank_prefix)
                .filter(|l| Run::from_line(l).is_some())
                .collect();
            raw.extend(lines.iter().map(|l| l.trim().to_string()));
            let runs: Vec<Run> = lines.iter().filter_map(|l| Run::from_line(l)).collect();
            if runs.len() < ranks {
                failed(format!(
                    "{} result line(s) of {ranks} ranks in:\n{stdout}",
                    runs.len()
                ))
            } else {
                Run::of_ranks(runs)
            }
        }
        Err(e) => failed(e.lines().last().unwrap_or_default().to_string()),
    };
    match &run.error {
        None => println!(
            "bench: {what}: {:.0} tokens/s, median step {:.1} ms, peak RSS {:.0} MB ({:.1}s, load {})",
            run.tokens_per_s,
            run.median_step_ms,
            run.peak_rss_mb,
            t0.elapsed().as_secs_f64(),
            load_average()
        ),
        Some(e) => println!("bench: {what}: no result: {e}"),
    }
    run
}

/// Everything the table needs.
#[derive(Debug, Default)]
pub struct Results {
    /// Per (job, precision) and implementation: every round's run.
    pub runs: BTreeMap<(String, String), BTreeMap<String, Vec<Run>>>,
    /// The best (fp32, bf16) matmul FLOP/s the probe saw.
    pub peak: Option<(f64, f64)>,
}

impl Results {
    fn push(&mut self, run: Run) {
        self.runs
            .entry((run.job.clone(), run.precision.clone()))
            .or_default()
            .entry(run.implementation.clone())
            .or_default()
            .push(run);
    }
}

fn fmt(x: Option<f64>, digits: usize) -> String {
    match x {
        Some(x) if x.is_finite() => format!("{x:.digits$}"),
        _ => "—".into(),
    }
}

/// The markdown table: one row per job and precision.
pub fn table(jobs: &[String], precisions: &[String], r: &Results) -> String {
    let mut out = String::from(
        "| job | precision | tchtrain tokens/s | python tokens/s | bare tokens/s | tokens/s ratio (tchtrain/python) \
         | real tokens/s (tchtrain / python) | tchtrain step ms | python step ms | bare step ms | fastest step ms (tchtrain / python / bare) \
         | fastest-step ratio (python/tchtrain) | overhead vs bare (median / fastest step) \
         | tchtrain RSS MB | python RSS MB | bare RSS MB | matmul GFLOP/s (% of peak) |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for job in jobs {
        for precision in precisions {
            let Some(sides) = r.runs.get(&(job.clone(), precision.clone())) else {
                continue;
            };
            let ok = |implementation: &str| -> Vec<&Run> {
                sides
                    .get(implementation)
                    .map(|v| v.iter().filter(|x| x.error.is_none()).collect())
                    .unwrap_or_default()
            };
            let med = |implementation: &str, f: fn(&Run) -> f64| {
                let v: Vec<f64> = ok(implementation).into_iter().map(f).collect();
                (!v.is_empty()).then(|| median(v))
            };
            let max = |implementation: &str, f: fn(&Run) -> f64| {
                ok(implementation).into_iter().map(f).reduce(f64::max)
            };
            let min = |implementation: &str, f: fn(&Run) -> f64| {
                ok(implementation).into_iter().map(f).reduce(f64::min)
            };
            let tps = |i| med(i, |x| x.tokens_per_s);
            let real = |i| med(i, |x| x.real_tokens_per_s);
            let ms = |i| med(i, |x| x.median_step_ms);
            let rss = |i| max(i, |x| x.peak_rss_mb);
            let ratio = match (tps("tchtrain"), tps("python")) {
                (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                _ => None,
            };
            let overhead = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:+.1} %", (a / b - 1.0) * 100.0),
                _ => "—".into(),
            };
            let fastest = |i| min(i, |x| x.min_step_ms);
            let flops = ok("tchtrain")
                .into_iter()
                .filter_map(|x| x.matmul_flops_per_s)
                .collect::<Vec<_>>();
            let flops = (!flops.is_empty()).then(|| median(flops));
            let peak = r
                .peak
                .map(|(fp32, bf16)| if precision == "bf16" { bf16 } else { fp32 })
                .filter(|p| p.is_finite());
            let flops_cell = match (flops, peak) {
                (Some(f), Some(p)) => format!("{:.1} ({:.0} %)", f / 1e9, f / p * 100.0),
                (Some(f), None) => format!("{:.1}", f / 1e9),
                _ => "—".into(),
            };
            let fastest_ratio = match (fastest("python"), fastest("tchtrain")) {
                (Some(p), Some(t)) if t > 0.0 => Some(p / t),
                _ => None,
            };
            out.push_str(&format!(
                "| {job} | {precision} | {} | {} | {} | {} | {} / {} | {} | {} | {} | {} / {} / {} | {} | {} / {} | {} | {} | {} | {} |\n",
                fmt(tps("tchtrain"), 0),
                fmt(tps("python"), 0),
                fmt(tps("bare"), 0),
                fmt(ratio, 2),
                fmt(real("tchtrain"), 0),
                fmt(real("python"), 0),
                fmt(ms("tchtrain"), 1),
                fmt(ms("python"), 1),
                fmt(ms("bare"), 1),
                fmt(fastest("tchtrain"), 1),
                fmt(fastest("python"), 1),
                fmt(fastest("bare"), 1),
                fmt(fastest_ratio, 2),
                overhead(ms("tchtrain"), ms("bare")),
                overhead(fastest("tchtrain"), fastest("bare")),
                fmt(rss("tchtrain"), 0),
                fmt(rss("python"), 0),
                fmt(rss("bare"), 0),
                flops_cell,
            ));
        }
    }
    out
}

/// Runs that did not measure the same thing, and sides with no result at all.
pub fn warnings(r: &Results) -> Vec<String> {
    let mut w = Vec::new();
    for ((job, precision), sides) in &r.runs {
        let ok: Vec<&Run> = sides
            .values()
            .flatten()
            .filter(|x| x.error.is_none())
            .collect();
        if ok.windows(2).any(|p| p[0].threads != p[1].threads) {
            w.push(format!("{job} {precision}: thread counts differ"));
        }
        if ok.windows(2).any(|p| p[0].tokens != p[1].tokens) {
            let tokens: Vec<String> = ok
                .iter()
                .map(|x| format!("{} {}", x.implementation, x.tokens))
                .collect();
            w.push(format!(
                "{job} {precision}: the measured steps saw different token counts ({})",
                tokens.join(", ")
            ));
        }
        for (implementation, runs) in sides {
            if let Some(e) = runs.iter().find_map(|x| x.error.as_ref()) {
                w.push(format!("{job} {precision} {implementation}: {e}"));
            }
        }
    }
    w
}

/// What `run` needs from the caller.
pub struct Plan<'a> {
    pub exe: &'a Path,
    pub python: &'a Path,
    pub script: &'a Path,
    pub data: &'a Path,
    pub assets: &'a Path,
    pub root: &'a Path,
    pub threads: &'a str,
    pub repeat: usize,
    pub jobs: &'a [String],
    pub precisions: &'a [String],
    /// Processes per side.
    pub ranks: usize,
    /// `--device` on both sides (`cpu`, `cuda`, `cuda:N`).
    pub device: &'a str,
    /// `--zero-stage` on both sides.
    pub zero_stage: Option<usize>,
}

/// FLOP/s as GFLOP/s, or "not probed".
fn gflops(x: f64) -> String {
    if x.is_finite() {
        format!("{:.1} GFLOP/s", x / 1e9)
    } else {
        "not probed".into()
    }
}

fn probe(plan: &Plan<'_>) -> Option<(f64, f64)> {
    let mut c = Command::new(plan.exe);
    c.current_dir(plan.root)
        .args(["--peak", "--threads", plan.threads, "--device", plan.device])
        .arg("--peak-precisions")
        .arg(plan.precisions.join(","));
    let out = cmd::output(&mut c, "matmul probe").ok()?;
    let peak = out.lines().find_map(peak_from_line);
    if let Some((fp32, bf16)) = peak {
        println!(
            "bench: matmul probe: fp32 {}, bf16 {}",
            gflops(fp32),
            gflops(bf16)
        );
    }
    peak
}

/// The command of one side, before its job's arguments: the Python script, or our
/// example; on several ranks under torchrun / `xtask launch`.
fn side(plan: &Plan<'_>, implementation: &str) -> Result<Command, String> {
    let ranks = plan.ranks.to_string();
    let mut c = if implementation == "python" {
        let mut c = Command::new(plan.python);
        if plan.ranks > 1 {
            c.args([
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                &ranks,
            ]);
        }
        c.arg(plan.script);
        c
    } else if plan.ranks > 1 {
        let xtask = std::env::current_exe()
            .map_err(|e| format!("bench --ranks: where is this xtask binary? {e}"))?;
        let mut c = Command::new(xtask);
        c.args(["launch", "--standalone", "--nproc-per-node", &ranks, "--"])
            .arg(plan.exe);
        c
    } else {
        Command::new(plan.exe)
    };
    c.current_dir(plan.root);
    Ok(c)
}

/// Prepares the jobs, then runs every (round, job, precision, side).
pub fn run(plan: &Plan<'_>) -> Result<Results, String> {
    let _ = std::fs::remove_dir_all(plan.data);
    let mut prepare = Command::new(plan.python);
    prepare
        .current_dir(plan.root)
        .arg(plan.script)
        .arg("--prepare")
        .arg(plan.data)
        .env("TCHTRAIN_ASSETS", plan.assets);
    cmd::output(&mut prepare, "preparing the Trainer benchmark jobs")?;

    let mut results = Results {
        peak: probe(plan),
        ..Results::default()
    };
    let mut raw = Vec::new();
    for round in 0..plan.repeat {
        for job in plan.jobs {
            for precision in plan.precisions {
                // Rotate who goes first, so no side always runs on a machine just warmed
                // (or just loaded) by another.
                for k in 0..IMPLS.len() {
                    let implementation = IMPLS[(round + k) % IMPLS.len()];
                    if implementation == "bare" && (plan.ranks > 1 || plan.zero_stage.is_some()) {
                        continue;
                    }
                    let mut c = side(plan, implementation)?;
                    c.arg("--data")
                        .arg(plan.data)
                        .args(["--job", job, "--precision", precision])
                        .args(["--threads", plan.threads, "--device", plan.device])
                        .env("TCHTRAIN_ASSETS", plan.assets);
                    if implementation == "bare" {
                        c.arg("--bare");
                    }
                    if let Some(stage) = plan.zero_stage {
                        c.args(["--zero-stage", &stage.to_string()]);
                    }
                    print!("bench: round {}/{}: ", round + 1, plan.repeat);
                    results.push(run_one(
                        &mut c,
                        job,
                        precision,
                        implementation,
                        plan.ranks,
                        &mut raw,
                    ));
                }
            }
        }
    }
    if let Some((fp32, bf16)) = probe(plan) {
        let (f0, b0) = results.peak.unwrap_or((0.0, 0.0));
        results.peak = Some((fp32.max(f0), bf16.max(b0)));
    }
    // Every run's line, for a closer look than the table's medians.
    let runs = plan.data.join("runs.jsonl");
    match std::fs::write(&runs, raw.join("\n") + "\n") {
        Ok(()) => println!("bench: every run's line is in {}", runs.display()),
        Err(e) => println!("bench: could not write {}: {e}", runs.display()),
    }
    Ok(results)
}

/// The report around the table.
pub fn print_report(plan: &Plan<'_>, results: &Results, load_before: &str) {
    println!();
    println!(
        "Trainer vs upstream Trainer, {}, {}{} intra-op threads, median of {} round(s) \
         ({}; load average {load_before} before, {} after):",
        if plan.device == "cpu" {
            "CPU".to_string()
        } else {
            format!("device {}", plan.device)
        },
        if plan.ranks > 1 {
            format!(
                "{} ranks ({}, {}; tokens/s summed over them), ",
                plan.ranks,
                match plan.zero_stage {
                    Some(stage) => format!("DeepSpeed ZeRO-{stage}"),
                    None => "DDP".into(),
                },
                if plan.device == "cpu" { "Gloo" } else { "NCCL" }
            )
        } else {
            String::new()
        },
        plan.threads,
        plan.repeat,
        machine(),
        load_average()
    );
    if let Some((fp32, bf16)) = results.peak {
        println!(
            "matmul peak (best [N, N] x [N, N], N = 2048 on the CPU, 8192 on a GPU): fp32 {}, bf16 {}",
            gflops(fp32),
            gflops(bf16)
        );
    }
    println!();
    print!("{}", table(plan.jobs, plan.precisions, results));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(implementation: &str, tps: f64, ms: f64) -> Run {
        Run {
            job: "gpt2_tiny".into(),
            precision: "fp32".into(),
            implementation: implementation.into(),
            error: None,
            tokens_per_s: tps,
            real_tokens_per_s: tps * 0.5,
            median_step_ms: ms,
            min_step_ms: ms / 2.0,
            peak_rss_mb: 1000.0,
            tokens: 12288.0,
            threads: 2.0,
            matmul_flops_per_s: (implementation == "tchtrain").then_some(10e9),
        }
    }

    #[test]
    fn parses_both_sides_and_errors() {
        let rust = r#"{"impl":"tchtrain","job":"gpt2_tiny","matmul_flops":1e12,"matmul_flops_per_s":6.6e9,"median_step_ms":3287.1,"min_step_ms":1497.6,"peak_rss_mb":1112.05,"precision":"fp32","steps":12,"threads":2,"tokens":12288,"tokens_per_s":330.0}"#;
        let python = r#"{"job": "gpt2_tiny", "precision": "fp32", "impl": "python", "tokens_per_s": 298.5, "median_step_ms": 3207.2, "min_step_ms": 1714.9, "peak_rss_mb": 1420.6, "steps": 12, "tokens": 12288, "threads": 2}"#;
        let refused =
            r#"{"error":"bf16: not supported","impl":"bare","job":"gpt2_tiny","precision":"bf16"}"#;
        let r = Run::from_line(rust).unwrap();
        let p = Run::from_line(python).unwrap();
        assert_eq!((r.tokens, r.threads), (p.tokens, p.threads));
        assert_eq!(r.matmul_flops_per_s, Some(6.6e9));
        assert_eq!(p.matmul_flops_per_s, None);
        let e = Run::from_line(refused).unwrap();
        assert_eq!(e.error.as_deref(), Some("bf16: not supported"));
        assert!(e.tokens_per_s.is_nan());
        assert_eq!(
            peak_from_line(
                r#"{"bf16_flops_per_s":2e11,"fp32_flops_per_s":5e10,"probe":"matmul","threads":2}"#
            ),
            Some((5e10, 2e11))
        );
        assert!(Run::from_line(r#"{"bench": "optim/sgd"}"#).is_none());
    }

    #[test]
    fn ranks_lines_make_one_run() {
        let line = |rank: u32, tps: f64, ms: f64, rss: f64| {
            format!(
                r#"[rank {rank}] {{"impl":"tchtrain","job":"gpt2_6x384","matmul_flops_per_s":1e9,"median_step_ms":{ms},"min_step_ms":{ms},"peak_rss_mb":{rss},"precision":"fp32","threads":1,"tokens":4096,"tokens_per_s":{tps}}}"#
            )
        };
        let (a, b) = (line(0, 300.0, 1500.0, 900.0), line(1, 280.0, 1600.0, 850.0));
        let runs: Vec<Run> = [a.as_str(), b.as_str(), "[rank 1] loading"]
            .into_iter()
            .map(without_rank_prefix)
            .filter_map(Run::from_line)
            .collect();
        let run = Run::of_ranks(runs);
        assert_eq!(run.tokens_per_s, 580.0);
        assert_eq!(run.tokens, 8192.0);
        assert_eq!((run.median_step_ms, run.peak_rss_mb), (1600.0, 900.0));
        assert_eq!(run.matmul_flops_per_s, Some(2e9));
        assert_eq!(without_rank_prefix("[rank x] {}"), "[rank x] {}");
        assert_eq!(without_rank_prefix("{\"a\": 1}"), "{\"a\": 1}");
    }

    #[test]
    fn table_ratios_and_overhead() {
        let mut r = Results {
            peak: Some((50e9, 200e9)),
            ..Results::default()
        };
        for x in [
            run("tchtrain", 300.0, 100.0),
            run("tchtrain", 340.0, 104.0),
            run("python", 200.0, 150.0),
            run("bare", 330.0, 100.0),
        ] {
            r.push(x);
        }
        let t = table(&["gpt2_tiny".into()], &["fp32".into()], &r);
        assert!(
            t.contains(
                "| gpt2_tiny | fp32 | 320 | 200 | 330 | 1.60 | 160 / 100 | 102.0 | 150.0 | 100.0 | 50.0 / 75.0 / 50.0 | 1.50 | +2.0 % / +0.0 % | 1000 | 1000 | 1000 | 10.0 (20 %) |"
            ),
            "{t}"
        );
        assert!(warnings(&r).is_empty());
        let mut refused = run("bare", f64::NAN, f64::NAN);
        refused.precision = "bf16".into();
        refused.error = Some("no autocast".into());
        r.push(refused);
        assert_eq!(warnings(&r), ["gpt2_tiny bf16 bare: no autocast"]);
    }
}

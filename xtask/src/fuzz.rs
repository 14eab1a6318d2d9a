//! `cargo xtask fuzz`: a bounded libFuzzer run of every fuzz target under `fuzz/` (one per
//! parser of outside input). `cargo xtask test` runs the same targets without libFuzzer: the
//! replay test `fuzz/tests/it` (seeds and seeded mutations, stable, no instrumented build).
//!
//! The targets build with `cargo fuzz` on the nightly toolchain. This module installs
//! `cargo-fuzz` (a pinned version, once, into the per-user cache), builds every target in
//! one cargo invocation into a build folder in the same cache (so a fresh clone rebuilds
//! only what changed), then runs each target binary for a fixed number of inputs with a
//! fixed seed, starting from the committed seeds in `fuzz/corpus/<target>/`. New inputs
//! and crash reproducers go to `target/fuzz/`, never into the committed seeds.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Instant, SystemTime};

use crate::cmd;
use crate::disk;
use crate::paths;
use crate::setup::Setup;

/// Every fuzz target (a file `fuzz/fuzz_targets/<name>.rs` each), in run order.
pub const TARGETS: [&str; 19] = [
    "training_args_json",
    "training_args_cli",
    "trainer_state_json",
    "deepspeed_config",
    "fsdp_config",
    "config_json",
    "tokenizer_json",
    "gpt2_vocab_merges",
    "table_csv",
    "table_json",
    "data_file",
    "dataset_cache_rows",
    "adapter_config",
    "generation_config",
    "torch_pickle",
    "deepspeed_scheduler",
    "parquet",
    "image_png",
    "audio",
];

/// The environment variable capping the fuzz build folder, in MiB.
const BUILD_CAP_ENV: &str = "TCHTRAIN_FUZZ_BUILD_MB";

/// The cap on the fuzz build folder: `$TCHTRAIN_FUZZ_BUILD_MB` MiB, else 16384 MiB (a full
/// build of every target takes about 8.6 GB since the Parquet / Arrow target, which the old
/// 8192 cap cleared before every build; the stale artifacts of earlier builds are pruned
/// after each build, this bounds what pruning misses, such as other toolchains' builds).
fn build_cap() -> Result<u64, String> {
    match std::env::var(BUILD_CAP_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(16384 << 20),
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|mb| *mb < 1 << 40)
            .map(|mb| mb << 20)
            .ok_or_else(|| format!("{BUILD_CAP_ENV}=`{v}` is not a size in MiB (a whole number)")),
        Err(e) => Err(format!("{BUILD_CAP_ENV} is unreadable: {e}")),
    }
}

/// Inputs per target in a run: `cargo xtask test` and `cargo xtask fuzz` without `--runs`.
pub const DEFAULT_RUNS: u64 = 5000;

/// The cargo-fuzz release installed into the cache.
const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// Wall-clock guard per target: libFuzzer stops (cleanly) after this many seconds even
/// when fewer inputs ran; the output then says how many did.
const MAX_SECONDS_PER_TARGET: u64 = 120;

/// Command-line options of `fuzz`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Inputs per target (libFuzzer `-runs`).
    pub runs: u64,
    /// libFuzzer `-seed`: a fixed seed makes a run reproducible.
    pub seed: u64,
    /// `address` (default) or `none`.
    pub sanitizer: String,
    /// `--dev`: cargo's dev profile (the workspace's `profile.dev`)
    /// instead of release. A cold build takes a fraction of the release build's time; the
    /// inputs run slower, which a bounded run does not notice.
    pub dev: bool,
    /// The targets to run (all when empty).
    pub targets: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            runs: DEFAULT_RUNS,
            seed: 1,
            sanitizer: "address".into(),
            dev: false,
            targets: Vec::new(),
        }
    }
}

impl Options {
    /// Parses `fuzz`'s arguments.
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let mut o = Options::default();
        let mut it = args.iter();
        let number = |flag: &str, v: Option<&String>| -> Result<u64, String> {
            v.and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("fuzz: {flag} needs a non-negative integer"))
        };
        while let Some(a) = it.next() {
            match a.as_str() {
                "--runs" => o.runs = number("--runs", it.next())?,
                "--seed" => o.seed = number("--seed", it.next())?,
                "--dev" => o.dev = true,
                "--sanitizer" => {
                    o.sanitizer = it
                        .next()
                        .filter(|s| matches!(s.as_str(), "address" | "none"))
                        .ok_or("fuzz: --sanitizer needs `address` or `none`")?
                        .clone();
                }
                t if TARGETS.contains(&t) => o.targets.push(t.to_string()),
                other => {
                    return Err(format!(
                        "fuzz: unknown option or target `{other}` (options: --runs N, --seed N, \
                         --sanitizer address|none, --dev; targets: {})",
                        TARGETS.join(", ")
                    ));
                }
            }
        }
        Ok(o)
    }

    fn selected(&self) -> Vec<&str> {
        if self.targets.is_empty() {
            TARGETS.to_vec()
        } else {
            TARGETS
                .iter()
                .copied()
                .filter(|t| self.targets.iter().any(|s| s == t))
                .collect()
        }
    }
}

/// How a fuzz run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every target ran its inputs without a crash.
    Passed,
    /// Fuzzing was impossible on this machine (no nightly toolchain, cargo-fuzz could not
    /// be installed); the reason says what is missing.
    Skipped(String),
    /// Targets that crashed (or failed to build), with where the reproducer is.
    Failed(Vec<String>),
}

/// What a fuzz run did, for the summary line.
#[derive(Debug, Clone)]
pub struct Report {
    /// Inputs each target executed (seeds included), in run order.
    pub executed: Vec<(String, u64)>,
    /// The result.
    pub outcome: Outcome,
    /// Seconds spent, build included.
    pub seconds: f64,
}

impl Report {
    /// One clause for the summary line, e.g. `fuzz: 11 targets, 22000 inputs, no crash`.
    pub fn summary(&self) -> String {
        let total: u64 = self.executed.iter().map(|(_, n)| n).sum();
        match &self.outcome {
            Outcome::Passed => format!(
                "fuzz: {} target{}, {total} inputs, no crash",
                self.executed.len(),
                if self.executed.len() == 1 { "" } else { "s" }
            ),
            Outcome::Skipped(why) => format!("fuzz: skipped ({why})"),
            Outcome::Failed(which) => format!("fuzz: FAILED ({})", which.join("; ")),
        }
    }
}

/// `cargo xtask fuzz [--runs N] [--seed N] [--sanitizer address|none] [--dev] [TARGET...]`.
pub fn run(args: &[String]) -> Result<(), String> {
    let o = Options::parse(args)?;
    let s = crate::setup::run(&crate::setup::Options::default())?;
    let report = fuzz(&s, &o);
    println!("{} ({:.1}s)", report.summary(), report.seconds);
    match report.outcome {
        Outcome::Failed(_) => Err("fuzzing found a failure (see above)".into()),
        Outcome::Passed | Outcome::Skipped(_) => Ok(()),
    }
}

/// Installs what is missing, builds the targets and runs each for `o.runs` inputs.
pub fn fuzz(s: &Setup, o: &Options) -> Report {
    let t0 = Instant::now();
    let mut executed = Vec::new();
    let outcome = fuzz_inner(s, o, &mut executed);
    Report {
        executed,
        outcome,
        seconds: t0.elapsed().as_secs_f64(),
    }
}

fn fuzz_inner(s: &Setup, o: &Options, executed: &mut Vec<(String, u64)>) -> Outcome {
    let root = paths::workspace_root();
    let cache = match paths::cache_dir() {
        Ok(c) => c,
        Err(e) => return Outcome::Skipped(e),
    };
    if let Err(why) = ensure_nightly() {
        println!("fuzz: skipped: {why}");
        return Outcome::Skipped(why);
    }
    let cargo_fuzz = match ensure_cargo_fuzz(&cache) {
        Ok(p) => p,
        Err(why) => {
            println!("fuzz: skipped: {why}");
            return Outcome::Skipped(why);
        }
    };
    let target_dir = cache.join("fuzz-target");
    match build_cap() {
        Ok(cap) => {
            let size = disk::size_of(&target_dir);
            if size > cap {
                println!(
                    "fuzz: the build folder {} holds {:.1} GB, over its cap of {:.1} GB ({BUILD_CAP_ENV}): clearing it",
                    target_dir.display(),
                    size as f64 / 1e9,
                    cap as f64 / 1e9
                );
                if let Err(e) = std::fs::remove_dir_all(&target_dir) {
                    return Outcome::Failed(vec![format!(
                        "cannot clear {}: {e}",
                        target_dir.display()
                    )]);
                }
            }
        }
        Err(e) => return Outcome::Failed(vec![e]),
    }
    let t_build = Instant::now();
    let build_started = SystemTime::now();
    let mut build = nightly(&cargo_fuzz);
    build
        .current_dir(&root)
        .args(["fuzz", "build", "--fuzz-dir"])
        .arg(root.join("fuzz"))
        .args([
            "--features",
            "libfuzzer",
            "--sanitizer",
            &o.sanitizer,
            "--target-dir",
        ])
        .arg(&target_dir);
    if o.dev {
        build.arg("--dev");
    }
    if let Some(libtorch) = &s.child_libtorch {
        build.env("LIBTORCH", libtorch);
    }
    println!("fuzz: {}", cmd::display(&build));
    if let Err(e) = cmd::status(&mut build, "building the fuzz targets") {
        return Outcome::Failed(vec![e]);
    }
    println!(
        "fuzz: targets built in {:.1}s",
        t_build.elapsed().as_secs_f64()
    );
    let profile = if o.dev { "debug" } else { "release" };
    let bin_dir = target_dir.join(host_triple()).join(profile);
    let ours = |c: &str| c.starts_with("tchtrain") || TARGETS.contains(&c);
    let freed = disk::prune_stale(&bin_dir.join("deps"), &ours, build_started);
    if freed > 0 {
        println!(
            "fuzz: removed {:.1} GB of this workspace's artifacts from earlier builds",
            freed as f64 / 1e9
        );
    }
    // The targets that read files write them to a scratch folder under TMPDIR.
    let scratch = match disk::scratch_dir("fuzz") {
        Ok(d) => d,
        Err(e) => return Outcome::Failed(vec![e]),
    };
    let mut failed = Vec::new();
    for target in o.selected() {
        match run_target(&root, &bin_dir, &scratch, target, o) {
            Ok(n) => executed.push((target.to_string(), n)),
            Err(e) => {
                println!("fuzz: {target}: FAILED: {e}");
                failed.push(format!("{target}: {e}"));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    if failed.is_empty() {
        Outcome::Passed
    } else {
        Outcome::Failed(failed)
    }
}

/// Runs one target binary with `scratch` as its `TMPDIR`; returns the number of inputs it
/// executed.
fn run_target(
    root: &Path,
    bin_dir: &Path,
    scratch: &Path,
    target: &str,
    o: &Options,
) -> Result<u64, String> {
    let work = root.join("target").join("fuzz");
    let corpus = work.join("corpus").join(target);
    let artifacts = work.join("artifacts").join(target);
    for dir in [&corpus, &artifacts] {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let seeds = root.join("fuzz").join("corpus").join(target);
    let mut c = Command::new(bin_dir.join(target));
    c.current_dir(root)
        .env("TMPDIR", scratch)
        .arg(&corpus)
        .arg(&seeds)
        .arg(format!("-runs={}", o.runs))
        .arg(format!("-seed={}", o.seed))
        .arg(format!("-max_total_time={MAX_SECONDS_PER_TARGET}"))
        .arg("-timeout=60")
        .arg("-print_final_stats=1")
        .arg(format!("-artifact_prefix={}/", artifacts.display()));
    let t0 = Instant::now();
    let out = c
        .output()
        .map_err(|e| format!("could not start {}: {e}", bin_dir.join(target).display()))?;
    let log = String::from_utf8_lossy(&out.stderr);
    let n = executed_units(&log);
    if !out.status.success() {
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        for line in tail.iter().rev() {
            println!("  {line}");
        }
        let reproducer = log
            .lines()
            .find_map(|l| l.split_once("Test unit written to ").map(|(_, p)| p.trim()))
            .map_or_else(String::new, |p| {
                format!("; reproduce with `{} {p}`", bin_dir.join(target).display())
            });
        return Err(format!(
            "crashed after {} inputs ({}){reproducer}",
            n.unwrap_or(0),
            out.status
        ));
    }
    let n = n.ok_or_else(|| format!("no `number_of_executed_units` in its output:\n{log}"))?;
    let short = if n < o.runs {
        format!(" (stopped by the {MAX_SECONDS_PER_TARGET} s guard)")
    } else {
        String::new()
    };
    println!(
        "fuzz: {target}: {n} inputs in {:.1}s, no crash{short}",
        t0.elapsed().as_secs_f64()
    );
    Ok(n)
}

/// `stat::number_of_executed_units: N` from libFuzzer's final stats.
fn executed_units(log: &str) -> Option<u64> {
    log.lines().find_map(|l| {
        l.trim()
            .strip_prefix("stat::number_of_executed_units:")
            .and_then(|n| n.trim().parse().ok())
    })
}

/// A command run under the nightly toolchain through rustup, without the variables the
/// outer (stable) cargo set, so that cargo-fuzz picks nightly's cargo and rustc.
fn nightly(program: &Path) -> Command {
    let mut c = Command::new("rustup");
    c.args(["run", "nightly"]).arg(program);
    for var in [
        "RUSTUP_TOOLCHAIN",
        "CARGO",
        "RUSTC",
        "RUSTDOC",
        "RUSTC_WRAPPER",
    ] {
        c.env_remove(var);
    }
    c
}

/// Checks for a nightly toolchain (libFuzzer needs `-Z` flags), installing one with rustup
/// when it is missing.
fn ensure_nightly() -> Result<(), String> {
    let probe = || {
        cmd::output(
            Command::new("rustup").args(["run", "nightly", "rustc", "--version"]),
            "checking for a nightly toolchain",
        )
    };
    if let Ok(v) = probe() {
        println!("fuzz: nightly toolchain {}", v.trim());
        return Ok(());
    }
    println!("fuzz: no nightly toolchain; installing one with rustup (minimal profile)");
    let installed = cmd::status(
        Command::new("rustup").args(["toolchain", "install", "nightly", "--profile", "minimal"]),
        "installing the nightly toolchain",
    );
    match (installed, probe()) {
        (_, Ok(_)) => Ok(()),
        (Err(e), _) | (Ok(()), Err(e)) => Err(format!(
            "cargo fuzz needs a nightly toolchain and none could be installed ({e})"
        )),
    }
}

/// `cargo-fuzz` from the cache, installed there (once) with `cargo install --locked`.
fn ensure_cargo_fuzz(cache: &Path) -> Result<PathBuf, String> {
    let root = cache.join(format!("cargo-fuzz-{CARGO_FUZZ_VERSION}"));
    let bin = root.join("bin").join("cargo-fuzz");
    if bin.is_file() {
        return Ok(bin);
    }
    println!(
        "fuzz: installing cargo-fuzz {CARGO_FUZZ_VERSION} into {} (once, ~3 min)",
        root.display()
    );
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    cmd::status(
        Command::new(cargo)
            .args([
                "install",
                "cargo-fuzz",
                "--locked",
                "--version",
                CARGO_FUZZ_VERSION,
            ])
            .arg("--root")
            .arg(&root),
        "installing cargo-fuzz from crates.io",
    )
    .map_err(|e| format!("{e} (is crates.io reachable?)"))?;
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!("cargo install did not produce {}", bin.display()))
    }
}

/// The target triple cargo-fuzz builds for (its default: the host's).
fn host_triple() -> &'static str {
    if cfg!(all(target_arch = "x86_64", target_os = "linux")) {
        "x86_64-unknown-linux-gnu"
    } else if cfg!(all(target_arch = "aarch64", target_os = "linux")) {
        "aarch64-unknown-linux-gnu"
    } else if cfg!(all(target_arch = "aarch64", target_os = "macos")) {
        "aarch64-apple-darwin"
    } else {
        "x86_64-apple-darwin"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_target_has_a_source_file_and_seeds() {
        let root = paths::workspace_root();
        for t in TARGETS {
            let src = root.join("fuzz/fuzz_targets").join(format!("{t}.rs"));
            assert!(src.is_file(), "{} is missing", src.display());
            let seeds = root.join("fuzz/corpus").join(t);
            let n = std::fs::read_dir(&seeds).map(|d| d.count()).unwrap_or(0);
            assert!(n > 0, "{} has no seed inputs", seeds.display());
        }
        let sources = std::fs::read_dir(root.join("fuzz/fuzz_targets"))
            .unwrap()
            .count();
        assert_eq!(
            sources,
            TARGETS.len(),
            "a fuzz target is missing from TARGETS"
        );
    }

    #[test]
    fn parses_options_and_reads_libfuzzer_stats() {
        let args: Vec<String> = ["--runs", "50", "table_csv", "config_json"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let o = Options::parse(&args).unwrap();
        assert_eq!(o.runs, 50);
        assert!(!o.dev);
        assert_eq!(o.selected(), ["config_json", "table_csv"]);
        assert!(Options::parse(&["--dev".to_string()]).unwrap().dev);
        assert!(Options::parse(&["nope".to_string()]).is_err());
        let log = "Done 2000 runs in 1 second(s)\nstat::number_of_executed_units: 2003\n";
        assert_eq!(executed_units(log), Some(2003));
    }
}

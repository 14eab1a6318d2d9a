//! `cargo xtask test`: setup, then every test of the workspace (the fuzz targets' replay of
//! their seeds and of inputs made from them among them, `fuzz/tests/it`), then the short
//! form of the end-to-end parity suite (`cargo xtask e2e --short`), then one summary line.
//! Coverage-guided fuzzing under libFuzzer is `cargo xtask fuzz` (a nightly build of its own,
//! ~12 min on 2 cores, so not part of this command).

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

use crate::cmd;
use crate::cmd::cargo;
use crate::disk;
use crate::e2e;
use crate::setup;
use crate::test_jobs;

/// The intra-op threads of the reference values (`REFERENCE_THREADS` in
/// scripts/setup_assets.py).
pub(crate) const REFERENCE_THREADS: &str = "2";

/// libgomp's wait policy for the tests, the reference scripts (`reference_env` in
/// scripts/setup_assets.py) and the e2e sides: idle OpenMP threads sleep instead of spinning,
/// since each shares the cores with other jobs.
pub(crate) const OMP_WAIT_POLICY: &str = "PASSIVE";

/// Counts read from cargo test's `test result:` lines.
#[derive(Debug, Default, PartialEq, Eq)]
struct Totals {
    passed: u64,
    failed: u64,
    ignored: u64,
}

impl Totals {
    /// Adds one `test result: ok. 3 passed; 0 failed; 1 ignored; ...` line.
    fn add_line(&mut self, line: &str) {
        let Some(rest) = line.trim().strip_prefix("test result: ") else {
            return;
        };
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(label), Some(count)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = count.parse::<u64>() else {
                continue;
            };
            match label {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                _ => {}
            }
        }
    }
}

/// Runs setup and the test suite; extra arguments go to `cargo test`. `--gpu` also runs
/// the tests that need a CUDA device (ignored otherwise).
pub fn run(args: &[String]) -> Result<(), String> {
    let t0 = Instant::now();
    let (s, references, warm) =
        setup::run_deferring_references(&setup::Options::with_warm_build())?;
    // The assets and reference values are made while cargo builds the tests, which need
    // only libtorch; the tests wait for them.
    let references = std::thread::spawn(move || references.generate());
    if let Some(warm) = warm {
        warm.finish()?;
    }
    let mut references = Some(references);
    let mut wait_for_references = move || -> Result<(), String> {
        match references.take() {
            Some(handle) => handle
                .join()
                .map_err(|_| "the reference values' thread panicked".to_string())?,
            None => Ok(()),
        }
    };
    let gpu = args.iter().any(|a| a == "--gpu");
    let args: Vec<&String> = args.iter().filter(|a| *a != "--gpu").collect();
    let extra: Vec<&String> = match args.first().map(|a| a.as_str()) {
        Some("--") => args[1..].to_vec(),
        _ => args,
    };
    println!("test: libtorch {}", s.libtorch.display());
    // A generated file that no longer matches its generator fails the run up front.
    crate::codegen::check_or_write(&s.python, true)?;
    let root = crate::paths::workspace_root();
    if let Some(warning) = disk::low_space_warning(&root, disk::TEST_NEEDS_BYTES) {
        println!("test: warning: {warning}");
    }
    // The tests' checkpoints and scratch files (and the compilers' temporary files) go here,
    // not to /tmp, and are removed when the run passes.
    let tmp = disk::scratch_dir("test")?;
    let mut totals = Totals::default();
    // Extra arguments go to one plain `cargo test`; without them the test binaries run side
    // by side (test_jobs.rs).
    if gpu && !extra.is_empty() {
        return Err(
            "--gpu with cargo test's arguments: pass `-- --include-ignored` among them instead"
                .into(),
        );
    }
    let features = cuda_features(&s, gpu)?;
    let workspace = if extra.is_empty() {
        workspace_tests(
            &s,
            &tmp,
            &features,
            gpu,
            &mut totals,
            &mut wait_for_references,
        )?
    } else {
        wait_for_references()?;
        let mut args = vec!["--workspace"];
        args.extend(features.iter().map(String::as_str));
        cargo_test(&s, &tmp, &args, &extra, &mut totals)?
    };
    wait_for_references()?;
    let parity = e2e_step(&s)?;
    let passed = workspace && totals.failed == 0;
    if passed {
        let _ = std::fs::remove_dir_all(&tmp);
    } else {
        println!(
            "test: the failed run's temporary files are kept in {}",
            tmp.display()
        );
    }
    println!(
        "xtask test finished in {:.1}s (setup included)",
        t0.elapsed().as_secs_f64()
    );
    println!(
        "summary: {} passed, {} failed, {} skipped; {}",
        totals.passed,
        totals.failed,
        totals.ignored,
        parity.as_ref().map_or_else(
            || "e2e: skipped (TCHTRAIN_E2E=0)".into(),
            e2e::Report::summary
        )
    );
    if !passed {
        Err("cargo test failed (see the `test result:` lines above)".into())
    } else if parity.as_ref().is_some_and(|r| !r.passed()) {
        Err("the e2e parity suite failed (see the `e2e` tables above; rerun with `cargo xtask e2e --short`)".into())
    } else {
        Ok(())
    }
}

/// The environment of the tests: the setup's assets and virtualenv, `tmp` as `TMPDIR`.
fn test_env(s: &setup::Setup, tmp: &Path) -> Vec<(String, OsString)> {
    let mut env = vec![
        (
            "TCHTRAIN_ASSETS".to_string(),
            s.assets.clone().into_os_string(),
        ),
        (
            "TCHTRAIN_VENV_PYTHON".to_string(),
            s.python.clone().into_os_string(),
        ),
        ("TMPDIR".to_string(), tmp.as_os_str().to_owned()),
        // The reference values were generated with this many intra-op threads
        // (scripts/setup_assets.py, REFERENCE_THREADS): some libtorch kernels split their sums
        // by thread, so the Rust side runs with the same (MKL follows OpenMP's count).
        // Relaunched ranks set their own.
        ("OMP_NUM_THREADS".to_string(), REFERENCE_THREADS.into()),
        // Two jobs of two OpenMP threads share 2 cores (and on a fresh machine share them with
        // the build and the reference scripts): libgomp's default is to spin ~300,000 times at
        // each barrier before sleeping, which there burns the core the awaited thread needs.
        // Passive waiting changes no number (only how an idle thread waits); two copies of a
        // Trainer shard side by side took 83 s with the default and 41 s with it.
        ("OMP_WAIT_POLICY".to_string(), OMP_WAIT_POLICY.into()),
    ];
    // The examples' multi-process tests run the scripts under `xtask launch`.
    if let Ok(exe) = std::env::current_exe() {
        env.push(("TCHTRAIN_XTASK".to_string(), exe.into_os_string()));
    }
    if let Some(libtorch) = &s.child_libtorch {
        env.push(("LIBTORCH".to_string(), libtorch.clone().into_os_string()));
    }
    env
}

/// The `cargo` options that compile every crate's `cuda` feature (ProcessGroupNCCL in
/// tchtrain-sys, the Trainer's GPU paths) when the libtorch has CUDA: the workspace's one
/// test build then compiles and links them, and its tests (the NCCL ones ignored without a
/// device) run on the CPU with that build. With a CPU-only libtorch, none (a line says so),
/// and `--gpu` is refused.
fn cuda_features(s: &setup::Setup, gpu: bool) -> Result<Vec<String>, String> {
    let lib = s.libtorch.join("lib");
    if lib.join("libtorch_cuda.so").exists() {
        return Ok(vec!["--features".into(), "tchtrain/cuda".into()]);
    }
    if gpu {
        return Err(format!(
            "--gpu: {} has no libtorch_cuda.so (a CPU-only libtorch); run `cargo xtask setup` \
             for the CUDA wheel, or pass --libtorch a CUDA build",
            lib.display()
        ));
    }
    println!(
        "test: the `cuda` features are not compiled: {} has no libtorch_cuda.so (a CPU-only libtorch)",
        lib.display()
    );
    Ok(Vec::new())
}

/// Every test of the workspace: the test binaries built by `cargo test --no-run` (with
/// `features`), then (after `before_running`: the reference values) run side by side with
/// the doc tests ([`test_jobs`]), the longest binaries in shards, each job's output printed
/// when it ends and its `test result:` lines added to `totals`; whether all built and
/// passed. `gpu` runs the ignored tests too (every one needs a CUDA device).
fn workspace_tests(
    s: &setup::Setup,
    tmp: &Path,
    features: &[String],
    gpu: bool,
    totals: &mut Totals,
    before_running: &mut dyn FnMut() -> Result<(), String>,
) -> Result<bool, String> {
    let env = test_env(s, tmp);
    let mut build = cargo();
    build
        .args([
            "test",
            "--workspace",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .args(features)
        .envs(env.iter().cloned())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    println!("test: {}", cmd::display(&build));
    let t0 = Instant::now();
    let out = build
        .output()
        .map_err(|e| format!("could not start cargo test --no-run: {e}"))?;
    if !out.status.success() {
        println!("test: building the tests failed ({})", out.status);
        return Ok(false);
    }
    before_running()?;
    let binaries = test_jobs::test_binaries(&String::from_utf8_lossy(&out.stdout));
    println!(
        "test: {} test binaries built in {:.1}s",
        binaries.len(),
        t0.elapsed().as_secs_f64()
    );
    let slots = test_jobs::slots()?;
    // Each test's time in its result line (`test x ... ok <12.345s>`): libtest's
    // `--report-time`, unstable, so enabled for the test binaries alone with
    // RUSTC_BOOTSTRAP (libtest reads it when it parses its options); the slowest are listed
    // at the end, the figures a fresh machine's test time is cut by.
    let mut args = vec!["-Z", "unstable-options", "--report-time"];
    if gpu {
        args.push("--include-ignored");
    }
    let mut timed_env = env.clone();
    timed_env.push(("RUSTC_BOOTSTRAP".to_string(), "1".into()));
    let mut jobs = Vec::new();
    for binary in &binaries {
        jobs.extend(test_jobs::Job::for_binary(
            binary, &timed_env, &args, slots,
        )?);
    }
    let mut doc = cargo();
    doc.args(["test", "--workspace", "--doc", "--no-fail-fast"])
        .args(features)
        .envs(env.iter().cloned());
    jobs.push(test_jobs::Job {
        label: "doc tests".into(),
        command: doc,
        weight: 120,
    });
    println!("test: {} jobs, {slots} at a time", jobs.len());
    let mut ok = true;
    let mut timed = Vec::new();
    test_jobs::run(jobs, slots, tmp, |f| {
        print!("{}", f.output);
        for line in f.output.lines() {
            totals.add_line(line);
            if let Some((name, seconds)) = test_time(line) {
                timed.push((seconds, format!("{} {name}", f.label)));
            }
        }
        match f.status {
            Ok(status) if status.success() => {}
            Ok(status) => {
                println!("test: {} FAILED ({status})", f.label);
                ok = false;
            }
            Err(e) => {
                println!("test: {} FAILED: {e}", f.label);
                ok = false;
            }
        }
    })?;
    timed.sort_by(|a, b| b.0.total_cmp(&a.0));
    println!(
        "test: the {} slowest of {} timed tests ({:.0}s in all):",
        timed.len().min(SLOWEST_SHOWN),
        timed.len(),
        timed.iter().map(|t| t.0).sum::<f64>()
    );
    for (seconds, name) in timed.iter().take(SLOWEST_SHOWN) {
        println!("test:   {seconds:7.1}s {name}");
    }
    Ok(ok)
}

/// How many of the slowest tests the run lists at its end.
const SLOWEST_SHOWN: usize = 25;

/// A test's name and seconds in a `--report-time` result line
/// (`test a::b ... ok <12.345s>`).
fn test_time(line: &str) -> Option<(&str, f64)> {
    let rest = line.strip_prefix("test ")?;
    let (name, result) = rest.split_once(" ... ")?;
    let time = result.trim_end().strip_suffix("s>")?.rsplit_once('<')?.1;
    Some((name, time.parse().ok()?))
}

/// `cargo test --no-fail-fast {args} {extra}` with the setup's environment and `tmp` as
/// `TMPDIR`, its output echoed and its `test result:` lines added to `totals`; whether it
/// succeeded.
fn cargo_test(
    s: &setup::Setup,
    tmp: &Path,
    args: &[&str],
    extra: &[&String],
    totals: &mut Totals,
) -> Result<bool, String> {
    let mut c = cargo();
    c.args(["test", "--no-fail-fast"])
        .args(args)
        .args(extra)
        .envs(test_env(s, tmp))
        .stdout(Stdio::piped());
    println!("test: {}", cmd::display(&c));
    let mut child = c
        .spawn()
        .map_err(|e| format!("could not start cargo test: {e}"))?;
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines() {
            let line = line.map_err(|e| format!("reading cargo test output: {e}"))?;
            println!("{line}");
            totals.add_line(&line);
        }
    }
    let status = child
        .wait()
        .map_err(|e| format!("waiting for cargo test: {e}"))?;
    Ok(status.success())
}

/// The short form of `cargo xtask e2e` on the example binaries `cargo test` just built
/// (nothing to build); `None` when `TCHTRAIN_E2E=0` skips it.
fn e2e_step(s: &setup::Setup) -> Result<Option<e2e::Report>, String> {
    match std::env::var("TCHTRAIN_E2E").as_deref() {
        Ok("0") => return Ok(None),
        Ok("1") | Err(_) => {}
        Ok(other) => {
            return Err(format!(
                "TCHTRAIN_E2E={other}: expected 0 (skip the e2e short form) or 1"
            ));
        }
    }
    println!("test: the e2e parity suite, short form (cargo xtask e2e --short)");
    let report = e2e::short_step(s);
    println!(
        "test: e2e took {:.1}s; {}",
        report.seconds,
        report.summary()
    );
    Ok(Some(report))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_report_time_lines() {
        assert_eq!(
            test_time("test a::b_c ... ok <12.345s>"),
            Some(("a::b_c", 12.345))
        );
        assert_eq!(test_time("test x ... FAILED <0.500s>"), Some(("x", 0.5)));
        assert_eq!(test_time("test x ... ok"), None);
        assert_eq!(test_time("test result: ok. 3 passed"), None);
    }

    #[test]
    fn sums_cargo_test_result_lines() {
        let mut t = Totals::default();
        t.add_line("test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.00s");
        t.add_line(
            "test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out",
        );
        t.add_line("running 3 tests");
        assert_eq!(
            t,
            Totals {
                passed: 5,
                failed: 1,
                ignored: 1
            }
        );
    }
}

//! The workspace's test binaries run side by side: `cargo test` runs one binary after the
//! other, and the Trainer's (the longest, ~8 min one test at a time) leaves about half the CPU idle
//! while its tests wait on each other (one global-generator lock) and on their ranks. So
//! `cargo xtask test` builds every test binary first (`cargo test --no-run`), then runs them
//! in `TCHTRAIN_TEST_JOBS` slots (default 2, at most the cores), the longest first, with the
//! doc tests as one more job. The longest binaries run as shards of about a minute each
//! (separate processes, each with its own generator and lock). Each binary runs as `cargo test` runs
//! it (its package's folder as the working directory, the same environment); its output is
//! printed whole when it ends, with its time.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::json::Json;

/// One test binary `cargo test --no-run` built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TestBinary {
    /// Its package (`tchtrain-trainer`).
    pub package: String,
    /// Its target: `it`, or the package's own name for the unit tests of the library.
    pub target: String,
    /// The executable.
    pub exe: PathBuf,
    /// Its package's folder (cargo test's working directory for it).
    pub dir: PathBuf,
}

/// The test binaries among cargo's `--message-format=json` lines (the artifacts built with
/// the test profile that have an executable).
pub(crate) fn test_binaries(json_lines: &str) -> Vec<TestBinary> {
    json_lines
        .lines()
        .filter_map(|line| Json::parse(line.trim()).ok())
        .filter(|m| m.get("reason").and_then(Json::as_str) == Some("compiler-artifact"))
        .filter(|m| {
            matches!(
                m.get("profile").and_then(|p| p.get("test")),
                Some(Json::Bool(true))
            )
        })
        .filter_map(|m| {
            let exe = m.get("executable").and_then(Json::as_str)?;
            let manifest = m.get("manifest_path").and_then(Json::as_str)?;
            let target = m
                .get("target")
                .and_then(|t| t.get("name"))
                .and_then(Json::as_str)?;
            let id = m.get("package_id").and_then(Json::as_str)?;
            Some(TestBinary {
                package: package_name(id),
                target: target.to_string(),
                exe: PathBuf::from(exe),
                dir: Path::new(manifest).parent()?.to_path_buf(),
            })
        })
        .collect()
}

/// The name in a package id: `path+file:///w/trainer#tchtrain-trainer@0.1.0` (cargo ≥ 1.77;
/// `path+file:///w/xtask#0.1.0` when the name is the folder's) or
/// `tchtrain-trainer 0.1.0 (path+file:///w/trainer)`.
fn package_name(id: &str) -> String {
    match id.split_once('#') {
        Some((url, rest)) => match rest.split_once('@') {
            Some((name, _)) => name.to_string(),
            None => url.rsplit('/').next().unwrap_or(rest).to_string(),
        },
        None => id.split(' ').next().unwrap_or(id).to_string(),
    }
}

/// Seconds a package's integration tests (`it`) take on 2 cores when run alone (the
/// trainer's ~400 s one test at a time, the models' ~450 s, the examples' ~230 s, the
/// optimizers' ~90 s when last measured; TRL's ~26 s since its references' tiny models have
/// a 1024-token vocabulary), so that the longest start first; the
/// others, and every library's unit tests, take well under a minute.
fn expected_seconds(package: &str, target: &str) -> u64 {
    match (package, target) {
        ("tchtrain-trainer", "it") => 400,
        ("tchtrain-models", "it") => 450,
        ("tchtrain-examples", "it") => 230,
        ("tchtrain-optim", "it") => 90,
        _ => 30,
    }
}

/// A binary expected to run at least this long is split into shards, one process each.
/// Its tests serialise on one lock per process (libtorch's global generator,
/// `tchtrain_testing::lock`) and wait on their ranks, so one process leaves about half of
/// 2 cores idle; shards in separate processes have a generator each.
const SHARD_ABOVE_SECONDS: u64 = 200;

/// About this many expected seconds of tests per shard: short shards let the pool even out
/// the long ones (round-robin shards of the Trainer's tests took 232 s to 773 s side by
/// side when they were four). A shard's process start costs about a second.
const SECONDS_PER_SHARD: u64 = 60;

/// One job: a label and the command it runs.
pub(crate) struct Job {
    /// What the output calls it (`tchtrain-trainer it`, `doc tests`).
    pub label: String,
    /// The command.
    pub command: Command,
    /// Its expected length in seconds (the order jobs start in).
    pub weight: u64,
}

impl Job {
    /// The jobs running `binary` with `env` and `args` (libtest's options) in its package's
    /// folder: one, or for a binary expected to run longer than [`SHARD_ABOVE_SECONDS`]
    /// one shard per [`SECONDS_PER_SHARD`] (at least twice `slots`, at most one per test),
    /// each running every n-th of its tests (`--exact` names, in libtest's order so that
    /// each module's tests spread over the shards).
    pub(crate) fn for_binary(
        binary: &TestBinary,
        env: &[(String, std::ffi::OsString)],
        args: &[&str],
        slots: usize,
    ) -> Result<Vec<Self>, String> {
        let label = format!("{} {}", binary.package, binary.target);
        let weight = expected_seconds(&binary.package, &binary.target);
        let command = || {
            let mut command = Command::new(&binary.exe);
            command.current_dir(&binary.dir);
            command.envs(env.iter().map(|(k, v)| (k, v)));
            command.args(args);
            command
        };
        if slots < 2 || weight < SHARD_ABOVE_SECONDS {
            return Ok(vec![Self {
                label,
                command: command(),
                weight,
            }]);
        }
        let listing = crate::cmd::output(
            command().args(["--list", "--format", "terse"]),
            &format!("listing the tests of {label}"),
        )?;
        let names = listed_tests(&listing);
        let shards = (2 * slots)
            .max(weight.div_ceil(SECONDS_PER_SHARD) as usize)
            .min(names.len().max(1));
        Ok((0..shards)
            .map(|i| {
                let mut c = command();
                c.arg("--exact").args(names.iter().skip(i).step_by(shards));
                Self {
                    label: format!("{label} (shard {}/{shards})", i + 1),
                    command: c,
                    weight: weight / shards as u64,
                }
            })
            .collect())
    }
}

/// The test names in libtest's `--list --format terse` output (`module::name: test`
/// lines; benchmarks and the summary line left out).
fn listed_tests(listing: &str) -> Vec<&str> {
    listing
        .lines()
        .filter_map(|line| line.strip_suffix(": test"))
        .collect()
}

/// How one job ended.
pub(crate) struct Finished {
    /// Its label.
    pub label: String,
    /// Its exit status, or why it could not start.
    pub status: Result<ExitStatus, String>,
    /// Its stdout and stderr, interleaved as written.
    pub output: String,
    /// How long it ran.
    pub elapsed: Duration,
}

/// The number of jobs run at once: `TCHTRAIN_TEST_JOBS`, else 2 (at most the cores).
pub(crate) fn slots() -> Result<usize, String> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    match std::env::var("TCHTRAIN_TEST_JOBS") {
        Err(_) => Ok(cores.min(2)),
        Ok(v) => v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| format!("TCHTRAIN_TEST_JOBS=`{v}`: expected a number of jobs >= 1")),
    }
}

/// Runs `jobs` in `slots` slots, the heaviest first; `done` sees each as it ends (on the
/// calling thread). Each job's output goes to a file in `scratch` until it ends.
pub(crate) fn run(
    mut jobs: Vec<Job>,
    slots: usize,
    scratch: &Path,
    mut done: impl FnMut(Finished),
) -> Result<(), String> {
    jobs.sort_by_key(|j| std::cmp::Reverse(j.weight));
    let total = jobs.len();
    let queue = Arc::new(Mutex::new(
        jobs.into_iter().enumerate().collect::<VecDeque<_>>(),
    ));
    let (tx, rx) = mpsc::channel();
    let mut workers = Vec::new();
    for _ in 0..slots.max(1) {
        let (queue, tx, scratch) = (Arc::clone(&queue), tx.clone(), scratch.to_path_buf());
        workers.push(std::thread::spawn(move || {
            loop {
                let next = queue.lock().map(|mut q| q.pop_front()).unwrap_or(None);
                let Some((index, job)) = next else { break };
                if tx.send(run_one(index, job, &scratch)).is_err() {
                    break;
                }
            }
        }));
    }
    drop(tx);
    for (n, finished) in rx.iter().enumerate() {
        println!(
            "test: [{}/{total}] {} finished in {:.1}s",
            n + 1,
            finished.label,
            finished.elapsed.as_secs_f64()
        );
        done(finished);
    }
    for w in workers {
        w.join()
            .map_err(|_| "a test job thread panicked".to_string())?;
    }
    Ok(())
}

/// Runs one job with its output in `scratch/job-<index>.log`.
fn run_one(index: usize, mut job: Job, scratch: &Path) -> Finished {
    let t0 = Instant::now();
    let log = scratch.join(format!("job-{index}.log"));
    println!("test: started {}", job.label);
    let status = std::fs::File::create(&log)
        .and_then(|f| Ok((f.try_clone()?, f)))
        .map_err(|e| format!("cannot create {}: {e}", log.display()))
        .and_then(|(out, err)| {
            job.command
                .stdin(Stdio::null())
                .stdout(Stdio::from(out))
                .stderr(Stdio::from(err))
                .status()
                .map_err(|e| format!("could not start {}: {e}", job.label))
        });
    let output = std::fs::read(&log)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    Finished {
        label: job.label,
        status,
        output,
        elapsed: t0.elapsed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_test_binaries_of_cargos_json() {
        let lines = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/trainer#tchtrain-trainer@0.1.0","manifest_path":"/w/trainer/Cargo.toml","target":{"kind":["test"],"name":"it"},"profile":{"test":true},"executable":"/w/target/debug/deps/it-1"}
{"reason":"compiler-artifact","package_id":"path+file:///w/trainer#tchtrain-trainer@0.1.0","manifest_path":"/w/trainer/Cargo.toml","target":{"kind":["lib"],"name":"tchtrain_trainer"},"profile":{"test":false},"executable":null}
{"reason":"compiler-artifact","package_id":"tchtrain-models 0.1.0 (path+file:///w/models)","manifest_path":"/w/models/Cargo.toml","target":{"kind":["lib"],"name":"tchtrain_models"},"profile":{"test":true},"executable":"/w/target/debug/deps/tchtrain_models-2"}
{"reason":"build-finished","success":true}
warning: not json"#;
        assert_eq!(
            test_binaries(lines),
            vec![
                TestBinary {
                    package: "tchtrain-trainer".into(),
                    target: "it".into(),
                    exe: "/w/target/debug/deps/it-1".into(),
                    dir: "/w/trainer".into(),
                },
                TestBinary {
                    package: "tchtrain-models".into(),
                    target: "tchtrain_models".into(),
                    exe: "/w/target/debug/deps/tchtrain_models-2".into(),
                    dir: "/w/models".into(),
                },
            ]
        );
    }

    #[test]
    fn reads_package_names_from_ids() {
        assert_eq!(
            package_name("path+file:///w/trainer#tchtrain-trainer@0.1.0"),
            "tchtrain-trainer"
        );
        assert_eq!(package_name("path+file:///w/xtask#0.1.0"), "xtask");
        assert_eq!(
            package_name("tchtrain-models 0.1.0 (path+file:///w/models)"),
            "tchtrain-models"
        );
    }

    #[test]
    fn shards_a_long_binary_by_its_listed_tests() {
        let scratch = std::env::temp_dir().join(format!("xtask-shards-{}", std::process::id()));
        std::fs::create_dir_all(&scratch).unwrap();
        let exe = scratch.join("it.sh");
        std::fs::write(
            &exe,
            "#!/bin/sh\n[ \"$X\" = 1 ] || exit 9\nprintf 'a::one: test\\na::two: test\\nb::three: test\\nb::bench: bench\\n\\n3 tests, 1 benchmark\\n'\n",
        )
        .unwrap();
        std::process::Command::new("chmod")
            .args(["+x", exe.to_str().unwrap()])
            .status()
            .unwrap();
        let binary = |package: &str| TestBinary {
            package: package.into(),
            target: "it".into(),
            exe: exe.clone(),
            dir: scratch.clone(),
        };
        let env = [("X".to_string(), "1".into())];
        let args = |job: &Job| -> Vec<String> {
            job.command
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        };
        let jobs =
            Job::for_binary(&binary("tchtrain-trainer"), &env, &["--include-ignored"], 2).unwrap();
        // One shard per minute expected (400 s: 7), at most one per test.
        assert_eq!(jobs.len(), 3);
        assert_eq!(jobs[0].label, "tchtrain-trainer it (shard 1/3)");
        assert_eq!(jobs[0].weight, 133);
        assert_eq!(args(&jobs[0]), ["--include-ignored", "--exact", "a::one"]);
        assert_eq!(args(&jobs[1]), ["--include-ignored", "--exact", "a::two"]);
        assert_eq!(args(&jobs[2]), ["--include-ignored", "--exact", "b::three"]);
        // A short binary, or one slot: one job with every test.
        let jobs = Job::for_binary(&binary("tchtrain-losses"), &env, &[], 2).unwrap();
        assert_eq!(jobs.len(), 1);
        assert!(args(&jobs[0]).is_empty());
        assert_eq!(
            Job::for_binary(&binary("tchtrain-trainer"), &env, &[], 1)
                .unwrap()
                .len(),
            1
        );
        // A listing that fails names the binary.
        let err = Job::for_binary(&binary("tchtrain-trainer"), &[], &[], 2)
            .err()
            .unwrap();
        assert!(
            err.contains("listing the tests of tchtrain-trainer it") && err.contains("failed"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&scratch);
    }

    #[test]
    fn runs_every_job_in_slots_the_heaviest_first() {
        let scratch = std::env::temp_dir().join(format!("xtask-test-jobs-{}", std::process::id()));
        std::fs::create_dir_all(&scratch).unwrap();
        let job = |label: &str, weight: u64, script: &str| {
            let mut command = Command::new("sh");
            command.args(["-c", script]);
            Job {
                label: label.into(),
                command,
                weight,
            }
        };
        let jobs = vec![
            job("light", 1, "echo light; exit 3"),
            job("heavy", 9, "sleep 0.3; echo heavy; echo err >&2"),
            job("middle", 5, "echo middle"),
        ];
        let mut seen = Vec::new();
        run(jobs, 1, &scratch, |f| {
            seen.push((f.label, f.status.unwrap().code(), f.output));
        })
        .unwrap();
        assert_eq!(
            seen,
            vec![
                ("heavy".to_string(), Some(0), "heavy\nerr\n".to_string()),
                ("middle".to_string(), Some(0), "middle\n".to_string()),
                ("light".to_string(), Some(3), "light\n".to_string()),
            ]
        );
        let mut labels = Vec::new();
        let jobs = (0..5)
            .map(|i| job(&format!("j{i}"), 1, "sleep 0.1"))
            .collect();
        run(jobs, 3, &scratch, |f| labels.push(f.label)).unwrap();
        labels.sort();
        assert_eq!(labels, ["j0", "j1", "j2", "j3", "j4"]);
        let _ = std::fs::remove_dir_all(&scratch);
    }
}

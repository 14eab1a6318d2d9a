//! `cargo xtask soak [--kills N] [--seed S]`: the crash test of the Trainer's checkpoints at
//! length. It runs `trainer/tests/it/crash_save.rs` (a training run saving at every step,
//! killed with SIGKILL at seeded random moments, each relaunch resuming from the newest
//! checkpoint, then the chain resumed to a fixed step and compared with an uninterrupted
//! run) with N kills (default 100) instead of the test suite's 20, and prints its summary:
//! kills, unloadable newest checkpoints, the most steps a kill lost. Not part of `test`:
//! it takes minutes. With `--ranks N` it is the soak of a data-parallel run instead
//! (`soak_ranks`: ranks killed and stopped under `launch --max-restarts`).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::{cmd, disk, setup};

/// The test `soak` runs.
const TEST: &str = "crash_save::sigkill_during_saves_never_leaves_a_broken_newest_checkpoint";

/// `cargo xtask soak ...`.
pub fn run(args: &[String]) -> Result<(), String> {
    if args.iter().any(|a| a == "--ranks") {
        return crate::soak_ranks::run(args);
    }
    let (mut kills, mut seed) = (100u64, None::<u64>);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut number = |flag: &str| -> Result<u64, String> {
            it.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("soak: `{flag}` needs a whole number"))
        };
        match arg.as_str() {
            "--kills" => kills = number("--kills")?.max(1),
            "--seed" => seed = Some(number("--seed")?),
            other => {
                return Err(format!(
                    "soak: unknown option `{other}` (options: --kills N, --seed S)"
                ));
            }
        }
    }
    let t0 = Instant::now();
    let s = setup::run(&setup::Options::default())?;
    let tmp = disk::scratch_dir("soak")?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut c = Command::new(cargo);
    c.current_dir(crate::paths::workspace_root())
        .args(["test", "-p", "tchtrain-trainer", "--test", "it", "--", TEST])
        .args(["--exact", "--nocapture"])
        .env("TCHTRAIN_ASSETS", &s.assets)
        .env("TCHTRAIN_VENV_PYTHON", &s.python)
        .env("TMPDIR", &tmp)
        .env("TCHTRAIN_CRASH_KILLS", kills.to_string())
        .stdout(Stdio::piped());
    if let Some(seed) = seed {
        c.env("TCHTRAIN_CRASH_SEED", seed.to_string());
    }
    if let Some(libtorch) = &s.child_libtorch {
        c.env("LIBTORCH", libtorch);
    }
    println!("soak: {}", cmd::display(&c));
    let mut child = c
        .spawn()
        .map_err(|e| format!("soak: could not start cargo test: {e}"))?;
    let mut summary = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines() {
            let line = line.map_err(|e| format!("soak: reading the test's output: {e}"))?;
            println!("{line}");
            if line.starts_with("soak:") || line.contains("SIGKILLs (seed") {
                summary.push(line);
            }
        }
    }
    let status = child
        .wait()
        .map_err(|e| format!("soak: waiting for cargo test: {e}"))?;
    println!(
        "soak: finished in {:.0}s (setup and build included)",
        t0.elapsed().as_secs_f64()
    );
    for line in &summary {
        println!("{line}");
    }
    if status.success() {
        let _ = std::fs::remove_dir_all(&tmp);
        Ok(())
    } else {
        Err(format!(
            "soak: the crash test failed ({status}); its files are kept in {}",
            tmp.display()
        ))
    }
}

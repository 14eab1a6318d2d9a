//! Faults at scale, shortened: `cargo xtask soak --ranks 4` with a few faults. A 4-rank run
//! of `run_clm` (ZeRO-2, then DDP) under `launch --max-restarts`, two ranks SIGKILLed and
//! one SIGSTOPped at seeded random moments; the launcher restarts the group after each,
//! the script resumes from the newest checkpoint, and the soak itself fails unless every
//! fault restarted the group exactly once, every newest checkpoint is complete, every loss
//! a resumed group logged and the final weights equal the uninterrupted run's, and the
//! stopped rank was noticed within `ddp_timeout` (10 s, +5 s of libtorch's polling). This
//! test reads its summary lines. The full soak (50 faults) is `cargo xtask soak --ranks 4`.

use std::process::Command;

use anyhow::{Result, ensure};

use crate::launch::xtask;

/// The summary line of `strategy` in the soak's output.
fn summary<'a>(text: &'a str, strategy: &str) -> Option<&'a str> {
    text.lines()
        .find(|l| l.starts_with(&format!("soak: {strategy} on 4 ranks: ")))
}

#[test]
fn four_ranks_killed_and_stopped_restart_and_finish_as_if_uninterrupted() -> Result<()> {
    let output = Command::new(xtask()?)
        .args([
            "soak",
            "--ranks",
            "4",
            "--kills",
            "2",
            "--hangs",
            "1",
            "--steps",
            "8",
            "--strategy",
            "both",
            "--script",
        ])
        .arg(env!("CARGO_BIN_EXE_run_clm"))
        .output()?;
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    ensure!(
        output.status.success(),
        "the soak failed ({}):\n{text}",
        output.status
    );
    for strategy in ["zero2", "ddp"] {
        let line = summary(&text, strategy)
            .ok_or_else(|| anyhow::anyhow!("no {strategy} summary in:\n{text}"))?;
        for part in [
            ": 3 faults (",
            "1 SIGSTOPs noticed after",
            "; 3 restarts; 0 unloadable checkpoints;",
            "equal the uninterrupted run's: yes; final weights equal: yes",
        ] {
            ensure!(line.contains(part), "{strategy}: `{part}` not in: {line}");
        }
        // Every step's loss was logged by some group and compared, resumed steps again.
        let compared: usize = line
            .split(" logged losses (every group's)")
            .next()
            .and_then(|s| s.rsplit(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        ensure!(
            compared >= 8,
            "{strategy}: only {compared} losses compared: {line}"
        );
    }
    Ok(())
}

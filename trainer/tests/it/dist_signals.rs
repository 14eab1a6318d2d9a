//! A stop signal in a data-parallel run, with real processes and real signals: with
//! `enable_jit_checkpoint`, SIGTERM sent to **one** rank of a world of 2 stops every rank at
//! the same step (the ranks agree on it through a scalar all-reduce at each step boundary),
//! the checkpoint of that step is written and complete, and every rank exits 0. Without the
//! agreement the signalled rank would stop and save while the other went on into the next
//! step's all-reduce: a hang until `ddp_timeout`, then an error.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use tchtrain_testing::lock;

use anyhow::{Result, bail};
use tchtrain_callbacks::{TrainerCallback, TrainerControl, TrainerState};
use tchtrain_trainer::Trainer;
use tchtrain_training_args::{SaveStrategy, TrainingArguments};

use crate::common::{
    blocks, free_port, initial_model, is_rank, launch_ranks, rank, temp_dir, test_dir,
};

fn args(output_dir: &Path) -> Result<TrainingArguments> {
    let mut args = TrainingArguments {
        per_device_train_batch_size: 2,
        max_steps: 100_000,
        logging_steps: 1.0,
        save_strategy: SaveStrategy::Steps,
        save_steps: 1e6,
        enable_jit_checkpoint: true,
        ddp_timeout: 20,
        seed: 1,
        use_cpu: true,
        report_to: vec![],
        disable_tqdm: true,
        ..TrainingArguments::new(output_dir.display().to_string())
    };
    args.post_init()?;
    Ok(args)
}

/// Writes this rank's global step to `progress-rank{r}` after each step.
struct Progress(std::path::PathBuf);

impl TrainerCallback for Progress {
    fn on_step_end(
        &mut self,
        _: &TrainingArguments,
        state: &TrainerState,
        _: &mut TrainerControl,
    ) -> tchtrain_callbacks::Result<()> {
        let _ = std::fs::write(&self.0, state.global_step.to_string());
        Ok(())
    }
}

/// A rank: trains until a signal (its own or its peer's) stops it; writes the step.
fn rank_trains_until_stopped() -> Result<()> {
    let r = rank();
    let dir = test_dir();
    let mut t = Trainer::builder(initial_model()?, args(&dir.join("out"))?)
        .train_dataset(blocks("train", 40)?)
        .callback(Progress(dir.join(format!("progress-rank{r}"))))
        .build()?;
    let out = t.train(None)?;
    std::fs::write(
        dir.join(format!("stopped-rank{r}")),
        out.global_step.to_string(),
    )?;
    Ok(())
}

fn read_step(path: &Path) -> Option<i64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[test]
fn sigterm_to_one_rank_stops_every_rank_at_the_same_step_with_a_checkpoint() -> Result<()> {
    let _g = lock();
    if is_rank() {
        return rank_trains_until_stopped();
    }
    let dir = temp_dir("dist-signal");
    let port = free_port();
    let children = launch_ranks(
        "sigterm_to_one_rank_stops_every_rank_at_the_same_step_with_a_checkpoint",
        2,
        &[(0, port), (1, port)],
        &dir,
        "rank",
    );
    let pid1 = children[1].id();
    // Wait until rank 1 has trained a couple of steps, then signal rank 1 only.
    let start = Instant::now();
    while read_step(&dir.join("progress-rank1")).unwrap_or(0) < 2 {
        if start.elapsed() > Duration::from_secs(120) {
            bail!("rank 1 did not reach step 2");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = Command::new("kill")
        .args(["-s", "TERM", &pid1.to_string()])
        .status()?;
    assert!(status.success());
    let codes = crate::common::wait_codes(children, Duration::from_secs(120));
    let stderr = |r: i32| {
        std::fs::read_to_string(dir.join(format!("stderr-rank{r}.txt"))).unwrap_or_default()
    };
    assert_eq!(
        codes,
        [Some(0), Some(0)],
        "rank 0:\n{}\nrank 1:\n{}",
        stderr(0),
        stderr(1)
    );
    let s0 = read_step(&dir.join("stopped-rank0")).expect("rank 0 returned");
    let s1 = read_step(&dir.join("stopped-rank1")).expect("rank 1 returned");
    assert_eq!(s0, s1, "the ranks stopped at different steps");
    assert!((2..100_000).contains(&s0));
    // The checkpoint of that step, complete (rank 0 writes it).
    let ckpt = dir.join(format!("out/checkpoint-{s0}"));
    for f in [
        "model.safetensors",
        "trainer_state.json",
        "optimizer.safetensors",
    ] {
        assert!(ckpt.join(f).is_file(), "{f} missing in {}", ckpt.display());
    }
    println!("both ranks stopped at step {s0} after SIGTERM to rank 1 only");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

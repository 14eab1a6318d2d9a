//! Rendezvous faults of a data-parallel run, with real processes on 127.0.0.1: each test
//! re-launches this test binary as some ranks of a world of 2 (torchrun's environment) with
//! `ddp_timeout` of a few seconds. Every rank that is started must fail `train` with
//! [`tchtrain_distributed::Error::Rendezvous`] within the timeout (not hang; measured here
//! from before the model is built, with `ddp_timeout` 4 s: 4.3-5.0 s for rank 1, 5.3-6.2 s
//! for rank 0, whose wait libtorch checks once a second), and the
//! message must name what to check: `MASTER_ADDR:MASTER_PORT`, `RANK`, `WORLD_SIZE` and
//! `ddp_timeout`.
//!
//! * A rank that never joins: `WORLD_SIZE=2`, only rank 0 started.
//! * A wrong `MASTER_PORT`: rank 1 points at another port than rank 0 serves on.
//!
//! (A rank killed mid-run is `distributed.rs`'s `a_dead_rank_...` test.)

use std::path::Path;
use std::time::{Duration, Instant};
use tchtrain_testing::lock;

use anyhow::Result;
use tchtrain_trainer::Trainer;
use tchtrain_training_args::{SaveStrategy, TrainingArguments};

use crate::common::{
    blocks, free_port, initial_model, is_rank, launch_ranks, rank, temp_dir, test_dir,
};

/// The `ddp_timeout` of the ranks, in seconds.
const TIMEOUT_S: i64 = 4;

/// A short job; it never gets to its first step.
fn args(output_dir: &Path) -> Result<TrainingArguments> {
    let mut args = TrainingArguments {
        per_device_train_batch_size: 2,
        max_steps: 2,
        logging_steps: 1.0,
        save_strategy: SaveStrategy::Steps,
        save_steps: 1.0,
        ddp_timeout: TIMEOUT_S,
        seed: 1,
        use_cpu: true,
        report_to: vec![],
        disable_tqdm: true,
        ..TrainingArguments::new(output_dir.display().to_string())
    };
    args.post_init()?;
    Ok(args)
}

/// A rank: builds and trains; the run must fail with the rendezvous error within the
/// timeout. Writes the message and the time it took to `error-rank{rank}.txt`.
fn rank_expects_rendezvous_error() -> Result<()> {
    let r = rank();
    let out = test_dir().join(format!("out-rank{r}"));
    let start = Instant::now();
    let result = Trainer::builder(initial_model()?, args(&out)?)
        .train_dataset(blocks("train", 8)?)
        .build()
        .and_then(|mut t| t.train(None).map(|_| t.state.global_step));
    let waited = start.elapsed();
    let err = match result {
        Ok(step) => panic!("rank {r} trained to step {step} without its peer"),
        Err(e) => e,
    };
    std::fs::write(
        test_dir().join(format!("error-rank{r}.txt")),
        format!("{}\n{}", waited.as_secs_f64(), err),
    )?;
    assert!(
        matches!(
            err,
            tchtrain_trainer::Error::Distributed(tchtrain_distributed::Error::Rendezvous { .. })
        ),
        "rank {r}: {err:?}"
    );
    // Within the timeout: the clock started before the model was built, libtorch checks
    // rank 0's wait for the others once a second, and a loaded machine needs some room.
    assert!(
        waited < Duration::from_secs(TIMEOUT_S as u64 + 4),
        "rank {r} gave up after {waited:?}"
    );
    assert!(!out.join("checkpoint-1").exists(), "rank {r} trained");
    Ok(())
}

/// Launches `ranks` (rank, MASTER_PORT), waits (bounded) and returns each rank's
/// `(seconds, message)`.
fn run_world(test: &str, name: &str, ranks: &[(i32, u16)]) -> Result<Vec<(f64, String)>> {
    let dir = temp_dir(name);
    let started = Instant::now();
    let children = launch_ranks(test, 2, ranks, &dir, "rank");
    // Far beyond the timeout: a hang fails here instead of blocking the suite.
    let codes = crate::common::wait_codes(children, Duration::from_secs(120));
    let total = started.elapsed();
    let mut reports = Vec::new();
    for (i, &(r, _)) in ranks.iter().enumerate() {
        let stderr =
            std::fs::read_to_string(dir.join(format!("stderr-rank{r}.txt"))).unwrap_or_default();
        assert_eq!(codes[i], Some(0), "rank {r} (asserts its error):\n{stderr}");
        let text = std::fs::read_to_string(dir.join(format!("error-rank{r}.txt")))?;
        let (secs, message) = text.split_once('\n').unwrap_or((&text, ""));
        println!("{name}: rank {r} after {secs} s (all ranks done in {total:.1?}): {message}");
        reports.push((secs.parse()?, message.to_string()));
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(reports)
}

/// The message names what a user must check, with the values this rank used.
fn assert_clear(message: &str, rank: i32, port: u16) {
    for needle in [
        format!("127.0.0.1:{port}"),
        "MASTER_ADDR".to_string(),
        "MASTER_PORT".to_string(),
        format!("RANK={rank}"),
        "WORLD_SIZE=2".to_string(),
        format!("ddp_timeout={TIMEOUT_S}"),
    ] {
        assert!(message.contains(&needle), "missing `{needle}`: {message}");
    }
}

#[test]
fn a_rank_that_never_joins_is_a_clear_error_within_ddp_timeout() -> Result<()> {
    let _g = lock();
    if is_rank() {
        return rank_expects_rendezvous_error();
    }
    let port = free_port();
    let reports = run_world(
        "a_rank_that_never_joins_is_a_clear_error_within_ddp_timeout",
        "never-joins",
        &[(0, port)],
    )?;
    let (_, message) = &reports[0];
    assert_clear(message, 0, port);
    assert!(message.contains("1/2"), "how many joined: {message}");
    Ok(())
}

#[test]
fn a_wrong_master_port_is_a_clear_error_within_ddp_timeout() -> Result<()> {
    let _g = lock();
    if is_rank() {
        return rank_expects_rendezvous_error();
    }
    let port = free_port();
    let mut wrong = free_port();
    while wrong == port {
        wrong = free_port();
    }
    let reports = run_world(
        "a_wrong_master_port_is_a_clear_error_within_ddp_timeout",
        "wrong-port",
        &[(0, port), (1, wrong)],
    )?;
    assert_clear(&reports[0].1, 0, port);
    assert_clear(&reports[1].1, 1, wrong);
    Ok(())
}

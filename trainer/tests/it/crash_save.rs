//! Atomic checkpoints under SIGKILL: this test re-launches its own binary as a training
//! process on tiny GPT-2 (dropout off) that saves a checkpoint at every step, and kills it
//! with SIGKILL at seeded random moments, many times. Each relaunch resumes from the newest
//! checkpoint the previous ones left. After every kill:
//!
//! * `get_last_checkpoint` names a `checkpoint-N` folder (never a `tmp-checkpoint-N` one)
//!   that is complete: every file is there and readable, its `trainer_state.json` says
//!   step N, it passes the resume's preflight (`Trainer::check_resume_checkpoint`), its
//!   weights load into the model and its optimizer and scheduler states parse;
//! * every `checkpoint-*` folder but those left by an interrupted rotation (older than the
//!   newest) is complete.
//!
//! At the end a run in this process resumes from the newest checkpoint to a fixed step, and
//! its logged losses, gradient norms and learning rates (the history carried through every
//! checkpoint of the chain) equal those of one uninterrupted run bit for bit.
//!
//! `TCHTRAIN_CRASH_SEED` changes the kill times (the default is fixed, so a failure
//! reproduces); `TCHTRAIN_CRASH_KILLS` the number of kills. `cargo xtask soak` runs it with
//! 100 kills and prints its summary line: kills, unloadable newest checkpoints (the test
//! fails on any) and the most steps a kill lost (the steps the killed run had finished past
//! the newest checkpoint).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tchtrain_testing::lock;

use anyhow::{Context, Result, bail};
use tchtrain_callbacks::{JsonMap, JsonValue, TrainerCallback, TrainerControl, TrainerState};
use tchtrain_optim::{OPTIMIZER_STATE_NAME, OPTIMIZER_TENSORS_NAME, OptimizerStateDict};
use tchtrain_trainer::{ResumeFrom, Trainer};
use tchtrain_training_args::{SaveStrategy, SchedulerType, TrainingArguments};

use crate::common::{ROLE, blocks, initial_model, temp_dir, test_dir};

/// Kills by default (`TCHTRAIN_CRASH_KILLS` overrides).
const KILLS: u64 = 20;
/// Rows of the training set: 12 rows in micro-batches of 2 with accumulation 2 make 3
/// update steps per epoch, so the chain crosses many epoch boundaries.
const ROWS: usize = 12;
/// Every wait on a child is bounded by this.
const LIMIT: Duration = Duration::from_secs(60);
/// The files of a complete checkpoint.
const FILES: [&str; 8] = [
    "model.safetensors",
    "config.json",
    "trainer_state.json",
    "training_args.json",
    OPTIMIZER_TENSORS_NAME,
    OPTIMIZER_STATE_NAME,
    "scheduler.json",
    "rng_state.json",
];

/// A checkpoint at every step, `save_total_limit` 4 (so rotation's deletions are killed
/// too), a constant schedule after 3 warmup steps (the learning rates do not depend on
/// `max_steps`, so the killed runs can aim far and the final one stop at `max_steps`).
fn args(output_dir: &Path, max_steps: i64, save: bool) -> Result<TrainingArguments> {
    let mut args = TrainingArguments {
        per_device_train_batch_size: 2,
        gradient_accumulation_steps: 2,
        max_steps,
        learning_rate: 1e-3,
        lr_scheduler_type: SchedulerType::ConstantWithWarmup,
        warmup_steps: 3.0,
        weight_decay: 0.01,
        logging_steps: 1.0,
        save_strategy: if save {
            SaveStrategy::Steps
        } else {
            SaveStrategy::No
        },
        save_steps: 1.0,
        save_total_limit: Some(4),
        seed: 5,
        use_cpu: true,
        report_to: vec![],
        disable_tqdm: true,
        ..TrainingArguments::new(output_dir.display().to_string())
    };
    args.post_init()?;
    Ok(args)
}

/// Writes the step reached into `marker` at the end of every step (the file appears once
/// training is under way).
struct Marker(PathBuf);

impl TrainerCallback for Marker {
    fn on_step_end(
        &mut self,
        _: &TrainingArguments,
        state: &TrainerState,
        _: &mut TrainerControl,
    ) -> tchtrain_callbacks::Result<()> {
        // Written whole then renamed: a kill never leaves a torn number.
        let tmp = self.0.with_extension("tmp");
        if std::fs::write(&tmp, state.global_step.to_string()).is_ok() {
            let _ = std::fs::rename(&tmp, &self.0);
        }
        Ok(())
    }
}

/// The child: resumes from the newest checkpoint (if any) and trains until it is killed.
fn child_train() -> Result<()> {
    let dir = test_dir();
    let out = dir.join("out");
    let resume = tchtrain_trainer::get_last_checkpoint(&out)?.map(|_| ResumeFrom::Last);
    let mut trainer = Trainer::builder(initial_model()?, args(&out, 1_000_000, true)?)
        .train_dataset(blocks("train", ROWS)?)
        .callback(Marker(dir.join("marker")))
        .build()?;
    trainer.train(resume)?;
    bail!("the child was never killed")
}

/// `(step, loss, grad_norm, learning_rate)` of every training log entry.
fn step_logs(history: &[JsonMap]) -> Vec<(i64, f64, f64, f64)> {
    let num = |e: &JsonMap, k: &str| e.get(k).and_then(JsonValue::as_f64);
    history
        .iter()
        .filter_map(|e| {
            Some((
                e.get("step")?.as_i64()?,
                num(e, "loss")?,
                num(e, "grad_norm")?,
                num(e, "learning_rate")?,
            ))
        })
        .collect()
}

/// xorshift64*: seeded kill times without a dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn spawn(dir: &Path) -> Result<Child> {
    let stderr = std::fs::File::create(dir.join("stderr.txt"))?;
    Ok(Command::new(std::env::current_exe()?)
        .args([
            "--exact",
            &crate::common::test_path(
                "sigkill_during_saves_never_leaves_a_broken_newest_checkpoint",
            ),
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(ROLE, "child")
        .env(crate::common::DIR, dir)
        .env("OMP_NUM_THREADS", "1")
        // The child's `test result` lines must not be counted as this run's.
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()?)
}

fn child_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("stderr.txt")).unwrap_or_default()
}

fn step_of(path: &Path, prefix: &str) -> Option<i64> {
    path.file_name()?
        .to_str()?
        .strip_prefix(prefix)?
        .parse()
        .ok()
}

/// Why `ckpt` is not a complete checkpoint at its step, if it is not: every file is there
/// and its `trainer_state.json` says that step; with `load`, its weights also load into
/// the model and its optimizer and scheduler states parse.
fn incomplete(ckpt: &Path, load: bool) -> Option<String> {
    let step = step_of(ckpt, "checkpoint-")?;
    let check = || -> Result<()> {
        for file in FILES {
            if !ckpt.join(file).is_file() {
                bail!("{file} is missing");
            }
        }
        let state = TrainerState::load_from_json(ckpt.join("trainer_state.json"))?;
        if state.global_step != step {
            bail!("trainer_state.json says step {}", state.global_step);
        }
        if !load {
            return Ok(());
        }
        // The resume's own preflight (every file complete and readable, the model's
        // architecture), then the weights themselves.
        let out = ckpt.with_file_name("preflight-out");
        Trainer::builder(initial_model()?, args(&out, 1, false)?)
            .build()?
            .check_resume_checkpoint(ckpt)?;
        let mut model = initial_model()?;
        tchtrain_trainer::load_model_weights(&mut *model, ckpt)?;
        let opt = OptimizerStateDict::load(ckpt)?;
        if opt.tensors.is_empty() {
            bail!("the optimizer state has no tensors");
        }
        let sched: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(ckpt.join("scheduler.json"))?)?;
        if sched["last_epoch"].as_i64() != Some(step) {
            bail!("scheduler.json's last_epoch is {}", sched["last_epoch"]);
        }
        Ok(())
    };
    check().err().map(|e| format!("{e:#}"))
}

#[test]
fn sigkill_during_saves_never_leaves_a_broken_newest_checkpoint() -> Result<()> {
    let _g = lock();
    if crate::common::is_rank() {
        return child_train();
    }
    // The children run on one thread (OMP_NUM_THREADS=1); so does this process while this
    // test runs, so that every run sums in the same order. The other tests of this binary
    // get the count back afterwards.
    struct Threads(i32);
    impl Drop for Threads {
        fn drop(&mut self) {
            tch::set_num_threads(self.0);
        }
    }
    let _threads = Threads(tch::get_num_threads());
    tch::set_num_threads(1);
    let kills = env_u64("TCHTRAIN_CRASH_KILLS", KILLS);
    let seed = env_u64("TCHTRAIN_CRASH_SEED", 0x5eed_c0de);
    let mut rng = Rng(seed.max(1));
    let dir = temp_dir("crash-save");
    let out = dir.join("out");
    let start = Instant::now();
    let (mut mid_save, mut mid_rotation, mut newest) = (0, 0, 0);
    let (mut unloadable, mut max_lost) = (0, 0);
    for kill in 0..kills {
        let marker = dir.join("marker");
        let _ = std::fs::remove_file(&marker);
        let mut child = spawn(&dir)?;
        let launched = Instant::now();
        while !marker.exists() {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "kill {kill}: child exited early ({status}):\n{}",
                    child_log(&dir)
                );
            }
            if launched.elapsed() > LIMIT {
                let _ = child.kill();
                bail!(
                    "kill {kill}: child did not start training:\n{}",
                    child_log(&dir)
                );
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        // Within the next step or two; saves (fsyncs) take most of a step's time.
        std::thread::sleep(Duration::from_millis(rng.below(350)));
        child.kill()?; // SIGKILL
        let status = child.wait()?;
        let reached: i64 = std::fs::read_to_string(&marker)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        assert_eq!(
            status.code(),
            None,
            "kill {kill}: the child was not killed: {status}"
        );

        let Some(last) = tchtrain_trainer::get_last_checkpoint(&out)? else {
            // Killed before the first save was committed.
            assert_eq!(newest, 0, "kill {kill}: the checkpoints are gone");
            max_lost = max_lost.max(reached);
            continue;
        };
        let step = step_of(&last, "checkpoint-").context("checkpoint name")?;
        assert!(
            step >= newest,
            "kill {kill}: checkpoint-{step} after checkpoint-{newest}"
        );
        newest = step;
        max_lost = max_lost.max(reached - step);
        if let Some(why) = incomplete(&last, true) {
            eprintln!(
                "kill {kill}: the newest checkpoint {} is broken: {why}",
                last.display()
            );
            unloadable += 1;
            // The next run resumes from it and would fail; the chain ends here.
            break;
        }
        for entry in std::fs::read_dir(&out)? {
            let path = entry?.path();
            if step_of(&path, "tmp-checkpoint-").is_some() {
                mid_save += 1;
            } else if let Some(s) = step_of(&path, "checkpoint-")
                && s != step
                && let Some(why) = incomplete(&path, false)
            {
                // Only rotation deletes, and only folders older than the newest.
                assert!(s < step, "kill {kill}: {} is broken: {why}", path.display());
                mid_rotation += 1;
            }
        }
    }
    let killed_for = start.elapsed();
    println!(
        "soak: {kills} kills, {unloadable} unloadable checkpoints, at most {max_lost} steps lost per kill"
    );
    assert_eq!(unloadable, 0, "a kill left an unloadable newest checkpoint");

    // Resume the chain to a fixed end, and compare with one uninterrupted run.
    let end = newest + 4;
    let mut resumed = Trainer::builder(initial_model()?, args(&out, end, true)?)
        .train_dataset(blocks("train", ROWS)?)
        .build()?;
    assert_eq!(resumed.train(Some(ResumeFrom::Last))?.global_step, end);
    let full_dir = dir.join("uninterrupted");
    let mut full = Trainer::builder(initial_model()?, args(&full_dir, end, false)?)
        .train_dataset(blocks("train", ROWS)?)
        .build()?;
    full.train(None)?;
    let expected = step_logs(&full.state.log_history);
    assert_eq!(expected.len() as i64, end);
    // Dropout is off and the data order is a function of the seed and the epoch: exact.
    assert_eq!(step_logs(&resumed.state.log_history), expected);
    println!(
        "{kills} SIGKILLs (seed {seed:#x}) in {killed_for:.1?}: newest checkpoint-{newest}, \
         {mid_save} kills left a tmp-checkpoint, {mid_rotation} a half-rotated old checkpoint; \
         resumed to step {end} equal to the uninterrupted run; {:.1?} in all",
        start.elapsed()
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

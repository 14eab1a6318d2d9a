//! Graceful stop with real signals (`enable_jit_checkpoint`): each test re-launches this
//! test binary as a training process on tiny GPT-2 (dropout off) and signals it once
//! training has begun.
//!
//! * One SIGTERM: the child finishes its optimizer step, saves a complete checkpoint at
//!   that step and exits 0; resuming from that checkpoint in this process continues from
//!   its step.
//! * Two SIGINTs: the second exits at once with status 130, without a checkpoint.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tchtrain_testing::{assets, lock};

use anyhow::{Context, Result, bail};
use tch::Device;
use tchtrain_callbacks::{TrainerCallback, TrainerControl, TrainerState};
use tchtrain_collators::{Feature, Label};
use tchtrain_data::{Dataset, InMemoryDataset};
use tchtrain_models::{AutoTask, LoadOptions, PreTrainedModel, from_pretrained_dir};
use tchtrain_trainer::{ResumeFrom, Trainer};
use tchtrain_training_args::{SaveStrategy, TrainingArguments};

const ROLE: &str = "TCHTRAIN_SIGNAL_TEST_ROLE";
const DIR: &str = "TCHTRAIN_SIGNAL_TEST_DIR";
/// The step at which the child writes its marker (training has begun).
const MARKER_STEP: i64 = 2;
/// Every wait on the child is bounded by this.
const LIMIT: Duration = Duration::from_secs(120);
const SIGINT: &str = "INT";
const SIGTERM: &str = "TERM";

fn reference_dir() -> PathBuf {
    assets().join("reference/trainer_clm")
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tchtrain-sig-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// The first `n` hamlet blocks of the reference (`input_ids`, `labels`).
fn blocks(n: usize) -> Result<Arc<dyn Dataset>> {
    let path = reference_dir().join("blocks.json");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let rows = v["train"]
        .as_array()
        .context("blocks")?
        .iter()
        .take(n)
        .map(|row| {
            let ids: Vec<i64> = serde_json::from_value(row.clone())?;
            Ok(Feature::new(ids.clone()).with_labels(Label::Ids(ids)))
        })
        .collect::<Result<_>>()?;
    Ok(InMemoryDataset::new(rows).into_shared())
}

fn initial_model() -> Result<Box<dyn PreTrainedModel>> {
    Ok(from_pretrained_dir(
        &reference_dir().join("initial"),
        AutoTask::CausalLm,
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model)
}

/// Many steps, no scheduled save within reach: only the signal makes a checkpoint.
fn args(output_dir: &Path, max_steps: i64) -> Result<TrainingArguments> {
    let mut args = TrainingArguments {
        per_device_train_batch_size: 4,
        max_steps,
        learning_rate: 1e-3,
        logging_steps: 1.0,
        save_strategy: SaveStrategy::Steps,
        save_steps: 1e6,
        enable_jit_checkpoint: true,
        seed: 11,
        use_cpu: true,
        report_to: vec![],
        disable_tqdm: true,
        ..TrainingArguments::new(output_dir.display().to_string())
    };
    args.post_init()?;
    Ok(args)
}

/// Writes `marker` at step [`MARKER_STEP`], then sleeps `pause` inside the callback (to
/// hold the process in a known place while the parent signals it).
struct Marker {
    marker: PathBuf,
    pause: Duration,
}

impl TrainerCallback for Marker {
    fn on_step_end(
        &mut self,
        _: &TrainingArguments,
        state: &TrainerState,
        _: &mut TrainerControl,
    ) -> tchtrain_callbacks::Result<()> {
        if state.global_step == MARKER_STEP {
            let _ = std::fs::write(&self.marker, b"training");
            std::thread::sleep(self.pause);
        }
        Ok(())
    }
}

/// The child: trains until a signal stops it.
fn child_train(pause: Duration) -> Result<()> {
    let dir = PathBuf::from(std::env::var_os(DIR).context("the parent sets the folder")?);
    let mut trainer = Trainer::builder(initial_model()?, args(&dir.join("out"), 1_000_000)?)
        .train_dataset(blocks(38)?)
        .callback(Marker {
            marker: dir.join("marker"),
            pause,
        })
        .build()?;
    let out = trainer.train(None)?;
    std::fs::write(dir.join("stopped_at"), out.global_step.to_string())?;
    Ok(())
}

/// Re-launches this binary to run test `test` as the child, in `dir`.
fn spawn(test: &str, dir: &Path) -> Result<Child> {
    std::fs::create_dir_all(dir)?;
    let stderr = std::fs::File::create(dir.join("stderr.txt"))?;
    Ok(Command::new(std::env::current_exe()?)
        .args([
            "--exact",
            &crate::common::test_path(test),
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(ROLE, "child")
        .env(DIR, dir)
        // The child's `test result` lines must not be counted as this run's.
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()?)
}

/// Kills the child on drop (a failed or timed-out wait leaves no process behind).
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn child_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("stderr.txt")).unwrap_or_default()
}

/// Waits (bounded) until the child has written its marker.
fn wait_for_marker(child: &mut Guard, dir: &Path) -> Result<()> {
    let start = Instant::now();
    while !dir.join("marker").is_file() {
        if let Some(status) = child.0.try_wait()? {
            bail!("child exited early ({status}):\n{}", child_log(dir));
        }
        if start.elapsed() > LIMIT {
            bail!(
                "child did not reach step {MARKER_STEP}:\n{}",
                child_log(dir)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Waits (bounded) for the child's exit.
fn wait_for_exit(child: &mut Guard, dir: &Path) -> Result<ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.0.try_wait()? {
            return Ok(status);
        }
        if start.elapsed() > LIMIT {
            bail!("child did not exit after the signal:\n{}", child_log(dir));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `sig` (`kill -s NAME`) to the child.
fn send(child: &Guard, sig: &str) -> Result<()> {
    let status = Command::new("kill")
        .args(["-s", sig, &child.0.id().to_string()])
        .status()?;
    if !status.success() {
        bail!("kill -s {sig} failed: {status}");
    }
    Ok(())
}

#[test]
fn sigterm_saves_a_checkpoint_at_the_step_boundary_and_exits_0() -> Result<()> {
    let _g = lock();
    if std::env::var(ROLE).is_ok() {
        return child_train(Duration::ZERO);
    }
    let dir = temp_dir("term");
    let mut child = Guard(spawn(
        "sigterm_saves_a_checkpoint_at_the_step_boundary_and_exits_0",
        &dir,
    )?);
    wait_for_marker(&mut child, &dir)?;
    send(&child, SIGTERM)?;
    let status = wait_for_exit(&mut child, &dir)?;
    assert_eq!(status.code(), Some(0), "{}", child_log(&dir));

    // The run stopped at the step it was in and saved exactly there.
    let stopped: i64 = std::fs::read_to_string(dir.join("stopped_at"))?
        .trim()
        .parse()?;
    assert!(stopped >= MARKER_STEP, "stopped at {stopped}");
    let out = dir.join("out");
    let ckpt = out.join(format!("checkpoint-{stopped}"));
    assert_eq!(
        tchtrain_trainer::get_last_checkpoint(&out)?,
        Some(ckpt.clone())
    );
    assert!(!out.join(format!("tmp-checkpoint-{stopped}")).exists());
    // Complete: the state parses at that step, the weights load into the model.
    let state = TrainerState::load_from_json(ckpt.join("trainer_state.json"))?;
    assert_eq!(state.global_step, stopped);
    let mut model = initial_model()?;
    tchtrain_trainer::load_model_weights(&mut *model, &ckpt)?;

    // Resuming continues from that step (two more steps), keeping the logged history.
    let mut resumed = Trainer::builder(initial_model()?, args(&out, stopped + 2)?)
        .train_dataset(blocks(38)?)
        .build()?;
    let result = resumed.train(Some(ResumeFrom::Path(ckpt)))?;
    assert_eq!(result.global_step, stopped + 2);
    let logged: Vec<i64> = resumed
        .state
        .log_history
        .iter()
        .filter(|e| e.contains_key("loss"))
        .filter_map(|e| e.get("step")?.as_i64())
        .collect();
    // The checkpoint's history (steps 1..=stopped), then the two new steps.
    assert_eq!(logged, (1..=stopped + 2).collect::<Vec<_>>());
    assert_eq!(
        resumed.state.log_history[..state.log_history.len()],
        state.log_history[..]
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[test]
fn a_second_sigint_exits_at_once_with_130() -> Result<()> {
    let _g = lock();
    if std::env::var(ROLE).is_ok() {
        // Held inside step 2's callback, so that both signals arrive before the step ends.
        return child_train(Duration::from_secs(60));
    }
    let dir = temp_dir("int");
    let mut child = Guard(spawn("a_second_sigint_exits_at_once_with_130", &dir)?);
    wait_for_marker(&mut child, &dir)?;
    send(&child, SIGINT)?;
    std::thread::sleep(Duration::from_millis(200));
    send(&child, SIGINT)?;
    let start = Instant::now();
    let status = wait_for_exit(&mut child, &dir)?;
    assert_eq!(status.code(), Some(130), "{}", child_log(&dir));
    // At once: well before the 60 s pause would have ended.
    assert!(start.elapsed() < Duration::from_secs(30));
    assert!(!dir.join("stopped_at").exists());
    assert_eq!(
        tchtrain_trainer::get_last_checkpoint(&dir.join("out"))?,
        None
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[test]
fn after_train_returns_a_sigterm_takes_its_default_action_again() -> Result<()> {
    let _g = lock();
    if std::env::var(ROLE).is_ok() {
        // Three steps with the graceful stop armed, then idle with it disarmed.
        let dir = PathBuf::from(std::env::var_os(DIR).context("the parent sets the folder")?);
        let mut trainer = Trainer::builder(initial_model()?, args(&dir.join("out"), 3)?)
            .train_dataset(blocks(38)?)
            .build()?;
        trainer.train(None)?;
        std::fs::write(dir.join("marker"), b"trained")?;
        std::thread::sleep(Duration::from_secs(60));
        return Ok(());
    }
    let dir = temp_dir("after");
    let mut child = Guard(spawn(
        "after_train_returns_a_sigterm_takes_its_default_action_again",
        &dir,
    )?);
    wait_for_marker(&mut child, &dir)?;
    send(&child, SIGTERM)?;
    let start = Instant::now();
    let status = wait_for_exit(&mut child, &dir)?;
    // Terminated by the signal itself, at once (not recorded and ignored).
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(15), "{status}: {}", child_log(&dir));
    assert!(start.elapsed() < Duration::from_secs(30));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

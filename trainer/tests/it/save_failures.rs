//! Checkpoint saves that fail: a file-size limit (`RLIMIT_FSIZE`, in a child process whose
//! limit `prlimit` lowers after the first checkpoint), a full file system (a small tmpfs)
//! and a read-only one (the tmpfs remounted read-only). Each time the save returns
//! `Error::CheckpointSave` naming the checkpoint, the file, the reason and the space, the
//! partial folder is gone, the previous checkpoint is untouched and is what
//! `get_last_checkpoint` finds, and a run resumed from it (the limit lifted) ends as the
//! uninterrupted run does, bit for bit.
//!
//! The file-system cases mount a tmpfs, which needs root (CAP_SYS_ADMIN); where `mount`
//! fails they print that they were skipped.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use tchtrain_callbacks::{TrainerCallback, TrainerControl, TrainerState};
use tchtrain_testing::lock;
use tchtrain_trainer::{Error, ResumeFrom, SaveFailureKind, Trainer};
use tchtrain_training_args::{SaveStrategy, TrainingArguments};

use crate::common::{blocks_in, initial_model_in, isolated, reference_dir, temp_dir};

/// The full-vocabulary tiny GPT-2 (not the small one the other our-runs tests use): the
/// limits below (a 20 MB file size, a 90 MB disk) are sized to its ~13 MB weights and ~26 MB
/// optimizer state.
fn initial_model() -> Result<Box<dyn tchtrain_models::PreTrainedModel>> {
    initial_model_in(&reference_dir())
}

fn blocks(part: &str, n: usize) -> Result<std::sync::Arc<dyn tchtrain_data::Dataset>> {
    blocks_in(&reference_dir(), part, n)
}

/// A checkpoint at every step of 3.
fn args(output_dir: &Path) -> Result<TrainingArguments> {
    let mut args = TrainingArguments {
        per_device_train_batch_size: 2,
        max_steps: 3,
        learning_rate: 1e-3,
        logging_steps: 1.0,
        save_strategy: SaveStrategy::Steps,
        save_steps: 1.0,
        seed: 5,
        use_cpu: true,
        report_to: vec![],
        disable_tqdm: true,
        ..TrainingArguments::new(output_dir.display().to_string())
    };
    args.post_init()?;
    Ok(args)
}

/// Runs `action` at the end of step `step`, before that step's save.
struct AtStep<F: FnMut() + Send + 'static> {
    step: i64,
    action: F,
}

impl<F: FnMut() + Send + 'static> TrainerCallback for AtStep<F> {
    fn on_step_end(
        &mut self,
        _: &TrainingArguments,
        state: &TrainerState,
        _: &mut TrainerControl,
    ) -> tchtrain_callbacks::Result<()> {
        if state.global_step == self.step {
            (self.action)();
        }
        Ok(())
    }
}

/// The logged losses of a run.
fn losses(state: &TrainerState) -> Vec<f64> {
    state
        .log_history
        .iter()
        .filter_map(|e| e.get("loss").and_then(|v| v.as_f64()))
        .collect()
}

/// Trains in `out` with `action` run at the end of step 2; the save of step 2 must fail
/// with `kind`. Checks the error and the folders, then lifts the fault (`lift`) and
/// resumes from checkpoint-1 to the end: the losses equal an uninterrupted run's.
fn fails_at_step_two(
    out: &Path,
    kind: SaveFailureKind,
    action: impl FnMut() + Send + 'static,
    lift: impl FnOnce() -> Result<()>,
) -> Result<()> {
    let mut trainer = Trainer::builder(initial_model()?, args(out)?)
        .train_dataset(blocks("train", 12)?)
        .callback(AtStep { step: 2, action })
        .build()?;
    let err = match trainer.train(None) {
        Ok(_) => bail!("the save of step 2 did not fail"),
        Err(e) => e,
    };
    let message = err.to_string();
    eprintln!("{kind:?}: {message}");
    let first = out.join("checkpoint-1");
    let Error::CheckpointSave { failure, .. } = &err else {
        bail!("not a CheckpointSave error: {message}");
    };
    assert_eq!(failure.kind, kind, "{message}");
    assert_eq!(failure.checkpoint, out.join("checkpoint-2"));
    assert_eq!(failure.previous.as_deref(), Some(first.as_path()));
    match kind {
        // The optimizer state (26 MB) is the file that does not fit.
        SaveFailureKind::FileTooLarge | SaveFailureKind::DiskFull => {
            assert_eq!(
                failure.file.as_deref(),
                Some(out.join("checkpoint-2/optimizer.safetensors").as_path()),
                "{message}"
            );
            assert!(
                failure.needed_bytes.is_some_and(|n| n > 30_000_000),
                "{message}"
            );
        }
        // The temporary folder cannot be made in the output folder.
        _ => assert_eq!(failure.file.as_deref(), Some(out), "{message}"),
    }
    if kind == SaveFailureKind::FileTooLarge {
        assert_eq!(failure.file_size_limit, Some(20_000_000), "{message}");
    }
    if kind == SaveFailureKind::DiskFull {
        assert!(
            failure.available_bytes.is_some_and(|a| a < 30_000_000),
            "{message}"
        );
    }
    assert!(
        message.contains("checkpoint-2") && message.contains("checkpoint-1"),
        "{message}"
    );
    lift()?;
    assert!(
        !out.join("tmp-checkpoint-2").exists(),
        "the partial save is removed"
    );
    assert!(!out.join("checkpoint-2").exists());
    assert_eq!(
        tchtrain_trainer::get_last_checkpoint(out)?,
        Some(first.clone())
    );
    // The previous checkpoint resumes, and the run ends as an uninterrupted one.
    let mut resumed = Trainer::builder(initial_model()?, args(out)?)
        .train_dataset(blocks("train", 12)?)
        .build()?;
    resumed.train(Some(ResumeFrom::Path(first)))?;
    let plain_dir = temp_dir(&format!("save-failure-plain-{kind:?}"));
    let mut plain = Trainer::builder(initial_model()?, args(&plain_dir)?)
        .train_dataset(blocks("train", 12)?)
        .build()?;
    plain.train(None)?;
    assert_eq!(losses(&resumed.state), losses(&plain.state));
    assert_eq!(losses(&plain.state).len(), 3);
    let _ = std::fs::remove_dir_all(&plain_dir);
    Ok(())
}

/// `prlimit` on this process's file-size limit (soft:hard, in bytes or `unlimited`).
fn set_file_size_limit(limit: &str) -> Result<()> {
    let ok = Command::new("prlimit")
        .args([
            "--pid",
            &std::process::id().to_string(),
            &format!("--fsize={limit}:unlimited"),
        ])
        .status()
        .context("prlimit (util-linux) sets this process's file-size limit")?;
    ensure!(ok.success(), "prlimit failed");
    Ok(())
}

/// A file-size limit of 20 MB from step 2 on: the model (13 MB) fits, the optimizer state
/// (26 MB) does not. In its own process: the limit is process-wide.
#[test]
fn a_file_size_limit_fails_the_save_cleanly() -> Result<()> {
    let _g = lock();
    if !isolated("save_failures::a_file_size_limit_fails_the_save_cleanly") {
        return Ok(());
    }
    let out = temp_dir("save-failure-fsize");
    fails_at_step_two(
        &out,
        SaveFailureKind::FileTooLarge,
        || set_file_size_limit("20000000").expect("lowering the limit"),
        || set_file_size_limit("unlimited"),
    )?;
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

/// A tmpfs mounted on a fresh folder, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// `None` (and a note) where this process may not mount.
    fn mount(name: &str, megabytes: u64) -> Result<Option<Self>> {
        let dir = temp_dir(name);
        std::fs::create_dir_all(&dir)?;
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={megabytes}m"), "tmpfs"])
            .arg(&dir)
            .stderr(std::process::Stdio::null())
            .status();
        if !status.is_ok_and(|s| s.success()) {
            eprintln!("skipped: cannot mount a tmpfs here (needs root)");
            let _ = std::fs::remove_dir(&dir);
            return Ok(None);
        }
        Ok(Some(Self(dir)))
    }

    fn remount(&self, options: &str) -> Result<()> {
        let ok = Command::new("mount")
            .args(["-o", &format!("remount,{options}")])
            .arg(&self.0)
            .status()?;
        ensure!(ok.success(), "remounting {} {options}", self.0.display());
        Ok(())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A 90 MiB file system: checkpoint-1 (about 65 MB: 39 MB of our files, 26 MB of upstream's
/// `optimizer.pt` beside them) fits, checkpoint-2 does not. The error gives the space a
/// checkpoint needs and what is free; then the file system grows (the fault lifted) and the
/// run resumes.
#[test]
fn a_full_disk_fails_the_save_cleanly() -> Result<()> {
    let _g = lock();
    let Some(fs) = Tmpfs::mount("save-failure-full", 90)? else {
        return Ok(());
    };
    let out = fs.0.join("out");
    fails_at_step_two(
        &out,
        SaveFailureKind::DiskFull,
        || {},
        || fs.remount("size=400m"),
    )
}

/// The output folder's file system turns read-only at step 2; then writable again.
#[test]
fn a_read_only_folder_fails_the_save_cleanly() -> Result<()> {
    let _g = lock();
    let Some(fs) = Tmpfs::mount("save-failure-ro", 200)? else {
        return Ok(());
    };
    let out = fs.0.join("out");
    let dir = fs.0.clone();
    let remount_ro = move || {
        let ok = Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(&dir)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "remounting read-only");
    };
    fails_at_step_two(&out, SaveFailureKind::ReadOnly, remount_ro, || {
        fs.remount("rw")
    })
}

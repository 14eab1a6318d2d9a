//! The per-step profile (`TCHTRAIN_PROFILE=1`): where a training run's time goes, by phase
//! of the loop: reading and collating batches, forward, backward, the optimizer (gradient
//! norm, clipping, step, scheduler, zeroing), the callbacks, and logging / saving /
//! evaluation. Printed to stderr at the end of `train` and written to
//! `output_dir/profile.json` (by the main process).
//!
//! The phases are cut by wall-clock marks in the loop; with a CUDA device, each mark first
//! synchronises the device so that queued kernels count where they were launched (profiling
//! then costs a little speed). Off by default: no marks, no synchronisation.

use std::time::{Duration, Instant};

use tch::Device;

/// A phase of the training loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Reading, collating and moving the accumulation window's batches, counting its items.
    Data,
    /// `compute_loss` (the model's forward and the loss).
    Forward,
    /// `loss.backward()` (and the gradient all-reduce of a data-parallel run).
    Backward,
    /// Gradient norm and clipping, the optimizer and scheduler steps, zeroing.
    Optimizer,
    /// `on_step_begin` / `on_substep_end` / `on_step_end` and the other callback events.
    Callbacks,
    /// Logging, saving checkpoints and evaluating (`_maybe_log_save_evaluate`).
    LogSaveEvaluate,
    /// The rest (loss accumulation, FLOP and token counting).
    Other,
}

const PHASES: [(Phase, &str); 7] = [
    (Phase::Data, "data"),
    (Phase::Forward, "forward"),
    (Phase::Backward, "backward"),
    (Phase::Optimizer, "optimizer"),
    (Phase::Callbacks, "callbacks"),
    (Phase::LogSaveEvaluate, "log_save_evaluate"),
    (Phase::Other, "other"),
];

/// Whether profiling was asked for (`TCHTRAIN_PROFILE` set to anything but `0` / empty).
pub(crate) fn requested() -> bool {
    std::env::var("TCHTRAIN_PROFILE").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Accumulated time per phase over a `train` call.
#[derive(Debug)]
pub(crate) struct StepProfile {
    device: Device,
    totals: [Duration; PHASES.len()],
    last: Instant,
    steps: u64,
}

impl StepProfile {
    /// Starts profiling (the loop calls [`mark`](Self::mark) after each phase).
    pub(crate) fn start(device: Device) -> Self {
        Self {
            device,
            totals: [Duration::ZERO; PHASES.len()],
            last: Instant::now(),
            steps: 0,
        }
    }

    fn sync(&self) {
        if let Device::Cuda(i) = self.device {
            tch::Cuda::synchronize(i as i64);
        }
    }

    fn add(&mut self, phase: Phase, d: Duration) {
        if let Some(i) = PHASES.iter().position(|(p, _)| *p == phase) {
            self.totals[i] += d;
        }
    }

    /// Charges the time since the previous mark to `phase`.
    pub(crate) fn mark(&mut self, phase: Phase) {
        self.sync();
        let now = Instant::now();
        self.add(phase, now - self.last);
        self.last = now;
    }

    /// Charges the time since the previous mark to a training step: its `forward` part (as
    /// the step recorded it in its context's `forward_time`) to [`Phase::Forward`], the
    /// rest to [`Phase::Backward`].
    pub(crate) fn mark_training_step(&mut self, forward: Duration) {
        self.sync();
        let now = Instant::now();
        let total = now - self.last;
        let forward = forward.min(total);
        self.add(Phase::Forward, forward);
        self.add(Phase::Backward, total - forward);
        self.last = now;
    }

    /// Counts an optimizer step.
    pub(crate) fn step_done(&mut self) {
        self.steps += 1;
    }

    /// The profile as a table (phase, seconds, ms per step, share) and as JSON.
    pub(crate) fn report(&self) -> (String, serde_json::Value) {
        let total: f64 = self.totals.iter().map(Duration::as_secs_f64).sum();
        let steps = self.steps.max(1) as f64;
        let mut text = format!(
            "tchtrain profile: {} optimizer steps, {total:.3} s in the loop\n{:<18} {:>10} {:>12} {:>7}\n",
            self.steps, "phase", "total s", "ms / step", "share"
        );
        let mut json = serde_json::Map::new();
        for ((_, name), d) in PHASES.iter().zip(self.totals) {
            let s = d.as_secs_f64();
            let share = if total > 0.0 { 100.0 * s / total } else { 0.0 };
            text.push_str(&format!(
                "{name:<18} {s:>10.3} {:>12.3} {share:>6.1}%\n",
                1e3 * s / steps
            ));
            json.insert(
                (*name).to_string(),
                serde_json::json!({"seconds": s, "ms_per_step": 1e3 * s / steps, "share": share / 100.0}),
            );
        }
        json.insert("steps".into(), serde_json::json!(self.steps));
        json.insert("seconds".into(), serde_json::json!(total));
        (text, serde_json::Value::Object(json))
    }
}

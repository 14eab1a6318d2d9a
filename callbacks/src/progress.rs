//! `ProgressCallback`: progress bars for training and evaluation (indicatif in place of tqdm).

use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use tchtrain_training_args::TrainingArguments;

use crate::error::Result;
use crate::printer::{format_g, format_logs};
use crate::trainer_callback::TrainerCallback;
use crate::trainer_control::TrainerControl;
use crate::trainer_state::TrainerState;
use tchtrain_training_args::{JsonMap, JsonValue};

const TRAIN_TEMPLATE: &str =
    "{percent:>3}%|{wide_bar}| {pos}/{len} [{elapsed_precise}<{eta_precise}, {per_sec}] {msg}";
const EVAL_TEMPLATE: &str =
    "{percent:>3}%|{wide_bar}| {pos}/{len} [{elapsed_precise}<{eta_precise}, {per_sec}]";

/// The process's resident memory in bytes (`VmRSS` of `/proc/self/status`); `None` where
/// there is no such file. Host memory only: this crate does not link libtorch, so it cannot
/// ask the CUDA caching allocator what it holds.
pub fn current_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let kib: u64 = line.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

/// A rate in a few characters: `812.5`, `12.3k`, `4.57M`.
fn format_rate(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.1}")
    }
}

/// Bytes in binary units: `734MiB` below a GiB, `1.20GiB` from there.
fn format_bytes(bytes: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    const GIB: f64 = 1024.0 * MIB;
    let b = bytes as f64;
    if b >= GIB {
        format!("{:.2}GiB", b / GIB)
    } else {
        format!("{:.0}MiB", b / MIB)
    }
}

/// The text beside the training bar: the last logged loss and learning rate (Python's
/// `{:.4g}`), the input tokens per second since the last log, and the process's memory, each
/// left out when unknown: `loss=2.5 lr=1e-05 tok/s=12.3k mem=1.20GiB`.
pub fn format_postfix(
    loss: Option<f64>,
    learning_rate: Option<f64>,
    tokens_per_second: Option<f64>,
    memory_bytes: Option<u64>,
) -> String {
    let mut parts = Vec::new();
    if let Some(loss) = loss {
        parts.push(format!("loss={}", format_g(loss, 4)));
    }
    if let Some(lr) = learning_rate {
        parts.push(format!("lr={}", format_g(lr, 4)));
    }
    if let Some(rate) = tokens_per_second {
        parts.push(format!("tok/s={}", format_rate(rate)));
    }
    if let Some(bytes) = memory_bytes {
        parts.push(format!("mem={}", format_bytes(bytes)));
    }
    parts.join(" ")
}

/// Upstream `ProgressCallback`: a training bar (step / total, rate, ETA) and an evaluation
/// bar, on the world's main process only. The bars draw on stderr and stay quiet when it is
/// not a terminal; the logs dict is printed above the bar (on stdout when no bar is drawn), as
/// tqdm's `write` does.
///
/// Beside the training bar ([`format_postfix`], refreshed as steps end, at most every
/// 100 ms): the last logged loss and learning rate, the input tokens per second since the last
/// log (from `state.num_input_tokens_seen`, which the Trainer counts when
/// `include_num_input_tokens_seen` is on; left out otherwise) and the process's resident
/// memory ([`current_rss_bytes`]; host memory only, the GPU's is not known to this crate).
/// Upstream's bar shows none of these.
pub struct ProgressCallback {
    /// Strings in the logs longer than this are replaced by a note.
    pub max_str_len: usize,
    multi: MultiProgress,
    training_bar: Option<ProgressBar>,
    prediction_bar: Option<ProgressBar>,
    current_step: i64,
    last_loss: Option<f64>,
    last_learning_rate: Option<f64>,
    /// Where the tokens-per-second window starts: the time and `num_input_tokens_seen` of the
    /// last log (or of the beginning of training).
    window_start: Option<(Instant, i64)>,
    message_refreshed: Option<Instant>,
}

/// How often step ends refresh the text beside the training bar.
const MESSAGE_REFRESH: Duration = Duration::from_millis(100);

impl std::fmt::Debug for ProgressCallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProgressCallback")
            .field("max_str_len", &self.max_str_len)
            .field("training_position", &self.training_position())
            .field("current_step", &self.current_step)
            .finish()
    }
}

impl Default for ProgressCallback {
    fn default() -> Self {
        Self::new(100)
    }
}

impl ProgressCallback {
    /// Bars drawn on stderr (hidden when it is not a terminal); `max_str_len` as upstream (default 100).
    pub fn new(max_str_len: usize) -> Self {
        Self::with_draw_target(max_str_len, ProgressDrawTarget::stderr())
    }

    /// Bars drawn on `target` (e.g. `ProgressDrawTarget::hidden()` in tests).
    pub fn with_draw_target(max_str_len: usize, target: ProgressDrawTarget) -> Self {
        Self {
            max_str_len,
            multi: MultiProgress::with_draw_target(target),
            training_bar: None,
            prediction_bar: None,
            current_step: 0,
            last_loss: None,
            last_learning_rate: None,
            window_start: None,
            message_refreshed: None,
        }
    }

    /// The text beside the training bar, while training runs.
    pub fn training_message(&self) -> Option<String> {
        self.training_bar.as_ref().map(|b| b.message().to_string())
    }

    /// Tokens per second since the window start, when tokens are counted and time has passed.
    fn tokens_per_second(&self, state: &TrainerState) -> Option<f64> {
        let (start, tokens) = self.window_start?;
        let seconds = start.elapsed().as_secs_f64();
        let seen = state.num_input_tokens_seen - tokens;
        (state.num_input_tokens_seen > 0 && seen >= 0 && seconds > 0.0)
            .then(|| seen as f64 / seconds)
    }

    /// Refreshes the text beside the bar; at steps, at most every
    /// [`MESSAGE_REFRESH`] (reading the memory costs a file read).
    fn update_message(&mut self, state: &TrainerState, at_step: bool) {
        let now = Instant::now();
        if at_step
            && self
                .message_refreshed
                .is_some_and(|t| now.duration_since(t) < MESSAGE_REFRESH)
        {
            return;
        }
        self.message_refreshed = Some(now);
        if let Some(bar) = &self.training_bar {
            bar.set_message(format_postfix(
                self.last_loss,
                self.last_learning_rate,
                self.tokens_per_second(state),
                current_rss_bytes(),
            ));
        }
    }

    /// Position and length of the training bar while training runs.
    pub fn training_position(&self) -> Option<(u64, u64)> {
        self.training_bar
            .as_ref()
            .map(|b| (b.position(), b.length().unwrap_or(0)))
    }

    /// Position and length of the evaluation bar while an evaluation runs.
    pub fn prediction_position(&self) -> Option<(u64, u64)> {
        self.prediction_bar
            .as_ref()
            .map(|b| (b.position(), b.length().unwrap_or(0)))
    }

    fn style(template: &str) -> ProgressStyle {
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar())
    }

    fn close_prediction_bar(&mut self) {
        if let Some(bar) = self.prediction_bar.take() {
            // tqdm's `leave=self.training_bar is None`.
            if self.training_bar.is_some() {
                bar.finish_and_clear();
                self.multi.remove(&bar);
            } else {
                bar.finish();
            }
        }
    }
}

impl TrainerCallback for ProgressCallback {
    fn on_train_begin(
        &mut self,
        _: &TrainingArguments,
        state: &TrainerState,
        _: &mut TrainerControl,
    ) -> Result<()> {
        if state.is_world_process_zero {
            let bar = self
                .multi
                .add(ProgressBar::new(state.max_steps.max(0) as u64));
            bar.set_style(Self::style(TRAIN_TEMPLATE));
            self.training_bar = Some(bar);
            self.window_start = Some((Instant::now(), state.num_input_tokens_seen));
            self.update_message(state, false);
        }
        self.current_step = 0;
        Ok(())
    }

    fn on_step_end(
        &mut self,
        _: &TrainingArguments,
        state: &TrainerState,
        _: &mut TrainerControl,
    ) -> Result<()> {
        if state.is_world_process_zero
            && let Some(bar) = &self.training_bar
        {
            bar.inc((state.global_step - self.current_step).max(0) as u64);
            self.current_step = state.global_step;
            self.update_message(state, true);
        }
        Ok(())
    }

    fn on_prediction_step(
        &mut self,
        _: &TrainingArguments,
        state: &TrainerState,
        _: &mut TrainerControl,
        eval_dataloader_len: Option<usize>,
    ) -> Result<()> {
        if let (true, Some(len)) = (state.is_world_process_zero, eval_dataloader_len) {
            let bar = self.prediction_bar.get_or_insert_with(|| {
                let bar = self.multi.add(ProgressBar::new(len as u64));
                bar.set_style(Self::style(EVAL_TEMPLATE));
                bar
            });
            bar.inc(1);
        }
        Ok(())
    }

    fn on_evaluate(
        &mut self,
        _: &TrainingArguments,
        state: &TrainerState,
        _: &mut TrainerControl,
        _: &JsonMap,
    ) -> Result<()> {
        if state.is_world_process_zero {
            self.close_prediction_bar();
        }
        Ok(())
    }

    fn on_predict(
        &mut self,
        _: &TrainingArguments,
        state: &TrainerState,
        _: &mut TrainerControl,
        _: &JsonMap,
    ) -> Result<()> {
        if state.is_world_process_zero {
            self.close_prediction_bar();
        }
        Ok(())
    }

    fn on_log(
        &mut self,
        _: &TrainingArguments,
        state: &TrainerState,
        _: &mut TrainerControl,
        logs: &JsonMap,
    ) -> Result<()> {
        if self.training_bar.is_none() || !state.is_world_process_zero {
            return Ok(());
        }
        let line = format_logs(logs, Some(self.max_str_len));
        if self.multi.is_hidden() {
            println!("{line}");
        } else {
            let _ = self.multi.println(line);
        }
        let num = |k: &str| logs.get(k).and_then(JsonValue::as_f64);
        if let Some(loss) = num("loss") {
            self.last_loss = Some(loss);
        }
        if let Some(lr) = num("learning_rate") {
            self.last_learning_rate = Some(lr);
        }
        self.update_message(state, false);
        // The next rate counts from this log on.
        if num("loss").is_some() {
            self.window_start = Some((Instant::now(), state.num_input_tokens_seen));
        }
        Ok(())
    }

    fn on_train_end(
        &mut self,
        _: &TrainingArguments,
        state: &TrainerState,
        _: &mut TrainerControl,
    ) -> Result<()> {
        if state.is_world_process_zero
            && let Some(bar) = self.training_bar.take()
        {
            bar.finish();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postfix_shows_loss_lr_tokens_and_memory() {
        assert_eq!(
            format_postfix(Some(2.5), Some(1e-5), Some(12_345.6), Some(1_288_490_189)),
            "loss=2.5 lr=1e-05 tok/s=12.3k mem=1.20GiB"
        );
        assert_eq!(
            format_postfix(
                Some(27.69833755493164),
                Some(0.0003),
                Some(812.54),
                Some(734 << 20)
            ),
            "loss=27.7 lr=0.0003 tok/s=812.5 mem=734MiB"
        );
        assert_eq!(
            format_postfix(None, None, Some(4_567_891.0), None),
            "tok/s=4.57M"
        );
        assert_eq!(
            format_postfix(None, None, None, Some(3 << 30)),
            "mem=3.00GiB"
        );
        assert_eq!(format_postfix(None, None, None, None), "");
    }

    #[test]
    fn resident_memory_is_read_from_proc() {
        let rss = current_rss_bytes().expect("Linux has /proc/self/status");
        // A test binary holds at least a megabyte and less than a terabyte.
        assert!((1 << 20..1 << 40).contains(&rss), "{rss}");
    }
}

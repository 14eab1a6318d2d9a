//! `ProgressCallback`: progress bars for training and evaluation (indicatif in place of tqdm).

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

/// Upstream `ProgressCallback`: a training bar (step / total, rate, ETA, and the last loss and
/// learning rate) and an evaluation bar, on the world's main process only. The bars draw on
/// stderr and stay quiet when it is not a terminal; the logs dict is printed above the bar
/// (on stdout when no bar is drawn), as tqdm's `write` does.
pub struct ProgressCallback {
    /// Strings in the logs longer than this are replaced by a note.
    pub max_str_len: usize,
    multi: MultiProgress,
    training_bar: Option<ProgressBar>,
    prediction_bar: Option<ProgressBar>,
    current_step: i64,
}

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
        let Some(bar) = self
            .training_bar
            .as_ref()
            .filter(|_| state.is_world_process_zero)
        else {
            return Ok(());
        };
        let line = format_logs(logs, Some(self.max_str_len));
        if self.multi.is_hidden() {
            println!("{line}");
        } else {
            let _ = self.multi.println(line);
        }
        let num = |k: &str| logs.get(k).and_then(JsonValue::as_f64);
        let mut msg = Vec::new();
        if let Some(loss) = num("loss") {
            msg.push(format!("loss={}", format_g(loss, 4)));
        }
        if let Some(lr) = num("learning_rate") {
            msg.push(format!("lr={}", format_g(lr, 4)));
        }
        if !msg.is_empty() {
            bar.set_message(msg.join(" "));
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

//! `DefaultFlowCallback`: when to log, evaluate, save and stop, from the strategies in `TrainingArguments`.

use tchtrain_training_args::{IntervalStrategy, SaveStrategy, TrainingArguments};

use crate::error::Result;
use crate::trainer_callback::TrainerCallback;
use crate::trainer_control::TrainerControl;
use crate::trainer_state::TrainerState;

/// Upstream `DefaultFlowCallback`: the default flow of the training loop for logs,
/// evaluation and checkpoints. Every Trainer holds one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DefaultFlowCallback;

/// `step % every == 0`; a zero interval (which upstream's argument checks rule out, and
/// where Python would raise `ZeroDivisionError`) never matches.
fn is_multiple(step: i64, every: i64) -> bool {
    step.checked_rem(every) == Some(0)
}

impl TrainerCallback for DefaultFlowCallback {
    fn on_step_end(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        control: &mut TrainerControl,
    ) -> Result<()> {
        // Log
        if state.global_step == 1 && args.logging_first_step {
            control.should_log = true;
        }
        if args.logging_strategy == IntervalStrategy::Steps
            && is_multiple(state.global_step, state.logging_steps)
        {
            control.should_log = true;
        }

        // Evaluate
        let eval_due = args.eval_delay <= state.global_step as f64;
        if args.eval_strategy == IntervalStrategy::Steps
            && is_multiple(state.global_step, state.eval_steps)
            && eval_due
        {
            control.should_evaluate = true;
        }

        // Save
        if args.save_strategy == SaveStrategy::Steps
            && state.save_steps > 0
            && is_multiple(state.global_step, state.save_steps)
        {
            control.should_save = true;
        }

        // End training
        if state.global_step >= state.max_steps {
            control.should_training_stop = true;
            // Evaluate at the end with a step strategy unless this step already evaluates.
            if args.eval_strategy == IntervalStrategy::Steps
                && !is_multiple(state.global_step, state.eval_steps)
                && eval_due
            {
                control.should_evaluate = true;
            }
            // Save at the end with a step strategy.
            if args.save_strategy == SaveStrategy::Steps {
                control.should_save = true;
            }
        }
        Ok(())
    }

    fn on_epoch_end(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        control: &mut TrainerControl,
    ) -> Result<()> {
        if args.logging_strategy == IntervalStrategy::Epoch {
            control.should_log = true;
        }
        if args.eval_strategy == IntervalStrategy::Epoch && args.eval_delay <= state.epoch {
            control.should_evaluate = true;
        }
        if args.save_strategy == SaveStrategy::Epoch {
            control.should_save = true;
        }
        Ok(())
    }
}

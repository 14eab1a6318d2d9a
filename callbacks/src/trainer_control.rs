//! `TrainerControl`: the switches callbacks flip to steer the training loop.

use crate::error::{Error, Result};
use crate::exportable_state::{CallbackState, ExportableState};
use tchtrain_training_args::JsonValue;

/// Upstream `TrainerControl`: flags that callbacks set and the training loop acts on.
///
/// `should_training_stop` is reset at the start of training, `should_epoch_stop` at the start
/// of each epoch, and `should_save` / `should_evaluate` / `should_log` at the start of each
/// step (and individually once the save / evaluation / log has happened).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TrainerControl {
    /// Whether the training should be interrupted (never set back to `false` by the loop).
    pub should_training_stop: bool,
    /// Whether the current epoch should be interrupted.
    pub should_epoch_stop: bool,
    /// Whether the model should be saved at this step.
    pub should_save: bool,
    /// Whether the model should be evaluated at this step.
    pub should_evaluate: bool,
    /// Whether the logs should be reported at this step.
    pub should_log: bool,
}

impl TrainerControl {
    /// Resets the flags for a new training (upstream `_new_training`).
    pub fn new_training(&mut self) {
        self.should_training_stop = false;
    }

    /// Resets the flags for a new epoch (upstream `_new_epoch`).
    pub fn new_epoch(&mut self) {
        self.should_epoch_stop = false;
    }

    /// Resets the flags for a new step (upstream `_new_step`).
    pub fn new_step(&mut self) {
        self.should_save = false;
        self.should_evaluate = false;
        self.should_log = false;
    }
}

impl ExportableState for TrainerControl {
    fn state(&self) -> CallbackState {
        let mut s = CallbackState::default();
        s.args
            .insert("should_training_stop", self.should_training_stop);
        s.args.insert("should_epoch_stop", self.should_epoch_stop);
        s.args.insert("should_save", self.should_save);
        s.args.insert("should_evaluate", self.should_evaluate);
        s.args.insert("should_log", self.should_log);
        s
    }

    fn from_state(state: &CallbackState) -> Result<Self> {
        let mut c = TrainerControl::default();
        for (key, value) in state.args.iter() {
            let flag = match key {
                "should_training_stop" => &mut c.should_training_stop,
                "should_epoch_stop" => &mut c.should_epoch_stop,
                "should_save" => &mut c.should_save,
                "should_evaluate" => &mut c.should_evaluate,
                "should_log" => &mut c.should_log,
                _ => {
                    return Err(Error::UnknownField {
                        what: "TrainerControl".into(),
                        field: format!("args.{key}"),
                    });
                }
            };
            *flag = bool_field(value, key)?;
        }
        if let Some((key, _)) = state.attributes.iter().next() {
            return Err(Error::UnknownField {
                what: "TrainerControl".into(),
                field: format!("attributes.{key}"),
            });
        }
        Ok(c)
    }
}

fn bool_field(value: &JsonValue, key: &str) -> Result<bool> {
    value.as_bool().ok_or_else(|| Error::FieldType {
        what: "TrainerControl".into(),
        field: format!("args.{key}"),
        expected: "a bool",
        found: value.type_name().into(),
    })
}

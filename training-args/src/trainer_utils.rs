//! The strategy enums of upstream `trainer_utils.py` (`IntervalStrategy`, `SaveStrategy`, ...).

use serde::{Deserialize, Serialize};

/// When to log or evaluate: upstream `IntervalStrategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IntervalStrategy {
    /// Never.
    #[default]
    No,
    /// Every `*_steps` optimizer steps.
    Steps,
    /// At the end of every epoch.
    Epoch,
}

/// When to save a checkpoint: upstream `SaveStrategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SaveStrategy {
    /// Never.
    No,
    /// Every `save_steps` optimizer steps.
    #[default]
    Steps,
    /// At the end of every epoch.
    Epoch,
    /// Whenever a new best metric is reached.
    Best,
}

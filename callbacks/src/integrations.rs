//! `report_to`: the logger callbacks named in `TrainingArguments.report_to`.

use crate::error::{Error, Result};
use crate::jsonl::JsonlLoggerCallback;
use crate::tensorboard::TensorBoardCallback;
use crate::trainer_callback::TrainerCallback;

/// The `report_to` names this crate implements (`"all"` selects them all, `"none"` none).
pub const SUPPORTED_INTEGRATIONS: [&str; 2] = ["tensorboard", "jsonl"];

/// Upstream `get_reporting_integration_callbacks`: one logger callback per name in
/// `report_to`, in order. Names upstream knows but this crate does not implement (`wandb`,
/// `mlflow`, ...) are an error naming the supported ones.
pub fn get_reporting_integration_callbacks<S: AsRef<str>>(
    report_to: &[S],
) -> Result<Vec<Box<dyn TrainerCallback>>> {
    let mut names: Vec<&str> = Vec::new();
    for name in report_to.iter().map(AsRef::as_ref) {
        match name {
            "none" => {}
            "all" => names.extend(SUPPORTED_INTEGRATIONS),
            n if SUPPORTED_INTEGRATIONS.contains(&n) => names.push(n),
            other => {
                return Err(Error::UnknownIntegration {
                    name: other.to_string(),
                    supported: SUPPORTED_INTEGRATIONS.join(", "),
                });
            }
        }
    }
    names.dedup();
    Ok(names
        .into_iter()
        .map(|n| -> Box<dyn TrainerCallback> {
            if n == "tensorboard" {
                Box::new(TensorBoardCallback::new())
            } else {
                Box::new(JsonlLoggerCallback::new())
            }
        })
        .collect())
}

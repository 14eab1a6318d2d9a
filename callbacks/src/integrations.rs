//! `report_to`: the logger callbacks named in `TrainingArguments.report_to`.

use crate::error::{Error, Result};
use crate::jsonl::JsonlLoggerCallback;
use crate::mlflow::MLflowCallback;
use crate::mlflow_settings::is_mlflow_available;
use crate::tensorboard::TensorBoardCallback;
use crate::trainer_callback::TrainerCallback;
use crate::wandb::WandbCallback;

/// The `report_to` names this crate implements (`"all"` selects those available, `"none"`
/// none), in upstream's order.
pub const SUPPORTED_INTEGRATIONS: [&str; 4] = ["mlflow", "tensorboard", "wandb", "jsonl"];

/// Upstream `get_available_reporting_integrations`, over [`SUPPORTED_INTEGRATIONS`]: `mlflow`
/// when [`is_mlflow_available`] (a tracking server is named in `MLFLOW_TRACKING_URI`, and
/// `DISABLE_MLFLOW_INTEGRATION` is not `TRUE`), then `tensorboard`, `wandb` when
/// `WANDB_MODE` is `offline` (the only mode written here; upstream's is installed), and
/// `jsonl`.
pub fn get_available_reporting_integrations() -> Vec<&'static str> {
    SUPPORTED_INTEGRATIONS
        .into_iter()
        .filter(|n| *n != "mlflow" || is_mlflow_available())
        .filter(|n| {
            *n != "wandb"
                || std::env::var("WANDB_MODE").is_ok_and(|m| m == "offline" || m == "dryrun")
        })
        .collect()
}

/// Upstream `get_reporting_integration_callbacks`: one logger callback per name in
/// `report_to`, in order (`"all"`: [`get_available_reporting_integrations`]). Names upstream
/// knows but this crate does not implement (`wandb`, `comet_ml`, ...) are an error naming the
/// supported ones; `mlflow` reads its settings from the environment
/// ([`MLflowSettings::from_env`](crate::MLflowSettings::from_env)) and refuses those it cannot honour.
pub fn get_reporting_integration_callbacks<S: AsRef<str>>(
    report_to: &[S],
) -> Result<Vec<Box<dyn TrainerCallback>>> {
    let mut names: Vec<&str> = Vec::new();
    for name in report_to.iter().map(AsRef::as_ref) {
        match name {
            "none" => {}
            "all" => names.extend(get_available_reporting_integrations()),
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
    names
        .into_iter()
        .map(|n| -> Result<Box<dyn TrainerCallback>> {
            Ok(match n {
                "mlflow" => Box::new(MLflowCallback::new()?),
                "tensorboard" => Box::new(TensorBoardCallback::new()),
                "wandb" => Box::new(WandbCallback::new()?),
                _ => Box::new(JsonlLoggerCallback::new()),
            })
        })
        .collect()
}

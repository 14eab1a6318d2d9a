//! `report_to`: the logger callbacks named in `TrainingArguments.report_to`.

use crate::clearml::ClearMLCallback;
use crate::codecarbon::{CodeCarbonCallback, codecarbon_is_configured};
use crate::comet::CometCallback;
use crate::dvclive::DVCLiveCallback;
use crate::error::{Error, Result};
use crate::jsonl::JsonlLoggerCallback;
use crate::kubeflow::{KubeflowCallback, is_kubeflow_available};
use crate::mlflow::MLflowCallback;
use crate::mlflow_settings::is_mlflow_available;
use crate::swanlab::SwanLabCallback;
use crate::tensorboard::TensorBoardCallback;
use crate::trackio::TrackioCallback;
use crate::trainer_callback::TrainerCallback;
use crate::wandb::WandbCallback;

/// The `report_to` names this crate implements (`"all"` selects those available, `"none"`
/// none), in upstream's order.
pub const SUPPORTED_INTEGRATIONS: [&str; 11] = [
    "comet_ml",
    "dvclive",
    "mlflow",
    "tensorboard",
    "wandb",
    "codecarbon",
    "clearml",
    "trackio",
    "swanlab",
    "kubeflow",
    "jsonl",
];

/// Upstream `get_available_reporting_integrations`, over [`SUPPORTED_INTEGRATIONS`]:
/// `comet_ml` when `COMET_API_KEY` is set (upstream's condition: a configured key) and
/// `COMET_START_ONLINE` is false (the offline archive, the only mode written here), `mlflow`
/// when [`is_mlflow_available`] (a tracking server is named in `MLFLOW_TRACKING_URI`, and
/// `DISABLE_MLFLOW_INTEGRATION` is not `TRUE`), then `tensorboard`, `wandb` when
/// `WANDB_MODE` is `offline`, or online (unset or `online`) with an API key configured
/// (upstream's: installed; without a key wandb refuses to start), `codecarbon` when a codecarbon
/// configuration is present ([`codecarbon_is_configured`]: a `CODECARBON_*` variable or a
/// `.codecarbon.config`; upstream's: installed), `clearml` when
/// `CLEARML_OFFLINE_MODE` is true (the offline session, the only mode written here; upstream's:
/// installed), `trackio` when `TRACKIO_DIR` is set (upstream's: when the package is installed; here the
/// store's folder says the user wants one, so that `all` does not fill `$HF_HOME`), `swanlab`
/// when `SWANLAB_MODE` is `offline` (the only mode written here; upstream's: installed),
/// `kubeflow` when [`is_kubeflow_available`] (inside a Kubeflow TrainJob, as upstream), and
/// `jsonl`. Not `dvclive` (upstream's: when the package is installed): it writes `dvclive/`
/// and `dvc.yaml` into the working directory, so it is named explicitly.
pub fn get_available_reporting_integrations() -> Vec<&'static str> {
    SUPPORTED_INTEGRATIONS
        .into_iter()
        .filter(|n| *n != "dvclive")
        .filter(|n| {
            *n != "comet_ml"
                || (std::env::var_os("COMET_API_KEY").is_some_and(|k| !k.is_empty())
                    && std::env::var("COMET_START_ONLINE").is_ok_and(|v| {
                        matches!(
                            v.to_lowercase().as_str(),
                            "f" | "false" | "no" | "n" | "off" | "0"
                        )
                    }))
        })
        .filter(|n| *n != "mlflow" || is_mlflow_available())
        .filter(|n| *n != "wandb" || crate::wandb::wandb_is_configured())
        .filter(|n| *n != "codecarbon" || codecarbon_is_configured())
        .filter(|n| {
            *n != "trackio" || std::env::var_os("TRACKIO_DIR").is_some_and(|d| !d.is_empty())
        })
        .filter(|n| *n != "swanlab" || std::env::var("SWANLAB_MODE").is_ok_and(|m| m == "offline"))
        .filter(|n| {
            *n != "clearml"
                || std::env::var("CLEARML_OFFLINE_MODE").is_ok_and(|m| {
                    matches!(
                        m.to_lowercase().as_str(),
                        "y" | "yes" | "t" | "true" | "on" | "1"
                    )
                })
        })
        .filter(|n| *n != "kubeflow" || is_kubeflow_available())
        .collect()
}

/// The integrations `report_to` names, resolved (`"all"`: [`get_available_reporting_integrations`],
/// `"none"`: none), in order and without repeats; names upstream knows but this crate does
/// not implement (`neptune`, ...) are an error naming the supported ones.
pub fn reporting_integrations<S: AsRef<str>>(report_to: &[S]) -> Result<Vec<&'static str>> {
    let mut names: Vec<&'static str> = Vec::new();
    for name in report_to.iter().map(AsRef::as_ref) {
        match name {
            "none" => {}
            "all" => names.extend(get_available_reporting_integrations()),
            n => match SUPPORTED_INTEGRATIONS.iter().find(|s| **s == n) {
                Some(s) => names.push(s),
                None => {
                    return Err(Error::UnknownIntegration {
                        name: n.to_string(),
                        reason: unsupported_reason(n)
                            .map(|r| format!(": {r}"))
                            .unwrap_or_default(),
                        supported: SUPPORTED_INTEGRATIONS.join(", "),
                    });
                }
            },
        }
    }
    names.dedup();
    Ok(names)
}

/// Why an integration upstream knows is not implemented here.
fn unsupported_reason(name: &str) -> Option<&'static str> {
    Some(match name {
        "neptune" => {
            "Neptune's hosted service shut down on 2026-03-05 (an offline run has nowhere to be synced) and upstream deprecates its integration, recommending the other trackers"
        }
        "dagshub" => {
            "DagsHub's callback logs through the dagshub package to a DagsHub repository, not implemented here; a DagsHub repository is an MLflow tracking server: use mlflow with MLFLOW_TRACKING_URI"
        }
        "azure_ml" => {
            "it logs to the run context of a job running inside Azure ML (azureml.core), which does not exist here; Azure ML workspaces are MLflow tracking servers: use mlflow"
        }
        "flyte" => {
            "it writes Flyte Decks inside a Flyte task's execution (flytekit), which does not exist here"
        }
        _ => return None,
    })
}

/// Upstream `get_reporting_integration_callbacks`: one logger callback per name in
/// `report_to`, in order ([`reporting_integrations`]); `mlflow` reads its settings from the
/// environment ([`MLflowSettings::from_env`](crate::MLflowSettings::from_env)) and refuses
/// those it cannot honour, as `wandb` does ([`WandbSettings`](crate::WandbSettings)).
pub fn get_reporting_integration_callbacks<S: AsRef<str>>(
    report_to: &[S],
) -> Result<Vec<Box<dyn TrainerCallback>>> {
    reporting_integrations(report_to)?
        .into_iter()
        .map(|n| -> Result<Box<dyn TrainerCallback>> {
            Ok(match n {
                "comet_ml" => Box::new(CometCallback::new()?),
                "dvclive" => Box::new(DVCLiveCallback::new()?),
                "mlflow" => Box::new(MLflowCallback::new()?),
                "tensorboard" => Box::new(TensorBoardCallback::new()),
                "wandb" => Box::new(WandbCallback::new()?),
                "codecarbon" => Box::new(CodeCarbonCallback::new()?),
                "clearml" => Box::new(ClearMLCallback::new()?),
                "trackio" => Box::new(TrackioCallback::new()),
                "swanlab" => Box::new(SwanLabCallback::new()?),
                "kubeflow" => Box::new(KubeflowCallback::new()?),
                _ => Box::new(JsonlLoggerCallback::new()),
            })
        })
        .collect()
}

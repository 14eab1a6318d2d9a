//! `tchtrain-callbacks` — TrainerState, TrainerControl and TrainerCallback as in transformers 5.23 trainer_callback.py.
//!
//! Owns `TrainerState` (the exact `trainer_state.json` schema), `TrainerControl`, the `TrainerCallback` trait and the built-in callbacks and loggers.
//!
//! Mirrors upstream transformers/trainer_callback.py; names follow upstream so a transformers user finds each
//! concept where they expect it.
//!
//! The training loop owns a [`TrainerState`] and a [`TrainerControl`] and lends them to the
//! [`CallbackHandler`] at every event; callbacks decide by setting flags, the loop acts:
//!
//! ```
//! use tchtrain_callbacks::{CallbackHandler, DefaultFlowCallback, JsonMap, TrainerControl, TrainerState};
//! use tchtrain_training_args::TrainingArguments;
//!
//! # fn main() -> tchtrain_callbacks::Result<()> {
//! let args = TrainingArguments { logging_steps: 2.0, max_steps: 4, ..Default::default() };
//! let mut handler = CallbackHandler::new(vec![Box::new(DefaultFlowCallback)]);
//! let mut state = TrainerState::default();
//! let mut control = TrainerControl::default();
//! state.compute_steps(&args, 4);
//! state.max_steps = 4;
//! handler.on_train_begin(&args, &state, &mut control)?;
//! handler.on_epoch_begin(&args, &state, &mut control)?;
//! while !control.should_training_stop {
//!     handler.on_step_begin(&args, &state, &mut control)?;
//!     // ... forward, backward, optimizer step ...
//!     state.global_step += 1;
//!     state.epoch = state.global_step as f64 / 4.0;
//!     handler.on_step_end(&args, &state, &mut control)?;
//!     if control.should_log {
//!         let mut logs = JsonMap::new();
//!         logs.insert("loss", 0.5);
//!         logs.insert("epoch", state.epoch);
//!         let mut entry = logs.clone();
//!         entry.insert("step", state.global_step);
//!         state.log_history.push(entry);
//!         handler.on_log(&args, &state, &mut control, &logs)?;
//!     }
//!     if control.should_save {
//!         // ... write checkpoint-N/, then its trainer_state.json:
//!         state.update_stateful_callbacks(handler.exportable_states(&control));
//!         handler.on_save(&args, &state, &mut control)?;
//!     }
//! }
//! assert_eq!(state.log_history.len(), 2);
//! # Ok(())
//! # }
//! ```

mod args_dict;
mod callback_handler;
mod checksum_time;
mod clearml;
mod codecarbon;
mod codecarbon_data;
mod codecarbon_machine;
mod comet;
mod default_flow;
mod dvclive;
mod early_stopping;
mod error;
mod event_file;
mod exportable_state;
mod integrations;
mod jsonl;
mod kubeflow;
mod leveldb_log;
mod mlflow;
mod mlflow_rest;
mod mlflow_settings;
mod model_config;
mod printer;
mod progress;
mod protobuf;
mod pyyaml;
mod swanlab;
mod tensorboard;
mod trackio;
mod trainer_callback;
mod trainer_control;
mod trainer_state;
mod wandb;
mod wandb_api;
mod wandb_artifact;

pub use callback_handler::CallbackHandler;
pub use clearml::{ClearMLCallback, ClearMLSettings, config_dict_to_text};
pub use codecarbon::{
    CODECARBON_VERSION, Cell as CodeCarbonCell, CodeCarbonCallback, CodeCarbonLogLevel,
    CodeCarbonSettings, DEFAULT_EXPERIMENT_ID, EMISSIONS_CSV_COLUMNS, EmissionsTracker,
    MachineFacts, codecarbon_is_configured, lock_file_path, write_row as write_emissions_row,
};
pub use codecarbon_data::{
    CODECARBON_DATA_FILES, CloudMetadata, Emissions, GeoMetadata, cloud_location, countries_table,
    csv_rows as codecarbon_csv_rows, estimate_dimm_count, match_cpu, ram_power_watts,
};
pub use codecarbon_machine::LocationServices;
pub use comet::{CometCallback, CometMode, CometSettings};
pub use default_flow::DefaultFlowCallback;
pub use dvclive::{DVCLiveCallback, DVCLiveSettings, dump_yaml, standardize_metric_name};
pub use early_stopping::EarlyStoppingCallback;
pub use error::{Error, Result};
pub use event_file::{EventFileWriter, crc32c, masked_crc32c, tfrecord};
pub use exportable_state::{CallbackState, ExportableState};
pub use integrations::{
    SUPPORTED_INTEGRATIONS, get_available_reporting_integrations,
    get_reporting_integration_callbacks, reporting_integrations,
};
pub use jsonl::{JsonlLoggerCallback, METRICS_JSONL_NAME};
pub use kubeflow::{
    KubeflowCallback, KubeflowSettings, MIN_UPDATE_INTERVAL, is_kubeflow_available,
};
pub use leveldb_log::crc32;
pub use mlflow::{
    MLFLOW_MAX_PARAM_VAL_LENGTH, MLflowCallback, mlflow_metrics, mlflow_params,
    sanitize_metric_name,
};
pub use mlflow_settings::{MLflowSettings, is_mlflow_available};
pub use model_config::ModelConfig;
pub use printer::{PrinterCallback, format_g, format_logs};
pub use progress::{ProgressCallback, current_rss_bytes, format_postfix};
pub use pyyaml::safe_dump;
pub use swanlab::{
    DEFAULT_LOG_DIR as SWANLAB_DEFAULT_LOG_DIR, SwanLabCallback, SwanLabResume, SwanLabSettings,
};
pub use tchtrain_training_args::{
    JsonMap, JsonSyntaxError, JsonValue, dumps, loads, python_float_repr,
};
pub use tensorboard::{TensorBoardCallback, default_logdir, rewrite_logs, sanitized_hparams};
pub use trackio::{
    TRACKIO_SCHEMA_VERSION, TrackioCallback, TrackioSettings, canonical_project_name,
    check_trackio_args, generate_readable_name,
};
pub use trainer_callback::TrainerCallback;
pub use trainer_control::TrainerControl;
pub use trainer_state::{NumberForms, TrainerState, TrainingReferences};
pub use wandb::{WandbCallback, WandbLogModel, WandbOnline, WandbSettings};

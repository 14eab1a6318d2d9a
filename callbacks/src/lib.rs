//! `tchtrain-callbacks` — TrainerState, TrainerControl and TrainerCallback as in transformers 5.23 trainer_callback.py.
//!
//! Owns `TrainerState` (the exact `trainer_state.json` schema), `TrainerControl`, the `TrainerCallback` trait and the built-in callbacks and loggers.
//!
//! Mirrors upstream transformers/trainer_callback.py; names follow upstream so a transformers user finds each
//! concept where they expect it.

mod callback_handler;
mod default_flow;
mod early_stopping;
mod error;
mod event_file;
mod exportable_state;
mod integrations;
mod jsonl;
mod printer;
mod progress;
mod python_json;
mod tensorboard;
mod trainer_callback;
mod trainer_control;
mod trainer_state;

pub use callback_handler::CallbackHandler;
pub use default_flow::DefaultFlowCallback;
pub use early_stopping::EarlyStoppingCallback;
pub use error::{Error, Result};
pub use event_file::{EventFileWriter, crc32c, masked_crc32c, tfrecord};
pub use exportable_state::{CallbackState, ExportableState};
pub use integrations::{SUPPORTED_INTEGRATIONS, get_reporting_integration_callbacks};
pub use jsonl::{JsonlLoggerCallback, METRICS_JSONL_NAME};
pub use printer::{PrinterCallback, format_g, format_logs};
pub use progress::ProgressCallback;
pub use python_json::{JsonMap, JsonSyntaxError, JsonValue, dumps, loads, python_float_repr};
pub use tensorboard::{TensorBoardCallback, default_logdir, rewrite_logs};
pub use trainer_callback::TrainerCallback;
pub use trainer_control::TrainerControl;
pub use trainer_state::{NumberForms, TrainerState, TrainingReferences};

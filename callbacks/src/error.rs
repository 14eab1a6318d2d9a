//! The error type of `tchtrain-callbacks`.

use std::path::PathBuf;

use tchtrain_training_args::JsonSyntaxError;

/// Errors returned by `tchtrain-callbacks`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A JSON document could not be read or written.
    #[error("JSON error: {0}")]
    Json(#[from] serde_json::Error),

    /// A file could not be read, written or created.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done (`"reading"`, `"writing"`, `"creating"`).
        action: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A JSON text is not valid JSON.
    #[error("{what} is not valid JSON: {source}")]
    JsonSyntax {
        /// The file (or `"the JSON text"` for a string).
        what: String,
        /// Where and why.
        #[source]
        source: JsonSyntaxError,
    },

    /// A field of a JSON document has the wrong type or an invalid value.
    #[error("{what}: field `{field}` must be {expected}, found {found}")]
    FieldType {
        /// The document (file name or type name).
        what: String,
        /// The field, with its path inside the document (`log_history[3]`).
        field: String,
        /// What the field must hold.
        expected: &'static str,
        /// What it holds (a Python type name or value).
        found: String,
    },

    /// A JSON document holds a field the type does not know (upstream's `TypeError:
    /// __init__() got an unexpected keyword argument`).
    #[error("{what}: unexpected field `{field}` (transformers 5.23 does not write it)")]
    UnknownField {
        /// The document (file name or type name).
        what: String,
        /// The unexpected field.
        field: String,
    },

    /// A required field is missing from a JSON document.
    #[error("{what}: missing field `{field}`")]
    MissingField {
        /// The document (file name or type name).
        what: String,
        /// The missing field.
        field: String,
    },

    /// A callback was used with training arguments it cannot work with (upstream's
    /// `assert` in `EarlyStoppingCallback.on_train_begin`).
    #[error("{callback} requires {requirement}; {fix}")]
    CallbackRequirement {
        /// The callback's class name.
        callback: &'static str,
        /// What it needs.
        requirement: &'static str,
        /// How to fix it.
        fix: &'static str,
    },

    /// A `report_to` name this crate has no logger for.
    #[error(
        "report_to: unknown or unsupported integration `{name}`{reason}; supported: {supported}, \"all\", \"none\""
    )]
    UnknownIntegration {
        /// The name given.
        name: String,
        /// Why an integration upstream knows is not implemented (`": ..."`), else empty.
        reason: String,
        /// The names this crate supports.
        supported: String,
    },

    /// An MLflow environment variable (or [`MLflowSettings`](crate::MLflowSettings) field) holds
    /// a value this crate cannot honour: why, and what to do instead.
    #[error("{variable}={value:?}: {reason}")]
    MlflowSetting {
        /// The environment variable (`MLFLOW_TRACKING_URI`, `HF_MLFLOW_LOG_ARTIFACTS`, ...).
        variable: &'static str,
        /// Its value (empty when unset).
        value: String,
        /// Why it is refused and what to use instead.
        reason: String,
    },

    /// A W&B environment variable (or [`WandbSettings`](crate::WandbSettings) field) holds a
    /// value this crate cannot honour: why, and what to do instead.
    #[error("{variable}={value:?}: {reason}")]
    WandbSetting {
        /// The environment variable (`WANDB_MODE`, `WANDB_LOG_MODEL`, ...).
        variable: &'static str,
        /// Its value (empty when unset).
        value: String,
        /// Why it is refused and what to use instead.
        reason: String,
    },

    /// A request to the W&B server (`WANDB_BASE_URL`) failed.
    #[error("W&B {operation} at {base_url}: {}{message}", status.map(|s| format!("HTTP {s}: ")).unwrap_or_default())]
    WandbRequest {
        /// The GraphQL operation (`UpsertBucket`, ...), `file_stream`, or the upload.
        operation: String,
        /// The server's base URL.
        base_url: String,
        /// The HTTP status, when the server answered.
        status: Option<u16>,
        /// The server's answer, or the transport error, with the fix.
        message: String,
    },

    /// A W&B artifact cannot be logged as asked (its name, ...): why, and what to do instead.
    #[error("W&B artifact {name:?}: {reason}")]
    WandbArtifact {
        /// The artifact's name.
        name: String,
        /// Why, and what to do instead.
        reason: String,
    },

    /// A DVCLive environment variable, or the working directory's DVC state, asks for what
    /// this crate cannot honour: why, and what to do instead.
    #[error("dvclive: {setting}: {reason}")]
    DvcliveSetting {
        /// The environment variable and its value, or the file (`HF_DVCLIVE_LOG_MODEL="all"`,
        /// `dvc.yaml`).
        setting: String,
        /// Why it is refused and what to use instead.
        reason: String,
    },

    /// A Comet environment variable or config file asks for what this crate cannot honour
    /// (online mode, resuming an experiment, assets): why, and what to do instead.
    #[error("comet_ml: {setting}: {reason}")]
    CometSetting {
        /// The environment variable and its value, or the config file.
        setting: String,
        /// Why it is refused and what to use instead.
        reason: String,
    },

    /// `KubeflowCallback` outside a Kubeflow TrainJob (`KUBEFLOW_TRAINER_SERVER_URL` unset).
    #[error("kubeflow: {setting}: {reason}")]
    KubeflowSetting {
        /// The environment variable.
        setting: String,
        /// Why, and what to do instead.
        reason: String,
    },

    /// A SwanLab environment variable or settings file asks for what this crate cannot
    /// honour (cloud or local mode, model saving, settings not read here): why, and what to do
    /// instead.
    #[error("swanlab: {setting}: {reason}")]
    SwanLabSetting {
        /// The environment variable and its value, or the settings file.
        setting: String,
        /// Why it is refused and what to use instead.
        reason: String,
    },

    /// A ClearML setting (environment variable or `clearml.conf`) the ClearML logger cannot
    /// honour (online mode, model logging offline, settings not read here): why, and what to
    /// do instead.
    #[error("clearml: {setting}: {reason}")]
    ClearMLSetting {
        /// The environment variable and its value, or the settings file.
        setting: String,
        /// Why it is refused and what to use instead.
        reason: String,
    },

    /// A codecarbon setting (a `CODECARBON_*` variable or a `.codecarbon.config` key), or a
    /// machine, the CodeCarbon tracker cannot honour (outputs other than the CSV file, power
    /// sensors and GPUs it does not read, values codecarbon rejects): why, and what to do
    /// instead.
    #[error("codecarbon: {setting}: {reason}")]
    CodeCarbonSetting {
        /// The setting and its value, or what was found on the machine.
        setting: String,
        /// Why it is refused and what to use instead.
        reason: String,
    },

    /// A `TrainingArguments` field the Trackio logger cannot honour: why, and what to do
    /// instead.
    #[error("report_to trackio: {field}={value:?}: {reason}")]
    TrackioSetting {
        /// The field (`trackio_space_id`, `trackio_bucket_id`, ...).
        field: &'static str,
        /// Its value.
        value: String,
        /// Why it is refused and what to use instead.
        reason: String,
    },

    /// trackio's project database could not be opened, created or written.
    #[error("trackio database {}: {message}", .path.display())]
    Trackio {
        /// The database file.
        path: std::path::PathBuf,
        /// SQLite's message, or why the database is refused.
        message: String,
    },

    /// A request to the MLflow tracking server failed: the server answered with an error, or
    /// could not be reached.
    #[error("MLflow {endpoint} at {uri}: {}{message}", .error_code.as_ref().map(|c| format!("{c}: ")).unwrap_or_default())]
    MlflowRequest {
        /// The REST endpoint (`runs/create`, `runs/log-batch`, ...).
        endpoint: &'static str,
        /// The tracking URI.
        uri: String,
        /// The HTTP status, when the server answered.
        status: Option<u16>,
        /// MLflow's `error_code` (`RESOURCE_DOES_NOT_EXIST`, `INVALID_PARAMETER_VALUE`, ...).
        error_code: Option<String>,
        /// MLflow's message, or the transport error.
        message: String,
    },

    /// An MLflow run or experiment cannot be used as asked (upstream's `MlflowException`s of
    /// `set_experiment` / `start_run`, with their messages).
    #[error("MLflow: {message}")]
    MlflowRun {
        /// The run or experiment concerned.
        id: String,
        /// What is wrong and how to fix it.
        message: String,
    },

    /// A user-defined callback failed: the extension point for third-party callbacks,
    /// whose errors this crate cannot name.
    #[error("callback {callback} failed: {source}")]
    Callback {
        /// The callback's name.
        callback: String,
        /// Its error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
}

impl Error {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Error::Io {
            action,
            path: path.into(),
            source,
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

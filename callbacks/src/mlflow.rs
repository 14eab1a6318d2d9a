//! `MLflowCallback`: sends the training arguments, the model config and the logs to an MLflow
//! tracking server (upstream integrations/integration_utils.py `MLflowCallback`), speaking
//! MLflow's REST API.
//!
//! Upstream drives the `mlflow` Python package's fluent API; this crate has no Python, so it
//! talks to a tracking server over HTTP (`mlflow server`, or any hosted MLflow) and refuses the
//! local stores (`file:`, `sqlite:`) only the Python package can write. What differs:
//!
//! - Params and metrics are sent synchronously (upstream queues them for a background thread
//!   with `synchronous=False`); as there, a failed params or metrics batch is logged as an
//!   error and training goes on, while failing to create or resume the run, to set the tags
//!   or to end the run is an error.
//! - Requests are not retried (the Python client retries with backoff,
//!   `MLFLOW_HTTP_REQUEST_MAX_RETRIES`); the timeout is `MLFLOW_HTTP_REQUEST_TIMEOUT` (120 s).
//! - The run's default tags are `mlflow.user`, `mlflow.source.name` (the program as started),
//!   `mlflow.source.type` (`LOCAL`) and `mlflow.runName`; the Python package also adds
//!   `mlflow.source.git.commit` when the script lies in a git checkout, which this crate does not.
//! - There is no process-wide active run: a run the caller started itself is named with
//!   [`MLflowCallback::with_active_run`] (upstream: a run already active in `mlflow`); then, as
//!   upstream, the callback logs into it and leaves it open, unless `MLFLOW_NESTED_RUN` asks for
//!   a child run.
//! - `MLFLOW_RUN_ID` is read once, when the callback is built; the Python package deletes it
//!   from the environment once used, this crate does not change the environment.
//! - `HF_MLFLOW_LOG_ARTIFACTS` is refused: upstream logs each checkpoint as an `mlflow.pyfunc`
//!   model, which only the Python package builds.
//! - A config's tuples read as lists (the config reaches the callbacks as JSON).
//! - Once the callback has ended its run, a later `on_train_begin` starts a new one with its
//!   params (upstream's callback stays set up, and the `mlflow` package starts a bare run at
//!   the next metric).

use tchtrain_training_args::TrainingArguments;

use crate::args_dict::args_to_dict;
use crate::error::{Error, Result};
use crate::mlflow_rest::{
    MAX_METRICS_PER_BATCH, MAX_PARAMS_TAGS_PER_BATCH, MlflowRestClient, now_millis,
};
use crate::mlflow_settings::MLflowSettings;
use crate::model_config::ModelConfig;
use crate::printer::{python_repr, python_str, python_type};
use crate::trainer_callback::TrainerCallback;
use crate::trainer_control::TrainerControl;
use crate::trainer_state::TrainerState;
use tchtrain_training_args::{JsonMap, JsonValue, python_str_repr};

/// MLflow's `MAX_PARAM_VAL_LENGTH` (mlflow/utils/validation.py; upstream reads
/// `mlflow.utils.validation.MAX_PARAM_VAL_LENGTH`): longer params are dropped with a warning.
pub const MLFLOW_MAX_PARAM_VAL_LENGTH: usize = 6000;

/// `getpass.getuser()`: `LOGNAME`, `USER`, `LNAME`, `USERNAME`, else the password entry of
/// the process's user id.
fn current_user() -> String {
    for var in ["LOGNAME", "USER", "LNAME", "USERNAME"] {
        if let Ok(v) = std::env::var(var)
            && !v.is_empty()
        {
            return v;
        }
    }
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|rest| rest.split_whitespace().next().map(str::to_string))
        });
    if let (Some(uid), Ok(passwd)) = (uid, std::fs::read_to_string("/etc/passwd")) {
        for line in passwd.lines() {
            let fields: Vec<&str> = line.split(':').collect();
            if fields.len() > 2 && fields[2] == uid {
                return fields[0].to_string();
            }
        }
    }
    "unknown".into()
}

/// Upstream `flatten_dict` (transformers/utils/generic.py): non-empty nested dicts become
/// `parent.child` keys.
fn flatten_into(out: &mut JsonMap, prefix: Option<&str>, map: &JsonMap) {
    for (k, v) in map.iter() {
        let key = match prefix {
            Some(p) => format!("{p}.{k}"),
            None => k.to_string(),
        };
        match v {
            JsonValue::Object(m) if !m.is_empty() => flatten_into(out, Some(&key), m),
            other => {
                out.insert(key, other.clone());
            }
        }
    }
}

/// Python's `str()` of a param value; `id2label` (whose keys upstream's config holds as
/// ints) shows integer-looking keys as ints.
fn param_value(key: &str, value: &JsonValue) -> String {
    match value {
        JsonValue::Object(m) if key == "id2label" => {
            let entries: Vec<String> = m
                .iter()
                .map(|(k, v)| {
                    let shown = if k.parse::<i64>().is_ok() {
                        k.to_string()
                    } else {
                        python_str_repr(k)
                    };
                    format!("{shown}: {}", python_repr(v))
                })
                .collect();
            format!("{{{}}}", entries.join(", "))
        }
        other => python_str(other),
    }
}

/// The params upstream's `setup` logs for `args` and the model config: `{**model_config,
/// **args.to_dict()}`, flattened with `flatten`, values as `str()`, those longer than
/// [`MLFLOW_MAX_PARAM_VAL_LENGTH`] dropped with upstream's warning, at most `max_log_params`.
pub fn mlflow_params(
    args: &TrainingArguments,
    model_config: Option<&JsonMap>,
    flatten: bool,
    max_log_params: Option<usize>,
) -> Vec<(String, String)> {
    let mut combined = model_config.cloned().unwrap_or_default();
    for (k, v) in args_to_dict(args) {
        combined.insert(k, v);
    }
    if flatten {
        let mut flat = JsonMap::new();
        flatten_into(&mut flat, None, &combined);
        combined = flat;
    }
    let mut params: Vec<(String, String)> = Vec::with_capacity(combined.len());
    for (name, value) in combined.iter() {
        let text = param_value(name, value);
        if text.chars().count() > MLFLOW_MAX_PARAM_VAL_LENGTH {
            log::warn!(
                "Trainer is attempting to log a value of \"{text}\" for key \"{name}\" as a parameter. MLflow's \
                 log_param() only accepts values no longer than 250 characters so we dropped this attribute. \
                 You can use `MLFLOW_FLATTEN_PARAMS` environment variable to flatten the parameters and avoid \
                 this message."
            );
            continue;
        }
        params.push((name.to_string(), text));
    }
    if let Some(max) = max_log_params
        && max < params.len()
    {
        log::debug!(
            "Reducing the number of parameters to log from {} to {max}.",
            params.len()
        );
        params.truncate(max);
    }
    params
}

/// Upstream's metric-name sanitising: `re.sub(r"[^0-9A-Za-z_\-\.\ :/]", "_", k)`.
pub fn sanitize_metric_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ' ' | ':' | '/') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The metrics upstream's `on_log` sends for `logs`: ints, floats and bools (Python's bool is
/// an int), names sanitised (a later duplicate replaces the value in place, as a dict does);
/// any other value is dropped with upstream's warning.
pub fn mlflow_metrics(logs: &JsonMap) -> Vec<(String, f64)> {
    let mut metrics: Vec<(String, f64)> = Vec::new();
    for (k, v) in logs.iter() {
        let value = match v {
            JsonValue::Int(i) => *i as f64,
            JsonValue::Float(f) => *f,
            JsonValue::Bool(b) => f64::from(u8::from(*b)),
            other => {
                log::warn!(
                    "Trainer is attempting to log a value of \"{}\" of type {} for key \"{k}\" as a metric. \
                     MLflow's log_metric() only accepts float and int types so we dropped this attribute.",
                    python_str(other),
                    python_type(other)
                );
                continue;
            }
        };
        let name = sanitize_metric_name(k);
        match metrics.iter_mut().find(|(n, _)| *n == name) {
            Some(entry) => entry.1 = value,
            None => metrics.push((name, value)),
        }
    }
    metrics
}

/// Upstream `MLflowCallback`: on the world's main process, starts (or resumes) an MLflow run
/// at the beginning of training, logs the training arguments merged with the model config as
/// params, the `MLFLOW_TAGS` as tags, every numeric log as a metric at `global_step`, and ends
/// the run it started with status `FINISHED` at the end of training.
///
/// ```no_run
/// use tchtrain_callbacks::{MLflowCallback, MLflowSettings};
///
/// # fn main() -> tchtrain_callbacks::Result<()> {
/// // From MLFLOW_TRACKING_URI=http://127.0.0.1:5000 and the other MLFLOW_* variables:
/// let from_env = MLflowCallback::new()?;
/// // Or explicitly:
/// let mut settings = MLflowSettings::new("http://127.0.0.1:5000")?;
/// settings.experiment_name = Some("fine-tuning".into());
/// let callback = MLflowCallback::with_settings(settings);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct MLflowCallback {
    settings: MLflowSettings,
    client: MlflowRestClient,
    initialized: bool,
    auto_end_run: bool,
    /// The run being logged into.
    run_id: Option<String>,
    /// A run the caller started (upstream: `mlflow.active_run()` before training).
    active_run_id: Option<String>,
    model_config: Option<JsonMap>,
}

impl MLflowCallback {
    /// A callback configured from the environment ([`MLflowSettings::from_env`]).
    pub fn new() -> Result<Self> {
        Ok(Self::with_settings(MLflowSettings::from_env()?))
    }

    /// A callback with explicit settings.
    pub fn with_settings(settings: MLflowSettings) -> Self {
        let client = MlflowRestClient::new(
            &settings.tracking_uri,
            settings.timeout,
            settings.username.as_deref(),
            settings.password.as_deref(),
            settings.token.as_deref(),
        );
        Self {
            settings,
            client,
            initialized: false,
            auto_end_run: false,
            run_id: None,
            active_run_id: None,
            model_config: None,
        }
    }

    /// Logs into `run_id`, a run the caller started and will end (upstream: a run already
    /// active in the `mlflow` package when training starts); with `MLFLOW_NESTED_RUN`, a
    /// child run of it is started and ended instead.
    pub fn with_active_run(mut self, run_id: impl Into<String>) -> Self {
        self.active_run_id = Some(run_id.into());
        self
    }

    /// The settings in use.
    pub fn settings(&self) -> &MLflowSettings {
        &self.settings
    }

    /// The run being logged into, once training has begun (and until the run is ended).
    pub fn run_id(&self) -> Option<&str> {
        self.run_id.as_deref()
    }

    /// Upstream `setup`: starts or resumes the run and logs the params and tags (world
    /// process zero only). Called by the first `on_train_begin` or `on_log`.
    pub fn setup(&mut self, args: &TrainingArguments, state: &TrainerState) -> Result<()> {
        log::debug!(
            "MLflow experiment_name={:?}, run_name={:?}, nested={}, tracking_uri={}",
            self.settings.experiment_name,
            args.run_name,
            self.settings.nested_run,
            self.settings.tracking_uri
        );
        if state.is_world_process_zero {
            if self.active_run_id.is_none()
                || self.settings.nested_run
                || self.settings.run_id.is_some()
            {
                let experiment_id = match self.settings.experiment_name.clone() {
                    Some(name) => Some(self.set_experiment(&name)?),
                    None => None,
                };
                let run_id = self.start_run(args.run_name.as_deref(), experiment_id)?;
                log::debug!("MLflow run started with run_id={run_id}");
                self.run_id = Some(run_id);
                self.auto_end_run = true;
            } else {
                self.run_id = self.active_run_id.clone();
            }
            let run_id = self.run_id.clone().unwrap_or_default();
            let params = mlflow_params(
                args,
                self.model_config.as_ref(),
                self.settings.flatten_params,
                self.settings.max_log_params,
            );
            for chunk in params.chunks(MAX_PARAMS_TAGS_PER_BATCH) {
                if let Err(e) = self.client.log_params(&run_id, chunk) {
                    // Upstream logs params with `synchronous=False`: a failure is logged by
                    // mlflow's logging thread and training goes on.
                    log::error!("Run Id {run_id}: Failed to log run data: Exception: {e}");
                }
            }
            if !self.settings.tags.is_empty() {
                let tags: Vec<(String, String)> = self
                    .settings
                    .tags
                    .iter()
                    .map(|(k, v)| (k.to_string(), python_str(v)))
                    .collect();
                for chunk in tags.chunks(MAX_PARAMS_TAGS_PER_BATCH) {
                    self.client.set_tags(&run_id, chunk)?;
                }
            }
        }
        self.initialized = true;
        Ok(())
    }

    /// `mlflow.set_experiment(name)`: the experiment's id, created when missing.
    fn set_experiment(&self, name: &str) -> Result<String> {
        let experiment = match self.client.get_experiment_by_name(name)? {
            Some(e) => e,
            None => {
                log::info!(
                    "Experiment with name '{name}' does not exist. Creating a new experiment."
                );
                match self.client.create_experiment(name) {
                    Ok(id) => return Ok(id),
                    // Another process created it in between (mlflow handles the same race).
                    Err(Error::MlflowRequest {
                        error_code: Some(code),
                        ..
                    }) if code == "RESOURCE_ALREADY_EXISTS" => self
                        .client
                        .get_experiment_by_name(name)?
                        .ok_or_else(|| Error::MlflowRun {
                            id: name.to_string(),
                            message: format!("experiment {name:?} vanished while being created"),
                        })?,
                    Err(e) => return Err(e),
                }
            }
        };
        if experiment.lifecycle_stage != "active" {
            return Err(Error::MlflowRun {
                id: experiment.experiment_id,
                message: format!(
                    "Cannot set a deleted experiment {} as the active experiment. You can restore the \
                     experiment, or permanently delete the experiment to create a new one.",
                    python_str_repr(name)
                ),
            });
        }
        Ok(experiment.experiment_id)
    }

    /// `mlflow.start_run(run_name=..., nested=...)`: resumes `MLFLOW_RUN_ID` or creates a run.
    fn start_run(&self, run_name: Option<&str>, experiment_id: Option<String>) -> Result<String> {
        if let Some(active) = &self.active_run_id
            && !self.settings.nested_run
        {
            return Err(Error::MlflowRun {
                id: active.clone(),
                message: format!(
                    "Run with UUID {active} is already active. To start a new run, first end the current run \
                     with mlflow.end_run(). To start a nested run, call start_run with nested=True"
                ),
            });
        }
        if let Some(run_id) = &self.settings.run_id {
            let info = self.client.get_run(run_id)?;
            if let Some(exp) = &experiment_id
                && *exp != info.experiment_id
            {
                return Err(Error::MlflowRun {
                    id: run_id.clone(),
                    message: format!(
                        "Cannot start run with ID {run_id} because active experiment ID does not match \
                         environment run ID. Make sure --experiment-name or --experiment-id matches \
                         experiment set with set_experiment(), or just use command-line arguments"
                    ),
                });
            }
            if info.lifecycle_stage == "deleted" {
                return Err(Error::MlflowRun {
                    id: run_id.clone(),
                    message: format!(
                        "Cannot start run with ID {run_id} because it is in the deleted state."
                    ),
                });
            }
            self.client
                .update_run(run_id, "RUNNING", info.end_time, run_name)?;
            return Ok(run_id.clone());
        }
        let experiment_id = match (experiment_id, &self.settings.experiment_id) {
            (Some(id), _) => id,
            (None, Some(id)) => {
                self.client
                    .get_experiment(id)
                    .map_err(|_| Error::MlflowRun {
                        id: id.clone(),
                        message: format!(
                            "The provided MLFLOW_EXPERIMENT_ID environment variable value `{id}` does not \
                             exist in the tracking server. Provide a valid experiment_id."
                        ),
                    })?;
                id.clone()
            }
            (None, None) => "0".to_string(),
        };
        let user = current_user();
        let mut tags: Vec<(String, String)> = Vec::new();
        tags.push(("mlflow.user".into(), user.clone()));
        let source = std::env::args_os()
            .next()
            .map(|a| a.to_string_lossy().into_owned())
            .unwrap_or_default();
        tags.push(("mlflow.source.name".into(), source));
        tags.push(("mlflow.source.type".into(), "LOCAL".into()));
        if let Some(parent) = &self.active_run_id {
            tags.push(("mlflow.parentRunId".into(), parent.clone()));
        }
        if let Some(name) = run_name {
            tags.push(("mlflow.runName".into(), name.to_string()));
        }
        self.client
            .create_run(&experiment_id, &user, run_name, &tags)
    }

    /// `mlflow.end_run()` of the run this callback started.
    fn end_run(&mut self) -> Result<()> {
        if self.auto_end_run
            && let Some(run_id) = self.run_id.take()
        {
            self.auto_end_run = false;
            self.initialized = false;
            self.client
                .update_run(&run_id, "FINISHED", Some(now_millis()), None)?;
        }
        Ok(())
    }
}

impl TrainerCallback for MLflowCallback {
    fn set_model_config(&mut self, config: &ModelConfig) {
        self.model_config = Some(config.dict.clone());
    }

    fn on_train_begin(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        _: &mut TrainerControl,
    ) -> Result<()> {
        if !self.initialized {
            self.setup(args, state)?;
        }
        Ok(())
    }

    fn on_log(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        _: &mut TrainerControl,
        logs: &JsonMap,
    ) -> Result<()> {
        if !self.initialized {
            self.setup(args, state)?;
        }
        if state.is_world_process_zero
            && let Some(run_id) = &self.run_id
        {
            let metrics = mlflow_metrics(logs);
            for chunk in metrics.chunks(MAX_METRICS_PER_BATCH) {
                if let Err(e) = self.client.log_metrics(run_id, chunk, state.global_step) {
                    // Upstream logs metrics with `synchronous=False`: mlflow's logging thread
                    // logs the failure and training goes on.
                    log::error!("Run Id {run_id}: Failed to log run data: Exception: {e}");
                }
            }
        }
        Ok(())
    }

    fn on_train_end(
        &mut self,
        _: &TrainingArguments,
        state: &TrainerState,
        _: &mut TrainerControl,
    ) -> Result<()> {
        if self.initialized && state.is_world_process_zero {
            self.end_run()?;
        }
        Ok(())
    }
}

impl Drop for MLflowCallback {
    /// Upstream `__del__`: a run this callback started and did not end is ended.
    fn drop(&mut self) {
        if let Err(e) = self.end_run() {
            log::warn!("MLflowCallback: could not end the MLflow run: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_keep_numbers_and_sanitise_names() {
        let mut logs = JsonMap::new();
        logs.insert("loss", 2.5);
        logs.insert("acc(top1)", 1i64);
        logs.insert("flag", true);
        logs.insert("note", "x");
        logs.insert("acc[top1]", 0.5);
        logs.insert("λ", JsonValue::Null);
        assert_eq!(
            mlflow_metrics(&logs),
            vec![
                ("loss".to_string(), 2.5),
                ("acc_top1_".to_string(), 0.5),
                ("flag".to_string(), 1.0)
            ]
        );
        assert_eq!(sanitize_metric_name("eval/a b:c-d.e_λ"), "eval/a b:c-d.e__");
    }

    #[test]
    fn params_merge_the_model_config_first_and_render_python_str() {
        let args = TrainingArguments::default();
        let mut config = JsonMap::new();
        let mut id2label = JsonMap::new();
        id2label.insert("0", "NEG");
        id2label.insert("1", "POS");
        config.insert("id2label", JsonValue::Object(id2label));
        config.insert("n_layer", 2i64);
        config.insert("long", "y".repeat(MLFLOW_MAX_PARAM_VAL_LENGTH + 1));
        config.insert("output_dir", "overridden");
        let params = mlflow_params(&args, Some(&config), false, None);
        assert_eq!(
            params[0],
            ("id2label".into(), "{0: 'NEG', 1: 'POS'}".into())
        );
        assert_eq!(params[1], ("n_layer".into(), "2".into()));
        assert_eq!(params[2], ("output_dir".into(), "trainer_output".into()));
        assert!(params.iter().all(|(k, _)| k != "long"));
        let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("learning_rate"), Some("5e-05"));
        assert_eq!(get("report_to"), Some("[]"));
        assert_eq!(get("run_name"), Some("None"));
        assert_eq!(
            get("accelerator_config"),
            Some(
                "{'split_batches': False, 'dispatch_batches': None, 'even_batches': True, \
                 'use_seedable_sampler': True, 'non_blocking': False, 'gradient_accumulation_kwargs': None}"
            )
        );
        let flat = mlflow_params(&args, Some(&config), true, Some(3));
        assert_eq!(
            flat,
            vec![
                ("id2label.0".to_string(), "NEG".to_string()),
                ("id2label.1".to_string(), "POS".to_string()),
                ("n_layer".to_string(), "2".to_string()),
            ]
        );
    }
}

//! `CometCallback` (upstream integrations/integration_utils.py) writing Comet's offline
//! experiment archive as comet_ml 3.58 writes it (`COMET_START_ONLINE=false`): a zip
//! `<experiment key>.zip` (`COMET_MODE=create`) or `<experiment key>-<6 letters>.zip` (the
//! default `get_or_create`) in `COMET_OFFLINE_DIRECTORY` (default `.cometml-runs` in the
//! working directory), holding `experiment.json` (key, project, workspace, times, resume
//! strategy) and `messages.json` (one JSON message per line, in the shapes of the JSON schemas
//! the comet_ml package ships for its uploader). `comet upload <archive>` sends it to Comet.
//!
//! What upstream's callback logs, with the SDK's conversions: at setup `offline_experiment`,
//! the run name as `Name`, `hasNestedParams`, then `args.to_dict()` and `model.config` as
//! parameters flattened with `|` (`args|learning_rate`, `config|id2label|0`), sorted, each
//! once; at every `on_log` / `on_predict` the `curr_step` / `curr_epoch` parameters when they
//! change and the logs renamed by `rewrite_logs` as metrics (sorted; NaN and infinities as
//! the strings `NaN` / `Infinity`, strings and lists of several values as text, a list of
//! one number as that number, `None` skipped); at the end `Created from: transformers`.
//! The archive is written at `on_train_end`, again after any later event (an evaluation or
//! prediction after training, which upstream's archive holds as it is written when the
//! process exits), and when the callback is dropped.
//!
//! Not written: what the Python SDK logs of its own Python process (the script's source and
//! file name, installed Python and OS packages, console output, host details, its command
//! line as `run_arg_<i>` parameters, sampled `sys.*` system metrics, and the model's Python
//! `repr` as its graph, which these models do not have); `peft_config`, which upstream logs
//! as the adapter config object's Python `repr`.
//!
//! Refused with the reason: online mode (`COMET_START_ONLINE` unset or true: a Comet server),
//! `COMET_MODE=get` / `COMET_EXPERIMENT_KEY` (appending to an existing experiment),
//! `COMET_LOG_ASSETS` true (the output directory as assets), a Comet config file
//! (`COMET_CONFIG`, `.comet.config` in the working or home directory), whose settings are
//! not read here. An unknown `COMET_MODE` disables the logger with upstream's warning.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use tchtrain_training_args::{JsonMap, JsonValue, TrainingArguments, dumps, dumps_compact};

use crate::args_dict::args_to_dict;
use crate::error::{Error, Result};
use crate::model_config::ModelConfig;
use crate::printer::python_repr;
use crate::tensorboard::rewrite_logs;
use crate::trainer_callback::TrainerCallback;
use crate::trainer_control::TrainerControl;
use crate::trainer_state::TrainerState;

/// comet_ml's `MAXIMAL_KEY_LENGTH` and `MAXIMAL_VALUE_LENGTH`.
const MAXIMAL_KEY_LENGTH: usize = 100;
const MAXIMAL_VALUE_LENGTH: usize = 1000;
/// comet_ml's `TRUNCATED_INDICATOR`.
const TRUNCATED_INDICATOR: &str = " [truncated]";
/// comet_ml's `PARAMETERS_MAX_DEPTH`; metrics flatten to 1000 levels, past any log's depth.
const PARAMETERS_MAX_DEPTH: usize = 10;
const METRICS_MAX_DEPTH: usize = 1000;
/// comet_ml's `DEFAULT_OFFLINE_DATA_DIRECTORY`.
pub const DEFAULT_OFFLINE_DIRECTORY: &str = ".cometml-runs";

fn refuse(setting: String, reason: &str) -> Error {
    Error::CometSetting {
        setting,
        reason: reason.to_string(),
    }
}

/// everett's `parse_bool`, which comet_ml's configuration uses.
fn parse_bool(name: &str, value: &str) -> Result<bool> {
    match value.to_lowercase().as_str() {
        "t" | "true" | "yes" | "y" | "on" | "1" => Ok(true),
        "f" | "false" | "no" | "n" | "off" | "0" => Ok(false),
        _ => Err(refuse(
            format!("{name}={value:?}"),
            "not a boolean (comet_ml reads true/false, yes/no, on/off, 1/0)",
        )),
    }
}

/// How an offline experiment starts (comet_ml's resume strategies this crate writes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CometMode {
    /// `create`: a new experiment, archive `<key>.zip`.
    Create,
    /// `get_or_create` (the default): with no experiment key, a new experiment, archive
    /// `<key>-<suffix>.zip`.
    GetOrCreate,
}

impl CometMode {
    fn name(self) -> &'static str {
        match self {
            CometMode::Create => "create",
            CometMode::GetOrCreate => "get_or_create",
        }
    }
}

/// Where `CometCallback` writes, and the environment it was checked against.
#[derive(Debug, Clone, PartialEq)]
pub struct CometSettings {
    /// The folder the archive goes into (`COMET_OFFLINE_DIRECTORY`, default `.cometml-runs`
    /// in the working directory).
    pub offline_directory: PathBuf,
    /// `COMET_PROJECT_NAME`.
    pub project_name: Option<String>,
    /// `COMET_WORKSPACE`.
    pub workspace: Option<String>,
    /// `COMET_MODE` (or `COMET_START_MODE`); `None` when `COMET_MODE` holds a value upstream
    /// does not know, which disables the logger with a warning, as upstream.
    pub mode: Option<CometMode>,
}

impl CometSettings {
    /// The working directory and the environment (see the module's documentation).
    pub fn from_env() -> Result<Self> {
        let cwd = std::env::current_dir().map_err(|e| Error::io("reading", ".", e))?;
        let home = std::env::var_os("HOME").map(PathBuf::from);
        Self::from_lookup(cwd, home.as_deref(), |name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) with the working and home directories and an environment
    /// given as a function.
    pub fn from_lookup(
        cwd: impl Into<PathBuf>,
        home: Option<&Path>,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self> {
        let cwd = cwd.into();
        let set = |name: &str| lookup(name).filter(|v| !v.is_empty());
        if let Some(v) = set("COMET_CONFIG") {
            return Err(refuse(
                format!("COMET_CONFIG={v:?}"),
                "Comet's config files are not read here: set their settings as COMET_* environment variables",
            ));
        }
        for dir in [Some(cwd.as_path()), home].into_iter().flatten() {
            let file = dir.join(".comet.config");
            if file.is_file() {
                return Err(refuse(
                    file.display().to_string(),
                    "Comet's config files are not read here: set their settings as COMET_* environment variables, and move the file away",
                ));
            }
        }
        let online = match set("COMET_START_ONLINE") {
            Some(v) => parse_bool("COMET_START_ONLINE", &v)?,
            None => true,
        };
        if online {
            return Err(refuse(
                format!(
                    "COMET_START_ONLINE={}",
                    set("COMET_START_ONLINE").map_or("<unset>".into(), |v| format!("{v:?}"))
                ),
                "Comet's online mode (the default) sends the experiment to a Comet server, which is not implemented here: set COMET_START_ONLINE=false to write the offline archive, and send it with `comet upload`",
            ));
        }
        if let Some(v) = set("COMET_EXPERIMENT_KEY") {
            return Err(refuse(
                format!("COMET_EXPERIMENT_KEY={v:?}"),
                "logging to an experiment of a given key (appending to an existing one) is not implemented here: unset it, and each run writes a new experiment",
            ));
        }
        if let Some(v) = set("COMET_LOG_ASSETS")
            && matches!(v.to_uppercase().as_str(), "TRUE" | "1")
        {
            return Err(refuse(
                format!("COMET_LOG_ASSETS={v:?}"),
                "logging output_dir's checkpoints as Comet assets is not implemented here: unset it (the checkpoints stay in output_dir)",
            ));
        }
        let mode = match lookup("COMET_MODE") {
            Some(v) if !v.is_empty() => match v.to_lowercase().as_str() {
                "create" => Some(CometMode::Create),
                "get_or_create" => Some(CometMode::GetOrCreate),
                "get" => {
                    return Err(refuse(
                        format!("COMET_MODE={v:?}"),
                        "appending to an existing experiment is not implemented here: use create or get_or_create",
                    ));
                }
                _ => {
                    log::warn!("Invalid COMET_MODE env value {v:?}, Comet logging is disabled");
                    None
                }
            },
            _ => match set("COMET_START_MODE").map(|v| v.to_lowercase()).as_deref() {
                None | Some("get_or_create") => Some(CometMode::GetOrCreate),
                Some("create") => Some(CometMode::Create),
                Some(other) => {
                    return Err(refuse(
                        format!("COMET_START_MODE={other:?}"),
                        "comet_ml starts experiments in the modes create, get_or_create and get; get (appending to an existing experiment) is not implemented here",
                    ));
                }
            },
        };
        let offline_directory = match set("COMET_OFFLINE_DIRECTORY") {
            Some(d) if d != DEFAULT_OFFLINE_DIRECTORY => cwd.join(d),
            _ => cwd.join(DEFAULT_OFFLINE_DIRECTORY),
        };
        Ok(Self {
            offline_directory,
            project_name: set("COMET_PROJECT_NAME"),
            workspace: set("COMET_WORKSPACE"),
            mode,
        })
    }
}

/// Milliseconds since the epoch (comet_ml's `local_timestamp`).
fn local_timestamp() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// comet_ml's `convert_to_string_truncated`: at most `size` characters, the end replaced by
/// ` [truncated]`.
fn truncated(s: &str, size: usize) -> String {
    if s.chars().count() <= size {
        return s.to_string();
    }
    let keep = size.saturating_sub(TRUNCATED_INDICATOR.chars().count());
    s.chars().take(keep).collect::<String>() + TRUNCATED_INDICATOR
}

/// comet_ml's `fix_special_floats`.
fn fix_special_floats(v: &JsonValue) -> JsonValue {
    match v {
        JsonValue::Float(x) if x.is_nan() => JsonValue::Str("NaN".into()),
        JsonValue::Float(x) if x.is_infinite() => {
            JsonValue::Str(if *x > 0.0 { "Infinity" } else { "-Infinity" }.into())
        }
        other => other.clone(),
    }
}

/// comet_ml's `flatten_dict`: nested mappings joined with `separator`, down to `max_depth`
/// levels (deeper mappings kept as values; an empty mapping is a value). Returns the flat
/// map and whether any mapping was nested.
fn flatten(map: &JsonMap, separator: &str, max_depth: usize) -> (Vec<(String, JsonValue)>, bool) {
    fn walk(
        map: &JsonMap,
        prefix: Option<&str>,
        depth: usize,
        separator: &str,
        max_depth: usize,
        out: &mut Vec<(String, JsonValue)>,
        nested: &mut bool,
    ) {
        if depth > 1 {
            *nested = true;
        }
        for (k, v) in map.iter() {
            let key = match prefix {
                Some(p) => format!("{p}{separator}{k}"),
                None => k.to_string(),
            };
            match v {
                JsonValue::Object(inner) if !inner.is_empty() && depth < max_depth => walk(
                    inner,
                    Some(&key),
                    depth + 1,
                    separator,
                    max_depth,
                    out,
                    nested,
                ),
                JsonValue::Object(inner) if inner.is_empty() && depth < max_depth => {
                    *nested = true;
                    out.push((key, v.clone()))
                }
                _ => out.push((key, v.clone())),
            }
        }
    }
    let mut out = Vec::new();
    let mut nested = false;
    walk(map, None, 1, separator, max_depth, &mut out, &mut nested);
    (out, nested)
}

/// comet_ml's `convert_user_input_to_metric_value` then `fix_special_floats`: `None` for a
/// value the SDK skips.
fn metric_value(v: &JsonValue) -> Option<JsonValue> {
    Some(match v {
        JsonValue::Null => {
            log::warn!("Cannot safely convert None object to a metric value; metric skipped");
            return None;
        }
        JsonValue::Int(_) | JsonValue::Float(_) => fix_special_floats(v),
        JsonValue::Bool(b) => JsonValue::Str(if *b { "True" } else { "False" }.into()),
        JsonValue::Str(s) => JsonValue::Str(truncated(s, MAXIMAL_VALUE_LENGTH)),
        JsonValue::Array(items)
            if items.len() == 1
                && matches!(
                    items[0],
                    JsonValue::Int(_) | JsonValue::Float(_) | JsonValue::Bool(_)
                ) =>
        {
            fix_special_floats(&items[0])
        }
        JsonValue::Array(_) => JsonValue::Str(truncated(&python_repr(v), MAXIMAL_VALUE_LENGTH)),
        JsonValue::Object(_) => JsonValue::Str(dumps(v, None, true)),
    })
}

/// The parameter message's payload for a value (comet_ml's `_log_parameter`): `("param",
/// value)` or `("params", list)`.
fn parameter_value(v: &JsonValue) -> (&'static str, JsonValue) {
    match v {
        JsonValue::Object(_) => (
            "param",
            JsonValue::Str(truncated(&dumps(v, None, true), MAXIMAL_VALUE_LENGTH)),
        ),
        JsonValue::Array(items) => {
            let text = dumps_compact(v, false);
            if text.chars().count() > MAXIMAL_VALUE_LENGTH {
                (
                    "param",
                    JsonValue::Str(truncated(&text, MAXIMAL_VALUE_LENGTH)),
                )
            } else {
                (
                    "params",
                    JsonValue::Array(items.iter().map(fix_special_floats).collect()),
                )
            }
        }
        JsonValue::Str(s) => ("param", JsonValue::Str(truncated(s, MAXIMAL_VALUE_LENGTH))),
        other => ("param", fix_special_floats(other)),
    }
}

/// Python's `==` between two logged values (comet_ml's `generalized_equality.equal`), which
/// keeps a parameter from being logged twice.
fn same_value(a: &JsonValue, b: &JsonValue) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// An offline experiment being written: its messages, and where its archive goes.
struct Experiment {
    key: String,
    archive: PathBuf,
    settings: CometSettings,
    mode: CometMode,
    start_time: i64,
    messages: Vec<String>,
    params: HashMap<String, JsonValue>,
    curr_step: Option<JsonValue>,
    curr_epoch: Option<JsonValue>,
    framework_used: bool,
    written: bool,
}

impl Experiment {
    /// comet_ml's `OfflineExperiment`: a new key, and the empty archive created in the offline
    /// directory (created when missing, its parent not) to check that it can be written.
    fn start(settings: &CometSettings, mode: CometMode) -> Result<Self> {
        let mut next = crate::checksum_time::random_stream();
        let key = format!("{:016x}{:016x}", next(), next());
        let name = match mode {
            CometMode::Create => format!("{key}.zip"),
            CometMode::GetOrCreate => {
                const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
                let suffix: String = (0..6)
                    .map(|_| LETTERS[(next() % LETTERS.len() as u64) as usize] as char)
                    .collect();
                format!("{key}-{suffix}.zip")
            }
        };
        let dir = &settings.offline_directory;
        if !dir.exists() {
            std::fs::create_dir(dir).map_err(|e| Error::io("creating", dir, e))?;
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt as _;
                let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
            }
        }
        let mut experiment = Self {
            key,
            archive: dir.join(name),
            settings: settings.clone(),
            mode,
            start_time: local_timestamp(),
            messages: Vec::new(),
            params: HashMap::new(),
            curr_step: None,
            curr_epoch: None,
            framework_used: false,
            written: true,
        };
        experiment.write_zip(&[])?;
        experiment.log_other("offline_experiment", JsonValue::Bool(true));
        Ok(experiment)
    }

    fn push(&mut self, kind: &str, mut payload: JsonMap) {
        payload.insert("message_id", JsonValue::Int(self.messages.len() as i64 + 1));
        let mut message = JsonMap::new();
        message.insert("payload", JsonValue::Object(payload));
        message.insert("type", JsonValue::Str(kind.into()));
        self.messages
            .push(dumps_compact(&JsonValue::Object(message), true));
        self.written = false;
    }

    fn log_other(&mut self, key: &str, value: JsonValue) {
        let value = match value {
            v
            @ (JsonValue::Int(_) | JsonValue::Float(_) | JsonValue::Bool(_) | JsonValue::Null) => v,
            JsonValue::Str(s) => JsonValue::Str(truncated(&s, MAXIMAL_VALUE_LENGTH)),
            other => JsonValue::Str(truncated(&python_repr(&other), MAXIMAL_VALUE_LENGTH)),
        };
        let mut payload = JsonMap::new();
        payload.insert("key", JsonValue::Str(truncated(key, MAXIMAL_KEY_LENGTH)));
        payload.insert("value", value);
        self.push("log_other", payload);
    }

    fn log_parameter(&mut self, name: &str, value: &JsonValue, source: &str) {
        let name = truncated(name, MAXIMAL_KEY_LENGTH);
        if self
            .params
            .get(&name)
            .is_some_and(|seen| same_value(seen, value))
        {
            return;
        }
        let (field, shown) = parameter_value(value);
        let mut param = JsonMap::new();
        param.insert("paramName", JsonValue::Str(name.clone()));
        param.insert("paramValue", shown);
        param.insert("step", self.curr_step.clone().unwrap_or(JsonValue::Null));
        param.insert("source", JsonValue::Str(source.into()));
        let mut payload = JsonMap::new();
        payload.insert("local_timestamp", JsonValue::Int(local_timestamp()));
        payload.insert(field, JsonValue::Object(param));
        self.push("parameter_msg", payload);
        self.params.insert(name, value.clone());
    }

    /// `log_parameters(params, framework="transformers", source="manual",
    /// flatten_nested=True)`.
    fn log_parameters(&mut self, params: &JsonMap) {
        let (mut flat, nested) = flatten(params, "|", PARAMETERS_MAX_DEPTH);
        if nested {
            self.log_other("hasNestedParams", JsonValue::Bool(true));
        }
        flat.sort_by(|a, b| a.0.cmp(&b.0));
        self.framework_used = true;
        for (k, v) in &flat {
            self.log_parameter(k, v, "manual");
        }
    }

    /// `_set_step` / `_set_epoch`: the `curr_step` / `curr_epoch` parameters.
    fn set_step_epoch(&mut self, step: i64, epoch: f64) {
        self.curr_step = Some(JsonValue::Int(step));
        self.log_parameter("curr_step", &JsonValue::Int(step), "auto-logged");
        self.curr_epoch = Some(JsonValue::Float(epoch));
        self.log_parameter("curr_epoch", &JsonValue::Float(epoch), "auto-logged");
    }

    /// `__internal_api__log_metrics__(rewrite_logs(logs), step=state.global_step,
    /// epoch=state.epoch, framework="transformers")`.
    fn log_metrics(&mut self, logs: &JsonMap, step: i64, epoch: f64) {
        self.set_step_epoch(step, epoch);
        let (mut flat, _) = flatten(&rewrite_logs(logs), "/", METRICS_MAX_DEPTH);
        flat.sort_by(|a, b| a.0.cmp(&b.0));
        self.framework_used = true;
        for (name, value) in &flat {
            let Some(value) = metric_value(value) else {
                continue;
            };
            let mut metric = JsonMap::new();
            metric.insert(
                "metricName",
                JsonValue::Str(truncated(name, MAXIMAL_KEY_LENGTH)),
            );
            metric.insert("metricValue", value);
            metric.insert("step", self.curr_step.clone().unwrap_or(JsonValue::Null));
            metric.insert("epoch", self.curr_epoch.clone().unwrap_or(JsonValue::Null));
            let mut payload = JsonMap::new();
            payload.insert("local_timestamp", JsonValue::Int(local_timestamp()));
            payload.insert("metric", JsonValue::Object(metric));
            self.push("metric_msg", payload);
        }
    }

    /// `experiment.json` as comet_ml's `write_experiment_meta_file` writes it.
    fn meta(&self, stop_time: i64) -> String {
        let opt = |v: &Option<String>| v.clone().map_or(JsonValue::Null, JsonValue::Str);
        let mut m = JsonMap::new();
        m.insert("offline_id", JsonValue::Str(self.key.clone()));
        m.insert("project_name", opt(&self.settings.project_name));
        m.insert("start_time", JsonValue::Int(self.start_time));
        m.insert("stop_time", JsonValue::Int(stop_time));
        m.insert("tags", JsonValue::Array(Vec::new()));
        m.insert("workspace", opt(&self.settings.workspace));
        m.insert("resume_strategy", JsonValue::Str(self.mode.name().into()));
        m.insert("customer_error_reported", JsonValue::Bool(false));
        m.insert("customer_error_message", JsonValue::Null);
        m.insert("user_provided_experiment_key", JsonValue::Bool(false));
        m.insert("comet_start_sourced", JsonValue::Bool(true));
        dumps(&JsonValue::Object(m), None, false)
    }

    /// The archive with `messages.json` holding `lines`, written beside it and renamed into
    /// place, so that a failed write leaves the previous archive whole.
    fn write_zip(&self, lines: &[String]) -> Result<()> {
        let tmp = self.archive.with_extension("zip.tmp");
        let write = || -> std::io::Result<()> {
            let file = std::fs::File::create(&tmp)?;
            let mut zip = zip::ZipWriter::new(file);
            let options = zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Stored);
            zip.start_file("messages.json", options)?;
            for line in lines {
                zip.write_all(line.as_bytes())?;
                zip.write_all(b"\n")?;
            }
            zip.start_file("experiment.json", options)?;
            zip.write_all(self.meta(local_timestamp()).as_bytes())?;
            zip.finish()?.sync_all()
        };
        write()
            .and_then(|()| std::fs::rename(&tmp, &self.archive))
            .map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                Error::io("writing", &self.archive, e)
            })
    }

    /// comet_ml's end of an experiment: `Created from` for the framework that logged, then
    /// the archive.
    fn end(&mut self) -> Result<()> {
        let mut lines = self.messages.clone();
        if self.framework_used {
            let mut payload = JsonMap::new();
            payload.insert("key", JsonValue::Str("Created from".into()));
            payload.insert("message_id", JsonValue::Int(lines.len() as i64 + 1));
            payload.insert("value", JsonValue::Str("transformers".into()));
            let mut message = JsonMap::new();
            message.insert("payload", JsonValue::Object(payload));
            message.insert("type", JsonValue::Str("log_other".into()));
            lines.push(dumps_compact(&JsonValue::Object(message), true));
        }
        self.write_zip(&lines)?;
        self.written = true;
        log::info!(
            "To upload this offline experiment, run:\n    comet upload {}",
            self.archive.display()
        );
        Ok(())
    }
}

/// Upstream `CometCallback`: sends the logs to Comet, here as Comet's offline archive (see
/// the module's documentation).
pub struct CometCallback {
    settings: CometSettings,
    model_config: Option<ModelConfig>,
    experiment: Option<Experiment>,
    initialized: bool,
    train_ended: bool,
}

impl std::fmt::Debug for CometCallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CometCallback")
            .field("settings", &self.settings)
            .field("initialized", &self.initialized)
            .field("archive", &self.archive())
            .finish()
    }
}

impl CometCallback {
    /// Settings from the environment ([`CometSettings::from_env`]); refusals are errors.
    pub fn new() -> Result<Self> {
        Ok(Self::with_settings(CometSettings::from_env()?))
    }

    /// With the given settings.
    pub fn with_settings(settings: CometSettings) -> Self {
        Self {
            settings,
            model_config: None,
            experiment: None,
            initialized: false,
            train_ended: false,
        }
    }

    /// The archive this run writes, once the experiment has started.
    pub fn archive(&self) -> Option<&Path> {
        self.experiment.as_ref().map(|e| e.archive.as_path())
    }

    /// Upstream `setup`: the experiment started on the first process, with the name, the
    /// arguments and the model config.
    pub fn setup(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        with_model: bool,
    ) -> Result<()> {
        self.initialized = true;
        if !state.is_world_process_zero {
            return Ok(());
        }
        let Some(mode) = self.settings.mode else {
            return Ok(());
        };
        let mut experiment = Experiment::start(&self.settings, mode)?;
        if let Some(name) = args.run_name.as_deref() {
            experiment.log_other("Name", JsonValue::Str(name.to_string()));
        }
        let mut params = JsonMap::new();
        params.insert("args", JsonValue::Object(args_to_dict(args)));
        if with_model && let Some(config) = &self.model_config {
            params.insert("config", JsonValue::Object(config.dict.clone()));
        }
        experiment.log_parameters(&params);
        self.experiment = Some(experiment);
        Ok(())
    }

    fn log(&mut self, state: &TrainerState, logs: &JsonMap) -> Result<()> {
        if !state.is_world_process_zero {
            return Ok(());
        }
        if let Some(experiment) = &mut self.experiment {
            experiment.log_metrics(logs, state.global_step, state.epoch);
            if self.train_ended {
                experiment.end()?;
            }
        }
        Ok(())
    }
}

impl Drop for CometCallback {
    fn drop(&mut self) {
        if let Some(experiment) = &mut self.experiment
            && !experiment.written
            && let Err(e) = experiment.end()
        {
            log::error!("Comet: the offline archive could not be written: {e}");
        }
    }
}

impl TrainerCallback for CometCallback {
    fn name(&self) -> &str {
        "CometCallback"
    }

    fn set_model_config(&mut self, config: &ModelConfig) {
        self.model_config = Some(config.clone());
    }

    fn on_train_begin(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        _control: &mut TrainerControl,
    ) -> Result<()> {
        if !self.initialized {
            self.setup(args, state, true)?;
        }
        Ok(())
    }

    fn on_log(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        _control: &mut TrainerControl,
        logs: &JsonMap,
    ) -> Result<()> {
        if !self.initialized {
            self.setup(args, state, true)?;
        }
        self.log(state, logs)
    }

    fn on_train_end(
        &mut self,
        _args: &TrainingArguments,
        state: &TrainerState,
        _control: &mut TrainerControl,
    ) -> Result<()> {
        if self.initialized && state.is_world_process_zero {
            self.train_ended = true;
            if let Some(experiment) = &mut self.experiment {
                experiment.end()?;
            }
        }
        Ok(())
    }

    fn on_predict(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        _control: &mut TrainerControl,
        metrics: &JsonMap,
    ) -> Result<()> {
        if !self.initialized {
            self.setup(args, state, false)?;
        }
        self.log(state, metrics)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_convert_as_comet_ml_converts_them() {
        assert_eq!(truncated("abc", 100), "abc");
        let long = "x".repeat(120);
        let cut = truncated(&long, MAXIMAL_KEY_LENGTH);
        assert_eq!(cut.chars().count(), 100);
        assert!(cut.ends_with(" [truncated]"));
        assert_eq!(
            metric_value(&JsonValue::Float(f64::NEG_INFINITY)),
            Some(JsonValue::Str("-Infinity".into()))
        );
        assert_eq!(metric_value(&JsonValue::Null), None);
        assert_eq!(
            metric_value(&JsonValue::Bool(true)),
            Some(JsonValue::Str("True".into()))
        );
        let list = JsonValue::Array(vec![JsonValue::Str("a".into()), JsonValue::Float(f64::NAN)]);
        assert_eq!(
            parameter_value(&list),
            (
                "params",
                JsonValue::Array(vec![
                    JsonValue::Str("a".into()),
                    JsonValue::Str("NaN".into())
                ])
            )
        );
        let mut m = JsonMap::new();
        m.insert("b", JsonValue::Int(1));
        m.insert("a", JsonValue::Float(0.5));
        assert_eq!(
            parameter_value(&JsonValue::Object(m)),
            ("param", JsonValue::Str("{\"a\": 0.5, \"b\": 1}".into()))
        );
    }

    #[test]
    fn online_mode_and_resuming_are_refused_by_name() {
        let dir = std::env::temp_dir();
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        let err = CometSettings::from_lookup(&dir, None, env(&[])).unwrap_err();
        assert!(
            err.to_string().contains("COMET_START_ONLINE=<unset>"),
            "{err}"
        );
        assert!(
            err.to_string().contains("COMET_START_ONLINE=false"),
            "{err}"
        );
        for (pairs, named) in [
            (
                &[("COMET_START_ONLINE", "0"), ("COMET_MODE", "get")][..],
                "COMET_MODE",
            ),
            (
                &[
                    ("COMET_START_ONLINE", "no"),
                    ("COMET_EXPERIMENT_KEY", "abc"),
                ][..],
                "COMET_EXPERIMENT_KEY",
            ),
            (
                &[
                    ("COMET_START_ONLINE", "false"),
                    ("COMET_LOG_ASSETS", "True"),
                ][..],
                "COMET_LOG_ASSETS",
            ),
            (&[("COMET_START_ONLINE", "maybe")][..], "COMET_START_ONLINE"),
            (
                &[("COMET_START_ONLINE", "false"), ("COMET_CONFIG", "/x")][..],
                "COMET_CONFIG",
            ),
        ] {
            let pairs: &'static [(&str, &str)] = Box::leak(pairs.to_vec().into_boxed_slice());
            let err = CometSettings::from_lookup(&dir, None, env(pairs)).unwrap_err();
            assert!(err.to_string().contains(named), "{err}");
        }
        let off = CometSettings::from_lookup(
            &dir,
            None,
            env(&[("COMET_START_ONLINE", "false"), ("COMET_MODE", "sideways")]),
        )
        .unwrap();
        assert_eq!(off.mode, None);
        assert_eq!(off.offline_directory, dir.join(".cometml-runs"));
    }
}

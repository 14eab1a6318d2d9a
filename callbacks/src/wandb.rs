//! `WandbCallback` (upstream integrations/integration_utils.py) in W&B's offline mode: the run
//! written as wandb 0.31 writes an offline run — a folder
//! `<WANDB_DIR>/wandb/offline-run-<YYYYMMDD_HHMMSS>-<id>/` holding `run-<id>.wandb`, the run's
//! transaction log (`wandb.proto` `Record`s in LevelDB's log framing: a `:W&B` header, 32 KiB
//! blocks, each record with its CRC-32, length and fragment type), which `wandb sync` uploads.
//!
//! What upstream's callback logs goes in the same records: the run (`WANDB_PROJECT`, the run
//! name, ...), the config (`{**model.config.to_dict(), **args.to_dict()}` and
//! `model/num_parameters`), `define_metric("train/global_step")` and every other metric
//! stepped by it, each `on_log` as a history row (`rewrite_logs`: `train/`, `eval/`, `test/`
//! keys, `train/global_step`) with the summary updated, the single-value scalars
//! (`train_runtime`, `total_flos`, ...) in the summary alone, `on_predict`'s metrics as a row,
//! and the exit record when the callback is dropped (upstream's run finishes at the process's
//! exit). Only the first process writes.
//!
//! Refused with the reason (the environment variables upstream's callback and the `wandb`
//! package read): online mode (`WANDB_MODE` unset or `online`: uploading as the run goes is
//! not implemented; set `WANDB_MODE=offline` and `wandb sync` the folder), `WANDB_LOG_MODEL`
//! `end` / `checkpoint` (model artifacts), `WANDB_WATCH` `gradients` / `parameters` / `all`
//! (histograms), `WANDB_RESUME`. `WANDB_MODE=disabled` (or `WANDB_DISABLED`) writes nothing.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use tchtrain_training_args::{JsonMap, JsonValue, TrainingArguments, dumps};

use crate::args_dict::args_to_dict;
use crate::error::{Error, Result};
use crate::leveldb_log::LevelDbLog;
use crate::model_config::ModelConfig;
use crate::protobuf::Proto;
use crate::tensorboard::{SINGLE_VALUE_SCALARS, rewrite_logs, step_row};
use crate::trainer_callback::TrainerCallback;
use crate::trainer_control::TrainerControl;
use crate::trainer_state::TrainerState;

/// The step metric upstream's callback defines.
const STEP_METRIC: &str = "train/global_step";

/// What `WandbCallback` reads from the environment (upstream's callback and the `wandb`
/// package's settings).
#[derive(Debug, Clone, PartialEq)]
pub struct WandbSettings {
    /// `WANDB_PROJECT` (`huggingface`).
    pub project: String,
    /// `WANDB_DIR`: where the `wandb/` folder goes (the working directory by default).
    pub dir: PathBuf,
    /// `WANDB_RUN_ID` (8 random lowercase letters and digits by default).
    pub run_id: Option<String>,
    /// `WANDB_NAME`: the run's name when the arguments give no `run_name`.
    pub name: Option<String>,
    /// `WANDB_ENTITY`.
    pub entity: Option<String>,
    /// `WANDB_RUN_GROUP`.
    pub run_group: Option<String>,
    /// `WANDB_JOB_TYPE`.
    pub job_type: Option<String>,
    /// `WANDB_NOTES`.
    pub notes: Option<String>,
    /// `WANDB_TAGS` (comma-separated).
    pub tags: Vec<String>,
    /// `WANDB_MODE=disabled` or `WANDB_DISABLED` true: nothing is written.
    pub disabled: bool,
}

fn setting(variable: &'static str, value: &str, reason: &str) -> Error {
    Error::WandbSetting {
        variable,
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

impl WandbSettings {
    /// Offline settings writing under `dir`, the rest at their defaults.
    pub fn offline(dir: impl Into<PathBuf>) -> Self {
        Self {
            project: "huggingface".into(),
            dir: dir.into(),
            run_id: None,
            name: None,
            entity: None,
            run_group: None,
            job_type: None,
            notes: None,
            tags: Vec::new(),
            disabled: false,
        }
    }

    /// Reads the environment; refuses what is not implemented (see the module's
    /// documentation), and warns as upstream on an unknown `WANDB_LOG_MODEL`.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) over `lookup` (an environment given as a function).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let var = |name: &str| lookup(name).filter(|v| !v.is_empty());
        let mode = var("WANDB_MODE").unwrap_or_default();
        let disabled_flag = var("WANDB_DISABLED")
            .is_some_and(|v| matches!(v.to_lowercase().as_str(), "true" | "1" | "yes"));
        let disabled = mode == "disabled" || disabled_flag;
        if !disabled && !matches!(mode.as_str(), "offline" | "dryrun") {
            return Err(setting(
                "WANDB_MODE",
                &mode,
                "W&B's online mode (uploading the run as it goes) is not implemented here; set WANDB_MODE=offline, and upload the run folder afterwards with `wandb sync <folder>`",
            ));
        }
        // Upstream's `WandbLogModel(value)`: an exact, case-sensitive lookup (`END` or
        // `true` is an unrecognised value: a warning, and no model logging).
        match var("WANDB_LOG_MODEL").as_deref() {
            None | Some("false") => {}
            Some(v @ ("end" | "checkpoint")) => {
                return Err(setting(
                    "WANDB_LOG_MODEL",
                    v,
                    "logging the model as W&B artifacts is not implemented here; unset it (the model is in output_dir)",
                ));
            }
            Some(other) => log::warn!(
                "Received unrecognized `WANDB_LOG_MODEL` setting value={other}; so disabling `WANDB_LOG_MODEL`"
            ),
        }
        if let Some(w) =
            var("WANDB_WATCH").filter(|w| matches!(w.as_str(), "all" | "parameters" | "gradients"))
        {
            return Err(setting(
                "WANDB_WATCH",
                &w,
                "wandb.watch's gradient and parameter histograms are not implemented here; unset it",
            ));
        }
        if let Some(r) = var("WANDB_RESUME") {
            return Err(setting(
                "WANDB_RESUME",
                &r,
                "resuming a W&B run is not implemented here; unset it (a new run is written)",
            ));
        }
        let dir = match var("WANDB_DIR") {
            Some(d) => PathBuf::from(d),
            None => std::env::current_dir().map_err(|e| Error::Io {
                action: "reading",
                path: PathBuf::from("."),
                source: e,
            })?,
        };
        Ok(Self {
            project: var("WANDB_PROJECT").unwrap_or_else(|| "huggingface".into()),
            dir,
            run_id: var("WANDB_RUN_ID"),
            name: var("WANDB_NAME"),
            entity: var("WANDB_ENTITY"),
            run_group: var("WANDB_RUN_GROUP"),
            job_type: var("WANDB_JOB_TYPE"),
            notes: var("WANDB_NOTES"),
            tags: var("WANDB_TAGS")
                .map(|t| {
                    t.split(',')
                        .map(|s| s.trim().to_string())
                        .filter(|s| !s.is_empty())
                        .collect()
                })
                .unwrap_or_default(),
            disabled,
        })
    }
}

/// The transaction log's file header: `:W&B`, magic 0xBEE1 (little-endian), version 0.
const WANDB_HEADER: &[u8; 7] = b":W&B\xe1\xbe\x00";

/// `ConfigItem` / `SummaryItem` / `HistoryItem`: `key` (or the `nested_key` path) and
/// `value_json`.
fn item(keys: &[&str], value_json: &str) -> Proto {
    let mut p = Proto::default();
    match keys {
        [key] => p.string(1, key),
        _ => {
            for k in keys {
                p.string(2, k);
            }
        }
    }
    p.string(16, value_json);
    p
}

/// `json.dumps` of one value, compact as wandb writes it.
fn value_json(v: &JsonValue) -> String {
    dumps(v, None, false)
}

/// UTC `YYYYMMDD_HHMMSS` of `secs` since the epoch.
pub(crate) fn timestamp_name(secs: i64) -> String {
    let (year, month, day, hour, minute, second) = crate::checksum_time::utc_parts(secs);
    format!("{year:04}{month:02}{day:02}_{hour:02}{minute:02}{second:02}")
}

/// wandb's `generate_id()`: 8 characters of `[a-z0-9]`.
pub(crate) fn generate_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut next = crate::checksum_time::random_stream();
    (0..8)
        .map(|_| ALPHABET[(next() % ALPHABET.len() as u64) as usize] as char)
        .collect()
}

/// An open offline run.
struct Run {
    log: LevelDbLog,
    dir: PathBuf,
    id: String,
    num: i64,
    step: i64,
    start: f64,
    /// The last `train/global_step` logged: `step_sync` adds it to a row without one.
    global_step: Option<JsonValue>,
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl Run {
    /// `Record { num = 1; <kind> = field; _info = 200 { stream_id = 1 } }`.
    fn record(&mut self, field: u32, body: &Proto) -> Result<()> {
        self.num += 1;
        let mut r = Proto::default();
        r.int(1, self.num);
        r.message(field, body);
        let mut info = Proto::default();
        info.string(1, &self.id);
        r.message(200, &info);
        self.log.append(&r.0)
    }

    fn config(&mut self, entries: &JsonMap) -> Result<()> {
        let mut c = Proto::default();
        for (k, v) in entries.iter() {
            c.message(1, &item(&[k], &value_json(v)));
        }
        self.record(5, &c)
    }

    fn summary(&mut self, entries: &[(Vec<&str>, String)]) -> Result<()> {
        let mut s = Proto::default();
        for (keys, v) in entries {
            s.message(1, &item(keys, v));
        }
        self.record(3, &s)
    }

    /// `wandb.log(row)`: the history row with `_step`, `_runtime`, `_timestamp`, and the
    /// summary updated with it.
    fn log(&mut self, row: &JsonMap) -> Result<()> {
        // `define_metric("*", step_metric="train/global_step", step_sync=True)`: a row
        // without the step metric gets its last value (wandb-core's step sync).
        let mut row = row.clone();
        match row.get(STEP_METRIC) {
            Some(v) => self.global_step = Some(v.clone()),
            None => {
                if let Some(v) = &self.global_step {
                    row.insert(STEP_METRIC, v.clone());
                }
            }
        }
        let row = &row;
        let t = now();
        let mut items: Vec<(Vec<&str>, String)> =
            row.iter().map(|(k, v)| (vec![k], value_json(v))).collect();
        items.push((vec!["_timestamp"], value_json(&JsonValue::Float(t))));
        items.push((
            vec!["_runtime"],
            value_json(&JsonValue::Float(t - self.start)),
        ));
        items.push((vec!["_step"], self.step.to_string()));
        self.summary(&items)?;
        let mut h = Proto::default();
        for (keys, v) in &items {
            // History items are flat keys, written as a one-element `nested_key`.
            let mut i = Proto::default();
            for k in keys {
                i.string(2, k);
            }
            i.string(16, v);
            h.message(1, &i);
        }
        let mut step = Proto::default();
        if self.step != 0 {
            step.int(1, self.step);
        }
        h.message(2, &step);
        self.step += 1;
        self.record(2, &h)
    }

    fn finish(&mut self) -> Result<()> {
        let runtime = (now() - self.start).max(0.0);
        self.summary(&[
            (vec!["_wandb", "runtime"], (runtime as i64).to_string()),
            (vec!["_runtime"], (runtime as i64).to_string()),
        ])?;
        let mut exit = Proto::default();
        exit.int(2, runtime as i64);
        self.record(18, &exit)
    }
}

/// Upstream `WandbCallback`, writing offline runs (see the module's documentation).
pub struct WandbCallback {
    settings: WandbSettings,
    model_config: Option<ModelConfig>,
    run: Option<Run>,
    initialized: bool,
}

impl std::fmt::Debug for WandbCallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WandbCallback")
            .field("settings", &self.settings)
            .field("run_dir", &self.run_dir())
            .finish()
    }
}

impl WandbCallback {
    /// The callback with the environment's settings ([`WandbSettings::from_env`]).
    pub fn new() -> Result<Self> {
        Ok(Self::with_settings(WandbSettings::from_env()?))
    }

    /// The callback with explicit settings.
    pub fn with_settings(settings: WandbSettings) -> Self {
        Self {
            settings,
            model_config: None,
            run: None,
            initialized: false,
        }
    }

    /// The run's folder, once the run has started.
    pub fn run_dir(&self) -> Option<&Path> {
        self.run.as_ref().map(|r| r.dir.as_path())
    }

    /// Upstream `setup`: `wandb.init(project, name=run_name)`, the config, the step metric,
    /// the parameter count.
    pub fn setup(&mut self, args: &TrainingArguments, state: &TrainerState) -> Result<()> {
        self.initialized = true;
        if self.settings.disabled || !state.is_world_process_zero {
            return Ok(());
        }
        let s = &self.settings;
        let id = s.run_id.clone().unwrap_or_else(generate_id);
        let start = now();
        let root = s.dir.join("wandb");
        let dir = root.join(format!("offline-run-{}-{id}", timestamp_name(start as i64)));
        for sub in ["files", "logs", "tmp"] {
            let d = dir.join(sub);
            std::fs::create_dir_all(&d).map_err(|e| Error::Io {
                action: "creating",
                path: d,
                source: e,
            })?;
        }
        let latest = root.join("latest-run");
        let _ = std::fs::remove_file(&latest);
        #[cfg(unix)]
        let _ = std::os::unix::fs::symlink(dir.file_name().unwrap_or_default(), &latest);
        let log = LevelDbLog::create(&dir.join(format!("run-{id}.wandb")), WANDB_HEADER)?;
        let mut run = Run {
            log,
            dir,
            id: id.clone(),
            num: 0,
            step: 0,
            start,
            global_step: None,
        };
        // HeaderRecord { version_info { producer, min_consumer } }.
        let mut version = Proto::default();
        version.string(1, concat!("tchtrain ", env!("CARGO_PKG_VERSION")));
        version.string(2, "0.70.0");
        let mut header = Proto::default();
        header.message(1, &version);
        run.record(21, &header)?;
        // RunRecord.
        let mut r = Proto::default();
        r.string(1, &id);
        if let Some(e) = &s.entity {
            r.string(2, e);
        }
        r.string(3, &s.project);
        let mut config = Proto::default();
        config.message(1, &item(&["_wandb"], "{}"));
        r.message(4, &config);
        if let Some(g) = &s.run_group {
            r.string(6, g);
        }
        if let Some(j) = &s.job_type {
            r.string(7, j);
        }
        if let Some(name) = args.run_name.as_ref().or(s.name.as_ref()) {
            r.string(8, name);
        }
        if let Some(n) = &s.notes {
            r.string(9, n);
        }
        for t in &s.tags {
            r.string(10, t);
        }
        r.string(13, &crate::event_file::hostname());
        let mut time = Proto::default();
        time.int(1, start as i64);
        time.int(2, ((start.fract()) * 1e9) as i64);
        r.message(17, &time);
        run.record(17, &r)?;
        // `config.update({**model_config, **args.to_dict()})`.
        let mut combined = self
            .model_config
            .as_ref()
            .map(|c| c.dict.clone())
            .unwrap_or_default();
        for (k, v) in args_to_dict(args) {
            combined.insert(k, v);
        }
        run.config(&combined)?;
        // `define_metric("train/global_step")`, `define_metric("*", step_metric=...,
        // step_sync=True)`.
        let mut options = Proto::default();
        options.bool(3, true);
        let mut m = Proto::default();
        m.string(1, "train/global_step");
        m.message(6, &options);
        run.record(12, &m)?;
        let mut options = Proto::default();
        options.bool(1, true);
        options.bool(3, true);
        let mut m = Proto::default();
        m.string(2, "*");
        m.string(4, "train/global_step");
        m.message(6, &options);
        run.record(12, &m)?;
        // `config["model/num_parameters"] = model.num_parameters()`.
        if let Some(n) = self.model_config.as_ref().and_then(|c| c.num_parameters) {
            let mut entry = JsonMap::new();
            entry.insert("model/num_parameters", JsonValue::Int(n));
            run.config(&entry)?;
        }
        self.run = Some(run);
        Ok(())
    }
}

impl TrainerCallback for WandbCallback {
    fn set_model_config(&mut self, config: &ModelConfig) {
        self.model_config = Some(config.clone());
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
        let Some(run) = self.run.as_mut() else {
            return Ok(());
        };
        let scalars: Vec<(Vec<&str>, String)> = logs
            .iter()
            .filter(|(k, _)| SINGLE_VALUE_SCALARS.contains(k))
            .map(|(k, v)| (vec![k], value_json(v)))
            .collect();
        if !scalars.is_empty() {
            run.summary(&scalars)?;
        }
        run.log(&step_row(logs, state.global_step))
    }

    fn on_predict(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        _: &mut TrainerControl,
        metrics: &JsonMap,
    ) -> Result<()> {
        if !self.initialized {
            self.setup(args, state)?;
        }
        match self.run.as_mut() {
            Some(run) => run.log(&rewrite_logs(metrics)),
            None => Ok(()),
        }
    }
}

impl Drop for WandbCallback {
    /// The run finishes (its runtime in the summary, the exit record), as upstream's at the
    /// process's exit.
    fn drop(&mut self) {
        if let Some(mut run) = self.run.take()
            && let Err(e) = run.finish()
        {
            log::warn!("W&B: finishing the run in {}: {e}", run.dir.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_folders_are_named_by_utc_time() {
        assert_eq!(timestamp_name(1_796_079_478), "20261130_225758");
    }
}

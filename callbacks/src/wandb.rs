//! `WandbCallback` (upstream integrations/integration_utils.py), online and in W&B's offline
//! mode. Either way the run is written as wandb 0.31 writes it — a folder
//! `<WANDB_DIR>/wandb/<run|offline-run>-<YYYYMMDD_HHMMSS>-<id>/` holding `run-<id>.wandb`, the
//! run's transaction log (`wandb.proto` `Record`s in LevelDB's log framing: a `:W&B` header,
//! 32 KiB blocks, each record with its CRC-32, length and fragment type), which `wandb sync`
//! uploads.
//!
//! Online (`WANDB_MODE` unset or `online`, as wandb's default) the run also goes to the
//! server in `WANDB_BASE_URL` as it is made, through the requests wandb-core makes
//! ([`wandb_api`](crate::wandb_api)): `UpsertBucket` at the start (the run, its whole config
//! with the metric definitions in `_wandb.m`), each history line and the summary on the file
//! stream when it is logged, and at the end `config.yaml`, `wandb-summary.json` and
//! `wandb-metadata.json` uploaded and the stream completed (exit code 0). The API key is
//! `WANDB_API_KEY`, else the netrc entry `wandb login` writes; without one the run is refused
//! as wandb refuses it. The server unreachable at the start is an error (as `wandb.init`'s);
//! later, the training goes on, lines not taken are sent again with the next log, and the
//! run's folder keeps the whole run (`wandb sync --include-online`).
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
//! `WANDB_LOG_MODEL` `end` / `checkpoint` logs the model as artifacts as upstream's callback
//! does (see [`wandb_artifact`](crate::wandb_artifact) for how wandb stages them, and how
//! wandb-core sends them to the server online, where the artifact is not in the run's log): at
//! setup `model-<run>` with `model_architecture.txt` (upstream's `print(model)`), aliased
//! `base_model`; with `checkpoint`, each saved `checkpoint-<step>/` folder, aliased
//! `epoch_<epoch>` and `checkpoint_global_step_<step>`; with `end`, the final model as the
//! Trainer's `save_model` writes it plus `model_architecture.txt`, aliased `final_model`.
//!
//! Refused with the reason (the environment variables upstream's callback and the `wandb`
//! package read): `WANDB_LOG_MODEL` with a model whose `print(model)` is not
//! written out here (Gemma 4's and Qwen3.5's multimodal models; quantized models; adapters on
//! embeddings or expert parameters), wandb's `shared` mode, `WANDB_WATCH` `gradients` /
//! `parameters` / `all` (histograms), `WANDB_RESUME`. `WANDB_MODE=disabled` (or `WANDB_DISABLED`) writes nothing.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use tchtrain_training_args::{JsonMap, JsonValue, TrainingArguments, dumps, loads};

use crate::args_dict::args_to_dict;
use crate::error::{Error, Result};
use crate::leveldb_log::LevelDbLog;
use crate::model_config::ModelConfig;
use crate::protobuf::Proto;
use crate::tensorboard::{SINGLE_VALUE_SCALARS, rewrite_logs, step_row};
use crate::trainer_callback::TrainerCallback;
use crate::trainer_control::TrainerControl;
use crate::trainer_state::TrainerState;
use crate::wandb_api::{FileStream, WandbApi};
use crate::wandb_artifact::{Artifact, staging_dir};

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
    /// `WANDB_LOG_MODEL`.
    pub log_model: WandbLogModel,
    /// `WANDB_DATA_DIR` (`~/.local/share/wandb` by default): artifacts' files are staged in
    /// its `artifacts/staging/`.
    pub data_dir: PathBuf,
    /// `WANDB_CACHE_DIR` (`~/.cache/wandb` by default): an online run's uploaded artifact
    /// files are kept in its `artifacts/obj/md5/`, as wandb-core keeps them.
    pub cache_dir: PathBuf,
    /// Online mode (`WANDB_MODE` unset or `online`): the server and the API key; `None`
    /// offline.
    pub online: Option<WandbOnline>,
}

/// Where an online run goes: `WANDB_BASE_URL` and the API key (`WANDB_API_KEY`, else the
/// netrc entry `wandb login` writes for the server's host).
#[derive(Clone, PartialEq)]
pub struct WandbOnline {
    /// `WANDB_BASE_URL` (wandb 0.31's default: `https://api.forge.coreweave.com`).
    pub base_url: String,
    /// The API key.
    pub api_key: String,
}

impl std::fmt::Debug for WandbOnline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WandbOnline")
            .field("base_url", &self.base_url)
            .field("api_key", &"***")
            .finish()
    }
}

/// wandb 0.31's default `base_url`.
pub const DEFAULT_BASE_URL: &str = "https://api.forge.coreweave.com";

impl WandbOnline {
    /// wandb's `api_to_app_url`: where the runs are seen (the Forge app, `wandb.ai` for
    /// `api.wandb.ai`, `app.<host>` for another `api.<host>`, else the server itself).
    pub fn app_url(&self) -> String {
        let url = self.base_url.trim_end_matches('/');
        let host = url.split("://").nth(1).unwrap_or(url);
        let host = host.split(['/', ':']).next().unwrap_or(host);
        for (forge, api) in [
            ("forge.coreweave.com", "api.wandb.ai"),
            ("qa.forge.coreweave.com", "api.qa.wandb.ai"),
        ] {
            if host == forge || host == format!("api.{forge}") || host == api {
                return format!("https://{forge}/wandb");
            }
        }
        if url.contains("://api.wandb.test") {
            url.replacen("://api.", "://app.", 1)
        } else if url.contains("://api.wandb.") {
            url.replacen("://api.", "://", 1)
        } else if url.contains("://api.") {
            url.replacen("://api.", "://app.", 1)
        } else {
            url.to_string()
        }
    }
}

/// The password of `machine <host>` in a netrc file's text.
fn netrc_password(text: &str, host: &str) -> Option<String> {
    let tokens: Vec<&str> = text.split_whitespace().collect();
    let mut i = 0;
    let mut in_host = false;
    while i < tokens.len() {
        match tokens[i] {
            "machine" => {
                in_host = tokens.get(i + 1) == Some(&host);
                i += 2;
            }
            "default" => {
                in_host = false;
                i += 1;
            }
            "password" if in_host => return tokens.get(i + 1).map(|p| p.to_string()),
            "login" | "password" | "account" => i += 2,
            _ => i += 1,
        }
    }
    None
}

/// Upstream's `WandbLogModel`: which models `WANDB_LOG_MODEL` logs as artifacts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WandbLogModel {
    /// `false` (or unset, or an unrecognised value): none.
    False,
    /// `end`: the final model.
    End,
    /// `checkpoint`: every checkpoint, and the final model.
    Checkpoint,
}

impl WandbLogModel {
    /// Upstream's `is_enabled`: `end` or `checkpoint`.
    pub fn is_enabled(self) -> bool {
        self != Self::False
    }
}

/// platformdirs' `user_data_dir("wandb")` on Linux: `$XDG_DATA_HOME/wandb`, else
/// `~/.local/share/wandb`.
fn default_data_dir(var: impl Fn(&str) -> Option<String>) -> PathBuf {
    match var("XDG_DATA_HOME").filter(|d| !d.trim().is_empty()) {
        Some(d) => PathBuf::from(d).join("wandb"),
        None => PathBuf::from(var("HOME").unwrap_or_else(|| "/".into())).join(".local/share/wandb"),
    }
}

/// platformdirs' `user_cache_dir("wandb")` on Linux: `$XDG_CACHE_HOME/wandb`, else
/// `~/.cache/wandb`.
fn default_cache_dir(var: impl Fn(&str) -> Option<String>) -> PathBuf {
    match var("XDG_CACHE_HOME").filter(|d| !d.trim().is_empty()) {
        Some(d) => PathBuf::from(d).join("wandb"),
        None => PathBuf::from(var("HOME").unwrap_or_else(|| "/".into())).join(".cache/wandb"),
    }
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
            log_model: WandbLogModel::False,
            data_dir: default_data_dir(|name| std::env::var(name).ok()),
            cache_dir: default_cache_dir(|name| std::env::var(name).ok()),
            online: None,
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
        let online = !disabled && matches!(mode.as_str(), "" | "online" | "run");
        if !disabled && !online && !matches!(mode.as_str(), "offline" | "dryrun") {
            return Err(setting(
                "WANDB_MODE",
                &mode,
                "W&B's modes here are online (the default), offline and disabled (wandb's shared mode, for several processes writing one run, is not implemented)",
            ));
        }
        // Upstream's `WandbLogModel(value)`: an exact, case-sensitive lookup (`END` or
        // `true` is an unrecognised value: a warning, and no model logging).
        let log_model = match var("WANDB_LOG_MODEL").as_deref() {
            None | Some("false") => WandbLogModel::False,
            Some("end") => WandbLogModel::End,
            Some("checkpoint") => WandbLogModel::Checkpoint,
            Some(other) => {
                log::warn!(
                    "Received unrecognized `WANDB_LOG_MODEL` setting value={other}; so disabling `WANDB_LOG_MODEL`"
                );
                WandbLogModel::False
            }
        };
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
        let online = match online {
            false => None,
            true => Some(online_settings(&var)?),
        };
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
            log_model,
            data_dir: var("WANDB_DATA_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| default_data_dir(var)),
            cache_dir: var("WANDB_CACHE_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| default_cache_dir(var)),
            online,
        })
    }
}

/// The server and the API key of an online run: `WANDB_BASE_URL`, `WANDB_API_KEY`, else the
/// netrc file (`NETRC`, else `~/.netrc`) entry of the server's host, which `wandb login`
/// writes; without a key, wandb's own refusal.
fn online_settings(var: &impl Fn(&str) -> Option<String>) -> Result<WandbOnline> {
    let base_url = var("WANDB_BASE_URL")
        .map(|u| u.trim().trim_end_matches('/').to_string())
        .unwrap_or_else(|| DEFAULT_BASE_URL.into());
    let Some(rest) = base_url
        .strip_prefix("https://")
        .or_else(|| base_url.strip_prefix("http://"))
    else {
        return Err(setting(
            "WANDB_BASE_URL",
            &base_url,
            "not an http(s) URL; name the W&B server, e.g. https://api.wandb.ai",
        ));
    };
    let host = rest
        .split(['/', ':'])
        .next()
        .unwrap_or_default()
        .to_string();
    let netrc = var("NETRC")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".netrc")));
    let api_key = var("WANDB_API_KEY").or_else(|| {
        netrc
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|text| netrc_password(&text, &host))
    });
    match api_key {
        Some(api_key) => Ok(WandbOnline { base_url, api_key }),
        None => Err(setting(
            "WANDB_API_KEY",
            "",
            &format!(
                "No API key configured for {host} (W&B's online mode, WANDB_MODE unset or online). Set WANDB_API_KEY, or run `wandb login` (it writes the key to ~/.netrc); or set WANDB_MODE=offline and upload the run later with `wandb sync`"
            ),
        )),
    }
}

/// Whether `report_to="all"` takes W&B: offline mode, or online mode with an API key.
pub(crate) fn wandb_is_configured() -> bool {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    match var("WANDB_MODE").as_deref() {
        Some("offline" | "dryrun") => true,
        None | Some("online" | "run") => online_settings(&var).is_ok(),
        _ => false,
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
    crate::checksum_time::random_chars(b"abcdefghijklmnopqrstuvwxyz0123456789", 8)
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
    /// The summary's top-level values (what `dict(run.summary)` gives upstream's artifact
    /// metadata), by key.
    summary_values: std::collections::BTreeMap<String, JsonValue>,
    /// The config as it stands (each update applied), for the server.
    config_tree: JsonMap,
    /// Online: the summary as it stands (`_wandb.runtime` nested), for the server.
    summary_tree: JsonMap,
    /// Online: the run's file stream to the server.
    stream: Option<FileStream>,
    /// Whether a failed post was reported (once per run).
    warned: bool,
}

/// The metric definitions upstream's callback makes, as wandb-core writes them in the
/// config's `_wandb.m` (a `MetricRecord` by field number: 1 name, 2 glob, 5 the step
/// metric's 1-based index, 6 the options set, 7 the summary kinds).
fn metric_definitions() -> JsonValue {
    loads(
        r#"[{"1": "train/global_step", "6": [3], "7": []}, {"2": "*", "5": 1, "6": [1], "7": []}]"#,
    )
    .unwrap_or(JsonValue::Null)
}

/// Sets `keys` (a path) to `value` in `tree`.
fn apply(tree: &mut JsonMap, keys: &[&str], value: JsonValue) {
    match keys {
        [] => {}
        [key] => {
            tree.insert(*key, value);
        }
        [key, rest @ ..] => {
            if !matches!(tree.get(key), Some(JsonValue::Object(_))) {
                tree.insert(*key, JsonValue::Object(JsonMap::new()));
            }
            if let Some(JsonValue::Object(sub)) = tree.get_mut(key) {
                apply(sub, rest, value);
            }
        }
    }
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
            self.config_tree.insert(k, v.clone());
        }
        self.record(5, &c)
    }

    fn summary(&mut self, entries: &[(Vec<&str>, String)]) -> Result<()> {
        let mut s = Proto::default();
        for (keys, v) in entries {
            s.message(1, &item(keys, v));
            // Only an online run sends the summary: offline the record is all.
            if self.stream.is_some() {
                apply(
                    &mut self.summary_tree,
                    keys,
                    loads(v).unwrap_or(JsonValue::Null),
                );
            }
        }
        self.record(3, &s)
    }

    /// The config as the server takes it: `{key: {"value": value}}`, with the metric
    /// definitions in `_wandb`.
    fn server_config(&self) -> JsonValue {
        let mut out = JsonMap::new();
        let mut wandb = JsonMap::new();
        wandb.insert("m", metric_definitions());
        let mut wrapped = JsonMap::new();
        wrapped.insert("value", JsonValue::Object(wandb));
        out.insert("_wandb", JsonValue::Object(wrapped));
        for (k, v) in self.config_tree.iter() {
            let mut wrapped = JsonMap::new();
            wrapped.insert("value", v.clone());
            out.insert(k, JsonValue::Object(wrapped));
        }
        JsonValue::Object(out)
    }

    /// Online: posts the pending history lines and the summary; a failure is reported once
    /// and the lines stay for the next post (the run's folder keeps everything).
    fn post(&mut self) {
        let summary = value_json(&JsonValue::Object(self.summary_tree.clone()));
        let Some(stream) = self.stream.as_mut() else {
            return;
        };
        if let Err(e) = stream.post(&summary, None)
            && !std::mem::replace(&mut self.warned, true)
        {
            log::warn!(
                "{e}; the run goes on, the lines not taken are sent again with the next log (the run's folder {} keeps the whole run)",
                self.dir.display()
            );
        }
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
        for (k, v) in row.iter() {
            self.summary_values.insert(k.to_string(), v.clone());
        }
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
        self.record(2, &h)?;
        if let Some(stream) = self.stream.as_mut() {
            let fields: Vec<String> = items
                .iter()
                .map(|(keys, v)| format!("{}:{v}", value_json(&JsonValue::Str(keys[0].into()))))
                .collect();
            stream.push(format!("{{{}}}", fields.join(",")));
            self.post();
        }
        Ok(())
    }

    /// `{k: v for k, v in dict(run.summary).items() if isinstance(v, numbers.Number) and not
    /// k.startswith("_")}` (booleans are numbers in Python).
    fn numeric_summary(&self) -> JsonMap {
        let mut out = JsonMap::new();
        for (k, v) in &self.summary_values {
            if !k.starts_with('_')
                && matches!(
                    v,
                    JsonValue::Int(_) | JsonValue::Float(_) | JsonValue::Bool(_)
                )
            {
                out.insert(k.as_str(), v.clone());
            }
        }
        out
    }

    fn finish(&mut self) -> Result<()> {
        let runtime = (now() - self.start).max(0.0);
        self.summary(&[
            (vec!["_wandb", "runtime"], (runtime as i64).to_string()),
            (vec!["_runtime"], (runtime as i64).to_string()),
        ])?;
        let mut exit = Proto::default();
        exit.int(2, runtime as i64);
        self.record(18, &exit)?;
        if self.stream.is_some() {
            self.finish_online();
        }
        Ok(())
    }

    /// Online: the run's files (`config.yaml`, `wandb-summary.json`, `wandb-metadata.json`)
    /// written to `files/` and uploaded, then the last post (`complete`, `exitcode` 0, the
    /// uploaded files), each tried three times; a failure is reported with how to upload the
    /// run from its folder.
    fn finish_online(&mut self) {
        let summary = value_json(&JsonValue::Object(self.summary_tree.clone()));
        let files: Vec<(&str, Vec<u8>)> = vec![
            ("wandb-metadata.json", self.metadata().into_bytes()),
            ("wandb-summary.json", summary.clone().into_bytes()),
            (
                "config.yaml",
                crate::pyyaml::safe_dump(&self.server_config()).into_bytes(),
            ),
        ];
        for (name, bytes) in &files {
            let _ = std::fs::write(self.dir.join("files").join(name), bytes);
        }
        let mut uploaded: Vec<&str> = files.iter().map(|(n, _)| *n).collect();
        uploaded.sort();
        let end = serde_json::json!({"uploaded": uploaded, "complete": true, "exitcode": 0});
        let dir = self.dir.clone();
        let Some(stream) = self.stream.as_mut() else {
            return;
        };
        let mut last = Ok(());
        for attempt in 0..3 {
            if attempt > 0 {
                std::thread::sleep(std::time::Duration::from_secs(attempt));
            }
            last = stream
                .api
                .upload_run_files(&stream.path, &files)
                .and_then(|()| stream.post(&summary, Some(&end)));
            if last.is_ok() {
                break;
            }
        }
        if let Err(e) = last {
            log::warn!(
                "{e}: the run is not complete on the server; upload it from its folder with `wandb sync --include-online {}`",
                dir.display()
            );
        }
    }

    /// `wandb-metadata.json`: what the run's overview shows of the process.
    fn metadata(&self) -> String {
        let secs = self.start as i64;
        let (y, mo, d, h, mi, s) = crate::checksum_time::utc_parts(secs);
        let micros = ((self.start - secs as f64) * 1e6) as i64;
        let args: Vec<JsonValue> = std::env::args().skip(1).map(JsonValue::Str).collect();
        let text = |v: Option<String>| v.map_or(JsonValue::Null, JsonValue::Str);
        let mut m = JsonMap::new();
        m.insert(
            "os",
            JsonValue::Str(format!(
                "{}-{}-{}",
                std::env::consts::OS,
                std::fs::read_to_string("/proc/sys/kernel/osrelease")
                    .map(|r| r.trim().to_string())
                    .unwrap_or_default(),
                std::env::consts::ARCH
            )),
        );
        m.insert(
            "startedAt",
            JsonValue::Str(format!(
                "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{micros:06}Z"
            )),
        );
        m.insert("program", text(std::env::args().next()));
        m.insert("args", JsonValue::Array(args));
        m.insert(
            "executable",
            text(
                std::env::current_exe()
                    .ok()
                    .map(|p| p.display().to_string()),
            ),
        );
        m.insert(
            "root",
            text(
                std::env::current_dir()
                    .ok()
                    .map(|p| p.display().to_string()),
            ),
        );
        m.insert("host", JsonValue::Str(crate::event_file::hostname()));
        m.insert(
            "cpu_count_logical",
            std::thread::available_parallelism()
                .map_or(JsonValue::Null, |n| JsonValue::Int(n.get() as i64)),
        );
        dumps(&JsonValue::Object(m), Some(2), false)
    }
}

/// Upstream `WandbCallback`, writing offline runs (see the module's documentation).
pub struct WandbCallback {
    settings: WandbSettings,
    model_config: Option<ModelConfig>,
    run: Option<Run>,
    initialized: bool,
    /// Online: the run's page.
    run_url: Option<String>,
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
            run_url: None,
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
        // wandb's `run_mode`: `run` online, `offline-run` offline.
        let mode = match s.online {
            Some(_) => "run",
            None => "offline-run",
        };
        let dir = root.join(format!("{mode}-{}-{id}", timestamp_name(start as i64)));
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
            summary_values: Default::default(),
            config_tree: JsonMap::new(),
            summary_tree: JsonMap::new(),
            stream: None,
            warned: false,
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
        // Online: the run on the server (`UpsertBucket`, its config whole), then its file
        // stream.
        if let Some(online) = &s.online {
            let api = WandbApi::new(
                &online.base_url,
                &online.api_key,
                std::time::Duration::from_secs(60),
            );
            let text = |v: &Option<String>| {
                v.as_ref()
                    .map_or(serde_json::Value::Null, |t| t.as_str().into())
            };
            let variables = serde_json::json!({
                "name": id,
                "project": s.project,
                "entity": text(&s.entity),
                "groupName": text(&s.run_group),
                "displayName": text(&args.run_name.clone().or(s.name.clone())),
                "notes": text(&s.notes),
                "jobType": text(&s.job_type),
                "tags": if s.tags.is_empty() { serde_json::Value::Null } else { s.tags.clone().into() },
                "host": crate::event_file::hostname(),
                "program": std::env::args().next(),
                "config": value_json(&run.server_config()),
            });
            let path = api.upsert_bucket(variables)?;
            let url = format!(
                "{}/{}/{}/runs/{}",
                online.app_url(),
                path.entity,
                path.project,
                path.run
            );
            log::info!("W&B: syncing run {} to {url}", path.run);
            self.run_url = Some(url);
            run.stream = Some(FileStream::new(api, path));
        }
        self.run = Some(run);
        // The initial model's architecture as an artifact.
        if self.settings.log_model.is_enabled() {
            let mut metadata = JsonMap::new();
            let config = self.model_config.as_ref();
            metadata.insert(
                "model_config",
                config.map_or(JsonValue::Null, |c| JsonValue::Object(c.dict.clone())),
            );
            metadata.insert("num_parameters", self.num_parameters());
            metadata.insert("initial_model", JsonValue::Bool(true));
            let mut artifact = self.model_artifact(args, metadata)?;
            artifact.new_file("model_architecture.txt", self.architecture()?.as_bytes())?;
            self.log_artifact(&artifact, &["base_model".into()])?;
        }
        Ok(())
    }

    /// `wandb.config.get("model/num_parameters")`.
    fn num_parameters(&self) -> JsonValue {
        self.model_config
            .as_ref()
            .and_then(|c| c.num_parameters)
            .map_or(JsonValue::Null, JsonValue::Int)
    }

    /// What upstream's `save_model_architecture_to_file` writes: `print(model)` of a
    /// `PreTrainedModel`, nothing (an empty file) for a model without a config; refused for a
    /// model whose tree is not written out here.
    fn architecture(&self) -> Result<String> {
        match &self.model_config {
            None => Ok(String::new()),
            Some(c) => match &c.architecture {
                Some(text) => Ok(format!("{text}\n")),
                None => Err(setting(
                    "WANDB_LOG_MODEL",
                    match self.settings.log_model {
                        WandbLogModel::End => "end",
                        _ => "checkpoint",
                    },
                    &format!(
                        "the model artifacts hold model_architecture.txt, upstream's print(model), which is written out here for every text family and LoRA / DoRA adapters over them but Gemma 4's and Qwen3.5's multimodal models (model_type {:?}), quantized models and adapters on embeddings or expert parameters; unset WANDB_LOG_MODEL (the checkpoints and the model stay in output_dir)",
                        c.dict
                            .get("model_type")
                            .and_then(JsonValue::as_str)
                            .unwrap_or("?")
                    ),
                )),
            },
        }
    }

    /// `wandb.Artifact(name=model-<run id or name>, type="model", metadata)`.
    fn model_artifact(&self, args: &TrainingArguments, metadata: JsonMap) -> Result<Artifact> {
        let id = self.run.as_ref().map_or("", |r| r.id.as_str());
        let name = match args.run_name.as_deref() {
            Some(name) if name != args.output_dir() => format!("model-{name}"),
            _ => format!("model-{id}"),
        };
        Artifact::new(
            &name,
            "model",
            metadata,
            &staging_dir(&self.settings.data_dir),
        )
    }

    /// `run.log_artifact(artifact, aliases)`: online, sent to the server as wandb-core sends
    /// it (at the run's history step; a type other than the existing artifact's is refused,
    /// as wandb refuses it); offline — or online when the upload fails, or a file reaches
    /// the 2 GiB W&B uploads in parts — the `ArtifactRecord` in the run's log, which
    /// `wandb sync` uploads.
    fn log_artifact(&mut self, artifact: &Artifact, aliases: &[String]) -> Result<()> {
        let (project, entity) = (&self.settings.project, self.settings.entity.as_deref());
        let cache_dir = self.settings.cache_dir.clone();
        let Some(run) = self.run.as_mut() else {
            return Ok(());
        };
        if let Some(stream) = run.stream.as_ref() {
            let step = (run.step > 0).then_some(run.step);
            let uploaded = match artifact.check_type(&stream.api, &stream.path) {
                Ok(Err(refused)) => return Err(refused),
                Ok(Ok(())) if !artifact.uploads_whole() => Err(Error::WandbArtifact {
                    name: artifact.name().to_string(),
                    reason:
                        "a file of 2 GiB or more, which W&B uploads in parts (not implemented here)"
                            .into(),
                }),
                Ok(Ok(())) => artifact.upload(&stream.api, &stream.path, aliases, step, &cache_dir),
                Err(e) => Err(e),
            };
            match uploaded {
                Ok(()) => return Ok(()),
                Err(e) => log::warn!(
                    "{e}: the artifact stays in the run's log (its files staged); upload it with `wandb sync --include-online {}`",
                    run.dir.display()
                ),
            }
        }
        let record = artifact.record(&run.id, project, entity, aliases);
        run.record(8, &record)
    }
}

/// Python's `round(x, 2)` (correctly rounded, ties to even on the exact binary value) as
/// Python prints it.
fn round2_repr(x: f64) -> String {
    if !x.is_finite() {
        return tchtrain_training_args::python_float_repr(x);
    }
    // The exact decimal expansion (an f64 has at most 1074 fraction digits).
    let exact = format!("{:.1100}", x.abs());
    let (int_part, frac) = exact.split_once('.').unwrap_or((&exact, ""));
    let (kept, rest) = frac.split_at(2);
    let mut digits: Vec<u8> = format!("{int_part}{kept}").into_bytes();
    let first = rest.as_bytes()[0];
    let tail_zero = rest[1..].bytes().all(|b| b == b'0');
    let last_odd = (digits[digits.len() - 1] - b'0') % 2 == 1;
    let up = first > b'5' || (first == b'5' && (!tail_zero || last_odd));
    if up {
        let mut i = digits.len();
        loop {
            if i == 0 {
                digits.insert(0, b'1');
                break;
            }
            i -= 1;
            if digits[i] == b'9' {
                digits[i] = b'0';
            } else {
                digits[i] += 1;
                break;
            }
        }
    }
    let text = String::from_utf8(digits).unwrap_or_default();
    let (i, f) = text.split_at(text.len() - 2);
    let value: f64 = format!("{}{i}.{f}", if x < 0.0 { "-" } else { "" })
        .parse()
        .unwrap_or(x);
    tchtrain_training_args::python_float_repr(value)
}

impl TrainerCallback for WandbCallback {
    fn set_model_config(&mut self, config: &ModelConfig) {
        self.model_config = Some(config.clone());
    }

    /// Upstream's setup adds W&B's badge, linking the run, to the model card when it logs the
    /// model (the run's URL is `None` offline, and upstream writes that).
    fn model_card_comment(&self) -> Option<String> {
        (self.run.is_some() && self.settings.log_model.is_enabled()).then(|| {
            format!("[<img src=\"https://raw.githubusercontent.com/wandb/assets/main/wandb-github-badge-28.svg\" alt=\"Visualize in Weights & Biases\" width=\"200\" height=\"32\"/>]({})", self.run_url.as_deref().unwrap_or("None"))
        })
    }

    /// Upstream's `on_train_end` saves the model it is handed when `WANDB_LOG_MODEL` is
    /// `end` or `checkpoint`.
    fn saves_model_at_train_end(&self) -> bool {
        self.settings.log_model.is_enabled() && !self.settings.disabled
    }

    /// Upstream `on_train_end`: the final model (the files `save_model` wrote, and
    /// `model_architecture.txt`) as `model-<run>`, aliased `final_model`.
    fn on_model_saved(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        dir: &Path,
    ) -> Result<()> {
        if !self.initialized || !state.is_world_process_zero || self.run.is_none() {
            return Ok(());
        }
        let mut metadata = match args.load_best_model_at_end {
            false => self
                .run
                .as_ref()
                .map(Run::numeric_summary)
                .unwrap_or_default(),
            true => {
                let mut m = JsonMap::new();
                let metric = args.metric_for_best_model.as_deref().unwrap_or("None");
                m.insert(
                    format!("eval/{metric}").as_str(),
                    state.best_metric.map_or(JsonValue::Null, JsonValue::Float),
                );
                m.insert("train/total_floss", JsonValue::Float(state.total_flos));
                m.insert("model/num_parameters", self.num_parameters());
                m
            }
        };
        metadata.insert("final_model", JsonValue::Bool(true));
        let mut artifact = self.model_artifact(args, metadata)?;
        // `save_model_architecture_to_file(model, temp_dir)`, then every file of the folder
        // (its top level).
        let architecture = self.architecture()?;
        let listing = std::fs::read_dir(dir).map_err(|e| Error::Io {
            action: "listing",
            path: dir.to_path_buf(),
            source: e,
        })?;
        let mut files: Vec<PathBuf> = listing
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        for path in files {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if name != "model_architecture.txt" {
                artifact.add_file_skipping_cache(&name, &path)?;
            }
        }
        artifact.new_file("model_architecture.txt", architecture.as_bytes())?;
        self.log_artifact(&artifact, &["final_model".into()])
    }

    /// Upstream `on_save` with `WANDB_LOG_MODEL=checkpoint`: the checkpoint's folder as
    /// `model-<run>`, aliased by its epoch and step.
    fn on_save(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        _: &mut TrainerControl,
    ) -> Result<()> {
        if self.settings.log_model != WandbLogModel::Checkpoint
            || !self.initialized
            || !state.is_world_process_zero
        {
            return Ok(());
        }
        let Some(run) = self.run.as_ref() else {
            return Ok(());
        };
        let mut metadata = run.numeric_summary();
        metadata.insert("model/num_parameters", self.num_parameters());
        let mut artifact = self.model_artifact(args, metadata)?;
        artifact.add_dir(
            &Path::new(args.output_dir()).join(format!("checkpoint-{}", state.global_step)),
        )?;
        self.log_artifact(
            &artifact,
            &[
                format!("epoch_{}", round2_repr(state.epoch)),
                format!("checkpoint_global_step_{}", state.global_step),
            ],
        )
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
            for (k, v) in logs
                .iter()
                .filter(|(k, _)| SINGLE_VALUE_SCALARS.contains(k))
            {
                run.summary_values.insert(k.to_string(), v.clone());
            }
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

    /// Python's `round(x, 2)` printed: ties to even on the exact binary value (0.125 is
    /// exact: 0.12; 0.375: 0.38; 2.675 is below its decimal: 2.67).
    #[test]
    fn rounds_epochs_as_python() {
        for (x, want) in [
            (0.5, "0.5"),
            (1.0, "1.0"),
            (0.125, "0.12"),
            (0.375, "0.38"),
            (2.675, "2.67"),
            (1.0 / 3.0, "0.33"),
            (2.0 / 3.0, "0.67"),
            (9.999, "10.0"),
            (-0.125, "-0.12"),
        ] {
            assert_eq!(round2_repr(x), want, "{x}");
        }
    }

    #[test]
    fn run_folders_are_named_by_utc_time() {
        assert_eq!(timestamp_name(1_796_079_478), "20261130_225758");
    }
}

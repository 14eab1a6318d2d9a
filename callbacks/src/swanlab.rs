//! `SwanLabCallback` (upstream integrations/integration_utils.py) writing a SwanLab run as
//! swanlab 0.10 writes it in offline mode (`SWANLAB_MODE=offline`): a run folder
//! `<log dir>/run-<YYYYmmdd_HHMMSS>-<id>/` (log dir `SWANLAB_LOG_DIR`, default `swanlog` in the
//! working directory, with the `.gitignore` swanlab puts there) holding `run-<id>.swanlab` — the
//! run's records (swanlab's protobuf `Record`s) in LevelDB's log format behind swanlab's
//! `:SWL` header — `files/config.yaml` and the empty `media/` and `debug/` folders.
//! `swanlab sync <run folder>` uploads it.
//!
//! What upstream's callback logs, with the SDK's conversions: at setup a start record (project,
//! workspace, the run name or a generated `<adjective>-<animal>-<NN>` name, a generated
//! color, the id, the resume mode: `allow` when resuming from a checkpoint), then the config
//! — `FRAMEWORK: 🤗transformers`, `model.config` and `args.to_dict()` merged
//! (`{**model_config, **args}`), `model_num_parameters` — as swanlab's config.yaml (each key's
//! `value`, `desc`, `sort`; `None` at the top level as `{}`, NaN / infinities as the strings
//! `NaN` / `Inf`; PyYAML's dump) with a config save record per update; at every `on_log` the
//! run-summary keys (`train_runtime`, ...) as `single_value/<key>`, then the logs renamed by
//! `rewrite_logs` with `train/global_step`, at the global step; `on_predict`'s metrics at
//! the step after the largest logged. Each key's first value brings its column record
//! (section: the key's first `/` part); a value becomes a scalar record when swanlab takes it
//! (numbers, bools as 1 / 0, strings that parse as floats — NaN / infinities as NaN —; other
//! strings, lists and `None` skipped with swanlab's message) and its step is new for the key
//! (a repeated step is skipped). Keys lose leading / trailing spaces, dots and slashes and are
//! cut at 512 characters. The finish record is written when the callback is dropped (upstream:
//! when the process exits), `RUN_STATE_FINISHED`, or `RUN_STATE_CRASHED` when training began
//! and never reached `on_train_end`.
//!
//! Not written: what the Python SDK records of its own Python process (console lines, the
//! hardware / runtime metadata and the installed Python packages as `files/`, its debug log);
//! `peft_config` and the adapter's parameter counts, which upstream logs for a PeftModel.
//!
//! Settings are read from the environment; refused by name: cloud mode (`SWANLAB_MODE` unset,
//! `online` or `cloud`: a SwanLab server), `local` mode (it also writes the deprecated local
//! dashboard's files), `SWANLAB_LOG_MODEL` (upstream only warns that it is unsupported and
//! adds a cloud badge to the model card), swanlab's settings files (`swanlab.yaml`, `.env`,
//! `.swanlab/config.yaml`, `/etc/swanlab`, `~/.swanlab/config.yaml`) and every other
//! `SWANLAB_*` variable but the API key and hosts (unused offline, as upstream).
//! `SWANLAB_PROJECT`, which upstream's callback documents and passes as the project, is honoured
//! (swanlab 0.10 itself fails to start with it set: it reads it as its nested project settings).

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use tchtrain_training_args::{JsonMap, JsonValue, TrainingArguments};

use crate::args_dict::args_to_dict;
use crate::error::{Error, Result};
use crate::leveldb_log::LevelDbLog;
use crate::model_config::ModelConfig;
use crate::protobuf::Proto;
use crate::pyyaml::safe_dump;
use crate::tensorboard::{SINGLE_VALUE_SCALARS, rewrite_logs};
use crate::trainer_callback::TrainerCallback;
use crate::trainer_control::TrainerControl;
use crate::trainer_state::TrainerState;
use crate::wandb::{generate_id, timestamp_name};

/// The run log's file header: `:SWL`, magic 0xE1D6 (little-endian), version 2.
const SWANLAB_HEADER: &[u8; 7] = b":SWL\xd6\xe1\x02";
/// swanlab's default log folder (in the working directory).
pub const DEFAULT_LOG_DIR: &str = "swanlog";
/// swanlab's `METRIC_KEY_MAX_LENGTH`.
const METRIC_KEY_MAX_LENGTH: usize = 512;
/// swanlab's `_SYSTEM_KEY_PREFIX`: keys the SDK keeps for itself.
const SYSTEM_KEY_PREFIX: &str = "__swanlab__.";
/// The variables read here (besides the API key and hosts, which offline mode does not use).
const READ: [&str; 12] = [
    "SWANLAB_MODE",
    "SWANLAB_LOG_DIR",
    "SWANLAB_LOGDIR",
    "SWANLAB_PROJECT",
    "SWANLAB_PROJECT_NAME",
    "SWANLAB_PROJ_NAME",
    "SWANLAB_WORKSPACE",
    "SWANLAB_PROJECT_WORKSPACE",
    "SWANLAB_EXPERIMENT_NAME",
    "SWANLAB_EXP_NAME",
    "SWANLAB_RUN_ID",
    "SWANLAB_RESUME",
];
/// Read by swanlab only in cloud mode.
const UNUSED_OFFLINE: [&str; 3] = ["SWANLAB_API_KEY", "SWANLAB_API_HOST", "SWANLAB_WEB_HOST"];

fn refuse(setting: String, reason: &str) -> Error {
    Error::SwanLabSetting {
        setting,
        reason: reason.to_string(),
    }
}

/// swanlab's `strip_env_quotes`: a value wrapped in a matching pair of quotes loses them.
fn strip_env_quotes(v: &str) -> &str {
    let b = v.as_bytes();
    if b.len() >= 2 && b[0] == b[b.len() - 1] && matches!(b[0], b'"' | b'\'') {
        &v[1..v.len() - 1]
    } else {
        v
    }
}

/// swanlab's resume modes (`StartRecord.resume`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwanLabResume {
    /// `never`: a new run (the default).
    Never,
    /// `allow`: resume the run of the id if the server has it, else a new one.
    Allow,
    /// `must`: resume the run of the id.
    Must,
}

impl SwanLabResume {
    /// swanlab's `map_resume_value` of a string.
    fn parse(v: &str) -> Option<Self> {
        Some(match v.to_lowercase().as_str() {
            "true" | "yes" | "1" | "allow" => Self::Allow,
            "false" | "no" | "0" | "never" => Self::Never,
            "must" => Self::Must,
            _ => return None,
        })
    }
}

/// Where `SwanLabCallback` writes, and the environment it was checked against.
#[derive(Debug, Clone, PartialEq)]
pub struct SwanLabSettings {
    /// `SWANLAB_MODE=disabled`: nothing is written, as upstream.
    pub disabled: bool,
    /// The log folder (`SWANLAB_LOG_DIR`, or the older `SWANLAB_LOGDIR`; default `swanlog` in
    /// the working directory).
    pub log_dir: PathBuf,
    /// `SWANLAB_PROJECT` (what upstream's callback passes), `SWANLAB_PROJECT_NAME` or
    /// `SWANLAB_PROJ_NAME`; default the working directory's name.
    pub project: String,
    /// `SWANLAB_WORKSPACE` / `SWANLAB_PROJECT_WORKSPACE`.
    pub workspace: Option<String>,
    /// `SWANLAB_EXPERIMENT_NAME` / `SWANLAB_EXP_NAME`: the name when `run_name` is unset.
    pub experiment_name: Option<String>,
    /// `SWANLAB_RUN_ID`.
    pub run_id: Option<String>,
    /// `SWANLAB_RESUME` (else `allow` when resuming from a checkpoint, else `never`).
    pub resume: Option<SwanLabResume>,
}

/// swanlab's `ProjectName`: 1-100 characters of `[0-9a-zA-Z_\-+.]`.
fn valid_project(p: &str) -> bool {
    (1..=100).contains(&p.chars().count())
        && p.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-+.".contains(c))
}

impl SwanLabSettings {
    /// The working directory, the home directory and the environment (see the module's
    /// documentation).
    pub fn from_env() -> Result<Self> {
        let cwd = std::env::current_dir().map_err(|e| Error::io("reading", ".", e))?;
        let home = std::env::var_os("HOME").map(PathBuf::from);
        Self::from_vars(cwd, home.as_deref(), std::env::vars())
    }

    /// [`from_env`](Self::from_env) with the working and home directories and the environment
    /// given.
    pub fn from_vars(
        cwd: impl Into<PathBuf>,
        home: Option<&Path>,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self> {
        let cwd = cwd.into();
        let vars: HashMap<String, String> = vars
            .into_iter()
            .filter(|(k, _)| k.starts_with("SWANLAB_"))
            .map(|(k, v)| (k, strip_env_quotes(v.trim()).to_string()))
            .collect();
        let mut names: Vec<&String> = vars.keys().collect();
        names.sort();
        for name in names {
            if !READ.contains(&name.as_str()) && !UNUSED_OFFLINE.contains(&name.as_str()) {
                let reason = if name == "SWANLAB_LOG_MODEL" {
                    "upstream only warns that SwanLab does not save models and adds a cloud badge to the model card; unset it (checkpoints stay in output_dir)"
                } else {
                    "this swanlab setting is not read here; unset it (the settings read are SWANLAB_MODE, SWANLAB_LOG_DIR, SWANLAB_PROJECT, SWANLAB_WORKSPACE, SWANLAB_EXP_NAME, SWANLAB_RUN_ID and SWANLAB_RESUME)"
                };
                return Err(refuse(format!("{name}={:?}", vars[name]), reason));
            }
        }
        let get = |name: &str| vars.get(name).filter(|v| !v.is_empty()).cloned();
        let config_dir =
            get("SWANLAB_CONFIG_DIR").map_or(PathBuf::from("/etc/swanlab"), PathBuf::from);
        let user_dir = home.map(|h| h.join(".swanlab"));
        let mut files: Vec<PathBuf> = [
            "swanlab.yaml",
            "swanlab.yml",
            ".swanlab/config.yaml",
            ".swanlab/config.yml",
        ]
        .iter()
        .map(|f| cwd.join(f))
        .chain(
            user_dir
                .iter()
                .flat_map(|d| [d.join("config.yaml"), d.join("config.yml")]),
        )
        .collect();
        if let Ok(entries) = std::fs::read_dir(&config_dir) {
            files.extend(
                entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml")),
            );
        }
        if let Some(file) = files.into_iter().find(|f| f.is_file()) {
            return Err(refuse(
                file.display().to_string(),
                "swanlab's settings files are not read here: set their settings as SWANLAB_* environment variables, and move the file away",
            ));
        }
        let dotenv = cwd.join(".env");
        if std::fs::read_to_string(&dotenv).is_ok_and(|t| {
            t.lines().any(|l| {
                l.trim_start()
                    .trim_start_matches("export ")
                    .trim_start()
                    .starts_with("SWANLAB_")
            })
        }) {
            return Err(refuse(
                dotenv.display().to_string(),
                "swanlab reads SWANLAB_* settings from a .env file in the working directory, which is not read here: export them in the environment instead",
            ));
        }
        let disabled = match get("SWANLAB_MODE").as_deref() {
            Some("offline") => false,
            Some("disabled") => true,
            Some("local") => {
                return Err(refuse(
                    "SWANLAB_MODE=\"local\"".into(),
                    "local mode also writes the deprecated local dashboard's files (logs/, console/), which are not written here: use SWANLAB_MODE=offline (the same run records, uploaded with `swanlab sync`)",
                ));
            }
            mode @ (None | Some("online") | Some("cloud")) => {
                return Err(refuse(
                    format!(
                        "SWANLAB_MODE={}",
                        mode.map_or("<unset>".into(), |m| format!("{m:?}"))
                    ),
                    "SwanLab's cloud mode (the default) sends the run to a SwanLab server, which is not implemented here: set SWANLAB_MODE=offline to write the run folder, and upload it with `swanlab sync <run folder>`",
                ));
            }
            Some(other) => {
                return Err(refuse(
                    format!("SWANLAB_MODE={other:?}"),
                    "not a SwanLab mode (swanlab knows disabled, online, local and offline; offline is written here)",
                ));
            }
        };
        let log_dir = get("SWANLAB_LOG_DIR")
            .or_else(|| get("SWANLAB_LOGDIR"))
            .map_or(cwd.join(DEFAULT_LOG_DIR), |d| cwd.join(d));
        if log_dir.exists() && !log_dir.is_dir() {
            return Err(refuse(
                format!("SWANLAB_LOG_DIR={:?}", log_dir.display().to_string()),
                "it exists and is not a folder; name a folder for the run folders",
            ));
        }
        let proj_name = get("SWANLAB_PROJ_NAME").filter(|p| {
            let ok = valid_project(p);
            if !ok {
                log::warn!(
                    "Invalid SWANLAB_PROJ_NAME='{p}', ignored, using default project name instead."
                );
            }
            ok
        });
        let (project, source) = match (
            get("SWANLAB_PROJECT"),
            get("SWANLAB_PROJECT_NAME"),
            proj_name,
        ) {
            (Some(p), _, _) => (p, "SWANLAB_PROJECT"),
            (None, Some(p), _) => (p, "SWANLAB_PROJECT_NAME"),
            (None, None, Some(p)) => (p, "SWANLAB_PROJ_NAME"),
            (None, None, None) => (
                cwd.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                "the working directory's name",
            ),
        };
        if !valid_project(&project) {
            return Err(refuse(
                format!("{source} = {project:?}"),
                "not a SwanLab project name (1-100 characters of letters, digits, _ - + .): set SWANLAB_PROJECT to one",
            ));
        }
        let workspace = get("SWANLAB_PROJECT_WORKSPACE").or_else(|| get("SWANLAB_WORKSPACE"));
        if let Some(w) = &workspace
            && !((1..=25).contains(&w.len())
                && w.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        {
            return Err(refuse(
                format!("SWANLAB_WORKSPACE={w:?}"),
                "not a SwanLab workspace name (1-25 characters of letters, digits, - _)",
            ));
        }
        let run_id = get("SWANLAB_RUN_ID");
        if let Some(id) = &run_id
            && (id.chars().count() > 512
                || id
                    .chars()
                    .any(|c| c.is_control() || "<>:\"/\\|?*".contains(c)))
        {
            return Err(refuse(
                format!("SWANLAB_RUN_ID={id:?}"),
                "not a SwanLab run id (up to 512 characters, none of < > : \" / \\ | ? * or control characters)",
            ));
        }
        let resume = match get("SWANLAB_RESUME") {
            Some(v) => Some(SwanLabResume::parse(&v).ok_or_else(|| {
                refuse(
                    format!("SWANLAB_RESUME={v:?}"),
                    "not a resume mode (must, allow, never, or true / false)",
                )
            })?),
            None => None,
        };
        Ok(Self {
            disabled,
            log_dir,
            project,
            workspace,
            experiment_name: get("SWANLAB_EXPERIMENT_NAME").or_else(|| get("SWANLAB_EXP_NAME")),
            run_id,
            resume,
        })
    }
}

/// `(seconds, nanos)` since the epoch.
fn now() -> (i64, i64) {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_secs() as i64, i64::from(d.subsec_nanos()))
}

/// A `google.protobuf.Timestamp`.
fn timestamp((seconds, nanos): (i64, i64)) -> Proto {
    let mut t = Proto::default();
    if seconds != 0 {
        t.int(1, seconds);
    }
    if nanos != 0 {
        t.int(2, nanos);
    }
    t
}

fn string_if_set(p: &mut Proto, field: u32, v: &str) {
    if !v.is_empty() {
        p.string(field, v);
    }
}

/// A uniform draw in `[0, 1)`.
fn unit(next: &mut impl FnMut() -> u64) -> f64 {
    (next() >> 11) as f64 / (1u64 << 53) as f64
}

/// swanlab's `generate_name("beauty")`: `<adjective>-<animal>-<10..99>`.
fn generate_name() -> String {
    const ADJECTIVES: [&str; 15] = [
        "elegant",
        "stellar",
        "vibrant",
        "serene",
        "cosmic",
        "lucid",
        "radiant",
        "ethereal",
        "nimble",
        "valiant",
        "gentle",
        "brilliant",
        "luminous",
        "tranquil",
        "dazzling",
    ];
    const ANIMALS: [&str; 20] = [
        "swan", "rat", "ox", "tiger", "rabbit", "dragon", "snake", "horse", "goat", "monkey",
        "rooster", "dog", "pig", "cat", "elephant", "penguin", "kangaroo", "panda", "lion",
        "zebra",
    ];
    let mut next = crate::checksum_time::random_stream();
    let adjective = ADJECTIVES[(next() % 15) as usize];
    let animal = ANIMALS[(next() % 20) as usize];
    format!("{adjective}-{animal}-{}", 10 + next() % 90)
}

/// swanlab's `generate_color("beauty")`: a random hue at saturation 0.4-0.6 and value
/// 0.85-1.0, through Python's `colorsys.hsv_to_rgb`, as `#rrggbb`.
fn generate_color() -> String {
    let mut next = crate::checksum_time::random_stream();
    let h = unit(&mut next);
    let s = 0.4 + 0.2 * unit(&mut next);
    let v = 0.85 + 0.15 * unit(&mut next);
    let i = (h * 6.0) as i64;
    let f = h * 6.0 - i as f64;
    let (p, q, t) = (v * (1.0 - s), v * (1.0 - s * f), v * (1.0 - s * (1.0 - f)));
    let (r, g, b) = match i % 6 {
        0 => (v, t, p),
        1 => (q, v, p),
        2 => (p, v, t),
        3 => (p, q, v),
        4 => (t, p, v),
        _ => (v, p, q),
    };
    let byte = |x: f64| (x * 255.0) as u8;
    format!("#{:02x}{:02x}{:02x}", byte(r), byte(g), byte(b))
}

/// Python's `float(str)`: surrounding whitespace, underscores between digits, `inf` / `nan`
/// words.
fn python_float(s: &str) -> Option<f64> {
    let t = s.trim();
    let chars: Vec<char> = t.chars().collect();
    let mut cleaned = String::with_capacity(t.len());
    for (i, &c) in chars.iter().enumerate() {
        if c == '_' {
            let digit = |j: Option<&char>| j.is_some_and(char::is_ascii_digit);
            if !(i > 0 && digit(chars.get(i - 1)) && digit(chars.get(i + 1))) {
                return None;
            }
        } else {
            cleaned.push(c);
        }
    }
    cleaned.parse().ok()
}

/// swanlab's `validate_key`: leading / trailing spaces, tabs, line breaks, dots and slashes
/// stripped, cut at 512 characters; `None` (dropped, with swanlab's message) when nothing or a
/// control character is left.
fn validate_key(key: &str) -> Option<String> {
    let k = key.trim_matches([' ', '\t', '\n', '\r', '.', '/']);
    if k.is_empty() {
        log::error!(
            "SwanLab key: '{key}' is invalid or empty after sanitization, please use valid characters and avoid leading/trailing special characters."
        );
        return None;
    }
    let k: String = k.chars().take(METRIC_KEY_MAX_LENGTH).collect();
    if k != key {
        log::warn!(
            "Key '{key}' has been trimmed to '{k}', due to leading/trailing characters or length exceeding limit."
        );
    }
    if k.chars().any(|c| (c as u32) < 0x20 || c as u32 == 0x7f) {
        log::error!("SwanLab dropped an invalid metric: '{k}' holds a control character");
        return None;
    }
    Some(k)
}

/// swanlab's `flatten_dict` (nested mappings joined with `/`) with each key validated.
fn flatten(map: &JsonMap, prefix: Option<&str>, out: &mut Vec<(String, JsonValue)>) {
    for (k, v) in map.iter() {
        let key = match prefix {
            Some(p) => format!("{p}/{k}"),
            None => k.to_string(),
        };
        match v {
            JsonValue::Object(inner) => flatten(inner, Some(&key), out),
            _ => {
                if let Some(key) = validate_key(&key) {
                    match out.iter_mut().find(|(k, _)| *k == key) {
                        Some(entry) => {
                            log::warn!(
                                "Duplicate key found after sanitization: '{key}'. The latter value will overwrite the former one."
                            );
                            entry.1 = v.clone();
                        }
                        None => out.push((key, v.clone())),
                    }
                }
            }
        }
    }
}

/// swanlab's `Scalar.transform`: the number a value logs as, or `None` with the SDK's message.
fn scalar_value(key: &str, v: &JsonValue) -> Option<f64> {
    let fail = |why: String| {
        log::error!("Error when parsing metric '{key}': {why}");
        None
    };
    match v {
        JsonValue::Bool(b) => Some(if *b { 1.0 } else { 0.0 }),
        JsonValue::Int(i) => Some(*i as f64),
        JsonValue::Float(x) => Some(*x),
        JsonValue::Str(s) => match python_float(s) {
            Some(x) if x.is_nan() || x.is_infinite() => Some(f64::NAN),
            Some(x) => Some(x),
            None => fail(format!("TypeError: Unsupported scalar string value: '{s}'.")),
        },
        JsonValue::Null => fail(
            "TypeError: Failed to extract scalar value from builtins.NoneType. If it's a Tensor or Array, please ensure it's a scalar value.".into(),
        ),
        JsonValue::Array(_) => fail(
            "TypeError: List must contain TransformMedia objects or swanlab.echarts chart objects".into(),
        ),
        JsonValue::Object(_) => fail("TypeError: Unsupported scalar type: dict.".into()),
    }
}

/// swanlab's config `parse` of one top-level value: `None` as `{}`, NaN / infinities (at any
/// depth) as the strings `NaN` / `Inf`.
fn config_value(v: &JsonValue, top: bool) -> JsonValue {
    match v {
        JsonValue::Null if top => JsonValue::Object(JsonMap::new()),
        JsonValue::Float(x) if x.is_nan() => JsonValue::Str("NaN".into()),
        JsonValue::Float(x) if x.is_infinite() => JsonValue::Str("Inf".into()),
        JsonValue::Object(m) => JsonValue::Object(
            m.iter()
                .map(|(k, v)| (k.to_string(), config_value(v, false)))
                .collect(),
        ),
        JsonValue::Array(a) => JsonValue::Array(a.iter().map(|v| config_value(v, false)).collect()),
        other => other.clone(),
    }
}

/// An open offline run.
struct Run {
    log: LevelDbLog,
    dir: PathBuf,
    /// Records counted up (columns, scalars).
    num: i64,
    /// swanlab's global step: the largest step given, or one past it for a log without one.
    global_step: i64,
    /// Per key, the steps taken (a key is in the map once its column is written).
    steps: HashMap<String, BTreeSet<i64>>,
    /// The config: key → (value, sort index), and the next index.
    config: Vec<(String, JsonValue, usize)>,
    finished: bool,
}

impl Run {
    /// `Record { num, timestamp, <field> = body }`.
    fn record(&mut self, num: i64, field: u32, body: &Proto) -> Result<()> {
        let mut r = Proto::default();
        r.int(1, num);
        r.message(2, &timestamp(now()));
        r.message(field, body);
        self.log.append(&r.0)
    }

    /// config.yaml rewritten, and a config save record.
    fn save_config(&mut self) -> Result<()> {
        let mut content = JsonMap::new();
        for (key, value, sort) in &self.config {
            let mut entry = JsonMap::new();
            entry.insert("value", value.clone());
            entry.insert("desc", "");
            entry.insert("sort", *sort as i64);
            content.insert(key.clone(), JsonValue::Object(entry));
        }
        let path = self.dir.join("files").join("config.yaml");
        let text = safe_dump(&JsonValue::Object(content));
        std::fs::create_dir_all(self.dir.join("files"))
            .and_then(|()| std::fs::write(&path, text))
            .map_err(|e| Error::io("writing", &path, e))?;
        let mut save = Proto::default();
        save.string(1, "config");
        save.string(2, &path.to_string_lossy());
        save.int(5, 1);
        self.record(-3, 20, &save)
    }

    /// `config.update(entries)` (or `config[key] = value` for one entry).
    fn update_config(&mut self, entries: &JsonMap) -> Result<()> {
        for (k, v) in entries.iter() {
            let v = config_value(v, true);
            match self.config.iter_mut().find(|(key, _, _)| key == k) {
                Some(entry) => entry.1 = v,
                None => {
                    let sort = self.config.len();
                    self.config.push((k.to_string(), v, sort));
                }
            }
        }
        self.save_config()
    }

    /// `swanlab.log(data, step)`.
    fn log(&mut self, data: &JsonMap, step: Option<i64>) -> Result<()> {
        let step = match step {
            Some(s) => {
                self.global_step = self.global_step.max(s);
                s
            }
            None => {
                self.global_step += 1;
                self.global_step
            }
        };
        let logged_at = now();
        let mut flat = Vec::new();
        flatten(data, None, &mut flat);
        for (key, value) in flat {
            if key.starts_with(SYSTEM_KEY_PREFIX) {
                log::warn!("Metric '{key}' at step {step} is a system key, skipped");
                continue;
            }
            let Some(number) = scalar_value(&key, &value) else {
                continue;
            };
            if !self.steps.contains_key(&key) {
                let section = match key.split_once('/') {
                    Some((first, _)) => first,
                    None => "",
                };
                let mut column = Proto::default();
                column.int(1, 1);
                column.int(2, 1);
                column.string(3, &key);
                string_if_set(&mut column, 5, section);
                column.int(6, 3);
                self.num += 1;
                self.record(self.num, 12, &column)?;
                self.steps.insert(key.clone(), BTreeSet::new());
            }
            let steps = self.steps.get_mut(&key).expect("inserted above");
            if step <= -1 || !steps.insert(step) {
                log::debug!(
                    "Metric '{key}' at step {step} was skipped because it is duplicate or too old."
                );
                continue;
            }
            let mut scalar = Proto::default();
            scalar.string(1, &key);
            if step != 0 {
                scalar.int(2, step);
            }
            scalar.int(3, 1);
            scalar.message(4, &timestamp(logged_at));
            let mut v = Proto::default();
            if number.to_bits() != 0 {
                v.double(1, number);
            }
            scalar.message(5, &v);
            self.num += 1;
            self.record(self.num, 13, &scalar)?;
        }
        Ok(())
    }

    /// The finish record.
    fn finish(&mut self, crashed: bool) -> Result<()> {
        if self.finished {
            return Ok(());
        }
        self.finished = true;
        let mut f = Proto::default();
        if crashed {
            f.int(1, 2);
            f.string(
                2,
                "training stopped before on_train_end (an error or an interrupted run)",
            );
        } else {
            f.int(1, 1);
        }
        f.message(3, &timestamp(now()));
        self.record(-2, 11, &f)
    }
}

/// Upstream `SwanLabCallback`: sends the logs to SwanLab, here as SwanLab's offline run folder
/// (see the module's documentation).
pub struct SwanLabCallback {
    settings: SwanLabSettings,
    model_config: Option<ModelConfig>,
    run: Option<Run>,
    initialized: bool,
    training: bool,
}

impl std::fmt::Debug for SwanLabCallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SwanLabCallback")
            .field("settings", &self.settings)
            .field("initialized", &self.initialized)
            .field("run_dir", &self.run_dir())
            .finish()
    }
}

impl SwanLabCallback {
    /// Settings from the environment ([`SwanLabSettings::from_env`]); refusals are errors.
    pub fn new() -> Result<Self> {
        Ok(Self::with_settings(SwanLabSettings::from_env()?))
    }

    /// With the given settings.
    pub fn with_settings(settings: SwanLabSettings) -> Self {
        Self {
            settings,
            model_config: None,
            run: None,
            initialized: false,
            training: false,
        }
    }

    /// The run folder, once the run has started.
    pub fn run_dir(&self) -> Option<&Path> {
        self.run.as_ref().map(|r| r.dir.as_path())
    }

    /// Upstream `setup`: on the first process, the run started (`swanlab.init`) with the
    /// name, then the config.
    pub fn setup(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        with_model: bool,
    ) -> Result<()> {
        self.initialized = true;
        if !state.is_world_process_zero || self.settings.disabled {
            return Ok(());
        }
        let s = &self.settings;
        let name = match (&args.run_name, &s.experiment_name) {
            (Some(n), _) | (None, Some(n)) => n.clone(),
            (None, None) => generate_name(),
        };
        if name.chars().count() > 512 {
            return Err(refuse(
                format!("run_name ({} characters)", name.chars().count()),
                "SwanLab experiment names are at most 512 characters: set a shorter run_name",
            ));
        }
        let resume = s
            .resume
            .unwrap_or(if args.resume_from_checkpoint.is_some() {
                SwanLabResume::Allow
            } else {
                SwanLabResume::Never
            });
        let id = s.run_id.clone().unwrap_or_else(generate_id);
        let log_dir = &s.log_dir;
        std::fs::create_dir_all(log_dir).map_err(|e| Error::io("creating", log_dir, e))?;
        let gitignore = log_dir.join(".gitignore");
        if !gitignore.exists() {
            std::fs::write(&gitignore, "*").map_err(|e| Error::io("writing", &gitignore, e))?;
        }
        // A new folder each time (swanlab retries ten times, a second apart).
        let mut attempt = 0;
        let dir = loop {
            let (secs, _) = now();
            let dir = log_dir.join(format!("run-{}-{id}", timestamp_name(secs)));
            match std::fs::create_dir(&dir) {
                Ok(()) => break dir,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 9 => {
                    attempt += 1;
                    std::thread::sleep(std::time::Duration::from_secs(1));
                }
                Err(e) => return Err(Error::io("creating", &dir, e)),
            }
        };
        let log = LevelDbLog::create(&dir.join(format!("run-{id}.swanlab")), SWANLAB_HEADER)?;
        let mut run = Run {
            log,
            dir,
            num: 0,
            global_step: -1,
            steps: HashMap::new(),
            config: Vec::new(),
            finished: false,
        };
        let mut start = Proto::default();
        start.string(1, &s.project);
        if let Some(w) = &s.workspace {
            start.string(2, w);
        }
        start.string(4, &name);
        start.string(9, &generate_color());
        start.string(10, &id);
        match resume {
            SwanLabResume::Never => {}
            SwanLabResume::Allow => start.int(11, 1),
            SwanLabResume::Must => start.int(11, 2),
        }
        start.message(12, &timestamp(now()));
        run.record(-1, 10, &start)?;
        run.save_config()?;
        for sub in ["media", "files", "debug"] {
            let d = run.dir.join(sub);
            std::fs::create_dir_all(&d).map_err(|e| Error::io("creating", &d, e))?;
        }
        let mut framework = JsonMap::new();
        framework.insert("FRAMEWORK", "🤗transformers");
        run.update_config(&framework)?;
        let model = self.model_config.as_ref().filter(|_| with_model);
        let mut combined = model.map(|c| c.dict.clone()).unwrap_or_default();
        for (k, v) in args_to_dict(args) {
            combined.insert(k, v);
        }
        run.update_config(&combined)?;
        match model.and_then(|c| c.num_parameters) {
            Some(n) => {
                let mut entry = JsonMap::new();
                entry.insert("model_num_parameters", n);
                run.update_config(&entry)?;
            }
            None => log::info!(
                "Could not log the number of model parameters in SwanLab due to an AttributeError."
            ),
        }
        self.run = Some(run);
        Ok(())
    }
}

impl Drop for SwanLabCallback {
    fn drop(&mut self) {
        let crashed = self.training;
        if let Some(run) = &mut self.run
            && let Err(e) = run.finish(crashed)
        {
            log::error!("SwanLab: the finish record could not be written: {e}");
        }
    }
}

impl TrainerCallback for SwanLabCallback {
    fn name(&self) -> &str {
        "SwanLabCallback"
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
        self.training = true;
        if !self.initialized {
            self.setup(args, state, true)?;
        }
        Ok(())
    }

    fn on_train_end(
        &mut self,
        _args: &TrainingArguments,
        _state: &TrainerState,
        _control: &mut TrainerControl,
    ) -> Result<()> {
        self.training = false;
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
        let Some(run) = self.run.as_mut().filter(|_| state.is_world_process_zero) else {
            return Ok(());
        };
        let step = state.global_step;
        let mut rest = JsonMap::new();
        for (k, v) in logs.iter() {
            if SINGLE_VALUE_SCALARS.contains(&k) {
                let mut one = JsonMap::new();
                one.insert(format!("single_value/{k}"), v.clone());
                run.log(&one, Some(step))?;
            } else {
                rest.insert(k, v.clone());
            }
        }
        let mut row = rewrite_logs(&rest);
        row.insert("train/global_step", step);
        run.log(&row, Some(step))
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
        match self.run.as_mut().filter(|_| state.is_world_process_zero) {
            Some(run) => run.log(&rewrite_logs(metrics), None),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn values_and_keys_convert_as_swanlab_converts_them() {
        assert_eq!(python_float(" 0.5 "), Some(0.5));
        assert_eq!(python_float("1_000"), Some(1000.0));
        assert_eq!(python_float("1__0"), None);
        assert_eq!(python_float("-Infinity"), Some(f64::NEG_INFINITY));
        assert_eq!(python_float("1e3"), Some(1000.0));
        assert_eq!(python_float("ok"), None);
        assert!(
            scalar_value("k", &JsonValue::Str("nan".into()))
                .unwrap()
                .is_nan()
        );
        assert_eq!(scalar_value("k", &JsonValue::Bool(true)), Some(1.0));
        assert_eq!(scalar_value("k", &JsonValue::Null), None);
        assert_eq!(validate_key("/eval/dot."), Some("eval/dot".into()));
        assert_eq!(validate_key(" ./ "), None);
        assert_eq!(validate_key("a\u{1}b"), None);
        assert_eq!(strip_env_quotes("\"abc\""), "abc");
        assert_eq!(strip_env_quotes("'abc\""), "'abc\"");
        let name = generate_name();
        assert_eq!(name.split('-').count(), 3, "{name}");
        let color = generate_color();
        assert!(color.len() == 7 && color.starts_with('#'), "{color}");
    }

    #[test]
    fn cloud_mode_settings_files_and_unknown_variables_are_refused_by_name() {
        let cwd =
            std::env::temp_dir().join(format!("tchtrain-swanlab-settings-{}", std::process::id()));
        std::fs::create_dir_all(&cwd).unwrap();
        let err = |pairs: &[(&str, &str)]| {
            SwanLabSettings::from_vars(&cwd, None, vars(pairs))
                .unwrap_err()
                .to_string()
        };
        assert!(err(&[]).contains("SWANLAB_MODE=<unset>"));
        assert!(err(&[("SWANLAB_MODE", "cloud")]).contains("swanlab sync"));
        assert!(err(&[("SWANLAB_MODE", "local")]).contains("SWANLAB_MODE=offline"));
        assert!(
            err(&[("SWANLAB_MODE", "offline"), ("SWANLAB_LOG_MODEL", "end")])
                .contains("SWANLAB_LOG_MODEL")
        );
        assert!(
            err(&[("SWANLAB_MODE", "offline"), ("SWANLAB_TAGS", "a,b")]).contains("SWANLAB_TAGS")
        );
        assert!(
            err(&[("SWANLAB_MODE", "offline"), ("SWANLAB_PROJECT", "a b")])
                .contains("SWANLAB_PROJECT")
        );
        assert!(
            err(&[("SWANLAB_MODE", "offline"), ("SWANLAB_RESUME", "maybe")])
                .contains("SWANLAB_RESUME")
        );
        let ok = SwanLabSettings::from_vars(
            &cwd,
            None,
            vars(&[
                ("SWANLAB_MODE", "'offline'"),
                ("SWANLAB_API_KEY", "k"),
                ("SWANLAB_PROJ_NAME", "p-1"),
                ("SWANLAB_RESUME", "True"),
            ]),
        )
        .unwrap();
        assert_eq!(ok.project, "p-1");
        assert_eq!(ok.resume, Some(SwanLabResume::Allow));
        assert_eq!(ok.log_dir, cwd.join("swanlog"));
        std::fs::write(cwd.join(".env"), "SWANLAB_MODE=offline\n").unwrap();
        assert!(err(&[("SWANLAB_MODE", "offline")]).contains(".env"));
        std::fs::remove_file(cwd.join(".env")).unwrap();
        std::fs::write(cwd.join("swanlab.yaml"), "mode: offline\n").unwrap();
        assert!(err(&[("SWANLAB_MODE", "offline")]).contains("swanlab.yaml"));
        let _ = std::fs::remove_dir_all(&cwd);
    }
}

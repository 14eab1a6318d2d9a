//! `ClearMLCallback` (upstream integrations/integration_utils.py) writing a ClearML task as
//! clearml 2.1 writes it in offline mode (`CLEARML_OFFLINE_MODE=1`): a session folder
//! `<cache>/offline/offline-<id>/` (cache `CLEARML_CACHE_DIR`, default `~/.clearml/cache`)
//! holding `task.json` — the task: project, name, type, the `Transformers` hyperparameters and
//! the `Model Configuration` configuration object — `metrics.jsonl` — the reported scalars,
//! one JSON list of events per line — and an empty `data/`, zipped beside it
//! (`offline-<id>.zip`) when the task closes at the end of training.
//! `Task.import_offline_session("<...>.zip")` uploads it to a ClearML server.
//!
//! What upstream's callback logs, with the SDK's conversions: at setup every `TrainingArguments`
//! field but the `*_token` ones as a hyperparameter of section `Transformers` (clearml's
//! `flatten_dictionary`: a dict field's entries as `field/key`; `accelerator_config`, not a
//! builtin type, dropped as clearml drops it; each value's text and type as clearml's
//! `_set_parameters` stores them: enums by member name with their members listed in the
//! description, lists and dicts as JSON, `None` as an empty value without a type), the two
//! `_ignore_*_ui_overrides_` flags, and `model.config.to_dict()` as HOCON text (clearml's
//! `config_dict_to_text`); at every `on_log` each number (bools as 1 / 0, NaN and infinities
//! as 0.0, clearml's defaults) as a scalar — `train_runtime`, `train_loss`, `epoch`, ... as
//! single values (metric `Summary`), `eval_*` under `eval`, `test_*` under `test`, the rest
//! under `train`, at the global step —, other values dropped with upstream's warning.
//!
//! Not written: what the Python SDK records of its own Python process (the script's code and
//! installed packages in `script`, console lines in `log.jsonl`, the resource monitor's
//! `:monitor:` scalars). `script` names the program that ran.
//!
//! Settings are read from the environment; refused by name: ClearML's online mode (a ClearML
//! server; `CLEARML_OFFLINE_MODE` unset or false), `CLEARML_LOG_MODEL` (TRUE by default) when
//! checkpoints are saved — clearml 2.1 cannot store model weights offline (upstream's callback
//! stops the run at the first save) —, running under a ClearML agent (`CLEARML_TASK_ID`),
//! a `clearml.conf` with an `sdk` section, and every other `CLEARML_*` / `TRAINS_*` variable
//! but the server's address and keys (unused offline, as clearml).

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use tchtrain_training_args::{
    HubStrategy, IntervalStrategy, JsonMap, JsonValue, OptimizerNames, SaveStrategy, SchedulerType,
    TrainingArguments, dumps, python_float_repr,
};

use crate::args_dict::args_to_dict;
use crate::error::{Error, Result};
use crate::model_config::ModelConfig;
use crate::trainer_callback::TrainerCallback;
use crate::trainer_control::TrainerControl;
use crate::trainer_state::TrainerState;

/// The `CLEARML_*` variables read here (each also under its older `TRAINS_*` name where
/// clearml reads one).
const READ: [&str; 7] = [
    "CLEARML_OFFLINE_MODE",
    "TRAINS_OFFLINE_MODE",
    "CLEARML_PROJECT",
    "CLEARML_TASK",
    "CLEARML_LOG_MODEL",
    "CLEARML_CACHE_DIR",
    "TRAINS_CACHE_DIR",
];
/// Read by clearml only online (the server's address and keys).
const UNUSED_OFFLINE: [&str; 12] = [
    "CLEARML_API_HOST",
    "CLEARML_WEB_HOST",
    "CLEARML_FILES_HOST",
    "CLEARML_API_ACCESS_KEY",
    "CLEARML_API_SECRET_KEY",
    "CLEARML_API_HOST_VERIFY_CERT",
    "TRAINS_API_HOST",
    "TRAINS_WEB_HOST",
    "TRAINS_FILES_HOST",
    "TRAINS_API_ACCESS_KEY",
    "TRAINS_API_SECRET_KEY",
    "TRAINS_API_HOST_VERIFY_CERT",
];
/// The hyperparameter section upstream's callback writes.
const HPARAMS_SECTION: &str = "Transformers";
/// The configuration object upstream's callback writes.
const MODEL_CONFIG_SECTION: &str = "Model Configuration";
/// The keys upstream's callback reports as single values (`report_single_value`).
const SINGLE_VALUE_SCALARS: [&str; 6] = [
    "train_runtime",
    "train_samples_per_second",
    "train_steps_per_second",
    "train_loss",
    "total_flos",
    "epoch",
];
/// clearml's iteration of a single value (`report_single_value`): the smallest int32.
const SINGLE_VALUE_ITERATION: i64 = -2_147_483_648;

fn refuse(setting: impl Into<String>, reason: &str) -> Error {
    Error::ClearMLSetting {
        setting: setting.into(),
        reason: reason.to_string(),
    }
}

/// clearml's `safe_text_to_bool`: `y yes t true on 1` / `n no f false off 0` (any case), any
/// other non-empty text true.
fn clearml_bool(v: &str) -> bool {
    match v.to_lowercase().as_str() {
        "y" | "yes" | "t" | "true" | "on" | "1" => true,
        "n" | "no" | "f" | "false" | "off" | "0" | "" => false,
        _ => true,
    }
}

/// Where `ClearMLCallback` writes, and the environment it was checked against.
#[derive(Debug, Clone, PartialEq)]
pub struct ClearMLSettings {
    /// `CLEARML_PROJECT`, default `HuggingFace Transformers`.
    pub project: String,
    /// `CLEARML_TASK`, default `Trainer`.
    pub task_name: String,
    /// `CLEARML_LOG_MODEL` (upstream: `TRUE` unless set to something else than
    /// `1 ON YES TRUE`, any case): log each checkpoint as an output model — refused when a
    /// checkpoint is saved (see the module's documentation).
    pub log_model: bool,
    /// The cache folder the session goes under (`CLEARML_CACHE_DIR`, `~` and `$VAR`
    /// expanded; default `~/.clearml/cache`): the session is `<cache>/offline/offline-<id>/`.
    pub cache_dir: PathBuf,
}

impl ClearMLSettings {
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
        let all: HashMap<String, String> = vars.into_iter().collect();
        let mut names: Vec<&String> = all
            .keys()
            .filter(|k| k.starts_with("CLEARML_") || k.starts_with("TRAINS_"))
            .collect();
        names.sort();
        for name in names {
            let n = name.as_str();
            if READ.contains(&n) || UNUSED_OFFLINE.contains(&n) || n == "CLEARML_CONFIG_FILE" {
                continue;
            }
            let reason = if n == "CLEARML_TASK_ID" || n == "TRAINS_TASK_ID" {
                "it is set by a ClearML agent running a task remotely, which is not implemented here: run the training locally in offline mode and import the session"
            } else {
                "this clearml setting is not read here; unset it (the settings read are CLEARML_OFFLINE_MODE, CLEARML_PROJECT, CLEARML_TASK, CLEARML_LOG_MODEL and CLEARML_CACHE_DIR)"
            };
            return Err(refuse(format!("{n}={:?}", all[name]), reason));
        }
        let get = |names: &[&str]| {
            names
                .iter()
                .find_map(|n| all.get(*n).filter(|v| !v.is_empty()).cloned())
        };
        let offline = get(&["CLEARML_OFFLINE_MODE", "TRAINS_OFFLINE_MODE"]);
        if !offline.as_deref().is_some_and(clearml_bool) {
            return Err(refuse(
                format!(
                    "CLEARML_OFFLINE_MODE={}",
                    offline.map_or("<unset>".into(), |m| format!("{m:?}"))
                ),
                "ClearML's online mode (the default) sends the task to a ClearML server, which is not implemented here: set CLEARML_OFFLINE_MODE=1 to write the offline session, and upload it with clearml's Task.import_offline_session(\"<session>.zip\")",
            ));
        }
        let config_file = match get(&["CLEARML_CONFIG_FILE"]) {
            Some(f) => Some(cwd.join(expand(&f, home, &all))),
            None => home.map(|h| h.join("clearml.conf")),
        };
        if let Some(file) = config_file.filter(|f| f.is_file()) {
            let text =
                std::fs::read_to_string(&file).map_err(|e| Error::io("reading", &file, e))?;
            if text.contains("sdk") {
                return Err(refuse(
                    file.display().to_string(),
                    "its `sdk` settings (what clearml records and where its cache is) are not read here: move them out of the file (its `api` section, unused offline, may stay), and set the session's folder with CLEARML_CACHE_DIR",
                ));
            }
        }
        let cache_dir = match get(&["CLEARML_CACHE_DIR", "TRAINS_CACHE_DIR"]) {
            Some(d) => cwd.join(expand(&d, home, &all)),
            None => home
                .map(|h| h.join(".clearml").join("cache"))
                .ok_or_else(|| {
                    refuse(
                        "CLEARML_CACHE_DIR=<unset>",
                        "the session goes to ~/.clearml/cache, and HOME is not set: set CLEARML_CACHE_DIR",
                    )
                })?,
        };
        let log_model = get(&["CLEARML_LOG_MODEL"])
            .is_none_or(|v| matches!(v.to_uppercase().as_str(), "1" | "ON" | "YES" | "TRUE"));
        Ok(Self {
            project: get(&["CLEARML_PROJECT"]).unwrap_or_else(|| "HuggingFace Transformers".into()),
            task_name: get(&["CLEARML_TASK"]).unwrap_or_else(|| "Trainer".into()),
            log_model,
            cache_dir,
        })
    }
}

/// Python's `expandvars(expanduser(path))`: a leading `~` as the home folder, `$NAME` and
/// `${NAME}` as the variable's value when it is set (left as they are otherwise).
fn expand(path: &str, home: Option<&Path>, vars: &HashMap<String, String>) -> PathBuf {
    let path = match (path.strip_prefix('~'), home) {
        (Some(rest), Some(h)) if rest.is_empty() || rest.starts_with('/') => {
            format!("{}{rest}", h.display())
        }
        _ => path.to_string(),
    };
    let re = regex::Regex::new(r"\$(\w+|\{[^}]*\})").expect("a valid pattern");
    let out = re.replace_all(&path, |c: &regex::Captures<'_>| {
        let name = c[1].trim_start_matches('{').trim_end_matches('}');
        vars.get(name).cloned().unwrap_or_else(|| c[0].to_string())
    });
    PathBuf::from(out.into_owned())
}

/// An enum-valued field as clearml stores it: the enum's name as the type, the member's name
/// as the value, the members listed in the description.
fn enum_param(field: &str, value: &str) -> Option<(&'static str, String, Vec<String>)> {
    macro_rules! param {
        ($t:ty) => {{
            let v: $t = value.parse().ok()?;
            Some((
                <$t>::UPSTREAM_NAME,
                v.member_name().into_owned(),
                <$t>::ALL
                    .iter()
                    .map(|m| m.member_name().into_owned())
                    .collect(),
            ))
        }};
    }
    match field {
        "eval_strategy" | "logging_strategy" => param!(IntervalStrategy),
        "save_strategy" => param!(SaveStrategy),
        "hub_strategy" => param!(HubStrategy),
        "lr_scheduler_type" => param!(SchedulerType),
        "optim" => param!(OptimizerNames),
        _ => None,
    }
}

/// clearml's `get_basic_type`: `list/<item type>` for a non-empty list of one item type,
/// `dict/<value type>` likewise, else the value's type name.
fn basic_type(v: &JsonValue) -> Cow<'static, str> {
    fn name(v: &JsonValue) -> &'static str {
        match v {
            JsonValue::Null => "NoneType",
            other => other.type_name(),
        }
    }
    let items: Vec<&JsonValue> = match v {
        JsonValue::Array(a) => a.iter().collect(),
        JsonValue::Object(m) => m.iter().map(|(_, v)| v).collect(),
        _ => Vec::new(),
    };
    match items.first() {
        Some(first) if items.iter().all(|i| name(i) == name(first)) => {
            Cow::Owned(format!("{}/{}", name(v), name(first)))
        }
        _ => Cow::Borrowed(name(v)),
    }
}

/// clearml's `_set_parameters`' `stringify`: `None` as empty text, lists and dicts as JSON,
/// anything else as Python's `str`.
fn stringify(v: &JsonValue) -> String {
    match v {
        JsonValue::Null => String::new(),
        JsonValue::Bool(b) => if *b { "True" } else { "False" }.into(),
        JsonValue::Int(i) => i.to_string(),
        JsonValue::Float(f) => python_float_repr(*f),
        JsonValue::Str(s) => s.clone(),
        other => dumps(other, None, false),
    }
}

/// clearml's `flatten_dictionary` with `/`: nested dicts' entries under `key/`, an empty
/// nested dict kept as `{}` under its own key (without the prefix, as clearml does).
fn flatten(map: &JsonMap, prefix: &str, out: &mut Vec<(String, JsonValue)>) {
    for (k, v) in map.iter() {
        match v {
            JsonValue::Object(inner) => {
                let before = out.len();
                flatten(inner, &format!("{prefix}{k}/"), out);
                if out.len() == before {
                    out.push((k.to_string(), JsonValue::Object(JsonMap::new())));
                }
            }
            _ => out.push((format!("{prefix}{k}"), v.clone())),
        }
    }
}

fn param_item(
    section: &str,
    name: &str,
    value: String,
    ty: Option<&str>,
    description: String,
) -> JsonValue {
    let mut item = JsonMap::new();
    item.insert("description", description);
    item.insert("name", name);
    item.insert("section", section);
    if let Some(t) = ty {
        item.insert("type", t);
    }
    item.insert("value", value);
    JsonValue::Object(item)
}

/// Upstream `_copy_training_args_as_hparams` with the two `set_parameter` flags: the
/// `Transformers` section as clearml stores it (see the module's documentation).
/// (`with_model`: the model-configuration flag too, set when the model has a config).
fn training_args_hyperparams(args: &TrainingArguments, suffix: &str, with_model: bool) -> JsonMap {
    let section = format!("{HPARAMS_SECTION}{suffix}");
    let mut dict = args_to_dict(args);
    let dropped: Vec<String> = dict
        .iter()
        .map(|(k, _)| k.to_string())
        .filter(|k| k.ends_with("_token") || k == "accelerator_config")
        .collect();
    for k in dropped {
        dict.remove(&k);
    }
    let mut flat = Vec::new();
    flatten(&dict, "", &mut flat);
    let mut params = JsonMap::new();
    for (name, v) in flat {
        let item = match (&v, enum_param(&name, v.as_str().unwrap_or_default())) {
            (JsonValue::Str(_), Some((ty, member, members))) => param_item(
                &section,
                &name,
                member,
                Some(ty),
                format!("Values:\n{}", members.join(",\n")),
            ),
            (JsonValue::Array(items), _) if name == "debug" && !items.is_empty() => param_item(
                &section,
                &name,
                stringify(&v),
                Some("list/DebugOption"),
                String::new(),
            ),
            (JsonValue::Null, _) => param_item(&section, &name, String::new(), None, String::new()),
            _ => param_item(
                &section,
                &name,
                stringify(&v),
                Some(&basic_type(&v)),
                String::new(),
            ),
        };
        params.insert(name, item);
    }
    let flags = [
        ("_ignore_hparams_ui_overrides_", "hyperparameters"),
        ("_ignore_model_config_ui_overrides_", "model configuration"),
    ];
    for &(flag, what) in &flags[..if with_model { 2 } else { 1 }] {
        params.insert(
            flag,
            param_item(
                &section,
                flag,
                "True".into(),
                Some("bool"),
                format!(
                    "If True, ignore Transformers {what} overrides done in the UI/backend when running remotely. Otherwise, the overrides will be applied when running remotely"
                ),
            ),
        );
    }
    let mut out = JsonMap::new();
    out.insert(section, JsonValue::Object(params));
    out
}

/// The characters that send clearml's `config_dict_to_text` to its JSON fallback when a key
/// holds one.
const HOCON_SPECIAL: &str = "$}[]:=+#`^?!@*&.";

/// pyhocon's `_number_re` matched at the start of a key (`re.match`, with its lookahead):
/// such a string key is quoted.
fn number_like(key: &str) -> bool {
    let number = regex::Regex::new(r"^[+-]?(\d*\.\d+|\d+(\.\d+)?)([eE][+\-]?\d+)?$")
        .expect("a valid pattern");
    let after = regex::Regex::new(r"^(|[ \t]*([$}\],#\n\r]|//).*)$").expect("a valid pattern");
    (1..=key.len())
        .filter(|&n| key.is_char_boundary(n))
        .any(|n| number.is_match(&key[..n]) && after.is_match(&key[n..]))
}

fn hocon_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        match c {
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// A string after the JSON fallback's round trip (`json.dumps`, then pyhocon's parser, which
/// decodes `\\ \n \r \t \"` and keeps every other escape as its text: `\b`, `\f`,
/// `\u00XX` for the other control characters, `\uXXXX` for each UTF-16 unit of a non-ASCII
/// character).
fn through_json(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        match c {
            '\\' | '\n' | '\r' | '\t' | '"' => out.push(c),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || !c.is_ascii() => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out
}

/// pyhocon's `HOCONConverter._auto_indent`.
fn auto_indent(lines: &str, section: &str) -> String {
    let indent = lines.rfind('\n').map_or(lines.len(), |i| lines.len() - i);
    let section_indent = section.find('\n').unwrap_or(section.len());
    if section_indent < 3 {
        return format!("{lines}{section}");
    }
    let joiner = format!("\n{}", " ".repeat(indent));
    let parts: Vec<&str> = section.split('\n').map(str::trim).collect();
    format!("{lines}{}", parts.join(&joiner))
}

/// A key as the tree holds it: `int_keys` (the main path, where `id2label`'s keys are the
/// integers upstream's dict holds) or a string.
struct Hocon {
    /// The JSON fallback: every key a string (`"0"` quoted), non-finite floats as strings.
    fallback: bool,
}

impl Hocon {
    /// pyhocon's `HOCONConverter.to_hocon(config, compact=False, indent=2, level)`.
    fn write(&self, v: &JsonValue, level: usize, int_keys: bool) -> String {
        match v {
            JsonValue::Object(m) => {
                if m.is_empty() {
                    return "{}".into();
                }
                let mut lines = String::new();
                if level > 0 {
                    lines.push_str("{\n");
                }
                let mut bet = Vec::new();
                for (k, item) in m.iter() {
                    let is_int = int_keys && k.parse::<i64>().is_ok();
                    let key = if !is_int
                        && (number_like(k)
                            || (self.fallback && k.chars().any(|c| HOCON_SPECIAL.contains(c))))
                    {
                        format!("\"{k}\"")
                    } else {
                        k.to_string()
                    };
                    let assign = if matches!(item, JsonValue::Object(_)) {
                        ""
                    } else {
                        " ="
                    };
                    let bet_line = format!("{}{key}{assign} ", " ".repeat(level * 2));
                    let child_int_keys = !self.fallback && level == 0 && k == "id2label";
                    let value_line = self.write(item, level + 1, child_int_keys);
                    if matches!(item, JsonValue::Array(_)) {
                        bet.push(auto_indent(&bet_line, &value_line));
                    } else {
                        bet.push(bet_line + &value_line);
                    }
                }
                lines.push_str(&bet.join("\n"));
                if level > 0 {
                    lines.push_str(&format!("\n{}}}", " ".repeat((level - 1) * 2)));
                }
                lines
            }
            JsonValue::Array(items) => {
                if items.is_empty() {
                    return "[]".into();
                }
                let mut lines = String::from("[");
                let mut base_len = lines.len();
                let mut skip_comma = false;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 && !skip_comma {
                        lines.push_str(", ");
                    }
                    skip_comma = false;
                    let new_line = self.write(item, level + 1, false);
                    lines.push_str(&new_line);
                    if new_line.contains('\n') || lines.chars().count() - base_len > 80 {
                        if i < items.len() - 1 {
                            lines.push_str(&format!(",\n{}", " ".repeat(level * 2)));
                        }
                        base_len = lines.chars().count();
                        skip_comma = true;
                    }
                }
                lines.push(']');
                lines
            }
            JsonValue::Str(s) => {
                let s = if self.fallback {
                    Cow::Owned(through_json(s))
                } else {
                    Cow::Borrowed(s.as_str())
                };
                if s.contains('\n') && s.chars().count() > 1 {
                    format!("\"\"\"{s}\"\"\"")
                } else {
                    format!("\"{}\"", hocon_escape(&s))
                }
            }
            JsonValue::Null => "null".into(),
            JsonValue::Bool(b) => if *b { "true" } else { "false" }.into(),
            JsonValue::Int(i) => i.to_string(),
            JsonValue::Float(f) if self.fallback && !f.is_finite() => {
                let s = if f.is_nan() {
                    "NaN"
                } else if *f > 0.0 {
                    "Infinity"
                } else {
                    "-Infinity"
                };
                format!("\"{s}\"")
            }
            JsonValue::Float(f) => match python_float_repr(*f).as_str() {
                "NaN" => "nan".into(),
                "Infinity" => "inf".into(),
                "-Infinity" => "-inf".into(),
                s => s.to_string(),
            },
        }
    }
}

/// clearml's `config_dict_to_text` of `model.config.to_dict()`: pyhocon's HOCON text, through
/// its JSON fallback when a key holds one of `$}[]:=+#`^?!@*&.` (`id2label`'s keys are the
/// integers upstream's dict holds).
pub fn config_dict_to_text(config: &JsonMap) -> String {
    fn special(v: &JsonValue) -> bool {
        match v {
            JsonValue::Object(m) => m
                .iter()
                .any(|(k, v)| k.chars().any(|c| HOCON_SPECIAL.contains(c)) || special(v)),
            JsonValue::Array(items) => items.iter().any(special),
            _ => false,
        }
    }
    let root = JsonValue::Object(config.clone());
    let fallback = special(&root);
    Hocon { fallback }.write(&root, 0, false)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// An open offline session.
struct Session {
    dir: PathBuf,
    id: String,
    task: JsonMap,
    closed: bool,
}

impl Session {
    fn create(settings: &ClearMLSettings) -> Result<Self> {
        let id = format!("offline-{}", crate::trackio::uuid4_hex());
        let dir = settings.cache_dir.join("offline").join(&id);
        let data = dir.join("data");
        std::fs::create_dir_all(&data).map_err(|e| Error::io("creating", &data, e))?;
        let program = std::env::current_exe().ok();
        let mut script = JsonMap::new();
        script.insert(
            "binary",
            program
                .as_ref()
                .and_then(|p| p.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        );
        script.insert("branch", "");
        script.insert("diff", "");
        script.insert(
            "entry_point",
            program
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
        );
        script.insert("repository", "");
        script.insert("version_num", "");
        script.insert("working_dir", ".");
        let mut execution = JsonMap::new();
        execution.insert("artifacts", JsonValue::Array(Vec::new()));
        execution.insert("docker_cmd", "");
        execution.insert("model", "");
        execution.insert("model_desc", JsonValue::Object(JsonMap::new()));
        execution.insert("model_labels", JsonValue::Object(JsonMap::new()));
        execution.insert("parameters", JsonValue::Object(JsonMap::new()));
        let mut task = JsonMap::new();
        task.insert("execution", JsonValue::Object(execution));
        task.insert("id", id.as_str());
        task.insert("name", settings.task_name.as_str());
        task.insert("offline_folder", dir.display().to_string());
        task.insert("offline_output_models", JsonValue::Array(Vec::new()));
        task.insert("output", JsonValue::Object(JsonMap::new()));
        task.insert("project_name", settings.project.as_str());
        task.insert("script", JsonValue::Object(script));
        task.insert("type", "training");
        let session = Self {
            dir,
            id,
            task,
            closed: false,
        };
        session.save_task()?;
        log::info!(
            "ClearML running in offline mode, session stored in {}",
            session.dir.display()
        );
        Ok(session)
    }

    /// `task.json`, as clearml writes it at each edit (`sort_keys=True`).
    fn save_task(&self) -> Result<()> {
        let path = self.dir.join("task.json");
        let text = dumps(&JsonValue::Object(self.task.clone()), None, true);
        std::fs::write(&path, text).map_err(|e| Error::io("writing", &path, e))
    }

    fn section(&mut self, key: &str) -> &mut JsonMap {
        if !matches!(self.task.get(key), Some(JsonValue::Object(_))) {
            self.task.insert(key, JsonValue::Object(JsonMap::new()));
        }
        match self.task.get_mut(key) {
            Some(JsonValue::Object(m)) => m,
            _ => unreachable!("inserted above"),
        }
    }

    /// One line of `metrics.jsonl`: the events reported by one `on_log`.
    fn report(&self, scalars: &[(String, String, i64, f64)]) -> Result<()> {
        if scalars.is_empty() {
            return Ok(());
        }
        let timestamp = now_ms();
        let events: Vec<JsonValue> = scalars
            .iter()
            .map(|(metric, variant, iter, value)| {
                let mut e = JsonMap::new();
                e.insert("timestamp", timestamp);
                e.insert("type", "training_stats_scalar");
                e.insert("task", self.id.as_str());
                e.insert("iter", *iter);
                e.insert("metric", metric.as_str());
                e.insert("variant", variant.as_str());
                e.insert("value", *value);
                e.insert("method", "get");
                JsonValue::Object(e)
            })
            .collect();
        let path = self.dir.join("metrics.jsonl");
        let line = dumps(&JsonValue::Array(events), None, false) + "\n";
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .map_err(|e| Error::io("writing", &path, e))
    }

    /// `Task.close()` offline: `task.json` saved, the folder zipped beside it
    /// (`offline-<id>.zip`, deflated, the session's files at its root).
    fn close(&mut self) -> Result<PathBuf> {
        self.save_task()?;
        let zip_path = self.dir.with_extension("zip");
        let tmp = self.dir.with_extension("zip.tmp");
        let write = || -> std::io::Result<()> {
            let mut zip = zip::ZipWriter::new(std::fs::File::create(&tmp)?);
            let options = zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Deflated);
            for name in ["metrics.jsonl", "task.json"] {
                let path = self.dir.join(name);
                if path.is_file() {
                    zip.start_file(name, options)?;
                    zip.write_all(&std::fs::read(&path)?)?;
                }
            }
            zip.finish()?.sync_all()
        };
        write()
            .and_then(|()| std::fs::rename(&tmp, &zip_path))
            .map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                Error::io("writing", &zip_path, e)
            })?;
        self.closed = true;
        println!(
            "ClearML Task: Offline session stored in {}",
            zip_path.display()
        );
        Ok(zip_path)
    }
}

/// Upstream `ClearMLCallback`: sends the logs to ClearML, here as ClearML's offline session
/// (see the module's documentation).
pub struct ClearMLCallback {
    settings: ClearMLSettings,
    model_config: Option<ModelConfig>,
    session: Option<Session>,
    initialized: bool,
    /// Upstream's `_train_run_counter` and `_model_connect_counter` (class attributes there,
    /// counting the runs of the process; here this callback's, the same for one Trainer per
    /// process).
    train_runs: usize,
    model_connects: usize,
    suffix: String,
}

impl std::fmt::Debug for ClearMLCallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClearMLCallback")
            .field("settings", &self.settings)
            .field("initialized", &self.initialized)
            .field("session_dir", &self.session_dir())
            .finish()
    }
}

impl ClearMLCallback {
    /// Settings from the environment ([`ClearMLSettings::from_env`]); refusals are errors.
    pub fn new() -> Result<Self> {
        Ok(Self::with_settings(ClearMLSettings::from_env()?))
    }

    /// With the given settings.
    pub fn with_settings(settings: ClearMLSettings) -> Self {
        Self {
            settings,
            model_config: None,
            session: None,
            initialized: false,
            train_runs: 0,
            model_connects: 0,
            suffix: String::new(),
        }
    }

    /// The session folder, once the task has started.
    pub fn session_dir(&self) -> Option<&Path> {
        self.session.as_ref().map(|s| s.dir.as_path())
    }

    /// Upstream `setup`: on the first process, the task created (`Task.init`), the training
    /// arguments as hyperparameters and the model's config as a configuration object.
    pub fn setup(&mut self, args: &TrainingArguments, state: &TrainerState) -> Result<()> {
        self.train_runs += 1;
        self.model_connects += 1;
        self.suffix = if self.train_runs == 1 {
            String::new()
        } else {
            format!("_{}", self.train_runs)
        };
        if !state.is_world_process_zero {
            return Ok(());
        }
        if self.settings.log_model && args.save_strategy != SaveStrategy::No {
            return Err(refuse(
                "CLEARML_LOG_MODEL (TRUE unless set otherwise)",
                "upstream logs each checkpoint as a ClearML output model, which clearml 2.1 cannot store in offline mode (OutputModel.update_weights_package fails with \"'DummyModel' object has no attribute 'locked'\", ending upstream's run at its first save): set CLEARML_LOG_MODEL=FALSE (the checkpoints stay in output_dir), or save_strategy=\"no\"",
            ));
        }
        if self.session.as_ref().is_none_or(|s| s.closed) {
            log::info!("Automatic ClearML logging enabled.");
            self.session = Some(Session::create(&self.settings)?);
            log::info!("ClearML Task has been initialized.");
        }
        self.initialized = true;
        let suffix = self.suffix.clone();
        let description = {
            let mut d = format!("The configuration of model number {}.", self.model_connects);
            if self.model_connects != self.train_runs {
                d.push_str(" Note that, when cloning this task and running it remotely, the configuration might be applied to another model instead of this one. To avoid this, initialize the task externally by calling `Task.init` before the `ClearMLCallback` is instantiated.");
            }
            d
        };
        let model = self.model_config.clone();
        let session = self.session.as_mut().expect("created above");
        let hyperparams = training_args_hyperparams(args, &suffix, model.is_some());
        let sections = session.section("hyperparams");
        for (k, v) in hyperparams.iter() {
            sections.insert(k, v.clone());
        }
        if let Some(config) = model {
            let name = format!("{MODEL_CONFIG_SECTION}{suffix}");
            let mut item = JsonMap::new();
            item.insert("description", description);
            item.insert("name", name.as_str());
            item.insert("value", config_dict_to_text(&config.dict));
            session
                .section("configuration")
                .insert(name, JsonValue::Object(item));
        }
        session.save_task()
    }
}

impl Drop for ClearMLCallback {
    fn drop(&mut self) {
        if let Some(session) = self.session.as_mut().filter(|s| !s.closed)
            && let Err(e) = session.close()
        {
            log::error!("ClearML: the offline session could not be zipped: {e}");
        }
    }
}

/// The scalars upstream's `on_log` reports for `logs` at `step` (with clearml's conversions),
/// and the keys it drops.
fn scalars_of(logs: &JsonMap, step: i64, suffix: &str) -> Vec<(String, String, i64, f64)> {
    let mut out = Vec::new();
    for (k, v) in logs.iter() {
        let value = match v {
            JsonValue::Int(i) => *i as f64,
            JsonValue::Float(f) => *f,
            JsonValue::Bool(b) => f64::from(u8::from(*b)),
            other => {
                log::warn!(
                    "Trainer is attempting to log a value of \"{}\" of type {} for key \"{k}\" as a scalar. This invocation of ClearML logger's  report_scalar() is incorrect so we dropped this attribute.",
                    crate::printer::python_str(other),
                    crate::printer::python_type(other),
                );
                continue;
            }
        };
        let value = if value.is_finite() {
            value
        } else {
            log::info!(
                "{} value encountered. Reporting it as '0.0'.",
                if value.is_nan() { "NaN" } else { "inf" }
            );
            0.0
        };
        let (metric, variant, iter) = if SINGLE_VALUE_SCALARS.contains(&k) {
            (
                "Summary".to_string(),
                format!("{k}{suffix}"),
                SINGLE_VALUE_ITERATION,
            )
        } else if let Some(rest) = k.strip_prefix("eval_") {
            (format!("eval{suffix}"), rest.to_string(), step)
        } else if let Some(rest) = k.strip_prefix("test_") {
            (format!("test{suffix}"), rest.to_string(), step)
        } else {
            (format!("train{suffix}"), k.to_string(), step)
        };
        out.push((metric, variant, iter, value));
    }
    out
}

impl TrainerCallback for ClearMLCallback {
    fn name(&self) -> &str {
        "ClearMLCallback"
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
            self.setup(args, state)?;
        }
        Ok(())
    }

    fn on_train_end(
        &mut self,
        _args: &TrainingArguments,
        _state: &TrainerState,
        _control: &mut TrainerControl,
    ) -> Result<()> {
        if let Some(session) = self.session.as_mut().filter(|s| !s.closed) {
            session.close()?;
            self.train_runs = 0;
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
            self.setup(args, state)?;
        }
        match self
            .session
            .as_ref()
            .filter(|_| state.is_world_process_zero)
        {
            Some(session) if !session.closed => {
                session.report(&scalars_of(logs, state.global_step, &self.suffix))
            }
            _ => Ok(()),
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
    fn online_mode_agents_config_files_and_unknown_variables_are_refused_by_name() {
        let cwd =
            std::env::temp_dir().join(format!("tchtrain-clearml-settings-{}", std::process::id()));
        std::fs::create_dir_all(&cwd).unwrap();
        let err = |pairs: &[(&str, &str)]| {
            ClearMLSettings::from_vars(&cwd, Some(&cwd), vars(pairs))
                .unwrap_err()
                .to_string()
        };
        assert!(err(&[]).contains("CLEARML_OFFLINE_MODE=<unset>"));
        assert!(err(&[("CLEARML_OFFLINE_MODE", "off")]).contains("import_offline_session"));
        assert!(
            err(&[("CLEARML_OFFLINE_MODE", "1"), ("CLEARML_TASK_ID", "abc")])
                .contains("ClearML agent")
        );
        assert!(
            err(&[
                ("CLEARML_OFFLINE_MODE", "1"),
                ("CLEARML_LOG_LEVEL", "DEBUG")
            ])
            .contains("CLEARML_LOG_LEVEL")
        );
        let ok = ClearMLSettings::from_vars(
            &cwd,
            Some(Path::new("/home/u")),
            vars(&[
                ("TRAINS_OFFLINE_MODE", "yes"),
                ("CLEARML_API_HOST", "https://api.clear.ml"),
                ("CLEARML_LOG_MODEL", "false"),
                ("CLEARML_CACHE_DIR", "~/c/$WHERE"),
                ("WHERE", "here"),
            ]),
        )
        .unwrap();
        assert_eq!(ok.project, "HuggingFace Transformers");
        assert_eq!(ok.task_name, "Trainer");
        assert!(!ok.log_model);
        assert_eq!(ok.cache_dir, PathBuf::from("/home/u/c/here"));
        let default =
            ClearMLSettings::from_vars(&cwd, Some(&cwd), vars(&[("CLEARML_OFFLINE_MODE", "1")]))
                .unwrap();
        assert!(default.log_model, "upstream's default is TRUE");
        assert_eq!(default.cache_dir, cwd.join(".clearml/cache"));
        std::fs::write(cwd.join("clearml.conf"), "sdk { development { } }\n").unwrap();
        assert!(err(&[("CLEARML_OFFLINE_MODE", "1")]).contains("clearml.conf"));
        std::fs::write(cwd.join("clearml.conf"), "api { web_server: x }\n").unwrap();
        assert!(
            ClearMLSettings::from_vars(&cwd, Some(&cwd), vars(&[("CLEARML_OFFLINE_MODE", "1")]))
                .is_ok()
        );
        let _ = std::fs::remove_dir_all(&cwd);
    }

    #[test]
    fn number_like_keys_follow_pyhocons_pattern() {
        for (key, quoted) in [
            ("0", true),
            ("1.5", true),
            ("-2e3", true),
            ("1,", true),
            ("12abc", false),
            ("1 x", false),
            ("abc", false),
            ("1 //", true),
        ] {
            assert_eq!(number_like(key), quoted, "{key:?}");
        }
    }
}

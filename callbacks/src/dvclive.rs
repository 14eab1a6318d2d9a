//! `DVCLiveCallback` (upstream integrations/integration_utils.py) writing what `dvclive.Live()`
//! writes (dvclive 3.49) outside a DVC repository: under the working directory,
//! `dvclive/params.yaml` (`args.to_dict()`, `log_params`), `dvclive/plots/metrics/<name>.tsv`
//! (one row per `log_metric`: `step` and the value), `dvclive/metrics.json` (the summary:
//! each metric's last value nested by its `/`-separated name, and `step`) and `dvc.yaml`
//! (where DVC finds the params, metrics and plots), the files `dvc metrics show`, `dvc plots
//! show` and DVC Studio read.
//!
//! Each `on_log`: every number or string logged under dvclive's standardised name
//! (`standardize_metric_name(key, "dvclive.huggingface")`: `eval_loss` -> `eval/loss`),
//! anything else dropped with upstream's warning, then `next_step()` (the summary and
//! `dvc.yaml` written, the step advanced). `on_train_end`: `end()`. Only the first process
//! writes.
//!
//! Refused with the reason: `HF_DVCLIVE_LOG_MODEL` true / `all` (model artifacts), a working
//! directory inside a DVC repository (dvclive saves a DVC experiment there), `DVC_ROOT` /
//! `DVC_EXP_BASELINE_REV` (running under `dvc repro` / `dvc exp run`), a DVC Studio token
//! (`DVC_STUDIO_TOKEN`, `STUDIO_TOKEN`: live metrics posted to Studio), `DVCLIVE_RESUME`, and
//! a `dvc.yaml` holding entries besides dvclive's own (dvclive merges into it through DVC's
//! YAML editor).

use std::path::{Path, PathBuf};

use tchtrain_training_args::{JsonMap, JsonValue, TrainingArguments, dumps, python_float_repr};

use crate::args_dict::args_to_dict;
use crate::error::{Error, Result};
use crate::trainer_callback::TrainerCallback;
use crate::trainer_control::TrainerControl;
use crate::trainer_state::TrainerState;

/// dvclive's `env2bool`: set, and matching `1|y|yes|true` anywhere, case-insensitively.
fn env2bool(value: &str) -> bool {
    let v = value.to_lowercase();
    v.contains('1') || v.contains('y') || v.contains("true")
}

fn refuse(setting: String, reason: &str) -> Error {
    Error::DvcliveSetting {
        setting,
        reason: reason.to_string(),
    }
}

/// Where `DVCLiveCallback` writes, and the environment it was checked against.
#[derive(Debug, Clone, PartialEq)]
pub struct DVCLiveSettings {
    /// The folder `dvclive/` and `dvc.yaml` go into (upstream: the working directory).
    pub base: PathBuf,
}

impl DVCLiveSettings {
    /// Writing under `base`.
    pub fn in_dir(base: impl Into<PathBuf>) -> Self {
        Self { base: base.into() }
    }

    /// The working directory, with the environment checked (see the module's
    /// documentation).
    pub fn from_env() -> Result<Self> {
        let base = std::env::current_dir().map_err(|e| Error::io("reading", ".", e))?;
        Self::from_lookup(base, |name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) with `base` and an environment given as a function.
    pub fn from_lookup(
        base: impl Into<PathBuf>,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self> {
        if let Some(v) = lookup("HF_DVCLIVE_LOG_MODEL") {
            let upper = v.to_uppercase();
            if matches!(upper.as_str(), "1" | "ON" | "YES" | "TRUE") || v.to_lowercase() == "all" {
                return Err(refuse(
                    format!("HF_DVCLIVE_LOG_MODEL={v:?}"),
                    "logging the model or output_dir as DVC artifacts (`Live.log_artifact`) is not implemented here; unset it (the checkpoints are in output_dir)",
                ));
            }
        }
        for name in ["DVC_ROOT", "DVC_EXP_BASELINE_REV"] {
            if let Some(v) = lookup(name) {
                return Err(refuse(
                    format!("{name}={v:?}"),
                    "running inside `dvc repro` / `dvc exp run` (dvclive then records the run in the DVC pipeline) is not implemented here; run the training directly",
                ));
            }
        }
        for name in ["DVC_STUDIO_TOKEN", "STUDIO_TOKEN"] {
            if let Some(v) = lookup(name).filter(|v| !v.is_empty()) {
                let _ = v;
                return Err(refuse(
                    format!("{name} (set)"),
                    "posting live metrics to DVC Studio is not implemented here; unset it, and push the dvclive folder with DVC afterwards",
                ));
            }
        }
        if let Some(v) = lookup("DVCLIVE_RESUME").filter(|v| env2bool(v)) {
            return Err(refuse(
                format!("DVCLIVE_RESUME={v:?}"),
                "resuming a DVCLive run (appending to its files) is not implemented here; unset it (the run's files are written anew)",
            ));
        }
        let base = base.into();
        let absolute = std::path::absolute(&base).unwrap_or_else(|_| base.clone());
        if let Some(repo) = absolute.ancestors().find(|d| d.join(".dvc").is_dir()) {
            return Err(refuse(
                format!(
                    "{} is inside the DVC repository {}",
                    base.display(),
                    repo.display()
                ),
                "dvclive saves a DVC experiment there at the end of training, which is not implemented here; run from a directory outside it",
            ));
        }
        Ok(Self { base })
    }
}

/// dvclive's `standardize_metric_name(name, "dvclive.huggingface")`.
pub fn standardize_metric_name(name: &str) -> String {
    name.replace("train_", "train/").replace("eval_", "eval/")
}

/// ruamel.yaml's round-trip dump (`default_flow_style = False`, YAML 1.2, block sequences
/// at their key's indentation) of a mapping, as dvclive's `dump_yaml` writes `params.yaml`
/// and `dvc.yaml`.
pub fn dump_yaml(map: &JsonMap) -> String {
    let mut out = String::new();
    yaml_map(&mut out, map, 0, false);
    out
}

fn yaml_map(out: &mut String, map: &JsonMap, indent: usize, first_inline: bool) {
    for (i, (k, v)) in map.iter().enumerate() {
        if !(first_inline && i == 0) {
            out.push_str(&" ".repeat(indent));
        }
        out.push_str(&yaml_string(k));
        out.push(':');
        yaml_value_after_key(out, v, indent);
    }
}

fn yaml_value_after_key(out: &mut String, v: &JsonValue, indent: usize) {
    match v {
        JsonValue::Object(m) if !m.is_empty() => {
            out.push('\n');
            yaml_map(out, m, indent + 2, false);
        }
        JsonValue::Array(a) if !a.is_empty() => {
            out.push('\n');
            yaml_seq(out, a, indent);
        }
        JsonValue::Null => out.push('\n'),
        other => {
            out.push(' ');
            out.push_str(&yaml_scalar(other));
            out.push('\n');
        }
    }
}

fn yaml_seq(out: &mut String, items: &[JsonValue], indent: usize) {
    for item in items {
        out.push_str(&" ".repeat(indent));
        out.push('-');
        match item {
            JsonValue::Object(m) if !m.is_empty() => {
                out.push(' ');
                yaml_map(out, m, indent + 2, true);
            }
            JsonValue::Array(a) if !a.is_empty() => {
                out.push('\n');
                yaml_seq(out, a, indent + 2);
            }
            JsonValue::Null => out.push('\n'),
            other => {
                out.push(' ');
                out.push_str(&yaml_scalar(other));
                out.push('\n');
            }
        }
    }
}

fn yaml_scalar(v: &JsonValue) -> String {
    match v {
        JsonValue::Null => String::new(),
        JsonValue::Bool(b) => b.to_string(),
        JsonValue::Int(i) => i.to_string(),
        JsonValue::Float(x) if x.is_nan() => ".nan".into(),
        JsonValue::Float(x) if x.is_infinite() => if *x > 0.0 { ".inf" } else { "-.inf" }.into(),
        JsonValue::Float(x) => python_float_repr(*x).to_lowercase(),
        JsonValue::Str(s) => yaml_string(s),
        JsonValue::Object(_) => "{}".into(),
        JsonValue::Array(_) => "[]".into(),
    }
}

/// Whether YAML 1.2 (ruamel's resolver) reads `s` as something other than a string.
fn resolves_to_non_string(s: &str) -> bool {
    const WORDS: [&str; 13] = [
        "true", "True", "TRUE", "false", "False", "FALSE", "~", "null", "Null", "NULL", "=", "<<",
        "",
    ];
    if WORDS.contains(&s) {
        return true;
    }
    let unsigned = s.strip_prefix(['-', '+']).unwrap_or(s);
    let digits = |t: &str, ok: fn(char) -> bool| !t.is_empty() && t.chars().all(ok);
    if digits(unsigned, |c| c.is_ascii_digit() || c == '_')
        || unsigned
            .strip_prefix("0o")
            .is_some_and(|t| digits(t, |c| ('0'..='7').contains(&c) || c == '_'))
        || unsigned
            .strip_prefix("0x")
            .is_some_and(|t| digits(t, |c| c.is_ascii_hexdigit() || c == '_'))
        || unsigned
            .strip_prefix("0b")
            .is_some_and(|t| digits(t, |c| c == '0' || c == '1' || c == '_'))
    {
        return true;
    }
    if matches!(unsigned, ".inf" | ".Inf" | ".INF") || matches!(s, ".nan" | ".NaN" | ".NAN") {
        return true;
    }
    // [-+]?(\.[0-9_]+|[0-9_]+(\.[0-9_]*)?)([eE][-+]?[0-9]+)?
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(i) => (&unsigned[..i], Some(&unsigned[i + 1..])),
        None => (unsigned, None),
    };
    let number = |t: &str| t.chars().all(|c| c.is_ascii_digit() || c == '_');
    let mantissa_ok = match mantissa.split_once('.') {
        Some((a, b)) => (a.is_empty() && !b.is_empty() || !a.is_empty()) && number(a) && number(b),
        None => !mantissa.is_empty() && number(mantissa),
    };
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['-', '+']).unwrap_or(e);
        !e.is_empty() && e.chars().all(|c| c.is_ascii_digit())
    });
    if mantissa_ok && exponent_ok && mantissa.chars().any(|c| c.is_ascii_digit()) {
        return true;
    }
    // Timestamps: YYYY-MM-DD...
    let b = s.as_bytes();
    b.len() >= 8 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-' && b[5].is_ascii_digit()
}

/// A string as ruamel writes it: plain when it reads back as the same string, else
/// single-quoted (double-quoted with escapes when it holds a line break or a control
/// character).
fn yaml_string(s: &str) -> String {
    if s.chars().any(|c| c.is_control()) {
        return dumps(&JsonValue::Str(s.to_string()), None, false);
    }
    let first = s.chars().next();
    let second = s.chars().nth(1);
    let indicator = match first {
        Some(
            '#' | ',' | '[' | ']' | '{' | '}' | '&' | '*' | '!' | '|' | '>' | '\'' | '"' | '%'
            | '@' | '`',
        ) => true,
        Some('-' | '?' | ':') => second.is_none_or(char::is_whitespace),
        _ => false,
    };
    let plain = !resolves_to_non_string(s)
        && !indicator
        && !s.starts_with(' ')
        && !s.ends_with(' ')
        && !s.ends_with(':')
        && !s.contains(": ")
        && !s.contains(" #");
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "''"))
    }
}

/// A value's cell in a metric's TSV file (Python's `str`, through the `csv` module: quoted
/// when it holds a tab, a quote or a line break).
fn tsv_cell(v: &JsonValue) -> String {
    let text = match v {
        JsonValue::Float(x) => python_float_repr(*x),
        JsonValue::Int(i) => i.to_string(),
        JsonValue::Bool(b) => if *b { "True" } else { "False" }.to_string(),
        JsonValue::Str(s) => s.clone(),
        other => dumps(other, None, false),
    };
    if text.contains(['\t', '"', '\r', '\n']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text
    }
}

/// An open `Live()`.
struct Live {
    base: PathBuf,
    /// `Live._step`: `None` until the first `next_step`.
    step: Option<i64>,
    /// The metrics logged so far (their TSV files exist).
    metrics: Vec<String>,
    summary: JsonMap,
    params: JsonMap,
}

impl Live {
    fn dir(&self) -> PathBuf {
        self.base.join("dvclive")
    }

    fn write(path: &Path, text: &str) -> Result<()> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| Error::io("creating", parent, e))?;
        }
        std::fs::write(path, text).map_err(|e| Error::io("writing", path, e))
    }

    /// `Live()`: the checks, then the previous run's files removed (`_init_cleanup`).
    fn open(base: &Path) -> Result<Self> {
        let live = Self {
            base: base.to_path_buf(),
            step: None,
            metrics: Vec::new(),
            summary: JsonMap::new(),
            params: JsonMap::new(),
        };
        let dvc_yaml = base.join("dvc.yaml");
        if let Ok(text) = std::fs::read_to_string(&dvc_yaml)
            && !live.own_dvc_yaml_texts().contains(&text)
        {
            return Err(refuse(
                dvc_yaml.display().to_string(),
                "it holds entries besides dvclive's own (stages, other plots); dvclive merges its entries into it through DVC's YAML editor, which is not implemented here: move it away or train from another directory",
            ));
        }
        let dir = live.dir();
        for sub in ["custom", "images", "metrics", "sklearn"] {
            let d = dir.join("plots").join(sub);
            if d.exists() {
                std::fs::remove_dir_all(&d).map_err(|e| Error::io("removing", &d, e))?;
            }
        }
        let mut stale: Vec<PathBuf> = ["metrics.json", "params.yaml", "report.html", "report.md"]
            .iter()
            .map(|f| dir.join(f))
            .collect();
        if let Ok(entries) = std::fs::read_dir(&dir) {
            stale.extend(
                entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.is_file() && p.to_string_lossy().ends_with("dvc.yaml")),
            );
        }
        for f in stale.iter().filter(|f| f.exists()) {
            std::fs::remove_file(f).map_err(|e| Error::io("removing", f, e))?;
        }
        Ok(live)
    }

    /// The `dvc.yaml` texts this writer makes (params; and metrics; and plots), which a new
    /// run may overwrite.
    fn own_dvc_yaml_texts(&self) -> Vec<String> {
        (1..=3).map(|n| dump_yaml(&Self::dvc_yaml(n))).collect()
    }

    /// dvclive's `make_dvcyaml` with its first `sections` sections.
    fn dvc_yaml(sections: usize) -> JsonMap {
        let mut m = JsonMap::new();
        let list = |s: &str| JsonValue::Array(vec![JsonValue::Str(s.into())]);
        m.insert("params", list("dvclive/params.yaml"));
        if sections >= 2 {
            m.insert("metrics", list("dvclive/metrics.json"));
        }
        if sections >= 3 {
            let mut x = JsonMap::new();
            x.insert("x", JsonValue::Str("step".into()));
            let mut plot = JsonMap::new();
            plot.insert("dvclive/plots/metrics", JsonValue::Object(x));
            m.insert("plots", JsonValue::Array(vec![JsonValue::Object(plot)]));
        }
        m
    }

    fn log_params(&mut self, params: JsonMap) -> Result<()> {
        for (k, v) in params.iter() {
            self.params.insert(k, v.clone());
        }
        Self::write(&self.dir().join("params.yaml"), &dump_yaml(&self.params))
    }

    fn log_metric(&mut self, name: &str, value: &JsonValue) -> Result<()> {
        let value = match value {
            // `str(val)`: Python's `nan`, `inf`, `-inf`.
            JsonValue::Float(x) if x.is_nan() => JsonValue::Str("nan".into()),
            JsonValue::Float(x) if x.is_infinite() => {
                JsonValue::Str(if *x > 0.0 { "inf" } else { "-inf" }.into())
            }
            v => v.clone(),
        };
        let step = self.step.unwrap_or(0);
        let path = self.dir().join("plots/metrics").join(format!("{name}.tsv"));
        let basename = name.rsplit('/').next().unwrap_or(name);
        let mut text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.is_empty() {
            text = format!("step\t{basename}\n");
        }
        text.push_str(&format!("{step}\t{}\n", tsv_cell(&value)));
        Self::write(&path, &text)?;
        if !self.metrics.iter().any(|m| m == name) {
            self.metrics.push(name.to_string());
        }
        // funcy's `set_in` over the name's parts.
        let parts: Vec<&str> = name.split('/').filter(|p| !p.is_empty()).collect();
        let mut node = &mut self.summary;
        for part in &parts[..parts.len().saturating_sub(1)] {
            if !matches!(node.get(part), Some(JsonValue::Object(_))) {
                node.insert(*part, JsonValue::Object(JsonMap::new()));
            }
            node = match node.get_mut(part) {
                Some(JsonValue::Object(m)) => m,
                _ => unreachable!("inserted above"),
            };
        }
        node.insert(parts.last().copied().unwrap_or(name), value);
        Ok(())
    }

    /// `sync()`: the summary (with `step` once stepped) and `dvc.yaml`.
    fn sync(&mut self) -> Result<()> {
        if let Some(step) = self.step {
            self.summary.insert("step", JsonValue::Int(step));
        }
        let json = dumps(&JsonValue::Object(self.summary.clone()), Some(4), false) + "\n";
        Self::write(&self.dir().join("metrics.json"), &json)?;
        let sections = if self.dir().join("plots/metrics").exists() {
            3
        } else if !self.metrics.is_empty() || !self.summary.is_empty() {
            2
        } else {
            1
        };
        Self::write(
            &self.base.join("dvc.yaml"),
            &dump_yaml(&Self::dvc_yaml(sections)),
        )
    }

    fn next_step(&mut self) -> Result<()> {
        self.step.get_or_insert(0);
        self.sync()?;
        self.step = self.step.map(|s| s + 1);
        Ok(())
    }

    fn end(&mut self) -> Result<()> {
        if let Some(JsonValue::Int(s)) = self.summary.get("step") {
            self.step = Some(*s);
        }
        self.sync()
    }
}

/// Upstream `DVCLiveCallback` (see the module's documentation).
pub struct DVCLiveCallback {
    settings: DVCLiveSettings,
    live: Option<Live>,
    initialized: bool,
}

impl std::fmt::Debug for DVCLiveCallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DVCLiveCallback")
            .field("settings", &self.settings)
            .field("initialized", &self.initialized)
            .finish()
    }
}

impl DVCLiveCallback {
    /// The callback writing under the working directory ([`DVCLiveSettings::from_env`]).
    pub fn new() -> Result<Self> {
        Ok(Self::with_settings(DVCLiveSettings::from_env()?))
    }

    /// The callback with explicit settings.
    pub fn with_settings(settings: DVCLiveSettings) -> Self {
        Self {
            settings,
            live: None,
            initialized: false,
        }
    }

    /// Upstream `setup`: `Live()` and `log_params(args.to_dict())` on the first process.
    pub fn setup(&mut self, args: &TrainingArguments, state: &TrainerState) -> Result<()> {
        self.initialized = true;
        if state.is_world_process_zero {
            let mut live = Live::open(&self.settings.base)?;
            live.log_params(args_to_dict(args))?;
            self.live = Some(live);
        }
        Ok(())
    }
}

impl TrainerCallback for DVCLiveCallback {
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
        let Some(live) = self.live.as_mut() else {
            return Ok(());
        };
        for (key, value) in logs.iter() {
            match value {
                JsonValue::Float(_)
                | JsonValue::Int(_)
                | JsonValue::Bool(_)
                | JsonValue::Str(_) => live.log_metric(&standardize_metric_name(key), value)?,
                other => log::warn!(
                    "Trainer is attempting to log a value of \"{}\" of type {} for key \"{key}\" as a scalar. This invocation of DVCLive's Live.log_metric() is incorrect so we dropped this attribute.",
                    dumps(other, None, false),
                    other.type_name()
                ),
            }
        }
        live.next_step()
    }

    fn on_train_end(
        &mut self,
        _: &TrainingArguments,
        _: &TrainerState,
        _: &mut TrainerControl,
    ) -> Result<()> {
        match self.live.as_mut() {
            Some(live) if self.initialized => live.end(),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_quoted_where_yaml_would_read_another_type() {
        for plain in [
            "out",
            "adamw_torch_fused",
            "linear",
            "no",
            "a-b",
            "/tmp/x",
            "-x",
            "1e",
            "e5",
        ] {
            assert_eq!(yaml_string(plain), plain);
        }
        for (s, quoted) in [
            ("", "''"),
            ("true", "'true'"),
            ("null", "'null'"),
            ("12", "'12'"),
            ("1e-3", "'1e-3'"),
            ("1.5", "'1.5'"),
            (".5", "'.5'"),
            ("0x1F", "'0x1F'"),
            ("2026-12-01", "'2026-12-01'"),
            ("a: b", "'a: b'"),
            ("- x", "'- x'"),
            ("it's", "it's"),
            ("'q", "'''q'"),
            ("#x", "'#x'"),
        ] {
            assert_eq!(yaml_string(s), quoted, "{s:?}");
        }
    }

    #[test]
    fn names_and_cells_as_dvclive_writes_them() {
        assert_eq!(standardize_metric_name("eval_loss"), "eval/loss");
        assert_eq!(
            standardize_metric_name("train_samples_per_second"),
            "train/samples_per_second"
        );
        assert_eq!(standardize_metric_name("loss"), "loss");
        assert_eq!(
            tsv_cell(&JsonValue::Float(3.7500000000000003e-05)),
            "3.7500000000000003e-05"
        );
        assert_eq!(tsv_cell(&JsonValue::Float(1.0)), "1.0");
        assert_eq!(tsv_cell(&JsonValue::Str("a\tb".into())), "\"a\tb\"");
    }
}

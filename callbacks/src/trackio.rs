//! `TrackioCallback` (upstream integrations/integration_utils.py, `report_to="trackio"`) with
//! trackio's local store, as trackio 0.43 writes it: the project's SQLite database
//! `<TRACKIO_DIR>/<project>.db` (`TRACKIO_DIR`, else `$HF_HOME/trackio`; the project name
//! kept to `[A-Za-z0-9_-]`), with trackio's own schema (`trackio_schema.sql`, `user_version`
//! 2), in WAL mode. `trackio show` and trackio's API read it as one of their own.
//!
//! What upstream's callback logs goes where trackio puts it:
//! - `trackio.init(project=args.project, name=args.run_name, resume="allow")`: a run named
//!   `run_name`, or trackio's readable name (`dainty-sunset-0`, the first one unused in the
//!   project); a run of that name already in the project is resumed (its id, its steps
//!   continued);
//! - the config (`{**model.config.to_dict(), **args.to_dict()}`, updated with
//!   `allow_val_change=True`, which trackio's plain-dict config keeps as a key, then
//!   `model/num_parameters`, after trackio's `_Username` / `_Created` / `_Group`) in the
//!   `configs` table with the run's first row;
//! - each `on_log` (`rewrite_logs`: `train/` / `eval/` / `test/`, the single-value scalars
//!   left out, `train/global_step` added) and `on_predict` as a `metrics` row: trackio's step
//!   (0, 1, ... per run), the UTC time in ISO form, the metrics as JSON (`NaN` / `Infinity`
//!   as strings, as `serialize_values`), a log id. Only the first process writes.
//!
//! Refused with the reason: `trackio_space_id` / `trackio_bucket_id` (a Gradio Space or a
//! Bucket on the Hub: logging over the network is not implemented), and `push_to_hub` unless
//! `trackio_static_space_id` is `False` (upstream's `on_push_begin` syncs the project to a
//! static Space). Not written: `_Username` (trackio asks the Hub who the token's user is;
//! here it stays `null`) and trackio's automatic CPU / GPU metrics (its `psutil` /
//! `nvidia-ml-py` monitors, the `system_metrics` table).

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, params};
use tchtrain_training_args::{JsonMap, JsonValue, StrOrBool, TrainingArguments, dumps};

use crate::args_dict::args_to_dict;
use crate::error::{Error, Result};
use crate::model_config::ModelConfig;
use crate::tensorboard::{rewrite_logs, step_row};
use crate::trainer_callback::TrainerCallback;
use crate::trainer_control::TrainerControl;
use crate::trainer_state::TrainerState;

/// trackio's project schema (`SCHEMA_VERSION` 2).
const SCHEMA: &str = include_str!("trackio_schema.sql");
/// trackio's `SCHEMA_VERSION`, kept in `PRAGMA user_version`.
pub const TRACKIO_SCHEMA_VERSION: i64 = 2;

// trackio's `generate_readable_name` word lists (utils.py).
const ADJECTIVES: [&str; 91] = [
    "dainty",
    "brave",
    "calm",
    "eager",
    "fancy",
    "gentle",
    "happy",
    "jolly",
    "kind",
    "lively",
    "merry",
    "nice",
    "proud",
    "quick",
    "hugging",
    "silly",
    "tidy",
    "witty",
    "zealous",
    "bright",
    "shy",
    "bold",
    "clever",
    "daring",
    "elegant",
    "faithful",
    "graceful",
    "honest",
    "inventive",
    "jovial",
    "keen",
    "lucky",
    "modest",
    "noble",
    "optimistic",
    "patient",
    "quirky",
    "resourceful",
    "sincere",
    "thoughtful",
    "upbeat",
    "valiant",
    "warm",
    "youthful",
    "zesty",
    "adventurous",
    "breezy",
    "cheerful",
    "delightful",
    "energetic",
    "fearless",
    "glad",
    "hopeful",
    "imaginative",
    "joyful",
    "kindly",
    "luminous",
    "mysterious",
    "neat",
    "outgoing",
    "playful",
    "radiant",
    "spirited",
    "tranquil",
    "unique",
    "vivid",
    "wise",
    "zany",
    "artful",
    "bubbly",
    "charming",
    "dazzling",
    "earnest",
    "festive",
    "gentlemanly",
    "hearty",
    "intrepid",
    "jubilant",
    "knightly",
    "lively",
    "magnetic",
    "nimble",
    "orderly",
    "peaceful",
    "quick-witted",
    "robust",
    "sturdy",
    "trusty",
    "upstanding",
    "vibrant",
    "whimsical",
];
const NOUNS: [&str; 92] = [
    "sunset",
    "forest",
    "river",
    "mountain",
    "breeze",
    "meadow",
    "ocean",
    "valley",
    "sky",
    "field",
    "cloud",
    "star",
    "rain",
    "leaf",
    "stone",
    "flower",
    "bird",
    "tree",
    "wave",
    "trail",
    "island",
    "desert",
    "hill",
    "lake",
    "pond",
    "grove",
    "canyon",
    "reef",
    "bay",
    "peak",
    "glade",
    "marsh",
    "cliff",
    "dune",
    "spring",
    "brook",
    "cave",
    "plain",
    "ridge",
    "wood",
    "blossom",
    "petal",
    "root",
    "branch",
    "seed",
    "acorn",
    "pine",
    "willow",
    "cedar",
    "elm",
    "falcon",
    "eagle",
    "sparrow",
    "robin",
    "owl",
    "finch",
    "heron",
    "crane",
    "duck",
    "swan",
    "fox",
    "wolf",
    "bear",
    "deer",
    "moose",
    "otter",
    "beaver",
    "lynx",
    "hare",
    "badger",
    "butterfly",
    "bee",
    "ant",
    "beetle",
    "dragonfly",
    "firefly",
    "ladybug",
    "moth",
    "spider",
    "worm",
    "coral",
    "kelp",
    "shell",
    "pebble",
    "face",
    "boulder",
    "cobble",
    "sand",
    "wavelet",
    "tide",
    "current",
    "mist",
];
/// trackio's `canonical_project_name`: the project's on-disk name, `[A-Za-z0-9_-]` kept
/// (`default` when nothing is left).
pub fn canonical_project_name(project: &str) -> String {
    let safe: String = project
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_')
        .collect();
    let safe = safe.trim_end().to_string();
    if safe.is_empty() {
        "default".into()
    } else {
        safe
    }
}

/// trackio's `generate_readable_name` for a local run: `dainty-sunset-0`, else the first of
/// `<adjective>-<noun>-<n>` (n = 1, 2, ...) not in `used`.
pub fn generate_readable_name(used: &[String]) -> String {
    let mut number = 0usize;
    let mut name = format!("{}-{}-{number}", ADJECTIVES[0], NOUNS[0]);
    while used.contains(&name) {
        number += 1;
        name = format!(
            "{}-{}-{number}",
            ADJECTIVES[number % ADJECTIVES.len()],
            NOUNS[number % NOUNS.len()]
        );
    }
    name
}

/// Where `TrackioCallback` writes (trackio's `TRACKIO_DIR`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackioSettings {
    /// The folder of the project databases.
    pub dir: PathBuf,
}

impl TrackioSettings {
    /// `TRACKIO_DIR`, else `$HF_HOME/trackio` (`HF_HOME`: `$XDG_CACHE_HOME/huggingface`,
    /// else `~/.cache/huggingface`).
    pub fn from_env() -> Self {
        Self::from_lookup(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    /// [`from_env`](Self::from_env) over `lookup`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let dir = match lookup("TRACKIO_DIR") {
            Some(d) => PathBuf::from(d),
            None => {
                let hf_home = lookup("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
                    lookup("XDG_CACHE_HOME")
                        .map(PathBuf::from)
                        .or_else(|| lookup("HOME").map(|h| Path::new(&h).join(".cache")))
                        .unwrap_or_else(|| PathBuf::from(".cache"))
                        .join("huggingface")
                });
                hf_home.join("trackio")
            }
        };
        Self { dir }
    }

    /// The database of `project`.
    pub fn project_db_path(&self, project: &str) -> PathBuf {
        self.dir
            .join(format!("{}.db", canonical_project_name(project)))
    }
}

/// Why `args` cannot be honoured by the Trackio logger, if they cannot (checked before
/// training, when `report_to` names trackio).
pub fn check_trackio_args(args: &TrainingArguments) -> Result<()> {
    let refuse = |field: &'static str, value: String, reason: &str| {
        Err(Error::TrackioSetting {
            field,
            value,
            reason: reason.to_string(),
        })
    };
    if let Some(space) = &args.trackio_space_id {
        return refuse(
            "trackio_space_id",
            space.clone(),
            "logging to a Trackio Space on the Hub is not implemented; leave it unset (None) to log to trackio's local store, then `trackio sync --project <project> --space-id <space>` it",
        );
    }
    if let Some(bucket) = &args.trackio_bucket_id {
        return refuse(
            "trackio_bucket_id",
            bucket.clone(),
            "logging to a Hub Bucket is not implemented; leave it unset to log to trackio's local store",
        );
    }
    if args.push_to_hub && !matches!(args.trackio_static_space_id, Some(StrOrBool::Bool(false))) {
        return refuse(
            "trackio_static_space_id",
            match &args.trackio_static_space_id {
                None => "None".into(),
                Some(StrOrBool::Str(s)) => s.clone(),
                Some(StrOrBool::Bool(b)) => {
                    if *b {
                        "True".into()
                    } else {
                        "False".into()
                    }
                }
            },
            "with push_to_hub, upstream's Trackio logger syncs the project to a static Space on the Hub (`trackio.sync(sdk=\"static\")`), which is not implemented; set --trackio_static_space_id False to push the model without it",
        );
    }
    let canonical = canonical_project_name(&args.project);
    if canonical.starts_with("registry-") {
        return refuse(
            "project",
            args.project.clone(),
            "names beginning with 'registry-' are reserved for trackio registries; choose another project name",
        );
    }
    Ok(())
}

/// trackio's `serialize_values`: non-finite floats as the strings `Infinity`, `-Infinity`,
/// `NaN`.
fn serialize_values(v: &JsonValue) -> JsonValue {
    match v {
        JsonValue::Float(f) if f.is_nan() => JsonValue::Str("NaN".into()),
        JsonValue::Float(f) if f.is_infinite() => {
            JsonValue::Str(if *f > 0.0 { "Infinity" } else { "-Infinity" }.into())
        }
        JsonValue::Array(a) => JsonValue::Array(a.iter().map(serialize_values).collect()),
        JsonValue::Object(m) => {
            let mut out = JsonMap::new();
            for (k, v) in m.iter() {
                out.insert(k, serialize_values(v));
            }
            JsonValue::Object(out)
        }
        other => other.clone(),
    }
}

/// The bytes trackio stores for a metrics or config dict (a JSON blob).
fn json_blob(m: &JsonMap) -> Vec<u8> {
    dumps(
        &serialize_values(&JsonValue::Object(m.clone())),
        None,
        false,
    )
    .into_bytes()
}

/// Python's `datetime.now(timezone.utc).isoformat()`.
fn iso_now() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let (y, mo, da, h, mi, s) = crate::checksum_time::utc_parts(d.as_secs() as i64);
    let micros = d.subsec_micros();
    let frac = if micros == 0 {
        String::new()
    } else {
        format!(".{micros:06}")
    };
    format!("{y:04}-{mo:02}-{da:02}T{h:02}:{mi:02}:{s:02}{frac}+00:00")
}

/// `uuid.uuid4().hex`: 32 hex digits, version 4, RFC 4122 variant.
pub(crate) fn uuid4_hex() -> String {
    let mut next = crate::checksum_time::random_stream();
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&next().to_le_bytes());
    bytes[8..].copy_from_slice(&next().to_le_bytes());
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sql_error(path: &Path, e: rusqlite::Error) -> Error {
    Error::Trackio {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// A started run: the project's database and where the run stands.
struct Run {
    conn: Connection,
    path: PathBuf,
    id: String,
    name: String,
    next_step: i64,
    /// The config, written with the first row (trackio's `_config_logged`).
    pending_config: Option<JsonMap>,
}

impl Run {
    /// Opens (creating it with trackio's schema when new) the database at `path`.
    fn open(path: &Path) -> Result<Connection> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| Error::Io {
                action: "creating",
                path: dir.to_path_buf(),
                source: e,
            })?;
        }
        let conn = Connection::open(path).map_err(|e| sql_error(path, e))?;
        // trackio's `_configure_sqlite_pragmas` (off Spaces).
        conn.pragma_update(None, "journal_mode", "WAL")
            .and_then(|_| conn.pragma_update(None, "synchronous", "NORMAL"))
            .and_then(|_| conn.pragma_update(None, "temp_store", "MEMORY"))
            .map_err(|e| sql_error(path, e))?;
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(|e| sql_error(path, e))?;
        let tables: i64 = conn
            .query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| r.get(0))
            .map_err(|e| sql_error(path, e))?;
        if tables == 0 {
            conn.execute_batch(&format!(
                "BEGIN; {SCHEMA} PRAGMA user_version = {TRACKIO_SCHEMA_VERSION}; COMMIT;"
            ))
            .map_err(|e| sql_error(path, e))?;
        } else if version != TRACKIO_SCHEMA_VERSION {
            return Err(Error::Trackio {
                path: path.to_path_buf(),
                message: format!(
                    "this project database has trackio's schema version {version}, and this logger writes version {TRACKIO_SCHEMA_VERSION} (trackio 0.43); open it once with that trackio (`trackio show --project ...`) to migrate it, or log to another project or TRACKIO_DIR"
                ),
            });
        }
        Ok(conn)
    }

    /// `trackio.log(metrics)`: one `metrics` row at the run's next step (with the config
    /// the first time).
    fn log(&mut self, metrics: &JsonMap) -> Result<()> {
        let now = iso_now();
        let tx = self
            .conn
            .transaction()
            .map_err(|e| sql_error(&self.path, e))?;
        tx.execute(
            "INSERT OR IGNORE INTO metrics (timestamp, run_id, run_name, step, metrics, log_id, space_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULL)",
            params![now, self.id, self.name, self.next_step, json_blob(metrics), uuid4_hex()],
        )
        .map_err(|e| sql_error(&self.path, e))?;
        if let Some(config) = self.pending_config.take() {
            tx.execute(
                "INSERT OR REPLACE INTO configs (run_id, run_name, config, created_at) VALUES (?1, ?2, ?3, ?4)",
                params![self.id, self.name, json_blob(&config), iso_now()],
            )
            .map_err(|e| sql_error(&self.path, e))?;
        }
        tx.commit().map_err(|e| sql_error(&self.path, e))?;
        self.next_step += 1;
        Ok(())
    }
}

/// Upstream `TrackioCallback` over trackio's local store (see the module docs).
pub struct TrackioCallback {
    settings: TrackioSettings,
    model_config: Option<ModelConfig>,
    run: Option<Run>,
    initialized: bool,
}

impl std::fmt::Debug for TrackioCallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrackioCallback")
            .field("settings", &self.settings)
            .field("run", &self.run.as_ref().map(|r| (&r.name, &r.id)))
            .finish()
    }
}

impl Default for TrackioCallback {
    fn default() -> Self {
        Self::new()
    }
}

impl TrackioCallback {
    /// The callback with [`TrackioSettings::from_env`].
    pub fn new() -> Self {
        Self::with_settings(TrackioSettings::from_env())
    }

    /// The callback writing under `settings.dir`.
    pub fn with_settings(settings: TrackioSettings) -> Self {
        Self {
            settings,
            model_config: None,
            run: None,
            initialized: false,
        }
    }

    /// The running run's database, name and id.
    pub fn run(&self) -> Option<(&Path, &str, &str)> {
        self.run
            .as_ref()
            .map(|r| (r.path.as_path(), r.name.as_str(), r.id.as_str()))
    }

    /// Upstream `setup`: `trackio.init(...)`, the config, the parameter count.
    pub fn setup(&mut self, args: &TrainingArguments, state: &TrainerState) -> Result<()> {
        check_trackio_args(args)?;
        self.initialized = true;
        if !state.is_world_process_zero {
            return Ok(());
        }
        let path = self.settings.project_db_path(&args.project);
        let conn = Run::open(&path)?;
        let used: Vec<String> = {
            let mut stmt = conn
                .prepare("SELECT run_name FROM metrics UNION SELECT run_name FROM configs")
                .map_err(|e| sql_error(&path, e))?;
            let rows = stmt
                .query_map([], |r| r.get::<_, String>(0))
                .map_err(|e| sql_error(&path, e))?;
            rows.collect::<std::result::Result<_, _>>()
                .map_err(|e| sql_error(&path, e))?
        };
        // `resume="allow"`: a named run already in the project goes on.
        let existing: Option<String> = match &args.run_name {
            Some(name) => conn
                .query_row(
                    "SELECT run_id, MIN(timestamp) AS created_at FROM metrics WHERE run_name = ?1 GROUP BY run_id, run_name ORDER BY created_at DESC LIMIT 1",
                    [name],
                    |r| r.get(0),
                )
                .optional()
                .map_err(|e| sql_error(&path, e))?,
            None => None,
        };
        let name = args
            .run_name
            .clone()
            .unwrap_or_else(|| generate_readable_name(&used));
        let id = existing.clone().unwrap_or_else(uuid4_hex);
        let next_step = match &existing {
            Some(id) => conn
                .query_row(
                    "SELECT MAX(step) FROM metrics WHERE run_id = ?1",
                    [id],
                    |r| r.get::<_, Option<i64>>(0),
                )
                .map_err(|e| sql_error(&path, e))?
                .map_or(0, |s| s + 1),
            None => 0,
        };
        let mut config = JsonMap::new();
        config.insert("_Username", JsonValue::Null);
        config.insert("_Created", JsonValue::Str(iso_now()));
        config.insert("_Group", JsonValue::Null);
        // `trackio.config.update({**model_config, **args.to_dict()}, allow_val_change=True)`.
        if let Some(mc) = &self.model_config {
            for (k, v) in mc.dict.iter() {
                config.insert(k, v.clone());
            }
        }
        for (k, v) in args_to_dict(args).iter() {
            config.insert(k, v.clone());
        }
        config.insert("allow_val_change", JsonValue::Bool(true));
        if let Some(n) = self.model_config.as_ref().and_then(|c| c.num_parameters) {
            config.insert("model/num_parameters", JsonValue::Int(n));
        }
        log::info!(
            "* {} run: {name} (trackio project {:?} in {})",
            if existing.is_some() {
                "Resumed existing"
            } else {
                "Created new"
            },
            args.project,
            path.display()
        );
        self.run = Some(Run {
            conn,
            path,
            id,
            name,
            next_step,
            pending_config: Some(config),
        });
        Ok(())
    }
}

impl TrainerCallback for TrackioCallback {
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

    fn on_train_end(
        &mut self,
        _: &TrainingArguments,
        state: &TrainerState,
        _: &mut TrainerControl,
    ) -> Result<()> {
        if !state.is_world_process_zero || !self.initialized {
            return Ok(());
        }
        // `trackio.finish()`: every row is already committed.
        self.run = None;
        self.initialized = false;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_paths_follow_trackio() {
        assert_eq!(generate_readable_name(&[]), "dainty-sunset-0");
        let used = vec!["dainty-sunset-0".to_string(), "brave-forest-1".to_string()];
        assert_eq!(generate_readable_name(&used), "calm-river-2");
        assert_eq!(canonical_project_name("my.model/x y"), "mymodelxy");
        assert_eq!(canonical_project_name("..."), "default");
        let s = TrackioSettings::from_lookup(|k| (k == "HF_HOME").then(|| "/h".to_string()));
        assert_eq!(
            s.project_db_path("huggingface"),
            Path::new("/h/trackio/huggingface.db")
        );
        let s = TrackioSettings::from_lookup(|k| (k == "TRACKIO_DIR").then(|| "/t".to_string()));
        assert_eq!(s.dir, Path::new("/t"));
        let s = TrackioSettings::from_lookup(|k| (k == "HOME").then(|| "/home/u".to_string()));
        assert_eq!(s.dir, Path::new("/home/u/.cache/huggingface/trackio"));
    }

    #[test]
    fn ids_and_times_have_python_s_forms() {
        let id = uuid4_hex();
        assert_eq!(id.len(), 32);
        assert_eq!(&id[12..13], "4");
        assert!(matches!(&id[16..17], "8" | "9" | "a" | "b"), "{id}");
        assert_ne!(uuid4_hex(), id);
        let t = iso_now();
        assert!(t.ends_with("+00:00") && t.as_bytes()[10] == b'T', "{t}");
        let mut m = JsonMap::new();
        m.insert("a", JsonValue::Float(f64::NAN));
        m.insert("b", JsonValue::Float(f64::NEG_INFINITY));
        assert_eq!(
            String::from_utf8(json_blob(&m)).unwrap(),
            r#"{"a": "NaN", "b": "-Infinity"}"#
        );
    }
}

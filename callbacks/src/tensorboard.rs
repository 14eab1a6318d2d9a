//! `TensorBoardCallback`: sends the logs to TensorBoard event files (upstream integrations/integration_utils.py).

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use tchtrain_training_args::TrainingArguments;

use crate::args_dict::args_to_dict;
use crate::error::Result;
use crate::event_file::{EventFileWriter, hostname};
use crate::model_config::ModelConfig;
use crate::trainer_callback::TrainerCallback;
use crate::trainer_control::TrainerControl;
use crate::trainer_state::TrainerState;
use tchtrain_training_args::{JsonMap, JsonValue, dumps};

/// Upstream `rewrite_logs`: `eval_x` becomes `eval/x`, `test_x` becomes `test/x`, anything
/// else `train/x`.
pub fn rewrite_logs(logs: &JsonMap) -> JsonMap {
    logs.iter()
        .map(|(k, v)| {
            let key = if let Some(rest) = k.strip_prefix("eval_") {
                format!("eval/{rest}")
            } else if let Some(rest) = k.strip_prefix("test_") {
                format!("test/{rest}")
            } else {
                format!("train/{k}")
            };
            (key, v.clone())
        })
        .collect()
}

/// The logs upstream's W&B and Trackio callbacks keep out of a logged row (W&B puts them in
/// the run's summary alone).
pub(crate) const SINGLE_VALUE_SCALARS: [&str; 5] = [
    "train_runtime",
    "train_samples_per_second",
    "train_steps_per_second",
    "train_loss",
    "total_flos",
];

/// The row upstream's W&B and Trackio callbacks log for `logs`: the single-value scalars
/// left out, [`rewrite_logs`], and `train/global_step`.
pub(crate) fn step_row(logs: &JsonMap, global_step: i64) -> JsonMap {
    let rest: JsonMap = logs
        .iter()
        .filter(|(k, _)| !SINGLE_VALUE_SCALARS.contains(k))
        .map(|(k, v)| (k, v.clone()))
        .collect();
    let mut row = rewrite_logs(&rest);
    row.insert("train/global_step", JsonValue::Int(global_step));
    row
}

/// Upstream `default_logdir`: `runs/<Mon><DD>_<HH>-<MM>-<SS>_<hostname>`. The time is UTC
/// (upstream uses local time; this crate reads no time zone database).
pub fn default_logdir() -> PathBuf {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (_, month, day, hour, minute, second) = crate::checksum_time::utc_parts(secs);
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let name = format!(
        "{}{:02}_{:02}-{:02}-{:02}_{}",
        MONTHS[(month - 1) as usize],
        day,
        hour,
        minute,
        second,
        hostname()
    );
    Path::new("runs").join(name)
}

/// Upstream `args.to_sanitized_dict()` in upstream's order (the fields in declaration order,
/// then `train_batch_size` and `eval_batch_size`): bools, numbers and strings as they are,
/// anything else as its Python `str()`. What TensorBoard's hparams dashboard shows.
pub fn sanitized_hparams(args: &TrainingArguments) -> JsonMap {
    let sanitized = args.to_sanitized_dict();
    let mut keys: Vec<String> = args_to_dict(args).into_iter().map(|(k, _)| k).collect();
    keys.extend([
        "train_batch_size".to_string(),
        "eval_batch_size".to_string(),
    ]);
    let mut out = JsonMap::new();
    for k in keys {
        let value = match sanitized.get(&k) {
            Some(serde_json::Value::Bool(b)) => JsonValue::Bool(*b),
            Some(serde_json::Value::Number(n)) => match n.as_i64() {
                Some(i) => JsonValue::Int(i),
                None => JsonValue::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            Some(serde_json::Value::String(s)) => JsonValue::Str(s.clone()),
            Some(other) => JsonValue::Str(other.to_string()),
            None => continue,
        };
        out.insert(k, value);
    }
    out
}

/// Upstream `TensorBoardCallback`: at the beginning of training writes the arguments
/// (`args.to_json_string()`) as the text `args` and the model's config
/// (`model.config.to_json_string()`, when [`set_model_config`](TrainerCallback::set_model_config)
/// gave one) as the text `model_config`; then every numeric log as a scalar (tag rewritten by
/// [`rewrite_logs`], step = `global_step`) and every string log as text, on the world's main
/// process. The folder is `TENSORBOARD_LOGGING_DIR` when set, else
/// `<output_dir>/runs/<time>_<host>` (or `<output_dir>/runs/<time>_<host>/<trial_name>` in a
/// hyperparameter search).
#[derive(Debug, Default)]
pub struct TensorBoardCallback {
    /// Where the event file goes; chosen at `on_train_begin` when unset.
    pub logging_dir: Option<PathBuf>,
    /// Also write the arguments to TensorBoard's HParams dashboard at the beginning of
    /// training: `add_hparams(args.to_sanitized_dict(), metric_dict={})` (see
    /// [`EventFileWriter::add_hparams`]). Off by default, as in transformers 5.23, whose
    /// callback no longer calls it (4.x did).
    pub log_hparams: bool,
    tb_writer: Option<EventFileWriter>,
    model_config_json: Option<String>,
}

impl TensorBoardCallback {
    /// A callback whose folder comes from `TENSORBOARD_LOGGING_DIR` (`~` expanded) when set.
    pub fn new() -> Self {
        let logging_dir = std::env::var_os("TENSORBOARD_LOGGING_DIR").map(|d| {
            let d = PathBuf::from(d);
            match (d.strip_prefix("~"), std::env::var_os("HOME")) {
                (Ok(rest), Some(home)) => PathBuf::from(home).join(rest),
                _ => d,
            }
        });
        Self {
            logging_dir,
            ..Default::default()
        }
    }

    /// A callback writing into `logging_dir`.
    pub fn with_logging_dir(logging_dir: impl Into<PathBuf>) -> Self {
        Self {
            logging_dir: Some(logging_dir.into()),
            ..Default::default()
        }
    }

    /// The same callback, writing the arguments to the HParams dashboard too
    /// ([`TensorBoardCallback::log_hparams`]).
    pub fn with_hparams(mut self) -> Self {
        self.log_hparams = true;
        self
    }

    /// The current event file, while one is open.
    pub fn event_file(&self) -> Option<&Path> {
        self.tb_writer.as_ref().map(EventFileWriter::path)
    }

    fn writer(&mut self) -> Result<&mut EventFileWriter> {
        if self.tb_writer.is_none() {
            // SummaryWriter(log_dir=None) falls back to `runs/...` in the working directory.
            let dir = self.logging_dir.clone().unwrap_or_else(default_logdir);
            self.tb_writer = Some(EventFileWriter::new(dir)?);
        }
        Ok(self.tb_writer.as_mut().expect("writer was just created"))
    }
}

impl TrainerCallback for TensorBoardCallback {
    fn set_model_config(&mut self, config: &ModelConfig) {
        self.model_config_json = Some(config.json_string.clone());
    }

    fn on_train_begin(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        _: &mut TrainerControl,
    ) -> Result<()> {
        if !state.is_world_process_zero {
            return Ok(());
        }
        let output_dir = PathBuf::from(args.output_dir.as_deref().unwrap_or("trainer_output"));
        if state.is_hyper_param_search
            && let Some(trial) = &state.trial_name
        {
            self.logging_dir = Some(output_dir.join(default_logdir()).join(trial));
        }
        if self.logging_dir.is_none() {
            self.logging_dir = Some(output_dir.join(default_logdir()));
        }
        // Upstream `args.to_json_string()`: `json.dumps(args.to_dict(), indent=2)`.
        let args_json = dumps(&JsonValue::Object(args_to_dict(args)), Some(2), false);
        let model_config = self.model_config_json.clone();
        let log_hparams = self.log_hparams;
        let writer = self.writer()?;
        writer.add_text("args", &args_json, 0)?;
        if let Some(text) = model_config {
            writer.add_text("model_config", &text, 0)?;
        }
        if log_hparams {
            writer.add_hparams(&sanitized_hparams(args), &JsonMap::new(), None, None)?;
        }
        writer.flush()
    }

    fn on_log(
        &mut self,
        _: &TrainingArguments,
        state: &TrainerState,
        _: &mut TrainerControl,
        logs: &JsonMap,
    ) -> Result<()> {
        if !state.is_world_process_zero {
            return Ok(());
        }
        let writer = self.writer()?;
        for (k, v) in rewrite_logs(logs).iter() {
            match v {
                JsonValue::Int(_) | JsonValue::Float(_) | JsonValue::Bool(_) => {
                    let x = match v {
                        JsonValue::Bool(b) => f64::from(u8::from(*b)),
                        other => other.as_f64().unwrap_or_default(),
                    };
                    writer.add_scalar(k, x, state.global_step)?;
                }
                JsonValue::Str(s) => writer.add_text(k, s, state.global_step)?,
                other => log::warn!(
                    "Trainer is attempting to log a value of \"{other:?}\" of type {} for key \"{k}\" as a scalar. \
                     This invocation of Tensorboard's writer.add_scalar() is incorrect so we dropped this attribute.",
                    other.type_name()
                ),
            }
        }
        writer.flush()
    }

    fn on_train_end(
        &mut self,
        _: &TrainingArguments,
        _: &TrainerState,
        _: &mut TrainerControl,
    ) -> Result<()> {
        if let Some(mut w) = self.tb_writer.take() {
            w.flush()?;
        }
        Ok(())
    }
}

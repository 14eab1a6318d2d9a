//! `JsonlLoggerCallback`: every log as one JSON line in a metrics file (a `report_to` logger of this crate).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use tchtrain_training_args::TrainingArguments;

use crate::error::{Error, Result};
use crate::trainer_callback::TrainerCallback;
use crate::trainer_control::TrainerControl;
use crate::trainer_state::TrainerState;
use tchtrain_training_args::{JsonMap, JsonValue, dumps};

/// The file name used under `output_dir` when no path is given.
pub const METRICS_JSONL_NAME: &str = "metrics.jsonl";

/// Appends each log, on the world's main process, to a JSON-lines file as the entry
/// `log_history` gets (`{**logs, "step": global_step}`), in Python's `json.dumps` format
/// (`NaN` stays `NaN`, as Python writes it). The default file is `<output_dir>/metrics.jsonl`.
#[derive(Debug, Default)]
pub struct JsonlLoggerCallback {
    /// The metrics file; `<output_dir>/metrics.jsonl` when unset.
    pub path: Option<PathBuf>,
    file: Option<File>,
}

impl JsonlLoggerCallback {
    /// A logger writing to `<output_dir>/metrics.jsonl`.
    pub fn new() -> Self {
        Self::default()
    }

    /// A logger writing to `path`.
    pub fn with_path(path: impl Into<PathBuf>) -> Self {
        Self {
            path: Some(path.into()),
            file: None,
        }
    }

    fn file(&mut self, args: &TrainingArguments) -> Result<&mut File> {
        if self.file.is_none() {
            let path = self.path.get_or_insert_with(|| {
                Path::new(args.output_dir.as_deref().unwrap_or("trainer_output"))
                    .join(METRICS_JSONL_NAME)
            });
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| Error::io("creating", dir, e))?;
            }
            let f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&*path)
                .map_err(|e| Error::io("opening", &*path, e))?;
            self.file = Some(f);
        }
        Ok(self.file.as_mut().expect("file was just opened"))
    }
}

impl TrainerCallback for JsonlLoggerCallback {
    fn on_log(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        _: &mut TrainerControl,
        logs: &JsonMap,
    ) -> Result<()> {
        if !state.is_world_process_zero {
            return Ok(());
        }
        let mut entry = logs.clone();
        entry.insert("step", state.global_step);
        let line = dumps(&JsonValue::Object(entry), None, false) + "\n";
        let path = self.path.clone();
        let file = self.file(args)?;
        file.write_all(line.as_bytes())
            .and_then(|()| file.flush())
            .map_err(|e| {
                Error::io(
                    "writing",
                    path.unwrap_or_else(|| PathBuf::from(METRICS_JSONL_NAME)),
                    e,
                )
            })
    }

    fn on_train_end(
        &mut self,
        _: &TrainingArguments,
        _: &TrainerState,
        _: &mut TrainerControl,
    ) -> Result<()> {
        self.file = None;
        Ok(())
    }
}

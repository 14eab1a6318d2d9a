//! What the example scripts write at the end of a run, as upstream's `Trainer` methods of
//! the same names: `save_model` (the model and `training_args.json` in `output_dir`),
//! `save_state` (`trainer_state.json`), `log_metrics` (the aligned metrics table) and
//! `save_metrics` (`{split}_results.json` merged into `all_results.json`). In a
//! data-parallel run only the process that saves (`args.should_save()`, rank 0) writes
//! or prints, as upstream.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::checkpoint::{TRAINER_STATE_NAME, TRAINING_ARGS_NAME};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::trainer::Trainer;

/// Upstream `_secs2timedelta`: `H:MM:SS.cc`.
fn secs_to_timedelta(secs: f64) -> String {
    let whole = secs.trunc() as u64;
    let centis = ((secs - secs.trunc()).abs() * 100.0) as u64;
    format!(
        "{}:{:02}:{:02}.{centis:02}",
        whole / 3600,
        (whole / 60) % 60,
        whole % 60
    )
}

/// Upstream `metrics_format`: runtimes as `H:MM:SS.cc`, `total_flos` in GF, other values
/// rounded to 4 decimals.
pub fn metrics_format(metrics: &Metrics) -> Vec<(String, String)> {
    metrics
        .iter()
        .map(|(k, &v)| {
            let shown = if k.contains("_runtime") {
                secs_to_timedelta(v)
            } else if k == "total_flos" {
                format!("{}GF", (v as u64) >> 30)
            } else if v.fract() == 0.0 && v.abs() < 1e15 {
                format!("{}", v as i64)
            } else {
                format!("{}", (v * 1e4).round_ties_even() / 1e4)
            };
            (k.clone(), shown)
        })
        .collect()
}

/// Writes `value` as JSON with 4-space indentation (Python's `json.dump(indent=4)`).
fn write_json_indent4<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let mut buf = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, formatter);
    value.serialize(&mut ser).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        source,
    })?;
    std::fs::write(path, buf).map_err(|e| Error::io("writing", path, e))
}

impl Trainer {
    /// Upstream `save_model`: `save_pretrained` into `output_dir` (or the Trainer's),
    /// plus `training_args.json`, written only where upstream writes them
    /// (`args.should_save`: the main process); the other processes write nothing. Returns
    /// the folder.
    pub fn save_model(&self, output_dir: Option<&Path>) -> Result<PathBuf> {
        let dir =
            output_dir.map_or_else(|| PathBuf::from(self.args.output_dir()), Path::to_path_buf);
        // At the end of `train` a sharded model is whole again on every rank, so there is
        // nothing to gather, except under FSDP's mixed precision, whose float32 shards are
        // the model (a collective); what upstream's `_save` writes, only rank 0 writes.
        let state_dict = self.policy_state_dict()?;
        if !self.args.should_save() {
            return Ok(dir);
        }
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating", &dir, e))?;
        self.write_model_weights(&dir, state_dict)?;
        // Upstream `_save`: `self.data.processing_class.save_pretrained(output_dir)`.
        self.data.save_processing_class(&dir)?;
        self.args.to_json_file(dir.join(TRAINING_ARGS_NAME))?;
        Ok(dir)
    }

    /// Upstream `create_model_card`: the model card (see [`TrainingSummary`]) written as
    /// `README.md` in `output_dir`, by the first process only. The model's
    /// `config._name_or_path` (when its config carries one) is the default `finetuned_from`;
    /// the example scripts pass `finetuned_from` as upstream's do.
    pub fn create_model_card(&self, options: crate::ModelCardOptions) -> Result<()> {
        if !self.is_world_process_zero() {
            return Ok(());
        }
        let name_or_path = match self.model.as_pretrained() {
            Some(p) => p
                .config()
                .to_json_value()?
                .get("_name_or_path")
                .and_then(serde_json::Value::as_str)
                .map(str::to_string),
            None => None,
        };
        let mut summary = crate::TrainingSummary::from_parts(
            &self.args,
            &self.state.log_history,
            self.model.model_name(),
            name_or_path.as_deref(),
            options,
        );
        summary.comment_additions = self.callback_handler.model_card_comments();
        crate::modelcard::write_model_card(
            Path::new(self.args.output_dir()),
            &summary.to_model_card(),
        )
    }

    /// Upstream `save_state`: `trainer_state.json` in `output_dir`.
    pub fn save_state(&mut self) -> Result<()> {
        if !self.args.should_save() {
            return Ok(());
        }
        let dir = PathBuf::from(self.args.output_dir());
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating", &dir, e))?;
        let states = self.callback_handler.exportable_states(&self.control);
        self.state.update_stateful_callbacks(states);
        self.state.save_to_json(dir.join(TRAINER_STATE_NAME))?;
        Ok(())
    }

    /// Upstream `log_metrics`: prints `***** {split} metrics *****` and one aligned line
    /// per metric, sorted by name (see [`metrics_format`]).
    pub fn log_metrics(&self, split: &str, metrics: &Metrics) {
        if !self.args.should_save() {
            return;
        }
        println!("***** {split} metrics *****");
        let formatted = metrics_format(metrics);
        let kw = formatted.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        let vw = formatted.iter().map(|(_, v)| v.len()).max().unwrap_or(0);
        for (k, v) in formatted {
            println!("  {k:<kw$} = {v:>vw$}");
        }
    }

    /// Upstream `save_metrics`: `{split}_results.json` in `output_dir` (sorted keys,
    /// indent 4) and, when `combined`, the metrics merged into `all_results.json`.
    pub fn save_metrics(&self, split: &str, metrics: &Metrics, combined: bool) -> Result<()> {
        if !self.args.should_save() {
            return Ok(());
        }
        let dir = PathBuf::from(self.args.output_dir());
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating", &dir, e))?;
        write_json_indent4(&dir.join(format!("{split}_results.json")), metrics)?;
        if combined {
            let path = dir.join("all_results.json");
            let mut all: std::collections::BTreeMap<String, serde_json::Value> = if path.is_file() {
                let text =
                    std::fs::read_to_string(&path).map_err(|e| Error::io("reading", &path, e))?;
                serde_json::from_str(&text).map_err(|source| Error::Json {
                    path: path.clone(),
                    source,
                })?
            } else {
                Default::default()
            };
            for (k, v) in metrics {
                all.insert(k.clone(), serde_json::json!(v));
            }
            write_json_indent4(&path, &all)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_upstream() {
        let mut m = Metrics::new();
        m.insert("train_runtime".into(), 3725.456);
        m.insert("total_flos".into(), 3.0 * (1u64 << 30) as f64 + 5.0);
        m.insert("eval_loss".into(), 2.345678);
        m.insert("train_samples".into(), 40.0);
        let f: std::collections::BTreeMap<_, _> = metrics_format(&m).into_iter().collect();
        assert_eq!(f["train_runtime"], "1:02:05.45");
        assert_eq!(f["total_flos"], "3GF");
        assert_eq!(f["eval_loss"], "2.3457");
        assert_eq!(f["train_samples"], "40");
    }
}

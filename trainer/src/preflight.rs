//! Checks of the training input made before the first step, so that bad data or a bad
//! checkpoint is a typed error up front instead of a libtorch failure mid-run:
//! class labels outside the model's `num_labels`, and a `resume_from_checkpoint` folder
//! whose files are truncated, unreadable, from another checkpoint or incomplete (checked
//! before any weight is copied). Each error names the file and what to do.
//!
//! | file | caught |
//! |---|---|
//! | `*.safetensors` (model, optimizer, shards) | truncated, header not JSON |
//! | `trainer_state.json` | not JSON, unknown fields (another version), `global_step` not the folder's step |
//! | `rng_state.json`, `optimizer.json`, `scheduler.json`, `config.json` | not JSON / not the expected schema |
//! | `optimizer.safetensors` / `optimizer.json` | one without the other, or both missing beside `scheduler.json` |
//! | `config.json` (with [`Trainer::check_resume_checkpoint`]) | another `model_type` / architecture than the model's |

use std::io::Read;
use std::path::Path;

use tchtrain_callbacks::TrainerState;
use tchtrain_collators::Label;
use tchtrain_models::LabelCheck;
use tchtrain_optim::{
    OPTIMIZER_STATE_NAME, OPTIMIZER_TENSORS_NAME, OptimizerStateMeta, SCHEDULER_NAME,
};

use crate::checkpoint::{PREFIX_CHECKPOINT_DIR, RNG_STATE_NAME, RngState, TRAINER_STATE_NAME};
use crate::error::{Error, Result};
use crate::trainer::Trainer;

/// The label id upstream's losses ignore.
const IGNORE_INDEX: i64 = -100;

impl Trainer {
    /// Every class label of the training rows lies in `0..num_labels` for a model whose
    /// [`label_check`](tchtrain_models::TrainableModel::label_check) is a sequence head
    /// (single-label classification), and every tag in `0..num_labels` or -100 for a token
    /// head; else [`Error::InvalidLabel`] naming the first bad row. Other models are not
    /// checked.
    pub(crate) fn check_train_labels(&self) -> Result<()> {
        let architecture = self.model.model_name();
        let (sequence, num_labels) = match self.model.label_check() {
            Some(LabelCheck::Sequence { num_labels }) => (true, num_labels),
            Some(LabelCheck::Token { num_labels }) => (false, num_labels),
            None => return Ok(()),
        };
        let token = !sequence;
        let Some(dataset) = self.data.train_dataset.as_ref() else {
            return Ok(());
        };
        let bad = |label: i64, row: usize| Error::InvalidLabel {
            label: label.to_string(),
            row,
            detail: format!(
                "outside the {num_labels} labels of this {architecture} (ids 0..{num_labels}); set num_labels to cover every class or fix the data"
            ),
        };
        for row in 0..dataset.len() {
            match dataset.labels(row)? {
                Some(Label::Class(c)) if sequence && !(0..num_labels).contains(&c) => {
                    return Err(bad(c, row));
                }
                Some(Label::Ids(ids)) if token => {
                    if let Some(&c) = ids
                        .iter()
                        .find(|&&c| c != IGNORE_INDEX && !(0..num_labels).contains(&c))
                    {
                        return Err(bad(c, row));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Checks a `resume_from_checkpoint` folder before anything is loaded from it: it is a
/// folder, every `*.safetensors` file in it is complete (its header parses and the file
/// holds every byte the header names), `trainer_state.json` / `rng_state.json` /
/// `optimizer.json` / `scheduler.json` / `config.json`, when present, parse, the state's
/// `global_step` is the step of a `checkpoint-N` folder, and the optimizer state is there
/// when the scheduler's is. Each failure is [`Error::InvalidCheckpoint`] saying which file,
/// why, and what to do.
pub(crate) fn check_resume_checkpoint(dir: &Path) -> Result<()> {
    let invalid = |detail: String| Error::InvalidCheckpoint {
        dir: dir.to_path_buf(),
        detail,
    };
    if !dir.is_dir() {
        return Err(invalid("not a folder".into()));
    }
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io("listing", dir, e))?;
    let mut files: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors") && p.is_file())
        .collect();
    files.sort();
    for file in files {
        check_safetensors_complete(&file).map_err(|detail| {
            invalid(format!(
                "{}: {detail}; copy the file again from the original checkpoint, or resume from an older checkpoint",
                file.file_name().unwrap_or_default().to_string_lossy()
            ))
        })?;
    }
    let state = dir.join(TRAINER_STATE_NAME);
    if state.is_file() {
        let state = TrainerState::load_from_json(&state).map_err(|e| {
            invalid(format!(
                "{TRAINER_STATE_NAME} cannot be used ({e}); it may come from another transformers version or another program: put back the {TRAINER_STATE_NAME} this checkpoint was saved with, or resume from another checkpoint"
            ))
        })?;
        let folder_step = dir
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix(PREFIX_CHECKPOINT_DIR)?.strip_prefix('-'))
            .and_then(|n| n.parse::<i64>().ok());
        if let Some(step) = folder_step
            && step != state.global_step
        {
            return Err(invalid(format!(
                "{TRAINER_STATE_NAME} says global_step {} but the folder is {PREFIX_CHECKPOINT_DIR}-{step}: the file belongs to another checkpoint; put back this checkpoint's own {TRAINER_STATE_NAME}, or resume from {PREFIX_CHECKPOINT_DIR}-{} if that is the one you meant",
                state.global_step, state.global_step
            )));
        }
    }
    let rng = dir.join(RNG_STATE_NAME);
    if rng.is_file() {
        let text = read_text(&rng)?;
        serde_json::from_str::<RngState>(&text)
            .map_err(|e| invalid(format!("{RNG_STATE_NAME} cannot be used ({e}){DAMAGED}")))?;
    }
    let optimizer = dir.join(OPTIMIZER_STATE_NAME);
    if optimizer.is_file() {
        serde_json::from_str::<OptimizerStateMeta>(&read_text(&optimizer)?).map_err(|e| {
            invalid(format!(
                "{OPTIMIZER_STATE_NAME} cannot be used ({e}){DAMAGED}"
            ))
        })?;
    }
    let scheduler = dir.join(SCHEDULER_NAME);
    if scheduler.is_file() {
        let value: serde_json::Value = serde_json::from_str(&read_text(&scheduler)?)
            .map_err(|e| invalid(format!("{SCHEDULER_NAME} is not JSON ({e}){DAMAGED}")))?;
        if !value.is_object() {
            return Err(invalid(format!(
                "{SCHEDULER_NAME} is not a scheduler state (a JSON object){DAMAGED}"
            )));
        }
    }
    let config = dir.join(tchtrain_models::CONFIG_NAME);
    if config.is_file() {
        let value: serde_json::Value = serde_json::from_str(&read_text(&config)?).map_err(|e| {
            invalid(format!(
                "{} is not JSON ({e}){DAMAGED}",
                tchtrain_models::CONFIG_NAME
            ))
        })?;
        if !value.is_object() {
            return Err(invalid(format!(
                "{} is not a model config (a JSON object){DAMAGED}",
                tchtrain_models::CONFIG_NAME
            )));
        }
    }
    check_optimizer_files(dir).map_err(invalid)
}

/// The end of the message for a damaged file of a checkpoint.
const DAMAGED: &str = "; the file is damaged or was written by another program: copy it again from the original checkpoint, or resume from an older checkpoint";

fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::io("reading", path, e))
}

/// The optimizer state of a full (not `save_only_model`, not sharded) checkpoint is
/// `optimizer.safetensors` + `optimizer.json`, saved with `scheduler.json`: one of the pair
/// alone, or neither beside `scheduler.json`, is an incomplete copy. Resuming without it
/// would restart AdamW's moments from zero and silently change the run.
fn check_optimizer_files(dir: &Path) -> std::result::Result<(), String> {
    let tensors = dir.join(OPTIMIZER_TENSORS_NAME).is_file();
    let json = dir.join(OPTIMIZER_STATE_NAME).is_file();
    let fix = "copy it from the original checkpoint; or, to start over from these weights with a fresh optimizer, train from this folder as the model (model_name_or_path) without resume_from_checkpoint";
    match (tensors, json) {
        (true, false) => Err(format!(
            "{OPTIMIZER_TENSORS_NAME} is there but {OPTIMIZER_STATE_NAME} is missing: {fix}"
        )),
        (false, true) => Err(format!(
            "{OPTIMIZER_STATE_NAME} is there but {OPTIMIZER_TENSORS_NAME} is missing: {fix}"
        )),
        (false, false)
            if dir.join(SCHEDULER_NAME).is_file()
                && tchtrain_deepspeed::find_shard_dir(dir).is_err() =>
        {
            Err(format!(
                "the optimizer state ({OPTIMIZER_TENSORS_NAME} + {OPTIMIZER_STATE_NAME}) is missing beside {SCHEDULER_NAME}: {fix}"
            ))
        }
        _ => Ok(()),
    }
}

impl Trainer {
    /// Checks that checkpoint `dir` can resume this Trainer, reading only headers and small
    /// files: every check the resume makes before loading anything (complete safetensors,
    /// readable states, `global_step` matching the folder, the optimizer state present),
    /// and that its `config.json` describes this model (same `model_type` and
    /// architecture). Each failure is [`Error::InvalidCheckpoint`] naming the file and the
    /// fix.
    pub fn check_resume_checkpoint(&self, dir: &Path) -> Result<()> {
        check_resume_checkpoint(dir)?;
        let config = dir.join(tchtrain_models::CONFIG_NAME);
        if !config.is_file() {
            return Ok(());
        }
        let value: serde_json::Value =
            serde_json::from_str(&read_text(&config)?).map_err(|source| Error::Json {
                path: config.clone(),
                source,
            })?;
        // A model without a config (the user's own) has no model type to compare.
        let Some(model) = self.model.as_pretrained() else {
            return Ok(());
        };
        let model_type = model.config().model_type();
        let architecture = model.architecture();
        let theirs_type = value["model_type"].as_str();
        let theirs_arch = value["architectures"][0].as_str();
        let differs = theirs_type.is_some_and(|t| t != model_type)
            || theirs_arch.is_some_and(|a| a != architecture);
        if differs {
            return Err(Error::InvalidCheckpoint {
                dir: dir.to_path_buf(),
                detail: format!(
                    "{} describes a {} (model_type {}) but this Trainer's model is a {architecture} (model_type {model_type}): resume only from checkpoints of this run's model; to start from another model's weights, load it with from_pretrained and train without resume_from_checkpoint",
                    tchtrain_models::CONFIG_NAME,
                    theirs_arch.unwrap_or("model"),
                    theirs_type.unwrap_or("unknown"),
                ),
            });
        }
        Ok(())
    }
}

/// Whether a safetensors file is complete: an 8-byte little-endian header length, a JSON
/// header of that length, and at least as many data bytes as its largest `data_offsets`
/// end. Reads only the header.
fn check_safetensors_complete(path: &Path) -> std::result::Result<(), String> {
    let mut file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    let mut len = [0u8; 8];
    file.read_exact(&mut len)
        .map_err(|_| format!("truncated: {size} bytes, shorter than the 8-byte header length"))?;
    let header_len = u64::from_le_bytes(len);
    if header_len > size.saturating_sub(8) {
        return Err(format!(
            "truncated: {size} bytes, but the header alone is {header_len} bytes"
        ));
    }
    let mut header = vec![0u8; header_len as usize];
    file.read_exact(&mut header).map_err(|e| e.to_string())?;
    let header: serde_json::Value =
        serde_json::from_slice(&header).map_err(|e| format!("unreadable header ({e})"))?;
    let data_end = header
        .as_object()
        .ok_or("the header is not a JSON object")?
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .filter_map(|(_, v)| v["data_offsets"][1].as_u64())
        .max()
        .unwrap_or(0);
    let needed = 8 + header_len + data_end;
    if size < needed {
        return Err(format!(
            "truncated: {size} bytes, but its header describes {needed} bytes (an interrupted copy or save?)"
        ));
    }
    Ok(())
}

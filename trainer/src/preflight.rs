//! Checks of the training input made before the first step, so that bad data or a bad
//! checkpoint is a typed error up front instead of a libtorch failure mid-run:
//! class labels outside the model's `num_labels`, and a `resume_from_checkpoint` folder
//! whose files are truncated or unreadable (checked before any weight is copied).

use std::io::Read;
use std::path::Path;

use tchtrain_callbacks::TrainerState;
use tchtrain_collators::Label;

use crate::checkpoint::{RNG_STATE_NAME, RngState, TRAINER_STATE_NAME};
use crate::error::{Error, Result};
use crate::trainer::Trainer;

/// The label id upstream's losses ignore.
const IGNORE_INDEX: i64 = -100;

impl Trainer {
    /// Every class label of the training rows lies in `0..num_labels` for a
    /// `...ForSequenceClassification` model (single-label classification), and every tag in
    /// `0..num_labels` or -100 for a `...ForTokenClassification` model; else
    /// [`Error::InvalidLabel`] naming the first bad row. Other models are not checked.
    pub(crate) fn check_train_labels(&self) -> Result<()> {
        let architecture = self.model.architecture();
        let sequence = architecture.ends_with("ForSequenceClassification");
        let token = architecture.ends_with("ForTokenClassification");
        let Some(dataset) = self.train_dataset.as_ref().filter(|_| sequence || token) else {
            return Ok(());
        };
        let num_labels = self.model.config().num_labels();
        let bad = |label: i64, row: usize| Error::InvalidLabel {
            label: label.to_string(),
            row,
            detail: format!(
                "outside the {num_labels} labels of this {architecture} (ids 0..{num_labels}); set num_labels to cover every class or fix the data"
            ),
        };
        for row in 0..dataset.len() {
            match dataset.get(row)?.labels {
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
/// holds every byte the header names), and `trainer_state.json` / `rng_state.json`, when
/// present, parse. Each failure is [`Error::InvalidCheckpoint`] saying which file and why.
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
                "{}: {detail}",
                file.file_name().unwrap_or_default().to_string_lossy()
            ))
        })?;
    }
    let state = dir.join(TRAINER_STATE_NAME);
    if state.is_file() {
        TrainerState::load_from_json(&state).map_err(|e| {
            invalid(format!(
                "{TRAINER_STATE_NAME} cannot be used ({e}); it may come from another transformers version or another program"
            ))
        })?;
    }
    let rng = dir.join(RNG_STATE_NAME);
    if rng.is_file() {
        let text = std::fs::read_to_string(&rng).map_err(|e| Error::io("reading", &rng, e))?;
        serde_json::from_str::<RngState>(&text)
            .map_err(|e| invalid(format!("{RNG_STATE_NAME} cannot be used ({e})")))?;
    }
    Ok(())
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

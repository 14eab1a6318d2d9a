//! `torch.load` / `torch.save` (torch's `serialization.py`): whole files in, value trees out,
//! and back. `save` writes the records in `_save`'s order: `data.pkl`, `.format_version`,
//! `.storage_alignment`, `byteorder`, `data/<key>` per storage, then the stream writer's
//! `version` and `.data/serialization_id`.

use std::io::BufWriter;
use std::path::Path;

use crate::error::{Error, Result};
use crate::globals::Globals;
use crate::pickler::MAX_DEPTH;
use crate::pickler::pickle;
use crate::stream_writer::StreamWriter;
use crate::torch_file::{NoStorages, TorchFile};
use crate::unpickler::unpickle;
use crate::value::Value;

/// `.format_version` (`_save`: version 1 orders storages by numeric key).
const FORMAT_VERSION: &str = "1";
/// `.storage_alignment` (`torch.utils.serialization.config.save.storage_alignment`).
const STORAGE_ALIGNMENT: &str = "64";

/// How to read a checkpoint (what `torch.load`'s `weights_only=True` path decides).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadOptions {
    /// The globals a pickle may name; anything else is refused.
    pub globals: Globals,
    /// How deeply containers may nest. Checkpoints nest a handful of levels; the default,
    /// 256, keeps reading (and dropping, comparing, writing the result) within a thread's
    /// stack.
    pub max_depth: usize,
}

impl Default for LoadOptions {
    /// [`Globals::trainer_checkpoint`] and a depth of 256.
    fn default() -> Self {
        Self {
            globals: Globals::trainer_checkpoint(),
            max_depth: MAX_DEPTH,
        }
    }
}

impl LoadOptions {
    /// torch's `weights_only=True` defaults: [`Globals::weights_only`].
    pub fn weights_only() -> Self {
        Self {
            globals: Globals::weights_only(),
            ..Self::default()
        }
    }
}

/// `torch.load(path, weights_only=True)` with transformers' Trainer allow-list
/// ([`LoadOptions::default`]): reads a checkpoint such as `optimizer.pt`, `scheduler.pt`,
/// `rng_state.pth`, `scaler.pt` or `training_args.bin`.
///
/// ```no_run
/// let state = tchtrain_serialization::load("checkpoint-2/scheduler.pt")?;
/// let last_epoch = state.get("last_epoch").and_then(|v| v.as_i64());
/// # Ok::<(), tchtrain_serialization::Error>(())
/// ```
pub fn load(path: impl AsRef<Path>) -> Result<Value> {
    load_with(path, &LoadOptions::default())
}

/// [`load`] with explicit options (another allow-list, another depth limit).
pub fn load_with(path: impl AsRef<Path>, options: &LoadOptions) -> Result<Value> {
    TorchFile::open(path)?.load(options)
}

/// `pickle.loads` under the same restrictions, for a bare pickle stream (no zip, so no
/// tensors: a persistent id is an error).
pub fn loads(data: &[u8], options: &LoadOptions) -> Result<Value> {
    let file = "<pickle>";
    unpickle(data, file, options, &mut NoStorages { file })
}

/// `pickle.dumps(value, protocol=2)` for a value without tensors.
pub fn dumps(value: &Value) -> Result<Vec<u8>> {
    Ok(pickle(value, false)?.data)
}

/// `torch.save(value, path)` (path first, as `std::fs::write`): a zip checkpoint whose archive folder is the file's stem, as
/// torch names it, which `torch.load(path, weights_only=True)` reads back equal.
pub fn save(path: impl AsRef<Path>, value: &Value) -> Result<()> {
    let path = path.as_ref();
    let archive_name = archive_name(path)?;
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::create(path).map_err(io)?;
    let out = write_archive(value, BufWriter::new(file), &archive_name)?;
    out.into_inner()
        .map_err(|e| io(e.into_error()))?
        .sync_all()
        .map_err(io)
}

/// `torch.save(value, buffer)` into memory (archive folder `archive`, as torch names it for
/// a file-like object).
pub fn save_to_vec(value: &Value) -> Result<Vec<u8>> {
    write_archive(value, Vec::new(), "archive")
}

fn write_archive<W: std::io::Write>(value: &Value, out: W, archive_name: &str) -> Result<W> {
    let pickled = pickle(value, true)?;
    let mut w = StreamWriter::new(out, archive_name)?;
    w.write_record("data.pkl", &pickled.data)?;
    w.write_record(".format_version", FORMAT_VERSION.as_bytes())?;
    w.write_record(".storage_alignment", STORAGE_ALIGNMENT.as_bytes())?;
    w.write_record("byteorder", b"little")?;
    for (key, record) in pickled.storages.iter().enumerate() {
        w.write_record(&format!("data/{key}"), &record.storage.bytes)?;
    }
    w.finish()
}

/// caffe2's `basename`: the file name without directories and without its last extension.
fn archive_name(path: &Path) -> Result<String> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| Error::Unwritable {
            problem: format!("invalid file name: {}", path.display()),
        })?;
    let stem = match name.rfind('.') {
        Some(dot) => &name[..dot],
        None => name,
    };
    if stem.is_empty() {
        return Err(Error::Unwritable {
            problem: format!(
                "invalid file name: {} (torch names the archive after the file's stem)",
                path.display()
            ),
        });
    }
    Ok(stem.to_string())
}

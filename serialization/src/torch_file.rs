//! A torch zip checkpoint opened for reading (`PyTorchStreamReader` plus `torch.serialization._load`):
//! its records under the archive folder, the `version` and `byteorder` checks torch makes, and
//! the storages `data/<key>` that persistent ids name, loaded once each, size-checked and
//! byte-swapped from big-endian files.

use std::collections::HashMap;
use std::io::{Cursor, Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::rebuild::{PersistentId, StorageSource, StorageType};
use crate::serialization::LoadOptions;
use crate::unpickler::unpickle;
use crate::value::{Storage, Value};

/// caffe2's `kMinSupportedFileFormatVersion` / `kMaxSupportedFileFormatVersion`.
const SUPPORTED_VERSIONS: std::ops::RangeInclusive<u64> = 1..=10;

/// Where an archive's bytes are: a file read record by record, or memory.
enum Source {
    File(std::io::BufReader<std::fs::File>),
    Memory(Cursor<Vec<u8>>),
}

impl Read for Source {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Source::File(f) => f.read(buf),
            Source::Memory(m) => m.read(buf),
        }
    }
}

impl Seek for Source {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        match self {
            Source::File(f) => f.seek(pos),
            Source::Memory(m) => m.seek(pos),
        }
    }
}

/// A torch zip checkpoint (what `torch.save` writes by default). Opened from a path, records
/// are read from the file as they are needed (a storage is in memory once, as torch holds it);
/// from bytes, they are read from memory.
///
/// ```no_run
/// use tchtrain_serialization::{LoadOptions, TorchFile};
/// let mut file = TorchFile::open("checkpoint-2/optimizer.pt")?;
/// let state = file.load(&LoadOptions::default())?;
/// let step = state.get("state").and_then(|s| s.as_dict()).map(|s| s.len());
/// # Ok::<(), tchtrain_serialization::Error>(())
/// ```
pub struct TorchFile {
    name: String,
    /// The archive's size in bytes.
    file_len: u64,
    archive: zip::ZipArchive<Source>,
    archive_name: String,
}

impl std::fmt::Debug for TorchFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TorchFile")
            .field("name", &self.name)
            .field("archive_name", &self.archive_name)
            .field("records", &self.archive.len())
            .finish()
    }
}

impl TorchFile {
    /// Opens the file at `path` (its records are read when asked for).
    pub fn open(path: impl AsRef<Path>) -> Result<TorchFile> {
        let path = path.as_ref();
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let file_len = file.metadata().map_err(io)?.len();
        let mut source = Source::File(std::io::BufReader::new(file));
        let mut magic = Vec::new();
        (&mut source).take(8).read_to_end(&mut magic).map_err(io)?;
        source.seek(SeekFrom::Start(0)).map_err(io)?;
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        Self::from_source(source, file_len, &magic, &name)
    }

    /// Reads a checkpoint held in memory; `name` labels errors.
    pub fn from_bytes(bytes: Vec<u8>, name: &str) -> Result<TorchFile> {
        let magic = bytes[..bytes.len().min(8)].to_vec();
        let file_len = bytes.len() as u64;
        Self::from_source(Source::Memory(Cursor::new(bytes)), file_len, &magic, name)
    }

    fn from_source(source: Source, file_len: u64, magic: &[u8], name: &str) -> Result<TorchFile> {
        let zip_error = |e: zip::result::ZipError| Error::Zip {
            file: name.to_string(),
            problem: e.to_string(),
        };
        if magic == b"PYTORCH1" {
            return Err(Error::Zip {
                file: name.to_string(),
                problem: "an archive from the PyTorch preview release".into(),
            });
        }
        // Offsets are absolute, as miniz reads them (no search for data prepended to the zip).
        let config = zip::read::Config {
            archive_offset: zip::read::ArchiveOffset::Known(0),
        };
        let archive = zip::ZipArchive::with_config(config, source).map_err(zip_error)?;
        // PyTorchStreamReader::init: the folder of the first entry is the archive name.
        let first = match archive.name_for_index(0) {
            Some(Ok(first)) => first.into_owned(),
            Some(Err(e)) => return Err(zip_error(e)),
            None => {
                return Err(Error::Zip {
                    file: name.to_string(),
                    problem: "archive does not contain any files".into(),
                });
            }
        };
        let Some((archive_name, _)) = first.split_once('/') else {
            return Err(Error::BadRecord {
                file: name.to_string(),
                record: first.clone(),
                problem: "file in archive is not in a subdirectory".into(),
            });
        };
        let archive_name = archive_name.to_string();
        let mut file = TorchFile {
            name: name.to_string(),
            file_len,
            archive,
            archive_name,
        };
        file.check_version()?;
        Ok(file)
    }

    /// The archive folder every record sits in (the saved file's stem: `optimizer`).
    pub fn archive_name(&self) -> &str {
        &self.archive_name
    }

    /// The name used in errors (the file name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Every record's name, without the archive folder, in the order of the zip's central
    /// directory (entries outside the folder are left out).
    pub fn record_names(&self) -> Vec<String> {
        let prefix = format!("{}/", self.archive_name);
        self.archive
            .file_names()
            .filter_map(|n| n.ok())
            .filter_map(|n| n.strip_prefix(&prefix).map(str::to_string))
            .collect()
    }

    /// Whether the archive has `record` (`"data.pkl"`).
    pub fn has_record(&self, record: &str) -> bool {
        self.archive
            .index_for_name(&format!("{}/{record}", self.archive_name))
            .is_some()
    }

    /// The bytes of `record` (`"data.pkl"`, `"data/0"`), `None` when it is absent.
    pub fn record(&mut self, record: &str) -> Result<Option<Vec<u8>>> {
        let full = format!("{}/{record}", self.archive_name);
        let file_len = self.file_len;
        let Some(index) = self.archive.index_for_name(&full) else {
            return Ok(None);
        };
        let name = self.name.clone();
        let corrupt = |problem: String| Error::Zip {
            file: name.clone(),
            problem: format!("record `{full}`: {problem}"),
        };
        let mut entry = self
            .archive
            .by_index(index)
            .map_err(|e| corrupt(e.to_string()))?;
        let size = entry.size();
        // Deflate expands at most 1032-fold: a larger declared size is a lie (or a bomb).
        if size
            > entry
                .compressed_size()
                .saturating_mul(1032)
                .saturating_add(64)
        {
            return Err(corrupt(format!(
                "declares {size} bytes from {} compressed",
                entry.compressed_size()
            )));
        }
        // A stored entry cannot be larger than the file; a deflated one is read no further
        // than its declared size (and a mismatch is corruption).
        let capacity = usize::try_from(size.min(file_len)).unwrap_or(usize::MAX);
        let mut out = Vec::with_capacity(capacity);
        (&mut entry)
            .take(size.saturating_add(1))
            .read_to_end(&mut out)
            .map_err(|e| corrupt(e.to_string()))?;
        if out.len() as u64 != size {
            return Err(corrupt(format!(
                "holds {} bytes, its header says {size}",
                out.len()
            )));
        }
        Ok(Some(out))
    }

    fn check_version(&mut self) -> Result<()> {
        let record = if self.has_record(".data/version") {
            ".data/version"
        } else {
            "version"
        };
        let Some(bytes) = self.record(record)? else {
            return Err(Error::MissingRecord {
                file: self.name.clone(),
                record: format!("{}/version", self.archive_name),
            });
        };
        let version = std::str::from_utf8(&bytes)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok());
        match version {
            Some(v) if SUPPORTED_VERSIONS.contains(&v) => Ok(()),
            _ => Err(Error::BadRecord {
                file: self.name.clone(),
                record: format!("{}/{record}", self.archive_name),
                problem: format!(
                    "file format version {:?} is outside the supported {}..={}",
                    String::from_utf8_lossy(&bytes),
                    SUPPORTED_VERSIONS.start(),
                    SUPPORTED_VERSIONS.end()
                ),
            }),
        }
    }

    /// Whether the storages are big-endian (`byteorder` record; little when absent).
    fn big_endian(&mut self) -> Result<bool> {
        match self.record("byteorder")?.as_deref() {
            None | Some(b"little") => Ok(false),
            Some(b"big") => Ok(true),
            Some(other) => Err(Error::BadRecord {
                file: self.name.clone(),
                record: format!("{}/byteorder", self.archive_name),
                problem: format!(
                    "Unknown endianness type: {:?}",
                    String::from_utf8_lossy(other)
                ),
            }),
        }
    }

    /// Unpickles `data.pkl` with `options` (torch's `_load` with `weights_only=True`),
    /// loading the storages its tensors name.
    pub fn load(&mut self, options: &LoadOptions) -> Result<Value> {
        let big_endian = self.big_endian()?;
        let Some(data) = self.record("data.pkl")? else {
            return Err(Error::MissingRecord {
                file: self.name.clone(),
                record: format!("{}/data.pkl", self.archive_name),
            });
        };
        let label = format!("{}: {}/data.pkl", self.name, self.archive_name);
        let mut storages = ArchiveStorages {
            file: self,
            big_endian,
            loaded: HashMap::new(),
        };
        unpickle(&data, &label, options, &mut storages)
    }
}

/// The storages of one archive, each loaded once (tensors that view one storage share it).
struct ArchiveStorages<'a> {
    file: &'a mut TorchFile,
    big_endian: bool,
    loaded: HashMap<String, (StorageType, Arc<Storage>)>,
}

impl StorageSource for ArchiveStorages<'_> {
    fn load_storage(&mut self, pid: &PersistentId) -> Result<Arc<Storage>> {
        let file = self.file.name.clone();
        let bad = |problem: String| Error::BadStorage {
            file: file.clone(),
            key: pid.key.clone(),
            problem,
        };
        if let Some((ty, storage)) = self.loaded.get(&pid.key) {
            if *ty != pid.storage_type {
                return Err(bad(format!(
                    "named as {:?} and as {:?}",
                    ty, pid.storage_type
                )));
            }
            return Ok(storage.clone());
        }
        let dtype = pid.storage_type.dtype();
        let nbytes = pid
            .numel
            .checked_mul(dtype.element_size() as u64)
            .ok_or_else(|| bad(format!("numel {} overflows", pid.numel)))?;
        let record = format!("data/{}", pid.key);
        let Some(mut bytes) = self.file.record(&record)? else {
            return Err(Error::MissingStorage {
                file,
                key: pid.key.clone(),
                record: format!("{}/{record}", self.file.archive_name),
            });
        };
        if bytes.len() as u64 != nbytes {
            return Err(bad(format!(
                "the record holds {} bytes but the persistent id says {} elements of {} ({nbytes} bytes)",
                bytes.len(),
                pid.numel,
                dtype
            )));
        }
        if self.big_endian {
            for element in bytes.chunks_exact_mut(dtype.swap_unit()) {
                element.reverse();
            }
        }
        let storage = Arc::new(Storage {
            bytes,
            device: pid.location.clone(),
        });
        self.loaded
            .insert(pid.key.clone(), (pid.storage_type, storage.clone()));
        Ok(storage)
    }
}

/// A bare pickle stream has no storages: any persistent id is refused.
pub(crate) struct NoStorages<'a> {
    pub file: &'a str,
}

impl StorageSource for NoStorages<'_> {
    fn load_storage(&mut self, pid: &PersistentId) -> Result<Arc<Storage>> {
        Err(Error::MissingStorage {
            file: self.file.to_string(),
            key: pid.key.clone(),
            record: format!("data/{} (a bare pickle has no storages)", pid.key),
        })
    }
}

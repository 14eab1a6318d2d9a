//! Cache files for tokenized datasets: the role of `datasets`' `Dataset.map` cache
//! (`cache-<fingerprint>.arrow`, reused by the next run that maps the same data with the same
//! function, rebuilt with `--overwrite_cache`).
//!
//! A [`Fingerprint`] is the SHA-256 of everything the rows depend on (the caller feeds it the
//! input rows, the tokenizer's JSON and the options); [`MapCache::map`] returns the rows stored
//! under it, or computes them, stores them and returns them. The file (`cache-<hex>.rows` in
//! the cache folder) is a small binary format ([`encode_rows`]) ending in a CRC-32 of its body;
//! it is written to a temporary name and renamed, so a crash or a concurrent run never leaves a
//! half-written file under the final name. A file that does not decode (truncated, corrupt,
//! from another version) is reported in the log and rebuilt, never an error; a folder that
//! cannot be written is reported and the rows are used uncached.
//!
//! The folder is `$TCHTRAIN_DATASETS_CACHE` when set (`0` or `off`: no cache), else
//! `datasets/` in the per-user cache folder (`$TCHTRAIN_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/tchtrain`, else `~/.cache/tchtrain`).
//!
//! The folder is bounded: `$TCHTRAIN_DATASETS_CACHE_MB` (default 4096 MiB) caps the size of
//! its cache files, the least recently used going first. A load marks a file used (its
//! modification time); after each write the oldest files are deleted until the rest fit. A
//! dataset larger than the whole cap is used uncached (logged). `cargo xtask clean-cache`
//! lists and clears the folder.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::feature::{Column, Feature, Label};
use sha2::{Digest, Sha256};

/// The environment variable naming the cache folder (`0` or `off` turns the cache off).
pub const DATASETS_CACHE_ENV: &str = "TCHTRAIN_DATASETS_CACHE";

/// The environment variable capping the cache folder's size, in MiB.
pub const DATASETS_CACHE_MB_ENV: &str = "TCHTRAIN_DATASETS_CACHE_MB";

/// The cap when [`DATASETS_CACHE_MB_ENV`] is unset: 4096 MiB.
pub const DEFAULT_DATASETS_CACHE_MB: u64 = 4096;

const MAGIC: &[u8; 16] = b"TCHTRAIN-ROWS-v5";

/// The SHA-256 of a sequence of parts, each length-prefixed (so `["ab", "c"]` and
/// `["a", "bc"]` differ).
#[derive(Debug, Clone)]
pub struct Fingerprint {
    hasher: Sha256,
}

impl Fingerprint {
    /// A fingerprint that starts with `function`, the name of what produces the rows.
    pub fn new(function: &str) -> Self {
        let mut f = Self {
            hasher: Sha256::new(),
        };
        f.update(MAGIC).update(function);
        f
    }

    /// Adds one part.
    pub fn update(&mut self, part: impl AsRef<[u8]>) -> &mut Self {
        let part = part.as_ref();
        self.hasher.update((part.len() as u64).to_le_bytes());
        self.hasher.update(part);
        self
    }

    /// The fingerprint in hexadecimal (64 characters).
    pub fn hex(&self) -> String {
        self.hasher
            .clone()
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// A folder of cached tokenized datasets (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapCache {
    dir: PathBuf,
    max_bytes: u64,
}

impl MapCache {
    /// A cache in `dir` (created when the first file is written), capped at
    /// [`DEFAULT_DATASETS_CACHE_MB`].
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            max_bytes: DEFAULT_DATASETS_CACHE_MB << 20,
        }
    }

    /// This cache capped at `max_bytes` (its files' total size; least recently used first
    /// out).
    pub fn with_max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// The cap on the files' total size, in bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// The cache the environment names: `$TCHTRAIN_DATASETS_CACHE` (`0` / `off` / empty:
    /// none), else `datasets/` in the per-user cache folder the rest of the project uses
    /// (`$TCHTRAIN_CACHE_DIR`, else `$XDG_CACHE_HOME/tchtrain`, else `~/.cache/tchtrain`);
    /// `None` when none of them is set. The cap is `$TCHTRAIN_DATASETS_CACHE_MB` (MiB), else
    /// [`DEFAULT_DATASETS_CACHE_MB`]; a value that is not a whole number of MiB is an error
    /// naming the variable.
    pub fn from_env() -> crate::Result<Option<Self>> {
        Self::from_vars(|name| std::env::var_os(name))
    }

    /// [`from_env`](Self::from_env) with the variables `var` gives.
    pub fn from_vars(var: impl Fn(&str) -> Option<OsString>) -> crate::Result<Option<Self>> {
        let max_mb = match var(DATASETS_CACHE_MB_ENV) {
            None => DEFAULT_DATASETS_CACHE_MB,
            Some(v) => {
                let v = v.to_string_lossy();
                match v.trim().parse::<u64>() {
                    Ok(mb) if mb < 1 << 40 => mb,
                    _ => {
                        return Err(crate::Error::InvalidArgument {
                            field: DATASETS_CACHE_MB_ENV,
                            detail: format!(
                                "`{v}` is not a size in MiB: give a whole number (0 keeps nothing), or unset it for {DEFAULT_DATASETS_CACHE_MB}"
                            ),
                        });
                    }
                }
            }
        };
        Ok(Self::dir_from_vars(&var).map(|dir| Self::new(dir).with_max_bytes(max_mb << 20)))
    }

    /// The folder the variables name (see [`from_env`](Self::from_env)).
    fn dir_from_vars(var: &impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
        if let Some(v) = var(DATASETS_CACHE_ENV) {
            let s = v.to_string_lossy();
            if s.is_empty() || s == "0" || s.eq_ignore_ascii_case("off") {
                return None;
            }
            return Some(PathBuf::from(v));
        }
        let nonempty = |k: &str| var(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        let root = nonempty("TCHTRAIN_CACHE_DIR")
            .or_else(|| nonempty("XDG_CACHE_HOME").map(|d| d.join("tchtrain")))
            .or_else(|| nonempty("HOME").map(|h| h.join(".cache").join("tchtrain")))?;
        Some(root.join("datasets"))
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file that holds the rows of `fingerprint`.
    pub fn path(&self, fingerprint: &Fingerprint) -> PathBuf {
        self.dir.join(format!("cache-{}.rows", fingerprint.hex()))
    }

    /// The rows stored under `fingerprint`, or (when there are none, they do not decode, or
    /// `overwrite` is set: upstream's `load_from_cache_file=not overwrite_cache`) `compute()`'s,
    /// which are then stored. Only `compute`'s own errors are returned.
    pub fn map<E>(
        &self,
        fingerprint: &Fingerprint,
        overwrite: bool,
        compute: impl FnOnce() -> Result<Vec<Feature>, E>,
    ) -> Result<Vec<Feature>, E> {
        let path = self.path(fingerprint);
        if !overwrite && let Ok(bytes) = std::fs::read(&path) {
            match decode_rows(&bytes) {
                Ok(rows) => {
                    log::info!("Loading cached processed dataset at {}", path.display());
                    mark_used(&path);
                    return Ok(rows);
                }
                Err(e) => log::warn!(
                    "the cached dataset {} is unreadable ({e}); rebuilding it",
                    path.display()
                ),
            }
        }
        let rows = compute()?;
        if let Err(e) = self.store(&path, &rows) {
            log::warn!(
                "could not write the dataset cache {}: {e}; set {DATASETS_CACHE_ENV} to a writable folder, or to 0 to turn the cache off",
                path.display()
            );
        }
        Ok(rows)
    }

    fn store(&self, path: &Path, rows: &[Feature]) -> std::io::Result<()> {
        let bytes = encode_rows(rows);
        if bytes.len() as u64 > self.max_bytes {
            log::info!(
                "the tokenized dataset ({} MiB) is larger than the cache's cap ({} MiB, {DATASETS_CACHE_MB_ENV}): not cached",
                bytes.len() >> 20,
                self.max_bytes >> 20
            );
            return Ok(());
        }
        std::fs::create_dir_all(&self.dir)?;
        let tmp = path.with_extension(format!("rows.tmp-{}", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, path).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })?;
        self.evict(path);
        Ok(())
    }

    /// The cache files (`cache-*.rows`) with their sizes and last use, least recently used
    /// first.
    pub fn entries(&self) -> std::io::Result<Vec<CacheEntry>> {
        let mut entries = Vec::new();
        let read = match std::fs::read_dir(&self.dir) {
            Ok(read) => read,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(entries),
            Err(e) => return Err(e),
        };
        for entry in read {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if !(name.starts_with("cache-") && name.ends_with(".rows")) {
                continue;
            }
            let meta = entry.metadata()?;
            entries.push(CacheEntry {
                path: entry.path(),
                bytes: meta.len(),
                used: meta.modified()?,
            });
        }
        entries.sort_by(|a, b| a.used.cmp(&b.used).then_with(|| a.path.cmp(&b.path)));
        Ok(entries)
    }

    /// Deletes the least recently used files until the rest fit under the cap, never `keep`
    /// (the file just written). Failures are logged: the cache stays usable.
    fn evict(&self, keep: &Path) {
        let entries = match self.entries() {
            Ok(entries) => entries,
            Err(e) => {
                log::warn!(
                    "could not list the dataset cache {}: {e}",
                    self.dir.display()
                );
                return;
            }
        };
        let mut total: u64 = entries.iter().map(|e| e.bytes).sum();
        for entry in &entries {
            if total <= self.max_bytes {
                break;
            }
            if entry.path == keep {
                continue;
            }
            match std::fs::remove_file(&entry.path) {
                Ok(()) => {
                    log::info!(
                        "dataset cache over {} MiB ({DATASETS_CACHE_MB_ENV}): removed the least recently used {}",
                        self.max_bytes >> 20,
                        entry.path.display()
                    );
                    total -= entry.bytes;
                }
                Err(e) => log::warn!("could not remove {}: {e}", entry.path.display()),
            }
        }
    }
}

/// One file of a [`MapCache`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheEntry {
    /// The file.
    pub path: PathBuf,
    /// Its size.
    pub bytes: u64,
    /// When it was last written or loaded.
    pub used: std::time::SystemTime,
}

/// Marks a cache file used now (its modification time), for least-recently-used eviction.
fn mark_used(path: &Path) {
    let now = std::time::SystemTime::now();
    if let Err(e) = std::fs::File::options()
        .append(true)
        .open(path)
        .and_then(|f| f.set_modified(now))
    {
        log::debug!("could not mark {} used: {e}", path.display());
    }
}

/// `cache.map(..)` when there is a cache, else `compute()`.
pub fn map_cached<E>(
    cache: Option<&MapCache>,
    fingerprint: &Fingerprint,
    overwrite: bool,
    compute: impl FnOnce() -> Result<Vec<Feature>, E>,
) -> Result<Vec<Feature>, E> {
    match cache {
        Some(c) => c.map(fingerprint, overwrite, compute),
        None => compute(),
    }
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_ids(out: &mut Vec<u8>, ids: &[i64]) {
    put_u64(out, ids.len() as u64);
    for &v in ids {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

fn put_opt_ids(out: &mut Vec<u8>, ids: Option<&Vec<i64>>) {
    match ids {
        None => out.push(0),
        Some(ids) => {
            out.push(1);
            put_ids(out, ids);
        }
    }
}

/// The cache file's bytes for `rows`: a 16-byte magic, the row count, each row's fields
/// (little-endian; optional fields behind a presence byte), then the CRC-32 of all of it.
pub fn encode_rows(rows: &[Feature]) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + rows.len() * 64);
    out.extend_from_slice(MAGIC);
    put_u64(&mut out, rows.len() as u64);
    for r in rows {
        put_ids(&mut out, &r.input_ids);
        put_opt_ids(&mut out, r.token_type_ids.as_ref());
        put_opt_ids(&mut out, r.attention_mask.as_ref());
        put_opt_ids(&mut out, r.special_tokens_mask.as_ref());
        match &r.offset_mapping {
            None => out.push(0),
            Some(spans) => {
                out.push(1);
                let flat: Vec<i64> = spans.iter().flat_map(|&(a, b)| [a, b]).collect();
                put_ids(&mut out, &flat);
            }
        }
        match &r.labels {
            None => out.push(0),
            Some(Label::Class(c)) => {
                out.push(1);
                out.extend_from_slice(&c.to_le_bytes());
            }
            Some(Label::Value(v)) => {
                out.push(2);
                out.extend_from_slice(&v.to_bits().to_le_bytes());
            }
            Some(Label::Ids(ids)) => {
                out.push(3);
                put_ids(&mut out, ids);
            }
            Some(Label::Values(vs)) => {
                out.push(4);
                let bits: Vec<i64> = vs.iter().map(|v| v.to_bits() as i64).collect();
                put_ids(&mut out, &bits);
            }
        }
        for position in [r.start_positions, r.end_positions] {
            put_opt_ids(&mut out, position.map(|p| vec![p]).as_ref());
        }
        put_opt_ids(&mut out, r.seq_lengths.as_ref());
        put_u64(&mut out, r.columns.len() as u64);
        for (name, value) in &r.columns {
            put_ids(&mut out, &name.bytes().map(i64::from).collect::<Vec<_>>());
            match value {
                Column::Ids(ids) => {
                    out.push(0);
                    put_ids(&mut out, ids);
                }
                Column::Float(v) => {
                    out.push(1);
                    out.extend_from_slice(&v.to_bits().to_le_bytes());
                }
                Column::Floats { shape, values } => {
                    out.push(2);
                    put_ids(&mut out, shape);
                    put_u64(&mut out, values.len() as u64);
                    for v in values {
                        out.extend_from_slice(&v.to_bits().to_le_bytes());
                    }
                }
            }
        }
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> std::result::Result<&[u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(format!("truncated at byte {}", self.at));
        };
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u8(&mut self) -> std::result::Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u64(&mut self) -> std::result::Result<u64, String> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }

    fn ids(&mut self) -> std::result::Result<Vec<i64>, String> {
        let n = self.u64()?;
        // Every id takes 8 bytes: a count larger than what is left is corrupt (and must not
        // reserve memory for it).
        if n > ((self.bytes.len() - self.at) / 8) as u64 {
            return Err(format!(
                "a list of {n} ids overruns the file at byte {}",
                self.at
            ));
        }
        (0..n).map(|_| Ok(self.u64()? as i64)).collect()
    }

    fn opt_ids(&mut self) -> std::result::Result<Option<Vec<i64>>, String> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(self.ids()?)),
            t => Err(format!("bad presence byte {t} at byte {}", self.at - 1)),
        }
    }
}

/// Decodes [`encode_rows`]' bytes; an error says what is wrong (bad magic, bad checksum,
/// truncated, a bad tag) and never panics, whatever the bytes.
pub fn decode_rows(bytes: &[u8]) -> std::result::Result<Vec<Feature>, String> {
    if bytes.len() < MAGIC.len() + 8 + 4 || &bytes[..MAGIC.len()] != MAGIC {
        return Err("not a tchtrain rows cache file (bad magic)".into());
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    let stored = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    if crc32fast::hash(body) != stored {
        return Err("checksum mismatch".into());
    }
    let mut r = Reader {
        bytes: body,
        at: MAGIC.len(),
    };
    let n = r.u64()?;
    // A row takes at least 16 bytes: the ids count and eight presence / tag bytes.
    if n > (body.len() / 16) as u64 {
        return Err(format!("{n} rows cannot fit in {} bytes", body.len()));
    }
    let mut rows = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let input_ids = r.ids()?;
        let token_type_ids = r.opt_ids()?;
        let attention_mask = r.opt_ids()?;
        let special_tokens_mask = r.opt_ids()?;
        let offset_mapping = match r.opt_ids()? {
            None => None,
            Some(flat) if flat.len() % 2 == 0 => {
                Some(flat.chunks(2).map(|p| (p[0], p[1])).collect())
            }
            Some(_) => return Err("an offset mapping of odd length".into()),
        };
        let labels = match r.u8()? {
            0 => None,
            1 => Some(Label::Class(r.u64()? as i64)),
            2 => Some(Label::Value(f64::from_bits(r.u64()?))),
            3 => Some(Label::Ids(r.ids()?)),
            4 => Some(Label::Values(
                r.ids()?
                    .into_iter()
                    .map(|b| f64::from_bits(b as u64))
                    .collect(),
            )),
            t => return Err(format!("bad label tag {t}")),
        };
        let mut position = || -> std::result::Result<Option<i64>, String> {
            match r.opt_ids()?.as_deref() {
                None => Ok(None),
                Some(&[p]) => Ok(Some(p)),
                Some(v) => Err(format!("an answer position of {} values", v.len())),
            }
        };
        let start_positions = position()?;
        let end_positions = position()?;
        let seq_lengths = r.opt_ids()?;
        let mut columns = std::collections::BTreeMap::new();
        for _ in 0..r.u64()? {
            let name = r
                .ids()?
                .into_iter()
                .map(|b| u8::try_from(b).map_err(|_| format!("a column name byte {b}")))
                .collect::<std::result::Result<Vec<u8>, String>>()?;
            let name = String::from_utf8(name).map_err(|e| format!("a column name: {e}"))?;
            let value = match r.take(1)?[0] {
                0 => Column::Ids(r.ids()?),
                1 => Column::Float(f64::from_bits(r.u64()?)),
                2 => {
                    let shape = r.ids()?;
                    let n = r.u64()? as usize;
                    let bytes = r.take(n.checked_mul(4).ok_or("a float array's length")?)?;
                    let values = bytes
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect();
                    Column::Floats { shape, values }
                }
                t => return Err(format!("bad column tag {t}")),
            };
            columns.insert(name, value);
        }
        rows.push(Feature {
            input_ids,
            token_type_ids,
            attention_mask,
            special_tokens_mask,
            offset_mapping,
            labels,
            start_positions,
            end_positions,
            seq_lengths,
            columns,
        });
    }
    if r.at != body.len() {
        return Err(format!(
            "{} bytes left after the last row",
            body.len() - r.at
        ));
    }
    Ok(rows)
}

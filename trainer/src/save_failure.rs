//! Write failures during a checkpoint save: the disk full, a file-size limit
//! (`RLIMIT_FSIZE`), a read-only folder or file system, a file or folder removed while the
//! save runs.
//!
//! A checkpoint is written into `tmp-checkpoint-{step}/` and renamed only when complete
//! (see `checkpoint.rs`), so a failed save never touches the previous checkpoint. On a
//! failure the partial folder is removed (giving its space back) and the save returns
//! [`Error::CheckpointSave`]: the file that failed, why, the space a checkpoint needs (the
//! size of the previous complete one) against what the file system has free, and that the
//! previous checkpoint is the newest complete one. The training then stops with that error
//! (upstream's Trainer stops at the `OSError` too): continuing would train on past the last
//! state that can be resumed, and the next save would most likely fail the same way. Resume
//! from the previous checkpoint once space is freed or the limit raised.
//!
//! A process over its file-size limit gets `SIGXFSZ`, which kills it by default; the
//! Trainer catches it (as CPython ignores it at start-up), so the write fails with `EFBIG`
//! instead and the failure is reported as above.

use std::path::{Path, PathBuf};
use std::sync::Once;
use std::sync::atomic::AtomicBool;

use crate::error::Error;

/// Why a checkpoint could not be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaveFailureKind {
    /// No space left on the file system (`ENOSPC`, or a quota: `EDQUOT`).
    DiskFull,
    /// A file would pass the process's file-size limit (`EFBIG`, `ulimit -f`).
    FileTooLarge,
    /// The folder or its file system is read-only (`EROFS`, `EACCES`, `EPERM`).
    ReadOnly,
    /// A file or folder of the save disappeared while it was written (`ENOENT`).
    Removed,
    /// Any other write error.
    Other,
}

impl std::fmt::Display for SaveFailureKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::DiskFull => "the disk is full",
            Self::FileTooLarge => "a file passed the file-size limit",
            Self::ReadOnly => "the folder is read-only",
            Self::Removed => "a file or folder was removed while it was written",
            Self::Other => "a write failed",
        })
    }
}

/// A failed checkpoint save ([`Error::CheckpointSave`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaveFailure {
    /// The checkpoint folder that was being written (`checkpoint-{step}`).
    pub checkpoint: PathBuf,
    /// The file (or folder) whose write failed, when known.
    pub file: Option<PathBuf>,
    /// Why.
    pub kind: SaveFailureKind,
    /// The space a checkpoint takes (the previous complete one's size), when known.
    pub needed_bytes: Option<u64>,
    /// The space free on the output folder's file system after the partial save was
    /// removed.
    pub available_bytes: Option<u64>,
    /// The process's file-size limit, for [`SaveFailureKind::FileTooLarge`].
    pub file_size_limit: Option<u64>,
    /// The newest complete checkpoint, untouched.
    pub previous: Option<PathBuf>,
}

impl std::fmt::Display for SaveFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "saving {} failed: {}",
            self.checkpoint.display(),
            self.kind
        )?;
        if let Some(file) = &self.file {
            write!(f, " writing {}", file.display())?;
        }
        f.write_str(&space_note(
            self.kind,
            self.needed_bytes,
            self.available_bytes,
            self.file_size_limit,
        ))?;
        match &self.previous {
            Some(p) => write!(
                f,
                "; the partial save was removed and {} is the newest complete checkpoint: free space or fix the folder, then resume from it",
                p.display()
            ),
            None => f.write_str(
                "; the partial save was removed and there is no earlier checkpoint: free space or fix the folder, then train again",
            ),
        }
    }
}

/// Catches `SIGXFSZ` for the rest of the process (once), so that a write past the
/// file-size limit fails with `EFBIG` instead of killing the process.
pub(crate) fn catch_file_size_signal() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let seen = std::sync::Arc::new(AtomicBool::new(false));
        if let Err(e) = signal_hook::flag::register(signal_hook::consts::SIGXFSZ, seen) {
            log::warn!(
                "could not catch SIGXFSZ ({e}): a save past the file-size limit will kill the process"
            );
        }
    });
}

/// The first I/O error in `err`'s chain of sources.
fn io_error_in<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a std::io::Error> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return Some(io);
        }
        next = e.source();
    }
    None
}

/// The kind of an I/O error, by its OS error code where there is one.
fn kind_of(io: &std::io::Error) -> SaveFailureKind {
    use nix::errno::Errno;
    match io.raw_os_error().map(Errno::from_raw) {
        Some(Errno::ENOSPC | Errno::EDQUOT) => SaveFailureKind::DiskFull,
        Some(Errno::EFBIG) => SaveFailureKind::FileTooLarge,
        Some(Errno::EROFS | Errno::EACCES | Errno::EPERM) => SaveFailureKind::ReadOnly,
        Some(Errno::ENOENT) => SaveFailureKind::Removed,
        _ => match io.kind() {
            std::io::ErrorKind::StorageFull => SaveFailureKind::DiskFull,
            std::io::ErrorKind::FileTooLarge => SaveFailureKind::FileTooLarge,
            std::io::ErrorKind::ReadOnlyFilesystem | std::io::ErrorKind::PermissionDenied => {
                SaveFailureKind::ReadOnly
            }
            std::io::ErrorKind::NotFound => SaveFailureKind::Removed,
            _ => SaveFailureKind::Other,
        },
    }
}

/// The kind of a failure whose chain holds no I/O error (a lower crate kept only the
/// message): read from the message, else from the file system's state.
fn kind_from_state(message: &str, dir: &Path) -> SaveFailureKind {
    let m = message.to_ascii_lowercase();
    if m.contains("no space left") || m.contains("quota") {
        SaveFailureKind::DiskFull
    } else if m.contains("file too large") {
        SaveFailureKind::FileTooLarge
    } else if m.contains("read-only") || m.contains("permission denied") {
        SaveFailureKind::ReadOnly
    } else if m.contains("no such file") {
        SaveFailureKind::Removed
    } else if available_bytes(dir) == Some(0) {
        SaveFailureKind::DiskFull
    } else {
        SaveFailureKind::Other
    }
}

/// The first path an error message names inside `tmp` (the file that failed), if any.
fn file_named(message: &str, tmp: &Path) -> Option<PathBuf> {
    let tmp = tmp.display().to_string();
    let at = message.find(&tmp)?;
    let rest = &message[at..];
    let end = rest
        .find(|c: char| c == ':' || c == '\'' || c == '"' || c == ',' || c.is_whitespace())
        .unwrap_or(rest.len());
    Some(PathBuf::from(&rest[..end]))
}

/// Bytes free for an unprivileged user on the file system holding `dir` (or its nearest
/// existing parent).
pub(crate) fn available_bytes(dir: &Path) -> Option<u64> {
    let existing = dir.ancestors().find(|p| p.exists())?;
    let s = nix::sys::statvfs::statvfs(existing).ok()?;
    Some(s.blocks_available() as u64 * s.fragment_size() as u64)
}

/// The process's file-size limit (the soft `RLIMIT_FSIZE`), when there is one.
fn file_size_limit() -> Option<u64> {
    use nix::sys::resource::{Resource, getrlimit};
    let (soft, _) = getrlimit(Resource::RLIMIT_FSIZE).ok()?;
    (soft != nix::sys::resource::RLIM_INFINITY).then_some(soft)
}

/// Bytes under `path` (files, recursively).
pub(crate) fn size_of(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.len();
    }
    std::fs::read_dir(path)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| size_of(&e.path()))
        .sum()
}

/// The failed save of `checkpoint` (written into `tmp`): removes `tmp` and returns the
/// typed error (see the module docs). `previous` is the newest complete checkpoint, if any.
pub(crate) fn failed_save(
    err: Error,
    checkpoint: &Path,
    tmp: &Path,
    previous: Option<PathBuf>,
) -> Error {
    // Errors that are not about writing (a collective, a bad state) pass through.
    let message = err.to_string();
    let io = io_error_in(&err);
    let kind = match io {
        Some(io) => kind_of(io),
        None => kind_from_state(&message, checkpoint),
    };
    if io.is_none() && kind == SaveFailureKind::Other {
        remove_partial(tmp);
        return err;
    }
    let file = match &err {
        Error::Io { path, .. } => Some(path.clone()),
        _ => file_named(&message, tmp),
    }
    .map(|f| match f.strip_prefix(tmp) {
        // The temporary folder itself could not be made: its parent is what failed.
        Ok(rel) if rel.as_os_str().is_empty() => tmp.parent().unwrap_or(tmp).to_path_buf(),
        // Named under its final folder: the temporary one is gone.
        Ok(rel) => checkpoint.join(rel),
        Err(_) => f,
    });
    remove_partial(tmp);
    let run_dir = checkpoint.parent().unwrap_or(checkpoint);
    Error::CheckpointSave {
        failure: Box::new(SaveFailure {
            checkpoint: checkpoint.to_path_buf(),
            file,
            kind,
            needed_bytes: previous.as_deref().map(size_of).filter(|n| *n > 0),
            available_bytes: available_bytes(run_dir),
            file_size_limit: (kind == SaveFailureKind::FileTooLarge)
                .then(file_size_limit)
                .flatten(),
            previous,
        }),
        source: Box::new(err),
    }
}

/// Removes the partial checkpoint folder (logged when that fails too).
fn remove_partial(tmp: &Path) {
    if tmp.exists()
        && let Err(e) = std::fs::remove_dir_all(tmp)
    {
        log::warn!(
            "could not remove the partial checkpoint {}: {e}",
            tmp.display()
        );
    }
}

/// What a [`SaveFailure`] says about space: needed against free, or the limit.
fn space_note(
    kind: SaveFailureKind,
    needed: Option<u64>,
    available: Option<u64>,
    limit: Option<u64>,
) -> String {
    let mb = |b: u64| format!("{:.1} MB", b as f64 / 1e6);
    match kind {
        SaveFailureKind::FileTooLarge => match (limit, needed) {
            (Some(l), Some(n)) => format!(
                " (the file-size limit is {}; a checkpoint takes about {} in all)",
                mb(l),
                mb(n)
            ),
            (Some(l), None) => format!(" (the file-size limit is {})", mb(l)),
            _ => String::new(),
        },
        SaveFailureKind::ReadOnly | SaveFailureKind::Removed => String::new(),
        _ => match (needed, available) {
            (Some(n), Some(a)) => format!(
                " (a checkpoint needs about {}, the size of the previous one; {} free)",
                mb(n),
                mb(a)
            ),
            (None, Some(a)) => format!(" ({} free)", mb(a)),
            _ => String::new(),
        },
    }
}

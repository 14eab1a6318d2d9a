//! `tchtrain-testing` — what the tests of every tchtrain crate share (upstream's
//! `testing_utils.py`): where the offline assets and the reference values are, the lock
//! that serialises tests using libtorch's process-global generator, scratch folders that
//! remove themselves, a local Hugging Face hub ([`HubServer`]) serving model and dataset
//! repositories on 127.0.0.1, and a stand-in W&B server ([`WandbStandIn`]).
//!
//! Each crate's integration tests are one binary (`tests/it/main.rs` with a module per
//! topic), so its tests share one process: every test that seeds or draws from the global
//! generator (`tch::manual_seed`, dropout, a model's initialisation, an unseeded collator)
//! takes [`lock`] for its whole run.

mod hub_server;
mod log_history;
mod wandb_server;

pub use hub_server::{HubRequest, HubServer, HubServerBuilder, ServedRevision};
pub use log_history::{MaxRel, assert_exact, compare, compare_within, rel};
pub use wandb_server::WandbStandIn;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// The offline assets folder: `$TCHTRAIN_ASSETS` (set by `cargo xtask test`), else
/// `assets/` at the workspace root (the link `cargo xtask setup` makes).
pub fn assets() -> PathBuf {
    std::env::var_os("TCHTRAIN_ASSETS").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets"),
        PathBuf::from,
    )
}

/// An asset's path as a string (for command-line style arguments).
pub fn asset(relative: &str) -> String {
    assets().join(relative).display().to_string()
}

/// The outputs of `scripts/reference/<script>.py`.
pub fn reference_dir(script: &str) -> PathBuf {
    assets().join("reference").join(script)
}

static GENERATOR: Mutex<()> = Mutex::new(());

/// Serialises the tests of this process that use libtorch's global generator (or anything
/// else process-wide: the allocator, the current directory). A test that panicked while
/// holding it does not poison the others.
pub fn lock() -> MutexGuard<'static, ()> {
    GENERATOR.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fresh, empty folder `tchtrain-<name>-<pid>` under the temporary folder (`TMPDIR`,
/// which `cargo xtask test` points into `target/`). Removed when the guard drops, unless
/// the test is failing (a panic in progress), so that what it wrote can be looked at.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates the folder (emptied first if a previous run left it).
    pub fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("tchtrain-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        Self { path }
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// [`TempDir::new`].
pub fn temp_dir(name: &str) -> TempDir {
    TempDir::new(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_temp_dir_is_fresh_and_removed_on_drop() {
        let path = {
            let d = temp_dir("testing-self");
            std::fs::write(d.join("f"), b"x").unwrap();
            assert!(d.join("f").is_file());
            d.path().to_path_buf()
        };
        assert!(!path.exists());
        let d = temp_dir("testing-self");
        assert_eq!(std::fs::read_dir(&*d).unwrap().count(), 0);
    }
}

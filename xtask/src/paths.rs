//! Where things live: the workspace root, the per-user cache, the virtualenv.

use std::path::{Path, PathBuf};

/// torch version tch 0.26 is built for; the virtualenv folder is keyed by it.
pub const TORCH_VERSION: &str = "2.13.0";

/// Workspace root (the parent of `xtask/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// Cargo's build folder: `CARGO_TARGET_DIR`, else `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// Per-user cache folder shared by every clone: `$TCHTRAIN_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/tchtrain`, else `~/.cache/tchtrain`.
pub fn cache_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("TCHTRAIN_CACHE_DIR") {
        return Ok(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(dir).join("tchtrain"));
    }
    match std::env::var_os("HOME") {
        Some(home) => Ok(PathBuf::from(home).join(".cache").join("tchtrain")),
        None => Err(
            "neither TCHTRAIN_CACHE_DIR, XDG_CACHE_HOME nor HOME is set: \
                     set TCHTRAIN_CACHE_DIR to a writable folder"
                .into(),
        ),
    }
}

/// The virtualenv holding torch, transformers and friends.
pub fn venv_dir(cache: &Path) -> PathBuf {
    cache.join(format!("venv-torch-{TORCH_VERSION}"))
}

/// The virtualenv's python.
pub fn venv_python(venv: &Path) -> PathBuf {
    venv.join("bin").join("python")
}

/// The offline assets (shared by clones; `<root>/assets` links here).
pub fn assets_cache(cache: &Path) -> PathBuf {
    cache.join("assets")
}

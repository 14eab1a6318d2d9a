//! Keeping runs from filling the disk: a scratch `TMPDIR` per command (tests and fuzz
//! targets write checkpoints and scratch files to the system temporary folder), a free-space
//! check before a long build, and pruning of this workspace's stale artifacts from the fuzz
//! build folder that every clone shares.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

/// Free space below which `cargo xtask test` warns before it builds: a clean clone's
/// `target/` grows to about 8 GB (tests, the `cuda` build, the demo), the fuzz build adds
/// about 2 GB and the tests write about 2 GB of checkpoints.
pub const TEST_NEEDS_BYTES: u64 = 14 << 30;

/// A fresh, empty `target/xtask-tmp/<name>` to hand to children as `TMPDIR`: whatever a
/// previous (killed) run left there is removed first.
pub fn scratch_dir(name: &str) -> Result<PathBuf, String> {
    let dir = crate::paths::workspace_root()
        .join("target")
        .join("xtask-tmp")
        .join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .map_err(|e| format!("cannot empty the scratch folder {}: {e}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir)
        .map_err(|e| format!("cannot create the scratch folder {}: {e}", dir.display()))?;
    Ok(dir)
}

/// Bytes free for an unprivileged user on the file system holding `path` (`df -Pk`);
/// `None` when `df` is missing or its output is not understood.
pub fn free_bytes(path: &Path) -> Option<u64> {
    let out = Command::new("df").arg("-Pk").arg(path).output().ok()?;
    if !out.status.success() {
        return None;
    }
    parse_df_available(&String::from_utf8_lossy(&out.stdout))
}

/// The `Available` column (KiB) of `df -P`'s data line, in bytes.
fn parse_df_available(text: &str) -> Option<u64> {
    let line = text.lines().nth(1)?;
    let kib: u64 = line.split_whitespace().nth(3)?.parse().ok()?;
    Some(kib * 1024)
}

/// A warning when the file system holding `path` has less than `need` bytes free, naming
/// what to delete; `None` when there is room (or `df` cannot tell).
pub fn low_space_warning(path: &Path, need: u64) -> Option<String> {
    let free = free_bytes(path)?;
    (free < need).then(|| {
        format!(
            "only {:.1} GB free on the file system of {} (a full run needs about {:.0} GB): \
             free some space first (`cargo clean` in old clones, stale folders under /tmp), \
             or the build may stop with `No space left on device`",
            free as f64 / 1e9,
            path.display(),
            need as f64 / 1e9
        )
    })
}

/// Removes, from a profile's `deps` folder of a cargo build folder, the artifacts of crates
/// named by `ours` that an earlier build left behind: a crate of this workspace gets a new
/// hash for each clone path and each change, so a build folder shared by clones keeps a full
/// set of old libraries and binaries (about 2 GB for the fuzz targets) per run unless they
/// are removed. Only crates rebuilt since `since` are touched, and of those only the hashes
/// not written since then; other crates (registry dependencies, which keep their hashes) are
/// left alone. `build/` and `.fingerprint/` are not touched: they are small, and a build
/// script's compiled binary keeps its hash while its output is rewritten. Returns the bytes
/// freed.
pub fn prune_stale(deps: &Path, ours: &dyn Fn(&str) -> bool, since: SystemTime) -> u64 {
    let dir = deps;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    // crate → hash → (entries, written since `since`)
    let mut crates: BTreeMap<String, BTreeMap<String, (Vec<PathBuf>, bool)>> = BTreeMap::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let Some((krate, hash)) = artifact_key(&entry.file_name().to_string_lossy()) else {
            continue;
        };
        if !ours(&krate) {
            continue;
        }
        let fresh = newest_mtime(&path).is_some_and(|t| t >= since);
        let slot = crates.entry(krate).or_default().entry(hash).or_default();
        slot.0.push(path);
        slot.1 |= fresh;
    }
    let mut freed = 0;
    for hashes in crates.values() {
        let rebuilt: BTreeSet<&String> = hashes
            .iter()
            .filter(|(_, (_, fresh))| *fresh)
            .map(|(h, _)| h)
            .collect();
        if rebuilt.is_empty() {
            continue;
        }
        for (hash, (paths, _)) in hashes {
            if rebuilt.contains(hash) {
                continue;
            }
            for p in paths {
                let size = size_of(p);
                let removed = if p.is_dir() {
                    std::fs::remove_dir_all(p)
                } else {
                    std::fs::remove_file(p)
                };
                if removed.is_ok() {
                    freed += size;
                }
            }
        }
    }
    freed
}

/// `(crate, hash)` of a `deps` entry: `libtchtrain_trainer-0123456789abcdef.rlib` →
/// `("tchtrain_trainer", "0123456789abcdef")`.
fn artifact_key(name: &str) -> Option<(String, String)> {
    let stem = name.split('.').next()?;
    let (krate, hash) = stem.rsplit_once('-')?;
    if hash.len() != 16 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let krate = krate.strip_prefix("lib").unwrap_or(krate);
    Some((krate.to_string(), hash.to_string()))
}

/// The newest modification time of a file, or of a folder and its direct entries.
fn newest_mtime(path: &Path) -> Option<SystemTime> {
    let own = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let children = std::fs::read_dir(path).into_iter().flatten().flatten();
    children
        .filter_map(|e| e.metadata().and_then(|m| m.modified()).ok())
        .chain(own)
        .max()
}

/// Bytes under `path` (a file or a folder, recursively; links not followed).
pub fn size_of(path: &Path) -> u64 {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn reads_df_available_column() {
        let text = "Filesystem 1024-blocks Used Available Capacity Mounted on\n\
                    /dev/vda 263174212 91225260 4887388 95% /\n";
        assert_eq!(parse_df_available(text), Some(4_887_388 * 1024));
        assert_eq!(parse_df_available("Filesystem\n"), None);
    }

    #[test]
    fn keys_of_build_folder_entries() {
        let k = |n: &str| artifact_key(n).map(|(c, h)| format!("{c} {h}"));
        assert_eq!(
            k("libtchtrain_trainer-0123456789abcdef.rlib").as_deref(),
            Some("tchtrain_trainer 0123456789abcdef")
        );
        assert_eq!(
            k("config_json-fedcba9876543210.d").as_deref(),
            Some("config_json fedcba9876543210")
        );
        // The hard-linked copies at the profile's top (`config_json`) carry no hash.
        assert_eq!(k("config_json"), None);
        assert_eq!(k("serde-1.0.0"), None);
    }

    #[test]
    fn prunes_only_old_hashes_of_rebuilt_crates_of_ours() {
        let root = std::env::temp_dir().join(format!("xtask-prune-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let deps = root.join("release").join("deps");
        std::fs::create_dir_all(&deps).unwrap();
        let write = |p: &Path, bytes: usize| {
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, vec![0u8; bytes]).unwrap();
        };
        // Before the build: two old hashes of our crate, one registry crate, one crate of
        // ours that this build did not touch.
        write(&deps.join("libtchtrain_models-aaaaaaaaaaaaaaaa.rlib"), 100);
        write(&deps.join("libtchtrain_models-aaaaaaaaaaaaaaaa.rmeta"), 10);
        write(&deps.join("libtchtrain_models-bbbbbbbbbbbbbbbb.rlib"), 100);
        write(&deps.join("libserde-cccccccccccccccc.rlib"), 100);
        write(&deps.join("libserde-dddddddddddddddd.rlib"), 100);
        write(&deps.join("libtchtrain_losses-eeeeeeeeeeeeeeee.rlib"), 100);
        std::thread::sleep(Duration::from_millis(20));
        let since = SystemTime::now();
        std::thread::sleep(Duration::from_millis(20));
        // The build: a new hash of the models crate; serde rebuilt too (it is not ours, so
        // its old hashes stay).
        write(&deps.join("libtchtrain_models-1111111111111111.rlib"), 100);
        write(&deps.join("libserde-2222222222222222.rlib"), 100);

        let ours = |c: &str| c.starts_with("tchtrain");
        let freed = prune_stale(&deps, &ours, since);
        assert_eq!(freed, 100 + 10 + 100);
        let left: BTreeSet<String> = std::fs::read_dir(&deps)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let expected: BTreeSet<String> = [
            "libtchtrain_models-1111111111111111.rlib",
            "libserde-cccccccccccccccc.rlib",
            "libserde-dddddddddddddddd.rlib",
            "libserde-2222222222222222.rlib",
            "libtchtrain_losses-eeeeeeeeeeeeeeee.rlib",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        assert_eq!(left, expected);
        std::fs::remove_dir_all(&root).unwrap();
    }
}

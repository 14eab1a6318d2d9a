//! `cargo xtask clean-cache`: what the project keeps in the per-user cache folder
//! ([`paths::cache_dir`]) and in the system temporary folder, with sizes, and clearing of
//! the parts named.
//!
//! Without arguments it lists; `clean-cache NAME...` removes those parts (their names as
//! listed), `--all` every part the project owns. A folder of the cache the project does not
//! know is listed as such and never removed. `tmp` stands for the `tchtrain-*` folders tests
//! and examples leave in the temporary folder when killed: only those whose process (the
//! number ending the name) is gone.

use std::path::{Path, PathBuf};

use crate::disk;
use crate::paths;

/// One part of what the project keeps.
struct Part {
    name: String,
    what: &'static str,
    paths: Vec<PathBuf>,
}

/// What a cache folder entry named `name` is, if the project made it.
fn describe(name: &str) -> Option<&'static str> {
    Some(match name {
        n if n.starts_with("venv-torch-") => {
            "the Python virtualenv (torch, transformers, reference packages); `cargo xtask setup` rebuilds it"
        }
        "assets" => {
            "offline assets and reference values; `cargo xtask setup` fetches and regenerates them"
        }
        "datasets" => {
            "tokenized-dataset cache, capped by TCHTRAIN_DATASETS_CACHE_MB (default 4096)"
        }
        "fuzz-target" => {
            "the fuzz targets' build folder, capped by TCHTRAIN_FUZZ_BUILD_MB (default 16384)"
        }
        n if n.starts_with("cargo-fuzz-") => "the cargo-fuzz install `cargo xtask fuzz` uses",
        "gpu-bundle" => {
            "`cargo xtask gpu-bundle`'s libtorch of the GPU machine's torch, tch's C++ built against it, its release build"
        }
        _ => return None,
    })
}

/// Whether a process with this id is alive (`/proc/<pid>` exists, or `kill -0` succeeds).
fn alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
        || std::process::Command::new("kill")
            .args(["-0", &pid.to_string()])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
}

/// The `tchtrain-*` folders of the temporary folder whose process is gone.
fn stale_temp_folders() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = name
                .strip_prefix("tchtrain-")?
                .rsplit('-')
                .next()?
                .parse::<u32>()
                .ok()?;
            (!alive(pid)).then(|| e.path())
        })
        .collect();
    out.sort();
    out
}

/// Every part, the cache folder's entries by name, then `tmp`; unknown entries last.
fn parts(cache: &Path) -> (Vec<Part>, Vec<PathBuf>) {
    let mut known = Vec::new();
    let mut unknown = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(cache)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        match describe(&name) {
            Some(what) => known.push(Part {
                name,
                what,
                paths: vec![path],
            }),
            None => unknown.push(path),
        }
    }
    known.push(Part {
        name: "tmp".into(),
        what: "`tchtrain-*` folders in the temporary folder left by killed tests and examples",
        paths: stale_temp_folders(),
    });
    (known, unknown)
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// `cargo xtask clean-cache [--all] [NAME...]`.
pub fn run(args: &[String]) -> Result<(), String> {
    let cache = paths::cache_dir()?;
    let (known, unknown) = parts(&cache);
    let all = args.iter().any(|a| a == "--all");
    let named: Vec<&String> = args.iter().filter(|a| *a != "--all").collect();
    for n in &named {
        if n.starts_with('-') {
            return Err(format!(
                "clean-cache: unknown option `{n}` (options: --all, or the names listed)"
            ));
        }
        if !known.iter().any(|p| &p.name == *n) {
            let names: Vec<&str> = known.iter().map(|p| p.name.as_str()).collect();
            return Err(format!(
                "clean-cache: `{n}` is not a part of the cache; known parts: {}",
                names.join(", ")
            ));
        }
    }
    if !all && named.is_empty() {
        println!("{}:", cache.display());
        let mut total = 0;
        for p in &known {
            let size: u64 = p.paths.iter().map(|q| disk::size_of(q)).sum();
            total += size;
            let count = if p.name == "tmp" {
                format!(" ({} folders)", p.paths.len())
            } else {
                String::new()
            };
            println!("  {:<22} {:>10}{count}  {}", p.name, gib(size), p.what);
        }
        for u in &unknown {
            println!(
                "  {:<22} {:>10}  not the project's: left alone",
                u.file_name().unwrap_or_default().to_string_lossy(),
                gib(disk::size_of(u))
            );
        }
        println!(
            "  total {}; `cargo xtask clean-cache NAME...` or `--all` clears",
            gib(total)
        );
        return Ok(());
    }
    let mut freed = 0;
    for p in known.iter().filter(|p| all || named.contains(&&p.name)) {
        for path in &p.paths {
            let size = disk::size_of(path);
            let removed = if path.is_dir() {
                std::fs::remove_dir_all(path)
            } else {
                std::fs::remove_file(path)
            };
            removed.map_err(|e| format!("clean-cache: cannot remove {}: {e}", path.display()))?;
            freed += size;
            println!("clean-cache: removed {} ({})", path.display(), gib(size));
        }
    }
    println!("clean-cache: freed {}", gib(freed));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_project_s_parts_are_named_and_others_left_alone() {
        let cache = std::env::temp_dir().join(format!("xtask-clean-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&cache);
        for d in [
            "venv-torch-2.13.0",
            "assets",
            "datasets",
            "fuzz-target",
            "cargo-fuzz-0.13.2",
            "gpu-bundle",
            "mine",
        ] {
            std::fs::create_dir_all(cache.join(d)).unwrap();
        }
        let (known, unknown) = parts(&cache);
        let names: Vec<&str> = known.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "assets",
                "cargo-fuzz-0.13.2",
                "datasets",
                "fuzz-target",
                "gpu-bundle",
                "venv-torch-2.13.0",
                "tmp"
            ]
        );
        assert_eq!(unknown, [cache.join("mine")]);
        assert!(!alive(u32::MAX - 1));
        assert!(alive(std::process::id()));
        std::fs::remove_dir_all(&cache).unwrap();
    }
}

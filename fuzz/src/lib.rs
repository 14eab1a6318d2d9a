//! Helpers shared by the fuzz targets: parsers that take a path get the input through a
//! scratch file, and text parsers get it as UTF-8.

use std::path::PathBuf;

/// The input as text, or `None` when it is not UTF-8 (every text parser takes `&str`).
pub fn text(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}

/// Writes `data` to `name` in a folder of this process's own (under the system temporary
/// folder) and returns the path, for the parsers whose public entry point reads a file.
pub fn scratch_file(name: &str, data: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tchtrain-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("creating the fuzz scratch folder");
    let path = dir.join(name);
    std::fs::write(&path, data).expect("writing the fuzz scratch file");
    path
}

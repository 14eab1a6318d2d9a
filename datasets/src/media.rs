//! What `datasets`' media features (`Image`, `Audio`) share: a cell `{"bytes": ..., "path":
//! ...}` (the bytes embedded, else the file) or a path.

use std::path::{Path, PathBuf};

/// Where a media cell's file is.
pub(crate) enum CellBytes {
    /// The embedded bytes.
    Bytes(Vec<u8>),
    /// The file to read (made absolute against the dataset's folder).
    Path(PathBuf),
}

/// The bytes of a `{"bytes": ..., "path": ...}` cell (its bytes as a list of byte values,
/// when present; else the file at `path`, relative to `base_dir` when not absolute), or a
/// path cell. `feature` names the feature in the error (a message to wrap).
pub(crate) fn cell_bytes(
    cell: &serde_json::Value,
    base_dir: Option<&Path>,
    feature: &str,
) -> std::result::Result<CellBytes, String> {
    use serde_json::Value;
    let path = match cell {
        Value::String(p) => Some(p.as_str()),
        Value::Object(o) => {
            if let Some(Value::Array(bytes)) = o.get("bytes") {
                let bytes = bytes
                    .iter()
                    .map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
                    .collect::<Option<Vec<u8>>>()
                    .ok_or_else(|| "`bytes` is not a list of byte values".to_string())?;
                return Ok(CellBytes::Bytes(bytes));
            }
            o.get("path").and_then(Value::as_str)
        }
        _ => None,
    };
    let path = path.ok_or_else(|| {
        format!(
            "an {feature} cell is {{\"bytes\": ..., \"path\": ...}} or a path, and this one has neither"
        )
    })?;
    let path = Path::new(path);
    Ok(CellBytes::Path(match base_dir {
        Some(base) if path.is_relative() => base.join(path),
        _ => path.to_path_buf(),
    }))
}

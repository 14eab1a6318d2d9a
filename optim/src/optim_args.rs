//! `optim_args` parsing, as upstream `trainer_optimizer._parse_optim_args`: a comma-separated
//! list of `key=value` (spaces removed), values kept as strings for each optimizer to read.

use std::collections::BTreeMap;

use crate::{Error, Result};

/// Parses `TrainingArguments.optim_args` (`"momentum=0.9, nesterov=True"`) into a map.
/// `None` or an empty string give an empty map; an entry without exactly one `=` is
/// [`Error::InvalidOptimArgs`] (upstream's tuple unpacking fails the same way).
///
/// ```
/// let args = tchtrain_optim::parse_optim_args(Some("momentum=0.9, nesterov=True"))?;
/// assert_eq!(args["momentum"], "0.9");
/// assert_eq!(args["nesterov"], "True");
/// # Ok::<(), tchtrain_optim::Error>(())
/// ```
pub fn parse_optim_args(optim_args: Option<&str>) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let Some(s) = optim_args.filter(|s| !s.is_empty()) else {
        return Ok(out);
    };
    let s = s.replace(' ', "");
    for mapping in s.split(',') {
        let mut parts = mapping.split('=');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(k), Some(v), None) => {
                out.insert(k.to_string(), v.to_string());
            }
            _ => {
                return Err(Error::InvalidOptimArgs {
                    entry: mapping.to_string(),
                });
            }
        }
    }
    Ok(out)
}

/// Reads `key` as a float (Python `float(value)`), if present.
pub(crate) fn float_arg(args: &BTreeMap<String, String>, key: &str) -> Result<Option<f64>> {
    args.get(key)
        .map(|v| {
            parse_python_float(v).ok_or_else(|| Error::InvalidOptimArgValue {
                key: key.into(),
                value: v.clone(),
                expected: "a float",
            })
        })
        .transpose()
}

/// Reads `key` as upstream's boolean (`value.lower() in ("true", "1", "yes")`), if present.
pub(crate) fn bool_arg(args: &BTreeMap<String, String>, key: &str) -> Option<bool> {
    args.get(key)
        .map(|v| matches!(v.to_lowercase().as_str(), "true" | "1" | "yes"))
}

/// Python's `float(str)` for the forms it accepts that Rust's parser does not (`inf`,
/// `Infinity`, `nan`, underscores between digits).
fn parse_python_float(s: &str) -> Option<f64> {
    let t = s.trim();
    if let Ok(v) = t.parse::<f64>() {
        return Some(v);
    }
    let cleaned: String = t.chars().filter(|&c| c != '_').collect();
    cleaned.parse::<f64>().ok()
}

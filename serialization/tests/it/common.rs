//! What the tests share: where `scripts/reference/torch_pickles.py` put its files, the
//! comparison of a [`Value`] with the JSON that script writes for a Python object (the same
//! encoding for files Python wrote and files Rust wrote), and running that script with the
//! pinned venv's python.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value as Json;
use tchtrain_serialization::{Storage, Tensor, Value};

/// A file of `scripts/reference/torch_pickles.py`'s output (`trainer/optimizer.pt`).
pub fn reference(relative: &str) -> PathBuf {
    tchtrain_testing::reference_dir("torch_pickles").join(relative)
}

/// Every checkpoint the reference script wrote, as paths relative to its folder.
pub const REFERENCE_FILES: [&str; 14] = [
    "trainer/optimizer.pt",
    "trainer/scheduler.pt",
    "trainer/rng_state.pth",
    "trainer/scaler.pt",
    "trainer/training_args.bin",
    "extra/adamw_foreach.pt",
    "extra/adamw_fused.pt",
    "extra/sgd_momentum.pt",
    "extra/adafactor.pt",
    "extra/lambda_lr.pt",
    "extra/grad_scaler.pt",
    "extra/training_args_variant.bin",
    "extra/values.pt",
    "extra/python_values.bin",
];

/// The JSON the script wrote beside `path`.
pub fn description(path: &Path) -> Result<Json> {
    let json_path = PathBuf::from(format!("{}.json", path.display()));
    let text = std::fs::read_to_string(&json_path)
        .with_context(|| format!("reading {}", json_path.display()))?;
    Ok(serde_json::from_str(&text)?)
}

/// Runs `torch_pickles.py --describe [--resave DIR] FILES` with `TCHTRAIN_VENV_PYTHON`.
pub fn python_describe(files: &[PathBuf], resave: Option<&Path>) -> Result<()> {
    let python = std::env::var("TCHTRAIN_VENV_PYTHON").context(
        "TCHTRAIN_VENV_PYTHON is not set: run `cargo xtask setup` (it writes .cargo/libtorch.toml)",
    )?;
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/reference/torch_pickles.py");
    let mut c = Command::new(python);
    c.arg(script).arg("--describe");
    if let Some(dir) = resave {
        c.arg("--resave").arg(dir);
    }
    c.args(files).env("OMP_NUM_THREADS", "2");
    let out = c.output().context("running the venv python")?;
    ensure!(
        out.status.success(),
        "torch_pickles.py --describe failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Asserts that `value` is what `expected` (the script's JSON of a Python object) describes;
/// the error names the path to the first difference.
pub fn assert_matches(value: &Value, expected: &Json, what: &str) -> Result<()> {
    Matcher::default().check(value, expected, what)
}

#[derive(Default)]
struct Matcher {
    /// Storages numbered in the order they are met, as the script numbers them.
    storages: HashMap<*const Storage, u64>,
}

fn tag<'a>(json: &'a Json, key: &str) -> Option<&'a Json> {
    json.as_object()
        .filter(|o| o.len() == 1)
        .and_then(|o| o.get(key))
}

fn float_matches(actual: f64, expected: &Json) -> bool {
    let Some(text) = expected.as_str() else {
        return false;
    };
    let e: f64 = match text.parse() {
        Ok(e) => e,
        Err(_) => return false,
    };
    (actual.is_nan() && e.is_nan()) || actual.to_bits() == e.to_bits()
}

/// Two's-complement little-endian bytes as a decimal string (up to 128 bits).
fn bigint_text(bytes: &[u8]) -> Option<String> {
    if bytes.len() > 16 {
        return None;
    }
    let fill = if bytes.last()? & 0x80 != 0 { 0xff } else { 0 };
    let mut full = [fill; 16];
    full[..bytes.len()].copy_from_slice(bytes);
    Some(i128::from_le_bytes(full).to_string())
}

impl Matcher {
    fn check(&mut self, value: &Value, expected: &Json, at: &str) -> Result<()> {
        let mismatch = || anyhow::anyhow!("{at}: expected {expected}, got {value:?}");
        match (value, expected) {
            (Value::None, Json::Null) => Ok(()),
            (Value::Bool(a), Json::Bool(b)) if a == b => Ok(()),
            (Value::Int(a), Json::Number(n)) if n.as_i64() == Some(*a) => Ok(()),
            (Value::Str(a), Json::String(b)) if a == b => Ok(()),
            (Value::List(items), Json::Array(expected)) => self.seq(items, expected, at),
            (Value::BigInt(bytes), e) if tag(e, "bigint").is_some() => {
                ensure!(
                    bigint_text(bytes).as_deref() == tag(e, "bigint").and_then(Json::as_str),
                    mismatch()
                );
                Ok(())
            }
            (Value::Float(f), e) if tag(e, "float").is_some() => {
                ensure!(float_matches(*f, &e["float"]), mismatch());
                Ok(())
            }
            (Value::Bytes(b), e) if tag(e, "bytes").is_some() => {
                ensure!(Some(hex(b).as_str()) == e["bytes"].as_str(), mismatch());
                Ok(())
            }
            (Value::Tuple(items), e) if tag(e, "tuple").is_some() => {
                self.seq(items, e["tuple"].as_array().context("tuple")?, at)
            }
            (Value::Dict(items), e) if tag(e, "dict").is_some() => {
                self.pairs(items, &e["dict"], at)
            }
            (Value::OrderedDict(items), e) if tag(e, "ordered_dict").is_some() => {
                self.pairs(items, &e["ordered_dict"], at)
            }
            (Value::Global { module, name }, e) if tag(e, "global").is_some() => {
                ensure!(
                    Some(format!("{module}.{name}").as_str()) == e["global"].as_str(),
                    mismatch()
                );
                Ok(())
            }
            (Value::Object(o), e) if tag(e, "object").is_some() => {
                let e = &e["object"];
                ensure!(Some(o.class().as_str()) == e["class"].as_str(), mismatch());
                let kind = match o.kind {
                    tchtrain_serialization::ObjectKind::Reduce => "reduce",
                    tchtrain_serialization::ObjectKind::NewObj => "newobj",
                };
                ensure!(
                    Some(kind) == e["kind"].as_str(),
                    "{at}: kind {kind}, expected {}",
                    e["kind"]
                );
                let args = e["args"].as_array().context("args")?;
                self.seq(&o.args, args, &format!("{at}.args"))?;
                match (&o.state, &e["state"]) {
                    (None, Json::Null) => Ok(()),
                    (Some(s), e) if !e.is_null() => self.check(s, e, &format!("{at}.state")),
                    _ => Err(mismatch()),
                }
            }
            (Value::Tensor(t), e) if tag(e, "tensor").is_some() => self.tensor(t, &e["tensor"], at),
            _ => Err(mismatch()),
        }
    }

    fn seq(&mut self, items: &[Value], expected: &[Json], at: &str) -> Result<()> {
        ensure!(
            items.len() == expected.len(),
            "{at}: {} items, expected {}",
            items.len(),
            expected.len()
        );
        for (i, (v, e)) in items.iter().zip(expected).enumerate() {
            self.check(v, e, &format!("{at}[{i}]"))?;
        }
        Ok(())
    }

    fn pairs(&mut self, items: &[(Value, Value)], expected: &Json, at: &str) -> Result<()> {
        let expected = expected.as_array().context("pairs")?;
        ensure!(
            items.len() == expected.len(),
            "{at}: {} entries, expected {}",
            items.len(),
            expected.len()
        );
        for ((k, v), e) in items.iter().zip(expected) {
            let label = match k {
                Value::Str(s) => format!("{at}.{s}"),
                other => format!("{at}[{other:?}]"),
            };
            self.check(k, &e[0], &format!("{label} (key)"))?;
            self.check(v, &e[1], &label)?;
        }
        Ok(())
    }

    fn tensor(&mut self, t: &Tensor, e: &Json, at: &str) -> Result<()> {
        let next = self.storages.len() as u64;
        let storage = *self
            .storages
            .entry(std::sync::Arc::as_ptr(&t.storage))
            .or_insert(next);
        let ints = |key: &str| -> Result<Vec<i64>> {
            e[key]
                .as_array()
                .with_context(|| format!("{at}: {key}"))?
                .iter()
                .map(|v| v.as_i64().context("an int"))
                .collect()
        };
        let checks = [
            ("dtype", Some(t.dtype.name()) == e["dtype"].as_str()),
            ("shape", ints("shape")? == t.size),
            ("stride", ints("stride")? == t.stride),
            (
                "storage_offset",
                e["storage_offset"].as_i64() == Some(t.storage_offset),
            ),
            (
                "requires_grad",
                e["requires_grad"].as_bool() == Some(t.requires_grad),
            ),
            ("parameter", e["parameter"].as_bool() == Some(t.parameter)),
            (
                "device",
                e["device"].as_str() == Some(t.storage.device.as_str()),
            ),
            ("storage", e["storage"].as_u64() == Some(storage)),
            (
                "bytes",
                e["bytes"].as_str() == Some(hex(&t.contiguous_bytes()?).as_str()),
            ),
        ];
        for (field, ok) in checks {
            ensure!(ok, "{at}: tensor {field} differs: expected {e}, got {t:?}");
        }
        if let Some(values) = e.get("values") {
            let Some(actual) = t.to_f64_vec()? else {
                bail!("{at}: no f64 view of a {} tensor", t.dtype);
            };
            let values = values.as_array().context("values")?;
            ensure!(
                actual.len() == values.len(),
                "{at}: {} values",
                actual.len()
            );
            for (i, (a, v)) in actual.iter().zip(values).enumerate() {
                let ok = match v {
                    Json::Bool(b) => *a == *b as i64 as f64,
                    Json::Number(n) => {
                        n.as_i64()
                            .map(|n| n as f64)
                            .or(n.as_u64().map(|n| n as f64))
                            == Some(*a)
                    }
                    other => float_matches(*a, &other["float"]),
                };
                ensure!(ok, "{at}: value {i} is {a}, expected {v}");
            }
        }
        Ok(())
    }
}

/// Lower-case hex, as Python's `bytes.hex()`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

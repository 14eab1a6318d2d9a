//! `"auto"` filling and mismatch errors equal upstream's `HfTrainerDeepSpeedConfig`
//! (`scripts/reference/deepspeed_config.py`): filled configs equal as JSON, error messages
//! equal as strings, ZeRO stage / offload / dtype queries equal.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;
use tchtrain_deepspeed::{Error, HfTrainerDeepSpeedConfig};
use tchtrain_training_args::TrainingArguments;

fn reference() -> Result<Value> {
    let dir = std::env::var_os("TCHTRAIN_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets"));
    let path = dir.join("reference/deepspeed_config/deepspeed_config.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("{} (run `cargo xtask setup`)", path.display()))?;
    Ok(serde_json::from_str(&text)?)
}

/// Python's `==` on JSON (1 == 1.0), recursively.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

#[test]
fn auto_fill_and_mismatches_match_upstream() -> Result<()> {
    let r = reference()?;
    let cases = r["cases"].as_array().context("cases")?;
    assert!(cases.len() >= 7);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let mut dict = r["args"].as_object().unwrap().clone();
        dict.extend(case["overrides"].as_object().unwrap().clone());
        dict.insert("output_dir".into(), "unused".into());
        let args: TrainingArguments = TrainingArguments::from_dict(dict)?.args;
        let mut ds = HfTrainerDeepSpeedConfig::from_value(case["input"].clone())?;
        let dtype = ds.trainer_config_process(&args, false);
        let steps = case["num_training_steps"].as_u64().unwrap() as usize;
        let result = ds.trainer_config_finalize(&args, case["hidden_size"].as_i64(), steps);
        let expected = &case["result"];
        match (result, expected.get("error")) {
            (Ok(()), None) => {
                assert!(
                    same(&Value::Object(ds.config.clone()), &expected["config"]),
                    "{name}: {:?}\nvs {}",
                    ds.config,
                    expected["config"]
                );
                assert_eq!(
                    ds.zero_stage(),
                    expected["zero_stage"].as_i64().unwrap(),
                    "{name}"
                );
                assert_eq!(
                    ds.is_offload(),
                    expected["is_offload"].as_bool().unwrap(),
                    "{name}"
                );
                assert_eq!(
                    format!("torch.{dtype}"),
                    expected["dtype"].as_str().unwrap(),
                    "{name}"
                );
            }
            (Err(e), Some(msg)) => assert_eq!(e.to_string(), msg.as_str().unwrap(), "{name}"),
            (got, want) => panic!("{name}: got {got:?}, upstream {want:?}"),
        }
    }
    Ok(())
}

#[test]
fn bad_configs_are_typed_errors() -> Result<()> {
    let err = HfTrainerDeepSpeedConfig::from_path_or_json("{not json").unwrap_err();
    assert!(matches!(err, Error::Json { .. }), "{err}");
    assert!(matches!(
        HfTrainerDeepSpeedConfig::from_value(serde_json::json!([1, 2])),
        Err(Error::InvalidConfig { .. })
    ));
    let ds = HfTrainerDeepSpeedConfig::from_value(
        serde_json::json!({"zero_optimization": {"stage": 3}}),
    )?;
    let args = TrainingArguments {
        auto_find_batch_size: true,
        ..TrainingArguments::default()
    };
    let err = ds.check_trainer_compat(&args).unwrap_err();
    assert!(err.to_string().contains("auto_find_batch_size"), "{err}");
    let dir = std::env::temp_dir().join(format!("tchtrain-ds-{}.json", std::process::id()));
    std::fs::write(
        &dir,
        r#"{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}"#,
    )?;
    let from_file = HfTrainerDeepSpeedConfig::from_path_or_json(dir.to_str().unwrap())?;
    assert!(from_file.is_zero2() && from_file.is_offload());
    std::fs::remove_file(dir)?;
    Ok(())
}

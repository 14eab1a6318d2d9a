//! The ZeRO-2 and ZeRO-3 example configs of transformers' "DeepSpeed" documentation page
//! (`tests/fixtures/ds_config_zero{2,3}.json`, every Trainer value `"auto"`) are accepted:
//! filled exactly as upstream's `HfTrainerDeepSpeedConfig` fills them
//! (`ds_config_zero{2,3}.filled.json`, written by `scripts/reference/deepspeed_doc_configs.py`),
//! fp16 `"auto"` resolving to disabled (no `--fp16`: a CPU run), their offload devices
//! reported; a conflicting value gives upstream's mismatch message, word for word.

use std::path::{Path, PathBuf};

use anyhow::Result;
use serde_json::{Value, json};
use tchtrain_deepspeed::HfTrainerDeepSpeedConfig;
use tchtrain_training_args::TrainingArguments;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The reference script's arguments: batch 2, accumulation 2, lr 1e-3, weight decay 0.01,
/// warmup 2 steps, on the CPU.
fn args() -> Result<TrainingArguments> {
    let mut args = TrainingArguments {
        per_device_train_batch_size: 2,
        gradient_accumulation_steps: 2,
        learning_rate: 1e-3,
        weight_decay: 0.01,
        max_grad_norm: 1.0,
        warmup_steps: 2.0,
        use_cpu: true,
        report_to: vec![],
        ..TrainingArguments::new("unused")
    };
    args.post_init()?;
    Ok(args)
}

/// Python's `==` on JSON (`2e8 == 200000000.0`, `1 == 1.0`), recursively.
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

fn processed(name: &str, overrides: &[(&str, Value)]) -> Result<HfTrainerDeepSpeedConfig> {
    let mut ds = HfTrainerDeepSpeedConfig::from_path_or_json(fixture(name).to_str().unwrap())?;
    for (key, value) in overrides {
        let mut node = &mut ds.config;
        let parts: Vec<&str> = key.split('.').collect();
        for p in &parts[..parts.len() - 1] {
            node = node.get_mut(*p).unwrap().as_object_mut().unwrap();
        }
        node.insert(parts[parts.len() - 1].to_string(), value.clone());
    }
    Ok(ds)
}

#[test]
fn the_documentation_examples_fill_as_upstream() -> Result<()> {
    let args = args()?;
    for stage in [2, 3] {
        let mut ds = processed(&format!("ds_config_zero{stage}.json"), &[])?;
        assert_eq!(ds.zero_stage(), stage);
        let dtype = ds.trainer_config_process(&args, false);
        assert_eq!(
            dtype, "float32",
            "zero{stage}: fp16 \"auto\" without --fp16"
        );
        ds.trainer_config_finalize(&args, Some(64), 6)?;
        assert_eq!(ds.get_value("fp16.enabled"), Some(&json!(false)));
        let text = std::fs::read_to_string(fixture(&format!("ds_config_zero{stage}.filled.json")))?;
        let upstream: Value = serde_json::from_str(&text)?;
        assert!(
            same(&Value::Object(ds.config.clone()), &upstream),
            "zero{stage}: {}\nupstream: {upstream}",
            Value::Object(ds.config.clone())
        );
        assert!(
            !serde_json::to_string(&ds.config)?.contains("\"auto\""),
            "zero{stage}: no \"auto\" left"
        );
        assert!(ds.is_offload());
        let mut expected = vec![(
            "zero_optimization.offload_optimizer.device",
            "cpu".to_string(),
        )];
        if stage == 3 {
            expected.push(("zero_optimization.offload_param.device", "cpu".into()));
        }
        assert_eq!(ds.offload_devices(), expected);
    }
    // Offload devices "none" are no offload.
    let ds = processed(
        "ds_config_zero3.json",
        &[
            ("zero_optimization.offload_optimizer.device", json!("none")),
            ("zero_optimization.offload_param.device", json!("none")),
        ],
    )?;
    assert!(!ds.is_offload());
    assert!(ds.offload_devices().is_empty());
    Ok(())
}

#[test]
fn a_conflicting_value_in_a_documentation_example_gives_upstreams_message() -> Result<()> {
    let args = args()?;
    // The messages printed by scripts/reference/deepspeed_doc_configs.py.
    let cases = [
        (
            "ds_config_zero2.json",
            vec![
                ("gradient_accumulation_steps", json!(4)),
                ("optimizer.params.lr", json!(3e-5)),
                ("fp16.enabled", json!(true)),
            ],
            "Please correct the following DeepSpeed config values that mismatch TrainingArguments values:\n\
             - ds gradient_accumulation_steps=4 vs hf gradient_accumulation_steps=2\n\
             - ds optimizer.params.lr=3e-05 vs hf learning_rate=0.001\n\
             - ds fp16.enabled=True vs hf fp16|fp16_full_eval=False\n\
             The easiest method is to set these DeepSpeed config values to 'auto'.",
        ),
        (
            "ds_config_zero3.json",
            vec![
                ("gradient_clipping", json!(0.5)),
                ("train_micro_batch_size_per_gpu", json!(3)),
            ],
            "Please correct the following DeepSpeed config values that mismatch TrainingArguments values:\n\
             - ds train_micro_batch_size_per_gpu=3 vs hf per_device_train_batch_size=2\n\
             - ds gradient_clipping=0.5 vs hf max_grad_norm=1.0\n\
             The easiest method is to set these DeepSpeed config values to 'auto'.",
        ),
    ];
    for (name, overrides, message) in cases {
        let mut ds = processed(name, &overrides)?;
        ds.trainer_config_process(&args, false);
        let err = ds.trainer_config_finalize(&args, Some(64), 6).unwrap_err();
        assert_eq!(err.to_string(), message, "{name}");
    }
    Ok(())
}

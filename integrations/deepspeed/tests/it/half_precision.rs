//! DeepSpeed's half-precision sections and deprecated keys as DeepSpeed 0.19.8 reads them:
//!
//! * the `fp16` section's loss scaler (`DeepSpeedFP16Config` + `CreateLossScaler`) follows
//!   DeepSpeed's own through fixed overflow patterns, every scale, hysteresis and counter
//!   equal (`scripts/reference/deepspeed_loss_scaler.py`), and raises at its minimum scale at
//!   the same step; DeepSpeed's validators refuse the same sections;
//! * `bf16` is a static scale of 1 with the overflow check on by default;
//! * accelerate's `set_mixed_precision` adds, fills and refuses sections as upstream;
//! * `cpu_offload` / `cpu_offload_param` map to `offload_optimizer` / `offload_param`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tch::Kind;
use tchtrain_accelerate::LossScaler;
use tchtrain_deepspeed::{Error, HfTrainerDeepSpeedConfig};

fn reference() -> Result<Value> {
    let dir = std::env::var_os("TCHTRAIN_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets"));
    let path = dir.join("reference/deepspeed_loss_scaler/deepspeed_loss_scaler.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("{} (run `cargo xtask setup`)", path.display()))?;
    Ok(serde_json::from_str(&text)?)
}

fn config(v: Value) -> Result<HfTrainerDeepSpeedConfig> {
    Ok(HfTrainerDeepSpeedConfig::from_value(v)?)
}

fn scaler_of(section: &Value) -> Result<LossScaler> {
    let ds = config(json!({ "fp16": section, "zero_optimization": {"stage": 2} }))?;
    let (kind, mp) = ds.zero_mixed_precision()?.context("fp16 enabled")?;
    assert_eq!(kind, Kind::Half);
    assert!(mp.check_grad_overflow);
    Ok(mp.loss_scaler)
}

#[test]
fn loss_scaler_trajectories_equal_deepspeeds() -> Result<()> {
    let reference = reference()?;
    let cases = reference["cases"].as_array().context("cases")?;
    assert_eq!(cases.len(), 20);
    for case in cases {
        let name = case["name"].as_str().context("name")?;
        let mut scaler = scaler_of(&case["section"])?;
        assert_eq!(
            scaler.is_dynamic(),
            case["dynamic"].as_bool() == Some(true),
            "{name}"
        );
        assert_eq!(
            scaler.loss_scale(),
            case["init_scale"].as_f64().context("init")?,
            "{name}"
        );
        let trace = case["trace"].as_array().context("trace")?;
        let raised_at = case["raised_at"].as_u64().map(|i| i as usize);
        for (i, overflow) in case["pattern"]
            .as_array()
            .context("pattern")?
            .iter()
            .enumerate()
        {
            let outcome = scaler.update_scale(overflow.as_i64() == Some(1));
            if raised_at == Some(i) {
                let err = outcome.expect_err(name);
                assert!(
                    err.to_string()
                        .starts_with("Current loss scale already at minimum"),
                    "{err}"
                );
                break;
            }
            outcome.with_context(|| format!("{name} step {i}"))?;
            let want = &trace[i];
            // Every scale is a power of two times an integer: exact in f64 on both sides.
            assert_eq!(
                scaler.loss_scale(),
                want["cur_scale"].as_f64().context("scale")?,
                "{name} step {i}"
            );
            if let LossScaler::Dynamic(d) = &scaler {
                assert_eq!(
                    Some(d.cur_iter),
                    want["cur_iter"].as_i64(),
                    "{name} step {i}"
                );
                assert_eq!(
                    Some(d.last_overflow_iter),
                    want["last_overflow_iter"].as_i64(),
                    "{name} step {i}"
                );
                assert_eq!(
                    Some(d.cur_hysteresis),
                    want["cur_hysteresis"].as_i64(),
                    "{name} step {i}"
                );
            }
        }
        if raised_at.is_none() {
            assert_eq!(
                trace.len(),
                case["pattern"].as_array().map_or(0, Vec::len),
                "{name}"
            );
        }
    }
    // DeepSpeed's validators refuse the same sections.
    for bad in reference["refused"].as_array().context("refused")? {
        let ds = config(json!({ "fp16": bad, "zero_optimization": {"stage": 2} }))?;
        match ds.zero_mixed_precision() {
            Err(Error::InvalidConfig { key, .. }) => assert!(key.starts_with("fp16."), "{key}"),
            other => bail!("{bad} gave {other:?}"),
        }
    }
    // bf16: a static scale of 1, whatever happens; the overflow check on by default.
    let ds = config(json!({"bf16": {"enabled": true}, "zero_optimization": {"stage": 2}}))?;
    let (kind, mut mp) = ds.zero_mixed_precision()?.context("bf16")?;
    assert_eq!(kind, Kind::BFloat16);
    assert!(mp.check_grad_overflow);
    mp.loss_scaler.update_scale(true)?;
    assert_eq!(
        mp.loss_scaler.loss_scale(),
        reference["bf16_scale"].as_f64().context("bf16")?
    );
    let ds = config(
        json!({"bf16": {"enabled": true, "check_grad_overflow": false}, "zero_optimization": {}}),
    )?;
    assert!(
        !ds.zero_mixed_precision()?
            .context("bf16")?
            .1
            .check_grad_overflow
    );
    // fp32 masters only.
    let ds = config(json!({"bf16": {"enabled": true, "bf16_master_weights_and_grads": true}}))?;
    assert!(matches!(
        ds.zero_mixed_precision(),
        Err(Error::NotSupported { .. })
    ));
    let ds = config(json!({"fp16": {"enabled": true}, "bf16": {"enabled": true}}))?;
    assert!(ds.zero_mixed_precision().is_err());
    assert!(
        config(json!({"fp16": {"enabled": false}}))?
            .zero_mixed_precision()?
            .is_none()
    );
    Ok(())
}

#[test]
fn set_mixed_precision_adds_and_refuses_sections_as_accelerate() -> Result<()> {
    // `--fp16` with no section: accelerate adds `{"enabled": True, "auto_cast": True}`.
    let mut ds = config(json!({"zero_optimization": {"stage": 2}}))?;
    ds.set_mixed_precision("fp16")?;
    assert_eq!(
        ds.config["fp16"],
        json!({"enabled": true, "auto_cast": true})
    );
    assert_eq!(ds.config["bf16"], json!({"enabled": false}));
    // `--bf16` with the docs' `"auto"`: filled.
    let mut ds = config(json!({"bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 3}}))?;
    ds.set_mixed_precision("bf16")?;
    assert_eq!(ds.config["bf16"], json!({"enabled": true}));
    assert_eq!(ds.config["fp16"], json!({"enabled": false}));
    // No flag: both sections disabled, an "auto" filled with false.
    let mut ds = config(json!({"fp16": {"enabled": "auto"}, "zero_optimization": {}}))?;
    ds.set_mixed_precision("no")?;
    assert_eq!(ds.config["fp16"], json!({"enabled": false}));
    // The other dtype enabled in the file: accelerate's error.
    let mut ds = config(json!({"fp16": {"enabled": true}, "zero_optimization": {}}))?;
    let err = ds
        .set_mixed_precision("bf16")
        .expect_err("conflict")
        .to_string();
    assert!(
        err.starts_with("`--mixed_precision` arg cannot be set to `bf16` when `fp16` is set in the DeepSpeed config file."),
        "{err}"
    );
    Ok(())
}

#[test]
fn deprecated_offload_keys_map_as_deepspeeds() -> Result<()> {
    // The documents' ZeRO-2 section.
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/configs/ds_zero2_fp16.json");
    let mut ds = if path.is_file() {
        HfTrainerDeepSpeedConfig::from_path_or_json(&path.display().to_string())?
    } else {
        config(json!({"zero_optimization": {"stage": 2, "cpu_offload": true}}))?
    };
    let warnings = ds.normalize_deprecated_keys()?;
    assert_eq!(
        warnings,
        ["Config parameter cpu_offload is deprecated use offload_optimizer instead"]
    );
    assert_eq!(
        ds.get_value("zero_optimization.offload_optimizer"),
        Some(&json!({"device": "cpu"}))
    );
    assert!(ds.get_value("zero_optimization.cpu_offload").is_none());
    assert!(ds.is_offload());
    let mut ds = config(
        json!({"zero_optimization": {"stage": 3, "cpu_offload_param": true,
        "cpu_offload": false, "cpu_offload_use_pin_memory": true}}),
    )?;
    assert_eq!(ds.normalize_deprecated_keys()?.len(), 3);
    assert_eq!(
        ds.get_value("zero_optimization.offload_param"),
        Some(&json!({"device": "cpu"}))
    );
    assert!(
        ds.get_value("zero_optimization.offload_optimizer")
            .is_none()
    );
    // DeepSpeed keeps the pin-memory key (and reads nothing from it).
    assert_eq!(
        ds.get_value("zero_optimization.cpu_offload_use_pin_memory"),
        Some(&json!(true))
    );
    // With its replacement: DeepSpeed's assertion.
    let mut ds = config(
        json!({"zero_optimization": {"cpu_offload": true, "offload_optimizer": {"device": "cpu"}}}),
    )?;
    assert!(matches!(
        ds.normalize_deprecated_keys(),
        Err(Error::InvalidConfig { .. })
    ));
    Ok(())
}

/// `data_types.grad_accum_dtype` as DeepSpeed 0.19.8's engine reads it
/// (`DeepSpeedEngine.get_data_types` and `_do_optimizer_sanity_check`): under ZeRO only
/// stage 1 + bf16 + fp32 without optimizer offload changes the optimizer (its
/// `BF16_Optimizer`, refused here by name); without ZeRO only the model's own dtype is
/// accepted; DeepSpeed's `DtypeEnum` names are read.
#[test]
fn grad_accum_dtype_as_deepspeeds_engine_reads_it() -> Result<()> {
    let check = |stage: i64, half: &str, accum: Value, offload: bool| {
        let mut v = json!({
            "zero_optimization": {"stage": stage},
            "data_types": {"grad_accum_dtype": accum},
        });
        if !half.is_empty() {
            v[half] = json!({"enabled": true});
        }
        if offload {
            v["zero_optimization"]["offload_optimizer"] = json!({"device": "cpu"});
        }
        HfTrainerDeepSpeedConfig::from_value(v).and_then(|c| c.zero_mixed_precision().map(|_| ()))
    };
    // Accepted: the ZeRO optimizers do not read it.
    for (stage, half, accum, offload) in [
        (2, "bf16", "fp32", false),
        (3, "bf16", "fp32", false),
        (2, "fp16", "fp32", false),
        (1, "bf16", "fp32", true),
        (1, "bf16", "bf16", false),
        (1, "fp16", "torch.float32", false),
        (1, "", "half", false),
    ] {
        check(stage, half, json!(accum), offload)
            .with_context(|| format!("stage {stage} {half} {accum} offload {offload}"))?;
    }
    // Without ZeRO: the model's dtype only.
    check(0, "", json!("float32"), false)?;
    match check(0, "", json!("fp16"), false) {
        Err(Error::NotSupported { key, why }) => {
            assert_eq!(key, "data_types.grad_accum_dtype");
            assert!(
                why.contains(
                    "unsupported mix of model_dtype=torch.float32 and grad_accum_dtype=torch.float16"
                ),
                "{why}"
            );
        }
        other => bail!("stage 0 fp32 with fp16 accumulation: {other:?}"),
    }
    // BF16_Optimizer's case.
    match check(1, "bf16", json!("fp32"), false) {
        Err(Error::NotSupported { key, why }) => {
            assert_eq!(key, "data_types.grad_accum_dtype");
            assert!(why.contains("BF16_Optimizer"), "{why}");
        }
        other => bail!("stage 1 bf16 with fp32 accumulation: {other:?}"),
    }
    // Not a DtypeEnum value.
    assert!(matches!(
        check(2, "bf16", json!("float64"), false),
        Err(Error::InvalidConfig { .. })
    ));
    assert!(matches!(
        check(2, "bf16", json!(32), false),
        Err(Error::InvalidConfig { .. })
    ));
    Ok(())
}

/// `communication_data_type` as DeepSpeed's `get_communication_data_type` parses it: the
/// three names in any case, absent or null for none (the engine then reduces in the model's
/// dtype), and DeepSpeed's `ValueError` for anything else.
#[test]
fn communication_data_type_as_deepspeed_parses_it() -> Result<()> {
    let parse = |v: Value| {
        HfTrainerDeepSpeedConfig::from_value(json!({"communication_data_type": v}))
            .and_then(|c| c.communication_data_type())
    };
    assert_eq!(parse(json!("fp32"))?, Some(tch::Kind::Float));
    assert_eq!(parse(json!("FP16"))?, Some(tch::Kind::Half));
    assert_eq!(parse(json!("bf16"))?, Some(tch::Kind::BFloat16));
    assert_eq!(parse(Value::Null)?, None);
    assert_eq!(
        HfTrainerDeepSpeedConfig::from_value(json!({}))?.communication_data_type()?,
        None
    );
    for bad in [json!("float32"), json!(32)] {
        match parse(bad.clone()) {
            Err(Error::InvalidConfig { key, fix, .. }) => {
                assert_eq!(key, "communication_data_type");
                assert!(fix.contains("['fp16', 'bf16', 'fp32']"), "{fix}");
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
    Ok(())
}

/// `zero_optimization.overlap_comm` with DeepSpeed's default by stage, and
/// `reduce_bucket_size` (an integer, or a float with an integral value such as `5e8`, default
/// 500,000,000); other values are refused naming the key.
#[test]
fn overlap_comm_and_reduce_bucket_size_as_deepspeed_reads_them() -> Result<()> {
    let zero = |v: Value| HfTrainerDeepSpeedConfig::from_value(json!({ "zero_optimization": v }));
    assert!(!zero(json!({"stage": 2}))?.overlap_comm()?);
    assert!(zero(json!({"stage": 3}))?.overlap_comm()?);
    assert!(zero(json!({"stage": 2, "overlap_comm": true}))?.overlap_comm()?);
    assert!(!zero(json!({"stage": 3, "overlap_comm": false}))?.overlap_comm()?);
    assert!(
        zero(json!({"stage": 2, "overlap_comm": Value::Null}))?
            .overlap_comm()
            .is_ok()
    );
    assert_eq!(
        zero(json!({"stage": 2}))?.reduce_bucket_size()?,
        500_000_000
    );
    assert_eq!(
        zero(json!({"reduce_bucket_size": 5e8}))?.reduce_bucket_size()?,
        500_000_000
    );
    assert_eq!(
        zero(json!({"reduce_bucket_size": 147456}))?.reduce_bucket_size()?,
        147_456
    );
    for (bad, key) in [
        (
            json!({"overlap_comm": "yes"}),
            "zero_optimization.overlap_comm",
        ),
        (
            json!({"reduce_bucket_size": 0}),
            "zero_optimization.reduce_bucket_size",
        ),
        (
            json!({"reduce_bucket_size": 1.5}),
            "zero_optimization.reduce_bucket_size",
        ),
        (
            json!({"reduce_bucket_size": "auto"}),
            "zero_optimization.reduce_bucket_size",
        ),
    ] {
        let c = zero(bad.clone())?;
        let got = if key.ends_with("overlap_comm") {
            c.overlap_comm().map(|_| ())
        } else {
            c.reduce_bucket_size().map(|_| ())
        };
        match got {
            Err(Error::InvalidConfig { key: k, .. }) => assert_eq!(k, key, "{bad}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
    Ok(())
}

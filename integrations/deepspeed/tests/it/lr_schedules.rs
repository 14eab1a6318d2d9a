//! DeepSpeed's schedules equal DeepSpeed's own (`scripts/reference/deepspeed_lr_schedules.py`,
//! deepspeed 0.19.8's `lr_schedules`): every group's lr after construction and after each of
//! 60 steps, bit for bit (the same float operations in the same order), the saved state, and
//! DeepSpeed's refusals.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::{Value, json};
use tch::{Device, Kind, Tensor};
use tchtrain_deepspeed::{DeepSpeedLR, Error};
use tchtrain_optim::{GroupSpec, LrScheduler, Optimizer, Sgd, SgdConfig};

fn reference() -> Result<Value> {
    let dir = std::env::var_os("TCHTRAIN_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets"));
    let path = dir.join("reference/deepspeed_lr_schedules/deepspeed_lr_schedules.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("{} (run `cargo xtask setup`)", path.display()))?;
    Ok(serde_json::from_str(&text)?)
}

/// The reference's optimizer: groups at lr 1e-3 and 5e-4.
fn optimizer() -> Result<Sgd> {
    let t = || Tensor::zeros([2], (Kind::Float, Device::Cpu));
    Ok(Sgd::new(
        vec![
            GroupSpec::new(vec![("w".into(), t())]),
            GroupSpec::new(vec![("b".into(), t())]).with_lr(5e-4),
        ],
        SgdConfig {
            lr: 1e-3,
            ..Default::default()
        },
    )?)
}

fn lrs(v: &Value) -> Vec<f64> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default()
}

#[test]
fn deepspeed_schedules_equal_deepspeeds_own_at_every_step() -> Result<()> {
    let r = reference()?;
    let cases = r["cases"].as_array().context("cases")?;
    assert_eq!(cases.len(), 11);
    for case in cases {
        let name = case["name"].as_str().context("name")?;
        let section = json!({"type": case["type"], "params": case["params"]});
        let mut opt = optimizer()?;
        let mut s = DeepSpeedLR::from_config(&section, &mut opt)?;
        let expected = case["lrs"].as_array().context("lrs")?;
        assert_eq!(opt.lrs(), lrs(&expected[0]), "{name}: after construction");
        for (k, want) in expected.iter().enumerate().skip(1) {
            s.step(&mut opt)?;
            assert_eq!(opt.lrs(), lrs(want), "{name}: after step {k}");
            assert_eq!(
                s.get_last_lr(),
                lrs(&case["last_lr"][k - 1]),
                "{name}: step {k}"
            );
        }
        assert_eq!(s.state_dict(), case["state"], "{name}");

        // Resuming from the state (the lrs themselves come back with the optimizer's).
        let mut resumed = DeepSpeedLR::from_config(&section, &mut optimizer()?)?;
        resumed.load_state_dict(&case["state"])?;
        let mut o2 = optimizer()?;
        resumed.step(&mut o2)?;
        s.step(&mut opt)?;
        assert_eq!(o2.lrs(), opt.lrs(), "{name}: resumed");
    }
    Ok(())
}

#[test]
fn bad_scheduler_sections_are_refused_by_key() -> Result<()> {
    let r = reference()?;
    // DeepSpeed's ValueError for warmup_num_steps that is not a positive integer.
    for e in r["errors"].as_array().context("errors")? {
        let section = json!({"type": "WarmupLR", "params": e["params"]});
        let err = DeepSpeedLR::from_config(&section, &mut optimizer()?).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidConfig { key, .. } if key == "scheduler.params.warmup_num_steps"),
            "{err}"
        );
    }
    let cases = [
        (json!({"type": "OneCycle", "params": {}}), "scheduler.type"),
        (json!({"type": "Cosine", "params": {}}), "scheduler.type"),
        (
            json!({"type": "WarmupLR", "params": {"warmup_num_steps": 5, "warmup_type": "exp"}}),
            "scheduler.params.warmup_type",
        ),
        (
            json!({"type": "WarmupDecayLR", "params": {"warmup_num_steps": 5}}),
            "scheduler.params.total_num_steps",
        ),
        (
            json!({"type": "WarmupLR", "params": {"warmup_num_steps": 5, "warmup_max_lr": [1e-3]}}),
            "scheduler.params.warmup_max_lr",
        ),
        // A key the scheduler does not take (DeepSpeed: TypeError), e.g. a typo.
        (
            json!({"type": "WarmupLR", "params": {"warmup_num_step": 5}}),
            "scheduler.params.warmup_num_step",
        ),
        (
            json!({"type": "WarmupCosineLR", "params": {"total_num_steps": 9, "warmup_max_lr": 1e-3}}),
            "scheduler.params.warmup_max_lr",
        ),
    ];
    for (section, key) in cases {
        let err = DeepSpeedLR::from_config(&section, &mut optimizer()?).unwrap_err();
        let named = match &err {
            Error::InvalidConfig { key, .. } | Error::NotSupported { key, .. } => key.clone(),
            other => panic!("{section}: {other}"),
        };
        assert_eq!(named, key, "{section}: {err}");
    }
    Ok(())
}

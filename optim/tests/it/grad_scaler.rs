//! `GradScaler` against `scripts/reference/grad_scaler.py` (torch 2.13's
//! `torch.amp.GradScaler("cpu")`): the scale and growth tracker after every `update`, which
//! steps were skipped, the clip totals and the final parameters under AdamW, the final
//! `state_dict`, `scale(loss)` for float32 and float16 losses; then the state round trip and
//! torch's errors for calls out of order.

use std::collections::BTreeMap;
use std::path::PathBuf;
use tchtrain_testing::lock;

use anyhow::{Context, Result};
use serde_json::Value;
use tch::{Device, Kind, Tensor};
use tchtrain_optim::{
    AdamW, AdamWConfig, Error, GradScaler, GradScalerKwargs, GradScalerState, GroupSpec, Optimizer,
    clip_grad_norm, set_grad,
};

fn reference() -> Result<(Value, BTreeMap<String, Tensor>)> {
    let dir = std::env::var_os("TCHTRAIN_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../assets"))
        .join("reference/grad_scaler");
    let json = dir.join("grad_scaler.json");
    let text = std::fs::read_to_string(&json).with_context(|| {
        format!(
            "{} is missing: run `cargo xtask setup` to generate the reference values",
            json.display()
        )
    })?;
    let tensors = Tensor::read_safetensors(dir.join("grad_scaler.safetensors"))?
        .into_iter()
        .collect();
    Ok((serde_json::from_str(&text)?, tensors))
}

fn kwargs(v: &Value) -> GradScalerKwargs {
    GradScalerKwargs {
        init_scale: v["init_scale"].as_f64().unwrap(),
        growth_factor: v["growth_factor"].as_f64().unwrap(),
        backoff_factor: v["backoff_factor"].as_f64().unwrap(),
        growth_interval: v["growth_interval"].as_i64().unwrap(),
        enabled: true,
    }
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

/// The clip total torch logged: a number, or `"inf"` / `"nan"`.
fn total_of(v: &Value) -> f64 {
    match v {
        Value::String(s) => s.parse().unwrap(),
        v => v.as_f64().unwrap(),
    }
}

#[test]
fn scales_skips_and_steps_as_torch() -> Result<()> {
    let _g = lock();
    let (meta, t) = reference()?;
    let steps = meta["steps"].as_i64().unwrap();
    let names = ["weight", "bias"];
    for (case, rec) in meta["cases"].as_object().unwrap() {
        let params: Vec<Tensor> = names
            .iter()
            .map(|n| t[&format!("init.{n}")].copy().set_requires_grad(true))
            .collect();
        let mut opt = AdamW::new(
            vec![GroupSpec::unnamed(
                params.iter().map(Tensor::shallow_clone).collect(),
            )],
            AdamWConfig {
                lr: 1e-2,
                weight_decay: 0.01,
                ..Default::default()
            },
        )?;
        let mut scaler = GradScaler::new(kwargs(&rec["kwargs"]))?;
        for step in 0..steps {
            let loss = Tensor::from(1.0f32);
            let _ = scaler.scale(&loss)?;
            let scale = scaler.get_scale()?;
            for (p, n) in params.iter().zip(names) {
                let g = t[&format!("grads.{n}")].get(step) * scale;
                set_grad(p, Some(&g))?;
            }
            scaler.unscale_(&opt)?;
            let total = clip_grad_norm(&params, 1.0, 2.0, false)?.double_value(&[]);
            let stepped = scaler.step(&mut opt)?;
            scaler.update()?;
            let i = step as usize;
            let want_total = total_of(&rec["clip_total"][i]);
            assert!(
                // The same ops on the same few elements as torch: equal to the bit.
                (total.is_nan() && want_total.is_nan()) || total == want_total,
                "{case} step {step}: clip total {total} vs torch {want_total}"
            );
            assert_eq!(
                stepped,
                rec["stepped"][i].as_bool().unwrap(),
                "{case} step {step}: stepped"
            );
            assert_eq!(
                scaler.get_scale()?,
                rec["scale"][i].as_f64().unwrap(),
                "{case} step {step}: scale"
            );
            assert_eq!(
                scaler.growth_tracker()?,
                rec["growth_tracker"][i].as_i64().unwrap(),
                "{case} step {step}: growth tracker"
            );
            opt.zero_grad();
        }
        for (p, n) in params.iter().zip(names) {
            let d = max_abs_diff(p, &t[&format!("{case}.final.{n}")]);
            // The unscaled gradients are the fed ones exactly (power-of-two scales), and
            // the steps torch's AdamW single-tensor path op for op.
            assert_eq!(d, 0.0, "{case}: final {n} differs by {d}");
        }
        let state: GradScalerState = serde_json::from_value(rec["state_dict"].clone())?;
        assert_eq!(scaler.state_dict()?, Some(state), "{case}: state_dict");
        println!(
            "{case}: {} steps, {} skipped, final scale {}",
            steps,
            rec["stepped"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|s| !s.as_bool().unwrap())
                .count(),
            scaler.get_scale()?
        );
    }
    Ok(())
}

#[test]
fn scale_multiplies_the_loss_as_torch() -> Result<()> {
    let _g = lock();
    let (_, t) = reference()?;
    for bits in ["32", "16"] {
        let mut scaler = GradScaler::new(GradScalerKwargs {
            init_scale: 1024.0,
            ..Default::default()
        })?;
        let scaled = scaler.scale(&t[&format!("scale.loss{bits}")])?;
        let want = &t[&format!("scale.scaled{bits}")];
        assert_eq!(scaled.kind(), want.kind(), "float{bits} loss: dtype");
        assert_eq!(
            scaled.double_value(&[]),
            want.double_value(&[]),
            "float{bits} loss"
        );
    }
    Ok(())
}

#[test]
fn state_round_trips_and_misuse_is_an_error() -> Result<()> {
    let _g = lock();
    let p = Tensor::ones([3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let mut opt = AdamW::new(
        vec![GroupSpec::unnamed(vec![p.shallow_clone()])],
        AdamWConfig::default(),
    )?;
    let mut scaler = GradScaler::new(GradScalerKwargs {
        init_scale: 256.0,
        growth_interval: 2,
        ..Default::default()
    })?;
    // Before any scale(): torch's hint.
    let err = scaler.step(&mut opt).unwrap_err();
    assert!(err.to_string().contains("scaler.scale(loss"), "{err}");
    let step = |s: &mut GradScaler, opt: &mut AdamW, g: f32| -> Result<bool> {
        let _ = s.scale(&Tensor::from(1.0f32))?;
        set_grad(&p, Some(&Tensor::from_slice(&[g, 1.0, 1.0])))?;
        let stepped = s.step(opt)?;
        s.update()?;
        Ok(stepped)
    };
    assert!(step(&mut scaler, &mut opt, 1.0)?);
    assert!(step(&mut scaler, &mut opt, 1.0)?);
    assert_eq!(scaler.get_scale()?, 512.0, "grown after 2 clean steps");
    assert!(!step(&mut scaler, &mut opt, f32::INFINITY)?);
    assert_eq!(scaler.get_scale()?, 256.0, "backed off");
    // Saved and restored into a fresh scaler (before its first scale(), as torch allows).
    let dir = std::env::temp_dir().join(format!("tchtrain-scaler-{}", std::process::id()));
    scaler.save(&dir)?;
    let mut restored = GradScaler::new(GradScalerKwargs::default())?;
    restored.load(&dir)?;
    assert_eq!(restored.state_dict()?, scaler.state_dict()?);
    let _ = restored.scale(&Tensor::from(1.0f32))?;
    assert_eq!(restored.get_scale()?, 256.0);
    std::fs::remove_dir_all(&dir)?;
    // Out of order: unscale_ twice, step twice, float16 gradients.
    let _ = scaler.scale(&Tensor::from(1.0f32))?;
    set_grad(&p, Some(&Tensor::from_slice(&[1.0f32, 1.0, 1.0])))?;
    scaler.unscale_(&opt)?;
    let twice = scaler.unscale_(&opt).unwrap_err();
    assert!(twice.to_string().contains("already been called"), "{twice}");
    scaler.step(&mut opt)?;
    let again = scaler.step(&mut opt).unwrap_err();
    assert!(
        again.to_string().contains("step() has already been called"),
        "{again}"
    );
    scaler.update()?;
    let h = Tensor::ones([2], (Kind::Half, Device::Cpu)).set_requires_grad(true);
    let half_opt = AdamW::new(
        vec![GroupSpec::unnamed(vec![h.shallow_clone()])],
        AdamWConfig::default(),
    )?;
    set_grad(&h, Some(&Tensor::ones([2], (Kind::Half, Device::Cpu))))?;
    let _ = scaler.scale(&Tensor::from(1.0f32))?;
    let fp16 = scaler.unscale_(&half_opt).unwrap_err();
    assert!(
        matches!(&fp16, Error::GradScaler(m) if m.contains("FP16")),
        "{fp16}"
    );
    // torch's constructor checks.
    for (growth, backoff, name) in [(1.0, 0.5, "growth_factor"), (2.0, 1.0, "backoff_factor")] {
        let err = GradScaler::new(GradScalerKwargs {
            growth_factor: growth,
            backoff_factor: backoff,
            ..Default::default()
        })
        .unwrap_err();
        assert!(
            matches!(err, Error::InvalidHyperparameter { name: n, .. } if n == name),
            "{err}"
        );
    }
    // Disabled: scale is the identity and step always steps.
    let mut off = GradScaler::new(GradScalerKwargs {
        enabled: false,
        ..Default::default()
    })?;
    assert_eq!(off.scale(&Tensor::from(2.5f32))?.double_value(&[]), 2.5);
    set_grad(&p, Some(&Tensor::from_slice(&[f32::NAN, 1.0, 1.0])))?;
    assert!(off.step(&mut opt)?);
    assert_eq!(off.state_dict()?, None);
    Ok(())
}

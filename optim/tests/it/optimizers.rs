//! Optimizers, clipping and decay groups against `scripts/reference/optim_parity.py`
//! (torch 2.13 / transformers 5.23), plus state export / restore and typed errors.

use tchtrain_testing::lock;

use crate::packages::Reference;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use tch::{Device, Kind, Tensor};
use tchtrain_optim::{
    Adafactor, AdafactorConfig, Adagrad, AdagradConfig, Adam, AdamConfig, AdamW, AdamWConfig,
    BnbConfig, BnbOptimizer, Error, GroupSpec, Optimizer, OptimizerArgs, OptimizerStateDict,
    RmsProp, RmsPropConfig, Sgd, SgdConfig, clip_grad_norm, clip_grad_norm_if_enabled,
    create_optimizer, decay_param_groups, get_decay_parameter_names, parse_optim_args,
};

fn reference() -> Result<Reference> {
    Reference::read("optim_parity")
}

impl Reference {
    fn groups(&self) -> Vec<Vec<String>> {
        serde_json::from_value(self.meta["groups"].clone()).expect("groups")
    }
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

/// Fresh leaf parameters (copies of `init.*`), by name, in the group layout.
fn fresh_params(r: &Reference) -> Result<Vec<Vec<(String, Tensor)>>> {
    r.groups()
        .iter()
        .map(|names| {
            names
                .iter()
                .map(|n| {
                    Ok((
                        n.clone(),
                        r.t(&format!("init.{n}"))?.copy().set_requires_grad(true),
                    ))
                })
                .collect()
        })
        .collect()
}

/// Builds the optimizer of a reference case from its JSON (field names match torch's).
fn build(case: &str, meta: &Value, params: &[Vec<(String, Tensor)>]) -> Result<Box<dyn Optimizer>> {
    let specs: Vec<GroupSpec> = params
        .iter()
        .zip(meta["groups"].as_array().context("groups")?)
        .map(|(ps, g)| {
            let mut s = GroupSpec::new(
                ps.iter()
                    .map(|(n, t)| (n.clone(), t.shallow_clone()))
                    .collect(),
            );
            s.lr = g.get("lr").and_then(Value::as_f64);
            s.weight_decay = g.get("weight_decay").and_then(Value::as_f64);
            s
        })
        .collect();
    let d = meta["defaults"].clone();
    let kind = case.split('_').next().unwrap_or(case);
    Ok(match kind {
        "adamw" => Box::new(AdamW::new(
            specs,
            serde_json::from_value::<AdamWConfig>(d)?,
        )?),
        "adam" => Box::new(Adam::new(specs, serde_json::from_value::<AdamConfig>(d)?)?),
        "sgd" => Box::new(Sgd::new(specs, serde_json::from_value::<SgdConfig>(d)?)?),
        "adagrad" => Box::new(Adagrad::new(
            specs,
            serde_json::from_value::<AdagradConfig>(d)?,
        )?),
        "rmsprop" => Box::new(RmsProp::new(
            specs,
            serde_json::from_value::<RmsPropConfig>(d)?,
        )?),
        "adafactor" => Box::new(Adafactor::new(
            specs,
            serde_json::from_value::<AdafactorConfig>(d)?,
        )?),
        // lion-pytorch's update, which bitsandbytes' 32-bit Lion (the one owner here) computes
        "lion" => {
            let f = |k: &str| d.get(k).and_then(Value::as_f64);
            let betas = d["betas"].as_array().context("betas")?;
            let c = BnbConfig {
                lr: f("lr").context("lr")?,
                betas: (
                    betas[0].as_f64().context("beta1")?,
                    betas[1].as_f64().context("beta2")?,
                ),
                weight_decay: f("weight_decay").unwrap_or(0.0),
                ..BnbConfig::lion()
            };
            Box::new(BnbOptimizer::new(specs, c)?)
        }
        other => bail!("unknown case kind {other}"),
    })
}

/// Sets every parameter's gradient to the reference gradient of `step` (through a backward
/// of `sum(p * g)`, which gives exactly `g`).
fn set_grads(
    r: &Reference,
    params: &[Vec<(String, Tensor)>],
    opt: &mut dyn Optimizer,
    step: i64,
) -> Result<()> {
    opt.zero_grad();
    for (n, p) in params.iter().flatten() {
        let g = r.t(&format!("grads.{n}"))?.get(step);
        (p * g).sum(Kind::Float).backward();
    }
    Ok(())
}

#[test]
fn every_optimizer_matches_torch_for_50_steps() -> Result<()> {
    let _g = lock();
    let r = reference()?;
    let cases = r.meta["cases"].as_object().context("cases")?.clone();
    let mut report = Vec::new();
    for (case, meta) in &cases {
        let params = fresh_params(&r)?;
        let mut opt = build(case, meta, &params)?;
        let (mut step1, mut last) = (0.0f64, 0.0f64);
        for step in 0..r.steps() {
            set_grads(&r, &params, opt.as_mut(), step)?;
            opt.step()?;
            if step == 0 {
                for (n, p) in params.iter().flatten() {
                    step1 = step1.max(max_abs_diff(p, r.t(&format!("{case}.step1.{n}"))?));
                }
            }
        }
        for (n, p) in params.iter().flatten() {
            last = last.max(max_abs_diff(p, r.t(&format!("{case}.final.{n}"))?));
        }
        report.push(format!("{case:28} step1 {step1:.3e}  step50 {last:.3e}"));
        // Same libtorch kernels, same op order and scalars as torch.optim's CPU path (and the
        // same fused kernels): the results are bit-identical. The bound is 1e-6.
        assert_eq!(step1, 0.0, "{case}: step 1 differs from torch by {step1:e}");
        assert_eq!(last, 0.0, "{case}: step 50 differs from torch by {last:e}");
    }
    println!("max abs diff vs torch (fp32):\n{}", report.join("\n"));
    Ok(())
}

fn snapshot(params: &[Vec<(String, Tensor)>]) -> Vec<Tensor> {
    params
        .iter()
        .flatten()
        .map(|(_, p)| p.detach().copy())
        .collect()
}

#[test]
fn save_and_restore_mid_run_is_bit_identical() -> Result<()> {
    let _g = lock();
    let r = reference()?;
    let cases = r.meta["cases"].as_object().context("cases")?.clone();
    let steps = r.steps();
    let split = 20;
    for (case, meta) in &cases {
        // Uninterrupted.
        let params = fresh_params(&r)?;
        let mut opt = build(case, meta, &params)?;
        for step in 0..steps {
            set_grads(&r, &params, opt.as_mut(), step)?;
            opt.step()?;
        }
        let expected = snapshot(&params);

        // Interrupted at `split`: save, restore into fresh objects, continue.
        let params = fresh_params(&r)?;
        let mut opt = build(case, meta, &params)?;
        for step in 0..split {
            set_grads(&r, &params, opt.as_mut(), step)?;
            opt.step()?;
        }
        let dir =
            std::env::temp_dir().join(format!("tchtrain-optim-{}-{case}", std::process::id()));
        opt.save(&dir)?;
        let saved = snapshot(&params);
        drop(opt);

        let resumed = fresh_params(&r)?;
        for ((_, p), s) in resumed.iter().flatten().zip(&saved) {
            tch::no_grad(|| p.shallow_clone().copy_(s));
        }
        let mut opt = build(case, meta, &resumed)?;
        opt.load(&dir)?;
        std::fs::remove_dir_all(&dir).ok();
        for step in split..steps {
            set_grads(&r, &resumed, opt.as_mut(), step)?;
            opt.step()?;
        }
        for (a, b) in snapshot(&resumed).iter().zip(&expected) {
            assert!(
                a.equal(b),
                "{case}: resumed run differs by {:e}",
                max_abs_diff(a, b)
            );
        }
    }
    Ok(())
}

fn simple_adamw(shape: &[i64]) -> Result<(Tensor, AdamW)> {
    let p = Tensor::zeros(shape, (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let opt = AdamW::new(
        vec![GroupSpec::new(vec![("w".into(), p.shallow_clone())])],
        AdamWConfig::default(),
    )?;
    Ok((p, opt))
}

fn stepped_state(shape: &[i64]) -> Result<OptimizerStateDict> {
    let (p, mut opt) = simple_adamw(shape)?;
    p.sum(Kind::Float).backward();
    opt.step()?;
    Ok(opt.state_dict()?)
}

#[test]
fn load_state_dict_rejects_bad_input_with_typed_errors() -> Result<()> {
    let _g = lock();
    // Shapes differ.
    let sd = stepped_state(&[3])?;
    let (_, mut other) = simple_adamw(&[4])?;
    match other.load_state_dict(&sd) {
        Err(Error::ShapeMismatch {
            param: 0,
            key,
            expected,
            found,
        }) => {
            assert_eq!(key, "exp_avg");
            assert_eq!((expected, found), (vec![4], vec![3]));
        }
        other => panic!("expected ShapeMismatch, got {other:?}"),
    }

    // A state tensor is missing.
    let mut sd = stepped_state(&[3])?;
    sd.tensors.remove("state.0.exp_avg_sq");
    let (_, mut opt) = simple_adamw(&[3])?;
    assert!(matches!(
        opt.load_state_dict(&sd),
        Err(Error::MissingState { param: 0, ref key }) if key == "exp_avg_sq"
    ));

    // Another optimizer's state.
    let sd = stepped_state(&[3])?;
    let p = Tensor::zeros([3], (Kind::Float, Device::Cpu));
    let mut sgd = Sgd::new(
        vec![GroupSpec::new(vec![("w".into(), p)])],
        SgdConfig::default(),
    )?;
    assert!(matches!(
        sgd.load_state_dict(&sd),
        Err(Error::OptimizerMismatch { .. })
    ));

    // Another group layout.
    let p = Tensor::zeros([3], (Kind::Float, Device::Cpu));
    let q = Tensor::zeros([3], (Kind::Float, Device::Cpu));
    let mut two = AdamW::new(
        vec![GroupSpec::new(vec![("w".into(), p), ("v".into(), q)])],
        AdamWConfig::default(),
    )?;
    assert!(matches!(
        two.load_state_dict(&sd),
        Err(Error::GroupLayoutMismatch { .. })
    ));

    // Loading nothing from a folder without state files.
    let (_, mut opt) = simple_adamw(&[3])?;
    let missing = std::env::temp_dir().join("tchtrain-optim-no-such-dir");
    assert!(matches!(opt.load(&missing), Err(Error::Io { .. })));
    Ok(())
}

#[test]
fn bad_hyperparameters_are_typed_errors() {
    let _g = lock();
    let p = || {
        vec![GroupSpec::unnamed(vec![Tensor::zeros(
            [2],
            (Kind::Float, Device::Cpu),
        )])]
    };
    let neg_lr = AdamW::new(
        p(),
        AdamWConfig {
            lr: -1.0,
            ..Default::default()
        },
    );
    assert!(matches!(
        neg_lr,
        Err(Error::InvalidHyperparameter { name: "lr", .. })
    ));
    let beta = Adam::new(
        p(),
        AdamConfig {
            betas: (1.0, 0.999),
            ..Default::default()
        },
    );
    assert!(matches!(
        beta,
        Err(Error::InvalidHyperparameter {
            name: "betas[0]",
            ..
        })
    ));
    let group_lr = Sgd::new(
        vec![
            GroupSpec::unnamed(vec![Tensor::zeros([2], (Kind::Float, Device::Cpu))]).with_lr(-0.1),
        ],
        SgdConfig::default(),
    );
    assert!(matches!(
        group_lr,
        Err(Error::InvalidHyperparameter { name: "lr", .. })
    ));
    let nesterov = Sgd::new(
        p(),
        SgdConfig {
            nesterov: true,
            ..Default::default()
        },
    );
    assert!(matches!(nesterov, Err(Error::ConflictingOptions(_))));
    let af = Adafactor::new(
        p(),
        AdafactorConfig {
            lr: Some(1e-3),
            ..Default::default()
        },
    );
    assert!(matches!(af, Err(Error::ConflictingOptions(_))));
}

#[test]
fn clip_grad_norm_matches_torch() -> Result<()> {
    let _g = lock();
    let r = reference()?;
    for (case, meta) in r.meta["clip"].as_object().context("clip")? {
        let norm_type = match &meta["norm_type"] {
            Value::String(s) if s == "inf" => f64::INFINITY,
            v => v.as_f64().context("norm_type")?,
        };
        let max_norm = meta["max_norm"].as_f64().context("max_norm")?;
        let params = fresh_params(&r)?;
        let flat: Vec<Tensor> = params
            .iter()
            .flatten()
            .map(|(_, p)| p.shallow_clone())
            .collect();
        for (n, p) in params.iter().flatten() {
            let g = r.t(&format!("grads.{n}"))?.get(0) * 2.0;
            (p * g).sum(Kind::Float).backward();
        }
        let total = clip_grad_norm(&flat, max_norm, norm_type, false)?;
        let expected = meta["total_norm"].as_f64().context("total_norm")?;
        // Same per-tensor vector_norm and stacking as torch: the f32 totals agree exactly.
        assert_eq!(total.double_value(&[]), expected, "{case}: total norm");
        for (n, p) in params.iter().flatten() {
            let d = max_abs_diff(&p.grad(), r.t(&format!("clip.{case}.{n}"))?);
            assert_eq!(d, 0.0, "{case}: clipped grad of {n} differs by {d:e}");
        }
    }
    Ok(())
}

#[test]
fn clip_grad_norm_nonfinite_and_disabled() -> Result<()> {
    let _g = lock();
    let p = Tensor::zeros([2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    (&p * Tensor::from_slice(&[f32::NAN, 1.0]))
        .sum(Kind::Float)
        .backward();
    let err = clip_grad_norm(&[p.shallow_clone()], 1.0, 2.0, true);
    assert!(matches!(err, Err(Error::NonFiniteNorm { .. })));
    // Without the check the nan norm is returned, as torch does.
    assert!(
        clip_grad_norm(&[p.shallow_clone()], 1.0, 2.0, false)?
            .double_value(&[])
            .is_nan()
    );

    let q = Tensor::zeros([2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    (&q * Tensor::from_slice(&[30.0f32, 40.0]))
        .sum(Kind::Float)
        .backward();
    assert_eq!(clip_grad_norm_if_enabled(&[q.shallow_clone()], 0.0)?, None);
    assert_eq!(
        q.grad().double_value(&[1]),
        40.0,
        "max_grad_norm = 0 leaves grads alone"
    );
    let total = clip_grad_norm_if_enabled(&[q.shallow_clone()], 1.0)?;
    assert_eq!(total, Some(50.0));
    assert!((q.grad().double_value(&[1]) - 0.8).abs() < 1e-6);
    Ok(())
}

#[test]
fn decay_parameter_names_match_trainer() -> Result<()> {
    let _g = lock();
    let r = reference()?;
    for (kind, m) in r.meta["decay"].as_object().context("decay")? {
        let names: Vec<String> = serde_json::from_value(m["names"].clone())?;
        let ln: Vec<String> = serde_json::from_value(m["layernorm_modules"].clone())?;
        let mut expected: Vec<String> = serde_json::from_value(m["decay"].clone())?;
        // Upstream lists children before a module's own parameters; the Trainer only tests
        // membership, so compare as sorted lists.
        let mut got = get_decay_parameter_names(&names, &ln);
        got.sort();
        expected.sort();
        assert_eq!(got, expected, "{kind}");
    }
    // Two groups, upstream order: decay first (with weight_decay), then the rest with 0.
    let t = |rg: bool| Tensor::zeros([1], (Kind::Float, Device::Cpu)).set_requires_grad(rg);
    let named = vec![
        ("h.0.mlp.weight".to_string(), t(true)),
        ("h.0.mlp.bias".to_string(), t(true)),
        ("ln_f.weight".to_string(), t(true)),
        ("frozen.weight".to_string(), t(false)),
    ];
    let groups = decay_param_groups(named, 0.1, &["ln_f"]);
    let names: Vec<Vec<&str>> = groups
        .iter()
        .map(|g| g.params.iter().map(|(n, _)| n.as_str()).collect())
        .collect();
    assert_eq!(
        names,
        vec![vec!["h.0.mlp.weight"], vec!["h.0.mlp.bias", "ln_f.weight"]]
    );
    assert_eq!(
        (groups[0].weight_decay, groups[1].weight_decay),
        (Some(0.1), Some(0.0))
    );
    Ok(())
}

#[test]
fn optim_args_and_factory_follow_trainer_optimizer() -> Result<()> {
    let _g = lock();
    assert!(parse_optim_args(None)?.is_empty());
    assert!(parse_optim_args(Some(""))?.is_empty());
    let a = parse_optim_args(Some("momentum=0.9, nesterov = True,dampening=0"))?;
    assert_eq!(a.len(), 3);
    assert_eq!(a["nesterov"], "True");
    assert!(matches!(
        parse_optim_args(Some("momentum")),
        Err(Error::InvalidOptimArgs { .. })
    ));
    assert!(matches!(
        parse_optim_args(Some("a=1=2")),
        Err(Error::InvalidOptimArgs { .. })
    ));

    let p = || {
        vec![GroupSpec::unnamed(vec![Tensor::zeros(
            [2],
            (Kind::Float, Device::Cpu),
        )])]
    };
    for name in tchtrain_optim::supported_optimizers() {
        // GaLore / APOLLO need `optim_target_modules` and build their own two groups
        // (checked in low_rank.rs).
        if name.starts_with("galore_") || name.starts_with("apollo_") {
            continue;
        }
        let args = OptimizerArgs {
            optim: name.into(),
            learning_rate: 1e-3,
            ..Default::default()
        };
        let opt = create_optimizer(&args, p())?;
        assert_eq!(opt.lrs(), vec![1e-3], "{name}");
    }
    let sgd = OptimizerArgs {
        optim: "sgd".into(),
        optim_args: Some("momentum=0.9,nesterov=true".into()),
        ..Default::default()
    };
    let opt = create_optimizer(&sgd, p())?;
    assert_eq!(opt.hyperparameters()["momentum"], 0.9);
    assert_eq!(opt.hyperparameters()["nesterov"], true);
    let fused = OptimizerArgs {
        optim: "adamw_torch_fused".into(),
        ..Default::default()
    };
    assert_eq!(
        create_optimizer(&fused, p())?.hyperparameters()["fused"],
        true
    );
    for (name, says) in [
        ("adamw_torch_xla", "XLA"),
        ("adamw_anyprecision", "torchdistx"),
        ("adamw_torch_2bit", "not one of upstream's OptimizerNames"),
    ] {
        let bad = OptimizerArgs {
            optim: name.into(),
            ..Default::default()
        };
        match create_optimizer(&bad, p()) {
            Err(e @ Error::UnsupportedOptimizer { .. }) => {
                let text = e.to_string();
                assert!(text.contains(name) && text.contains(says), "{text}");
                assert!(text.contains("use `adamw_torch_fused` instead"), "{text}");
            }
            other => panic!("{name}: {:?}", other.map(|o| o.name())),
        }
    }
    let bad_value = OptimizerArgs {
        optim: "rmsprop".into(),
        optim_args: Some("alpha=abc".into()),
        ..Default::default()
    };
    assert!(matches!(
        create_optimizer(&bad_value, p()),
        Err(Error::InvalidOptimArgValue { .. })
    ));
    Ok(())
}

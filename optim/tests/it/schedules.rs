//! Every scheduler against `scripts/reference/optim_schedules.py` (transformers 5.23
//! `get_scheduler` on torch 2.13), state resume, and typed errors for bad arguments.

use std::path::PathBuf;
use tchtrain_testing::lock;

use anyhow::{Context, Result};
use serde_json::Value;
use tch::{Device, Kind, Tensor};
use tchtrain_optim::{
    Error, GroupSpec, LrScheduler, Optimizer, SCHEDULER_TYPES, Sgd, SgdConfig, get_scheduler,
};

fn reference() -> Result<Value> {
    let path = std::env::var_os("TCHTRAIN_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../assets"))
        .join("reference/optim_schedules/optim_schedules.json");
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "{} is missing: run `cargo xtask setup` to generate the reference values",
            path.display()
        )
    })?;
    Ok(serde_json::from_str(&text)?)
}

/// The reference's optimizer: SGD with default lr 1e-3 and groups at 1e-3 and 5e-4.
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

fn step(s: &mut dyn LrScheduler, opt: &mut dyn Optimizer, metric: f64) -> Result<()> {
    if s.steps_on_metric() {
        s.step_with_metric(opt, metric)?
    } else {
        s.step(opt)?
    }
    Ok(())
}

fn build(case: &Value, opt: &mut dyn Optimizer, steps: i64) -> Result<Box<dyn LrScheduler>> {
    Ok(get_scheduler(
        case["name"].as_str().context("name")?,
        opt,
        case["warmup"].as_i64(),
        Some(steps),
        case["kwargs"].as_object(),
    )?)
}

#[test]
fn every_scheduler_matches_transformers_at_every_step() -> Result<()> {
    let _g = lock();
    let r = reference()?;
    let steps = r["steps"].as_i64().context("steps")?;
    let metrics: Vec<f64> = serde_json::from_value(r["metrics"].clone())?;
    let cases = r["cases"].as_object().context("cases")?;
    let mut covered = std::collections::BTreeSet::new();
    let mut worst = 0.0f64;
    for (case, c) in cases {
        covered.insert(c["name"].as_str().context("name")?.to_string());
        let expected: Vec<Vec<f64>> = serde_json::from_value(c["lrs"].clone())?;
        let mut opt = optimizer()?;
        let mut s = build(c, &mut opt, steps)?;
        let mut got = vec![s.get_last_lr().to_vec()];
        for &m in &metrics[..steps as usize] {
            step(s.as_mut(), &mut opt, m)?;
            assert_eq!(
                opt.lrs(),
                s.get_last_lr(),
                "{case}: optimizer and scheduler disagree"
            );
            got.push(s.get_last_lr().to_vec());
        }
        assert_eq!(got.len(), expected.len(), "{case}");
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            for (a, b) in g.iter().zip(e) {
                let d = (a - b).abs();
                worst = worst.max(d);
                // Same f64 formulas in Python's operation order with the same libm: the issue
                // bound is 1e-12, and in practice the values are identical.
                assert!(d <= 1e-12, "{case} step {i}: {a} vs {b}");
            }
        }
    }
    println!("scheduler max abs error: {worst:e}");
    let all: std::collections::BTreeSet<String> =
        SCHEDULER_TYPES.iter().map(|s| s.to_string()).collect();
    assert_eq!(covered, all, "every SchedulerType has a reference case");
    Ok(())
}

#[test]
fn scheduler_state_resumes_identically() -> Result<()> {
    let _g = lock();
    let r = reference()?;
    let steps = r["steps"].as_i64().context("steps")?;
    let metrics: Vec<f64> = serde_json::from_value(r["metrics"].clone())?;
    for (case, c) in r["cases"].as_object().context("cases")? {
        let mut opt = optimizer()?;
        let mut s = build(c, &mut opt, steps)?;
        for &m in &metrics[..37] {
            step(s.as_mut(), &mut opt, m)?;
        }
        let dir =
            std::env::temp_dir().join(format!("tchtrain-sched-{}-{case}", std::process::id()));
        opt.save(&dir)?;
        s.save(&dir)?;
        let mut rest = Vec::new();
        for &m in &metrics[37..] {
            step(s.as_mut(), &mut opt, m)?;
            rest.push(s.get_last_lr().to_vec());
        }

        // The Trainer's resume order: fresh optimizer and scheduler, then load both states.
        let mut opt2 = optimizer()?;
        let mut s2 = build(c, &mut opt2, steps)?;
        opt2.load(&dir)?;
        s2.load(&dir)?;
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(
            s2.last_epoch(),
            s.last_epoch() - (metrics.len() - 37) as i64,
            "{case}"
        );
        for (k, &m) in metrics[37..].iter().enumerate() {
            step(s2.as_mut(), &mut opt2, m)?;
            assert_eq!(
                s2.get_last_lr(),
                rest[k].as_slice(),
                "{case}: resumed step {k}"
            );
        }
    }
    Ok(())
}

#[test]
fn last_epoch_resumes_from_initial_lr() -> Result<()> {
    let _g = lock();
    let mut opt = optimizer()?;
    let kwargs = serde_json::json!({"last_epoch": 4});
    // No initial_lr in the groups yet: torch raises KeyError; here a typed error.
    let err = get_scheduler("linear", &mut opt, Some(10), Some(100), kwargs.as_object());
    assert!(matches!(err, Err(Error::SchedulerStateMismatch { .. })));
    // Once a scheduler has set initial_lr, last_epoch = 4 continues at step 5.
    let _first = get_scheduler("linear", &mut opt, Some(10), Some(100), None)?;
    let s = get_scheduler("linear", &mut opt, Some(10), Some(100), kwargs.as_object())?;
    assert_eq!(s.last_epoch(), 5);
    assert_eq!(s.get_last_lr(), &[1e-3 * 0.5, 5e-4 * 0.5]);
    Ok(())
}

#[test]
fn bad_scheduler_arguments_are_typed_errors() -> Result<()> {
    let _g = lock();
    let mut opt = optimizer()?;
    let kw = serde_json::json!({"num_cycles": 2, "min_lr": 1e-5});
    match get_scheduler("cosine", &mut opt, Some(1), Some(10), kw.as_object()) {
        Err(Error::UnknownSchedulerKwarg {
            scheduler,
            kwarg,
            accepted,
        }) => {
            assert_eq!((scheduler.as_str(), kwarg.as_str()), ("cosine", "min_lr"));
            assert_eq!(accepted, "num_cycles, last_epoch");
        }
        other => panic!(
            "expected UnknownSchedulerKwarg, got {:?}",
            other.map(|s| s.name().to_string())
        ),
    }
    let kw = serde_json::json!({"patience": 2, "warmup": 3});
    assert!(matches!(
        get_scheduler("reduce_lr_on_plateau", &mut opt, None, None, kw.as_object()),
        Err(Error::UnknownSchedulerKwarg { .. })
    ));
    assert!(matches!(
        get_scheduler("cosine_annealing", &mut opt, Some(1), Some(10), None),
        Err(Error::UnknownScheduler { .. })
    ));
    assert!(matches!(
        get_scheduler("linear", &mut opt, None, Some(10), None),
        Err(Error::MissingSchedulerArgument {
            argument: "num_warmup_steps",
            ..
        })
    ));
    assert!(matches!(
        get_scheduler("cosine", &mut opt, Some(1), None, None),
        Err(Error::MissingSchedulerArgument {
            argument: "num_training_steps",
            ..
        })
    ));
    assert!(matches!(
        get_scheduler("cosine_with_min_lr", &mut opt, Some(1), Some(10), None),
        Err(Error::InvalidSchedulerKwarg { .. })
    ));
    let kw = serde_json::json!({"lr_end": 1.0});
    assert!(matches!(
        get_scheduler("polynomial", &mut opt, Some(1), Some(10), kw.as_object()),
        Err(Error::InvalidSchedulerKwarg { .. })
    ));
    let kw = serde_json::json!({"num_decay_steps": 5, "decay_type": "exp"});
    assert!(matches!(
        get_scheduler(
            "warmup_stable_decay",
            &mut opt,
            Some(1),
            Some(10),
            kw.as_object()
        ),
        Err(Error::InvalidSchedulerKwarg { .. })
    ));
    let kw = serde_json::json!({"num_cycles": "two"});
    assert!(matches!(
        get_scheduler("cosine", &mut opt, Some(1), Some(10), kw.as_object()),
        Err(Error::InvalidSchedulerKwarg { .. })
    ));
    let kw = serde_json::json!({"factor": 1.5});
    assert!(matches!(
        get_scheduler("greedy", &mut opt, None, None, kw.as_object()),
        Err(Error::InvalidSchedulerKwarg { .. })
    ));
    // Stepping the wrong way.
    let mut plateau = get_scheduler("reduce_lr_on_plateau", &mut opt, None, None, None)?;
    assert!(matches!(
        plateau.step(&mut opt),
        Err(Error::WrongStepKind { .. })
    ));
    let mut linear = get_scheduler("linear", &mut opt, Some(1), Some(10), None)?;
    assert!(matches!(
        linear.step_with_metric(&mut opt, 1.0),
        Err(Error::WrongStepKind { .. })
    ));
    // A state of another scheduler.
    assert!(matches!(
        linear.load_state_dict(&plateau.state_dict()),
        Err(Error::SchedulerStateMismatch { .. })
    ));
    Ok(())
}

//! DeepSpeed's `scheduler` section (`DeepSpeedLR::from_config`: `WarmupLR`, `WarmupDecayLR`,
//! `WarmupCosineLR` and their params) on any JSON, over a two-group SGD: construction, a few
//! steps, the state saved and loaded into a second schedule. Any outcome but a panic; every
//! learning rate a schedule sets is a number (finite or not, never a crash).

use tch::{Device, Kind, Tensor};
use tchtrain_deepspeed::DeepSpeedLR;
use tchtrain_optim::{GroupSpec, LrScheduler, Sgd, SgdConfig};

fn optimizer() -> Option<Sgd> {
    let t = || Tensor::zeros([2], (Kind::Float, Device::Cpu));
    Sgd::new(
        vec![
            GroupSpec::new(vec![("w".into(), t())]),
            GroupSpec::new(vec![("b".into(), t())]).with_lr(5e-4),
        ],
        SgdConfig {
            lr: 1e-3,
            ..Default::default()
        },
    )
    .ok()
}

/// One input.
pub fn run(data: &[u8]) {
    let Ok(section) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let Some(mut opt) = optimizer() else {
        return;
    };
    let Ok(mut schedule) = DeepSpeedLR::from_config(&section, &mut opt) else {
        return;
    };
    for _ in 0..4 {
        if schedule.step(&mut opt).is_err() {
            return;
        }
    }
    let state = schedule.state_dict();
    let Some(mut other_opt) = optimizer() else {
        return;
    };
    if let Ok(mut other) = DeepSpeedLR::from_config(&section, &mut other_opt) {
        let _ = other.load_state_dict(&state);
        let _ = other.step(&mut other_opt);
    }
}

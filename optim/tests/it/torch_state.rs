//! torch's `optimizer.pt` / `scheduler.pt` / `scaler.pt` forms of our states: written, read
//! back through `tchtrain-serialization`, and restored with the parameters renumbered in
//! upstream's `named_parameters()` order.

use anyhow::Result;
use tch::{Device, Kind, Tensor, nn};
use tchtrain_optim::{
    AdamW, AdamWConfig, GradScalerState, GroupSpec, Optimizer, grad_scaler_from_torch,
    grad_scaler_to_torch, optimizer_from_torch, optimizer_to_torch,
};
use tchtrain_serialization::{LoadOptions, TorchFile, Value, save_to_vec};

/// `torch.save` then `torch.load(weights_only=True)`, in memory.
fn reload(value: &Value) -> Result<Value> {
    let mut file = TorchFile::from_bytes(save_to_vec(value)?, "state.pt")?;
    Ok(file.load(&LoadOptions::default())?)
}

fn adamw(vs: &nn::VarStore, fused: bool) -> Result<AdamW> {
    let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(AdamW::new(
        vec![GroupSpec::new(named).with_weight_decay(0.01)],
        AdamWConfig {
            lr: 0.1,
            fused,
            ..Default::default()
        },
    )?)
}

#[test]
fn adamw_state_round_trips_through_optimizer_pt_in_upstream_order() -> Result<()> {
    let _g = tchtrain_testing::lock();
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    // Created (upstream's registration order) b then a; our group holds them a, b.
    let b = vs.root().randn("b", &[3], 0.0, 1.0);
    let a = vs.root().randn("a", &[2, 2], 0.0, 1.0);
    let mut opt = adamw(&vs, true)?;
    for _ in 0..2 {
        opt.zero_grad();
        (a.square().sum(Kind::Float) + b.sum(Kind::Float)).backward();
        opt.step()?;
    }
    let order = vec!["b".to_string(), "a".to_string()];
    let value = optimizer_to_torch(&opt, &order)?;
    let value = reload(&value)?;
    // torch's index 0 is `b`: its state has b's shape; step is a 0-d float32 tensor.
    let state0 = value.get("state").unwrap().as_dict().unwrap()[0].1.clone();
    assert_eq!(
        state0.get("exp_avg").unwrap().as_tensor().unwrap().size,
        [3]
    );
    let step = state0.get("step").unwrap().as_tensor().unwrap();
    assert_eq!(step.to_f64_vec()?.unwrap(), [2.0]);
    let group = &value.get("param_groups").unwrap().as_seq().unwrap()[0];
    assert_eq!(group.get("fused"), Some(&Value::Bool(true)));

    let mut fresh = adamw(&vs, true)?;
    let differences = optimizer_from_torch(&mut fresh, &value, &order)?;
    assert!(differences.is_empty(), "{differences:?}");
    let (x, y) = (opt.state_dict()?, fresh.state_dict()?);
    assert_eq!(x.meta, y.meta);
    for (k, t) in &x.tensors {
        assert!(t.equal(&y.tensors[k]), "{k}");
    }
    // The wrong order puts b's state on a: an error naming the parameter.
    let wrong = vec!["a".to_string(), "b".to_string()];
    let err = optimizer_from_torch(&mut adamw(&vs, true)?, &value, &wrong).unwrap_err();
    assert!(err.to_string().contains("parameter `a`"), "{err}");
    Ok(())
}

#[test]
fn grad_scaler_state_round_trips_through_scaler_pt() -> Result<()> {
    let state = GradScalerState {
        scale: 131072.0,
        growth_factor: 2.0,
        backoff_factor: 0.5,
        growth_interval: 4,
        growth_tracker: 2,
    };
    let value = reload(&grad_scaler_to_torch(&state))?;
    assert_eq!(grad_scaler_from_torch(&value)?, state);
    Ok(())
}

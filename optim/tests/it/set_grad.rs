//! `set_grad` (torch's `p.grad = g`): an optimizer stepping on gradients assigned by hand
//! takes exactly the step it takes after `backward()` produced the same gradients, the
//! assignment shares storage, `None` removes the gradient, and mismatches are errors.

use anyhow::Result;
use tch::{Device, Kind, Tensor};
use tchtrain_optim::{AdamW, AdamWConfig, GroupSpec, Optimizer, set_grad};
use tchtrain_testing::lock;

fn params() -> Vec<Tensor> {
    tch::manual_seed(3);
    vec![
        Tensor::randn([4, 3], (Kind::Float, Device::Cpu)).set_requires_grad(true),
        Tensor::randn([5], (Kind::Float, Device::Cpu)).set_requires_grad(true),
    ]
}

fn adamw(ps: &[Tensor]) -> Result<AdamW> {
    Ok(AdamW::new(
        vec![
            GroupSpec::unnamed(ps.iter().map(Tensor::shallow_clone).collect())
                .with_weight_decay(0.1),
        ],
        AdamWConfig {
            lr: 0.01,
            ..Default::default()
        },
    )?)
}

#[test]
fn assigned_gradients_step_like_backward() -> Result<()> {
    let _g = lock();
    let a = params();
    let b: Vec<Tensor> = a
        .iter()
        .map(|p| p.detach().copy().set_requires_grad(true))
        .collect();
    let (mut opt_a, mut opt_b) = (adamw(&a)?, adamw(&b)?);
    for step in 0..3 {
        let loss = a
            .iter()
            .map(|p| (p * p * (step + 1) as f64).sum(Kind::Float))
            .reduce(|x, y| x + y)
            .unwrap();
        loss.backward();
        for (pa, pb) in a.iter().zip(&b) {
            set_grad(pb, Some(&pa.grad().copy()))?;
        }
        opt_a.step()?;
        opt_b.step()?;
        opt_a.zero_grad();
        opt_b.zero_grad();
    }
    for (pa, pb) in a.iter().zip(&b) {
        // The same ops on the same values: bit-identical.
        assert_eq!(
            pa.f_sub(pb)?.abs().max().double_value(&[]),
            0.0,
            "parameters differ"
        );
    }
    Ok(())
}

#[test]
fn assignment_shares_storage_and_none_clears() -> Result<()> {
    let _g = lock();
    let p = Tensor::zeros([3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let mut g = Tensor::ones([3], (Kind::Float, Device::Cpu));
    set_grad(&p, Some(&g))?;
    let _ = g.fill_(7.0);
    assert_eq!(Vec::<f32>::try_from(&p.grad())?, [7.0, 7.0, 7.0]);
    // Every handle on the parameter sees it.
    assert!(p.shallow_clone().grad().defined());
    set_grad(&p, None)?;
    assert!(!p.grad().defined());
    Ok(())
}

#[test]
fn mismatching_gradients_are_errors() {
    let _g = lock();
    let p = Tensor::zeros([3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let shape = set_grad(&p, Some(&Tensor::zeros([4], (Kind::Float, Device::Cpu))));
    assert!(
        shape
            .as_ref()
            .is_err_and(|e| e.to_string().contains("different size")),
        "{shape:?}"
    );
    let kind = set_grad(&p, Some(&Tensor::zeros([3], (Kind::Double, Device::Cpu))));
    assert!(
        kind.as_ref()
            .is_err_and(|e| e.to_string().contains("different type")),
        "{kind:?}"
    );
    assert!(!p.grad().defined(), "a refused gradient is not kept");
}

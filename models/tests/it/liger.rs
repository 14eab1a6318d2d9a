//! Liger's fused linear + cross-entropy (`use_liger_kernel`) against the plain path on the
//! same model: the loss computed chunk by chunk without the logits within 1e-6 relative, and
//! every gradient within 2e-6 relative (to the largest magnitude of each plain tensor). Both
//! are fp32 and differ only in summation order (per chunk, then over chunks): against the same
//! model in float64 each path is about 6e-7 off (measured), so they may differ by the sum of
//! the two; the fused path must be at most twice as far from float64 as the plain one.

use anyhow::{Context, Result};
use tch::{Device, Kind, Tensor};
use tchtrain_models::{AutoTask, LoadOptions, ModelInputs, PreTrainedModel, from_pretrained_dir};
use tchtrain_testing::{assets, lock};

fn rel(a: &Tensor, b: &Tensor) -> f64 {
    let scale = b.abs().max().double_value(&[]).max(1e-30);
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
        / scale
}

/// A step's loss, gradients by name, and whether the output had logits.
type Step = (Tensor, Vec<(String, Tensor)>, bool);

/// Loss and gradients of one training forward / backward.
fn step(model: &dyn PreTrainedModel, inputs: &ModelInputs<'_>) -> Result<Step> {
    for (_, v) in model.var_store().variables() {
        let mut g = v.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
    let out = model.forward(inputs)?;
    let loss = out.loss.context("loss")?;
    loss.backward();
    let mut grads: Vec<(String, Tensor)> = model
        .var_store()
        .variables()
        .into_iter()
        .map(|(k, v)| (k, v.grad().copy()))
        .collect();
    grads.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((loss.detach(), grads, out.logits.is_some()))
}

#[test]
fn liger_fused_linear_cross_entropy_equals_the_plain_loss() -> Result<()> {
    let _g = lock();
    let dir = assets().join("tiny-llama");
    let load = || -> Result<Box<dyn PreTrainedModel>> {
        let mut m = from_pretrained_dir(
            &dir,
            AutoTask::CausalLm,
            Device::Cpu,
            &LoadOptions::default(),
        )?
        .model;
        m.train();
        Ok(m)
    };
    let plain = load()?;
    let mut liger = load()?;
    liger.apply_liger_kernel(None)?;
    // The same model in float64: how far each fp32 path is from the exact result.
    let mut exact = load()?;
    exact.var_store_mut().double();
    // 3 rows of 40 tokens (120 rows of a 49152-wide head: chunks of 2 rows), one row
    // partly padded with -100.
    tch::manual_seed(0);
    let ids = Tensor::randint(49152, [3, 40], (Kind::Int64, Device::Cpu));
    let labels = ids.copy();
    let _ = labels.narrow(1, 30, 10).get(2).fill_(-100);
    let count = Tensor::from(100.0f32);
    for num_items in [None, Some(&count)] {
        let inputs = ModelInputs {
            input_ids: Some(&ids),
            labels: Some(&labels),
            num_items_in_batch: num_items,
            ..Default::default()
        };
        let (want, want_grads, has_logits) = step(&*plain, &inputs)?;
        assert!(has_logits);
        let (got, got_grads, has_logits) = step(&*liger, &inputs)?;
        assert!(!has_logits, "the fused loss materialises no logits");
        let (truth, truth_grads, _) = step(&*exact, &inputs)?;
        let loss_rel = rel(&got, &want);
        assert!(loss_rel <= 1e-6, "loss {got:?} vs {want:?}: {loss_rel:e}");
        // Each fp32 path against float64: the fused one is as accurate as the plain one.
        let (mut worst, mut worst_plain) = (0.0f64, 0.0f64);
        for (((name, g), (_, w)), (_, t)) in got_grads.iter().zip(&want_grads).zip(&truth_grads) {
            let d = rel(g, w);
            assert!(d <= 2e-6, "grad of {name}: {d:e}");
            worst = worst.max(rel(g, t));
            worst_plain = worst_plain.max(rel(w, t));
        }
        assert!(
            worst <= 2.0 * worst_plain,
            "{worst:e} vs the plain path's {worst_plain:e}"
        );
        println!(
            "num_items {num_items:?}: loss rel {loss_rel:.1e}; worst grad rel to float64 {worst:.1e} (plain {worst_plain:.1e}); plain loss rel to float64 {:.1e}",
            rel(&want, &truth)
        );
    }
    // In evaluation mode the logits are computed (the plain path), unless skipped.
    liger.eval();
    let inputs = ModelInputs {
        input_ids: Some(&ids),
        labels: Some(&labels),
        ..Default::default()
    };
    let out = tch::no_grad(|| liger.forward(&inputs))?;
    assert!(out.logits.is_some());
    let skipped = ModelInputs {
        skip_logits: Some(true),
        ..inputs
    };
    let out = tch::no_grad(|| liger.forward(&skipped))?;
    assert!(out.logits.is_none() && out.loss.is_some());
    assert!(
        out.logits()
            .unwrap_err()
            .to_string()
            .contains("use_liger_kernel")
    );
    Ok(())
}

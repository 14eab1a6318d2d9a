//! Comparing a run's `log_history` with upstream's (the reference scripts write
//! `trainer.state.log_history` as JSON): the same entries, steps and epochs, and the largest
//! relative difference of each logged value.

use anyhow::{Context, Result};
use tchtrain_training_args::{JsonMap, JsonValue};

fn num(entry: &JsonMap, key: &str) -> Option<f64> {
    entry.get(key).and_then(JsonValue::as_f64)
}

/// Relative difference; 0 for equal values (infinities of one sign, two NaNs), infinite
/// when only one side is a NaN or infinite (so a `max` over a log never hides it).
pub fn rel(a: f64, b: f64) -> f64 {
    if a == b || (a.is_nan() && b.is_nan()) {
        return 0.0;
    }
    if !a.is_finite() || !b.is_finite() {
        return f64::INFINITY;
    }
    (a - b).abs() / b.abs().max(1e-12)
}

/// The largest relative differences over a run's log.
#[derive(Debug, Default)]
pub struct MaxRel {
    /// Of the training losses.
    pub loss: f64,
    /// Of the gradient norms.
    pub grad_norm: f64,
    /// Of the learning rates.
    pub learning_rate: f64,
    /// Of the evaluation losses.
    pub eval_loss: f64,
}

/// Compares a Trainer's `log_history` (`trainer.state.log_history`) with upstream's entry by entry: same steps and
/// epochs, the returned relative differences on the logged values.
pub fn compare(name: &str, ours: &[JsonMap], expected: &serde_json::Value) -> Result<MaxRel> {
    compare_within(name, ours, expected, 0.0)
}

/// [`compare`], with `train_loss` (the mean of the run's losses) allowed `train_loss_bound`
/// relative (0: equal).
pub fn compare_within(
    name: &str,
    ours: &[JsonMap],
    expected: &serde_json::Value,
    train_loss_bound: f64,
) -> Result<MaxRel> {
    let expected = expected.as_array().context("log_history")?;
    assert_eq!(ours.len(), expected.len(), "{name}: number of log entries");
    let mut m = MaxRel::default();
    for (i, (o, e)) in ours.iter().zip(expected).enumerate() {
        // Non-finite numbers are written as the strings "inf" / "nan" (trainer_fp16.py).
        let e_num = |k: &str| {
            e.get(k).and_then(|v| {
                v.as_f64()
                    .or_else(|| v.as_str().and_then(|s| s.parse::<f64>().ok()))
            })
        };
        assert_eq!(
            o.get("step").and_then(JsonValue::as_i64),
            e["step"].as_i64(),
            "{name} entry {i}: step"
        );
        let (oe, ee) = (num(o, "epoch").context("epoch")?, e_num("epoch").unwrap());
        assert!(rel(oe, ee) < 1e-12, "{name} entry {i}: epoch {oe} vs {ee}");
        if let Some(want) = e_num("loss") {
            m.loss = m.loss.max(rel(num(o, "loss").context("loss")?, want));
            m.grad_norm = m.grad_norm.max(rel(
                num(o, "grad_norm").context("grad_norm")?,
                e_num("grad_norm").context("upstream grad_norm")?,
            ));
            m.learning_rate = m.learning_rate.max(rel(
                num(o, "learning_rate").context("learning_rate")?,
                e_num("learning_rate").context("upstream learning_rate")?,
            ));
        }
        if let Some(want) = e_num("eval_loss") {
            m.eval_loss = m
                .eval_loss
                .max(rel(num(o, "eval_loss").context("eval_loss")?, want));
        }
        if let Some(want) = e_num("train_loss") {
            let got = num(o, "train_loss").context("train_loss")?;
            assert!(
                rel(got, want) <= train_loss_bound,
                "{name}: train_loss {got} vs {want}"
            );
            assert_eq!(
                num(o, "total_flos"),
                e_num("total_flos"),
                "{name}: total_flos"
            );
        }
    }
    println!(
        "{name}: max relative difference loss {:.2e}, grad_norm {:.2e}, learning_rate {:.2e}, eval_loss {:.2e}",
        m.loss, m.grad_norm, m.learning_rate, m.eval_loss
    );
    Ok(m)
}

/// Every logged value equal to upstream's, to the bit. Both sides run the very same libtorch
/// (the Rust side links the reference virtualenv's `libtorch_cpu.so`) on the same shapes, in
/// the same op order (parameters in upstream's registration order, numpy's mean for the
/// evaluation loss) and with the same intra-op thread count (`cargo xtask test` sets the
/// reference scripts' 2): the same kernels give the same bits, over every step.
pub fn assert_exact(name: &str, m: &MaxRel) {
    assert!(m.loss == 0.0, "{name}: loss {:e}", m.loss);
    assert!(m.grad_norm == 0.0, "{name}: grad_norm {:e}", m.grad_norm);
    assert!(
        m.learning_rate == 0.0,
        "{name}: learning_rate {:e}",
        m.learning_rate
    );
    assert!(m.eval_loss == 0.0, "{name}: eval_loss {:e}", m.eval_loss);
}

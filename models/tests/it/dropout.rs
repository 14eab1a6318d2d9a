//! `tchtrain_models::dropout` against libtorch's own `dropout` in the same process: from the
//! same generator state, the same output bits, the same gradient bits, and the generator left
//! in the same state (the next draw equal), for shapes across the mt19937 block boundary,
//! dropout rates from 0.05 to 0.9, and the cases that go to libtorch's own op (no training,
//! p = 0 or 1, non-contiguous input, float64).

use anyhow::{Result, ensure};
use tch::{Device, Kind, Tensor};
use tchtrain_models::{dropout, dropout_fast_path};
use tchtrain_testing::lock;

/// Output, gradient and the generator's next draw after `f` from seed `seed`.
fn run(seed: i64, x: &Tensor, f: impl Fn(&Tensor) -> Tensor) -> (Tensor, Tensor, Tensor) {
    tch::manual_seed(seed);
    let x = x.detach().set_requires_grad(true);
    let y = f(&x);
    // A gradient that is not all ones, so the backward's multiply is checked too.
    let w = Tensor::arange(y.numel() as i64, (Kind::Float, Device::Cpu))
        .reshape(y.size())
        .to_kind(y.kind())
        / 7.0;
    (&y * &w).sum(y.kind()).backward();
    let next = Tensor::rand([4], (Kind::Double, Device::Cpu));
    (y.detach(), x.grad(), next)
}

fn same_bits(a: &Tensor, b: &Tensor) -> bool {
    a.size() == b.size()
        && a.kind() == b.kind()
        && a.to_kind(Kind::Double)
            .eq_tensor(&b.to_kind(Kind::Double))
            .all()
            .int64_value(&[])
            == 1
        && a.signbit().eq_tensor(&b.signbit()).all().int64_value(&[]) == 1
}

#[test]
fn dropout_draws_libtorchs_noise_and_leaves_the_generator_as_libtorch() -> Result<()> {
    let _guard = lock();
    ensure!(
        dropout_fast_path(),
        "the self-check of csrc/dropout.cpp failed: this libtorch's bernoulli_ draws differently"
    );
    let shapes: [&[i64]; 6] = [&[1], &[3, 5], &[311], &[624], &[2, 1249], &[4, 128, 576]];
    let mut seed = 7;
    for shape in shapes {
        for p in [0.05, 0.1, 0.5, 0.9] {
            for train in [true, false] {
                seed += 1;
                tch::manual_seed(1000 + seed);
                let x = Tensor::randn(shape, (Kind::Float, Device::Cpu));
                let theirs = run(seed, &x, |x| x.dropout(p, train));
                let ours = run(seed, &x, |x| dropout(x, p, train));
                for (what, a, b) in [
                    ("output", &ours.0, &theirs.0),
                    ("gradient", &ours.1, &theirs.1),
                    ("next draw", &ours.2, &theirs.2),
                ] {
                    ensure!(
                        same_bits(a, b),
                        "{what} differs: shape {shape:?}, p {p}, train {train}"
                    );
                }
                if train && shape.len() == 3 {
                    // The noise really drops about p of the elements.
                    let dropped = ours
                        .0
                        .eq(0.0)
                        .to_kind(Kind::Double)
                        .mean(Kind::Double)
                        .double_value(&[]);
                    ensure!((dropped - p).abs() < 0.01, "p {p}: dropped {dropped}");
                }
            }
        }
    }
    Ok(())
}

#[test]
fn inputs_libtorch_handles_itself_give_libtorchs_results() -> Result<()> {
    let _guard = lock();
    tch::manual_seed(3);
    let x = Tensor::randn([64, 48], (Kind::Float, Device::Cpu));
    let cases: Vec<(&str, Tensor, f64)> = vec![
        ("p = 0", x.shallow_clone(), 0.0),
        ("p = 1", x.shallow_clone(), 1.0),
        ("non-contiguous", x.transpose(0, 1), 0.2),
        ("float64", x.to_kind(Kind::Double), 0.2),
    ];
    for (what, x, p) in cases {
        let theirs = run(11, &x, |x| x.dropout(p, true));
        let ours = run(11, &x, |x| dropout(x, p, true));
        ensure!(same_bits(&ours.0, &theirs.0), "{what}: output differs");
        ensure!(same_bits(&ours.1, &theirs.1), "{what}: gradient differs");
        ensure!(same_bits(&ours.2, &theirs.2), "{what}: next draw differs");
    }
    Ok(())
}

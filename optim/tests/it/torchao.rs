//! torchao's low-bit AdamW (`adamw_torch_8bit`, `adamw_torch_4bit`) against torchao 0.18 run by
//! `scripts/reference/optim_packages.py` (its `adamw_torch_*bit*` cases): after 50 steps the
//! parameters, the plain states, and the quantized states' codes and block scales are
//! bit-identical to torchao's (its step compiled by inductor on this CPU).

use anyhow::{Context, Result, ensure};
use tch::{Device, Kind, Tensor};
use tchtrain_optim::{
    Error, GroupSpec, LowBitAdamW, LowBitAdamWConfig, Optimizer, OptimizerArgs, StateBits,
    create_optimizer, decay_param_groups,
};
use tchtrain_testing::lock;

use crate::packages::{LAYERNORMS, Reference, reference, relative_diff};

/// The reference's torchao cases.
fn torchao_cases(r: &Reference) -> Result<Vec<String>> {
    let cases: Vec<String> = r.meta["cases"]
        .as_object()
        .context("cases")?
        .iter()
        .filter(|(_, c)| {
            c["class"]
                .as_str()
                .is_some_and(|s| s.starts_with("torchao."))
        })
        .map(|(k, _)| k.clone())
        .collect();
    ensure!(!cases.is_empty(), "no torchao case in optim_packages.json");
    Ok(cases)
}

/// Number of elements where `a` and `b` differ (bit patterns for floats: `-0.0 != 0.0`).
fn mismatches(a: &Tensor, b: &Tensor) -> Result<i64> {
    ensure!(
        a.size() == b.size(),
        "shapes {:?} / {:?}",
        a.size(),
        b.size()
    );
    ensure!(
        a.kind() == b.kind(),
        "kinds {:?} / {:?}",
        a.kind(),
        b.kind()
    );
    let (a, b) = match a.kind() {
        Kind::Float => (a.view_dtype(Kind::Int), b.view_dtype(Kind::Int)),
        _ => (a.shallow_clone(), b.shallow_clone()),
    };
    Ok(a.ne_tensor(&b).sum(Kind::Int64).int64_value(&[]))
}

#[test]
fn low_bit_adamw_matches_torchao_bit_for_bit() -> Result<()> {
    let _g = lock();
    let r = reference()?;
    let mut report = Vec::new();
    for case in torchao_cases(&r)? {
        let (params, opt) = r.run(&case)?;
        let mut worst = 0.0f64;
        let mut param_mismatches = 0;
        for (n, p) in &params {
            let want = r.t(&format!("{case}.final.{n}"))?;
            worst = worst.max(relative_diff(p, want));
            param_mismatches += mismatches(&p.detach(), want)?;
        }
        let (mut codes, mut codes_total, mut others) = (0, 0, 0);
        let mut quantized = 0;
        // Flat state indices follow the groups (decayed parameters first).
        let names: Vec<String> = opt
            .param_groups()
            .iter()
            .flat_map(|g| g.param_names.clone())
            .collect();
        for (i, n) in names.iter().enumerate() {
            let st = opt.state()[i].as_ref().context("state missing")?;
            let prefix = format!("{case}.state.{n}.");
            let want: Vec<(&str, &Tensor)> = r
                .tensors
                .iter()
                .filter_map(|(k, t)| k.strip_prefix(&prefix).map(|k| (k, t)))
                .filter(|(k, _)| *k != "step" && !k.ends_with(".qmap"))
                .collect();
            let keys: Vec<&String> = st.tensors.keys().collect();
            ensure!(
                want.iter()
                    .map(|(k, _)| *k)
                    .eq(keys.iter().map(|k| k.as_str())),
                "{case} {n}: state keys {keys:?}, torchao has {:?}",
                want.iter().map(|(k, _)| k).collect::<Vec<_>>()
            );
            let step = r.t(&format!("{prefix}step"))?.double_value(&[]);
            ensure!(st.step as f64 == step, "{case} {n}: step {}", st.step);
            for (key, t) in want {
                let found = &st.tensors[key];
                if key.ends_with(".codes") {
                    quantized += 1;
                    codes += mismatches(found, t)?;
                    codes_total += t.numel() as i64;
                } else {
                    others += mismatches(found, t)?;
                }
            }
        }
        report.push(format!(
            "{case:28} params {worst:.1e} ({param_mismatches} elements differ), \
             {quantized} quantized states: {codes} of {codes_total} codes differ, \
             {others} scale / plain-state elements differ"
        ));
        // Same kernel arithmetic (see optim/src/torchao.rs): nothing may differ.
        ensure!(
            param_mismatches == 0,
            "{case}: parameters differ ({worst:e})"
        );
        ensure!(codes == 0, "{case}: {codes} codes differ");
        ensure!(
            others == 0,
            "{case}: {others} scale / state elements differ"
        );
    }
    println!("torchao low-bit AdamW vs torchao:\n{}", report.join("\n"));
    Ok(())
}

#[test]
fn low_bit_adamw_state_values_are_torchaos_dequantized_states() -> Result<()> {
    let _g = lock();
    let r = reference()?;
    for (case, bits, block_size) in [
        ("adamw_torch_8bit", StateBits::Eight, 256),
        ("adamw_torch_4bit_block128", StateBits::Four, 128),
    ] {
        let args = r.optimizer_args(case)?;
        let params = r.fresh_params()?;
        let named = params
            .iter()
            .map(|(n, t)| (n.clone(), t.shallow_clone()))
            .collect();
        let mut opt = LowBitAdamW::new(
            decay_param_groups(named, args.weight_decay, &LAYERNORMS),
            LowBitAdamWConfig {
                bits,
                lr: args.learning_rate,
                block_size,
                ..Default::default()
            },
        )?;
        for step in 0..r.steps() {
            r.step(&params, &mut opt, step)?;
        }
        // Flat state indices follow the groups (decayed parameters first).
        let names: Vec<(String, Vec<i64>)> = opt
            .param_groups()
            .iter()
            .flat_map(|g| {
                g.param_names
                    .iter()
                    .cloned()
                    .zip(g.params.iter().map(Tensor::size))
            })
            .collect();
        for (i, (n, shape)) in names.iter().enumerate() {
            for key in ["exp_avg", "exp_avg_sq"] {
                let prefix = format!("{case}.state.{n}.{key}");
                let want = match r.tensors.get(&prefix) {
                    Some(t) => t.shallow_clone(),
                    None => {
                        let codes = r.t(&format!("{prefix}.codes"))?;
                        let scale = r.t(&format!("{prefix}.scale"))?;
                        let qmap = r.t(&format!("{prefix}.qmap"))?;
                        let codes = match bits {
                            StateBits::Eight => codes.reshape([-1]),
                            StateBits::Four => Tensor::stack(
                                &[
                                    codes.bitwise_right_shift_tensor_scalar(4),
                                    codes.bitwise_and(15),
                                ],
                                -1,
                            )
                            .reshape([-1]),
                        };
                        (qmap
                            .take(&codes.to_kind(Kind::Int64))
                            .view([-1, block_size as i64])
                            * scale.view([-1, 1]))
                        .view(shape.as_slice())
                    }
                };
                let found = opt.state_value(i, key)?;
                ensure!(
                    mismatches(&found, &want)? == 0,
                    "{case} {n} {key}: dequantized values differ"
                );
            }
        }
        ensure!(opt.state_value(0, "max_exp_avg_sq").is_err());
    }
    Ok(())
}

/// Seeded random 1-D parameters of the given sizes and dtype, named `p0`, `p1`, ...
fn params_with_grads(shapes: &[i64], kind: Kind, seed: i64) -> Vec<(String, Tensor)> {
    tch::manual_seed(seed);
    shapes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let p = Tensor::randn([n], (Kind::Float, Device::Cpu))
                .to_kind(kind)
                .set_requires_grad(true);
            (format!("p{i}"), p)
        })
        .collect()
}

fn set_grads(params: &[(String, Tensor)], seed: i64) -> Result<()> {
    tch::manual_seed(seed);
    for (_, p) in params {
        let g = Tensor::randn(p.size(), (Kind::Float, Device::Cpu)).to_kind(p.kind());
        tchtrain_optim::set_grad(p, Some(&g))?;
    }
    Ok(())
}

fn copies(params: &[(String, Tensor)]) -> Vec<(String, Tensor)> {
    params
        .iter()
        .map(|(n, t)| (n.clone(), t.detach().copy().set_requires_grad(true)))
        .collect()
}

fn group(params: &[(String, Tensor)]) -> Vec<GroupSpec> {
    vec![GroupSpec::new(
        params
            .iter()
            .map(|(n, t)| (n.clone(), t.shallow_clone()))
            .collect(),
    )]
}

#[test]
fn bf16_parameters_keep_fp32_scales_across_a_resume() -> Result<()> {
    let _g = lock();
    for config in [
        LowBitAdamWConfig::adamw8bit(),
        LowBitAdamWConfig::adamw4bit(),
    ] {
        let params = params_with_grads(&[8192, 1000], Kind::BFloat16, 1);
        let mut opt = LowBitAdamW::new(group(&params), config.clone())?;
        for step in 0..3 {
            set_grads(&params, 10 + step)?;
            opt.step()?;
        }
        let st = opt.state()[0].as_ref().context("state")?;
        ensure!(st.tensors["exp_avg.scale"].kind() == Kind::Float);
        ensure!(st.tensors["exp_avg.codes"].kind() == Kind::Uint8);
        // Plain states take the parameter's dtype, as torchao's `zeros_like(p)`.
        let small = opt.state()[1].as_ref().context("state")?;
        ensure!(small.tensors["exp_avg"].kind() == Kind::BFloat16);

        let dir = tchtrain_testing::temp_dir("torchao_bf16_resume");
        opt.save(dir.path())?;
        let resumed = copies(&params);
        let mut other = LowBitAdamW::new(group(&resumed), config)?;
        other.load(dir.path())?;
        let st = other.state()[0].as_ref().context("state")?;
        ensure!(st.tensors["exp_avg.scale"].kind() == Kind::Float);
        for step in 3..6 {
            set_grads(&params, 10 + step)?;
            opt.step()?;
            set_grads(&resumed, 10 + step)?;
            other.step()?;
        }
        for ((n, a), (_, b)) in params.iter().zip(&resumed) {
            ensure!(a.equal(b), "{n} differs after the resume");
        }
    }
    Ok(())
}

#[test]
fn bf16_stochastic_rounding_picks_a_neighbour_of_the_fp32_update() -> Result<()> {
    let _g = lock();
    let nearest = params_with_grads(&[8192], Kind::BFloat16, 2);
    let stochastic = copies(&nearest);
    let mut a = LowBitAdamW::new(group(&nearest), LowBitAdamWConfig::default())?;
    let mut b = LowBitAdamW::new(
        group(&stochastic),
        LowBitAdamWConfig {
            bf16_stochastic_round: true,
            ..Default::default()
        },
    )?;
    set_grads(&nearest, 3)?;
    set_grads(&stochastic, 3)?;
    a.step()?;
    b.step()?;
    // One step from the same point: both round the same fp32 value, to nearest or to one of
    // its two bf16 neighbours at random, so they differ by at most one bf16 step.
    let (x, y) = (
        nearest[0].1.to_kind(Kind::Float),
        stochastic[0].1.to_kind(Kind::Float),
    );
    let ulp = x.abs().clamp_min(1e-30).log2().floor().exp2() / 128.0;
    let far = (&x - &y)
        .abs()
        .gt_tensor(&ulp)
        .sum(Kind::Int64)
        .int64_value(&[]);
    ensure!(far == 0, "{far} elements moved more than one bf16 step");
    let differ = x.ne_tensor(&y).sum(Kind::Int64).int64_value(&[]);
    ensure!(
        differ > 100,
        "stochastic rounding changed only {differ} of 8192 elements"
    );
    Ok(())
}

#[test]
fn amsgrad_runs_on_plain_states_and_is_refused_on_quantized_ones() -> Result<()> {
    let _g = lock();
    let config = LowBitAdamWConfig {
        amsgrad: true,
        ..Default::default()
    };
    // 4000 elements: below torchao's 4096, plain state; 5000: not a multiple of 256.
    let params = params_with_grads(&[4000, 5000], Kind::Float, 4);
    let mut opt = LowBitAdamW::new(group(&params), config.clone())?;
    set_grads(&params, 5)?;
    opt.step()?;
    let st = opt.state()[0].as_ref().context("state")?;
    ensure!(st.tensors.contains_key("max_exp_avg_sq"));
    let max = opt.state_value(0, "max_exp_avg_sq")?;
    ensure!(max.equal(&opt.state_value(0, "exp_avg_sq")?));

    let quantized = params_with_grads(&[4096], Kind::Float, 4);
    let err = LowBitAdamW::new(group(&quantized), config).err();
    ensure!(
        matches!(err, Some(Error::InvalidOptimizerSetup { .. })),
        "{err:?}"
    );
    Ok(())
}

#[test]
fn trainer_optim_args_are_read_as_upstream_intends() -> Result<()> {
    let _g = lock();
    let build = |optim: &str, optim_args: Option<&str>| {
        let params = params_with_grads(&[4096], Kind::Float, 6);
        let args = OptimizerArgs {
            optim: optim.into(),
            optim_args: optim_args.map(String::from),
            ..Default::default()
        };
        create_optimizer(&args, group(&params))
    };
    let opt = build("adamw_torch_4bit", None)?;
    ensure!(opt.name() == "torchao_adamw_4bit");
    ensure!(
        opt.hyperparameters()["block_size"] == 256,
        "the Trainer passes 256"
    );
    ensure!(opt.hyperparameters()["bits"] == "4");
    let opt = build(
        "adamw_torch_8bit",
        Some("block_size=128, bf16_stochastic_round=Yes"),
    )?;
    ensure!(opt.name() == "torchao_adamw_8bit");
    ensure!(opt.hyperparameters()["block_size"] == 128);
    ensure!(opt.hyperparameters()["bf16_stochastic_round"] == true);
    ensure!(opt.hyperparameters()["lr"] == 5e-5);

    for bad in [
        "block_size=12.5",
        "block_size=-1",
        "bf16_stochastic_round=maybe",
    ] {
        let err = build("adamw_torch_8bit", Some(bad)).err();
        ensure!(
            matches!(err, Some(Error::InvalidOptimArgValue { .. })),
            "{bad}: {err:?}"
        );
    }
    for bad in ["block_size=0", "block_size=3"] {
        let err = build("adamw_torch_4bit", Some(bad)).err();
        ensure!(
            matches!(
                err,
                Some(Error::InvalidHyperparameter {
                    name: "block_size",
                    ..
                })
            ),
            "{bad}: {err:?}"
        );
    }
    // An odd block size is fine for one code per byte.
    build("adamw_torch_8bit", Some("block_size=3"))?;
    Ok(())
}

#[test]
fn a_state_dict_of_the_other_width_or_block_size_is_refused() -> Result<()> {
    let _g = lock();
    let params = params_with_grads(&[8192], Kind::Float, 7);
    let mut opt = LowBitAdamW::new(group(&params), LowBitAdamWConfig::adamw8bit())?;
    set_grads(&params, 8)?;
    opt.step()?;
    let sd = opt.state_dict()?;
    let mut four = LowBitAdamW::new(group(&params), LowBitAdamWConfig::adamw4bit())?;
    ensure!(matches!(
        four.load_state_dict(&sd),
        Err(Error::OptimizerMismatch { .. })
    ));
    let mut other_block = LowBitAdamW::new(
        group(&params),
        LowBitAdamWConfig {
            block_size: 512,
            ..Default::default()
        },
    )?;
    let err = other_block.load_state_dict(&sd).err();
    ensure!(matches!(err, Some(Error::ShapeMismatch { .. })), "{err:?}");
    Ok(())
}

#[test]
fn quantization_maps_are_torchaos() -> Result<()> {
    let _g = lock();
    let r = reference()?;
    for (case, bits) in [
        ("adamw_torch_8bit", StateBits::Eight),
        ("adamw_torch_4bit", StateBits::Four),
    ] {
        let params = params_with_grads(&[8192], Kind::Float, 9);
        let config = LowBitAdamWConfig {
            bits,
            block_size: 256,
            ..Default::default()
        };
        let mut opt = LowBitAdamW::new(group(&params), config)?;
        set_grads(&params, 9)?;
        opt.step()?;
        // Every byte value, block scales of one: the dequantized state lists the map.
        let st = opt.state_mut()[0].as_mut().context("state")?;
        for key in ["exp_avg", "exp_avg_sq"] {
            let codes = &st.tensors[&format!("{key}.codes")];
            let bytes = Tensor::arange(codes.numel() as i64, (Kind::Int64, Device::Cpu))
                .remainder(256)
                .to_kind(Kind::Uint8)
                .view(codes.size().as_slice());
            st.tensors.insert(format!("{key}.codes"), bytes);
            let _ = st
                .tensors
                .get_mut(&format!("{key}.scale"))
                .context("scale")?
                .fill_(1.0);
        }
        for key in ["exp_avg", "exp_avg_sq"] {
            let qmap = r.t(&format!("{case}.state.proj.weight.{key}.qmap"))?;
            let values = opt.state_value(0, key)?;
            let want = match bits {
                StateBits::Eight => qmap.shallow_clone(),
                // Byte b holds codes b >> 4 (even element) and b & 15 (odd element).
                StateBits::Four => {
                    let b = Tensor::arange(256, (Kind::Int64, Device::Cpu));
                    let codes =
                        Tensor::stack(&[b.divide_scalar_mode(16, "floor"), b.remainder(16)], -1);
                    qmap.take(&codes.reshape([-1]))
                }
            };
            let n = want.numel() as i64;
            ensure!(
                mismatches(&values.slice(0, 0, n, 1), &want)? == 0,
                "{case} {key}: the map differs from torchao's"
            );
        }
    }
    Ok(())
}

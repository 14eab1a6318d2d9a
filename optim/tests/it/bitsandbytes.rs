//! bitsandbytes' optimizers beyond the final parameters `packages.rs` checks: every state
//! tensor after the 50 reference steps (the 8-bit codes byte for byte, absmax and the float32
//! states), the dynamic maps, the Trainer's 32-bit override of embeddings, and the handler's
//! refusals.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result};
use tch::{Kind, Tensor};
use tchtrain_optim::{
    BnbConfig, BnbOptimizer, Error, GroupSpec, Optimizer, OptimizerArgs, ParamState,
    create_dynamic_map, create_optimizer, dequantize_blockwise, quantize_blockwise,
};
use tchtrain_testing::lock;

use crate::packages::{Reference, reference, relative_diff};

/// The reference cases built with a bitsandbytes class.
fn bnb_cases(r: &Reference) -> Result<Vec<String>> {
    Ok(r.meta["cases"]
        .as_object()
        .context("cases")?
        .iter()
        .filter(|(_, c)| {
            c["class"]
                .as_str()
                .is_some_and(|s| s.starts_with("bitsandbytes."))
        })
        .map(|(name, _)| name.clone())
        .collect())
}

/// Each parameter's state by name.
fn states_by_name(opt: &dyn Optimizer) -> BTreeMap<String, &ParamState> {
    let names = opt
        .param_groups()
        .iter()
        .flat_map(|g| g.param_names.iter().cloned());
    names
        .zip(opt.state())
        .filter_map(|(n, s)| s.as_ref().map(|s| (n, s)))
        .collect()
}

#[test]
fn bitsandbytes_states_match_the_reference_after_50_steps() -> Result<()> {
    let _g = lock();
    let r = reference()?;
    let cases = bnb_cases(&r)?;
    assert!(!cases.is_empty(), "no bitsandbytes case in the reference");
    let mut report = Vec::new();
    for case in &cases {
        let (_, opt) = r.run(case)?;
        let states = states_by_name(opt.as_ref());
        let prefix = format!("{case}.state.");
        let expected: BTreeSet<&str> = r
            .tensors
            .keys()
            .filter_map(|k| k.strip_prefix(&prefix))
            .collect();
        let ours: BTreeSet<String> = states
            .iter()
            .flat_map(|(n, s)| s.tensors.keys().map(move |k| format!("{n}.{k}")))
            .collect();
        let ours: BTreeSet<&str> = ours.iter().map(String::as_str).collect();
        assert_eq!(ours, expected, "{case}: state keys differ");
        let (mut bytes, mut mismatched, mut worst) = (0usize, 0usize, 0.0f64);
        for key in &expected {
            let want = r.t(&format!("{prefix}{key}"))?;
            let (param, entry) = key.rsplit_once('.').context("key")?;
            let got = states[param].tensors[entry].shallow_clone();
            assert_eq!(got.kind(), want.kind(), "{case}: {key} dtype");
            assert_eq!(got.size(), want.size(), "{case}: {key} shape");
            if want.kind() == Kind::Uint8 {
                bytes += want.numel();
                mismatched += got.ne_tensor(want).sum(Kind::Int64).int64_value(&[]) as usize;
            } else {
                worst = worst.max(relative_diff(&got, want));
            }
        }
        report.push(format!(
            "{case:34} 8-bit codes {mismatched}/{bytes} differ, float states {worst:.2e}"
        ));
        // Identical bytes: the quantization reproduces the library's lookup table and
        // fused multiply-add, and the float32 updates are torch's own ops in the same order.
        assert_eq!(
            mismatched, 0,
            "{case}: {mismatched} of {bytes} 8-bit codes differ"
        );
        assert!(worst <= 1e-6, "{case}: float states differ by {worst:e}");
    }
    println!(
        "bitsandbytes states against the reference:\n{}",
        report.join("\n")
    );
    Ok(())
}

#[test]
fn dynamic_maps_are_bitsandbytes_maps() -> Result<()> {
    let _g = lock();
    let r = reference()?;
    let signed = create_dynamic_map(true)?;
    let unsigned = create_dynamic_map(false)?;
    // the maps bitsandbytes stored in the state of the 8-bit AdamW (`qmap1`: signed for the
    // first moment, `qmap2`: unsigned for the second)
    assert!(signed.equal(r.t("adamw_bnb_8bit.state.proj.weight.qmap1")?));
    assert!(unsigned.equal(r.t("adamw_bnb_8bit.state.proj.weight.qmap2")?));
    for map in [&signed, &unsigned] {
        assert_eq!(map.size(), [256]);
        assert_eq!(map.kind(), Kind::Float);
        assert_eq!(map.max().double_value(&[]), 1.0);
    }
    // bitsandbytes' values at a few indices (the signed map has no -1: its most negative
    // entry is the mean of the last fraction bin, as the largest positive below 1.0)
    let s = Vec::<f32>::try_from(&signed)?;
    let u = Vec::<f32>::try_from(&unsigned)?;
    assert_eq!(
        (s[0], s[127], s[128], s[254], s[255]),
        (-0.99296874, 0.0, 5.5000004e-7, 0.99296874, 1.0)
    );
    assert_eq!(
        (u[0], u[1], u[254], u[255]),
        (0.0, 3.2500003e-7, 0.9964844, 1.0)
    );
    Ok(())
}

#[test]
fn blockwise_quantization_reproduces_the_reference_codes() -> Result<()> {
    let _g = lock();
    let r = reference()?;
    // dequantize the reference's codes and quantize them back. In a block whose largest
    // magnitude is positive, that element has code 255 (1.0), so the absmax comes back
    // unchanged and every value is a codebook entry times it: its own nearest entry. (A
    // negative maximum has code 0, -0.99296874: the absmax would shrink.)
    for case in [
        "adamw_bnb_8bit",
        "lion_8bit",
        "ademamix_8bit",
        "rmsprop_bnb_8bit",
    ] {
        let prefix = format!("{case}.state.proj.weight");
        let codes = r.t(&format!("{prefix}.state1"))?.reshape([-1, 256]);
        let absmax = r.t(&format!("{prefix}.absmax1"))?.reshape([-1]);
        let qmap = r.t(&format!("{prefix}.qmap1"))?;
        let values = dequantize_blockwise(&codes, &absmax, qmap, 256)?;
        assert_eq!(values.size(), codes.size());
        let (again, absmax_again) = quantize_blockwise(&values, qmap, 256)?;
        let positive = codes.eq(255).any_dim(1, false);
        let kept = i64::try_from(positive.sum(Kind::Int64))?;
        assert!(kept > 0, "{case}: no block with a positive maximum");
        let differ = i64::try_from(
            again
                .index_select(0, &positive.nonzero().squeeze_dim(1))
                .ne_tensor(&codes.index_select(0, &positive.nonzero().squeeze_dim(1)))
                .sum(Kind::Int64),
        )?;
        assert_eq!(differ, 0, "{case}: requantized codes differ");
        assert!(
            absmax_again
                .masked_select(&positive)
                .equal(&absmax.masked_select(&positive)),
            "{case}: absmax differs"
        );
    }
    // a block of zeros: absmax 0 and code 0, as the library writes them
    let (q, m) = quantize_blockwise(
        &Tensor::zeros([300], tch::kind::FLOAT_CPU),
        &create_dynamic_map(true)?,
        256,
    )?;
    assert_eq!(m.size(), [2]);
    assert_eq!(q.sum(Kind::Int64).int64_value(&[]), 0);
    assert_eq!(m.sum(Kind::Float).double_value(&[]), 0.0);
    // a codebook of another size is an error, not a panic
    assert!(quantize_blockwise(&m, &Tensor::zeros([10], tch::kind::FLOAT_CPU), 256).is_err());
    Ok(())
}

#[test]
fn embeddings_keep_32bit_state_under_8bit_optimizers() -> Result<()> {
    let _g = lock();
    let r = reference()?;
    let kinds = |args: &OptimizerArgs| -> Result<BTreeMap<String, Kind>> {
        let params = r.fresh_params()?;
        let groups = vec![GroupSpec::new(
            params
                .iter()
                .map(|(n, t)| (n.clone(), t.shallow_clone()))
                .collect(),
        )];
        let mut opt = create_optimizer(args, groups)?;
        r.step(&params, opt.as_mut(), 0)?;
        Ok(states_by_name(opt.as_ref())
            .into_iter()
            .map(|(n, s)| (n, s.tensors["state1"].kind()))
            .collect())
    };
    let mut args = r.optimizer_args("adamw_bnb_8bit")?;
    assert_eq!(args.embedding_weights, ["embed.weight"]);
    let with_override = kinds(&args)?;
    // embed.weight (4608 elements) is registered for 32-bit state; proj.weight (5120) is
    // 8-bit; head.weight (1920) and the vectors are below min_8bit_size
    assert_eq!(with_override["embed.weight"], Kind::Float);
    assert_eq!(with_override["proj.weight"], Kind::Uint8);
    assert_eq!(with_override["head.weight"], Kind::Float);
    assert_eq!(with_override["norm.weight"], Kind::Float);
    args.embedding_weights.clear();
    assert_eq!(kinds(&args)?["embed.weight"], Kind::Uint8);
    Ok(())
}

#[test]
fn uint8_state_survives_the_state_dict() -> Result<()> {
    let _g = lock();
    let r = reference()?;
    let params = r.fresh_params()?;
    let mut opt = r.build("ademamix_8bit", &params)?;
    for step in 0..3 {
        r.step(&params, opt.as_mut(), step)?;
    }
    let dir = tchtrain_testing::temp_dir("bnb_state_dict");
    opt.save(dir.path())?;
    let mut other = r.build("ademamix_8bit", &params)?;
    other.load(dir.path())?;
    let (a, b) = (states_by_name(opt.as_ref()), states_by_name(other.as_ref()));
    for (name, st) in &a {
        for (key, t) in &st.tensors {
            let u = &b[name].tensors[key];
            assert_eq!(u.kind(), t.kind(), "{name}.{key}");
            assert!(u.equal(t), "{name}.{key}");
        }
        assert_eq!(b[name].step, st.step);
    }
    assert_eq!(a["proj.weight"].tensors["state1"].kind(), Kind::Uint8);
    assert_eq!(a["proj.weight"].tensors["state1"].size(), [2, 80, 64]);
    assert_eq!(a["proj.weight"].tensors["absmax1"].size(), [2, 20]);
    Ok(())
}

#[test]
fn bitsandbytes_handler_refuses_what_upstream_fails_on() -> Result<()> {
    let _g = lock();
    let p = || {
        vec![GroupSpec::unnamed(vec![Tensor::zeros(
            [4],
            tch::kind::FLOAT_CPU,
        )])]
    };
    let args = |optim: &str, optim_args: Option<&str>| OptimizerArgs {
        optim: optim.into(),
        optim_args: optim_args.map(String::from),
        ..Default::default()
    };
    // RMSprop gets optim_args as strings: bitsandbytes fails on every one but `optim_bits`
    // (replaced by the name's) and an empty `centered`
    for bad in [
        "alpha=0.9",
        "momentum=0.9",
        "eps=1e-6",
        "centered=False",
        "foo=1",
    ] {
        let err = create_optimizer(&args("rmsprop_bnb", Some(bad)), p()).err();
        assert!(
            matches!(err, Some(Error::InvalidOptimizerSetup { .. })),
            "{bad}: {err:?}"
        );
    }
    for fine in ["optim_bits=8", "centered="] {
        create_optimizer(&args("rmsprop_bnb_8bit", Some(fine)), p())?;
    }
    // AdEMAMix reads t_alpha / t_beta3 as Python's int()
    let err = create_optimizer(&args("ademamix", Some("t_alpha=1.5")), p()).err();
    assert!(
        matches!(err, Some(Error::InvalidOptimArgValue { .. })),
        "{err:?}"
    );
    create_optimizer(
        &args("ademamix_8bit", Some("t_alpha=1_000,t_beta3=20")),
        p(),
    )?;
    // bitsandbytes' own checks
    let bad_configs = [
        BnbConfig {
            optim_bits: 4,
            ..BnbConfig::adamw()
        },
        BnbConfig {
            betas: (0.0, 0.0),
            ..BnbConfig::rmsprop()
        },
        BnbConfig {
            beta3: 1.0,
            ..BnbConfig::ademamix()
        },
        BnbConfig {
            lr: -1.0,
            ..BnbConfig::lion()
        },
    ];
    for c in bad_configs {
        assert!(
            matches!(
                BnbOptimizer::new(p(), c.clone()),
                Err(Error::InvalidHyperparameter { .. })
            ),
            "{c:?}"
        );
    }
    Ok(())
}

#[test]
fn bfloat16_parameters_keep_float32_state_through_a_resume() -> Result<()> {
    let _g = lock();
    let r = reference()?;
    let bf16 = |params: &[(String, Tensor)]| -> Vec<(String, Tensor)> {
        params
            .iter()
            .map(|(n, t)| {
                // (a copy: `to_kind` of a bfloat16 tensor is the tensor itself)
                let t = t
                    .detach()
                    .to_kind(Kind::BFloat16)
                    .copy()
                    .set_requires_grad(true);
                (n.clone(), t)
            })
            .collect()
    };
    let step = |params: &[(String, Tensor)], opt: &mut dyn Optimizer, step: i64| -> Result<()> {
        for (n, p) in params {
            let g = r
                .t(&format!("grads.{n}"))?
                .get(step)
                .to_kind(Kind::BFloat16);
            tchtrain_optim::set_grad(p, Some(&g))?;
        }
        opt.step()?;
        opt.zero_grad();
        Ok(())
    };
    for case in [
        "adamw_bnb_8bit",
        "ademamix_8bit",
        "lion_32bit",
        "rmsprop_bnb_8bit",
    ] {
        let params = bf16(&r.fresh_params()?);
        let mut opt = r.build(case, &params)?;
        for s in 0..3 {
            step(&params, opt.as_mut(), s)?;
        }
        let dir = tchtrain_testing::temp_dir("bnb_bf16");
        opt.save(dir.path())?;
        let resumed = bf16(&params);
        let mut other = r.build(case, &resumed)?;
        other.load(dir.path())?;
        for s in 3..6 {
            step(&params, opt.as_mut(), s)?;
            step(&resumed, other.as_mut(), s)?;
        }
        for ((n, a), (_, b)) in params.iter().zip(&resumed) {
            assert_eq!(a.kind(), Kind::BFloat16);
            assert!(a.equal(b), "{case}: {n} differs after the resume");
        }
        let (a, b) = (states_by_name(opt.as_ref()), states_by_name(other.as_ref()));
        for (name, st) in &a {
            for (key, t) in &st.tensors {
                // float32 (or uint8) whatever the parameter's dtype, as bitsandbytes keeps it
                assert!(
                    matches!(t.kind(), Kind::Float | Kind::Uint8),
                    "{case}: {name}.{key}"
                );
                assert!(b[name].tensors[key].equal(t), "{case}: {name}.{key}");
            }
        }
    }
    Ok(())
}

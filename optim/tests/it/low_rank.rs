//! GaLore and APOLLO (`galore_*` / `apollo_*` cases of `scripts/reference/optim_packages.py`):
//! final parameters and low-rank moments against galore-torch / apollo-torch after 50 steps,
//! a bit-exact resume, the projector's state, GaLore's 8-bit AdamW against the package's
//! bitsandbytes state (codes byte for byte), and upstream's refusals of `optim_target_modules`.

use std::collections::BTreeSet;

use anyhow::{Context, Result};
use tch::{Device, Kind, Tensor};
use tchtrain_optim::{
    Error, GaLoreAdamW8bit, GaLoreAdamW8bitConfig, GroupSpec, Optimizer, OptimizerArgs, ProjType,
    Projection, check_target_module_exists, create_optimizer, decay_param_groups,
    low_rank_target_names,
};
use tchtrain_testing::lock;
use tchtrain_training_args::StrOrList;

use crate::packages::{LAYERNORMS, LINEARS, Reference, reference, relative_diff};

const BOUND: f64 = 1e-6;

fn low_rank_cases(r: &Reference) -> Result<Vec<String>> {
    Ok(r.meta["cases"]
        .as_object()
        .context("cases")?
        .keys()
        .filter(|k| k.starts_with("galore_") || k.starts_with("apollo_"))
        .cloned()
        .collect())
}

#[test]
fn galore_and_apollo_match_their_packages_for_50_steps() -> Result<()> {
    let _g = lock();
    let r = reference()?;
    let cases = low_rank_cases(&r)?;
    assert!(cases.len() >= 12, "low-rank cases missing: {cases:?}");
    let mut report = Vec::new();
    for case in &cases {
        let (params, opt) = r.run(case)?;
        let worst = r.final_diff(case, &params)?;
        // The moments (low-rank for the projected weights), by parameter name.
        let names: Vec<String> = opt
            .param_groups()
            .iter()
            .flat_map(|g| g.param_names.clone())
            .collect();
        let mut worst_state = 0.0f64;
        let mut compared = 0;
        for (i, st) in opt.state().iter().enumerate() {
            let Some(st) = st else { continue };
            // (bitsandbytes' `state1` / `state2` of GaLore's 8-bit AdamW when float32; its 8-bit
            // codes are compared byte for byte below)
            for key in [
                "exp_avg",
                "exp_avg_sq",
                "exp_avg_sq_row",
                "exp_avg_sq_col",
                "state1",
                "state2",
            ] {
                let Some(t) = st.tensors.get(key).filter(|t| t.kind() != Kind::Uint8) else {
                    continue;
                };
                let reference = r.t(&format!("{case}.state.{}.{key}", names[i]))?;
                worst_state = worst_state.max(relative_diff(t, reference));
                compared += 1;
            }
        }
        assert!(
            compared >= 6,
            "{case}: only {compared} state tensors compared"
        );
        report.push(format!(
            "{case:34} final {worst:.2e}  moments {worst_state:.2e}"
        ));
        assert!(
            worst <= BOUND,
            "{case}: parameters differ by {worst:e} relative"
        );
        assert!(
            worst_state <= BOUND,
            "{case}: moments differ by {worst_state:e} relative"
        );
    }
    println!(
        "relative difference from galore-torch / apollo-torch:\n{}",
        report.join("\n")
    );
    Ok(())
}

#[test]
fn galore_and_apollo_resume_bit_exactly_with_their_projectors() -> Result<()> {
    let _g = lock();
    let r = reference()?;
    let dir = tchtrain_testing::temp_dir("low_rank_resume");
    for case in low_rank_cases(&r)? {
        let params = r.fresh_params()?;
        let mut opt = r.build(&case, &params)?;
        // 25 steps: the projection was last recomputed before the break (gaps 7, 9, 10), so
        // the resumed run must take it from the state dict.
        let half = r.steps() / 2;
        for step in 0..half {
            r.step(&params, opt.as_mut(), step)?;
        }
        let path = dir.path().join(&case);
        opt.save(&path)?;
        let resumed: Vec<(String, Tensor)> = params
            .iter()
            .map(|(n, t)| (n.clone(), t.detach().copy().set_requires_grad(true)))
            .collect();
        let mut other = r.build(&case, &resumed)?;
        other.load(&path)?;
        for step in half..r.steps() {
            r.step(&params, opt.as_mut(), step)?;
            r.step(&resumed, other.as_mut(), step)?;
        }
        for ((n, a), (_, b)) in params.iter().zip(&resumed) {
            assert!(a.equal(b), "{case}: {n} differs after the resume");
        }
    }
    Ok(())
}

/// The names and shapes of the state of parameter `name` after `steps` steps of `case`.
fn state_after(
    r: &Reference,
    case: &str,
    steps: i64,
) -> Result<(Box<dyn tchtrain_optim::Optimizer>, Vec<String>)> {
    let params = r.fresh_params()?;
    let mut opt = r.build(case, &params)?;
    for step in 0..steps {
        r.step(&params, opt.as_mut(), step)?;
    }
    let names = opt
        .param_groups()
        .iter()
        .flat_map(|g| g.param_names.clone())
        .collect();
    Ok((opt, names))
}

#[test]
fn galore_keeps_its_svd_projection_in_the_state_and_renews_it_every_gap() -> Result<()> {
    let _g = lock();
    let r = reference()?;
    let (opt, names) = state_after(&r, "galore_adamw", 1)?;
    // Upstream's groups: [non-target, target], no weight decay (the decay groups are dropped).
    let groups = opt.param_groups();
    assert_eq!(groups.len(), 2);
    assert_eq!(groups[1].param_names, ["proj.weight", "head.weight"]);
    assert!(groups.iter().all(|g| g.weight_decay == 0.0));
    let at = |n: &str| names.iter().position(|x| x == n).unwrap();
    let proj = opt.state()[at("proj.weight")]
        .as_ref()
        .context("proj state")?;
    let head = opt.state()[at("head.weight")]
        .as_ref()
        .context("head state")?;
    // proj.weight is 80 x 64 (tall: right projection Vh[:8]); head.weight 24 x 80 (wide: left
    // projection U[:, :8]).
    assert_eq!(proj.tensors["ortho_matrix"].size(), [8, 64]);
    assert_eq!(proj.tensors["exp_avg"].size(), [80, 8]);
    assert_eq!(head.tensors["ortho_matrix"].size(), [24, 8]);
    assert_eq!(head.tensors["exp_avg"].size(), [8, 80]);
    // Orthonormal rows / columns.
    let vh = &proj.tensors["ortho_matrix"];
    let eye = Tensor::eye(8, (Kind::Float, Device::Cpu));
    assert!(vh.matmul(&vh.tr()).allclose(&eye, 1e-5, 1e-5, false));
    let u = &head.tensors["ortho_matrix"];
    assert!(u.tr().matmul(u).allclose(&eye, 1e-5, 1e-5, false));
    // The projection is kept between renewals (steps 1..9) and renewed at step 10.
    let (opt9, _) = state_after(&r, "galore_adamw", 10)?;
    let (opt10, _) = state_after(&r, "galore_adamw", 11)?;
    let m = |o: &dyn tchtrain_optim::Optimizer| {
        o.state()[at("proj.weight")].as_ref().unwrap().tensors["ortho_matrix"].copy()
    };
    assert!(m(opt.as_ref()).equal(&m(opt9.as_ref())));
    assert!(!m(opt9.as_ref()).equal(&m(opt10.as_ref())));
    // proj_type=full keeps both factors.
    let (full, names) = state_after(&r, "galore_adamw_all_linear_full", 1)?;
    let i = names.iter().position(|x| x == "proj.weight").unwrap();
    let st = full.state()[i].as_ref().unwrap();
    assert_eq!(st.tensors["ortho_matrix.0"].size(), [80, 6]);
    assert_eq!(st.tensors["ortho_matrix.1"].size(), [6, 64]);
    assert_eq!(st.tensors["exp_avg"].size(), [6, 6]);
    Ok(())
}

#[test]
fn apollo_draws_its_projection_from_the_seeded_generator_of_upstream() -> Result<()> {
    let _g = lock();
    let r = reference()?;
    let (opt, names) = state_after(&r, "apollo_adamw", 1)?;
    // proj.weight is parameter 5 of 6 (after the 4 non-target ones): seed 5, and after the
    // draw apollo_torch's `next_seed(5)`.
    let i = names.iter().position(|x| x == "proj.weight").unwrap();
    assert_eq!(i, 4);
    let st = opt.state()[i].as_ref().unwrap();
    assert_eq!(
        st.tensors["projector_seed"].int64_value(&[]),
        7008601228353732127
    );
    // `stable_randn((8, 64), seed=5) / sqrt(8)`, first values from torch.
    let p = &st.tensors["ortho_matrix"];
    assert_eq!(p.size(), [8, 64]);
    let expected = [
        1.8423298597335815f64,
        0.5188871622085571,
        -1.7119213342666626,
    ];
    for (j, e) in expected.iter().enumerate() {
        let got = p.double_value(&[0, j as i64]);
        assert_eq!(got as f32, (*e as f32) / (8f32).sqrt(), "entry {j}");
    }
    // The norm-growth limiter's state and the low-rank moments.
    assert_eq!(st.tensors["scaled_grad"].size(), Vec::<i64>::new());
    assert_eq!(st.tensors["exp_avg"].size(), [80, 8]);
    // The renewal at step 10 uses the advanced seed.
    let (opt10, _) = state_after(&r, "apollo_adamw", 11)?;
    let st10 = opt10.state()[i].as_ref().unwrap();
    assert_eq!(
        st10.tensors["projector_seed"].int64_value(&[]),
        8061465352518219924
    );
    Ok(())
}

/// The reference cases of galore_torch's `AdamW8bit`.
fn galore_8bit_cases(r: &Reference) -> Result<Vec<String>> {
    Ok(r.meta["cases"]
        .as_object()
        .context("cases")?
        .iter()
        .filter(|(_, c)| c["class"].as_str() == Some("galore_torch.adamw8bit.AdamW8bit"))
        .map(|(name, _)| name.clone())
        .collect())
}

#[test]
fn galore_adamw_8bit_states_match_the_package_byte_for_byte() -> Result<()> {
    let _g = lock();
    let r = reference()?;
    let cases = galore_8bit_cases(&r)?;
    assert_eq!(cases.len(), 4, "GaLore 8-bit cases: {cases:?}");
    let mut report = Vec::new();
    let mut projected_8bit = 0;
    for case in &cases {
        let (opt, names) = state_after(&r, case, r.steps())?;
        let prefix = format!("{case}.state.");
        // The package's state, less its projector (an object, not in the reference): ours
        // keeps the projector's matrices beside it.
        let expected: BTreeSet<&str> = r
            .tensors
            .keys()
            .filter_map(|k| k.strip_prefix(&prefix))
            .collect();
        let mut ours = BTreeSet::new();
        for (name, st) in names.iter().zip(opt.state()) {
            let st = st.as_ref().context("every parameter has a state")?;
            for key in st.tensors.keys().filter(|k| !k.starts_with("ortho_matrix")) {
                ours.insert(format!("{name}.{key}"));
            }
        }
        let ours: BTreeSet<&str> = ours.iter().map(String::as_str).collect();
        assert_eq!(ours, expected, "{case}: state keys differ");
        let (mut bytes, mut mismatched, mut worst) = (0usize, 0usize, 0.0f64);
        for key in &expected {
            let want = r.t(&format!("{prefix}{key}"))?;
            let (param, entry) = key.rsplit_once('.').context("key")?;
            let i = names.iter().position(|n| n == param).context("param")?;
            let got = &opt.state()[i].as_ref().context("state")?.tensors[entry];
            assert_eq!(got.kind(), want.kind(), "{case}: {key} dtype");
            assert_eq!(got.size(), want.size(), "{case}: {key} shape");
            if want.kind() == Kind::Uint8 {
                bytes += want.numel();
                mismatched += got.ne_tensor(want).sum(Kind::Int64).int64_value(&[]) as usize;
                if param != "embed.weight" && entry == "state1" {
                    projected_8bit += 1;
                }
            } else {
                worst = worst.max(relative_diff(got, want));
            }
        }
        report.push(format!(
            "{case:34} 8-bit codes {mismatched}/{bytes} differ, float states {worst:.2e}"
        ));
        // The embedding (4608 elements; no 32-bit override, the class is not bitsandbytes')
        // is 8-bit in every case.
        assert!(
            r.t(&format!("{prefix}embed.weight.state1"))?.kind() == Kind::Uint8,
            "{case}: embedding state not 8-bit"
        );
        assert_eq!(
            mismatched, 0,
            "{case}: {mismatched} of {bytes} 8-bit codes differ"
        );
        assert!(worst <= BOUND, "{case}: float states differ by {worst:e}");
    }
    // rank=52: proj.weight's projected 80x52 state is 8-bit (4160 elements, 17 blocks).
    assert_eq!(
        projected_8bit, 1,
        "one projected parameter with 8-bit state"
    );
    println!(
        "GaLore 8-bit AdamW states against galore-torch on bitsandbytes:\n{}",
        report.join("\n")
    );
    Ok(())
}

#[test]
fn galore_adamw_8bit_keeps_the_packages_update_limit_and_weight_decay() -> Result<()> {
    let _g = lock();
    let r = reference()?;
    let steps = r.steps();
    let (opt, names) = state_after(&r, "galore_adamw_8bit", steps)?;
    // `lr` only from the Trainer: bitsandbytes' weight decay 1e-2 in both groups.
    let groups = opt.param_groups();
    assert_eq!(groups[1].param_names, ["proj.weight", "head.weight"]);
    assert!(groups.iter().all(|g| g.weight_decay == 0.01));
    // galore-torch's `percentile_clipping` reaches bitsandbytes as `max_unorm = 100`: the
    // projected weights with float32 state (80x8, 8x80) get no update from their moments,
    // only the decay `p += -lr * wd * p` (1e-3 * 1e-2) in each step...
    let params = r.fresh_params()?;
    let mut rebuilt = r.build("galore_adamw_8bit", &params)?;
    for step in 0..steps {
        r.step(&params, rebuilt.as_mut(), step)?;
    }
    for name in ["proj.weight", "head.weight"] {
        let mut decayed = r.t(&format!("init.{name}"))?.copy();
        for _ in 0..steps {
            decayed = decayed.g_add(&(&decayed * -1e-5));
        }
        let (_, p) = params.iter().find(|(n, _)| n == name).context("param")?;
        assert!(
            relative_diff(p, &decayed) <= 1e-6,
            "{name}: more than the decay"
        );
        // ... while their moments move.
        let i = names.iter().position(|n| n == name).context("param")?;
        let st = opt.state()[i].as_ref().context("state")?;
        assert!(st.tensors["state1"].abs().max().double_value(&[]) > 0.0);
        assert!(st.tensors["unorm_vec"].double_value(&[0]) > 0.0);
    }
    // ...and a parameter at zero (LayerNorm's bias) stays there.
    let (_, bias) = params
        .iter()
        .find(|(n, _)| n == "norm.bias")
        .context("bias")?;
    assert_eq!(bias.abs().max().double_value(&[]), 0.0);
    Ok(())
}

#[test]
fn galore_adamw_8bit_checks_its_arguments() -> Result<()> {
    let _g = lock();
    let w = || {
        let t = Tensor::zeros([8, 8], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        vec![GroupSpec::new(vec![("w".to_string(), t)])]
    };
    let bad = GaLoreAdamW8bitConfig {
        betas: (0.9, 1.0),
        ..Default::default()
    };
    assert!(matches!(
        GaLoreAdamW8bit::new(w(), bad),
        Err(Error::InvalidHyperparameter { .. })
    ));
    let projection = Projection {
        rank: 2,
        update_proj_gap: 10,
        scale: 0.25,
        proj_type: ProjType::Std,
    };
    let too_many = GaLoreAdamW8bitConfig {
        projections: vec![None, Some(projection.clone())],
        ..Default::default()
    };
    assert!(matches!(
        GaLoreAdamW8bit::new(w(), too_many),
        Err(Error::GroupCountMismatch { .. })
    ));
    // A projected parameter that is not a matrix fails in the step, as upstream's projector.
    let v = Tensor::zeros([8], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let mut opt = GaLoreAdamW8bit::new(
        vec![GroupSpec::new(vec![("v".to_string(), v.shallow_clone())])],
        GaLoreAdamW8bitConfig {
            projections: vec![Some(projection)],
            ..Default::default()
        },
    )?;
    v.sum(Kind::Float).backward();
    assert!(opt.step().is_err());
    Ok(())
}

fn args(optim: &str, targets: Option<StrOrList>) -> OptimizerArgs {
    OptimizerArgs {
        optim: optim.into(),
        learning_rate: 1e-3,
        optim_target_modules: targets,
        linear_modules: LINEARS.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn groups(r: &Reference) -> Result<Vec<GroupSpec>> {
    let params = r.fresh_params()?;
    Ok(decay_param_groups(params, 0.1, &LAYERNORMS))
}

fn setup_error(result: tchtrain_optim::Result<Box<dyn tchtrain_optim::Optimizer>>) -> String {
    match result {
        Err(Error::InvalidOptimizerSetup { detail, .. }) => detail,
        Err(e) => panic!("expected InvalidOptimizerSetup, got {e}"),
        Ok(_) => panic!("expected InvalidOptimizerSetup, got an optimizer"),
    }
}

#[test]
fn low_rank_optimizers_refuse_missing_or_unmatched_target_modules_as_upstream() -> Result<()> {
    let _g = lock();
    let r = reference()?;
    for optim in [
        "galore_adamw",
        "galore_adafactor",
        "galore_adamw_8bit",
        "apollo_adamw",
    ] {
        let detail = setup_error(create_optimizer(&args(optim, None), groups(&r)?));
        assert_eq!(
            detail,
            format!("You need to define `optim_target_modules` to use {optim} optimizers")
        );
        let none = StrOrList::List(vec!["attn".into(), "mlp".into()]);
        let detail = setup_error(create_optimizer(&args(optim, Some(none)), groups(&r)?));
        assert_eq!(
            detail,
            format!("No target modules found for {optim} (['attn', 'mlp'])."),
        );
        // An embedding matches but is not `nn.Linear`: ignored, so nothing is found.
        let embed = StrOrList::One("embed".into());
        let detail = setup_error(create_optimizer(&args(optim, Some(embed)), groups(&r)?));
        assert_eq!(
            detail,
            format!("No target modules found for {optim} (embed).")
        );
    }
    let bad = StrOrList::One("proj(".into());
    let detail = setup_error(create_optimizer(
        &args("galore_adamw", Some(bad)),
        groups(&r)?,
    ));
    assert!(detail.contains("not a valid regex"), "{detail}");
    // `update_proj_gap` must divide: 0 is refused up front (upstream fails in the first step).
    let mut a = args("galore_adamw", Some(StrOrList::One("all-linear".into())));
    a.optim_args = Some("update_proj_gap=0".into());
    assert!(matches!(
        create_optimizer(&a, groups(&r)?),
        Err(Error::InvalidHyperparameter {
            name: "update_proj_gap",
            ..
        })
    ));
    a.optim_args = Some("proj_type=diagonal".into());
    assert!(matches!(
        create_optimizer(&a, groups(&r)?),
        Err(Error::InvalidOptimArgValue { .. })
    ));
    // APOLLO's random projection has no `full` form.
    let mut a = args("apollo_adamw", Some(StrOrList::One("all-linear".into())));
    a.optim_args = Some("proj_type=full".into());
    assert!(matches!(
        create_optimizer(&a, groups(&r)?),
        Err(Error::ConflictingOptions(_))
    ));
    Ok(())
}

#[test]
fn target_modules_match_as_upstreams_check_target_module_exists() -> Result<()> {
    let list = |v: &[&str]| StrOrList::List(v.iter().map(|s| s.to_string()).collect());
    let m = |t: &StrOrList, k: &str| check_target_module_exists("galore_adamw", t, k).unwrap();
    // A string is a regex matched against the whole name.
    assert!(m(
        &StrOrList::One(r".*\.q_proj".into()),
        "model.layers.0.q_proj"
    ));
    assert!(!m(
        &StrOrList::One("q_proj".into()),
        "model.layers.0.q_proj"
    ));
    // A list: exact name, substring, or a whole-name regex.
    assert!(m(&list(&["q_proj"]), "model.layers.0.q_proj"));
    assert!(m(&list(&["attn"]), "model.layers.0.self_attn.o_proj"));
    assert!(m(
        &list(&[r"model\.layers\.\d+\.mlp\..*"]),
        "model.layers.3.mlp.up"
    ));
    assert!(!m(&list(&["lm_head"]), "model.layers.0.q_proj"));
    // "all-linear" (or "all_linear") takes every linear module, in registration order.
    let linears: Vec<String> = ["a.q", "a.k", "lm_head"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for all in ["all-linear", "all_linear"] {
        let names =
            low_rank_target_names("apollo_adamw", Some(&StrOrList::One(all.into())), &linears)?;
        assert_eq!(names, ["a.q.weight", "a.k.weight", "lm_head.weight"]);
    }
    Ok(())
}

#[test]
fn layer_wise_optimizers_refuse_accumulation_ddp_and_missing_targets_as_upstream() -> Result<()> {
    let _g = lock();
    let r = reference()?;
    let targets = || Some(StrOrList::List(vec!["proj".into()]));
    for optim in ["galore_adamw_layerwise", "apollo_adamw_layerwise"] {
        let mut a = args(optim, targets());
        a.gradient_accumulation_steps = 2;
        assert_eq!(
            setup_error(create_optimizer(&a, groups(&r)?)),
            format!("Layerwise {optim} does not support gradient accumulation!")
        );
        let mut a = args(optim, targets());
        a.distributed = true;
        assert_eq!(
            setup_error(create_optimizer(&a, groups(&r)?)),
            format!("Layer-wise {optim} does not support DDP at this time")
        );
        assert_eq!(
            setup_error(create_optimizer(&args(optim, None), groups(&r)?)),
            format!("You need to define `optim_target_modules` to use {optim} optimizers")
        );
        let none = StrOrList::List(vec!["attn".into()]);
        assert_eq!(
            setup_error(create_optimizer(&args(optim, Some(none)), groups(&r)?)),
            format!("No target modules found for {optim} (['attn']).")
        );
    }
    // Upstream's galore_adafactor_layerwise fails in galore_torch's constructor (the Trainer's
    // lr with relative_step=True): refused, pointing at galore_adafactor.
    match create_optimizer(&args("galore_adafactor_layerwise", targets()), groups(&r)?) {
        Err(Error::UnsupportedOptimizer { why, instead, .. }) => {
            assert!(why.contains("relative_step=True"), "{why}");
            assert_eq!(instead, "galore_adafactor");
        }
        other => panic!("expected a refusal, got {:?}", other.map(|o| o.name())),
    }
    Ok(())
}

#[test]
fn layer_wise_optimizers_update_inside_the_backward_and_leave_no_gradient() -> Result<()> {
    let _g = lock();
    let r = reference()?;
    let params = r.fresh_params()?;
    let mut opt = r.build("galore_adamw_layerwise", &params)?;
    assert_eq!(opt.name(), "galore_adamw_layerwise");
    assert!(opt.fuses_backward());
    // The non-layer-wise layout, which the Trainer's scheduler drives.
    let groups = opt.param_groups();
    assert_eq!(groups.len(), 2);
    assert_eq!(groups[1].param_names, ["proj.weight", "head.weight"]);
    assert!(groups.iter().all(|g| g.weight_decay == 0.0));
    r.step(&params, opt.as_mut(), 0)?;
    // Every parameter was updated and its gradient dropped: the Trainer's clip finds none and
    // reports a norm of 0, as upstream's.
    for (n, p) in &params {
        assert!(!p.grad().defined(), "{n} kept its gradient");
        assert!(!p.equal(r.t(&format!("init.{n}"))?), "{n} was not updated");
    }
    let handles: Vec<Tensor> = params.iter().map(|(_, t)| t.shallow_clone()).collect();
    let norm = tchtrain_optim::clip_grad_norm(&handles, 1.0, 2.0, false)?;
    assert_eq!(norm.double_value(&[]), 0.0);
    assert!(opt.state().iter().all(Option::is_some));
    // step() is the dummy's: gradients set by hand are not applied.
    let before: Vec<Tensor> = params.iter().map(|(_, t)| t.copy()).collect();
    for (_, p) in &params {
        tchtrain_optim::set_grad(p, Some(&p.ones_like()))?;
    }
    opt.step()?;
    for ((n, p), b) in params.iter().zip(&before) {
        assert!(p.equal(b), "{n} moved in step()");
    }
    opt.zero_grad();
    // The scheduled rate reaches every parameter's optimizer: a rate of 0 changes nothing.
    opt.set_lrs(&[0.0, 0.0])?;
    let mut loss = Tensor::zeros([], (Kind::Float, Device::Cpu));
    for (_, p) in &params {
        loss += p.sum(Kind::Float);
    }
    opt.fused_backward(&loss, 0.0)?;
    for ((n, p), b) in params.iter().zip(&before) {
        assert!(p.equal(b), "{n} moved at lr 0");
    }
    // GaLore has no randomness: layer-wise gives the numbers of galore_adamw, bit for bit.
    let whole = r.fresh_params()?;
    let mut other = r.build("galore_adamw", &whole)?;
    let layered = r.fresh_params()?;
    let mut opt = r.build("galore_adamw_layerwise", &layered)?;
    for step in 0..12 {
        r.step(&whole, other.as_mut(), step)?;
        r.step(&layered, opt.as_mut(), step)?;
    }
    for ((n, a), (_, b)) in whole.iter().zip(&layered) {
        assert!(a.equal(b), "{n} differs from galore_adamw");
    }
    Ok(())
}

#[test]
fn layer_wise_apollo_seeds_every_parameters_projection_with_1_as_upstream() -> Result<()> {
    let _g = lock();
    let r = reference()?;
    // One APOLLOAdamW per parameter numbers its only parameter 1: every projection starts
    // from seed 1 (the non-layer-wise optimizer gives proj.weight seed 5).
    let (opt, names) = state_after(&r, "apollo_adamw_layerwise", 1)?;
    let expected = [
        -1.5255959033966064f64,
        -0.7502318024635315,
        -0.6539809107780457,
    ];
    for (name, shape) in [("proj.weight", [8, 64]), ("head.weight", [24, 8])] {
        let i = names.iter().position(|x| x == name).context("target")?;
        let st = opt.state()[i].as_ref().context("state")?;
        assert_eq!(
            st.tensors["projector_seed"].int64_value(&[]),
            505211975917066638,
            "{name}: next_seed(1)"
        );
        let p = &st.tensors["ortho_matrix"];
        assert_eq!(p.size(), shape);
        for (j, e) in expected.iter().enumerate() {
            let got = p.double_value(&[0, j as i64]);
            assert_eq!(got as f32, (*e as f32) / (8f32).sqrt(), "{name} entry {j}");
        }
    }
    let (opt10, names) = state_after(&r, "apollo_adamw_layerwise", 11)?;
    let i = names
        .iter()
        .position(|x| x == "proj.weight")
        .context("proj")?;
    let st = opt10.state()[i].as_ref().context("state")?;
    assert_eq!(
        st.tensors["projector_seed"].int64_value(&[]),
        7574884091489552460
    );
    Ok(())
}

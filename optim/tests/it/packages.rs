//! The `optim` names whose optimizers come from packages, against
//! `scripts/reference/optim_packages.py`: each case is built by [`create_optimizer`] from the
//! same `TrainingArguments` fields upstream's Trainer read, then 50 steps on the reference's
//! gradients, `train()` before each step as upstream's `training_step` calls it.
//!
//! Every case also checks its state export: 25 steps, `state_dict` saved to disk, a fresh
//! optimizer over copies of the parameters loads it, 25 more steps: bit-identical to the run
//! without the break.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use serde_json::Value;
use tch::{Kind, Tensor};
use tchtrain_optim::{GroupSpec, Optimizer, OptimizerArgs, create_optimizer, decay_param_groups};
use tchtrain_testing::lock;
use tchtrain_training_args::{OptimizerNames, OptimizerSupport, StrOrList};

/// The test module's layout (`Tiny` in the reference script).
pub(crate) const LAYERNORMS: [&str; 1] = ["norm"];
pub(crate) const EMBEDDINGS: [&str; 1] = ["embed.weight"];
pub(crate) const LINEARS: [&str; 2] = ["proj", "head"];

/// Named parameters in `named_parameters()` order.
pub(crate) type NamedParams = Vec<(String, Tensor)>;

pub(crate) struct Reference {
    pub meta: Value,
    pub tensors: BTreeMap<String, Tensor>,
}

pub(crate) fn reference() -> Result<Reference> {
    Reference::read("optim_packages")
}

impl Reference {
    /// `STEM.json` and `STEM.safetensors` of `scripts/reference/STEM.py`.
    pub fn read(stem: &str) -> Result<Self> {
        let dir = tchtrain_testing::reference_dir(stem);
        let json = dir.join(format!("{stem}.json"));
        let text = std::fs::read_to_string(&json).with_context(|| {
            format!(
                "{} is missing: run `cargo xtask setup` to generate the reference values",
                json.display()
            )
        })?;
        let st = dir.join(format!("{stem}.safetensors"));
        let tensors = Tensor::read_safetensors(&st)
            .with_context(|| format!("{} (run `cargo xtask setup`)", st.display()))?
            .into_iter()
            .collect();
        Ok(Reference {
            meta: serde_json::from_str(&text)?,
            tensors,
        })
    }
}

impl Reference {
    pub fn t(&self, key: &str) -> Result<&Tensor> {
        self.tensors
            .get(key)
            .with_context(|| format!("reference tensor {key} missing"))
    }

    pub fn steps(&self) -> i64 {
        self.meta["steps"].as_i64().unwrap_or(50)
    }

    pub fn param_names(&self) -> Vec<String> {
        serde_json::from_value(self.meta["params"].clone()).unwrap_or_default()
    }

    pub fn case(&self, name: &str) -> Result<&Value> {
        self.meta["cases"]
            .get(name)
            .with_context(|| format!("case {name} missing from optim_packages.json"))
    }

    /// Fresh leaf parameters (copies of `init.*`), in `named_parameters()` order.
    pub fn fresh_params(&self) -> Result<Vec<(String, Tensor)>> {
        self.param_names()
            .into_iter()
            .map(|n| {
                let t = self.t(&format!("init.{n}"))?.copy().set_requires_grad(true);
                Ok((n, t))
            })
            .collect()
    }

    /// The `OptimizerArgs` of a case: its `TrainingArguments` fields, and the module's facts
    /// as the Trainer fills them.
    pub fn optimizer_args(&self, case: &str) -> Result<OptimizerArgs> {
        let a = &self.case(case)?["args"];
        let f = |k: &str, d: f64| a.get(k).and_then(Value::as_f64).unwrap_or(d);
        let d = OptimizerArgs::default();
        Ok(OptimizerArgs {
            optim: a["optim"].as_str().context("optim")?.to_string(),
            learning_rate: f("learning_rate", d.learning_rate),
            adam_beta1: f("adam_beta1", d.adam_beta1),
            adam_beta2: f("adam_beta2", d.adam_beta2),
            adam_epsilon: f("adam_epsilon", d.adam_epsilon),
            optim_args: a
                .get("optim_args")
                .and_then(Value::as_str)
                .map(String::from),
            weight_decay: f("weight_decay", d.weight_decay),
            warmup_steps: f("warmup_steps", d.warmup_steps),
            optim_target_modules: a
                .get("optim_target_modules")
                .map(|v| serde_json::from_value::<StrOrList>(v.clone()))
                .transpose()?,
            gradient_accumulation_steps: a
                .get("gradient_accumulation_steps")
                .and_then(Value::as_u64)
                .unwrap_or(1) as usize,
            distributed: false,
            embedding_weights: EMBEDDINGS.iter().map(|s| s.to_string()).collect(),
            linear_modules: LINEARS.iter().map(|s| s.to_string()).collect(),
        })
    }

    /// The case's optimizer over `params`, built as the Trainer builds it.
    pub fn build(&self, case: &str, params: &[(String, Tensor)]) -> Result<Box<dyn Optimizer>> {
        let args = self.optimizer_args(case)?;
        let named = params
            .iter()
            .map(|(n, t)| (n.clone(), t.shallow_clone()))
            .collect();
        let groups = decay_param_groups(named, args.weight_decay, &LAYERNORMS);
        Ok(create_optimizer(&args, groups)?)
    }

    /// The case run over the reference's steps from fresh parameters: the parameters and
    /// the optimizer after it.
    pub fn run(&self, case: &str) -> Result<(NamedParams, Box<dyn Optimizer>)> {
        let params = self.fresh_params()?;
        let mut opt = self.build(case, &params)?;
        for step in 0..self.steps() {
            self.step(&params, opt.as_mut(), step)?;
        }
        Ok((params, opt))
    }

    /// The worst [`relative_diff`] of `params` from the case's final parameters.
    pub fn final_diff(&self, case: &str, params: &[(String, Tensor)]) -> Result<f64> {
        let mut worst = 0.0f64;
        for (n, p) in params {
            worst = worst.max(relative_diff(p, self.t(&format!("{case}.final.{n}"))?));
        }
        Ok(worst)
    }

    /// One training step of the reference: gradients of `step`, `train()`, `step()`,
    /// `zero_grad()`.
    pub fn step(
        &self,
        params: &[(String, Tensor)],
        opt: &mut dyn Optimizer,
        step: i64,
    ) -> Result<()> {
        if opt.fuses_backward() {
            // upstream's training_step for LOMO: `accelerator.backward(loss, learning_rate=lr)`
            // on a loss whose gradients are the reference's.
            let mut loss = Tensor::zeros([], (Kind::Float, tch::Device::Cpu));
            for (n, p) in params {
                let g = self.t(&format!("grads.{n}"))?.get(step);
                loss += (p * g).sum(Kind::Float);
            }
            let lr = opt.lrs()[0];
            return Ok(opt.fused_backward(&loss, lr)?);
        }
        for (n, p) in params {
            // A copy: some optimizers write into the gradient (optimi's Kahan path does).
            let g = self.t(&format!("grads.{n}"))?.get(step).copy();
            tchtrain_optim::set_grad(p, Some(&g))?;
        }
        opt.train()?;
        opt.step()?;
        opt.zero_grad();
        Ok(())
    }
}

/// `max |a - b| / max |b|` (0 when both are zero).
pub(crate) fn relative_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    let (a, b) = (a.to_kind(Kind::Double), b.to_kind(Kind::Double));
    let diff = (&a - &b).abs().max().double_value(&[]);
    let scale = b.abs().max().double_value(&[]);
    if diff == 0.0 { 0.0 } else { diff / scale }
}

fn copies(params: &[(String, Tensor)]) -> Vec<(String, Tensor)> {
    params
        .iter()
        .map(|(n, t)| (n.clone(), t.detach().copy().set_requires_grad(true)))
        .collect()
}

/// The relative bound of the issue for float states (see each case's note in docs/optimizers.md).
const BOUND: f64 = 1e-6;

#[test]
fn package_optimizers_match_their_packages_for_50_steps() -> Result<()> {
    let _g = lock();
    let r = reference()?;
    let cases: Vec<String> = r.meta["cases"]
        .as_object()
        .context("cases")?
        .keys()
        .cloned()
        .collect();
    let mut report = Vec::new();
    for case in &cases {
        let (params, mut opt) = r.run(case)?;
        let worst = r.final_diff(case, &params)?;
        let mut line = format!("{case:34} final {worst:.2e}");
        assert!(
            worst <= BOUND,
            "{case}: parameters differ by {worst:e} relative"
        );
        if r.tensors
            .keys()
            .any(|k| k.starts_with(&format!("{case}.eval.")))
        {
            opt.eval()?;
            let mut worst = 0.0f64;
            for (n, p) in &params {
                worst = worst.max(relative_diff(p, r.t(&format!("{case}.eval.{n}"))?));
            }
            line += &format!("  eval {worst:.2e}");
            assert!(
                worst <= BOUND,
                "{case}: eval() parameters differ by {worst:e}"
            );
        }
        report.push(line);
    }
    println!(
        "relative difference from the packages:\n{}",
        report.join("\n")
    );
    Ok(())
}

#[test]
fn package_optimizers_resume_bit_exactly_from_their_state_dict() -> Result<()> {
    let _g = lock();
    let r = reference()?;
    let cases: Vec<String> = r.meta["cases"]
        .as_object()
        .context("cases")?
        .keys()
        .cloned()
        .collect();
    let dir = tchtrain_testing::temp_dir("optim_packages_resume");
    for case in &cases {
        let params = r.fresh_params()?;
        let mut opt = r.build(case, &params)?;
        let half = r.steps() / 2;
        for step in 0..half {
            r.step(&params, opt.as_mut(), step)?;
        }
        let path = dir.path().join(case);
        opt.save(&path)?;
        let resumed = copies(&params);
        let mut other = r.build(case, &resumed)?;
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

/// The table in docs/optimizers.md of `optim` names, from `OptimizerNames::support`.
fn optimizer_table() -> String {
    let mut out =
        String::from("| `optim` | here | checked against / why refused |\n|---|---|---|\n");
    for name in OptimizerNames::ALL {
        let row = match name.support() {
            OptimizerSupport::Working { reference } => format!("working | `{reference}`"),
            OptimizerSupport::Refused { why, instead } => {
                format!("refused | {why}; use `{instead}`")
            }
        };
        out += &format!("| `{}` | {row} |\n", name.as_str());
    }
    out
}

#[test]
fn every_optim_name_is_built_or_refused_as_the_table_and_readme_say() -> Result<()> {
    let _g = lock();
    let params = || {
        vec![GroupSpec::new(vec![
            (
                "proj.weight".to_string(),
                Tensor::zeros([8, 8], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true),
            ),
            (
                "proj.bias".to_string(),
                Tensor::zeros([8], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true),
            ),
        ])]
    };
    let mut working = 0;
    for name in OptimizerNames::ALL {
        let args = OptimizerArgs {
            optim: name.as_str().into(),
            learning_rate: 1e-3,
            optim_target_modules: Some(StrOrList::List(vec!["proj".into()])),
            linear_modules: vec!["proj".into()],
            ..Default::default()
        };
        match (name.support(), create_optimizer(&args, params())) {
            (OptimizerSupport::Working { .. }, Ok(opt)) => {
                working += 1;
                assert!(opt.lrs().iter().all(|&lr| lr == 1e-3), "{name}");
            }
            (OptimizerSupport::Refused { why, instead }, Err(e)) => {
                let text = e.to_string();
                assert!(
                    text.contains(why) && text.contains(instead),
                    "{name}: {text}"
                );
            }
            (support, built) => panic!(
                "{name}: the table says {support:?}, the factory gave {:?}",
                built.map(|o| o.name())
            ),
        }
    }
    assert_eq!(working, OptimizerNames::supported().len());
    let readme = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/optimizers.md"
    ))?;
    let (begin, end) = (
        "<!-- optim-support:begin -->\n",
        "<!-- optim-support:end -->",
    );
    let start = readme
        .find(begin)
        .context("docs/optimizers.md lacks the optim-support markers")?
        + begin.len();
    let stop = readme[start..]
        .find(end)
        .context("docs/optimizers.md lacks the end marker")?
        + start;
    let table = optimizer_table();
    assert!(
        readme[start..stop] == table,
        "docs/optimizers.md's optim-support table is stale; replace it with:\n{table}"
    );
    Ok(())
}

//! bf16 autocast on the CPU (the Trainer's `--bf16`: accelerate's `autocast` region around
//! the forward, the outputs back in float32) on every model family and each kind of head,
//! against `torch.autocast("cpu", dtype=torch.bfloat16)` with transformers 5.23
//! (`scripts/reference/models.py`, `autocast.safetensors`: the fp32 cases' checkpoints,
//! batches and labels rerun under autocast).
//!
//! Tolerance: 0. The same libtorch runs the same autocast op lists (matmuls and linear
//! layers in bfloat16, softmax, norms and losses promoted to float32) on the same inputs in
//! the same order, so every logit, loss and gradient is the same float.

use std::collections::HashMap;

use anyhow::{Context, Result, bail};
use tch::{Device, Kind, Tensor};
use tchtrain_accelerate::AutocastGuard;
use tchtrain_models::{AutoTask, LoadOptions, ModelInputs, from_pretrained_dir};
use tchtrain_testing::{assets, lock};

fn max_abs(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size(), "shape mismatch");
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

#[test]
fn every_family_under_bf16_autocast_equals_upstream() -> Result<()> {
    let _g = lock();
    let dir = assets().join("reference/models");
    let path = dir.join("autocast.safetensors");
    if !path.exists() {
        bail!("{} is missing: run `cargo xtask setup`", path.display());
    }
    let reference: HashMap<String, Tensor> = Tensor::read_safetensors(&path)?.into_iter().collect();
    let mut cases: Vec<&str> = reference
        .keys()
        .filter_map(|k| k.strip_suffix(".loss"))
        .collect();
    cases.sort();
    assert!(
        cases.len() >= 21,
        "{} cases in {}",
        cases.len(),
        path.display()
    );
    for case in cases {
        let task = match case.rsplit('_').next() {
            Some("lm") => AutoTask::CausalLm,
            Some("mlm") => AutoTask::MaskedLm,
            Some("seqcls") => AutoTask::SequenceClassification { num_labels: None },
            Some("tokcls") => AutoTask::TokenClassification { num_labels: None },
            Some("qa") => AutoTask::QuestionAnswering,
            _ => bail!("{case}: unknown head"),
        };
        let batch: HashMap<String, Tensor> =
            Tensor::read_safetensors(dir.join(format!("{case}.safetensors")))?
                .into_iter()
                .collect();
        let mut model =
            from_pretrained_dir(&dir.join(case), task, Device::Cpu, &LoadOptions::default())?.model;
        model.eval();
        let inputs = ModelInputs {
            input_ids: batch.get("input_ids"),
            attention_mask: batch.get("attention_mask"),
            token_type_ids: batch.get("token_type_ids"),
            ..Default::default()
        };
        let logits = {
            let _autocast = AutocastGuard::enter(Device::Cpu, Kind::BFloat16)?;
            tch::no_grad(|| model.forward(&inputs))?
                .logits
                .context("logits")?
        };
        let logits_diff = max_abs(
            &logits.to_kind(Kind::Float),
            &reference[&format!("{case}.logits")],
        );
        let labelled = ModelInputs {
            labels: batch.get("labels"),
            start_positions: batch.get("start_positions"),
            end_positions: batch.get("end_positions"),
            ..inputs
        };
        let loss = {
            let _autocast = AutocastGuard::enter(Device::Cpu, Kind::BFloat16)?;
            model.forward(&labelled)?.loss.context("loss")?
        }
        .to_kind(Kind::Float);
        loss.backward();
        let loss_diff = max_abs(&loss.reshape([1]), &reference[&format!("{case}.loss")]);
        let vars = model.var_store().variables();
        let tied = model.tied_weights();
        let prefix = format!("{case}.grad.");
        let mut grad_diff = 0.0f64;
        let mut n = 0;
        for (key, expected) in reference.iter().filter(|(k, _)| k.starts_with(&prefix)) {
            let name = &key[prefix.len()..];
            let name = tied
                .iter()
                .find(|(t, _)| t == name)
                .map_or(name, |(_, source)| source.as_str());
            let var = vars
                .get(name)
                .with_context(|| format!("{case}: no parameter {name}"))?;
            let d = max_abs(&var.grad(), expected);
            if d > 0.0 {
                eprintln!(
                    "{case}: grad of {name} differs by {d:.3e} (max |g| {:.3e})",
                    expected.abs().max().double_value(&[])
                );
            }
            grad_diff = grad_diff.max(d);
            n += 1;
        }
        eprintln!(
            "{case}: bf16 autocast logits {logits_diff:.3e}, loss {loss_diff:.3e}, {n} gradients {grad_diff:.3e}"
        );
        assert!(n > 0, "{case}: no gradients compared");
        assert!(
            logits_diff == 0.0 && loss_diff == 0.0 && grad_diff == 0.0,
            "{case}: bf16 autocast differs from upstream's (logits {logits_diff}, loss {loss_diff}, gradients {grad_diff})"
        );
    }
    Ok(())
}

//! Gemma 3's vision-language model (`Gemma3ForConditionalGeneration`: SigLIP tower, projector,
//! Gemma 3 language model) against transformers 5.23 (`scripts/reference/gemma3_vlm.py`):
//! tiny seeded checkpoints with the image token inside the text vocabulary (as Gemma 3's) and
//! past it (embedded as token 0), a batch of one image, two images (one row padded) and text
//! only.
//!
//! - Parameters in upstream's order (vision tower, projector, language model).
//! - Training-mode logits, loss and every gradient with `token_type_ids` (each image's tokens
//!   attend both ways, the sliding layer within its window), the logits without them (plain
//!   causal masks), the loss and gradients under CPU bfloat16 autocast.
//! - `save_pretrained` writes upstream's tensors under its names (`vision_tower.…`,
//!   `multi_modal_projector.…`, `language_model.model.…`).
//! - Too few image tokens for the images: upstream's message.
//!
//! Tolerance: 0 (the tower, the pooling, Gemma's RMSNorm, the scatter and the masks op for op).

use std::collections::HashMap;

use anyhow::{Context, Result, ensure};
use tch::{Device, Kind, Tensor};
use tchtrain_accelerate::AutocastGuard;
use tchtrain_models::{AutoTask, LoadOptions, ModelInputs, from_pretrained_dir};
use tchtrain_testing::{assets, lock, temp_dir};

use crate::decoder_families::{max_abs, parameter_order};

fn tensors(path: &std::path::Path) -> Result<HashMap<String, Tensor>> {
    Ok(Tensor::read_safetensors(path)
        .with_context(|| format!("{} (run `cargo xtask setup`)", path.display()))?
        .into_iter()
        .collect())
}

#[test]
fn gemma3_vision_language_model_equals_transformers() -> Result<()> {
    let _g = lock();
    for case in ["inside", "outside"] {
        let dir = assets().join("reference/gemma3_vlm").join(case);
        let loaded = from_pretrained_dir(
            &dir.join("model"),
            AutoTask::CausalLm,
            Device::Cpu,
            &LoadOptions::default(),
        )?;
        ensure!(
            loaded.info.missing_keys.is_empty() && loaded.info.unexpected_keys.is_empty(),
            "{case}: {:?}",
            loaded.info
        );
        let mut model = loaded.model;
        ensure!(model.architecture() == "Gemma3ForConditionalGeneration");
        // Parameter order: upstream's `named_parameters()` (the tied head left out).
        let upstream: Vec<String> =
            serde_json::from_str(&std::fs::read_to_string(dir.join("parameters.json"))?)?;
        let vars = model.var_store().variables();
        let ours = parameter_order(&*model);
        ensure!(ours == upstream, "{case}: parameter order {ours:?}");
        let r = tensors(&dir.join("forward.safetensors"))?;
        let inputs = ModelInputs {
            input_ids: r.get("input_ids"),
            attention_mask: r.get("attention_mask"),
            pixel_values: r.get("pixel_values"),
            ..Default::default()
        };
        model.train();
        for (prefix, autocast) in [("", false), ("autocast.", true)] {
            for v in vars.values() {
                let mut g = v.grad();
                if g.defined() {
                    let _ = g.zero_();
                }
            }
            let out = {
                let _a = match autocast {
                    true => Some(AutocastGuard::enter(Device::Cpu, Kind::BFloat16)?),
                    false => None,
                };
                model.forward(&ModelInputs {
                    token_type_ids: r.get("token_type_ids"),
                    labels: r.get("labels"),
                    ..inputs
                })?
            };
            if !autocast {
                let logits = out.logits.as_ref().context("logits")?;
                ensure!(
                    logits.equal(&r["logits"]),
                    "{case}: logits differ by {}",
                    max_abs(logits, &r["logits"])
                );
            }
            let loss = out.loss.context("loss")?.to_kind(Kind::Float);
            loss.backward();
            let d = max_abs(&loss.reshape([1]), &r[&format!("{prefix}loss")]);
            ensure!(d == 0.0, "{case}: {prefix}loss differs by {d:e}");
            let grad_prefix = format!("{prefix}grad.");
            let mut n = 0;
            for (key, expected) in r.iter().filter(|(k, _)| k.starts_with(&grad_prefix)) {
                let name = &key[grad_prefix.len()..];
                let var = vars
                    .get(name)
                    .with_context(|| format!("no parameter {name}"))?;
                let d = max_abs(&var.grad(), expected);
                ensure!(d == 0.0, "{case}: {prefix}grad of {name} differs by {d:e}");
                n += 1;
            }
            ensure!(
                n == upstream.len(),
                "{case}: {n} gradients of {} parameters",
                upstream.len()
            );
        }
        // Without token_type_ids: the plain causal masks.
        let logits = tch::no_grad(|| model.forward(&inputs))?
            .logits
            .context("logits")?;
        ensure!(
            logits.equal(&r["causal.logits"]),
            "{case}: causal logits differ by {}",
            max_abs(&logits, &r["causal.logits"])
        );
        // Saved as upstream's.
        let out = temp_dir("gemma3-vlm-save");
        model.save_pretrained(&out)?;
        let ours = tensors(&out.join("model.safetensors"))?;
        let theirs = tensors(&dir.join("model/model.safetensors"))?;
        let mut names: Vec<_> = ours.keys().collect();
        names.sort();
        let mut expected: Vec<_> = theirs.keys().collect();
        expected.sort();
        ensure!(names == expected, "{case}: saved {names:?}");
        for n in names {
            ensure!(ours[n].equal(&theirs[n]), "{case}: saved {n} differs");
        }
        // One image's placeholders short: upstream's message.
        let ids = r["input_ids"].copy();
        let image_token = if case == "inside" { 62 } else { 70 };
        let _ = ids.get(0).get(4).fill_(5);
        let err = tch::no_grad(|| {
            model.forward(&ModelInputs {
                input_ids: Some(&ids),
                ..inputs
            })
        })
        .expect_err("a placeholder short");
        ensure!(
            err.to_string()
                .contains("Image features and image tokens do not match, tokens: 11, features: 12"),
            "{err} (image token {image_token})"
        );
    }
    Ok(())
}

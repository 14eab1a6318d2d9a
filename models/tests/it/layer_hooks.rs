//! The per-layer hooks (`LayerHooks`, `Context::with_layer_hooks`) of GPT-2, BERT and Llama: called
//! before and after every layer in order, with the hidden states of the right shape; hooks
//! that hand the tensor back change nothing (bit for bit); a failing hook is an error naming
//! the layer; outside `with_layer_hooks` nothing is called.

use std::sync::{Arc, Mutex};
use tchtrain_testing::{assets, lock};

use anyhow::{Context, Result};
use tch::{Device, Tensor};
use tchtrain_models::{AutoTask, Error, LayerHooks, LoadOptions, ModelInputs, from_pretrained_dir};

/// Records every call; fails at `fail_at` (layer, "before" / "after") when set.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<(String, usize, Vec<i64>)>>,
    fail_at: Option<(usize, &'static str)>,
}

impl Recorder {
    fn record(&self, what: &str, index: usize, hidden: Tensor) -> Result<Tensor, String> {
        self.calls
            .lock()
            .expect("calls")
            .push((what.to_string(), index, hidden.size()));
        if self.fail_at == Some((index, if what == "before" { "before" } else { "after" })) {
            return Err("the hook failed".into());
        }
        Ok(hidden)
    }
}

impl LayerHooks for Recorder {
    fn before_layer(&self, index: usize, hidden: Tensor) -> Result<Tensor, String> {
        self.record("before", index, hidden)
    }

    fn after_layer(&self, index: usize, hidden: Tensor) -> Result<Tensor, String> {
        self.record("after", index, hidden)
    }
}

#[test]
fn every_model_calls_the_hooks_around_each_layer_in_order() -> Result<()> {
    let _g = lock();
    for (name, task, width) in [
        ("tiny-gpt2", AutoTask::CausalLm, "n_embd"),
        ("tiny-bert", AutoTask::MaskedLm, "hidden_size"),
        ("tiny-llama", AutoTask::CausalLm, "hidden_size"),
    ] {
        let dir = assets().join(name);
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
        let hidden = config[width].as_i64().expect("width");
        let layers = config
            .get("n_layer")
            .or_else(|| config.get("num_hidden_layers"))
            .and_then(|v| v.as_u64())
            .expect("layer count") as usize;
        let model = from_pretrained_dir(&dir, task, Device::Cpu, &LoadOptions::default())?.model;
        let ids = Tensor::from_slice(&[1i64, 5, 9, 3, 7, 2]).view([2, 3]);
        let inputs = ModelInputs {
            input_ids: Some(&ids),
            ..ModelInputs::default()
        };
        let plain = tch::no_grad(|| model.forward(&inputs))?
            .logits
            .context("logits")?;

        let rec = Arc::new(Recorder::default());
        let hooked = model
            .context()
            .with_layer_hooks(rec.clone(), || tch::no_grad(|| model.forward(&inputs)))?
            .logits
            .context("logits")?;
        assert_eq!(
            hooked.f_sub(&plain)?.abs().max().double_value(&[]),
            0.0,
            "{name}: identity hooks change nothing"
        );
        let expected: Vec<(String, usize, Vec<i64>)> = (0..layers)
            .flat_map(|i| {
                [("before", i), ("after", i)].map(|(w, i)| (w.to_string(), i, vec![2, 3, hidden]))
            })
            .collect();
        assert_eq!(*rec.calls.lock().expect("calls"), expected, "{name}");

        // Outside `with_layer_hooks`: no calls.
        let n = rec.calls.lock().expect("calls").len();
        let _ = tch::no_grad(|| model.forward(&inputs))?;
        assert_eq!(
            rec.calls.lock().expect("calls").len(),
            n,
            "{name}: hooks uninstalled"
        );

        // A failing hook stops the forward with an error naming the layer.
        let failing = Arc::new(Recorder {
            fail_at: Some((layers - 1, "after")),
            ..Recorder::default()
        });
        let err = model
            .context()
            .with_layer_hooks(failing, || tch::no_grad(|| model.forward(&inputs)))
            .expect_err("the hook fails");
        assert!(
            matches!(err, Error::LayerHook { layer, .. } if layer == layers - 1),
            "{name}: {err:?}"
        );
        assert!(err.to_string().contains("the hook failed"), "{err}");
    }
    Ok(())
}

/// Identity hooks that say they release parameters (as ZeRO-3's do).
struct Releasing;

impl LayerHooks for Releasing {
    fn before_layer(&self, _: usize, hidden: Tensor) -> Result<Tensor, String> {
        Ok(hidden)
    }

    fn after_layer(&self, _: usize, hidden: Tensor) -> Result<Tensor, String> {
        Ok(hidden)
    }

    fn releases_parameters(&self) -> bool {
        true
    }
}

/// The loss's gradient with respect to the input embeddings' weight after the forward, with
/// every layer linear weight pointed at new storage holding twice its values between the
/// forward and the backward (what ZeRO-3 does with re-gathered values, here changed so that
/// which storage the backward read shows in the result).
fn grad_after_swapping_weights(
    model: &dyn tchtrain_models::PreTrainedModel,
    inputs: &ModelInputs<'_>,
    hooks: Option<Arc<dyn LayerHooks>>,
    swap: bool,
) -> Result<(f64, Tensor)> {
    let named: Vec<(String, Tensor)> = model.var_store().variables().into_iter().collect();
    for (_, t) in &named {
        let mut g = t.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
    let out = match hooks {
        Some(h) => model
            .context()
            .with_layer_hooks(h, || model.forward(inputs))?,
        None => model.forward(inputs)?,
    };
    let loss = out.loss.expect("labels given");
    let linear = |n: &str| {
        n.contains(".layers.")
            && n.ends_with(".weight")
            && !n.contains("layernorm")
            && !n.contains("LayerNorm")
    };
    let mut originals = Vec::new();
    if swap {
        tch::no_grad(|| -> Result<()> {
            for (n, t) in &named {
                if linear(n)
                    || (n.contains(".layer.") && n.ends_with("dense.weight"))
                    || (n.contains(".layer.")
                        && (n.ends_with("query.weight")
                            || n.ends_with("key.weight")
                            || n.ends_with("value.weight")))
                {
                    let old = t.copy();
                    let mut v = t.shallow_clone();
                    v.set_data(&(&old * 2.0));
                    originals.push((v, old));
                }
            }
            Ok(())
        })?;
    }
    loss.backward();
    for (mut v, old) in originals {
        v.set_data(&old);
    }
    let embed = named
        .iter()
        .find(|(n, _)| n.contains("embed_tokens") || n.contains("word_embeddings"))
        .expect("input embeddings");
    Ok((loss.double_value(&[]), embed.1.grad().copy()))
}

#[test]
fn releasing_hooks_save_the_weights_themselves() -> Result<()> {
    let _g = lock();
    for (name, task) in [
        ("tiny-llama", AutoTask::CausalLm),
        ("tiny-bert", AutoTask::MaskedLm),
    ] {
        let dir = assets().join(name);
        let model = from_pretrained_dir(&dir, task, Device::Cpu, &LoadOptions::default())?.model;
        let ids = Tensor::from_slice(&[1i64, 5, 9, 3, 7, 2]).view([2, 3]);
        let inputs = ModelInputs {
            input_ids: Some(&ids),
            labels: Some(&ids),
            ..ModelInputs::default()
        };
        let releasing: Arc<dyn LayerHooks> = Arc::new(Releasing);
        let (loss, grad) = grad_after_swapping_weights(&*model, &inputs, None, false)?;
        let (loss_r, grad_r) =
            grad_after_swapping_weights(&*model, &inputs, Some(releasing.clone()), false)?;
        // The (W xᵀ)ᵀ form agrees with nn::Linear to rounding: the two are different GEMM
        // calls (transposed operands), so each output's K-term dot product (K <= 128, the
        // intermediate width) may be summed in another order: at most (K-1)u|w||x| per
        // output with u = 2^-24, i.e. 128 * 6e-8 = 7.6e-6 relative per layer, and through
        // two layers and the head at most (2L+1) times that, 4e-5. Bounded by that.
        let rel = |a: &Tensor, b: &Tensor| -> f64 {
            a.f_sub(b).unwrap().abs().max().double_value(&[])
                / b.abs().max().double_value(&[]).max(1e-30)
        };
        assert!(
            (loss - loss_r).abs() / loss.abs() < 4e-5,
            "{name}: {loss} vs {loss_r}"
        );
        assert!(
            rel(&grad_r, &grad) < 4e-5,
            "{name}: gradient {}",
            rel(&grad_r, &grad)
        );
        // Swapping the weights' storage between forward and backward: nn::Linear's saved
        // transposes still read the old storage (the same computation: the same gradient to
        // the bit); the releasing
        // form reads the variables' new storage (a gradient off by far more than rounding:
        // 4 % on BERT, whose post-norm layers damp it, more on Llama).
        let (_, grad_swapped) = grad_after_swapping_weights(&*model, &inputs, None, true)?;
        assert!(
            rel(&grad_swapped, &grad) == 0.0,
            "{name}: nn::Linear kept the old storage: {}",
            rel(&grad_swapped, &grad)
        );
        let (_, grad_r_swapped) =
            grad_after_swapping_weights(&*model, &inputs, Some(releasing), true)?;
        assert!(
            rel(&grad_r_swapped, &grad) > 1e-3,
            "{name}: the releasing form read the new storage: {}",
            rel(&grad_r_swapped, &grad)
        );
    }
    Ok(())
}

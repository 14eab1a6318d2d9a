//! The per-layer hooks (`LayerHooks`, `with_layer_hooks`) of GPT-2, BERT and Llama: called
//! before and after every layer in order, with the hidden states of the right shape; hooks
//! that hand the tensor back change nothing (bit for bit); a failing hook is an error naming
//! the layer; outside `with_layer_hooks` nothing is called.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use anyhow::Result;
use tch::{Device, Tensor};
use tchtrain_models::{
    AutoTask, Error, LayerHooks, LoadOptions, ModelInputs, from_pretrained_dir, with_layer_hooks,
};

fn assets() -> PathBuf {
    std::env::var_os("TCHTRAIN_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets"))
}

/// Records every call; fails at `fail_at` (layer, "before" / "after") when set.
#[derive(Default)]
struct Recorder {
    calls: RefCell<Vec<(String, usize, Vec<i64>)>>,
    fail_at: Option<(usize, &'static str)>,
}

impl Recorder {
    fn record(&self, what: &str, index: usize, hidden: Tensor) -> Result<Tensor, String> {
        self.calls
            .borrow_mut()
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
        let plain = tch::no_grad(|| model.forward(&inputs))?.logits;

        let rec = Rc::new(Recorder::default());
        let hooked =
            with_layer_hooks(rec.clone(), || tch::no_grad(|| model.forward(&inputs)))?.logits;
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
        assert_eq!(*rec.calls.borrow(), expected, "{name}");

        // Outside `with_layer_hooks`: no calls.
        let n = rec.calls.borrow().len();
        let _ = tch::no_grad(|| model.forward(&inputs))?;
        assert_eq!(rec.calls.borrow().len(), n, "{name}: hooks uninstalled");

        // A failing hook stops the forward with an error naming the layer.
        let failing = Rc::new(Recorder {
            fail_at: Some((layers - 1, "after")),
            ..Recorder::default()
        });
        let err = with_layer_hooks(failing, || tch::no_grad(|| model.forward(&inputs)))
            .expect_err("the hook fails");
        assert!(
            matches!(err, Error::LayerHook { layer, .. } if layer == layers - 1),
            "{name}: {err:?}"
        );
        assert!(err.to_string().contains("the hook failed"), "{err}");
    }
    Ok(())
}

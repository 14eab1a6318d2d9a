//! `tchtrain-nn` — the parts a model is built from, on tch: [`Linear`], [`Conv1D`],
//! [`Embedding`], [`LayerNorm`], [`RmsNorm`], dropout and upstream's activations.
//!
//! Each part is built from a [`Path`]: the variable path is the `state_dict` key and the
//! part's upstream module name. A part owns what a module owns upstream: its LoRA adapter
//! ([`LoraSlot`]), its reports to the [`DebugUnderflowOverflow`] tracer, and, for a
//! model's layers, the [`LayerHooks`] ZeRO-3 and FSDP gather parameters with. A model's
//! parts share one [`Context`], which holds the model's dynamic state; nothing is kept in
//! thread-locals.
//!
//! Mirrors `torch.nn`, transformers' `activations.py`, `debug_utils.py`,
//! `integrations/neftune.py`, `_init_weights` / `_initialize_missing_keys`, and peft's
//! `tuners/lora/layer.py`.

mod activations;
pub mod bitsandbytes;
mod context;
pub mod debug_utils;
mod dropout;
mod embedding;
mod error;
mod gated_delta_net;
pub mod initialization;
mod layer_hooks;
mod linear;
mod lora;
mod module_repr;
mod moe;
mod neftune;
mod normalization;
mod path;

pub use activations::Activation;
pub use context::{Context, NeftuneGuard};
pub use debug_utils::{DebugUnderflowOverflow, Out, Var, join};
pub use dropout::{dropout, dropout_fast_path, dropout_traced, noise};
pub use embedding::Embedding;
pub use error::{Error, Result};
pub use gated_delta_net::{
    GatedDeltaNet, GatedDeltaNetSizes, LinearAttentionState, causal_conv1d_fn,
    causal_conv1d_update, rms_norm_gated, torch_chunk_gated_delta_rule,
    torch_recurrent_gated_delta_rule,
};
pub use layer_hooks::LayerHooks;
pub use linear::{Conv1D, Linear, Linear4bit, Linear8bitLt, QuantSlot, QuantizedWeight};
pub use lora::{Dora, LoraAdapter, LoraSlot};
pub use module_repr::ModuleRepr;
pub use moe::{ExpertGate, Experts, RouterKind, TopKRouter, load_balancing_loss_func};
pub use neftune::neftune_post_forward_hook;
pub use normalization::{LayerNorm, RmsNorm};
pub use path::Path;

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tch::nn::VarStore;
    use tch::{Device, Kind, Tensor};

    use super::*;

    struct Doubling;

    impl LayerHooks for Doubling {
        fn before_layer(&self, _: usize, h: Tensor) -> std::result::Result<Tensor, String> {
            Ok(h * 2.0)
        }
        fn after_layer(&self, i: usize, _: Tensor) -> std::result::Result<Tensor, String> {
            Err(format!("after {i}"))
        }
    }

    #[test]
    fn a_part_is_named_by_its_path_and_registers_its_lora_slot() {
        let vs = VarStore::new(Device::Cpu);
        let ctx = Context::new();
        let root = Path::root(&vs, &ctx);
        let lin = Linear::new(&root / "model" / "layers" / 0 / "q_proj", 4, 3, true, 0.02);
        let emb = Embedding::with_padding(&root / "embed_tokens", 10, 4, 0.02, Some(-1));
        assert_eq!(lin.name(), "model.layers.0.q_proj");
        assert_eq!(emb.padding_idx(), Some(9));
        let names: Vec<String> = ctx.lora_slots().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["model.layers.0.q_proj", "embed_tokens"]);
        // Without an adapter the part is `x Wᵀ + b`, bit for bit.
        let x = Tensor::randn([2, 4], (Kind::Float, Device::Cpu));
        let want = x.linear(&lin.ws, lin.bs.as_ref());
        assert!(lin.forward(&x).equal(&want));
        // With one, its term is added; `ran` says the part used it.
        let (_, slot) = &ctx.lora_slots()[0];
        let a = Tensor::ones([2, 4], (Kind::Float, Device::Cpu));
        let b = Tensor::ones([3, 2], (Kind::Float, Device::Cpu));
        slot.set(Some(LoraAdapter {
            a: a.shallow_clone(),
            b: b.shallow_clone(),
            scaling: 0.5,
            dora: None,
            dropout: 0.0,
            train: false,
        }));
        assert!(!slot.ran());
        let got = lin.forward(&x);
        assert!(slot.ran());
        let term = x.linear::<Tensor>(&a, None).linear::<Tensor>(&b, None) * 0.5;
        assert!(got.allclose(&(want + term), 1e-6, 1e-6, false));
    }

    #[test]
    fn hooks_are_the_models_own_and_come_off_after_the_call() {
        let ctx = Context::new();
        let other = Context::new();
        let h = Tensor::ones([1], (Kind::Float, Device::Cpu));
        let (before, err) = ctx.with_layer_hooks(Arc::new(Doubling), || {
            // Another model's parts see no hooks.
            assert!(
                other
                    .before_layer(0, h.shallow_clone())
                    .is_ok_and(|t| t.equal(&h))
            );
            (
                ctx.before_layer(0, h.shallow_clone()),
                ctx.after_layer(3, h.shallow_clone()),
            )
        });
        assert_eq!(before.expect("before").double_value(&[0]), 2.0);
        assert!(matches!(err, Err(Error::LayerHook { layer: 3, .. })));
        // Removed afterwards, also when the call panicked.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            ctx.with_layer_hooks(Arc::new(Doubling), || panic!("in the forward"))
        }));
        assert!(
            ctx.before_layer(0, h.shallow_clone())
                .is_ok_and(|t| t.equal(&h))
        );
        assert!(!ctx.releases_parameters());
    }

    #[test]
    fn a_deferred_context_draws_nothing_and_records_each_init() {
        let vs = VarStore::new(Device::Cpu);
        let ctx = Context::deferred();
        let root = Path::root(&vs, &ctx);
        let lin = Linear::new(&root / "score", 4, 2, true, 0.02);
        assert_eq!(lin.ws.abs().sum(Kind::Float).double_value(&[]), 0.0);
        let recorded: Vec<String> = ctx.take_deferred().into_iter().map(|(n, _)| n).collect();
        assert_eq!(recorded, ["score.weight", "score.bias"]);
        assert!(!ctx.is_deferred());
    }

    #[test]
    fn neftune_is_set_per_model_until_the_guard_drops() {
        let ctx = Context::new();
        let guard = ctx.activate_neftune(5.0);
        assert_eq!(ctx.neftune_noise_alpha(), Some(5.0));
        assert_eq!(Context::new().neftune_noise_alpha(), None);
        let x = Tensor::zeros([1, 4, 8], (Kind::Float, Device::Cpu));
        let eval = neftune_post_forward_hook(&ctx, x.shallow_clone(), false).expect("eval");
        assert!(eval.equal(&x));
        let noisy = neftune_post_forward_hook(&ctx, x.shallow_clone(), true).expect("train");
        let bound = 5.0 / (4.0f64 * 8.0).sqrt();
        let max = noisy.abs().max().double_value(&[]);
        assert!(max > 0.0 && max <= bound, "{max} within {bound}");
        drop(guard);
        assert_eq!(ctx.neftune_noise_alpha(), None);
    }
}

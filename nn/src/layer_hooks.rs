//! Per-layer hooks around the forward of each transformer layer: the Rust form of
//! `register_forward_pre_hook` / `register_forward_hook` on the decoder (or encoder)
//! layers, which is how DeepSpeed ZeRO-3 and FSDP gather a layer's parameters just before
//! it runs and release them after.
//!
//! A model's [`Context::with_layer_hooks`](crate::Context::with_layer_hooks) installs them
//! for the forwards run inside it; the models call
//! [`Context::before_layer`](crate::Context::before_layer) with the hidden states entering
//! layer `i` and [`Context::after_layer`](crate::Context::after_layer) with those leaving
//! it, and go on with the tensors the hooks return (the same values; a hook may return a
//! tensor with a different autograd history, e.g. one whose backward gathers the layer
//! again).

use tch::Tensor;

/// Hooks around each transformer layer's forward (see the module documentation).
pub trait LayerHooks: Send + Sync {
    /// Called before layer `index` runs on `hidden`; returns the tensor it runs on.
    fn before_layer(&self, index: usize, hidden: Tensor) -> std::result::Result<Tensor, String>;

    /// Called with layer `index`'s output `hidden`; returns the tensor the model goes on
    /// with.
    fn after_layer(&self, index: usize, hidden: Tensor) -> std::result::Result<Tensor, String>;

    /// Whether these hooks release a layer's parameters between its forward and its
    /// backward and point them at new storage before the backward (ZeRO-3). The layers'
    /// linear maps are then computed so that autograd saves the weight variable itself
    /// (which follows the new storage) rather than the transposed view `at::linear` saves
    /// (which would keep the released storage alive until the backward), as DeepSpeed's
    /// `LinearFunctionForZeroStage3`. The outputs agree with the usual path to rounding.
    fn releases_parameters(&self) -> bool {
        false
    }
}

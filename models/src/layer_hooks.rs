//! Per-layer hooks around the forward of each transformer layer: the Rust form of
//! `register_forward_pre_hook` / `register_forward_hook` on the decoder (or encoder) layers,
//! which is how DeepSpeed ZeRO-3 and FSDP gather a layer's parameters just before it runs
//! and release them after.
//!
//! [`with_layer_hooks`] installs a [`LayerHooks`] for the forwards run inside it on the
//! current thread; GPT-2, BERT and Llama call [`LayerHooks::before_layer`] with the hidden
//! states entering layer `i` and [`LayerHooks::after_layer`] with those leaving it, and go on
//! with the tensors the hooks return (the same values; a hook may return a tensor with a
//! different autograd history, e.g. one whose backward gathers the layer again).

use std::cell::RefCell;
use std::rc::Rc;

use tch::{Tensor, nn};

use crate::error::{Error, Result};

/// Hooks around each transformer layer's forward (see the module documentation).
pub trait LayerHooks {
    /// Called before layer `index` runs on `hidden`; returns the tensor it runs on.
    fn before_layer(&self, index: usize, hidden: Tensor) -> std::result::Result<Tensor, String>;

    /// Called with layer `index`'s output `hidden`; returns the tensor the model goes on with.
    fn after_layer(&self, index: usize, hidden: Tensor) -> std::result::Result<Tensor, String>;

    /// Whether these hooks release a layer's parameters between its forward and its backward
    /// and point them at new storage before the backward (ZeRO-3). The layers' linear maps
    /// are then computed so that autograd saves the weight variable itself (which follows
    /// the new storage) rather than the transposed view `at::linear` saves (which would keep
    /// the released storage alive until the backward), as DeepSpeed's
    /// `LinearFunctionForZeroStage3`. The outputs agree with the usual path to rounding.
    fn releases_parameters(&self) -> bool {
        false
    }
}

thread_local! {
    static HOOKS: RefCell<Option<Rc<dyn LayerHooks>>> = const { RefCell::new(None) };
}

/// Runs `f` with `hooks` installed for the current thread (the previous ones, if any, are
/// put back afterwards, also when `f` panics).
pub fn with_layer_hooks<R>(hooks: Rc<dyn LayerHooks>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Rc<dyn LayerHooks>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let prev = self.0.take();
            HOOKS.with(|h| *h.borrow_mut() = prev);
        }
    }
    let prev = HOOKS.with(|h| h.borrow_mut().replace(hooks));
    let _restore = Restore(prev);
    f()
}

fn current() -> Option<Rc<dyn LayerHooks>> {
    HOOKS.with(|h| h.borrow().clone())
}

/// What the models call before layer `index`.
pub(crate) fn before_layer(index: usize, hidden: Tensor) -> Result<Tensor> {
    match current() {
        None => Ok(hidden),
        Some(h) => h
            .before_layer(index, hidden)
            .map_err(|detail| Error::LayerHook {
                layer: index,
                detail,
            }),
    }
}

/// What the models call after layer `index`.
pub(crate) fn after_layer(index: usize, hidden: Tensor) -> Result<Tensor> {
    match current() {
        None => Ok(hidden),
        Some(h) => h
            .after_layer(index, hidden)
            .map_err(|detail| Error::LayerHook {
                layer: index,
                detail,
            }),
    }
}

thread_local! {
    static RELEASES: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Whether the layers' linear maps run in the releasing form now: as set by
/// [`with_releases`], else as the installed hooks ask.
pub(crate) fn releases_parameters() -> bool {
    RELEASES
        .with(std::cell::Cell::get)
        .unwrap_or_else(|| current().is_some_and(|h| h.releases_parameters()))
}

/// Runs `f` with the linear maps' form fixed to `releases` (a checkpointed layer recomputed
/// in the backward, outside the hooks, computes as its forward did).
pub(crate) fn with_releases<R>(releases: bool, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<bool>);
    impl Drop for Restore {
        fn drop(&mut self) {
            RELEASES.with(|r| r.set(self.0));
        }
    }
    let _restore = Restore(RELEASES.with(|r| r.replace(Some(releases))));
    f()
}

/// A transformer layer's linear map `x Wᵀ + b`: `nn::Linear`'s, or under hooks that release
/// parameters (see [`LayerHooks::releases_parameters`]) `(W xᵀ)ᵀ + b`, whose matrix product
/// saves `W` itself for the backward.
pub(crate) fn linear(xs: &Tensor, lin: &nn::Linear) -> Tensor {
    if !releases_parameters() {
        return xs.apply(lin);
    }
    let mut size = xs.size();
    let in_dim = size.last().copied().unwrap_or(0);
    let y = lin.ws.mm(&xs.reshape([-1, in_dim]).tr()).tr();
    let y = match &lin.bs {
        Some(b) => y + b,
        None => y,
    };
    if let Some(last) = size.last_mut() {
        *last = lin.ws.size()[0];
    }
    y.reshape(size)
}

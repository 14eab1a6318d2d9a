//! Activation checkpointing (upstream `GradientCheckpointingLayer` calling
//! `torch.utils.checkpoint.checkpoint`): a layer's forward run without keeping its
//! activations, and run again in the backward (`tchtrain-sys`'s `csrc/checkpoint.cpp`), with
//! the forward's generator states replayed so that dropout draws the same masks, and its
//! autocast state restored. Losses and gradients equal those of the plain forward.
//!
//! [`ActivationCheckpointing`] holds upstream's settings (`activation_checkpointing_enable`'s
//! `every_n_layers` and `offload`, `checkpoint`'s `preserve_rng_state`; `use_reentrant` picks
//! between two implementations with the same numbers). Models run their layers with
//! [`run_layers`], which checkpoints each layer [`ActivationCheckpointing::checkpoints`]
//! selects, while training.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_void};
use std::sync::Arc;

use serde_json::Value;
use tch::Tensor;
use tchtrain_sys::C_tensor;

use crate::error::{Error, Result};

/// Upstream's activation-checkpointing settings of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActivationCheckpointing {
    /// Checkpoint layers `0, n, 2n, ...` only (upstream's `every_n_layers`, default 1).
    pub every_n_layers: usize,
    /// Keep the saved layer inputs in host memory (upstream's `offload`; nothing to move on
    /// the CPU).
    pub offload: bool,
    /// Replay the generator states of the forward in the recompute (torch's
    /// `preserve_rng_state`, default true): without it dropout draws new masks.
    pub preserve_rng_state: bool,
}

impl Default for ActivationCheckpointing {
    fn default() -> Self {
        Self {
            every_n_layers: 1,
            offload: false,
            preserve_rng_state: true,
        }
    }
}

impl ActivationCheckpointing {
    /// From `activation_checkpointing_kwargs` (as the Trainer passes them: `every_n_layers`
    /// and `offload` for `activation_checkpointing_enable`, the rest for
    /// `torch.utils.checkpoint.checkpoint`). Keys the checkpoint here does not take are an
    /// error naming them.
    pub fn from_kwargs(kwargs: Option<&serde_json::Map<String, Value>>) -> Result<Self> {
        let mut out = Self::default();
        let bad = |key: &str, value: &Value, fix: &str| Error::InvalidArgument {
            field: "activation_checkpointing_kwargs",
            detail: format!("{key}={value}: {fix}"),
        };
        for (key, value) in kwargs.into_iter().flatten() {
            match key.as_str() {
                "every_n_layers" => {
                    out.every_n_layers = value
                        .as_u64()
                        .filter(|&n| n >= 1)
                        .ok_or_else(|| bad(key, value, "use a whole number >= 1"))?
                        as usize;
                }
                "offload" => {
                    out.offload = value
                        .as_bool()
                        .ok_or_else(|| bad(key, value, "use true or false"))?;
                }
                "preserve_rng_state" => {
                    out.preserve_rng_state = value
                        .as_bool()
                        .ok_or_else(|| bad(key, value, "use true or false"))?;
                }
                // Both of torch's implementations compute the same numbers.
                "use_reentrant" => {
                    value
                        .as_bool()
                        .ok_or_else(|| bad(key, value, "use true or false"))?;
                }
                _ => {
                    return Err(bad(
                        key,
                        value,
                        "the checkpoint here takes every_n_layers, offload, preserve_rng_state and use_reentrant",
                    ));
                }
            }
        }
        Ok(out)
    }

    /// Whether layer `index` is checkpointed (upstream: `layer_index % every_n_layers == 0`).
    pub fn checkpoints(&self, index: usize) -> bool {
        index.is_multiple_of(self.every_n_layers)
    }
}

/// A layer's forward as the checkpoint runs it (twice).
type LayerClosure = Box<dyn Fn(&Tensor, Option<&Tensor>) -> Result<Tensor> + Send>;

/// A model's layer (or the inputs of its forward) shared between the model and the
/// checkpoints of its forwards, which run it again in the backward.
#[derive(Debug)]
pub(crate) struct Shared<T: ReadOnlyLayer>(pub(crate) T);

/// The layer types [`Shared`] may hold: parameter tensors and plain values that a forward
/// only reads.
///
/// # Safety
/// The type's forward must only read its tensors (no method mutating through `&self`, no
/// interior mutability), so that running it from the training thread and then, once, from
/// the autograd engine's thread in the backward is sound.
pub(crate) unsafe trait ReadOnlyLayer: Send {}

// SAFETY: see `ReadOnlyLayer` — its implementors only read their tensors, and libtorch's
// reads are thread-safe (`tch::Tensor` is not `Sync` because of other methods mutating
// through `&self`, which layers never call); the two runs never overlap.
unsafe impl<T: ReadOnlyLayer> Sync for Shared<T> {}

impl<T: ReadOnlyLayer> std::ops::Deref for Shared<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// The layer loop of every model (upstream: `for layer in self.layers` with
/// `GradientCheckpointingLayer.__call__`). For each layer in turn: the context's layer hooks
/// before it (ZeRO-3 gathers its parameters), its forward, checkpointed while training when
/// `checkpointing` selects its index, then the hooks after it (the release).
/// `forward(layer, h, extra, inputs)` runs one layer; `extra` is a tensor made outside the
/// layers that the checkpoint hands back its gradient (DeBERTa's relative embeddings).
pub(crate) fn run_layers<L, X, F>(
    ctx: &tchtrain_nn::Context,
    layers: &[Arc<Shared<L>>],
    inputs: &Arc<Shared<X>>,
    extra: Option<&Tensor>,
    checkpointing: Option<&ActivationCheckpointing>,
    train: bool,
    mut h: Tensor,
    forward: F,
) -> Result<Tensor>
where
    L: ReadOnlyLayer + 'static,
    X: ReadOnlyLayer + 'static,
    F: Fn(&L, &Tensor, Option<&Tensor>, &X) -> Result<Tensor> + Copy + Send + 'static,
{
    for (i, layer) in layers.iter().enumerate() {
        h = ctx.before_layer(i, h)?;
        h = match checkpointing {
            Some(options) if train && options.checkpoints(i) => {
                let (layer, x, c) = (Arc::clone(layer), Arc::clone(inputs), ctx.clone());
                checkpoint_layer_with(&h, extra, ctx, options, move |h, e| {
                    let out = forward(&layer, h, e, &x)?;
                    c.check()?;
                    Ok(out)
                })?
            }
            _ => forward(layer, &h, extra, inputs)?,
        };
        h = ctx.after_layer(i, h)?;
    }
    Ok(h)
}

/// A malloc'd copy of `message` for the shim (which throws and frees it).
fn shim_message(message: &str) -> *mut c_char {
    let text = std::ffi::CString::new(message.replace('\0', " ")).unwrap_or_default();
    // SAFETY: `text` is a live NUL-terminated string; the shim copies it.
    unsafe { tchtrain_sys::tchtrain_checkpoint_message(text.as_ptr()) }
}

/// Called by the shim: runs the layer on `input`; an error (its message, an out-of-memory
/// one included, so that `auto_find_batch_size` recognises it) or a panic's text goes back.
unsafe extern "C" fn run_layer(
    layer: *mut c_void,
    input: *const C_tensor,
    extra: *const C_tensor,
    out: *mut *mut C_tensor,
) -> *mut c_char {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: `layer` is the `Box<LayerClosure>` leaked by `checkpoint_layer`, alive
        // until `drop_layer`; `input` (and `extra` when not null) live tensors the shim
        // borrows to us for the call.
        let (f, x, e) = unsafe {
            (
                &*(layer as *const LayerClosure),
                Tensor::clone_from_ptr(input as *mut C_tensor),
                (!extra.is_null()).then(|| Tensor::clone_from_ptr(extra as *mut C_tensor)),
            )
        };
        f(&x, e.as_ref())
    }));
    match result {
        Ok(Ok(mut y)) => {
            // SAFETY: `out` is the shim's out-parameter; the shim takes ownership of the
            // tensor allocated by libtorch's wrapper (and deletes it).
            unsafe { *out = y.as_mut_ptr() };
            std::mem::forget(y);
            std::ptr::null_mut()
        }
        Ok(Err(e)) => shim_message(&e.to_string()),
        Err(panic) => {
            let text = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "the layer panicked".into());
            shim_message(&text)
        }
    }
}

/// Called by the shim when the autograd graph lets go of the layer.
unsafe extern "C" fn drop_layer(layer: *mut c_void) {
    // SAFETY: `layer` is the pointer `checkpoint_layer` leaked, dropped once.
    drop(unsafe { Box::from_raw(layer as *mut LayerClosure) });
}

/// `torch.utils.checkpoint.checkpoint(f, x, extra)`: `f(x, extra)` without keeping its
/// activations, `f` run again in the backward. `f` must capture what it needs by value
/// (shallow tensor clones, `Arc`s of the layer): it outlives this call, for as long as the
/// graph. When `x` does not require a gradient the layer runs plainly (the checkpoint's
/// backward hands gradients back through `x`; a frozen input would cut the layer's
/// parameters off). `extra` is a second tensor input (DeBERTa's relative embeddings, made
/// from parameters outside the layer): the recompute gets it as a leaf of its own and hands
/// its gradient back to the graph that made it, as reentrant checkpointing does for every
/// tensor input. `f` gets `extra` (or, in the recompute, that leaf).
pub(crate) fn checkpoint_layer_with(
    x: &Tensor,
    extra: Option<&Tensor>,
    ctx: &tchtrain_nn::Context,
    options: &ActivationCheckpointing,
    f: impl Fn(&Tensor, Option<&Tensor>) -> Result<Tensor> + Send + 'static,
) -> Result<Tensor> {
    if !x.requires_grad() {
        return f(x, extra);
    }
    // The recompute computes the linear maps in the form this forward uses and reports to
    // the underflow / overflow tracer of this forward (the layers' LoRA slots keep this
    // forward's adapters).
    let ctx = ctx.clone();
    let releases = ctx.releases_parameters();
    let tracer = ctx.tracer();
    let f = move |x: &Tensor, e: Option<&Tensor>| {
        let run = || ctx.with_releases(releases, || f(x, e));
        match &tracer {
            Some(t) => ctx.with_tracer(t, run),
            None => run(),
        }
    };
    let layer: *mut LayerClosure = Box::into_raw(Box::new(Box::new(f) as LayerClosure));
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: `x` (and `extra`) are live for the call; `layer` is handed over (the shim frees it through
    // `drop_layer`, also on failure); the callbacks live as long as the program.
    let err = unsafe {
        tchtrain_sys::tchtrain_checkpoint(
            x.as_ptr(),
            extra.map_or(std::ptr::null(), |e| e.as_ptr()),
            layer.cast(),
            run_layer,
            drop_layer,
            options.preserve_rng_state,
            options.offload,
            &mut out,
        )
    };
    // SAFETY: the shim's result, freed by `take_error`.
    unsafe { tchtrain_sys::take_error(err) }.map_err(|m| Error::Torch(tch::TchError::Torch(m)))?;
    // SAFETY: allocated by the shim with `new at::Tensor(..)`, owned by nobody else.
    Ok(unsafe { Tensor::from_ptr(out) })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tch::{Device, Kind};

    use super::*;

    /// One tensor input.
    fn checkpoint_layer(
        x: &Tensor,
        ctx: &tchtrain_nn::Context,
        options: &ActivationCheckpointing,
        f: impl Fn(&Tensor) -> Result<Tensor> + Send + 'static,
    ) -> Result<Tensor> {
        checkpoint_layer_with(x, None, ctx, options, move |x, _| f(x))
    }

    const OOM: &str = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes";

    fn input() -> Tensor {
        Tensor::ones([3], (Kind::Float, Device::Cpu)).set_requires_grad(true)
    }

    #[test]
    fn a_failing_layer_gives_its_message_back() {
        let options = ActivationCheckpointing::default();
        // An error in the forward, then a panic: their text comes back (auto_find_batch_size
        // reads out-of-memory errors from it).
        let err = checkpoint_layer(&input(), &tchtrain_nn::Context::new(), &options, |_| {
            Err(Error::InvalidArgument {
                field: "layer",
                detail: OOM.into(),
            })
        })
        .unwrap_err();
        assert!(err.to_string().contains(OOM), "{err}");
        let err = checkpoint_layer(
            &input(),
            &tchtrain_nn::Context::new(),
            &options,
            |_| -> Result<Tensor> { panic!("CUDA out of memory. Tried to allocate 2 GiB") },
        )
        .unwrap_err();
        assert!(err.to_string().contains(" out of memory."), "{err}");
        // A recompute that fails in the backward: the backward fails with its message, and
        // the generator is where it was.
        let calls = std::sync::Arc::new(AtomicUsize::new(0));
        let seen = std::sync::Arc::clone(&calls);
        let x = input();
        let y = checkpoint_layer(&x, &tchtrain_nn::Context::new(), &options, move |x| {
            if seen.fetch_add(1, Ordering::SeqCst) == 1 {
                return Err(Error::InvalidArgument {
                    field: "layer",
                    detail: OOM.into(),
                });
            }
            Ok(x.dropout(0.5, true) * 2.0)
        })
        .unwrap();
        tch::manual_seed(3);
        let before = Tensor::rand([4], (Kind::Float, Device::Cpu));
        tch::manual_seed(3);
        let err = y.sum(Kind::Float).f_backward().unwrap_err();
        assert!(err.to_string().contains(OOM), "{err}");
        assert!(Tensor::rand([4], (Kind::Float, Device::Cpu)).equal(&before));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }
}

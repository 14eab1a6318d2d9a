//! What a model's parts share: one [`Context`] per model, handed to every part by the
//! [`Path`](crate::Path) it is built from.
//!
//! It holds the model's dynamic state, each piece set by its owner for a span of calls:
//! - the [`LayerHooks`] of the running forward (ZeRO-3 / FSDP gathering, set by
//!   `tchtrain-accelerate`);
//! - the [`DebugUnderflowOverflow`] tracer that listens (set by the Trainer);
//! - NEFTune's noise level (set by the Trainer for `train`);
//! - while `from_pretrained` builds the model, the deferred initialisation;
//! - the LoRA slot of every adaptable part, by module name (filled by `PeftModel`; the
//!   parts read their own slot, never the map).
//!
//! The state is behind mutexes: a model is `Send`, and a checkpointed layer's recompute
//! may run on the autograd engine's thread.

use std::sync::{Arc, Mutex, MutexGuard};

use tch::Tensor;

use crate::debug_utils::{DebugUnderflowOverflow, Out, Var};
use crate::error::{Error, Result};
use crate::initialization::VarInit;
use crate::layer_hooks::LayerHooks;
use crate::lora::LoraSlot;

/// A model's shared state (see the module documentation). Cloning shares it.
#[derive(Clone, Default)]
pub struct Context {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    hooks: Mutex<Option<Arc<dyn LayerHooks>>>,
    /// The linear maps' form fixed for a checkpoint's recompute.
    releases: Mutex<Option<bool>>,
    tracer: Mutex<Option<Arc<Mutex<DebugUnderflowOverflow>>>>,
    neftune: Mutex<Option<f64>>,
    input_require_grads: Mutex<bool>,
    training: Mutex<bool>,
    deferred: Mutex<Option<Vec<(String, VarInit)>>>,
    lora_slots: Mutex<Vec<(String, LoraSlot)>>,
    quant_slots: Mutex<Vec<(String, crate::linear::QuantSlot)>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("hooks", &lock(&self.inner.hooks).is_some())
            .field("traced", &self.traced())
            .field("neftune", &self.neftune_noise_alpha())
            .finish_non_exhaustive()
    }
}

/// A poisoned lock still holds usable state: a panic elsewhere does not change it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Puts a slot's previous value back when dropped (also on panic).
struct Restore<'a, T> {
    slot: &'a Mutex<T>,
    previous: Option<T>,
}

impl<T> Drop for Restore<'_, T> {
    fn drop(&mut self) {
        if let Some(previous) = self.previous.take() {
            *lock(self.slot) = previous;
        }
    }
}

fn with_value<T, R>(slot: &Mutex<T>, value: T, f: impl FnOnce() -> R) -> R {
    let previous = std::mem::replace(&mut *lock(slot), value);
    let _restore = Restore {
        slot,
        previous: Some(previous),
    };
    f()
}

impl Context {
    /// A context whose parts draw their initial values when built.
    pub fn new() -> Self {
        Self::default()
    }

    /// A context for `from_pretrained`: parts built with it draw nothing and record their
    /// init for [`initialize_missing`](crate::initialization::initialize_missing); see
    /// [`take_deferred`](Self::take_deferred).
    pub fn deferred() -> Self {
        let ctx = Self::default();
        *lock(&ctx.inner.deferred) = Some(Vec::new());
        ctx
    }

    /// Whether this context defers initialisation.
    pub fn is_deferred(&self) -> bool {
        lock(&self.inner.deferred).is_some()
    }

    /// Records `init` for the variable `name` when deferred; returns whether it did.
    pub(crate) fn record_init(&self, name: String, init: VarInit) -> bool {
        match lock(&self.inner.deferred).as_mut() {
            Some(recorded) => {
                recorded.push((name, init));
                true
            }
            None => false,
        }
    }

    /// Ends deferral: every recorded variable init, in creation order.
    pub fn take_deferred(&self) -> Vec<(String, VarInit)> {
        lock(&self.inner.deferred).take().unwrap_or_default()
    }

    // --- layer hooks ---

    /// Runs `f` with `hooks` around each layer of this model's forwards (the previous ones
    /// put back afterwards, also on panic).
    pub fn with_layer_hooks<R>(&self, hooks: Arc<dyn LayerHooks>, f: impl FnOnce() -> R) -> R {
        with_value(&self.inner.hooks, Some(hooks), f)
    }

    fn hooks(&self) -> Option<Arc<dyn LayerHooks>> {
        lock(&self.inner.hooks).clone()
    }

    /// What a model calls before layer `index` runs on `hidden`.
    pub fn before_layer(&self, index: usize, hidden: Tensor) -> Result<Tensor> {
        match self.hooks() {
            None => Ok(hidden),
            Some(h) => h
                .before_layer(index, hidden)
                .map_err(|detail| Error::LayerHook {
                    layer: index,
                    detail,
                }),
        }
    }

    /// What a model calls with layer `index`'s output `hidden`.
    pub fn after_layer(&self, index: usize, hidden: Tensor) -> Result<Tensor> {
        match self.hooks() {
            None => Ok(hidden),
            Some(h) => h
                .after_layer(index, hidden)
                .map_err(|detail| Error::LayerHook {
                    layer: index,
                    detail,
                }),
        }
    }

    /// Whether a layer's linear maps run in the releasing form now: as fixed by
    /// [`with_releases`](Self::with_releases), else as the hooks ask
    /// ([`LayerHooks::releases_parameters`]).
    pub fn releases_parameters(&self) -> bool {
        let fixed = *lock(&self.inner.releases);
        fixed.unwrap_or_else(|| self.hooks().is_some_and(|h| h.releases_parameters()))
    }

    /// Runs `f` with the linear maps' form fixed to `releases` (a checkpointed layer
    /// recomputed in the backward, outside the hooks, computes as its forward did).
    pub fn with_releases<R>(&self, releases: bool, f: impl FnOnce() -> R) -> R {
        with_value(&self.inner.releases, Some(releases), f)
    }

    // --- the underflow / overflow tracer ---

    /// Runs `f` with `tracer` reporting every part's forward (the previous tracer put back
    /// afterwards, also on panic).
    pub fn with_tracer<R>(
        &self,
        tracer: &Arc<Mutex<DebugUnderflowOverflow>>,
        f: impl FnOnce() -> R,
    ) -> R {
        with_value(&self.inner.tracer, Some(Arc::clone(tracer)), f)
    }

    /// The listening tracer, if any.
    pub fn tracer(&self) -> Option<Arc<Mutex<DebugUnderflowOverflow>>> {
        lock(&self.inner.tracer).clone()
    }

    /// Whether a tracer listens (the parts skip building reports otherwise).
    pub fn traced(&self) -> bool {
        lock(&self.inner.tracer).is_some()
    }

    /// Upstream's forward hook on the module `name` of class `class`, after it ran.
    pub fn hook(
        &self,
        name: impl FnOnce() -> String,
        class: &str,
        params: &[(&str, &Tensor)],
        inputs: &[Var<'_>],
        output: Out<'_>,
    ) {
        let Some(tracer) = self.tracer() else {
            return;
        };
        let name = name();
        lock(&tracer).forward_hook(&name, class, params, inputs, &output);
    }

    /// The hook of a module with one tensor input and one tensor output.
    pub fn leaf(
        &self,
        name: impl FnOnce() -> String,
        class: &str,
        params: &[(&str, &Tensor)],
        x: &Tensor,
        y: &Tensor,
    ) {
        self.hook(name, class, params, &[Var::T(x)], Out::One(Var::T(y)));
    }

    /// The hook of the model itself (called by the Trainer with keyword arguments, so no
    /// positional inputs; its output is a `ModelOutput`), then the tracer's error, if a
    /// hook raised during this forward.
    pub fn model_frame(&self, class: &str) -> Result<()> {
        self.hook(String::new, class, &[], &[], Out::One(Var::NotTensor));
        self.check()
    }

    /// The error a hook raised during this forward (or a checkpoint's recompute), if any.
    pub fn check(&self) -> Result<()> {
        let pending = self.tracer().and_then(|t| lock(&t).take_pending());
        match pending {
            Some(message) => Err(Error::DebugUnderflowOverflow(message)),
            None => Ok(()),
        }
    }

    // --- NEFTune ---

    /// Upstream `activate_neftune(model, neftune_noise_alpha)`: this model's input
    /// embeddings get NEFTune noise of level `alpha` while training, until the guard is
    /// dropped (upstream's `deactivate_neftune`).
    pub fn activate_neftune(&self, alpha: f64) -> NeftuneGuard {
        let previous = lock(&self.inner.neftune).replace(alpha);
        NeftuneGuard {
            ctx: self.clone(),
            previous,
        }
    }

    /// The NEFTune level active on this model, if any.
    pub fn neftune_noise_alpha(&self) -> Option<f64> {
        *lock(&self.inner.neftune)
    }

    // --- LoRA slots ---

    /// Registers the LoRA slot of the part `name` (done by the adaptable parts when built).
    pub(crate) fn register_lora_slot(&self, name: String, slot: LoraSlot) {
        lock(&self.inner.lora_slots).push((name, slot));
    }

    /// Every adaptable part's LoRA slot, by module name, in creation order.
    pub fn lora_slots(&self) -> Vec<(String, LoraSlot)> {
        lock(&self.inner.lora_slots).clone()
    }

    // --- input gradients ---

    /// transformers' `enable_input_require_grads()`: the input embeddings' output requires a
    /// gradient from now on (a forward hook upstream), so that checkpointed layers over a
    /// frozen embedding still take their parameters' gradients through their recompute.
    pub fn enable_input_require_grads(&self) {
        *lock(&self.inner.input_require_grads) = true;
    }

    /// Whether [`enable_input_require_grads`](Self::enable_input_require_grads) is on.
    pub fn input_require_grads(&self) -> bool {
        *lock(&self.inner.input_require_grads)
    }

    // --- training mode ---

    /// Records the model's mode (upstream's `module.training`, which `model.train()` /
    /// `model.eval()` set on every module): the parts whose computation depends on it read
    /// it here (bitsandbytes' `Linear8bitLt`).
    pub fn set_training(&self, training: bool) {
        *lock(&self.inner.training) = training;
    }

    /// The mode [`set_training`](Self::set_training) recorded (evaluation at first, as a
    /// loaded model upstream).
    pub fn is_training(&self) -> bool {
        *lock(&self.inner.training)
    }

    // --- quantized weights ---

    /// Registers the quantized slot of the linear part `name` (done by every [`Linear`] when
    /// built).
    ///
    /// [`Linear`]: crate::Linear
    pub(crate) fn register_quant_slot(&self, name: String, slot: crate::linear::QuantSlot) {
        lock(&self.inner.quant_slots).push((name, slot));
    }

    /// Every linear part's quantized slot (`nn.Linear` upstream, which bitsandbytes replaces), by
    /// module name, in creation order.
    pub fn quant_slots(&self) -> Vec<(String, crate::linear::QuantSlot)> {
        lock(&self.inner.quant_slots).clone()
    }
}

/// Restores the previous NEFTune level of the model when dropped.
#[derive(Debug)]
pub struct NeftuneGuard {
    ctx: Context,
    previous: Option<f64>,
}

impl Drop for NeftuneGuard {
    fn drop(&mut self) {
        *lock(&self.ctx.inner.neftune) = self.previous;
    }
}

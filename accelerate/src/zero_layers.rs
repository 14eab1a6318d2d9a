//! ZeRO-3 (and FSDP `full_shard`) layer by layer: during a training step each transformer
//! layer's parameters are gathered just before the layer runs and released right after, and
//! again for its backward, as DeepSpeed's `DeepSpeedZeRoOffload` does with module hooks
//! (`_pre_forward_module_hook`, `_post_forward_module_hook`, and the pre- / post-backward
//! hooks it attaches to the module's outputs and inputs).
//!
//! [`LayerGather`] is a [`LayerHooks`] [`Accelerator::with_gathered_parameters`](crate::Accelerator::with_gathered_parameters) installs around a training step:
//!
//! | when | what (collectives in the same order on every rank) |
//! |---|---|
//! | forward enters layer `i` | all-gather layer `i`'s shards into its parameters; put a gradient boundary on the layer's input |
//! | forward leaves layer `i` | release layer `i`'s parameters; put a gradient boundary on the layer's output |
//! | backward reaches layer `i`'s output boundary | all-gather layer `i` again (autograd saved the variables, which now point at the new storage) |
//! | backward leaves layer `i` (its input boundary) | reduce-scatter layer `i`'s gradients into the shards' `.grad` (added over the window's micro-batches), free them, release the parameters |
//!
//! The hooks say they release parameters, so the models compute their layers' linear maps
//! in a form whose backward reads the weight variable (re-gathered) rather than a saved view
//! of the released storage: the released memory is really free between a layer's forward and
//! its backward, for GPT-2's `Conv1D` and for BERT's and Llama's `Linear`s alike.
//!
//! The root unit (embeddings, final norm, heads) stays gathered through the step and is
//! reduced with the optimizer step as before. At most the root unit and one layer are
//! gathered at a time, so a rank holds its shards, the root unit and one layer of full
//! parameters (and of full gradients), instead of the whole model.
//!
//! A failure inside a hook (a dead peer, a timeout) is kept here, reported by the model or
//! the backward as a generic error, and [`LayerGather::take_error`] hands the accelerator the
//! original one.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tch::Tensor;
use tchtrain_distributed::ProcessGroup;
use tchtrain_nn::LayerHooks;

use crate::error::{Error, Result};
use crate::grad_boundary::{self, BoundaryAction};
use crate::state::PartialState;
use crate::zero::ZeroEngine;

/// Locks the shared engine (a poisoned lock still holds a usable engine: the panic that
/// poisoned it is reported where it happened).
pub(crate) fn lock_engine(engine: &Mutex<ZeroEngine>) -> MutexGuard<'_, ZeroEngine> {
    engine.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a hook or a boundary's action does with the engine, on the process group.
fn collective(
    engine: &Mutex<ZeroEngine>,
    state: &PartialState,
    f: impl FnOnce(&mut ProcessGroup, &mut ZeroEngine) -> Result<()>,
) -> Result<()> {
    state.with_sharding_group(|pg| f(pg, &mut lock_engine(engine)))?;
    Ok(())
}

/// The per-layer hooks of one stage-3 training step (see the module documentation), or of
/// an evaluation ([`LayerGather::for_evaluation`]: gather before each layer, release after,
/// nothing for a backward).
pub(crate) struct LayerGather {
    engine: Arc<Mutex<ZeroEngine>>,
    state: Arc<PartialState>,
    /// Whether a backward follows (training): gradient boundaries re-gather and reduce.
    backward: bool,
    /// The first error a hook or a backward action met.
    error: Arc<Mutex<Option<Error>>>,
    /// The boundaries this step registered (forgotten when the step ends).
    tokens: Mutex<Vec<u64>>,
}

impl LayerGather {
    pub(crate) fn new(engine: Arc<Mutex<ZeroEngine>>, state: Arc<PartialState>) -> Self {
        Self {
            engine,
            state,
            backward: true,
            error: Arc::new(Mutex::new(None)),
            tokens: Mutex::new(Vec::new()),
        }
    }

    /// The hooks of a forward-only pass (evaluation, prediction): each layer gathered just
    /// before it runs and released right after, as DeepSpeed's ZeRO-3 forward hooks do in
    /// `eval()` mode. The models keep their usual linear maps (no backward reads the
    /// parameters), so the outputs are those of the fully gathered model.
    pub(crate) fn for_evaluation(engine: Arc<Mutex<ZeroEngine>>, state: Arc<PartialState>) -> Self {
        let mut hooks = Self::new(engine, state);
        hooks.backward = false;
        hooks
    }

    /// The error a hook or a backward action met, if any (the one to report).
    pub(crate) fn take_error(&self) -> Option<Error> {
        self.error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Runs `f` now; an error is kept and returned as a message for the model's error.
    fn run(
        &self,
        f: impl FnOnce(&mut ProcessGroup, &mut ZeroEngine) -> Result<()>,
    ) -> std::result::Result<(), String> {
        keep(&self.error, collective(&self.engine, &self.state, f))
    }

    /// `hidden` behind a gradient boundary whose backward runs `f` with the engine.
    fn boundary(
        &self,
        hidden: &Tensor,
        f: impl FnOnce(&mut ProcessGroup, &mut ZeroEngine) -> Result<()> + Send + 'static,
    ) -> std::result::Result<Tensor, String> {
        let (engine, state, error) = (self.engine.clone(), self.state.clone(), self.error.clone());
        let action: BoundaryAction = Box::new(move || keep(&error, collective(&engine, &state, f)));
        let (out, token) =
            grad_boundary::grad_boundary(hidden, action).map_err(|e| e.to_string())?;
        lock_tokens(&self.tokens).push(token);
        Ok(out)
    }
}

/// Keeps the first error in `slot`, returning its message.
fn keep(slot: &Mutex<Option<Error>>, r: Result<()>) -> std::result::Result<(), String> {
    r.map_err(|e| {
        let msg = e.to_string();
        slot.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert(e);
        msg
    })
}

impl Drop for LayerGather {
    fn drop(&mut self) {
        grad_boundary::forget_boundaries(&lock_tokens(&self.tokens));
    }
}

/// The boundaries list (a poisoned lock still holds a usable list).
fn lock_tokens(m: &Mutex<Vec<u64>>) -> std::sync::MutexGuard<'_, Vec<u64>> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

impl LayerHooks for LayerGather {
    fn releases_parameters(&self) -> bool {
        self.backward
    }

    fn before_layer(&self, index: usize, hidden: Tensor) -> std::result::Result<Tensor, String> {
        self.run(|pg, engine| engine.gather_unit(pg, index))?;
        if !self.backward {
            return Ok(hidden);
        }
        // Backward leaves the layer here: its gradients are complete.
        self.boundary(&hidden, move |pg, engine| {
            engine.reduce_unit(pg, index)?;
            engine.release_unit(index)
        })
    }

    fn after_layer(&self, index: usize, hidden: Tensor) -> std::result::Result<Tensor, String> {
        self.run(|_, engine| engine.release_unit(index))?;
        if !self.backward {
            return Ok(hidden);
        }
        // Backward enters the layer here: its parameters are needed again.
        self.boundary(&hidden, move |pg, engine| engine.gather_unit(pg, index))
    }
}

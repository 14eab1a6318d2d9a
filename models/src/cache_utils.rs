//! Upstream's `DynamicCache` (`cache_utils.py` of transformers 5.23): each decoder layer's
//! keys and values `[batch, kv_heads, seq, head_dim]` (keys after the rotary embedding),
//! grown along the sequence by every forward that is given the cache, so that decoding
//! runs each new token alone. A sliding-window layer keeps only its last `window - 1` tokens
//! (upstream's `DynamicSlidingWindowLayer`).

use std::sync::{Arc, Mutex};

use tch::Tensor;

use crate::Result;

/// One layer's keys and values once it ran, and the tokens it has seen (more than it keeps
/// when it slides).
type Layer = Option<(Tensor, Tensor, i64)>;

/// The keys and values of the tokens seen so far, per layer. Cloning shares the cache.
#[derive(Debug, Clone, Default)]
pub struct DynamicCache {
    layers: Arc<Mutex<Vec<Layer>>>,
    /// The linear-attention layers' convolution and recurrent states (Qwen3.5's Gated
    /// DeltaNet layers; upstream's `LinearAttentionLayer` entries of the same cache).
    linear: Arc<Mutex<Vec<Option<tchtrain_nn::LinearAttentionState>>>>,
}

/// The cache a model's layers get: `cache`, but none when activation checkpointing runs in
/// training (upstream's checkpointed layers drop it with this warning: the recompute would
/// append the keys twice).
pub(crate) fn cache_for_layers(
    cache: Option<&DynamicCache>,
    train: bool,
    checkpointing: bool,
) -> Option<&DynamicCache> {
    if cache.is_some() && train && checkpointing {
        log::warn!(
            "`use_cache=True` is incompatible with gradient checkpointing. Setting `use_cache=False`."
        );
        return None;
    }
    cache
}

/// What upstream's first `DynamicLayer.update` returns for `states`: `torch.cat` onto the
/// empty tensor of its lazy initialisation, a contiguous copy (attention kernels round by
/// the layout of their inputs, so the cached keys are laid out as upstream's). An
/// encoder-decoder model's cross-attention keys go through the same first update.
///
/// The empty tensors take the keys' dtype (`lazy_initialization`), and `cat` promotes: under
/// autocast, float32 keys (rotated by float32 cos / sin) turn bfloat16 values into float32,
/// so that a value used by two attentions (Gemma 4's shared ones) gathers its gradient in
/// float32, as upstream's.
pub(crate) fn first_update(states: &Tensor, keys_kind: tch::Kind) -> Result<Tensor> {
    let empty = Tensor::f_empty([0], (keys_kind, states.device()))?;
    Ok(Tensor::f_cat(&[&empty, states], -2)?)
}

impl DynamicCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Layer>> {
        match self.layers.lock() {
            Ok(l) => l,
            Err(p) => p.into_inner(),
        }
    }

    /// `get_seq_length()`: the tokens cached (the first attention layer's).
    pub fn get_seq_length(&self) -> i64 {
        self.lock()
            .iter()
            .flatten()
            .next()
            .map_or(0, |(_, _, seen)| *seen)
    }

    /// Runs `f` on linear-attention layer `layer`'s state, made by `empty` first (then `f`
    /// is told the state is fresh: the prefill).
    pub(crate) fn with_linear_state<T>(
        &self,
        layer: usize,
        empty: impl FnOnce() -> Result<tchtrain_nn::LinearAttentionState>,
        f: impl FnOnce(&mut tchtrain_nn::LinearAttentionState, bool) -> Result<T>,
    ) -> Result<T> {
        let mut states = match self.linear.lock() {
            Ok(l) => l,
            Err(p) => p.into_inner(),
        };
        if states.len() <= layer {
            states.resize_with(layer + 1, || None);
        }
        let fresh = states[layer].is_none();
        let state = match &mut states[layer] {
            Some(state) => state,
            slot @ None => slot.insert(empty()?),
        };
        f(state, fresh)
    }

    /// `update(keys, values, layer_idx)`: appends the new keys / values along the sequence
    /// and returns the whole of them.
    pub(crate) fn update(
        &self,
        layer: usize,
        keys: &Tensor,
        values: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        self.append(layer, keys, values, None)
    }

    /// `DynamicSlidingWindowLayer.update`: the kept keys / values and the new ones are
    /// returned, the last `window - 1` of them kept.
    pub(crate) fn update_sliding(
        &self,
        layer: usize,
        window: i64,
        keys: &Tensor,
        values: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        self.append(layer, keys, values, Some((window - 1).max(0)))
    }

    /// The layer's states with the new ones appended (returned whole), of which the last
    /// `keep` are kept (all without a bound).
    fn append(
        &self,
        layer: usize,
        keys: &Tensor,
        values: &Tensor,
        keep: Option<i64>,
    ) -> Result<(Tensor, Tensor)> {
        let mut layers = self.lock();
        if layers.len() <= layer {
            layers.resize_with(layer + 1, || None);
        }
        let (k, v, seen) = match layers[layer].take() {
            Some((k, v, seen)) => (
                Tensor::f_cat(&[&k, keys], -2)?,
                Tensor::f_cat(&[&v, values], -2)?,
                seen,
            ),
            None => (
                first_update(keys, keys.kind())?,
                first_update(values, keys.kind())?,
                0,
            ),
        };
        let seen = seen + keys.size()[2];
        let len = k.size()[2];
        let kept = match keep {
            Some(keep) if keep < len => (
                k.f_narrow(2, len - keep, keep)?,
                v.f_narrow(2, len - keep, keep)?,
            ),
            _ => (k.shallow_clone(), v.shallow_clone()),
        };
        layers[layer] = Some((kept.0, kept.1, seen));
        Ok((k, v))
    }

    /// `reorder_cache(beam_idx)`: every layer's rows picked by `beam_idx` (beam search).
    pub(crate) fn reorder_cache(&self, beam_idx: &Tensor) -> Result<()> {
        let mut layers = self.lock();
        for layer in layers.iter_mut() {
            if let Some((k, v, seen)) = layer.take() {
                *layer = Some((
                    k.f_index_select(0, beam_idx)?,
                    v.f_index_select(0, beam_idx)?,
                    seen,
                ));
            }
        }
        drop(layers);
        let mut states = match self.linear.lock() {
            Ok(l) => l,
            Err(p) => p.into_inner(),
        };
        for state in states.iter_mut().flatten() {
            state.conv_state = state.conv_state.f_index_select(0, beam_idx)?;
            state.recurrent_state = state.recurrent_state.f_index_select(0, beam_idx)?;
        }
        Ok(())
    }
}

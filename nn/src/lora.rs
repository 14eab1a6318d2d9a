//! peft's `LoraLayer` state inside a part: the [`LoraSlot`] of an adaptable [`Linear`],
//! [`Conv1D`] or [`Embedding`], and the forward terms of peft's `tuners/lora/layer.py`
//! (`Linear.forward`, `Embedding.forward`, DoRA's `DoraLinearLayer` /
//! `DoraEmbeddingLayer`).
//!
//! `tchtrain-models`' `PeftModel` fills the slots (the active adapter of each adapted
//! module, read from the model's variables) before a forward; each part adds its own
//! slot's term.
//!
//! [`Linear`]: crate::Linear
//! [`Conv1D`]: crate::Conv1D
//! [`Embedding`]: crate::Embedding

use std::sync::{Arc, Mutex};

use tch::{Kind, Tensor};

use crate::context::lock;

/// The adapter a part's forward adds: the active adapter's `lora_A` / `lora_B` (for an
/// embedding `lora_embedding_A` / `_B`), its scaling, its DoRA state.
#[derive(Debug)]
pub struct LoraAdapter {
    /// `lora_A` (`[r, in]`; an embedding's `[r, vocab]`).
    pub a: Tensor,
    /// `lora_B` (`[out, r]`; an embedding's `[width, r]`).
    pub b: Tensor,
    /// `lora_alpha / r` (or rsLoRA's).
    pub scaling: f64,
    /// DoRA's magnitude and the base weight it normalises.
    pub dora: Option<Dora>,
    /// `lora_dropout` (linear parts only).
    pub dropout: f64,
    /// Whether the model trains (dropout applies).
    pub train: bool,
}

/// What DoRA's forward reads besides the adapter.
#[derive(Debug)]
pub struct Dora {
    /// `lora_magnitude_vector`.
    pub magnitude: Tensor,
    /// The base layer's weight.
    pub weight: Tensor,
    /// The base layer's bias.
    pub bias: Option<Tensor>,
    /// `Conv1D`: the weight is `[in, out]`.
    pub conv1d: bool,
}

#[derive(Debug, Default)]
struct SlotState {
    adapter: Option<LoraAdapter>,
    hit: bool,
}

/// A part's LoRA slot (shared by the part and the model's [`Context`](crate::Context)).
#[derive(Debug, Clone, Default)]
pub struct LoraSlot(Arc<Mutex<SlotState>>);

impl LoraSlot {
    /// Sets the adapter the part adds (none: the base layer alone) and clears
    /// [`ran`](Self::ran).
    pub fn set(&self, adapter: Option<LoraAdapter>) {
        let mut s = lock(&self.0);
        s.adapter = adapter;
        s.hit = false;
    }

    /// Whether the part added its adapter since [`set`](Self::set).
    pub fn ran(&self) -> bool {
        lock(&self.0).hit
    }

    /// peft's `Linear.forward` for a part whose base output is `y` on input `x`:
    /// `y + lora_B(lora_A(dropout(x))) * scaling`, `x` first cast to the adapter's dtype
    /// and the sum back to `y`'s (`y` itself without an adapter).
    pub(crate) fn apply_linear(&self, x: &Tensor, y: Tensor) -> Tensor {
        self.apply(x, y, false)
    }

    /// peft's `bnb.Linear4bit.forward` over a 4-bit part's output `y`: as
    /// [`apply_linear`](Self::apply_linear), but the adapter's term is cast to `y`'s dtype
    /// before the sum (`requires_conversion`: `torch.is_autocast_enabled()`, which reads
    /// CUDA's autocast, is false on the CPU).
    pub(crate) fn apply_linear_quantized(&self, x: &Tensor, y: Tensor) -> Tensor {
        self.apply(x, y, true)
    }

    fn apply(&self, x: &Tensor, y: Tensor, quantized: bool) -> Tensor {
        let mut s = lock(&self.0);
        let Some(layer) = &s.adapter else {
            return y;
        };
        let x = if x.kind() == layer.a.kind() {
            x.shallow_clone()
        } else {
            x.to_kind(layer.a.kind())
        };
        let kind = y.kind();
        let out = match &layer.dora {
            None => {
                let x = if layer.dropout > 0.0 && layer.train {
                    crate::dropout::dropout(&x, layer.dropout, true)
                } else {
                    x
                };
                let after_a = x.linear::<Tensor>(&layer.a, None);
                // `B(A x) * s` as `B(s · A x)`: the same bits for s = 2^k, k >= 0 (every
                // product and sum of the matmul scales exactly), on `r` columns instead of
                // the output's, forward and backward; no multiply at all for s = 1.
                let delta = match exact_rank_side_scaling(layer.scaling) {
                    Some(1.0) => after_a.linear::<Tensor>(&layer.b, None),
                    Some(s) => (after_a * s).linear::<Tensor>(&layer.b, None),
                    None => after_a.linear::<Tensor>(&layer.b, None) * layer.scaling,
                };
                if quantized {
                    y + delta.to_kind(kind)
                } else {
                    (y + delta).to_kind(kind)
                }
            }
            Some(d) => (&y + dora_term(&x, &y, layer, d)).to_kind(kind),
        };
        s.hit = true;
        out
    }

    /// peft's `ParamWrapper` on a 3-D expert parameter `w` `[experts, out, in]` (not
    /// transposed) with one adapter: `_LoraFactorsProxy`, `baddbmm(w, B', A', alpha=scaling)`
    /// with autocast off, where `A'` is `lora_A` `[r · experts, in]` viewed `[experts, r, in]`
    /// and `B'` is `lora_B` `[out, r · experts]` viewed `[out, r, experts]` and permuted to
    /// `[experts, out, r]`, both in `w`'s dtype (`get_delta_factors`). `w` itself without an
    /// adapter.
    pub(crate) fn apply_parameter(&self, w: &Tensor) -> crate::Result<Tensor> {
        let mut s = lock(&self.0);
        let Some(layer) = &s.adapter else {
            return Ok(w.shallow_clone());
        };
        let experts = w.size()[0];
        let a = layer.a.f_reshape([experts, -1, layer.a.size()[1]])?;
        let b = layer
            .b
            .f_reshape([layer.b.size()[0], -1, experts])?
            .f_permute([2, 0, 1])?;
        let (lhs, rhs) = (b.f_to_kind(w.kind())?, a.f_to_kind(w.kind())?);
        let out = crate::moe::without_autocast(w.device(), || {
            Ok(w.f_baddbmm(&lhs, &rhs, 1.0, layer.scaling)?)
        })?;
        s.hit = true;
        Ok(out)
    }

    /// peft's `Embedding.forward` for a part whose base output is `y` on the ids `ids`:
    /// `y + (embedding(ids, A.T, padding_idx) @ B.T) * scaling`, times the part's
    /// `embed_scale` where it has one (Gemma's scaled embeddings), in `y`'s dtype; no
    /// dropout and no input cast, as peft's. With DoRA, `m / ‖W.T + s · B @ A‖` rescales
    /// `y` and the term. `y` itself without an adapter.
    pub(crate) fn apply_embedding(
        &self,
        ids: &Tensor,
        y: Tensor,
        padding_idx: Option<i64>,
        embed_scale: Option<&Tensor>,
    ) -> Tensor {
        let mut s = lock(&self.0);
        let Some(layer) = &s.adapter else {
            return y;
        };
        let kind = y.kind();
        let after_a =
            Tensor::embedding(&layer.a.tr(), ids, padding_idx.unwrap_or(-1), false, false);
        let scale = |t: Tensor| match embed_scale {
            Some(s) => {
                let s = s.to_kind(t.kind());
                t * s
            }
            None => t,
        };
        let out = match &layer.dora {
            None => {
                let term = scale(after_a.matmul(&layer.b.tr()) * layer.scaling);
                (y + term).to_kind(kind)
            }
            Some(d) => {
                // `DoraEmbeddingLayer.forward`: the LoRA weight `(A.T @ B.T).T`, the norms
                // of `W.T + scaling · lora_weight` (detached) in the weight's dtype.
                let lora_weight = layer.a.tr().matmul(&layer.b.tr()).tr();
                let weight_norm = (d.weight.tr() + lora_weight.detach() * layer.scaling)
                    .linalg_norm(2.0, &[1i64][..], false, None::<Kind>)
                    .detach();
                let mns = &d.magnitude / weight_norm;
                let dora = scale(&mns * after_a.matmul(&layer.b.tr()) * layer.scaling);
                (mns * y + dora).to_kind(kind)
            }
        };
        s.hit = true;
        out
    }
}

/// `Some(scaling)` when `scaling` is 2^k with k >= 0 (peft's default `lora_alpha / r` = 1,
/// and `alpha = 2r`): multiplying the rank-`r` intermediate instead of the output then
/// gives the same bits, as scaling by a power of two at least 1 rounds nothing (short of
/// overflow, where both are infinite).
fn exact_rank_side_scaling(scaling: f64) -> Option<f64> {
    let power_of_two = scaling.is_normal() && scaling.to_bits() & ((1u64 << 52) - 1) == 0;
    (power_of_two && (1.0..=2f64.powi(64)).contains(&scaling)).then_some(scaling)
}

/// peft's `DoraLinearVariant.forward` + `DoraLinearLayer.forward`: the term added to the
/// base output `y`, op for op (the LoRA weight through the adapter's forward on an
/// identity, the row norms of `W + scaling · ΔW` detached, the base output reused without
/// dropout and recomputed on the dropped input with it).
fn dora_term(x: &Tensor, y: &Tensor, layer: &LoraAdapter, d: &Dora) -> Tensor {
    let (x, base_result) = if layer.dropout > 0.0 && layer.train {
        (crate::dropout::dropout(x, layer.dropout, true), None)
    } else {
        (x.shallow_clone(), Some(y))
    };
    let in_features = layer.a.size()[1];
    let eye = Tensor::eye(in_features, (layer.a.kind(), layer.a.device()));
    let lora_weight = eye
        .linear::<Tensor>(&layer.a, None)
        .linear::<Tensor>(&layer.b, None)
        .tr()
        .to_kind(x.kind());
    let weight = d.weight.to_kind(x.kind());
    let oriented = if d.conv1d {
        weight.tr()
    } else {
        weight.shallow_clone()
    };
    let weight_norm = (&oriented + lora_weight.detach() * layer.scaling)
        .linalg_norm(2.0, &[1i64][..], false, None::<Kind>)
        .to_kind(oriented.kind())
        .detach();
    let mag_norm_scale = (&d.magnitude / weight_norm).view([1, -1]);
    let lora_result = x
        .linear::<Tensor>(&layer.a, None)
        .linear::<Tensor>(&layer.b, None);
    let base_result = match (base_result, &d.bias) {
        (Some(r), Some(bias)) => r - bias,
        (Some(r), None) => r.shallow_clone(),
        (None, _) => x.linear::<Tensor>(&oriented, None),
    };
    (&mag_norm_scale - 1.0) * base_result + &mag_norm_scale * lora_result * layer.scaling
}

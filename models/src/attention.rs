//! Attention through libtorch's `scaled_dot_product_attention`, with upstream's masks
//! (masking_utils.py for the sdpa implementation): no mask at all when no key is padded
//! (causal models then pass `is_causal`, which lets SDPA take its causal kernels and skip the
//! masked blocks), otherwise a boolean `[batch, 1, q, k]` mask of causality and/or padding.

use tch::{Device, Kind, Tensor};

/// What SDPA gets for one forward: an explicit boolean mask (true = attend), or none with
/// `is_causal` set for a causal model.
pub(crate) struct Mask {
    mask: Option<Tensor>,
    is_causal: bool,
}

impl Mask {
    /// The explicit boolean mask, `None` when SDPA gets none (what upstream's layers get as
    /// `attention_mask` with the sdpa implementation).
    pub(crate) fn tensor(&self) -> Option<&Tensor> {
        self.mask.as_ref()
    }
}

/// Builds the mask for `seq` queries over `seq` keys. As upstream's
/// `_ignore_causal_mask_sdpa` / `_ignore_bidirectional_mask_sdpa` decide, a padding mask
/// without a single padded key is dropped (one host read, as upstream's `padding_mask.all()`);
/// a causal model then relies on `is_causal` (only when `seq > 1`, as upstream's sdpa
/// integration).
pub(crate) fn attention_mask(
    attention_mask: Option<&Tensor>,
    batch: i64,
    seq: i64,
    causal: bool,
    device: Device,
) -> Mask {
    let padding = attention_mask
        .map(|m| m.to_device(device).ne(0).view([batch, 1, 1, seq]))
        .filter(|p| p.all().int64_value(&[]) == 0);
    let Some(padding) = padding else {
        return Mask {
            mask: None,
            is_causal: causal && seq > 1,
        };
    };
    let mask = if causal {
        let tril = Tensor::ones([seq, seq], (Kind::Bool, device))
            .tril(0)
            .view([1, 1, seq, seq]);
        padding.logical_and(&tril)
    } else {
        padding
    };
    Mask {
        mask: Some(mask),
        is_causal: false,
    }
}

/// `softmax(q kᵀ · scale + mask) v` with dropout in training; `q`, `k`, `v` are
/// `[batch, heads, seq, head_dim]` (k / v may have fewer heads: grouped-query attention).
pub(crate) fn sdpa(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Mask,
    dropout: f64,
    scale: f64,
) -> Tensor {
    let enable_gqa = q.size()[1] != k.size()[1];
    Tensor::scaled_dot_product_attention(
        q,
        k,
        v,
        mask.mask.as_ref(),
        dropout,
        mask.is_causal,
        Some(scale),
        enable_gqa,
    )
}

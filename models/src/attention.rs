//! Attention through libtorch's `scaled_dot_product_attention`, with upstream's masks:
//! causal and/or key padding, as a boolean `[batch, 1, q, k]` mask.

use tch::{Device, Kind, Tensor};

/// Builds the boolean mask (true = attend) for `seq` queries over `seq` keys.
pub(crate) fn attention_mask(
    attention_mask: Option<&Tensor>,
    batch: i64,
    seq: i64,
    causal: bool,
    device: Device,
) -> Option<Tensor> {
    let padding = attention_mask.map(|m| m.to_device(device).ne(0).view([batch, 1, 1, seq]));
    let causal_mask = causal.then(|| {
        Tensor::ones([seq, seq], (Kind::Bool, device))
            .tril(0)
            .view([1, 1, seq, seq])
    });
    match (padding, causal_mask) {
        (Some(p), Some(c)) => Some(p.logical_and(&c)),
        (Some(p), None) => Some(p),
        (None, Some(c)) => Some(c),
        (None, None) => None,
    }
}

/// `softmax(q kᵀ · scale + mask) v` with dropout in training; `q`, `k`, `v` are
/// `[batch, heads, seq, head_dim]` (k / v may have fewer heads: grouped-query attention).
pub(crate) fn sdpa(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    dropout: f64,
    scale: f64,
) -> Tensor {
    let enable_gqa = q.size()[1] != k.size()[1];
    Tensor::scaled_dot_product_attention(q, k, v, mask, dropout, false, Some(scale), enable_gqa)
}

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

    /// No mask, not causal: every query sees every key (a vision encoder's patches).
    pub(crate) fn none() -> Self {
        Self {
            mask: None,
            is_causal: false,
        }
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

/// [`attention_mask`] for `seq` new queries after `past` cached keys (decoding with a
/// [`DynamicCache`](crate::DynamicCache)): `attention_mask` covers the `past + seq` keys; key
/// `k` is visible from query `q` when `k <= q + past` and `k` is not padding. Without padding,
/// one query needs no mask (upstream's `_ignore_causal_mask_sdpa`), several get the causal
/// band over the batch.
pub(crate) fn attention_mask_after(
    attention_mask: Option<&Tensor>,
    batch: i64,
    seq: i64,
    past: i64,
    device: Device,
) -> crate::Result<Mask> {
    let total = past + seq;
    if let Some(m) = attention_mask.filter(|m| m.size() != [batch, total]) {
        return Err(crate::Error::InvalidInput {
            name: "attention_mask",
            detail: format!(
                "shape {:?}: expected [batch, cached + new tokens] = [{batch}, {total}]",
                m.size()
            ),
        });
    }
    if past == 0 {
        return Ok(self::attention_mask(
            attention_mask,
            batch,
            seq,
            true,
            device,
        ));
    }
    let padding = attention_mask
        .map(|m| m.to_device(device).ne(0).view([batch, 1, 1, total]))
        .filter(|p| p.all().int64_value(&[]) == 0);
    if padding.is_none() && seq == 1 {
        return Ok(Mask {
            mask: None,
            is_causal: false,
        });
    }
    let q = Tensor::arange(seq, (Kind::Int64, device)).view([seq, 1]);
    let k = Tensor::arange(total, (Kind::Int64, device)).view([1, total]);
    let band = k.le_tensor(&(q + past)).view([1, 1, seq, total]);
    let mask = match padding {
        Some(p) => p.logical_and(&band),
        None => band.expand([batch, 1, seq, total], false),
    };
    Ok(Mask {
        mask: Some(mask),
        is_causal: false,
    })
}

/// Upstream's packed-sequence detection (masking_utils' `find_packed_sequence_indices`), for
/// batches of `DataCollatorWithFlattening`: several documents in one row, without an
/// attention mask, their `position_ids` restarting at each. Upstream looks only when
/// `position_ids` are given, no 2D attention mask is, and no cache is used (`cached`: one was
/// given, or the model builds one because its config's `use_cache` is true, which the
/// Trainer sets to `args.use_cache`, false by default). A position that does not follow its
/// predecessor by 1 starts a new document; a batch whose rows each hold one document is not
/// packed (one host read, as upstream's).
struct Packed {
    /// `[batch, seq]`: the index of each token's document within its row.
    documents: Tensor,
    /// `[batch, seq]`: the positions, expanded over the batch.
    positions: Tensor,
}

impl Packed {
    fn detect(
        position_ids: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
        cached: bool,
        batch: i64,
        seq: i64,
        device: Device,
    ) -> crate::Result<Option<Self>> {
        let (Some(p), None, false) = (position_ids, attention_mask, cached) else {
            return Ok(None);
        };
        let size = p.size();
        if size.len() != 2 || (size[0] != batch && size[0] != 1) || size[1] != seq {
            return Err(crate::Error::InvalidInput {
                name: "position_ids",
                detail: format!("shape {size:?}: expected [{batch} or 1, {seq}]"),
            });
        }
        let positions = p.f_to_device(device)?.f_expand([batch, seq], false)?;
        // `torch.diff(position_ids, prepend=position_ids[:, :1] - 1)`, then where it is not 1.
        let previous = Tensor::f_cat(
            &[
                positions.narrow(1, 0, 1) - 1,
                positions.narrow(1, 0, seq - 1),
            ],
            1,
        )?;
        let documents = (&positions - previous).ne(1).cumsum(-1, Kind::Int64);
        if documents.select(1, -1).eq(0).all().int64_value(&[]) != 0 {
            return Ok(None);
        }
        Ok(Some(Self {
            documents,
            positions,
        }))
    }

    /// Upstream's causal mask under `packed_sequence_compatibility_function`: key `k` is
    /// visible from query `q` when both are in the same document and, on the documents' own
    /// positions, `k <= q` (and `q - window < k` with a sliding `window`). Always an
    /// explicit `[batch, 1, q, k]` boolean mask (upstream then allows no `is_causal` skip).
    fn causal_mask(&self, window: Option<i64>) -> Mask {
        let (d, p) = (&self.documents, &self.positions);
        let (q, k) = (p.unsqueeze(2), p.unsqueeze(1));
        let mut mask = d
            .unsqueeze(2)
            .eq_tensor(&d.unsqueeze(1))
            .logical_and(&k.le_tensor(&q));
        if let Some(w) = window {
            mask = mask.logical_and(&k.gt_tensor(&(&q - w)));
        }
        Mask {
            mask: Some(mask.unsqueeze(1)),
            is_causal: false,
        }
    }
}

/// A decoder forward's causal mask, and with `window` its sliding-window mask, as upstream's
/// `create_causal_mask` / `create_sliding_window_causal_mask` build them: over the packed
/// documents when [`Packed::detect`] finds some (`cached`: a cache is given, or the model
/// builds one), else over the padding and the `past` cached keys.
#[allow(clippy::too_many_arguments)]
pub(crate) fn causal_masks(
    position_ids: Option<&Tensor>,
    attention_mask: Option<&Tensor>,
    cached: bool,
    batch: i64,
    seq: i64,
    past: i64,
    window: Option<i64>,
    device: Device,
) -> crate::Result<(Mask, Option<Mask>)> {
    Ok(
        match Packed::detect(position_ids, attention_mask, cached, batch, seq, device)? {
            Some(p) => (p.causal_mask(None), window.map(|w| p.causal_mask(Some(w)))),
            None => (
                attention_mask_after(attention_mask, batch, seq, past, device)?,
                match window {
                    Some(w) if past > 0 => Some(sliding_mask_after(
                        attention_mask,
                        batch,
                        seq,
                        past,
                        w,
                        device,
                    )),
                    Some(w) => Some(sliding_window_mask(attention_mask, batch, seq, w, device)),
                    None => None,
                },
            ),
        },
    )
}

/// Upstream's `create_masks_for_vision_model` (Gemma 3's `token_type_ids`, sdpa): the image
/// tokens (`token_type_ids == 1`) form blocks, one per run of image tokens
/// (`get_block_sequence_ids_for_mask`), and a query sees key `k` when `k <= q` or both are in
/// the same block (`or_masks(causal, blockwise_overlay)`), the sliding layers only when also
/// `k > q - window`, never a padded key. Always explicit `[batch, 1, q, k]` masks (upstream
/// allows no `is_causal` skip with the overlays). Refused with cached keys (decoding with
/// images) and with packed sequences, which are not implemented here.
#[allow(clippy::too_many_arguments)]
pub(crate) fn blockwise_causal_masks(
    token_type_ids: &Tensor,
    attention_mask: Option<&Tensor>,
    packed: bool,
    batch: i64,
    seq: i64,
    past: i64,
    window: Option<i64>,
    device: Device,
) -> crate::Result<(Mask, Option<Mask>)> {
    if past > 0 || packed {
        return Err(crate::Error::InvalidInput {
            name: "token_type_ids",
            detail: "the image blocks' bidirectional masks over cached keys (decoding with images) or over packed sequences are not implemented here; pass an attention_mask and no cache".into(),
        });
    }
    if token_type_ids.size() != [batch, seq] {
        return Err(crate::Error::InvalidInput {
            name: "token_type_ids",
            detail: format!(
                "shape {:?}: expected [batch, seq] = [{batch}, {seq}]",
                token_type_ids.size()
            ),
        });
    }
    if let Some(m) = attention_mask.filter(|m| m.size() != [batch, seq]) {
        return Err(crate::Error::InvalidInput {
            name: "attention_mask",
            detail: format!("shape {:?}: expected [{batch}, {seq}]", m.size()),
        });
    }
    let is_image = token_type_ids.f_to_device(device)?.f_eq(1)?;
    let previous = Tensor::f_cat(
        &[
            Tensor::f_zeros([batch, 1], (Kind::Bool, device))?,
            is_image.f_narrow(1, 0, seq - 1)?,
        ],
        1,
    )?;
    let starts = is_image.f_logical_and(&previous.f_logical_not()?)?;
    let groups = starts.f_cumsum(1, Kind::Int64)? - 1;
    let blocks = groups.f_where_self(&is_image, &Tensor::f_full([], -1, (Kind::Int64, device))?)?;
    let same_block = blocks
        .f_unsqueeze(2)?
        .f_eq_tensor(&blocks.f_unsqueeze(1)?)?
        .f_logical_and(&blocks.f_ge(0)?.f_unsqueeze(2)?)?;
    let q = Tensor::f_arange(seq, (Kind::Int64, device))?.f_view([1, seq, 1])?;
    let k = Tensor::f_arange(seq, (Kind::Int64, device))?.f_view([1, 1, seq])?;
    let mut full = k.f_le_tensor(&q)?.f_logical_or(&same_block)?;
    if let Some(m) = attention_mask {
        let padding = m.f_to_device(device)?.f_ne(0)?.f_view([batch, 1, seq])?;
        full = full.f_logical_and(&padding)?;
    }
    let sliding = match window {
        Some(w) => Some(Mask {
            mask: Some(
                full.f_logical_and(&k.f_gt_tensor(&(&q - w))?)?
                    .f_unsqueeze(1)?,
            ),
            is_causal: false,
        }),
        None => None,
    };
    Ok((
        Mask {
            mask: Some(full.f_unsqueeze(1)?),
            is_causal: false,
        },
        sliding,
    ))
}

/// Upstream's sliding-window mask when `past` tokens are cached: the keys are the ones a
/// sliding cache layer kept (the last `min(past, window - 1)`) and the new ones
/// (`get_mask_sizes`), key `k` visible from query `q` when `q - window < k <= q` and `k` is not
/// padding; none for one new token without padding (every kept key is in the window).
pub(crate) fn sliding_mask_after(
    attention_mask: Option<&Tensor>,
    batch: i64,
    seq: i64,
    past: i64,
    window: i64,
    device: Device,
) -> Mask {
    let kept = past.min(window - 1);
    let offset = past - kept;
    let kv = kept + seq;
    let padding = attention_mask
        .map(|m| {
            m.to_device(device)
                .narrow(1, offset, kv)
                .ne(0)
                .view([batch, 1, 1, kv])
        })
        .filter(|p| p.all().int64_value(&[]) == 0);
    if padding.is_none() && seq == 1 {
        return Mask {
            mask: None,
            is_causal: false,
        };
    }
    let q = Tensor::arange_start(past, past + seq, (Kind::Int64, device)).view([seq, 1]);
    let k = Tensor::arange_start(offset, offset + kv, (Kind::Int64, device)).view([1, kv]);
    let band = k
        .le_tensor(&q)
        .logical_and(&k.gt_tensor(&(&q - window)))
        .view([1, 1, seq, kv]);
    let mask = match padding {
        Some(p) => p.logical_and(&band),
        None => band.expand([batch, 1, seq, kv], false),
    };
    Mask {
        mask: Some(mask),
        is_causal: false,
    }
}

/// Upstream's `create_sliding_window_causal_mask` (sdpa): key `k` is visible from query
/// `q` when `q - window < k <= q` and `k` is not padding. As upstream's
/// `_ignore_causal_mask_sdpa`, a window at least as long as the sequence adds nothing and
/// the plain causal mask (or `is_causal`) is used.
pub(crate) fn sliding_window_mask(
    attention_mask: Option<&Tensor>,
    batch: i64,
    seq: i64,
    window: i64,
    device: Device,
) -> Mask {
    if seq < window {
        return self::attention_mask(attention_mask, batch, seq, true, device);
    }
    let q = Tensor::arange(seq, (Kind::Int64, device)).view([seq, 1]);
    let k = Tensor::arange(seq, (Kind::Int64, device)).view([1, seq]);
    let band = k
        .le_tensor(&q)
        .logical_and(&k.gt_tensor(&(&q - window)))
        .view([1, 1, seq, seq]);
    let mask = match attention_mask {
        Some(m) => m
            .to_device(device)
            .ne(0)
            .view([batch, 1, 1, seq])
            .logical_and(&band),
        // Upstream's mask without padding is the band expanded over the batch (a stride-0
        // view, not [1, 1, q, k]): SDPA picks its kernel by the mask's shape.
        None => band.expand([batch, 1, seq, seq], false),
    };
    Mask {
        mask: Some(mask),
        is_causal: false,
    }
}

/// Upstream's bidirectional sliding-window mask (ModernBERT's local layers, sdpa): key `k`
/// is visible from query `q` when `|q - k| <= half` and `k` is not padding. Without padding
/// and with `seq < half` upstream builds none; without padding otherwise, the band expanded
/// over the batch (a stride-0 view, as upstream's).
pub(crate) fn local_window_mask(
    attention_mask: Option<&Tensor>,
    batch: i64,
    seq: i64,
    half: i64,
    device: Device,
) -> Mask {
    let padding = attention_mask
        .map(|m| m.to_device(device).ne(0).view([batch, 1, 1, seq]))
        .filter(|p| p.all().int64_value(&[]) == 0);
    if padding.is_none() && seq < half {
        return Mask {
            mask: None,
            is_causal: false,
        };
    }
    let q = Tensor::arange(seq, (Kind::Int64, device)).view([seq, 1]);
    let k = Tensor::arange(seq, (Kind::Int64, device)).view([1, seq]);
    let band = (&q - &k).abs().le(half).view([1, 1, seq, seq]);
    let mask = match padding {
        Some(p) => p.logical_and(&band),
        None => band.expand([batch, 1, seq, seq], false),
    };
    Mask {
        mask: Some(mask),
        is_causal: false,
    }
}

/// `softmax(q kᵀ · scale + mask) v` with dropout in training; `q`, `k`, `v` are
/// `[batch, heads, seq, head_dim]` (k / v may have fewer heads: grouped-query attention).
/// As upstream's `sdpa_attention_forward`, grouped-query attention goes through SDPA's
/// `enable_gqa` only without a mask (`use_gqa_in_sdpa`); with one, a single query is packed
/// per key / value head (`pack_gqa`: `[batch, kv_heads, n_rep, head_dim]`), and otherwise
/// k / v are repeated per query head (`repeat_kv`): each selects another kernel, with
/// other roundings.
pub(crate) fn sdpa(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Mask,
    dropout: f64,
    scale: f64,
) -> Tensor {
    let (heads, kv_heads) = (q.size()[1], k.size()[1]);
    let grouped = heads != kv_heads;
    let gqa_in_sdpa = mask.mask.is_none() && k.size()[3] == v.size()[3] && k.size()[3] <= 256;
    let q_len = q.size()[2];
    if grouped && !gqa_in_sdpa && q_len == 1 {
        // `pack_gqa` (the mask, shared by the heads, as it is), undone on the output.
        let (b, d) = (q.size()[0], q.size()[3]);
        let packed = q.reshape([b, kv_heads, heads / kv_heads, d]);
        let out = Tensor::scaled_dot_product_attention(
            &packed,
            k,
            v,
            mask.mask.as_ref(),
            dropout,
            false,
            Some(scale),
            false,
        );
        let out_batch = out.size()[0];
        return out.reshape([out_batch, -1, q_len, v.size()[3]]);
    }
    let (k, v) = if grouped && !gqa_in_sdpa {
        (
            repeat_kv(k, heads / kv_heads),
            repeat_kv(v, heads / kv_heads),
        )
    } else {
        (k.shallow_clone(), v.shallow_clone())
    };
    Tensor::scaled_dot_product_attention(
        q,
        &k,
        &v,
        mask.mask.as_ref(),
        dropout,
        mask.is_causal,
        Some(scale),
        grouped && gqa_in_sdpa,
    )
}

/// Upstream's sdpa with a relative position bias (T5's `position_bias` `[1, heads, q, k]`):
/// `create_position_bias_mask` merges it with the mask into one additive float mask (the
/// bias where a key is visible, the dtype's lowest value elsewhere; the causal mask built
/// when the mask was left to `is_causal`), and SDPA runs with it and `scale = 1` (T5 does
/// not scale `q kᵀ`).
pub(crate) fn sdpa_with_position_bias(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Mask,
    position_bias: &Tensor,
    dropout: f64,
) -> Tensor {
    let lowest = finfo_min(k.kind());
    let merged = match (&mask.mask, mask.is_causal) {
        (Some(m), _) => position_bias.where_scalarother(m, lowest),
        (None, true) => {
            let (q_len, k_len) = (q.size()[2], k.size()[2]);
            let causal = Tensor::arange(q_len, (Kind::Int64, q.device()))
                .view([q_len, 1])
                .ge_tensor(&Tensor::arange(k_len, (Kind::Int64, q.device())).view([1, k_len]))
                .view([1, 1, q_len, k_len]);
            position_bias.where_scalarother(&causal, lowest)
        }
        (None, false) => position_bias.shallow_clone(),
    }
    .contiguous();
    Tensor::scaled_dot_product_attention(q, k, v, Some(&merged), dropout, false, Some(1.0), false)
}

/// Upstream's `eager_attention_forward` (the Gemma 2 form, with `softcap`): `q kᵀ · scale`,
/// soft-capped as `tanh(x / softcap) · softcap`, plus the additive mask (0 where a key is
/// visible, the dtype's lowest value elsewhere, as `masking_utils.eager_mask`), softmax in
/// float32 cast back, dropout in training, times `v` (k / v repeated per query head).
/// `mask_kind` is the hidden states' dtype, which upstream builds the mask in (under autocast
/// float32, so that the sum is float32 as upstream's).
#[allow(clippy::too_many_arguments)]
pub(crate) fn eager(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Mask,
    mask_kind: Kind,
    dropout: f64,
    train: bool,
    scale: f64,
    softcap: Option<f64>,
    sinks: Option<&Tensor>,
) -> Tensor {
    let (heads, kv_heads) = (q.size()[1], k.size()[1]);
    let (k, v) = if heads != kv_heads {
        (
            repeat_kv(k, heads / kv_heads),
            repeat_kv(v, heads / kv_heads),
        )
    } else {
        (k.shallow_clone(), v.shallow_clone())
    };
    let mut w = q.matmul(&k.transpose(2, 3)) * scale;
    if let Some(cap) = softcap {
        w = (w / cap).tanh() * cap;
    }
    // The eager implementation always gets a mask (no `is_causal` shortcut).
    let (q_len, k_len) = (q.size()[2], k.size()[2]);
    let visible = match (&mask.mask, mask.is_causal) {
        (Some(m), _) => Some(m.shallow_clone()),
        (None, true) => Some(
            Tensor::ones([q_len, k_len], (Kind::Bool, q.device()))
                .tril(0)
                .view([1, 1, q_len, k_len]),
        ),
        (None, false) => None,
    };
    if let Some(visible) = visible {
        let lowest = finfo_min(mask_kind);
        let additive = Tensor::zeros(visible.size(), (mask_kind, q.device()))
            .masked_fill(&visible.logical_not(), lowest);
        // Out of place, as upstream's `attn_weights + attention_mask`.
        #[allow(clippy::assign_op_pattern)]
        {
            w = w + additive;
        }
    }
    let w = match sinks {
        // gpt-oss: each head's sink logit joins the softmax (after subtracting the row max,
        // in the scores' dtype), then is dropped; the weights in the values' dtype.
        Some(sinks) => {
            let (batch, q_len) = (q.size()[0], q.size()[2]);
            let sinks = sinks
                .reshape([1, -1, 1, 1])
                .expand([batch, -1, q_len, -1], false);
            let combined = Tensor::cat(&[&w, &sinks], -1);
            let combined = &combined - combined.max_dim(-1, true).0;
            let probs = combined.softmax(-1, combined.kind());
            let k_len = probs.size()[3] - 1;
            probs.narrow(-1, 0, k_len)
        }
        None => w.softmax(-1, Kind::Float).to_kind(q.kind()),
    };
    let w = if train && dropout > 0.0 {
        tchtrain_nn::dropout(&w, dropout, true)
    } else {
        w
    };
    let w = match sinks {
        Some(_) => w.to_kind(v.kind()),
        None => w,
    };
    w.matmul(&v)
}

/// `torch.finfo(kind).min` of a floating kind (float32's for the others).
pub(crate) fn finfo_min(kind: Kind) -> f64 {
    match kind {
        Kind::Half => -65504.0,
        Kind::BFloat16 => -3.389_531_389_251_535_5e38,
        Kind::Double => f64::MIN,
        _ => f64::from(f32::MIN),
    }
}

/// Upstream `repeat_kv`: `[batch, kv_heads, seq, dim]` to `[batch, kv_heads * n_rep, seq, dim]`.
fn repeat_kv(x: &Tensor, n_rep: i64) -> Tensor {
    let s = x.size();
    x.unsqueeze(2)
        .expand([s[0], s[1], n_rep, s[2], s[3]], false)
        .reshape([s[0], s[1] * n_rep, s[2], s[3]])
}

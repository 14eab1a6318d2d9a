//! `torch.nn.functional.dropout`, the one dropout of every model here (hidden states,
//! attention probabilities, LoRA's input dropout, the padding-free layout's rows).
//!
//! On the CPU, libtorch's dropout is `noise = empty_like(x).bernoulli_(1 - p);
//! noise.div_(1 - p); x * noise`, and its `bernoulli_` draws one element at a time from the
//! default generator. [`noise`] draws the same noise from the same generator state with
//! `tchtrain-sys`'s `csrc/dropout.cpp` (about four times faster, and the `div_` folded in),
//! leaving the generator where libtorch leaves it; `x * noise` is then the same op, so the
//! output and its backward are libtorch's, bit for bit. Other devices and dtypes, and
//! non-contiguous inputs, go to libtorch's own `dropout`.
#![allow(unsafe_code)]

use tch::{Device, Kind, Tensor};

/// `torch.nn.functional.dropout(x, p, training=train)`.
pub fn dropout(x: &Tensor, p: f64, train: bool) -> Tensor {
    if !train || p <= 0.0 || p >= 1.0 || !fast_path_applies(x.kind(), x.device()) {
        return x.dropout(p, train);
    }
    if !x.is_contiguous() || x.numel() == 0 {
        return x.dropout(p, train);
    }
    x * noise(&x.size(), p, x.kind(), x.device())
}

/// Dropout's noise for a tensor of `shape`: `empty(shape).bernoulli_(1 - p).div_(1 - p)` on
/// the default generator, for `0 < p < 1`.
pub fn noise(shape: &[i64], p: f64, kind: Kind, device: Device) -> Tensor {
    let mut noise = Tensor::empty(shape, (kind, device));
    if fast_path_applies(kind, device) {
        // SAFETY: `noise` is a live, contiguous float32 CPU tensor owned here, and 0 < p < 1
        // (the callers' condition); the shim only writes its elements.
        let err = unsafe { tchtrain_sys::tchtrain_dropout_noise_(noise.as_mut_ptr(), p) };
        // SAFETY: `err` is null or a message the shim allocated. The shim checks its
        // preconditions (met here) before it touches the generator, so on an error nothing
        // was drawn and libtorch's own ops below draw instead.
        if unsafe { tchtrain_sys::take_error(err) }.is_ok() {
            return noise;
        }
    }
    let _ = noise.bernoulli_float_(1.0 - p);
    let _ = noise.g_div_scalar_(1.0 - p);
    noise
}

fn fast_path_applies(kind: Kind, device: Device) -> bool {
    kind == Kind::Float && device == Device::Cpu
}

/// Whether dropout's CPU noise is drawn by tchtrain's own loop: false only when its
/// self-check found that this libtorch's `bernoulli_` draws differently, and every dropout
/// then runs libtorch's own ops.
pub fn dropout_fast_path() -> bool {
    // SAFETY: no arguments; the shim catches everything.
    unsafe { tchtrain_sys::tchtrain_dropout_fast_path() == 1 }
}

/// Dropout as upstream's `nn.Dropout` module `name` (which reports in evaluation too).
pub fn dropout_traced(
    ctx: &crate::Context,
    x: &Tensor,
    p: f64,
    train: bool,
    name: impl FnOnce() -> String,
) -> Tensor {
    let y = dropout(x, p, train);
    ctx.leaf(name, "Dropout", &[], x, &y);
    y
}

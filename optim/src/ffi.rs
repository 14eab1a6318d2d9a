//! The safe Rust face of `tchtrain-sys`'s `csrc/optim.cpp`: libtorch ops that tch does not expose
//! (`add(other, alpha)`, `addcmul(.., value)`, `addcdiv(.., value)`, `p.grad = g`) and the fused
//! multi-tensor kernels `_fused_adamw_` / `_fused_adam_` / `_fused_sgd_`; and of
//! `csrc/generator.cpp`'s draws from a fresh seeded CPU generator.
//!
//! This is the only module that sees raw pointers. Each call hands libtorch pointers to
//! tensors borrowed for the duration of the call; C++ exceptions are caught in the shim and
//! come back as [`Error::Torch`](crate::Error::Torch).
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int};

use tch::{TchError, Tensor};
use tchtrain_sys::{
    C_tensor, tchtrain_optim_add, tchtrain_optim_add_, tchtrain_optim_addcdiv_,
    tchtrain_optim_addcmul, tchtrain_optim_addcmul_, tchtrain_optim_fused_adam,
    tchtrain_optim_fused_sgd, tchtrain_optim_set_grad, tchtrain_optim_vector_norm,
};

use crate::Result;

/// Turns the shim's error pointer into a `Result`, freeing the message.
fn check(err: *mut c_char) -> Result<()> {
    // SAFETY: `err` is what a shim function just returned.
    unsafe { tchtrain_sys::take_error(err) }.map_err(|msg| TchError::Torch(msg).into())
}

/// Takes ownership of a tensor the shim allocated with `new at::Tensor`.
fn adopt(out: *mut C_tensor) -> Result<Tensor> {
    if out.is_null() {
        return Err(TchError::Torch("the optim shim returned no tensor".into()).into());
    }
    // SAFETY: `out` was allocated by the shim with `new at::Tensor(..)`, the same layout tch
    // uses for its own tensors, and nothing else owns it.
    Ok(unsafe { Tensor::from_ptr(out) })
}

/// `t.add_(other, alpha=alpha)` (ATen's fused `t + alpha * other`, as the optimizers and
/// TRL's reference-model sync compute it).
pub fn add_(t: &mut Tensor, other: &Tensor, alpha: f64) -> Result<()> {
    // SAFETY: both pointers come from live tensors borrowed for the call.
    check(unsafe { tchtrain_optim_add_(t.as_mut_ptr(), other.as_ptr(), alpha) })
}

/// `t.add(other, alpha=alpha)`.
pub(crate) fn add(t: &Tensor, other: &Tensor, alpha: f64) -> Result<Tensor> {
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: both inputs are live tensors borrowed for the call; `out` is written on success.
    check(unsafe { tchtrain_optim_add(t.as_ptr(), other.as_ptr(), alpha, &mut out) })?;
    adopt(out)
}

/// `t.addcmul_(t1, t2, value=value)`.
pub(crate) fn addcmul_(t: &mut Tensor, t1: &Tensor, t2: &Tensor, value: f64) -> Result<()> {
    // SAFETY: all pointers come from live tensors borrowed for the call.
    check(unsafe { tchtrain_optim_addcmul_(t.as_mut_ptr(), t1.as_ptr(), t2.as_ptr(), value) })
}

/// `t.addcmul(t1, t2, value=value)`.
pub(crate) fn addcmul(t: &Tensor, t1: &Tensor, t2: &Tensor, value: f64) -> Result<Tensor> {
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: all inputs are live tensors borrowed for the call; `out` is written on success.
    check(unsafe {
        tchtrain_optim_addcmul(t.as_ptr(), t1.as_ptr(), t2.as_ptr(), value, &mut out)
    })?;
    adopt(out)
}

/// `p.grad = grad` (`None`: `p.grad = None`).
pub(crate) fn set_grad(p: &mut Tensor, grad: Option<&Tensor>) -> Result<()> {
    let g = grad.map_or(std::ptr::null(), Tensor::as_ptr);
    // SAFETY: `p` and `grad` (when given) are live tensors borrowed for the call.
    check(unsafe { tchtrain_optim_set_grad(p.as_mut_ptr(), g) })
}

/// `t.addcdiv_(t1, t2, value=value)`.
pub(crate) fn addcdiv_(t: &mut Tensor, t1: &Tensor, t2: &Tensor, value: f64) -> Result<()> {
    // SAFETY: all pointers come from live tensors borrowed for the call.
    check(unsafe { tchtrain_optim_addcdiv_(t.as_mut_ptr(), t1.as_ptr(), t2.as_ptr(), value) })
}

/// `torch.linalg.vector_norm(t, ord)` over all elements (a 0-d tensor).
pub(crate) fn vector_norm(t: &Tensor, ord: f64) -> Result<Tensor> {
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: the input is a live tensor borrowed for the call; `out` is written on success.
    check(unsafe { tchtrain_optim_vector_norm(t.as_ptr(), ord, &mut out) })?;
    adopt(out)
}

fn ptrs(ts: &[&Tensor]) -> Vec<*mut C_tensor> {
    // The kernels write through these; the caller holds `&mut` access to the owning structs.
    ts.iter().map(|t| t.as_ptr() as *mut C_tensor).collect()
}

/// Hyper-parameters of one `_fused_adam(w)_` call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FusedAdamArgs {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub weight_decay: f64,
    pub eps: f64,
    pub amsgrad: bool,
    pub maximize: bool,
    /// `_fused_adamw_` when true, `_fused_adam_` otherwise.
    pub decoupled: bool,
}

/// Tensors of one `_fused_adam(w)_` call; all lists have the same length and device.
pub(crate) struct FusedAdamTensors<'a> {
    pub params: &'a [&'a Tensor],
    pub grads: &'a [&'a Tensor],
    pub exp_avgs: &'a [&'a Tensor],
    pub exp_avg_sqs: &'a [&'a Tensor],
    /// Read only when `amsgrad`.
    pub max_exp_avg_sqs: &'a [&'a Tensor],
    pub state_steps: &'a [&'a Tensor],
}

/// `torch._fused_adamw_` / `torch._fused_adam_`: updates params, moments in place (the
/// step tensors must already be incremented, as torch.optim does before the call).
pub(crate) fn fused_adam(t: &FusedAdamTensors<'_>, a: FusedAdamArgs) -> Result<()> {
    let n = t.params.len();
    let lists = [t.grads, t.exp_avgs, t.exp_avg_sqs, t.state_steps];
    if lists.iter().any(|l| l.len() != n) || (a.amsgrad && t.max_exp_avg_sqs.len() != n) {
        return Err(TchError::Torch("fused adam: tensor lists differ in length".into()).into());
    }
    let (p, g, m, v, s) = (
        ptrs(t.params),
        ptrs(t.grads),
        ptrs(t.exp_avgs),
        ptrs(t.exp_avg_sqs),
        ptrs(t.state_steps),
    );
    let vmax = if a.amsgrad {
        ptrs(t.max_exp_avg_sqs)
    } else {
        v.clone()
    };
    // SAFETY: every pointer array holds `n` pointers to live tensors that outlive the call.
    check(unsafe {
        tchtrain_optim_fused_adam(
            p.as_ptr(),
            g.as_ptr(),
            m.as_ptr(),
            v.as_ptr(),
            vmax.as_ptr(),
            s.as_ptr(),
            n,
            a.lr,
            a.beta1,
            a.beta2,
            a.weight_decay,
            a.eps,
            c_int::from(a.amsgrad),
            c_int::from(a.maximize),
            c_int::from(a.decoupled),
        )
    })
}

/// Hyper-parameters of one `_fused_sgd_` call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FusedSgdArgs {
    pub weight_decay: f64,
    pub momentum: f64,
    pub lr: f64,
    pub dampening: f64,
    pub nesterov: bool,
    pub maximize: bool,
    pub is_first_step: bool,
}

/// `torch._fused_sgd_` (momentum buffers are read only when `momentum != 0`).
pub(crate) fn fused_sgd(
    params: &[&Tensor],
    grads: &[&Tensor],
    momentum_buffers: &[&Tensor],
    a: FusedSgdArgs,
) -> Result<()> {
    let n = params.len();
    if grads.len() != n || (a.momentum != 0.0 && momentum_buffers.len() != n) {
        return Err(TchError::Torch("fused sgd: tensor lists differ in length".into()).into());
    }
    let (p, g) = (ptrs(params), ptrs(grads));
    let b = if a.momentum != 0.0 {
        ptrs(momentum_buffers)
    } else {
        g.clone()
    };
    // SAFETY: every pointer array holds `n` pointers to live tensors that outlive the call.
    check(unsafe {
        tchtrain_optim_fused_sgd(
            p.as_ptr(),
            g.as_ptr(),
            b.as_ptr(),
            n,
            a.weight_decay,
            a.momentum,
            a.lr,
            a.dampening,
            c_int::from(a.nesterov),
            c_int::from(a.maximize),
            c_int::from(a.is_first_step),
        )
    })
}

/// `torch.randn(shape, generator=torch.Generator().manual_seed(seed))`: float32, on the CPU,
/// from a fresh generator (libtorch's own draw, so the same numbers as upstream's).
pub(crate) fn randn_seeded(seed: u64, shape: &[i64]) -> Result<Tensor> {
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: `shape` is a live slice of `shape.len()` values; `out` is written on success.
    check(unsafe {
        tchtrain_sys::tchtrain_randn_seeded(seed, shape.as_ptr(), shape.len(), &mut out)
    })?;
    adopt(out)
}

/// `torch.randint(low, high, (n,), generator=torch.Generator().manual_seed(seed))`: int64, on
/// the CPU, from a fresh generator.
pub(crate) fn randint_seeded(seed: u64, low: i64, high: i64, n: i64) -> Result<Tensor> {
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: plain values in; `out` is written on success.
    check(unsafe { tchtrain_sys::tchtrain_randint_seeded(seed, low, high, n, &mut out) })?;
    adopt(out)
}

//! A gradient boundary: `x` behind an identity op whose backward first runs a Rust action
//! (`tchtrain-sys`'s `csrc/grad_boundary.cpp`). ZeRO-3's per-layer hooks put one on the
//! hidden states entering and leaving each layer (`zero_layers.rs`).
#![allow(unsafe_code)]

use std::ffi::c_int;

use tch::{TchError, Tensor};
use tchtrain_sys::C_tensor;

use crate::error::Result;
use crate::ffi::check;

/// What a gradient boundary runs in the backward: `Err` carries a message for the log; the
/// caller keeps the typed error itself.
pub(crate) type BoundaryAction = Box<dyn FnOnce() -> std::result::Result<(), String> + Send>;

/// The actions of the live gradient boundaries, by token.
static BOUNDARY_ACTIONS: std::sync::Mutex<std::collections::BTreeMap<u64, BoundaryAction>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());
static NEXT_BOUNDARY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn boundary_actions()
-> std::sync::MutexGuard<'static, std::collections::BTreeMap<u64, BoundaryAction>> {
    BOUNDARY_ACTIONS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Called by the shim in the backward: runs (once) the action registered under `token`.
unsafe extern "C" fn run_boundary(token: u64) -> c_int {
    let action = boundary_actions().remove(&token);
    let Some(action) = action else {
        log::error!(
            "gradient boundary {token}: no action (the step that built this graph has ended)"
        );
        return 1;
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(action)) {
        Ok(Ok(())) => 0,
        Ok(Err(msg)) => {
            log::debug!("gradient boundary {token}: {msg}");
            1
        }
        Err(_) => {
            log::error!("gradient boundary {token}: the action panicked");
            1
        }
    }
}

/// `x` behind an identity op whose backward runs `action` first (once), then passes the
/// gradient on unchanged. Returns the new tensor and the token to
/// [`forget_boundaries`] when the graph will not be run backward.
pub(crate) fn grad_boundary(x: &Tensor, action: BoundaryAction) -> Result<(Tensor, u64)> {
    let token = NEXT_BOUNDARY.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    boundary_actions().insert(token, action);
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: `x` is a live tensor borrowed for the call, `out` a live local, `run_boundary`
    // a function that lives as long as the program.
    let err =
        unsafe { tchtrain_sys::tchtrain_grad_boundary(x.as_ptr(), token, run_boundary, &mut out) };
    if let Err(e) = check(err) {
        boundary_actions().remove(&token);
        return Err(e);
    }
    if out.is_null() {
        boundary_actions().remove(&token);
        return Err(TchError::Torch("the shim returned no tensor".into()).into());
    }
    // SAFETY: allocated by the shim with `new at::Tensor(..)`, owned by nobody else.
    Ok((unsafe { Tensor::from_ptr(out) }, token))
}

/// Drops the actions of boundaries whose backward did not run (or will not).
pub(crate) fn forget_boundaries(tokens: &[u64]) {
    let mut actions = boundary_actions();
    for t in tokens {
        actions.remove(t);
    }
}

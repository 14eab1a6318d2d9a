//! The safe Rust face of `tchtrain-sys`'s autocast, generator, gradient-boundary and CPU-cache calls: autocast regions for a device type
//! ([`AutocastGuard`], upstream's `torch.autocast(device_type, dtype)` as accelerate enters
//! it around the model's forward) and the default generators' states ([`rng_state`],
//! [`set_rng_state`]: `torch.get_rng_state()` / `torch.cuda.get_rng_state()`).
//!
//! This is the only module of the crate that sees raw pointers. C++ exceptions are caught in
//! the shim and come back as [`Error::Torch`](crate::Error::Torch).
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int};

use tch::{Device, Kind, TchError, Tensor};
use tchtrain_sys::*;

use crate::error::{Error, Result};

fn check(err: *mut c_char) -> Result<()> {
    // SAFETY: `err` is what a shim function just returned.
    unsafe { tchtrain_sys::take_error(err) }.map_err(|msg| TchError::Torch(msg).into())
}

/// The shim's device code and index: 0 = CPU, 1 = CUDA.
fn device_code(device: Device) -> Result<(c_int, c_int)> {
    match device {
        Device::Cpu => Ok((0, 0)),
        Device::Cuda(i) => Ok((1, i as c_int)),
        other => Err(Error::InvalidArgument {
            field: "device",
            detail: format!("{other:?} is neither the CPU nor a CUDA device"),
        }),
    }
}

/// c10::ScalarType codes of the kinds autocast takes.
fn scalar_type(kind: Kind) -> Result<c_int> {
    match kind {
        Kind::Half => Ok(5),
        Kind::Float => Ok(6),
        Kind::BFloat16 => Ok(15),
        other => Err(Error::InvalidArgument {
            field: "bf16",
            detail: format!("autocast to {other:?}: only bfloat16, float16 or float32"),
        }),
    }
}

/// An open `torch.autocast(device_type, dtype)` region: ops on `device`'s type run in `dtype`
/// where autocast's op lists say so (matmuls, linear, attention in bf16; softmax, losses,
/// norms in fp32) until the guard drops, which restores the previous autocast state and, when
/// it closes the outermost region, clears the weight-cast cache (upstream's `__exit__`).
#[derive(Debug)]
pub(crate) struct AutocastGuard {
    device: c_int,
    prev_enabled: bool,
    prev_dtype: c_int,
    prev_cache: bool,
}

impl AutocastGuard {
    /// Enters the region (upstream's `__enter__`).
    pub(crate) fn enter(device: Device, dtype: Kind) -> Result<Self> {
        let (code, _) = device_code(device)?;
        let dtype = scalar_type(dtype)?;
        let (mut prev_enabled, mut prev_dtype, mut prev_cache) = (false, 0, false);
        // SAFETY: the out-pointers point at live locals for the duration of the call.
        check(unsafe {
            tchtrain_autocast_enter(
                code,
                dtype,
                &mut prev_enabled,
                &mut prev_dtype,
                &mut prev_cache,
            )
        })?;
        Ok(Self {
            device: code,
            prev_enabled,
            prev_dtype,
            prev_cache,
        })
    }
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        // SAFETY: plain values; the shim only touches libtorch's thread-local autocast state.
        let err = unsafe {
            tchtrain_autocast_exit(
                self.device,
                self.prev_enabled,
                self.prev_dtype,
                self.prev_cache,
            )
        };
        if let Err(e) = check(err) {
            log::error!("leaving an autocast region failed: {e}");
        }
    }
}

/// The state of `device`'s default generator, a uint8 tensor on the CPU
/// (`torch.get_rng_state()`, `torch.cuda.get_rng_state(i)`).
pub(crate) fn rng_state(device: Device) -> Result<Tensor> {
    let (code, index) = device_code(device)?;
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: `out` is a live local; on success the shim stores a `new at::Tensor` in it.
    check(unsafe { tchtrain_get_rng_state(code, index, &mut out) })?;
    if out.is_null() {
        return Err(TchError::Torch("the trainer shim returned no generator state".into()).into());
    }
    // SAFETY: allocated by the shim with `new at::Tensor(..)`, the layout tch uses for its
    // own tensors, and owned by nobody else.
    Ok(unsafe { Tensor::from_ptr(out) })
}

/// Restores `device`'s default generator from a state [`rng_state`] returned
/// (`torch.set_rng_state`); libtorch checks the size and type and errors otherwise.
pub(crate) fn set_rng_state(device: Device, state: &Tensor) -> Result<()> {
    let (code, index) = device_code(device)?;
    // SAFETY: `state` is a live tensor borrowed for the call.
    check(unsafe { tchtrain_set_rng_state(code, index, state.as_ptr()) })
}

/// Installs `tchtrain-sys`'s (`csrc/cpu_cache.cpp`) caching allocator as libtorch's CPU allocator, or joins
/// its current holders; `limit` caps the bytes of free blocks it keeps. False when another
/// allocator of higher priority is in place (nothing changed then).
pub(crate) fn cpu_cache_acquire(limit: u64) -> bool {
    // SAFETY: a plain value; the shim catches every C++ exception.
    unsafe { tchtrain_cpu_cache_acquire(limit) }
}

/// Leaves the holders; the last one restores the previous allocator and frees the cache.
pub(crate) fn cpu_cache_release() {
    // SAFETY: no arguments; the shim catches every C++ exception.
    unsafe { tchtrain_cpu_cache_release() }
}

/// (reuses, fresh large allocations, bytes cached now, most bytes cached at once), counted
/// since the process started.
pub(crate) fn cpu_cache_stats() -> (u64, u64, u64, u64) {
    let (mut hits, mut misses, mut cached, mut peak) = (0, 0, 0, 0);
    // SAFETY: the out-pointers point at live locals for the duration of the call.
    unsafe { tchtrain_cpu_cache_stats(&mut hits, &mut misses, &mut cached, &mut peak) };
    (hits, misses, cached, peak)
}

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
    let err = unsafe { tchtrain_grad_boundary(x.as_ptr(), token, run_boundary, &mut out) };
    if let Err(e) = check(err) {
        boundary_actions().remove(&token);
        return Err(e);
    }
    if out.is_null() {
        boundary_actions().remove(&token);
        return Err(TchError::Torch("the trainer shim returned no tensor".into()).into());
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

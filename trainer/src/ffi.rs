//! The safe Rust face of `tchtrain-sys`'s generator and CPU-cache calls: the default
//! generators' states ([`rng_state`], [`set_rng_state`]: `torch.get_rng_state()` /
//! `torch.cuda.get_rng_state()`) and the caching CPU allocator's switch and counters.
//!
//! This is the only module of the crate that sees raw pointers. C++ exceptions are caught in
//! the shim and come back as [`Error::Torch`](crate::Error::Torch).
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int};

use tch::{Device, TchError, Tensor};
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

//! The default generators' states, as torch exposes them and accelerate's `utils/random.py`
//! saves them: [`get_rng_state`] / [`set_rng_state`] for the CPU (`torch.get_rng_state()`)
//! or a CUDA device (`torch.cuda.get_rng_state(i)`), over `tchtrain-sys`'s
//! `csrc/generator.cpp`. The Trainer's checkpoints save them, so that a resumed run draws the
//! same dropout masks.
#![allow(unsafe_code)]

use tch::{Device, TchError, Tensor};
use tchtrain_sys::C_tensor;

use crate::error::Result;
use crate::ffi::{check, device_code};

/// The state of `device`'s default generator, a uint8 tensor on the CPU
/// (`torch.get_rng_state()`, `torch.cuda.get_rng_state(i)`).
pub fn get_rng_state(device: Device) -> Result<Tensor> {
    let (code, index) = device_code(device)?;
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: `out` is a live local; on success the shim stores a `new at::Tensor` in it.
    check(unsafe { tchtrain_sys::tchtrain_get_rng_state(code, index, &mut out) })?;
    if out.is_null() {
        return Err(TchError::Torch("the shim returned no generator state".into()).into());
    }
    // SAFETY: allocated by the shim with `new at::Tensor(..)`, the layout tch uses for its
    // own tensors, and owned by nobody else.
    Ok(unsafe { Tensor::from_ptr(out) })
}

/// Restores `device`'s default generator from a state [`get_rng_state`] returned
/// (`torch.set_rng_state`); libtorch checks the size and type and errors otherwise.
pub fn set_rng_state(device: Device, state: &Tensor) -> Result<()> {
    let (code, index) = device_code(device)?;
    // SAFETY: `state` is a live tensor borrowed for the call.
    check(unsafe { tchtrain_sys::tchtrain_set_rng_state(code, index, state.as_ptr()) })
}

//! `torch.autocast(device_type, dtype)` as accelerate enters it around the model's forward
//! (mixed precision `bf16`, or `fp16` with a loss scaler), for the CPU or a CUDA device, over
//! `tchtrain-sys`'s `csrc/autocast.cpp` (tch 0.26's own `autocast` drives only CUDA).
#![allow(unsafe_code)]

use std::ffi::c_int;

use tch::{Device, Kind};

use crate::error::{Error, Result};
use crate::ffi::{check, device_code};

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
pub struct AutocastGuard {
    device: c_int,
    prev_enabled: bool,
    prev_dtype: c_int,
    prev_cache: bool,
}

impl AutocastGuard {
    /// Enters the region (upstream's `__enter__`).
    pub fn enter(device: Device, dtype: Kind) -> Result<Self> {
        let (code, _) = device_code(device)?;
        let dtype = scalar_type(dtype)?;
        let (mut prev_enabled, mut prev_dtype, mut prev_cache) = (false, 0, false);
        // SAFETY: the out-pointers point at live locals for the duration of the call.
        check(unsafe {
            tchtrain_sys::tchtrain_autocast_enter(
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
            tchtrain_sys::tchtrain_autocast_exit(
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

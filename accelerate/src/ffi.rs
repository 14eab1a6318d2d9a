//! What every safe wrapper of `tchtrain-sys` in this crate shares: a shim error as
//! [`Error::Torch`], and the shim's device codes.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int};

use tch::{Device, TchError};

use crate::error::{Error, Result};

/// The shim's result: `Ok` for a null pointer, else its message (freed).
pub(crate) fn check(err: *mut c_char) -> Result<()> {
    // SAFETY: `err` is what a shim function just returned.
    unsafe { tchtrain_sys::take_error(err) }.map_err(|msg| TchError::Torch(msg).into())
}

/// The shim's device code and index: 0 = CPU, 1 = CUDA.
pub(crate) fn device_code(device: Device) -> Result<(c_int, c_int)> {
    match device {
        Device::Cpu => Ok((0, 0)),
        Device::Cuda(i) => Ok((1, i as c_int)),
        other => Err(Error::InvalidArgument {
            field: "device",
            detail: format!("{other:?} is neither the CPU nor a CUDA device"),
        }),
    }
}

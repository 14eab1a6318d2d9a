//! Process-wide backend switches: upstream's `enable_tf32` / `is_torch_tf32_available`
//! (transformers `utils/import_utils.py`), `torch.use_deterministic_algorithms` (what
//! `enable_full_determinism` sets), accelerate's `clear_device_cache` (`utils/memory.py`)
//! and the CUDA allocator's counters (`torch.cuda.memory_allocated`,
//! `max_memory_allocated`, `reset_peak_memory_stats`), over `tchtrain-sys`'s
//! `csrc/backends.cpp`.
#![allow(unsafe_code)]

use tch::Device;

use crate::error::Result;
use crate::ffi::{check, device_code};

/// Upstream `is_torch_tf32_available`: a CUDA device of compute capability 8.0 or newer
/// (Ampere). libtorch reports no capability without CUDA, so a CPU-only process is `false`.
pub fn is_torch_tf32_available() -> bool {
    tch::Cuda::is_available() && cuda_major(0).is_some_and(|major| major >= 8)
}

/// The compute capability's major number of CUDA device `index`, from the CUDA runtime
/// libtorch loaded (`None` without one).
pub fn cuda_major(index: usize) -> Option<i64> {
    // SAFETY: plain C call; looks the runtime up, returns -1 when absent.
    let major = unsafe { tchtrain_sys::tchtrain_cuda_capability_major(index as i32) };
    (major >= 0).then_some(i64::from(major))
}

/// Upstream `enable_tf32(enable)` on torch >= 2.9: `torch.backends.fp32_precision` set to
/// `"tf32"` or `"ieee"`.
pub fn enable_tf32(enable: bool) -> Result<()> {
    // SAFETY: plain C call; the error pointer is taken by `check`.
    check(unsafe { tchtrain_sys::tchtrain_set_fp32_precision_tf32(i32::from(enable)) })
}

/// `torch.use_deterministic_algorithms(mode, warn_only)`, with
/// `torch.backends.cudnn.deterministic = mode` and, when on, `cudnn.benchmark = False` (the
/// three switches upstream's `enable_full_determinism` sets).
pub fn use_deterministic_algorithms(mode: bool, warn_only: bool) -> Result<()> {
    // SAFETY: plain C call; the error pointer is taken by `check`.
    check(unsafe {
        tchtrain_sys::tchtrain_set_deterministic(i32::from(mode), i32::from(warn_only))
    })
}

/// `torch.are_deterministic_algorithms_enabled()`.
pub fn are_deterministic_algorithms_enabled() -> bool {
    // SAFETY: reads a flag of libtorch's global context.
    unsafe { tchtrain_sys::tchtrain_deterministic_algorithms() != 0 }
}

/// Accelerate's `clear_device_cache`: the CUDA caching allocator's cached blocks handed
/// back (`torch.cuda.empty_cache()`); nothing on the CPU, whose allocator caches nothing
/// upstream (Python's `gc.collect()` has no counterpart: Rust frees tensors when dropped).
pub fn clear_device_cache(device: Device) -> Result<()> {
    if device == Device::Cpu {
        return Ok(());
    }
    let (code, _) = device_code(device)?;
    // SAFETY: plain C call; the error pointer is taken by `check`.
    check(unsafe { tchtrain_sys::tchtrain_empty_device_cache(code) })
}

/// `torch.cuda.memory_allocated(index)` and `torch.cuda.max_memory_allocated(index)`: the
/// bytes the CUDA caching allocator has handed out now and at most since the last
/// [`reset_peak_memory_stats`]. An error on the CPU, which has no such allocator.
pub fn memory_allocated(device: Device) -> Result<(i64, i64)> {
    let (code, index) = device_code(device)?;
    let (mut current, mut peak) = (0i64, 0i64);
    // SAFETY: plain C call writing two integers on success; the error pointer is taken by
    // `check`.
    check(unsafe {
        tchtrain_sys::tchtrain_device_memory_allocated(code, index, &mut current, &mut peak)
    })?;
    Ok((current, peak))
}

/// `torch.cuda.reset_peak_memory_stats(index)`.
pub fn reset_peak_memory_stats(device: Device) -> Result<()> {
    let (code, index) = device_code(device)?;
    // SAFETY: plain C call; the error pointer is taken by `check`.
    check(unsafe { tchtrain_sys::tchtrain_device_reset_peak_memory_stats(code, index) })
}

//! The caching CPU allocator (`csrc/cpu_cache.cpp`) behind a guard: held while the Trainer
//! trains, evaluates or predicts, and while `generate` decodes.
//!
//! glibc returns every freed block above its mmap threshold (at most 32 MB) to the kernel, so
//! a CPU training step that allocates the same large buffers every time (GPT-2's
//! `[batch, seq, 50257]` logits, their gradient, the log-softmax) maps, faults in and unmaps
//! them again at every step: ~18 % of a step's time went to page faults, and steps took about
//! twice as long as with the memory kept (BENCHMARKS.md, "Where the time goes"). PyTorch keeps
//! freed GPU memory in its CUDA caching allocator but has no such cache on the CPU. While a
//! [`CpuMemoryCache`] is held, libtorch's CPU allocations of 1 MiB or more are rounded up to one
//! of 8 sizes per power of two (so nearby sizes, e.g. batches padded to different lengths,
//! share blocks) and served from a cache of freed blocks (the smallest at least as large, if at
//! most twice the size). Before a request that no cached block fits gets fresh memory, the
//! oldest cached blocks are released until the memory held (in use plus cached) is within the
//! most ever in use at once plus 1/4, so the cache raises the peak resident memory by at most
//! a quarter of the large blocks' peak (the bench jobs' figures are in BENCHMARKS.md); the
//! cached bytes are also capped. Smaller allocations go
//! to the system allocator as before. The numbers computed do not change, only where the
//! memory comes from.
//!
//! `TCHTRAIN_CPU_CACHE_MB` sets the cap in MiB (default [`DEFAULT_LIMIT_MB`]); `0` turns the
//! cache off.

/// The default cap on cached free bytes, in MiB. The bound that matters is the other one
/// (in use plus cached within the peak in use plus 1/4); at 1024 MiB this cap evicted
/// SmolLM2-135M's 100 MB logit-sized blocks (logits, log-softmax, their gradients) in every
/// LoRA step, and each came back as 25,000 fresh page faults: 4096 MiB made that step 6 %
/// faster at the same resident memory (BENCHMARKS.md, smollm2_lora).
pub const DEFAULT_LIMIT_MB: u64 = 4096;

/// The environment variable that sets the cap in MiB (`0`: no cache).
pub const LIMIT_ENV: &str = "TCHTRAIN_CPU_CACHE_MB";

/// Counters of the caching allocator since the process started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuMemoryCacheStats {
    /// Large allocations served from the cache.
    pub hits: u64,
    /// Large allocations that needed fresh memory.
    pub misses: u64,
    /// Bytes of free blocks cached now.
    pub cached_bytes: u64,
    /// Most bytes of free blocks cached at once.
    pub peak_cached_bytes: u64,
}

/// While alive, libtorch's CPU allocator keeps freed large blocks for reuse (see the module
/// documentation). Holders nest and may live on several threads; the last one to drop
/// restores the previous allocator and frees the cached blocks.
#[derive(Debug)]
pub struct CpuMemoryCache {
    _private: (),
}

impl CpuMemoryCache {
    /// Joins the cache with a cap of `limit_bytes` free bytes (the largest cap among the
    /// holders applies). `None` when `limit_bytes` is 0 or another allocator of higher
    /// priority is installed.
    pub fn with_limit(limit_bytes: u64) -> Option<Self> {
        if limit_bytes == 0 || !cpu_cache_acquire(limit_bytes) {
            return None;
        }
        Some(Self { _private: () })
    }

    /// Joins the cache with the cap `TCHTRAIN_CPU_CACHE_MB` names (default
    /// [`DEFAULT_LIMIT_MB`]); `None` when it is 0. A value that is not a whole number is
    /// reported once in the log and the default used.
    pub fn from_env() -> Option<Self> {
        let mb = match std::env::var(LIMIT_ENV) {
            Err(_) => DEFAULT_LIMIT_MB,
            Ok(v) => match v.trim().parse::<u64>() {
                Ok(mb) => mb,
                Err(_) => {
                    log::warn!(
                        "{LIMIT_ENV}={v:?} is not a whole number of MiB; using {DEFAULT_LIMIT_MB}"
                    );
                    DEFAULT_LIMIT_MB
                }
            },
        };
        Self::with_limit(mb.saturating_mul(1 << 20))
    }

    /// The allocator's counters.
    pub fn stats() -> CpuMemoryCacheStats {
        let (hits, misses, cached_bytes, peak_cached_bytes) = cpu_cache_stats();
        CpuMemoryCacheStats {
            hits,
            misses,
            cached_bytes,
            peak_cached_bytes,
        }
    }
}

impl Drop for CpuMemoryCache {
    fn drop(&mut self) {
        cpu_cache_release();
    }
}

/// Installs `tchtrain-sys`'s caching allocator (`csrc/cpu_cache.cpp`) as libtorch's CPU allocator, or joins
/// its current holders; `limit` caps the bytes of free blocks it keeps. False when another
/// allocator of higher priority is in place (nothing changed then).
#[allow(unsafe_code)]
fn cpu_cache_acquire(limit: u64) -> bool {
    // SAFETY: a plain value; the shim catches every C++ exception.
    unsafe { crate::tchtrain_cpu_cache_acquire(limit) }
}

/// Leaves the holders; the last one restores the previous allocator and frees the cache.
#[allow(unsafe_code)]
fn cpu_cache_release() {
    // SAFETY: no arguments; the shim catches every C++ exception.
    unsafe { crate::tchtrain_cpu_cache_release() }
}

/// (reuses, fresh large allocations, bytes cached now, most bytes cached at once), counted
/// since the process started.
#[allow(unsafe_code)]
fn cpu_cache_stats() -> (u64, u64, u64, u64) {
    let (mut hits, mut misses, mut cached, mut peak) = (0, 0, 0, 0);
    // SAFETY: the out-pointers point at live locals for the duration of the call.
    unsafe { crate::tchtrain_cpu_cache_stats(&mut hits, &mut misses, &mut cached, &mut peak) };
    (hits, misses, cached, peak)
}

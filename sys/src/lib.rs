//! `tchtrain-sys` — all of tchtrain's C++, as torch-sys is for tch: the pieces of libtorch
//! tch 0.26 does not expose, compiled once by this crate's `build.rs` against the libtorch
//! torch-sys links, behind one exception guard (`csrc/guard.h`).
//!
//! | file | what |
//! |---|---|
//! | `csrc/autocast.cpp` | `torch.autocast(device_type, dtype)` enter / exit for the CPU or CUDA |
//! | `csrc/backends.cpp` | `tf32` (fp32 precision), deterministic algorithms, the device allocator's `emptyCache` |
//! | `csrc/generator.cpp` | the default generators' states (`torch.get_rng_state` / `set_rng_state`); `randn` / `randint` from a fresh seeded CPU generator |
//! | `csrc/dropout.cpp` | dropout's CPU noise, drawn from the default generator exactly as libtorch's `bernoulli_` draws it (self-checked), faster |
//! | `csrc/grad_boundary.cpp` | an identity op whose backward calls back into Rust (ZeRO-3's per-layer hooks) |
//! | `csrc/checkpoint.cpp` | activation checkpointing: a layer recomputed in the backward (a Rust closure), generator and autocast states replayed |
//! | `csrc/quantized_linear.cpp` | bitsandbytes' `MatMul4Bit` / `MatMul8bitFp` / `MatMul8bitLt`: a linear map over a quantized weight whose forward and input gradient a Rust closure computes (the graph keeps the quantized weight only) |
//! | `csrc/chunked_logprob.cpp` | TRL's `ChunkedLogProbFunction` (its torch fallback): per-token log-probabilities, entropy and top-1 hits of `hidden @ weight.T` by vocabulary tiles, without the logits, and their backward |
//! | `csrc/cpu_cache.cpp` | a caching CPU allocator installed while the Trainer runs |
//! | `csrc/optim.cpp` | `add` / `addcmul` / `addcdiv` with their scalars, `p.grad = g`, the fused Adam(W) / SGD kernels |
//! | `csrc/c10d.cpp` + `csrc/gloo/` | a TCPStore rendezvous, ProcessGroupGloo (ProcessGroupNCCL with the `cuda` feature), the collectives |
//! | `csrc/ddp.cpp` | DDP's gradient reduction overlapped with the backward: torch's own `c10d::Reducer`, built and driven as `DistributedDataParallel` does |
//!
//! Only raw `extern "C"` declarations live here; the safe wrappers stay beside their users
//! (`tchtrain-optim`, `tchtrain-distributed`, `tchtrain-accelerate`, `tchtrain-trainer`).
//! Every function returning `*mut c_char` returns null on success or an error message that
//! [`take_error`] turns into a `String` (and frees).
#![allow(unsafe_code)]
// Raw declarations: each is documented where it is defined, in `csrc/`.
#![allow(missing_docs)]

use std::ffi::{CStr, c_char, c_int, c_void};

pub use torch_sys::C_tensor;

pub mod cpu_cache;

/// The shim's c10d process group (a TCPStore and its backend), owned through a pointer.
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct tchtrain_pg {
    _private: [u8; 0],
}

/// The shim's DDP reducer (torch's `c10d::Reducer`), owned through a pointer.
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct tchtrain_reducer {
    _private: [u8; 0],
}

/// The shim's sharded-engine reducer (csrc/shard_reducer.cpp), owned through a pointer.
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct tchtrain_shard_reducer {
    _private: [u8; 0],
}

/// A Rust function a gradient boundary's backward calls with its token: 0 when its action
/// succeeded.
pub type BoundaryFn = unsafe extern "C" fn(u64) -> c_int;

unsafe extern "C" {
    fn tchtrain_free_error(err: *mut c_char);
}

/// The message of a failed call (`Err`), or `Ok` for a null pointer; the message is freed.
///
/// # Safety
/// `err` must be null or a pointer returned by a function of this crate, not yet freed.
pub unsafe fn take_error(err: *mut c_char) -> Result<(), String> {
    if err.is_null() {
        return Ok(());
    }
    // SAFETY: per the contract, a NUL-terminated string malloc'd by the shim, freed once here.
    let message = unsafe { CStr::from_ptr(err) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: as above.
    unsafe { tchtrain_free_error(err) };
    Err(message)
}

// csrc/autocast.cpp, csrc/generator.cpp, csrc/grad_boundary.cpp
unsafe extern "C" {
    pub fn tchtrain_autocast_enter(
        device: c_int,
        dtype: c_int,
        prev_enabled: *mut bool,
        prev_dtype: *mut c_int,
        prev_cache: *mut bool,
    ) -> *mut c_char;
    pub fn tchtrain_autocast_enter_disabled(
        device: c_int,
        prev_enabled: *mut bool,
        prev_dtype: *mut c_int,
        prev_cache: *mut bool,
    ) -> *mut c_char;
    pub fn tchtrain_autocast_exit(
        device: c_int,
        prev_enabled: bool,
        prev_dtype: c_int,
        prev_cache: bool,
    ) -> *mut c_char;
    pub fn tchtrain_get_rng_state(
        device: c_int,
        index: c_int,
        out: *mut *mut C_tensor,
    ) -> *mut c_char;
    pub fn tchtrain_set_rng_state(
        device: c_int,
        index: c_int,
        state: *const C_tensor,
    ) -> *mut c_char;
    pub fn tchtrain_randn_seeded(
        seed: u64,
        shape: *const i64,
        ndim: usize,
        out: *mut *mut C_tensor,
    ) -> *mut c_char;
    pub fn tchtrain_randint_seeded(
        seed: u64,
        low: i64,
        high: i64,
        n: i64,
        out: *mut *mut C_tensor,
    ) -> *mut c_char;
    pub fn tchtrain_grad_boundary(
        x: *const C_tensor,
        token: u64,
        f: BoundaryFn,
        out: *mut *mut C_tensor,
    ) -> *mut c_char;
}

// csrc/dropout.cpp
unsafe extern "C" {
    pub fn tchtrain_dropout_fast_path() -> c_int;
    pub fn tchtrain_dropout_noise_(noise: *mut C_tensor, p: f64) -> *mut c_char;
}

// csrc/backends.cpp
unsafe extern "C" {
    pub fn tchtrain_set_fp32_precision_tf32(on: c_int) -> *mut c_char;
    pub fn tchtrain_cuda_capability_major(index: c_int) -> c_int;
    pub fn tchtrain_cpu_capability_avx512() -> c_int;
    pub fn tchtrain_set_deterministic(on: c_int, warn_only: c_int) -> *mut c_char;
    pub fn tchtrain_deterministic_algorithms() -> c_int;
    pub fn tchtrain_empty_device_cache(device: c_int) -> *mut c_char;
    pub fn tchtrain_device_memory_allocated(
        device: c_int,
        index: c_int,
        current: *mut i64,
        peak: *mut i64,
    ) -> *mut c_char;
    pub fn tchtrain_device_reset_peak_memory_stats(device: c_int, index: c_int) -> *mut c_char;
}

// csrc/checkpoint.cpp
/// Runs a checkpointed layer on `input` (and `extra`, null when there is none): null and a
/// new tensor in `out`, or an error message made by `tchtrain_checkpoint_message`.
pub type LayerFn = unsafe extern "C" fn(
    layer: *mut c_void,
    input: *const C_tensor,
    extra: *const C_tensor,
    out: *mut *mut C_tensor,
) -> *mut c_char;
/// Frees a checkpointed layer's closure.
pub type DropFn = unsafe extern "C" fn(layer: *mut c_void);
unsafe extern "C" {
    pub fn tchtrain_checkpoint_message(message: *const c_char) -> *mut c_char;
    pub fn tchtrain_checkpoint(
        x: *const C_tensor,
        extra: *const C_tensor,
        layer: *mut c_void,
        run: LayerFn,
        drop: DropFn,
        preserve_rng_state: bool,
        offload: bool,
        out: *mut *mut C_tensor,
    ) -> *mut c_char;
}

// csrc/quantized_linear.cpp
/// Runs a quantized linear map's closure: `op` 0 is the forward of `t` (and `bias`, possibly
/// null), `op` 1 the input's gradient from the output's gradient `t`, the input's dtype code
/// `dtype`. Null and a new tensor in `out`, or an error message made by
/// `tchtrain_checkpoint_message`.
pub type QuantizedFn = unsafe extern "C" fn(
    weight: *mut c_void,
    op: c_int,
    t: *const C_tensor,
    bias: *const C_tensor,
    dtype: c_int,
    out: *mut *mut C_tensor,
) -> *mut c_char;
/// Frees a quantized linear map's closure.
pub type QuantizedDropFn = unsafe extern "C" fn(weight: *mut c_void);
unsafe extern "C" {
    pub fn tchtrain_quantized_linear(
        x: *const C_tensor,
        bias: *const C_tensor,
        weight: *mut c_void,
        run: QuantizedFn,
        drop: QuantizedDropFn,
        out: *mut *mut C_tensor,
    ) -> *mut c_char;
}

// csrc/chunked_logprob.cpp
unsafe extern "C" {
    pub fn tchtrain_chunked_logprob(
        hidden: *const C_tensor,
        weight: *const C_tensor,
        bias: *const C_tensor,
        targets: *const C_tensor,
        temperature: f64,
        chunk_size: i64,
        softcap: f64,
        logit_scale: f64,
        want_entropy: bool,
        want_top1: bool,
        want_log_sum_sq: bool,
        want_mean_logits: bool,
        out: *mut *mut C_tensor,
    ) -> *mut c_char;
}

// csrc/cpu_cache.cpp
unsafe extern "C" {
    pub fn tchtrain_cpu_cache_acquire(limit: u64) -> bool;
    pub fn tchtrain_cpu_cache_release();
    pub fn tchtrain_cpu_cache_stats(
        hits: *mut u64,
        misses: *mut u64,
        cached: *mut u64,
        peak_cached: *mut u64,
    );
}

// csrc/optim.cpp
unsafe extern "C" {
    pub fn tchtrain_optim_add_(s: *mut C_tensor, other: *const C_tensor, alpha: f64)
    -> *mut c_char;
    pub fn tchtrain_optim_add(
        s: *const C_tensor,
        other: *const C_tensor,
        alpha: f64,
        out: *mut *mut C_tensor,
    ) -> *mut c_char;
    pub fn tchtrain_optim_addcmul_(
        s: *mut C_tensor,
        t1: *const C_tensor,
        t2: *const C_tensor,
        value: f64,
    ) -> *mut c_char;
    pub fn tchtrain_optim_addcmul(
        s: *const C_tensor,
        t1: *const C_tensor,
        t2: *const C_tensor,
        value: f64,
        out: *mut *mut C_tensor,
    ) -> *mut c_char;
    pub fn tchtrain_optim_addcdiv_(
        s: *mut C_tensor,
        t1: *const C_tensor,
        t2: *const C_tensor,
        value: f64,
    ) -> *mut c_char;
    pub fn tchtrain_optim_set_grad(s: *mut C_tensor, grad: *const C_tensor) -> *mut c_char;
    pub fn tchtrain_optim_vector_norm(
        s: *const C_tensor,
        ord: f64,
        out: *mut *mut C_tensor,
    ) -> *mut c_char;
    pub fn tchtrain_optim_fused_adam(
        params: *const *mut C_tensor,
        grads: *const *mut C_tensor,
        exp_avgs: *const *mut C_tensor,
        exp_avg_sqs: *const *mut C_tensor,
        max_exp_avg_sqs: *const *mut C_tensor,
        state_steps: *const *mut C_tensor,
        n: usize,
        lr: f64,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        eps: f64,
        amsgrad: c_int,
        maximize: c_int,
        decoupled: c_int,
    ) -> *mut c_char;
    pub fn tchtrain_optim_fused_sgd(
        params: *const *mut C_tensor,
        grads: *const *mut C_tensor,
        momentum_buffers: *const *mut C_tensor,
        n: usize,
        weight_decay: f64,
        momentum: f64,
        lr: f64,
        dampening: f64,
        nesterov: c_int,
        maximize: c_int,
        is_first_step: c_int,
    ) -> *mut c_char;
}

// csrc/c10d.cpp
unsafe extern "C" {
    pub fn tchtrain_c10d_new_gloo(
        host: *const c_char,
        port: u16,
        rank: c_int,
        world_size: c_int,
        timeout_ms: i64,
        gloo_interface: *const c_char,
        out: *mut *mut tchtrain_pg,
    ) -> *mut c_char;
    pub fn tchtrain_c10d_has_nccl() -> c_int;
    pub fn tchtrain_c10d_new_nccl(
        host: *const c_char,
        port: u16,
        rank: c_int,
        world_size: c_int,
        timeout_ms: i64,
        device_index: c_int,
        out: *mut *mut tchtrain_pg,
    ) -> *mut c_char;
    pub fn tchtrain_c10d_free(pg: *mut tchtrain_pg);
    pub fn tchtrain_c10d_allreduce(
        pg: *mut tchtrain_pg,
        t: *mut C_tensor,
        op: c_int,
    ) -> *mut c_char;
    pub fn tchtrain_c10d_broadcast(
        pg: *mut tchtrain_pg,
        t: *mut C_tensor,
        root: c_int,
    ) -> *mut c_char;
    pub fn tchtrain_c10d_allgather(
        pg: *mut tchtrain_pg,
        out: *mut C_tensor,
        input: *mut C_tensor,
    ) -> *mut c_char;
    pub fn tchtrain_c10d_reduce_scatter(
        pg: *mut tchtrain_pg,
        out: *mut C_tensor,
        input: *mut C_tensor,
        op: c_int,
    ) -> *mut c_char;
    pub fn tchtrain_c10d_barrier(pg: *mut tchtrain_pg) -> *mut c_char;
}

// csrc/ddp.cpp
unsafe extern "C" {
    pub fn tchtrain_ddp_reducer_new(
        pg: *mut tchtrain_pg,
        params: *const *mut C_tensor,
        n: usize,
        bucket_bytes_cap: i64,
        first_bucket_bytes_cap: i64,
        find_unused_parameters: c_int,
        out: *mut *mut tchtrain_reducer,
        num_buckets: *mut usize,
    ) -> *mut c_char;
    pub fn tchtrain_ddp_reducer_prepare_for_forward(r: *mut tchtrain_reducer) -> *mut c_char;
    pub fn tchtrain_ddp_reducer_rebuild_buckets(
        r: *mut tchtrain_reducer,
        rebuilt: *mut c_int,
    ) -> *mut c_char;
    pub fn tchtrain_ddp_reducer_prepare_for_backward(
        r: *mut tchtrain_reducer,
        outputs: *const *mut C_tensor,
        n: usize,
    ) -> *mut c_char;
    pub fn tchtrain_ddp_reducer_check_finalized(r: *mut tchtrain_reducer) -> *mut c_char;
    pub fn tchtrain_ddp_reducer_num_buckets(r: *mut tchtrain_reducer) -> usize;
    pub fn tchtrain_ddp_reducer_free(r: *mut tchtrain_reducer);
}

// csrc/shard_reducer.cpp
unsafe extern "C" {
    pub fn tchtrain_shard_reducer_new(
        pg: *mut tchtrain_pg,
        params: *const *mut C_tensor,
        n: usize,
        bucket_bytes: i64,
        pre: f64,
        post: f64,
        op: c_int,
        average: c_int,
        kind: c_int,
        out: *mut *mut tchtrain_shard_reducer,
        num_buckets: *mut usize,
    ) -> *mut c_char;
    pub fn tchtrain_shard_reducer_arm(r: *mut tchtrain_shard_reducer) -> *mut c_char;
    pub fn tchtrain_shard_reducer_finish(
        r: *mut tchtrain_shard_reducer,
        started_in_backward: *mut usize,
    ) -> *mut c_char;
    pub fn tchtrain_shard_reducer_free(r: *mut tchtrain_shard_reducer);
}

//! The safe Rust face of `tchtrain-sys`'s `csrc/c10d.cpp`. This is the only module that sees raw
//! pointers: a [`RawGroup`] owns the shim's `tchtrain_pg*` and frees it on drop; each call
//! lends libtorch the tensors for its duration; C++ exceptions come back as `Err(String)`.
#![allow(unsafe_code)]

use std::ffi::{CString, c_char};

use tch::Tensor;
use tchtrain_sys::*;

/// Turns the shim's error pointer into a `Result`, freeing the message.
fn check(err: *mut c_char) -> Result<(), String> {
    // SAFETY: `err` is what a shim function just returned.
    unsafe { tchtrain_sys::take_error(err) }
}

/// Whether the shim was compiled with NCCL (the `cuda` feature).
pub(crate) fn has_nccl() -> bool {
    // SAFETY: a constant query with no arguments.
    unsafe { tchtrain_c10d_has_nccl() != 0 }
}

/// An owned c10d process group, Gloo or NCCL (and its TCPStore).
#[derive(Debug)]
pub(crate) struct RawGroup {
    ptr: *mut tchtrain_pg,
}

// SAFETY: c10d process groups are used from one thread at a time through `&mut self`
// (collectives) and are safe to move between threads.
unsafe impl Send for RawGroup {}

impl RawGroup {
    /// TCPStore rendezvous at `host:port` (rank 0 serves it), then a Gloo group.
    pub(crate) fn new_gloo(
        host: &str,
        port: u16,
        rank: i32,
        world: i32,
        timeout_ms: i64,
        iface: Option<&str>,
    ) -> Result<Self, String> {
        let host = CString::new(host).map_err(|_| "host contains a NUL byte".to_string())?;
        let iface = CString::new(iface.unwrap_or(""))
            .map_err(|_| "GLOO_SOCKET_IFNAME contains a NUL byte".to_string())?;
        let mut ptr: *mut tchtrain_pg = std::ptr::null_mut();
        // SAFETY: valid C strings for the call's duration; `ptr` is written only on success.
        check(unsafe {
            tchtrain_c10d_new_gloo(
                host.as_ptr(),
                port,
                rank,
                world,
                timeout_ms,
                iface.as_ptr(),
                &mut ptr,
            )
        })?;
        Ok(Self { ptr })
    }

    /// TCPStore rendezvous at `host:port`, then an NCCL group on CUDA device `device`.
    pub(crate) fn new_nccl(
        host: &str,
        port: u16,
        rank: i32,
        world: i32,
        timeout_ms: i64,
        device: i32,
    ) -> Result<Self, String> {
        let host = CString::new(host).map_err(|_| "host contains a NUL byte".to_string())?;
        let mut ptr: *mut tchtrain_pg = std::ptr::null_mut();
        // SAFETY: a valid C string for the call's duration; `ptr` is written only on success.
        check(unsafe {
            tchtrain_c10d_new_nccl(
                host.as_ptr(),
                port,
                rank,
                world,
                timeout_ms,
                device,
                &mut ptr,
            )
        })?;
        Ok(Self { ptr })
    }

    pub(crate) fn all_reduce(&mut self, t: &mut Tensor, op: i32) -> Result<(), String> {
        // SAFETY: `self.ptr` is live; the tensor is borrowed mutably for the call.
        check(unsafe { tchtrain_c10d_allreduce(self.ptr, t.as_mut_ptr(), op) })
    }

    pub(crate) fn broadcast(&mut self, t: &mut Tensor, root: i32) -> Result<(), String> {
        // SAFETY: as above.
        check(unsafe { tchtrain_c10d_broadcast(self.ptr, t.as_mut_ptr(), root) })
    }

    pub(crate) fn all_gather(&mut self, out: &mut Tensor, input: &Tensor) -> Result<(), String> {
        // SAFETY: as above; the input is only read by libtorch (the shim takes a non-const
        // pointer because c10d's signature does).
        check(unsafe {
            tchtrain_c10d_allgather(self.ptr, out.as_mut_ptr(), input.as_ptr() as *mut C_tensor)
        })
    }

    pub(crate) fn reduce_scatter(
        &mut self,
        out: &mut Tensor,
        input: &Tensor,
        op: i32,
    ) -> Result<(), String> {
        // SAFETY: as above.
        check(unsafe {
            tchtrain_c10d_reduce_scatter(
                self.ptr,
                out.as_mut_ptr(),
                input.as_ptr() as *mut C_tensor,
                op,
            )
        })
    }

    pub(crate) fn barrier(&mut self) -> Result<(), String> {
        // SAFETY: `self.ptr` is live.
        check(unsafe { tchtrain_c10d_barrier(self.ptr) })
    }
}

/// An owned DDP reducer (torch's `c10d::Reducer`) over some parameters of a [`RawGroup`]; it
/// keeps the group's backend alive on its own.
#[derive(Debug)]
pub(crate) struct RawReducer {
    ptr: *mut tchtrain_reducer,
}

// SAFETY: the reducer is driven from one thread at a time through `&self` between
// backwards (its hooks run inside the backward of that thread's tensors), and its state
// sits behind the reducer's own mutex.
unsafe impl Send for RawReducer {}
// SAFETY: as above; every shim call takes the reducer's mutex.
unsafe impl Sync for RawReducer {}

impl RawReducer {
    /// A reducer over `params`; also returns the first iteration's bucket count.
    pub(crate) fn new(
        group: &mut RawGroup,
        params: &[Tensor],
        bucket_bytes_cap: i64,
        first_bucket_bytes_cap: i64,
        find_unused_parameters: bool,
    ) -> Result<(Self, usize), String> {
        let ptrs: Vec<*mut C_tensor> = params.iter().map(|t| t.as_ptr() as *mut C_tensor).collect();
        let mut ptr: *mut tchtrain_reducer = std::ptr::null_mut();
        let mut buckets = 0usize;
        // SAFETY: the group and the tensors are live for the call; the shim copies the
        // tensor handles; `ptr` and `buckets` are written only on success.
        check(unsafe {
            tchtrain_ddp_reducer_new(
                group.ptr,
                ptrs.as_ptr(),
                ptrs.len(),
                bucket_bytes_cap,
                first_bucket_bytes_cap,
                i32::from(find_unused_parameters),
                &mut ptr,
                &mut buckets,
            )
        })?;
        Ok((Self { ptr }, buckets))
    }

    pub(crate) fn prepare_for_forward(&self) -> Result<(), String> {
        // SAFETY: `self.ptr` is live.
        check(unsafe { tchtrain_ddp_reducer_prepare_for_forward(self.ptr) })
    }

    pub(crate) fn rebuild_buckets(&self) -> Result<bool, String> {
        let mut rebuilt = 0;
        // SAFETY: `self.ptr` is live; `rebuilt` is written on success.
        check(unsafe { tchtrain_ddp_reducer_rebuild_buckets(self.ptr, &mut rebuilt) })?;
        Ok(rebuilt != 0)
    }

    pub(crate) fn prepare_for_backward(&self, outputs: &[&Tensor]) -> Result<(), String> {
        let ptrs: Vec<*mut C_tensor> = outputs
            .iter()
            .map(|t| t.as_ptr() as *mut C_tensor)
            .collect();
        // SAFETY: the tensors are live for the call; the shim copies their handles.
        check(unsafe {
            tchtrain_ddp_reducer_prepare_for_backward(self.ptr, ptrs.as_ptr(), ptrs.len())
        })
    }

    pub(crate) fn check_finalized(&self) -> Result<(), String> {
        // SAFETY: `self.ptr` is live.
        check(unsafe { tchtrain_ddp_reducer_check_finalized(self.ptr) })
    }

    pub(crate) fn num_buckets(&self) -> usize {
        // SAFETY: `self.ptr` is live.
        unsafe { tchtrain_ddp_reducer_num_buckets(self.ptr) }
    }
}

/// An owned `tchtrain_shard_reducer*` (csrc/shard_reducer.cpp).
#[derive(Debug)]
pub(crate) struct RawShardReducer {
    ptr: *mut tchtrain_shard_reducer,
}

// SAFETY: as `RawReducer`: driven from one thread at a time, its hooks run inside that
// thread's backward, and its state sits behind its own mutex.
unsafe impl Send for RawShardReducer {}
// SAFETY: as above; every shim call takes the reducer's mutex.
unsafe impl Sync for RawShardReducer {}

impl RawShardReducer {
    /// A reducer over `params` with the reduction's numbers (`kind`: c10's ScalarType or
    /// -1); also returns its number of buckets.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        group: &mut RawGroup,
        params: &[Tensor],
        bucket_bytes: i64,
        pre: f64,
        post: f64,
        op: i32,
        average: bool,
        kind: i32,
    ) -> Result<(Self, usize), String> {
        let ptrs: Vec<*mut C_tensor> = params.iter().map(|t| t.as_ptr() as *mut C_tensor).collect();
        let mut ptr: *mut tchtrain_shard_reducer = std::ptr::null_mut();
        let mut buckets = 0usize;
        // SAFETY: the group and the tensors are live for the call; the shim copies the
        // tensor handles; `ptr` and `buckets` are written only on success.
        check(unsafe {
            tchtrain_shard_reducer_new(
                group.ptr,
                ptrs.as_ptr(),
                ptrs.len(),
                bucket_bytes,
                pre,
                post,
                op,
                i32::from(average),
                kind,
                &mut ptr,
                &mut buckets,
            )
        })?;
        Ok((Self { ptr }, buckets))
    }

    pub(crate) fn arm(&self) -> Result<(), String> {
        // SAFETY: `self.ptr` is live.
        check(unsafe { tchtrain_shard_reducer_arm(self.ptr) })
    }

    /// Returns how many buckets had started during the backward.
    pub(crate) fn finish(&self) -> Result<usize, String> {
        let mut started = 0usize;
        // SAFETY: `self.ptr` is live; `started` is written on success.
        check(unsafe { tchtrain_shard_reducer_finish(self.ptr, &mut started) })?;
        Ok(started)
    }
}

impl Drop for RawShardReducer {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `tchtrain_shard_reducer_new` and is freed once.
        unsafe { tchtrain_shard_reducer_free(self.ptr) };
    }
}

impl Drop for RawReducer {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `tchtrain_ddp_reducer_new` and is freed once.
        unsafe { tchtrain_ddp_reducer_free(self.ptr) };
    }
}

impl Drop for RawGroup {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `tchtrain_c10d_new_gloo` / `_new_nccl` and is freed once.
        unsafe { tchtrain_c10d_free(self.ptr) };
    }
}

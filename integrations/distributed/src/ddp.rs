//! `DistributedDataParallel`'s gradient contract: parameters broadcast from rank 0 at
//! construction, gradients averaged across ranks by torch's own reducer during the backward
//! (bucket all-reduces overlapped with the rest of the backward, buckets rebuilt in the
//! gradients' ready order after the first iteration), or after a backward it was not
//! prepared for, in buckets of `bucket_cap_mb` flattened into one buffer per all-reduce.

use tch::Tensor;

use crate::ffi::RawReducer;
use crate::process_group::{ProcessGroup, ReduceOp};

/// `param.grad = grad` (tch has no setter): the gradient lives on the `TensorImpl` every
/// handle shares.
#[allow(unsafe_code)]
fn set_grad(param: &Tensor, grad: &Tensor) -> Result<()> {
    let mut handle = param.shallow_clone();
    // SAFETY: both tensors are live for the call; the shim copies the handle of `grad`.
    let err = unsafe { tchtrain_sys::tchtrain_optim_set_grad(handle.as_mut_ptr(), grad.as_ptr()) };
    // SAFETY: the shim's result, freed by `take_error`.
    unsafe { tchtrain_sys::take_error(err) }
        .map_err(|detail| Error::InvalidTensor { op: "ddp", detail })
}
use crate::{Error, Result};

/// Upstream's default `ddp_bucket_cap_mb`.
pub const DEFAULT_BUCKET_CAP_MB: f64 = 25.0;

/// DDP's `_DEFAULT_FIRST_BUCKET_BYTES`: the first bucket's cap when `bucket_cap_mb` is not
/// given (the last layers' gradients, ready first, start their all-reduce early).
pub const DEFAULT_FIRST_BUCKET_BYTES: i64 = 1024 * 1024;

/// Gradient synchronisation for a fixed list of parameters.
#[derive(Debug)]
pub struct DistributedDataParallel {
    params: Vec<Tensor>,
    /// Indices into `params`, grouped so that each bucket is at most the cap (a parameter
    /// larger than the cap gets a bucket of its own), in reverse order: the buckets of
    /// [`all_reduce_gradients`](Self::all_reduce_gradients), the reduction after a backward
    /// the reducer was not prepared for.
    buckets: Vec<Vec<usize>>,
    /// DDP's `find_unused_parameters`: a parameter without a gradient on a rank takes part
    /// as zeros (else it is an error naming it).
    find_unused_parameters: bool,
    /// Torch's reducer, whose hooks reduce the buckets during a prepared backward.
    reducer: RawReducer,
}

impl DistributedDataParallel {
    /// `DistributedDataParallel(module, bucket_cap_mb=, find_unused_parameters=)`: broadcasts
    /// every parameter from rank 0 (so all ranks start equal) and builds torch's reducer over
    /// them, its hooks on every parameter's gradient accumulator. `bucket_cap_mb` `None` is
    /// DDP's default: 25 MiB buckets after a first one of 1 MiB; given, every bucket takes
    /// it. `parameters` are leaves that require grad, on one device.
    pub fn new(
        pg: &mut ProcessGroup,
        params: Vec<Tensor>,
        bucket_cap_mb: Option<f64>,
        find_unused_parameters: bool,
    ) -> Result<Self> {
        let mb = bucket_cap_mb.unwrap_or(DEFAULT_BUCKET_CAP_MB);
        if mb.is_nan() || mb <= 0.0 {
            return Err(Error::InvalidTensor {
                op: "ddp",
                detail: format!("bucket_cap_mb must be positive, got {mb}"),
            });
        }
        // `_BucketCapacityConfig.create`: int(bucket_cap_mb * 2**20), the first bucket 1 MiB
        // only with the default.
        let cap = (mb * 1024.0 * 1024.0) as i64;
        let first = if bucket_cap_mb.is_none() {
            DEFAULT_FIRST_BUCKET_BYTES
        } else {
            cap
        };
        tch::no_grad(|| -> Result<()> {
            for p in &params {
                let mut data = p.f_detach()?;
                pg.broadcast(&mut data, 0)?;
            }
            Ok(())
        })?;
        let (reducer, _) =
            RawReducer::new(pg.raw_mut(), &params, cap, first, find_unused_parameters)
                .map_err(|detail| Error::InvalidTensor { op: "ddp", detail })?;
        let cap = usize::try_from(cap).unwrap_or(usize::MAX);
        let mut buckets: Vec<Vec<usize>> = Vec::new();
        let mut current: Vec<usize> = Vec::new();
        let mut bytes = 0usize;
        let mut kind = None;
        for i in (0..params.len()).rev() {
            let p = &params[i];
            let size = p.numel() * p.kind().elt_size_in_bytes();
            let same_kind = kind.is_none_or(|k| k == p.kind());
            if !current.is_empty() && (bytes + size > cap || !same_kind) {
                buckets.push(std::mem::take(&mut current));
                bytes = 0;
            }
            kind = Some(p.kind());
            current.push(i);
            bytes += size;
        }
        if !current.is_empty() {
            buckets.push(current);
        }
        Ok(Self {
            params,
            buckets,
            find_unused_parameters,
            reducer,
        })
    }

    /// The reducer's current number of buckets: one until the first synchronised backward
    /// (without `find_unused_parameters`), then as rebuilt in the gradients' ready order.
    pub fn num_buckets(&self) -> usize {
        self.reducer.num_buckets()
    }

    /// What DDP's forward does around the model before a backward: `_pre_forward` (when
    /// `require_backward_grad_sync`, the reducer's iteration; on every forward with grad,
    /// the one bucket rebuild, a collective, after the first synchronised backward) and
    /// `_post_forward` (when `require_backward_grad_sync`, the reducer armed: with
    /// `find_unused_parameters` the graph searched from `outputs` for the parameters it does
    /// not reach). Every rank calls it before each backward, with the same `sync`; with
    /// `sync` the backward then reduces the buckets as their gradients become ready, and
    /// [`finish_backward`](Self::finish_backward) checks after it that every bucket was.
    pub fn prepare_for_backward(&self, outputs: &[&Tensor], sync: bool) -> Result<()> {
        let reducer_error = |detail: String| Error::InvalidTensor { op: "ddp", detail };
        if sync {
            self.reducer.prepare_for_forward().map_err(reducer_error)?;
        }
        self.reducer.rebuild_buckets().map_err(reducer_error)?;
        if sync {
            let outputs = if self.find_unused_parameters {
                outputs
            } else {
                &[]
            };
            self.reducer
                .prepare_for_backward(outputs)
                .map_err(reducer_error)?;
        }
        Ok(())
    }

    /// After a backward prepared with `sync`: the reducer's check that every bucket was
    /// reduced (torch's message naming the parameters that got no gradient, and
    /// `find_unused_parameters`, when some did not).
    pub fn finish_backward(&self) -> Result<()> {
        self.reducer
            .check_finalized()
            .map_err(|detail| Error::InvalidTensor {
                op: "ddp",
                detail: format!("the backward left buckets unreduced: some parameters took no part in the loss; set ddp_find_unused_parameters=True (DDP's find_unused_parameters) when some go unused. Torch's reducer: {detail}"),
            })
    }

    /// The reduction after a backward the reducer was not prepared for (a loss whose
    /// `backward()` was called directly): every gradient averaged across ranks (sum, then
    /// divide by world size), one flattened all-reduce per bucket of `bucket_cap_mb`. Every
    /// parameter must have a gradient unless `find_unused_parameters`.
    pub fn all_reduce_gradients(&self, pg: &mut ProcessGroup) -> Result<()> {
        tch::no_grad(|| -> Result<()> {
            // With find_unused_parameters: which parameters some rank used (one MAX
            // all-reduce of a flag per parameter).
            let used_anywhere: Option<Vec<bool>> = if self.find_unused_parameters {
                let flags: Vec<f32> = self
                    .params
                    .iter()
                    .map(|p| if p.grad().defined() { 1.0 } else { 0.0 })
                    .collect();
                let mut flags = Tensor::from_slice(&flags).f_to_device(self.device())?;
                pg.all_reduce(&mut flags, ReduceOp::Max)?;
                let flags = Vec::<f32>::try_from(flags.f_to_device(tch::Device::Cpu)?)?;
                Some(flags.into_iter().map(|f| f > 0.0).collect())
            } else {
                None
            };
            for bucket in &self.buckets {
                let grads: Vec<Tensor> = bucket
                    .iter()
                    .map(|&i| {
                        let p = &self.params[i];
                        let g = p.grad();
                        if g.defined() {
                            return Ok(g.f_flatten(0, -1)?);
                        }
                        if used_anywhere.is_some() {
                            return Ok(Tensor::f_zeros([p.numel() as i64], (p.kind(), p.device()))?);
                        }
                        Err(Error::InvalidTensor {
                            op: "ddp",
                            detail: format!("parameter {i} has no gradient on this rank: it took no part in the loss; set ddp_find_unused_parameters=True (DDP's find_unused_parameters) when some parameters go unused"),
                        })
                    })
                    .collect::<Result<_>>()?;
                let mut flat = Tensor::f_cat(&grads, 0)?;
                pg.all_reduce(&mut flat, ReduceOp::Avg)?;
                let mut offset = 0i64;
                for &i in bucket {
                    let p = &self.params[i];
                    let n = p.numel() as i64;
                    let chunk = flat.f_narrow(0, offset, n)?.f_view_as(p)?;
                    let mut g = p.grad();
                    if g.defined() {
                        g.f_copy_(&chunk)?;
                    } else if used_anywhere.as_ref().is_some_and(|u| u[i]) {
                        let mut fresh = chunk.f_zeros_like()?;
                        fresh.f_copy_(&chunk)?;
                        set_grad(p, &fresh)?;
                    }
                    offset += n;
                }
            }
            Ok(())
        })
    }

    /// The device of the parameters (the first one's; the CPU when there are none).
    fn device(&self) -> tch::Device {
        self.params.first().map_or(tch::Device::Cpu, Tensor::device)
    }
}

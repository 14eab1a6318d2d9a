//! `DistributedDataParallel`'s gradient contract: parameters broadcast from rank 0 at
//! construction, gradients averaged across ranks after backward, in buckets of
//! `bucket_cap_mb` (upstream default 25 MB) flattened into one buffer per all-reduce.

use tch::Tensor;

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

/// Gradient synchronisation for a fixed list of parameters.
#[derive(Debug)]
pub struct DistributedDataParallel {
    params: Vec<Tensor>,
    /// Indices into `params`, grouped so that each bucket is at most the cap (a parameter
    /// larger than the cap gets a bucket of its own). Built in reverse order, as DDP does,
    /// so the last layers (whose gradients are ready first) come first.
    buckets: Vec<Vec<usize>>,
    /// DDP's `find_unused_parameters`: a parameter without a gradient on a rank takes part
    /// as zeros (else it is an error naming it).
    find_unused_parameters: bool,
}

impl DistributedDataParallel {
    /// Broadcasts every parameter from rank 0 (so all ranks start equal) and plans buckets.
    pub fn new(pg: &mut ProcessGroup, params: Vec<Tensor>, bucket_cap_mb: f64) -> Result<Self> {
        if bucket_cap_mb.is_nan() || bucket_cap_mb <= 0.0 {
            return Err(Error::InvalidTensor {
                op: "ddp",
                detail: format!("bucket_cap_mb must be positive, got {bucket_cap_mb}"),
            });
        }
        let cap = (bucket_cap_mb * 1024.0 * 1024.0) as usize;
        tch::no_grad(|| -> Result<()> {
            for p in &params {
                let mut data = p.f_detach()?;
                pg.broadcast(&mut data, 0)?;
            }
            Ok(())
        })?;
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
            find_unused_parameters: false,
        })
    }

    /// DDP's `find_unused_parameters=True`: a parameter this rank's backward did not reach
    /// counts as a zero gradient in the average; it gets the averaged gradient when another
    /// rank used it, and keeps none when no rank did (as torch's reducer leaves it).
    pub fn find_unused_parameters(mut self, find: bool) -> Self {
        self.find_unused_parameters = find;
        self
    }

    /// Number of buckets (one all-reduce each).
    pub fn num_buckets(&self) -> usize {
        self.buckets.len()
    }

    /// Averages every gradient across ranks (sum, then divide by world size), one
    /// flattened all-reduce per bucket. Every parameter must have a gradient.
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

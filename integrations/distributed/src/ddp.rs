//! `DistributedDataParallel`'s gradient contract: parameters broadcast from rank 0 at
//! construction, gradients averaged across ranks after backward, in buckets of
//! `bucket_cap_mb` (upstream default 25 MB) flattened into one buffer per all-reduce.

use tch::Tensor;

use crate::process_group::{ProcessGroup, ReduceOp};
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
        Ok(Self { params, buckets })
    }

    /// Number of buckets (one all-reduce each).
    pub fn num_buckets(&self) -> usize {
        self.buckets.len()
    }

    /// Averages every gradient across ranks (sum, then divide by world size), one
    /// flattened all-reduce per bucket. Every parameter must have a gradient.
    pub fn all_reduce_gradients(&self, pg: &mut ProcessGroup) -> Result<()> {
        tch::no_grad(|| -> Result<()> {
            for bucket in &self.buckets {
                let grads: Vec<Tensor> = bucket
                    .iter()
                    .map(|&i| {
                        let p = &self.params[i];
                        let g = p.grad();
                        if !g.defined() {
                            return Err(Error::InvalidTensor {
                                op: "ddp",
                                detail: format!("parameter {i} has no gradient on this rank: run backward first (unused parameters are not supported, as DDP's default find_unused_parameters=False)"),
                            });
                        }
                        Ok(g.f_flatten(0, -1)?)
                    })
                    .collect::<Result<_>>()?;
                let mut flat = Tensor::f_cat(&grads, 0)?;
                pg.all_reduce(&mut flat, ReduceOp::Avg)?;
                let mut offset = 0i64;
                for &i in bucket {
                    let p = &self.params[i];
                    let n = p.numel() as i64;
                    let mut g = p.grad();
                    let chunk = flat.f_narrow(0, offset, n)?.f_view_as(p)?;
                    g.f_copy_(&chunk)?;
                    offset += n;
                }
            }
            Ok(())
        })
    }
}

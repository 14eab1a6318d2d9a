//! The gradient reduction of a sharded engine's stages 1 and 2 (DeepSpeed's ZeRO-1 / 2,
//! FSDP's `SHARD_GRAD_OP`) overlapped with the backward, as DeepSpeed reduces
//! `reduce_bucket_size` buckets from its gradient hooks: a bucket's all-reduce starts as
//! soon as its last gradient is accumulated, while the backward goes on. The arithmetic is
//! the engine's own ([`BucketReduction`]), so each element is the same sum as a reduction
//! after the backward; the buffers live only until [`ShardReducer::finish`] (nothing the
//! size of the gradients is kept between steps). The C++ side is `csrc/shard_reducer.cpp`.

use tch::{Kind, Tensor};

use crate::ffi::RawShardReducer;
use crate::process_group::{ProcessGroup, ReduceOp};
use crate::{Error, Result};

/// How a bucket is reduced: cast to `kind`, divided by `pre_divide`, all-reduced with
/// `op` (an average as a sum, then a division by the world size), divided by
/// `post_divide`, and written back into the gradients in their own dtype.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketReduction {
    /// The divisor before the sum (`None`: none).
    pub pre_divide: Option<f64>,
    /// The divisor after it (`None`: none).
    pub post_divide: Option<f64>,
    /// The collective's operation.
    pub op: ReduceOp,
    /// The dtype the bucket is reduced in (`None`: the gradients' own). Writing the result
    /// back must be exact (the gradients' dtype at least as wide), which
    /// [`ShardReducer::new`] checks.
    pub kind: Option<Kind>,
}

/// Whether every value of `from` is exactly a value of `to`.
fn widens_exactly(from: Kind, to: Kind) -> bool {
    from == to
        || to == Kind::Double
        || (to == Kind::Float && matches!(from, Kind::Half | Kind::BFloat16))
}

/// c10's `ScalarType` number of a floating kind.
fn scalar_type(kind: Kind) -> Result<i32> {
    Ok(match kind {
        Kind::Half => 5,
        Kind::Float => 6,
        Kind::Double => 7,
        Kind::BFloat16 => 15,
        other => {
            return Err(Error::InvalidTensor {
                op: "shard_reducer",
                detail: format!("gradients cannot be reduced in {other:?}"),
            });
        }
    })
}

/// The overlapped reduction over a fixed list of parameters (see the module docs).
#[derive(Debug)]
pub struct ShardReducer {
    raw: RawShardReducer,
    num_buckets: usize,
    rank: i32,
}

impl ShardReducer {
    /// Hooks every parameter of `params` (leaves that require grad, one device, equal on
    /// every rank) and cuts them into buckets of at most `bucket_bytes` (one dtype each,
    /// in reverse order; a larger parameter alone), the same on every rank. Every rank
    /// builds it, with the same parameters in the same order.
    pub fn new(
        pg: &mut ProcessGroup,
        params: &[Tensor],
        bucket_bytes: i64,
        reduction: BucketReduction,
    ) -> Result<Self> {
        if bucket_bytes <= 0 {
            return Err(Error::InvalidTensor {
                op: "shard_reducer",
                detail: format!("the bucket size must be positive, got {bucket_bytes} bytes"),
            });
        }
        let kind = match reduction.kind {
            None => -1,
            Some(k) => {
                if let Some(p) = params.iter().find(|p| !widens_exactly(k, p.kind())) {
                    return Err(Error::InvalidTensor {
                        op: "shard_reducer",
                        detail: format!(
                            "gradients of {:?} reduced in {k:?} would be rounded when written back; reduce them after the backward",
                            p.kind()
                        ),
                    });
                }
                scalar_type(k)?
            }
        };
        let (raw, num_buckets) = RawShardReducer::new(
            pg.raw_mut(),
            params,
            bucket_bytes,
            reduction.pre_divide.unwrap_or(1.0),
            reduction.post_divide.unwrap_or(1.0),
            reduction.op.code(),
            reduction.op == ReduceOp::Avg,
            kind,
        )
        .map_err(|detail| Error::InvalidTensor {
            op: "shard_reducer",
            detail,
        })?;
        Ok(Self {
            raw,
            num_buckets,
            rank: pg.rank(),
        })
    }

    /// Whether gradients of `grad` reduced in `kind` can be written back exactly (the
    /// condition [`Self::new`] checks).
    pub fn writes_back_exactly(kind: Kind, grad: Kind) -> bool {
        widens_exactly(kind, grad)
    }

    /// The number of buckets.
    pub fn num_buckets(&self) -> usize {
        self.num_buckets
    }

    /// Before a backward that ends an accumulation window (every rank): its buckets are
    /// reduced as their gradients become ready.
    pub fn arm(&self) -> Result<()> {
        self.raw.arm().map_err(|detail| Error::InvalidTensor {
            op: "shard_reducer",
            detail,
        })
    }

    /// After the armed backward (every rank): the buckets not started yet (those after a
    /// parameter that got no gradient on this rank) are started, all are waited for, and
    /// the reduced values written into the gradients (created for a parameter that had
    /// none). Returns how many buckets had started during the backward.
    pub fn finish(&self) -> Result<usize> {
        self.raw.finish().map_err(|message| Error::Collective {
            op: "shard_reducer",
            rank: self.rank,
            message,
        })
    }
}

//! FSDP's mixed-precision policy: torch 2.13's `MixedPrecisionPolicy` (FSDP2,
//! `torch/distributed/fsdp/_fully_shard/_fsdp_api.py`) and FSDP1's `MixedPrecision`
//! `buffer_dtype`, as accelerate's `FullyShardedDataParallelPlugin.set_mixed_precision`
//! builds them from `--bf16` / `--fp16`, and the gradient divide factors of FSDP2's
//! reduce-scatter (`_get_gradient_divide_factors`, `_fsdp_collectives.py`).
//!
//! | upstream | here |
//! |---|---|
//! | `set_mixed_precision("bf16")` (FSDP2): `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16, output_dtype=bf16)` | [`MixedPrecisionPolicy::for_dtype`] with `fsdp_version` 2 |
//! | FSDP1: `MixedPrecision(param_dtype=, reduce_dtype=, buffer_dtype=)` | [`MixedPrecisionPolicy::for_dtype`] with `fsdp_version` 1 (`buffer_dtype`, no `output_dtype`) |
//! | `_get_gradient_divide_factors(group, None, reduce_dtype)` | [`GradientDivideFactors::fsdp2`] |
//!
//! What the engine does with it ([`crate::ZeroEngine::set_mp_policy`]): the sharded
//! parameters stay float32 (the optimizer's), each all-gather casts them to `param_dtype`
//! and the model computes with those; the unsharded gradients (`param_dtype`) are cast to
//! `reduce_dtype`, reduce-scattered with the divide factors, and cast back to float32 for
//! the sharded gradients. The [`crate::Accelerator`] casts the model's floating outputs to
//! `output_dtype` after accelerate's `convert_outputs_to_fp32` (FSDP2's post-forward hook
//! runs after the forward accelerate wrapped), so the loss the Trainer sees is in
//! `output_dtype`.

use tch::Kind;

use crate::error::{Error, Result};
use tchtrain_distributed::ReduceOp;

/// torch's FSDP2 `MixedPrecisionPolicy` (with FSDP1's `buffer_dtype`): `None` keeps the
/// parameter's own dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MixedPrecisionPolicy {
    /// The dtype the parameters are all-gathered and computed in.
    pub param_dtype: Option<Kind>,
    /// The dtype the gradients are reduced in.
    pub reduce_dtype: Option<Kind>,
    /// FSDP2: the dtype the root module's floating outputs are cast to.
    pub output_dtype: Option<Kind>,
    /// FSDP1: the dtype the model's floating buffers are cast to.
    pub buffer_dtype: Option<Kind>,
}

impl MixedPrecisionPolicy {
    /// accelerate's `set_mixed_precision(mixed_precision)` for an FSDP plugin of
    /// `fsdp_version`: `"bf16"` / `"fp16"` / `"fp32"` give the policy of that dtype
    /// (`buffer_autocast=False`); `"no"` gives none.
    pub fn for_dtype(mixed_precision: &str, fsdp_version: i64) -> Result<Option<Self>> {
        let dtype = match mixed_precision {
            "no" => return Ok(None),
            "bf16" | "fp8" => Kind::BFloat16,
            "fp16" => Kind::Half,
            "fp32" => Kind::Float,
            other => {
                return Err(Error::InvalidConfig {
                    key: "mixed_precision".into(),
                    value: other.into(),
                    fix: "use one of fp8, fp16, bf16, fp32",
                });
            }
        };
        Ok(Some(if fsdp_version == 1 {
            Self {
                param_dtype: Some(dtype),
                reduce_dtype: Some(dtype),
                output_dtype: None,
                buffer_dtype: Some(dtype),
            }
        } else {
            Self {
                param_dtype: Some(dtype),
                reduce_dtype: Some(dtype),
                output_dtype: Some(dtype),
                buffer_dtype: None,
            }
        }))
    }
}

/// How a reduce-scatter averages the gradients over `world_size` ranks: divided by
/// `pre` before the collective, reduced with `op`, divided by `post` after.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradientDivideFactors {
    /// Divisor applied to every rank's gradients before the reduction.
    pub pre: Option<f64>,
    /// Divisor applied to the reduced result.
    pub post: Option<f64>,
    /// The collective's reduction.
    pub op: ReduceOp,
}

impl GradientDivideFactors {
    /// FSDP2's `_get_gradient_divide_factors` for a reduce-scatter over `world_size` ranks
    /// in `reduce_dtype` (no HSDP, no custom factor): float32 and bfloat16 reduce with
    /// `AVG` (a sum with one division where the backend has no average); float16, which
    /// could overflow, is divided by about the square root of the world size before the
    /// sum and by the rest after.
    pub fn fsdp2(world_size: i64, reduce_dtype: Kind) -> Self {
        let overflow_risk = !matches!(reduce_dtype, Kind::Float | Kind::BFloat16);
        if !overflow_risk {
            let op = if world_size == 1 {
                ReduceOp::Sum
            } else {
                ReduceOp::Avg
            };
            return Self {
                pre: None,
                post: None,
                op,
            };
        }
        let factor = world_size as f64;
        let mut pre = 1.0f64;
        while factor % pre == 0.0 && factor / pre > pre {
            pre *= 2.0;
        }
        Self {
            pre: Some(pre),
            post: Some(factor / pre),
            op: ReduceOp::Sum,
        }
    }
}

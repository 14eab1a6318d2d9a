//! Upstream `initialization.py` and `from_pretrained`'s `_initialize_missing_keys`: the
//! weights a checkpoint lacks (a new head on a pretrained body, sizes refused with
//! `ignore_mismatched_sizes`) are drawn from the global generator with each module's
//! `_init_weights`, in module order, and nothing else is drawn: after `set_seed(42)`,
//! `from_pretrained(..., num_labels=2)` gives MiniLM's classifier exactly
//! `torch.empty(2, 384).normal_(0, 0.02)` and leaves the generator right after it.
//!
//! A model's constructor draws every weight (upstream's `Model(config)`). `from_pretrained`
//! builds it with a [`Context::deferred`](crate::Context::deferred) instead: each variable
//! is created without drawing (its constant, or zeros for a random init) and its init is
//! recorded; once the checkpoint is loaded, [`initialize_missing`] applies the recorded
//! init to the missing variables only, in creation order (which is upstream's
//! registration order).

use tch::Tensor;
use tch::nn::{Init, VarStore};

use crate::error::{Error, Result};
use crate::path::Path;

/// Upstream `_init_weights` for Linear / Conv1D / Embedding: `normal(0, initializer_range)`.
pub fn normal(std: f64) -> Init {
    Init::Randn {
        mean: 0.0,
        stdev: std,
    }
}

/// A variable's upstream initialisation: its init, for an embedding with a `padding_idx`
/// the row `_init_weights` zeroes after the draw, and a truncated normal a model's own
/// `_init_weights` draws after the generic one (ModernBERT's).
#[derive(Debug, Clone, Copy)]
pub struct VarInit {
    /// The init.
    pub init: Init,
    /// The row zeroed after the draw.
    pub zero_row: Option<i64>,
    /// A truncated normal drawn after.
    pub trunc_normal: Option<TruncNormal>,
}

/// `init.trunc_normal_(mean, std, a, b)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TruncNormal {
    /// `mean`.
    pub mean: f64,
    /// `std`.
    pub std: f64,
    /// The lower bound.
    pub a: f64,
    /// The upper bound.
    pub b: f64,
}

impl TruncNormal {
    /// torch 2.13's `_no_grad_trunc_normal_` on the global generator: when the interval
    /// holds more than 30% of the mass, normal draws of the whole tensor, each rejected value
    /// replaced from a fresh draw of the whole tensor until none is left; otherwise
    /// rejection sampling from uniform proposals.
    pub fn apply(&self, t: &mut Tensor) -> Result<()> {
        let TruncNormal { mean, std, a, b } = *self;
        let cdf = |x: f64| (1.0 + erf(x / std::f64::consts::SQRT_2)) / 2.0;
        let p = cdf((b - mean) / std) - cdf((a - mean) / std);
        tch::no_grad(|| -> Result<()> {
            if p > 0.3 {
                // The bounds in the tensor's dtype, so that the rejection is consistent.
                let bound = |x: f64| Tensor::from(x).to_kind(t.kind()).double_value(&[]);
                let (lo, hi) = (bound(a), bound(b));
                let mut result = t.f_normal_(mean, std)?;
                loop {
                    let mask = result.f_lt(lo)?.f_logical_or(&result.f_gt(hi)?)?;
                    if mask.f_any()?.f_int64_value(&[])? == 0 {
                        break;
                    }
                    let fresh = result.f_empty_like()?.f_normal_(mean, std)?;
                    result = fresh.f_where_self(&mask, &result)?;
                }
                t.f_copy_(&result)?;
            } else {
                let mode = a.max(mean.min(b));
                let log_peak = -0.5 * ((mode - mean) / std).powi(2);
                let log_pdf = |c: &Tensor| -> Result<Tensor> {
                    Ok(((c - mean) / std).f_pow_tensor_scalar(2)? * -0.5 - log_peak)
                };
                let _ = t.f_uniform_(a, b)?;
                let mut candidates = log_pdf(t)?;
                let mut accept = t.f_empty_like()?;
                let mut pending = accept
                    .f_uniform_(0.0, 1.0)?
                    .f_log()?
                    .f_gt_tensor(&candidates)?;
                if pending.f_any()?.f_int64_value(&[])? != 0 {
                    let mut result = t.shallow_clone();
                    let mut proposals = t.f_empty_like()?;
                    loop {
                        let _ = proposals.f_uniform_(a, b)?;
                        result = proposals.f_where_self(&pending, &result)?;
                        candidates = log_pdf(&proposals)?;
                        let again = accept
                            .f_uniform_(0.0, 1.0)?
                            .f_log()?
                            .f_gt_tensor(&candidates)?;
                        pending = again.f_where_self(&pending, &pending)?;
                        if pending.f_any()?.f_int64_value(&[])? == 0 {
                            break;
                        }
                    }
                    t.f_copy_(&result)?;
                }
            }
            Ok(())
        })
    }
}

/// The error function (the Chebyshev fit of Numerical Recipes' `erfcc`, relative error
/// below 1.2e-7), for `trunc_normal_`'s choice between its two samplers: only that
/// decision (p > 0.3) reads it, so a bound within 1e-7 of the boundary could choose
/// otherwise than Python's `math.erf`.
fn erf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.5 * x.abs());
    let y = 1.0
        - t * (-x * x - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 { y } else { -y }
}

/// The init to create `name` under `p` with: `init` itself, or, when the model's context
/// defers initialisation, one that draws nothing (the recorded `init` is applied later if
/// the checkpoint lacks it).
pub fn init(p: &Path<'_>, name: &str, init: Init) -> Init {
    init_zero_row(p, name, init, None)
}

/// `p.var(name, dims, init)`, its `zero_row` zeroed, then `trunc_normal` drawn over it
/// (now, or recorded when deferred, for [`initialize_missing`]).
pub fn var_trunc_normal(
    p: &Path<'_>,
    name: &str,
    dims: &[i64],
    init: Init,
    zero_row: Option<i64>,
    trunc_normal: TruncNormal,
) -> Result<Tensor> {
    let recorded = p.ctx().record_init(
        p.path(name),
        VarInit {
            init,
            zero_row,
            trunc_normal: Some(trunc_normal),
        },
    );
    if recorded {
        return Ok(p.var(name, dims, Init::Const(0.0)));
    }
    let mut t = p.var(name, dims, init);
    if let Some(row) = zero_row {
        tch::no_grad(|| t.f_select(0, row)?.f_zero_().map(drop))?;
    }
    trunc_normal.apply(&mut t)?;
    Ok(t)
}

/// [`init`] for an embedding whose `padding_idx` row is zeroed after the draw (when
/// deferred, recorded for [`initialize_missing`]; otherwise the caller zeroes it).
pub fn init_zero_row(p: &Path<'_>, name: &str, init: Init, zero_row: Option<i64>) -> Init {
    let recorded = p.ctx().record_init(
        p.path(name),
        VarInit {
            init,
            zero_row,
            trunc_normal: None,
        },
    );
    match init {
        _ if !recorded => init,
        Init::Const(_) => init,
        _ => Init::Const(0.0),
    }
}

/// `p.var(name, dims, init)` through [`init`].
pub fn var(p: &Path<'_>, name: &str, dims: &[i64], i: Init) -> Tensor {
    p.var(name, dims, init(p, name, i))
}

/// `_initialize_missing_keys`: the variables named in `missing` get their recorded init, in
/// creation order, from the global generator (`normal_(mean, std)` for a normal init, as
/// upstream's `init.normal_`), an embedding's padding row zeroed after.
pub fn initialize_missing(
    vs: &VarStore,
    inits: &[(String, VarInit)],
    missing: &[String],
) -> Result<()> {
    let vars = vs.variables();
    tch::no_grad(|| -> Result<()> {
        for (
            name,
            VarInit {
                init,
                zero_row,
                trunc_normal,
            },
        ) in inits
        {
            if !missing.contains(name) {
                continue;
            }
            let Some(var) = vars.get(name) else {
                continue;
            };
            let mut var = var.shallow_clone();
            match *init {
                Init::Const(c) => {
                    let _ = var.f_fill_(c)?;
                }
                Init::Randn { mean, stdev } => {
                    let _ = var.f_normal_(mean, stdev)?;
                }
                Init::Uniform { lo, up } => {
                    let _ = var.f_uniform_(lo, up)?;
                }
                other => {
                    return Err(Error::InvalidArgument {
                        field: "from_pretrained",
                        detail: format!(
                            "{name}: no upstream initialisation for {other:?}; the checkpoint must hold this weight"
                        ),
                    });
                }
            }
            if let Some(row) = *zero_row {
                let _ = var.f_select(0, row)?.f_zero_()?;
            }
            if let Some(trunc) = trunc_normal {
                trunc.apply(&mut var)?;
            }
        }
        Ok(())
    })
}

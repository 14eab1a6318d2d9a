//! Upstream `initialization.py` and `from_pretrained`'s `_initialize_missing_keys`: the
//! weights a checkpoint lacks (a new head on a pretrained body, sizes refused with
//! `ignore_mismatched_sizes`) are drawn from the global generator with each module's
//! `_init_weights`, in module order, and nothing else is drawn: after `set_seed(42)`,
//! `from_pretrained(..., num_labels=2)` gives MiniLM's classifier exactly
//! `torch.empty(2, 384).normal_(0, 0.02)` and leaves the generator right after it.
//!
//! A model's constructor draws every weight (upstream's `Model(config)`). `from_pretrained`
//! builds it inside [`deferred`] instead: each variable is created without drawing (its
//! constant, or zeros for a random init) and its init is recorded; once the checkpoint is
//! loaded, [`initialize_missing`] applies the recorded init to the missing variables only,
//! in creation order (which is upstream's registration order).

use std::cell::RefCell;

use tch::Tensor;
use tch::nn::{self, Init, VarStore};

use crate::error::{Error, Result};

/// A variable's upstream initialisation: its init, for an embedding with a `padding_idx`
/// the row `_init_weights` zeroes after the draw, and a truncated normal a model's own
/// `_init_weights` draws after the generic one (ModernBERT's).
#[derive(Debug, Clone, Copy)]
pub(crate) struct VarInit {
    pub(crate) init: Init,
    pub(crate) zero_row: Option<i64>,
    pub(crate) trunc_normal: Option<TruncNormal>,
}

/// `init.trunc_normal_(mean, std, a, b)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TruncNormal {
    pub(crate) mean: f64,
    pub(crate) std: f64,
    pub(crate) a: f64,
    pub(crate) b: f64,
}

impl TruncNormal {
    /// torch 2.13's `_no_grad_trunc_normal_` on the global generator: when the interval
    /// holds more than 30% of the mass, normal draws of the whole tensor, each rejected value
    /// replaced from a fresh draw of the whole tensor until none is left; otherwise
    /// rejection sampling from uniform proposals.
    pub(crate) fn apply(&self, t: &mut Tensor) -> Result<()> {
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

thread_local! {
    static DEFERRED: RefCell<Option<Vec<(String, VarInit)>>> = const { RefCell::new(None) };
}

/// The init to create `name` under `p` with: `init` itself, or, inside [`deferred`], one
/// that draws nothing (the recorded `init` is applied later if the checkpoint lacks it).
pub(crate) fn init(p: &nn::Path<'_>, name: &str, init: Init) -> Init {
    init_zero_row(p, name, init, None)
}

/// `p.var(name, dims, init)`, its `zero_row` zeroed, then `trunc_normal` drawn over it
/// (now, or recorded inside [`deferred`] for [`initialize_missing`]).
pub(crate) fn var_trunc_normal(
    p: &nn::Path<'_>,
    name: &str,
    dims: &[i64],
    init: Init,
    zero_row: Option<i64>,
    trunc_normal: TruncNormal,
) -> Result<Tensor> {
    let recorded = DEFERRED.with(|d| match d.borrow_mut().as_mut() {
        None => false,
        Some(recorded) => {
            recorded.push((
                p.path(name),
                VarInit {
                    init,
                    zero_row,
                    trunc_normal: Some(trunc_normal),
                },
            ));
            true
        }
    });
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

/// [`init`] for an embedding whose `padding_idx` row is zeroed after the draw (inside
/// [`deferred`], recorded for [`initialize_missing`]; otherwise the caller zeroes it).
pub(crate) fn init_zero_row(
    p: &nn::Path<'_>,
    name: &str,
    init: Init,
    zero_row: Option<i64>,
) -> Init {
    DEFERRED.with(|d| match d.borrow_mut().as_mut() {
        None => init,
        Some(recorded) => {
            recorded.push((
                p.path(name),
                VarInit {
                    init,
                    zero_row,
                    trunc_normal: None,
                },
            ));
            match init {
                Init::Const(_) => init,
                _ => Init::Const(0.0),
            }
        }
    })
}

/// `p.var(name, dims, init)` through [`init`].
pub(crate) fn var(p: &nn::Path<'_>, name: &str, dims: &[i64], i: Init) -> Tensor {
    p.var(name, dims, init(p, name, i))
}

/// Whether variables are being created inside [`deferred`] (nothing drawn now).
pub(crate) fn is_deferred() -> bool {
    DEFERRED.with(|d| d.borrow().is_some())
}

/// Runs `build` (a model's constructor) with initialisation deferred; returns what it built
/// and the init of every variable, in creation order.
pub(crate) fn deferred<T>(
    build: impl FnOnce() -> Result<T>,
) -> Result<(T, Vec<(String, VarInit)>)> {
    struct Restore(Option<Vec<(String, VarInit)>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let prev = self.0.take();
            DEFERRED.with(|d| *d.borrow_mut() = prev);
        }
    }
    let prev = DEFERRED.with(|d| d.borrow_mut().replace(Vec::new()));
    let restore = Restore(prev);
    let built = build();
    let recorded = DEFERRED.with(|d| d.borrow_mut().take()).unwrap_or_default();
    drop(restore);
    Ok((built?, recorded))
}

/// `_initialize_missing_keys`: the variables named in `missing` get their recorded init, in
/// creation order, from the global generator (`normal_(mean, std)` for a normal init, as
/// upstream's `init.normal_`), an embedding's padding row zeroed after.
pub(crate) fn initialize_missing(
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

//! The learning-rate multipliers of upstream `optimization.py` (the `lr_lambda` of each
//! `LambdaLR`), evaluated in f64 with Python's operation order, and the `get_*_schedule*`
//! constructors under upstream's names.

use serde::{Deserialize, Serialize};

use crate::{Error, LambdaLR, Optimizer, Result};

/// WSD warm-up / decay curve (`warmup_type` / `decay_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WsdCurve {
    /// `"linear"`.
    #[serde(rename = "linear")]
    Linear,
    /// `"cosine"`.
    #[serde(rename = "cosine")]
    Cosine,
    /// `"1-sqrt"`.
    #[serde(rename = "1-sqrt")]
    OneMinusSqrt,
}

impl WsdCurve {
    /// Parses upstream's string (`linear`, `cosine`, `1-sqrt`).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "linear" => Some(Self::Linear),
            "cosine" => Some(Self::Cosine),
            "1-sqrt" => Some(Self::OneMinusSqrt),
            _ => None,
        }
    }
}

/// A `LambdaLR` multiplier: `lr = base_lr * lr_lambda(step)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum LrLambda {
    /// `_get_constant_lambda`.
    Constant,
    /// `_get_constant_schedule_with_warmup_lr_lambda`.
    ConstantWithWarmup {
        /// Warm-up steps.
        num_warmup_steps: i64,
    },
    /// `_get_linear_schedule_with_warmup_lr_lambda`.
    Linear {
        /// Warm-up steps.
        num_warmup_steps: i64,
        /// Total steps.
        num_training_steps: i64,
    },
    /// `_get_cosine_schedule_with_warmup_lr_lambda` (with `min_lr_rate`, 0 for plain cosine).
    Cosine {
        /// Warm-up steps.
        num_warmup_steps: i64,
        /// Total steps.
        num_training_steps: i64,
        /// Number of waves (0.5: half a cosine).
        num_cycles: f64,
        /// Floor as a ratio of the initial lr (`None`: plain cosine, clamped at 0).
        min_lr_rate: Option<f64>,
    },
    /// `_get_cosine_with_hard_restarts_schedule_with_warmup_lr_lambda`.
    CosineWithHardRestarts {
        /// Warm-up steps.
        num_warmup_steps: i64,
        /// Total steps.
        num_training_steps: i64,
        /// Number of hard restarts.
        num_cycles: f64,
    },
    /// `_get_polynomial_decay_schedule_with_warmup_lr_lambda`.
    Polynomial {
        /// Warm-up steps.
        num_warmup_steps: i64,
        /// Total steps.
        num_training_steps: i64,
        /// Final lr.
        lr_end: f64,
        /// Power of the decay.
        power: f64,
        /// The optimizer's default lr.
        lr_init: f64,
    },
    /// `_get_inverse_sqrt_schedule_lr_lambda`.
    InverseSqrt {
        /// Warm-up steps.
        num_warmup_steps: i64,
        /// Time scale.
        timescale: f64,
    },
    /// `_get_cosine_with_min_lr_schedule_with_warmup_lr_rate_lambda`.
    CosineWarmupWithMinLr {
        /// Warm-up steps.
        num_warmup_steps: i64,
        /// Total steps.
        num_training_steps: i64,
        /// Number of waves.
        num_cycles: f64,
        /// Floor as a ratio of the initial lr.
        min_lr_rate: f64,
        /// Starting ratio of the warm-up (`None`: `(step + 1) / warmup`).
        warmup_lr_rate: Option<f64>,
    },
    /// `_get_wsd_scheduler_lambda`.
    WarmupStableDecay {
        /// Warm-up steps.
        num_warmup_steps: i64,
        /// Stable steps.
        num_stable_steps: i64,
        /// Decay steps.
        num_decay_steps: i64,
        /// Warm-up curve.
        warmup_type: WsdCurve,
        /// Decay curve.
        decay_type: WsdCurve,
        /// Floor as a ratio of the initial lr.
        min_lr_ratio: f64,
        /// Number of waves of the cosine decay.
        num_cycles: f64,
    },
    /// A fixed multiplier (`AdafactorSchedule`'s `initial_lr` lambda).
    Fixed {
        /// The multiplier.
        value: f64,
    },
}

fn warmup_ratio(step: i64, warmup: i64) -> f64 {
    step as f64 / (warmup.max(1) as f64)
}

impl LrLambda {
    /// The multiplier at `current_step` (torch's `last_epoch`).
    pub fn value(&self, current_step: i64) -> f64 {
        use std::f64::consts::PI;
        let s = current_step;
        match *self {
            Self::Constant => 1.0,
            Self::Fixed { value } => value,
            Self::ConstantWithWarmup {
                num_warmup_steps: w,
            } => {
                if s < w {
                    s as f64 / (w as f64).max(1.0)
                } else {
                    1.0
                }
            }
            Self::Linear {
                num_warmup_steps: w,
                num_training_steps: t,
            } => {
                if s < w {
                    return warmup_ratio(s, w);
                }
                ((t - s) as f64 / ((t - w).max(1) as f64)).max(0.0)
            }
            Self::Cosine {
                num_warmup_steps: w,
                num_training_steps: t,
                num_cycles,
                min_lr_rate,
            } => {
                if s < w {
                    return warmup_ratio(s, w);
                }
                let progress = (s - w) as f64 / ((t - w).max(1) as f64);
                let factor = 0.5 * (1.0 + (PI * num_cycles * 2.0 * progress).cos());
                match min_lr_rate {
                    None => factor.max(0.0),
                    Some(m) => (factor * (1.0 - m) + m).max(0.0),
                }
            }
            Self::CosineWithHardRestarts {
                num_warmup_steps: w,
                num_training_steps: t,
                num_cycles,
            } => {
                if s < w {
                    return warmup_ratio(s, w);
                }
                let progress = (s - w) as f64 / ((t - w).max(1) as f64);
                if progress >= 1.0 {
                    return 0.0;
                }
                (0.5 * (1.0 + (PI * ((num_cycles * progress) % 1.0)).cos())).max(0.0)
            }
            Self::Polynomial {
                num_warmup_steps: w,
                num_training_steps: t,
                lr_end,
                power,
                lr_init,
            } => {
                if s < w {
                    warmup_ratio(s, w)
                } else if s > t {
                    lr_end / lr_init
                } else {
                    let lr_range = lr_init - lr_end;
                    let decay_steps = (t - w) as f64;
                    let pct_remaining = 1.0 - (s - w) as f64 / decay_steps;
                    let decay = lr_range * pct_remaining.powf(power) + lr_end;
                    decay / lr_init
                }
            }
            Self::InverseSqrt {
                num_warmup_steps: w,
                timescale,
            } => {
                if s < w {
                    return warmup_ratio(s, w);
                }
                let shift = timescale - w as f64;
                1.0 / ((s as f64 + shift) / timescale).sqrt()
            }
            Self::CosineWarmupWithMinLr {
                num_warmup_steps,
                num_training_steps,
                num_cycles,
                min_lr_rate,
                warmup_lr_rate,
            } => {
                let (s, w, t) = (s as f64, num_warmup_steps as f64, num_training_steps as f64);
                if s < w {
                    return match warmup_lr_rate {
                        None => (s + 1.0) / w.max(1.0),
                        Some(r) => r + (1.0 - r) * s / (w - 1.0).max(1.0),
                    };
                }
                let progress = (s - w + 1.0) / (t - w).max(1.0);
                let factor = 0.5 * (1.0 + (PI * num_cycles * 2.0 * progress).cos());
                (factor * (1.0 - min_lr_rate) + min_lr_rate).max(0.0)
            }
            Self::WarmupStableDecay {
                num_warmup_steps: w,
                num_stable_steps: st,
                num_decay_steps: d,
                warmup_type,
                decay_type,
                min_lr_ratio,
                num_cycles,
            } => {
                if s < w {
                    let progress = warmup_ratio(s, w);
                    let factor = match warmup_type {
                        WsdCurve::Linear => progress,
                        WsdCurve::Cosine => 0.5 * (1.0 - (PI * progress).cos()),
                        WsdCurve::OneMinusSqrt => 1.0 - (1.0 - progress).sqrt(),
                    };
                    return (factor * (1.0 - min_lr_ratio) + min_lr_ratio).max(0.0);
                }
                if s < w + st {
                    return 1.0;
                }
                if s < w + st + d {
                    let progress = (s - w - st) as f64 / (d.max(1) as f64);
                    let factor = match decay_type {
                        WsdCurve::Linear => 1.0 - progress,
                        WsdCurve::Cosine => 0.5 * (1.0 + (PI * num_cycles * 2.0 * progress).cos()),
                        WsdCurve::OneMinusSqrt => 1.0 - progress.sqrt(),
                    };
                    return (factor * (1.0 - min_lr_ratio) + min_lr_ratio).max(0.0);
                }
                min_lr_ratio
            }
        }
    }
}

/// Constant lr (`get_constant_schedule`).
pub fn get_constant_schedule(optimizer: &mut dyn Optimizer, last_epoch: i64) -> Result<LambdaLR> {
    LambdaLR::new(optimizer, "constant", LrLambda::Constant, last_epoch)
}

/// Linear warm-up then constant (`get_constant_schedule_with_warmup`).
pub fn get_constant_schedule_with_warmup(
    optimizer: &mut dyn Optimizer,
    num_warmup_steps: i64,
    last_epoch: i64,
) -> Result<LambdaLR> {
    let l = LrLambda::ConstantWithWarmup { num_warmup_steps };
    LambdaLR::new(optimizer, "constant_with_warmup", l, last_epoch)
}

/// Linear warm-up then linear decay to 0 (`get_linear_schedule_with_warmup`).
///
/// ```
/// use tch::{Device, Kind, Tensor};
/// use tchtrain_optim::{get_linear_schedule_with_warmup, GroupSpec, LrScheduler, Optimizer, Sgd, SgdConfig};
/// let p = Tensor::zeros([1], (Kind::Float, Device::Cpu));
/// let mut opt = Sgd::new(vec![GroupSpec::unnamed(vec![p])], SgdConfig { lr: 1.0, ..Default::default() })?;
/// let mut sched = get_linear_schedule_with_warmup(&mut opt, 2, 10, -1)?;
/// assert_eq!(opt.lrs(), vec![0.0]);
/// sched.step(&mut opt)?;
/// assert_eq!(sched.get_last_lr(), &[0.5]);
/// # Ok::<(), tchtrain_optim::Error>(())
/// ```
pub fn get_linear_schedule_with_warmup(
    optimizer: &mut dyn Optimizer,
    num_warmup_steps: i64,
    num_training_steps: i64,
    last_epoch: i64,
) -> Result<LambdaLR> {
    let l = LrLambda::Linear {
        num_warmup_steps,
        num_training_steps,
    };
    LambdaLR::new(optimizer, "linear", l, last_epoch)
}

/// Linear warm-up then cosine decay to 0 (`get_cosine_schedule_with_warmup`; upstream
/// default `num_cycles = 0.5`).
pub fn get_cosine_schedule_with_warmup(
    optimizer: &mut dyn Optimizer,
    num_warmup_steps: i64,
    num_training_steps: i64,
    num_cycles: f64,
    last_epoch: i64,
) -> Result<LambdaLR> {
    let l = LrLambda::Cosine {
        num_warmup_steps,
        num_training_steps,
        num_cycles,
        min_lr_rate: None,
    };
    LambdaLR::new(optimizer, "cosine", l, last_epoch)
}

/// Linear warm-up then cosine with hard restarts
/// (`get_cosine_with_hard_restarts_schedule_with_warmup`; upstream default `num_cycles = 1`).
pub fn get_cosine_with_hard_restarts_schedule_with_warmup(
    optimizer: &mut dyn Optimizer,
    num_warmup_steps: i64,
    num_training_steps: i64,
    num_cycles: f64,
    last_epoch: i64,
) -> Result<LambdaLR> {
    let l = LrLambda::CosineWithHardRestarts {
        num_warmup_steps,
        num_training_steps,
        num_cycles,
    };
    LambdaLR::new(optimizer, "cosine_with_restarts", l, last_epoch)
}

/// Linear warm-up then polynomial decay to `lr_end`
/// (`get_polynomial_decay_schedule_with_warmup`; upstream defaults `lr_end = 1e-7`,
/// `power = 1.0`). `lr_end` must be below the optimizer's default lr.
pub fn get_polynomial_decay_schedule_with_warmup(
    optimizer: &mut dyn Optimizer,
    num_warmup_steps: i64,
    num_training_steps: i64,
    lr_end: f64,
    power: f64,
    last_epoch: i64,
) -> Result<LambdaLR> {
    let lr_init = optimizer.default_lr();
    if lr_init.partial_cmp(&lr_end) != Some(std::cmp::Ordering::Greater) {
        return Err(Error::InvalidSchedulerKwarg {
            scheduler: "polynomial".into(),
            kwarg: "lr_end".into(),
            reason: format!("lr_end ({lr_end}) must be smaller than initial lr ({lr_init})"),
        });
    }
    let l = LrLambda::Polynomial {
        num_warmup_steps,
        num_training_steps,
        lr_end,
        power,
        lr_init,
    };
    LambdaLR::new(optimizer, "polynomial", l, last_epoch)
}

/// Linear warm-up then inverse square root (`get_inverse_sqrt_schedule`; `timescale`
/// defaults to `num_warmup_steps`, or 10 000 when that is 0).
pub fn get_inverse_sqrt_schedule(
    optimizer: &mut dyn Optimizer,
    num_warmup_steps: i64,
    timescale: Option<f64>,
    last_epoch: i64,
) -> Result<LambdaLR> {
    let timescale = timescale.unwrap_or(if num_warmup_steps != 0 {
        num_warmup_steps as f64
    } else {
        10_000.0
    });
    let l = LrLambda::InverseSqrt {
        num_warmup_steps,
        timescale,
    };
    LambdaLR::new(optimizer, "inverse_sqrt", l, last_epoch)
}

/// Resolves upstream's `min_lr` / `min_lr_rate` pair (exactly one must be set).
fn min_lr_rate_of(
    scheduler: &str,
    optimizer: &dyn Optimizer,
    min_lr: Option<f64>,
    min_lr_rate: Option<f64>,
) -> Result<f64> {
    let invalid = |reason: &str| Error::InvalidSchedulerKwarg {
        scheduler: scheduler.into(),
        kwarg: "min_lr".into(),
        reason: reason.into(),
    };
    match (min_lr, min_lr_rate) {
        (Some(_), Some(_)) => Err(invalid("Only one of min_lr or min_lr_rate should be set")),
        (Some(m), None) => Ok(m / optimizer.default_lr()),
        (None, Some(r)) => Ok(r),
        (None, None) => Err(invalid(
            "One of min_lr or min_lr_rate should be set through the `lr_scheduler_kwargs`",
        )),
    }
}

/// Linear warm-up then cosine decay to a floor (`get_cosine_with_min_lr_schedule_with_warmup`).
pub fn get_cosine_with_min_lr_schedule_with_warmup(
    optimizer: &mut dyn Optimizer,
    num_warmup_steps: i64,
    num_training_steps: i64,
    num_cycles: f64,
    last_epoch: i64,
    min_lr: Option<f64>,
    min_lr_rate: Option<f64>,
) -> Result<LambdaLR> {
    let rate = min_lr_rate_of("cosine_with_min_lr", optimizer, min_lr, min_lr_rate)?;
    let l = LrLambda::Cosine {
        num_warmup_steps,
        num_training_steps,
        num_cycles,
        min_lr_rate: Some(rate),
    };
    LambdaLR::new(optimizer, "cosine_with_min_lr", l, last_epoch)
}

/// Warm-up from `warmup_lr_rate` then cosine decay to a floor
/// (`get_cosine_with_min_lr_schedule_with_warmup_lr_rate`).
#[allow(clippy::too_many_arguments)]
pub fn get_cosine_with_min_lr_schedule_with_warmup_lr_rate(
    optimizer: &mut dyn Optimizer,
    num_warmup_steps: i64,
    num_training_steps: i64,
    num_cycles: f64,
    last_epoch: i64,
    min_lr: Option<f64>,
    min_lr_rate: Option<f64>,
    warmup_lr_rate: Option<f64>,
) -> Result<LambdaLR> {
    let rate = min_lr_rate_of("cosine_warmup_with_min_lr", optimizer, min_lr, min_lr_rate)?;
    let l = LrLambda::CosineWarmupWithMinLr {
        num_warmup_steps,
        num_training_steps,
        num_cycles,
        min_lr_rate: rate,
        warmup_lr_rate,
    };
    LambdaLR::new(optimizer, "cosine_warmup_with_min_lr", l, last_epoch)
}

/// Options of [`get_wsd_schedule`] beyond the step counts (upstream defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct WsdOptions {
    /// Stable steps; `None`: `num_training_steps - num_warmup_steps - num_decay_steps`.
    pub num_stable_steps: Option<i64>,
    /// Warm-up curve (default linear).
    pub warmup_type: WsdCurve,
    /// Decay curve (default cosine).
    pub decay_type: WsdCurve,
    /// Floor as a ratio of the initial lr (default 0).
    pub min_lr_ratio: f64,
    /// Waves of the cosine decay (default 0.5).
    pub num_cycles: f64,
}

impl Default for WsdOptions {
    fn default() -> Self {
        Self {
            num_stable_steps: None,
            warmup_type: WsdCurve::Linear,
            decay_type: WsdCurve::Cosine,
            min_lr_ratio: 0.0,
            num_cycles: 0.5,
        }
    }
}

/// Warm-up, stable, decay (`get_wsd_schedule`). Needs `num_training_steps` or
/// `options.num_stable_steps` (the latter wins when both are given).
pub fn get_wsd_schedule(
    optimizer: &mut dyn Optimizer,
    num_warmup_steps: i64,
    num_decay_steps: i64,
    num_training_steps: Option<i64>,
    options: WsdOptions,
    last_epoch: i64,
) -> Result<LambdaLR> {
    let num_stable_steps = match (options.num_stable_steps, num_training_steps) {
        (Some(s), _) => s,
        (None, Some(t)) => t - num_warmup_steps - num_decay_steps,
        (None, None) => {
            return Err(Error::MissingSchedulerArgument {
                scheduler: "warmup_stable_decay".into(),
                argument: "num_training_steps or num_stable_steps",
            });
        }
    };
    let l = LrLambda::WarmupStableDecay {
        num_warmup_steps,
        num_stable_steps,
        num_decay_steps,
        warmup_type: options.warmup_type,
        decay_type: options.decay_type,
        min_lr_ratio: options.min_lr_ratio,
        num_cycles: options.num_cycles,
    };
    LambdaLR::new(optimizer, "warmup_stable_decay", l, last_epoch)
}

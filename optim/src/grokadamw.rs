//! GrokAdamW: AdamW on the gradient plus an amplified slow EMA of itself ("grokfast"), with a
//! layer-wise decaying beta1 and per-parameter gradient clipping. Upstream's `grokadamw`.
//!
//! Reference matched: PyPI grokadamw 0.1.2's `GrokAdamW._update_group`, op for op. For the
//! `i`-th parameter with a gradient in its group:
//!
//! ```text
//! g          <- clip_grad_norm_(g, gradient_clipping)      (when gradient_clipping > 0)
//! beta1_i    <- beta1 * (1 - gamma) ** i
//! alpha      <- alpha_init * exp(-grokking_signal_decay_rate * signal)
//! ema        <- ema * alpha + (1 - alpha) * g
//! gg         <- g + lamb * ema
//! m          <- m * beta1_i + (1 - beta1_i) * gg
//! v          <- v * beta2 + (1 - beta2) * gg * gg
//! p          <- p * (1 - lr * wd)
//! p          <- p - lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + eps)
//! ```
//!
//! The grokking signal: the package computes it from `group["train_loss"]` /
//! `group["eval_loss"]` or from `grokking_signal_fns`; upstream's Trainer sets neither, so it
//! is 0 and `alpha == alpha_init`. That is what runs here (callables cannot be passed through
//! `optim_args` either).

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::clip::clip_grad_norm;
use crate::ffi;
use crate::optimizer::{
    build_groups, check_non_negative, check_unit, expect_shape, grad_of, optimizer_accessors,
};
use crate::{Error, GroupSpec, Optimizer, ParamGroup, ParamState, Result};

/// Hyper-parameters of [`GrokAdamW`] (the package's defaults; the Trainer passes `lr`, the
/// Adam betas and eps, and `optim_args`' `alpha_init`, `lamb`, `gamma`,
/// `grokking_signal_decay_rate`, `gradient_clipping`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GrokAdamWConfig {
    /// Learning rate (default 1e-3).
    pub lr: f64,
    /// `(beta1, beta2)` (default (0.9, 0.999)).
    pub betas: (f64, f64),
    /// Added to the denominator (default 1e-8).
    pub eps: f64,
    /// Decoupled weight decay (default 1e-2).
    pub weight_decay: f64,
    /// EMA factor of the slow gradient (default 0.98; in [0, 1]).
    pub alpha_init: f64,
    /// Amplification of the slow gradient (default 2.0).
    pub lamb: f64,
    /// Layer-wise decay of beta1: `beta1 * (1 - gamma) ** i` (default 0.1).
    pub gamma: f64,
    /// How fast the grokking signal lowers `alpha` (default 0.1).
    pub grokking_signal_decay_rate: f64,
    /// Max L2 norm of each parameter's gradient; 0 disables (default 1.0).
    pub gradient_clipping: f64,
}

impl Default for GrokAdamWConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 1e-2,
            alpha_init: 0.98,
            lamb: 2.0,
            gamma: 0.1,
            grokking_signal_decay_rate: 0.1,
            gradient_clipping: 1.0,
        }
    }
}

/// The GrokAdamW optimizer.
#[derive(Debug)]
pub struct GrokAdamW {
    config: GrokAdamWConfig,
    groups: Vec<ParamGroup>,
    state: Vec<Option<ParamState>>,
}

impl GrokAdamW {
    /// Creates the optimizer over `groups` (each may override `lr` / `weight_decay`), with the
    /// package's checks.
    pub fn new(groups: Vec<GroupSpec>, config: GrokAdamWConfig) -> Result<Self> {
        check_non_negative("lr", config.lr)?;
        check_non_negative("eps", config.eps)?;
        check_unit("betas[0]", config.betas.0)?;
        check_unit("betas[1]", config.betas.1)?;
        check_non_negative("weight_decay", config.weight_decay)?;
        if !(0.0..=1.0).contains(&config.alpha_init) {
            return Err(Error::InvalidHyperparameter {
                name: "alpha_init",
                value: config.alpha_init,
                expected: "in [0, 1]",
            });
        }
        let (groups, state) = build_groups(groups, config.lr, config.weight_decay)?;
        Ok(Self {
            config,
            groups,
            state,
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &GrokAdamWConfig {
        &self.config
    }
}

impl Optimizer for GrokAdamW {
    fn name(&self) -> &'static str {
        "grokadamw"
    }

    fn default_lr(&self) -> f64 {
        self.config.lr
    }

    fn step(&mut self) -> Result<()> {
        let c = &self.config;
        let (beta1, beta2) = c.betas;
        // The Trainer's grokking signal (no losses in the group, no signal functions).
        let signal = 0.0f64;
        let alpha = c.alpha_init * (-c.grokking_signal_decay_rate * signal).exp();
        tch::no_grad(|| {
            let mut offset = 0;
            for group in &self.groups {
                let (lr, wd) = (group.lr, group.weight_decay);
                // `i` counts the parameters that have a gradient, as the package enumerates them.
                let mut i = 0i32;
                for (j, p) in group.params.iter().enumerate() {
                    let index = offset + j;
                    let Some(grad) = grad_of(p) else { continue };
                    let mut p = p.shallow_clone();
                    let st = self.state[index].get_or_insert_with(|| {
                        let mut st = ParamState::default();
                        for key in ["exp_avg", "exp_avg_sq", "grok_ema"] {
                            st.tensors.insert(key.into(), p.zeros_like());
                        }
                        st
                    });
                    st.step += 1;
                    let t = st.step as i32; // (Python's float ** int is C's pow)
                    let mut exp_avg = st.handle(index, "exp_avg")?;
                    let mut exp_avg_sq = st.handle(index, "exp_avg_sq")?;
                    let mut grok_ema = st.handle(index, "grok_ema")?;

                    if c.gradient_clipping > 0.0 {
                        let _ = clip_grad_norm(
                            std::slice::from_ref(&p),
                            c.gradient_clipping,
                            2.0,
                            false,
                        )?;
                    }
                    let layer_beta1 = beta1 * (1.0 - c.gamma).powf(f64::from(i));
                    let _ = grok_ema.f_mul_scalar_(alpha)?;
                    ffi::add_(&mut grok_ema, &grad, 1.0 - alpha)?;
                    let grok_grad = grad.f_add(&grok_ema.f_mul_scalar(c.lamb)?)?;

                    let _ = exp_avg.f_mul_scalar_(layer_beta1)?;
                    ffi::add_(&mut exp_avg, &grok_grad, 1.0 - layer_beta1)?;
                    let _ = exp_avg_sq.f_mul_scalar_(beta2)?;
                    ffi::addcmul_(&mut exp_avg_sq, &grok_grad, &grok_grad, 1.0 - beta2)?;

                    let bias_correction1 = 1.0 - beta1.powf(f64::from(t));
                    let bias_correction2 = 1.0 - beta2.powf(f64::from(t));
                    let step_size = lr * bias_correction2.sqrt() / bias_correction1;

                    let _ = p.f_mul_scalar_(1.0 - lr * wd)?;
                    let mut denom = exp_avg_sq.f_sqrt()?;
                    let _ = denom.f_add_scalar_(c.eps)?;
                    ffi::addcdiv_(&mut p, &exp_avg, &denom, -step_size)?;
                    i += 1;
                }
                offset += group.params.len();
            }
            Ok(())
        })
    }

    fn validate_state(&self, index: usize, param: &Tensor, state: &ParamState) -> Result<()> {
        for key in ["exp_avg", "exp_avg_sq", "grok_ema"] {
            expect_shape(index, state, key, &param.size())?;
        }
        Ok(())
    }

    optimizer_accessors!();
}

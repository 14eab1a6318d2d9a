//! StableAdamW (Wortsman et al. 2023, "Stable and low-precision training for large-scale
//! vision-language models"): AdamW with debiased betas and a learning rate divided by the
//! per-tensor RMS of `grad / sqrt(v)` when that exceeds 1. Upstream's `stable_adamw`.
//!
//! Reference matched: torch-optimi 0.3.3's `StableAdamW`, single-tensor path
//! (`_single_param_stableadamw`), op for op:
//!
//! ```text
//! step      <- step + 1                       (one count per param group)
//! b1, b2    <- (beta**step - beta) / (beta**step - 1)    (debiased betas)
//! m         <- m.lerp(g, 1 - b1)
//! v         <- v * b2 + (1 - b2) * g * g
//! rms       <- sqrt(mean(g^2 / max(v, eps^2)))
//! lr        <- lr / max(1, rms)
//! p         <- p * (1 - lr * wd)              (decouple_lr: 1 - lr / max_lr * wd)
//! p         <- p - lr * m / (sqrt(v) + eps)   (Kahan-compensated for fp16 / bf16 params)
//! ```
//!
//! optimi's Triton and foreach paths are not mirrored: on a CPU optimi 0.3.3 picks its Triton
//! kernel whenever triton imports (and fails there), so the single-tensor path is what it runs
//! where it runs at all.

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::ffi;
use crate::optimizer::{
    build_groups, check_non_negative, check_unit, expect_shape, grad_of, is_reduced,
    optimizer_accessors,
};
use crate::{Error, GroupSpec, Optimizer, ParamGroup, ParamState, Result};

/// Hyper-parameters of [`StableAdamW`] (optimi's defaults; the Trainer passes `lr`, the Adam
/// betas and eps, `weight_decay` and `optim_args`' `decouple_lr`, `max_lr`, `kahan_sum`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StableAdamWConfig {
    /// Learning rate (optimi requires it; default here 1e-3).
    pub lr: f64,
    /// `(beta1, beta2)` (default (0.9, 0.99)).
    pub betas: (f64, f64),
    /// Weight decay (default 1e-2).
    pub weight_decay: f64,
    /// Added to the denominator (default 1e-6).
    pub eps: f64,
    /// Fully decoupled weight decay: `1 - lr / max_lr * wd` instead of `1 - lr * wd`.
    pub decouple_lr: bool,
    /// The largest scheduled learning rate, for `decouple_lr` (default: `lr` when
    /// `decouple_lr`, as optimi sets it).
    pub max_lr: Option<f64>,
    /// Kahan summation of the update for fp16 / bf16 parameters (`None`: on for those).
    pub kahan_sum: Option<bool>,
    /// optimi's per-group step counts (`group["step"]`), restored with the state.
    pub group_steps: Vec<u64>,
}

impl Default for StableAdamWConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            betas: (0.9, 0.99),
            weight_decay: 1e-2,
            eps: 1e-6,
            decouple_lr: false,
            max_lr: None,
            kahan_sum: None,
            group_steps: Vec::new(),
        }
    }
}

/// The StableAdamW optimizer.
#[derive(Debug)]
pub struct StableAdamW {
    config: StableAdamWConfig,
    groups: Vec<ParamGroup>,
    state: Vec<Option<ParamState>>,
}

/// optimi's `debias_beta`: the Adam bias correction folded into the beta.
fn debias_beta(beta: f64, step: u64) -> f64 {
    let bs = beta.powf(step as f64);
    (bs - beta) / (bs - 1.0)
}

impl StableAdamW {
    /// Creates the optimizer over `groups` (each may override `lr` / `weight_decay`).
    pub fn new(groups: Vec<GroupSpec>, mut config: StableAdamWConfig) -> Result<Self> {
        check_non_negative("lr", config.lr)?;
        check_non_negative("weight_decay", config.weight_decay)?;
        check_unit("betas[0]", config.betas.0)?;
        check_unit("betas[1]", config.betas.1)?;
        check_non_negative("eps", config.eps)?;
        if config.decouple_lr && config.max_lr.is_none() {
            config.max_lr = Some(config.lr);
        }
        if let Some(max_lr) = config.max_lr {
            check_non_negative("max_lr", max_lr)?;
        }
        let (groups, state) = build_groups(groups, config.lr, config.weight_decay)?;
        config.group_steps = vec![0; groups.len()];
        Ok(Self {
            config,
            groups,
            state,
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &StableAdamWConfig {
        &self.config
    }
}

impl Optimizer for StableAdamW {
    fn name(&self) -> &'static str {
        "stable_adamw"
    }

    fn default_lr(&self) -> f64 {
        self.config.lr
    }

    fn step(&mut self) -> Result<()> {
        let c = self.config.clone();
        if self.config.group_steps.len() != self.groups.len() {
            return Err(Error::GroupLayoutMismatch {
                detail: format!(
                    "{} group step counts for {} param groups",
                    self.config.group_steps.len(),
                    self.groups.len()
                ),
            });
        }
        tch::no_grad(|| {
            let mut offset = 0;
            for (gi, group) in self.groups.iter().enumerate() {
                // optimi counts the step per group, whether or not its parameters have grads.
                self.config.group_steps[gi] += 1;
                let step = self.config.group_steps[gi];
                let beta1_comp = 1.0 - debias_beta(c.betas.0, step);
                let beta2_hat = debias_beta(c.betas.1, step);
                let beta2_comp = 1.0 - beta2_hat;
                for (j, p) in group.params.iter().enumerate() {
                    let index = offset + j;
                    let Some(mut grad) = grad_of(p) else { continue };
                    let mut p = p.shallow_clone();
                    let kahan = c.kahan_sum.unwrap_or(true) && is_reduced(p.kind());
                    let st = self.state[index].get_or_insert_with(|| {
                        let mut st = ParamState::default();
                        st.tensors.insert("exp_avg".into(), p.zeros_like());
                        st.tensors.insert("exp_avg_sq".into(), p.zeros_like());
                        // `torch.tensor(eps ** 2, dtype=param.dtype)`.
                        st.tensors.insert(
                            "eps_sq".into(),
                            Tensor::from(c.eps * c.eps).to_kind(p.kind()).to(p.device()),
                        );
                        if kahan {
                            st.tensors.insert("kahan_comp".into(), p.zeros_like());
                        }
                        st
                    });
                    st.step = step;
                    let mut exp_avg = st.handle(index, "exp_avg")?;
                    let mut exp_avg_sq = st.handle(index, "exp_avg_sq")?;
                    let eps_sq = st.handle(index, "eps_sq")?;
                    let kahan_comp = st.tensors.get("kahan_comp").map(Tensor::shallow_clone);

                    let _ = exp_avg.f_lerp_(&grad, beta1_comp)?;
                    let _ = exp_avg_sq.f_mul_scalar_(beta2_hat)?;
                    ffi::addcmul_(&mut exp_avg_sq, &grad, &grad, beta2_comp)?;

                    let mut ratio = grad.f_pow_tensor_scalar(2)?;
                    let _ = ratio.f_div_(&exp_avg_sq.f_maximum(&eps_sq)?)?;
                    let rms = ratio.f_mean(None::<Kind>)?.f_sqrt()?.f_double_value(&[])?;
                    let lr = group.lr / if rms > 1.0 { rms } else { 1.0 };

                    let wd = group.weight_decay;
                    if wd != 0.0 {
                        let factor = if c.decouple_lr {
                            let max_lr = c.max_lr.unwrap_or(c.lr);
                            1.0 - (lr / max_lr) * wd
                        } else {
                            1.0 - lr * wd
                        };
                        let _ = p.f_mul_scalar_(factor)?;
                    }

                    let mut denom = exp_avg_sq.f_sqrt()?;
                    let _ = denom.f_add_scalar_(c.eps)?;
                    match kahan_comp {
                        Some(mut comp) if kahan => {
                            ffi::addcdiv_(&mut comp, &exp_avg, &denom, -lr)?;
                            // optimi keeps the old weights in the gradient's buffer.
                            grad.f_copy_(&p.f_detach()?)?;
                            let _ = p.f_add_(&comp)?;
                            let _ = comp.f_add_(&grad.f_sub_(&p)?)?;
                        }
                        _ => ffi::addcdiv_(&mut p, &exp_avg, &denom, -lr)?,
                    }
                }
                offset += group.params.len();
            }
            Ok(())
        })
    }

    fn validate_state(&self, index: usize, param: &Tensor, state: &ParamState) -> Result<()> {
        expect_shape(index, state, "exp_avg", &param.size())?;
        expect_shape(index, state, "exp_avg_sq", &param.size())?;
        expect_shape(index, state, "eps_sq", &[])?;
        if state.tensors.contains_key("kahan_comp") {
            expect_shape(index, state, "kahan_comp", &param.size())?;
        }
        Ok(())
    }

    optimizer_accessors!();
}

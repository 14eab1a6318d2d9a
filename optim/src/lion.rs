//! Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms").
//!
//! Reference matched: lion-pytorch's `update_fn` (lucidrains/lion-pytorch, v0.2,
//! `decoupled_weight_decay=False`), which is also what bitsandbytes' 32-bit Lion
//! (`lion_32bit`, the Trainer's `OptimizerNames.LION`) computes:
//!
//! ```text
//! p       <- p * (1 - lr * wd)
//! update  <- sign(beta1 * m + (1 - beta1) * g)
//! p       <- p - lr * update
//! m       <- beta2 * m + (1 - beta2) * g
//! ```
//!
//! State per parameter: `exp_avg` only (no step count).

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::ffi;
use crate::optimizer::{
    build_groups, check_non_negative, check_unit, deep_copy, expect_shape, grad_of,
    optimizer_accessors,
};
use crate::{GroupSpec, Optimizer, ParamGroup, ParamState, Result};

/// Hyper-parameters of [`Lion`] (lion-pytorch's defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LionConfig {
    /// Learning rate (default 1e-4).
    pub lr: f64,
    /// `(beta1, beta2)` (default (0.9, 0.99)).
    pub betas: (f64, f64),
    /// Decoupled weight decay, multiplied by lr (default 0).
    pub weight_decay: f64,
}

impl Default for LionConfig {
    fn default() -> Self {
        Self {
            lr: 1e-4,
            betas: (0.9, 0.99),
            weight_decay: 0.0,
        }
    }
}

/// The Lion optimizer (sign of an interpolated momentum).
#[derive(Debug)]
pub struct Lion {
    config: LionConfig,
    groups: Vec<ParamGroup>,
    state: Vec<Option<ParamState>>,
}

impl Lion {
    /// Creates the optimizer over `groups` (each may override `lr` / `weight_decay`).
    pub fn new(groups: Vec<GroupSpec>, config: LionConfig) -> Result<Self> {
        check_non_negative("lr", config.lr)?;
        check_unit("betas[0]", config.betas.0)?;
        check_unit("betas[1]", config.betas.1)?;
        check_non_negative("weight_decay", config.weight_decay)?;
        let (groups, state) = build_groups(groups, config.lr, config.weight_decay)?;
        Ok(Self {
            config,
            groups,
            state,
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &LionConfig {
        &self.config
    }
}

impl Optimizer for Lion {
    fn name(&self) -> &'static str {
        "lion"
    }

    fn default_lr(&self) -> f64 {
        self.config.lr
    }

    fn step(&mut self) -> Result<()> {
        let (beta1, beta2) = self.config.betas;
        tch::no_grad(|| {
            let mut offset = 0;
            for group in &self.groups {
                let (lr, wd) = (group.lr, group.weight_decay);
                for (j, p) in group.params.iter().enumerate() {
                    let index = offset + j;
                    let Some(grad) = grad_of(p) else { continue };
                    let mut p = p.shallow_clone();
                    let st = self.state[index].get_or_insert_with(|| {
                        let mut st = ParamState::default();
                        st.tensors.insert("exp_avg".into(), p.zeros_like());
                        st
                    });
                    let mut exp_avg = st.handle(index, "exp_avg")?;
                    let _ = p.f_mul_scalar_(1.0 - lr * wd)?;
                    let mut interp = deep_copy(&exp_avg)?;
                    let _ = interp.f_mul_scalar_(beta1)?;
                    let mut update = ffi::add(&interp, &grad, 1.0 - beta1)?;
                    let _ = update.f_sign_()?;
                    ffi::add_(&mut p, &update, -lr)?;
                    let _ = exp_avg.f_mul_scalar_(beta2)?;
                    ffi::add_(&mut exp_avg, &grad, 1.0 - beta2)?;
                }
                offset += group.params.len();
            }
            Ok(())
        })
    }

    fn validate_state(&self, index: usize, param: &Tensor, state: &ParamState) -> Result<()> {
        expect_shape(index, state, "exp_avg", &param.size())
    }

    optimizer_accessors!();
}

//! RMSprop (torch.optim.RMSprop): the single-tensor CPU path op for op.

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::ffi;
use crate::optimizer::{
    build_groups, check_non_negative, expect_shape, grad_of, optimizer_accessors,
};
use crate::{GroupSpec, Optimizer, ParamGroup, ParamState, Result};

/// Hyper-parameters of [`RmsProp`] (torch.optim.RMSprop's arguments and defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RmsPropConfig {
    /// Learning rate (default 1e-2).
    pub lr: f64,
    /// Smoothing constant (default 0.99).
    pub alpha: f64,
    /// Term added to the denominator (default 1e-8).
    pub eps: f64,
    /// L2 penalty (default 0).
    pub weight_decay: f64,
    /// Momentum factor (default 0).
    pub momentum: f64,
    /// Normalise by an estimate of the gradient's variance (default false).
    pub centered: bool,
    /// Maximise the objective (default false).
    pub maximize: bool,
}

impl Default for RmsPropConfig {
    fn default() -> Self {
        Self {
            lr: 1e-2,
            alpha: 0.99,
            eps: 1e-8,
            weight_decay: 0.0,
            momentum: 0.0,
            centered: false,
            maximize: false,
        }
    }
}

/// RMSprop, as torch.optim.RMSprop.
#[derive(Debug)]
#[doc(alias = "RMSprop")]
pub struct RmsProp {
    config: RmsPropConfig,
    groups: Vec<ParamGroup>,
    state: Vec<Option<ParamState>>,
}

impl RmsProp {
    /// Creates the optimizer over `groups` (each may override `lr` / `weight_decay`).
    pub fn new(groups: Vec<GroupSpec>, config: RmsPropConfig) -> Result<Self> {
        check_non_negative("lr", config.lr)?;
        check_non_negative("eps", config.eps)?;
        check_non_negative("momentum", config.momentum)?;
        check_non_negative("weight_decay", config.weight_decay)?;
        check_non_negative("alpha", config.alpha)?;
        let (groups, state) = build_groups(groups, config.lr, config.weight_decay)?;
        Ok(Self {
            config,
            groups,
            state,
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &RmsPropConfig {
        &self.config
    }

    fn init_state(&self, p: &Tensor) -> ParamState {
        let mut st = ParamState::default();
        st.tensors.insert("square_avg".into(), p.zeros_like());
        if self.config.momentum > 0.0 {
            st.tensors.insert("momentum_buffer".into(), p.zeros_like());
        }
        if self.config.centered {
            st.tensors.insert("grad_avg".into(), p.zeros_like());
        }
        st
    }
}

impl Optimizer for RmsProp {
    fn name(&self) -> &'static str {
        "rmsprop"
    }

    fn default_lr(&self) -> f64 {
        self.config.lr
    }

    fn step(&mut self) -> Result<()> {
        tch::no_grad(|| {
            let c = self.config.clone();
            let mut offset = 0;
            for gi in 0..self.groups.len() {
                let (lr, weight_decay) = (self.groups[gi].lr, self.groups[gi].weight_decay);
                for j in 0..self.groups[gi].params.len() {
                    let index = offset + j;
                    let p = &self.groups[gi].params[j];
                    let Some(grad) = grad_of(p) else { continue };
                    let mut p = p.shallow_clone();
                    if self.state[index].is_none() {
                        self.state[index] = Some(self.init_state(&p));
                    }
                    let st = self.state[index].as_mut().expect("initialised above");
                    let mut grad = if c.maximize { grad.f_neg()? } else { grad };
                    let mut square_avg = st.handle(index, "square_avg")?;
                    st.step += 1;
                    if weight_decay != 0.0 {
                        grad = ffi::add(&grad, &p, weight_decay)?;
                    }
                    let _ = square_avg.f_mul_scalar_(c.alpha)?;
                    ffi::addcmul_(&mut square_avg, &grad, &grad, 1.0 - c.alpha)?;
                    let mut avg = if c.centered {
                        let mut grad_avg = st.handle(index, "grad_avg")?;
                        let _ = grad_avg.f_lerp_(&grad, 1.0 - c.alpha)?;
                        let mut avg = ffi::addcmul(&square_avg, &grad_avg, &grad_avg, -1.0)?;
                        let _ = avg.f_sqrt_()?;
                        avg
                    } else {
                        square_avg.f_sqrt()?
                    };
                    let _ = avg.f_add_scalar_(c.eps)?;
                    if c.momentum > 0.0 {
                        let mut buf = st.handle(index, "momentum_buffer")?;
                        let _ = buf.f_mul_scalar_(c.momentum)?;
                        ffi::addcdiv_(&mut buf, &grad, &avg, 1.0)?;
                        ffi::add_(&mut p, &buf, -lr)?;
                    } else {
                        ffi::addcdiv_(&mut p, &grad, &avg, -lr)?;
                    }
                }
                offset += self.groups[gi].params.len();
            }
            Ok(())
        })
    }

    fn validate_state(&self, index: usize, param: &Tensor, state: &ParamState) -> Result<()> {
        let shape = param.size();
        expect_shape(index, state, "square_avg", &shape)?;
        if self.config.momentum > 0.0 {
            expect_shape(index, state, "momentum_buffer", &shape)?;
        }
        if self.config.centered {
            expect_shape(index, state, "grad_avg", &shape)?;
        }
        Ok(())
    }

    optimizer_accessors!();
}

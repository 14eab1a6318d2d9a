//! SGD with momentum, dampening, Nesterov and weight decay (torch.optim.SGD): the
//! single-tensor CPU path op for op, or libtorch's `_fused_sgd_` kernel.

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::ffi::{self, FusedSgdArgs};
use crate::optimizer::{
    build_groups, check_non_negative, deep_copy, expect_shape, grad_of, optimizer_accessors,
};
use crate::{Error, GroupSpec, Optimizer, ParamGroup, ParamState, Result};

/// Hyper-parameters of [`Sgd`] (torch.optim.SGD's arguments and defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SgdConfig {
    /// Learning rate (default 1e-3).
    pub lr: f64,
    /// Momentum factor (default 0).
    pub momentum: f64,
    /// Dampening for momentum (default 0).
    pub dampening: f64,
    /// L2 penalty (default 0).
    pub weight_decay: f64,
    /// Nesterov momentum (default false; needs momentum > 0 and dampening = 0).
    pub nesterov: bool,
    /// Maximise the objective (default false).
    pub maximize: bool,
    /// Use libtorch's fused kernel `_fused_sgd_` (default false).
    pub fused: bool,
}

impl Default for SgdConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            maximize: false,
            fused: false,
        }
    }
}

/// Stochastic gradient descent, as torch.optim.SGD.
#[derive(Debug)]
pub struct Sgd {
    config: SgdConfig,
    groups: Vec<ParamGroup>,
    state: Vec<Option<ParamState>>,
}

impl Sgd {
    /// Creates the optimizer over `groups` (each may override `lr` / `weight_decay`).
    pub fn new(groups: Vec<GroupSpec>, config: SgdConfig) -> Result<Self> {
        check_non_negative("lr", config.lr)?;
        check_non_negative("momentum", config.momentum)?;
        check_non_negative("weight_decay", config.weight_decay)?;
        if config.nesterov && (config.momentum <= 0.0 || config.dampening != 0.0) {
            return Err(Error::ConflictingOptions(
                "Nesterov momentum requires a momentum and zero dampening",
            ));
        }
        let (groups, state) = build_groups(groups, config.lr, config.weight_decay)?;
        Ok(Self {
            config,
            groups,
            state,
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &SgdConfig {
        &self.config
    }

    fn single_tensor(&mut self) -> Result<()> {
        let c = &self.config;
        let mut offset = 0;
        for group in &self.groups {
            for (j, p) in group.params.iter().enumerate() {
                let index = offset + j;
                let Some(grad) = grad_of(p) else { continue };
                let mut p = p.shallow_clone();
                let mut grad = if c.maximize { grad.f_neg()? } else { grad };
                if group.weight_decay != 0.0 {
                    grad = ffi::add(&grad, &p, group.weight_decay)?;
                }
                if c.momentum != 0.0 {
                    let st = self.state[index].get_or_insert_with(ParamState::default);
                    let buf = match st.tensors.get("momentum_buffer") {
                        None => {
                            let buf = deep_copy(&grad)?;
                            st.tensors
                                .insert("momentum_buffer".into(), buf.shallow_clone());
                            buf
                        }
                        Some(buf) => {
                            let mut buf = buf.shallow_clone();
                            let _ = buf.f_mul_scalar_(c.momentum)?;
                            ffi::add_(&mut buf, &grad, 1.0 - c.dampening)?;
                            buf
                        }
                    };
                    grad = if c.nesterov {
                        ffi::add(&grad, &buf, c.momentum)?
                    } else {
                        buf
                    };
                }
                ffi::add_(&mut p, &grad, -group.lr)?;
            }
            offset += group.params.len();
        }
        Ok(())
    }

    fn fused(&mut self) -> Result<()> {
        let c = self.config.clone();
        let mut offset = 0;
        for group in &self.groups {
            let mut members = Vec::new();
            for (j, p) in group.params.iter().enumerate() {
                if let Some(g) = grad_of(p) {
                    members.push((offset + j, p.shallow_clone(), g));
                }
            }
            offset += group.params.len();
            if members.is_empty() {
                continue;
            }
            let has_momentum = c.momentum != 0.0;
            let is_first_step = has_momentum
                && members.iter().all(|(i, _, _)| {
                    self.state[*i]
                        .as_ref()
                        .is_none_or(|s| !s.tensors.contains_key("momentum_buffer"))
                });
            let mut bufs = Vec::new();
            for (i, _, g) in &members {
                if has_momentum {
                    let st = self.state[*i].get_or_insert_with(ParamState::default);
                    if is_first_step {
                        st.tensors
                            .insert("momentum_buffer".into(), g.f_empty_like()?);
                    }
                    bufs.push(st.handle(*i, "momentum_buffer")?);
                }
            }
            let mut buckets: Vec<((Device, Kind), Vec<usize>)> = Vec::new();
            for (k, (_, p, _)) in members.iter().enumerate() {
                let key = (p.device(), p.kind());
                match buckets.iter_mut().find(|(b, _)| *b == key) {
                    Some((_, v)) => v.push(k),
                    None => buckets.push((key, vec![k])),
                }
            }
            for (_, ks) in buckets {
                let params: Vec<&Tensor> = ks.iter().map(|&k| &members[k].1).collect();
                let grads: Vec<&Tensor> = ks.iter().map(|&k| &members[k].2).collect();
                let b: Vec<&Tensor> = if has_momentum {
                    ks.iter().map(|&k| &bufs[k]).collect()
                } else {
                    Vec::new()
                };
                ffi::fused_sgd(
                    &params,
                    &grads,
                    &b,
                    FusedSgdArgs {
                        weight_decay: group.weight_decay,
                        momentum: c.momentum,
                        lr: group.lr,
                        dampening: c.dampening,
                        nesterov: c.nesterov,
                        maximize: c.maximize,
                        is_first_step,
                    },
                )?;
            }
        }
        Ok(())
    }
}

impl Optimizer for Sgd {
    fn name(&self) -> &'static str {
        "sgd"
    }

    fn step_supports_amp_scaling(&self) -> bool {
        self.config.fused
    }

    fn default_lr(&self) -> f64 {
        self.config.lr
    }

    fn step(&mut self) -> Result<()> {
        tch::no_grad(|| {
            if self.config.fused {
                self.fused()
            } else {
                self.single_tensor()
            }
        })
    }

    fn validate_state(&self, index: usize, param: &Tensor, state: &ParamState) -> Result<()> {
        if state.tensors.contains_key("momentum_buffer") {
            expect_shape(index, state, "momentum_buffer", &param.size())?;
        }
        Ok(())
    }

    optimizer_accessors!();
}

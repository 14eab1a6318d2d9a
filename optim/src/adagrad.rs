//! Adagrad (torch.optim.Adagrad): the single-tensor CPU path op for op (dense gradients).

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::ffi;
use crate::optimizer::{
    build_groups, check_non_negative, expect_shape, grad_of, optimizer_accessors,
};
use crate::{GroupSpec, Optimizer, ParamGroup, ParamState, Result};

/// Hyper-parameters of [`Adagrad`] (torch.optim.Adagrad's arguments and defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdagradConfig {
    /// Learning rate (default 1e-2).
    pub lr: f64,
    /// Learning-rate decay (default 0).
    pub lr_decay: f64,
    /// L2 penalty (default 0).
    pub weight_decay: f64,
    /// Initial value of the sum of squares (default 0).
    pub initial_accumulator_value: f64,
    /// Term added to the denominator (default 1e-10).
    pub eps: f64,
    /// Maximise the objective (default false).
    pub maximize: bool,
}

impl Default for AdagradConfig {
    fn default() -> Self {
        Self {
            lr: 1e-2,
            lr_decay: 0.0,
            weight_decay: 0.0,
            initial_accumulator_value: 0.0,
            eps: 1e-10,
            maximize: false,
        }
    }
}

/// Adagrad, as torch.optim.Adagrad (state is created eagerly, as torch does).
#[derive(Debug)]
pub struct Adagrad {
    config: AdagradConfig,
    groups: Vec<ParamGroup>,
    state: Vec<Option<ParamState>>,
}

impl Adagrad {
    /// Creates the optimizer over `groups` (each may override `lr` / `weight_decay`).
    pub fn new(groups: Vec<GroupSpec>, config: AdagradConfig) -> Result<Self> {
        check_non_negative("lr", config.lr)?;
        check_non_negative("lr_decay", config.lr_decay)?;
        check_non_negative("weight_decay", config.weight_decay)?;
        check_non_negative(
            "initial_accumulator_value",
            config.initial_accumulator_value,
        )?;
        check_non_negative("eps", config.eps)?;
        let (groups, mut state) = build_groups(groups, config.lr, config.weight_decay)?;
        let params = groups.iter().flat_map(|g| g.params.iter());
        for (slot, p) in state.iter_mut().zip(params) {
            let mut st = ParamState::default();
            st.tensors.insert(
                "sum".into(),
                p.f_full_like(config.initial_accumulator_value)?,
            );
            *slot = Some(st);
        }
        Ok(Self {
            config,
            groups,
            state,
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &AdagradConfig {
        &self.config
    }
}

impl Optimizer for Adagrad {
    fn name(&self) -> &'static str {
        "adagrad"
    }

    fn default_lr(&self) -> f64 {
        self.config.lr
    }

    fn step(&mut self) -> Result<()> {
        let c = &self.config;
        tch::no_grad(|| {
            let mut offset = 0;
            for group in &self.groups {
                for (j, p) in group.params.iter().enumerate() {
                    let index = offset + j;
                    let Some(grad) = grad_of(p) else { continue };
                    let mut p = p.shallow_clone();
                    let st = self.state[index].get_or_insert_with(ParamState::default);
                    if !st.tensors.contains_key("sum") {
                        st.tensors
                            .insert("sum".into(), p.f_full_like(c.initial_accumulator_value)?);
                    }
                    let mut state_sum = st.handle(index, "sum")?;
                    st.step += 1;
                    let step = st.step as f64;
                    let mut grad = if c.maximize { grad.f_neg()? } else { grad };
                    if group.weight_decay != 0.0 {
                        grad = ffi::add(&grad, &p, group.weight_decay)?;
                    }
                    let clr = group.lr / (1.0 + (step - 1.0) * c.lr_decay);
                    ffi::addcmul_(&mut state_sum, &grad, &grad, 1.0)?;
                    let mut std = state_sum.f_sqrt()?;
                    let _ = std.f_add_scalar_(c.eps)?;
                    ffi::addcdiv_(&mut p, &grad, &std, -clr)?;
                }
                offset += group.params.len();
            }
            Ok(())
        })
    }

    fn validate_state(&self, index: usize, param: &Tensor, state: &ParamState) -> Result<()> {
        expect_shape(index, state, "sum", &param.size())
    }

    optimizer_accessors!();
}

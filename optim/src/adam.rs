//! Adam (torch.optim.Adam) and the update shared with AdamW: torch's single-tensor CPU path
//! (`_single_tensor_adam`) op for op, and the fused kernels (`_fused_adam_` / `_fused_adamw_`).

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::ffi::{self, FusedAdamArgs, FusedAdamTensors};
use crate::optimizer::{
    build_groups, check_non_negative, check_unit, expect_shape, grad_of, optimizer_accessors,
};
use crate::{GroupSpec, Optimizer, ParamGroup, ParamState, Result};

/// Hyper-parameters of [`Adam`] (torch.optim.Adam's arguments and defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdamConfig {
    /// Learning rate (default 1e-3).
    pub lr: f64,
    /// `(beta1, beta2)` (default (0.9, 0.999)).
    pub betas: (f64, f64),
    /// Term added to the denominator (default 1e-8).
    pub eps: f64,
    /// L2 penalty added to the gradient (default 0).
    pub weight_decay: f64,
    /// AMSGrad variant (default false).
    pub amsgrad: bool,
    /// Maximise the objective (default false).
    pub maximize: bool,
    /// Use libtorch's fused kernel `_fused_adam_` (default false).
    pub fused: bool,
}

impl Default for AdamConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            amsgrad: false,
            maximize: false,
            fused: false,
        }
    }
}

impl AdamConfig {
    /// torch's argument checks.
    pub(crate) fn validate(&self) -> Result<()> {
        check_non_negative("lr", self.lr)?;
        check_non_negative("eps", self.eps)?;
        check_unit("betas[0]", self.betas.0)?;
        check_unit("betas[1]", self.betas.1)?;
        check_non_negative("weight_decay", self.weight_decay)
    }
}

/// Adam with L2 weight decay, as torch.optim.Adam.
#[derive(Debug)]
pub struct Adam {
    config: AdamConfig,
    groups: Vec<ParamGroup>,
    state: Vec<Option<ParamState>>,
}

impl Adam {
    /// Creates the optimizer over `groups` (each may override `lr` / `weight_decay`).
    pub fn new(groups: Vec<GroupSpec>, config: AdamConfig) -> Result<Self> {
        config.validate()?;
        let (groups, state) = build_groups(groups, config.lr, config.weight_decay)?;
        Ok(Self {
            config,
            groups,
            state,
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &AdamConfig {
        &self.config
    }
}

impl Optimizer for Adam {
    fn name(&self) -> &'static str {
        "adam"
    }

    fn step_supports_amp_scaling(&self) -> bool {
        self.config.fused
    }

    fn default_lr(&self) -> f64 {
        self.config.lr
    }

    fn step(&mut self) -> Result<()> {
        adam_step(&self.groups, &mut self.state, &self.config, false)
    }

    fn validate_state(&self, index: usize, param: &Tensor, state: &ParamState) -> Result<()> {
        validate_adam_state(index, param, state, self.config.amsgrad)
    }

    optimizer_accessors!();
}

/// Checks the entries torch's Adam keeps per parameter.
pub(crate) fn validate_adam_state(
    index: usize,
    param: &Tensor,
    state: &ParamState,
    amsgrad: bool,
) -> Result<()> {
    let shape = param.size();
    expect_shape(index, state, "exp_avg", &shape)?;
    expect_shape(index, state, "exp_avg_sq", &shape)?;
    if amsgrad {
        expect_shape(index, state, "max_exp_avg_sq", &shape)?;
    }
    Ok(())
}

/// One Adam / AdamW step over all groups (`decoupled`: AdamW's decoupled weight decay).
pub(crate) fn adam_step(
    groups: &[ParamGroup],
    state: &mut [Option<ParamState>],
    config: &AdamConfig,
    decoupled: bool,
) -> Result<()> {
    tch::no_grad(|| {
        let mut offset = 0;
        for group in groups {
            let mut with_grad = Vec::new();
            for (j, p) in group.params.iter().enumerate() {
                let index = offset + j;
                let Some(grad) = grad_of(p) else { continue };
                let st = state[index].get_or_insert_with(|| init_adam_state(p, config.amsgrad));
                if config.amsgrad && !st.tensors.contains_key("max_exp_avg_sq") {
                    // amsgrad switched on after a resume: torch would fail; start from zeros.
                    st.tensors.insert("max_exp_avg_sq".into(), p.zeros_like());
                }
                with_grad.push((index, p.shallow_clone(), grad));
            }
            if config.fused {
                fused_adam_group(&with_grad, state, group, config, decoupled)?;
            } else {
                for (index, mut p, grad) in with_grad {
                    let st = state[index].as_mut().expect("initialised above");
                    single_tensor_adam(index, &mut p, &grad, st, group, config, decoupled)?;
                }
            }
            offset += group.params.len();
        }
        Ok(())
    })
}

fn init_adam_state(p: &Tensor, amsgrad: bool) -> ParamState {
    let mut st = ParamState::default();
    st.tensors.insert("exp_avg".into(), p.zeros_like());
    st.tensors.insert("exp_avg_sq".into(), p.zeros_like());
    if amsgrad {
        st.tensors.insert("max_exp_avg_sq".into(), p.zeros_like());
    }
    st
}

/// `_single_tensor_adam` for one parameter (capturable=False, differentiable=False).
fn single_tensor_adam(
    index: usize,
    p: &mut Tensor,
    grad: &Tensor,
    st: &mut ParamState,
    group: &ParamGroup,
    config: &AdamConfig,
    decoupled: bool,
) -> Result<()> {
    let (beta1, beta2) = config.betas;
    let (lr, weight_decay) = (group.lr, group.weight_decay);
    let mut grad = if config.maximize {
        grad.f_neg()?
    } else {
        grad.shallow_clone()
    };
    let mut exp_avg = st.handle(index, "exp_avg")?;
    let mut exp_avg_sq = st.handle(index, "exp_avg_sq")?;

    st.step += 1;

    if weight_decay != 0.0 {
        if decoupled {
            let _ = p.f_mul_scalar_(1.0 - lr * weight_decay)?;
        } else {
            grad = ffi::add(&grad, p, weight_decay)?;
        }
    }

    let _ = exp_avg.f_lerp_(&grad, 1.0 - beta1)?;
    let _ = exp_avg_sq.f_mul_scalar_(beta2)?;
    ffi::addcmul_(&mut exp_avg_sq, &grad, &grad, 1.0 - beta2)?;

    // torch keeps `step` as a float tensor and reads it back with `.item()`.
    let step = st.step as f64;
    let bias_correction1 = 1.0 - beta1.powf(step);
    let bias_correction2 = 1.0 - beta2.powf(step);
    let step_size = lr / bias_correction1;
    let bias_correction2_sqrt = bias_correction2.powf(0.5);

    let mut denom = if config.amsgrad {
        let max_exp_avg_sq = st.handle(index, "max_exp_avg_sq")?;
        let _ = max_exp_avg_sq.f_maximum_out(&max_exp_avg_sq, &exp_avg_sq)?;
        max_exp_avg_sq
            .f_sqrt()?
            .f_div_scalar(bias_correction2_sqrt)?
    } else {
        exp_avg_sq.f_sqrt()?.f_div_scalar(bias_correction2_sqrt)?
    };
    let _ = denom.f_add_scalar_(config.eps)?;
    ffi::addcdiv_(p, &exp_avg, &denom, -step_size)
}

/// `_fused_adam` for one group: tensors grouped by (device, dtype), steps incremented, then
/// one `_fused_adam(w)_` call per bucket.
fn fused_adam_group(
    with_grad: &[(usize, Tensor, Tensor)],
    state: &mut [Option<ParamState>],
    group: &ParamGroup,
    config: &AdamConfig,
    decoupled: bool,
) -> Result<()> {
    let mut buckets: Vec<((Device, Kind), Vec<usize>)> = Vec::new();
    for (k, (_, p, _)) in with_grad.iter().enumerate() {
        let key = (p.device(), p.kind());
        match buckets.iter_mut().find(|(b, _)| *b == key) {
            Some((_, v)) => v.push(k),
            None => buckets.push((key, vec![k])),
        }
    }
    for ((device, _), members) in buckets {
        let mut steps = Vec::new();
        let mut moments = Vec::new();
        for &k in &members {
            let index = with_grad[k].0;
            let st = state[index].as_mut().expect("initialised by adam_step");
            st.step += 1;
            steps.push(Tensor::f_scalar_tensor(
                st.step as f64,
                (Kind::Float, device),
            )?);
            let max = if config.amsgrad {
                Some(st.handle(index, "max_exp_avg_sq")?)
            } else {
                None
            };
            moments.push((
                st.handle(index, "exp_avg")?,
                st.handle(index, "exp_avg_sq")?,
                max,
            ));
        }
        let params: Vec<&Tensor> = members.iter().map(|&k| &with_grad[k].1).collect();
        let grads: Vec<&Tensor> = members.iter().map(|&k| &with_grad[k].2).collect();
        let exp_avgs: Vec<&Tensor> = moments.iter().map(|m| &m.0).collect();
        let exp_avg_sqs: Vec<&Tensor> = moments.iter().map(|m| &m.1).collect();
        let max_exp_avg_sqs: Vec<&Tensor> = moments.iter().filter_map(|m| m.2.as_ref()).collect();
        let state_steps: Vec<&Tensor> = steps.iter().collect();
        ffi::fused_adam(
            &FusedAdamTensors {
                params: &params,
                grads: &grads,
                exp_avgs: &exp_avgs,
                exp_avg_sqs: &exp_avg_sqs,
                max_exp_avg_sqs: &max_exp_avg_sqs,
                state_steps: &state_steps,
            },
            FusedAdamArgs {
                lr: group.lr,
                beta1: config.betas.0,
                beta2: config.betas.1,
                weight_decay: group.weight_decay,
                eps: config.eps,
                amsgrad: config.amsgrad,
                maximize: config.maximize,
                decoupled,
            },
        )?;
    }
    Ok(())
}

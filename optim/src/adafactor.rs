//! Adafactor, as upstream transformers' `optimization.Adafactor` (fairseq's port), op for op:
//! factored second moments for tensors with 2+ dims, relative step sizes, parameter scaling,
//! warmup init, update clipping, optional first moment, and the proxy `AdafactorSchedule`'s
//! lr read-out ([`Adafactor::get_lr`]).

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::ffi;
use crate::low_rank::Projector;
use crate::optimizer::{
    build_groups, check_non_negative, expect_shape, grad_of, is_reduced, optimizer_accessors,
};
use crate::{Error, GroupSpec, Optimizer, ParamGroup, ParamState, Result};

/// Hyper-parameters of [`Adafactor`] (upstream's arguments and defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdafactorConfig {
    /// External learning rate; `None` with `relative_step` (the default).
    pub lr: Option<f64>,
    /// Regularisation constants for the squared gradient and the parameter scale
    /// (default (1e-30, 1e-3)).
    pub eps: (f64, f64),
    /// Threshold of the root mean square of the final update (default 1.0).
    pub clip_threshold: f64,
    /// Coefficient of the running average of the squared gradient (default -0.8).
    pub decay_rate: f64,
    /// Coefficient of the running average of the gradient; `None` keeps no first moment.
    pub beta1: Option<f64>,
    /// Weight decay (default 0).
    pub weight_decay: f64,
    /// Scale the learning rate by the parameter's RMS (default true).
    pub scale_parameter: bool,
    /// Compute a time-dependent learning rate instead of the external one (default true).
    pub relative_step: bool,
    /// Warm-up initialisation of the relative step (default false).
    pub warmup_init: bool,
}

impl Default for AdafactorConfig {
    fn default() -> Self {
        Self {
            lr: None,
            eps: (1e-30, 1e-3),
            clip_threshold: 1.0,
            decay_rate: -0.8,
            beta1: None,
            weight_decay: 0.0,
            scale_parameter: true,
            relative_step: true,
            warmup_init: false,
        }
    }
}

/// Adafactor (Shazeer & Stern 2018), as upstream transformers implements it.
#[derive(Debug)]
pub struct Adafactor {
    config: AdafactorConfig,
    groups: Vec<ParamGroup>,
    state: Vec<Option<ParamState>>,
}

impl Adafactor {
    /// Creates the optimizer over `groups` (each may override `lr` / `weight_decay`).
    pub fn new(groups: Vec<GroupSpec>, config: AdafactorConfig) -> Result<Self> {
        if config.lr.is_some() && config.relative_step {
            return Err(Error::ConflictingOptions(
                "Cannot combine manual `lr` and `relative_step=True` options",
            ));
        }
        if config.warmup_init && !config.relative_step {
            return Err(Error::ConflictingOptions(
                "`warmup_init=True` requires `relative_step=True`",
            ));
        }
        if let Some(lr) = config.lr {
            check_non_negative("lr", lr)?;
        }
        check_non_negative("weight_decay", config.weight_decay)?;
        let (groups, state) = build_groups(groups, config.lr.unwrap_or(0.0), config.weight_decay)?;
        Ok(Self {
            config,
            groups,
            state,
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &AdafactorConfig {
        &self.config
    }

    /// The step size of group `group` as upstream's `_get_lr` computes it from the state of
    /// the group's first parameter (what `AdafactorSchedule.get_lr` reports); `None` before
    /// that parameter has been stepped.
    pub fn get_lr(&self, group: usize) -> Option<f64> {
        let g = self.groups.get(group)?;
        let first: usize = self.groups[..group].iter().map(|g| g.params.len()).sum();
        if g.params.is_empty() {
            return None;
        }
        let st = self.state.get(first)?.as_ref()?;
        Some(lr_of(&self.config, g.lr, st.step, *st.scalars.get("RMS")?))
    }
}

/// Upstream's `_get_lr`. `rms` is the f32 RMS value; when it wins the `max`, upstream's lr is
/// a float32 tensor (`param_scale * rel_step_sz`), reproduced by rounding to f32.
fn lr_of(c: &AdafactorConfig, group_lr: f64, step: u64, rms: f64) -> f64 {
    let mut rel_step_sz = group_lr;
    if c.relative_step {
        let step = step as f64;
        let min_step = if c.warmup_init { 1e-6 * step } else { 1e-2 };
        rel_step_sz = min_step.min(1.0 / step.sqrt());
    }
    if c.scale_parameter {
        // Python `max(eps1, RMS_tensor)` keeps eps1 unless RMS > eps1.
        if rms > c.eps.1 {
            return ((rms as f32) * (rel_step_sz as f32)) as f64;
        }
        return c.eps.1 * rel_step_sz;
    }
    rel_step_sz
}

/// `tensor.norm(2) / numel ** 0.5`.
fn rms(t: &Tensor) -> Result<Tensor> {
    let numel = t.numel() as f64;
    Ok(ffi::vector_norm(t, 2.0)?.f_div_scalar(numel.powf(0.5))?)
}

impl Optimizer for Adafactor {
    fn name(&self) -> &'static str {
        "adafactor"
    }

    fn default_lr(&self) -> f64 {
        self.config.lr.unwrap_or(0.0)
    }

    fn step(&mut self) -> Result<()> {
        let c = self.config.clone();
        tch::no_grad(|| {
            let mut offset = 0;
            for group in &self.groups {
                for (j, p) in group.params.iter().enumerate() {
                    let index = offset + j;
                    let Some(grad) = grad_of(p) else { continue };
                    let st = self.state[index].get_or_insert_with(ParamState::default);
                    adafactor_update(&c, group, p, index, st, grad, None)?;
                }
                offset += group.params.len();
            }
            Ok(())
        })
    }

    fn validate_state(&self, index: usize, param: &Tensor, state: &ParamState) -> Result<()> {
        validate_moments(&self.config, index, &param.size(), state)
    }

    optimizer_accessors!();
}

/// Checks Adafactor's moments of parameter `index` against the shape they factor (the
/// parameter's, or GaLore's projected one): `exp_avg` with `beta1`, row and column factors
/// for two or more dimensions, else `exp_avg_sq`.
pub(crate) fn validate_moments(
    c: &AdafactorConfig,
    index: usize,
    shape: &[i64],
    state: &ParamState,
) -> Result<()> {
    if c.beta1.is_some() {
        expect_shape(index, state, "exp_avg", shape)?;
    }
    if shape.len() >= 2 {
        let row = &shape[..shape.len() - 1];
        let mut col = shape[..shape.len() - 2].to_vec();
        col.push(shape[shape.len() - 1]);
        expect_shape(index, state, "exp_avg_sq_row", row)?;
        expect_shape(index, state, "exp_avg_sq_col", &col)?;
    } else {
        expect_shape(index, state, "exp_avg_sq", shape)?;
    }
    Ok(())
}

/// The Adafactor update of one parameter `p` (flat index `index`) with gradient `grad`, op for
/// op as upstream's loop body. With a `projector` it is galore_torch's `GaLoreAdafactor`: the
/// gradient is projected (at the step count before the increment) before the moments are
/// initialised or updated, and the update projected back before the weight decay.
pub(crate) fn adafactor_update(
    c: &AdafactorConfig,
    group: &ParamGroup,
    p: &Tensor,
    index: usize,
    st: &mut ParamState,
    mut grad: Tensor,
    projector: Option<&Projector<'_>>,
) -> Result<()> {
    if is_reduced(grad.kind()) {
        grad = grad.f_to_kind(Kind::Float)?;
    }
    if let Some(pr) = projector {
        grad = pr.project(st, &grad, st.step)?;
    }
    let shape = grad.size();
    let factored = shape.len() >= 2;
    let use_first_moment = c.beta1.is_some();
    // Upstream's `"RMS" not in state` (GaLore; plain Adafactor tests `len(state) == 0`, the
    // same here: both set `RMS` with the moments).
    if !st.scalars.contains_key("RMS") {
        st.step = 0;
        if use_first_moment {
            st.tensors.insert("exp_avg".into(), grad.f_zeros_like()?);
        }
        let opts = (grad.kind(), grad.device());
        if factored {
            let row = &shape[..shape.len() - 1];
            let mut col = shape[..shape.len() - 2].to_vec();
            col.push(shape[shape.len() - 1]);
            st.tensors
                .insert("exp_avg_sq_row".into(), Tensor::f_zeros(row, opts)?);
            st.tensors
                .insert("exp_avg_sq_col".into(), Tensor::f_zeros(&col, opts)?);
        } else {
            st.tensors.insert("exp_avg_sq".into(), grad.f_zeros_like()?);
        }
        st.scalars.insert("RMS".into(), 0.0);
    } else {
        for key in MOMENTS {
            if let Some(t) = st.tensors.get_mut(key)
                && (t.kind() != grad.kind() || t.device() != grad.device())
            {
                *t = t.f_to_device(grad.device())?.f_to_kind(grad.kind())?;
            }
        }
    }

    let mut p_orig = p.shallow_clone();
    let mut p32 = if is_reduced(p.kind()) {
        p.f_to_kind(Kind::Float)?
    } else {
        p.shallow_clone()
    };

    st.step += 1;
    let rms_p = rms(&p32)?.f_double_value(&[])?;
    st.scalars.insert("RMS".into(), rms_p);
    let lr = lr_of(c, group.lr, st.step, rms_p);
    // Whether upstream's lr is the float32 tensor (RMS won the max).
    let lr_is_tensor = c.scale_parameter && rms_p > c.eps.1;

    let beta2t = 1.0 - (st.step as f64).powf(c.decay_rate);
    let mut update = grad.f_pow_tensor_scalar(2)?;
    let _ = update.f_add_scalar_(c.eps.0)?;
    let mut update = if factored {
        let mut row = st.handle(index, "exp_avg_sq_row")?;
        let mut col = st.handle(index, "exp_avg_sq_col")?;
        let _ = row.f_mul_scalar_(beta2t)?;
        ffi::add_(
            &mut row,
            &update.f_mean_dim(-1, false, None::<Kind>)?,
            1.0 - beta2t,
        )?;
        let _ = col.f_mul_scalar_(beta2t)?;
        ffi::add_(
            &mut col,
            &update.f_mean_dim(-2, false, None::<Kind>)?,
            1.0 - beta2t,
        )?;
        // _approx_sq_grad
        let mut r = row.f_div(&row.f_mean_dim(-1, true, None::<Kind>)?)?;
        let _ = r.f_rsqrt_()?;
        let r = r.f_unsqueeze(-1)?;
        let cf = col.f_unsqueeze(-2)?.f_rsqrt()?;
        let mut u = r.f_mul(&cf)?;
        let _ = u.f_mul_(&grad)?;
        u
    } else {
        let mut v = st.handle(index, "exp_avg_sq")?;
        let _ = v.f_mul_scalar_(beta2t)?;
        ffi::add_(&mut v, &update, 1.0 - beta2t)?;
        let mut u = v.f_rsqrt()?;
        let _ = u.f_mul_(&grad)?;
        u
    };
    let mut clip = rms(&update)?.f_div_scalar(c.clip_threshold)?;
    let _ = clip.f_clamp_min_(1.0)?;
    let _ = update.f_div_(&clip)?;
    let _ = update.f_mul_scalar_(lr)?;

    if let Some(beta1) = c.beta1 {
        let mut exp_avg = st.handle(index, "exp_avg")?;
        let _ = exp_avg.f_mul_scalar_(beta1)?;
        ffi::add_(&mut exp_avg, &update, 1.0 - beta1)?;
        update = exp_avg;
    }

    if let Some(pr) = projector {
        update = pr.project_back(st, &update)?;
    }

    if group.weight_decay != 0.0 {
        let alpha = if lr_is_tensor {
            // `-wd * lr` with lr a float32 tensor is computed in float32.
            ((-group.weight_decay) as f32 * lr as f32) as f64
        } else {
            -group.weight_decay * lr
        };
        let p_copy = p32.shallow_clone();
        ffi::add_(&mut p32, &p_copy, alpha)?;
    }
    let _ = p32.f_add_(&update.f_neg()?)?;
    if is_reduced(p_orig.kind()) {
        p_orig.f_copy_(&p32)?;
    }
    Ok(())
}

/// Adafactor's moment entries (upstream's `.to(grad)` moves these, not a projector's).
const MOMENTS: [&str; 4] = ["exp_avg", "exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_sq"];

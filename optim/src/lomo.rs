//! LOMO and AdaLomo (Lv et al. 2023/2024, "Full Parameter Fine-tuning for Large Language
//! Models with Limited Resources" / "AdaLomo"): the update is taken from each parameter's
//! gradient during the backward pass, and the gradient is dropped at once, so no gradient
//! set and no optimizer state (LOMO) or a factored second moment only (AdaLomo) is kept.
//! Upstream's `lomo` / `adalomo`.
//!
//! Reference matched: PyPI lomo-optim 0.1.1 (`Lomo.fuse_update`, `AdaLomo.fuse_update`, the
//! non-ZeRO path), as upstream's Trainer drives them: `Lomo(model, lr)` / `AdaLomo(model,
//! lr)` with the package's other defaults, `accelerator.backward(loss, learning_rate=lr)`
//! calling `optimizer.fused_backward(loss, lr)` with the scheduler's current rate, and
//! `optimizer.step()` a no-op. Per parameter, LOMO:
//!
//! ```text
//! p <- p * (1 - lr * wd)       (wd = 0 under the Trainer)
//! p <- p - lr * g
//! ```
//!
//! AdaLomo (step count `t`, counted per `fused_backward`; loss scaled by `loss_scale` before
//! the backward and the gradient divided by it after):
//!
//! ```text
//! beta2t <- 1 - t ** decay_rate
//! u      <- g^2 + eps[0]
//! 2-D:   r <- r * beta2t + (1 - beta2t) * mean(u, -1);  c <- c * beta2t + (1 - beta2t) * mean(u, -2)
//!        u <- rsqrt(r / mean(r)) x rsqrt(c) * g
//! 1-D:   v <- v * beta2t + (1 - beta2t) * u;  u <- rsqrt(v) * g
//! u      <- u / max(rms(u) / clip_threshold, 1)
//! lr'    <- lr * max(eps[1], rms(p))
//! p      <- p * (1 - lr' * wd) - lr' * u
//! ```
//!
//! How the backward is fused here: `fused_backward` runs the backward, then updates every
//! parameter from its gradient and drops the gradient, in parameter order. The package does the
//! same updates from hooks while the backward runs; as no update feeds another parameter's
//! gradient, the numbers are the same. What differs is the peak memory: here every gradient
//! exists at the end of the backward, as in plain training.
//! Not mirrored: the fp16 loss scaler LOMO creates when the loss itself is float16 (refused),
//! the grad-norm pre-pass (`clip_grad_norm`, which the Trainer does not pass) and ZeRO-3.

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::ffi;
use crate::optimizer::{
    build_groups, check_non_negative, expect_shape, grad_of, optimizer_accessors,
};
use crate::{Error, GroupSpec, Optimizer, ParamGroup, ParamState, Result};

/// Hyper-parameters of [`Lomo`] (the package's defaults; the Trainer passes `lr` only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LomoConfig {
    /// Learning rate (default 1e-3; each `fused_backward` sets the current one).
    pub lr: f64,
    /// Clamps every gradient entry to `[-v, v]` first (default none).
    pub clip_grad_value: Option<f64>,
    /// Weight decay, multiplied by lr (default 0).
    pub weight_decay: f64,
}

impl Default for LomoConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            clip_grad_value: None,
            weight_decay: 0.0,
        }
    }
}

/// Hyper-parameters of [`AdaLomo`] (the package's defaults; the Trainer passes `lr` only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdaLomoConfig {
    /// Learning rate (default 1e-3; each `fused_backward` sets the current one).
    pub lr: f64,
    /// The loss is multiplied by it before the backward, the gradients divided by it after
    /// (default 1024; 0 disables).
    pub loss_scale: f64,
    /// `(eps for the squared gradient, floor of the parameter RMS)` (default (1e-30, 1e-3)).
    pub eps: (f64, f64),
    /// RMS threshold of the update (default 1.0).
    pub clip_threshold: f64,
    /// Exponent of the second-moment decay `1 - t ** decay_rate` (default -0.8).
    pub decay_rate: f64,
    /// Clamps every gradient entry to `[-v, v]` first (default none).
    pub clip_grad_value: Option<f64>,
    /// Weight decay, multiplied by the scaled lr (default 0).
    pub weight_decay: f64,
    /// Backward passes taken (the package's `step_num`), restored with the state.
    pub step_num: u64,
}

impl Default for AdaLomoConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            loss_scale: 1024.0,
            eps: (1e-30, 1e-3),
            clip_threshold: 1.0,
            decay_rate: -0.8,
            clip_grad_value: None,
            weight_decay: 0.0,
            step_num: 0,
        }
    }
}

/// One group over every parameter, as the package's `super().__init__(model.parameters())`.
fn one_group(groups: Vec<GroupSpec>, lr: f64, weight_decay: f64) -> Result<Vec<GroupSpec>> {
    let params = groups.into_iter().flat_map(|g| g.params).collect();
    Ok(vec![
        GroupSpec::new(params)
            .with_lr(lr)
            .with_weight_decay(weight_decay),
    ])
}

/// A loss LOMO can run the backward of: a float32 / bfloat16 scalar (a float16 loss would make
/// the package create its dynamic loss scaler, which is not mirrored).
fn check_loss(name: &'static str, loss: &Tensor) -> Result<()> {
    if loss.kind() == Kind::Half {
        return Err(Error::FusedBackward {
            optimizer: name,
            detail: "a float16 loss makes lomo-optim scale it dynamically, which tchtrain does \
                     not mirror; compute the loss in float32 (fp16 mixed precision does) or use \
                     bf16"
                .into(),
        });
    }
    Ok(())
}

/// The gradient of `p` as float32, taken off the parameter (`grad_fp32 = p.grad.to(float32)`
/// then `p.grad = None`: the handle keeps the gradient's memory alive).
fn take_grad(p: &Tensor) -> Result<Option<Tensor>> {
    let Some(g) = grad_of(p) else {
        return Ok(None);
    };
    let g = g.f_to_kind(Kind::Float)?;
    ffi::set_grad(&mut p.shallow_clone(), None)?;
    Ok(Some(g))
}

/// Writes the float32 result back into the parameter (`p.data.copy_(p_fp32)`).
fn write_back(p: &Tensor, p_fp32: &Tensor) -> Result<()> {
    if p.kind() != Kind::Float {
        p.shallow_clone().f_copy_(p_fp32)?;
    }
    Ok(())
}

/// `p.data.to(torch.float32)`: the parameter itself when it is float32, else a copy.
fn as_fp32(p: &Tensor) -> Result<Tensor> {
    Ok(if p.kind() == Kind::Float {
        p.shallow_clone()
    } else {
        p.f_to_kind(Kind::Float)?
    })
}

/// The LOMO optimizer.
#[derive(Debug)]
pub struct Lomo {
    config: LomoConfig,
    groups: Vec<ParamGroup>,
    state: Vec<Option<ParamState>>,
}

impl Lomo {
    /// Creates the optimizer over every parameter of `groups` (merged into one group, as the
    /// package takes the whole model).
    pub fn new(groups: Vec<GroupSpec>, config: LomoConfig) -> Result<Self> {
        check_non_negative("lr", config.lr)?;
        check_non_negative("weight_decay", config.weight_decay)?;
        let (groups, state) = build_groups(
            one_group(groups, config.lr, config.weight_decay)?,
            config.lr,
            config.weight_decay,
        )?;
        Ok(Self {
            config,
            groups,
            state,
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &LomoConfig {
        &self.config
    }

    fn update(&self, lr: f64) -> Result<()> {
        let c = &self.config;
        tch::no_grad(|| {
            for p in self.groups.iter().flat_map(|g| &g.params) {
                let Some(mut g) = take_grad(p)? else { continue };
                if let Some(v) = c.clip_grad_value.filter(|&v| v > 0.0) {
                    let _ = g.f_clamp_(-v, v)?;
                }
                let mut p_fp32 = as_fp32(p)?;
                if c.weight_decay > 0.0 {
                    let _ = p_fp32.f_mul_scalar_(1.0 - lr * c.weight_decay)?;
                }
                ffi::add_(&mut p_fp32, &g, -lr)?;
                write_back(p, &p_fp32)?;
            }
            Ok(())
        })
    }
}

impl Optimizer for Lomo {
    fn name(&self) -> &'static str {
        "lomo"
    }

    fn default_lr(&self) -> f64 {
        self.config.lr
    }

    /// A no-op: the update happened in [`Optimizer::fused_backward`] (accelerate's
    /// `AcceleratedOptimizer.step` returns at once for LOMO).
    fn step(&mut self) -> Result<()> {
        Ok(())
    }

    fn fuses_backward(&self) -> bool {
        true
    }

    fn fused_backward(&mut self, loss: &Tensor, lr: f64) -> Result<()> {
        check_loss("lomo", loss)?;
        self.config.lr = lr;
        for g in &mut self.groups {
            g.lr = lr;
        }
        loss.f_backward()?;
        self.update(lr)
    }

    fn validate_state(&self, _index: usize, _param: &Tensor, _state: &ParamState) -> Result<()> {
        Ok(())
    }

    optimizer_accessors!();
}

/// The AdaLomo optimizer.
#[derive(Debug)]
pub struct AdaLomo {
    config: AdaLomoConfig,
    groups: Vec<ParamGroup>,
    state: Vec<Option<ParamState>>,
}

impl AdaLomo {
    /// Creates the optimizer over every parameter of `groups` (merged into one group, as the
    /// package takes the whole model). Parameters of more than two dimensions are refused: the
    /// package's factored moments only fit 1-D and 2-D parameters.
    pub fn new(groups: Vec<GroupSpec>, config: AdaLomoConfig) -> Result<Self> {
        check_non_negative("lr", config.lr)?;
        check_non_negative("weight_decay", config.weight_decay)?;
        check_non_negative("loss_scale", config.loss_scale)?;
        for g in &groups {
            for (name, p) in &g.params {
                if p.dim() > 2 || p.dim() == 0 {
                    return Err(Error::InvalidOptimizerSetup {
                        name: "adalomo".into(),
                        detail: format!(
                            "parameter `{name}` has {} dimensions; AdaLomo's factored second \
                             moment takes 1-D and 2-D parameters only",
                            p.dim()
                        ),
                    });
                }
            }
        }
        let (groups, state) = build_groups(
            one_group(groups, config.lr, config.weight_decay)?,
            config.lr,
            config.weight_decay,
        )?;
        Ok(Self {
            config,
            groups,
            state,
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &AdaLomoConfig {
        &self.config
    }

    /// `tensor.norm(2) / (tensor.numel() ** 0.5)`.
    fn rms(t: &Tensor) -> Result<Tensor> {
        let numel = t.numel() as f64;
        Ok(ffi::vector_norm(t, 2.0)?.f_div_scalar(numel.powf(0.5))?)
    }

    fn update(&mut self) -> Result<()> {
        let c = self.config.clone();
        let t = c.step_num as f64;
        let decay_rate = if c.step_num == 0 && c.decay_rate < 0.0 {
            -c.decay_rate
        } else {
            c.decay_rate
        };
        let beta2t = 1.0 - t.powf(decay_rate);
        tch::no_grad(|| {
            let params: Vec<Tensor> = self
                .groups
                .iter()
                .flat_map(|g| g.params.iter().map(Tensor::shallow_clone))
                .collect();
            for (index, p) in params.iter().enumerate() {
                let Some(mut g) = take_grad(p)? else { continue };
                if c.loss_scale != 0.0 {
                    let _ = g.f_div_scalar_(c.loss_scale)?;
                }
                if let Some(v) = c.clip_grad_value.filter(|&v| v > 0.0) {
                    let _ = g.f_clamp_(-v, v)?;
                }
                let size = p.size();
                let st = self.state[index].get_or_insert_with(|| {
                    let mut st = ParamState::default();
                    let opts = (Kind::Float, p.device());
                    if size.len() == 1 {
                        st.tensors
                            .insert("exp_avg_sq".into(), Tensor::zeros([size[0]], opts));
                    } else {
                        st.tensors
                            .insert("exp_avg_sq_row".into(), Tensor::zeros([size[0]], opts));
                        st.tensors
                            .insert("exp_avg_sq_col".into(), Tensor::zeros([size[1]], opts));
                    }
                    st
                });
                st.step = c.step_num;
                let mut update = g.f_pow_tensor_scalar(2)?.f_add_scalar(c.eps.0)?;
                if size.len() > 1 {
                    let mut row = st.handle(index, "exp_avg_sq_row")?;
                    let mut col = st.handle(index, "exp_avg_sq_col")?;
                    let _ = row.f_mul_scalar_(beta2t)?;
                    ffi::add_(
                        &mut row,
                        &update.f_mean_dim(&[-1i64][..], false, None::<Kind>)?,
                        1.0 - beta2t,
                    )?;
                    let _ = col.f_mul_scalar_(beta2t)?;
                    ffi::add_(
                        &mut col,
                        &update.f_mean_dim(&[-2i64][..], false, None::<Kind>)?,
                        1.0 - beta2t,
                    )?;
                    let mut r = row.f_div(&row.f_mean_dim(&[-1i64][..], true, None::<Kind>)?)?;
                    let _ = r.f_rsqrt_()?;
                    let r = r.f_unsqueeze(-1)?;
                    let cf = col.f_unsqueeze(-2)?.f_rsqrt()?;
                    update = r.f_mul(&cf)?;
                    let _ = update.f_mul_(&g)?;
                } else {
                    let mut v = st.handle(index, "exp_avg_sq")?;
                    let _ = v.f_mul_scalar_(beta2t)?;
                    ffi::add_(&mut v, &update, 1.0 - beta2t)?;
                    update = v.f_rsqrt()?;
                    let _ = update.f_mul_(&g)?;
                }
                let mut scale = Self::rms(&update)?.f_div_scalar(c.clip_threshold)?;
                let _ = scale.f_clamp_min_(1.0)?;
                let _ = update.f_div_(&scale)?;

                let mut p_fp32 = as_fp32(p)?;
                let numel = p.numel() as f64;
                let p_rms = ffi::vector_norm(&p_fp32, 2.0)?.f_div_scalar(numel.sqrt())?;
                // `lr * max(eps[1], p_rms)`: a float product when the RMS is not larger, else
                // a float32 tensor (and the weight-decay factor a float32 tensor with it).
                let (lr, lr_tensor) = if p_rms.f_double_value(&[])? > c.eps.1 {
                    let t = p_rms.f_mul_scalar(c.lr)?;
                    (t.f_double_value(&[])?, Some(t))
                } else {
                    (c.lr * c.eps.1, None)
                };
                if c.weight_decay > 0.0 {
                    match &lr_tensor {
                        Some(t) => {
                            let factor =
                                t.f_mul_scalar(c.weight_decay)?.f_neg()?.f_add_scalar(1.0)?;
                            let _ = p_fp32.f_mul_(&factor)?;
                        }
                        None => {
                            let _ = p_fp32.f_mul_scalar_(1.0 - lr * c.weight_decay)?;
                        }
                    }
                }
                ffi::add_(&mut p_fp32, &update, -lr)?;
                write_back(p, &p_fp32)?;
            }
            Ok(())
        })
    }
}

impl Optimizer for AdaLomo {
    fn name(&self) -> &'static str {
        "adalomo"
    }

    fn default_lr(&self) -> f64 {
        self.config.lr
    }

    /// A no-op: the update happened in [`Optimizer::fused_backward`].
    fn step(&mut self) -> Result<()> {
        Ok(())
    }

    fn fuses_backward(&self) -> bool {
        true
    }

    fn fused_backward(&mut self, loss: &Tensor, lr: f64) -> Result<()> {
        check_loss("adalomo", loss)?;
        self.config.lr = lr;
        for g in &mut self.groups {
            g.lr = lr;
        }
        let scaled = if self.config.loss_scale != 0.0 {
            loss.f_mul_scalar(self.config.loss_scale)?
        } else {
            loss.shallow_clone()
        };
        self.config.step_num += 1;
        scaled.f_backward()?;
        self.update()
    }

    fn validate_state(&self, index: usize, param: &Tensor, state: &ParamState) -> Result<()> {
        let size = param.size();
        if size.len() == 1 {
            expect_shape(index, state, "exp_avg_sq", &size)
        } else {
            expect_shape(index, state, "exp_avg_sq_row", &size[..1])?;
            expect_shape(index, state, "exp_avg_sq_col", &size[1..2])
        }
    }

    optimizer_accessors!();
}

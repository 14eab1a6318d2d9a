//! AdamW (torch.optim.AdamW): `adamw_torch` (single-tensor CPU path, op for op) and
//! `adamw_torch_fused` (libtorch's `_fused_adamw_` kernel).

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::adam::{AdamConfig, adam_step, validate_adam_state};
use crate::optimizer::{build_groups, optimizer_accessors};
use crate::{GroupSpec, Optimizer, ParamGroup, ParamState, Result};

/// Hyper-parameters of [`AdamW`] (torch.optim.AdamW's arguments and defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdamWConfig {
    /// Learning rate (default 1e-3).
    pub lr: f64,
    /// `(beta1, beta2)` (default (0.9, 0.999)).
    pub betas: (f64, f64),
    /// Term added to the denominator (default 1e-8).
    pub eps: f64,
    /// Decoupled weight decay (default 1e-2); param groups usually override it.
    pub weight_decay: f64,
    /// AMSGrad variant (default false).
    pub amsgrad: bool,
    /// Maximise the objective (default false).
    pub maximize: bool,
    /// Use libtorch's fused kernel `_fused_adamw_` (`adamw_torch_fused`; default false).
    pub fused: bool,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 1e-2,
            amsgrad: false,
            maximize: false,
            fused: false,
        }
    }
}

impl AdamWConfig {
    fn as_adam(&self) -> AdamConfig {
        AdamConfig {
            lr: self.lr,
            betas: self.betas,
            eps: self.eps,
            weight_decay: self.weight_decay,
            amsgrad: self.amsgrad,
            maximize: self.maximize,
            fused: self.fused,
        }
    }
}

/// Adam with decoupled weight decay, as torch.optim.AdamW.
///
/// ```
/// use tch::{nn, Device, Kind, Tensor};
/// use tchtrain_optim::{AdamW, AdamWConfig, GroupSpec, Optimizer};
///
/// let vs = nn::VarStore::new(Device::Cpu);
/// let w = vs.root().zeros("w", &[3]);
/// let mut opt = AdamW::new(
///     vec![GroupSpec::new(vec![("w".into(), w.shallow_clone())]).with_weight_decay(0.0)],
///     AdamWConfig { lr: 0.1, ..Default::default() },
/// )?;
/// (&w - Tensor::ones([3], (Kind::Float, Device::Cpu))).square().sum(Kind::Float).backward();
/// opt.step()?;
/// assert!(w.double_value(&[0]) > 0.0);
/// # Ok::<(), tchtrain_optim::Error>(())
/// ```
#[derive(Debug)]
pub struct AdamW {
    config: AdamWConfig,
    groups: Vec<ParamGroup>,
    state: Vec<Option<ParamState>>,
}

impl AdamW {
    /// Creates the optimizer over `groups` (each may override `lr` / `weight_decay`).
    pub fn new(groups: Vec<GroupSpec>, config: AdamWConfig) -> Result<Self> {
        config.as_adam().validate()?;
        let (groups, state) = build_groups(groups, config.lr, config.weight_decay)?;
        Ok(Self {
            config,
            groups,
            state,
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &AdamWConfig {
        &self.config
    }
}

impl Optimizer for AdamW {
    fn name(&self) -> &'static str {
        "adamw"
    }

    fn step_supports_amp_scaling(&self) -> bool {
        self.config.fused
    }

    fn default_lr(&self) -> f64 {
        self.config.lr
    }

    fn step(&mut self) -> Result<()> {
        adam_step(&self.groups, &mut self.state, &self.config.as_adam(), true)
    }

    fn validate_state(&self, index: usize, param: &Tensor, state: &ParamState) -> Result<()> {
        validate_adam_state(index, param, state, self.config.amsgrad)
    }

    optimizer_accessors!();
}

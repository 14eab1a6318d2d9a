//! Schedule-Free optimizers (Defazio et al. 2024, "The Road Less Scheduled"): upstream's
//! `schedule_free_adamw`, `schedule_free_sgd` and `schedule_free_radam`.
//!
//! Reference matched: the `schedulefree` package 1.4.1 (`AdamWScheduleFree`,
//! `SGDScheduleFree`, `RAdamScheduleFree`, the classes the Trainer's handler imports), op for
//! op (their foreach path runs these very ops one tensor at a time on a CPU). Each group keeps
//! a step count `k`, the largest scheduled learning rate `lr_max` and the sum of the
//! averaging weights `weight_sum`; each parameter keeps `z` (and `exp_avg_sq` for the Adam
//! variants). A step, with `c = weight / weight_sum` and `weight = (k+1)^r * lr_max^p`:
//!
//! ```text
//! v  <- beta2 * v + (1 - beta2) * g * g               (Adam variants)
//! g  <- g / (sqrt(v / (1 - beta2^(k+1))) + eps)       (Adam variants; in place, as upstream)
//! g  <- g + wd * y                                    (when wd != 0)
//! y  <- lerp(y, z, c) + lr * (beta1 * (1 - c) - 1) * g
//! z  <- z - lr * g
//! ```
//!
//! The parameters hold `y` (the point the gradient is taken at) in train mode and the average
//! `x` in eval mode: [`Optimizer::train`] moves them to `y = lerp(x, z, 1 - beta1)`,
//! [`Optimizer::eval`] back with `lerp(y, z, 1 - 1/beta1)`. A step outside train mode is
//! [`Error::NotInTrainMode`], as upstream raises. The group values (`k`, `train_mode`,
//! `weight_sum`, `lr_max`, `scheduled_lr`) are saved with the hyper-parameters, so a state dict
//! taken in either mode resumes exactly (with the parameters saved in the same mode).
//!
//! `lr` above is the group's learning rate times the warmup factor `min(1, (k+1) /
//! warmup_steps)` (AdamW, SGD) or RAdam's rectification (0 while the variance is not
//! tractable, with the default `silent_sgd_phase`, and no normalisation of `g` then).
//!
//! Beyond upstream, AdamW's and RAdam's `beta1` must lie in `(0, 1)` as SGD's momentum does
//! there (`eval()` divides by it), `beta2` in `[0, 1)`, `eps` and `warmup_steps` be
//! non-negative and `r`, `weight_lr_power` finite.

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::ffi;
use crate::optimizer::{
    build_groups, check_non_negative, check_unit, deep_copy, expect_shape, grad_of,
};
use crate::{Error, GroupSpec, Optimizer, ParamGroup, ParamState, Result};

/// The values a schedule-free optimizer keeps per param group (upstream's `group["k"]`,
/// `group["train_mode"]`, ...), saved in the state dict with the hyper-parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ScheduleFreeGroupState {
    /// Steps taken.
    pub k: u64,
    /// Whether the parameters hold `y` (train mode) rather than the average `x`.
    pub train_mode: bool,
    /// Sum of the averaging weights so far.
    pub weight_sum: f64,
    /// Largest scheduled learning rate so far (-1 before the first step).
    pub lr_max: f64,
    /// Learning rate of the last step, after warmup / rectification (for logging).
    pub scheduled_lr: f64,
}

impl Default for ScheduleFreeGroupState {
    fn default() -> Self {
        Self {
            k: 0,
            train_mode: false,
            weight_sum: 0.0,
            lr_max: -1.0,
            scheduled_lr: 0.0,
        }
    }
}

impl ScheduleFreeGroupState {
    /// Records the step's scheduled learning rate and returns the averaging weight `ckp1`
    /// (upstream's group update, in its order of float operations).
    fn advance(&mut self, lr: f64, r: f64, weight_lr_power: f64) -> f64 {
        self.scheduled_lr = lr;
        // Python's `max(lr, lr_max)`: the first unless the second is larger.
        self.lr_max = if self.lr_max > lr { self.lr_max } else { lr };
        let weight = py_pow((self.k + 1) as f64, r) * py_pow(self.lr_max, weight_lr_power);
        self.weight_sum += weight;
        // Upstream catches the ZeroDivisionError of a zero sum.
        if self.weight_sum == 0.0 {
            0.0
        } else {
            weight / self.weight_sum
        }
    }
}

/// Python's `a ** b` on floats: libm's `pow`, kept out of reach of constant-exponent
/// rewrites (`pow(x, 0.5)` into `sqrt`) so the result is the one CPython computes.
fn py_pow(a: f64, b: f64) -> f64 {
    a.powf(std::hint::black_box(b))
}

/// The linear warmup factor of AdamW / SGD schedule-free at step `k` (`warmup_steps` as
/// given, a ratio below 1 included, as upstream passes it).
fn warmup(k: u64, warmup_steps: f64) -> f64 {
    if (k as f64) < warmup_steps {
        (k + 1) as f64 / warmup_steps
    } else {
        1.0
    }
}

/// Checks `0 < value < 1` (an `eval()` divides by beta1 / momentum).
fn check_open_unit(name: &'static str, value: f64) -> Result<()> {
    if value > 0.0 && value < 1.0 {
        Ok(())
    } else {
        Err(Error::InvalidHyperparameter {
            name,
            value,
            expected: "in (0, 1)",
        })
    }
}

/// Checks that `value` is finite.
fn check_finite(name: &'static str, value: f64) -> Result<()> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(Error::InvalidHyperparameter {
            name,
            value,
            expected: "finite",
        })
    }
}

/// One fresh [`ScheduleFreeGroupState`] per group.
fn fresh_states(groups: &[ParamGroup]) -> Vec<ScheduleFreeGroupState> {
    vec![ScheduleFreeGroupState::default(); groups.len()]
}

/// Moves the parameters of every group not yet in the mode `to_train` to it:
/// `p.lerp_(z, weight)` for each parameter with a `z`, then records the mode.
fn switch_mode(
    groups: &[ParamGroup],
    state: &[Option<ParamState>],
    group_state: &mut [ScheduleFreeGroupState],
    to_train: bool,
    weight: f64,
) -> Result<()> {
    check_group_count(groups, group_state)?;
    tch::no_grad(|| {
        let mut offset = 0;
        for (group, gs) in groups.iter().zip(group_state.iter_mut()) {
            if gs.train_mode != to_train {
                for (j, p) in group.params.iter().enumerate() {
                    let z = state
                        .get(offset + j)
                        .and_then(Option::as_ref)
                        .and_then(|st| st.tensors.get("z"));
                    if let Some(z) = z {
                        let mut p = p.shallow_clone();
                        let _ = p.f_lerp_(z, weight)?;
                    }
                }
                gs.train_mode = to_train;
            }
            offset += group.params.len();
        }
        Ok(())
    })
}

/// [`Error::GroupCountMismatch`] unless there is one group state per param group.
fn check_group_count(groups: &[ParamGroup], group_state: &[ScheduleFreeGroupState]) -> Result<()> {
    if groups.len() == group_state.len() {
        Ok(())
    } else {
        Err(Error::GroupCountMismatch {
            what: "schedule-free group states",
            expected: groups.len(),
            found: group_state.len(),
        })
    }
}

/// Upstream's check at the top of `step()`: the first group must be in train mode.
fn check_train_mode(name: &'static str, group_state: &[ScheduleFreeGroupState]) -> Result<()> {
    match group_state.first() {
        Some(gs) if !gs.train_mode => Err(Error::NotInTrainMode { optimizer: name }),
        _ => Ok(()),
    }
}

/// The per-parameter step after any normalisation of `grad` (in place, as upstream):
/// weight decay at `y`, `y <- lerp(y, z, ckp1) + y_lr * grad`, `z <- z - lr * grad`.
fn interpolate_step(
    y: &mut Tensor,
    z: &mut Tensor,
    grad: &mut Tensor,
    decay: f64,
    ckp1: f64,
    y_lr: f64,
    lr: f64,
) -> Result<()> {
    if decay != 0.0 {
        ffi::add_(grad, y, decay)?;
    }
    let _ = y.f_lerp_(z, ckp1)?;
    ffi::add_(y, grad, y_lr)?;
    // `z.sub_(grad, alpha=lr)`: libtorch's sub is its add with the alpha negated.
    ffi::add_(z, grad, -lr)
}

/// `exp_avg_sq <- beta2 * exp_avg_sq + (1 - beta2) * grad^2`.
fn update_second_moment(exp_avg_sq: &mut Tensor, grad: &Tensor, beta2: f64) -> Result<()> {
    let _ = exp_avg_sq.f_mul_scalar_(beta2)?;
    ffi::addcmul_(exp_avg_sq, grad, grad, 1.0 - beta2)
}

/// `grad /= sqrt(exp_avg_sq / bias_correction2) + eps`, in place.
fn adam_normalize(
    grad: &mut Tensor,
    exp_avg_sq: &Tensor,
    bias_correction2: f64,
    eps: f64,
) -> Result<()> {
    let mut denom = exp_avg_sq.f_div_scalar(bias_correction2)?;
    let _ = denom.f_sqrt_()?;
    let _ = denom.f_add_scalar_(eps)?;
    let _ = grad.f_div_(&denom)?;
    Ok(())
}

/// The state of parameter `index`, created on its first step: `z = p.clone()` and, with
/// `second_moment`, `exp_avg_sq = zeros_like(p)`.
fn state_of<'a>(
    state: &'a mut [Option<ParamState>],
    index: usize,
    p: &Tensor,
    second_moment: bool,
) -> Result<&'a mut ParamState> {
    let slot = &mut state[index];
    let needs_init = slot.as_ref().is_none_or(|st| !st.tensors.contains_key("z"));
    if needs_init {
        let mut st = ParamState::default();
        st.tensors.insert("z".into(), deep_copy(p)?);
        if second_moment {
            st.tensors.insert("exp_avg_sq".into(), p.f_zeros_like()?);
        }
        *slot = Some(st);
    }
    slot.as_mut().ok_or(Error::MissingState {
        param: index,
        key: "z".into(),
    })
}

/// The group-independent settings of one Adam-style step.
struct AdamStep {
    beta2: f64,
    eps: f64,
    bias_correction2: f64,
    /// Whether the gradient is normalised (RAdam's rectified phase; always for AdamW).
    adaptive: bool,
}

/// One step over the parameters of `group` (flat offset `offset`) with the group's
/// scheduled `lr`, averaging weight `ckp1` and `y` coefficient `y_lr`; `adam` for the Adam
/// variants.
#[allow(clippy::too_many_arguments)]
fn step_group(
    group: &ParamGroup,
    offset: usize,
    state: &mut [Option<ParamState>],
    adam: Option<&AdamStep>,
    lr: f64,
    ckp1: f64,
    y_lr: f64,
) -> Result<()> {
    for (j, p) in group.params.iter().enumerate() {
        let index = offset + j;
        let Some(mut grad) = grad_of(p) else { continue };
        let st = state_of(state, index, p, adam.is_some())?;
        let mut z = st.handle(index, "z")?;
        if let Some(a) = adam {
            let mut exp_avg_sq = st.handle(index, "exp_avg_sq")?;
            update_second_moment(&mut exp_avg_sq, &grad, a.beta2)?;
            if a.adaptive {
                adam_normalize(&mut grad, &exp_avg_sq, a.bias_correction2, a.eps)?;
            }
        }
        let mut y = p.shallow_clone();
        interpolate_step(
            &mut y,
            &mut z,
            &mut grad,
            group.weight_decay,
            ckp1,
            y_lr,
            lr,
        )?;
    }
    Ok(())
}

/// Implements the [`Optimizer`] accessors, `train` / `eval` and the hyper-parameters (the
/// group states included, their count checked) for a schedule-free optimizer whose config
/// `$config` has `lr` and `group_state` fields; `$beta1` reads the interpolation coefficient.
macro_rules! schedule_free_common {
    ($name:literal, $config:ty, |$c:ident| $beta1:expr) => {
        fn name(&self) -> &'static str {
            $name
        }
        fn default_lr(&self) -> f64 {
            self.config.lr
        }
        fn train(&mut self) -> Result<()> {
            let $c = &self.config;
            let weight = 1.0 - $beta1;
            switch_mode(
                &self.groups,
                &self.state,
                &mut self.config.group_state,
                true,
                weight,
            )
        }
        fn eval(&mut self) -> Result<()> {
            let $c = &self.config;
            let weight = 1.0 - 1.0 / $beta1;
            switch_mode(
                &self.groups,
                &self.state,
                &mut self.config.group_state,
                false,
                weight,
            )
        }
        fn param_groups(&self) -> &[ParamGroup] {
            &self.groups
        }
        fn param_groups_mut(&mut self) -> &mut [ParamGroup] {
            &mut self.groups
        }
        fn state(&self) -> &[Option<ParamState>] {
            &self.state
        }
        fn state_mut(&mut self) -> &mut Vec<Option<ParamState>> {
            &mut self.state
        }
        fn hyperparameters(&self) -> serde_json::Value {
            serde_json::to_value(&self.config).unwrap_or(serde_json::Value::Null)
        }
        fn set_hyperparameters(&mut self, value: &serde_json::Value) -> Result<()> {
            let config: $config = crate::optimizer::parse_hyper(value)?;
            check_group_count(&self.groups, &config.group_state)?;
            self.config = config;
            Ok(())
        }
    };
}

/// Hyper-parameters of [`AdamWScheduleFree`] (`schedulefree.AdamWScheduleFree`'s arguments
/// and defaults; the Trainer passes `lr`, the Adam betas / eps, `weight_decay`,
/// `warmup_steps` and `optim_args`' `weight_lr_power` / `r`), plus the group states.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdamWScheduleFreeConfig {
    /// Learning rate (default 0.0025).
    pub lr: f64,
    /// `(beta1, beta2)` (default (0.9, 0.999)): beta1 is the interpolation between `z` and
    /// the average.
    pub betas: (f64, f64),
    /// Term added to the denominator (default 1e-8).
    pub eps: f64,
    /// Weight decay taken at `y` (default 0); param groups usually override it.
    pub weight_decay: f64,
    /// Steps of linear warmup (default 0; a float, used as given).
    pub warmup_steps: f64,
    /// Power of the polynomial weighting of the average (default 0).
    pub r: f64,
    /// Power of the largest learning rate in the averaging weights (default 2).
    pub weight_lr_power: f64,
    /// The per-group values (filled by the constructor, restored with the state).
    pub group_state: Vec<ScheduleFreeGroupState>,
}

impl Default for AdamWScheduleFreeConfig {
    fn default() -> Self {
        Self {
            lr: 0.0025,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            warmup_steps: 0.0,
            r: 0.0,
            weight_lr_power: 2.0,
            group_state: Vec::new(),
        }
    }
}

/// Schedule-Free AdamW (`schedulefree.AdamWScheduleFree`): no learning-rate schedule needed;
/// call [`Optimizer::train`] before training steps and [`Optimizer::eval`] before evaluating.
///
/// ```
/// use tch::{nn, Device, Kind, Tensor};
/// use tchtrain_optim::{AdamWScheduleFree, AdamWScheduleFreeConfig, GroupSpec, Optimizer};
///
/// let vs = nn::VarStore::new(Device::Cpu);
/// let w = vs.root().zeros("w", &[3]);
/// let mut opt = AdamWScheduleFree::new(
///     vec![GroupSpec::new(vec![("w".into(), w.shallow_clone())])],
///     AdamWScheduleFreeConfig { lr: 0.1, ..Default::default() },
/// )?;
/// opt.train()?;
/// (&w - Tensor::ones([3], (Kind::Float, Device::Cpu))).square().sum(Kind::Float).backward();
/// opt.step()?;
/// opt.eval()?;
/// assert!(w.double_value(&[0]) > 0.0);
/// # Ok::<(), tchtrain_optim::Error>(())
/// ```
#[derive(Debug)]
pub struct AdamWScheduleFree {
    config: AdamWScheduleFreeConfig,
    groups: Vec<ParamGroup>,
    state: Vec<Option<ParamState>>,
}

impl AdamWScheduleFree {
    /// Creates the optimizer over `groups` (each may override `lr` / `weight_decay`), in
    /// eval mode as upstream.
    pub fn new(groups: Vec<GroupSpec>, mut config: AdamWScheduleFreeConfig) -> Result<Self> {
        check_non_negative("lr", config.lr)?;
        check_open_unit("betas[0]", config.betas.0)?;
        check_unit("betas[1]", config.betas.1)?;
        check_non_negative("eps", config.eps)?;
        check_non_negative("weight_decay", config.weight_decay)?;
        check_non_negative("warmup_steps", config.warmup_steps)?;
        check_finite("r", config.r)?;
        check_finite("weight_lr_power", config.weight_lr_power)?;
        let (groups, state) = build_groups(groups, config.lr, config.weight_decay)?;
        config.group_state = fresh_states(&groups);
        Ok(Self {
            config,
            groups,
            state,
        })
    }

    /// The hyper-parameters and group states.
    pub fn config(&self) -> &AdamWScheduleFreeConfig {
        &self.config
    }
}

impl Optimizer for AdamWScheduleFree {
    fn step(&mut self) -> Result<()> {
        check_train_mode(self.name(), &self.config.group_state)?;
        check_group_count(&self.groups, &self.config.group_state)?;
        let c = &mut self.config;
        let (beta1, beta2) = c.betas;
        tch::no_grad(|| {
            let mut offset = 0;
            for (group, gs) in self.groups.iter().zip(c.group_state.iter_mut()) {
                let k = gs.k;
                let sched = warmup(k, c.warmup_steps);
                let bias_correction2 = 1.0 - py_pow(beta2, (k + 1) as f64);
                let lr = group.lr * sched;
                let ckp1 = gs.advance(lr, c.r, c.weight_lr_power);
                let adam = AdamStep {
                    beta2,
                    eps: c.eps,
                    bias_correction2,
                    adaptive: true,
                };
                let y_lr = lr * (beta1 * (1.0 - ckp1) - 1.0);
                step_group(group, offset, &mut self.state, Some(&adam), lr, ckp1, y_lr)?;
                gs.k = k + 1;
                offset += group.params.len();
            }
            Ok(())
        })
    }

    fn validate_state(&self, index: usize, param: &Tensor, state: &ParamState) -> Result<()> {
        expect_shape(index, state, "z", &param.size())?;
        expect_shape(index, state, "exp_avg_sq", &param.size())
    }

    schedule_free_common!("schedule_free_adamw", AdamWScheduleFreeConfig, |c| c
        .betas
        .0);
}

/// Hyper-parameters of [`SgdScheduleFree`] (`schedulefree.SGDScheduleFree`'s arguments and
/// defaults; the Trainer passes `lr`, `weight_decay`, `warmup_steps` and `optim_args`'
/// `weight_lr_power` / `r`), plus the group states.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SgdScheduleFreeConfig {
    /// Learning rate (default 1.0).
    pub lr: f64,
    /// Momentum: the interpolation between `z` and the average (default 0.9; in (0, 1)).
    pub momentum: f64,
    /// Weight decay taken at `y` (default 0); param groups usually override it.
    pub weight_decay: f64,
    /// Steps of linear warmup (default 0; a float, used as given).
    pub warmup_steps: f64,
    /// Power of the polynomial weighting of the average (default 0).
    pub r: f64,
    /// Power of the largest learning rate in the averaging weights (default 2).
    pub weight_lr_power: f64,
    /// The per-group values (filled by the constructor, restored with the state).
    pub group_state: Vec<ScheduleFreeGroupState>,
}

impl Default for SgdScheduleFreeConfig {
    fn default() -> Self {
        Self {
            lr: 1.0,
            momentum: 0.9,
            weight_decay: 0.0,
            warmup_steps: 0.0,
            r: 0.0,
            weight_lr_power: 2.0,
            group_state: Vec::new(),
        }
    }
}

/// Schedule-Free SGD (`schedulefree.SGDScheduleFree`): no learning-rate schedule needed;
/// call [`Optimizer::train`] before training steps and [`Optimizer::eval`] before evaluating.
#[derive(Debug)]
pub struct SgdScheduleFree {
    config: SgdScheduleFreeConfig,
    groups: Vec<ParamGroup>,
    state: Vec<Option<ParamState>>,
}

impl SgdScheduleFree {
    /// Creates the optimizer over `groups` (each may override `lr` / `weight_decay`), in
    /// eval mode as upstream.
    pub fn new(groups: Vec<GroupSpec>, mut config: SgdScheduleFreeConfig) -> Result<Self> {
        check_non_negative("lr", config.lr)?;
        check_open_unit("momentum", config.momentum)?;
        check_non_negative("weight_decay", config.weight_decay)?;
        check_non_negative("warmup_steps", config.warmup_steps)?;
        check_finite("r", config.r)?;
        check_finite("weight_lr_power", config.weight_lr_power)?;
        let (groups, state) = build_groups(groups, config.lr, config.weight_decay)?;
        config.group_state = fresh_states(&groups);
        Ok(Self {
            config,
            groups,
            state,
        })
    }

    /// The hyper-parameters and group states.
    pub fn config(&self) -> &SgdScheduleFreeConfig {
        &self.config
    }
}

impl Optimizer for SgdScheduleFree {
    fn step(&mut self) -> Result<()> {
        check_train_mode(self.name(), &self.config.group_state)?;
        check_group_count(&self.groups, &self.config.group_state)?;
        let c = &mut self.config;
        let momentum = c.momentum;
        tch::no_grad(|| {
            let mut offset = 0;
            for (group, gs) in self.groups.iter().zip(c.group_state.iter_mut()) {
                let k = gs.k;
                let sched = warmup(k, c.warmup_steps);
                let lr = group.lr * sched;
                let ckp1 = gs.advance(lr, c.r, c.weight_lr_power);
                let y_lr = lr * (momentum * (1.0 - ckp1) - 1.0);
                step_group(group, offset, &mut self.state, None, lr, ckp1, y_lr)?;
                gs.k = k + 1;
                offset += group.params.len();
            }
            Ok(())
        })
    }

    fn validate_state(&self, index: usize, param: &Tensor, state: &ParamState) -> Result<()> {
        expect_shape(index, state, "z", &param.size())
    }

    schedule_free_common!("schedule_free_sgd", SgdScheduleFreeConfig, |c| c.momentum);
}

/// Hyper-parameters of [`RAdamScheduleFree`] (`schedulefree.RAdamScheduleFree`'s arguments
/// and defaults; the Trainer passes `lr`, the Adam betas / eps, `weight_decay` and
/// `optim_args`' `weight_lr_power` / `r`; no warmup: the rectification replaces it), plus
/// the group states.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RAdamScheduleFreeConfig {
    /// Learning rate (default 0.0025).
    pub lr: f64,
    /// `(beta1, beta2)` (default (0.9, 0.999)).
    pub betas: (f64, f64),
    /// Term added to the denominator (default 1e-8).
    pub eps: f64,
    /// Weight decay taken at `y` (default 0); param groups usually override it.
    pub weight_decay: f64,
    /// Power of the polynomial weighting of the average (default 0).
    pub r: f64,
    /// Power of the largest learning rate in the averaging weights (default 2).
    pub weight_lr_power: f64,
    /// Leave the parameters alone (a learning rate of 0) while the variance is not yet
    /// tractable, instead of SGD steps (default true).
    pub silent_sgd_phase: bool,
    /// The per-group values (filled by the constructor, restored with the state).
    pub group_state: Vec<ScheduleFreeGroupState>,
}

impl Default for RAdamScheduleFreeConfig {
    fn default() -> Self {
        Self {
            lr: 0.0025,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            r: 0.0,
            weight_lr_power: 2.0,
            silent_sgd_phase: true,
            group_state: Vec::new(),
        }
    }
}

/// Schedule-Free RAdam (`schedulefree.RAdamScheduleFree`): rectified Adam steps, no warmup
/// or schedule needed; call [`Optimizer::train`] before training steps and
/// [`Optimizer::eval`] before evaluating.
#[derive(Debug)]
pub struct RAdamScheduleFree {
    config: RAdamScheduleFreeConfig,
    groups: Vec<ParamGroup>,
    state: Vec<Option<ParamState>>,
}

impl RAdamScheduleFree {
    /// Creates the optimizer over `groups` (each may override `lr` / `weight_decay`), in
    /// eval mode as upstream.
    pub fn new(groups: Vec<GroupSpec>, mut config: RAdamScheduleFreeConfig) -> Result<Self> {
        check_non_negative("lr", config.lr)?;
        check_open_unit("betas[0]", config.betas.0)?;
        check_unit("betas[1]", config.betas.1)?;
        check_non_negative("eps", config.eps)?;
        check_non_negative("weight_decay", config.weight_decay)?;
        check_finite("r", config.r)?;
        check_finite("weight_lr_power", config.weight_lr_power)?;
        let (groups, state) = build_groups(groups, config.lr, config.weight_decay)?;
        config.group_state = fresh_states(&groups);
        Ok(Self {
            config,
            groups,
            state,
        })
    }

    /// The hyper-parameters and group states.
    pub fn config(&self) -> &RAdamScheduleFreeConfig {
        &self.config
    }
}

impl Optimizer for RAdamScheduleFree {
    fn step(&mut self) -> Result<()> {
        check_train_mode(self.name(), &self.config.group_state)?;
        check_group_count(&self.groups, &self.config.group_state)?;
        let c = &mut self.config;
        let (beta1, beta2) = c.betas;
        tch::no_grad(|| {
            let mut offset = 0;
            for (group, gs) in self.groups.iter().zip(c.group_state.iter_mut()) {
                let k = gs.k;
                let step = (k + 1) as f64;
                let beta2_t = py_pow(beta2, step);
                let bias_correction2 = 1.0 - beta2_t;
                // The length of the approximated SMA, and its maximum.
                let rho_inf = 2.0 / (1.0 - beta2) - 1.0;
                let rho_t = rho_inf - 2.0 * step * beta2_t / bias_correction2;
                let adaptive = rho_t > 4.0;
                let rect = if adaptive {
                    py_pow(
                        (rho_t - 4.0) * (rho_t - 2.0) * rho_inf
                            / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t),
                        0.5,
                    )
                } else if c.silent_sgd_phase {
                    0.0
                } else {
                    1.0
                };
                let lr = group.lr * rect;
                let ckp1 = gs.advance(lr, c.r, c.weight_lr_power);
                let y_lr = lr * (beta1 * (1.0 - ckp1) - 1.0);
                let adam = AdamStep {
                    beta2,
                    eps: c.eps,
                    bias_correction2,
                    adaptive,
                };
                step_group(group, offset, &mut self.state, Some(&adam), lr, ckp1, y_lr)?;
                gs.k = k + 1;
                offset += group.params.len();
            }
            Ok(())
        })
    }

    fn validate_state(&self, index: usize, param: &Tensor, state: &ParamState) -> Result<()> {
        expect_shape(index, state, "z", &param.size())?;
        expect_shape(index, state, "exp_avg_sq", &param.size())
    }

    schedule_free_common!("schedule_free_radam", RAdamScheduleFreeConfig, |c| c
        .betas
        .0);
}

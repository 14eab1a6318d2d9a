//! GaLore (galore-torch 1.0's `GaLoreAdamW` and `GaLoreAdafactor`), op for op: the gradient of
//! each projected parameter goes through its SVD projector (recomputed every
//! `update_proj_gap` steps), the moments live in the low-rank space, and the update is
//! projected back and scaled by `scale`. Parameters of groups without a projection get the
//! plain update of the base optimizer (transformers' deprecated AdamW, with `eps=1e-6` and
//! `correct_bias`; transformers' Adafactor).

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::adafactor::{adafactor_update, validate_moments};
use crate::low_rank::{Projection, Projector, ProjectorKind};
use crate::optimizer::{
    build_groups, check_non_negative, check_unit, expect_shape, grad_of, optimizer_accessors,
};
use crate::{AdafactorConfig, Error, GroupSpec, Optimizer, ParamGroup, ParamState, Result, ffi};

/// Hyper-parameters of [`GaLoreAdamW`] (galore_torch's `AdamW` arguments and defaults) and
/// the projection of each param group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GaLoreAdamWConfig {
    /// Learning rate (default 1e-3).
    pub lr: f64,
    /// `(beta1, beta2)` (default (0.9, 0.999)).
    pub betas: (f64, f64),
    /// Term added to the denominator (default 1e-6).
    pub eps: f64,
    /// Decoupled weight decay, applied after the update (default 0).
    pub weight_decay: f64,
    /// Bias correction of the moments (default true).
    pub correct_bias: bool,
    /// Per param group, its projection (upstream's group keys `rank`, ...); `None` (or a
    /// group past the end of the list): the plain AdamW update.
    pub projections: Vec<Option<Projection>>,
}

impl Default for GaLoreAdamWConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-6,
            weight_decay: 0.0,
            correct_bias: true,
            projections: Vec::new(),
        }
    }
}

/// Checks AdamW's hyper-parameters as upstream's constructor does.
pub(crate) fn validate_adam(lr: f64, betas: (f64, f64), eps: f64) -> Result<()> {
    check_non_negative("lr", lr)?;
    check_unit("betas[0]", betas.0)?;
    check_unit("betas[1]", betas.1)?;
    check_non_negative("eps", eps)
}

/// The step size of galore_torch's / apollo_torch's AdamW at step `step` (already
/// incremented): `lr * sqrt(1 - beta2 ** step) / (1 - beta1 ** step)` with `correct_bias`.
pub(crate) fn adam_step_size(lr: f64, betas: (f64, f64), step: u64, correct_bias: bool) -> f64 {
    if !correct_bias {
        return lr;
    }
    let bias_correction1 = 1.0 - betas.0.powf(step as f64);
    let bias_correction2 = 1.0 - betas.1.powf(step as f64);
    lr * bias_correction2.sqrt() / bias_correction1
}

/// The moments of galore_torch's / apollo_torch's AdamW: initialises `exp_avg` /
/// `exp_avg_sq` like `grad` when absent, increments the step, updates them and returns
/// `exp_avg / (exp_avg_sq.sqrt() + eps)`.
pub(crate) fn adam_moments(
    st: &mut ParamState,
    index: usize,
    grad: &Tensor,
    betas: (f64, f64),
    eps: f64,
) -> Result<Tensor> {
    if !st.tensors.contains_key("exp_avg") {
        st.tensors.insert("exp_avg".into(), grad.f_zeros_like()?);
        st.tensors.insert("exp_avg_sq".into(), grad.f_zeros_like()?);
    }
    let mut exp_avg = st.handle(index, "exp_avg")?;
    let mut exp_avg_sq = st.handle(index, "exp_avg_sq")?;
    st.step += 1;
    let _ = exp_avg.f_mul_scalar_(betas.0)?;
    ffi::add_(&mut exp_avg, grad, 1.0 - betas.0)?;
    let _ = exp_avg_sq.f_mul_scalar_(betas.1)?;
    ffi::addcmul_(&mut exp_avg_sq, grad, grad, 1.0 - betas.1)?;
    let mut denom = exp_avg_sq.f_sqrt()?;
    let _ = denom.f_add_scalar_(eps)?;
    Ok(exp_avg.f_div(&denom)?)
}

/// `p.add_(p, alpha=-lr * weight_decay)` when `weight_decay > 0` (AdamW's decay after the
/// update).
pub(crate) fn decay_after(p: &Tensor, lr: f64, weight_decay: f64) -> Result<()> {
    if weight_decay > 0.0 {
        let mut p_mut = p.shallow_clone();
        ffi::add_(&mut p_mut, p, -lr * weight_decay)?;
    }
    Ok(())
}

/// Checks the state of a parameter of an AdamW-style low-rank optimizer: the moments have
/// the projected shape, the projector's matrices theirs.
pub(crate) fn validate_low_rank_adam(
    index: usize,
    param: &Tensor,
    state: &ParamState,
    projector: Option<&Projector<'_>>,
) -> Result<()> {
    let shape = param.size();
    let moment_shape = match projector {
        Some(pr) if shape.len() == 2 => {
            pr.validate(index, &shape, state)?;
            pr.projection.low_rank_shape(&shape, pr.kind)
        }
        _ => shape,
    };
    if state.tensors.contains_key("exp_avg") {
        expect_shape(index, state, "exp_avg", &moment_shape)?;
        expect_shape(index, state, "exp_avg_sq", &moment_shape)?;
    }
    Ok(())
}

/// Checks each projection and that no projection asks for more groups than there are.
pub(crate) fn validate_projections(
    projections: &[Option<Projection>],
    groups: usize,
) -> Result<()> {
    if projections.len() > groups {
        return Err(Error::GroupCountMismatch {
            what: "projections",
            expected: groups,
            found: projections.len(),
        });
    }
    projections
        .iter()
        .flatten()
        .try_for_each(Projection::validate)
}

/// galore_torch's `GaLoreAdamW`: AdamW whose projected groups keep their moments in the
/// low-rank space of an SVD projection of the gradient.
///
/// ```
/// use tch::{nn, Device, Kind, Tensor};
/// use tchtrain_optim::{GaLoreAdamW, GaLoreAdamWConfig, GroupSpec, Optimizer, ProjType, Projection};
///
/// let vs = nn::VarStore::new(Device::Cpu);
/// let w = vs.root().randn("w", &[6, 4], 0.0, 1.0);
/// let projection = Projection { rank: 2, update_proj_gap: 200, scale: 0.25, proj_type: ProjType::Std };
/// let mut opt = GaLoreAdamW::new(
///     vec![GroupSpec::new(vec![("w".into(), w.shallow_clone())])],
///     GaLoreAdamWConfig { projections: vec![Some(projection)], ..Default::default() },
/// )?;
/// w.square().sum(Kind::Float).backward();
/// opt.step()?;
/// assert_eq!(opt.state()[0].as_ref().unwrap().tensors["exp_avg"].size(), [6, 2]);
/// # Ok::<(), tchtrain_optim::Error>(())
/// ```
#[derive(Debug)]
pub struct GaLoreAdamW {
    config: GaLoreAdamWConfig,
    groups: Vec<ParamGroup>,
    state: Vec<Option<ParamState>>,
}

impl GaLoreAdamW {
    /// Creates the optimizer over `groups` (each may override `lr` / `weight_decay`);
    /// `config.projections[i]` is the projection of group `i`.
    pub fn new(groups: Vec<GroupSpec>, config: GaLoreAdamWConfig) -> Result<Self> {
        validate_adam(config.lr, config.betas, config.eps)?;
        validate_projections(&config.projections, groups.len())?;
        let (groups, state) = build_groups(groups, config.lr, config.weight_decay)?;
        Ok(Self {
            config,
            groups,
            state,
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &GaLoreAdamWConfig {
        &self.config
    }

    /// The projector of the parameter at flat `index`, if its group has a projection.
    fn projector(&self, index: usize) -> Option<Projector<'_>> {
        let group = group_of(&self.groups, index)?;
        svd_projector(&self.config.projections, group)
    }
}

/// The group index of flat parameter `index`.
pub(crate) fn group_of(groups: &[ParamGroup], index: usize) -> Option<usize> {
    let mut end = 0;
    groups.iter().position(|g| {
        end += g.params.len();
        index < end
    })
}

/// GaLore's SVD projector for group `group`, if it has a projection.
pub(crate) fn svd_projector(
    projections: &[Option<Projection>],
    group: usize,
) -> Option<Projector<'_>> {
    let projection = projections.get(group)?.as_ref()?;
    Some(Projector {
        projection,
        kind: ProjectorKind::Svd,
        seed: 0,
    })
}

impl Optimizer for GaLoreAdamW {
    fn name(&self) -> &'static str {
        "galore_adamw"
    }

    fn default_lr(&self) -> f64 {
        self.config.lr
    }

    fn step(&mut self) -> Result<()> {
        let c = &self.config;
        tch::no_grad(|| {
            let mut offset = 0;
            for (gi, group) in self.groups.iter().enumerate() {
                let projector = svd_projector(&c.projections, gi);
                for (j, p) in group.params.iter().enumerate() {
                    let index = offset + j;
                    let Some(mut grad) = grad_of(p) else { continue };
                    let st = self.state[index].get_or_insert_with(ParamState::default);
                    if let Some(pr) = &projector {
                        grad = pr.project(st, &grad, st.step)?;
                    }
                    let mut norm_grad = adam_moments(st, index, &grad, c.betas, c.eps)?;
                    let step_size = adam_step_size(group.lr, c.betas, st.step, c.correct_bias);
                    if let Some(pr) = &projector {
                        norm_grad = pr.project_back(st, &norm_grad)?;
                    }
                    let mut p_mut = p.shallow_clone();
                    ffi::add_(&mut p_mut, &norm_grad, -step_size)?;
                    decay_after(p, group.lr, group.weight_decay)?;
                }
                offset += group.params.len();
            }
            Ok(())
        })
    }

    fn validate_state(&self, index: usize, param: &Tensor, state: &ParamState) -> Result<()> {
        validate_low_rank_adam(index, param, state, self.projector(index).as_ref())
    }

    optimizer_accessors!();
}

/// Hyper-parameters of [`GaLoreAdafactor`]: transformers' Adafactor arguments and the
/// projection of each param group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct GaLoreAdafactorConfig {
    /// Adafactor's hyper-parameters (upstream's defaults).
    #[serde(flatten)]
    pub adafactor: AdafactorConfig,
    /// Per param group, its projection; `None` (or a group past the end of the list): the
    /// plain Adafactor update.
    pub projections: Vec<Option<Projection>>,
}

/// galore_torch's `GaLoreAdafactor`: transformers' Adafactor whose projected groups keep
/// their factored moments in the low-rank space of an SVD projection of the gradient.
#[derive(Debug)]
pub struct GaLoreAdafactor {
    config: GaLoreAdafactorConfig,
    groups: Vec<ParamGroup>,
    state: Vec<Option<ParamState>>,
}

impl GaLoreAdafactor {
    /// Creates the optimizer over `groups` (each may override `lr` / `weight_decay`);
    /// `config.projections[i]` is the projection of group `i`.
    pub fn new(groups: Vec<GroupSpec>, config: GaLoreAdafactorConfig) -> Result<Self> {
        let a = &config.adafactor;
        if a.lr.is_some() && a.relative_step {
            return Err(Error::ConflictingOptions(
                "Cannot combine manual `lr` and `relative_step=True` options",
            ));
        }
        if a.warmup_init && !a.relative_step {
            return Err(Error::ConflictingOptions(
                "`warmup_init=True` requires `relative_step=True`",
            ));
        }
        if let Some(lr) = a.lr {
            check_non_negative("lr", lr)?;
        }
        check_non_negative("weight_decay", a.weight_decay)?;
        validate_projections(&config.projections, groups.len())?;
        let (groups, state) = build_groups(groups, a.lr.unwrap_or(0.0), a.weight_decay)?;
        Ok(Self {
            config,
            groups,
            state,
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &GaLoreAdafactorConfig {
        &self.config
    }
}

impl Optimizer for GaLoreAdafactor {
    fn name(&self) -> &'static str {
        "galore_adafactor"
    }

    fn default_lr(&self) -> f64 {
        self.config.adafactor.lr.unwrap_or(0.0)
    }

    fn step(&mut self) -> Result<()> {
        let c = &self.config;
        tch::no_grad(|| {
            let mut offset = 0;
            for (gi, group) in self.groups.iter().enumerate() {
                let projector = svd_projector(&c.projections, gi);
                for (j, p) in group.params.iter().enumerate() {
                    let index = offset + j;
                    let Some(grad) = grad_of(p) else { continue };
                    let st = self.state[index].get_or_insert_with(ParamState::default);
                    adafactor_update(&c.adafactor, group, p, index, st, grad, projector.as_ref())?;
                }
                offset += group.params.len();
            }
            Ok(())
        })
    }

    fn validate_state(&self, index: usize, param: &Tensor, state: &ParamState) -> Result<()> {
        let shape = param.size();
        let projector =
            group_of(&self.groups, index).and_then(|g| svd_projector(&self.config.projections, g));
        let shape = match &projector {
            Some(pr) if shape.len() == 2 => {
                pr.validate(index, &shape, state)?;
                pr.projection.low_rank_shape(&shape, pr.kind)
            }
            _ => shape,
        };
        if !state.scalars.contains_key("RMS") {
            return Ok(());
        }
        validate_moments(&self.config.adafactor, index, &shape, state)
    }

    optimizer_accessors!();
}

/// Upstream's `_get_galore_optimizer` (with `_setup_low_rank_optimizer`): the projection from
/// `optim_args` (`rank=128`, `update_proj_gap=200`, `scale=0.25`, `proj_type=std`), the groups
/// `[non-target, target]` with no weight decay (the handler drops the Trainer's decay groups,
/// and galore_torch's default is 0), `lr`; `galore_adafactor` adds
/// `scale_parameter=False, relative_step=False`. (`galore_adamw_8bit`'s groups carry its own
/// default weight decay, 1e-2.)
pub(crate) fn create_galore(
    args: &crate::OptimizerArgs,
    optim_args: &std::collections::BTreeMap<String, String>,
    groups: Vec<GroupSpec>,
) -> Result<Box<dyn Optimizer>> {
    use crate::low_rank::{int_arg, low_rank_groups, low_rank_target_names};
    let name = args.optim.as_str();
    let projection = Projection {
        rank: int_arg(optim_args, "rank")?.unwrap_or(128),
        update_proj_gap: gap_arg(optim_args)?,
        scale: crate::optim_args::float_arg(optim_args, "scale")?.unwrap_or(0.25),
        proj_type: optim_args
            .get("proj_type")
            .map(|s| s.parse())
            .transpose()?
            .unwrap_or(crate::ProjType::Std),
    };
    let targets = low_rank_target_names(
        name,
        args.optim_target_modules.as_ref(),
        &args.linear_modules,
    )?;
    let groups = low_rank_groups(groups, &targets).into();
    let projections = vec![None, Some(projection)];
    Ok(match name {
        "galore_adamw" => Box::new(GaLoreAdamW::new(
            groups,
            GaLoreAdamWConfig {
                lr: args.learning_rate,
                projections,
                ..Default::default()
            },
        )?),
        // galore_torch's AdamW8bit with `lr` only: bitsandbytes' eps (1e-8) and weight decay
        // (1e-2) stay
        "galore_adamw_8bit" => Box::new(crate::GaLoreAdamW8bit::new(
            groups,
            crate::GaLoreAdamW8bitConfig {
                lr: args.learning_rate,
                projections,
                ..Default::default()
            },
        )?),
        "galore_adafactor" => Box::new(GaLoreAdafactor::new(
            groups,
            GaLoreAdafactorConfig {
                adafactor: AdafactorConfig {
                    lr: Some(args.learning_rate),
                    scale_parameter: false,
                    relative_step: false,
                    ..Default::default()
                },
                projections,
            },
        )?),
        other => {
            return Err(Error::InvalidOptimizerSetup {
                name: other.into(),
                detail: "not a GaLore optimizer name".into(),
            });
        }
    })
}

/// `int(optim_args.pop("update_proj_gap", 200))`, which must be positive here.
pub(crate) fn gap_arg(optim_args: &std::collections::BTreeMap<String, String>) -> Result<u64> {
    let gap = crate::low_rank::int_arg(optim_args, "update_proj_gap")?.unwrap_or(200);
    u64::try_from(gap).map_err(|_| Error::InvalidHyperparameter {
        name: "update_proj_gap",
        value: gap as f64,
        expected: ">= 1",
    })
}

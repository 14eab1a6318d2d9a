//! APOLLO (apollo-torch 1.0.3's `APOLLOAdamW`), op for op: the gradient of each projected
//! parameter goes through a low-rank projection (a seeded Gaussian matrix by default, or
//! GaLore's SVD), AdamW's moments live in that space, and the ratio of the low-rank update's
//! norm to the low-rank gradient's (per channel or per tensor) scales the full gradient, which
//! Fira's norm-growth limiter then bounds. Other groups get the plain update (transformers'
//! deprecated AdamW, `eps=1e-6`, `correct_bias`).
//!
//! The random projection draws from a fresh CPU generator seeded with the parameter's
//! 1-based position over all groups (then `next_seed`), as upstream does on the CPU; on CUDA
//! upstream draws from a CUDA generator, a different stream, where this one keeps the CPU's.

use std::str::FromStr;

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::galore::{
    adam_moments, adam_step_size, decay_after, group_of, validate_adam, validate_low_rank_adam,
};
use crate::low_rank::{Projection, Projector, ProjectorKind};
use crate::optimizer::{build_groups, grad_of, optimizer_accessors};
use crate::{Error, GroupSpec, Optimizer, ParamGroup, ParamState, Result, ffi};

/// State key of the norm-growth limiter's last scaled-gradient norm.
const SCALED_GRAD: &str = "scaled_grad";

/// APOLLO's `scale_type`: how the gradient scaling factor is resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScaleType {
    /// One factor per channel (row or column, along the projected side; the default).
    Channel,
    /// One factor for the whole tensor.
    Tensor,
}

impl FromStr for ScaleType {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "channel" => Ok(Self::Channel),
            "tensor" => Ok(Self::Tensor),
            _ => Err(Error::InvalidOptimArgValue {
                key: "scale_type".into(),
                value: s.into(),
                expected: "channel or tensor",
            }),
        }
    }
}

/// The APOLLO options of a projected group: upstream's group keys `rank`, `proj`,
/// `scale_type`, `update_proj_gap`, `scale`, `proj_type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApolloProjection {
    /// Rank, recompute gap, scale and side of the projection.
    #[serde(flatten)]
    pub projection: Projection,
    /// `proj`: `random` (default) or `svd`.
    pub proj: ProjectorKind,
    /// `scale_type`: `channel` (default) or `tensor`.
    pub scale_type: ScaleType,
}

/// What one param group sets beyond the optimizer's defaults (upstream's handler gives the
/// projected group the Trainer's `betas` / `eps`; the other group keeps the class defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct ApolloGroup {
    /// The group's `betas`, or the optimizer's.
    pub betas: Option<(f64, f64)>,
    /// The group's `eps`, or the optimizer's.
    pub eps: Option<f64>,
    /// The group's projection; `None`: the plain AdamW update.
    pub projection: Option<ApolloProjection>,
}

/// Hyper-parameters of [`ApolloAdamW`] (apollo_torch's `AdamW` arguments and defaults) and
/// the options of each param group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ApolloAdamWConfig {
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
    /// Multiply by `sqrt(scale)` before the norm-growth limiter instead of after (default
    /// false).
    pub scale_front: bool,
    /// Disable the norm-growth limiter (default false).
    pub disable_nl: bool,
    /// Per param group, its options (a group past the end of the list: none).
    pub groups: Vec<ApolloGroup>,
    /// The random projector's first seed is `seed_offset` plus the parameter's 1-based flat
    /// index (upstream: 0; one optimizer per parameter, as the layer-wise form builds, seeds
    /// every parameter with 1).
    pub seed_offset: u64,
}

impl Default for ApolloAdamWConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-6,
            weight_decay: 0.0,
            correct_bias: true,
            scale_front: false,
            disable_nl: false,
            groups: Vec::new(),
            seed_offset: 0,
        }
    }
}

/// apollo_torch's `APOLLOAdamW`: AdamW whose projected groups take the moments of a low-rank
/// projection of the gradient and apply their norm ratio to the full gradient.
#[derive(Debug)]
pub struct ApolloAdamW {
    config: ApolloAdamWConfig,
    groups: Vec<ParamGroup>,
    state: Vec<Option<ParamState>>,
}

impl ApolloAdamW {
    /// Creates the optimizer over `groups` (each may override `lr` / `weight_decay`);
    /// `config.groups[i]` holds the options of group `i`.
    pub fn new(groups: Vec<GroupSpec>, config: ApolloAdamWConfig) -> Result<Self> {
        validate_adam(config.lr, config.betas, config.eps)?;
        if config.groups.len() > groups.len() {
            return Err(Error::GroupCountMismatch {
                what: "APOLLO group options",
                expected: groups.len(),
                found: config.groups.len(),
            });
        }
        for g in &config.groups {
            validate_adam(
                config.lr,
                g.betas.unwrap_or(config.betas),
                g.eps.unwrap_or(config.eps),
            )?;
            if let Some(p) = &g.projection {
                p.projection.validate()?;
                if p.proj == ProjectorKind::Random
                    && p.projection.proj_type == crate::ProjType::Full
                {
                    return Err(Error::ConflictingOptions(
                        "APOLLO's random projection does not implement proj_type=full",
                    ));
                }
            }
        }
        let (groups, state) = build_groups(groups, config.lr, config.weight_decay)?;
        Ok(Self {
            config,
            groups,
            state,
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &ApolloAdamWConfig {
        &self.config
    }
}

/// The projector of flat parameter `index` in group `group`, if the group has a projection.
fn projector(c: &ApolloAdamWConfig, group: usize, index: usize) -> Option<Projector<'_>> {
    let p = c.groups.get(group)?.projection.as_ref()?;
    Some(Projector {
        projection: &p.projection,
        kind: p.proj,
        seed: c.seed_offset + index as u64 + 1,
    })
}

impl Optimizer for ApolloAdamW {
    fn name(&self) -> &'static str {
        "apollo_adamw"
    }

    fn default_lr(&self) -> f64 {
        self.config.lr
    }

    fn step(&mut self) -> Result<()> {
        let c = &self.config;
        tch::no_grad(|| {
            let mut offset = 0;
            for (gi, group) in self.groups.iter().enumerate() {
                let options = c.groups.get(gi);
                let betas = options.and_then(|o| o.betas).unwrap_or(c.betas);
                let eps = options.and_then(|o| o.eps).unwrap_or(c.eps);
                for (j, p) in group.params.iter().enumerate() {
                    let index = offset + j;
                    let Some(full_grad) = grad_of(p) else {
                        continue;
                    };
                    let st = self.state[index].get_or_insert_with(ParamState::default);
                    let pr = projector(c, gi, index);
                    let grad = match &pr {
                        Some(pr) => pr.project(st, &full_grad, st.step)?,
                        None => full_grad.shallow_clone(),
                    };
                    let mut norm_grad = adam_moments(st, index, &grad, betas, eps)?;
                    let step_size = adam_step_size(group.lr, betas, st.step, c.correct_bias);
                    if let Some(o) = options.and_then(|o| o.projection.as_ref()) {
                        norm_grad = apollo_scaled_grad(c, o, st, &full_grad, &grad, &norm_grad)?;
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
        let pr = group_of(&self.groups, index).and_then(|g| projector(&self.config, g, index));
        validate_low_rank_adam(index, param, state, pr.as_ref())
    }

    optimizer_accessors!();
}

/// APOLLO's steps 3 and 4: the gradient scaling factor from the low-rank update `norm_grad`
/// and gradient `grad`, applied to the full gradient, the norm-growth limiter, `sqrt(scale)`.
fn apollo_scaled_grad(
    c: &ApolloAdamWConfig,
    o: &ApolloProjection,
    st: &mut ParamState,
    full_grad: &Tensor,
    grad: &Tensor,
    norm_grad: &Tensor,
) -> Result<Tensor> {
    let size = full_grad.size();
    // The low-rank dimension: 0 for a wide gradient, 1 otherwise.
    let norm_dim: i64 = if size[0] < size[1] { 0 } else { 1 };
    let factor = match o.scale_type {
        ScaleType::Channel => {
            let num = norm_grad.f_norm_scalaropt_dim(2.0, [norm_dim], false)?;
            let den = grad
                .f_norm_scalaropt_dim(2.0, [norm_dim], false)?
                .f_add_scalar(1e-8)?;
            let f = num.f_div(&den)?;
            if norm_dim == 1 { f.f_unsqueeze(1)? } else { f }
        }
        ScaleType::Tensor => {
            let num = ffi::vector_norm(norm_grad, 2.0)?;
            let den = ffi::vector_norm(grad, 2.0)?.f_add_scalar(1e-8)?;
            num.f_div(&den)?
        }
    };
    let mut scaled = full_grad.f_mul(&factor)?;
    let sqrt_scale = o.projection.scale.sqrt();
    if c.scale_front {
        let _ = scaled.f_mul_scalar_(sqrt_scale)?;
    }
    if !c.disable_nl {
        match st.tensors.get(SCALED_GRAD) {
            Some(previous) => {
                let norm = ffi::vector_norm(&scaled, 2.0)?;
                let ratio = norm.f_div(&previous.f_add_scalar(1e-8)?)?;
                // Python's `max(ratio, 1.01) / 1.01`: the float 1.0 unless `ratio < 1.01`
                // is false, then the tensor `ratio / 1.01`.
                if ratio.f_lt(1.01)?.f_int64_value(&[])? != 0 {
                    scaled = scaled.f_div_scalar(1.0)?;
                    st.tensors
                        .insert(SCALED_GRAD.into(), norm.f_div_scalar(1.0)?);
                } else {
                    let limiter = ratio.f_div_scalar(1.01)?;
                    scaled = scaled.f_div(&limiter)?;
                    st.tensors.insert(SCALED_GRAD.into(), norm.f_div(&limiter)?);
                }
            }
            None => {
                st.tensors
                    .insert(SCALED_GRAD.into(), ffi::vector_norm(&scaled, 2.0)?);
            }
        }
    }
    if !c.scale_front {
        let _ = scaled.f_mul_scalar_(sqrt_scale)?;
    }
    Ok(scaled)
}

/// Upstream's `_get_apollo_optimizer` (with `_setup_low_rank_optimizer`): the projection from
/// `optim_args` (`rank=128`, `proj=random`, `scale_type=channel`, `update_proj_gap=200`,
/// `scale=1.0`, `proj_type=std`) and the Trainer's `betas` / `eps` on the target group, the
/// groups `[non-target, target]` with no weight decay (the handler drops the Trainer's decay
/// groups), `lr`.
pub(crate) fn create_apollo(
    args: &crate::OptimizerArgs,
    optim_args: &std::collections::BTreeMap<String, String>,
    groups: Vec<GroupSpec>,
) -> Result<Box<dyn Optimizer>> {
    use crate::low_rank::{int_arg, low_rank_groups, low_rank_target_names};
    let name = args.optim.as_str();
    let proj = match optim_args.get("proj").map(String::as_str) {
        None | Some("random") => ProjectorKind::Random,
        Some("svd") => ProjectorKind::Svd,
        // Upstream raises "Invalid projector type specified in group" in the first step.
        Some(other) => {
            return Err(Error::InvalidOptimArgValue {
                key: "proj".into(),
                value: other.into(),
                expected: "random or svd",
            });
        }
    };
    let projection = ApolloProjection {
        projection: Projection {
            rank: int_arg(optim_args, "rank")?.unwrap_or(128),
            update_proj_gap: crate::galore::gap_arg(optim_args)?,
            scale: crate::optim_args::float_arg(optim_args, "scale")?.unwrap_or(1.0),
            proj_type: optim_args
                .get("proj_type")
                .map(|s| s.parse())
                .transpose()?
                .unwrap_or(crate::ProjType::Std),
        },
        proj,
        scale_type: optim_args
            .get("scale_type")
            .map(|s| s.parse())
            .transpose()?
            .unwrap_or(ScaleType::Channel),
    };
    let targets = low_rank_target_names(
        name,
        args.optim_target_modules.as_ref(),
        &args.linear_modules,
    )?;
    let groups = low_rank_groups(groups, &targets).into();
    let target_group = ApolloGroup {
        betas: Some((args.adam_beta1, args.adam_beta2)),
        eps: Some(args.adam_epsilon),
        projection: Some(projection),
    };
    Ok(Box::new(ApolloAdamW::new(
        groups,
        ApolloAdamWConfig {
            lr: args.learning_rate,
            groups: vec![ApolloGroup::default(), target_group],
            ..Default::default()
        },
    )?))
}

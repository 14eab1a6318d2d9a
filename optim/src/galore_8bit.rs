//! galore-torch 1.0's `GaLoreAdamW8bit` (`galore_torch.adamw8bit.AdamW8bit`) on bitsandbytes
//! 0.50.2's CPU update, op for op.
//!
//! The class is bitsandbytes' `Optimizer2State("adam", ...)` with `optim_bits=8` whatever its
//! `optim_bits` argument says; its step, per parameter with a gradient:
//! - in a group with a projection: the gradient goes through GaLore's SVD projector (as
//!   [`GaLoreAdamW`](crate::GaLoreAdamW)'s), the parameter's data is swapped for zeros of the
//!   projected shape, bitsandbytes' `update_step` runs on them with the projected gradient and
//!   the group's weight decay set to 0, and the result, projected back and times `scale`, is
//!   added to the saved data; then the weight decay, `p += -lr * weight_decay * p`;
//! - elsewhere: bitsandbytes' `update_step` (decoupled weight decay `p *= 1 - lr * wd`).
//!
//! bitsandbytes keeps the state of a (projected) shape of at least `min_8bit_size` (4096)
//! elements as blockwise 8-bit codes (`state1` / `state2`, `qmap1` / `qmap2`,
//! `absmax1` / `absmax2`), smaller ones in float32, as [`BnbOptimizer`](crate::BnbOptimizer).
//!
//! galore-torch 1.0 passes bitsandbytes' arguments by position from an older signature: its
//! `percentile_clipping` (100) lands in bitsandbytes 0.50.2's `max_unorm` and its `block_wise`
//! (true) in `skip_zeros` (which the CPU kernels ignore). So every parameter keeps `unorm_vec`,
//! and the 32-bit update is limited to 100 times the norm of the data it updates: for a
//! projected parameter that data is the zeros, so a projected parameter with float32 state
//! gets no update from its moments (the moments still move), only the weight decay; a
//! parameter whose values are all zero (a LayerNorm bias at initialisation) stays zero. The
//! 8-bit update has no such limit. This is what the package does, and what is reproduced.
//!
//! The reference is the package's algorithm on the CPU, its CUDA-only `torch.cuda.synchronize()`
//! (called after each parameter's update) stubbed. The Trainer passes `lr` only, and, the class
//! not being bitsandbytes' own, registers no 32-bit override of the embeddings.

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::bitsandbytes::{ParamRef, is_non_castable, update_param, validate_bnb_state};
use crate::blockwise::QuantizerCache;
use crate::galore::{decay_after, group_of, svd_projector, validate_projections};
use crate::low_rank::Projection;
use crate::optimizer::{
    build_groups, check_non_negative, check_unit, grad_of, optimizer_accessors,
};
use crate::{BnbConfig, GroupSpec, Optimizer, ParamGroup, ParamState, Result};

/// Hyper-parameters of [`GaLoreAdamW8bit`] (galore_torch's `AdamW8bit` arguments and
/// defaults) and the projection of each param group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GaLoreAdamW8bitConfig {
    /// Learning rate (default 1e-3).
    pub lr: f64,
    /// `(beta1, beta2)` (default (0.9, 0.999)).
    pub betas: (f64, f64),
    /// Term added to the denominator (default 1e-8).
    pub eps: f64,
    /// Weight decay (default 1e-2): bitsandbytes' decoupled decay for parameters without a
    /// projection, galore_torch's `p += -lr * wd * p` after the projected-back update for the
    /// others.
    pub weight_decay: f64,
    /// `min_8bit_size`: a (projected) state of fewer elements stays float32 (default 4096).
    pub min_8bit_size: u64,
    /// `percentile_clipping` (default 100), which reaches bitsandbytes 0.50.2 as `max_unorm`
    /// (see the module documentation); 0 turns the limit off.
    pub percentile_clipping: f64,
    /// Per param group, its projection (upstream's group keys `rank`, ...); `None` (or a
    /// group past the end of the list): the plain 8-bit AdamW update.
    pub projections: Vec<Option<Projection>>,
}

impl Default for GaLoreAdamW8bitConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 1e-2,
            min_8bit_size: 4096,
            percentile_clipping: 100.0,
            projections: Vec::new(),
        }
    }
}

impl GaLoreAdamW8bitConfig {
    /// The bitsandbytes configuration its update runs with.
    fn bnb(&self) -> BnbConfig {
        BnbConfig {
            lr: self.lr,
            betas: self.betas,
            eps: self.eps,
            weight_decay: self.weight_decay,
            optim_bits: 8,
            min_8bit_size: self.min_8bit_size,
            max_unorm: self.percentile_clipping,
            ..BnbConfig::adamw()
        }
    }
}

/// galore_torch's `GaLoreAdamW8bit`: bitsandbytes' 8-bit AdamW whose projected groups keep
/// their (8-bit or float32) moments in the low-rank space of an SVD projection of the
/// gradient. See the module documentation for what galore-torch 1.0 on bitsandbytes 0.50.2
/// does, which this reproduces.
///
/// ```
/// use tch::{nn, Device, Kind};
/// use tchtrain_optim::{GaLoreAdamW8bit, GaLoreAdamW8bitConfig, GroupSpec, Optimizer, ProjType, Projection};
///
/// let vs = nn::VarStore::new(Device::Cpu);
/// let w = vs.root().randn("w", &[128, 64], 0.0, 1.0);
/// let projection = Projection { rank: 64, update_proj_gap: 200, scale: 0.25, proj_type: ProjType::Left };
/// let mut opt = GaLoreAdamW8bit::new(
///     vec![GroupSpec::new(vec![("w".into(), w.shallow_clone())])],
///     GaLoreAdamW8bitConfig { projections: vec![Some(projection)], ..Default::default() },
/// )?;
/// w.square().sum(Kind::Float).backward();
/// opt.step()?;
/// // 64 x 64 = 4096 projected elements: 8-bit moments
/// let state = opt.state()[0].as_ref().unwrap();
/// assert_eq!(state.tensors["state1"].size(), [64, 64]);
/// assert_eq!(state.tensors["state1"].kind(), Kind::Uint8);
/// # Ok::<(), tchtrain_optim::Error>(())
/// ```
#[derive(Debug)]
pub struct GaLoreAdamW8bit {
    config: GaLoreAdamW8bitConfig,
    groups: Vec<ParamGroup>,
    state: Vec<Option<ParamState>>,
    quantizers: QuantizerCache,
}

impl GaLoreAdamW8bit {
    /// Creates the optimizer over `groups` (each may override `lr` / `weight_decay`);
    /// `config.projections[i]` is the projection of group `i`. The values are checked as
    /// bitsandbytes' constructor does, the projections as GaLore's.
    pub fn new(groups: Vec<GroupSpec>, config: GaLoreAdamW8bitConfig) -> Result<Self> {
        check_non_negative("lr", config.lr)?;
        check_non_negative("eps", config.eps)?;
        check_unit("betas[0]", config.betas.0)?;
        check_unit("betas[1]", config.betas.1)?;
        check_non_negative("weight_decay", config.weight_decay)?;
        check_non_negative("percentile_clipping", config.percentile_clipping)?;
        validate_projections(&config.projections, groups.len())?;
        let (groups, state) = build_groups(groups, config.lr, config.weight_decay)?;
        Ok(Self {
            config,
            groups,
            state,
            quantizers: QuantizerCache::default(),
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &GaLoreAdamW8bitConfig {
        &self.config
    }
}

impl Optimizer for GaLoreAdamW8bit {
    fn name(&self) -> &'static str {
        "galore_adamw_8bit"
    }

    fn default_lr(&self) -> f64 {
        self.config.lr
    }

    fn step(&mut self) -> Result<()> {
        let c = &self.config;
        let bnb = c.bnb();
        let quantizers = &mut self.quantizers;
        let states = &mut self.state;
        tch::no_grad(|| {
            let mut offset = 0;
            for (gi, group) in self.groups.iter().enumerate() {
                let projector = svd_projector(&c.projections, gi);
                for (j, p) in group.params.iter().enumerate() {
                    let index = offset + j;
                    let Some(grad) = grad_of(p) else { continue };
                    let st = states[index].get_or_insert_with(ParamState::default);
                    let name = &group.param_names[j];
                    let Some(pr) = &projector else {
                        let param = ParamRef {
                            name,
                            tensor: p,
                            index,
                        };
                        update_param(
                            &bnb,
                            group.lr,
                            group.weight_decay,
                            param,
                            &grad,
                            st,
                            quantizers,
                        )?;
                        continue;
                    };
                    let low_grad = pr.project(st, &grad, st.step)?;
                    // `p.data = zeros` of the projected shape and the parameter's dtype;
                    // bitsandbytes updates them with the group's decay set to 0
                    let low = Tensor::f_zeros(low_grad.size().as_slice(), (p.kind(), p.device()))?;
                    let param = ParamRef {
                        name,
                        tensor: &low,
                        index,
                    };
                    update_param(&bnb, group.lr, 0.0, param, &low_grad, st, quantizers)?;
                    // `p.data = p.saved_data.add_(project_back(p.data))`, then the decay
                    let back = pr.project_back(st, &low)?;
                    let _ = p.shallow_clone().f_add_(&back)?;
                    decay_after(p, group.lr, group.weight_decay)?;
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
        if state.tensors.contains_key("state1") {
            validate_bnb_state(crate::BnbAlgorithm::AdamW, index, &shape, state)?;
        }
        Ok(())
    }

    /// bitsandbytes' state entries load uncast (`non_castable_tensor_keys`); the projector's
    /// matrices take the parameter's dtype.
    fn keeps_state_dtype(&self, key: &str) -> bool {
        is_non_castable(key)
    }

    optimizer_accessors!();
}

//! bitsandbytes' optimizers (0.50.2) as they run on a CPU: AdamW, AdEMAMix, Lion and RMSprop
//! with 32-bit or blockwise 8-bit state, and the Trainer's handler for the `optim` names that
//! load them (upstream `trainer_optimizer._get_bitsandbytes_optimizer`).
//!
//! bitsandbytes' `Optimizer1State` / `Optimizer2State` (and `AdEMAMix`) keep per parameter
//! `step` and `state1` (and `state2`); under `optim_bits=8` a parameter of at least
//! `min_8bit_size` (4096) elements keeps them as uint8 codes of the dynamic maps `qmap1` /
//! `qmap2` with one float32 `absmax1` / `absmax2` per block of 256 elements; smaller ones, and
//! parameters registered with `{"optim_bits": 32}` (the Trainer registers every
//! `nn.Embedding` weight), keep float32 state. The update is the CPU backend's pure-torch
//! kernel (`backends/cpu/ops.py`: `_optimizer_update_32bit_cpu`,
//! `_optimizer_update_8bit_blockwise_cpu`), op for op; the 8-bit path dequantizes the state,
//! updates it in float32 and quantizes it back ([`quantize_blockwise`](crate::quantize_blockwise)). Paged optimizers
//! are not paged on a CPU (bitsandbytes warns and falls back), so `is_paged` changes nothing
//! here. (bitsandbytes 0.50.2's paged AdEMAMix fails on a CPU for parameters of 100k
//! elements or more, asking for CUDA managed memory; this implementation runs them unpaged.)
//!
//! State keys are bitsandbytes' (`state1`, `state2`, `qmap1`, `qmap2`, `absmax1`,
//! `absmax2`); AdEMAMix's `state1` stacks its two EMAs as `(2, *shape)` (and `absmax1` as
//! `(2, blocks)`). `skip_zeros` stays at its default (false: all the Trainer passes; the CPU
//! kernels ignore it), and so does `max_unorm` (0) under the Trainer's names; a positive
//! `max_unorm` (GaLore's 8-bit AdamW passes one) adds the `unorm_vec` state and the CPU
//! kernel's update-norm limit on the 32-bit AdamW / RMSprop update. The CPU kernel ignores
//! RMSprop's `momentum` (its `betas[1]`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tch::{Kind, TchError, Tensor};

use crate::blockwise::{
    BLOCKSIZE, QuantizerCache, create_dynamic_map, dequantize, f32_values, num_blocks, u8_values,
};
use crate::ffi;
use crate::optim_args::float_arg;
use crate::optimizer::{
    build_groups, check_non_negative, check_unit, expect_shape, grad_of, optimizer_accessors,
};
use crate::{Error, GroupSpec, Optimizer, OptimizerArgs, ParamGroup, ParamState, Result};

/// The update rule (bitsandbytes' `optimizer_name`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BnbAlgorithm {
    /// `bitsandbytes.optim.AdamW` (kernel `adam`, decoupled weight decay): two states.
    AdamW,
    /// `bitsandbytes.optim.AdEMAMix`: a fast and a slow EMA stacked in `state1`, `nu` in
    /// `state2`, optional `t_alpha` / `t_beta3` warm-up schedules.
    Ademamix,
    /// `bitsandbytes.optim.Lion`: one state, sign update.
    Lion,
    /// `bitsandbytes.optim.RMSprop`: one state, `betas = (alpha, momentum)`.
    RmsProp,
}

impl BnbAlgorithm {
    fn two_state(self) -> bool {
        matches!(self, Self::AdamW | Self::Ademamix)
    }

    fn name(self) -> &'static str {
        match self {
            Self::AdamW => "bnb_adamw",
            Self::Ademamix => "bnb_ademamix",
            Self::Lion => "bnb_lion",
            Self::RmsProp => "bnb_rmsprop",
        }
    }
}

/// Hyper-parameters of [`BnbOptimizer`] (bitsandbytes' constructor arguments and the
/// `GlobalOptimManager` overrides). The constructors [`BnbConfig::adamw`],
/// [`BnbConfig::ademamix`], [`BnbConfig::lion`] and [`BnbConfig::rmsprop`] give each class's
/// defaults; `Default` is AdamW's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BnbConfig {
    /// The update rule.
    pub algorithm: BnbAlgorithm,
    /// Learning rate.
    pub lr: f64,
    /// `betas[0..2]`: Adam's / AdEMAMix's `(beta1, beta2)`, Lion's `(beta1, beta2)`,
    /// RMSprop's `(alpha, momentum)`.
    pub betas: (f64, f64),
    /// AdEMAMix's `betas[2]`, the slow EMA's decay (default 0.9999; unused otherwise).
    pub beta3: f64,
    /// AdEMAMix's `alpha`, the slow EMA's weight (default 5.0; unused otherwise).
    pub alpha: f64,
    /// AdEMAMix's `t_alpha`: `alpha` ramps up linearly over this many steps (`None` or 0:
    /// no schedule).
    pub t_alpha: Option<i64>,
    /// AdEMAMix's `t_beta3`: `beta3` ramps up from `beta1` over this many steps (`None` or
    /// 0: no schedule).
    pub t_beta3: Option<i64>,
    /// Epsilon (Lion passes 0).
    pub eps: f64,
    /// Decoupled weight decay for AdamW / AdEMAMix / Lion (`p *= 1 - lr * wd`), added to the
    /// gradient for RMSprop.
    pub weight_decay: f64,
    /// `optim_bits`: 32 (float32 state) or 8 (blockwise 8-bit state).
    pub optim_bits: u32,
    /// `min_8bit_size`: parameters with fewer elements keep float32 state (default 4096).
    pub min_8bit_size: u64,
    /// `is_paged`: recorded; a CPU optimizer is never paged.
    pub is_paged: bool,
    /// `max_unorm` (default 0: off): when positive, every parameter keeps `unorm_vec` (the
    /// norm of its last update) and a 32-bit AdamW / RMSprop update whose norm exceeds
    /// `max_unorm * ||p||` (the parameter's norm before the step) is scaled down to it. The
    /// 8-bit kernel ignores it, as bitsandbytes' CPU backend does.
    pub max_unorm: f64,
    /// Names of the parameters registered with `{"optim_bits": 32}` (the Trainer's
    /// `register_module_override` of every `nn.Embedding` weight): float32 state whatever
    /// `optim_bits` says.
    pub fp32_params: Vec<String>,
}

impl BnbConfig {
    fn base(algorithm: BnbAlgorithm) -> Self {
        Self {
            algorithm,
            lr: 1e-3,
            betas: (0.9, 0.999),
            beta3: 0.9999,
            alpha: 5.0,
            t_alpha: None,
            t_beta3: None,
            eps: 1e-8,
            weight_decay: 1e-2,
            optim_bits: 32,
            min_8bit_size: 4096,
            is_paged: false,
            max_unorm: 0.0,
            fp32_params: Vec::new(),
        }
    }

    /// `bitsandbytes.optim.AdamW`'s defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8,
    /// weight decay 1e-2.
    pub fn adamw() -> Self {
        Self::base(BnbAlgorithm::AdamW)
    }

    /// `bitsandbytes.optim.AdEMAMix`'s defaults: lr 1e-3, betas (0.9, 0.999, 0.9999),
    /// alpha 5, eps 1e-8, weight decay 1e-2, no schedules.
    pub fn ademamix() -> Self {
        Self::base(BnbAlgorithm::Ademamix)
    }

    /// `bitsandbytes.optim.Lion`'s defaults: lr 1e-4, betas (0.9, 0.99), weight decay 0.
    pub fn lion() -> Self {
        Self {
            lr: 1e-4,
            betas: (0.9, 0.99),
            eps: 0.0,
            weight_decay: 0.0,
            ..Self::base(BnbAlgorithm::Lion)
        }
    }

    /// `bitsandbytes.optim.RMSprop`'s defaults: lr 1e-2, alpha 0.99, eps 1e-8, weight
    /// decay 0, momentum 0.
    pub fn rmsprop() -> Self {
        Self {
            lr: 1e-2,
            betas: (0.99, 0.0),
            weight_decay: 0.0,
            ..Self::base(BnbAlgorithm::RmsProp)
        }
    }
}

impl Default for BnbConfig {
    fn default() -> Self {
        Self::adamw()
    }
}

/// A bitsandbytes optimizer: AdamW, AdEMAMix, Lion or RMSprop with 32-bit or blockwise 8-bit
/// state, bit-identical to bitsandbytes 0.50.2 on a CPU (its pure-torch CPU kernels, and the C
/// library's blockwise quantization for the 8-bit states).
///
/// Per parameter: `step`, `state1` (and `state2` for AdamW / AdEMAMix; AdEMAMix's `state1`
/// stacks its two EMAs as `(2, *shape)`), float32, or under `optim_bits = 8` for parameters
/// of at least `min_8bit_size` elements not in `fp32_params`, uint8 codes with `qmap1` /
/// `qmap2` ([`create_dynamic_map`](crate::create_dynamic_map) signed / unsigned) and one
/// float32 `absmax1` / `absmax2` per block of 256 elements. The state stays float32 for
/// float16 / bfloat16 parameters too, and loads uncast, as bitsandbytes' does.
#[derive(Debug)]
pub struct BnbOptimizer {
    config: BnbConfig,
    groups: Vec<ParamGroup>,
    state: Vec<Option<ParamState>>,
    quantizers: QuantizerCache,
}

impl BnbOptimizer {
    /// Creates the optimizer over `groups` (each may override `lr` / `weight_decay`),
    /// checking the values as bitsandbytes' constructors do.
    pub fn new(groups: Vec<GroupSpec>, config: BnbConfig) -> Result<Self> {
        check_non_negative("lr", config.lr)?;
        check_non_negative("eps", config.eps)?;
        check_unit("betas[0]", config.betas.0)?;
        check_unit("betas[1]", config.betas.1)?;
        check_non_negative("weight_decay", config.weight_decay)?;
        check_non_negative("max_unorm", config.max_unorm)?;
        if config.algorithm == BnbAlgorithm::Ademamix {
            check_unit("betas[2]", config.beta3)?;
            // the schedule takes log(beta1) and log(beta3) (Python's math.log(0) raises)
            if schedule_on(config.t_beta3) && (config.betas.0 == 0.0 || config.beta3 == 0.0) {
                return Err(Error::InvalidHyperparameter {
                    name: "betas",
                    value: 0.0,
                    expected: "beta1 and beta3 > 0 when t_beta3 is set (its schedule takes their log)",
                });
            }
        }
        if config.algorithm == BnbAlgorithm::RmsProp && config.betas.0 == 0.0 {
            return Err(Error::InvalidHyperparameter {
                name: "alpha",
                value: 0.0,
                expected: "!= 0 (bitsandbytes' RMSprop does not support alpha == 0)",
            });
        }
        if !matches!(config.optim_bits, 8 | 32) {
            return Err(Error::InvalidHyperparameter {
                name: "optim_bits",
                value: f64::from(config.optim_bits),
                expected: "8 or 32",
            });
        }
        let (groups, state) = build_groups(groups, config.lr, config.weight_decay)?;
        Ok(Self {
            config,
            groups,
            state,
            quantizers: QuantizerCache::default(),
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &BnbConfig {
        &self.config
    }
}

/// Python's truthiness of `t_alpha` / `t_beta3`: a schedule runs when set and non-zero.
fn schedule_on(t: Option<i64>) -> bool {
    t.is_some_and(|t| t != 0)
}

/// The scalars of one update (`config` plus the group's lr / weight decay and AdEMAMix's
/// scheduled `alpha` / `beta3`), as bitsandbytes passes them to the kernel.
#[derive(Debug, Clone, Copy)]
struct Hyper {
    lr: f64,
    weight_decay: f64,
    beta1: f64,
    beta2: f64,
    beta3: f64,
    alpha: f64,
    eps: f64,
    step: f64,
    max_unorm: f64,
}

impl Hyper {
    fn new(c: &BnbConfig, lr: f64, weight_decay: f64, step: u64) -> Self {
        let (beta1, beta2) = c.betas;
        let (mut beta3, mut alpha) = match c.algorithm {
            BnbAlgorithm::Ademamix => (c.beta3, c.alpha),
            // Optimizer1State passes beta3 = alpha = 0; Optimizer2State AdamW has no third
            // beta and alpha 0
            _ => (0.0, 0.0),
        };
        let s = step as f64;
        if c.algorithm == BnbAlgorithm::Ademamix {
            // AdEMAMix.update_step's schedulers
            // (Python's `min(a, b)` keeps `a` unless `b < a`)
            if let Some(t) = c.t_alpha.filter(|&t| t != 0) {
                let ramp = s * alpha / t as f64;
                alpha = if alpha < ramp { alpha } else { ramp };
            }
            if let Some(t) = c.t_beta3.filter(|&t| t != 0) {
                let (ln_beta1, ln_beta3) = (beta1.ln(), beta3.ln());
                let step_scale = s / t as f64;
                let scheduled = ((ln_beta1 * ln_beta3)
                    / (((1.0 - step_scale) * ln_beta3) + (step_scale * ln_beta1)))
                    .exp();
                beta3 = if beta3 < scheduled { beta3 } else { scheduled };
            }
        }
        Self {
            lr,
            weight_decay,
            beta1,
            beta2,
            beta3,
            alpha,
            eps: c.eps,
            step: s,
            max_unorm: c.max_unorm,
        }
    }

    /// `1 - beta1 ** step` and `sqrt(1 - beta2 ** step)` (Python's float pow: libm `pow`).
    fn corrections(&self) -> (f64, f64) {
        (
            1.0 - self.beta1.powf(self.step),
            (1.0 - self.beta2.powf(self.step)).sqrt(),
        )
    }
}

/// The shape of `state1`: AdEMAMix stacks its two EMAs.
fn state1_shape(algorithm: BnbAlgorithm, shape: &[i64]) -> Vec<i64> {
    match algorithm {
        BnbAlgorithm::Ademamix => std::iter::once(2).chain(shape.iter().copied()).collect(),
        _ => shape.to_vec(),
    }
}

/// `init_state`: zeroed float32 state, or uint8 state with its maps and absmax when the
/// parameter is 8-bit.
fn init_state(c: &BnbConfig, name: &str, p: &Tensor) -> Result<ParamState> {
    let bits = if c.fp32_params.iter().any(|n| n == name) {
        32
    } else {
        c.optim_bits
    };
    let n = p.numel();
    let eight_bit = bits == 8 && n as u64 >= c.min_8bit_size;
    let device = p.device();
    let shape = p.size();
    let s1_shape = state1_shape(c.algorithm, &shape);
    let kind = if eight_bit { Kind::Uint8 } else { Kind::Float };
    let mut st = ParamState::default();
    st.tensors.insert(
        "state1".into(),
        Tensor::f_zeros(s1_shape.as_slice(), (kind, device))?,
    );
    if c.algorithm.two_state() {
        st.tensors.insert(
            "state2".into(),
            Tensor::f_zeros(shape.as_slice(), (kind, device))?,
        );
    }
    if eight_bit {
        let blocks = num_blocks(n, BLOCKSIZE) as i64;
        let absmax1: Vec<i64> = match c.algorithm {
            BnbAlgorithm::Ademamix => vec![2, blocks],
            _ => vec![blocks],
        };
        st.tensors.insert(
            "qmap1".into(),
            create_dynamic_map(true)?.f_to_device(device)?,
        );
        st.tensors.insert(
            "absmax1".into(),
            Tensor::f_zeros(absmax1.as_slice(), (Kind::Float, device))?,
        );
        if c.algorithm.two_state() {
            st.tensors.insert(
                "qmap2".into(),
                create_dynamic_map(false)?.f_to_device(device)?,
            );
            st.tensors.insert(
                "absmax2".into(),
                Tensor::f_zeros([blocks], (Kind::Float, device))?,
            );
        }
    }
    if c.max_unorm > 0.0 {
        st.tensors.insert(
            "unorm_vec".into(),
            Tensor::f_zeros([1], (Kind::Float, device))?,
        );
    }
    Ok(st)
}

/// `p.data.float()`: the parameter itself when it is float32 (the kernels then update it in
/// place), else a float32 copy to write back.
fn param_f32(p: &Tensor) -> Result<(Tensor, bool)> {
    Ok(if p.kind() == Kind::Float {
        (p.shallow_clone(), true)
    } else {
        (p.f_to_kind(Kind::Float)?, false)
    })
}

/// `p.data.copy_(p_float)` when `p_float` is a copy.
fn write_back(p: &Tensor, pf: &Tensor, aliased: bool) -> Result<()> {
    if !aliased {
        let mut p = p.shallow_clone();
        p.f_copy_(pf)?;
    }
    Ok(())
}

/// `g.float() * gnorm_scale` (a fresh float32 tensor; the scale is 1).
fn grad_f32(g: &Tensor) -> Result<Tensor> {
    Ok(g.f_to_kind(Kind::Float)?.f_mul_scalar(1.0)?)
}

/// `t.mul_(beta).add_(g, alpha=1 - beta)`.
fn ema_(t: &mut Tensor, g: &Tensor, beta: f64) -> Result<()> {
    let _ = t.f_mul_scalar_(beta)?;
    ffi::add_(t, g, 1.0 - beta)
}

/// `t.mul_(beta).addcmul_(g, g, value=1 - beta)`.
fn ema_sq_(t: &mut Tensor, g: &Tensor, beta: f64) -> Result<()> {
    let _ = t.f_mul_scalar_(beta)?;
    ffi::addcmul_(t, g, g, 1.0 - beta)
}

/// `if weight_decay > 0: p.mul_(1 - lr * weight_decay)`.
fn decay_(pf: &mut Tensor, h: &Hyper) -> Result<()> {
    if h.weight_decay > 0.0 {
        let _ = pf.f_mul_scalar_(1.0 - h.lr * h.weight_decay)?;
    }
    Ok(())
}

/// `_compute_update_norm_and_scale`: 1 unless `max_unorm > 0`; then the update's norm goes
/// into `unorm_vec` and an update longer than `max_unorm * param_norm` is scaled down to it
/// (Python floats: the op's schema turns the norms into doubles).
fn update_scale(update: &Tensor, st: &ParamState, h: &Hyper, param_norm: f64) -> Result<f64> {
    if h.max_unorm <= 0.0 {
        return Ok(1.0);
    }
    let unorm = ffi::vector_norm(update, 2.0)?.f_double_value(&[])?;
    if let Some(unorm_vec) = st.tensors.get("unorm_vec") {
        let _ = unorm_vec.shallow_clone().f_fill_(unorm)?;
    }
    let limit = h.max_unorm * param_norm;
    Ok(if unorm > limit { limit / unorm } else { 1.0 })
}

/// `_optimizer_update_32bit_cpu` (with `optimizer_update_32bit`'s `param_norm`, the norm of
/// the parameter before the step, when `max_unorm > 0`).
fn update_32bit(
    algorithm: BnbAlgorithm,
    h: &Hyper,
    p: &Tensor,
    grad: &Tensor,
    st: &ParamState,
    index: usize,
) -> Result<()> {
    let g = grad_f32(grad)?;
    let (mut pf, aliased) = param_f32(p)?;
    let param_norm = if h.max_unorm > 0.0 {
        ffi::vector_norm(&pf, 2.0)?.f_double_value(&[])?
    } else {
        0.0
    };
    let mut s1 = st.handle(index, "state1")?;
    match algorithm {
        BnbAlgorithm::AdamW => {
            let mut s2 = st.handle(index, "state2")?;
            ema_(&mut s1, &g, h.beta1)?;
            ema_sq_(&mut s2, &g, h.beta2)?;
            let (c1, c2) = h.corrections();
            let step_size = -h.lr * c2 / c1;
            decay_(&mut pf, h)?;
            let update = s1.f_div(&s2.f_sqrt()?.f_add_scalar(h.eps * c2)?)?;
            let scale = update_scale(&update, st, h, param_norm)?;
            ffi::add_(&mut pf, &update, step_size * scale)?;
        }
        BnbAlgorithm::Ademamix => {
            let mut nu = st.handle(index, "state2")?;
            let (mut m1, mut m2) = (s1.f_get(0)?, s1.f_get(1)?);
            ema_(&mut m1, &g, h.beta1)?;
            ema_(&mut m2, &g, h.beta3)?;
            ema_sq_(&mut nu, &g, h.beta2)?;
            let (c1, c2) = h.corrections();
            decay_(&mut pf, h)?;
            let mixed = m1.f_div_scalar(c1)?.f_add(&m2.f_mul_scalar(h.alpha)?)?;
            let adaptive = nu.f_sqrt()?.f_div_scalar(c2)?.f_add_scalar(h.eps)?;
            ffi::add_(&mut pf, &mixed.f_div(&adaptive)?, -h.lr)?;
        }
        BnbAlgorithm::Lion => {
            decay_(&mut pf, h)?;
            let update = ffi::add(&s1.f_mul_scalar(h.beta1)?, &g, 1.0 - h.beta1)?;
            ffi::add_(&mut pf, &update.f_sign()?, -h.lr)?;
            ema_(&mut s1, &g, h.beta2)?;
        }
        BnbAlgorithm::RmsProp => {
            let g_wd = if h.weight_decay > 0.0 {
                ffi::add(&g, &pf, h.weight_decay)?
            } else {
                g
            };
            ema_sq_(&mut s1, &g_wd, h.beta1)?;
            let update = g_wd.f_div(&s1.f_sqrt()?.f_add_scalar(h.eps)?)?;
            let scale = update_scale(&update, st, h, param_norm)?;
            ffi::add_(&mut pf, &update, -h.lr * scale)?;
        }
    }
    write_back(p, &pf, aliased)
}

/// Dequantizes `bytes` (blocks of [`BLOCKSIZE`]) into a float32 tensor of `shape` on the
/// parameter's device.
fn dequantized(code: &[f32], bytes: &[u8], absmax: &[f32], like: &Tensor) -> Result<Tensor> {
    let values = dequantize(code, bytes, absmax, BLOCKSIZE);
    Ok(Tensor::from_slice(&values)
        .f_view(like.size().as_slice())?
        .f_to_device(like.device())?)
}

/// The uint8 state `key` with its map and absmax, read on the CPU.
struct Quantized {
    bytes: Vec<u8>,
    code: Vec<f32>,
    absmax: Vec<f32>,
}

impl Quantized {
    fn read(st: &ParamState, index: usize, which: u8) -> Result<Self> {
        Ok(Self {
            bytes: u8_values(st.tensor(index, &format!("state{which}"))?)?,
            code: f32_values(st.tensor(index, &format!("qmap{which}"))?)?,
            absmax: f32_values(st.tensor(index, &format!("absmax{which}"))?)?,
        })
    }
}

/// Quantizes `values` (float32 tensors, concatenated in order) into the uint8 state
/// `state{which}` and `absmax{which}` of `st`, each tensor its own run of blocks (AdEMAMix
/// quantizes its two EMAs separately).
fn requantize(
    st: &ParamState,
    index: usize,
    which: u8,
    values: &[&Tensor],
    quantizers: &mut QuantizerCache,
) -> Result<()> {
    let code = f32_values(st.tensor(index, &format!("qmap{which}"))?)?;
    let quantizer = quantizers.get(&code)?;
    let mut bytes = Vec::new();
    let mut absmax = Vec::new();
    for v in values {
        let v = f32_values(v)?;
        let mut q = vec![0u8; v.len()];
        let mut m = vec![0f32; num_blocks(v.len(), BLOCKSIZE)];
        quantizer.quantize(&v, BLOCKSIZE, &mut q, &mut m);
        bytes.extend(q);
        absmax.extend(m);
    }
    let mut state = st.handle(index, &format!("state{which}"))?;
    let mut absmax_t = st.handle(index, &format!("absmax{which}"))?;
    state.f_copy_(
        &Tensor::from_slice(&bytes)
            .f_view(state.size().as_slice())?
            .f_to_device(state.device())?,
    )?;
    absmax_t.f_copy_(
        &Tensor::from_slice(&absmax)
            .f_view(absmax_t.size().as_slice())?
            .f_to_device(absmax_t.device())?,
    )?;
    Ok(())
}

/// `_optimizer_update_8bit_blockwise_cpu`: dequantize, update in float32, quantize back.
fn update_8bit(
    algorithm: BnbAlgorithm,
    h: &Hyper,
    p: &Tensor,
    grad: &Tensor,
    st: &ParamState,
    index: usize,
    quantizers: &mut QuantizerCache,
) -> Result<()> {
    let q1 = Quantized::read(st, index, 1)?;
    let mut grad = grad_f32(grad)?;
    let (mut pf, aliased) = param_f32(p)?;
    let state2 = if algorithm.two_state() {
        let q2 = Quantized::read(st, index, 2)?;
        Some(dequantized(&q2.code, &q2.bytes, &q2.absmax, p)?)
    } else {
        None
    };
    let second = || -> Result<Tensor> {
        state2
            .as_ref()
            .map(Tensor::shallow_clone)
            .ok_or_else(|| Error::MissingState {
                param: index,
                key: "state2".into(),
            })
    };
    match algorithm {
        BnbAlgorithm::Ademamix => {
            let n = q1.bytes.len() / 2;
            let blocks = q1.absmax.len() / 2;
            let mut m1 = dequantized(&q1.code, &q1.bytes[..n], &q1.absmax[..blocks], p)?;
            let mut m2 = dequantized(&q1.code, &q1.bytes[n..], &q1.absmax[blocks..], p)?;
            let mut nu = second()?;
            ema_(&mut m1, &grad, h.beta1)?;
            ema_(&mut m2, &grad, h.beta3)?;
            ema_sq_(&mut nu, &grad, h.beta2)?;
            let (c1, c2) = h.corrections();
            let update = m1
                .f_div_scalar(c1)?
                .f_add(&m2.f_mul_scalar(h.alpha)?)?
                .f_div(&nu.f_sqrt()?.f_div_scalar(c2)?.f_add_scalar(h.eps)?)?;
            decay_(&mut pf, h)?;
            ffi::add_(&mut pf, &update, -h.lr)?;
            write_back(p, &pf, aliased)?;
            requantize(st, index, 1, &[&m1, &m2], quantizers)?;
            requantize(st, index, 2, &[&nu], quantizers)?;
        }
        _ => {
            let mut s1 = dequantized(&q1.code, &q1.bytes, &q1.absmax, p)?;
            match algorithm {
                BnbAlgorithm::AdamW => {
                    let mut s2 = second()?;
                    ema_(&mut s1, &grad, h.beta1)?;
                    ema_sq_(&mut s2, &grad, h.beta2)?;
                    let (c1, c2) = h.corrections();
                    let mut denom = s2.f_sqrt()?.f_div_scalar(c2)?;
                    let _ = denom.f_add_scalar_(h.eps)?;
                    decay_(&mut pf, h)?;
                    ffi::addcdiv_(&mut pf, &s1, &denom, -h.lr / c1)?;
                }
                BnbAlgorithm::Lion => {
                    decay_(&mut pf, h)?;
                    let update_dir = s1
                        .f_mul_scalar(h.beta1)?
                        .f_add(&grad.f_mul_scalar(1.0 - h.beta1)?)?
                        .f_sign()?;
                    ffi::add_(&mut pf, &update_dir, -h.lr)?;
                    ema_(&mut s1, &grad, h.beta2)?;
                }
                _ => {
                    // RMSprop: weight decay added to the gradient whatever its value
                    let p_now = pf.shallow_clone();
                    ffi::add_(&mut grad, &p_now, h.weight_decay)?;
                    ema_sq_(&mut s1, &grad, h.beta1)?;
                    let mut denom = s1.f_sqrt()?;
                    let _ = denom.f_add_scalar_(h.eps)?;
                    ffi::addcdiv_(&mut pf, &grad, &denom, -h.lr)?;
                }
            }
            write_back(p, &pf, aliased)?;
            requantize(st, index, 1, &[&s1], quantizers)?;
            if let Some(s2) = &state2 {
                requantize(st, index, 2, &[s2], quantizers)?;
            }
        }
    }
    Ok(())
}

/// Checks that state `key` of parameter `index` has dtype `kind` (bitsandbytes keeps its maps
/// and absmax in float32 and loads them uncast).
fn expect_kind(index: usize, state: &ParamState, key: &str, kind: Kind) -> Result<()> {
    let found = state.tensor(index, key)?.kind();
    if found == kind {
        Ok(())
    } else {
        Err(TchError::Kind(format!(
            "state `{key}` of parameter {index} is {found:?}, expected {kind:?}"
        ))
        .into())
    }
}

impl Optimizer for BnbOptimizer {
    fn name(&self) -> &'static str {
        self.config.algorithm.name()
    }

    fn default_lr(&self) -> f64 {
        self.config.lr
    }

    fn step(&mut self) -> Result<()> {
        let config = &self.config;
        let quantizers = &mut self.quantizers;
        let states = &mut self.state;
        tch::no_grad(|| {
            let mut offset = 0;
            for group in &self.groups {
                for (j, p) in group.params.iter().enumerate() {
                    let index = offset + j;
                    let Some(grad) = grad_of(p) else { continue };
                    let st = states[index].get_or_insert_with(ParamState::default);
                    let param = ParamRef {
                        name: &group.param_names[j],
                        tensor: p,
                        index,
                    };
                    let (lr, weight_decay) = (group.lr, group.weight_decay);
                    update_param(config, lr, weight_decay, param, &grad, st, quantizers)?;
                }
                offset += group.params.len();
            }
            Ok(())
        })
    }

    fn validate_state(&self, index: usize, param: &Tensor, state: &ParamState) -> Result<()> {
        validate_bnb_state(self.config.algorithm, index, &param.size(), state)
    }

    /// bitsandbytes loads these uncast (`Optimizer8bit.non_castable_tensor_keys`), where
    /// torch casts floating state to the parameter's dtype.
    fn keeps_state_dtype(&self, key: &str) -> bool {
        is_non_castable(key)
    }

    optimizer_accessors!();
}

/// The parameter an update is for: its name (for `fp32_params`), the tensor updated in place
/// and its flat index (for errors).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ParamRef<'a> {
    pub name: &'a str,
    pub tensor: &'a Tensor,
    pub index: usize,
}

/// One parameter's step of a bitsandbytes optimizer: `init_state` when `st` has no `state1`
/// yet (entries are added, so `st` may hold others, as GaLore's projector), the step count,
/// and `update_step` with the group's `lr` / `weight_decay`: the 8-bit blockwise or the
/// 32-bit kernel, as the state's dtype says.
pub(crate) fn update_param(
    config: &BnbConfig,
    lr: f64,
    weight_decay: f64,
    param: ParamRef<'_>,
    grad: &Tensor,
    st: &mut ParamState,
    quantizers: &mut QuantizerCache,
) -> Result<()> {
    let (p, index) = (param.tensor, param.index);
    if !st.tensors.contains_key("state1") {
        st.tensors
            .extend(init_state(config, param.name, p)?.tensors);
        st.step = 0;
    }
    st.step += 1;
    let h = Hyper::new(config, lr, weight_decay, st.step);
    if st.tensor(index, "state1")?.kind() == Kind::Uint8 {
        update_8bit(config.algorithm, &h, p, grad, st, index, quantizers)
    } else {
        update_32bit(config.algorithm, &h, p, grad, st, index)
    }
}

/// bitsandbytes' `Optimizer8bit.non_castable_tensor_keys`: state entries loaded uncast.
pub(crate) fn is_non_castable(key: &str) -> bool {
    matches!(
        key,
        "qmap1"
            | "qmap2"
            | "max1"
            | "max2"
            | "new_max1"
            | "new_max2"
            | "state1"
            | "state2"
            | "gnorm_vec"
            | "absmax1"
            | "absmax2"
            | "unorm_vec"
    )
}

/// Checks the bitsandbytes state of a parameter of `shape` (for GaLore's projected parameters,
/// the low-rank shape): `state1` / `state2`, and for uint8 state the maps and absmax, their
/// shapes and dtypes; `unorm_vec` when present.
pub(crate) fn validate_bnb_state(
    algorithm: BnbAlgorithm,
    index: usize,
    shape: &[i64],
    state: &ParamState,
) -> Result<()> {
    let two_state = algorithm.two_state();
    let shape = shape.to_vec();
    if state.tensors.contains_key("unorm_vec") {
        expect_shape(index, state, "unorm_vec", &[1])?;
        expect_kind(index, state, "unorm_vec", Kind::Float)?;
    }
    expect_shape(index, state, "state1", &state1_shape(algorithm, &shape))?;
    if two_state {
        expect_shape(index, state, "state2", &shape)?;
    }
    let kind = state.tensor(index, "state1")?.kind();
    if kind == Kind::Uint8 {
        let numel: i64 = shape.iter().product();
        let blocks = num_blocks(numel.max(0) as usize, BLOCKSIZE) as i64;
        let absmax1 = match algorithm {
            BnbAlgorithm::Ademamix => vec![2, blocks],
            _ => vec![blocks],
        };
        expect_shape(index, state, "qmap1", &[256])?;
        expect_shape(index, state, "absmax1", &absmax1)?;
        let mut float32 = vec!["qmap1", "absmax1"];
        if two_state {
            expect_shape(index, state, "qmap2", &[256])?;
            expect_shape(index, state, "absmax2", &[blocks])?;
            expect_kind(index, state, "state2", Kind::Uint8)?;
            float32.extend(["qmap2", "absmax2"]);
        }
        for key in float32 {
            expect_kind(index, state, key, Kind::Float)?;
        }
    } else {
        // bitsandbytes keeps float32 or uint8 state
        expect_kind(index, state, "state1", Kind::Float)?;
        if two_state {
            expect_kind(index, state, "state2", Kind::Float)?;
        }
    }
    Ok(())
}

/// The `optim` names upstream's Trainer builds with bitsandbytes (`_BITSANDBYTES_OPTIMIZERS`).
pub(crate) const BITSANDBYTES_OPTIMIZERS: [&str; 15] = [
    "adamw_bnb_8bit",
    "adamw_8bit",
    "paged_adamw_32bit",
    "paged_adamw_8bit",
    "ademamix",
    "ademamix_8bit",
    "paged_ademamix_32bit",
    "paged_ademamix_8bit",
    "lion_32bit",
    "lion_8bit",
    "paged_lion_32bit",
    "paged_lion_8bit",
    "rmsprop_bnb",
    "rmsprop_bnb_8bit",
    "rmsprop_bnb_32bit",
];

/// Python's `int(str)` (decimal, optional sign, underscores between digits).
fn int_arg(args: &BTreeMap<String, String>, key: &str) -> Result<Option<i64>> {
    args.get(key)
        .map(|v| {
            let cleaned: String = v.trim().chars().filter(|&c| c != '_').collect();
            cleaned
                .parse::<i64>()
                .map_err(|_| Error::InvalidOptimArgValue {
                    key: key.into(),
                    value: v.clone(),
                    expected: "an integer",
                })
        })
        .transpose()
}

/// Upstream `_get_bitsandbytes_optimizer`: the class from the name (`adam` → AdamW, `lion`,
/// `rmsprop`, `ademamix`), `optim_bits` 8 when the name says `8bit` (else 32), `is_paged`
/// when it says `paged` (not for RMSprop), `lr = learning_rate`, and
/// - AdamW: `betas = (adam_beta1, adam_beta2)`, `eps = adam_epsilon`;
/// - Lion: `betas = (adam_beta1, adam_beta2)`;
/// - AdEMAMix: `beta1` / `beta2` / `beta3` / `alpha` / `eps` / `t_alpha` / `t_beta3` from
///   `optim_args` (defaults the Adam betas, 0.9999, 5.0, `adam_epsilon`, no schedules);
/// - RMSprop: `optim_args` as keyword arguments, *as strings*: bitsandbytes fails on any
///   of them (a `TypeError` comparing a float with a string, `centered` set: not
///   supported) except `optim_bits` (replaced by the name's) and an empty `centered`, so
///   the others are refused here.
///
/// Weight decay comes from the groups. Under 8-bit state the Trainer registers every
/// `nn.Embedding` weight for 32-bit state: `args.embedding_weights`.
pub(crate) fn trainer_config(
    name: &str,
    args: &OptimizerArgs,
    optim_args: &BTreeMap<String, String>,
) -> Result<BnbConfig> {
    let optim_bits = if name.contains("8bit") { 8 } else { 32 };
    let is_paged = name.contains("paged");
    let betas = (args.adam_beta1, args.adam_beta2);
    let mut c = if name.contains("adam") {
        BnbConfig {
            betas,
            eps: args.adam_epsilon,
            ..BnbConfig::adamw()
        }
    } else if name.contains("lion") {
        BnbConfig {
            betas,
            ..BnbConfig::lion()
        }
    } else if name.contains("rmsprop") {
        for (key, value) in optim_args {
            let harmless = key == "optim_bits" || (key == "centered" && value.is_empty());
            if !harmless {
                return Err(Error::InvalidOptimizerSetup {
                    name: name.into(),
                    detail: format!(
                        "optim_args `{key}={value}`: upstream passes optim_args to \
                         bitsandbytes' RMSprop as strings, which it rejects (a TypeError, or \
                         'Centered RMSprop is not supported!'); leave optim_args unset"
                    ),
                });
            }
        }
        BnbConfig::rmsprop()
    } else if name.contains("ademamix") {
        BnbConfig {
            betas: (
                float_arg(optim_args, "beta1")?.unwrap_or(args.adam_beta1),
                float_arg(optim_args, "beta2")?.unwrap_or(args.adam_beta2),
            ),
            beta3: float_arg(optim_args, "beta3")?.unwrap_or(0.9999),
            alpha: float_arg(optim_args, "alpha")?.unwrap_or(5.0),
            eps: float_arg(optim_args, "eps")?.unwrap_or(args.adam_epsilon),
            t_alpha: int_arg(optim_args, "t_alpha")?,
            t_beta3: int_arg(optim_args, "t_beta3")?,
            ..BnbConfig::ademamix()
        }
    } else {
        return Err(Error::InvalidOptimizerSetup {
            name: name.into(),
            detail: "not a bitsandbytes optimizer name".into(),
        });
    };
    c.lr = args.learning_rate;
    c.optim_bits = optim_bits;
    if c.algorithm != BnbAlgorithm::RmsProp {
        c.is_paged = is_paged;
    }
    if optim_bits == 8 {
        c.fp32_params.clone_from(&args.embedding_weights);
    }
    Ok(c)
}

//! torchao's low-bit AdamW (`torchao.optim.AdamW8bit` / `AdamW4bit`, torchao 0.18): the
//! Trainer's `adamw_torch_8bit` and `adamw_torch_4bit`.
//!
//! Each state tensor of a parameter with at least 4096 elements, a multiple of `block_size`,
//! is kept quantized (Dettmers et al. 2022 for 8 bits, Li et al. 2023 for 4 bits): the flat
//! tensor is cut into blocks of `block_size`, each block is scaled by its largest magnitude
//! (`scale`, fp32, at least 1e-12) and every scaled value is stored as the index (`codes`,
//! uint8) of the nearest entry of a fixed map (`qmap`):
//!
//! - 8 bits: bitsandbytes' dynamic tree map without its zero padding (`create_dynamic_map`),
//!   signed for `exp_avg`, unsigned for `exp_avg_sq`; one code per byte, `codes` has the
//!   parameter's shape;
//! - 4 bits: the dynamic map with 3 exponent bits (signed, `exp_avg`) and the linear map
//!   `linspace(0, 1, 17)[1:]` without zero (unsigned, `exp_avg_sq`); two codes per byte
//!   (even element in the high nibble), `codes` is flat.
//!
//! Smaller parameters keep plain state tensors of the parameter's dtype. A step computes in
//! fp32: `p -= lr * wd * p`, `m = m + (g - m) * (1 - beta1)`, `v = v + (g² - v) * (1 - beta2)`
//! (from the dequantized states, which are then re-quantized), `p -= lr * (m / bc1) /
//! (sqrt(v) / sqrt(bc2) + eps)` with the fp32 `m` and `v` of this step, the bias corrections
//! `1 - beta^step` in fp32.
//!
//! torchao runs that step through `torch.compile`; on a CPU, inductor emits one C++ kernel
//! built with `-ffp-contract=off`, so every multiply and add rounds on its own (eager torch's
//! `lerp` fuses them), and its square root is the correctly rounded one (eager torch's fp32
//! `sqrt` on CPU is not, on some 0.6% of inputs). The ops below follow the compiled kernel one
//! rounding at a time: same parameters, codes and scales bit for bit (see the tests).
//!
//! State entries: `exp_avg`, `exp_avg_sq` (and `max_exp_avg_sq` with `amsgrad`), each either a
//! plain tensor or the pair `KEY.codes` (uint8) / `KEY.scale` (fp32) — torchao's
//! `OptimState8bit` / `OptimState4bit` taken apart.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::optimizer::{
    build_groups, check_non_negative, check_unit, expect_shape, grad_of, optimizer_accessors,
};
use crate::{Error, GroupSpec, Optimizer, ParamGroup, ParamState, Result};

/// torchao (like bitsandbytes) quantizes only tensors of at least this many elements.
pub const LOW_BIT_MIN_SIZE: i64 = 4096;

/// The state keys of [`LowBitAdamW`], signed first.
const MOMENTS: [(&str, bool); 3] = [
    ("exp_avg", true),
    ("exp_avg_sq", false),
    ("max_exp_avg_sq", false),
];

/// How many bits per value [`LowBitAdamW`] stores its quantized states in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StateBits {
    /// `torchao.optim.AdamW8bit` (`adamw_torch_8bit`).
    #[serde(rename = "8")]
    Eight = 0,
    /// `torchao.optim.AdamW4bit` (`adamw_torch_4bit`).
    #[serde(rename = "4")]
    Four = 1,
}

/// Hyper-parameters of [`LowBitAdamW`] (torchao's `AdamW8bit` / `AdamW4bit` arguments).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LowBitAdamWConfig {
    /// 8-bit or 4-bit states (default 8).
    pub bits: StateBits,
    /// Learning rate (default 1e-3).
    pub lr: f64,
    /// `(beta1, beta2)` (default (0.9, 0.999)).
    pub betas: (f64, f64),
    /// Term added to the denominator (default 1e-8).
    pub eps: f64,
    /// Decoupled weight decay (default 1e-2); param groups usually override it.
    pub weight_decay: f64,
    /// AMSGrad variant (default false). torchao 0.18 runs it only on plain states (its
    /// quantized states lack `maximum`), so [`LowBitAdamW::new`] refuses it when a parameter
    /// would get quantized state.
    pub amsgrad: bool,
    /// Elements per quantization block (torchao's defaults: 256 for 8 bits, 128 for 4 bits;
    /// the Trainer passes 256 to both).
    pub block_size: usize,
    /// Round bf16 parameters stochastically after the fp32 update (default false; no effect
    /// on other dtypes).
    pub bf16_stochastic_round: bool,
}

impl Default for LowBitAdamWConfig {
    fn default() -> Self {
        Self::adamw8bit()
    }
}

impl LowBitAdamWConfig {
    /// `torchao.optim.AdamW8bit()`'s defaults.
    pub fn adamw8bit() -> Self {
        Self {
            bits: StateBits::Eight,
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 1e-2,
            amsgrad: false,
            block_size: 256,
            bf16_stochastic_round: false,
        }
    }

    /// `torchao.optim.AdamW4bit()`'s defaults (block size 128).
    pub fn adamw4bit() -> Self {
        Self {
            bits: StateBits::Four,
            block_size: 128,
            ..Self::adamw8bit()
        }
    }

    fn validate(&self) -> Result<()> {
        check_non_negative("lr", self.lr)?;
        check_non_negative("eps", self.eps)?;
        check_unit("betas[0]", self.betas.0)?;
        check_unit("betas[1]", self.betas.1)?;
        check_non_negative("weight_decay", self.weight_decay)?;
        let even = self.bits == StateBits::Eight || self.block_size.is_multiple_of(2);
        if self.block_size == 0 || !even || i64::try_from(self.block_size).is_err() {
            return Err(Error::InvalidHyperparameter {
                name: "block_size",
                value: self.block_size as f64,
                expected: "a positive integer, even for 4-bit states",
            });
        }
        Ok(())
    }

    fn block(&self) -> i64 {
        // Checked by `validate`; a value set through `set_hyperparameters` is not, so it
        // saturates rather than wraps.
        i64::try_from(self.block_size).unwrap_or(i64::MAX)
    }

    /// torchao's `_new_buffer` rule: quantize tensors of at least 4096 elements that split
    /// into whole blocks.
    fn quantizes(&self, numel: i64) -> bool {
        numel >= LOW_BIT_MIN_SIZE && numel.checked_rem(self.block()) == Some(0)
    }
}

/// A quantization map (`qmap`) as torchao builds it, on CPU.
fn qmap(bits: StateBits, signed: bool) -> Result<Tensor> {
    let values = match (bits, signed) {
        (StateBits::Eight, _) => dynamic_map(signed, 7, 8)?,
        (StateBits::Four, true) => dynamic_map(true, 3, 4)?,
        (StateBits::Four, false) => {
            let all = Tensor::f_linspace(0.0, 1.0, 17, (Kind::Float, Device::Cpu))?;
            return Ok(all.f_slice(0, 1, 17, 1)?);
        }
    };
    Ok(Tensor::from_slice(&values))
}

/// torchao's `create_dynamic_map` (bitsandbytes' dynamic tree map, zero padding removed):
/// float32 `linspace` midpoints scaled by powers of ten, as the Python computes them.
fn dynamic_map(signed: bool, max_exponent_bits: i32, total_bits: i32) -> Result<Vec<f32>> {
    let non_sign_bits = total_bits - 1;
    let mut data: Vec<f32> = Vec::new();
    let mut push = |fraction_items: i64, exponent: i32| -> Result<()> {
        let boundaries = Tensor::f_linspace(0.1, 1.0, fraction_items, (Kind::Float, Device::Cpu))?;
        let n = fraction_items;
        let lower = boundaries.f_slice(0, 0, n - 1, 1)?;
        let upper = boundaries.f_slice(0, 1, n, 1)?;
        let means = lower.f_add(&upper)?.f_div_scalar(2.0)?;
        // Python's `10 ** k`: an int for k >= 0, a float otherwise.
        let power = 10f64.powi(exponent);
        data.extend(Vec::<f32>::try_from(&means.f_mul_scalar(power)?)?);
        if signed {
            data.extend(Vec::<f32>::try_from(&means.f_mul_scalar(-power)?)?);
        }
        Ok(())
    };
    let mut last = 0;
    for i in 0..max_exponent_bits {
        let shift = i + non_sign_bits - max_exponent_bits + if signed { 0 } else { 1 };
        push((1i64 << shift) + 1, -(max_exponent_bits - 1) + i)?;
        last = i;
    }
    let additional_items = (1i64 << (non_sign_bits - max_exponent_bits)) - 1;
    if additional_items > 0 {
        push(additional_items + 1, -(max_exponent_bits - 1) + last)?;
    }
    data.push(0.0);
    data.push(1.0);
    data.sort_by(f32::total_cmp);
    Ok(data)
}

/// torchao's `quantize_8bit_with_qmap` / `quantize_4bit_with_qmap`: the branchless binary
/// search for the last map entry `<= x`, then rounding up when `x` is at least halfway to
/// the next entry.
fn quantize_with_qmap(x: &Tensor, qmap: &Tensor) -> Result<Tensor> {
    let n = qmap.size()[0];
    let entry = |i: i64| -> Result<Tensor> { Ok(qmap.f_get(i)?) };
    let zero = Tensor::f_zeros([], (Kind::Int64, x.device()))?;
    let mut step = n / 2;
    let mut codes = Tensor::f_full([], step, (Kind::Int64, x.device()))?
        .f_where_self(&x.f_ge_tensor(&entry(step)?)?, &zero)?;
    step /= 2;
    while step >= 1 {
        let probe = qmap.f_take(&codes.f_add_scalar(step)?)?;
        let jump = Tensor::f_full([], step, (Kind::Int64, x.device()))?;
        codes = codes.f_add(&jump.f_where_self(&x.f_ge_tensor(&probe)?, &zero)?)?;
        step /= 2;
    }
    let codes_up = codes.f_add_scalar(1)?.f_clamp_max(n - 1)?;
    let val_down = qmap.f_take(&codes)?;
    let val_up = qmap.f_take(&codes_up)?;
    let residual = x.f_sub(&val_down)?;
    let half = val_up.f_sub(&val_down)?.f_mul_scalar(0.5)?;
    let codes = codes_up.f_where_self(&residual.f_ge_tensor(&half)?, &codes)?;
    Ok(codes.f_to_kind(Kind::Uint8)?)
}

/// One quantized state tensor: torchao's `OptimState8bit` / `OptimState4bit`.
struct Quantized {
    codes: Tensor,
    scale: Tensor,
    qmap: Tensor,
    bits: StateBits,
    block: i64,
}

impl Quantized {
    /// The fp32 values (`dequantize()`), flat.
    fn dequantize(&self) -> Result<Tensor> {
        let codes = match self.bits {
            StateBits::Eight => self.codes.f_reshape([-1])?,
            StateBits::Four => {
                let high = self.codes.f_bitwise_right_shift_tensor_scalar(4)?;
                let low = self.codes.f_bitwise_and(0b1111)?;
                Tensor::f_stack(&[high, low], -1)?.f_reshape([-1])?
            }
        };
        let values = self.qmap.f_take(&codes.f_to_kind(Kind::Int64)?)?;
        Ok(values
            .f_view([-1, self.block])?
            .f_mul(&self.scale.f_view([-1, 1])?)?
            .f_reshape([-1])?)
    }

    /// `copy_(src)`: block scales (`scale_tensor`), codes, packing.
    fn store(&mut self, src: &Tensor) -> Result<()> {
        let blocks = src.f_reshape([-1, self.block])?;
        let scale = blocks.f_abs()?.f_amax([-1], false)?.f_clamp_min(1e-12)?;
        let scaled = blocks.f_div(&scale.f_view([-1, 1])?)?.f_reshape([-1])?;
        let codes = quantize_with_qmap(&scaled, &self.qmap)?;
        let codes = match self.bits {
            StateBits::Eight => codes.f_view_as(&self.codes)?,
            StateBits::Four => {
                let pairs = codes.f_view([-1, 2])?.f_to_kind(Kind::Int64)?;
                let high = pairs.f_select(1, 0)?.f_mul_scalar(16)?;
                high.f_add(&pairs.f_select(1, 1)?)?.f_to_kind(Kind::Uint8)?
            }
        };
        self.codes.f_copy_(&codes)?;
        self.scale.f_copy_(&scale)?;
        Ok(())
    }
}

/// A state tensor of one parameter: plain or quantized.
enum Moment {
    Plain(Tensor),
    Quantized(Quantized),
}

impl Moment {
    /// The fp32 values, with the parameter's shape.
    fn read(&self, shape: &[i64]) -> Result<Tensor> {
        match self {
            Moment::Plain(t) => Ok(t.f_to_kind(Kind::Float)?),
            Moment::Quantized(q) => Ok(q.dequantize()?.f_view(shape)?),
        }
    }

    fn write(&mut self, value: &Tensor) -> Result<()> {
        match self {
            Moment::Plain(t) => {
                t.f_copy_(value)?;
                Ok(())
            }
            Moment::Quantized(q) => q.store(value),
        }
    }
}

/// torchao's `AdamW8bit` / `AdamW4bit`: AdamW with block-wise quantized states.
///
/// ```
/// use tch::{nn, Device, Kind, Tensor};
/// use tchtrain_optim::{GroupSpec, LowBitAdamW, LowBitAdamWConfig, Optimizer};
///
/// let vs = nn::VarStore::new(Device::Cpu);
/// let w = vs.root().zeros("w", &[64, 64]);
/// let mut opt = LowBitAdamW::new(
///     vec![GroupSpec::new(vec![("w".into(), w.shallow_clone())])],
///     LowBitAdamWConfig { lr: 0.1, ..LowBitAdamWConfig::adamw4bit() },
/// )?;
/// (&w - 1.0).square().sum(Kind::Float).backward();
/// opt.step()?;
/// assert!(w.double_value(&[0, 0]) > 0.0);
/// // 4096 elements: 4-bit codes, two per byte.
/// assert_eq!(opt.state()[0].as_ref().unwrap().tensors["exp_avg.codes"].size(), [2048]);
/// # Ok::<(), tchtrain_optim::Error>(())
/// ```
#[derive(Debug)]
pub struct LowBitAdamW {
    config: LowBitAdamWConfig,
    groups: Vec<ParamGroup>,
    state: Vec<Option<ParamState>>,
    /// The maps on CPU, `[8-bit, 4-bit][signed, unsigned]` (`config.bits` may be changed by
    /// `set_hyperparameters`).
    qmaps: [[Tensor; 2]; 2],
}

impl LowBitAdamW {
    /// Creates the optimizer over `groups` (each may override `lr` / `weight_decay`).
    ///
    /// Refuses `amsgrad` when a parameter would get quantized state (torchao fails there at
    /// its first step).
    pub fn new(groups: Vec<GroupSpec>, config: LowBitAdamWConfig) -> Result<Self> {
        config.validate()?;
        let (groups, state) = build_groups(groups, config.lr, config.weight_decay)?;
        if config.amsgrad {
            let quantized = groups
                .iter()
                .flat_map(|g| g.param_names.iter().zip(&g.params))
                .find(|(_, p)| config.quantizes(p.numel() as i64));
            if let Some((name, _)) = quantized {
                let optim = match config.bits {
                    StateBits::Eight => "adamw_torch_8bit",
                    StateBits::Four => "adamw_torch_4bit",
                };
                return Err(Error::InvalidOptimizerSetup {
                    name: optim.into(),
                    detail: format!(
                        "amsgrad needs the maximum of a quantized state, which torchao 0.18 \
                         does not implement (`{name}` gets quantized state): turn amsgrad off"
                    ),
                });
            }
        }
        let qmaps = [
            [
                qmap(StateBits::Eight, true)?,
                qmap(StateBits::Eight, false)?,
            ],
            [qmap(StateBits::Four, true)?, qmap(StateBits::Four, false)?],
        ];
        Ok(Self {
            config,
            groups,
            state,
            qmaps,
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &LowBitAdamWConfig {
        &self.config
    }

    /// The fp32 value of state `key` (`exp_avg`, `exp_avg_sq`, `max_exp_avg_sq`) of parameter
    /// `index`, dequantized where it is stored quantized (torchao's `dequantize()`).
    pub fn state_value(&self, index: usize, key: &str) -> Result<Tensor> {
        let missing = || Error::MissingState {
            param: index,
            key: key.to_string(),
        };
        let st = self
            .state
            .get(index)
            .and_then(Option::as_ref)
            .ok_or_else(missing)?;
        let param = self
            .groups
            .iter()
            .flat_map(|g| &g.params)
            .nth(index)
            .ok_or_else(missing)?;
        let signed = MOMENTS
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, s)| *s)
            .ok_or_else(missing)?;
        self.moment(index, st, key, signed, param.device())?
            .read(&param.size())
    }

    fn moment(
        &self,
        index: usize,
        st: &ParamState,
        key: &str,
        signed: bool,
        device: Device,
    ) -> Result<Moment> {
        if let Some(t) = st.tensors.get(key) {
            return Ok(Moment::Plain(t.shallow_clone()));
        }
        let codes = st.handle(index, &format!("{key}.codes"))?;
        let scale = st.handle(index, &format!("{key}.scale"))?;
        Ok(Moment::Quantized(Quantized {
            codes,
            scale,
            qmap: self.qmaps[self.config.bits as usize][usize::from(!signed)]
                .f_to_device(device)?,
            bits: self.config.bits,
            block: self.config.block(),
        }))
    }

    /// Zero state for `p`: torchao's `_new_buffer`.
    fn new_state(&self, p: &Tensor) -> Result<ParamState> {
        let mut st = ParamState::default();
        let numel = p.numel() as i64;
        let keys = if self.config.amsgrad { 3 } else { 2 };
        for (key, _) in &MOMENTS[..keys] {
            if self.config.quantizes(numel) {
                let codes_len = match self.config.bits {
                    StateBits::Eight => p.size(),
                    StateBits::Four => vec![numel / 2],
                };
                let codes = Tensor::f_zeros(&codes_len, (Kind::Uint8, p.device()))?;
                let scale =
                    Tensor::f_zeros([numel / self.config.block()], (Kind::Float, p.device()))?;
                st.tensors.insert(format!("{key}.codes"), codes);
                st.tensors.insert(format!("{key}.scale"), scale);
            } else {
                st.tensors.insert(key.to_string(), p.f_zeros_like()?);
            }
        }
        Ok(st)
    }

    /// `single_param_adam` as inductor compiles it (see the module docs).
    fn update(&self, index: usize, p: &Tensor, grad: &Tensor, lr: f64, wd: f64) -> Result<()> {
        let st = self.state[index]
            .as_ref()
            .ok_or_else(|| Error::MissingState {
                param: index,
                key: "exp_avg".into(),
            })?;
        let (beta1, beta2) = self.config.betas;
        let shape = p.size();
        let device = p.device();
        let p32 = p.f_to_kind(Kind::Float)?;
        let g32 = grad.f_to_kind(Kind::Float)?;
        // `lr` is a float32 tensor in torchao's groups, `weight_decay` a float32 constant of
        // the compiled kernel: their product rounds to fp32 before it scales `p`.
        let lr32 = lr as f32;
        let decay = lr32 * wd as f32;
        let p32 = p32.f_sub(&p32.f_mul_scalar(f64::from(decay))?)?;
        // `1 - beta ** step` with a float32 step tensor: `powf` in fp32.
        let step = st.step as f32;
        let bc1 = 1.0f32 - (beta1 as f32).powf(step);
        let bc2_sqrt = (1.0f32 - (beta2 as f32).powf(step)).sqrt();

        let mut m = self.moment(index, st, "exp_avg", true, device)?;
        let mut v = self.moment(index, st, "exp_avg_sq", false, device)?;
        // `lerp(end, w)` with w < 0.5 as inductor decomposes it: start + (end - start) * w.
        let m_old = m.read(&shape)?;
        let m32 = m_old.f_add(&g32.f_sub(&m_old)?.f_mul_scalar(1.0 - beta1)?)?;
        let v_old = v.read(&shape)?;
        let v32 = v_old.f_add(&g32.f_mul(&g32)?.f_sub(&v_old)?.f_mul_scalar(1.0 - beta2)?)?;
        m.write(&m32)?;
        v.write(&v32)?;
        let second = if self.config.amsgrad {
            let mut max = self.moment(index, st, "max_exp_avg_sq", false, device)?;
            let max32 = max.read(&shape)?.f_maximum(&v32)?;
            max.write(&max32)?;
            max32
        } else {
            v32
        };
        // The compiled kernel's square root is correctly rounded (`_mm512_sqrt_ps`); ATen's
        // fp32 `sqrt` on CPU (MKL's VML) misses by one ulp on some 0.6% of inputs. The fp64 root
        // rounded to fp32 is the correctly rounded fp32 root (53 >= 2 * 24 + 2 bits).
        let denom = second
            .f_to_kind(Kind::Double)?
            .f_sqrt()?
            .f_to_kind(Kind::Float)?
            .f_div_scalar(f64::from(bc2_sqrt))?
            .f_add_scalar(self.config.eps)?;
        let update = m32
            .f_div_scalar(f64::from(bc1))?
            .f_mul_scalar(f64::from(lr32))?
            .f_div(&denom)?;
        let p32 = p32.f_sub(&update)?;
        let mut p = p.shallow_clone();
        if self.config.bf16_stochastic_round && p.kind() == Kind::BFloat16 {
            p.f_copy_(&fp32_to_bf16_sr(&p32)?)?;
        } else {
            p.f_copy_(&p32)?;
        }
        Ok(())
    }
}

/// Upstream's `_get_torchao_optimizer`: `AdamW8bit` or `AdamW4bit` with `lr`, the Adam betas /
/// eps, and from `optim_args` `block_size` (default 256 for both) and
/// `bf16_stochastic_round` (transformers' `strtobool`, default false).
///
/// Upstream passes `block_size` on as the string it parsed, and torchao's `numel % block_size`
/// then raises a `TypeError` at the first step on any parameter of 4096 elements or more;
/// here it is read as the integer it names.
pub(crate) fn from_trainer(
    optim: &str,
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    optim_args: &BTreeMap<String, String>,
    groups: Vec<GroupSpec>,
) -> Result<LowBitAdamW> {
    let mut config = if optim == "adamw_torch_4bit" {
        LowBitAdamWConfig::adamw4bit()
    } else {
        LowBitAdamWConfig::adamw8bit()
    };
    config.lr = lr;
    config.betas = betas;
    config.eps = eps;
    config.block_size = match optim_args.get("block_size") {
        None => 256,
        Some(v) => {
            v.replace('_', "")
                .parse::<usize>()
                .map_err(|_| Error::InvalidOptimArgValue {
                    key: "block_size".into(),
                    value: v.clone(),
                    expected: "a positive integer",
                })?
        }
    };
    config.bf16_stochastic_round = match optim_args.get("bf16_stochastic_round") {
        None => false,
        Some(v) => strtobool(v).ok_or_else(|| Error::InvalidOptimArgValue {
            key: "bf16_stochastic_round".into(),
            value: v.clone(),
            expected: "a truth value (y, yes, t, true, on, 1, n, no, f, false, off, 0)",
        })?,
    };
    LowBitAdamW::new(groups, config)
}

/// transformers' `strtobool` (`None` where it raises `ValueError`).
fn strtobool(value: &str) -> Option<bool> {
    match value.to_lowercase().as_str() {
        "y" | "yes" | "t" | "true" | "on" | "1" => Some(true),
        "n" | "no" | "f" | "false" | "off" | "0" => Some(false),
        _ => None,
    }
}

/// torchao's `_fp32_to_bf16_sr`: rounds away from zero with probability (low 16 bits) / 2^16.
fn fp32_to_bf16_sr(x: &Tensor) -> Result<Tensor> {
    let rand = Tensor::f_randint_low(0, 1 << 16, x.size(), (Kind::Int, x.device()))?;
    let bits = x.f_contiguous()?.f_view_dtype(Kind::Int)?;
    let fraction = bits.f_bitwise_and(0xFFFF)?;
    let truncated = bits.f_bitwise_and(0xFFFF_0000u32 as i32 as i64)?;
    let away = truncated.f_add_scalar(0x10000)?;
    let rounded = away.f_where_self(&rand.f_lt_tensor(&fraction)?, &truncated)?;
    Ok(rounded
        .f_view_dtype(Kind::Float)?
        .f_to_kind(Kind::BFloat16)?)
}

impl Optimizer for LowBitAdamW {
    fn name(&self) -> &'static str {
        match self.config.bits {
            StateBits::Eight => "torchao_adamw_8bit",
            StateBits::Four => "torchao_adamw_4bit",
        }
    }

    fn default_lr(&self) -> f64 {
        self.config.lr
    }

    fn step(&mut self) -> Result<()> {
        tch::no_grad(|| {
            let mut offset = 0;
            for gi in 0..self.groups.len() {
                let (lr, wd) = (self.groups[gi].lr, self.groups[gi].weight_decay);
                for j in 0..self.groups[gi].params.len() {
                    let index = offset + j;
                    let p = self.groups[gi].params[j].shallow_clone();
                    let Some(grad) = grad_of(&p) else { continue };
                    if self.state[index].is_none() {
                        self.state[index] = Some(self.new_state(&p)?);
                    }
                    if let Some(st) = self.state[index].as_mut() {
                        st.step += 1;
                    }
                    self.update(index, &p, &grad, lr, wd)?;
                }
                offset += self.groups[gi].params.len();
            }
            Ok(())
        })
    }

    fn validate_state(&self, index: usize, param: &Tensor, state: &ParamState) -> Result<()> {
        let numel = param.numel() as i64;
        let keys = if self.config.amsgrad { 3 } else { 2 };
        for (key, _) in &MOMENTS[..keys] {
            if self.config.quantizes(numel) {
                let codes = match self.config.bits {
                    StateBits::Eight => param.size(),
                    StateBits::Four => vec![numel / 2],
                };
                expect_shape(index, state, &format!("{key}.codes"), &codes)?;
                let scale = [numel / self.config.block()];
                expect_shape(index, state, &format!("{key}.scale"), &scale)?;
            } else {
                expect_shape(index, state, key, &param.size())?;
            }
        }
        Ok(())
    }

    /// torchao keeps its scales float32 whatever the parameter's dtype.
    fn keeps_state_dtype(&self, key: &str) -> bool {
        key.ends_with(".scale")
    }

    optimizer_accessors!();
}

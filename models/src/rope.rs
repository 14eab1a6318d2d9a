//! Rotary position embeddings (upstream `modeling_rope_utils.py` and the models'
//! `XRotaryEmbedding`): the RoPE parameters of a config (`rope_parameters`, or v4's
//! `rope_theta` / `rope_scaling`) and the `cos` / `sin` of each forward, for every
//! `rope_type` upstream's `ROPE_INIT_FUNCTIONS` has for these models: `default`, `linear`,
//! `dynamic` (NTK, recomputed when a sequence outgrows the cache and reset when it fits
//! again, as `dynamic_rope_update`), `yarn` (with its attention scaling of cos / sin),
//! `longrope` (short factors, or long ones past `original_max_position_embeddings`) and
//! `llama3`; and `partial_rotary_factor` (the rotary part of each head).
//!
//! The arithmetic is upstream's, op for op (float32 tensors where upstream has them, Python
//! floats as f64), so the frequencies are bit-identical.

use std::sync::Mutex;

use serde_json::{Map, Value};
use tch::{Device, Kind, Tensor};

use crate::{Error, Result};

/// A `rope_type` and its parameters.
#[derive(Debug, Clone, PartialEq)]
enum RopeType {
    Default,
    Linear {
        factor: f64,
    },
    Dynamic {
        factor: f64,
    },
    Yarn {
        factor: f64,
        attention_factor: Option<f64>,
        beta_fast: f64,
        beta_slow: f64,
        mscale: Option<f64>,
        mscale_all_dim: Option<f64>,
        original_max_position_embeddings: f64,
        truncate: bool,
    },
    LongRope {
        short_factor: Vec<f64>,
        long_factor: Vec<f64>,
        factor: Option<f64>,
        attention_factor: Option<f64>,
        original_max_position_embeddings: i64,
    },
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
    /// Gemma 4's: the first `rope_angles` frequencies of the whole head's, the rest zero
    /// (those pairs pass unrotated), divided by `factor`.
    Proportional {
        factor: f64,
        rope_angles: i64,
    },
}

/// The RoPE of one config (or one layer type of it): its type, base and rotary dimension.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RopeParameters {
    rope_type: RopeType,
    theta: f64,
    /// `int(head_dim * partial_rotary_factor)`.
    dim: i64,
    max_position_embeddings: i64,
}

/// Upstream's `convert_rope_params_to_dict` and `standardize_rope_params` for one (flat)
/// dict: the v4 `rope_scaling` when given (it wins, as `rope_scaling or rope_parameters`),
/// else the v5 `rope_parameters`, with `type` read as `rope_type` and `rope_theta` defaulting
/// to the v4 key or `default_theta`.
pub(crate) fn standardize(
    rope_parameters: Option<&Map<String, Value>>,
    rope_scaling: Option<&Map<String, Value>>,
    rope_theta: Option<f64>,
    default_theta: f64,
) -> Map<String, Value> {
    let mut p = rope_scaling
        .or(rope_parameters)
        .cloned()
        .unwrap_or_default();
    if let Some(t) = p.remove("type") {
        p.entry("rope_type").or_insert(t);
    }
    p.entry("rope_type").or_insert("default".into());
    p.entry("rope_theta")
        .or_insert(rope_theta.unwrap_or(default_theta).into());
    p
}

fn invalid(value: String, fix: &'static str) -> Error {
    Error::InvalidConfig {
        field: "rope_parameters",
        value,
        fix,
    }
}

impl RopeParameters {
    /// Reads a standardised dict (see [`standardize`]) for heads of `head_dim`.
    /// `original_max_position_embeddings` is Phi-3's top-level key, which upstream prefers
    /// to the dict's for `llama3` / `yarn` / `longrope`; otherwise the dict's, defaulting to
    /// `max_position_embeddings`.
    pub(crate) fn from_dict(
        p: &Map<String, Value>,
        head_dim: i64,
        max_position_embeddings: i64,
        original_max_position_embeddings: Option<i64>,
    ) -> Result<Self> {
        let num = |key: &str| p.get(key).and_then(Value::as_f64);
        let need = |key: &'static str| {
            num(key).ok_or_else(|| {
                invalid(
                    format!("missing number `{key}`"),
                    "add the key upstream requires for this rope_type",
                )
            })
        };
        let factors = |key: &'static str| -> Result<Vec<f64>> {
            p.get(key)
                .and_then(Value::as_array)
                .and_then(|a| a.iter().map(Value::as_f64).collect::<Option<Vec<_>>>())
                .ok_or_else(|| {
                    invalid(
                        format!("`{key}` is not a list of numbers"),
                        "give longrope's short_factor and long_factor as lists of numbers",
                    )
                })
        };
        let theta = need("rope_theta")?;
        let partial = num("partial_rotary_factor").unwrap_or(1.0);
        let proportional = p.get("rope_type").and_then(Value::as_str) == Some("proportional");
        // Proportional RoPE always covers the whole head (its other angles are zero).
        let dim = if proportional {
            head_dim
        } else {
            (head_dim as f64 * partial) as i64
        };
        if dim <= 0 || dim > head_dim || dim % 2 != 0 {
            return Err(Error::InvalidConfig {
                field: "rope_parameters.partial_rotary_factor",
                value: format!("{partial} (rotary dimension {dim} of head_dim {head_dim})"),
                fix: "the rotary dimension int(head_dim * partial_rotary_factor) must be even and within the head",
            });
        }
        let original = || {
            original_max_position_embeddings
                .or_else(|| {
                    p.get("original_max_position_embeddings")
                        .and_then(Value::as_i64)
                })
                .unwrap_or(max_position_embeddings)
        };
        let rope_type = match p
            .get("rope_type")
            .and_then(Value::as_str)
            .unwrap_or("default")
        {
            "default" => RopeType::Default,
            "linear" => RopeType::Linear {
                factor: need("factor")?,
            },
            "dynamic" => RopeType::Dynamic {
                factor: need("factor")?,
            },
            "yarn" => RopeType::Yarn {
                factor: num("factor").unwrap_or(max_position_embeddings as f64 / original() as f64),
                attention_factor: num("attention_factor"),
                // `rope_parameters.get("beta_fast") or 32`: a 0 is the default too.
                beta_fast: num("beta_fast").filter(|b| *b != 0.0).unwrap_or(32.0),
                beta_slow: num("beta_slow").filter(|b| *b != 0.0).unwrap_or(1.0),
                mscale: num("mscale"),
                mscale_all_dim: num("mscale_all_dim"),
                original_max_position_embeddings: original() as f64,
                truncate: p.get("truncate").and_then(Value::as_bool).unwrap_or(true),
            },
            "longrope" => {
                let (short_factor, long_factor) =
                    (factors("short_factor")?, factors("long_factor")?);
                for (key, f) in [
                    ("short_factor", &short_factor),
                    ("long_factor", &long_factor),
                ] {
                    if f.len() as i64 != dim / 2 {
                        return Err(invalid(
                            format!(
                                "{key} has {} entries, the rotary dimension {dim} needs {}",
                                f.len(),
                                dim / 2
                            ),
                            "give one factor per rotary frequency (rotary dimension / 2)",
                        ));
                    }
                }
                RopeType::LongRope {
                    short_factor,
                    long_factor,
                    factor: num("factor"),
                    attention_factor: num("attention_factor"),
                    original_max_position_embeddings: original(),
                }
            }
            "proportional" => {
                // `int(rope_proportion * head_dim // 2)`.
                let rope_angles = (partial * head_dim as f64 / 2.0).floor() as i64;
                if rope_angles < 0 || rope_angles > head_dim / 2 {
                    return Err(Error::InvalidConfig {
                        field: "rope_parameters.partial_rotary_factor",
                        value: format!("{partial} (head_dim {head_dim})"),
                        fix: "use a factor between 0 and 1",
                    });
                }
                RopeType::Proportional {
                    factor: num("factor").unwrap_or(1.0),
                    rope_angles,
                }
            }
            "llama3" => RopeType::Llama3 {
                factor: need("factor")?,
                low_freq_factor: need("low_freq_factor")?,
                high_freq_factor: need("high_freq_factor")?,
                original_max_position_embeddings: original() as f64,
            },
            other => {
                return Err(Error::InvalidConfig {
                    field: "rope_parameters.rope_type",
                    value: other.to_string(),
                    fix: "supported rope types: default, linear, dynamic, yarn, longrope, llama3, proportional",
                });
            }
        };
        Ok(Self {
            rope_type,
            theta,
            dim,
            max_position_embeddings,
        })
    }

    /// The rotary dimension of each head.
    pub(crate) fn dim(&self) -> i64 {
        self.dim
    }

    /// `float32(arange(0, dim, 2) / dim)`.
    fn exponent(&self, device: Device) -> Tensor {
        Tensor::arange_start_step(0, self.dim, 2, (Kind::Int64, device)).to_kind(Kind::Float)
            / self.dim as f64
    }

    /// `1 / theta ** (arange(0, dim, 2) / dim)`, upstream's default frequencies.
    fn default_inv_freq(&self, device: Device) -> Result<Tensor> {
        Ok(Tensor::f_pow_scalar(self.theta, &self.exponent(device))?.reciprocal())
    }

    /// Upstream's `rope_init_fn(config, seq_len=seq_len)`: the inverse frequencies and the
    /// attention scaling of cos / sin.
    fn init(&self, seq_len: Option<i64>, device: Device) -> Result<(Tensor, f64)> {
        let d = self.dim as f64;
        Ok(match &self.rope_type {
            RopeType::Default => (self.default_inv_freq(device)?, 1.0),
            RopeType::Linear { factor } => (self.default_inv_freq(device)? / *factor, 1.0),
            RopeType::Dynamic { factor } => {
                let max = self.max_position_embeddings;
                let inv = match seq_len {
                    // At construction: Python floats.
                    None => {
                        let base = self.theta
                            * (factor * max as f64 / max as f64 - (factor - 1.0))
                                .powf(d / (d - 2.0));
                        Tensor::f_pow_scalar(base, &self.exponent(device))?.reciprocal()
                    }
                    // In the forward, `seq_len` is a tensor: float32 math.
                    Some(s) => {
                        let s = Tensor::scalar_tensor(s as f64, (Kind::Int64, device))
                            .maximum(&Tensor::scalar_tensor(max as f64, (Kind::Int64, device)));
                        let base = ((s * *factor) / max as f64 - (factor - 1.0))
                            .pow_tensor_scalar(d / (d - 2.0))
                            * self.theta;
                        base.f_pow(&self.exponent(device))?.reciprocal()
                    }
                };
                (inv, 1.0)
            }
            RopeType::Yarn {
                factor,
                attention_factor,
                beta_fast,
                beta_slow,
                mscale,
                mscale_all_dim,
                original_max_position_embeddings: original,
                truncate,
            } => {
                let get_mscale = |scale: f64, m: f64| {
                    if scale <= 1.0 {
                        1.0
                    } else {
                        0.1 * m * scale.ln() + 1.0
                    }
                };
                let attention = match (attention_factor, mscale, mscale_all_dim) {
                    (Some(a), _, _) => *a,
                    (None, Some(m), Some(all)) if *m != 0.0 && *all != 0.0 => {
                        get_mscale(*factor, *m) / get_mscale(*factor, *all)
                    }
                    _ => get_mscale(*factor, 1.0),
                };
                let correction_dim = |rotations: f64| {
                    (d * (original / (rotations * 2.0 * std::f64::consts::PI)).ln())
                        / (2.0 * self.theta.ln())
                };
                let (mut low, mut high) = (correction_dim(*beta_fast), correction_dim(*beta_slow));
                if *truncate {
                    low = low.floor();
                    high = high.ceil();
                }
                let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
                if low == high {
                    high += 0.001;
                }
                let ramp = ((Tensor::arange(self.dim / 2, (Kind::Float, device)) - low)
                    / (high - low))
                    .clamp(0.0, 1.0);
                let extrapolation_factor = -ramp + 1.0;
                let pos_freqs = Tensor::f_pow_scalar(self.theta, &self.exponent(device))?;
                let extrapolation = pos_freqs.reciprocal();
                let interpolation = (&pos_freqs * *factor).reciprocal();
                let inv = interpolation * (-&extrapolation_factor + 1.0)
                    + extrapolation * &extrapolation_factor;
                (inv, attention)
            }
            RopeType::LongRope {
                short_factor,
                long_factor,
                factor,
                attention_factor,
                original_max_position_embeddings: original,
            } => {
                let factor =
                    factor.unwrap_or(self.max_position_embeddings as f64 / *original as f64);
                let attention = match attention_factor {
                    Some(a) => *a,
                    None if factor <= 1.0 => 1.0,
                    None => (1.0 + factor.ln() / (*original as f64).ln()).sqrt(),
                };
                let ext = match seq_len {
                    Some(s) if s > *original => long_factor,
                    _ => short_factor,
                };
                let ext: Vec<f32> = ext.iter().map(|&f| f as f32).collect();
                let ext = Tensor::from_slice(&ext).to_device(device);
                let inv =
                    (ext * Tensor::f_pow_scalar(self.theta, &self.exponent(device))?).reciprocal();
                (inv, attention)
            }
            RopeType::Proportional {
                factor,
                rope_angles,
            } => {
                // `1 / base ** (arange(0, 2 · angles, 2).float() / head_dim)`, then zeros.
                let exponent =
                    Tensor::arange_start_step(0, 2 * rope_angles, 2, (Kind::Int64, device))
                        .to_kind(Kind::Float)
                        / d;
                let rotated = Tensor::f_pow_scalar(self.theta, &exponent)?.reciprocal();
                let nope = self.dim / 2 - rope_angles;
                let inv = if nope > 0 {
                    Tensor::cat(&[rotated, Tensor::zeros([nope], (Kind::Float, device))], 0)
                } else {
                    rotated
                };
                (inv / *factor, 1.0)
            }
            RopeType::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old,
            } => {
                let inv = self.default_inv_freq(device)?;
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                let wavelen = inv.reciprocal() * (2.0 * std::f64::consts::PI);
                // torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
                let inv_llama = (&inv / *factor).where_self(&wavelen.gt(low_wavelen), &inv);
                let smooth = (wavelen.reciprocal() * *old - *low_freq_factor)
                    / (high_freq_factor - low_freq_factor);
                let smoothed =
                    (smooth.ones_like() - &smooth) * &inv_llama / *factor + &smooth * &inv_llama;
                let medium = wavelen
                    .lt(high_wavelen)
                    .logical_not()
                    .logical_and(&wavelen.gt(low_wavelen).logical_not());
                (smoothed.where_self(&medium, &inv_llama), 1.0)
            }
        })
    }
}

/// What a dynamic RoPE remembers between forwards (upstream's `inv_freq` buffer and
/// `max_seq_len_cached`).
#[derive(Debug)]
struct DynamicState {
    inv_freq: Tensor,
    max_seq_len_cached: i64,
}

/// Upstream's `XRotaryEmbedding` with `dynamic_rope_update`: the frequencies of a config,
/// updated per forward for `dynamic` and `longrope`.
#[derive(Debug)]
pub(crate) struct RotaryEmbedding {
    params: RopeParameters,
    original_inv_freq: Tensor,
    attention_scaling: f64,
    /// `longrope`'s long frequencies.
    long_inv_freq: Option<Tensor>,
    /// `dynamic`'s current frequencies.
    dynamic: Option<Mutex<DynamicState>>,
}

impl RotaryEmbedding {
    pub(crate) fn new(params: RopeParameters, device: Device) -> Result<Self> {
        let (inv_freq, attention_scaling) = params.init(None, device)?;
        let long_inv_freq = match &params.rope_type {
            RopeType::LongRope {
                original_max_position_embeddings,
                ..
            } => Some(
                params
                    .init(
                        Some(original_max_position_embeddings.saturating_add(1)),
                        device,
                    )?
                    .0,
            ),
            _ => None,
        };
        let dynamic = matches!(params.rope_type, RopeType::Dynamic { .. }).then(|| {
            Mutex::new(DynamicState {
                inv_freq: inv_freq.shallow_clone(),
                max_seq_len_cached: params.max_position_embeddings,
            })
        });
        Ok(Self {
            params,
            original_inv_freq: inv_freq,
            attention_scaling,
            long_inv_freq,
            dynamic,
        })
    }

    /// The inverse frequencies for a forward over `positions` (`dynamic_rope_update`).
    fn inv_freq(&self, positions: &Tensor) -> Result<Tensor> {
        let seq_len = || positions.max().int64_value(&[]) + 1;
        if let (
            Some(long),
            RopeType::LongRope {
                original_max_position_embeddings: original,
                ..
            },
        ) = (&self.long_inv_freq, &self.params.rope_type)
        {
            return Ok(if seq_len() > *original {
                long.shallow_clone()
            } else {
                self.original_inv_freq.shallow_clone()
            });
        }
        let Some(state) = &self.dynamic else {
            return Ok(self.original_inv_freq.shallow_clone());
        };
        let seq_len = seq_len();
        let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
        let original_max = self.params.max_position_embeddings;
        let cached = state.max_seq_len_cached;
        if seq_len > cached {
            state.inv_freq = self.params.init(Some(seq_len), positions.device())?.0;
            state.max_seq_len_cached = seq_len;
        }
        // Upstream compares against the cache length read before a growth.
        if seq_len < original_max && cached > original_max {
            state.inv_freq = self.original_inv_freq.shallow_clone();
            state.max_seq_len_cached = original_max;
        }
        Ok(state.inv_freq.shallow_clone())
    }

    /// Upstream's rotary forward: float32 frequencies `positions × inv_freq`, duplicated,
    /// cos / sin times the attention scaling, cast to `kind`; `[batch, seq, dim]` each.
    pub(crate) fn cos_sin(&self, positions: &Tensor, kind: Kind) -> Result<(Tensor, Tensor)> {
        let inv_freq = self.inv_freq(positions)?.to_device(positions.device());
        let freqs = positions.unsqueeze(-1).to_kind(Kind::Float) * inv_freq;
        let emb = Tensor::cat(&[&freqs, &freqs], -1);
        let (cos, sin) = (emb.cos(), emb.sin());
        // (× 1.0 changes nothing: skipped)
        let (cos, sin) = match self.attention_scaling {
            1.0 => (cos, sin),
            scaling => (cos * scaling, sin * scaling),
        };
        Ok((cos.to_kind(kind), sin.to_kind(kind)))
    }
}

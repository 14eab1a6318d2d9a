//! The loss scaler of the ZeRO engine's half-precision regime: DeepSpeed 0.19.8's
//! `runtime/fp16/loss_scaler.py` (`LossScaler`, `DynamicLossScaler`, `CreateLossScaler`),
//! the same state and the same update rule, so that a run's scale trajectory and skipped
//! steps are DeepSpeed's.
//!
//! | DeepSpeed | here |
//! |---|---|
//! | `CreateLossScaler(dtype, static_loss_scale, dynamic_scaling, dynamic_loss_args)` | [`LossScaler::create`] |
//! | `LossScaler(scale)` (fp16 with `loss_scale > 0`; bf16 and fp32 with scale 1) | [`LossScaler::Static`] |
//! | `DynamicLossScaler(init_scale, scale_window, min_scale, delayed_shift, consecutive_hysteresis)` | [`LossScaler::Dynamic`] |
//! | `loss_scaler.loss_scale`, `update_scale(overflow)` | [`LossScaler::loss_scale`], [`LossScaler::update_scale`] |
//! | the `Exception` at the minimum scale (`raise_error_at_min_scale=True`, as the ZeRO optimizers build it) | [`Error::LossScaleAtMinimum`] |
//!
//! The state a checkpoint keeps (`optimizer_state_dict['loss_scaler']` in DeepSpeed's
//! files) is [`LossScaler`] itself, serialised with DeepSpeed's attribute names.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// DeepSpeed's `dynamic_loss_args` (`DeepSpeedFP16Config.dynamic_loss_scale_args()`, from
/// the config's `fp16` section).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DynamicLossArgs {
    /// `init_scale`: `2 ** fp16.initial_scale_power` (default `2 ** 16`).
    pub init_scale: f64,
    /// `scale_window`: `fp16.loss_scale_window` (default 1000).
    pub scale_window: i64,
    /// `min_scale`: `fp16.min_loss_scale` (default 1).
    pub min_scale: f64,
    /// `delayed_shift`: `fp16.hysteresis` (default 2).
    pub delayed_shift: i64,
    /// `consecutive_hysteresis`: `fp16.consecutive_hysteresis` (default false).
    pub consecutive_hysteresis: bool,
}

impl Default for DynamicLossArgs {
    fn default() -> Self {
        Self {
            init_scale: 65536.0,
            scale_window: 1000,
            min_scale: 1.0,
            delayed_shift: 2,
            consecutive_hysteresis: false,
        }
    }
}

/// DeepSpeed's `DynamicLossScaler`: its attributes, under its names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DynamicLossScaler {
    /// The scale the next backward multiplies the loss by.
    pub cur_scale: f64,
    /// Updates seen (one per optimizer step, skipped or not).
    pub cur_iter: i64,
    /// `cur_iter` of the last overflow (-1: none yet).
    pub last_overflow_iter: i64,
    /// 2.
    pub scale_factor: f64,
    /// Stable updates between two raises of the scale.
    pub scale_window: i64,
    /// The floor of the scale.
    pub min_scale: f64,
    /// Overflows tolerated before the scale is lowered (`hysteresis`).
    pub delayed_shift: i64,
    /// Overflows left before the next lowering.
    pub cur_hysteresis: i64,
    /// Whether a stable update refills `cur_hysteresis`.
    pub consecutive_hysteresis: bool,
}

impl DynamicLossScaler {
    /// `DynamicLossScaler(**dynamic_loss_args)`.
    pub fn new(args: DynamicLossArgs) -> Self {
        Self {
            cur_scale: args.init_scale,
            cur_iter: 0,
            last_overflow_iter: -1,
            scale_factor: 2.0,
            scale_window: args.scale_window,
            min_scale: args.min_scale,
            delayed_shift: args.delayed_shift,
            cur_hysteresis: args.delayed_shift,
            consecutive_hysteresis: args.consecutive_hysteresis,
        }
    }

    /// DeepSpeed's `update_scale(overflow)`, line for line.
    fn update_scale(&mut self, overflow: bool) -> Result<()> {
        if overflow {
            if self.delayed_shift == 1 || self.cur_hysteresis == 1 {
                if self.cur_scale == self.min_scale {
                    return Err(Error::LossScaleAtMinimum {
                        scale: self.cur_scale,
                    });
                }
                let next_scale = (self.cur_scale / self.scale_factor).max(self.min_scale);
                log::info!(
                    "[deepspeed] OVERFLOW! Skipping step. Attempted loss scale: {}, reducing to {}",
                    self.cur_scale as i64,
                    next_scale as i64
                );
                self.cur_scale = next_scale;
            } else {
                log::info!(
                    "[deepspeed] OVERFLOW! Skipping step. Attempted loss scale: {}, but hysteresis is {}. Reducing hysteresis to {}",
                    self.cur_scale as i64,
                    self.cur_hysteresis,
                    self.cur_hysteresis - 1
                );
                self.cur_hysteresis -= 1;
            }
            self.last_overflow_iter = self.cur_iter;
        } else {
            if self.consecutive_hysteresis {
                self.cur_hysteresis = self.delayed_shift;
            }
            let stable_interval = (self.cur_iter - self.last_overflow_iter) - 1;
            // `scale_window` > 0 is checked where the config is read, as DeepSpeed's validator.
            if stable_interval > 0 && stable_interval % self.scale_window.max(1) == 0 {
                if !self.consecutive_hysteresis {
                    self.cur_hysteresis = self.delayed_shift;
                }
                self.cur_scale *= self.scale_factor;
            }
        }
        self.cur_iter += 1;
        Ok(())
    }
}

/// The engine's loss scaler (DeepSpeed's `LossScalerBase` subclasses).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum LossScaler {
    /// `LossScaler`: a fixed scale (fp16's `loss_scale > 0`; 1 for bf16 and fp32).
    Static {
        /// `cur_scale`.
        cur_scale: f64,
    },
    /// `DynamicLossScaler` (fp16 with `loss_scale` 0).
    Dynamic(DynamicLossScaler),
}

impl LossScaler {
    /// DeepSpeed's `CreateLossScaler(dtype, static_loss_scale, dynamic_scaling,
    /// dynamic_loss_args)` for a model computing in `half` (float16) or not: the dynamic
    /// scaler for float16 with `dynamic_scaling`, else a static one (`static_loss_scale`
    /// for float16, 1 otherwise).
    pub fn create(
        half: bool,
        static_loss_scale: f64,
        dynamic_scaling: bool,
        dynamic_loss_args: DynamicLossArgs,
    ) -> Self {
        if half && dynamic_scaling {
            return Self::Dynamic(DynamicLossScaler::new(dynamic_loss_args));
        }
        Self::Static {
            cur_scale: if half { static_loss_scale } else { 1.0 },
        }
    }

    /// `loss_scale`: what the next backward multiplies the loss by.
    pub fn loss_scale(&self) -> f64 {
        match self {
            Self::Static { cur_scale } => *cur_scale,
            Self::Dynamic(d) => d.cur_scale,
        }
    }

    /// Whether the scale changes with overflows (`dynamic`).
    pub fn is_dynamic(&self) -> bool {
        matches!(self, Self::Dynamic(_))
    }

    /// `update_scale(overflow)`, once per optimizer step: the static scaler only notes an
    /// overflow; the dynamic one lowers the scale (after `hysteresis` overflows) or raises
    /// it after `scale_window` stable steps. At the minimum scale an overflow is
    /// [`Error::LossScaleAtMinimum`], as DeepSpeed raises.
    pub fn update_scale(&mut self, overflow: bool) -> Result<()> {
        match self {
            Self::Static { .. } => {
                if overflow {
                    log::warn!(
                        "[deepspeed] OVERFLOW! Skipping step. Gradients are non-finite, weights were not updated."
                    );
                }
                Ok(())
            }
            Self::Dynamic(d) => d.update_scale(overflow),
        }
    }
}

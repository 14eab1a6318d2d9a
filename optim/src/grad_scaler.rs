//! `GradScaler`: torch's `torch.amp.GradScaler`, dynamic loss scaling for float16 mixed
//! precision (what accelerate wraps around the optimizer for `--fp16` on a GPU).
//!
//! A step: `scale(loss)` multiplies the loss by the current scale before `backward()`;
//! `unscale_(optimizer)` divides the gradients by it in place and records whether any is inf
//! or NaN (call it before clipping); `step(optimizer)` steps unless one was, and
//! `update()` backs the scale off (`backoff_factor`) after such a step or grows it
//! (`growth_factor`) after `growth_interval` clean steps in a row, with libtorch's
//! `_amp_update_scale_`. The check and the unscale are torch's
//! `_amp_foreach_non_finite_check_and_unscale_` op for op: each gradient multiplied by the
//! float32 reciprocal of the scale (computed in float64, as torch does), so a power-of-two
//! scale gives back the gradients exactly.
//!
//! One optimizer per scaler (the Trainer's case). The state (`scale`, `growth_factor`,
//! `backoff_factor`, `growth_interval`, `_growth_tracker`, torch's `state_dict()` keys) is
//! saved as `scaler.json`.

use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::{Error, Optimizer, Result};

/// File name of a saved scaler state in a checkpoint folder.
pub const SCALER_NAME: &str = "scaler.json";

/// The constructor's arguments (accelerate's `GradScalerKwargs`), torch's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GradScalerKwargs {
    /// Initial scale (`2**16`).
    pub init_scale: f64,
    /// Factor the scale grows by after `growth_interval` clean steps (> 1).
    pub growth_factor: f64,
    /// Factor the scale is multiplied by after a step with inf / NaN gradients (< 1).
    pub backoff_factor: f64,
    /// Clean steps in a row before the scale grows.
    pub growth_interval: i64,
    /// `false`: `scale` returns the loss, `step` always steps, the rest does nothing.
    pub enabled: bool,
}

impl Default for GradScalerKwargs {
    fn default() -> Self {
        Self {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            enabled: true,
        }
    }
}

/// torch's `GradScaler.state_dict()`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GradScalerState {
    /// The current scale.
    pub scale: f64,
    /// `growth_factor`.
    pub growth_factor: f64,
    /// `backoff_factor`.
    pub backoff_factor: f64,
    /// `growth_interval`.
    pub growth_interval: i64,
    /// Clean steps since the scale last changed.
    #[serde(rename = "_growth_tracker")]
    pub growth_tracker: i64,
}

/// Where the scaler is within an iteration (torch's `OptState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Ready,
    Unscaled,
    Stepped,
}

/// Dynamic loss scaling (see the module docs).
#[derive(Debug)]
pub struct GradScaler {
    enabled: bool,
    init_scale: f64,
    growth_factor: f64,
    backoff_factor: f64,
    growth_interval: i64,
    init_growth_tracker: i64,
    /// float32 scalar, created on the first loss's device.
    scale: Option<Tensor>,
    /// int32 scalar beside it.
    growth_tracker: Option<Tensor>,
    stage: Stage,
    /// float32 scalar: 1 when this iteration's gradients had an inf or a NaN.
    found_inf: Option<Tensor>,
}

impl GradScaler {
    /// A scaler with `kwargs`; torch's checks (`growth_factor > 1`, `backoff_factor < 1`) as
    /// typed errors.
    pub fn new(kwargs: GradScalerKwargs) -> Result<Self> {
        if kwargs.enabled {
            if kwargs.growth_factor <= 1.0 {
                return Err(Error::InvalidHyperparameter {
                    name: "growth_factor",
                    value: kwargs.growth_factor,
                    expected: "must be > 1.0",
                });
            }
            if kwargs.backoff_factor >= 1.0 {
                return Err(Error::InvalidHyperparameter {
                    name: "backoff_factor",
                    value: kwargs.backoff_factor,
                    expected: "must be < 1.0",
                });
            }
        }
        Ok(Self {
            enabled: kwargs.enabled,
            init_scale: kwargs.init_scale,
            growth_factor: kwargs.growth_factor,
            backoff_factor: kwargs.backoff_factor,
            growth_interval: kwargs.growth_interval,
            init_growth_tracker: 0,
            scale: None,
            growth_tracker: None,
            stage: Stage::Ready,
            found_inf: None,
        })
    }

    /// Whether scaling is on.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    fn lazy_init(&mut self, device: Device) -> Result<()> {
        if self.scale.is_none() {
            self.scale = Some(Tensor::f_full([], self.init_scale, (Kind::Float, device))?);
            self.growth_tracker = Some(Tensor::f_full(
                [],
                self.init_growth_tracker,
                (Kind::Int, device),
            )?);
        }
        Ok(())
    }

    fn misuse(what: &str) -> Error {
        Error::GradScaler(format!(
            "{what} This may indicate your script did not use scaler.scale(loss or outputs) \
             earlier in the iteration."
        ))
    }

    /// `loss * scale` (the scale created on the loss's device the first time); the loss
    /// itself when disabled.
    pub fn scale(&mut self, loss: &Tensor) -> Result<Tensor> {
        if !self.enabled {
            return Ok(loss.shallow_clone());
        }
        self.lazy_init(loss.device())?;
        let scale = self.scale.as_ref().expect("initialised above");
        Ok(loss.f_mul(&scale.f_to_device(loss.device())?)?)
    }

    /// The scale tensor on `device` (created there on first use), sharing its storage:
    /// it follows [`update`](Self::update). For code that scales the loss itself (the
    /// Trainer's `backward`); `None` when disabled.
    pub fn scale_tensor(&mut self, device: Device) -> Result<Option<Tensor>> {
        if !self.enabled {
            return Ok(None);
        }
        self.lazy_init(device)?;
        Ok(self.scale.as_ref().map(Tensor::shallow_clone))
    }

    /// Divides `optimizer`'s gradients by the scale in place and records whether any was inf
    /// or NaN. At most once per iteration, before [`step`](Self::step); float16 gradients
    /// are refused (torch: `Attempting to unscale FP16 gradients.`).
    pub fn unscale_(&mut self, optimizer: &dyn Optimizer) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        let Some(scale) = &self.scale else {
            return Err(Self::misuse("Attempted unscale_ but _scale is None."));
        };
        match self.stage {
            Stage::Unscaled => {
                return Err(Error::GradScaler(
                    "unscale_() has already been called on this optimizer since the last update()."
                        .into(),
                ));
            }
            Stage::Stepped => {
                return Err(Error::GradScaler(
                    "unscale_() is being called after step().".into(),
                ));
            }
            Stage::Ready => {}
        }
        let inv_scale = scale
            .f_to_kind(Kind::Double)?
            .f_reciprocal()?
            .f_to_kind(Kind::Float)?;
        let mut found_inf = Tensor::f_zeros([], (Kind::Float, scale.device()))?;
        tch::no_grad(|| -> Result<()> {
            for group in optimizer.param_groups() {
                for p in &group.params {
                    let mut g = p.grad();
                    if !g.defined() {
                        continue;
                    }
                    if g.kind() == Kind::Half {
                        return Err(Error::GradScaler(
                            "Attempting to unscale FP16 gradients.".into(),
                        ));
                    }
                    let bad = g
                        .f_isfinite()?
                        .f_logical_not()?
                        .f_any()?
                        .f_to_kind(Kind::Float)?
                        .f_to_device(found_inf.device())?;
                    found_inf = found_inf.f_maximum(&bad)?;
                    let _ = g.f_mul_(&inv_scale.f_to_device(g.device())?)?;
                }
            }
            Ok(())
        })?;
        self.found_inf = Some(found_inf);
        self.stage = Stage::Unscaled;
        Ok(())
    }

    /// Whether [`unscale_`](Self::unscale_) ran in this iteration.
    pub fn is_unscaled(&self) -> bool {
        self.stage == Stage::Unscaled
    }

    /// The inf / NaN flag [`unscale_`](Self::unscale_) recorded (a float32 scalar, 1 when a
    /// gradient was not finite), for a sharded run to reduce across ranks before the
    /// step, as DTensor's handler of `_amp_foreach_non_finite_check_and_unscale_` does
    /// (`Partial("max")`): every rank then skips the same steps.
    pub fn found_inf_mut(&mut self) -> Option<&mut Tensor> {
        self.found_inf.as_mut()
    }

    /// Unscales (unless [`unscale_`](Self::unscale_) already did) and steps `optimizer`
    /// unless a gradient was inf or NaN. Returns whether it stepped.
    pub fn step(&mut self, optimizer: &mut dyn Optimizer) -> Result<bool> {
        if !self.enabled {
            optimizer.step()?;
            return Ok(true);
        }
        if self.scale.is_none() {
            return Err(Self::misuse("Attempted step but _scale is None."));
        }
        if self.stage == Stage::Stepped {
            return Err(Error::GradScaler(
                "step() has already been called since the last update().".into(),
            ));
        }
        if self.stage == Stage::Ready {
            self.unscale_(&*optimizer)?;
        }
        let found = self
            .found_inf
            .as_ref()
            .ok_or_else(|| {
                Error::GradScaler("No inf checks were recorded for this optimizer.".into())
            })?
            .f_double_value(&[])?;
        let stepped = found == 0.0;
        if stepped {
            optimizer.step()?;
        }
        self.stage = Stage::Stepped;
        Ok(stepped)
    }

    /// Backs the scale off after a step with inf / NaN gradients, or grows it after
    /// `growth_interval` clean steps (libtorch's `_amp_update_scale_`); then a new
    /// iteration starts.
    pub fn update(&mut self) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        let (Some(scale), Some(tracker)) = (self.scale.as_mut(), self.growth_tracker.as_ref())
        else {
            return Err(Self::misuse("Attempted update but _scale is None."));
        };
        let found = self.found_inf.take().ok_or_else(|| {
            Error::GradScaler("No inf checks were recorded prior to update.".into())
        })?;
        let found = found.f_to_device(scale.device())?;
        let _ = scale.f_internal_amp_update_scale_(
            tracker,
            &found,
            self.growth_factor,
            self.backoff_factor,
            self.growth_interval,
        )?;
        self.stage = Stage::Ready;
        Ok(())
    }

    /// The current scale (`init_scale` before the first [`scale`](Self::scale); 1 when
    /// disabled).
    pub fn get_scale(&self) -> Result<f64> {
        if !self.enabled {
            return Ok(1.0);
        }
        match &self.scale {
            Some(s) => Ok(s.f_double_value(&[])?),
            None => Ok(self.init_scale),
        }
    }

    /// Clean steps since the scale last changed.
    pub fn growth_tracker(&self) -> Result<i64> {
        if !self.enabled {
            return Ok(0);
        }
        match &self.growth_tracker {
            Some(t) => Ok(t.f_int64_value(&[])?),
            None => Ok(self.init_growth_tracker),
        }
    }

    /// torch's `state_dict()` (`None` when disabled: torch's is empty).
    pub fn state_dict(&self) -> Result<Option<GradScalerState>> {
        if !self.enabled {
            return Ok(None);
        }
        Ok(Some(GradScalerState {
            scale: self.get_scale()?,
            growth_factor: self.growth_factor,
            backoff_factor: self.backoff_factor,
            growth_interval: self.growth_interval,
            growth_tracker: self.growth_tracker()?,
        }))
    }

    /// torch's `load_state_dict` (nothing when disabled).
    pub fn load_state_dict(&mut self, state: &GradScalerState) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        self.init_scale = state.scale;
        self.growth_factor = state.growth_factor;
        self.backoff_factor = state.backoff_factor;
        self.growth_interval = state.growth_interval;
        self.init_growth_tracker = state.growth_tracker;
        if let Some(s) = self.scale.as_mut() {
            let _ = s.f_fill_(state.scale)?;
        }
        if let Some(t) = self.growth_tracker.as_mut() {
            let _ = t.f_fill_(state.growth_tracker)?;
        }
        Ok(())
    }

    /// Writes `scaler.json` into `dir` (created if missing); nothing when disabled.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let Some(state) = self.state_dict()? else {
            return Ok(());
        };
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            path: dir.into(),
            source,
        })?;
        let path = dir.join(SCALER_NAME);
        let text = serde_json::to_string_pretty(&state).map_err(|source| Error::Json {
            path: path.clone(),
            source,
        })?;
        std::fs::write(&path, text).map_err(|source| Error::Io { path, source })
    }

    /// Restores the state written by [`save`](Self::save).
    pub fn load(&mut self, dir: &Path) -> Result<()> {
        let path = dir.join(SCALER_NAME);
        let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        let state: GradScalerState =
            serde_json::from_str(&text).map_err(|source| Error::Json { path, source })?;
        self.load_state_dict(&state)
    }
}

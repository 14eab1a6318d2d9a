//! The [`LrScheduler`] trait, [`LambdaLR`] (torch's `LambdaLR` semantics: construction sets
//! `initial_lr` and takes step 0, each `step()` advances `last_epoch` and sets
//! `lr = base_lr * lambda(last_epoch)`), and [`get_scheduler`] with upstream's names and
//! `lr_scheduler_kwargs`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::schedules::{
    LrLambda, WsdCurve, WsdOptions, get_constant_schedule, get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup, get_cosine_with_hard_restarts_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup_lr_rate, get_inverse_sqrt_schedule,
    get_linear_schedule_with_warmup, get_polynomial_decay_schedule_with_warmup, get_wsd_schedule,
};
use crate::{Error, GreedyLR, Optimizer, ReduceLROnPlateau, Result};

/// File holding a scheduler's state in a checkpoint folder.
pub const SCHEDULER_NAME: &str = "scheduler.json";

/// `lr_scheduler_kwargs`: keyword arguments by name, as JSON values.
pub type SchedulerKwargs = serde_json::Map<String, serde_json::Value>;

/// Upstream `SchedulerType` values, in upstream's order.
pub const SCHEDULER_TYPES: [&str; 12] = [
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "reduce_lr_on_plateau",
    "cosine_with_min_lr",
    "cosine_warmup_with_min_lr",
    "warmup_stable_decay",
    "greedy",
];

/// A learning-rate scheduler driving an [`Optimizer`]'s group lrs.
pub trait LrScheduler {
    /// The `SchedulerType` name it was built for.
    fn name(&self) -> &str;

    /// Advances one step and writes the new lrs into `optimizer` (torch's `scheduler.step()`).
    /// Metric-driven schedulers return [`Error::WrongStepKind`].
    fn step(&mut self, optimizer: &mut dyn Optimizer) -> Result<()>;

    /// Steps on a metric (`ReduceLROnPlateau` / `GreedyLR`); the per-step schedulers keep
    /// this default, [`Error::WrongStepKind`].
    fn step_with_metric(&mut self, optimizer: &mut dyn Optimizer, metric: f64) -> Result<()> {
        let _ = (optimizer, metric);
        Err(Error::WrongStepKind {
            scheduler: self.name().to_string(),
            reason: "does not step on a metric: call step",
        })
    }

    /// Whether it steps on a metric (the Trainer steps those after evaluation); false for
    /// the per-step schedulers.
    fn steps_on_metric(&self) -> bool {
        false
    }

    /// The lrs of the last step, one per group (`get_last_lr()`).
    fn get_last_lr(&self) -> &[f64];

    /// The step counter (`last_epoch`).
    fn last_epoch(&self) -> i64;

    /// The state as JSON (`state_dict()`).
    fn state_dict(&self) -> serde_json::Value;

    /// Restores a state from [`LrScheduler::state_dict`].
    fn load_state_dict(&mut self, state: &serde_json::Value) -> Result<()>;

    /// Writes `scheduler.json` into `dir` (created if missing).
    fn save(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            path: dir.into(),
            source,
        })?;
        let path = dir.join(SCHEDULER_NAME);
        let text =
            serde_json::to_string_pretty(&self.state_dict()).map_err(|source| Error::Json {
                path: path.clone(),
                source,
            })?;
        std::fs::write(&path, text).map_err(|source| Error::Io { path, source })
    }

    /// Restores the state written by [`LrScheduler::save`].
    fn load(&mut self, dir: &Path) -> Result<()> {
        let path = dir.join(SCHEDULER_NAME);
        let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        let v = serde_json::from_str(&text).map_err(|source| Error::Json { path, source })?;
        self.load_state_dict(&v)
    }
}

/// `torch.optim.lr_scheduler.LambdaLR` with one [`LrLambda`] for all groups.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LambdaLR {
    /// `SchedulerType` name.
    pub scheduler: String,
    /// The multiplier.
    pub lr_lambda: LrLambda,
    /// `initial_lr` of each group.
    pub base_lrs: Vec<f64>,
    /// Step counter.
    pub last_epoch: i64,
    /// Number of `step()` calls, including the one at construction.
    #[serde(rename = "_step_count")]
    pub step_count: u64,
    /// The lrs of the last step.
    #[serde(rename = "_last_lr")]
    pub last_lr: Vec<f64>,
}

impl LambdaLR {
    /// Attaches to `optimizer` as torch does: with `last_epoch == -1` each group's
    /// `initial_lr` defaults to its current lr; otherwise every group must already have one
    /// (restored from an optimizer state). Then takes the initial step, which sets the lrs.
    pub fn new(
        optimizer: &mut dyn Optimizer,
        scheduler: &str,
        lr_lambda: LrLambda,
        last_epoch: i64,
    ) -> Result<Self> {
        let mut base_lrs = Vec::new();
        for (i, g) in optimizer.param_groups_mut().iter_mut().enumerate() {
            if last_epoch == -1 {
                base_lrs.push(*g.initial_lr.get_or_insert(g.lr));
            } else {
                base_lrs.push(g.initial_lr.ok_or_else(|| Error::SchedulerStateMismatch {
                    detail: format!(
                        "param 'initial_lr' is not specified in param_groups[{i}] when resuming \
                         scheduler with last_epoch >= 0 (load the optimizer state first)"
                    ),
                })?);
            }
        }
        let mut s = Self {
            scheduler: scheduler.to_string(),
            lr_lambda,
            base_lrs,
            last_epoch,
            step_count: 0,
            last_lr: Vec::new(),
        };
        s.step(optimizer)?;
        Ok(s)
    }

    /// The lrs at step `epoch` (`base_lr * lambda(epoch)`), without stepping.
    pub fn lrs_at(&self, epoch: i64) -> Vec<f64> {
        let f = self.lr_lambda.value(epoch);
        self.base_lrs.iter().map(|b| b * f).collect()
    }
}

impl LrScheduler for LambdaLR {
    fn name(&self) -> &str {
        &self.scheduler
    }

    fn step(&mut self, optimizer: &mut dyn Optimizer) -> Result<()> {
        self.step_count += 1;
        self.last_epoch += 1;
        let lrs = self.lrs_at(self.last_epoch);
        optimizer.set_lrs(&lrs)?;
        self.last_lr = lrs;
        Ok(())
    }

    fn get_last_lr(&self) -> &[f64] {
        &self.last_lr
    }

    fn last_epoch(&self) -> i64 {
        self.last_epoch
    }

    fn state_dict(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }

    /// Restores `base_lrs`, `last_epoch`, `_step_count` and `_last_lr`; like torch, the
    /// multiplier of the live scheduler is kept.
    fn load_state_dict(&mut self, state: &serde_json::Value) -> Result<()> {
        let s: LambdaLR =
            serde_json::from_value(state.clone()).map_err(|e| Error::SchedulerStateMismatch {
                detail: format!("not a LambdaLR state: {e}"),
            })?;
        if s.base_lrs.len() != self.base_lrs.len() {
            return Err(Error::GroupCountMismatch {
                what: "scheduler base_lrs",
                expected: self.base_lrs.len(),
                found: s.base_lrs.len(),
            });
        }
        self.base_lrs = s.base_lrs;
        self.last_epoch = s.last_epoch;
        self.step_count = s.step_count;
        self.last_lr = s.last_lr;
        Ok(())
    }
}

/// Typed reads of `lr_scheduler_kwargs` for one scheduler: rejects keys outside `accepted`.
pub(crate) struct Kwargs<'a> {
    scheduler: &'a str,
    map: &'a SchedulerKwargs,
}

impl<'a> Kwargs<'a> {
    pub(crate) fn new(
        scheduler: &'a str,
        map: &'a SchedulerKwargs,
        accepted: &[&str],
    ) -> Result<Self> {
        if let Some(k) = map.keys().find(|k| !accepted.contains(&k.as_str())) {
            return Err(Error::UnknownSchedulerKwarg {
                scheduler: scheduler.into(),
                kwarg: k.clone(),
                accepted: accepted.join(", "),
            });
        }
        Ok(Self { scheduler, map })
    }

    fn invalid(&self, key: &str, reason: impl Into<String>) -> Error {
        Error::InvalidSchedulerKwarg {
            scheduler: self.scheduler.into(),
            kwarg: key.into(),
            reason: reason.into(),
        }
    }

    /// A number (JSON int or float), if present and not null.
    pub(crate) fn f64(&self, key: &str) -> Result<Option<f64>> {
        match self.map.get(key) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.invalid(key, format!("expected a number, got {v}"))),
        }
    }

    /// An integer, if present and not null (floats with no fraction are accepted).
    pub(crate) fn i64(&self, key: &str) -> Result<Option<i64>> {
        match self.map.get(key) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(v) => v
                .as_i64()
                .or_else(|| v.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64))
                .map(Some)
                .ok_or_else(|| self.invalid(key, format!("expected an integer, got {v}"))),
        }
    }

    /// A string, if present.
    pub(crate) fn str(&self, key: &str) -> Result<Option<&'a str>> {
        match self.map.get(key) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.invalid(key, format!("expected a string, got {v}"))),
        }
    }

    /// A boolean, if present.
    pub(crate) fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.map.get(key) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.invalid(key, format!("expected a boolean, got {v}"))),
        }
    }

    /// A number or a list of numbers (one per group), if present.
    pub(crate) fn f64_or_list(&self, key: &str) -> Result<Option<Vec<f64>>> {
        match self.map.get(key) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_f64()
                        .ok_or_else(|| self.invalid(key, format!("expected numbers, got {v}")))
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(v) => v
                .as_f64()
                .map(|f| Some(vec![f]))
                .ok_or_else(|| self.invalid(key, format!("expected a number or a list, got {v}"))),
        }
    }

    fn curve(&self, key: &str, default: WsdCurve) -> Result<WsdCurve> {
        match self.str(key)? {
            None => Ok(default),
            Some(s) => WsdCurve::parse(s).ok_or_else(|| {
                self.invalid(
                    key,
                    format!("Unknown type: {s}, expected 'linear', 'cosine' or '1-sqrt'"),
                )
            }),
        }
    }
}

/// Builds the scheduler `name` (a `SchedulerType` value) for `optimizer`, as upstream
/// `get_scheduler(name, optimizer, num_warmup_steps, num_training_steps,
/// scheduler_specific_kwargs)`:
///
/// * `constant` and `constant_with_warmup` ignore `kwargs` (upstream does not pass them);
/// * `reduce_lr_on_plateau` and `greedy` take only `kwargs`;
/// * every other scheduler needs `num_warmup_steps`, and all but `inverse_sqrt` and
///   `warmup_stable_decay` need `num_training_steps` ([`Error::MissingSchedulerArgument`]);
/// * a kwarg the scheduler function does not take is [`Error::UnknownSchedulerKwarg`],
///   naming it and the accepted ones.
///
/// ```
/// use tch::{Device, Kind, Tensor};
/// use tchtrain_optim::{get_scheduler, AdamW, AdamWConfig, GroupSpec, LrScheduler};
/// let p = Tensor::zeros([1], (Kind::Float, Device::Cpu));
/// let mut opt = AdamW::new(vec![GroupSpec::unnamed(vec![p])], AdamWConfig::default())?;
/// let kwargs = serde_json::json!({"num_cycles": 1.5});
/// let sched = get_scheduler("cosine", &mut opt, Some(10), Some(100), kwargs.as_object())?;
/// assert_eq!(sched.get_last_lr(), &[0.0]);
/// let bad = serde_json::json!({"min_lr": 0.1});
/// assert!(get_scheduler("cosine", &mut opt, Some(10), Some(100), bad.as_object()).is_err());
/// # Ok::<(), tchtrain_optim::Error>(())
/// ```
pub fn get_scheduler(
    name: &str,
    optimizer: &mut dyn Optimizer,
    num_warmup_steps: Option<i64>,
    num_training_steps: Option<i64>,
    kwargs: Option<&SchedulerKwargs>,
) -> Result<Box<dyn LrScheduler>> {
    let empty = SchedulerKwargs::new();
    let map = kwargs.unwrap_or(&empty);
    if !SCHEDULER_TYPES.contains(&name) {
        return Err(Error::UnknownScheduler {
            name: name.into(),
            accepted: SCHEDULER_TYPES.join(", "),
        });
    }
    match name {
        "constant" => return Ok(Box::new(get_constant_schedule(optimizer, -1)?)),
        "reduce_lr_on_plateau" => {
            return Ok(Box::new(ReduceLROnPlateau::from_kwargs(optimizer, map)?));
        }
        "greedy" => return Ok(Box::new(GreedyLR::from_kwargs(optimizer, map)?)),
        _ => {}
    }
    let missing = |argument| Error::MissingSchedulerArgument {
        scheduler: name.into(),
        argument,
    };
    let warmup = num_warmup_steps.ok_or_else(|| missing("num_warmup_steps"))?;
    match name {
        "constant_with_warmup" => {
            return Ok(Box::new(get_constant_schedule_with_warmup(
                optimizer, warmup, -1,
            )?));
        }
        "inverse_sqrt" => {
            let k = Kwargs::new(name, map, &["timescale", "last_epoch"])?;
            let last_epoch = k.i64("last_epoch")?.unwrap_or(-1);
            return Ok(Box::new(get_inverse_sqrt_schedule(
                optimizer,
                warmup,
                k.f64("timescale")?,
                last_epoch,
            )?));
        }
        "warmup_stable_decay" => {
            let k = Kwargs::new(
                name,
                map,
                &[
                    "num_decay_steps",
                    "num_stable_steps",
                    "warmup_type",
                    "decay_type",
                    "min_lr_ratio",
                    "num_cycles",
                    "last_epoch",
                ],
            )?;
            let decay = k
                .i64("num_decay_steps")?
                .ok_or_else(|| missing("num_decay_steps"))?;
            let d = WsdOptions::default();
            let options = WsdOptions {
                num_stable_steps: k.i64("num_stable_steps")?,
                warmup_type: k.curve("warmup_type", d.warmup_type)?,
                decay_type: k.curve("decay_type", d.decay_type)?,
                min_lr_ratio: k.f64("min_lr_ratio")?.unwrap_or(d.min_lr_ratio),
                num_cycles: k.f64("num_cycles")?.unwrap_or(d.num_cycles),
            };
            let last_epoch = k.i64("last_epoch")?.unwrap_or(-1);
            return Ok(Box::new(get_wsd_schedule(
                optimizer,
                warmup,
                decay,
                num_training_steps,
                options,
                last_epoch,
            )?));
        }
        _ => {}
    }
    let total = num_training_steps.ok_or_else(|| missing("num_training_steps"))?;
    let sched = match name {
        "linear" => {
            let k = Kwargs::new(name, map, &["last_epoch"])?;
            get_linear_schedule_with_warmup(
                optimizer,
                warmup,
                total,
                k.i64("last_epoch")?.unwrap_or(-1),
            )?
        }
        "cosine" => {
            let k = Kwargs::new(name, map, &["num_cycles", "last_epoch"])?;
            let cycles = k.f64("num_cycles")?.unwrap_or(0.5);
            get_cosine_schedule_with_warmup(
                optimizer,
                warmup,
                total,
                cycles,
                k.i64("last_epoch")?.unwrap_or(-1),
            )?
        }
        "cosine_with_restarts" => {
            let k = Kwargs::new(name, map, &["num_cycles", "last_epoch"])?;
            let cycles = k.f64("num_cycles")?.unwrap_or(1.0);
            let last_epoch = k.i64("last_epoch")?.unwrap_or(-1);
            get_cosine_with_hard_restarts_schedule_with_warmup(
                optimizer, warmup, total, cycles, last_epoch,
            )?
        }
        "polynomial" => {
            let k = Kwargs::new(name, map, &["lr_end", "power", "last_epoch"])?;
            let lr_end = k.f64("lr_end")?.unwrap_or(1e-7);
            let power = k.f64("power")?.unwrap_or(1.0);
            let last_epoch = k.i64("last_epoch")?.unwrap_or(-1);
            get_polynomial_decay_schedule_with_warmup(
                optimizer, warmup, total, lr_end, power, last_epoch,
            )?
        }
        "cosine_with_min_lr" => {
            let k = Kwargs::new(
                name,
                map,
                &["num_cycles", "last_epoch", "min_lr", "min_lr_rate"],
            )?;
            get_cosine_with_min_lr_schedule_with_warmup(
                optimizer,
                warmup,
                total,
                k.f64("num_cycles")?.unwrap_or(0.5),
                k.i64("last_epoch")?.unwrap_or(-1),
                k.f64("min_lr")?,
                k.f64("min_lr_rate")?,
            )?
        }
        _ => {
            // "cosine_warmup_with_min_lr", the only name left.
            let k = Kwargs::new(
                name,
                map,
                &[
                    "num_cycles",
                    "last_epoch",
                    "min_lr",
                    "min_lr_rate",
                    "warmup_lr_rate",
                ],
            )?;
            get_cosine_with_min_lr_schedule_with_warmup_lr_rate(
                optimizer,
                warmup,
                total,
                k.f64("num_cycles")?.unwrap_or(0.5),
                k.i64("last_epoch")?.unwrap_or(-1),
                k.f64("min_lr")?,
                k.f64("min_lr_rate")?,
                k.f64("warmup_lr_rate")?,
            )?
        }
    };
    Ok(Box::new(sched))
}

//! Metric-driven schedulers: torch's `ReduceLROnPlateau` and upstream's `GreedyLR` (with its
//! `StreamingAverage`), stepping on a metric and reading / writing the optimizer's lrs.

use serde::{Deserialize, Serialize};

use crate::scheduler::{Kwargs, SchedulerKwargs};
use crate::{Error, LrScheduler, Optimizer, Result};

/// Serialises f64 allowing `inf` / `-inf` / `nan` (JSON has no literal for them).
mod json_f64 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() {
            s.serialize_f64(*v)
        } else if v.is_nan() {
            s.serialize_str("nan")
        } else if *v > 0.0 {
            s.serialize_str("inf")
        } else {
            s.serialize_str("-inf")
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum V {
            F(f64),
            S(String),
        }
        match V::deserialize(d)? {
            V::F(f) => Ok(f),
            V::S(s) => match s.as_str() {
                "inf" | "Infinity" => Ok(f64::INFINITY),
                "-inf" | "-Infinity" => Ok(f64::NEG_INFINITY),
                "nan" | "NaN" => Ok(f64::NAN),
                other => Err(serde::de::Error::custom(format!("not a number: {other}"))),
            },
        }
    }
}

/// `min` or `max`: whether lower or higher metrics are better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PlateauMode {
    /// Lower is better.
    Min,
    /// Higher is better.
    Max,
}

/// `rel` or `abs` threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ThresholdMode {
    /// Relative to the best value.
    Rel,
    /// Absolute.
    Abs,
}

fn parse_mode(scheduler: &str, k: &Kwargs<'_>, default: PlateauMode) -> Result<PlateauMode> {
    match k.str("mode")? {
        None => Ok(default),
        Some("min") => Ok(PlateauMode::Min),
        Some("max") => Ok(PlateauMode::Max),
        Some(m) => Err(Error::InvalidSchedulerKwarg {
            scheduler: scheduler.into(),
            kwarg: "mode".into(),
            reason: format!("mode {m} is unknown!"),
        }),
    }
}

fn parse_threshold_mode(
    scheduler: &str,
    k: &Kwargs<'_>,
    default: ThresholdMode,
) -> Result<ThresholdMode> {
    match k.str("threshold_mode")? {
        None => Ok(default),
        Some("rel") => Ok(ThresholdMode::Rel),
        Some("abs") => Ok(ThresholdMode::Abs),
        Some(m) => Err(Error::InvalidSchedulerKwarg {
            scheduler: scheduler.into(),
            kwarg: "threshold_mode".into(),
            reason: format!("threshold mode {m} is unknown!"),
        }),
    }
}

fn is_better(mode: PlateauMode, tmode: ThresholdMode, threshold: f64, a: f64, best: f64) -> bool {
    match (mode, tmode) {
        (PlateauMode::Min, ThresholdMode::Rel) => a < best * (1.0 - threshold),
        (PlateauMode::Min, ThresholdMode::Abs) => a < best - threshold,
        (PlateauMode::Max, ThresholdMode::Rel) => a > best * (threshold + 1.0),
        (PlateauMode::Max, ThresholdMode::Abs) => a > best + threshold,
    }
}

fn per_group(v: Option<Vec<f64>>, default: f64, n: usize, what: &'static str) -> Result<Vec<f64>> {
    match v {
        None => Ok(vec![default; n]),
        Some(v) if v.len() == 1 => Ok(vec![v[0]; n]),
        Some(v) if v.len() == n => Ok(v),
        Some(v) => Err(Error::GroupCountMismatch {
            what,
            expected: n,
            found: v.len(),
        }),
    }
}

fn worst(mode: PlateauMode) -> f64 {
    match mode {
        PlateauMode::Min => f64::INFINITY,
        PlateauMode::Max => f64::NEG_INFINITY,
    }
}

/// `torch.optim.lr_scheduler.ReduceLROnPlateau`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReduceLROnPlateau {
    /// Multiplier applied on a plateau (< 1).
    pub factor: f64,
    /// Lower bound of each group's lr.
    pub min_lrs: Vec<f64>,
    /// Epochs without improvement tolerated.
    pub patience: i64,
    /// Epochs to wait after a reduction.
    pub cooldown: i64,
    /// Remaining cooldown.
    pub cooldown_counter: i64,
    /// `min` or `max`.
    pub mode: PlateauMode,
    /// Improvement threshold.
    pub threshold: f64,
    /// `rel` or `abs`.
    pub threshold_mode: ThresholdMode,
    /// Best metric so far.
    #[serde(with = "json_f64")]
    pub best: f64,
    /// Epochs since the last improvement.
    pub num_bad_epochs: i64,
    /// Minimal lr change applied.
    pub eps: f64,
    /// Step counter.
    pub last_epoch: i64,
    /// The lrs after the last step.
    #[serde(rename = "_last_lr")]
    pub last_lr: Vec<f64>,
}

impl ReduceLROnPlateau {
    /// Builds it from `lr_scheduler_kwargs` (`mode`, `factor`, `patience`, `threshold`,
    /// `threshold_mode`, `cooldown`, `min_lr` (number or list), `eps`; torch's defaults).
    pub fn from_kwargs(optimizer: &dyn Optimizer, kwargs: &SchedulerKwargs) -> Result<Self> {
        let k = Kwargs::new(
            "reduce_lr_on_plateau",
            kwargs,
            &[
                "mode",
                "factor",
                "patience",
                "threshold",
                "threshold_mode",
                "cooldown",
                "min_lr",
                "eps",
            ],
        )?;
        let factor = k.f64("factor")?.unwrap_or(0.1);
        if factor >= 1.0 {
            return Err(Error::InvalidSchedulerKwarg {
                scheduler: "reduce_lr_on_plateau".into(),
                kwarg: "factor".into(),
                reason: "Factor should be < 1.0.".into(),
            });
        }
        let n = optimizer.param_groups().len();
        let mode = parse_mode("reduce_lr_on_plateau", &k, PlateauMode::Min)?;
        Ok(Self {
            factor,
            min_lrs: per_group(k.f64_or_list("min_lr")?, 0.0, n, "min_lr")?,
            patience: k.i64("patience")?.unwrap_or(10),
            cooldown: k.i64("cooldown")?.unwrap_or(0),
            cooldown_counter: 0,
            mode,
            threshold: k.f64("threshold")?.unwrap_or(1e-4),
            threshold_mode: parse_threshold_mode("reduce_lr_on_plateau", &k, ThresholdMode::Rel)?,
            best: worst(mode),
            num_bad_epochs: 0,
            eps: k.f64("eps")?.unwrap_or(1e-8),
            last_epoch: 0,
            last_lr: optimizer.lrs(),
        })
    }
}

impl LrScheduler for ReduceLROnPlateau {
    fn name(&self) -> &str {
        "reduce_lr_on_plateau"
    }

    fn step(&mut self, _optimizer: &mut dyn Optimizer) -> Result<()> {
        Err(Error::WrongStepKind {
            scheduler: "reduce_lr_on_plateau".into(),
            reason: "steps on a metric: call step_with_metric",
        })
    }

    fn step_with_metric(&mut self, optimizer: &mut dyn Optimizer, metric: f64) -> Result<()> {
        self.last_epoch += 1;
        if is_better(
            self.mode,
            self.threshold_mode,
            self.threshold,
            metric,
            self.best,
        ) {
            self.best = metric;
            self.num_bad_epochs = 0;
        } else {
            self.num_bad_epochs += 1;
        }
        if self.cooldown_counter > 0 {
            self.cooldown_counter -= 1;
            self.num_bad_epochs = 0;
        }
        if self.num_bad_epochs > self.patience {
            let groups = optimizer.param_groups_mut();
            if groups.len() != self.min_lrs.len() {
                return Err(Error::GroupCountMismatch {
                    what: "min_lrs",
                    expected: groups.len(),
                    found: self.min_lrs.len(),
                });
            }
            for (g, &min_lr) in groups.iter_mut().zip(&self.min_lrs) {
                let old = g.lr;
                let new = (old * self.factor).max(min_lr);
                if old - new > self.eps {
                    g.lr = new;
                }
            }
            self.cooldown_counter = self.cooldown;
            self.num_bad_epochs = 0;
        }
        self.last_lr = optimizer.lrs();
        Ok(())
    }

    fn steps_on_metric(&self) -> bool {
        true
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

    fn load_state_dict(&mut self, state: &serde_json::Value) -> Result<()> {
        *self =
            serde_json::from_value(state.clone()).map_err(|e| Error::SchedulerStateMismatch {
                detail: format!("not a ReduceLROnPlateau state: {e}"),
            })?;
        Ok(())
    }
}

/// Upstream `StreamingAverage`: the mean of the last `window_size` values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamingAverage {
    /// Window length.
    pub window_size: usize,
    /// The values in the window.
    pub values: Vec<f64>,
    /// Their running sum (updated incrementally, as upstream).
    pub sum: f64,
}

impl StreamingAverage {
    /// An empty window.
    pub fn new(window_size: usize) -> Self {
        Self {
            window_size,
            values: Vec::new(),
            sum: 0.0,
        }
    }

    /// Adds a value and returns the current average (`streamavg`).
    pub fn streamavg(&mut self, value: f64) -> f64 {
        self.values.push(value);
        self.sum += value;
        if self.values.len() > self.window_size {
            let removed = self.values.remove(0);
            self.sum -= removed;
        }
        self.sum / self.values.len() as f64
    }
}

/// Upstream `GreedyLR`: raises the lr (divides by `factor`) after `patience` improving
/// steps, lowers it (multiplies) after `patience` non-improving ones, and resets after
/// `reset_start` steps with every group at its minimum.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GreedyLR {
    /// Multiplier (< 1).
    pub factor: f64,
    /// Lower bounds.
    pub min_lrs: Vec<f64>,
    /// Upper bounds.
    pub max_lrs: Vec<f64>,
    /// Steps tolerated before acting.
    pub patience: i64,
    /// Print changes (kept for parity; nothing is printed).
    pub verbose: bool,
    /// Steps to wait after a reduction.
    pub cooldown: i64,
    /// Steps to wait after an increase.
    pub warmup: i64,
    /// Remaining cooldown.
    pub cooldown_counter: i64,
    /// Remaining warm-up.
    pub warmup_counter: i64,
    /// `min` or `max`.
    pub mode: PlateauMode,
    /// Improvement threshold.
    pub threshold: f64,
    /// `rel` or `abs`.
    pub threshold_mode: ThresholdMode,
    /// Best metric so far.
    #[serde(with = "json_f64")]
    pub best: f64,
    /// Consecutive non-improving steps.
    pub num_bad_epochs: i64,
    /// Consecutive improving steps.
    pub num_good_epochs: i64,
    /// Minimal lr change applied.
    pub eps: f64,
    /// Step counter.
    pub last_epoch: i64,
    /// Smooth metrics with a [`StreamingAverage`].
    pub smooth: bool,
    /// Window of the streaming average.
    pub window_size: usize,
    /// Steps at the minimum left before a reset.
    pub reset_start: i64,
    /// Configured `reset_start`.
    pub reset_start_original: i64,
    /// The lrs after the last step.
    #[serde(rename = "_last_lr")]
    pub last_lr: Vec<f64>,
    /// The lrs at construction (restored on reset).
    #[serde(rename = "_init_lrs")]
    pub init_lrs: Vec<f64>,
    /// The streaming average when `smooth`.
    #[serde(
        rename = "_streaming_avg",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub streaming_avg: Option<StreamingAverage>,
}

impl GreedyLR {
    /// Builds it from `lr_scheduler_kwargs` (upstream's names and defaults: `mode="min"`,
    /// `factor=0.95`, `patience=10`, `threshold=1e-6`, `threshold_mode="abs"`, `cooldown=0`,
    /// `warmup=0`, `min_lr=1e-3`, `max_lr=1.0`, `eps=1e-8`, `verbose`, `smooth=false`,
    /// `window_size=50`, `reset_start=500`).
    pub fn from_kwargs(optimizer: &dyn Optimizer, kwargs: &SchedulerKwargs) -> Result<Self> {
        let k = Kwargs::new(
            "greedy",
            kwargs,
            &[
                "mode",
                "factor",
                "patience",
                "threshold",
                "threshold_mode",
                "cooldown",
                "warmup",
                "min_lr",
                "max_lr",
                "eps",
                "verbose",
                "smooth",
                "window_size",
                "reset_start",
            ],
        )?;
        let factor = k.f64("factor")?.unwrap_or(0.95);
        if factor >= 1.0 {
            return Err(Error::InvalidSchedulerKwarg {
                scheduler: "greedy".into(),
                kwarg: "factor".into(),
                reason: "Factor should be < 1.0.".into(),
            });
        }
        let n = optimizer.param_groups().len();
        let mode = parse_mode("greedy", &k, PlateauMode::Min)?;
        let smooth = k.bool("smooth")?.unwrap_or(false);
        let window_size = k.i64("window_size")?.unwrap_or(50).max(0) as usize;
        let reset_start = k.i64("reset_start")?.unwrap_or(500);
        let init_lrs = optimizer.lrs();
        Ok(Self {
            factor,
            min_lrs: per_group(k.f64_or_list("min_lr")?, 1e-3, n, "min_lr")?,
            max_lrs: per_group(k.f64_or_list("max_lr")?, 1.0, n, "max_lr")?,
            patience: k.i64("patience")?.unwrap_or(10),
            verbose: k.bool("verbose")?.unwrap_or(false),
            cooldown: k.i64("cooldown")?.unwrap_or(0),
            warmup: k.i64("warmup")?.unwrap_or(0),
            cooldown_counter: 0,
            warmup_counter: 0,
            mode,
            threshold: k.f64("threshold")?.unwrap_or(1e-6),
            threshold_mode: parse_threshold_mode("greedy", &k, ThresholdMode::Abs)?,
            best: worst(mode),
            num_bad_epochs: 0,
            num_good_epochs: 0,
            eps: k.f64("eps")?.unwrap_or(1e-8),
            last_epoch: 0,
            smooth,
            window_size,
            reset_start,
            reset_start_original: reset_start,
            last_lr: init_lrs.clone(),
            init_lrs,
            streaming_avg: smooth.then(|| StreamingAverage::new(window_size)),
        })
    }

    fn reduce_lr(&mut self, optimizer: &mut dyn Optimizer) {
        let mut all_at_min = true;
        for (i, g) in optimizer.param_groups_mut().iter_mut().enumerate() {
            let min_lr = self.min_lrs[i];
            let old = g.lr;
            let new = (old * self.factor).max(min_lr);
            if old - new > self.eps {
                g.lr = new;
            }
            if g.lr > min_lr {
                all_at_min = false;
            }
        }
        if all_at_min {
            self.reset_start -= 1;
            if self.reset_start <= 0 {
                self.reset(optimizer);
            }
        }
    }

    fn increase_lr(&mut self, optimizer: &mut dyn Optimizer) {
        for (i, g) in optimizer.param_groups_mut().iter_mut().enumerate() {
            let old = g.lr;
            let new = (old / self.factor).min(self.max_lrs[i]);
            if new - old > self.eps {
                g.lr = new;
            }
        }
        self.reset_start = self.reset_start_original;
    }

    fn reset(&mut self, optimizer: &mut dyn Optimizer) {
        for (g, &lr) in optimizer.param_groups_mut().iter_mut().zip(&self.init_lrs) {
            g.lr = lr;
        }
        self.best = worst(self.mode);
        self.num_bad_epochs = 0;
        self.num_good_epochs = 0;
        self.cooldown_counter = 0;
        self.warmup_counter = 0;
        self.reset_start = self.reset_start_original;
        if self.smooth {
            self.streaming_avg = Some(StreamingAverage::new(self.window_size));
        }
    }
}

impl LrScheduler for GreedyLR {
    fn name(&self) -> &str {
        "greedy"
    }

    fn step(&mut self, _optimizer: &mut dyn Optimizer) -> Result<()> {
        Err(Error::WrongStepKind {
            scheduler: "greedy".into(),
            reason: "steps on a metric: call step_with_metric",
        })
    }

    fn step_with_metric(&mut self, optimizer: &mut dyn Optimizer, metric: f64) -> Result<()> {
        let n = optimizer.param_groups().len();
        for (what, len) in [
            ("min_lrs", self.min_lrs.len()),
            ("max_lrs", self.max_lrs.len()),
        ] {
            if len != n {
                return Err(Error::GroupCountMismatch {
                    what,
                    expected: n,
                    found: len,
                });
            }
        }
        let mut current = metric;
        if let (true, Some(avg)) = (self.smooth, self.streaming_avg.as_mut()) {
            current = avg.streamavg(current);
        }
        self.last_epoch += 1;
        if self.cooldown_counter > 0 {
            self.cooldown_counter -= 1;
            self.num_bad_epochs = 0;
            self.num_good_epochs = 0;
        } else if self.warmup_counter > 0 {
            self.warmup_counter -= 1;
            self.num_bad_epochs = 0;
            self.num_good_epochs = 0;
        } else {
            if is_better(
                self.mode,
                self.threshold_mode,
                self.threshold,
                current,
                self.best,
            ) {
                self.best = current;
                self.num_bad_epochs = 0;
                self.num_good_epochs += 1;
            } else {
                self.num_bad_epochs += 1;
                self.num_good_epochs = 0;
            }
            if self.num_good_epochs > self.patience {
                self.increase_lr(optimizer);
                self.warmup_counter = self.warmup;
                self.num_good_epochs = 0;
            } else if self.num_bad_epochs > self.patience {
                self.reduce_lr(optimizer);
                self.cooldown_counter = self.cooldown;
                self.num_bad_epochs = 0;
            }
        }
        self.last_lr = optimizer.lrs();
        Ok(())
    }

    fn steps_on_metric(&self) -> bool {
        true
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

    fn load_state_dict(&mut self, state: &serde_json::Value) -> Result<()> {
        *self =
            serde_json::from_value(state.clone()).map_err(|e| Error::SchedulerStateMismatch {
                detail: format!("not a GreedyLR state: {e}"),
            })?;
        Ok(())
    }
}

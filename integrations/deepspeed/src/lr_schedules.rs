//! DeepSpeed's learning-rate schedules (`deepspeed/runtime/lr_schedules.py`), built from a
//! config's `scheduler` section as DeepSpeed's engine builds them when the Trainer hands it
//! a `DummyScheduler` (upstream `deepspeed_optim_sched`): `WarmupLR`, `WarmupDecayLR` and
//! `WarmupCosineLR`. `OneCycle` (which also cycles the momentum) and `LRRangeTest` are
//! refused by name.
//!
//! Semantics as DeepSpeed's: at construction (`last_batch_iteration == -1`) the groups' lrs
//! become the schedule's value before it has started (`warmup_min_lr`, or 0 for the cosine
//! ratio), so the first optimizer step runs at it; each `step()` advances
//! `last_batch_iteration` and sets the lrs of that iteration. The state is
//! `{"last_batch_iteration": n}`, as DeepSpeed's `state_dict()`.

use serde_json::{Map, Value, json};
use tchtrain_optim::{LrScheduler, Optimizer};

use crate::{Error, Result};

/// DeepSpeed's `scheduler.type` values this crate builds.
pub const SCHEDULER_TYPES: [&str; 3] = ["WarmupLR", "WarmupDecayLR", "WarmupCosineLR"];

/// DeepSpeed's warm-up curves (`warmup_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmupType {
    /// `"log"` (DeepSpeed's default): `log(i + 1) / log(warmup_num_steps)`.
    Log,
    /// `"linear"`: `i / warmup_num_steps`.
    Linear,
}

/// What happens after the warm-up.
#[derive(Debug, Clone, PartialEq)]
enum Shape {
    /// `WarmupLR`: stays at `warmup_max_lr`.
    Constant,
    /// `WarmupDecayLR`: linear decay to 0 at `total_num_steps`.
    LinearDecay { total_num_steps: i64 },
    /// `WarmupCosineLR`: a ratio of each group's lr at construction, warming from
    /// `warmup_min_ratio` to 1 then cosine down to `cos_min_ratio`.
    Cosine {
        total_num_steps: i64,
        warmup_min_ratio: f64,
        cos_min_ratio: f64,
        org_lrs: Vec<f64>,
    },
}

/// One of DeepSpeed's warm-up schedules (see the module documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct DeepSpeedLR {
    name: &'static str,
    shape: Shape,
    min_lrs: Vec<f64>,
    delta_lrs: Vec<f64>,
    warmup_num_steps: i64,
    warmup_type: WarmupType,
    inverse_log_warm_up: f64,
    last_batch_iteration: i64,
    last_lr: Vec<f64>,
}

fn bad(key: &str, value: &Value, fix: &'static str) -> Error {
    Error::InvalidConfig {
        key: format!("scheduler.params.{key}"),
        value: value.to_string(),
        fix,
    }
}

/// DeepSpeed's `_format_param`: a list (one value per group) or one number for every group.
fn per_group(params: &Map<String, Value>, key: &str, groups: usize) -> Result<Option<Vec<f64>>> {
    let Some(v) = params.get(key) else {
        return Ok(None);
    };
    match v {
        Value::Number(n) => Ok(Some(vec![n.as_f64().unwrap_or(0.0); groups])),
        Value::Array(items) => {
            if items.len() != groups {
                return Err(bad(
                    key,
                    v,
                    "a list needs one value per optimizer parameter group",
                ));
            }
            items
                .iter()
                .map(|x| x.as_f64().ok_or_else(|| bad(key, v, "use numbers")))
                .collect::<Result<Vec<_>>>()
                .map(Some)
        }
        _ => Err(bad(key, v, "use a number or a list of numbers")),
    }
}

fn number(params: &Map<String, Value>, key: &str, default: f64) -> Result<f64> {
    match params.get(key) {
        None => Ok(default),
        Some(v) => v.as_f64().ok_or_else(|| bad(key, v, "use a number")),
    }
}

/// An integer parameter; DeepSpeed's `isinstance(x, int)` refuses `10.0`.
fn integer(params: &Map<String, Value>, key: &str, default: Option<i64>) -> Result<i64> {
    match params.get(key) {
        None => default.ok_or_else(|| bad(key, &Value::Null, "it is required for this scheduler")),
        Some(v) => v.as_i64().ok_or_else(|| bad(key, v, "use an integer")),
    }
}

fn warmup_steps(params: &Map<String, Value>) -> Result<i64> {
    let n = integer(params, "warmup_num_steps", Some(1000))?;
    if n <= 0 {
        // DeepSpeed's ValueError; with `"auto"` this is the Trainer's warmup (--warmup_steps).
        return Err(Error::InvalidConfig {
            key: "scheduler.params.warmup_num_steps".into(),
            value: n.to_string(),
            fix: "warmup_num_steps must be a positive integer (DeepSpeed's check); with \"auto\" it is the Trainer's warm-up: set --warmup_steps to at least 1",
        });
    }
    Ok(n)
}

fn warmup_type(params: &Map<String, Value>) -> Result<WarmupType> {
    match params.get("warmup_type") {
        None => Ok(WarmupType::Log),
        Some(Value::String(s)) if s == "log" => Ok(WarmupType::Log),
        Some(Value::String(s)) if s == "linear" => Ok(WarmupType::Linear),
        // DeepSpeed warns and falls back to "log"; a typo silently changing the curve is
        // refused here instead.
        Some(v) => Err(bad("warmup_type", v, "use \"log\" or \"linear\"")),
    }
}

impl DeepSpeedLR {
    /// The schedule of a config's `scheduler` section (`{"type": ..., "params": {...}}`)
    /// over `optimizer`, with the `"auto"` values already filled
    /// (`HfTrainerDeepSpeedConfig::trainer_config_finalize`). Sets the optimizer's lrs as
    /// DeepSpeed's constructor does.
    pub fn from_config(section: &Value, optimizer: &mut dyn Optimizer) -> Result<Self> {
        let kind = section.get("type").and_then(Value::as_str).unwrap_or("");
        let empty = Map::new();
        let params = section
            .get("params")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        // DeepSpeed calls `Scheduler(optimizer, **params)`: another key is a TypeError.
        let accepted: &[&str] = match kind {
            "WarmupLR" => &[
                "warmup_min_lr",
                "warmup_max_lr",
                "warmup_num_steps",
                "warmup_type",
                "last_batch_iteration",
            ],
            "WarmupDecayLR" => &[
                "total_num_steps",
                "warmup_min_lr",
                "warmup_max_lr",
                "warmup_num_steps",
                "warmup_type",
                "last_batch_iteration",
            ],
            "WarmupCosineLR" => &[
                "total_num_steps",
                "warmup_min_ratio",
                "warmup_num_steps",
                "cos_min_ratio",
                "warmup_type",
                "last_batch_iteration",
            ],
            _ => &[],
        };
        if let Some(key) = params
            .keys()
            .find(|k| !accepted.is_empty() && !accepted.contains(&k.as_str()))
        {
            return Err(Error::NotSupported {
                key: format!("scheduler.params.{key}"),
                why: format!(
                    "not a parameter of DeepSpeed's {kind} (it takes {}); DeepSpeed raises a TypeError: fix or remove it",
                    accepted.join(", ")
                ),
            });
        }
        let groups = optimizer.param_groups().len();
        let group_lrs = optimizer.lrs();
        let warmup_num_steps = warmup_steps(params)?.max(2);
        let warmup_type = warmup_type(params)?;
        let last_batch_iteration = integer(params, "last_batch_iteration", Some(-1))?;
        let (name, shape, min_lrs, max_lrs) = match kind {
            "WarmupLR" | "WarmupDecayLR" => {
                let min = per_group(params, "warmup_min_lr", groups)?.unwrap_or(vec![0.0; groups]);
                let max = match per_group(params, "warmup_max_lr", groups)? {
                    Some(m) => m,
                    // WarmupLR: the groups' lrs; WarmupDecayLR's signature default 0.001.
                    None if kind == "WarmupLR" => group_lrs.clone(),
                    None => vec![0.001; groups],
                };
                if kind == "WarmupLR" {
                    ("WarmupLR", Shape::Constant, min, max)
                } else {
                    let total_num_steps = integer(params, "total_num_steps", None)?;
                    (
                        "WarmupDecayLR",
                        Shape::LinearDecay { total_num_steps },
                        min,
                        max,
                    )
                }
            }
            "WarmupCosineLR" => {
                let total_num_steps = integer(params, "total_num_steps", None)?;
                let shape = Shape::Cosine {
                    total_num_steps,
                    warmup_min_ratio: number(params, "warmup_min_ratio", 0.0)?,
                    cos_min_ratio: number(params, "cos_min_ratio", 0.0001)?,
                    org_lrs: group_lrs.clone(),
                };
                (
                    "WarmupCosineLR",
                    shape,
                    vec![0.0; groups],
                    vec![0.0; groups],
                )
            }
            "OneCycle" | "LRRangeTest" => {
                return Err(Error::NotSupported {
                    key: "scheduler.type".into(),
                    why: format!(
                        "DeepSpeed's {kind} is not implemented here; use WarmupLR, WarmupDecayLR or WarmupCosineLR, or remove the `scheduler` section to use --lr_scheduler_type"
                    ),
                });
            }
            other => {
                return Err(Error::NotSupported {
                    key: "scheduler.type".into(),
                    why: format!(
                        "{other:?} is not a DeepSpeed scheduler this build has ({}); remove the `scheduler` section to use --lr_scheduler_type",
                        SCHEDULER_TYPES.join(", ")
                    ),
                });
            }
        };
        let delta_lrs = max_lrs.iter().zip(&min_lrs).map(|(b, s)| b - s).collect();
        let mut s = Self {
            name,
            shape,
            min_lrs,
            delta_lrs,
            warmup_num_steps,
            warmup_type,
            inverse_log_warm_up: 1.0 / (warmup_num_steps as f64).ln(),
            last_batch_iteration,
            last_lr: Vec::new(),
        };
        if last_batch_iteration == -1 {
            s.last_lr = s.get_lr();
            optimizer.set_lrs(&s.last_lr)?;
        }
        Ok(s)
    }

    /// The warm-up fraction at the current iteration (`None` once warm-up is over).
    fn warmup_gamma(&self) -> Option<f64> {
        let i = self.last_batch_iteration;
        (i < self.warmup_num_steps).then(|| match self.warmup_type {
            WarmupType::Log => self.inverse_log_warm_up * ((i + 1) as f64).ln(),
            WarmupType::Linear => i as f64 / self.warmup_num_steps as f64,
        })
    }

    /// DeepSpeed's `get_lr()` at `last_batch_iteration`.
    fn get_lr(&self) -> Vec<f64> {
        if let Shape::Cosine { org_lrs, .. } = &self.shape {
            if self.last_batch_iteration < 0 {
                return vec![0.0; org_lrs.len()];
            }
            let ratio = self.cosine_ratio();
            return org_lrs.iter().map(|lr| lr * ratio).collect();
        }
        if self.last_batch_iteration < 0 {
            return self.min_lrs.clone();
        }
        let gamma = match (&self.shape, self.warmup_gamma()) {
            (_, Some(g)) => g,
            (Shape::LinearDecay { total_num_steps }, None) => {
                let left = (total_num_steps - self.last_batch_iteration) as f64;
                let span = ((total_num_steps - self.warmup_num_steps) as f64).max(1.0);
                (left / span).max(0.0)
            }
            _ => 1.0,
        };
        self.min_lrs
            .iter()
            .zip(&self.delta_lrs)
            .map(|(min, delta)| min + delta * gamma)
            .collect()
    }

    /// `WarmupCosineLR.get_lr_ratio()`.
    fn cosine_ratio(&self) -> f64 {
        let Shape::Cosine {
            total_num_steps,
            warmup_min_ratio,
            cos_min_ratio,
            ..
        } = &self.shape
        else {
            return 1.0;
        };
        if let Some(g) = self.warmup_gamma() {
            return warmup_min_ratio + g * (1.0 - warmup_min_ratio);
        }
        let real_last_step = (self.last_batch_iteration - self.warmup_num_steps + 1) as f64;
        let real_total_steps = (total_num_steps - self.warmup_num_steps).max(1) as f64;
        let progress = (real_last_step / real_total_steps).min(1.0);
        let ratio = (1.0 + (std::f64::consts::PI * progress).cos()) / 2.0;
        (cos_min_ratio + (1.0 - cos_min_ratio) * ratio).max(0.0)
    }
}

impl LrScheduler for DeepSpeedLR {
    fn name(&self) -> &str {
        self.name
    }

    fn step(&mut self, optimizer: &mut dyn Optimizer) -> tchtrain_optim::Result<()> {
        self.last_batch_iteration += 1;
        self.last_lr = self.get_lr();
        optimizer.set_lrs(&self.last_lr)
    }

    fn get_last_lr(&self) -> &[f64] {
        &self.last_lr
    }

    fn last_epoch(&self) -> i64 {
        self.last_batch_iteration
    }

    fn state_dict(&self) -> Value {
        json!({"last_batch_iteration": self.last_batch_iteration})
    }

    /// DeepSpeed's `load_state_dict`: the iteration only (the lrs come back with the
    /// optimizer's state).
    fn load_state_dict(&mut self, state: &Value) -> tchtrain_optim::Result<()> {
        let n = state
            .get("last_batch_iteration")
            .and_then(Value::as_i64)
            .ok_or_else(|| tchtrain_optim::Error::SchedulerStateMismatch {
                detail: format!("not a DeepSpeed {} state: {state}", self.name),
            })?;
        self.last_batch_iteration = n;
        self.last_lr = self.get_lr();
        Ok(())
    }
}

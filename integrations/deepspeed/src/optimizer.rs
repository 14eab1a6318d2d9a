//! The optimizer of a config's `optimizer` section, as DeepSpeed's engine builds it when the
//! Trainer hands it a `DummyOptim` (upstream `deepspeed_optim_sched`; DeepSpeed's
//! `_configure_basic_optimizer`): `Adam` / `AdamW` over **one** group holding every trainable
//! parameter (upstream's `model_parameters`, so `weight_decay` applies to biases and norms
//! too, unlike the Trainer's own optimizer), with the section's `lr`, `betas`, `eps` and
//! `weight_decay`. `adam_w_mode` (default true; forced for `AdamW`) picks decoupled decay,
//! else the L2 penalty of `torch.optim.Adam`.
//!
//! DeepSpeed runs these as its fused CUDA kernel (`FusedAdam`) or its CPU kernel
//! (`DeepSpeedCPUAdam`, with offload), or `torch.optim.AdamW` / `Adam` with `torch_adam`:
//! the same update as torch's, to the rounding of the kernel. Here they are torch's
//! (`tchtrain-optim`'s `AdamW` / `Adam`, bit-equal to torch's). Other types (`Lamb`,
//! `OneBitAdam`, `Lion`, ...) are refused by name.

use serde_json::{Map, Value};
use tch::Tensor;
use tchtrain_optim::{Adam, AdamConfig, AdamW, AdamWConfig, GroupSpec, Optimizer};

use crate::{Error, Result};

/// The optimizer a config's `optimizer` section asks for (after `"auto"` filling).
#[derive(Debug, Clone, PartialEq)]
pub struct DeepSpeedOptimizer {
    /// `params.lr` (DeepSpeed's default 1e-3).
    pub lr: f64,
    /// `params.betas` (default (0.9, 0.999)).
    pub betas: (f64, f64),
    /// `params.eps` (default 1e-8).
    pub eps: f64,
    /// `params.weight_decay` (default 0).
    pub weight_decay: f64,
    /// Decoupled weight decay (AdamW) rather than an L2 penalty (Adam).
    pub adam_w_mode: bool,
}

fn refuse(key: &str, why: impl Into<String>) -> Error {
    Error::NotSupported {
        key: key.to_string(),
        why: why.into(),
    }
}

/// `optimizer.params.<key>` read with `read` (`None` for a wrong type), or `default`.
fn param<T>(
    params: &Map<String, Value>,
    key: &str,
    default: T,
    read: impl Fn(&Value) -> Option<T>,
    fix: &'static str,
) -> Result<T> {
    match params.get(key) {
        None => Ok(default),
        Some(v) => read(v).ok_or_else(|| Error::InvalidConfig {
            key: format!("optimizer.params.{key}"),
            value: v.to_string(),
            fix,
        }),
    }
}

fn number(params: &Map<String, Value>, key: &str, default: f64) -> Result<f64> {
    param(params, key, default, Value::as_f64, "use a number")
}

fn flag(params: &Map<String, Value>, key: &str, default: bool) -> Result<bool> {
    param(params, key, default, Value::as_bool, "use true or false")
}

impl DeepSpeedOptimizer {
    /// Reads an `optimizer` section (`{"type": ..., "params": {...}}`).
    pub fn from_config(section: &Value) -> Result<Self> {
        let kind = section.get("type").and_then(Value::as_str).unwrap_or("");
        // DeepSpeed compares the lower-cased name.
        let adamw = match kind.to_lowercase().as_str() {
            "adamw" => true,
            "adam" => false,
            _ => {
                return Err(refuse(
                    "optimizer.type",
                    format!(
                        "DeepSpeed's {kind:?} optimizer is not implemented here (Adam and AdamW are); use \"AdamW\", or remove the `optimizer` section to use the Trainer's --optim"
                    ),
                ));
            }
        };
        let empty = Map::new();
        let params = section
            .get("params")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        for key in params.keys() {
            if !matches!(
                key.as_str(),
                "lr" | "betas"
                    | "eps"
                    | "weight_decay"
                    | "adam_w_mode"
                    | "torch_adam"
                    | "bias_correction"
                    | "amsgrad"
            ) {
                return Err(refuse(
                    &format!("optimizer.params.{key}"),
                    "not a parameter of DeepSpeed's Adam this build implements (lr, betas, eps, weight_decay, adam_w_mode, torch_adam, bias_correction, amsgrad); remove it",
                ));
            }
        }
        if !flag(params, "bias_correction", true)? {
            return Err(refuse(
                "optimizer.params.bias_correction",
                "Adam without bias correction is not implemented; remove the key",
            ));
        }
        if flag(params, "amsgrad", false)? {
            return Err(refuse(
                "optimizer.params.amsgrad",
                "DeepSpeed's fused and CPU Adam kernels have no AMSGrad; remove the key",
            ));
        }
        // `torch_adam` only picks torch's implementation, which is the one used here.
        flag(params, "torch_adam", false)?;
        let betas = match params.get("betas") {
            None => (0.9, 0.999),
            Some(v) => match v
                .as_array()
                .map(|a| a.iter().map(Value::as_f64).collect::<Vec<_>>())
            {
                Some(b) if b.len() == 2 && b.iter().all(Option::is_some) => {
                    (b[0].unwrap_or_default(), b[1].unwrap_or_default())
                }
                _ => {
                    return Err(Error::InvalidConfig {
                        key: "optimizer.params.betas".into(),
                        value: v.to_string(),
                        fix: "use two numbers, e.g. [0.9, 0.999]",
                    });
                }
            },
        };
        Ok(Self {
            lr: number(params, "lr", 1e-3)?,
            betas,
            eps: number(params, "eps", 1e-8)?,
            weight_decay: number(params, "weight_decay", 0.0)?,
            // DeepSpeed: `adam_w_mode` defaults to true and AdamW forces it.
            adam_w_mode: adamw || flag(params, "adam_w_mode", true)?,
        })
    }

    /// The one group DeepSpeed's optimizer gets: every trainable parameter, at the section's
    /// `weight_decay`.
    pub fn param_groups(&self, params: Vec<(String, Tensor)>) -> Vec<GroupSpec> {
        vec![GroupSpec::new(params)]
    }

    /// The optimizer over `groups` ([`Self::param_groups`], or the ZeRO engine's shards of
    /// them).
    pub fn build(&self, groups: Vec<GroupSpec>) -> Result<Box<dyn Optimizer>> {
        Ok(if self.adam_w_mode {
            Box::new(AdamW::new(
                groups,
                AdamWConfig {
                    lr: self.lr,
                    betas: self.betas,
                    eps: self.eps,
                    weight_decay: self.weight_decay,
                    ..Default::default()
                },
            )?)
        } else {
            Box::new(Adam::new(
                groups,
                AdamConfig {
                    lr: self.lr,
                    betas: self.betas,
                    eps: self.eps,
                    weight_decay: self.weight_decay,
                    ..Default::default()
                },
            )?)
        })
    }
}

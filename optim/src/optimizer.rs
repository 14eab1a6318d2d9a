//! The [`Optimizer`] trait, [`ParamGroup`]s, per-parameter [`ParamState`] and the exportable
//! [`OptimizerStateDict`] (safetensors for tensors, JSON for everything else).
//!
//! Layout mirrors torch.optim's `state_dict()`: parameters are numbered in group order
//! (0, 1, ... across groups), `param_groups` hold the hyper-parameters and the indices (plus
//! the names, as torch >= 2.5 `param_names`), and `state[i]` holds the entries of parameter i
//! (`step`, `exp_avg`, ...). Tensors go to `optimizer.safetensors` under `state.{i}.{key}`,
//! the rest to `optimizer.json`.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::{Error, Result};

/// File holding the optimizer's state tensors in a checkpoint folder.
pub const OPTIMIZER_TENSORS_NAME: &str = "optimizer.safetensors";
/// File holding the optimizer's hyper-parameters, step counts and group layout.
pub const OPTIMIZER_STATE_NAME: &str = "optimizer.json";

/// Parameters given to an optimizer constructor, with optional per-group `lr` and
/// `weight_decay` (the optimizer's defaults apply where `None`), like a torch param-group dict.
#[derive(Debug)]
pub struct GroupSpec {
    /// `(name, tensor)` pairs; the tensors share storage with the model's variables
    /// (e.g. from `VarStore::variables()`).
    pub params: Vec<(String, Tensor)>,
    /// Learning rate of this group, or the optimizer's default.
    pub lr: Option<f64>,
    /// Weight decay of this group, or the optimizer's default.
    pub weight_decay: Option<f64>,
}

impl GroupSpec {
    /// A group with the optimizer's default hyper-parameters.
    pub fn new(params: Vec<(String, Tensor)>) -> Self {
        Self {
            params,
            lr: None,
            weight_decay: None,
        }
    }

    /// Unnamed parameters (named `"0"`, `"1"`, ... in the state dict).
    pub fn unnamed(params: Vec<Tensor>) -> Self {
        Self::new(
            params
                .into_iter()
                .enumerate()
                .map(|(i, t)| (i.to_string(), t))
                .collect(),
        )
    }

    /// Sets this group's learning rate.
    pub fn with_lr(mut self, lr: f64) -> Self {
        self.lr = Some(lr);
        self
    }

    /// Sets this group's weight decay.
    pub fn with_weight_decay(mut self, weight_decay: f64) -> Self {
        self.weight_decay = Some(weight_decay);
        self
    }
}

impl From<Vec<(String, Tensor)>> for GroupSpec {
    fn from(params: Vec<(String, Tensor)>) -> Self {
        Self::new(params)
    }
}

/// One param group of a live optimizer (torch's `optimizer.param_groups[i]`).
#[derive(Debug)]
pub struct ParamGroup {
    /// The parameters (sharing storage with the model).
    pub params: Vec<Tensor>,
    /// Their names, in the same order.
    pub param_names: Vec<String>,
    /// Current learning rate (schedulers write it).
    pub lr: f64,
    /// Weight decay.
    pub weight_decay: f64,
    /// `initial_lr`, set by the first scheduler attached (torch's `group["initial_lr"]`).
    pub initial_lr: Option<f64>,
}

impl ParamGroup {
    /// Resolves a [`GroupSpec`] against the optimizer defaults, checking the values.
    pub(crate) fn from_spec(spec: GroupSpec, lr: f64, weight_decay: f64) -> Result<Self> {
        let lr = spec.lr.unwrap_or(lr);
        let weight_decay = spec.weight_decay.unwrap_or(weight_decay);
        check_non_negative("lr", lr)?;
        check_non_negative("weight_decay", weight_decay)?;
        let (param_names, params) = spec.params.into_iter().unzip();
        Ok(Self {
            params,
            param_names,
            lr,
            weight_decay,
            initial_lr: None,
        })
    }
}

/// Returns an [`Error::InvalidHyperparameter`] unless `0 <= value` (nan fails too).
pub(crate) fn check_non_negative(name: &'static str, value: f64) -> Result<()> {
    if value >= 0.0 {
        Ok(())
    } else {
        Err(Error::InvalidHyperparameter {
            name,
            value,
            expected: ">= 0",
        })
    }
}

/// Returns an [`Error::InvalidHyperparameter`] unless `0 <= value < 1`.
pub(crate) fn check_unit(name: &'static str, value: f64) -> Result<()> {
    if (0.0..1.0).contains(&value) {
        Ok(())
    } else {
        Err(Error::InvalidHyperparameter {
            name,
            value,
            expected: "in [0, 1)",
        })
    }
}

/// State of one parameter (torch's `optimizer.state[p]`): a step count, tensors and scalars.
#[derive(Debug, Default)]
pub struct ParamState {
    /// Number of steps taken (`state["step"]`; torch keeps it as a float tensor).
    pub step: u64,
    /// Tensor entries by upstream name (`exp_avg`, `exp_avg_sq`, `momentum_buffer`, ...).
    pub tensors: BTreeMap<String, Tensor>,
    /// Scalar entries by upstream name (Adafactor's `RMS`).
    pub scalars: BTreeMap<String, f64>,
}

impl ParamState {
    /// The tensor `key`, or [`Error::MissingState`] for parameter `param`.
    pub fn tensor(&self, param: usize, key: &str) -> Result<&Tensor> {
        self.tensors.get(key).ok_or_else(|| Error::MissingState {
            param,
            key: key.to_string(),
        })
    }

    /// A handle on the tensor `key` (shares storage: in-place updates reach the state).
    pub(crate) fn handle(&self, param: usize, key: &str) -> Result<Tensor> {
        Ok(self.tensor(param, key)?.shallow_clone())
    }
}

/// JSON part of one param group in a state dict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParamGroupState {
    /// Learning rate.
    pub lr: f64,
    /// Weight decay.
    pub weight_decay: f64,
    /// `initial_lr` if a scheduler set it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_lr: Option<f64>,
    /// Flat indices of the group's parameters.
    pub params: Vec<usize>,
    /// Names of the group's parameters.
    pub param_names: Vec<String>,
}

/// JSON part of one parameter's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParamStateMeta {
    /// `state["step"]`.
    pub step: u64,
    /// Names of the tensor entries (stored in safetensors as `state.{i}.{name}`).
    pub tensors: Vec<String>,
    /// Scalar entries.
    #[serde(default)]
    pub scalars: BTreeMap<String, f64>,
}

/// The JSON file of an optimizer state dict (`optimizer.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptimizerStateMeta {
    /// Optimizer name (`adamw`, `sgd`, ...).
    pub optimizer: String,
    /// Optimizer-wide hyper-parameters (betas, eps, momentum, ...).
    pub defaults: serde_json::Value,
    /// Param-group layout and per-group values.
    pub param_groups: Vec<ParamGroupState>,
    /// Per-parameter state, keyed by flat index (torch's `state` dict keys).
    pub state: BTreeMap<usize, ParamStateMeta>,
}

/// A full optimizer state: [`OptimizerStateMeta`] plus the state tensors (torch's
/// `optimizer.state_dict()`).
#[derive(Debug)]
pub struct OptimizerStateDict {
    /// JSON part.
    pub meta: OptimizerStateMeta,
    /// Tensors, named `state.{i}.{key}`.
    pub tensors: BTreeMap<String, Tensor>,
}

impl OptimizerStateDict {
    /// Writes `optimizer.safetensors` and `optimizer.json` into `dir` (created if missing).
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            path: dir.into(),
            source,
        })?;
        let tensors: Vec<(&str, Tensor)> = self
            .tensors
            .iter()
            .map(|(k, t)| Ok((k.as_str(), t.f_to_device(tch::Device::Cpu)?.f_contiguous()?)))
            .collect::<Result<_>>()?;
        Tensor::write_safetensors(&tensors, dir.join(OPTIMIZER_TENSORS_NAME))?;
        let path = dir.join(OPTIMIZER_STATE_NAME);
        let json = serde_json::to_string_pretty(&self.meta).map_err(|source| Error::Json {
            path: path.clone(),
            source,
        })?;
        std::fs::write(&path, json).map_err(|source| Error::Io { path, source })
    }

    /// Reads a state dict written by [`OptimizerStateDict::save`].
    pub fn load(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let path = dir.join(OPTIMIZER_STATE_NAME);
        let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        let meta = serde_json::from_str(&text).map_err(|source| Error::Json { path, source })?;
        let tensors = Tensor::read_safetensors(dir.join(OPTIMIZER_TENSORS_NAME))?
            .into_iter()
            .collect();
        Ok(Self { meta, tensors })
    }
}

/// An optimizer over `tch::Tensor`s whose whole state can be exported and restored.
///
/// Implementors provide the update ([`Optimizer::step`]) and access to their groups, state and
/// hyper-parameters; `state_dict` / `load_state_dict` / `save` / `load` come for free.
pub trait Optimizer {
    /// Upstream-style name (`adamw`, `adam`, `sgd`, `adagrad`, `rmsprop`, `adafactor`, `lion`).
    fn name(&self) -> &'static str;

    /// Performs one update with the parameters' current `.grad()` (parameters without a
    /// gradient are skipped), under `no_grad`.
    fn step(&mut self) -> Result<()>;

    /// torch's `_step_supports_amp_scaling` (the fused Adam, AdamW and SGD kernels): a
    /// `GradScaler` hands such an optimizer its inf check and the kernel skips the update
    /// itself, so the step counts as taken (accelerate then steps the LR scheduler even when
    /// the update was skipped). Default `false`.
    fn step_supports_amp_scaling(&self) -> bool {
        false
    }

    /// `optimizer.train()`: schedule-free optimizers move the parameters to the point the
    /// gradient is taken at (upstream's Trainer calls it in every `training_step`). A no-op
    /// for the others, as upstream's `hasattr(optimizer, "train")` finds none there.
    fn train(&mut self) -> Result<()> {
        Ok(())
    }

    /// `optimizer.eval()`: schedule-free optimizers move the parameters to the averaged
    /// point (upstream's Trainer calls it at the start of `evaluation_loop`). A no-op for the
    /// others.
    fn eval(&mut self) -> Result<()> {
        Ok(())
    }

    /// Whether the optimizer takes its update inside the backward pass (LOMO, AdaLomo): the
    /// training step then calls [`Optimizer::fused_backward`] instead of `loss.backward()`,
    /// and `step()` does nothing (upstream's Trainer passes `learning_rate` to
    /// `accelerator.backward` for these).
    fn fuses_backward(&self) -> bool {
        false
    }

    /// LOMO's `fused_backward(loss, lr)`: the backward of `loss` with each parameter updated
    /// from its gradient at learning rate `lr`, the gradients dropped. Only for optimizers
    /// whose [`Optimizer::fuses_backward`] is true.
    fn fused_backward(&mut self, _loss: &Tensor, _lr: f64) -> Result<()> {
        Err(Error::FusedBackward {
            optimizer: self.name(),
            detail: "this optimizer does not fuse its update into the backward pass; call \
                     `backward()` and `step()`"
                .into(),
        })
    }

    /// The param groups.
    fn param_groups(&self) -> &[ParamGroup];

    /// The param groups, mutable (schedulers set `lr`).
    fn param_groups_mut(&mut self) -> &mut [ParamGroup];

    /// Per-parameter state by flat index (`None`: not initialised yet).
    fn state(&self) -> &[Option<ParamState>];

    /// Mutable per-parameter state.
    fn state_mut(&mut self) -> &mut Vec<Option<ParamState>>;

    /// The optimizer's default learning rate (torch's `optimizer.defaults["lr"]`).
    fn default_lr(&self) -> f64;

    /// Optimizer-wide hyper-parameters as JSON.
    fn hyperparameters(&self) -> serde_json::Value;

    /// Restores optimizer-wide hyper-parameters from [`Optimizer::hyperparameters`]' JSON.
    fn set_hyperparameters(&mut self, value: &serde_json::Value) -> Result<()>;

    /// Checks a loaded state entry for parameter `index` (required keys, shapes).
    fn validate_state(&self, index: usize, param: &Tensor, state: &ParamState) -> Result<()>;

    /// Whether the state entry `key` keeps its saved dtype on load. torch casts floating
    /// state to the parameter's dtype (the default, `false`); bitsandbytes keeps its
    /// `non_castable_tensor_keys` and torchao its float32 scales as they are.
    fn keeps_state_dtype(&self, _key: &str) -> bool {
        false
    }

    /// Clears the gradients of all parameters: torch's `zero_grad()` with its default
    /// `set_to_none=True` (`p.grad = None`), so the gradient memory is freed and the next
    /// backward writes a fresh gradient instead of adding into a buffer of zeros.
    fn zero_grad(&mut self) {
        for group in self.param_groups_mut() {
            for p in &mut group.params {
                // Removing a gradient cannot fail on a parameter; zeroing is the fallback.
                if crate::grad::set_grad(p, None).is_err() {
                    p.zero_grad();
                }
            }
        }
    }

    /// Current learning rate of every group.
    fn lrs(&self) -> Vec<f64> {
        self.param_groups().iter().map(|g| g.lr).collect()
    }

    /// Sets the learning rate of every group (one value per group).
    fn set_lrs(&mut self, lrs: &[f64]) -> Result<()> {
        let groups = self.param_groups_mut();
        if groups.len() != lrs.len() {
            return Err(Error::GroupCountMismatch {
                what: "learning rates",
                expected: groups.len(),
                found: lrs.len(),
            });
        }
        for (g, &lr) in groups.iter_mut().zip(lrs) {
            g.lr = lr;
        }
        Ok(())
    }

    /// Number of parameters over all groups.
    fn num_params(&self) -> usize {
        self.param_groups().iter().map(|g| g.params.len()).sum()
    }

    /// Exports the state (deep copies of the state tensors).
    fn state_dict(&self) -> Result<OptimizerStateDict> {
        let mut param_groups = Vec::new();
        let mut index = 0;
        for g in self.param_groups() {
            let n = g.params.len();
            param_groups.push(ParamGroupState {
                lr: g.lr,
                weight_decay: g.weight_decay,
                initial_lr: g.initial_lr,
                params: (index..index + n).collect(),
                param_names: g.param_names.clone(),
            });
            index += n;
        }
        let mut state = BTreeMap::new();
        let mut tensors = BTreeMap::new();
        for (i, st) in self.state().iter().enumerate() {
            let Some(st) = st else { continue };
            for (k, t) in &st.tensors {
                tensors.insert(format!("state.{i}.{k}"), deep_copy(t)?);
            }
            state.insert(
                i,
                ParamStateMeta {
                    step: st.step,
                    tensors: st.tensors.keys().cloned().collect(),
                    scalars: st.scalars.clone(),
                },
            );
        }
        let meta = OptimizerStateMeta {
            optimizer: self.name().to_string(),
            defaults: self.hyperparameters(),
            param_groups,
            state,
        };
        Ok(OptimizerStateDict { meta, tensors })
    }

    /// Restores a state exported by [`Optimizer::state_dict`] (same optimizer, same group
    /// layout): hyper-parameters, per-group lr / weight decay / initial_lr, and every
    /// parameter's state, cast to the parameter's dtype and device as torch does.
    fn load_state_dict(&mut self, sd: &OptimizerStateDict) -> Result<()> {
        let meta = &sd.meta;
        if meta.optimizer != self.name() {
            return Err(Error::OptimizerMismatch {
                expected: self.name().into(),
                found: meta.optimizer.clone(),
            });
        }
        check_layout(self.param_groups(), &meta.param_groups)?;
        let params: Vec<Tensor> = self
            .param_groups()
            .iter()
            .flat_map(|g| g.params.iter().map(Tensor::shallow_clone))
            .collect();
        let mut new_state: Vec<Option<ParamState>> = (0..params.len()).map(|_| None).collect();
        for (&i, m) in &meta.state {
            let param = params.get(i).ok_or_else(|| Error::GroupLayoutMismatch {
                detail: format!(
                    "state for parameter {i}, but there are {} parameters",
                    params.len()
                ),
            })?;
            let mut st = ParamState {
                step: m.step,
                scalars: m.scalars.clone(),
                ..Default::default()
            };
            for key in &m.tensors {
                let name = format!("state.{i}.{key}");
                let t = sd.tensors.get(&name).ok_or_else(|| Error::MissingState {
                    param: i,
                    key: key.clone(),
                })?;
                let t = if t.is_floating_point()
                    && param.is_floating_point()
                    && !self.keeps_state_dtype(key)
                {
                    t.f_to_kind(param.kind())?
                } else {
                    t.shallow_clone()
                };
                let t = deep_copy(&t.f_to_device(param.device())?)?;
                st.tensors.insert(key.clone(), t);
            }
            self.validate_state(i, param, &st)?;
            new_state[i] = Some(st);
        }
        self.set_hyperparameters(&meta.defaults)?;
        for (g, s) in self.param_groups_mut().iter_mut().zip(&meta.param_groups) {
            g.lr = s.lr;
            g.weight_decay = s.weight_decay;
            g.initial_lr = s.initial_lr;
        }
        *self.state_mut() = new_state;
        Ok(())
    }

    /// [`Optimizer::state_dict`] written to `dir` (`optimizer.safetensors` + `optimizer.json`).
    fn save(&self, dir: &Path) -> Result<()> {
        self.state_dict()?.save(dir)
    }

    /// [`Optimizer::load_state_dict`] from files written by [`Optimizer::save`].
    fn load(&mut self, dir: &Path) -> Result<()> {
        let sd = OptimizerStateDict::load(dir)?;
        self.load_state_dict(&sd)
    }
}

fn check_layout(groups: &[ParamGroup], saved: &[ParamGroupState]) -> Result<()> {
    if groups.len() != saved.len() {
        return Err(Error::GroupLayoutMismatch {
            detail: format!(
                "{} param groups here, {} in the state dict",
                groups.len(),
                saved.len()
            ),
        });
    }
    for (gi, (g, s)) in groups.iter().zip(saved).enumerate() {
        if g.params.len() != s.params.len() {
            return Err(Error::GroupLayoutMismatch {
                detail: format!(
                    "group {gi} has {} parameters here, {} in the state dict",
                    g.params.len(),
                    s.params.len()
                ),
            });
        }
        if !s.param_names.is_empty() && s.param_names != g.param_names {
            return Err(Error::GroupLayoutMismatch {
                detail: format!(
                    "group {gi} parameter names differ: {:?} here, {:?} in the state dict",
                    g.param_names, s.param_names
                ),
            });
        }
    }
    Ok(())
}

/// Checks that state `key` of parameter `index` exists and has `expected` shape.
pub(crate) fn expect_shape(
    index: usize,
    state: &ParamState,
    key: &str,
    expected: &[i64],
) -> Result<()> {
    let t = state.tensor(index, key)?;
    let found = t.size();
    if found != expected {
        return Err(Error::ShapeMismatch {
            param: index,
            key: key.to_string(),
            expected: expected.to_vec(),
            found,
        });
    }
    Ok(())
}

/// The gradient of `p` if it has one (tch returns an undefined tensor otherwise).
pub(crate) fn grad_of(p: &Tensor) -> Option<Tensor> {
    let g = p.grad();
    g.defined().then_some(g)
}

/// A detached copy of `t` with its own storage (`t.detach().clone()`).
pub(crate) fn deep_copy(t: &Tensor) -> Result<Tensor> {
    let mut out = t.f_empty_like()?;
    out.f_copy_(&t.f_detach()?)?;
    Ok(out)
}

/// Whether `kind` is a reduced-precision float (fp16 / bf16).
pub(crate) fn is_reduced(kind: Kind) -> bool {
    matches!(kind, Kind::Half | Kind::BFloat16)
}

/// Parses hyper-parameters JSON into a config type.
pub(crate) fn parse_hyper<T: serde::de::DeserializeOwned>(value: &serde_json::Value) -> Result<T> {
    serde_json::from_value(value.clone()).map_err(|source| Error::Json {
        path: Default::default(),
        source,
    })
}

/// Implements the accessor methods of [`Optimizer`] for a struct with fields
/// `config` (with an `lr` field and `Serialize`/`Deserialize`), `groups` and `state`.
macro_rules! optimizer_accessors {
    () => {
        fn param_groups(&self) -> &[$crate::ParamGroup] {
            &self.groups
        }
        fn param_groups_mut(&mut self) -> &mut [$crate::ParamGroup] {
            &mut self.groups
        }
        fn state(&self) -> &[Option<$crate::ParamState>] {
            &self.state
        }
        fn state_mut(&mut self) -> &mut Vec<Option<$crate::ParamState>> {
            &mut self.state
        }
        fn hyperparameters(&self) -> serde_json::Value {
            serde_json::to_value(&self.config).unwrap_or(serde_json::Value::Null)
        }
        fn set_hyperparameters(&mut self, value: &serde_json::Value) -> $crate::Result<()> {
            self.config = $crate::optimizer::parse_hyper(value)?;
            Ok(())
        }
    };
}
pub(crate) use optimizer_accessors;

/// Builds the groups of a new optimizer and an empty state vector.
pub(crate) fn build_groups(
    specs: Vec<GroupSpec>,
    lr: f64,
    weight_decay: f64,
) -> Result<(Vec<ParamGroup>, Vec<Option<ParamState>>)> {
    let groups = specs
        .into_iter()
        .map(|s| ParamGroup::from_spec(s, lr, weight_decay))
        .collect::<Result<Vec<_>>>()?;
    let n = groups.iter().map(|g| g.params.len()).sum();
    Ok((groups, (0..n).map(|_| None).collect()))
}

//! Layer-wise optimizers: one inner optimizer per parameter, each stepped from its
//! parameter's gradient during the backward pass and the gradient dropped at once. Upstream's
//! `galore_adamw_layerwise`, `galore_adamw_8bit_layerwise` and `apollo_adamw_layerwise`
//! (transformers'
//! `_setup_low_rank_optimizer` with `LayerWiseDummyOptimizer` / `LayerWiseDummyScheduler`).
//!
//! Upstream builds `optimizer_cls([{"params": [param]}], lr=...)` for every parameter outside
//! the targets and `optimizer_cls([{"params": [param], **low_rank_kwargs}], lr=...)` for every
//! target, registers a post-accumulate-grad hook on each parameter that steps its optimizer
//! and clears its gradient, and hands the Trainer a dummy optimizer whose `step()` and
//! `zero_grad()` do nothing. `get_scheduler` then builds one scheduler per inner optimizer and
//! steps it from a second hook, after the parameter's update. So in each training step every
//! parameter is updated once from its full gradient at the current scheduled learning rate,
//! the Trainer's gradient clipping finds no gradient (its `grad_norm` is 0) and clips nothing,
//! and every per-parameter scheduler moves on by one step, as one scheduler stepped after the
//! optimizer would. Gradient accumulation and DDP are refused, as upstream raises.
//!
//! Here [`LayerWise`] holds the inner optimizers and [`Optimizer::fuses_backward`] is true:
//! the Trainer calls [`Optimizer::fused_backward`] with its scheduler's current rate instead
//! of `loss.backward()`; it runs the backward, then steps each inner optimizer at that rate
//! and clears its parameter's gradient, in parameter order. As no update feeds another
//! parameter's gradient, the numbers are the hooks'; the peak memory is not: every gradient
//! exists at the end of the backward here, as in plain training. The Trainer's one scheduler
//! drives the rate of every inner optimizer (upstream's per-parameter schedulers all compute
//! the same rate). `step()` does nothing, as the dummy's.
//!
//! Deliberate differences from upstream:
//! - the state dict holds every inner optimizer's state (flat parameter index as the
//!   non-layer-wise optimizer's, the inner optimizers' hyper-parameters as a list), so a
//!   checkpoint resumes exactly. Upstream saves only the dummy optimizer and scheduler: a
//!   resumed run restarts every moment, projection and per-parameter schedule from scratch;
//! - upstream skips both hooks of a parameter that gets no gradient in a step, so that
//!   parameter's scheduler falls behind the others; here every parameter takes the Trainer's
//!   current rate.

use tch::Tensor;

use crate::optimizer::grad_of;
use crate::{
    ApolloAdamW, ApolloAdamWConfig, Error, GaLoreAdamW, GaLoreAdamW8bit, GaLoreAdamW8bitConfig,
    GaLoreAdamWConfig, GroupSpec, Optimizer, OptimizerArgs, ParamGroup, ParamState, Result,
};

/// Runs one inner optimizer per parameter inside [`Optimizer::fused_backward`] (upstream's
/// layer-wise optimizers; see the module documentation).
///
/// ```
/// use tch::{nn, Device, Kind};
/// use tchtrain_optim::{GroupSpec, LayerWise, Optimizer, Sgd, SgdConfig};
///
/// let vs = nn::VarStore::new(Device::Cpu);
/// let w = vs.root().ones("w", &[3]);
/// let b = vs.root().zeros("b", &[1]);
/// let groups = vec![GroupSpec::new(vec![("w".into(), w.shallow_clone()), ("b".into(), b.shallow_clone())])];
/// let mut opt = LayerWise::new("sgd_layerwise", groups, 0.1, |_group, param| {
///     let inner = Sgd::new(vec![GroupSpec::new(vec![param])], SgdConfig { lr: 0.1, ..Default::default() })?;
///     Ok(Box::new(inner) as Box<dyn Optimizer>)
/// })?;
/// let loss = (&w * 2.0).sum(Kind::Float) + (&b * 4.0).sum(Kind::Float);
/// opt.fused_backward(&loss, 0.5)?;
/// assert_eq!(w.double_value(&[0]), 0.0); // 1 - 0.5 * 2
/// assert_eq!(b.double_value(&[0]), -2.0); // 0 - 0.5 * 4
/// assert!(!w.grad().defined() && !b.grad().defined());
/// # Ok::<(), tchtrain_optim::Error>(())
/// ```
pub struct LayerWise {
    name: &'static str,
    lr: f64,
    /// The groups the Trainer's scheduler drives (the non-layer-wise optimizer's layout).
    groups: Vec<ParamGroup>,
    /// Each parameter's state, by flat index; moved into its inner optimizer for its step.
    state: Vec<Option<ParamState>>,
    /// One optimizer over each parameter, by flat index.
    inner: Vec<Box<dyn Optimizer>>,
}

impl std::fmt::Debug for LayerWise {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerWise")
            .field("name", &self.name)
            .field("lr", &self.lr)
            .field("groups", &self.groups)
            .field(
                "inner",
                &self.inner.iter().map(|o| o.name()).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl LayerWise {
    /// Builds one inner optimizer per parameter of `groups` with `build(group_index, (name,
    /// tensor))`; each must hold exactly that parameter in one group. `name` is the
    /// optimizer's name in its state dict, `lr` the default rate of the groups (a group's own
    /// `lr` wins; its `weight_decay` is only reported, the inner optimizers apply theirs).
    pub fn new(
        name: &'static str,
        groups: Vec<GroupSpec>,
        lr: f64,
        mut build: impl FnMut(usize, (String, Tensor)) -> Result<Box<dyn Optimizer>>,
    ) -> Result<Self> {
        crate::optimizer::check_non_negative("lr", lr)?;
        let mut outer = Vec::with_capacity(groups.len());
        let mut inner = Vec::new();
        for (gi, spec) in groups.into_iter().enumerate() {
            let shared: Vec<(String, Tensor)> = spec
                .params
                .iter()
                .map(|(n, t)| (n.clone(), t.shallow_clone()))
                .collect();
            let group = ParamGroup::from_spec(spec, lr, 0.0)?;
            for (param_name, t) in shared {
                let opt = build(gi, (param_name.clone(), t))?;
                let layout: Vec<usize> =
                    opt.param_groups().iter().map(|g| g.params.len()).collect();
                if layout != [1] {
                    return Err(Error::InvalidOptimizerSetup {
                        name: name.into(),
                        detail: format!(
                            "the inner optimizer of `{param_name}` must hold that one parameter \
                             in one group; it has groups of {layout:?} parameters"
                        ),
                    });
                }
                inner.push(opt);
            }
            outer.push(group);
        }
        // Report the inner optimizers' weight decay on the groups (upstream's handlers give
        // each parameter of a group the same).
        let mut index = 0;
        for g in &mut outer {
            if let Some(first) = inner.get(index).filter(|_| !g.params.is_empty()) {
                g.weight_decay = first.param_groups()[0].weight_decay;
            }
            index += g.params.len();
        }
        let state = (0..inner.len()).map(|_| None).collect();
        Ok(Self {
            name,
            lr,
            groups: outer,
            state,
            inner,
        })
    }

    /// The inner optimizer of the parameter at flat index `index` (its state lives in this
    /// optimizer's [`Optimizer::state`] between steps).
    pub fn inner(&self, index: usize) -> Option<&dyn Optimizer> {
        self.inner.get(index).map(|o| o.as_ref())
    }

    /// Steps the inner optimizer `index` at `lr` with its state moved in, and clears the
    /// parameter's gradient (upstream's `optimizer_dict[param].step()` then `.zero_grad()`).
    fn step_inner(&mut self, index: usize, lr: f64) -> Result<()> {
        let (Some(opt), Some(state)) = (self.inner.get_mut(index), self.state.get_mut(index))
        else {
            return Err(missing_inner(self.name, index));
        };
        let lrs = vec![lr; opt.param_groups().len()];
        opt.set_lrs(&lrs)?;
        let Some(slot) = opt.state_mut().first_mut() else {
            return Err(missing_inner(self.name, index));
        };
        std::mem::swap(slot, state);
        let stepped = opt.step();
        if let Some(slot) = opt.state_mut().first_mut() {
            std::mem::swap(slot, state);
        }
        opt.zero_grad();
        stepped
    }
}

/// The error for an inner optimizer without a state slot for parameter `index` (one built
/// outside [`LayerWise::new`]'s check).
fn missing_inner(name: &str, index: usize) -> Error {
    Error::InvalidOptimizerSetup {
        name: name.into(),
        detail: format!("no inner optimizer state for parameter {index}"),
    }
}

/// An error of an inner optimizer's state check, with the flat index of this optimizer.
fn reindex(e: Error, index: usize) -> Error {
    match e {
        Error::ShapeMismatch {
            key,
            expected,
            found,
            ..
        } => Error::ShapeMismatch {
            param: index,
            key,
            expected,
            found,
        },
        Error::MissingState { key, .. } => Error::MissingState { param: index, key },
        other => other,
    }
}

impl Optimizer for LayerWise {
    fn name(&self) -> &'static str {
        self.name
    }

    fn default_lr(&self) -> f64 {
        self.lr
    }

    /// A no-op: the updates happened in [`Optimizer::fused_backward`] (upstream's
    /// `LayerWiseDummyOptimizer.step`).
    fn step(&mut self) -> Result<()> {
        Ok(())
    }

    fn fuses_backward(&self) -> bool {
        true
    }

    /// The backward of `loss`, then every parameter that got a gradient updated by its inner
    /// optimizer at rate `lr` and its gradient cleared, in parameter order.
    fn fused_backward(&mut self, loss: &Tensor, lr: f64) -> Result<()> {
        crate::optimizer::check_non_negative("lr", lr)?;
        for g in &mut self.groups {
            g.lr = lr;
        }
        loss.f_backward()?;
        let params: Vec<Tensor> = self
            .groups
            .iter()
            .flat_map(|g| g.params.iter().map(Tensor::shallow_clone))
            .collect();
        for (index, p) in params.iter().enumerate() {
            // Upstream's hook: `if param.grad is not None`.
            if grad_of(p).is_some() {
                self.step_inner(index, lr)?;
            }
        }
        Ok(())
    }

    fn param_groups(&self) -> &[ParamGroup] {
        &self.groups
    }

    fn param_groups_mut(&mut self) -> &mut [ParamGroup] {
        &mut self.groups
    }

    fn state(&self) -> &[Option<ParamState>] {
        &self.state
    }

    fn state_mut(&mut self) -> &mut Vec<Option<ParamState>> {
        &mut self.state
    }

    /// The inner optimizers' hyper-parameters, a list by flat parameter index.
    fn hyperparameters(&self) -> serde_json::Value {
        serde_json::Value::Array(self.inner.iter().map(|o| o.hyperparameters()).collect())
    }

    fn set_hyperparameters(&mut self, value: &serde_json::Value) -> Result<()> {
        let list = value.as_array().ok_or_else(|| Error::GroupLayoutMismatch {
            detail: format!(
                "`{}` keeps a list of its inner optimizers' hyper-parameters, the state dict \
                 has none",
                self.name
            ),
        })?;
        if list.len() != self.inner.len() {
            return Err(Error::GroupLayoutMismatch {
                detail: format!(
                    "{} inner optimizers here, {} in the state dict",
                    self.inner.len(),
                    list.len()
                ),
            });
        }
        for (opt, v) in self.inner.iter_mut().zip(list) {
            opt.set_hyperparameters(v)?;
        }
        Ok(())
    }

    /// The inner optimizers' rule (they are all of one kind).
    fn keeps_state_dtype(&self, key: &str) -> bool {
        self.inner.first().is_some_and(|o| o.keeps_state_dtype(key))
    }

    fn validate_state(&self, index: usize, param: &Tensor, state: &ParamState) -> Result<()> {
        let opt = self
            .inner
            .get(index)
            .ok_or_else(|| Error::GroupLayoutMismatch {
                detail: format!(
                    "state for parameter {index}, but there are {} parameters",
                    self.inner.len()
                ),
            })?;
        opt.validate_state(0, param, state)
            .map_err(|e| reindex(e, index))
    }
}

/// Upstream's layer-wise branch of `_setup_low_rank_optimizer` for `galore_adamw_layerwise`,
/// `galore_adamw_8bit_layerwise` and `apollo_adamw_layerwise`: refuses DDP and gradient accumulation (as upstream raises),
/// then one optimizer per parameter, built as the non-layer-wise name builds its groups:
/// the non-target parameters with the optimizer's defaults and the Trainer's `lr`, the
/// targets with the projection of `optim_args` (and for APOLLO the Trainer's betas / eps).
/// Each APOLLO optimizer numbers its one parameter 1, so every random projection starts from
/// seed 1, as upstream's per-parameter `APOLLOAdamW`s do.
pub(crate) fn create_layerwise(
    args: &OptimizerArgs,
    groups: Vec<GroupSpec>,
) -> Result<Box<dyn Optimizer>> {
    let (name, base): (&'static str, &'static str) = match args.optim.as_str() {
        "galore_adamw_layerwise" => ("galore_adamw_layerwise", "galore_adamw"),
        "galore_adamw_8bit_layerwise" => ("galore_adamw_8bit_layerwise", "galore_adamw_8bit"),
        "apollo_adamw_layerwise" => ("apollo_adamw_layerwise", "apollo_adamw"),
        other => {
            return Err(Error::InvalidOptimizerSetup {
                name: other.into(),
                detail: "not a layer-wise optimizer name".into(),
            });
        }
    };
    if args.distributed {
        return Err(Error::InvalidOptimizerSetup {
            name: name.into(),
            detail: format!("Layer-wise {name} does not support DDP at this time"),
        });
    }
    // Upstream's errors on the targets name the layer-wise optimizer.
    crate::low_rank_target_names(
        name,
        args.optim_target_modules.as_ref(),
        &args.linear_modules,
    )?;
    if args.gradient_accumulation_steps != 1 {
        return Err(Error::InvalidOptimizerSetup {
            name: name.into(),
            detail: format!("Layerwise {name} does not support gradient accumulation!"),
        });
    }
    // The non-layer-wise optimizer: its groups `[non-target, target]` and its per-group
    // options, which each parameter's optimizer takes over.
    let whole = crate::create_optimizer(
        &OptimizerArgs {
            optim: base.into(),
            ..args.clone()
        },
        groups,
    )?;
    let specs: Vec<GroupSpec> = whole
        .param_groups()
        .iter()
        .map(|g| {
            GroupSpec::new(
                g.param_names
                    .iter()
                    .cloned()
                    .zip(g.params.iter().map(Tensor::shallow_clone))
                    .collect(),
            )
        })
        .collect();
    let config = whole.hyperparameters();
    let parse = |what| Error::InvalidOptimizerSetup {
        name: name.into(),
        detail: format!("the {what} configuration did not round-trip (a tchtrain bug)"),
    };
    let lr = args.learning_rate;
    let layerwise = match base {
        "galore_adamw" => {
            let c: GaLoreAdamWConfig =
                serde_json::from_value(config).map_err(|_| parse("GaLore AdamW"))?;
            LayerWise::new(name, specs, lr, |gi, param| {
                let projection = c.projections.get(gi).cloned().flatten();
                let config = GaLoreAdamWConfig {
                    projections: vec![projection],
                    ..c.clone()
                };
                Ok(Box::new(GaLoreAdamW::new(
                    vec![GroupSpec::new(vec![param])],
                    config,
                )?))
            })?
        }
        "galore_adamw_8bit" => {
            let c: GaLoreAdamW8bitConfig =
                serde_json::from_value(config).map_err(|_| parse("GaLore 8-bit AdamW"))?;
            LayerWise::new(name, specs, lr, |gi, param| {
                let projection = c.projections.get(gi).cloned().flatten();
                let config = GaLoreAdamW8bitConfig {
                    projections: vec![projection],
                    ..c.clone()
                };
                Ok(Box::new(GaLoreAdamW8bit::new(
                    vec![GroupSpec::new(vec![param])],
                    config,
                )?))
            })?
        }
        _ => {
            let c: ApolloAdamWConfig =
                serde_json::from_value(config).map_err(|_| parse("APOLLO AdamW"))?;
            LayerWise::new(name, specs, lr, |gi, param| {
                let options = c.groups.get(gi).cloned().unwrap_or_default();
                let config = ApolloAdamWConfig {
                    groups: vec![options],
                    seed_offset: 0,
                    ..c.clone()
                };
                Ok(Box::new(ApolloAdamW::new(
                    vec![GroupSpec::new(vec![param])],
                    config,
                )?))
            })?
        }
    };
    Ok(Box::new(layerwise))
}

//! torch's own state files of a checkpoint, so that transformers' Trainer resumes ours and we
//! resume its: `optimizer.pt` (`optimizer.state_dict()`), `scheduler.pt`
//! (`lr_scheduler.state_dict()`) and `scaler.pt` (`GradScaler.state_dict()`), as the values
//! [`tchtrain_serialization`] reads and writes.
//!
//! torch numbers the parameters of `optimizer.pt` in group order and names none of them (the
//! Trainer passes bare tensors). Upstream's groups are `get_decay_parameter_names`' decay
//! group then the no-decay group, each in `named_parameters()` (registration) order; ours
//! hold the same parameters in the same groups, in the order the caller built them. The
//! conversions take upstream's order as a list of names (`order`): within each group,
//! torch's `j`-th parameter is ours ranked `j`-th by it, and every group size and state
//! shape is checked (an error names the parameter). The per-group hyper-parameters follow torch's
//! `load_state_dict` (the file's `lr`, `weight_decay` and `initial_lr` replace ours); the
//! optimizer-wide ones (betas, eps, momentum, ...) stay ours and each difference is returned
//! so the caller can report it.

use std::collections::BTreeMap;
use std::path::Path;

use tch::{Device, Kind, Tensor};
use tchtrain_serialization::{DType, Tensor as TorchTensor, Value};

use crate::{
    Error, GradScalerState, LrScheduler, Optimizer, OptimizerStateDict, ParamStateMeta, Result,
};

/// torch's optimizer state file in a Trainer checkpoint.
pub const TORCH_OPTIMIZER_NAME: &str = "optimizer.pt";
/// torch's LR scheduler state file in a Trainer checkpoint.
pub const TORCH_SCHEDULER_NAME: &str = "scheduler.pt";
/// torch's `GradScaler` state file in a Trainer checkpoint.
pub const TORCH_SCALER_NAME: &str = "scaler.pt";

fn s(text: &str) -> Value {
    Value::Str(text.to_string())
}

fn bad(file: &str, field: impl Into<String>, detail: impl Into<String>) -> Error {
    Error::TorchState {
        file: file.to_string(),
        field: field.into(),
        detail: detail.into(),
    }
}

/// A libtorch tensor as a pickled CPU tensor (its bytes, row-major).
pub fn tensor_to_torch(t: &Tensor) -> Result<TorchTensor> {
    let t = t.f_detach()?.f_to_device(Device::Cpu)?.f_contiguous()?;
    let dtype = match t.kind() {
        Kind::Float => DType::Float32,
        Kind::Double => DType::Float64,
        Kind::Half => DType::Float16,
        Kind::BFloat16 => DType::BFloat16,
        Kind::Int64 => DType::Int64,
        Kind::Int => DType::Int32,
        Kind::Int16 => DType::Int16,
        Kind::Int8 => DType::Int8,
        Kind::Uint8 => DType::UInt8,
        Kind::Bool => DType::Bool,
        other => {
            return Err(bad(
                "tensor",
                "dtype",
                format!("{other:?} has no torch.save form here"),
            ));
        }
    };
    let numel = t.numel();
    let mut bytes = vec![0u8; numel * t.kind().elt_size_in_bytes()];
    t.f_copy_data_u8(&mut bytes, numel)?;
    Ok(TorchTensor::from_bytes(dtype, &t.size(), bytes)?)
}

/// A pickled tensor as a libtorch CPU tensor.
pub fn tensor_from_torch(t: &TorchTensor) -> Result<Tensor> {
    let kind = match t.dtype {
        DType::Float32 => Kind::Float,
        DType::Float64 => Kind::Double,
        DType::Float16 => Kind::Half,
        DType::BFloat16 => Kind::BFloat16,
        DType::Int64 => Kind::Int64,
        DType::Int32 => Kind::Int,
        DType::Int16 => Kind::Int16,
        DType::Int8 => Kind::Int8,
        DType::UInt8 => Kind::Uint8,
        DType::Bool => Kind::Bool,
        other => {
            return Err(bad("tensor", "dtype", format!("{other} is not supported")));
        }
    };
    let bytes = t.contiguous_bytes()?;
    Ok(Tensor::f_from_data_size(&bytes, &t.size, kind)?)
}

/// torch's spelling of `fused` / `foreach` when not asked for: `None`.
fn flag_or_none(on: bool) -> Value {
    if on { Value::Bool(true) } else { Value::None }
}

fn json_f64(v: &serde_json::Value, key: &str) -> Value {
    v.get(key)
        .and_then(serde_json::Value::as_f64)
        .map_or(Value::None, Value::Float)
}

fn json_bool(v: &serde_json::Value, key: &str) -> Value {
    Value::Bool(
        v.get(key)
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false),
    )
}

fn json_pair(v: &serde_json::Value, key: &str) -> Value {
    let pair = v.get(key).and_then(serde_json::Value::as_array);
    match pair {
        Some(items) => Value::Tuple(
            items
                .iter()
                .map(|x| x.as_f64().map_or(Value::None, Value::Float))
                .collect(),
        ),
        None => Value::None,
    }
}

/// The optimizer-wide entries torch keeps in every param group, from our hyper-parameters
/// JSON, in torch's order (`None` for an optimizer torch's Trainer has no file form for).
fn torch_group_defaults(name: &str, h: &serde_json::Value) -> Option<Vec<(&'static str, Value)>> {
    let fused = h.get("fused").and_then(serde_json::Value::as_bool) == Some(true);
    Some(match name {
        "adamw" | "adam" => vec![
            ("betas", json_pair(h, "betas")),
            ("eps", json_f64(h, "eps")),
            ("amsgrad", json_bool(h, "amsgrad")),
            ("maximize", json_bool(h, "maximize")),
            ("foreach", Value::None),
            ("capturable", Value::Bool(false)),
            ("differentiable", Value::Bool(false)),
            ("fused", flag_or_none(fused)),
            ("decoupled_weight_decay", Value::Bool(name == "adamw")),
        ],
        "sgd" => vec![
            ("momentum", json_f64(h, "momentum")),
            ("dampening", json_f64(h, "dampening")),
            ("nesterov", json_bool(h, "nesterov")),
            ("maximize", json_bool(h, "maximize")),
            ("foreach", Value::None),
            ("differentiable", Value::Bool(false)),
            ("fused", flag_or_none(fused)),
        ],
        "adafactor" => vec![
            ("eps", json_pair(h, "eps")),
            ("clip_threshold", json_f64(h, "clip_threshold")),
            ("decay_rate", json_f64(h, "decay_rate")),
            ("beta1", json_f64(h, "beta1")),
            ("scale_parameter", json_bool(h, "scale_parameter")),
            ("relative_step", json_bool(h, "relative_step")),
            ("warmup_init", json_bool(h, "warmup_init")),
        ],
        _ => return None,
    })
}

/// How an optimizer keeps `state["step"]`: a 0-d float32 tensor (torch's Adam / AdamW), a
/// Python int (transformers' Adafactor), or not at all (SGD).
fn step_form(name: &str) -> Option<bool> {
    match name {
        "adamw" | "adam" => Some(true),
        "adafactor" => Some(false),
        _ => None,
    }
}

/// For each param group, our flat indices in torch's order: the group's parameters ranked by
/// their position in `order` (upstream's `named_parameters()` names; names missing from it
/// keep their place after the others).
fn torch_positions(groups: &[crate::ParamGroupState], order: &[String]) -> Vec<Vec<usize>> {
    let rank: std::collections::HashMap<&str, usize> = order
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    groups
        .iter()
        .map(|g| {
            let mut idx: Vec<usize> = (0..g.params.len()).collect();
            idx.sort_by_key(|&j| {
                g.param_names
                    .get(j)
                    .and_then(|n| rank.get(n.as_str()).copied())
                    .unwrap_or(usize::MAX)
            });
            idx.into_iter().map(|j| g.params[j]).collect()
        })
        .collect()
}

/// `optimizer.state_dict()` as torch writes it into `optimizer.pt`, for AdamW (fused or not),
/// Adam, SGD and Adafactor (an error naming the optimizer for the others), numbering the
/// parameters as upstream's Trainer does given its `named_parameters()` order `order`.
pub fn optimizer_to_torch(opt: &dyn Optimizer, order: &[String]) -> Result<Value> {
    let name = opt.name();
    let sd = opt.state_dict()?;
    let defaults = torch_group_defaults(name, &sd.meta.defaults).ok_or_else(|| {
        bad(
            TORCH_OPTIMIZER_NAME,
            "optimizer",
            format!(
                "`{name}` has no torch optimizer.pt form (AdamW, Adam, SGD and Adafactor have)"
            ),
        )
    })?;
    let positions = torch_positions(&sd.meta.param_groups, order);
    let mut state = Vec::new();
    let flat: Vec<usize> = positions.iter().flatten().copied().collect();
    for (torch_index, &i) in flat.iter().enumerate() {
        let Some(m) = sd.meta.state.get(&i) else {
            continue;
        };
        let mut entries = Vec::new();
        match step_form(name) {
            Some(true) => {
                let bytes = (m.step as f32).to_le_bytes().to_vec();
                entries.push((
                    s("step"),
                    Value::Tensor(TorchTensor::from_bytes(DType::Float32, &[], bytes)?),
                ));
            }
            Some(false) => entries.push((s("step"), Value::Int(m.step as i64))),
            None => {}
        }
        for key in &m.tensors {
            let t =
                sd.tensors
                    .get(&format!("state.{i}.{key}"))
                    .ok_or_else(|| Error::MissingState {
                        param: i,
                        key: key.clone(),
                    })?;
            entries.push((s(key), Value::Tensor(tensor_to_torch(t)?)));
        }
        for (key, &v) in &m.scalars {
            entries.push((s(key), Value::Float(v)));
        }
        state.push((Value::Int(torch_index as i64), Value::Dict(entries)));
    }
    let mut groups = Vec::new();
    let mut next = 0i64;
    for g in &sd.meta.param_groups {
        let mut entries = vec![
            (s("weight_decay"), Value::Float(g.weight_decay)),
            (s("lr"), Value::Float(g.lr)),
        ];
        entries.extend(defaults.iter().map(|(k, v)| (s(k), v.clone())));
        if let Some(initial) = g.initial_lr {
            entries.push((s("initial_lr"), Value::Float(initial)));
        }
        let n = g.params.len() as i64;
        entries.push((
            s("params"),
            Value::List((next..next + n).map(Value::Int).collect()),
        ));
        next += n;
        groups.push(Value::Dict(entries));
    }
    Ok(Value::Dict(vec![
        (s("state"), Value::Dict(state)),
        (s("param_groups"), Value::List(groups)),
    ]))
}

fn describe(v: &Value) -> String {
    match v {
        Value::None => "None".into(),
        Value::Bool(b) => if *b { "True" } else { "False" }.into(),
        Value::Int(i) => i.to_string(),
        Value::Float(f) => format!("{f:?}"),
        Value::Tuple(items) => format!(
            "({})",
            items.iter().map(describe).collect::<Vec<_>>().join(", ")
        ),
        other => format!("{other:?}"),
    }
}

/// Whether two hyper-parameter values agree (ints and floats by value; `fused` / `foreach`
/// compare `None` and `False` equal: both mean "not asked for").
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::None, Value::Bool(false)) | (Value::Bool(false), Value::None) => true,
        (Value::Tuple(x), Value::Tuple(y)) | (Value::List(x), Value::List(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
        }
        _ => match (a.as_f64(), b.as_f64()) {
            (Some(x), Some(y)) => x == y,
            _ => a == b,
        },
    }
}

/// Restores `opt` from a torch `optimizer.state_dict()` (the value of `optimizer.pt`) numbered
/// by upstream's `named_parameters()` order `order`: each parameter's state (its shape
/// checked, an error naming the parameter), the
/// groups' `lr`, `weight_decay` and `initial_lr` as torch's `load_state_dict` does. Returns
/// the optimizer-wide hyper-parameters that differ from ours (`"betas: (0.9, 0.999) here,
/// (0.9, 0.99) in optimizer.pt"`), which keep our values.
pub fn optimizer_from_torch(
    opt: &mut dyn Optimizer,
    value: &Value,
    order: &[String],
) -> Result<Vec<String>> {
    const F: &str = TORCH_OPTIMIZER_NAME;
    let name = opt.name();
    let ours = opt.state_dict()?;
    let defaults = torch_group_defaults(name, &ours.meta.defaults).ok_or_else(|| {
        bad(
            F,
            "optimizer",
            format!("`{name}` cannot be restored from a torch optimizer.pt"),
        )
    })?;
    let groups = value
        .get("param_groups")
        .and_then(Value::as_seq)
        .ok_or_else(|| bad(F, "param_groups", "missing or not a list"))?;
    if groups.len() != ours.meta.param_groups.len() {
        return Err(bad(
            F,
            "param_groups",
            format!(
                "{} groups in the file, {} here (upstream: the decay group, then the no-decay group)",
                groups.len(),
                ours.meta.param_groups.len()
            ),
        ));
    }
    let positions = torch_positions(&ours.meta.param_groups, order);
    let flat_names: Vec<String> = ours
        .meta
        .param_groups
        .iter()
        .flat_map(|g| g.param_names.iter().cloned())
        .collect();
    let mut meta = ours.meta.clone();
    let mut index_of = BTreeMap::new();
    let mut differences = Vec::new();
    for (gi, (g, mine)) in groups.iter().zip(meta.param_groups.iter_mut()).enumerate() {
        let field = |k: &str| format!("param_groups[{gi}].{k}");
        let params = g
            .get("params")
            .and_then(Value::as_seq)
            .ok_or_else(|| bad(F, field("params"), "missing or not a list"))?;
        if params.len() != mine.params.len() {
            return Err(bad(
                F,
                field("params"),
                format!(
                    "{} parameters in the file, {} here (first here: `{}`)",
                    params.len(),
                    mine.params.len(),
                    mine.param_names.first().map_or("", String::as_str)
                ),
            ));
        }
        for (j, p) in params.iter().enumerate() {
            let key = p
                .as_i64()
                .ok_or_else(|| bad(F, field("params"), "a parameter id is not an int"))?;
            index_of.insert(key, positions[gi][j]);
        }
        let num = |k: &str| {
            g.get(k)
                .and_then(Value::as_f64)
                .ok_or_else(|| bad(F, field(k), "missing or not a number"))
        };
        mine.lr = num("lr")?;
        mine.weight_decay = num("weight_decay")?;
        mine.initial_lr = g.get("initial_lr").and_then(Value::as_f64);
        if gi == 0 {
            for (k, here) in &defaults {
                if let Some(theirs) = g.get(k)
                    && !same(here, theirs)
                    && *k != "fused"
                {
                    differences.push(format!(
                        "{k}: {} here, {} in {F}",
                        describe(here),
                        describe(theirs)
                    ));
                }
            }
        }
    }
    let params: Vec<Tensor> = opt
        .param_groups()
        .iter()
        .flat_map(|g| g.params.iter().map(Tensor::shallow_clone))
        .collect();
    let state = value
        .get("state")
        .and_then(Value::as_dict)
        .ok_or_else(|| bad(F, "state", "missing or not a dict"))?;
    meta.state.clear();
    let mut tensors = BTreeMap::new();
    for (k, entries) in state {
        let key = k
            .as_i64()
            .ok_or_else(|| bad(F, "state", "a key is not an int"))?;
        let &i = index_of.get(&key).ok_or_else(|| {
            bad(
                F,
                format!("state[{key}]"),
                "no param group lists this parameter",
            )
        })?;
        let pname = flat_names.get(i).cloned().unwrap_or_default();
        let entries = entries
            .as_dict()
            .ok_or_else(|| bad(F, format!("state[{key}]"), "not a dict"))?;
        let mut m = ParamStateMeta {
            step: 0,
            tensors: Vec::new(),
            scalars: BTreeMap::new(),
        };
        for (ek, ev) in entries {
            let ek = ek
                .as_str()
                .ok_or_else(|| bad(F, format!("state[{key}]"), "a key is not a str"))?;
            let field = format!("state[{key}].{ek} (parameter `{pname}`)");
            match (ek, ev) {
                ("step", Value::Tensor(t)) => {
                    let v = t
                        .to_f64_vec()?
                        .and_then(|v| v.first().copied())
                        .ok_or_else(|| bad(F, &field, "not a number"))?;
                    m.step = v as u64;
                }
                ("step", v) => {
                    m.step = v
                        .as_i64()
                        .ok_or_else(|| bad(F, &field, "not an int"))?
                        .max(0) as u64;
                }
                (_, Value::Tensor(t)) => {
                    let t = tensor_from_torch(t)?;
                    let p = &params[i];
                    // Adafactor's factored second moments have their own shapes; the
                    // optimizer's `validate_state` checks those.
                    let same_shape =
                        ek.starts_with("exp_avg") && !ek.contains("_row") && !ek.contains("_col")
                            || ek == "momentum_buffer"
                            || ek == "max_exp_avg_sq";
                    if same_shape && t.size() != p.size() {
                        return Err(bad(
                            F,
                            &field,
                            format!("shape {:?}, the parameter's is {:?}", t.size(), p.size()),
                        ));
                    }
                    m.tensors.push(ek.to_string());
                    tensors.insert(format!("state.{i}.{ek}"), t);
                }
                (_, Value::None) => {}
                (_, v) => {
                    let x = v
                        .as_f64()
                        .ok_or_else(|| bad(F, &field, format!("unexpected {}", describe(v))))?;
                    m.scalars.insert(ek.to_string(), x);
                }
            }
        }
        meta.state.insert(i, m);
    }
    opt.load_state_dict(&OptimizerStateDict { meta, tensors })?;
    Ok(differences)
}

/// `lr_scheduler.state_dict()` as torch writes it into `scheduler.pt`, for the schedulers
/// that are torch `LambdaLR`s (every `get_scheduler` type but `reduce_lr_on_plateau` and
/// `greedy`): `None` for the others.
pub fn scheduler_to_torch(sched: &dyn LrScheduler) -> Option<Value> {
    let j = sched.state_dict();
    j.get("lr_lambda")?;
    let floats = |k: &str| {
        Value::List(
            j.get(k)
                .and_then(serde_json::Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_f64())
                        .map(Value::Float)
                        .collect()
                })
                .unwrap_or_default(),
        )
    };
    let groups = j
        .get("base_lrs")
        .and_then(serde_json::Value::as_array)
        .map_or(0, Vec::len);
    Some(Value::Dict(vec![
        (s("base_lrs"), floats("base_lrs")),
        (s("last_epoch"), Value::Int(j["last_epoch"].as_i64()?)),
        (s("_step_count"), Value::Int(j["_step_count"].as_i64()?)),
        (s("_is_initial"), Value::Bool(false)),
        (s("_get_lr_called_within_step"), Value::Bool(false)),
        (s("_last_lr"), floats("_last_lr")),
        // `functools.partial` multipliers: torch saves their (empty) `__dict__`.
        (
            s("lr_lambdas"),
            Value::List((0..groups).map(|_| Value::Dict(Vec::new())).collect()),
        ),
    ]))
}

/// Restores a `LambdaLR`-based scheduler from torch's `scheduler.pt` value: `base_lrs`,
/// `last_epoch`, `_step_count` and `_last_lr` (the multiplier stays the live scheduler's, as
/// in torch).
pub fn scheduler_from_torch(sched: &mut dyn LrScheduler, value: &Value) -> Result<()> {
    const F: &str = TORCH_SCHEDULER_NAME;
    let mut j = sched.state_dict();
    if j.get("lr_lambda").is_none() {
        return Err(bad(
            F,
            "scheduler",
            format!(
                "`{}` is not a LambdaLR: only those resume from a torch scheduler.pt here",
                sched.name()
            ),
        ));
    }
    let floats = |k: &str| -> Result<serde_json::Value> {
        let items = value
            .get(k)
            .and_then(Value::as_seq)
            .ok_or_else(|| bad(F, k, "missing or not a list"))?;
        items
            .iter()
            .map(|x| {
                x.as_f64()
                    .map(serde_json::Value::from)
                    .ok_or_else(|| bad(F, k, "not a number"))
            })
            .collect::<Result<Vec<_>>>()
            .map(serde_json::Value::Array)
    };
    let int = |k: &str| {
        value
            .get(k)
            .and_then(Value::as_i64)
            .ok_or_else(|| bad(F, k, "missing or not an int"))
    };
    j["base_lrs"] = floats("base_lrs")?;
    j["_last_lr"] = floats("_last_lr")?;
    j["last_epoch"] = int("last_epoch")?.into();
    j["_step_count"] = int("_step_count")?.into();
    sched.load_state_dict(&j)
}

/// `GradScaler.state_dict()` as torch writes it into `scaler.pt`.
pub fn grad_scaler_to_torch(state: &GradScalerState) -> Value {
    Value::Dict(vec![
        (s("scale"), Value::Float(state.scale)),
        (s("growth_factor"), Value::Float(state.growth_factor)),
        (s("backoff_factor"), Value::Float(state.backoff_factor)),
        (s("growth_interval"), Value::Int(state.growth_interval)),
        (s("_growth_tracker"), Value::Int(state.growth_tracker)),
    ])
}

/// A `GradScaler` state from torch's `scaler.pt` value.
pub fn grad_scaler_from_torch(value: &Value) -> Result<GradScalerState> {
    const F: &str = TORCH_SCALER_NAME;
    let num = |k: &str| {
        value
            .get(k)
            .and_then(Value::as_f64)
            .ok_or_else(|| bad(F, k, "missing or not a number"))
    };
    let int = |k: &str| {
        value
            .get(k)
            .and_then(Value::as_i64)
            .ok_or_else(|| bad(F, k, "missing or not an int"))
    };
    Ok(GradScalerState {
        scale: num("scale")?,
        growth_factor: num("growth_factor")?,
        backoff_factor: num("backoff_factor")?,
        growth_interval: int("growth_interval")?,
        growth_tracker: int("_growth_tracker")?,
    })
}

/// Reads one of torch's checkpoint files (`torch.load(weights_only=True)` with the Trainer
/// checkpoint's allow-list).
pub fn load_torch_file(path: &Path) -> Result<Value> {
    Ok(tchtrain_serialization::load(path)?)
}

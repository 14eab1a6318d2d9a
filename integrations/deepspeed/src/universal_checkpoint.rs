//! DeepSpeed's universal checkpoint (`ds_to_universal.py`, `load_universal`): the per-rank
//! shards of a ZeRO-1/2/3 or sharded-FSDP checkpoint read back into one state per parameter
//! (its fp32 master value and each element-wise optimizer state, `exp_avg`, `exp_avg_sq`,
//! `momentum_buffer`, ...), then cut again for another world size, stage or wrap policy.
//!
//! [`load_zero_shard`](crate::load_zero_shard) takes this path when the checkpoint's world
//! size or flat layout differs from the run's: every rank reads every shard file (they are
//! the model's size in all), builds the universal form, and keeps its own slice of each of
//! its buffers. Optimizer states that are not element-wise (a scalar per shard, such as
//! Adafactor's `RMS`, or factored moments) cannot be cut again and are refused by name.

use std::collections::BTreeMap;
use std::path::Path;

use tch::{Kind, Tensor};
use tchtrain_distributed::ProcessGroup;
use tchtrain_optim::{Optimizer, OptimizerStateDict, OptimizerStateMeta, ParamStateMeta};

use crate::zero_checkpoint::{ZeroShardMeta, read_zero_shard};
use crate::{Error, Result};
use tchtrain_accelerate::{FlatLayout, ZeroEngine};

/// One parameter of a [`UniversalCheckpoint`].
#[derive(Debug)]
pub struct UniversalParam {
    /// The fp32 master value, in the parameter's shape.
    pub fp32: Tensor,
    /// Its optimizer state tensors by name (`exp_avg`, ...), in the parameter's shape.
    pub state: BTreeMap<String, Tensor>,
    /// The optimizer param group it was in.
    pub group: usize,
}

/// A sharded checkpoint in DeepSpeed's universal form: one state per parameter, no trace
/// of the world size or layout that wrote it.
#[derive(Debug)]
pub struct UniversalCheckpoint {
    /// The ZeRO stage that wrote the shards.
    pub zero_stage: i64,
    /// The ranks that wrote them.
    pub world_size: i64,
    /// Every parameter, by `state_dict` name.
    pub params: BTreeMap<String, UniversalParam>,
    /// The optimizer's step count (the same for every shard), when it has state.
    pub step: Option<u64>,
    /// Rank 0's optimizer state description (name, hyper-parameters, group learning
    /// rates), when the checkpoint has an optimizer.
    pub optimizer: Option<OptimizerStateMeta>,
}

fn bad(dir: &Path, detail: String) -> Error {
    Error::Checkpoint {
        path: dir.to_path_buf(),
        detail,
    }
}

/// The buffer index a shard optimizer parameter stands for (`flat.{b}`).
fn buffer_of(dir: &Path, name: &str) -> Result<usize> {
    name.strip_prefix("flat.")
        .and_then(|b| b.parse().ok())
        .ok_or_else(|| {
            bad(
                dir,
                format!("optimizer parameter `{name}` is not a flat shard"),
            )
        })
}

/// Upstream `ds_to_universal`: reads every rank's shard files in `dir` (a `global_step{N}/`
/// or `pytorch_model_fsdp_0/` folder) into one state per parameter.
pub fn ds_to_universal(dir: &Path) -> Result<UniversalCheckpoint> {
    let (meta0, first) = read_zero_shard(dir, 0)?;
    let world = meta0.world_size;
    let mut ranks: Vec<BTreeMap<String, Tensor>> = vec![first.into_iter().collect()];
    let mut metas: Vec<ZeroShardMeta> = vec![meta0.clone()];
    for r in 1..world {
        let (meta, tensors) = read_zero_shard(dir, r)?;
        if meta.buffers != meta0.buffers || meta.world_size != world {
            return Err(bad(
                dir,
                format!("rank {r}'s layout differs from rank 0's (files of two runs mixed?)"),
            ));
        }
        ranks.push(tensors.into_iter().collect());
        metas.push(meta);
    }
    // The full flat buffer `key_of(b)` over the ranks, padding dropped later per parameter.
    let full = |layout: &FlatLayout, key: &str| -> Result<Tensor> {
        let slices = ranks
            .iter()
            .enumerate()
            .map(|(r, t)| {
                let s = t
                    .get(key)
                    .ok_or_else(|| bad(dir, format!("rank {r} has no tensor {key}")))?;
                if s.numel() as i64 != layout.shard_numel {
                    return Err(bad(
                        dir,
                        format!(
                            "rank {r}'s {key} has {} elements where the layout has {} per rank: only element-wise state can be resharded",
                            s.numel(),
                            layout.shard_numel
                        ),
                    ));
                }
                Ok(s.f_reshape([-1])?)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Tensor::f_cat(&slices, 0)?)
    };
    let mut params = BTreeMap::new();
    for (b, layout) in meta0.buffers.iter().enumerate() {
        let flat = full(layout, &format!("fp32_flat.{b}"))?;
        for (i, p) in layout.params.iter().enumerate() {
            let fp32 = layout.piece(&flat, i)?.copy();
            params.insert(
                p.name.clone(),
                UniversalParam {
                    fp32,
                    state: BTreeMap::new(),
                    group: layout.group,
                },
            );
        }
    }
    let mut step = None;
    if let Some(opt) = &meta0.optimizer {
        for group in &opt.param_groups {
            for (&i, name) in group.params.iter().zip(&group.param_names) {
                let b = buffer_of(dir, name)?;
                let layout = meta0.buffers.get(b).ok_or_else(|| {
                    bad(dir, format!("optimizer parameter `{name}` has no buffer"))
                })?;
                let Some(state) = opt.state.get(&i) else {
                    continue;
                };
                if let Some(key) = state.scalars.keys().next() {
                    return Err(bad(
                        dir,
                        format!(
                            "the {} optimizer keeps `{key}` as one number per shard: its state cannot be cut for another world size; resume on {world} ranks with the same settings, or start a new optimizer from the consolidated model (zero_to_fp32)",
                            opt.optimizer
                        ),
                    ));
                }
                for (r, m) in metas.iter().enumerate() {
                    let s = m.optimizer.as_ref().and_then(|o| o.state.get(&i));
                    if s.map(|s| s.step) != Some(state.step) {
                        return Err(bad(
                            dir,
                            format!("rank {r}'s optimizer step differs from rank 0's"),
                        ));
                    }
                }
                match step {
                    None => step = Some(state.step),
                    Some(s) if s != state.step => {
                        return Err(bad(dir, "the shards' optimizer steps differ".into()));
                    }
                    _ => {}
                }
                for key in &state.tensors {
                    let flat = full(layout, &format!("state.{i}.{key}"))?;
                    for (i, p) in layout.params.iter().enumerate() {
                        let t = layout.piece(&flat, i)?.copy();
                        if let Some(u) = params.get_mut(&p.name) {
                            u.state.insert(key.clone(), t);
                        }
                    }
                }
            }
        }
    }
    Ok(UniversalCheckpoint {
        zero_stage: meta0.zero_stage,
        world_size: world,
        params,
        step,
        optimizer: meta0.optimizer,
    })
}

/// This rank's slice of a flat buffer laid out as `layout`, each parameter's values from
/// `value(name)` (the padding zero).
fn slice_of(
    dir: &Path,
    layout: &FlatLayout,
    rank: i64,
    kind: Kind,
    mut value: impl FnMut(&str) -> Result<Tensor>,
) -> Result<Tensor> {
    let full = Tensor::f_zeros([layout.padded_numel], (kind, tch::Device::Cpu))?;
    for (i, p) in layout.params.iter().enumerate() {
        let v = value(&p.name)?;
        if v.numel() as i64 != p.numel {
            return Err(bad(
                dir,
                format!(
                    "`{}` has {} elements in the checkpoint, {} in this model",
                    p.name,
                    v.numel(),
                    p.numel
                ),
            ));
        }
        layout.place(&full, i, &v)?;
    }
    Ok(full
        .f_narrow(0, rank * layout.shard_numel, layout.shard_numel)?
        .copy())
}

/// Upstream `load_universal`: this rank's shards and optimizer state cut from `uc` for the
/// engine's own layout (world size, stage, wrap units), then (stages 1 and 2) the
/// parameters all-gathered: a collective. `dir` names the checkpoint in errors.
pub fn load_universal(
    engine: &mut ZeroEngine,
    pg: &mut ProcessGroup,
    optimizer: Option<&mut dyn Optimizer>,
    uc: &UniversalCheckpoint,
    dir: &Path,
) -> Result<()> {
    let rank = engine.rank();
    let layouts: Vec<FlatLayout> = engine.layouts().into_iter().cloned().collect();
    let shards_now = engine.shards();
    let param = |name: &str| {
        uc.params
            .get(name)
            .ok_or_else(|| bad(dir, format!("the checkpoint has no parameter `{name}`")))
    };
    let mut shards = Vec::with_capacity(layouts.len());
    for (b, layout) in layouts.iter().enumerate() {
        let kind = shards_now[b].kind();
        let device = shards_now[b].device();
        let s = slice_of(dir, layout, rank, kind, |n| {
            Ok(param(n)?.fp32.shallow_clone())
        })?;
        shards.push(s.f_to_device(device)?);
    }
    engine.load_shards(pg, &shards)?;
    let (Some(opt), Some(saved), Some(step)) = (optimizer, &uc.optimizer, uc.step) else {
        return Ok(());
    };
    // This run's groups (`flat.{b}` shards), the checkpoint's hyper-parameters and group
    // learning rates, and every shard's state cut from the universal form.
    let mut sd = opt.state_dict()?;
    if sd.meta.param_groups.len() != saved.param_groups.len() {
        return Err(bad(
            dir,
            format!(
                "its optimizer has {} param groups, this run's {}",
                saved.param_groups.len(),
                sd.meta.param_groups.len()
            ),
        ));
    }
    if sd.meta.optimizer != saved.optimizer {
        return Err(bad(
            dir,
            format!(
                "written with the {} optimizer, this run uses {}",
                saved.optimizer, sd.meta.optimizer
            ),
        ));
    }
    sd.meta.defaults = saved.defaults.clone();
    for (now, then) in sd.meta.param_groups.iter_mut().zip(&saved.param_groups) {
        now.lr = then.lr;
        now.weight_decay = then.weight_decay;
        now.initial_lr = then.initial_lr;
    }
    let keys: Vec<String> = uc
        .params
        .values()
        .next()
        .map(|p| p.state.keys().cloned().collect())
        .unwrap_or_default();
    sd.meta.state.clear();
    sd.tensors.clear();
    for group in &sd.meta.param_groups {
        for (&i, name) in group.params.iter().zip(&group.param_names) {
            let b = buffer_of(dir, name)?;
            let layout = &layouts[b];
            for key in &keys {
                // Cast to the shard's dtype and device by `load_state_dict`, as torch does.
                let s = slice_of(dir, layout, rank, Kind::Float, |n| {
                    param(n)?
                        .state
                        .get(key)
                        .map(Tensor::shallow_clone)
                        .ok_or_else(|| bad(dir, format!("`{n}` has no optimizer state `{key}`")))
                })?;
                sd.tensors.insert(format!("state.{i}.{key}"), s);
            }
            sd.meta.state.insert(
                i,
                ParamStateMeta {
                    step,
                    tensors: keys.clone(),
                    scalars: BTreeMap::new(),
                },
            );
        }
    }
    opt.load_state_dict(&OptimizerStateDict {
        meta: sd.meta,
        tensors: sd.tensors,
    })?;
    Ok(())
}

//! Per-rank ZeRO checkpoint files, DeepSpeed's `zero_pp_rank_{r}_mp_rank_00_optim_states.pt`
//! as safetensors + JSON (upstream's `.pt` files are pickles):
//!
//! | file | content |
//! |---|---|
//! | `zero_pp_rank_{r}_mp_rank_00_optim_states.safetensors` | `fp32_flat.{b}`: rank r's slice of flat buffer b (the fp32 partition); `state.{i}.{key}`: the optimizer state of shard i |
//! | `zero_pp_rank_{r}_mp_rank_00_optim_states.json` | [`ZeroShardMeta`]: stage, world size, rank, every buffer's [`FlatLayout`], the optimizer's JSON state |
//!
//! In a Trainer checkpoint they lie in `checkpoint-N/global_step{N}/` with a `latest` file
//! naming that folder (DeepSpeed's layout), or in `checkpoint-N/pytorch_model_fsdp_0/`
//! for FSDP's SHARDED_STATE_DICT. Every rank writes its own pair; the layouts are the same
//! on every rank, so any one rank's JSON says how to consolidate ([`crate::zero_to_fp32`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::Tensor;
use tchtrain_distributed::ProcessGroup;
use tchtrain_optim::{Optimizer, OptimizerStateDict, OptimizerStateMeta};

use crate::{Error, Result};
use tchtrain_accelerate::{FlatLayout, LossScaler, ZeroEngine};

/// DeepSpeed's `latest` file: the name of the newest `global_step{N}` folder.
pub const LATEST_NAME: &str = "latest";
/// The folder FSDP's SHARDED_STATE_DICT checkpoints keep the model shards in.
pub const FSDP_MODEL_DIR: &str = "pytorch_model_fsdp_0";

/// The file stem of rank `rank`'s shard files (`zero_pp_rank_{rank}_mp_rank_00_optim_states`).
pub fn zero_shard_stem(rank: i64) -> String {
    format!("zero_pp_rank_{rank}_mp_rank_00_optim_states")
}

/// The folder of a DeepSpeed-style checkpoint at `global_step` (`global_step{N}`).
pub fn global_step_dir(checkpoint_dir: &Path, global_step: i64) -> PathBuf {
    checkpoint_dir.join(format!("global_step{global_step}"))
}

/// The JSON half of one rank's shard files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ZeroShardMeta {
    /// 1, 2 or 3.
    pub zero_stage: i64,
    /// Ranks that wrote shards.
    pub world_size: i64,
    /// The rank that wrote this file.
    pub rank: i64,
    /// Every flat buffer's layout, in order (`fp32_flat.{b}` is buffer b's slice).
    pub buffers: Vec<FlatLayout>,
    /// The optimizer's JSON state over the shards (absent when saved without one).
    pub optimizer: Option<OptimizerStateMeta>,
    /// DeepSpeed's fp16 / bf16 regime: the loss scaler's state (DeepSpeed keeps it in the
    /// optimizer state as `loss_scaler`); absent for fp32 runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scaler: Option<LossScaler>,
}

fn io(path: &Path, e: std::io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source: e,
    }
}

/// Writes this rank's shard files into `dir` (created if missing): the parameter slices
/// and, when given, the optimizer's state over them.
pub fn save_zero_shard(
    engine: &ZeroEngine,
    optimizer: Option<&dyn Optimizer>,
    dir: &Path,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let stem = zero_shard_stem(engine.rank());
    let mut tensors: Vec<(String, Tensor)> = engine
        .shards()
        .iter()
        .enumerate()
        .map(|(i, s)| Ok((format!("fp32_flat.{i}"), s.f_detach()?.copy())))
        .collect::<Result<_>>()?;
    let optimizer = match optimizer {
        Some(opt) => {
            let sd = opt.state_dict()?;
            tensors.extend(sd.tensors);
            Some(sd.meta)
        }
        None => None,
    };
    let meta = ZeroShardMeta {
        zero_stage: engine.stage().number(),
        world_size: engine.world_size(),
        rank: engine.rank(),
        buffers: engine.layouts().into_iter().cloned().collect(),
        optimizer,
        loss_scaler: engine.loss_scaler().cloned(),
    };
    let refs: Vec<(&str, Tensor)> = tensors
        .iter()
        .map(|(k, t)| Ok((k.as_str(), t.f_contiguous()?)))
        .collect::<Result<_>>()?;
    Tensor::write_safetensors(&refs, dir.join(format!("{stem}.safetensors")))?;
    let path = dir.join(format!("{stem}.json"));
    let text = serde_json::to_string_pretty(&meta).map_err(|source| Error::Json {
        what: path.display().to_string(),
        source,
    })?;
    std::fs::write(&path, text + "\n").map_err(|e| io(&path, e))
}

/// Reads rank `rank`'s shard files from `dir`: the JSON and the tensors by name.
pub fn read_zero_shard(dir: &Path, rank: i64) -> Result<(ZeroShardMeta, Vec<(String, Tensor)>)> {
    let stem = zero_shard_stem(rank);
    let path = dir.join(format!("{stem}.json"));
    let text = std::fs::read_to_string(&path).map_err(|e| io(&path, e))?;
    let meta: ZeroShardMeta = serde_json::from_str(&text).map_err(|source| Error::Json {
        what: path.display().to_string(),
        source,
    })?;
    let tensors = Tensor::read_safetensors(dir.join(format!("{stem}.safetensors")))?;
    Ok((meta, tensors))
}

/// Restores this rank's shards and optimizer state from `dir` (written by
/// [`save_zero_shard`]), then (stages 1 and 2) all-gathers the parameters: a collective. A
/// checkpoint written by another world size, stage or wrap policy is resharded through
/// DeepSpeed's universal form ([`crate::ds_to_universal`], [`crate::load_universal`]).
pub fn load_zero_shard(
    engine: &mut ZeroEngine,
    pg: &mut ProcessGroup,
    optimizer: Option<&mut dyn Optimizer>,
    dir: &Path,
) -> Result<()> {
    let bad = |detail: String| Error::Checkpoint {
        path: dir.to_path_buf(),
        detail,
    };
    // Rank 0's description says how the checkpoint was cut (every rank wrote one).
    let (meta0, _) = read_zero_shard(dir, 0)?;
    // The loss scaler is the same on every rank.
    match (&meta0.loss_scaler, engine.loss_scaler().is_some()) {
        (Some(scaler), true) => engine.load_loss_scaler(scaler.clone())?,
        (Some(_), false) => log::warn!(
            "{}: written by a DeepSpeed fp16 / bf16 run; this run trains without them: its loss scaler is not used",
            dir.display()
        ),
        (None, true) => log::warn!(
            "{}: written without DeepSpeed's fp16 / bf16 regime; the loss scaler starts afresh",
            dir.display()
        ),
        (None, false) => {}
    }
    let layouts: Vec<FlatLayout> = engine.layouts().into_iter().cloned().collect();
    if meta0.world_size != engine.world_size() || meta0.buffers != layouts {
        log::info!(
            "{}: written by {} ranks at ZeRO stage {}, this run has {} at stage {}: resharding through the universal checkpoint form",
            dir.display(),
            meta0.world_size,
            meta0.zero_stage,
            engine.world_size(),
            engine.stage().number()
        );
        let uc = crate::ds_to_universal(dir)?;
        return crate::load_universal(engine, pg, optimizer, &uc, dir);
    }
    let (meta, tensors) = read_zero_shard(dir, engine.rank())?;
    if meta.buffers != layouts {
        return Err(bad(format!(
            "rank {}'s flat layout differs from rank 0's (files of two runs mixed?)",
            engine.rank()
        )));
    }
    let mut by_name: std::collections::BTreeMap<String, Tensor> = tensors.into_iter().collect();
    let shards = (0..layouts.len())
        .map(|i| {
            by_name
                .remove(&format!("fp32_flat.{i}"))
                .ok_or_else(|| bad(format!("no tensor fp32_flat.{i}")))
        })
        .collect::<Result<Vec<_>>>()?;
    engine.load_shards(pg, &shards)?;
    if let (Some(opt), Some(ometa)) = (optimizer, meta.optimizer) {
        opt.load_state_dict(&OptimizerStateDict {
            meta: ometa,
            tensors: by_name,
        })?;
    }
    Ok(())
}

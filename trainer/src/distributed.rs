//! Data-parallel training (DDP) in the Trainer, active when `WORLD_SIZE > 1`
//! ([`TrainingArguments::world_size`], set by `cargo xtask launch` or torchrun).
//!
//! What upstream's Trainer (through accelerate) does, and where it is done here:
//!
//! | upstream | here |
//! |---|---|
//! | `init_process_group(backend, timeout=ddp_timeout)`, once per process (`PartialState`) | [`with_process_group`]: one process-wide Gloo group, created on first use |
//! | `DistributedDataParallel(model, bucket_cap_mb=ddp_bucket_cap_mb)`: parameters broadcast from rank 0, gradients averaged in buckets | `Trainer::wrap_model_ddp`, `Trainer::all_reduce_gradients` (after the accumulation window's last backward, before clipping: DDP's `no_sync` on the other micro-batches) |
//! | `DataLoaderShard` / `BatchSamplerShard(even_batches=True)` | [`DataLoader::sharded`] with [`BatchSamplerShard`] |
//! | `_get_num_items_in_batch`: `gather(num_items).sum()` with `average_tokens_across_devices` | [`all_reduce_sum`] in `count_num_items_in_batch` |
//! | `compute_loss`: `loss *= num_processes` in that case (DDP averages the gradients) | `default_compute_loss` |
//! | `_nested_gather(tr_loss).mean()` for the logged loss | `Trainer::mean_across_processes` |
//! | `store_flos`: `distributed_broadcast_scalars([flos]).sum()` (float32) | `Trainer::store_flos` through [`all_reduce_sum_f32`] |
//! | `_track_num_input_tokens`: `gather(tokens).sum()` | `Trainer::track_num_input_tokens` through [`all_reduce_sum`] |
//! | `evaluation_loop`: `gather_for_metrics` (`pad_across_processes` with -100, the last step cut to the dataset's remainder) | `Trainer::gather_for_metrics` |
//! | `should_save` / `is_world_process_zero`: only rank 0 writes checkpoints, callbacks print only there | `Trainer::save_checkpoint` (other ranks: `save_checkpoint_elsewhere`), the state's `is_world_process_zero` |
//!
//! Approximations, each a documented difference from upstream:
//! * only parameters are broadcast at wrap time (upstream DDP also broadcasts buffers, and
//!   at every forward with `broadcast_buffers=True`); the models here keep no trained buffers;
//! * ranks other than 0 write nothing into a checkpoint (upstream writes
//!   `rng_state_{rank}.pth` there; here rank 0 writes the one `rng_state.safetensors` and
//!   every rank restores it: the ranks start from the same seed and draw the same amounts,
//!   so their generator states agree, see `checkpoint.rs`);
//! * the backend is accelerate's default, NCCL for a CUDA run and Gloo on the CPU, or
//!   `ddp_backend`; NCCL needs the `cuda` feature of `tchtrain-distributed` (this crate's
//!   `cuda` feature turns it on), and `nccl` on a CPU run is refused before the rendezvous
//!   (upstream fails at the first collective); the other names torch knows (`mpi`, `ccl`,
//!   `hccl`, `cncl`, `mccl`) are refused, libtorch's c10d here has no such backend;
//! * `find_unused_parameters` is not supported: every trainable parameter must receive a
//!   gradient in each window (DDP's default).

use std::sync::Mutex;

use tch::{Device, Kind, Tensor};
use tchtrain_distributed::{
    Backend, DEFAULT_BUCKET_CAP_MB, DistributedDataParallel, DistributedEnv, ProcessGroup, ReduceOp,
};
use tchtrain_training_args::TrainingArguments;

use crate::error::{Error, Result};
use crate::model_info::named_parameters;
use crate::trainer::Trainer;
use tchtrain_data::BatchSamplerShard;
use tchtrain_data::DataLoader;

/// torch.distributed's default process group: one per process, shared by every Trainer.
static DEFAULT_GROUP: Mutex<Option<ProcessGroup>> = Mutex::new(None);

/// Runs `f` on the process-wide group, creating it on first use from the torchrun
/// environment with `ddp_timeout` (upstream `init_process_group`); `Ok(None)` in a
/// single-process run (`WORLD_SIZE` unset or 1).
pub(crate) fn with_process_group<T>(
    args: &TrainingArguments,
    f: impl FnOnce(&mut ProcessGroup) -> Result<T>,
) -> Result<Option<T>> {
    if args.world_size() <= 1 {
        return Ok(None);
    }
    with_group(&DEFAULT_GROUP, args, f, || {
        DistributedEnv::from_env()?.ok_or(Error::InvalidArgument {
            field: "WORLD_SIZE",
            detail: "is above 1 but the launcher environment is incomplete".into(),
        })
    })
}

/// Runs `f` on the group in `slot`, created on first use with the run's backend and
/// `ddp_timeout` at the rendezvous `env` returns.
fn with_group<T>(
    slot: &Mutex<Option<ProcessGroup>>,
    args: &TrainingArguments,
    f: impl FnOnce(&mut ProcessGroup) -> Result<T>,
    env: impl FnOnce() -> Result<DistributedEnv>,
) -> Result<Option<T>> {
    let mut guard = slot.lock().unwrap_or_else(|e| e.into_inner());
    if guard.is_none() {
        let backend = ddp_backend(args, training_device(args))?;
        *guard = Some(ProcessGroup::new(
            backend,
            &env()?,
            args.ddp_timeout_delta(),
        )?);
    }
    match guard.as_mut() {
        Some(pg) => f(pg).map(Some),
        None => Ok(None),
    }
}

/// The group of a single-process sharded run (see [`with_sharding_group`]).
static SINGLE_PROCESS_GROUP: Mutex<Option<ProcessGroup>> = Mutex::new(None);

/// Runs `f` on the process group of a sharded (ZeRO / FSDP) run: the launcher's group in a
/// multi-process run ([`with_process_group`]); in a single-process run a world of one,
/// created on first use over a TCPStore on 127.0.0.1 (`MASTER_PORT` when set, else a free
/// port) with the run's backend, as DeepSpeed's `init_distributed` does for one GPU. Its
/// collectives are copies, so the engine's numbers are the unsharded ones; what it buys
/// is the engine itself (`offload_optimizer` on one GPU).
pub(crate) fn with_sharding_group<T>(
    args: &TrainingArguments,
    f: impl FnOnce(&mut ProcessGroup) -> Result<T>,
) -> Result<Option<T>> {
    if args.world_size() > 1 {
        return with_process_group(args, f);
    }
    with_group(&SINGLE_PROCESS_GROUP, args, f, || {
        let master_port = match std::env::var("MASTER_PORT") {
            Ok(p) => p.trim().parse().map_err(|_| Error::InvalidArgument {
                field: "MASTER_PORT",
                detail: format!("'{p}' is not a port number"),
            })?,
            Err(_) => std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .map_err(|e| Error::InvalidArgument {
                    field: "MASTER_PORT",
                    detail: format!(
                        "unset, and no free port on 127.0.0.1 for the single-process group: {e}"
                    ),
                })?,
        };
        Ok(DistributedEnv {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: 1,
            master_addr: "127.0.0.1".into(),
            master_port,
        })
    })
}

/// The device the Trainer trains on (upstream `TrainingArguments.device`): the CPU with
/// `use_cpu`, else CUDA device 0 when there is one (`LOCAL_RANK`'s device in a multi-GPU
/// run, which `ProcessGroupNCCL` binds), else the CPU.
pub(crate) fn training_device(args: &TrainingArguments) -> Device {
    if args.use_cpu {
        Device::Cpu
    } else {
        Device::cuda_if_available()
    }
}

/// The c10d backend of a run on `device`: `ddp_backend` when set, else accelerate's default
/// (NCCL for CUDA when this build has it, Gloo otherwise). Refused with the field named: a
/// name c10d here does not have, and `nccl` for a CPU run.
pub(crate) fn ddp_backend(args: &TrainingArguments, device: Device) -> Result<Backend> {
    let Some(name) = args.ddp_backend.as_deref() else {
        return Ok(Backend::default_for(device));
    };
    let backend = Backend::parse(name).map_err(|e| Error::InvalidArgument {
        field: "ddp_backend",
        detail: e.to_string(),
    })?;
    if backend == Backend::Nccl && !device.is_cuda() {
        return Err(Error::InvalidArgument {
            field: "ddp_backend",
            detail: "'nccl' runs collectives on CUDA tensors but this run trains on the CPU (use_cpu, or no CUDA device visible): use 'gloo' or leave ddp_backend unset".into(),
        });
    }
    Ok(backend)
}

/// The sum of `value` over every process (itself in a single-process run), in float64.
pub(crate) fn all_reduce_sum(args: &TrainingArguments, value: f64) -> Result<f64> {
    Ok(
        with_process_group(args, |pg| Ok(pg.all_reduce_scalar(value, ReduceOp::Sum)?))?
            .unwrap_or(value),
    )
}

/// The sum of `value` over every process as upstream's `distributed_broadcast_scalars`
/// computes it: a float32 tensor (itself, unrounded, in a single-process run).
pub(crate) fn all_reduce_sum_f32(args: &TrainingArguments, value: f64) -> Result<f64> {
    Ok(with_process_group(args, |pg| {
        let mut t = Tensor::f_from_slice(&[value as f32])?.f_to_device(pg.device())?;
        pg.all_reduce(&mut t, ReduceOp::Sum)?;
        Ok(t.f_double_value(&[0])?)
    })?
    .unwrap_or(value))
}

/// `torch.distributed.barrier()` (nothing in a single-process run).
pub(crate) fn barrier(args: &TrainingArguments) -> Result<()> {
    with_process_group(args, |pg| Ok(pg.barrier()?))?;
    Ok(())
}

impl Trainer {
    /// Upstream `is_world_process_zero`: whether this process is rank 0 of the run (the
    /// one that writes checkpoints and whose callbacks print).
    pub fn is_world_process_zero(&self) -> bool {
        self.args.process_index() == 0
    }

    /// Upstream `is_local_process_zero`: whether this process is rank 0 on its machine.
    pub fn is_local_process_zero(&self) -> bool {
        self.args.local_process_index() == 0
    }

    /// accelerate's `prepare_data_loader`: in a data-parallel run, this process's shard of
    /// `loader` (see [`BatchSamplerShard`]); the loader itself otherwise.
    pub(crate) fn prepare_data_loader(&self, loader: DataLoader) -> DataLoader {
        let world = self.args.world_size();
        if world <= 1 {
            return loader;
        }
        loader.sharded(BatchSamplerShard::new(world, self.args.process_index()))
    }

    /// Wraps the model's parameters in [`DistributedDataParallel`] (broadcasting rank 0's
    /// values) at the start of training; nothing in a single-process run.
    pub(crate) fn wrap_model_ddp(&mut self) -> Result<()> {
        let params: Vec<Tensor> = named_parameters(&*self.model)
            .into_iter()
            .map(|(_, t)| t)
            .collect();
        let cap = self
            .args
            .ddp_bucket_cap_mb
            .map_or(DEFAULT_BUCKET_CAP_MB, |mb| mb as f64);
        self.ddp = with_process_group(&self.args, |pg| {
            Ok(DistributedDataParallel::new(pg, params, cap)?)
        })?;
        Ok(())
    }

    /// Averages the gradients over the processes (DDP's bucketed all-reduce), once per
    /// accumulation window, before clipping; nothing in a single-process run.
    pub(crate) fn all_reduce_gradients(&mut self) -> Result<()> {
        let Some(ddp) = &self.ddp else {
            return Ok(());
        };
        with_process_group(&self.args, |pg| Ok(ddp.all_reduce_gradients(pg)?))?;
        Ok(())
    }

    /// Upstream `nested_gather(t).mean().item()` for a 0-d float tensor: the mean over the
    /// processes (the value itself in a single-process run).
    pub(crate) fn mean_across_processes(&self, t: &Tensor) -> Result<f64> {
        let world = self.args.world_size();
        let mean = with_process_group(&self.args, |pg| {
            let mut all = t.f_to_kind(Kind::Float)?.f_reshape([1])?.f_contiguous()?;
            all = all.copy();
            pg.all_reduce(&mut all, ReduceOp::Sum)?;
            Ok(all.f_div_scalar(world as f64)?.f_double_value(&[0])?)
        })?;
        match mean {
            Some(m) => Ok(m),
            None => Ok(t.f_double_value(&[])?),
        }
    }

    /// accelerate's `gather_for_metrics` over a whole evaluation: every process's losses,
    /// predictions and labels (concatenated per process, padded along dim 1 with -100 to the
    /// longest across processes as `pad_across_processes`), gathered in the global batch
    /// order (step by step, rank by rank), cut to the dataset's length unless `drop_last`
    /// (the padding rows of the last step). Each list then holds one tensor. Nothing in a
    /// single-process run.
    pub(crate) fn gather_for_metrics(
        &self,
        lists: [&mut Vec<Tensor>; 3],
        loader: &DataLoader,
    ) -> Result<()> {
        if self.args.world_size() <= 1 {
            return Ok(());
        }
        let rows_per_batch = loader.batch_size() as i64;
        let keep = (!self.args.dataloader_drop_last).then(|| loader.num_examples() as i64);
        for list in lists {
            // Every process has items in the same lists (they run the same number of
            // full batches), so the collectives below pair up.
            let has = i64::from(!list.is_empty());
            let has = with_process_group(&self.args, |pg| {
                let mut t = Tensor::f_from_slice(&[has])?.f_to_device(pg.device())?;
                pg.all_reduce(&mut t, ReduceOp::Min)?;
                Ok(t.f_int64_value(&[0])?)
            })?;
            if has == Some(0) {
                list.clear();
                continue;
            }
            let local = crate::evaluation::concat_padded(list)?;
            let gathered = with_process_group(&self.args, |pg| {
                gather_in_batch_order(pg, &local, rows_per_batch, keep)
            })?;
            if let Some(g) = gathered {
                *list = vec![g];
            }
        }
        Ok(())
    }

    /// A checkpoint save on a process that does not write (`should_save` is false): the
    /// bookkeeping upstream's `_save_checkpoint` does on every rank (flos, the barrier
    /// before the best checkpoint is looked up, `best_model_checkpoint`).
    pub(crate) fn save_checkpoint_elsewhere(&mut self) -> Result<()> {
        self.store_flos()?;
        let tmp = std::path::PathBuf::from(self.args.output_dir()).join(format!(
            "tmp-{}-{}",
            crate::checkpoint::PREFIX_CHECKPOINT_DIR,
            self.state.global_step
        ));
        // Writes this rank's shards into rank 0's folder (zero.rs); nothing unsharded.
        self.save_sharded_state(&tmp)?;
        if self.args.save_strategy != tchtrain_training_args::SaveStrategy::No
            && let Some(best_step) = self.state.best_global_step
        {
            barrier(&self.args)?;
            let run_dir = std::path::PathBuf::from(self.args.output_dir());
            let best = run_dir.join(format!(
                "{}-{best_step}",
                crate::checkpoint::PREFIX_CHECKPOINT_DIR
            ));
            if best.exists() || best_step == self.state.global_step {
                self.state.best_model_checkpoint = Some(best.display().to_string());
            }
        }
        Ok(())
    }
}

/// All-gathers `local` (`[steps * rows_per_batch, ...]` on each process) and reorders it
/// from rank-major to the global batch order; keeps the first `keep` rows when given.
fn gather_in_batch_order(
    pg: &mut ProcessGroup,
    local: &Tensor,
    rows_per_batch: i64,
    keep: Option<i64>,
) -> Result<Tensor> {
    let world = i64::from(pg.world_size());
    // The group's device (NCCL: this rank's GPU; evaluation lists may sit on the CPU).
    let mut local = local.f_to_device(pg.device())?.f_contiguous()?;
    if local.dim() >= 2 {
        // pad_across_processes(dim=1, pad_index=-100)
        let len = local.size()[1];
        let mut max = Tensor::f_from_slice(&[len])?.f_to_device(pg.device())?;
        pg.all_reduce(&mut max, ReduceOp::Max)?;
        let max = max.f_int64_value(&[0])?;
        if max > len {
            let mut size = local.size();
            size[1] = max - len;
            let fill = Tensor::f_full(&size, -100.0, (local.kind(), local.device()))?;
            local = Tensor::f_cat(&[local, fill], 1)?.f_contiguous()?;
        }
    }
    let size = local.size();
    let rows = size.first().copied().unwrap_or(1);
    let mut out_size = size.clone();
    if out_size.is_empty() {
        out_size.push(world);
    } else {
        out_size[0] = rows * world;
    }
    let mut out = Tensor::f_empty(&out_size, (local.kind(), local.device()))?;
    pg.all_gather_into(&mut out, &local)?;
    let steps = if rows_per_batch > 0 && rows % rows_per_batch == 0 {
        rows / rows_per_batch
    } else {
        0
    };
    let mut ordered = if steps > 0 && !size.is_empty() {
        // [world, steps, batch, ...] -> [steps, world, batch, ...]
        let mut split = vec![world, steps, rows_per_batch];
        split.extend_from_slice(&size[1..]);
        out.f_view(split.as_slice())?
            .f_transpose(0, 1)?
            .f_contiguous()?
            .f_view(out_size.as_slice())?
    } else {
        log::warn!(
            "gather_for_metrics: a process's evaluation rows ({rows}) are not whole batches of {rows_per_batch}; gathered in rank order"
        );
        out
    };
    if let Some(keep) = keep
        && ordered.dim() >= 1
        && keep < ordered.size()[0]
    {
        ordered = ordered.f_narrow(0, 0, keep)?;
    }
    Ok(ordered)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(backend: Option<&str>) -> TrainingArguments {
        TrainingArguments {
            ddp_backend: backend.map(str::to_string),
            ..TrainingArguments::new("unused")
        }
    }

    #[test]
    fn ddp_backend_defaults_and_refusals() {
        assert_eq!(
            ddp_backend(&args(None), Device::Cpu).unwrap(),
            Backend::Gloo
        );
        assert_eq!(
            ddp_backend(&args(Some("gloo")), Device::Cpu).unwrap(),
            Backend::Gloo
        );
        // accelerate's default for a CUDA run: NCCL, when this build has it.
        assert_eq!(
            ddp_backend(&args(None), Device::Cuda(0)).unwrap(),
            if Backend::Nccl.is_built() {
                Backend::Nccl
            } else {
                Backend::Gloo
            }
        );
        assert_eq!(
            ddp_backend(&args(Some("nccl")), Device::Cuda(0)).unwrap(),
            Backend::Nccl
        );
        let err = ddp_backend(&args(Some("nccl")), Device::Cpu)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "invalid `ddp_backend`: 'nccl' runs collectives on CUDA tensors but this run trains on the CPU (use_cpu, or no CUDA device visible): use 'gloo' or leave ddp_backend unset"
        );
        let err = ddp_backend(&args(Some("mpi")), Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("invalid `ddp_backend`: process group backend 'mpi' is unavailable"),
            "{err}"
        );
    }
}

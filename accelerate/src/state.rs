//! accelerate's `PartialState`: where this process stands in the run (rank, world size,
//! device) and torch.distributed's default process group.
//!
//! As in accelerate (whose `PartialState` shares one state across every instance) and
//! torch.distributed (one default group per process), the group is process-wide: created
//! on first use from the launcher's environment (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
//! `MASTER_PORT`, set by `cargo xtask launch` or torchrun) with the state's backend and
//! timeout, then shared by every Trainer and Accelerator of the process. A single-process
//! run creates none, except for a sharded engine (see [`PartialState::with_sharding_group`]).

use std::sync::Mutex;
use std::time::Duration;

use tch::{Device, Tensor};
use tchtrain_distributed::{Backend, DistributedEnv, ProcessGroup, ReduceOp};

use crate::error::{Error, Result};

/// torch.distributed's default process group: one per process.
static DEFAULT_GROUP: Mutex<Option<ProcessGroup>> = Mutex::new(None);

/// The group of a single-process sharded run (see [`PartialState::with_sharding_group`]).
static SINGLE_PROCESS_GROUP: Mutex<Option<ProcessGroup>> = Mutex::new(None);

/// An environment variable as a number.
fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok()?.trim().parse().ok()
}

/// accelerate's `PartialState`: this process's rank, the run's size, the device, and the
/// settings its process group is created with (accelerate's `InitProcessGroupKwargs`).
#[derive(Debug, Clone)]
pub struct PartialState {
    device: Device,
    backend: Option<String>,
    timeout: Duration,
}

impl PartialState {
    /// The state of a run on `device`; `backend` (`None`: accelerate's default for the
    /// device, NCCL for CUDA when built, else Gloo) and `timeout` are used when the process
    /// group is created.
    pub fn new(device: Device, backend: Option<String>, timeout: Duration) -> Self {
        Self {
            device,
            backend,
            timeout,
        }
    }

    /// The device this process computes on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// `num_processes`: `WORLD_SIZE`, else 1.
    pub fn num_processes(&self) -> usize {
        env_usize("WORLD_SIZE").filter(|&n| n > 0).unwrap_or(1)
    }

    /// `process_index`: `RANK`, else 0.
    pub fn process_index(&self) -> usize {
        env_usize("RANK").unwrap_or(0)
    }

    /// `local_process_index`: `LOCAL_RANK`, else 0.
    pub fn local_process_index(&self) -> usize {
        env_usize("LOCAL_RANK").unwrap_or(0)
    }

    /// `is_main_process`: rank 0 of the run.
    pub fn is_main_process(&self) -> bool {
        self.process_index() == 0
    }

    /// `use_distributed`: more than one process.
    pub fn use_distributed(&self) -> bool {
        self.num_processes() > 1
    }

    /// The c10d backend: the one asked for, else accelerate's default (NCCL for a CUDA
    /// run when this build has it, Gloo otherwise). Refused with the field named
    /// (`ddp_backend`): a name c10d here does not have, and `nccl` for a CPU run.
    pub fn backend(&self) -> Result<Backend> {
        backend_for(self.backend.as_deref(), self.device)
    }

    /// Runs `f` on the process-wide group, creating it on first use (upstream
    /// `init_process_group`); `Ok(None)` in a single-process run.
    pub fn with_process_group<T>(
        &self,
        f: impl FnOnce(&mut ProcessGroup) -> Result<T>,
    ) -> Result<Option<T>> {
        if !self.use_distributed() {
            return Ok(None);
        }
        self.with_group(&DEFAULT_GROUP, f, || {
            DistributedEnv::from_env()?.ok_or(Error::InvalidArgument {
                field: "WORLD_SIZE",
                detail: "is above 1 but the launcher environment is incomplete".into(),
            })
        })
    }

    /// Runs `f` on the process group of a sharded (ZeRO / FSDP) engine: the launcher's
    /// group in a multi-process run; in a single-process run a world of one, created on
    /// first use over a TCPStore on 127.0.0.1 (`MASTER_PORT` when set, else a free port),
    /// as DeepSpeed's `init_distributed` does for one GPU. Its collectives are copies, so
    /// the engine's numbers are the unsharded ones; what it buys is the engine itself
    /// (`offload_optimizer` on one GPU).
    pub fn with_sharding_group<T>(
        &self,
        f: impl FnOnce(&mut ProcessGroup) -> Result<T>,
    ) -> Result<Option<T>> {
        if self.use_distributed() {
            return self.with_process_group(f);
        }
        self.with_group(&SINGLE_PROCESS_GROUP, f, || {
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

    /// Runs `f` on the group in `slot`, created on first use with the state's backend and
    /// timeout at the rendezvous `env` returns.
    fn with_group<T>(
        &self,
        slot: &Mutex<Option<ProcessGroup>>,
        f: impl FnOnce(&mut ProcessGroup) -> Result<T>,
        env: impl FnOnce() -> Result<DistributedEnv>,
    ) -> Result<Option<T>> {
        let mut guard = slot.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            let backend = self.backend()?;
            *guard = Some(ProcessGroup::new(backend, &env()?, self.timeout)?);
        }
        match guard.as_mut() {
            Some(pg) => f(pg).map(Some),
            None => Ok(None),
        }
    }

    /// `wait_for_everyone`: `torch.distributed.barrier()` (nothing in a single-process run).
    pub fn wait_for_everyone(&self) -> Result<()> {
        self.with_process_group(|pg| Ok(pg.barrier()?))?;
        Ok(())
    }

    /// `value` reduced over every process with `op`, in float64 (itself in a
    /// single-process run).
    pub fn reduce_scalar(&self, value: f64, op: ReduceOp) -> Result<f64> {
        Ok(self
            .with_process_group(|pg| Ok(pg.all_reduce_scalar(value, op)?))?
            .unwrap_or(value))
    }

    /// The sum of `value` over every process as a float32 tensor, as upstream's
    /// `distributed_broadcast_scalars([value]).sum()` computes it (itself, unrounded, in a
    /// single-process run).
    pub fn reduce_sum_f32(&self, value: f64) -> Result<f64> {
        Ok(self
            .with_process_group(|pg| {
                let mut t = Tensor::f_from_slice(&[value as f32])?.f_to_device(pg.device())?;
                pg.all_reduce(&mut t, ReduceOp::Sum)?;
                Ok(t.f_double_value(&[0])?)
            })?
            .unwrap_or(value))
    }
}

/// accelerate's device for this process (`PartialState.device`): the CPU with `cpu` (upstream's
/// `use_cpu`) or when no CUDA device is visible, else `cuda:LOCAL_RANK`, the device
/// ProcessGroupNCCL binds this rank to (`CUDA_VISIBLE_DEVICES` renumbers the visible
/// devices from 0, as for torch). A `LOCAL_RANK` past the visible devices is refused.
pub fn default_device(cpu: bool) -> Result<Device> {
    device_for_rank(
        cpu,
        tch::Cuda::device_count(),
        env_usize("LOCAL_RANK").unwrap_or(0),
    )
}

/// [`default_device`] for `cuda_devices` visible devices and this `local_rank`.
pub fn device_for_rank(cpu: bool, cuda_devices: i64, local_rank: usize) -> Result<Device> {
    if cpu || cuda_devices <= 0 {
        return Ok(Device::Cpu);
    }
    if local_rank as i64 >= cuda_devices {
        return Err(Error::InvalidArgument {
            field: "LOCAL_RANK",
            detail: format!(
                "local rank {local_rank} has no CUDA device: {cuda_devices} visible (CUDA_VISIBLE_DEVICES); launch at most {cuda_devices} processes per node (--nproc-per-node), or train on the CPU with --use_cpu"
            ),
        });
    }
    Ok(Device::Cuda(local_rank))
}

/// The c10d backend of a run on `device`: `name` when given, else accelerate's default.
/// Refused with the field named (`ddp_backend`): a name c10d here does not have, and
/// `nccl` for a CPU run.
pub fn backend_for(name: Option<&str>, device: Device) -> Result<Backend> {
    let Some(name) = name else {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rank_trains_on_its_local_ranks_device() {
        // Faked device counts: no GPU is needed to check the choice.
        assert_eq!(device_for_rank(false, 0, 3).unwrap(), Device::Cpu);
        assert_eq!(device_for_rank(true, 8, 3).unwrap(), Device::Cpu);
        assert_eq!(device_for_rank(false, 8, 0).unwrap(), Device::Cuda(0));
        assert_eq!(device_for_rank(false, 8, 3).unwrap(), Device::Cuda(3));
        let err = device_for_rank(false, 2, 2).unwrap_err().to_string();
        assert!(
            err.starts_with("invalid `LOCAL_RANK`: local rank 2 has no CUDA device: 2 visible"),
            "{err}"
        );
        // Here (no GPU) every rank is on the CPU.
        if tch::Cuda::device_count() == 0 {
            assert_eq!(default_device(false).unwrap(), Device::Cpu);
        }
    }

    #[test]
    fn backend_defaults_and_refusals() {
        assert_eq!(backend_for(None, Device::Cpu).unwrap(), Backend::Gloo);
        assert_eq!(
            backend_for(Some("gloo"), Device::Cpu).unwrap(),
            Backend::Gloo
        );
        // accelerate's default for a CUDA run: NCCL, when this build has it.
        assert_eq!(
            backend_for(None, Device::Cuda(0)).unwrap(),
            if Backend::Nccl.is_built() {
                Backend::Nccl
            } else {
                Backend::Gloo
            }
        );
        assert_eq!(
            backend_for(Some("nccl"), Device::Cuda(0)).unwrap(),
            Backend::Nccl
        );
        let err = backend_for(Some("nccl"), Device::Cpu)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "invalid `ddp_backend`: 'nccl' runs collectives on CUDA tensors but this run trains on the CPU (use_cpu, or no CUDA device visible): use 'gloo' or leave ddp_backend unset"
        );
        let err = backend_for(Some("mpi"), Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("invalid `ddp_backend`: process group backend 'mpi' is unavailable"),
            "{err}"
        );
    }
}

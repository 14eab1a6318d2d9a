//! `ProcessGroup`: libtorch's c10d `ProcessGroupGloo` (CPU tensors) or, with the `cuda`
//! feature, `ProcessGroupNCCL` (CUDA tensors) behind a TCPStore rendezvous, with the
//! collectives of `torch.distributed` on tch tensors, in place. Engine errors (a dead peer,
//! a timeout) come back as [`Error::Collective`], never a hang or an abort.

use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use tch::{Device, Kind, Tensor};

use crate::env::DistributedEnv;
use crate::ffi::{self, RawGroup};
use crate::{Error, Result};

/// Upstream's default `ddp_timeout` (1800 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

/// `torch.distributed.ReduceOp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Sum divided by the world size (done as a sum then a division: Gloo has no AVG).
    Avg,
    /// Product.
    Product,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
}

impl ReduceOp {
    pub(crate) fn code(self) -> i32 {
        match self {
            ReduceOp::Sum | ReduceOp::Avg => 0,
            ReduceOp::Product => 1,
            ReduceOp::Min => 2,
            ReduceOp::Max => 3,
        }
    }
}

/// A c10d backend (`init_process_group(backend=...)`, the Trainer's `ddp_backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Gloo: CPU tensors (always built).
    Gloo,
    /// NCCL: CUDA tensors, one device per process (the `cuda` feature).
    Nccl,
}

impl Backend {
    /// The name torch uses (`"gloo"`, `"nccl"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Gloo => "gloo",
            Backend::Nccl => "nccl",
        }
    }

    /// Parses a `ddp_backend` value. The other names torch accepts (`mpi`, `ccl`, `hccl`,
    /// `cncl`, `mccl`, `xccl`) are backends libtorch's c10d does not carry here.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "gloo" => Ok(Backend::Gloo),
            "nccl" => Ok(Backend::Nccl),
            other => Err(Error::BackendUnavailable {
                backend: other.to_string(),
                detail: "this build has 'gloo' (CPU tensors) and, with the `cuda` feature, 'nccl' (CUDA tensors)".into(),
            }),
        }
    }

    /// accelerate's default: NCCL for a CUDA device when this build has it, Gloo otherwise.
    pub fn default_for(device: Device) -> Self {
        if device.is_cuda() && ffi::has_nccl() {
            Backend::Nccl
        } else {
            Backend::Gloo
        }
    }

    /// Whether this build can create this backend's groups (NCCL: built with `cuda`).
    pub fn is_built(self) -> bool {
        match self {
            Backend::Gloo => true,
            Backend::Nccl => ffi::has_nccl(),
        }
    }
}

/// Waits until something accepts TCP connections at `addr:port` (rank 0's TCPStore), for at
/// most `timeout`. libtorch's TCPStore client retries with a backoff that can run seconds
/// past its timeout and reports a refused port with a C++ backtrace; this wait gives the
/// other ranks a bounded, plain answer first. The probe connections carry no data.
fn wait_for_store(addr: &str, port: u16, timeout: Duration) -> std::result::Result<(), String> {
    let start = Instant::now();
    let mut last = String::from("no attempt");
    loop {
        let remaining = timeout.saturating_sub(start.elapsed());
        match (addr, port).to_socket_addrs() {
            Ok(addrs) => {
                for a in addrs {
                    let wait = remaining.clamp(Duration::from_millis(10), Duration::from_secs(1));
                    match TcpStream::connect_timeout(&a, wait) {
                        Ok(_) => return Ok(()),
                        Err(e) => last = e.to_string(),
                    }
                }
            }
            Err(e) => last = format!("cannot resolve {addr}: {e}"),
        }
        if start.elapsed() >= timeout {
            return Err(format!(
                "nothing accepted a connection at {addr}:{port} in {:.1} s ({last}): rank 0 is not serving the store there",
                start.elapsed().as_secs_f64()
            ));
        }
        std::thread::sleep(Duration::from_millis(50).min(timeout.saturating_sub(start.elapsed())));
    }
}

/// A process group over libtorch's c10d (Gloo or NCCL backend).
#[derive(Debug)]
pub struct ProcessGroup {
    raw: RawGroup,
    rank: i32,
    world_size: i32,
    backend: Backend,
    device: Device,
}

/// The rendezvous error of `env` with `timeout`, from libtorch's message.
fn rendezvous_error(env: &DistributedEnv, timeout: Duration) -> impl Fn(String) -> Error + '_ {
    move |message: String| Error::Rendezvous {
        addr: format!("{}:{}", env.master_addr, env.master_port),
        rank: env.rank,
        world_size: env.world_size,
        timeout_s: timeout.as_secs_f64(),
        message: message.trim_end().trim_end_matches('.').to_string(),
    }
}

fn timeout_ms(timeout: Duration) -> i64 {
    i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX)
}

impl ProcessGroup {
    /// `init_process_group("gloo", init_method="env://", timeout=...)`: rendezvous at
    /// `MASTER_ADDR:MASTER_PORT` (rank 0 serves the TCPStore) and build the Gloo group.
    /// `GLOO_SOCKET_IFNAME` picks the network interface as in PyTorch.
    ///
    /// Every rank gives up with [`Error::Rendezvous`] once `timeout` has passed (libtorch
    /// rounds rank 0's wait for the others up to whole seconds): rank 0 when not every
    /// rank joined, the others when nothing accepts connections at
    /// `MASTER_ADDR:MASTER_PORT` (a wrong port or address, rank 0 not started).
    pub fn new_gloo(env: &DistributedEnv, timeout: Duration) -> Result<Self> {
        let iface = std::env::var("GLOO_SOCKET_IFNAME").ok();
        Self::rendezvous(env, timeout, Backend::Gloo, Device::Cpu, |ms| {
            RawGroup::new_gloo(
                &env.master_addr,
                env.master_port,
                env.rank,
                env.world_size,
                ms,
                iface.as_deref(),
            )
        })
    }

    /// The rendezvous every backend shares: ranks other than 0 wait (bounded) for rank 0's
    /// TCPStore, then `make` builds the group with the timeout in milliseconds; failures
    /// become [`Error::Rendezvous`].
    fn rendezvous(
        env: &DistributedEnv,
        timeout: Duration,
        backend: Backend,
        device: Device,
        make: impl FnOnce(i64) -> std::result::Result<RawGroup, String>,
    ) -> Result<Self> {
        if env.rank != 0 {
            wait_for_store(&env.master_addr, env.master_port, timeout)
                .map_err(rendezvous_error(env, timeout))?;
        }
        let raw = make(timeout_ms(timeout)).map_err(rendezvous_error(env, timeout))?;
        Ok(Self {
            raw,
            rank: env.rank,
            world_size: env.world_size,
            backend,
            device,
        })
    }

    /// `init_process_group("nccl", ...)` on CUDA device `LOCAL_RANK` (torchrun's one GPU
    /// per process), after the same TCPStore rendezvous as [`Self::new_gloo`]. Collectives
    /// then take tensors on that device. Unless `TORCH_NCCL_BLOCKING_WAIT` is set, the
    /// shim sets it to 1, so a dead peer or a hang ends in [`Error::Collective`] after
    /// `timeout` rather than in the NCCL watchdog's abort.
    ///
    /// [`Error::BackendUnavailable`] when this build has no NCCL (the `cuda` feature is
    /// off) or no CUDA device `LOCAL_RANK` is visible.
    pub fn new_nccl(env: &DistributedEnv, timeout: Duration) -> Result<Self> {
        let unavailable = |detail: String| Error::BackendUnavailable {
            backend: "nccl".into(),
            detail,
        };
        if !ffi::has_nccl() {
            return Err(unavailable(
                "tchtrain-distributed was built without its `cuda` feature: rebuild with `--features tchtrain-distributed/cuda` (a CUDA libtorch), or use ddp_backend='gloo'".into(),
            ));
        }
        let count = tch::Cuda::device_count();
        let index = usize::try_from(env.local_rank)
            .ok()
            .filter(|&i| i64::try_from(i).is_ok_and(|i| i < count));
        let Some(index) = index else {
            return Err(unavailable(format!(
                "LOCAL_RANK={} needs CUDA device {} but this process sees {count} CUDA device(s) (CUDA_VISIBLE_DEVICES, the driver): start at most {count} ranks per machine, or use ddp_backend='gloo' on CPU",
                env.local_rank, env.local_rank
            )));
        };
        let device = Device::Cuda(index);
        Self::rendezvous(env, timeout, Backend::Nccl, device, |ms| {
            RawGroup::new_nccl(
                &env.master_addr,
                env.master_port,
                env.rank,
                env.world_size,
                ms,
                env.local_rank,
            )
        })
    }

    /// [`Self::new_gloo`] or [`Self::new_nccl`] by `backend`.
    pub fn new(backend: Backend, env: &DistributedEnv, timeout: Duration) -> Result<Self> {
        match backend {
            Backend::Gloo => Self::new_gloo(env, timeout),
            Backend::Nccl => Self::new_nccl(env, timeout),
        }
    }

    /// The backend of this group.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The device this group's collectives take tensors on (CPU for Gloo, this rank's
    /// CUDA device for NCCL).
    pub fn device(&self) -> Device {
        self.device
    }

    /// The shim's group, for what is built over it (DDP's reducer).
    pub(crate) fn raw_mut(&mut self) -> &mut RawGroup {
        &mut self.raw
    }

    /// This process's rank.
    pub fn rank(&self) -> i32 {
        self.rank
    }

    /// Number of processes.
    pub fn world_size(&self) -> i32 {
        self.world_size
    }

    fn err(rank: i32, op: &'static str) -> impl FnOnce(String) -> Error + use<> {
        move |message| Error::Collective { op, rank, message }
    }

    fn check_contiguous(t: &Tensor, op: &'static str) -> Result<()> {
        if !t.is_contiguous() {
            return Err(Error::InvalidTensor {
                op,
                detail: "tensor must be contiguous".into(),
            });
        }
        Ok(())
    }

    /// `all_reduce(t, op)` in place.
    pub fn all_reduce(&mut self, t: &mut Tensor, op: ReduceOp) -> Result<()> {
        Self::check_contiguous(t, "all_reduce")?;
        let e = Self::err(self.rank, "all_reduce");
        self.raw.all_reduce(t, op.code()).map_err(e)?;
        if op == ReduceOp::Avg {
            let _ = t.f_div_scalar_(f64::from(self.world_size))?;
        }
        Ok(())
    }

    /// `broadcast(t, src=root)` in place.
    pub fn broadcast(&mut self, t: &mut Tensor, root: i32) -> Result<()> {
        Self::check_contiguous(t, "broadcast")?;
        if root < 0 || root >= self.world_size {
            return Err(Error::InvalidTensor {
                op: "broadcast",
                detail: format!("root {root} outside 0..{}", self.world_size),
            });
        }
        let e = Self::err(self.rank, "broadcast");
        self.raw.broadcast(t, root).map_err(e)
    }

    /// `all_gather_into_tensor(out, input)`: `out` holds `world_size` copies of `input`'s
    /// shape concatenated along dim 0, in rank order.
    pub fn all_gather_into(&mut self, out: &mut Tensor, input: &Tensor) -> Result<()> {
        Self::check_contiguous(out, "all_gather")?;
        Self::check_contiguous(input, "all_gather")?;
        if out.numel() != input.numel() * self.world_size as usize {
            return Err(Error::InvalidTensor {
                op: "all_gather",
                detail: format!(
                    "output has {} elements, expected world_size x {}",
                    out.numel(),
                    input.numel()
                ),
            });
        }
        let e = Self::err(self.rank, "all_gather");
        self.raw.all_gather(out, input).map_err(e)
    }

    /// `reduce_scatter_tensor(out, input, op)`: rank r receives the reduction of chunk r of
    /// every rank's `input`. On CPU Gloo's reduce-scatter is slow; [`Self::reduce_scatter_via_all_reduce`]
    /// is the faster equivalent there.
    pub fn reduce_scatter(&mut self, out: &mut Tensor, input: &Tensor, op: ReduceOp) -> Result<()> {
        Self::check_contiguous(out, "reduce_scatter")?;
        Self::check_contiguous(input, "reduce_scatter")?;
        if input.numel() != out.numel() * self.world_size as usize {
            return Err(Error::InvalidTensor {
                op: "reduce_scatter",
                detail: format!(
                    "input has {} elements, expected world_size x {}",
                    input.numel(),
                    out.numel()
                ),
            });
        }
        let e = Self::err(self.rank, "reduce_scatter");
        self.raw.reduce_scatter(out, input, op.code()).map_err(e)?;
        if op == ReduceOp::Avg {
            let _ = out.f_div_scalar_(f64::from(self.world_size))?;
        }
        Ok(())
    }

    /// Reduce-scatter computed as an all-reduce of a copy followed by taking this rank's
    /// chunk (faster than Gloo's reduce-scatter on CPU).
    pub fn reduce_scatter_via_all_reduce(
        &mut self,
        out: &mut Tensor,
        input: &Tensor,
        op: ReduceOp,
    ) -> Result<()> {
        if input.numel() != out.numel() * self.world_size as usize {
            return Err(Error::InvalidTensor {
                op: "reduce_scatter",
                detail: format!(
                    "input has {} elements, expected world_size x {}",
                    input.numel(),
                    out.numel()
                ),
            });
        }
        let mut full = input.f_contiguous()?.copy();
        self.all_reduce(&mut full, op)?;
        let n = out.numel() as i64;
        let chunk = full
            .f_flatten(0, -1)?
            .f_narrow(0, i64::from(self.rank) * n, n)?
            .f_view_as(out)?;
        tch::no_grad(|| out.f_copy_(&chunk))?;
        Ok(())
    }

    /// `barrier()`.
    pub fn barrier(&mut self) -> Result<()> {
        let e = Self::err(self.rank, "barrier");
        self.raw.barrier().map_err(e)
    }

    /// All-reduces a scalar (e.g. `num_items_in_batch` across ranks).
    pub fn all_reduce_scalar(&mut self, value: f64, op: ReduceOp) -> Result<f64> {
        let mut t = Tensor::f_from_slice(&[value])?
            .f_to_kind(Kind::Double)?
            .f_to_device(self.device)?;
        self.all_reduce(&mut t, op)?;
        Ok(t.f_double_value(&[0])?)
    }
}

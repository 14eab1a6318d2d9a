//! Upstream `TrainerMemoryTracker` (trainer_utils.py), on for `skip_memory_metrics=False`:
//! the process's resident memory (psutil's `memory_info().rss`, here `VmRSS` of `/proc/self/status`) at
//! the start and the end of each stage (`init`, `train`, `eval`, `test`), and its peak in
//! between (a thread polling it), reported as `{stage}_mem_cpu_alloc_delta` (end - start)
//! and `{stage}_mem_cpu_peaked_delta` (peak - end, at least 0), in bytes; the first report
//! also carries the `init` stage's and `before_init_mem_cpu`. A stage started inside another
//! (evaluation during training) is not tracked, as upstream.
//!
//! When CUDA is available (as upstream, whether or not the run uses it), the CUDA caching
//! allocator's counters too, on the run's CUDA device (device 0 for a CPU run, torch's
//! current device): at a stage's start the peak is reset and the cache emptied, then
//! `memory_allocated()` read; at its end the cache is emptied and `memory_allocated()` /
//! `max_memory_allocated()` read: `{stage}_mem_gpu_alloc_delta`,
//! `{stage}_mem_gpu_peaked_delta` and `before_init_mem_gpu`, each after its CPU
//! counterpart as upstream's dictionary orders them.
//!
//! Upstream's poller spins without pausing (a core busy for the stage); this one reads every
//! millisecond.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use tch::Device;

use crate::metrics::Metrics;

/// The CUDA device whose allocator upstream reads (`torch.cuda.memory_allocated()`: the
/// current device), when CUDA is available.
fn gpu_of(device: Device) -> Option<Device> {
    match device {
        Device::Cuda(_) => Some(device),
        _ if tch::Cuda::is_available() => Some(Device::Cuda(0)),
        _ => None,
    }
}

/// `torch.cuda.empty_cache()`, then `memory_allocated()` and `max_memory_allocated()`
/// (zeros when the allocator cannot be read: upstream would have failed at import).
fn gpu_counters(gpu: Device) -> (u64, u64) {
    let _ = tchtrain_accelerate::clear_device_cache(gpu);
    let (now, peak) = tchtrain_accelerate::memory_allocated(gpu).unwrap_or((0, 0));
    (now.max(0) as u64, peak.max(0) as u64)
}

/// The resident set size in bytes (`VmRSS` of `/proc/self/status`, what psutil's
/// `memory_info().rss` reads from `statm` times the page size).
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// One finished stage: start, end and peak bytes (resident, or the GPU allocator's).
#[derive(Debug, Clone, Copy)]
struct Stage {
    begin: u64,
    end: u64,
    peak: u64,
}

impl Stage {
    fn alloc_delta(&self) -> f64 {
        self.end as f64 - self.begin as f64
    }

    fn peaked_delta(&self) -> f64 {
        self.peak.saturating_sub(self.end) as f64
    }
}

/// The running stage's poller.
#[derive(Debug)]
struct Running {
    name: &'static str,
    begin: u64,
    /// The GPU allocator's bytes at the start.
    gpu_begin: Option<u64>,
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    poller: JoinHandle<()>,
}

/// Upstream `TrainerMemoryTracker` (see the module documentation).
#[derive(Debug)]
pub(crate) struct TrainerMemoryTracker {
    enabled: bool,
    /// The CUDA device read, when CUDA is available.
    gpu: Option<Device>,
    running: Option<Running>,
    stages: BTreeMap<&'static str, Stage>,
    gpu_stages: BTreeMap<&'static str, Stage>,
    init_reported: bool,
}

impl TrainerMemoryTracker {
    /// A tracker that measures only when `skip_memory_metrics` is false, the GPU counters
    /// of `device` (or of device 0 when CUDA is available to a CPU run).
    pub(crate) fn new(skip_memory_metrics: bool, device: Device) -> Self {
        let enabled = !skip_memory_metrics;
        Self {
            enabled,
            gpu: if enabled { gpu_of(device) } else { None },
            running: None,
            stages: BTreeMap::new(),
            gpu_stages: BTreeMap::new(),
            init_reported: false,
        }
    }

    /// Starts `stage` unless another one runs.
    pub(crate) fn start(&mut self, stage: &'static str) {
        if !self.enabled || self.running.is_some() {
            return;
        }
        let gpu_begin = self.gpu.map(|gpu| {
            let _ = tchtrain_accelerate::reset_peak_memory_stats(gpu);
            gpu_counters(gpu).0
        });
        let begin = rss_bytes();
        let peak = Arc::new(AtomicU64::new(begin));
        let stop = Arc::new(AtomicBool::new(false));
        let poller = {
            let (peak, stop) = (Arc::clone(&peak), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    peak.fetch_max(rss_bytes(), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
        };
        self.running = Some(Running {
            name: stage,
            begin,
            gpu_begin,
            peak,
            stop,
            poller,
        });
    }

    /// Stops `stage` (if it is the running one) and, with `metrics`, adds its figures to them.
    pub(crate) fn stop_and_update_metrics(
        &mut self,
        stage: &'static str,
        metrics: Option<&mut Metrics>,
    ) {
        if !self.enabled || self.running.as_ref().is_none_or(|r| r.name != stage) {
            return;
        }
        let Some(r) = self.running.take() else {
            return;
        };
        r.stop.store(true, Ordering::Relaxed);
        let _ = r.poller.join();
        if let (Some(gpu), Some(begin)) = (self.gpu, r.gpu_begin) {
            let (end, peak) = gpu_counters(gpu);
            self.gpu_stages.insert(stage, Stage { begin, end, peak });
        }
        let end = rss_bytes();
        let peak = r.peak.load(Ordering::Relaxed).max(end);
        self.stages.insert(
            stage,
            Stage {
                begin: r.begin,
                end,
                peak,
            },
        );
        let Some(metrics) = metrics else {
            return;
        };
        let mut report = vec![stage];
        if !self.init_reported {
            report.insert(0, "init");
            self.init_reported = true;
        }
        for name in &report {
            let (cpu, gpu) = (self.stages.get(name), self.gpu_stages.get(name));
            for (t, delta) in [
                ("alloc", Stage::alloc_delta as fn(&Stage) -> f64),
                ("peaked", Stage::peaked_delta),
            ] {
                if let Some(s) = cpu {
                    metrics.insert(format!("{name}_mem_cpu_{t}_delta"), delta(s));
                }
                if let Some(s) = gpu {
                    metrics.insert(format!("{name}_mem_gpu_{t}_delta"), delta(s));
                }
            }
        }
        if report[0] == "init"
            && let Some(init) = self.stages.get("init")
        {
            metrics.insert("before_init_mem_cpu".into(), init.begin as f64);
            if let Some(gpu) = self.gpu_stages.get("init") {
                metrics.insert("before_init_mem_gpu".into(), gpu.begin as f64);
            }
        }
    }
}

impl Drop for TrainerMemoryTracker {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            r.stop.store(true, Ordering::Relaxed);
            let _ = r.poller.join();
        }
    }
}

//! Upstream `TrainerMemoryTracker` (trainer_utils.py), on for `skip_memory_metrics=False`:
//! the process's resident memory (psutil's `memory_info().rss`, here `VmRSS` of `/proc/self/status`) at
//! the start and the end of each stage (`init`, `train`, `eval`, `test`), and its peak in
//! between (a thread polling it), reported as `{stage}_mem_cpu_alloc_delta` (end - start)
//! and `{stage}_mem_cpu_peaked_delta` (peak - end, at least 0), in bytes; the first report
//! also carries the `init` stage's and `before_init_mem_cpu`. A stage started inside another
//! (evaluation during training) is not tracked, as upstream.
//!
//! Upstream's poller spins without pausing (a core busy for the stage); this one reads every
//! millisecond. The CUDA counters (`*_mem_gpu_*`) are not reported: the field is refused on a
//! CUDA run (`field_support.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::metrics::Metrics;

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

/// One finished stage: start, end and peak resident bytes.
#[derive(Debug, Clone, Copy)]
struct Stage {
    begin: u64,
    end: u64,
    peak: u64,
}

/// The running stage's poller.
#[derive(Debug)]
struct Running {
    name: &'static str,
    begin: u64,
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    poller: JoinHandle<()>,
}

/// Upstream `TrainerMemoryTracker` (see the module documentation).
#[derive(Debug)]
pub(crate) struct TrainerMemoryTracker {
    enabled: bool,
    running: Option<Running>,
    stages: BTreeMap<&'static str, Stage>,
    init_reported: bool,
}

impl TrainerMemoryTracker {
    /// A tracker that measures only when `skip_memory_metrics` is false.
    pub(crate) fn new(skip_memory_metrics: bool) -> Self {
        Self {
            enabled: !skip_memory_metrics,
            running: None,
            stages: BTreeMap::new(),
            init_reported: false,
        }
    }

    /// Starts `stage` unless another one runs.
    pub(crate) fn start(&mut self, stage: &'static str) {
        if !self.enabled || self.running.is_some() {
            return;
        }
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
            if let Some(s) = self.stages.get(name) {
                metrics.insert(
                    format!("{name}_mem_cpu_alloc_delta"),
                    s.end as f64 - s.begin as f64,
                );
                metrics.insert(
                    format!("{name}_mem_cpu_peaked_delta"),
                    s.peak.saturating_sub(s.end) as f64,
                );
            }
        }
        if report[0] == "init"
            && let Some(init) = self.stages.get("init")
        {
            metrics.insert("before_init_mem_cpu".into(), init.begin as f64);
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

//! `report_to="codecarbon"`: upstream's `CodeCarbonCallback`, which tracks the training's
//! energy and CO2 emissions with codecarbon's `EmissionsTracker(output_dir=args.output_dir)`,
//! made on the local main process when the Trainer is built (`on_init_end`), started when
//! training begins and stopped when it ends: codecarbon 3.3.2's `emissions.csv` row, appended to
//! `<output_dir>/emissions.csv` as codecarbon appends it.
//!
//! The tracker is codecarbon 3.3.2's, on Linux, in the modes it picks on a machine without power
//! sensors it reads: every `measure_power_secs` (15 s) the RAM's power (its estimate from the
//! memory size, or `force_ram_power`) and the CPU's ("cpu_load" mode: the TDP of the CPU's model
//! in codecarbon's table, 4 W per thread for a model it does not know, times the sockets, or
//! `force_cpu_power`; times `0.1 + 0.9 * load³` of the machine's load, sampled each second, or
//! the process tree's share of the CPUs in `tracking_mode="process"`) become energy; the
//! location (GCP's region from the cloud metadata service; else geojs, ipinfo.io, else codecarbon's
//! default, Quebec) gives the carbon intensity from codecarbon's tables
//! ([`codecarbon_data`](crate::codecarbon_data)). The row's columns, formats and the file's
//! handling (a header of another version backed up as `emissions.csv.bak`) are codecarbon's;
//! `python_version` is empty (no Python runs) and `codecarbon_version` names the format's
//! version, 3.3.2.
//!
//! Settings are codecarbon's: `~/.codecarbon.config`, then `./.codecarbon.config` (their
//! `[codecarbon]` section), then the `CODECARBON_*` variables (any case), the last one winning.
//! Read: `project_name`, `experiment_id`, `measure_power_secs`, `api_call_interval`,
//! `output_file`, `output_methods` / `save_to_file` (the CSV), `tracking_mode`,
//! `force_cpu_power`, `force_ram_power`, `force_mode_cpu_load`, `pue`, `wue`,
//! `force_carbon_intensity_g_co2e_kwh`, `allow_multiple_runs` (its lock file), `log_level`,
//! `logger_preamble`. Keys that change nothing in the CSV tracker upstream either
//! (`api_endpoint`, `api_key`, `experiment_name`, `gpu_ids`, `metadata`, `prometheus_url`,
//! `rapl_include_dram`, `rapl_prefer_psys`, `output_dir` — the callback passes the Trainer's —,
//! and the CLI's `organization_id` / `project_id`) are accepted. Refused, with the reason: the
//! other outputs (`save_to_api` / `_logger` / `_prometheus` / `_logfire`, `output_methods` other
//! than `csv`, `emissions_endpoint`), Electricity Maps (`electricitymaps_api_token`: use
//! `force_carbon_intensity_g_co2e_kwh`), `on_csv_write="update"` (it rewrites the file through
//! pandas; a Trainer's run writes one row, which `append` writes), values codecarbon cannot
//! parse, and unknown keys. Machines whose sensors codecarbon would read are refused before
//! training: NVIDIA or AMD GPUs (`nvidia-smi` / `rocm-smi` answer: codecarbon measures them
//! through NVML / AMD SMI, not read here), readable RAPL counters (set `force_cpu_power`, or
//! `force_mode_cpu_load=true`, to have codecarbon estimate as here), a Raspberry Pi 5's PMIC, and
//! systems other than Linux.
//!
//! Unlike upstream, a callback dropped while tracking (a run that failed) still writes its row:
//! what was measured is not lost.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tchtrain_training_args::TrainingArguments;

use crate::codecarbon_data::{
    CloudMetadata, DEFAULT_POWER_PER_CORE, Emissions, GeoMetadata, POWER_CONSTANT, cloud_location,
    match_cpu, ram_power_watts,
};
use crate::codecarbon_machine::{self as machine, LocationServices};
use crate::error::{Error, Result};
use crate::trainer_callback::TrainerCallback;
use crate::trainer_control::TrainerControl;
use crate::trainer_state::TrainerState;

/// The codecarbon version whose file tchtrain writes (the `codecarbon_version` column).
pub const CODECARBON_VERSION: &str = "3.3.2";
/// codecarbon's default `experiment_id`.
pub const DEFAULT_EXPERIMENT_ID: &str = "5b0fa12a-3dd7-45bb-9766-cc326314d9f1";
/// The columns of codecarbon 3.3's `emissions.csv` (`EmissionsData`'s fields), in order.
pub const EMISSIONS_CSV_COLUMNS: [&str; 38] = [
    "timestamp",
    "project_name",
    "run_id",
    "experiment_id",
    "duration",
    "emissions",
    "emissions_rate",
    "cpu_power",
    "gpu_power",
    "ram_power",
    "cpu_energy",
    "gpu_energy",
    "ram_energy",
    "energy_consumed",
    "water_consumed",
    "country_name",
    "country_iso_code",
    "region",
    "cloud_provider",
    "cloud_region",
    "os",
    "python_version",
    "codecarbon_version",
    "cpu_count",
    "cpu_model",
    "gpu_count",
    "gpu_model",
    "longitude",
    "latitude",
    "ram_total_size",
    "tracking_mode",
    "cpu_utilization_percent",
    "gpu_utilization_percent",
    "ram_utilization_percent",
    "ram_used_gb",
    "on_cloud",
    "pue",
    "wue",
];

/// Keys codecarbon reads that change nothing in a CSV tracker (accepted, as upstream).
const NO_EFFECT_KEYS: [&str; 11] = [
    "api_endpoint",
    "api_key",
    "experiment_name",
    "gpu_ids",
    "metadata",
    "prometheus_url",
    "rapl_include_dram",
    "rapl_prefer_psys",
    "output_dir",
    "organization_id",
    "project_id",
];

fn refuse(setting: impl Into<String>, reason: impl Into<String>) -> Error {
    Error::CodeCarbonSetting {
        setting: setting.into(),
        reason: reason.into(),
    }
}

/// codecarbon's log levels (`logging`'s names), most verbose first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CodeCarbonLogLevel {
    /// `NOTSET` (everything).
    NotSet,
    /// `DEBUG`.
    Debug,
    /// `INFO` (codecarbon's default).
    Info,
    /// `WARNING` / `WARN`.
    Warning,
    /// `ERROR`.
    Error,
    /// `CRITICAL` / `FATAL`.
    Critical,
}

/// codecarbon's settings as its `EmissionsTracker` resolves them (see the module's
/// documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct CodeCarbonSettings {
    /// `project_name` (default `codecarbon`).
    pub project_name: String,
    /// `experiment_id` (default [`DEFAULT_EXPERIMENT_ID`]).
    pub experiment_id: String,
    /// `measure_power_secs` (default 15).
    pub measure_power_secs: f64,
    /// `api_call_interval` (default 8): measurements between emissions updates (-1: only at
    /// the end).
    pub api_call_interval: i64,
    /// `output_file` (default `emissions.csv`).
    pub output_file: String,
    /// Whether the CSV row is written (`save_to_file`, or `csv` among `output_methods`).
    pub save_to_file: bool,
    /// `tracking_mode`: `machine` (default) or `process`.
    pub tracking_mode: String,
    /// `force_cpu_power` in watts.
    pub force_cpu_power: Option<f64>,
    /// `force_ram_power` in watts.
    pub force_ram_power: Option<f64>,
    /// `force_mode_cpu_load`.
    pub force_mode_cpu_load: bool,
    /// `pue` (default 1.0).
    pub pue: f64,
    /// `wue` in litres per kWh (default 0).
    pub wue: f64,
    /// `force_carbon_intensity_g_co2e_kwh` (a negative value is ignored, as codecarbon).
    pub force_carbon_intensity_g_co2e_kwh: Option<f64>,
    /// `allow_multiple_runs` (default true); false takes codecarbon's lock file.
    pub allow_multiple_runs: bool,
    /// `log_level` (default `info`).
    pub log_level: CodeCarbonLogLevel,
    /// `logger_preamble`.
    pub logger_preamble: String,
    /// Where the location is asked (codecarbon's services by default).
    pub location: LocationServices,
}

impl Default for CodeCarbonSettings {
    fn default() -> Self {
        Self {
            project_name: "codecarbon".into(),
            experiment_id: DEFAULT_EXPERIMENT_ID.into(),
            measure_power_secs: 15.0,
            api_call_interval: 8,
            output_file: "emissions.csv".into(),
            save_to_file: true,
            tracking_mode: "machine".into(),
            force_cpu_power: None,
            force_ram_power: None,
            force_mode_cpu_load: false,
            pue: 1.0,
            wue: 0.0,
            force_carbon_intensity_g_co2e_kwh: None,
            allow_multiple_runs: true,
            log_level: CodeCarbonLogLevel::Info,
            logger_preamble: String::new(),
            location: LocationServices::default(),
        }
    }
}

/// configparser's `[codecarbon]` section of a file (keys lower-cased; `#` / `;` comments).
fn read_config_file(path: &Path) -> Result<Vec<(String, String)>> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(Vec::new());
    };
    let mut section = String::new();
    let mut out: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with(';') {
            continue;
        }
        if let Some(name) = trimmed.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
            section = name.to_string();
            continue;
        }
        if section != "codecarbon" {
            continue;
        }
        if line.starts_with(char::is_whitespace) {
            return Err(refuse(
                path.display().to_string(),
                "a value continued over several lines is not read here: write each key on one line",
            ));
        }
        let split = trimmed.find(['=', ':']).ok_or_else(|| {
            refuse(
                path.display().to_string(),
                format!("{trimmed:?} is not `key = value`"),
            )
        })?;
        let key = trimmed[..split].trim().to_lowercase();
        let value = trimmed[split + 1..].trim().to_string();
        out.retain(|(k, _)| *k != key);
        out.push((key, value));
    }
    Ok(out)
}

/// codecarbon's `_set_from_conf` with `return_type=bool`: true only for `true` (any case).
fn conf_bool(v: &str) -> bool {
    v.to_lowercase() == "true"
}

impl CodeCarbonSettings {
    /// From the working directory, the home directory and the environment.
    pub fn from_env() -> Result<Self> {
        let cwd = std::env::current_dir().map_err(|e| Error::io("reading", ".", e))?;
        let home = std::env::var_os("HOME").map(PathBuf::from);
        Self::from_vars(&cwd, home.as_deref(), std::env::vars())
    }

    /// codecarbon's `get_hierarchical_config` from `home`'s and `cwd`'s `.codecarbon.config`
    /// and the variables given, resolved as its tracker does (see the module's documentation).
    pub fn from_vars(
        cwd: &Path,
        home: Option<&Path>,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self> {
        let mut conf: Vec<(String, String, String)> = Vec::new(); // key, value, source
        let mut set = |key: String, value: String, source: String| {
            conf.retain(|(k, _, _)| *k != key);
            conf.push((key, value, source));
        };
        for file in home
            .map(|h| h.join(".codecarbon.config"))
            .into_iter()
            .chain([cwd.join(".codecarbon.config")])
        {
            for (k, v) in read_config_file(&file)? {
                set(k, v, file.display().to_string());
            }
        }
        let mut vars: Vec<(String, String)> = vars
            .into_iter()
            .filter(|(k, _)| k.to_lowercase().starts_with("codecarbon_"))
            .collect();
        vars.sort();
        for (k, v) in vars {
            let key = k.to_lowercase()["codecarbon_".len()..].to_string();
            set(key, v, k);
        }
        let get = |key: &str| conf.iter().find(|(k, _, _)| k == key);
        let named = |(k, v, source): &(String, String, String)| {
            if source.contains(".codecarbon.config") {
                format!("{k}={v:?} in {source}")
            } else {
                format!("{source}={v:?}")
            }
        };
        let float = |key: &str| -> Result<Option<f64>> {
            get(key)
                .map(|entry| {
                    entry.1.trim().parse::<f64>().map_err(|_| {
                        refuse(
                            named(entry),
                            format!("codecarbon reads {key} as a number (and ignores it with an error otherwise)"),
                        )
                    })
                })
                .transpose()
        };
        let mut s = Self::default();
        for entry in &conf {
            let (k, v) = (entry.0.as_str(), entry.1.as_str());
            match k {
                "project_name" => s.project_name = v.to_string(),
                "experiment_id" => s.experiment_id = v.to_string(),
                "output_file" => s.output_file = v.to_string(),
                "measure_power_secs"
                | "pue"
                | "wue"
                | "force_cpu_power"
                | "force_ram_power"
                | "force_carbon_intensity_g_co2e_kwh" => {}
                "api_call_interval" => {
                    s.api_call_interval = v.trim().parse().map_err(|_| {
                        refuse(
                            named(entry),
                            "codecarbon reads api_call_interval as an integer",
                        )
                    })?
                }
                "tracking_mode" => {
                    if v != "machine" && v != "process" {
                        return Err(refuse(
                            named(entry),
                            "codecarbon's tracking_mode is \"machine\" or \"process\"",
                        ));
                    }
                    s.tracking_mode = v.to_string();
                }
                "force_mode_cpu_load" => s.force_mode_cpu_load = conf_bool(v),
                "allow_multiple_runs" => s.allow_multiple_runs = conf_bool(v),
                "save_to_file" => {}
                "logger_preamble" => s.logger_preamble = v.to_string(),
                "log_level" => {
                    s.log_level = match v.to_uppercase().as_str() {
                        "NOTSET" => CodeCarbonLogLevel::NotSet,
                        "DEBUG" => CodeCarbonLogLevel::Debug,
                        "INFO" => CodeCarbonLogLevel::Info,
                        "WARN" | "WARNING" => CodeCarbonLogLevel::Warning,
                        "ERROR" => CodeCarbonLogLevel::Error,
                        "CRITICAL" | "FATAL" => CodeCarbonLogLevel::Critical,
                        _ => {
                            return Err(refuse(
                                named(entry),
                                "codecarbon's log levels are debug, info, warning, error and critical",
                            ));
                        }
                    }
                }
                "output_methods" => {
                    for method in v.split(',').map(str::trim).filter(|m| !m.is_empty()) {
                        match method {
                            "csv" => {}
                            "api" | "logger" | "prometheus" | "logfire" | "boamps" => {
                                return Err(refuse(
                                    named(entry),
                                    format!(
                                        "codecarbon's {method} output is not implemented here; the tracker writes the CSV file (output_methods=csv)"
                                    ),
                                ));
                            }
                            other => {
                                return Err(refuse(
                                    named(entry),
                                    format!(
                                        "{other:?} is not one of codecarbon's output methods (csv, api, logger, prometheus, logfire, boamps)"
                                    ),
                                ));
                            }
                        }
                    }
                }
                "save_to_api" | "save_to_logger" | "save_to_prometheus" | "save_to_logfire" => {
                    if conf_bool(v) && get("output_methods").is_none() {
                        return Err(refuse(
                            named(entry),
                            format!(
                                "codecarbon's {} output is not implemented here; the tracker writes the CSV file",
                                &k["save_to_".len()..]
                            ),
                        ));
                    }
                }
                "emissions_endpoint" => {
                    if !v.is_empty() {
                        return Err(refuse(
                            named(entry),
                            "sending each measurement to an HTTP endpoint is not implemented here; the tracker writes the CSV file",
                        ));
                    }
                }
                "electricitymaps_api_token" | "co2_signal_api_token" => {
                    if !v.is_empty() {
                        return Err(refuse(
                            named(entry),
                            "the live carbon intensity from Electricity Maps' API is not implemented here: set force_carbon_intensity_g_co2e_kwh to the intensity you know, or leave codecarbon's tables to estimate it",
                        ));
                    }
                }
                "on_csv_write" => match v {
                    "append" => {}
                    "update" => {
                        return Err(refuse(
                            named(entry),
                            "\"update\" rewrites the whole file through pandas (its other rows re-read and re-written); a Trainer's run writes one row, which \"append\" writes: use on_csv_write=append",
                        ));
                    }
                    _ => {
                        return Err(refuse(
                            named(entry),
                            "codecarbon's on_csv_write is \"append\" or \"update\"",
                        ));
                    }
                },
                "logging_logger" | "output_handlers" => {
                    return Err(refuse(
                        named(entry),
                        format!(
                            "{k} takes Python objects given to EmissionsTracker, not a setting"
                        ),
                    ));
                }
                k if NO_EFFECT_KEYS.contains(&k) => {}
                _ => {
                    return Err(refuse(
                        named(entry),
                        "codecarbon 3.3 reads no such setting (a misspelling?): remove it",
                    ));
                }
            }
        }
        if let Some(secs) = float("measure_power_secs")? {
            s.measure_power_secs = secs;
        }
        if let Some(pue) = float("pue")? {
            s.pue = pue;
        }
        if let Some(wue) = float("wue")? {
            s.wue = wue;
        }
        s.force_cpu_power = float("force_cpu_power")?;
        s.force_ram_power = float("force_ram_power")?;
        s.force_carbon_intensity_g_co2e_kwh = float("force_carbon_intensity_g_co2e_kwh")?
            .filter(|v| {
                let ok = *v >= 0.0;
                if !ok {
                    log::warn!(
                        "Invalid value for force_carbon_intensity_g_co2e_kwh: '{v}'. It must be a non-negative number. Using default calculation methods."
                    );
                }
                ok
            });
        if let Some(methods) = get("output_methods") {
            s.save_to_file = methods.1.split(',').any(|m| m.trim() == "csv");
        } else if let Some(entry) = get("save_to_file") {
            s.save_to_file = conf_bool(&entry.1);
        }
        if s.measure_power_secs.is_nan() || s.measure_power_secs <= 0.0 {
            return Err(refuse(
                format!("measure_power_secs={}", s.measure_power_secs),
                "the interval between measurements must be positive",
            ));
        }
        Ok(s)
    }
}

/// Whether a codecarbon configuration is present (a `CODECARBON_*` variable, or a
/// `.codecarbon.config` in the home or working directory): `report_to="all"` then takes
/// codecarbon.
pub fn codecarbon_is_configured() -> bool {
    std::env::vars_os().any(|(k, _)| {
        k.to_string_lossy()
            .to_lowercase()
            .starts_with("codecarbon_")
    }) || std::env::var_os("HOME")
        .map(PathBuf::from)
        .into_iter()
        .chain(std::env::current_dir().ok())
        .any(|d| d.join(".codecarbon.config").is_file())
}

/// What codecarbon reads from the machine once (its `_conf`).
#[derive(Debug, Clone, PartialEq)]
pub struct MachineFacts {
    /// `platform.platform()`.
    pub os: String,
    /// Logical CPUs (`count_cpus`).
    pub cpu_count: usize,
    /// Sockets (`count_physical_cpus`).
    pub cpu_physical_count: usize,
    /// The CPU's model as detected (`Unknown` when unread).
    pub cpu_model: String,
    /// The CPU's TDP in watts times the sockets (`force_cpu_power` instead when set); codecarbon's
    /// 85 W constant when the model could not be read.
    pub cpu_tdp: f64,
    /// Total memory in GB.
    pub ram_total_size: f64,
}

impl MachineFacts {
    /// Upstream `ResourceTracker.set_CPU_GPU_ram_tracking` on a machine it estimates (the
    /// refusals of the module's documentation checked first).
    pub fn detect(settings: &CodeCarbonSettings) -> Result<Self> {
        if std::env::consts::OS != "linux" {
            return Err(refuse(
                format!("the operating system {:?}", std::env::consts::OS),
                "the CodeCarbon tracker reads the machine as codecarbon does on Linux only",
            ));
        }
        if machine::is_nvidia_system() || machine::is_rocm_system() {
            return Err(refuse(
                "a GPU (nvidia-smi or rocm-smi answers)",
                "codecarbon measures GPUs' power through NVML / AMD SMI, which tchtrain does not read: remove codecarbon from report_to on this machine",
            ));
        }
        if machine::is_raspberry() {
            return Err(refuse(
                "a Raspberry Pi PMIC (vcgencmd pmic_read_adc)",
                "codecarbon reads the Raspberry Pi 5's power rails, which is not implemented here",
            ));
        }
        let cpu_count = machine::count_cpus();
        let cpu_physical_count = machine::count_physical_cpus();
        let detected = machine::detect_cpu_model().filter(|m| !m.is_empty());
        // Upstream `cpu.TDP()`: the table's TDP, or 4 W per thread for an unknown model.
        let (cpu_model, tdp) = match &detected {
            Some(model) => match match_cpu(model) {
                Some((_, tdp)) => (model.clone(), Some(tdp)),
                None => {
                    log::warn!(
                        "We saw that you have a {model} but we don't know it. Please help us add it, see https://docs.codecarbon.io/latest/how-to/troubleshooting/#unknown-cpu-model"
                    );
                    let estimated = cpu_count as f64 * DEFAULT_POWER_PER_CORE;
                    log::warn!(
                        "We will use the default power consumption of {DEFAULT_POWER_PER_CORE} W per thread for your {cpu_count} CPU, so {estimated}W."
                    );
                    (model.clone(), Some(estimated))
                }
            },
            None => ("Unknown".to_string(), None),
        };
        let uses_load_mode =
            settings.force_cpu_power.is_some() || (settings.force_mode_cpu_load && tdp.is_some());
        if !uses_load_mode && machine::is_rapl_available() {
            return Err(refuse(
                "readable RAPL energy counters under /sys/class/powercap",
                "codecarbon reads the CPU's energy from RAPL on this machine, which is not implemented here: set CODECARBON_FORCE_MODE_CPU_LOAD=true (or CODECARBON_FORCE_CPU_POWER=<watts>) to have codecarbon estimate the CPU's power from its load, as tchtrain does",
            ));
        }
        let cpu_tdp = match (settings.force_cpu_power, tdp) {
            (Some(forced), _) => forced,
            (None, Some(tdp)) => tdp * cpu_physical_count as f64,
            (None, None) => POWER_CONSTANT,
        };
        Ok(Self {
            os: machine::platform_platform(),
            cpu_count,
            cpu_physical_count,
            cpu_model,
            cpu_tdp,
            ram_total_size: machine::machine_memory_gb(),
        })
    }
}

/// The CPU in codecarbon's "cpu_load" mode (`external.hardware.CPU`).
#[derive(Debug)]
struct CpuLoad {
    tdp: f64,
    process: bool,
    cpu_count: usize,
    pid: u32,
    /// (watts, seconds the sample covers), averaged at each measurement.
    power_history: Vec<(f64, f64)>,
    last_sample: Option<Instant>,
    /// `SystemCPULoadMeter`'s baseline.
    load_baseline: Option<(f64, f64)>,
    /// Process mode: the last reading's wall time and the tree's CPU seconds.
    last_measurement: Option<Instant>,
    last_cpu_times: HashMap<u32, f64>,
}

impl CpuLoad {
    fn process_tree_times(&self) -> HashMap<u32, f64> {
        std::iter::once(self.pid)
            .chain(machine::descendants(self.pid))
            .filter_map(|p| Some((p, machine::process_cpu_seconds(p)?)))
            .collect()
    }

    /// Upstream `CPU.start` (cpu_load mode).
    fn start(&mut self) {
        self.power_history.clear();
        self.last_sample = Some(Instant::now());
        self.last_measurement = None;
        self.last_cpu_times.clear();
        if self.process {
            self.last_measurement = Some(Instant::now());
            self.last_cpu_times = self.process_tree_times();
        } else {
            self.load_baseline = machine::cpu_times();
        }
    }

    /// Upstream `CPU._get_power_from_cpu_load`, in watts.
    fn power_from_load(&mut self) -> f64 {
        if !self.process {
            let current = machine::cpu_times().unwrap_or((0.0, 0.0));
            let load = match self.load_baseline.replace(current) {
                Some(previous) => machine::busy_percent(previous, current),
                None => {
                    std::thread::sleep(Duration::from_millis(50));
                    let later = machine::cpu_times().unwrap_or(current);
                    self.load_baseline = Some(later);
                    machine::busy_percent(current, later)
                }
            };
            let load_factor = 0.1 + 0.9 * (load / 100.0).powi(3);
            return self.tdp * load_factor;
        }
        let now = Instant::now();
        let current = self.process_tree_times();
        let mut cpu_load = 0.0;
        if let Some(last) = self.last_measurement {
            let delta = now.duration_since(last).as_secs_f64();
            if delta > 0.0 {
                let total: f64 = current
                    .iter()
                    .map(|(pid, t)| t - self.last_cpu_times.get(pid).unwrap_or(t))
                    .filter(|d| *d > 0.0)
                    .sum();
                cpu_load = total / delta * 100.0;
            }
        }
        self.last_measurement = Some(now);
        self.last_cpu_times = current;
        let normalized = cpu_load / self.cpu_count as f64;
        self.tdp * normalized / 100.0
    }

    fn take_sample(&mut self) -> (f64, f64) {
        let power = self.power_from_load();
        let now = Instant::now();
        let duration = self
            .last_sample
            .map_or(0.0, |l| now.duration_since(l).as_secs_f64());
        self.last_sample = Some(now);
        (power, duration)
    }

    /// Upstream `CPU.monitor_power`: a sample kept for the next measurement.
    fn monitor(&mut self) {
        let sample = self.take_sample();
        self.power_history.push(sample);
    }

    /// Upstream `CPU.total_power`: the time-weighted mean of the samples since the last
    /// measurement and a new one, in watts.
    fn total_power(&mut self) -> f64 {
        let latest = self.take_sample();
        let mut history = std::mem::take(&mut self.power_history);
        history.push(latest);
        let total_duration: f64 = history.iter().map(|(_, d)| d).sum();
        if total_duration > 0.0 {
            history.iter().map(|(p, d)| p * d).sum::<f64>() / total_duration
        } else {
            history.iter().map(|(p, _)| p).sum::<f64>() / history.len() as f64
        }
    }
}

/// The RAM (`external.ram.RAM`).
#[derive(Debug)]
struct Ram {
    force: Option<f64>,
    process: bool,
    arm: bool,
    machine_gb: f64,
    pid: u32,
}

impl Ram {
    /// Upstream `RAM.total_power`, in watts.
    fn total_power(&self) -> f64 {
        if let Some(forced) = self.force {
            return forced;
        }
        let gb = if self.process {
            std::iter::once(self.pid)
                .chain(machine::descendants(self.pid))
                .filter_map(machine::process_rss)
                .sum::<u64>() as f64
                / machine::B_TO_GB
        } else {
            self.machine_gb
        };
        ram_power_watts(gb, self.arm)
    }
}

/// codecarbon's `Power` / `Energy` arithmetic for one hardware's reading of `watts` over
/// `seconds`: `Power.from_watts` (kW), `Energy.from_power_and_time` (kW times hours), both
/// multiplied by the PUE; the power back in watts (`Power.W`) and the energy in kWh.
fn scaled(watts: f64, seconds: f64, pue: f64) -> (f64, f64) {
    let kw = watts * 0.001;
    let energy = kw * (seconds * (1.0 / 3600.0)) * pue;
    ((kw * pue) * 1000.0, energy)
}

#[derive(Debug)]
struct State {
    started: Option<Instant>,
    stopping: bool,
    last_measured: Instant,
    cpu: CpuLoad,
    ram: Ram,
    total_energy: f64,
    total_cpu_energy: f64,
    total_ram_energy: f64,
    total_water: f64,
    total_emissions: f64,
    last_energy_covered: f64,
    cpu_power_sum: f64,
    ram_power_sum: f64,
    cpu_power: f64,
    ram_power: f64,
    measurements: usize,
    measure_occurrence: i64,
    cpu_utilization: Vec<f64>,
    ram_utilization: Vec<f64>,
    ram_used: Vec<f64>,
    /// psutil's `cpu_percent()` baseline (its last call).
    utilization_baseline: Option<(f64, f64)>,
    geo: Option<GeoMetadata>,
    cloud: Option<CloudMetadata>,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared.state.lock().unwrap_or_else(|e| e.into_inner())
}

/// codecarbon's lock file (`tempfile.gettempdir()/.codecarbon.lock`).
pub fn lock_file_path() -> PathBuf {
    ["TMPDIR", "TEMP", "TMP"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .find(|p| p.is_dir())
        .unwrap_or_else(|| PathBuf::from("/tmp"))
        .join(".codecarbon.lock")
}

/// codecarbon's `EmissionsTracker` in the modes the module's documentation describes.
pub struct EmissionsTracker {
    settings: CodeCarbonSettings,
    output_dir: PathBuf,
    facts: MachineFacts,
    run_id: String,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    lock: Option<PathBuf>,
    another_instance: bool,
    final_emissions: Option<f64>,
    engine: Emissions,
}

impl std::fmt::Debug for EmissionsTracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmissionsTracker")
            .field("output_dir", &self.output_dir)
            .field("run_id", &self.run_id)
            .field("facts", &self.facts)
            .finish()
    }
}

fn uuid4() -> String {
    let hex = crate::trackio::uuid4_hex();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

impl EmissionsTracker {
    /// Upstream `EmissionsTracker(output_dir=...)` with the settings given: the folder must
    /// exist (codecarbon's OSError otherwise); the machine is read and refused as the module's
    /// documentation says.
    pub fn new(settings: CodeCarbonSettings, output_dir: impl Into<PathBuf>) -> Result<Self> {
        let output_dir = output_dir.into();
        if !output_dir.exists() {
            return Err(refuse(
                format!("output_dir {:?}", output_dir.display().to_string()),
                format!(
                    "Folder '{}' doesn't exist ! (codecarbon's tracker writes its file there: create it first)",
                    output_dir.display()
                ),
            ));
        }
        let facts = MachineFacts::detect(&settings)?;
        let mut another_instance = false;
        let mut lock = None;
        if !settings.allow_multiple_runs {
            let path = lock_file_path();
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(_) => lock = Some(path),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    log::error!(
                        "Error: Another instance of codecarbon is probably running as we find `{}`. Turn off the other instance to be able to run this one or use `allow_multiple_runs` or delete the file. Exiting.",
                        path.display()
                    );
                    another_instance = true;
                }
                Err(e) => return Err(Error::io("creating", path, e)),
            }
        } else {
            Self::log_at(
                &settings,
                CodeCarbonLogLevel::Warning,
                "Multiple instances of codecarbon are allowed to run at the same time.",
            );
        }
        let pid = std::process::id();
        let process = settings.tracking_mode == "process";
        let state = State {
            started: None,
            stopping: false,
            last_measured: Instant::now(),
            cpu: CpuLoad {
                tdp: facts.cpu_tdp,
                process,
                cpu_count: facts.cpu_count.max(1),
                pid,
                power_history: Vec::new(),
                last_sample: None,
                load_baseline: None,
                last_measurement: None,
                last_cpu_times: HashMap::new(),
            },
            ram: Ram {
                force: settings.force_ram_power,
                process,
                arm: machine::is_arm_cpu(),
                machine_gb: facts.ram_total_size,
                pid,
            },
            total_energy: 0.0,
            total_cpu_energy: 0.0,
            total_ram_energy: 0.0,
            total_water: 0.0,
            total_emissions: 0.0,
            last_energy_covered: 0.0,
            cpu_power_sum: 0.0,
            ram_power_sum: 0.0,
            cpu_power: 0.0,
            ram_power: 0.0,
            measurements: 0,
            measure_occurrence: 0,
            cpu_utilization: Vec::new(),
            ram_utilization: Vec::new(),
            ram_used: Vec::new(),
            utilization_baseline: machine::cpu_times(),
            geo: None,
            cloud: None,
        };
        let engine = Emissions {
            force_carbon_intensity_g_co2e_kwh: settings.force_carbon_intensity_g_co2e_kwh,
        };
        Ok(Self {
            settings,
            output_dir,
            facts,
            run_id: uuid4(),
            shared: Arc::new(Shared {
                state: Mutex::new(state),
                wake: Condvar::new(),
            }),
            thread: None,
            lock,
            another_instance,
            final_emissions: None,
            engine,
        })
    }

    fn log_at(settings: &CodeCarbonSettings, level: CodeCarbonLogLevel, message: &str) {
        if level < settings.log_level {
            return;
        }
        let preamble = if settings.logger_preamble.is_empty() {
            String::new()
        } else {
            format!("[{}] ", settings.logger_preamble)
        };
        let level = match level {
            CodeCarbonLogLevel::NotSet | CodeCarbonLogLevel::Debug => log::Level::Debug,
            CodeCarbonLogLevel::Info => log::Level::Info,
            CodeCarbonLogLevel::Warning => log::Level::Warn,
            _ => log::Level::Error,
        };
        log::log!(target: "codecarbon", level, "{preamble}{message}");
    }

    /// What the machine was read as.
    pub fn facts(&self) -> &MachineFacts {
        &self.facts
    }

    /// This run's id (the `run_id` column).
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The file the row goes to.
    pub fn output_path(&self) -> PathBuf {
        self.output_dir.join(&self.settings.output_file)
    }

    /// Upstream `start`: the hardware's first reading, a measurement, and the measuring
    /// thread (a sample each second, a measurement each `measure_power_secs`).
    pub fn start(&mut self) {
        if self.another_instance {
            log::warn!("Another instance of codecarbon is already running. Exiting.");
            return;
        }
        let mut state = lock(&self.shared);
        if state.started.is_some() {
            log::warn!("Already started tracking");
            return;
        }
        let now = Instant::now();
        state.started = Some(now);
        state.last_measured = now;
        state.stopping = false;
        state.cpu_utilization.clear();
        state.ram_utilization.clear();
        state.ram_used.clear();
        state.cpu.start();
        let settings = self.settings.clone();
        let engine = self.engine.clone();
        measure_power_and_energy(&mut state, &settings, &engine);
        drop(state);
        let shared = Arc::clone(&self.shared);
        let interval = Duration::from_secs_f64(self.settings.measure_power_secs);
        self.thread = Some(std::thread::spawn(move || {
            let mut next_monitor = Instant::now() + Duration::from_secs(1);
            let mut next_measure = Instant::now() + interval;
            let mut state = lock(&shared);
            loop {
                if state.stopping {
                    return;
                }
                let now = Instant::now();
                let next = next_monitor.min(next_measure);
                if now < next {
                    state = shared
                        .wake
                        .wait_timeout(state, next - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                    continue;
                }
                if now >= next_monitor {
                    next_monitor = now + Duration::from_secs(1);
                    monitor_power(&mut state);
                }
                if now >= next_measure {
                    next_measure = now + interval;
                    measure_power_and_energy(&mut state, &settings, &engine);
                }
            }
        }));
    }

    /// Upstream `stop`: the measuring thread stopped, a last measurement (unless one was taken
    /// in the last 50 ms), the row written; the run's emissions in kg (`None` when it never
    /// started).
    pub fn stop(&mut self) -> Result<Option<f64>> {
        if self.another_instance {
            log::warn!("Another instance of codecarbon is already running. Exiting.");
            return Ok(None);
        }
        if lock(&self.shared).started.is_none() {
            log::warn!("Tracker already stopped or never started.");
            return Ok(self.final_emissions);
        }
        if let Some(path) = self.lock.take() {
            let _ = std::fs::remove_file(path);
        }
        lock(&self.shared).stopping = true;
        self.shared.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let mut state = lock(&self.shared);
        if state.last_measured.elapsed() >= Duration::from_millis(50) {
            measure_power_and_energy(&mut state, &self.settings, &self.engine);
        }
        let row = prepare_emissions_data(
            &mut state,
            &self.settings,
            &self.engine,
            &self.facts,
            &self.run_id,
        );
        state.started = None;
        drop(state);
        let emissions = match row.iter().find(|(k, _)| *k == "emissions") {
            Some((_, Cell::Float(f))) => *f,
            _ => 0.0,
        };
        self.final_emissions = Some(emissions);
        if self.settings.save_to_file {
            write_row(&self.output_path(), &row)?;
        }
        Ok(Some(emissions))
    }
}

impl Drop for EmissionsTracker {
    fn drop(&mut self) {
        let started = lock(&self.shared).started.is_some();
        if started && let Err(e) = self.stop() {
            log::error!("codecarbon: the emissions row could not be written: {e}");
        }
        if let Some(path) = self.lock.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Upstream `_monitor_power` (each second): a CPU power sample, the CPU's and RAM's use.
fn monitor_power(state: &mut State) {
    state.cpu.monitor();
    let current = machine::cpu_times();
    let cpu_utilization = match (state.utilization_baseline, current) {
        (Some(previous), Some(current)) => {
            machine::python_round_1(machine::busy_percent(previous, current))
        }
        _ => 0.0,
    };
    state.utilization_baseline = current;
    let (_, used, percent) = machine::virtual_memory();
    state.cpu_utilization.push(cpu_utilization);
    state.ram_utilization.push(percent);
    state.ram_used.push(used / machine::B_TO_GB);
}

/// Upstream `_measure_power_and_energy` / `_do_measurements`: the RAM's then the CPU's power
/// over the time since the last measurement (times the PUE), and every `api_call_interval`
/// measurements the emissions brought up to date.
fn measure_power_and_energy(state: &mut State, settings: &CodeCarbonSettings, engine: &Emissions) {
    // The hardware in codecarbon's order: the RAM, then the CPU, each over the time since the
    // last measurement (`power * pue`, `energy * pue` as codecarbon scales them).
    let last_duration = state.last_measured.elapsed().as_secs_f64();
    let (power_w, energy) = scaled(state.ram.total_power(), last_duration, settings.pue);
    state.total_energy += energy;
    state.total_water += settings.wue * energy;
    state.total_ram_energy += energy;
    state.ram_power = power_w;
    state.ram_power_sum += power_w;
    let last_duration = state.last_measured.elapsed().as_secs_f64();
    let (power_w, energy) = scaled(state.cpu.total_power(), last_duration, settings.pue);
    state.total_energy += energy;
    state.total_water += settings.wue * energy;
    state.total_cpu_energy += energy;
    state.cpu_power = power_w;
    state.cpu_power_sum += power_w;
    state.measurements += 1;
    log::info!(
        target: "codecarbon",
        "{:.6} kWh of electricity and {:.6} L of water were used since the beginning.",
        state.total_energy,
        state.total_water
    );
    state.last_measured = Instant::now();
    state.measure_occurrence += 1;
    if settings.api_call_interval != -1
        && settings.save_to_file
        && state.measure_occurrence >= settings.api_call_interval
    {
        update_emissions(state, settings, engine);
        state.measure_occurrence = 0;
    }
}

/// Upstream `_update_emissions`: the emissions of the energy not yet covered (the location
/// asked the first time).
fn update_emissions(state: &mut State, settings: &CodeCarbonSettings, engine: &Emissions) {
    if state.geo.is_none() {
        state.geo = Some(settings.location.geo_metadata());
    }
    if state.cloud.is_none() {
        state.cloud = Some(settings.location.cloud_metadata());
    }
    let delta = state.total_energy - state.last_energy_covered;
    if delta > 0.0 {
        let (cloud, geo) = (
            state.cloud.as_ref().expect("set"),
            state.geo.as_ref().expect("set"),
        );
        state.total_emissions += if cloud.is_on_private_infra() {
            engine.get_private_infra_emissions(delta, geo)
        } else {
            engine.get_cloud_emissions(delta, cloud, Some(geo))
        };
        state.last_energy_covered = state.total_energy;
    }
}

/// A CSV cell as codecarbon's pandas frame writes it.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// A Python float (`repr`).
    Float(f64),
    /// A Python int.
    Int(i64),
    /// A string.
    Str(String),
    /// `None` (an empty cell).
    None,
}

impl Cell {
    /// The cell's text in pandas' `to_csv` (Python floats' `repr`, `csv`'s minimal quoting).
    pub fn to_csv(&self) -> String {
        match self {
            Cell::Float(f) => crate::python_float_repr(*f),
            Cell::Int(i) => i.to_string(),
            Cell::None => String::new(),
            Cell::Str(s) => {
                if s.contains([',', '"', '\n']) {
                    format!("\"{}\"", s.replace('"', "\"\""))
                } else {
                    s.clone()
                }
            }
        }
    }
}

fn mean(history: &[f64]) -> Cell {
    if history.is_empty() {
        Cell::Int(0)
    } else {
        Cell::Float(history.iter().sum::<f64>() / history.len() as f64)
    }
}

/// Upstream `_prepare_emissions_data`: the row.
fn prepare_emissions_data(
    state: &mut State,
    settings: &CodeCarbonSettings,
    engine: &Emissions,
    facts: &MachineFacts,
    run_id: &str,
) -> Vec<(&'static str, Cell)> {
    update_emissions(state, settings, engine);
    let duration = state.started.map_or(0.0, |s| s.elapsed().as_secs_f64());
    let cloud = state.cloud.clone().unwrap_or_default();
    let geo = state
        .geo
        .clone()
        .unwrap_or_else(GeoMetadata::canada_default);
    let opt = |s: Option<String>| s.map_or(Cell::None, Cell::Str);
    let (country_name, country_iso_code, region, on_cloud, provider, cloud_region) =
        if cloud.is_on_private_infra() {
            (
                opt(geo.country_name.clone()),
                opt(geo.country_iso_code.clone()),
                opt(geo.region.clone()),
                "N",
                String::new(),
                String::new(),
            )
        } else {
            let (name, iso, region) = match cloud_location(&cloud) {
                Some((name, iso, region)) => (Cell::Str(name), Cell::Str(iso), opt(region)),
                None => (
                    opt(geo.country_name.clone()),
                    opt(geo.country_iso_code.clone()),
                    opt(geo.region.clone()),
                ),
            };
            (
                name,
                iso,
                region,
                "Y",
                cloud.provider.clone().unwrap_or_default(),
                cloud.region.clone().unwrap_or_default(),
            )
        };
    let (lon, lat) = if cloud.is_on_private_infra() {
        (
            geo.longitude.map_or(Cell::None, Cell::Float),
            geo.latitude.map_or(Cell::None, Cell::Float),
        )
    } else {
        (Cell::None, Cell::None)
    };
    let n = state.measurements;
    let avg = |sum: f64, last: f64| if n > 0 { sum / n as f64 } else { last };
    let emissions = state.total_emissions;
    vec![
        ("timestamp", Cell::Str(machine::local_timestamp())),
        ("project_name", Cell::Str(settings.project_name.clone())),
        ("run_id", Cell::Str(run_id.to_string())),
        ("experiment_id", Cell::Str(settings.experiment_id.clone())),
        ("duration", Cell::Float(duration)),
        ("emissions", Cell::Float(emissions)),
        ("emissions_rate", Cell::Float(emissions / duration)),
        (
            "cpu_power",
            Cell::Float(avg(state.cpu_power_sum, state.cpu_power)),
        ),
        ("gpu_power", Cell::Float(0.0)),
        (
            "ram_power",
            Cell::Float(avg(state.ram_power_sum, state.ram_power)),
        ),
        ("cpu_energy", Cell::Float(state.total_cpu_energy)),
        ("gpu_energy", Cell::Float(0.0)),
        ("ram_energy", Cell::Float(state.total_ram_energy)),
        ("energy_consumed", Cell::Float(state.total_energy)),
        ("water_consumed", Cell::Float(state.total_water)),
        ("country_name", country_name),
        ("country_iso_code", country_iso_code),
        ("region", region),
        ("cloud_provider", Cell::Str(provider)),
        ("cloud_region", Cell::Str(cloud_region)),
        ("os", Cell::Str(facts.os.clone())),
        ("python_version", Cell::Str(String::new())),
        ("codecarbon_version", Cell::Str(CODECARBON_VERSION.into())),
        ("cpu_count", Cell::Int(facts.cpu_count as i64)),
        ("cpu_model", Cell::Str(facts.cpu_model.clone())),
        ("gpu_count", Cell::Int(0)),
        ("gpu_model", Cell::Str(String::new())),
        ("longitude", lon),
        ("latitude", lat),
        ("ram_total_size", Cell::Float(facts.ram_total_size)),
        ("tracking_mode", Cell::Str(settings.tracking_mode.clone())),
        ("cpu_utilization_percent", mean(&state.cpu_utilization)),
        ("gpu_utilization_percent", Cell::Int(0)),
        ("ram_utilization_percent", mean(&state.ram_utilization)),
        ("ram_used_gb", mean(&state.ram_used)),
        ("on_cloud", Cell::Str(on_cloud.into())),
        ("pue", Cell::Float(settings.pue)),
        ("wue", Cell::Float(settings.wue)),
    ]
}

/// codecarbon's `backup`: `<file>.bak`, else `<file>_0.bak`, `<file>_1.bak`, ...
fn backup(path: &Path) -> Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let parent = path.parent().unwrap_or(Path::new("."));
    let mut target = parent.join(format!("{name}.bak"));
    let mut idx = 0;
    while target.exists() {
        target = parent.join(format!("{name}_{idx}.bak"));
        idx += 1;
    }
    std::fs::rename(path, &target).map_err(|e| Error::io("backing up", path, e))
}

/// Upstream `FileOutput.out` (append mode): a new file with the header, or the row appended
/// in the order of the existing file's header when it holds the same columns; a file with other
/// columns is backed up first.
pub fn write_row(path: &Path, row: &[(&'static str, Cell)]) -> Result<()> {
    use std::io::Write;
    let existing = match std::fs::read_to_string(path) {
        Ok(text) if !text.is_empty() => Some(text),
        Ok(_) => {
            log::warn!(
                "File {} exists but is empty. Treating as new file.",
                path.display()
            );
            None
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::io("reading", path, e)),
    };
    let header = existing.as_deref().and_then(|text| {
        crate::codecarbon_data::csv_rows(text.lines().next().unwrap_or_default())
            .into_iter()
            .next()
    });
    let mut ours: Vec<&str> = row.iter().map(|(k, _)| *k).collect();
    ours.sort();
    let matches = header.as_ref().is_some_and(|h| {
        let mut theirs: Vec<&str> = h.iter().map(String::as_str).collect();
        theirs.sort();
        theirs == ours
    });
    let line = |order: &[&str]| {
        order
            .iter()
            .map(|col| {
                row.iter()
                    .find(|(k, _)| k == col)
                    .map_or(String::new(), |(_, c)| c.to_csv())
            })
            .collect::<Vec<_>>()
            .join(",")
            + "\n"
    };
    if existing.is_some() && matches {
        let header = header.expect("matched");
        let order: Vec<&str> = header.iter().map(String::as_str).collect();
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(|e| Error::io("opening", path, e))?;
        return file
            .write_all(line(&order).as_bytes())
            .map_err(|e| Error::io("writing", path, e));
    }
    if existing.is_some() {
        log::warn!("The CSV format has changed, backing up old emission file.");
        backup(path)?;
    }
    let order: Vec<&str> = row.iter().map(|(k, _)| *k).collect();
    let text = order.join(",") + "\n" + &line(&order);
    std::fs::write(path, text).map_err(|e| Error::io("writing", path, e))
}

/// Upstream `CodeCarbonCallback`: an [`EmissionsTracker`] on the local main process, made at
/// `on_init_end` (into `args.output_dir`), started at `on_train_begin`, stopped at
/// `on_train_end`.
pub struct CodeCarbonCallback {
    settings: CodeCarbonSettings,
    tracker: Option<EmissionsTracker>,
}

impl std::fmt::Debug for CodeCarbonCallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CodeCarbonCallback")
            .field("settings", &self.settings)
            .field("tracker", &self.tracker)
            .finish()
    }
}

impl CodeCarbonCallback {
    /// Settings from the working directory, home and environment
    /// ([`CodeCarbonSettings::from_env`]); refusals are errors.
    pub fn new() -> Result<Self> {
        Ok(Self::with_settings(CodeCarbonSettings::from_env()?))
    }

    /// With the settings given.
    pub fn with_settings(settings: CodeCarbonSettings) -> Self {
        Self {
            settings,
            tracker: None,
        }
    }

    /// The tracker, once made.
    pub fn tracker(&self) -> Option<&EmissionsTracker> {
        self.tracker.as_ref()
    }
}

impl TrainerCallback for CodeCarbonCallback {
    fn name(&self) -> &str {
        "CodeCarbonCallback"
    }

    fn on_init_end(
        &mut self,
        args: &TrainingArguments,
        state: &TrainerState,
        _control: &mut TrainerControl,
    ) -> Result<()> {
        if self.tracker.is_none() && state.is_local_process_zero {
            self.tracker = Some(EmissionsTracker::new(
                self.settings.clone(),
                args.output_dir(),
            )?);
        }
        Ok(())
    }

    fn on_train_begin(
        &mut self,
        _args: &TrainingArguments,
        state: &TrainerState,
        _control: &mut TrainerControl,
    ) -> Result<()> {
        if let Some(tracker) = self
            .tracker
            .as_mut()
            .filter(|_| state.is_local_process_zero)
        {
            tracker.start();
        }
        Ok(())
    }

    fn on_train_end(
        &mut self,
        _args: &TrainingArguments,
        state: &TrainerState,
        _control: &mut TrainerControl,
    ) -> Result<()> {
        if let Some(tracker) = self
            .tracker
            .as_mut()
            .filter(|_| state.is_local_process_zero)
        {
            tracker.stop()?;
        }
        Ok(())
    }
}

//! What codecarbon 3.3 reads from the machine, read the same way on Linux: the platform's
//! name, the CPU's model and counts, memory, CPU times (psutil's, from `/proc`), the power
//! sensors and GPUs it would use, SLURM's allocation, and where the machine is (the cloud's
//! metadata service, then the location services geojs and ipinfo).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::codecarbon_data::{CloudMetadata, GeoMetadata, country_by_alpha_2};
use crate::{JsonValue, loads};

/// psutil's bytes per GB (`B_TO_GB`, 1024³).
pub const B_TO_GB: f64 = 1024.0 * 1024.0 * 1024.0;

fn sysconf(name: nix::unistd::SysconfVar) -> Option<i64> {
    nix::unistd::sysconf(name).ok().flatten().filter(|v| *v > 0)
}

fn run(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Python's `platform.platform()` on Linux: `Linux-<release>-<machine>-with-glibc<version>`
/// (uname, `uname -p` when it differs from the machine and is known, glibc's version).
pub fn platform_platform() -> String {
    let text = |s: &std::ffi::OsStr| s.to_string_lossy().into_owned();
    let (system, release, machine) = match nix::sys::utsname::uname() {
        Ok(u) => (text(u.sysname()), text(u.release()), text(u.machine())),
        Err(_) => (String::new(), String::new(), String::new()),
    };
    let mut processor = run("uname", &["-p"])
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    if processor == machine {
        processor.clear();
    }
    let libc = glibc_version()
        .map(|v| format!("glibc{v}"))
        .unwrap_or_default();
    python_platform_join(&[&system, &release, &machine, &processor, "with", &libc])
}

/// `os.confstr("CS_GNU_LIBC_VERSION")`'s version ("2.36"), as `getconf GNU_LIBC_VERSION` says.
fn glibc_version() -> Option<String> {
    let s = run("getconf", &["GNU_LIBC_VERSION"])?;
    let mut parts = s.split_whitespace();
    (parts.next() == Some("glibc"))
        .then(|| parts.next().map(str::to_string))
        .flatten()
}

/// Python's `platform._platform`: the non-empty parts joined by `-`, filename obstacles made
/// `-` (space `_`), `unknown` dropped, repeated `-` folded, trailing ones removed.
fn python_platform_join(parts: &[&str]) -> String {
    let mut p = parts
        .iter()
        .filter(|x| !x.is_empty())
        .map(|x| x.trim())
        .collect::<Vec<_>>()
        .join("-")
        .replace(' ', "_");
    for c in ['/', '\\', ':', ';', '"', '(', ')'] {
        p = p.replace(c, "-");
    }
    p = p.replace("unknown", "");
    while p.contains("--") {
        p = p.replace("--", "-");
    }
    p.trim_end_matches('-').to_string()
}

/// py-cpuinfo's `brand_raw` as codecarbon's `detect_cpu_model` reads it: `/proc/cpuinfo`'s
/// `model name` (lscpu's `Model name` where it has none); `None` when neither says.
pub fn detect_cpu_model() -> Option<String> {
    if let Ok(text) = std::fs::read_to_string("/proc/cpuinfo") {
        for line in text.lines() {
            if let Some((k, v)) = line.split_once(':')
                && k.trim() == "model name"
            {
                return Some(v.trim().to_string());
            }
        }
    }
    run("lscpu", &[])?.lines().find_map(|l| {
        l.split_once(':')
            .filter(|(k, _)| k.trim() == "Model name")
            .map(|(_, v)| v.trim().to_string())
    })
}

/// SLURM's job (`SLURM_JOB_ID`, else the deprecated `SLURM_JOBID`).
pub fn slurm_job_id() -> Option<String> {
    std::env::var("SLURM_JOB_ID")
        .ok()
        .or_else(|| std::env::var("SLURM_JOBID").ok())
}

fn scontrol(job: &str) -> Option<String> {
    run("scontrol", &["show", "job", job]).map(|s| s.trim().to_string())
}

/// Upstream `count_cpus`: psutil's logical CPUs (`SC_NPROCESSORS_ONLN`), or the job's
/// `NumCPUs=` from `scontrol show job` under SLURM.
pub fn count_cpus() -> usize {
    let machine = sysconf(nix::unistd::SysconfVar::_NPROCESSORS_ONLN).unwrap_or(1) as usize;
    let Some(job) = slurm_job_id() else {
        return machine;
    };
    let Some(text) = scontrol(&job) else {
        log::warn!(
            "Error running `scontrol show job {job}` to count SLURM-available cpus. Using the machine's cpu count."
        );
        return machine;
    };
    let found: Vec<usize> = regex::Regex::new(r"NumCPUs=(\d+)")
        .expect("valid")
        .captures_iter(&text)
        .filter_map(|c| c[1].parse().ok())
        .collect();
    match found.as_slice() {
        [n] => *n,
        _ => {
            log::warn!(
                "Could not find NumCPUs= after running `scontrol show job {job}` to count SLURM-available cpus. Using the machine's cpu count."
            );
            machine
        }
    }
}

/// Upstream `count_physical_cpus`: lscpu's `Socket(s):`, 1 when it does not say.
pub fn count_physical_cpus() -> usize {
    run("lscpu", &[])
        .and_then(|text| {
            text.lines().find_map(|l| {
                l.contains("Socket(s):")
                    .then(|| l.split(':').nth(1)?.trim().parse().ok())
                    .flatten()
            })
        })
        .unwrap_or(1)
}

/// `/proc/meminfo` in bytes, by field.
fn meminfo() -> Vec<(String, u64)> {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?.to_string(), f.next()?.parse::<u64>().ok()? * 1024))
        })
        .collect()
}

/// psutil's `virtual_memory()`: total, used (`total - available`) and percent used (one
/// decimal).
pub fn virtual_memory() -> (f64, f64, f64) {
    let m = meminfo();
    let get = |k: &str| m.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
    let total = get("MemTotal:").unwrap_or(0) as f64;
    let free = get("MemFree:").unwrap_or(0) as f64;
    let mut avail = match get("MemAvailable:") {
        Some(a) if a > 0 => a as f64,
        _ => {
            // psutil's calculate_avail_vmem fallback, simplified to free + cached + buffers
            free + get("Cached:").unwrap_or(0) as f64 + get("Buffers:").unwrap_or(0) as f64
        }
    };
    if avail > total {
        avail = free;
    }
    let used = total - avail;
    let percent = if total > 0.0 {
        python_round_1((total - avail) / total * 100.0)
    } else {
        0.0
    };
    (total, used, percent)
}

/// Python's `round(x, 1)` (correctly rounded, halves to even on the exact decimal value).
pub fn python_round_1(x: f64) -> f64 {
    let text = format!("{x:.1}");
    text.parse().unwrap_or(x)
}

/// Upstream `RAM.machine_memory_GB`: psutil's total memory in GB, or the job's `mem=` under
/// SLURM.
pub fn machine_memory_gb() -> f64 {
    let total = virtual_memory().0 / B_TO_GB;
    let Some(job) = slurm_job_id() else {
        return total;
    };
    let Some(text) = scontrol(&job) else {
        log::warn!(
            "Error running `scontrol show job $SLURM_JOB_ID` to retrieve SLURM-available RAM.Using the machine's total RAM."
        );
        return total;
    };
    let mut found: Vec<String> = regex::Regex::new(r"AllocTRES=.*?,mem=(\d+[A-Z])")
        .expect("valid")
        .captures_iter(&text)
        .map(|c| c[1].to_string())
        .collect();
    if found.is_empty() {
        found = regex::Regex::new(r"TRES=.*?,mem=(\d+[A-Z])")
            .expect("valid")
            .captures_iter(&text)
            .map(|c| c[1].to_string())
            .collect();
    }
    let [mem] = found.as_slice() else {
        log::warn!(
            "Could not find mem= after running `scontrol show job $SLURM_JOB_ID` to count SLURM-available RAM. Using the machine's total RAM."
        );
        return total;
    };
    let (nb, unit) = mem.split_at(mem.len() - 1);
    let nb: f64 = nb.parse().unwrap_or(0.0);
    match unit {
        "T" => nb * 1000.0,
        "G" => nb,
        "M" => nb / 1000.0,
        "K" => nb / 1_000_000.0,
        _ => total,
    }
}

/// psutil's `cpu_times()` summed over the CPUs, in seconds: the total (guest time excluded, as
/// it is counted in user time) and the busy part (less idle and iowait).
pub fn cpu_times() -> Option<(f64, f64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let ticks = sysconf(nix::unistd::SysconfVar::CLK_TCK).unwrap_or(100) as f64;
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse::<f64>().ok())
        .map(|x| x / ticks)
        .collect();
    let field = |i: usize| v.get(i).copied().unwrap_or(0.0);
    let total = v.iter().sum::<f64>() - field(8) - field(9);
    let busy = total - field(3) - field(4);
    Some((total, busy))
}

/// psutil's `cpu_percent` between two [`cpu_times`] readings (unrounded).
pub fn busy_percent(previous: (f64, f64), current: (f64, f64)) -> f64 {
    let total_delta = current.0 - previous.0;
    let busy_delta = current.1 - previous.1;
    if total_delta <= 0.0 {
        return 0.0;
    }
    (busy_delta / total_delta * 100.0).clamp(0.0, 100.0)
}

/// `/proc/<pid>/stat`'s fields after the command name.
fn proc_stat(pid: u32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// psutil's `Process(pid).children(recursive=True)`: every descendant's pid.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(p) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if let Some(ppid) = proc_stat(p).and_then(|f| f.get(1)?.parse().ok()) {
                parents.push((p, ppid));
            }
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        for (child, _) in parents.iter().filter(|(_, pp)| *pp == parent) {
            if !out.contains(child) {
                out.push(*child);
                frontier.push(*child);
            }
        }
    }
    out
}

/// psutil's `Process(pid).cpu_times()`: user + system seconds.
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let f = proc_stat(pid)?;
    let ticks = sysconf(nix::unistd::SysconfVar::CLK_TCK).unwrap_or(100) as f64;
    let user: f64 = f.get(11)?.parse().ok()?;
    let system: f64 = f.get(12)?.parse().ok()?;
    Some(user / ticks + system / ticks)
}

/// psutil's `Process(pid).memory_info().rss` in bytes.
pub fn process_rss(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * sysconf(nix::unistd::SysconfVar::PAGE_SIZE).unwrap_or(4096) as u64)
}

/// codecarbon's `RAM._detect_arm_cpu`: the machine is ARM (`arm` or `aarch` in its name).
pub fn is_arm_cpu() -> bool {
    let m = std::env::consts::ARCH.to_lowercase();
    m.contains("arm") || m.contains("aarch")
}

/// codecarbon's `is_rapl_available`: a package domain's `energy_uj` readable under
/// `/sys/class/powercap` (the places it scans).
pub fn is_rapl_available() -> bool {
    let bases = [
        "/sys/class/powercap/intel-rapl/subsystem",
        "/sys/class/powercap/intel-rapl",
        "/sys/class/powercap",
        "/sys/devices/virtual/powercap",
    ];
    let is_main = |dir: &Path, name: &str| {
        std::fs::read_to_string(dir.join("name"))
            .map(|n| n.trim().to_lowercase().contains("package"))
            .unwrap_or(false)
            || name.ends_with(":0")
    };
    let readable_main = |dir: &Path, name: &str| {
        let energy = dir.join("energy_uj");
        energy.exists() && std::fs::File::open(&energy).is_ok() && is_main(dir, name)
    };
    let scan = |dir: &Path| -> bool {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.contains(':') && e.path().is_dir() && readable_main(&e.path(), &name)
            })
    };
    bases
        .iter()
        .map(Path::new)
        .filter(|b| b.exists())
        .any(|base| {
            std::fs::read_dir(base)
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| {
                    e.file_name().to_string_lossy().starts_with("intel-rapl")
                        && e.path().is_dir()
                        && scan(&e.path())
                })
                || scan(base)
        })
}

/// codecarbon's `is_nvidia_system`: `nvidia-smi --help` runs.
pub fn is_nvidia_system() -> bool {
    run("nvidia-smi", &["--help"]).is_some()
}

/// codecarbon's `is_rocm_system`: `rocm-smi --help` runs.
pub fn is_rocm_system() -> bool {
    run("rocm-smi", &["--help"]).is_some()
}

/// codecarbon's `is_raspberry`: a Raspberry Pi 5's PMIC answers `vcgencmd pmic_read_adc`.
pub fn is_raspberry() -> bool {
    Path::new("/usr/bin/vcgencmd").exists()
        && run("vcgencmd", &["pmic_read_adc"]).is_some_and(|o| o.contains("volt("))
}

/// The local time as codecarbon stamps a row (`datetime.now().strftime("%Y-%m-%dT%H:%M:%S")`).
pub fn local_timestamp() -> String {
    jiff::Zoned::now().strftime("%Y-%m-%dT%H:%M:%S").to_string()
}

/// Where codecarbon's online tracker asks where the machine is.
#[derive(Debug, Clone, PartialEq)]
pub struct LocationServices {
    /// codecarbon's `geo_js_url` (`https://get.geojs.io/v1/ip/geo.json`).
    pub geo_js_url: String,
    /// Its backup (`https://ipinfo.io/json`).
    pub ipinfo_url: String,
    /// The cloud metadata service (`http://169.254.169.254`), asked as AWS, Azure then GCP.
    pub cloud_metadata_url: String,
}

impl Default for LocationServices {
    fn default() -> Self {
        Self {
            geo_js_url: "https://get.geojs.io/v1/ip/geo.json".into(),
            ipinfo_url: "https://ipinfo.io/json".into(),
            cloud_metadata_url: "http://169.254.169.254".into(),
        }
    }
}

fn get_json(
    url: &str,
    timeout: Duration,
    header: Option<(&str, &str)>,
) -> Result<JsonValue, String> {
    let agent = ureq::AgentBuilder::new().timeout(timeout).build();
    let mut request = agent.get(url);
    if let Some((k, v)) = header {
        request = request.set(k, v);
    }
    let text = request
        .call()
        .map_err(|e| e.to_string())?
        .into_string()
        .map_err(|e| e.to_string())?;
    loads(&text).map_err(|e| e.to_string())
}

fn as_object(v: &JsonValue) -> Option<&crate::JsonMap> {
    match v {
        JsonValue::Object(m) => Some(m),
        _ => None,
    }
}

fn text_of(v: Option<&JsonValue>) -> Option<String> {
    match v? {
        JsonValue::Str(s) => Some(s.clone()),
        _ => None,
    }
}

/// Python's `float(x)` of a JSON value (a number or a numeric string).
fn float_of(v: Option<&JsonValue>) -> Option<f64> {
    match v? {
        JsonValue::Str(s) => s.trim().parse().ok(),
        other => other.as_f64(),
    }
}

impl LocationServices {
    /// Upstream `GeoMetadata.from_geo_js`: geojs (0.5 s), else ipinfo.io (0.5 s, its alpha-2
    /// country through pycountry), else Canada / Quebec.
    pub fn geo_metadata(&self) -> GeoMetadata {
        let timeout = Duration::from_millis(500);
        let primary = get_json(&self.geo_js_url, timeout, None).and_then(|v| {
            let m = as_object(&v).ok_or("not an object")?;
            let region = text_of(m.get("region")).unwrap_or_default().to_lowercase();
            if region.is_empty() {
                return Err("Region is empty".to_string());
            }
            let iso = text_of(m.get("country_code3")).ok_or("'country_code3'")?;
            Ok(GeoMetadata {
                latitude: Some(float_of(m.get("latitude")).ok_or("latitude")?),
                longitude: Some(float_of(m.get("longitude")).ok_or("longitude")?),
                ..GeoMetadata::new(
                    Some(&iso),
                    text_of(m.get("country")).as_deref(),
                    Some(&region),
                )
            })
        });
        match primary {
            Ok(geo) => return geo,
            Err(e) => log::warn!(
                "Unable to access geographical location through primary API. Will resort to using the backup API - Exception : {e} - url={}",
                self.geo_js_url
            ),
        }
        let backup = get_json(&self.ipinfo_url, timeout, None).and_then(|v| {
            let m = as_object(&v).ok_or("not an object")?;
            let loc = text_of(m.get("loc")).unwrap_or_default();
            let loc: Vec<&str> = loc.split(',').collect();
            let (latitude, longitude) = if loc.len() == 2 {
                (
                    loc[0].trim().parse::<f64>().map_err(|e| e.to_string())?,
                    loc[1].trim().parse::<f64>().map_err(|e| e.to_string())?,
                )
            } else {
                (0.0, 0.0)
            };
            let country = text_of(m.get("country")).and_then(|a2| country_by_alpha_2(&a2));
            let (iso, name) = country.unwrap_or_default();
            Ok(GeoMetadata {
                latitude: Some(latitude),
                longitude: Some(longitude),
                ..GeoMetadata::new(
                    Some(&iso),
                    Some(&name),
                    Some(&text_of(m.get("region")).unwrap_or_default()),
                )
            })
        });
        backup.unwrap_or_else(|e| {
            log::warn!(
                "Unable to access geographical location through fallback API. Using 'Canada' as the default value - Exception : {e} - url={}",
                self.ipinfo_url
            );
            GeoMetadata::canada_default()
        })
    }

    /// Upstream `CloudMetadata.from_utils`: the metadata service asked as AWS, Azure then GCP
    /// (1 s each); GCP's zone gives its region; AWS and Azure publish no carbon intensity, so
    /// codecarbon reports them as private infrastructure (as here).
    pub fn cloud_metadata(&self) -> CloudMetadata {
        let base = self.cloud_metadata_url.trim_end_matches('/');
        let timeout = Duration::from_secs(1);
        type Provider<'a> = (&'a str, String, Option<(&'a str, &'a str)>);
        let providers: [Provider<'_>; 3] = [
            (
                "aws",
                format!("{base}/latest/dynamic/instance-identity/document"),
                None,
            ),
            (
                "azure",
                format!("{base}/metadata/instance?api-version=2019-08-15"),
                Some(("Metadata", "true")),
            ),
            (
                "gcp",
                format!("{base}/computeMetadata/v1/instance/?recursive=true&alt=json"),
                Some(("Metadata-Flavor", "Google")),
            ),
        ];
        let gcp_region = regex::Regex::new(r"[a-z]+-[a-z]+[0-9]+").expect("valid");
        for (provider, url, header) in providers {
            let Ok(metadata) = get_json(&url, timeout, header) else {
                log::debug!("Not running on {}", provider.to_uppercase());
                continue;
            };
            if as_object(&metadata).is_some_and(|m| m.is_empty()) {
                return CloudMetadata::default();
            }
            if provider != "gcp" {
                log::warn!(
                    "Cloud provider '{provider}' do not publish electricity carbon intensity. Using country value instead."
                );
                return CloudMetadata::default();
            }
            let zone = as_object(&metadata).and_then(|m| text_of(m.get("zone")));
            let region = zone.and_then(|z| gcp_region.find(&z).map(|m| m.as_str().to_string()));
            if region.is_none() {
                log::warn!(
                    "Cloud provider '{provider}' detected, but unable to read region. Using country value instead."
                );
            }
            return CloudMetadata {
                provider: Some(provider.to_string()),
                region,
            };
        }
        CloudMetadata::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platform_join_cleans_as_python() {
        assert_eq!(
            python_platform_join(&["Linux", "6.1.0", "x86_64", "", "with", "glibc2.36"]),
            "Linux-6.1.0-x86_64-with-glibc2.36"
        );
        assert_eq!(
            python_platform_join(&["Linux", "5.4 (x)", "unknown", "with", ""]),
            "Linux-5.4_-x-with"
        );
    }

    #[test]
    fn round_1_matches_python() {
        assert_eq!(python_round_1(12.05), 12.1); // 12.05 is 12.050000000000000711 as a double
        assert_eq!(python_round_1(0.25), 0.2);
        assert_eq!(python_round_1(99.99), 100.0);
    }
}

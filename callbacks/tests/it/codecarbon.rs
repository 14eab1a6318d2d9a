//! CodeCarbonCallback against upstream's with codecarbon 3.3.2
//! (scripts/reference/codecarbon_callback.py, run on this machine): the tables codecarbon
//! estimates with (its data files, the CPU model match, the RAM power model, the carbon
//! intensity of locations along every path, pandas' cells), what it reads of this machine and
//! where it finds it, and the `emissions.csv` its tracker writes through the Trainer's events
//! with the same settings — every column that does not depend on timing equal, the others
//! bound by codecarbon's own arithmetic (energy = power × time, emissions = energy × the
//! location's intensity, the CPU's power between 10 % and 100 % of its TDP); three runs find
//! the machine in a GCP region, through geojs, and through ipinfo.io, from a stand-in of the
//! location services answering both trackers the same. Upstream's tracker
//! then appends its own row to our file (it backs up a file whose header it does not write) and
//! pandas reads both rows.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tchtrain_callbacks::{
    CODECARBON_DATA_FILES, CloudMetadata, CodeCarbonCallback, CodeCarbonCell, CodeCarbonSettings,
    EMISSIONS_CSV_COLUMNS, Emissions, EmissionsTracker, Error, GeoMetadata, JsonValue,
    LocationServices, MachineFacts, TrainerCallback, TrainerControl, TrainerState, cloud_location,
    codecarbon_csv_rows, countries_table, dumps, match_cpu, ram_power_watts,
};
use tchtrain_training_args::TrainingArguments;

use crate::common::{at, env_of, run_reader, script_reference, temp_dir};

fn opt_str(v: &JsonValue) -> Option<&str> {
    v.as_str()
}

fn geo_of(v: &JsonValue) -> GeoMetadata {
    let g = v.as_array().unwrap();
    GeoMetadata::new(opt_str(&g[0]), opt_str(&g[1]), opt_str(&g[2]))
}

fn rel(a: f64, b: f64) -> f64 {
    if a == b {
        0.0
    } else {
        (a - b).abs() / a.abs().max(b.abs())
    }
}

#[test]
fn codecarbon_tables_equal_codecarbons() {
    let reference = script_reference("codecarbon_callback");
    // The data files carried are codecarbon's, byte for byte; the countries pycountry's.
    let hashes = at(at(&reference, "data"), "files");
    for (name, text) in CODECARBON_DATA_FILES {
        let ours = format!("{:x}", Sha256::digest(text.as_bytes()));
        assert_eq!(
            ours,
            at(hashes, name).as_str().unwrap(),
            "callbacks/data/codecarbon/{name} differs from the installed codecarbon's: run scripts/vendor_codecarbon_data.py"
        );
    }
    let pycountry = at(at(&reference, "data"), "countries").as_object().unwrap();
    let ours = countries_table();
    assert_eq!(
        ours.len(),
        pycountry.len(),
        "countries.json: run scripts/vendor_codecarbon_data.py"
    );
    for (alpha_2, entry) in pycountry.iter() {
        assert_eq!(
            ours.get(alpha_2),
            Some(entry),
            "countries.json's {alpha_2}: run scripts/vendor_codecarbon_data.py"
        );
    }
    // TDP._get_matching_cpu: exact, cleaned and token-set matches; ambiguous and unknown ones.
    for entry in at(&reference, "cpu_match").as_array().unwrap() {
        let e = entry.as_array().unwrap();
        let name = e[0].as_str().unwrap();
        let expected = e[1].as_str().map(|m| (m, e[2].as_f64().unwrap()));
        assert_eq!(match_cpu(name), expected, "cpu model {name:?}");
    }
    // RAM._calculate_ram_power, exactly.
    for entry in at(&reference, "ram_power").as_array().unwrap() {
        let e = entry.as_array().unwrap();
        let (gb, arm, watts) = (
            e[0].as_f64().unwrap(),
            e[1].as_bool().unwrap(),
            e[2].as_f64().unwrap(),
        );
        assert_eq!(ram_power_watts(gb, arm), watts, "{gb} GB, arm {arm}");
    }
    // Emissions: every path of get_private_infra_emissions and get_cloud_emissions, exactly
    // (the same operations in the same order on the same tables).
    for entry in at(&reference, "emissions").as_array().unwrap() {
        let e = entry.as_array().unwrap();
        let (what, kwh, kg) = (&e[0], e[1].as_f64().unwrap(), e[2].as_f64().unwrap());
        let what_obj = what.as_object().unwrap();
        let engine = Emissions {
            force_carbon_intensity_g_co2e_kwh: what_obj.get("forced").and_then(JsonValue::as_f64),
        };
        let geo = what_obj
            .get("geo")
            .filter(|g| !matches!(g, JsonValue::Null))
            .map(geo_of);
        let ours = match what_obj.get("cloud") {
            Some(cloud) => {
                let c = cloud.as_array().unwrap();
                let cloud = CloudMetadata {
                    provider: c[0].as_str().map(str::to_string),
                    region: c[1].as_str().map(str::to_string),
                };
                if let Some(names) = what_obj.get("names") {
                    let expected = names.as_array().map(|n| {
                        (
                            n[0].as_str().unwrap().to_string(),
                            n[1].as_str().unwrap().to_string(),
                            n[2].as_str().map(str::to_string),
                        )
                    });
                    assert_eq!(
                        cloud_location(&cloud),
                        expected,
                        "{}",
                        dumps(what, None, false)
                    );
                }
                engine.get_cloud_emissions(kwh, &cloud, geo.as_ref())
            }
            None => engine.get_private_infra_emissions(kwh, geo.as_ref().unwrap()),
        };
        assert_eq!(ours, kg, "{} of {kwh} kWh", dumps(what, None, false));
    }
    // pandas' to_csv cells (a row of one empty cell is quoted by Python's csv module; ours
    // are 38 cells wide).
    for entry in at(&reference, "csv_cells").as_array().unwrap() {
        let e = entry.as_array().unwrap();
        let cell = match &e[0] {
            JsonValue::Float(f) => CodeCarbonCell::Float(*f),
            JsonValue::Int(i) => CodeCarbonCell::Int(*i),
            JsonValue::Str(s) => CodeCarbonCell::Str(s.clone()),
            JsonValue::Null => CodeCarbonCell::None,
            other => panic!("{other:?}"),
        };
        let text = match cell.to_csv() {
            t if t.is_empty() => "\"\"".to_string(),
            t => t,
        };
        assert_eq!(text, e[1].as_str().unwrap(), "{:?}", e[0]);
    }
}

/// The facts codecarbon read of this machine, and where it found it.
#[test]
fn codecarbon_reads_this_machine_as_codecarbon() {
    let reference = script_reference("codecarbon_callback");
    let m = at(&reference, "machine");
    for flag in ["rapl", "nvidia", "rocm", "raspberry"] {
        assert!(
            !at(m, flag).as_bool().unwrap(),
            "codecarbon found {flag} on this machine: the CodeCarbon tracker refuses it"
        );
    }
    let settings = CodeCarbonSettings::default();
    let facts = MachineFacts::detect(&settings).unwrap();
    assert_eq!(facts.os, at(m, "os").as_str().unwrap());
    assert_eq!(facts.cpu_count as i64, at(m, "cpu_count").as_i64().unwrap());
    assert_eq!(
        facts.cpu_physical_count as i64,
        at(m, "cpu_physical_count").as_i64().unwrap()
    );
    assert_eq!(facts.cpu_model, at(m, "tdp_model").as_str().unwrap());
    assert_eq!(
        facts.cpu_tdp,
        at(m, "tdp").as_f64().unwrap() * facts.cpu_physical_count as f64
    );
    assert_eq!(
        facts.ram_total_size,
        at(m, "ram_total_size").as_f64().unwrap()
    );
    let cloud = settings.location.cloud_metadata();
    let c = at(m, "cloud").as_array().unwrap();
    assert_eq!(cloud.provider.as_deref(), c[0].as_str());
    assert_eq!(cloud.region.as_deref(), c[1].as_str());
    let geo = settings.location.geo_metadata();
    let g = at(m, "geo");
    assert_eq!(
        geo.country_iso_code.as_deref(),
        at(g, "country_iso_code").as_str()
    );
    assert_eq!(geo.country_name.as_deref(), at(g, "country_name").as_str());
    assert_eq!(geo.region.as_deref(), at(g, "region").as_str());
    assert_eq!(geo.latitude, at(g, "latitude").as_f64());
    assert_eq!(geo.longitude, at(g, "longitude").as_f64());
}

/// A stand-in for the location services on 127.0.0.1 answering `[status, body]` by path (the
/// reference's `services`), as the reference's answered upstream's lookups; its base URL.
fn stand_in(answers: JsonValue) -> String {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(&stream);
            let mut request_line = String::new();
            if reader.read_line(&mut request_line).is_err() {
                continue;
            }
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let path = request_line.split_whitespace().nth(1).unwrap_or("/");
            let (status, body) = match answers.as_object().unwrap().get(path) {
                Some(JsonValue::Array(a)) => (
                    a[0].as_i64().unwrap(),
                    match &a[1] {
                        JsonValue::Str(text) => text.clone(),
                        other => dumps(other, None, false),
                    },
                ),
                _ => (404, "not found".to_string()),
            };
            let _ = write!(
                &stream,
                "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    base
}

/// The Trainer's events around `seconds` of work (a busy half, an idle half), as the
/// reference drove upstream's callback.
fn run_callback(settings: &CodeCarbonSettings, output_dir: &Path, seconds: f64) {
    let args = TrainingArguments {
        output_dir: Some(output_dir.display().to_string()),
        ..Default::default()
    };
    let (state, mut control) = (TrainerState::default(), TrainerControl::default());
    let mut callback = CodeCarbonCallback::with_settings(settings.clone());
    callback.on_init_end(&args, &state, &mut control).unwrap();
    callback
        .on_train_begin(&args, &state, &mut control)
        .unwrap();
    let start = Instant::now();
    let mut x = 0u64;
    while start.elapsed().as_secs_f64() < seconds / 2.0 {
        x = std::hint::black_box(x.wrapping_add(1));
    }
    std::thread::sleep(Duration::from_secs_f64(seconds / 2.0));
    callback.on_train_end(&args, &state, &mut control).unwrap();
}

/// Our file: its header and its rows as text cells.
fn read_csv(path: &Path) -> (Vec<String>, Vec<Vec<String>>) {
    let mut rows = codecarbon_csv_rows(&std::fs::read_to_string(path).unwrap());
    let header = rows.remove(0);
    (header, rows)
}

/// Columns whose values depend on timing, the machine's load or the process.
const MEASURED: [&str; 15] = [
    "timestamp",
    "run_id",
    "duration",
    "emissions",
    "emissions_rate",
    "cpu_power",
    "cpu_energy",
    "ram_energy",
    "energy_consumed",
    "water_consumed",
    "cpu_utilization_percent",
    "ram_utilization_percent",
    "ram_used_gb",
    "ram_power",
    "python_version",
];

#[test]
fn codecarbon_callback_writes_what_upstream_writes() {
    let reference = script_reference("codecarbon_callback");
    let machine_tdp = {
        let m = at(&reference, "machine");
        at(m, "tdp").as_f64().unwrap() * at(m, "cpu_physical_count").as_f64().unwrap()
    };
    let root = temp_dir("codecarbon");
    let timestamp = regex::Regex::new(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d$").unwrap();
    let uuid4 =
        regex::Regex::new(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
            .unwrap();
    for case in at(&reference, "cases").as_array().unwrap() {
        let name = at(case, "name").as_str().unwrap();
        let work = root.join(name);
        let out = work.join("out");
        std::fs::create_dir_all(&out).unwrap();
        if let Some(config) = at(case, "config").as_str() {
            std::fs::write(work.join(".codecarbon.config"), config).unwrap();
        }
        let env = env_of(case);
        let file = env
            .iter()
            .find(|(k, _)| k == "CODECARBON_OUTPUT_FILE")
            .map_or("emissions.csv", |(_, v)| v.as_str())
            .to_string();
        if let Some(existing) = case.as_object().unwrap().get("existing") {
            std::fs::write(out.join(&file), existing.as_str().unwrap()).unwrap();
        }
        let mut settings = CodeCarbonSettings::from_vars(&work, Some(&work), env.clone()).unwrap();
        if let Some(services) = case.as_object().unwrap().get("services") {
            let base = stand_in(services.clone());
            settings.location = LocationServices {
                geo_js_url: format!("{base}/geo.json"),
                ipinfo_url: format!("{base}/ipinfo"),
                cloud_metadata_url: base,
            };
        }
        let seconds = at(case, "seconds").as_f64().unwrap();
        let runs = at(case, "runs").as_i64().unwrap();
        for _ in 0..runs {
            run_callback(&settings, &out, seconds);
        }
        let read = at(case, "read");
        let mut files: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        let expected_files: Vec<String> = at(case, "files")
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap().to_string())
            .collect();
        assert_eq!(files, expected_files, "{name}: the files beside the CSV");
        let (header, rows) = read_csv(&out.join(&file));
        let expected_header: Vec<&str> = at(read, "header")
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h.as_str().unwrap())
            .collect();
        assert_eq!(header, expected_header, "{name}: header");
        assert_eq!(header, EMISSIONS_CSV_COLUMNS);
        let upstream_rows = at(read, "rows").as_array().unwrap();
        assert_eq!(rows.len(), upstream_rows.len(), "{name}: rows");
        let mut run_ids = Vec::new();
        for (row, upstream) in rows.iter().zip(upstream_rows) {
            let cell = |col: &str| row[header.iter().position(|h| h == col).unwrap()].as_str();
            let num = |col: &str| {
                cell(col)
                    .parse::<f64>()
                    .unwrap_or_else(|_| panic!("{name}: {col} = {:?}", cell(col)))
            };
            let up = |col: &str| at(upstream, col).as_str().unwrap();
            for col in EMISSIONS_CSV_COLUMNS {
                if MEASURED.contains(&col) {
                    continue;
                }
                assert_eq!(cell(col), up(col), "{name}: column {col}");
            }
            assert_eq!(cell("python_version"), "", "{name}: no Python runs here");
            // The measured columns: formats, and codecarbon's arithmetic between them.
            assert!(timestamp.is_match(cell("timestamp")));
            assert!(uuid4.is_match(cell("run_id")));
            run_ids.push(cell("run_id").to_string());
            let duration = num("duration");
            assert!(
                // The callbacks' own work and the first location lookup (inside the last
                // measurement's row, as codecarbon's) add to the work's time; 2 s of slack for
                // a loaded machine.
                duration >= seconds && duration < seconds + 2.0,
                "{name}: duration {duration} for {seconds} s of work"
            );
            let (cpu_e, ram_e, total) =
                (num("cpu_energy"), num("ram_energy"), num("energy_consumed"));
            assert!(
                rel(cpu_e + num("gpu_energy") + ram_e, total) < 1e-12,
                "{name}: energy_consumed"
            );
            // emissions / energy is the location's intensity, the same as upstream's row's.
            let intensity = up("emissions").parse::<f64>().unwrap()
                / up("energy_consumed").parse::<f64>().unwrap();
            assert!(
                rel(num("emissions") / total, intensity) < 1e-12,
                "{name}: intensity {} vs {intensity}",
                num("emissions") / total
            );
            assert!(
                rel(num("emissions_rate"), num("emissions") / duration) < 1e-12,
                "{name}: emissions_rate"
            );
            let pue: f64 = up("pue").parse().unwrap();
            let wue: f64 = up("wue").parse().unwrap();
            assert!(
                rel(num("water_consumed"), wue * total) < 1e-12,
                "{name}: water"
            );
            let tracking_process = up("tracking_mode") == "process";
            let tdp = settings.force_cpu_power.unwrap_or(machine_tdp);
            let cpu_power = num("cpu_power");
            if tracking_process {
                // The process tree's CPU seconds over wall seconds, per CPU: it counts every
                // thread of this test binary (the other tests run beside it), and codecarbon
                // does not clamp it (tick-granular times can pass 100 %).
                assert!(
                    cpu_power.is_finite() && cpu_power >= 0.0,
                    "{name}: cpu_power {cpu_power}"
                );
            } else {
                // tdp * (0.1 + 0.9 * load³) with the machine's load in [0, 1].
                let low = 0.1 * tdp * pue;
                assert!(
                    cpu_power >= low * (1.0 - 1e-12) && cpu_power <= tdp * pue * (1.0 + 1e-12),
                    "{name}: cpu_power {cpu_power} outside [{low}, {}]",
                    tdp * pue
                );
            }
            if tracking_process {
                // The process tree's memory: codecarbon's smallest estimate, as upstream's.
                assert_eq!(cell("ram_power"), up("ram_power"), "{name}: ram_power");
            } else {
                assert_eq!(cell("ram_power"), up("ram_power"), "{name}: ram_power");
                // A constant power: its energy covers the run up to the last measurement —
                // within 50 ms of the stop (codecarbon's staleness rule), before the first
                // location lookup and the row's duration (1 s of slack for a loaded machine).
                let covered = ram_e * 3.6e6 / num("ram_power");
                assert!(
                    covered <= duration && covered > duration - 1.0,
                    "{name}: the RAM's energy covers {covered} s of {duration} s"
                );
            }
            for col in [
                "cpu_utilization_percent",
                "ram_utilization_percent",
                "ram_used_gb",
            ] {
                if duration < 1.0 {
                    assert_eq!(cell(col), "0", "{name}: {col} without a sample");
                } else {
                    assert!(
                        num(col) >= 0.0 && cell(col).contains('.'),
                        "{name}: {col} = {}",
                        cell(col)
                    );
                }
            }
        }
        run_ids.dedup();
        assert_eq!(run_ids.len(), rows.len(), "{name}: one run id per run");
        if name == "defaults" {
            // codecarbon's own tracker appends its row to our file (same header: no backup),
            // and pandas reads both.
            let both = run_reader("_codecarbon_read.py", &[out.as_os_str()], &[]);
            assert_eq!(
                at(&both, "backups").as_array().unwrap().len(),
                0,
                "{}",
                dumps(&both, None, false)
            );
            let parsed = at(&both, "parsed").as_array().unwrap();
            assert_eq!(parsed.len(), 2);
            assert_eq!(at(&parsed[0], "cpu_count"), at(&parsed[1], "cpu_count"));
            assert_eq!(
                at(&parsed[0], "country_name"),
                at(&parsed[1], "country_name")
            );
            assert_eq!(
                at(&parsed[0], "ram_total_size"),
                at(&parsed[1], "ram_total_size")
            );
            assert_eq!(at(&parsed[0], "python_version"), &JsonValue::Null);
        }
    }
    let _ = std::fs::remove_dir_all(&root);
}

fn refused(vars: &[(&str, &str)], config: Option<&str>) -> String {
    let dir = temp_dir("codecarbon-refusals");
    if let Some(config) = config {
        std::fs::write(dir.join(".codecarbon.config"), config).unwrap();
    }
    let vars = vars.iter().map(|(k, v)| (k.to_string(), v.to_string()));
    match CodeCarbonSettings::from_vars(&dir, None, vars) {
        Err(e @ Error::CodeCarbonSetting { .. }) => e.to_string(),
        other => panic!("{config:?}: {other:?}"),
    }
}

#[test]
fn codecarbon_settings_it_cannot_honour_are_refused_by_name() {
    for (vars, config, says) in [
        (
            vec![("CODECARBON_SAVE_TO_API", "True")],
            None,
            "CODECARBON_SAVE_TO_API",
        ),
        (
            vec![("CODECARBON_OUTPUT_METHODS", "csv,prometheus")],
            None,
            "prometheus output",
        ),
        (
            vec![("CODECARBON_OUTPUT_METHODS", "cvs")],
            None,
            "not one of",
        ),
        (
            vec![("CODECARBON_EMISSIONS_ENDPOINT", "http://x")],
            None,
            "HTTP endpoint",
        ),
        (
            vec![("CODECARBON_ELECTRICITYMAPS_API_TOKEN", "t")],
            None,
            "force_carbon_intensity_g_co2e_kwh",
        ),
        (
            vec![("CODECARBON_ON_CSV_WRITE", "update")],
            None,
            "on_csv_write=append",
        ),
        (
            vec![("CODECARBON_TRACKING_MODE", "gpu")],
            None,
            "\"machine\" or \"process\"",
        ),
        (
            vec![("CODECARBON_PUE", "high")],
            None,
            "CODECARBON_PUE=\"high\"",
        ),
        (
            vec![("CODECARBON_API_CALL_INTERVAL", "8.0")],
            None,
            "integer",
        ),
        (vec![("CODECARBON_LOG_LEVEL", "loud")], None, "log levels"),
        (
            vec![("CODECARBON_MEASURE_POWER_SECS", "0")],
            None,
            "positive",
        ),
        (
            vec![("CODECARBON_PROJET_NAME", "x")],
            None,
            "no such setting",
        ),
        (
            vec![],
            Some("[codecarbon]\nsave_to_logger = true\n"),
            "save_to_logger=\"true\" in",
        ),
        (
            vec![],
            Some("[codecarbon]\nproject_name = a\n  b\n"),
            "several lines",
        ),
    ] {
        let message = refused(&vars, config);
        assert!(message.contains(says), "{vars:?} {config:?}: {message}");
    }
    // Accepted as upstream: output_methods decides over save_to_*; keys without effect on the
    // CSV; the environment over the files; a negative forced intensity ignored.
    let dir = temp_dir("codecarbon-accepted");
    std::fs::write(
        dir.join(".codecarbon.config"),
        "[codecarbon]\nproject_name = from-file\napi_key = k\norganization_id = o\n[other]\nx = 1\n",
    )
    .unwrap();
    let s = CodeCarbonSettings::from_vars(
        &dir,
        None,
        [
            ("CODECARBON_OUTPUT_METHODS", "csv"),
            ("CODECARBON_SAVE_TO_API", "true"),
            ("codecarbon_Project_Name", "from-env"),
            ("CODECARBON_FORCE_CARBON_INTENSITY_G_CO2E_KWH", "-1"),
            ("CODECARBON_ALLOW_MULTIPLE_RUNS", "1"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
    )
    .unwrap();
    assert_eq!(s.project_name, "from-env");
    assert!(s.save_to_file);
    assert_eq!(s.force_carbon_intensity_g_co2e_kwh, None);
    assert!(!s.allow_multiple_runs, "codecarbon's bool is \"true\" only");
    // The output folder must exist (codecarbon's OSError), before training.
    let missing: PathBuf = dir.join("missing");
    let e = EmissionsTracker::new(CodeCarbonSettings::default(), &missing).unwrap_err();
    assert!(e.to_string().contains("doesn't exist"), "{e}");
}

/// `allow_multiple_runs=false`: codecarbon's lock file; a second tracker while it is held
/// writes nothing (upstream's "Another instance of codecarbon is already running").
#[test]
fn codecarbon_lock_file_keeps_a_second_tracker_from_writing() {
    let out = temp_dir("codecarbon-lock");
    let settings = CodeCarbonSettings {
        allow_multiple_runs: false,
        output_file: "locked.csv".into(),
        ..Default::default()
    };
    let lock = tchtrain_callbacks::lock_file_path();
    let held_before = lock.exists();
    assert!(
        !held_before,
        "{} exists: another codecarbon run holds it",
        lock.display()
    );
    let mut first = EmissionsTracker::new(settings.clone(), &out).unwrap();
    assert!(lock.exists());
    let mut second = EmissionsTracker::new(settings.clone(), &out).unwrap();
    second.start();
    assert_eq!(second.stop().unwrap(), None);
    assert!(!out.join("locked.csv").exists());
    first.start();
    std::thread::sleep(Duration::from_millis(100));
    let kg = first.stop().unwrap().unwrap();
    assert!(kg > 0.0);
    assert!(!lock.exists(), "released at stop");
    let (_, rows) = read_csv(&out.join("locked.csv"));
    assert_eq!(rows.len(), 1);
    drop(second);
    let _ = std::fs::remove_dir_all(&out);
}

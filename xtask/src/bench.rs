//! `cargo xtask bench`: benchmarks side by side with the Python original.
//!
//! Two suites, each with its Rust example and Python script, run alternately in one
//! invocation (so both sides see the same machine load) with the same intra-op thread count:
//!
//! * the Trainer suite (the default; `bench/trainer.rs`): our Trainer, upstream's Python
//!   Trainer and a bare tch loop on the same training jobs (tiny GPT-2, GPT-2 6 x 384,
//!   MiniLM classification, a tiny Qwen2, a LoRA adapter on SmolLM2-135M against peft; fp32
//!   and bf16 autocast): tokens/s, median step time, peak RSS,
//!   the ratios, and the achieved matmul FLOP/s against the machine's measured matmul peak;
//!   `examples/src/bin/bench_trainer.rs` and `scripts/bench/bench_trainer.py`.
//! * `--activation-memory`: activation checkpointing's memory and step time on SmolLM2-135M
//!   (block 512), with and without, each side in its own process
//!   (`examples/src/bin/bench_checkpointing.rs`, `scripts/bench/bench_checkpointing.py`).
//! * `--micro`: `examples/src/bin/bench_micro.rs` and `scripts/bench/bench_micro.py`
//!   (optimizer steps and collators). Both print one flat JSON object per measurement; the
//!   table shows, per benchmark, the median over rounds of each side's median time, the ratio
//!   python / tchtrain (> 1: tchtrain is faster), the same ratio for the fastest step or pass
//!   seen (less sensitive to other load on a shared machine) and tokens/s for the collators.
//! * `--generate`: greedy decoding with the key / value cache on SmolLM2-135M, batch 1 and
//!   8, 128 new tokens (`examples/src/bin/bench_generate.rs`, `scripts/bench/bench_generate.py`),
//!   in the same table: pass times, the ratio, new tokens/s; both sides must generate the same
//!   tokens (the sum of the generated ids is compared).
//! * `--datasets [--datasets-mb N]` (`bench/datasets.rs`): a Parquet text column of N MB of
//!   text (default 1024) streamed and tokenised one row group at a time, against `datasets`'
//!   `load_dataset("parquet")` + `map(batched=True)`: seconds, tokens/s and peak RSS
//!   (`examples/src/bin/bench_datasets.rs`, `scripts/bench/bench_datasets.py`).

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Instant;

use crate::cmd;
use crate::json::Json;
use crate::paths;
use crate::setup;

mod checkpointing;
mod datasets;
mod trainer;

/// Command-line options of `bench`.
#[derive(Debug, PartialEq, Eq)]
pub struct Options {
    /// The micro-benchmarks instead of the Trainer suite.
    micro: bool,
    /// Greedy decoding (`generate`) instead of the Trainer suite.
    generate: bool,
    /// Activation checkpointing's memory and time instead of the Trainer suite.
    activation_memory: bool,
    /// A large Parquet text column tokenised, against `datasets.map`: the MB of text.
    datasets_mb: Option<usize>,
    /// Rounds of (Rust run, Python run); `None`: 3 for `--micro`, 2 for the Trainer suite.
    repeat: Option<usize>,
    /// Intra-op threads on both sides; `None`: the core count (libtorch's default).
    threads: Option<usize>,
    /// Trainer suite: the jobs to run (default: all).
    jobs: Vec<String>,
    /// Trainer suite: the precisions to run (default: fp32 and bf16).
    precisions: Vec<String>,
    /// Trainer suite: processes per side (DDP over Gloo when more than one; NCCL on GPUs).
    ranks: usize,
    /// Trainer suite: `cpu` (the default), `cuda` (each rank on the GPU of its
    /// `LOCAL_RANK`) or `cuda:N`, on both sides.
    device: String,
    /// Trainer suite: both sides under DeepSpeed ZeRO at this stage (DeepSpeed's own engine
    /// on the Python side).
    zero_stage: Option<usize>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            micro: false,
            generate: false,
            activation_memory: false,
            datasets_mb: None,
            repeat: None,
            threads: None,
            jobs: trainer::JOBS.map(String::from).into(),
            precisions: trainer::PRECISIONS.map(String::from).into(),
            ranks: 1,
            device: "cpu".into(),
            zero_stage: None,
        }
    }
}

/// `--device`'s value: `cpu`, `cuda` or `cuda:N`.
fn device(option: &str, value: Option<&String>) -> Result<String, String> {
    let value = value.ok_or_else(|| format!("{option} needs a value"))?;
    let ok = value == "cpu"
        || value == "cuda"
        || value
            .strip_prefix("cuda:")
            .is_some_and(|n| n.parse::<usize>().is_ok());
    if ok {
        Ok(value.clone())
    } else {
        Err(format!("{option}: cpu, cuda or cuda:N, got `{value}`"))
    }
}

/// A comma-separated list of names out of `known`.
fn names(option: &str, value: Option<&String>, known: &[&str]) -> Result<Vec<String>, String> {
    let value = value.ok_or_else(|| format!("{option} needs a comma-separated list"))?;
    value
        .split(',')
        .map(|name| {
            if known.contains(&name) {
                Ok(name.to_string())
            } else {
                Err(format!(
                    "{option}: unknown `{name}` (known: {})",
                    known.join(", ")
                ))
            }
        })
        .collect()
}

fn positive(option: &str, value: Option<&String>) -> Result<usize, String> {
    let value = value.ok_or_else(|| format!("{option} needs a number"))?;
    match value.parse() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "{option}: expected a positive number, got `{value}`"
        )),
    }
}

impl Options {
    /// Parses `bench`'s arguments.
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let mut o = Options::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--micro" => o.micro = true,
                "--generate" => o.generate = true,
                "--activation-memory" => o.activation_memory = true,
                "--datasets" => o.datasets_mb = Some(o.datasets_mb.unwrap_or(1024)),
                "--datasets-mb" => o.datasets_mb = Some(positive(a, it.next())?),
                "--repeat" => o.repeat = Some(positive(a, it.next())?),
                "--threads" => o.threads = Some(positive(a, it.next())?),
                "--jobs" => o.jobs = names(a, it.next(), &trainer::JOBS)?,
                "--precisions" => o.precisions = names(a, it.next(), &trainer::PRECISIONS)?,
                "--ranks" => o.ranks = positive(a, it.next())?,
                "--device" => o.device = device(a, it.next())?,
                "--zero-stage" => {
                    let stage = positive(a, it.next())?;
                    if stage > 3 {
                        return Err(format!("{a}: 1, 2 or 3, got {stage}"));
                    }
                    o.zero_stage = Some(stage);
                }
                other => {
                    return Err(format!(
                        "bench: unknown option `{other}` (known: --micro, --generate, --activation-memory, --datasets, --datasets-mb N, --repeat N, \
                         --threads N, --jobs {}, --precisions fp32,bf16, --ranks N, --device cpu|cuda|cuda:N, --zero-stage N)",
                        trainer::JOBS.join(",")
                    ));
                }
            }
        }
        Ok(o)
    }
}

/// The last flat JSON line of a benchmark process's output (the process run and its command
/// echoed), for the modes that run each side once per setting.
struct JsonLine {
    what: String,
    fields: BTreeMap<String, Json>,
}

impl JsonLine {
    /// Runs `c` (`what` names it in messages) and reads its last JSON line.
    fn run(c: &mut Command, what: &str) -> Result<Self, String> {
        println!("bench: {what}: {}", cmd::display(c));
        let out = cmd::output(c, what)?;
        let fields = out
            .lines()
            .rev()
            .find_map(Json::object_line)
            .ok_or_else(|| format!("{what}: no JSON line in its output:\n{out}"))?;
        Ok(Self {
            what: what.to_string(),
            fields,
        })
    }

    /// The number `key`.
    fn num(&self, key: &str) -> Result<f64, String> {
        match self.fields.get(key) {
            Some(Json::Num(x)) => Ok(*x),
            _ => Err(format!("{}: no number `{key}` in its line", self.what)),
        }
    }
}

/// One measurement line of a benchmark binary.
#[derive(Debug, Clone, PartialEq)]
struct Measurement {
    bench: String,
    implementation: String,
    median_ms: f64,
    /// The fastest step / pass: less sensitive to other load on the machine.
    min_ms: Option<f64>,
    tokens_per_s: Option<f64>,
    threads: Option<f64>,
    /// `tokens` and `padded_len_sum`: both sides must have seen the same data.
    data_check: Option<(f64, f64)>,
    /// The optimizer's state after the steps, in bytes (optimizer rows).
    state_bytes: Option<f64>,
}

impl Measurement {
    fn from_line(line: &str) -> Option<Self> {
        let m = Json::object_line(line)?;
        let text = |k: &str| m.get(k).and_then(Json::as_str).map(str::to_string);
        let num = |k: &str| match m.get(k) {
            Some(Json::Num(x)) => Some(*x),
            _ => None,
        };
        Some(Self {
            bench: text("bench")?,
            implementation: text("impl")?,
            median_ms: num("median_ms")?,
            min_ms: num("min_ms"),
            tokens_per_s: num("tokens_per_s"),
            threads: num("threads"),
            data_check: num("tokens").zip(num("padded_len_sum")),
            state_bytes: num("state_bytes"),
        })
    }
}

/// Runs a benchmark binary and returns its measurement lines (other lines are echoed).
fn measure(c: &mut Command, what: &str) -> Result<Vec<Measurement>, String> {
    let t0 = Instant::now();
    let stdout = cmd::output(c, what)?;
    let mut found = Vec::new();
    for line in stdout.lines() {
        match Measurement::from_line(line) {
            Some(m) => found.push(m),
            None if line.trim().is_empty() => {}
            None => println!("  {line}"),
        }
    }
    println!(
        "bench: {what}: {} measurements in {:.1}s",
        found.len(),
        t0.elapsed().as_secs_f64()
    );
    Ok(found)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Per benchmark and implementation: every round's measurement.
type Rounds = BTreeMap<String, BTreeMap<String, Vec<Measurement>>>;

/// The markdown table: one row per benchmark, in first-seen order.
fn table(order: &[String], rounds: &Rounds) -> String {
    let mut out = String::from(
        "| bench | tchtrain ms | python ms | ratio (python/tchtrain) | ratio of fastest | tchtrain tokens/s | python tokens/s | tchtrain state MiB | python state MiB |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for bench in order {
        let side = |implementation: &str| rounds.get(bench).and_then(|m| m.get(implementation));
        let ms = |implementation: &str| {
            side(implementation).map(|v| median(v.iter().map(|m| m.median_ms).collect()))
        };
        let tps = |implementation: &str| {
            side(implementation).and_then(|v| {
                let t: Vec<f64> = v.iter().filter_map(|m| m.tokens_per_s).collect();
                (!t.is_empty()).then(|| median(t))
            })
        };
        let fastest = |implementation: &str| {
            side(implementation)
                .and_then(|v| v.iter().filter_map(|m| m.min_ms).min_by(f64::total_cmp))
        };
        let state = |implementation: &str| {
            side(implementation)
                .and_then(|v| v.iter().filter_map(|m| m.state_bytes).next())
                .map_or(String::new(), |b| format!("{:.1}", b / (1024.0 * 1024.0)))
        };
        let (rs, py) = (ms("tchtrain"), ms("python"));
        let fmt_ms = |x: Option<f64>| x.map_or("—".into(), |x| format!("{x:.3}"));
        let fmt_tps = |x: Option<f64>| x.map_or("".into(), |x| format!("{:.0}", x));
        let ratio = |rs: Option<f64>, py: Option<f64>| match (rs, py) {
            (Some(r), Some(p)) if r > 0.0 => format!("{:.2}", p / r),
            _ => "—".into(),
        };
        out.push_str(&format!(
            "| {bench} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            fmt_ms(rs),
            fmt_ms(py),
            ratio(rs, py),
            ratio(fastest("tchtrain"), fastest("python")),
            fmt_tps(tps("tchtrain")),
            fmt_tps(tps("python")),
            state("tchtrain"),
            state("python"),
        ));
    }
    out
}

/// Warnings for runs that did not measure the same thing on both sides.
fn consistency_warnings(rounds: &Rounds) -> Vec<String> {
    let mut warnings = Vec::new();
    for (bench, sides) in rounds {
        let threads: Vec<f64> = sides.values().flatten().filter_map(|m| m.threads).collect();
        if threads.windows(2).any(|w| w[0] != w[1]) {
            warnings.push(format!("{bench}: thread counts differ ({threads:?})"));
        }
        let checks: Vec<(f64, f64)> = sides
            .values()
            .flatten()
            .filter_map(|m| m.data_check)
            .collect();
        if checks.windows(2).any(|w| w[0] != w[1]) {
            warnings.push(format!(
                "{bench}: (tokens, padded length sum) differ between runs: {checks:?}"
            ));
        }
        for side in ["tchtrain", "python"] {
            if !sides.contains_key(side) {
                warnings.push(format!("{bench}: no {side} measurement"));
            }
        }
    }
    warnings
}

/// `/proc/loadavg`'s 1-, 5- and 15-minute load averages: other work on the machine skews
/// the timings.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

/// Total cores and the CPU model, for the report.
fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cores} cores available, {model}")
}

/// Runs setup, builds the suite's Rust example and runs both sides `repeat` times.
pub fn run(args: &[String]) -> Result<(), String> {
    let o = Options::parse(args)?;
    let t0 = Instant::now();
    let s = setup::run(&setup::Options::default())?;
    let root = paths::workspace_root();
    let example = if o.micro {
        "bench_micro"
    } else if o.generate {
        "bench_generate"
    } else if o.activation_memory {
        "bench_checkpointing"
    } else if o.datasets_mb.is_some() {
        "bench_datasets"
    } else {
        "bench_trainer"
    };

    if o.device != "cpu" && example != "bench_trainer" {
        return Err(format!(
            "bench --device {}: only the Trainer suite runs on a GPU (drop --micro / --generate / --activation-memory / --datasets)",
            o.device
        ));
    }
    // On a GPU the example is built with the `cuda` feature (NCCL, the CUDA allocator's
    // statistics), as `xtask test --gpu` builds the tests.
    let features: &[&str] = if o.device == "cpu" {
        &[]
    } else {
        &["tchtrain/cuda"]
    };
    let exe = crate::build_examples::build_examples_with(&s, true, &[example], "bench", features)?
        .join(example);
    let target = paths::target_dir();
    let script = root
        .join("scripts")
        .join("bench")
        .join(format!("{example}.py"));

    // libtorch's default intra-op thread count is the core count on both sides; pass it
    // explicitly so both surely use the same.
    let threads = o
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
        .to_string();
    let machine = machine();
    println!("bench: {machine}; {threads} intra-op threads on both sides");
    let load_before = load_average();

    if let Some(mb) = o.datasets_mb {
        let work = target.join("bench-datasets");
        datasets::run(&exe, &s.python, &script, &s.assets, &work, &threads, mb)?;
        println!(
            "xtask bench finished in {:.1}s (setup and build included)",
            t0.elapsed().as_secs_f64()
        );
        return Ok(());
    }

    if o.activation_memory {
        checkpointing::run(&exe, &s.python, &script, &s.assets, &threads)?;
        println!(
            "xtask bench finished in {:.1}s (setup and build included; load average {load_before} before, {} after)",
            t0.elapsed().as_secs_f64(),
            load_average()
        );
        return Ok(());
    }

    if !o.micro && !o.generate {
        let plan = trainer::Plan {
            exe: &exe,
            python: &s.python,
            script: &script,
            data: &target.join("bench-trainer"),
            assets: &s.assets,
            root: &root,
            threads: &threads,
            repeat: o.repeat.unwrap_or(2),
            jobs: &o.jobs,
            precisions: &o.precisions,
            ranks: o.ranks,
            device: &o.device,
            zero_stage: o.zero_stage,
        };
        let results = trainer::run(&plan)?;
        trainer::print_report(&plan, &results, &load_before);
        let warnings = trainer::warnings(&results);
        for w in &warnings {
            println!("note: {w}");
        }
        println!(
            "xtask bench finished in {:.1}s (setup and build included)",
            t0.elapsed().as_secs_f64()
        );
        return Ok(());
    }

    let repeat = o.repeat.unwrap_or(if o.generate { 2 } else { 3 });
    let mut order: Vec<String> = Vec::new();
    let mut rounds = Rounds::new();
    for round in 1..=repeat {
        let mut rust = Command::new(&exe);
        rust.current_dir(&root)
            .args(["--threads", &threads])
            .env("TCHTRAIN_ASSETS", &s.assets);
        let mut python = Command::new(&s.python);
        python
            .current_dir(&root)
            .arg(&script)
            .args(["--threads", &threads])
            .env("TCHTRAIN_ASSETS", &s.assets);
        let rust = measure(&mut rust, &format!("round {round}/{repeat} tchtrain"))?;
        let python = measure(&mut python, &format!("round {round}/{repeat} python"))?;
        for m in rust.into_iter().chain(python) {
            if !order.contains(&m.bench) {
                order.push(m.bench.clone());
            }
            rounds
                .entry(m.bench.clone())
                .or_default()
                .entry(m.implementation.clone())
                .or_default()
                .push(m);
        }
    }

    println!();
    println!(
        "{}, CPU fp32, {threads} threads, median of {} rounds ({machine}; \
         load average {load_before} before, {} after):",
        if o.generate {
            "greedy generate (128 new tokens, key / value cache, SmolLM2-135M)"
        } else {
            "micro-benchmarks"
        },
        repeat,
        load_average()
    );
    println!();
    print!("{}", table(&order, &rounds));
    let warnings = consistency_warnings(&rounds);
    for w in &warnings {
        println!("warning: {w}");
    }
    println!(
        "xtask bench finished in {:.1}s (setup and build included)",
        t0.elapsed().as_secs_f64()
    );
    if warnings.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} consistency warning(s): the two sides did not measure the same thing",
            warnings.len()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_flat_json_lines_from_both_sides() {
        // serde_json (compact) and Python's json.dumps (spaces) spell the same object differently
        let rust = r#"{"bench":"collate/with_padding","impl":"tchtrain","median_ms":0.5,"tokens_per_s":1.5e6,"tokens":47269,"padded_len_sum":2318,"threads":2}"#;
        let python = r#"{"bench": "collate/with_padding", "impl": "python", "median_ms": 2.25, "tokens_per_s": 183584.07, "tokens": 47269, "padded_len_sum": 2318, "threads": 2}"#;
        let r = Measurement::from_line(rust).unwrap();
        let p = Measurement::from_line(python).unwrap();
        assert_eq!(r.bench, p.bench);
        assert_eq!(
            (r.implementation.as_str(), p.implementation.as_str()),
            ("tchtrain", "python")
        );
        assert_eq!(r.tokens_per_s, Some(1.5e6));
        assert_eq!(p.median_ms, 2.25);
        assert_eq!(r.data_check, p.data_check);
        assert_eq!(r.threads, Some(2.0));
    }

    #[test]
    fn a_line_without_the_measurement_keys_is_not_a_measurement() {
        assert!(Measurement::from_line(r#"{"bench": "x"}"#).is_none());
        assert!(Measurement::from_line("warning: something").is_none());
    }

    #[test]
    fn table_has_ratio_python_over_tchtrain() {
        let m = |implementation: &str, ms: f64| Measurement {
            bench: "optim/sgd".into(),
            implementation: implementation.into(),
            median_ms: ms,
            min_ms: Some(ms / 2.0),
            tokens_per_s: None,
            threads: Some(2.0),
            data_check: None,
            state_bytes: None,
        };
        let mut rounds = Rounds::new();
        let sides = rounds.entry("optim/sgd".into()).or_default();
        sides.insert(
            "tchtrain".into(),
            vec![
                m("tchtrain", 10.0),
                m("tchtrain", 30.0),
                m("tchtrain", 20.0),
            ],
        );
        sides.insert("python".into(), vec![m("python", 40.0)]);
        let t = table(&["optim/sgd".into()], &rounds);
        assert!(
            t.contains("| optim/sgd | 20.000 | 40.000 | 2.00 | 4.00 |  |  |  |  |"),
            "{t}"
        );
        assert!(consistency_warnings(&rounds).is_empty());
    }

    #[test]
    fn options() {
        assert_eq!(Options::parse(&[]).unwrap(), Options::default());
        let args: Vec<String> = ["--micro", "--repeat", "5", "--threads", "1"]
            .map(String::from)
            .into();
        let o = Options::parse(&args).unwrap();
        assert_eq!((o.micro, o.repeat, o.threads), (true, Some(5), Some(1)));
        let args: Vec<String> = ["--jobs", "gpt2_tiny,minilm_cls", "--precisions", "bf16"]
            .map(String::from)
            .into();
        let o = Options::parse(&args).unwrap();
        assert!(!o.micro);
        assert_eq!(o.jobs, ["gpt2_tiny", "minilm_cls"]);
        assert_eq!(o.precisions, ["bf16"]);
        assert!(Options::parse(&["--jobs".into(), "gpt3".into()]).is_err());
        assert!(Options::parse(&["--threads".into()]).is_err());
        let o = Options::parse(&["--generate".into()]).unwrap();
        assert!(o.generate && !o.micro);
        assert!(Options::parse(&["--repeat".into(), "0".into()]).is_err());
        assert!(Options::parse(&["--fast".into()]).is_err());
        for (value, ok) in [
            ("cpu", true),
            ("cuda", true),
            ("cuda:1", true),
            ("gpu", false),
            ("cuda:x", false),
        ] {
            let parsed = Options::parse(&["--device".into(), value.into()]);
            assert_eq!(parsed.is_ok(), ok, "--device {value}");
            if ok {
                assert_eq!(parsed.unwrap().device, value);
            }
        }
        assert!(Options::parse(&["--device".into()]).is_err());
        let o = Options::parse(&["--zero-stage".into(), "2".into()]).unwrap();
        assert_eq!(o.zero_stage, Some(2));
        assert!(Options::parse(&["--zero-stage".into(), "4".into()]).is_err());
    }
}

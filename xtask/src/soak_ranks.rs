//! `cargo xtask soak --ranks N`: faults at scale. A data-parallel run of `run_clm` (tiny
//! GPT-2, a checkpoint at every step, `save_total_limit` 3) on N ranks under
//! `launch --max-restarts`, where seeded random ranks are SIGKILLed at seeded random moments
//! (inside a step and its collectives, inside a save, inside a rotation) and, with
//! `--hangs`, SIGSTOPped (a rank that stops answering: the others' collectives give up after
//! `ddp_timeout` and the group is restarted). The launcher restarts the group each time and
//! the script resumes from the newest complete checkpoint (`get_last_checkpoint`), until
//! the run ends. Then:
//!
//! * every fault restarted the group exactly once (a restart of its own, e.g. from a
//!   checkpoint that did not load, fails the soak);
//! * after each fault the newest `checkpoint-N` is complete: every file the uninterrupted
//!   run's checkpoints have is there and readable (JSON parses, the safetensors header
//!   matches the file's length, a torch pickle has its zip directory), its
//!   `trainer_state.json` says step N; the count of unloadable ones is printed;
//! * the steps a fault lost (those the killed group logged past the newest checkpoint) are
//!   counted and printed;
//! * every loss line a resumed group printed equals the uninterrupted run's line for that
//!   step, the final `trainer_state.json`'s log history equals its (the run's timings
//!   aside), and the final `model.safetensors` equals its byte for byte.
//!
//! ```text
//! cargo xtask soak --ranks 4 [--kills 50] [--hangs 2] [--seed S] [--strategy zero2|ddp|both]
//!                  [--steps N] [--script PATH]
//! ```
//!
//! `--strategy`: ZeRO-2 (a DeepSpeed JSON with `zero_optimization.stage` 2), DDP, or both
//! (the default). `--steps`: the run's `max_steps` (default: twice the faults, at least 12).
//! `--script`: a built `run_clm` (skips the build; the tests pass theirs).

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::json::Json;
use crate::launch::{self, Options, Output, Watch};
use crate::{build_examples, disk, setup, signal};

/// The runs' `ddp_timeout` (seconds): how long the survivors of a SIGSTOP wait.
const DDP_TIMEOUT_S: u64 = 10;
/// `save_total_limit` of the runs (rotation deletes a checkpoint at every save).
const SAVE_TOTAL_LIMIT: usize = 3;
/// The longest a group may go without saving a new checkpoint, or without being restarted
/// after a fault, before the soak gives up.
const STALL: Duration = Duration::from_secs(300);

/// The data-parallel strategies the soak runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strategy {
    Zero2,
    Ddp,
}

impl Strategy {
    fn name(self) -> &'static str {
        match self {
            Strategy::Zero2 => "zero2",
            Strategy::Ddp => "ddp",
        }
    }
}

/// The parsed command line.
#[derive(Debug, Clone)]
struct Soak {
    ranks: usize,
    kills: usize,
    hangs: usize,
    seed: u64,
    strategies: Vec<Strategy>,
    steps: Option<usize>,
    script: Option<PathBuf>,
}

impl Soak {
    fn parse(args: &[String]) -> Result<Self, String> {
        let mut s = Soak {
            ranks: 4,
            kills: 50,
            hangs: 0,
            seed: 0x5eed_0e1a,
            strategies: vec![Strategy::Zero2, Strategy::Ddp],
            steps: None,
            script: None,
        };
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let mut value = |flag: &str| -> Result<String, String> {
                it.next()
                    .cloned()
                    .ok_or_else(|| format!("soak: `{flag}` needs a value"))
            };
            let number = |flag: &str, v: String| -> Result<usize, String> {
                v.parse()
                    .map_err(|_| format!("soak: `{flag} {v}`: expected a whole number"))
            };
            match arg.as_str() {
                "--ranks" => s.ranks = number("--ranks", value("--ranks")?)?,
                "--kills" => s.kills = number("--kills", value("--kills")?)?,
                "--hangs" => s.hangs = number("--hangs", value("--hangs")?)?,
                "--steps" => s.steps = Some(number("--steps", value("--steps")?)?),
                "--seed" => s.seed = number("--seed", value("--seed")?)? as u64,
                "--script" => s.script = Some(PathBuf::from(value("--script")?)),
                "--strategy" => {
                    s.strategies = match value("--strategy")?.as_str() {
                        "zero2" => vec![Strategy::Zero2],
                        "ddp" => vec![Strategy::Ddp],
                        "both" => vec![Strategy::Zero2, Strategy::Ddp],
                        other => {
                            return Err(format!(
                                "soak: `--strategy {other}`: expected zero2, ddp or both"
                            ));
                        }
                    }
                }
                other => {
                    return Err(format!(
                        "soak: unknown option `{other}` with --ranks (options: --ranks N, --kills N, --hangs N, --seed S, --strategy zero2|ddp|both, --steps N, --script PATH)"
                    ));
                }
            }
        }
        if s.ranks < 2 {
            return Err(format!(
                "soak: `--ranks {}`: a data-parallel soak needs 2 ranks or more (one process: `cargo xtask soak` without --ranks)",
                s.ranks
            ));
        }
        if s.kills + s.hangs == 0 {
            return Err("soak: no faults to inject (`--kills 0` and no `--hangs`)".into());
        }
        Ok(s)
    }

    fn faults(&self) -> usize {
        self.kills + self.hangs
    }

    fn steps(&self) -> usize {
        self.steps.unwrap_or((2 * self.faults()).max(12))
    }
}

/// xorshift64*: seeded choices without a dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    }
}

/// The launcher's output of one run: everything into `log`, rank 0's loss lines per group
/// (the restart count when each line was printed), and the launcher's own notes echoed.
struct Lines {
    watch: Arc<Watch>,
    log: fs::File,
    partial: Vec<u8>,
    losses: Arc<Mutex<BTreeMap<usize, Vec<String>>>>,
    echo_notes: bool,
}

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.log.write_all(buf)?;
        self.partial.extend_from_slice(buf);
        while let Some(end) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line).trim_end().to_string();
            if let Some(rest) = line.strip_prefix("[rank 0] ")
                && rest.starts_with('{')
                && rest.contains("'loss'")
                && !rest.contains("train_runtime")
            {
                let mut losses = self.losses.lock().unwrap_or_else(|e| e.into_inner());
                losses
                    .entry(self.watch.restarts())
                    .or_default()
                    .push(rest.to_string());
            } else if self.echo_notes && line.starts_with("launch: ") {
                println!("soak: {line}");
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.log.flush()
    }
}

/// `run_clm`'s arguments for one run of the soak.
fn script_args(assets: &Path, out: &Path, ds: Option<&Path>, steps: usize) -> Vec<String> {
    let asset = |p: &str| assets.join(p).display().to_string();
    let mut a: Vec<String> = [
        "--model_name_or_path",
        &asset("tiny-gpt2"),
        "--tokenizer_name",
        &asset("gpt2-tokenizer"),
        "--train_file",
        &asset("text/hamlet.txt"),
        "--block_size",
        "32",
        "--per_device_train_batch_size",
        "2",
        "--learning_rate",
        "1e-3",
        "--seed",
        "7",
        "--max_steps",
        &steps.to_string(),
        "--logging_steps",
        "1",
        "--save_strategy",
        "steps",
        "--save_steps",
        "1",
        "--save_total_limit",
        &SAVE_TOTAL_LIMIT.to_string(),
        "--ddp_timeout",
        &DDP_TIMEOUT_S.to_string(),
        "--do_train",
        "--use_cpu",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
        "--output_dir",
        &out.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some(ds) = ds {
        a.push("--deepspeed".into());
        a.push(ds.display().to_string());
    }
    a
}

/// Starts `launch --max-restarts` for one run in a thread; returns its join handle.
fn start(
    options: Options,
    watch: Arc<Watch>,
    log: &Path,
    echo_notes: bool,
) -> Result<
    (
        std::thread::JoinHandle<Result<(), String>>,
        Arc<Mutex<BTreeMap<usize, Vec<String>>>>,
    ),
    String,
> {
    let file = fs::File::create(log).map_err(|e| format!("soak: {}: {e}", log.display()))?;
    let losses = Arc::new(Mutex::new(BTreeMap::new()));
    let sink = Arc::new(Mutex::new(Lines {
        watch: watch.clone(),
        log: file,
        partial: Vec::new(),
        losses: losses.clone(),
        echo_notes,
    }));
    let out = Output {
        stdout: sink.clone(),
        stderr: sink,
    };
    let handle = std::thread::spawn(move || launch::launch_watched(&options, &out, &watch));
    Ok((handle, losses))
}

/// `checkpoint-N` folders of `dir` (complete ones: the Trainer writes `tmp-checkpoint-N`
/// and renames it), by step.
fn checkpoints(dir: &Path) -> Vec<(usize, PathBuf)> {
    let mut found: Vec<(usize, PathBuf)> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let step = name.strip_prefix("checkpoint-")?.parse().ok()?;
            Some((step, e.path()))
        })
        .collect();
    found.sort();
    found
}

fn newest(dir: &Path) -> usize {
    checkpoints(dir).last().map_or(0, |(s, _)| *s)
}

/// Where a fault landed, seen from the output folder just before it.
fn moment(dir: &Path) -> &'static str {
    let names: Vec<String> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    if names.iter().any(|n| n.starts_with("tmp-checkpoint-")) {
        "save"
    } else if checkpoints(dir).len() > SAVE_TOTAL_LIMIT {
        "rotation"
    } else {
        "step"
    }
}

/// The files of a checkpoint, relative, with its step number written `{N}`.
fn layout(ckpt: &Path, step: usize) -> Result<Vec<String>, String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
        for e in fs::read_dir(dir)? {
            let p = e?.path();
            if p.is_dir() {
                walk(root, &p, out)?;
            } else {
                out.push(p.strip_prefix(root).unwrap_or(&p).to_path_buf());
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    walk(ckpt, ckpt, &mut files).map_err(|e| format!("soak: {}: {e}", ckpt.display()))?;
    let n = step.to_string();
    let mut names: Vec<String> = files
        .iter()
        .map(|p| p.display().to_string().replace(&n, "{N}"))
        .collect();
    names.sort();
    Ok(names)
}

/// Why the checkpoint at `ckpt` (step `step`) would not load, if it would not: a file of
/// `expected` missing, or one that does not read as its kind.
fn unloadable(ckpt: &Path, step: usize, expected: &[String]) -> Option<String> {
    let n = step.to_string();
    for rel in expected {
        let path = ckpt.join(rel.replace("{N}", &n));
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) => return Some(format!("{}: {e}", path.display())),
        };
        let bad = if rel.ends_with(".json") {
            match std::str::from_utf8(&bytes)
                .map_err(|e| e.to_string())
                .and_then(Json::parse)
            {
                Ok(j) if rel == "trainer_state.json" => {
                    let at = j.get("global_step").and_then(Json::as_f64);
                    (at != Some(step as f64)).then(|| format!("global_step {at:?}, not {step}"))
                }
                Ok(_) => None,
                Err(e) => Some(e),
            }
        } else if rel.ends_with(".safetensors") {
            safetensors_problem(&bytes)
        } else if rel.ends_with(".pt") || rel.ends_with(".pth") || rel.ends_with(".bin") {
            // A torch pickle is a zip: its end-of-central-directory record closes it.
            let tail = &bytes[bytes.len().saturating_sub(65_557)..];
            (!tail.windows(4).any(|w| w == b"PK\x05\x06")).then(|| "no zip directory".into())
        } else {
            None
        };
        if let Some(why) = bad {
            return Some(format!("{}: {why}", path.display()));
        }
    }
    None
}

/// What is wrong with a safetensors file, if anything: its header must parse and its
/// tensors must end where the file ends.
fn safetensors_problem(bytes: &[u8]) -> Option<String> {
    let len = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?) as usize;
    let Some(header) = bytes.get(8..8 + len) else {
        return Some("truncated header".into());
    };
    let header = match std::str::from_utf8(header)
        .map_err(|e| e.to_string())
        .and_then(Json::parse)
    {
        Ok(Json::Obj(m)) => m,
        Ok(_) => return Some("header is not an object".into()),
        Err(e) => return Some(e),
    };
    let end = header
        .values()
        .filter_map(|t| t.get("data_offsets")?.as_array()?.get(1)?.as_f64())
        .fold(0.0f64, f64::max) as usize;
    (8 + len + end != bytes.len())
        .then(|| format!("{} bytes, the header says {}", bytes.len(), 8 + len + end))
}

/// The log history of `trainer_state.json` in `dir`, the run's timings taken out, and its
/// `train_loss`: upstream's is the mean loss of the steps this process trained
/// (`_total_loss_scalar / (global_step - _initial_global_step)`), so a resumed run's
/// differs by design.
fn history(dir: &Path) -> Result<Vec<Json>, String> {
    let path = dir.join("trainer_state.json");
    let text = fs::read_to_string(&path).map_err(|e| format!("soak: {}: {e}", path.display()))?;
    let state = Json::parse(&text).map_err(|e| format!("soak: {}: {e}", path.display()))?;
    let entries = state
        .get("log_history")
        .and_then(Json::as_array)
        .ok_or_else(|| format!("soak: {} has no log_history", path.display()))?;
    Ok(entries
        .iter()
        .map(|e| match e {
            Json::Obj(m) => Json::Obj(
                m.iter()
                    .filter(|(k, _)| {
                        !matches!(
                            k.as_str(),
                            "train_runtime"
                                | "train_samples_per_second"
                                | "train_steps_per_second"
                                | "train_loss"
                        )
                    })
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            ),
            other => other.clone(),
        })
        .collect())
}

/// Launches one run to its end without faults (the reference): its loss lines, its first
/// checkpoint's layout and the mean time of a step (with its save).
fn reference(
    options: &Options,
    dir: &Path,
) -> Result<(Vec<String>, Vec<String>, Duration), String> {
    let watch = Arc::new(Watch::default());
    let (handle, losses) = start(options.clone(), watch, &dir.join("reference.log"), false)?;
    handle
        .join()
        .map_err(|_| "soak: the reference launch panicked".to_string())?
        .map_err(|e| {
            format!(
                "soak: the uninterrupted run failed: {e} (its output: {})",
                dir.join("reference.log").display()
            )
        })?;
    let out = dir.join("reference");
    let lines = losses
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&0)
        .unwrap_or_default();
    let (step, ckpt) = checkpoints(&out).pop().ok_or_else(|| {
        format!(
            "soak: the uninterrupted run left no checkpoint in {}",
            out.display()
        )
    })?;
    let files = layout(&ckpt, step)?;
    let results = fs::read_to_string(out.join("train_results.json"))
        .map_err(|e| format!("soak: {}: {e}", out.display()))?;
    let runtime = Json::parse(&results)?
        .get("train_runtime")
        .and_then(Json::as_f64)
        .unwrap_or(1.0);
    let per_step = Duration::from_secs_f64(runtime / lines.len().max(1) as f64);
    Ok((lines, files, per_step))
}

/// A fault: SIGKILL or SIGSTOP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Kill,
    Hang,
}

/// What the soak of one strategy found.
#[derive(Debug, Default)]
struct Tally {
    moments: BTreeMap<&'static str, usize>,
    hang_detect: Vec<f64>,
    unloadable: Vec<String>,
    lost: Vec<usize>,
}

/// Waits until `cond` holds or the launch ended or `STALL` passed; `what` names the wait.
fn wait_for(
    handle: &std::thread::JoinHandle<Result<(), String>>,
    what: &str,
    mut cond: impl FnMut() -> bool,
) -> Result<(), String> {
    let start = Instant::now();
    loop {
        if cond() {
            return Ok(());
        }
        if handle.is_finished() {
            return Err(format!("the launch ended while waiting for {what}"));
        }
        if start.elapsed() > STALL {
            return Err(format!("waited {STALL:?} for {what}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The soak of one strategy; the summary line.
fn soak_one(
    soak: &Soak,
    strategy: Strategy,
    script: &Path,
    assets: &Path,
    root: &Path,
) -> Result<String, String> {
    let t0 = Instant::now();
    let dir = root.join(strategy.name());
    fs::create_dir_all(&dir).map_err(|e| format!("soak: {}: {e}", dir.display()))?;
    let ds = match strategy {
        Strategy::Zero2 => {
            let p = dir.join("ds_zero2.json");
            fs::write(
                &p,
                "{\"zero_optimization\": {\"stage\": 2}, \"train_micro_batch_size_per_gpu\": \"auto\", \"gradient_accumulation_steps\": \"auto\", \"train_batch_size\": \"auto\"}\n",
            )
            .map_err(|e| format!("soak: {}: {e}", p.display()))?;
            Some(p)
        }
        Strategy::Ddp => None,
    };
    let steps = soak.steps();
    let options = |out: &Path, max_restarts: usize| Options {
        nproc_per_node: soak.ranks,
        nnodes: 1,
        node_rank: 0,
        master_addr: launch::DEFAULT_MASTER_ADDR.into(),
        master_port: 0,
        term_timeout: launch::DEFAULT_TERM_TIMEOUT,
        max_restarts,
        monitor_interval: launch::DEFAULT_MONITOR_INTERVAL,
        command: std::iter::once(script.display().to_string())
            .chain(script_args(assets, out, ds.as_deref(), steps))
            .collect(),
    };
    println!(
        "soak: {}: the uninterrupted run on {} ranks, {steps} steps",
        strategy.name(),
        soak.ranks
    );
    let (ref_lines, files, per_step) = reference(&options(&dir.join("reference"), 0), &dir)?;
    if ref_lines.len() != steps {
        return Err(format!(
            "soak: the uninterrupted run logged {} losses for {steps} steps (see {})",
            ref_lines.len(),
            dir.join("reference.log").display()
        ));
    }
    let ref_time = t0.elapsed();

    // The faults: which are hangs, spread over the run.
    let faults = soak.faults();
    let mut rng = Rng(soak.seed.max(1) ^ (strategy as u64 + 1).wrapping_mul(0x9e37_79b9));
    let mut kinds = vec![Fault::Kill; faults];
    for h in 0..soak.hangs {
        kinds[(h * faults) / soak.hangs + faults / (2 * soak.hangs)] = Fault::Hang;
    }
    println!(
        "soak: {}: the same run with {} SIGKILLs and {} SIGSTOPs (seed {:#x}, launch --max-restarts {})",
        strategy.name(),
        soak.kills,
        soak.hangs,
        soak.seed,
        faults + 2
    );
    let out = dir.join("faults");
    let watch = Arc::new(Watch::default());
    let (handle, losses) = start(
        options(&out, faults + 2),
        watch.clone(),
        &dir.join("faults.log"),
        true,
    )?;
    let mut tally = Tally::default();
    let mut resumed_from: BTreeMap<usize, usize> = BTreeMap::new();
    let fail = |e: String| {
        format!(
            "soak: {}: {e} (output in {})",
            strategy.name(),
            dir.join("faults.log").display()
        )
    };
    for (k, kind) in kinds.iter().enumerate() {
        wait_for(&handle, &format!("group {k} to start"), || {
            watch.restarts() == k && !watch.pids().is_empty()
        })
        .map_err(fail)?;
        let from = *resumed_from.entry(k).or_insert_with(|| newest(&out));
        wait_for(
            &handle,
            &format!("group {k} to save a checkpoint past {from}"),
            || newest(&out) > from,
        )
        .map_err(fail)?;
        std::thread::sleep(Duration::from_millis(
            rng.below(per_step.as_millis() as u64 + 1),
        ));
        let pids = watch.pids();
        if pids.is_empty() || watch.restarts() != k {
            return Err(fail(format!("group {k} ended before its fault")));
        }
        let rank = rng.below(pids.len() as u64) as usize;
        *tally.moments.entry(moment(&out)).or_default() += 1;
        let at = Instant::now();
        let sig = if *kind == Fault::Hang {
            signal::SIGSTOP
        } else {
            signal::SIGKILL
        };
        signal::kill_group(pids[rank], sig);
        wait_for(
            &handle,
            &format!("the restart after fault {k} (rank {rank})"),
            || watch.restarts() == k + 1,
        )
        .map_err(fail)?;
        if *kind == Fault::Hang {
            let detected = watch
                .failed_at()
                .map_or(f64::NAN, |t| t.saturating_duration_since(at).as_secs_f64());
            tally.hang_detect.push(detected);
        }
        let (step, ckpt) = checkpoints(&out)
            .pop()
            .ok_or_else(|| fail("no checkpoint left".into()))?;
        // The next group resumes from it (it takes seconds to start, so it has not saved yet).
        resumed_from.insert(k + 1, step);
        if let Some(why) = unloadable(&ckpt, step, &files) {
            tally.unloadable.push(format!("checkpoint-{step}: {why}"));
        }
        let logged = losses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&k)
            .map_or(0, Vec::len);
        tally.lost.push((from + logged).saturating_sub(step));
    }
    handle
        .join()
        .map_err(|_| fail("the launch panicked".into()))?
        .map_err(fail)?;

    // Equal to the uninterrupted run.
    let mut problems = Vec::new();
    if watch.restarts() != faults {
        problems.push(format!(
            "{} restarts for {faults} faults: a group failed on its own (see the log)",
            watch.restarts()
        ));
    }
    let losses = losses.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut compared = 0usize;
    for (group, lines) in &losses {
        let from = *resumed_from.get(group).unwrap_or(&0);
        for (i, line) in lines.iter().enumerate() {
            compared += 1;
            match ref_lines.get(from + i) {
                Some(want) if want == line => {}
                want => problems.push(format!(
                    "group {group} logged at step {}: {line}; the uninterrupted run: {want:?}",
                    from + i + 1
                )),
            }
        }
    }
    if history(&out)? != history(&dir.join("reference"))? {
        problems.push(
            "the final trainer_state.json's log_history differs from the uninterrupted run's"
                .into(),
        );
    }
    let weights = |d: &Path| {
        fs::read(d.join("model.safetensors")).map_err(|e| format!("soak: {}: {e}", d.display()))
    };
    let weights_equal = weights(&out)? == weights(&dir.join("reference"))?;
    if !weights_equal {
        problems.push("the final model.safetensors differs from the uninterrupted run's".into());
    }
    if !tally.unloadable.is_empty() {
        problems.push(format!("unloadable checkpoints: {:?}", tally.unloadable));
    }
    let slow: Vec<f64> = tally
        .hang_detect
        .iter()
        .copied()
        .filter(|t| !(*t <= DDP_TIMEOUT_S as f64 + 5.0))
        .collect();
    if !slow.is_empty() {
        problems.push(format!(
            "SIGSTOPped ranks noticed after {slow:?} s, past ddp_timeout {DDP_TIMEOUT_S} s (+5 s of libtorch's polling)"
        ));
    }
    let moments = tally
        .moments
        .iter()
        .map(|(m, n)| format!("{n} in a {m}"))
        .collect::<Vec<_>>()
        .join(", ");
    let hangs = if tally.hang_detect.is_empty() {
        String::new()
    } else {
        let (lo, hi) = tally
            .hang_detect
            .iter()
            .fold((f64::INFINITY, 0.0f64), |(lo, hi), &t| {
                (lo.min(t), hi.max(t))
            });
        format!(
            "; {} SIGSTOPs noticed after {lo:.1}-{hi:.1} s (ddp_timeout {DDP_TIMEOUT_S} s)",
            tally.hang_detect.len()
        )
    };
    let summary = format!(
        "soak: {} on {} ranks: {} faults ({moments}){hangs}; {} restarts; {} unloadable checkpoints; at most {} steps lost ({} in all); {compared} logged losses (every group's) equal the uninterrupted run's: {}; final weights equal: {}; {:.0}s (the uninterrupted run {:.0}s)",
        strategy.name(),
        soak.ranks,
        faults,
        watch.restarts(),
        tally.unloadable.len(),
        tally.lost.iter().max().unwrap_or(&0),
        tally.lost.iter().sum::<usize>(),
        if problems.iter().any(|p| p.contains("logged at step")) {
            "no"
        } else {
            "yes"
        },
        if weights_equal { "yes" } else { "no" },
        t0.elapsed().as_secs_f64(),
        ref_time.as_secs_f64(),
    );
    if problems.is_empty() {
        let _ = fs::remove_dir_all(&dir);
        Ok(summary)
    } else {
        Err(format!(
            "{summary}\nsoak: {}: {}\nsoak: the runs are kept in {}",
            strategy.name(),
            problems.join("\nsoak: "),
            dir.display()
        ))
    }
}

/// `cargo xtask soak --ranks N ...`.
pub fn run(args: &[String]) -> Result<(), String> {
    let soak = Soak::parse(args)?;
    signal::catch_termination_signals();
    let t0 = Instant::now();
    let (script, assets) = match &soak.script {
        Some(script) => {
            let assets = std::env::var_os("TCHTRAIN_ASSETS").map(PathBuf::from);
            let assets = match assets {
                Some(a) => a,
                None => setup::run(&setup::Options::default())?.assets,
            };
            (script.clone(), assets)
        }
        None => {
            let s = setup::run(&setup::Options::default())?;
            let bin = build_examples::build_examples(&s, false, &["run_clm"], "soak")?;
            (bin.join("run_clm"), s.assets)
        }
    };
    let root = disk::scratch_dir(&format!("soak-ranks-{}", std::process::id()))?;
    let mut summaries = Vec::new();
    for &strategy in &soak.strategies {
        summaries.push(soak_one(&soak, strategy, &script, &assets, &root)?);
    }
    let _ = fs::remove_dir_all(&root);
    println!("soak: finished in {:.0}s", t0.elapsed().as_secs_f64());
    for s in &summaries {
        println!("{s}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Vec<String> {
        s.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn parses_and_refuses_with_reasons() {
        let s = Soak::parse(&args(&["--ranks", "4"])).unwrap();
        assert_eq!((s.ranks, s.kills, s.hangs, s.steps()), (4, 50, 0, 100));
        assert_eq!(s.strategies, vec![Strategy::Zero2, Strategy::Ddp]);
        let s = Soak::parse(&args(&[
            "--ranks",
            "2",
            "--kills",
            "1",
            "--hangs",
            "1",
            "--strategy",
            "ddp",
        ]))
        .unwrap();
        assert_eq!((s.faults(), s.steps()), (2, 12));
        for (bad, says) in [
            (&["--ranks", "1"][..], "2 ranks or more"),
            (&["--ranks", "4", "--kills", "0"][..], "no faults"),
            (
                &["--ranks", "4", "--strategy", "fsdp"][..],
                "zero2, ddp or both",
            ),
            (&["--ranks", "4", "--kills", "x"][..], "whole number"),
            (&["--ranks", "4", "--bogus"][..], "unknown option"),
        ] {
            let err = Soak::parse(&args(bad)).unwrap_err();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
    }

    /// The checks that decide "unloadable" can fail: a missing file, a truncated
    /// safetensors file, a state of another step, a pickle without its zip directory.
    #[test]
    fn an_incomplete_checkpoint_is_named_with_the_reason() {
        let dir = std::env::temp_dir().join(format!("soak-ranks-unit-{}", std::process::id()));
        let ckpt = dir.join("checkpoint-7");
        fs::create_dir_all(ckpt.join("global_step7")).unwrap();
        let header = br#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
        let mut st = (header.len() as u64).to_le_bytes().to_vec();
        st.extend_from_slice(header);
        st.extend_from_slice(&[0u8; 8]);
        fs::write(ckpt.join("model.safetensors"), &st).unwrap();
        fs::write(ckpt.join("trainer_state.json"), r#"{"global_step": 7}"#).unwrap();
        fs::write(
            ckpt.join("global_step7/optim.pt"),
            b"PK\x03\x04....PK\x05\x06......",
        )
        .unwrap();
        let files = layout(&ckpt, 7).unwrap();
        assert_eq!(
            files,
            [
                "global_step{N}/optim.pt",
                "model.safetensors",
                "trainer_state.json"
            ]
        );
        assert_eq!(unloadable(&ckpt, 7, &files), None);

        fs::write(ckpt.join("model.safetensors"), &st[..st.len() - 1]).unwrap();
        assert!(
            unloadable(&ckpt, 7, &files)
                .unwrap()
                .contains("the header says")
        );
        fs::write(ckpt.join("model.safetensors"), &st).unwrap();
        fs::write(ckpt.join("trainer_state.json"), r#"{"global_step": 6}"#).unwrap();
        assert!(unloadable(&ckpt, 7, &files).unwrap().contains("not 7"));
        fs::write(ckpt.join("trainer_state.json"), r#"{"global_step": 7"#).unwrap();
        assert!(unloadable(&ckpt, 7, &files).is_some());
        fs::write(ckpt.join("trainer_state.json"), r#"{"global_step": 7}"#).unwrap();
        fs::write(ckpt.join("global_step7/optim.pt"), b"PK\x03\x04....").unwrap();
        assert!(
            unloadable(&ckpt, 7, &files)
                .unwrap()
                .contains("zip directory")
        );
        fs::remove_file(ckpt.join("global_step7/optim.pt")).unwrap();
        assert!(unloadable(&ckpt, 7, &files).unwrap().contains("optim.pt"));

        fs::create_dir_all(dir.join("tmp-checkpoint-8")).unwrap();
        assert_eq!(moment(&dir), "save");
        assert_eq!(newest(&dir), 7);
        let _ = fs::remove_dir_all(&dir);
    }
}

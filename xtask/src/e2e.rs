//! `cargo xtask e2e [--short] [--case NAME]`: the example scripts against upstream's, end to
//! end, on the same flags and data.
//!
//! Each case runs one of our example binaries (`run_clm`, `run_classification`) and the
//! Python driver of the same name in `scripts/e2e/` — upstream's example script's steps
//! (HfArgumentParser, `datasets.load_dataset`, `map(batched=True)` tokenization,
//! `group_texts` / the label list, `set_seed` before the model, `Trainer` with the script's
//! `compute_metrics`, train then evaluate) on the pinned transformers / datasets / torch —
//! with the same command line into two output folders, on 1 rank, or on 2 ranks (ours under
//! `xtask launch`, theirs under `python -m torch.distributed.run`, Gloo on the CPU). Both
//! sides run with `OMP_NUM_THREADS=2` (the reference scripts' intra-op thread count: some
//! libtorch kernels split their sums by thread) and offline.
//!
//! It then reads both `trainer_state.json` `log_history`s, `train_results.json` and
//! `eval_results.json` (and compares `predict_results.txt` line for line), and prints per case one table of the logged steps (loss, and the
//! relative differences of the loss, the gradient norm and the learning rate) and one of the
//! final metrics (train loss, evaluation loss and accuracy, perplexity, sample counts,
//! epochs; timings are left out). Relative difference: `|ours - theirs| / |theirs|`, 0 when
//! equal. **Tolerance: a case passes when every relative difference is at most 1e-6**
//! ([`TOLERANCE`]); both sides run the same libtorch on the same batches in the same op
//! order, so equal values are expected, and the tolerance leaves room for no more than a
//! sum's rounding (README.md has the measured figures). A key written by one side only
//! fails the case, as does a line of `predict_results.txt` that differs. A case whose preparation our script refuses with a
//! usage error naming the case's flag (a data format or `--dataset_name` not wired yet) is
//! skipped with the script's message; any other failure of either side fails the case. The
//! command exits non-zero when a case fails.
//!
//! The data are written by `scripts/e2e/prepare_data.py` into `target/e2e/data/` (Parquet
//! copies of hamlet.txt, the same laid out as a hub dataset repository, Rotten Tomatoes
//! reviews as `sentence,label` Parquet files, a GPT-2 tokenizer folder both sides load);
//! every run's output folder and log stay under `target/e2e/<case>/` for inspection.
//! The binaries are the dev profile's (`target/debug/`), the profile `cargo xtask test`
//! builds, so the short form inside `test` builds nothing; the numbers do not depend on
//! the profile (libtorch does the arithmetic, and Rust does not reassociate floats).
//!
//! `--short` is the form `cargo xtask test` runs ([`short_step`]): fewer cases and steps.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::cmd;
use crate::paths;
use crate::setup;

/// The largest relative difference a case may show in any compared value.
pub const TOLERANCE: f64 = 1e-6;

/// Intra-op threads on both sides: the reference scripts' (`REFERENCE_THREADS`).
const THREADS: &str = crate::test::REFERENCE_THREADS;

/// Which example script a case runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Script {
    Clm,
    Classification,
}

impl Script {
    /// The binary, and the Python driver's file stem.
    fn name(self) -> &'static str {
        match self {
            Script::Clm => "run_clm",
            Script::Classification => "run_classification",
        }
    }
}

/// Where a case finds its inputs.
struct Inputs<'a> {
    assets: &'a Path,
    data: &'a Path,
}

/// One parity case.
struct Case {
    name: &'static str,
    what: &'static str,
    script: Script,
    ranks: usize,
    /// Part of `--short` (and so of `cargo xtask test`).
    short: bool,
    /// The flag whose refusal by our script (a usage error naming it) skips the case.
    skip_if_refused: Option<&'static str>,
    /// The script's flags (without the common ones and `--output_dir`); `short` asks for
    /// the short form's sizes.
    args: fn(&Inputs<'_>, bool) -> Vec<String>,
}

fn path_arg(p: PathBuf) -> String {
    p.display().to_string()
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Tiny GPT-2 (the checkpoint's dropout 0.1), GPT-2's tokenizer, 64-token blocks, AdamW
/// lr 1e-3 with 2 warmup steps, batches of 4; evaluation at the end.
fn clm_args(i: &Inputs<'_>, short: bool, data: &[String]) -> Vec<String> {
    let mut v = vec![
        "--model_name_or_path".into(),
        path_arg(i.assets.join("tiny-gpt2")),
        "--tokenizer_name".into(),
        path_arg(i.data.join("gpt2-tokenizer")),
    ];
    v.extend(data.iter().cloned());
    v.extend(strings(&[
        "--block_size",
        "64",
        "--do_train",
        "--do_eval",
        "--max_steps",
        if short { "6" } else { "12" },
        "--per_device_train_batch_size",
        "4",
        "--per_device_eval_batch_size",
        "4",
        "--learning_rate",
        "1e-3",
        "--warmup_steps",
        "2",
        "--weight_decay",
        "0.01",
    ]));
    if short {
        v.extend(strings(&["--max_eval_samples", "16"]));
    }
    v
}

fn clm_txt(i: &Inputs<'_>, short: bool) -> Vec<String> {
    let file = path_arg(i.assets.join("text").join("hamlet.txt"));
    clm_args(i, short, &["--train_file".into(), file])
}

fn clm_parquet(i: &Inputs<'_>, short: bool) -> Vec<String> {
    let file = path_arg(i.data.join("hamlet.parquet"));
    clm_args(i, short, &["--train_file".into(), file])
}

fn clm_dataset_name(i: &Inputs<'_>, short: bool) -> Vec<String> {
    let repo = path_arg(i.data.join("hamlet-repo"));
    clm_args(i, short, &["--dataset_name".into(), repo])
}

/// SmolLM2-135M (a real Llama-family checkpoint, its own tokenizer) on hamlet.txt: 64-token
/// blocks, AdamW lr 1e-4 with 1 warmup step, batches of 2, 4 steps (2 in the short form),
/// evaluation on 16 blocks.
fn clm_smollm2(i: &Inputs<'_>, short: bool) -> Vec<String> {
    strings(&[
        "--model_name_or_path",
        &path_arg(i.assets.join("smollm2-135m")),
        "--train_file",
        &path_arg(i.assets.join("text").join("hamlet.txt")),
        "--block_size",
        "64",
        "--do_train",
        "--do_eval",
        "--max_steps",
        if short { "2" } else { "4" },
        "--per_device_train_batch_size",
        "2",
        "--per_device_eval_batch_size",
        "4",
        "--max_eval_samples",
        "16",
        "--learning_rate",
        "1e-4",
        "--warmup_steps",
        "1",
    ])
}

/// MiniLM-L6 with a new 2-label head on the Rotten Tomatoes rows (Parquet, `sentence` and
/// `label` columns), 64 tokens padded, AdamW lr 1e-4 with 2 warmup steps, batches of 8; then
/// `--do_predict` on the test rows (`predict_results.txt`).
fn classification_parquet(i: &Inputs<'_>, short: bool) -> Vec<String> {
    let dir = i.data.join("rotten-tomatoes");
    let mut v = vec![
        "--model_name_or_path".into(),
        path_arg(i.assets.join("minilm")),
        "--train_file".into(),
        path_arg(dir.join("train.parquet")),
        "--validation_file".into(),
        path_arg(dir.join("validation.parquet")),
    ];
    v.extend(["--test_file".into(), path_arg(dir.join("test.parquet"))]);
    v.extend(strings(&[
        "--max_seq_length",
        "64",
        "--do_train",
        "--do_eval",
        "--do_predict",
        "--max_steps",
        if short { "5" } else { "10" },
        "--per_device_train_batch_size",
        "8",
        "--per_device_eval_batch_size",
        "16",
        "--learning_rate",
        "1e-4",
        "--warmup_steps",
        "2",
        "--weight_decay",
        "0.01",
    ]));
    if short {
        v.extend(strings(&[
            "--max_eval_samples",
            "48",
            "--max_predict_samples",
            "24",
        ]));
    }
    v
}

/// The classification case as a regression: the `score` column (fresh 1.0, rotten 0.0) as
/// the label (`--remove_columns label --label_column_name score`), so `predict_results.txt`
/// holds each row's value to three decimals.
fn regression_parquet(i: &Inputs<'_>, short: bool) -> Vec<String> {
    let mut v = classification_parquet(i, short);
    v.extend(strings(&[
        "--remove_columns",
        "label",
        "--label_column_name",
        "score",
    ]));
    v
}

/// Every case, in the order they run.
fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "clm-txt",
            what: "run_clm, tiny GPT-2 on hamlet.txt (text loader, 5% held out), 1 rank",
            script: Script::Clm,
            ranks: 1,
            short: false,
            skip_if_refused: None,
            args: clm_txt,
        },
        Case {
            name: "clm-txt-2ranks",
            what: "run_clm, tiny GPT-2 on hamlet.txt, 2 ranks (DDP, Gloo)",
            script: Script::Clm,
            ranks: 2,
            short: true,
            skip_if_refused: None,
            args: clm_txt,
        },
        Case {
            name: "clm-parquet",
            what: "run_clm, tiny GPT-2 on hamlet.parquet (one row per line), 1 rank",
            script: Script::Clm,
            ranks: 1,
            short: false,
            skip_if_refused: Some("train_file"),
            args: clm_parquet,
        },
        Case {
            name: "classification-parquet",
            what: "run_classification, MiniLM on Rotten Tomatoes train/validation.parquet, 1 rank",
            script: Script::Classification,
            ranks: 1,
            short: true,
            skip_if_refused: Some("train_file"),
            args: classification_parquet,
        },
        Case {
            name: "regression-parquet",
            what: "run_classification as a regression (float labels), MiniLM on the same rows, 1 rank",
            script: Script::Classification,
            ranks: 1,
            short: false,
            skip_if_refused: Some("train_file"),
            args: regression_parquet,
        },
        Case {
            name: "clm-smollm2",
            what: "run_clm, SmolLM2-135M (fp32) on hamlet.txt, 1 rank",
            script: Script::Clm,
            ranks: 1,
            short: false,
            skip_if_refused: None,
            args: clm_smollm2,
        },
        Case {
            name: "clm-dataset-name",
            what: "run_clm --dataset_name <local folder laid out as a hub dataset repository>, 1 rank",
            script: Script::Clm,
            ranks: 1,
            short: false,
            skip_if_refused: Some("dataset_name"),
            args: clm_dataset_name,
        },
    ]
}

/// Command-line options of `e2e`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// The short form (`cargo xtask test`'s): fewer cases, fewer steps.
    short: bool,
    /// Only these cases (default: every case of the form).
    cases: Vec<String>,
}

impl Options {
    /// Parses `e2e`'s arguments.
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let known: Vec<&str> = cases().iter().map(|c| c.name).collect();
        let mut o = Options::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let (flag, inline) = match a.split_once('=') {
                Some((f, v)) => (f, Some(v.to_string())),
                None => (a.as_str(), None),
            };
            match flag {
                "--short" if inline.is_none() => o.short = true,
                "--case" => {
                    let v = inline
                        .or_else(|| it.next().cloned())
                        .ok_or("--case needs a case name")?;
                    for name in v.split(',') {
                        if !known.contains(&name) {
                            return Err(format!(
                                "e2e: unknown case `{name}` (known: {})",
                                known.join(", ")
                            ));
                        }
                        o.cases.push(name.to_string());
                    }
                }
                _ => {
                    return Err(format!(
                        "e2e: unknown option `{a}` (known: --short, --case NAME[,NAME...]; cases: {})",
                        known.join(", ")
                    ));
                }
            }
        }
        Ok(o)
    }

    fn selected(&self) -> Vec<Case> {
        cases()
            .into_iter()
            .filter(|c| {
                if self.cases.is_empty() {
                    !self.short || c.short
                } else {
                    self.cases.iter().any(|n| n == c.name)
                }
            })
            .collect()
    }
}

/// How one case ended.
#[derive(Debug, Clone, PartialEq)]
enum Verdict {
    /// Every compared value within [`TOLERANCE`]; the largest relative difference.
    Passed(f64),
    /// Skipped, and why.
    Skipped(String),
    /// Failed, and why.
    Failed(String),
}

/// One case's outcome, for the summary.
#[derive(Debug, Clone)]
struct Outcome {
    name: &'static str,
    ranks: usize,
    steps: usize,
    verdict: Verdict,
    seconds: f64,
}

/// What a suite run found: the summary clause and whether it failed.
#[derive(Debug, Clone)]
pub struct Report {
    outcomes: Vec<Outcome>,
    /// A failure before any case ran (no binary, no data).
    error: Option<String>,
    /// Wall time of the whole suite.
    pub seconds: f64,
}

impl Report {
    /// Whether every case passed or was skipped.
    pub fn passed(&self) -> bool {
        self.error.is_none()
            && !self
                .outcomes
                .iter()
                .any(|o| matches!(o.verdict, Verdict::Failed(_)))
    }

    /// One clause for `cargo xtask test`'s summary line, e.g.
    /// `e2e: 2 cases within 1e-6 of upstream (max relative difference 0.0e0), 0 skipped`.
    pub fn summary(&self) -> String {
        if let Some(e) = &self.error {
            return format!("e2e: FAILED ({e})");
        }
        let mut passed = 0;
        let mut worst = 0f64;
        let mut skipped = Vec::new();
        let mut failed = Vec::new();
        for o in &self.outcomes {
            match &o.verdict {
                Verdict::Passed(m) => {
                    passed += 1;
                    worst = worst.max(*m);
                }
                Verdict::Skipped(_) => skipped.push(o.name),
                Verdict::Failed(_) => failed.push(o.name),
            }
        }
        let mut s = format!(
            "e2e: {passed} case{} within {TOLERANCE:e} of upstream (max relative difference {worst:.1e})",
            if passed == 1 { "" } else { "s" }
        );
        if !skipped.is_empty() {
            s.push_str(&format!(", skipped {}", skipped.join(", ")));
        }
        if !failed.is_empty() {
            s.push_str(&format!(", FAILED {}", failed.join(", ")));
        }
        s
    }
}

/// The folder the example binaries of the dev profile land in.
fn debug_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
        .join("debug")
}

/// `cargo xtask e2e [--short] [--case NAME]`: setup, the dev build of the two example
/// binaries, the cases, the tables and a summary; fails when a case fails.
pub fn run(args: &[String]) -> Result<(), String> {
    if matches!(
        args.first().map(String::as_str),
        Some("--help" | "-h" | "help")
    ) {
        print!("{}", crate::USAGE);
        return Ok(());
    }
    let o = Options::parse(args)?;
    let t0 = Instant::now();
    let s = setup::run(&setup::Options::default())?;
    let root = paths::workspace_root();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build.current_dir(&root).args([
        "build",
        "-p",
        "tchtrain-examples",
        "--bin",
        "run_clm",
        "--bin",
        "run_classification",
    ]);
    if let Some(libtorch) = &s.child_libtorch {
        build.env("LIBTORCH", libtorch);
    }
    println!("e2e: {}", cmd::display(&build));
    let tb = Instant::now();
    cmd::status(
        &mut build,
        "building the run_clm and run_classification examples",
    )?;
    println!("e2e: built in {:.1}s", tb.elapsed().as_secs_f64());
    let report = suite(&s, &o.selected(), o.short);
    println!(
        "xtask e2e finished in {:.1}s (setup and build included); {}",
        t0.elapsed().as_secs_f64(),
        report.summary()
    );
    if report.passed() {
        Ok(())
    } else {
        Err("a parity case failed (see its table and log above)".into())
    }
}

/// The short form for `cargo xtask test`, on the binaries its `cargo test` built.
pub fn short_step(s: &setup::Setup) -> Report {
    let o = Options {
        short: true,
        cases: Vec::new(),
    };
    suite(s, &o.selected(), true)
}

/// Prepares the data and runs `cases`, printing each one's tables, then the summary table.
fn suite(s: &setup::Setup, cases: &[Case], short: bool) -> Report {
    let t0 = Instant::now();
    let root = paths::workspace_root();
    let bin = debug_dir(&root);
    let work = root.join("target").join("e2e");
    let fail = |e: String| Report {
        outcomes: Vec::new(),
        error: Some(e),
        seconds: t0.elapsed().as_secs_f64(),
    };
    for script in [Script::Clm, Script::Classification] {
        let exe = bin.join(script.name());
        if !exe.is_file() {
            return fail(format!(
                "no {} binary at {} (build it with `cargo build -p tchtrain-examples --bins`)",
                script.name(),
                exe.display()
            ));
        }
    }
    if let Err(e) = prepare(s, &root, &work) {
        return fail(e);
    }
    let inputs = Inputs {
        assets: &s.assets,
        data: &work.join("data"),
    };
    println!(
        "e2e: {} case(s){}, {THREADS} intra-op threads on both sides, tolerance {TOLERANCE:e} (relative)",
        cases.len(),
        if short { " (short form)" } else { "" }
    );
    let mut outcomes = Vec::new();
    for case in cases {
        let tc = Instant::now();
        println!("\n=== e2e {}: {} ===", case.name, case.what);
        let (verdict, steps) = match run_case(s, &root, &bin, &work, &inputs, case, short) {
            Ok(r) => r,
            Err(e) => (Verdict::Failed(e), 0),
        };
        match &verdict {
            Verdict::Passed(m) => println!(
                "e2e {}: PASSED (max relative difference {m:.1e} <= {TOLERANCE:e})",
                case.name
            ),
            Verdict::Skipped(why) => println!("e2e {}: SKIPPED: {why}", case.name),
            Verdict::Failed(why) => println!("e2e {}: FAILED: {why}", case.name),
        }
        outcomes.push(Outcome {
            name: case.name,
            ranks: case.ranks,
            steps,
            verdict,
            seconds: tc.elapsed().as_secs_f64(),
        });
    }
    print_summary(&outcomes);
    Report {
        outcomes,
        error: None,
        seconds: t0.elapsed().as_secs_f64(),
    }
}

/// The environment both sides run in: the reference thread count, offline, the
/// `datasets` cache inside the work folder.
fn side_env(c: &mut Command, s: &setup::Setup, work: &Path) {
    c.env("OMP_NUM_THREADS", THREADS)
        .env("TCHTRAIN_ASSETS", &s.assets)
        .env("HF_DATASETS_CACHE", work.join("hf-datasets-cache"))
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_DATASETS_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .env("TOKENIZERS_PARALLELISM", "false")
        .env("PYTHONUNBUFFERED", "1");
}

/// Empties `work` and writes the cases' data with `scripts/e2e/prepare_data.py`.
fn prepare(s: &setup::Setup, root: &Path, work: &Path) -> Result<(), String> {
    if work.exists() {
        std::fs::remove_dir_all(work)
            .map_err(|e| format!("cannot clear {}: {e}", work.display()))?;
    }
    std::fs::create_dir_all(work).map_err(|e| format!("cannot create {}: {e}", work.display()))?;
    let mut c = Command::new(&s.python);
    c.current_dir(root)
        .arg(root.join("scripts").join("e2e").join("prepare_data.py"))
        .arg(work);
    side_env(&mut c, s, work);
    let t0 = Instant::now();
    let out = cmd::output(&mut c, "writing the e2e data (scripts/e2e/prepare_data.py)")?;
    println!(
        "e2e: data in {} ({:.1}s): {}",
        work.join("data").display(),
        t0.elapsed().as_secs_f64(),
        out.trim()
    );
    Ok(())
}

/// How one side's run ended.
struct SideRun {
    ok: bool,
    /// The exit code (2: our scripts' usage errors).
    code: Option<i32>,
    seconds: f64,
    log: PathBuf,
}

/// Runs `c` with its output into `log`.
fn run_logged(c: &mut Command, log: &Path) -> Result<SideRun, String> {
    let file = File::create(log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
    let err = file
        .try_clone()
        .map_err(|e| format!("cannot open {} twice: {e}", log.display()))?;
    c.stdin(std::process::Stdio::null())
        .stdout(file)
        .stderr(err);
    println!("e2e: {}", cmd::display(c));
    let t0 = Instant::now();
    let status = c
        .status()
        .map_err(|e| format!("could not start `{}`: {e}", cmd::display(c)))?;
    Ok(SideRun {
        ok: status.success(),
        code: status.code(),
        seconds: t0.elapsed().as_secs_f64(),
        log: log.to_path_buf(),
    })
}

/// The last `n` lines of a log, indented.
fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| format!("    {l}\n"))
        .collect()
}

/// The line of our script's usage error, when the run ended with one that names `flag`.
fn refusal(run: &SideRun, flag: &str) -> Option<String> {
    if run.code != Some(2) {
        return None;
    }
    let text = std::fs::read_to_string(&run.log).ok()?;
    text.lines()
        .find(|l| l.contains(": error:") && l.contains(flag))
        .map(|l| l.trim().to_string())
}

/// This xtask binary, to run `launch` with. `cargo test --workspace` (in `cargo xtask test`)
/// rebuilds it while it runs, replacing the file: then the running one, which the kernel
/// keeps, is started through `/proc/self/exe`.
fn xtask_exe() -> Result<PathBuf, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find the xtask binary to launch ranks: {e}"))?;
    if exe.is_file() {
        return Ok(exe);
    }
    let running = PathBuf::from("/proc/self/exe");
    if running.exists() {
        Ok(running)
    } else {
        Err(format!(
            "the xtask binary {} is gone (rebuilt?); rerun `cargo xtask e2e`",
            exe.display()
        ))
    }
}

/// Runs both sides of one case and compares them: the verdict and the steps compared.
fn run_case(
    s: &setup::Setup,
    root: &Path,
    bin: &Path,
    work: &Path,
    inputs: &Inputs<'_>,
    case: &Case,
    short: bool,
) -> Result<(Verdict, usize), String> {
    let dir = work.join(case.name);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let (ours_dir, theirs_dir) = (dir.join("ours"), dir.join("theirs"));
    let script_args = (case.args)(inputs, short);
    let with_common = |out: &Path| -> Vec<String> {
        let mut v = script_args.clone();
        v.extend(strings(&[
            "--seed",
            "42",
            "--logging_steps",
            "1",
            "--save_strategy",
            "no",
            "--use_cpu",
            "--report_to",
            "none",
            "--disable_tqdm",
            "true",
            "--output_dir",
        ]));
        v.push(path_arg(out.to_path_buf()));
        v
    };
    let exe = bin.join(case.script.name());
    let mut ours = if case.ranks == 1 {
        Command::new(&exe)
    } else {
        let mut c = Command::new(xtask_exe()?);
        c.args([
            "launch",
            "--nproc-per-node",
            &case.ranks.to_string(),
            "--standalone",
            "--",
        ])
        .arg(&exe);
        c
    };
    ours.current_dir(root).args(with_common(&ours_dir));
    side_env(&mut ours, s, work);
    let ours_run = run_logged(&mut ours, &dir.join("ours.log"))?;
    if !ours_run.ok {
        if let Some(flag) = case.skip_if_refused
            && let Some(line) = refusal(&ours_run, flag)
        {
            return Ok((
                Verdict::Skipped(format!(
                    "our {} refuses `--{flag}` here: {line}",
                    case.script.name()
                )),
                0,
            ));
        }
        print!("{}", log_tail(&ours_run.log, 30));
        return Err(format!(
            "our {} failed (exit {:?}); log {}",
            case.script.name(),
            ours_run.code,
            ours_run.log.display()
        ));
    }

    let driver = root
        .join("scripts")
        .join("e2e")
        .join(format!("{}.py", case.script.name()));
    let mut theirs = Command::new(&s.python);
    if case.ranks > 1 {
        theirs.args([
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            &case.ranks.to_string(),
        ]);
    }
    theirs
        .current_dir(root)
        .arg(&driver)
        .args(with_common(&theirs_dir));
    side_env(&mut theirs, s, work);
    let theirs_run = run_logged(&mut theirs, &dir.join("theirs.log"))?;
    if !theirs_run.ok {
        print!("{}", log_tail(&theirs_run.log, 30));
        return Err(format!(
            "the upstream driver {} failed (exit {:?}); log {}",
            driver.display(),
            theirs_run.code,
            theirs_run.log.display()
        ));
    }
    println!(
        "e2e: ours {:.1}s, theirs {:.1}s ({} rank{})",
        ours_run.seconds,
        theirs_run.seconds,
        case.ranks,
        if case.ranks == 1 { "" } else { "s" }
    );
    let cmp = compare_dirs(&ours_dir, &theirs_dir)?;
    print!("{}", cmp.render());
    let steps = cmp.steps.len();
    let worst = cmp.max_rel();
    if let Some(p) = cmp.problems.first() {
        return Ok((
            Verdict::Failed(format!("{p} ({} problem(s) in all)", cmp.problems.len())),
            steps,
        ));
    }
    if steps == 0 {
        return Ok((Verdict::Failed("no training step was logged".into()), 0));
    }
    if worst <= TOLERANCE {
        Ok((Verdict::Passed(worst), steps))
    } else {
        Ok((
            Verdict::Failed(format!(
                "max relative difference {worst:.3e} > {TOLERANCE:e}"
            )),
            steps,
        ))
    }
}

/// The summary table of the cases.
fn print_summary(outcomes: &[Outcome]) {
    println!("\n| case | ranks | steps | max rel diff | result | seconds |");
    println!("|---|---:|---:|---:|---|---:|");
    for o in outcomes {
        let (max, result) = match &o.verdict {
            Verdict::Passed(m) => (format!("{m:.1e}"), "passed".to_string()),
            Verdict::Skipped(_) => ("—".into(), "skipped".into()),
            Verdict::Failed(why) => {
                // The whole reason is printed with the case above.
                let short: String = why.chars().take(100).collect();
                let more = if short.len() < why.len() { " ..." } else { "" };
                ("—".into(), format!("FAILED: {short}{more}"))
            }
        };
        println!(
            "| {} | {} | {} | {max} | {result} | {:.0} |",
            o.name, o.ranks, o.steps, o.seconds
        );
    }
}

// ---------------------------------------------------------------------------------------
// Comparing two output folders.

/// Relative difference of `ours` against `theirs`: 0 when equal (two NaNs included),
/// infinite when only one is finite, else `|ours - theirs| / |theirs|`.
fn rel(ours: f64, theirs: f64) -> f64 {
    if ours == theirs || (ours.is_nan() && theirs.is_nan()) {
        return 0.0;
    }
    if !ours.is_finite() || !theirs.is_finite() {
        return f64::INFINITY;
    }
    (ours - theirs).abs() / theirs.abs().max(f64::MIN_POSITIVE)
}

/// Keys that measure time, not numbers of the run: never compared.
fn is_timing(key: &str) -> bool {
    key.ends_with("_runtime") || key.contains("per_second")
}

/// One logged training step of both sides.
#[derive(Debug, Clone, PartialEq)]
struct StepRow {
    step: i64,
    loss: (f64, f64),
    grad_norm: Option<(f64, f64)>,
    learning_rate: Option<(f64, f64)>,
    epoch: Option<(f64, f64)>,
}

impl StepRow {
    fn max_rel(&self) -> f64 {
        [
            Some(self.loss),
            self.grad_norm,
            self.learning_rate,
            self.epoch,
        ]
        .into_iter()
        .flatten()
        .map(|(a, b)| rel(a, b))
        .fold(0.0, f64::max)
    }
}

/// One final value of both sides (`place` names the file or log entry).
#[derive(Debug, Clone, PartialEq)]
struct MetricRow {
    place: String,
    key: String,
    ours: f64,
    theirs: f64,
}

/// The comparison of one case's two output folders.
#[derive(Debug, Default)]
struct Comparison {
    steps: Vec<StepRow>,
    metrics: Vec<MetricRow>,
    /// Differences that fail the case whatever the numbers (a step logged by one side, a key
    /// one side writes and the other does not, a text output that differs).
    problems: Vec<String>,
    /// Text outputs found equal.
    texts: Vec<String>,
}

impl Comparison {
    fn max_rel(&self) -> f64 {
        let steps = self.steps.iter().map(StepRow::max_rel);
        let metrics = self.metrics.iter().map(|m| rel(m.ours, m.theirs));
        steps.chain(metrics).fold(0.0, f64::max)
    }

    /// The two tables and the problems.
    fn render(&self) -> String {
        let mut out = String::from(
            "| step | loss ours | loss theirs | rel diff | grad_norm rel diff | lr rel diff |\n|---:|---:|---:|---:|---:|---:|\n",
        );
        let opt = |v: Option<(f64, f64)>| {
            v.map_or("—".to_string(), |(a, b)| format!("{:.1e}", rel(a, b)))
        };
        for r in &self.steps {
            out.push_str(&format!(
                "| {} | {} | {} | {:.1e} | {} | {} |\n",
                r.step,
                r.loss.0,
                r.loss.1,
                rel(r.loss.0, r.loss.1),
                opt(r.grad_norm),
                opt(r.learning_rate)
            ));
        }
        out.push_str("\n| metric | ours | theirs | rel diff |\n|---|---:|---:|---:|\n");
        for m in &self.metrics {
            out.push_str(&format!(
                "| {} {} | {} | {} | {:.1e} |\n",
                m.place,
                m.key,
                m.ours,
                m.theirs,
                rel(m.ours, m.theirs)
            ));
        }
        for t in &self.texts {
            out.push_str(&format!("{t}\n"));
        }
        for p in &self.problems {
            out.push_str(&format!("problem: {p}\n"));
        }
        out
    }
}

/// A JSON object's numbers (numbers, and the strings Python writes for non-finite ones).
fn numbers(obj: &BTreeMap<String, Json>) -> BTreeMap<String, f64> {
    obj.iter()
        .filter_map(|(k, v)| v.as_f64().map(|x| (k.clone(), x)))
        .collect()
}

/// Compares the numeric keys of two flat objects into `cmp`, timings left out.
fn compare_objects(
    place: &str,
    ours: &BTreeMap<String, f64>,
    theirs: &BTreeMap<String, f64>,
    skip: &[&str],
    cmp: &mut Comparison,
) {
    for (key, &o) in ours {
        if is_timing(key) || skip.contains(&key.as_str()) {
            continue;
        }
        match theirs.get(key) {
            Some(&t) => cmp.metrics.push(MetricRow {
                place: place.to_string(),
                key: key.clone(),
                ours: o,
                theirs: t,
            }),
            None => cmp
                .problems
                .push(format!("{place}: `{key}` = {o} is written by ours only")),
        }
    }
    for (key, t) in theirs {
        if !is_timing(key) && !skip.contains(&key.as_str()) && !ours.contains_key(key) {
            cmp.problems.push(format!(
                "{place}: `{key}` = {t} is written by upstream only"
            ));
        }
    }
}

fn read_json(path: &Path) -> Result<Json, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    Json::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// `trainer_state.json`'s `log_history` entries.
fn log_history(dir: &Path) -> Result<Vec<BTreeMap<String, Json>>, String> {
    let path = dir.join("trainer_state.json");
    let state = read_json(&path)?;
    let entries = state
        .get("log_history")
        .and_then(Json::as_array)
        .ok_or_else(|| format!("{}: no log_history array", path.display()))?;
    entries
        .iter()
        .map(|e| {
            e.as_object()
                .cloned()
                .ok_or_else(|| format!("{}: a log_history entry is not an object", path.display()))
        })
        .collect()
}

/// Compares two finished runs' output folders.
fn compare_dirs(ours: &Path, theirs: &Path) -> Result<Comparison, String> {
    let mut cmp = Comparison::default();
    let (ours_log, theirs_log) = (log_history(ours)?, log_history(theirs)?);
    compare_logs(&ours_log, &theirs_log, &mut cmp);
    for file in ["train_results.json", "eval_results.json"] {
        let (o, t) = (ours.join(file), theirs.join(file));
        match (o.is_file(), t.is_file()) {
            (true, true) => {
                let num = |p: &Path| -> Result<BTreeMap<String, f64>, String> {
                    let j = read_json(p)?;
                    let obj = j
                        .as_object()
                        .ok_or_else(|| format!("{}: not a JSON object", p.display()))?;
                    Ok(numbers(obj))
                };
                compare_objects(file, &num(&o)?, &num(&t)?, &[], &mut cmp);
            }
            (false, false) => {}
            (mine, _) => cmp.problems.push(format!(
                "{file} is written by {} only",
                if mine { "ours" } else { "upstream" }
            )),
        }
    }
    // Text outputs, compared line for line.
    for file in ["predict_results.txt"] {
        let (o, t) = (ours.join(file), theirs.join(file));
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|e| format!("reading {}: {e}", p.display()))
        };
        match (o.is_file(), t.is_file()) {
            (true, true) => {
                let (o, t) = (read(&o)?, read(&t)?);
                if let Some((i, (a, b))) = o
                    .lines()
                    .zip(t.lines())
                    .enumerate()
                    .find(|(_, (a, b))| a != b)
                {
                    cmp.problems
                        .push(format!("{file} line {}: ours {a:?}, upstream {b:?}", i + 1));
                } else if o.lines().count() != t.lines().count() {
                    cmp.problems.push(format!(
                        "{file}: ours has {} lines, upstream {}",
                        o.lines().count(),
                        t.lines().count()
                    ));
                } else {
                    cmp.texts
                        .push(format!("{file}: {} lines equal", o.lines().count()));
                }
            }
            (false, false) => {}
            (mine, _) => cmp.problems.push(format!(
                "{file} is written by {} only",
                if mine { "ours" } else { "upstream" }
            )),
        }
    }
    Ok(cmp)
}

/// Compares two `log_history`s: the training steps (entries with `loss`) by step, the
/// evaluation entries (`eval_loss`) by step, the end-of-training entry (`train_loss`).
fn compare_logs(
    ours: &[BTreeMap<String, Json>],
    theirs: &[BTreeMap<String, Json>],
    cmp: &mut Comparison,
) {
    type Entries = BTreeMap<i64, BTreeMap<String, f64>>;
    let split = |log: &[BTreeMap<String, Json>]| -> (Entries, Entries, Vec<BTreeMap<String, f64>>) {
        let (mut train, mut eval, mut end) = (Entries::new(), Entries::new(), Vec::new());
        for e in log {
            let n = numbers(e);
            let step = n.get("step").map_or(-1, |&s| s as i64);
            if n.contains_key("train_loss") {
                end.push(n);
            } else if n.contains_key("loss") {
                train.insert(step, n);
            } else if n.contains_key("eval_loss") {
                eval.insert(step, n);
            }
        }
        (train, eval, end)
    };
    let (o_train, o_eval, o_end) = split(ours);
    let (t_train, t_eval, t_end) = split(theirs);
    let pair = |o: &BTreeMap<String, f64>, t: &BTreeMap<String, f64>, k: &str| {
        o.get(k).copied().zip(t.get(k).copied())
    };
    let steps: std::collections::BTreeSet<i64> =
        o_train.keys().chain(t_train.keys()).copied().collect();
    for step in steps {
        match (o_train.get(&step), t_train.get(&step)) {
            (Some(o), Some(t)) => cmp.steps.push(StepRow {
                step,
                loss: (o["loss"], t["loss"]),
                grad_norm: pair(o, t, "grad_norm"),
                learning_rate: pair(o, t, "learning_rate"),
                epoch: pair(o, t, "epoch"),
            }),
            (Some(_), None) => cmp
                .problems
                .push(format!("step {step} is logged by ours only")),
            _ => cmp
                .problems
                .push(format!("step {step} is logged by upstream only")),
        }
    }
    let eval_steps: std::collections::BTreeSet<i64> =
        o_eval.keys().chain(t_eval.keys()).copied().collect();
    for step in eval_steps {
        match (o_eval.get(&step), t_eval.get(&step)) {
            (Some(o), Some(t)) => {
                compare_objects(&format!("log step {step}"), o, t, &["step"], cmp);
            }
            _ => cmp.problems.push(format!(
                "the evaluation at step {step} is logged by one side only"
            )),
        }
    }
    match (o_end.first(), t_end.first()) {
        (Some(o), Some(t)) => compare_objects("log end", o, t, &["step"], cmp),
        (None, None) => {}
        _ => cmp
            .problems
            .push("the end-of-training log entry is written by one side only".into()),
    }
}

// ---------------------------------------------------------------------------------------
// A small JSON reader (xtask stays std-only): what trainer_state.json and the results files
// hold, written by Python's json module or serde_json.

/// A JSON value.
#[derive(Debug, Clone, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(BTreeMap<String, Json>),
}

impl Json {
    fn parse(text: &str) -> Result<Json, String> {
        let mut p = Parser {
            s: text.as_bytes(),
            i: 0,
        };
        let v = p.value()?;
        p.ws();
        if p.i != p.s.len() {
            return Err(format!("trailing characters at byte {}", p.i));
        }
        Ok(v)
    }

    fn get(&self, key: &str) -> Option<&Json> {
        self.as_object()?.get(key)
    }

    fn as_object(&self) -> Option<&BTreeMap<String, Json>> {
        match self {
            Json::Obj(m) => Some(m),
            _ => None,
        }
    }

    fn as_array(&self) -> Option<&Vec<Json>> {
        match self {
            Json::Arr(v) => Some(v),
            _ => None,
        }
    }

    /// A number; also the strings `"inf"` / `"nan"` some writers use for non-finite ones.
    fn as_f64(&self) -> Option<f64> {
        match self {
            Json::Num(x) => Some(*x),
            Json::Str(s) if matches!(s.as_str(), "inf" | "-inf" | "nan" | "NaN") => s.parse().ok(),
            _ => None,
        }
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn error(&self, what: &str) -> String {
        format!("{what} at byte {}", self.i)
    }

    fn eat(&mut self, word: &str) -> bool {
        if self.s[self.i..].starts_with(word.as_bytes()) {
            self.i += word.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self) -> Result<Json, String> {
        self.ws();
        match self.s.get(self.i) {
            None => Err(self.error("unexpected end")),
            Some(b'{') => self.object(),
            Some(b'[') => self.array(),
            Some(b'"') => Ok(Json::Str(self.string()?)),
            Some(_) if self.eat("null") => Ok(Json::Null),
            Some(_) if self.eat("true") => Ok(Json::Bool(true)),
            Some(_) if self.eat("false") => Ok(Json::Bool(false)),
            // Python's json.dumps writes these for non-finite floats.
            Some(_) if self.eat("NaN") => Ok(Json::Num(f64::NAN)),
            Some(_) if self.eat("Infinity") => Ok(Json::Num(f64::INFINITY)),
            Some(_) if self.eat("-Infinity") => Ok(Json::Num(f64::NEG_INFINITY)),
            Some(_) => self.number(),
        }
    }

    fn number(&mut self) -> Result<Json, String> {
        let start = self.i;
        while self.i < self.s.len()
            && matches!(
                self.s[self.i],
                b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'
            )
        {
            self.i += 1;
        }
        let text =
            std::str::from_utf8(&self.s[start..self.i]).map_err(|_| self.error("bad number"))?;
        text.parse::<f64>()
            .map(Json::Num)
            .map_err(|_| format!("bad number `{text}` at byte {start}"))
    }

    fn string(&mut self) -> Result<String, String> {
        self.i += 1; // the opening quote
        let mut out: Vec<u8> = Vec::new();
        loop {
            let Some(&b) = self.s.get(self.i) else {
                return Err(self.error("unterminated string"));
            };
            self.i += 1;
            match b {
                b'"' => break,
                b'\\' => {
                    let Some(&e) = self.s.get(self.i) else {
                        return Err(self.error("unterminated escape"));
                    };
                    self.i += 1;
                    match e {
                        b'n' => out.push(b'\n'),
                        b't' => out.push(b'\t'),
                        b'r' => out.push(b'\r'),
                        b'b' => out.push(8),
                        b'f' => out.push(12),
                        b'u' => {
                            let mut code = self.hex4()?;
                            // A surrogate pair.
                            if (0xD800..0xDC00).contains(&code) && self.eat("\\u") {
                                let low = self.hex4()?;
                                code = 0x10000
                                    + ((code - 0xD800) << 10)
                                    + (low.wrapping_sub(0xDC00) & 0x3FF);
                            }
                            let c = char::from_u32(code).unwrap_or('\u{FFFD}');
                            let mut buf = [0u8; 4];
                            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                        }
                        other => out.push(other),
                    }
                }
                other => out.push(other),
            }
        }
        String::from_utf8(out).map_err(|_| self.error("string is not UTF-8"))
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let digits = self
            .s
            .get(self.i..self.i + 4)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u32::from_str_radix(h, 16).ok())
            .ok_or_else(|| self.error("bad \\u escape"))?;
        self.i += 4;
        Ok(digits)
    }

    fn array(&mut self) -> Result<Json, String> {
        self.i += 1;
        let mut v = Vec::new();
        self.ws();
        if self.eat("]") {
            return Ok(Json::Arr(v));
        }
        loop {
            v.push(self.value()?);
            self.ws();
            if self.eat(",") {
                continue;
            }
            if self.eat("]") {
                return Ok(Json::Arr(v));
            }
            return Err(self.error("expected `,` or `]`"));
        }
    }

    fn object(&mut self) -> Result<Json, String> {
        self.i += 1;
        let mut m = BTreeMap::new();
        self.ws();
        if self.eat("}") {
            return Ok(Json::Obj(m));
        }
        loop {
            self.ws();
            if self.s.get(self.i) != Some(&b'"') {
                return Err(self.error("expected a key"));
            }
            let key = self.string()?;
            self.ws();
            if !self.eat(":") {
                return Err(self.error("expected `:`"));
            }
            let value = self.value()?;
            m.insert(key, value);
            self.ws();
            if self.eat(",") {
                continue;
            }
            if self.eat("}") {
                return Ok(Json::Obj(m));
            }
            return Err(self.error("expected `,` or `}`"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(text: &str) -> BTreeMap<String, Json> {
        Json::parse(text).unwrap().as_object().unwrap().clone()
    }

    #[test]
    fn reads_python_and_serde_json() {
        let j = Json::parse(
            r#"{"a": [1, 2.5e-3, -0.0, NaN, Infinity], "b": {"c": "x\"\u00e9\ud83d\ude00"}, "d": null, "e": true}"#,
        )
        .unwrap();
        let a = j.get("a").and_then(Json::as_array).unwrap();
        assert_eq!(a[1], Json::Num(2.5e-3));
        assert!(a[3].as_f64().unwrap().is_nan());
        assert_eq!(a[4].as_f64(), Some(f64::INFINITY));
        assert_eq!(
            j.get("b").and_then(|b| b.get("c")),
            Some(&Json::Str("x\"é😀".into()))
        );
        assert_eq!(j.get("d"), Some(&Json::Null));
        // Python's float repr round-trips through Rust's parser.
        assert_eq!(
            Json::parse("10.661139488220215").unwrap(),
            Json::Num(10.661139488220215)
        );
        assert!(Json::parse("{\"a\": 1,}").is_err());
        assert!(Json::parse("[1 2]").is_err());
        assert!(Json::parse("{} x").is_err());
    }

    #[test]
    fn relative_difference() {
        assert_eq!(rel(1.0, 1.0), 0.0);
        assert_eq!(rel(f64::NAN, f64::NAN), 0.0);
        assert_eq!(rel(f64::NAN, 1.0), f64::INFINITY);
        assert!((rel(1.000001, 1.0) - 1e-6).abs() < 1e-12);
        assert_eq!(rel(0.0, 0.0), 0.0);
    }

    #[test]
    fn compares_log_histories_by_step() {
        let ours = vec![
            obj(
                r#"{"step": 1, "loss": 2.0, "grad_norm": 1.0, "learning_rate": 0.001, "epoch": 0.1}"#,
            ),
            obj(
                r#"{"step": 2, "loss": 1.5, "grad_norm": 1.0, "learning_rate": 0.001, "epoch": 0.2}"#,
            ),
            obj(r#"{"step": 2, "eval_loss": 1.25, "eval_runtime": 3.0, "epoch": 0.2}"#),
            obj(
                r#"{"step": 2, "train_loss": 1.75, "train_runtime": 9.0, "total_flos": 5.0, "epoch": 0.2}"#,
            ),
        ];
        let mut theirs = ours.clone();
        theirs[1].insert("loss".into(), Json::Num(1.5 * (1.0 + 2e-6)));
        theirs[2].insert("eval_runtime".into(), Json::Num(1.0));
        let mut cmp = Comparison::default();
        compare_logs(&ours, &theirs, &mut cmp);
        assert!(cmp.problems.is_empty(), "{:?}", cmp.problems);
        assert_eq!(cmp.steps.len(), 2);
        assert_eq!(cmp.steps[0].max_rel(), 0.0);
        assert!(cmp.steps[1].max_rel() > TOLERANCE);
        // eval_loss and epoch at step 2, train_loss / total_flos / epoch at the end; no timings.
        let keys: Vec<String> = cmp
            .metrics
            .iter()
            .map(|m| format!("{} {}", m.place, m.key))
            .collect();
        assert_eq!(
            keys,
            [
                "log step 2 epoch",
                "log step 2 eval_loss",
                "log end epoch",
                "log end total_flos",
                "log end train_loss"
            ]
        );
        let table = cmp.render();
        assert!(
            table.contains("| 1 | 2 | 2 | 0.0e0 | 0.0e0 | 0.0e0 |"),
            "{table}"
        );

        let mut cmp = Comparison::default();
        compare_logs(&ours[..1], &ours[..2], &mut cmp);
        assert_eq!(cmp.problems, ["step 2 is logged by upstream only"]);
    }

    #[test]
    fn one_sided_keys_are_problems() {
        let ours = numbers(&obj(
            r#"{"train_loss": 1.0, "total_flos": 3.0, "train_runtime": 2.0}"#,
        ));
        let theirs = numbers(&obj(r#"{"train_loss": 1.0, "train_runtime": 5.0}"#));
        let mut cmp = Comparison::default();
        compare_objects("train_results.json", &ours, &theirs, &[], &mut cmp);
        assert_eq!(cmp.metrics.len(), 1);
        assert_eq!(cmp.problems.len(), 1);
        assert!(cmp.problems[0].contains("total_flos"));
    }

    #[test]
    fn options_and_case_selection() {
        let all = Options::parse(&[]).unwrap().selected();
        assert_eq!(all.len(), cases().len());
        let short = Options::parse(&["--short".into()]).unwrap().selected();
        assert!(!short.is_empty() && short.len() < all.len());
        assert!(short.iter().all(|c| c.short));
        let one = Options::parse(&["--case".into(), "clm-txt,clm-parquet".into()])
            .unwrap()
            .selected();
        assert_eq!(
            one.iter().map(|c| c.name).collect::<Vec<_>>(),
            ["clm-txt", "clm-parquet"]
        );
        assert!(Options::parse(&["--case=nope".into()]).is_err());
        assert!(Options::parse(&["--fast".into()]).is_err());
        // Names are unique and every case has a 1- or 2-rank form.
        let mut names: Vec<&str> = all.iter().map(|c| c.name).collect();
        names.dedup();
        assert_eq!(names.len(), all.len());
    }

    #[test]
    fn summary_clause() {
        let r = Report {
            outcomes: vec![
                Outcome {
                    name: "a",
                    ranks: 1,
                    steps: 3,
                    verdict: Verdict::Passed(0.0),
                    seconds: 1.0,
                },
                Outcome {
                    name: "b",
                    ranks: 1,
                    steps: 0,
                    verdict: Verdict::Skipped("refused".into()),
                    seconds: 1.0,
                },
            ],
            error: None,
            seconds: 2.0,
        };
        assert!(r.passed());
        assert_eq!(
            r.summary(),
            "e2e: 1 case within 1e-6 of upstream (max relative difference 0.0e0), skipped b"
        );
    }
}

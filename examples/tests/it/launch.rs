//! Each example script run as a user runs it on two processes: the script's binary under
//! `cargo xtask launch --nproc-per-node 2` (torchrun's environment, 127.0.0.1), to the end.
//! Only rank 0 writes the end-of-run files, as upstream's `save_model` / `save_metrics` /
//! `save_state` (`args.should_save`); before that was so, both ranks wrote
//! `model.safetensors` into the same folder and one of them failed. Each run must exit 0 on
//! both ranks, leave the saved model (weights, `config.json`, tokenizer), the results files
//! and `trainer_state.json` in `--output_dir`, and the saved model must load and differ from
//! the one it started from.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};
use tch::Device;
use tchtrain_callbacks::TrainerState;
use tchtrain_models::{AutoTask, LoadOptions, from_pretrained_dir};
use tchtrain_testing::{asset, temp_dir};

/// The `xtask` binary: `$TCHTRAIN_XTASK` (set by `cargo xtask test`), else the one
/// `cargo xtask` built beside the scripts' binaries.
pub(crate) fn xtask() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("TCHTRAIN_XTASK") {
        return Ok(PathBuf::from(path));
    }
    let beside = Path::new(env!("CARGO_BIN_EXE_run_clm"))
        .with_file_name(format!("xtask{}", std::env::consts::EXE_SUFFIX));
    ensure!(
        beside.is_file(),
        "no xtask binary at {} (run the tests with `cargo xtask test`, or `cargo build -p xtask` first)",
        beside.display()
    );
    Ok(beside)
}

/// `cargo xtask launch --nproc-per-node 2 -- <script> <args> --output_dir <out>` with the
/// CPU, no reports and no checkpoints; the launcher's output when it fails.
fn launch_2(script: &str, args: &[String], out: &Path) -> Result<()> {
    let mut all = args.to_vec();
    all.extend(strings(&[
        "--use_cpu",
        "--report_to",
        "none",
        "--save_strategy",
        "no",
        "--disable_tqdm",
        "true",
        "--output_dir",
    ]));
    all.push(out.display().to_string());
    launch_2_as_given(script, &all).map(|_| ())
}

/// `cargo xtask launch --nproc-per-node 2 -- <script> <args>` (127.0.0.1, a free port):
/// the launcher's output (stdout, then stderr); an error with it when a rank failed.
pub(crate) fn launch_2_as_given(script: &str, args: &[String]) -> Result<String> {
    let output = Command::new(xtask()?)
        .args([
            "launch",
            "--nproc-per-node",
            "2",
            "--master-port",
            "0",
            "--",
        ])
        .arg(script)
        .args(args)
        .output()?;
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    ensure!(
        output.status.success(),
        "{script} on 2 ranks failed ({}):\n{text}",
        output.status
    );
    Ok(text)
}

/// What a finished run leaves: every file named, the state at `steps`, and a saved model
/// that loads as `task` and differs from `initial`'s weights.
fn check_outputs(
    out: &Path,
    files: &[&str],
    steps: i64,
    task: AutoTask,
    initial: &Path,
) -> Result<()> {
    for f in files {
        ensure!(out.join(f).is_file(), "{f} missing in {}", out.display());
    }
    let leftovers: Vec<String> = std::fs::read_dir(out)?
        .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_>>()?;
    ensure!(
        !leftovers.iter().any(|n| n.contains(".tmp")),
        "temporary files left in {}: {leftovers:?}",
        out.display()
    );
    let state = TrainerState::load_from_json(out.join("trainer_state.json"))?;
    assert_eq!(state.global_step, steps);
    let options = LoadOptions::default();
    let saved = from_pretrained_dir(out, task, Device::Cpu, &options)
        .with_context(|| format!("loading the saved model in {}", out.display()))?
        .model;
    let start = from_pretrained_dir(initial, task, Device::Cpu, &options)?.model;
    let (saved, start) = (saved.var_store().variables(), start.var_store().variables());
    let changed = saved.iter().any(|(name, t)| {
        start
            .get(name)
            .is_some_and(|s| s.size() == t.size() && !s.allclose(t, 0.0, 0.0, false))
    });
    ensure!(changed, "the saved weights equal the initial ones");
    Ok(())
}

pub(crate) fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

const MODEL_FILES: [&str; 4] = [
    "model.safetensors",
    "config.json",
    "tokenizer.json",
    "training_args.json",
];

#[test]
fn run_clm_on_two_ranks_saves_once_and_loads() -> Result<()> {
    let out = temp_dir("launch-clm");
    let args = strings(&[
        "--model_name_or_path",
        &asset("tiny-gpt2"),
        "--tokenizer_name",
        &asset("gpt2-tokenizer"),
        "--train_file",
        &asset("text/hamlet.txt"),
        "--block_size",
        "32",
        "--max_eval_samples",
        "8",
        "--per_device_train_batch_size",
        "2",
        "--learning_rate",
        "1e-3",
        "--max_steps",
        "4",
        "--logging_steps",
        "1",
        "--do_train",
        "--do_eval",
    ]);
    launch_2(env!("CARGO_BIN_EXE_run_clm"), &args, &out)?;
    let mut files = MODEL_FILES.to_vec();
    files.extend([
        "train_results.json",
        "eval_results.json",
        "all_results.json",
    ]);
    check_outputs(
        &out,
        &files,
        4,
        AutoTask::CausalLm,
        Path::new(&asset("tiny-gpt2")),
    )
}

#[test]
fn run_mlm_on_two_ranks_saves_once_and_loads() -> Result<()> {
    let out = temp_dir("launch-mlm");
    let args = strings(&[
        "--model_name_or_path",
        &asset("tiny-bert"),
        "--tokenizer_name",
        &asset("minilm"),
        "--train_file",
        &asset("reference/trainer_mlm_ner/mlm/hamlet_400.txt"),
        "--line_by_line",
        "--max_seq_length",
        "24",
        "--max_eval_samples",
        "8",
        "--per_device_train_batch_size",
        "4",
        "--learning_rate",
        "1e-3",
        "--max_steps",
        "3",
        "--do_train",
        "--do_eval",
    ]);
    launch_2(env!("CARGO_BIN_EXE_run_mlm"), &args, &out)?;
    let mut files = MODEL_FILES.to_vec();
    files.extend([
        "train_results.json",
        "eval_results.json",
        "all_results.json",
    ]);
    check_outputs(
        &out,
        &files,
        3,
        AutoTask::MaskedLm,
        Path::new(&asset("tiny-bert")),
    )
}

#[test]
fn run_classification_on_two_ranks_saves_once_and_loads() -> Result<()> {
    let out = temp_dir("launch-classification");
    let args = strings(&[
        "--model_name_or_path",
        &asset("tiny-bert"),
        "--tokenizer_name",
        &asset("minilm"),
        "--train_file",
        &asset("text/rotten_tomatoes_corpus.csv.bz2"),
        "--text_column_names",
        "text",
        "--label_column_name",
        "category",
        "--label_filter",
        "fresh,rotten",
        "--validation_split_percentage",
        "10",
        "--max_train_samples",
        "64",
        "--max_eval_samples",
        "16",
        "--max_seq_length",
        "32",
        "--per_device_train_batch_size",
        "4",
        "--learning_rate",
        "1e-3",
        "--max_steps",
        "3",
        "--do_train",
        "--do_eval",
    ]);
    launch_2(env!("CARGO_BIN_EXE_run_classification"), &args, &out)?;
    let mut files = MODEL_FILES.to_vec();
    files.extend([
        "train_results.json",
        "eval_results.json",
        "all_results.json",
    ]);
    check_outputs(
        &out,
        &files,
        3,
        AutoTask::SequenceClassification { num_labels: None },
        Path::new(&asset("tiny-bert")),
    )
}

#[test]
fn run_ner_on_two_ranks_saves_once_and_loads() -> Result<()> {
    let out = temp_dir("launch-ner");
    let ner = asset("reference/trainer_mlm_ner/ner");
    let args = strings(&[
        "--model_name_or_path",
        &format!("{ner}/initial"),
        "--tokenizer_name",
        &asset("minilm"),
        "--train_file",
        &format!("{ner}/train.json"),
        "--validation_file",
        &format!("{ner}/validation.json"),
        "--test_file",
        &format!("{ner}/validation.json"),
        "--per_device_train_batch_size",
        "4",
        "--learning_rate",
        "1e-3",
        "--max_steps",
        "3",
        "--do_train",
        "--do_eval",
        "--do_predict",
    ]);
    launch_2(env!("CARGO_BIN_EXE_run_ner"), &args, &out)?;
    let mut files = MODEL_FILES.to_vec();
    files.extend([
        "train_results.json",
        "eval_results.json",
        "predict_results.json",
        "all_results.json",
        "predictions.txt",
    ]);
    check_outputs(
        &out,
        &files,
        3,
        AutoTask::TokenClassification { num_labels: None },
        Path::new(&format!("{ner}/initial")),
    )
}

/// A free TCP port on 127.0.0.1 for the rendezvous.
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// `xtask launch --nnodes 2 --node-rank <node> --nproc-per-node 2` of run_clm, started.
fn node(node: usize, port: u16, args: &[String], out: &Path) -> Result<std::process::Child> {
    Ok(Command::new(xtask()?)
        .args(["launch", "--nnodes", "2", "--node-rank", &node.to_string()])
        .args(["--nproc-per-node", "2", "--master-addr", "127.0.0.1"])
        .args(["--master-port", &port.to_string(), "--"])
        .arg(env!("CARGO_BIN_EXE_run_clm"))
        .args(args)
        .args(["--use_cpu", "--report_to", "none", "--save_strategy", "no"])
        .args(["--disable_tqdm", "true", "--output_dir"])
        .arg(out)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?)
}

/// `(loss, grad_norm)` of every step logged in `out/trainer_state.json`.
fn step_logs(out: &Path) -> Result<Vec<(f64, f64)>> {
    let state = TrainerState::load_from_json(out.join("trainer_state.json"))?;
    Ok(state
        .log_history
        .iter()
        .filter_map(|e| Some((e.get("loss")?.as_f64()?, e.get("grad_norm")?.as_f64()?)))
        .collect())
}

/// run_clm on two "nodes" of two processes each (two `cargo xtask launch --nnodes 2`
/// launchers on 127.0.0.1, as on two hosts) with one row per process equals run_clm in one
/// process with four rows per batch: the same losses and gradient norms, up to the order of
/// the sums (the tolerances of trainer/tests/it/distributed.rs: 1e-5 and 1e-4 relative).
/// Then a node that never arrives: node 0's ranks fail within `ddp_timeout`, naming it.
#[test]
fn run_clm_on_two_nodes_of_two_ranks_equals_one_process() -> Result<()> {
    let _g = tchtrain_testing::lock();
    let model = asset("reference/trainer_clm/initial");
    let common = |batch: &str| {
        strings(&[
            "--model_name_or_path",
            &model,
            "--tokenizer_name",
            &asset("gpt2-tokenizer"),
            "--train_file",
            &asset("text/hamlet.txt"),
            "--block_size",
            "32",
            "--per_device_train_batch_size",
            batch,
            "--learning_rate",
            "1e-3",
            "--max_steps",
            "4",
            "--logging_steps",
            "1",
            "--do_train",
            "--ddp_timeout",
            "20",
        ])
    };
    let nodes_out = temp_dir("launch-two-nodes");
    let port = free_port()?;
    let launchers = [
        node(0, port, &common("1"), &nodes_out)?,
        node(1, port, &common("1"), &nodes_out)?,
    ];
    for (n, launcher) in launchers.into_iter().enumerate() {
        let output = launcher.wait_with_output()?;
        ensure!(
            output.status.success(),
            "node {n} failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let single_out = temp_dir("launch-one-process");
    let mut single = common("4");
    single.extend(strings(&[
        "--use_cpu",
        "--report_to",
        "none",
        "--save_strategy",
        "no",
        "--disable_tqdm",
        "true",
        "--output_dir",
    ]));
    single.push(single_out.display().to_string());
    tchtrain_examples::run_clm::main_with_args(&single)?;
    let (four, one) = (step_logs(&nodes_out)?, step_logs(&single_out)?);
    assert_eq!(four.len(), 4, "{four:?}");
    assert_eq!(four.len(), one.len());
    let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(1e-12);
    for (step, ((loss, norm), (loss1, norm1))) in four.iter().zip(&one).enumerate() {
        assert!(
            rel(*loss, *loss1) < 1e-5,
            "step {step}: loss {loss} vs {loss1}"
        );
        assert!(
            rel(*norm, *norm1) < 1e-4,
            "step {step}: grad_norm {norm} vs {norm1}"
        );
    }

    // Node 1 never starts: node 0's ranks give up after ddp_timeout (here 3 s).
    let lonely_out = temp_dir("launch-lonely-node");
    let mut args = common("1");
    let at = args.iter().position(|a| a == "20").context("ddp_timeout")?;
    args[at] = "3".into();
    let started = std::time::Instant::now();
    let output = node(0, free_port()?, &args, &lonely_out)?.wait_with_output()?;
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(
        !output.status.success(),
        "node 0 alone succeeded:\n{stderr}"
    );
    ensure!(
        stderr.contains("could not join the process group") && stderr.contains("ddp_timeout=3s"),
        "the failure names the rendezvous and the timeout:\n{stderr}"
    );
    // Loading the model and the data comes first; the wait itself is bounded by the timeout.
    ensure!(took.as_secs_f64() < 60.0, "node 0 gave up after {took:?}");
    let _ = std::fs::remove_dir_all(&nodes_out);
    let _ = std::fs::remove_dir_all(&single_out);
    let _ = std::fs::remove_dir_all(&lonely_out);
    Ok(())
}

//! Shared pieces of the multi-process Trainer tests: the assets, the reference job's data and
//! initial model, and relaunching this test binary as the ranks of a world (torchrun's
//! environment, children's stdout dropped so their `test result` lines are not counted).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tch::Device;
use tchtrain_callbacks::JsonMap;
use tchtrain_collators::{Feature, Label};
use tchtrain_data::{Dataset, InMemoryDataset};
use tchtrain_distributed::DistributedEnv;
use tchtrain_models::{AutoTask, LoadOptions, PreTrainedModel, from_pretrained_dir};
pub use tchtrain_testing::assets;

/// Environment variable naming a child's role (set only in relaunched ranks).
pub const ROLE: &str = "TCHTRAIN_TEST_ROLE";
/// Environment variable naming the folder a test's ranks share.
pub const DIR: &str = "TCHTRAIN_TEST_DIR";

pub fn reference_dir() -> PathBuf {
    assets().join("reference/trainer_clm")
}

/// Tiny GPT-2 cut to its first 1024 tokens (`trainer_clm.py`'s `small_vocab_model`, saved by
/// `trainer_fp16.py` as `gpt2_initial/`): the model of the tests that compare our runs with
/// our runs. Its LM head, 1/49 of the full vocabulary's, is most of a step's time and of a
/// checkpoint's size.
pub fn small_vocab_initial() -> PathBuf {
    assets().join("reference/trainer_fp16/gpt2_initial")
}

/// The reference's hamlet blocks with their ids mapped into [`small_vocab_initial`]'s 1024
/// tokens (`id % 1024`; the same 90 train and 14 eval rows as `blocks.json`).
pub fn small_vocab_blocks_json() -> PathBuf {
    assets().join("reference/trainer_fp16/gpt2_blocks.json")
}

pub fn rank() -> usize {
    std::env::var("RANK")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

pub fn test_dir() -> PathBuf {
    PathBuf::from(std::env::var_os(DIR).expect("the parent sets the test folder"))
}

/// `true` in a relaunched rank.
pub fn is_rank() -> bool {
    std::env::var(ROLE).is_ok()
}

/// The child's role: `None` in the parent.
pub fn role() -> Option<String> {
    std::env::var(ROLE).ok()
}

/// A fresh temporary folder for one test.
pub fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tchtrain-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The full name libtest knows `test` by in this binary (`module::test`): the running test
/// is named by its thread, so a sibling `test` of the same module gets the same prefix.
pub fn test_path(test: &str) -> String {
    let current = std::thread::current()
        .name()
        .unwrap_or_default()
        .to_string();
    match current.rsplit_once("::") {
        _ if current == test || current.ends_with(&format!("::{test}")) => current,
        Some((module, _)) => format!("{module}::{test}"),
        None => test.to_string(),
    }
}

/// Set in a test relaunched alone in a child process by [`isolated`].
pub const ISOLATED: &str = "TCHTRAIN_TEST_ISOLATED";

/// Runs `test` alone in a child process of this binary, for checks of process-wide state
/// (the allocator's counters) that another test's threads could disturb: `true` in that
/// child, where the test body then runs; `false` in the parent once the child passed (its
/// output is shown when it failed).
pub fn isolated(test: &str) -> bool {
    if std::env::var_os(ISOLATED).is_some() {
        return true;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &test_path(test),
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(ISOLATED, "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{test} failed in its own process ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    false
}

/// Spawns this binary running only `test` as each rank of a world of `world`, in `role`.
pub fn launch(test: &str, world: i32, dir: &Path, role: &str) -> Vec<Child> {
    launch_nodes(test, 1, world, dir, role)
}

/// [`launch`] as `nodes` nodes of `world / nodes` processes each, with the environment
/// `cargo xtask launch --nnodes` gives each rank (`LOCAL_RANK`, `LOCAL_WORLD_SIZE`,
/// `GROUP_RANK`, `GROUP_WORLD_SIZE` those of its node), all on 127.0.0.1.
pub fn launch_nodes(test: &str, nodes: i32, world: i32, dir: &Path, role: &str) -> Vec<Child> {
    let port = free_port();
    let per_node = world / nodes;
    (0..world)
        .map(|rank| {
            let node = [
                ("LOCAL_RANK", (rank % per_node).to_string()),
                ("LOCAL_WORLD_SIZE", per_node.to_string()),
                ("GROUP_RANK", (rank / per_node).to_string()),
                ("GROUP_WORLD_SIZE", nodes.to_string()),
            ];
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    &test_path(test),
                    "--nocapture",
                    "--test-threads",
                    "1",
                ])
                .envs(DistributedEnv::vars_for(rank, world, "127.0.0.1", port))
                .envs(node)
                .env(ROLE, role)
                .env(DIR, dir)
                .env("OMP_NUM_THREADS", "1")
                // The ranks' `test result` lines would be counted by the summary.
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect()
}

/// Spawns this binary running only `test` as some ranks of a world of `world`, in `role`:
/// one child per `(rank, master_port)` (a rank left out never joins; a port that differs
/// from rank 0's is a wrong `MASTER_PORT`). The children's stderr goes to
/// `dir/stderr-rank{rank}.txt`.
pub fn launch_ranks(
    test: &str,
    world: i32,
    ranks: &[(i32, u16)],
    dir: &Path,
    role: &str,
) -> Vec<Child> {
    ranks
        .iter()
        .map(|&(rank, port)| {
            let stderr = std::fs::File::create(dir.join(format!("stderr-rank{rank}.txt"))).unwrap();
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    &test_path(test),
                    "--nocapture",
                    "--test-threads",
                    "1",
                ])
                .envs(DistributedEnv::vars_for(rank, world, "127.0.0.1", port))
                .env(ROLE, role)
                .env(DIR, dir)
                .env("OMP_NUM_THREADS", "1")
                // The ranks' `test result` lines would be counted by the summary.
                .stdout(Stdio::null())
                .stderr(stderr)
                .spawn()
                .unwrap()
        })
        .collect()
}

/// Every child's exit code, killing all of them if they have not finished within `limit`.
pub fn wait_codes(mut children: Vec<Child>, limit: Duration) -> Vec<Option<i32>> {
    let start = Instant::now();
    let mut codes: Vec<Option<Option<i32>>> = vec![None; children.len()];
    while codes.iter().any(Option::is_none) {
        for (i, c) in children.iter_mut().enumerate() {
            if codes[i].is_none() {
                codes[i] = c.try_wait().unwrap().map(|s| s.code());
            }
        }
        if start.elapsed() > limit {
            for c in &mut children {
                let _ = c.kill();
                let _ = c.wait();
            }
            panic!("ranks did not finish within {limit:?}: {codes:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    codes.into_iter().map(Option::flatten).collect()
}

/// The token ids of the first `n` blocks of `part` (`train` / `eval`) in the small
/// vocabulary ([`small_vocab_blocks_json`]).
pub fn block_ids(part: &str, n: usize) -> Result<Vec<Vec<i64>>> {
    block_ids_from(&small_vocab_blocks_json(), part, n)
}

/// [`block_ids`] of a reference job's `dir/blocks.json`.
pub fn block_ids_in(dir: &Path, part: &str, n: usize) -> Result<Vec<Vec<i64>>> {
    block_ids_from(&dir.join("blocks.json"), part, n)
}

fn block_ids_from(path: &Path, part: &str, n: usize) -> Result<Vec<Vec<i64>>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)?;
    v[part]
        .as_array()
        .context("blocks")?
        .iter()
        .take(n)
        .map(|row| Ok(serde_json::from_value(row.clone())?))
        .collect()
}

/// The first `n` blocks of `part` in the small vocabulary, row j's last (j * 13) % 40
/// labels -100: the data of the tests that compare our runs with our runs.
pub fn blocks(part: &str, n: usize) -> Result<Arc<dyn Dataset>> {
    Ok(rows_with_ignored_tails(block_ids(part, n)?))
}

/// The first 38 train blocks in the small vocabulary, labels = input ids: the data of the
/// field and hook tests, which compare our runs with our runs.
pub fn small_train() -> Result<Arc<dyn Dataset>> {
    let rows = block_ids("train", 38)?
        .into_iter()
        .map(|ids| Feature::new(ids.clone()).with_labels(Label::Ids(ids)))
        .collect();
    Ok(InMemoryDataset::new(rows).into_shared())
}

/// [`blocks`] of a reference job's `dir/blocks.json`.
pub fn blocks_in(dir: &Path, part: &str, n: usize) -> Result<Arc<dyn Dataset>> {
    Ok(rows_with_ignored_tails(block_ids_in(dir, part, n)?))
}

fn rows_with_ignored_tails(ids: Vec<Vec<i64>>) -> Arc<dyn Dataset> {
    let rows = ids
        .into_iter()
        .enumerate()
        .map(|(j, ids)| {
            // Rows end with 0 to 39 ignored labels (as padding would), so the ranks count
            // different numbers of tokens: only `average_tokens_across_devices` makes their
            // losses add up to the single process's.
            let mut labels = ids.clone();
            let ignored = (j * 13) % 40;
            let len = labels.len();
            labels[len - ignored..].fill(-100);
            Feature::new(ids).with_labels(Label::Ids(labels))
        })
        .collect();
    InMemoryDataset::new(rows).into_shared()
}

/// The starting point of the tests that compare our runs with our runs: tiny GPT-2 in the
/// small vocabulary, every dropout 0 ([`small_vocab_initial`]).
pub fn initial_model() -> Result<Box<dyn PreTrainedModel>> {
    model_from(&small_vocab_initial())
}

/// A reference job's starting point, `dir/initial`.
pub fn initial_model_in(dir: &Path) -> Result<Box<dyn PreTrainedModel>> {
    model_from(&dir.join("initial"))
}

fn model_from(dir: &Path) -> Result<Box<dyn PreTrainedModel>> {
    Ok(from_pretrained_dir(
        dir,
        AutoTask::CausalLm,
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model)
}

/// A `log_history` with only its numbers, each entry by key.
pub type Log = Vec<BTreeMap<String, f64>>;

/// The numbers of a `log_history`.
pub fn numbers(history: &[JsonMap]) -> Log {
    history
        .iter()
        .map(|e| {
            e.iter()
                .filter_map(|(k, v)| Some((k.to_string(), v.as_f64()?)))
                .collect()
        })
        .collect()
}

/// Writes a log exactly (the bits of each number).
pub fn write_log(path: &Path, log: &Log) -> Result<()> {
    let bits: Vec<BTreeMap<&String, u64>> = log
        .iter()
        .map(|e| e.iter().map(|(k, v)| (k, v.to_bits())).collect())
        .collect();
    Ok(std::fs::write(path, serde_json::to_string(&bits)?)?)
}

/// Reads a log [`write_log`] wrote.
pub fn read_log(path: &Path) -> Result<Log> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let bits: Vec<BTreeMap<String, u64>> = serde_json::from_str(&text)?;
    Ok(bits
        .into_iter()
        .map(|e| e.into_iter().map(|(k, b)| (k, f64::from_bits(b))).collect())
        .collect())
}

//! Save on 2 ranks, resume on 2 ranks: exact continuation of DDP, ZeRO-3, ZeRO-2 with the
//! optimizer offloaded to the CPU and FSDP full_shard with SHARDED_STATE_DICT, on 127.0.0.1
//! with real processes.
//!
//! The parent launches this binary twice as 2 ranks:
//!
//! 1. every rank trains tiny GPT-2 (dropouts 0) for 6 steps uninterrupted, then, in a second
//!    output folder, the same job stopped by a callback after step 3 (checkpoint-3 saved);
//! 2. fresh processes resume each configuration from that checkpoint-3 to step 6.
//!
//! Each checkpoint holds upstream's generator file of each rank (`rng_state_{rank}.pth`);
//! the DDP run resumes from those, as from a Python checkpoint.
//!
//! The resumed steps 4-6 log exactly (`assert_eq!`, bit for bit) the losses, gradient norms
//! and learning rates of the uninterrupted run, and the same final evaluation loss: the
//! weights (ZeRO-3 / FSDP: from the per-rank shards), the optimizer's per-rank state, the
//! scheduler and the data position are all restored. Then the resumed run's ZeRO-3 and
//! sharded-FSDP checkpoint-6 consolidate (zero_to_fp32) into a `model.safetensors` that
//! Python transformers loads with no missing weights and exactly these values; one process
//! cannot resume the sharded FSDP checkpoint (it holds no full model): a typed error.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use tchtrain_testing::lock;

use anyhow::{Context, Result, bail};
use serde_json::json;
use tch::Tensor;
use tchtrain_callbacks::{TrainerCallback, TrainerControl, TrainerState};
use tchtrain_trainer::{ResumeFrom, Trainer};
use tchtrain_training_args::{
    DictOrPath, IntervalStrategy, SaveStrategy, StrOrBool, TrainingArguments,
};

use crate::common::{
    Log, blocks, initial_model, launch, numbers, rank, read_log, role, small_vocab_initial,
    temp_dir, test_dir, wait_codes, write_log,
};

/// Rows per rank and micro-batch.
const B: usize = 2;
/// Where the interrupted run stops (a save step).
const STOP_AT: i64 = 3;

/// The configurations: (name, DeepSpeed config, FSDP config).
fn configs() -> Vec<(
    &'static str,
    Option<serde_json::Value>,
    Option<serde_json::Value>,
)> {
    let zero3 = json!({
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_optimization": {"stage": 3},
    });
    let full_shard = json!({"reshard_after_forward": true,
        "transformer_layer_cls_to_wrap": ["GPT2Block"],
        "state_dict_type": "SHARDED_STATE_DICT"});
    // ZeRO-2 with the optimizer's masters and state offloaded to the CPU: the resumed
    // masters must come back from the saved shards as well as the shards themselves.
    let mut zero2_offload = zero3.clone();
    zero2_offload["zero_optimization"] =
        json!({"stage": 2, "offload_optimizer": {"device": "cpu"}});
    vec![
        ("ddp", None, None),
        ("zero3", Some(zero3), None),
        ("zero2_offload", Some(zero2_offload), None),
        ("fsdp_full_shard_sharded", None, Some(full_shard)),
    ]
}

/// 32 rows, micro-batches of B rows, accumulation 2, 6 updates, evaluation and a save
/// every 3 steps.
fn job_args(
    output_dir: &Path,
    deepspeed: Option<serde_json::Value>,
    fsdp: Option<serde_json::Value>,
) -> Result<TrainingArguments> {
    let mut args = TrainingArguments {
        per_device_train_batch_size: B,
        per_device_eval_batch_size: B,
        gradient_accumulation_steps: 2,
        max_steps: 6,
        learning_rate: 1e-3,
        warmup_steps: 2.0,
        weight_decay: 0.01,
        max_grad_norm: 1.0,
        logging_steps: 1.0,
        eval_strategy: IntervalStrategy::Steps,
        eval_steps: Some(3.0),
        save_strategy: SaveStrategy::Steps,
        save_steps: 3.0,
        seed: 42,
        use_cpu: true,
        report_to: vec![],
        disable_tqdm: true,
        deepspeed: deepspeed.map(|v| DictOrPath::Dict(v.as_object().cloned().unwrap_or_default())),
        fsdp: fsdp.as_ref().map(|_| StrOrBool::Bool(true)),
        fsdp_config: fsdp.map(|v| DictOrPath::Dict(v.as_object().cloned().unwrap_or_default())),
        ..TrainingArguments::new(output_dir.display().to_string())
    };
    args.post_init()?;
    Ok(args)
}

/// Stops training at the end of step [`STOP_AT`] (after its save), as an interrupted job.
struct StopAfter;

impl TrainerCallback for StopAfter {
    fn on_step_end(
        &mut self,
        _args: &TrainingArguments,
        state: &TrainerState,
        control: &mut TrainerControl,
    ) -> tchtrain_callbacks::Result<()> {
        if state.global_step >= STOP_AT {
            control.should_training_stop = true;
        }
        Ok(())
    }
}

fn trainer(
    output_dir: &Path,
    ds: Option<serde_json::Value>,
    fsdp: Option<serde_json::Value>,
    stop: bool,
) -> Result<Trainer> {
    let mut b = Trainer::builder(initial_model()?, job_args(output_dir, ds, fsdp)?)
        .train_dataset(blocks("train", 32)?)
        .eval_dataset(blocks("eval", 12)?);
    if stop {
        b = b.callback(StopAfter);
    }
    Ok(b.build()?)
}

/// One rank's work in phase `role`.
fn run_rank(role: &str) -> Result<()> {
    let dir = test_dir();
    let r = rank();
    for (name, ds, fsdp) in configs() {
        let runs: Vec<(&str, Trainer, Option<ResumeFrom>)> = match role {
            "first" => vec![
                (
                    "full",
                    trainer(
                        &dir.join(name).join("full"),
                        ds.clone(),
                        fsdp.clone(),
                        false,
                    )?,
                    None,
                ),
                (
                    "part",
                    trainer(&dir.join(name).join("part"), ds, fsdp, true)?,
                    None,
                ),
            ],
            "resume" => {
                let out = dir.join(name).join("part");
                let ckpt = out.join(format!("checkpoint-{STOP_AT}"));
                vec![(
                    "resumed",
                    trainer(&out, ds, fsdp, false)?,
                    Some(ResumeFrom::Path(ckpt)),
                )]
            }
            other => bail!("unknown role {other}"),
        };
        for (run, mut t, resume) in runs {
            t.train(resume)
                .with_context(|| format!("{name} {run} on rank {r}"))?;
            write_log(
                &dir.join(format!("{name}-{run}-rank{r}.json")),
                &numbers(&t.state.log_history),
            )?;
        }
    }
    Ok(())
}

fn step_of(e: &BTreeMap<String, f64>) -> i64 {
    e.get("step").copied().unwrap_or(-1.0) as i64
}

/// The entries of `log` for steps `from..=to` that carry `key`, as (step, value).
fn series(log: &Log, key: &str, from: i64, to: i64) -> Vec<(i64, f64)> {
    log.iter()
        .filter(|e| (from..=to).contains(&step_of(e)))
        .filter_map(|e| Some((step_of(e), *e.get(key)?)))
        .collect()
}

#[test]
fn two_rank_checkpoints_resume_on_two_ranks_exactly() -> Result<()> {
    let _g = lock();
    const TEST: &str = "two_rank_checkpoints_resume_on_two_ranks_exactly";
    if let Some(role) = role() {
        return run_rank(&role);
    }
    let dir = temp_dir("exact");
    let codes = wait_codes(launch(TEST, 2, &dir, "first"), Duration::from_secs(900));
    assert_eq!(codes, [Some(0), Some(0)], "first launch: rank exit codes");
    // Upstream's generator files of a 2-process run: one per rank. The DDP run resumes
    // from them (our `rng_state.safetensors` removed), as from a Python checkpoint.
    for (name, _, _) in configs() {
        let ckpt3 = dir.join(name).join(format!("part/checkpoint-{STOP_AT}"));
        let files: Vec<bool> = ["rng_state.pth", "rng_state_0.pth", "rng_state_1.pth"]
            .iter()
            .map(|f| ckpt3.join(f).is_file())
            .collect();
        assert_eq!(
            files,
            [false, true, true],
            "{name}: upstream's per-rank rng files"
        );
        if name == "ddp" {
            std::fs::remove_file(ckpt3.join(tchtrain_trainer::RNG_GENERATOR_STATE_NAME))?;
        }
    }
    // Fresh processes, fresh process group.
    let codes = wait_codes(launch(TEST, 2, &dir, "resume"), Duration::from_secs(900));
    assert_eq!(codes, [Some(0), Some(0)], "resume launch: rank exit codes");
    let mut python_loads = Vec::new();
    for (name, _, _) in configs() {
        for r in 0..2 {
            let full = read_log(&dir.join(format!("{name}-full-rank{r}.json")))?;
            let part = read_log(&dir.join(format!("{name}-part-rank{r}.json")))?;
            let resumed = read_log(&dir.join(format!("{name}-resumed-rank{r}.json")))?;
            let losses = series(&full, "loss", 4, 6);
            assert_eq!(losses.len(), 3, "{name}: steps 4-6 logged a loss");
            assert_eq!(
                series(&part, "loss", 1, 6),
                series(&full, "loss", 1, 3),
                "{name} rank {r}: the interrupted run stopped after step {STOP_AT}"
            );
            for key in ["loss", "grad_norm", "learning_rate", "eval_loss"] {
                assert_eq!(
                    series(&resumed, key, 4, 6),
                    series(&full, key, 4, 6),
                    "{name} rank {r}: {key} of the resumed steps 4-6 vs the uninterrupted run"
                );
            }
            if r == 0 {
                println!(
                    "{name}: resumed losses of steps 4-6 {losses:?} equal the uninterrupted run's"
                );
            }
        }
        // The interrupted run saved per-rank shards (ZeRO-3, FSDP) at checkpoint-3.
        let ckpt3 = dir.join(name).join(format!("part/checkpoint-{STOP_AT}"));
        assert!(ckpt3.is_dir(), "{name}: {} missing", ckpt3.display());
        if name != "ddp" {
            let shard_dir = tchtrain_deepspeed::find_shard_dir(&ckpt3)?;
            for r in 0..2 {
                let stem = tchtrain_deepspeed::zero_shard_stem(r);
                assert!(
                    shard_dir.join(format!("{stem}.safetensors")).is_file(),
                    "{name}: rank {r}'s shards at checkpoint-3"
                );
            }
            // The resumed run's checkpoint-6 consolidates into a model transformers loads.
            let ckpt6 = dir.join(name).join("part/checkpoint-6");
            let out = dir.join(format!("{name}-consolidated"));
            tchtrain_deepspeed::convert_zero_checkpoint_to_fp32_state_dict(&ckpt6, &out)?;
            std::fs::copy(
                small_vocab_initial().join("config.json"),
                out.join("config.json"),
            )?;
            python_loads.push((out, name));
        }
    }
    load_in_python(&python_loads)?;
    // A SHARDED_STATE_DICT checkpoint holds no full model: one process cannot resume it.
    let ckpt3 = dir.join(format!("fsdp_full_shard_sharded/part/checkpoint-{STOP_AT}"));
    let mut single = trainer(&dir.join("single"), None, None, false)?;
    let err = single
        .train(Some(ResumeFrom::Path(ckpt3.clone())))
        .unwrap_err();
    assert!(
        matches!(&err, tchtrain_trainer::Error::InvalidCheckpoint { dir, detail }
            if *dir == ckpt3 && detail.contains("only as per-rank shards") && detail.contains("zero_to_fp32")),
        "{err}"
    );
    // The Trainer made its output folder, as upstream's does; nothing was written in it.
    assert!(
        std::fs::read_dir(dir.join("single"))?.next().is_none(),
        "nothing was trained or written"
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// transformers (the setup virtualenv's python, `TCHTRAIN_VENV_PYTHON`) loads `dir` with no
/// missing or unexpected weights, and every parameter it loaded equals the consolidated
/// file's tensor of that name exactly (their float64 sums are compared bit for bit).
fn load_in_python(dirs: &[(PathBuf, &str)]) -> Result<()> {
    let python = std::env::var_os("TCHTRAIN_VENV_PYTHON").context(
        "TCHTRAIN_VENV_PYTHON is not set: it names the setup virtualenv's python (with transformers); run `cargo xtask setup` (it writes .cargo/libtorch.toml) or set it by hand",
    )?;
    // One process for every folder: importing transformers is most of a load's time.
    let script = r#"
import json, sys, transformers
for d in sys.argv[1:]:
    m, info = transformers.AutoModelForCausalLM.from_pretrained(d, output_loading_info=True)
    sums = {n: p.detach().double().sum().item() for n, p in m.named_parameters()}
    print(json.dumps({"missing": sorted(info["missing_keys"]), "unexpected": sorted(info["unexpected_keys"]), "sums": sums}))
"#;
    let out = Command::new(&python)
        .args(["-c", script])
        .args(dirs.iter().map(|(d, _)| d))
        .output()
        .with_context(|| format!("running TCHTRAIN_VENV_PYTHON={}", python.to_string_lossy()))?;
    assert!(
        out.status.success(),
        "transformers could not load {:?}: {}",
        dirs.iter().map(|(_, n)| n).collect::<Vec<_>>(),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with('{')).collect();
    assert_eq!(lines.len(), dirs.len(), "one line per folder: {stdout}");
    for ((dir, name), line) in dirs.iter().zip(lines) {
        check_python_load(dir, name, serde_json::from_str(line)?)?;
    }
    Ok(())
}

/// What transformers loaded from `dir` (missing / unexpected keys, each parameter's sum)
/// against the file.
fn check_python_load(dir: &Path, name: &str, v: serde_json::Value) -> Result<()> {
    assert_eq!(
        v["missing"],
        json!([]),
        "{name}: missing keys in transformers"
    );
    assert_eq!(v["unexpected"], json!([]), "{name}: unexpected keys");
    let file: BTreeMap<String, Tensor> =
        tchtrain_models::read_checkpoint(dir)?.into_iter().collect();
    let sums = v["sums"].as_object().context("sums")?;
    assert!(!sums.is_empty());
    let mut compared = 0;
    for (param, sum) in sums {
        // GPT-2's lm_head is tied to wte and not in the file.
        let Some(t) = file.get(param) else {
            continue;
        };
        let ours = t.f_to_kind(tch::Kind::Double)?.f_sum(tch::Kind::Double)?;
        let ours = ours.f_double_value(&[])?;
        let theirs = sum.as_f64().context("a number")?;
        assert!(
            (ours - theirs).abs() <= 1e-9 * ours.abs().max(1.0),
            "{name}: transformers loaded {param} with sum {theirs}, the file has {ours}"
        );
        compared += 1;
    }
    assert_eq!(
        compared,
        file.len(),
        "{name}: every consolidated tensor is a parameter transformers loaded"
    );
    println!(
        "{name}: transformers loaded the consolidated checkpoint-6 ({compared} tensors equal)"
    );
    Ok(())
}

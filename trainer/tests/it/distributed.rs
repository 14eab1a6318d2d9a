//! Data-parallel training on 127.0.0.1 with real processes: each test re-launches this test
//! binary as 2 ranks (torchrun's environment variables, as `cargo xtask launch` sets them)
//! and checks what they wrote.
//!
//! * 2 ranks with `per_device_train_batch_size` B (and 4 ranks with 1 row each) train tiny
//!   GPT-2 (dropouts 0) exactly as one process with the whole batch and the same sample order: the same logged losses, gradient
//!   norms, learning rates, evaluation loss and gathered evaluation predictions (fp32;
//!   only the summation order differs). That needs the gradient average, accelerate's
//!   batch sharding and `average_tokens_across_devices` to be right together.
//! * Rank 0 alone writes checkpoints.
//! * A rank that dies mid-run makes the other fail with the distributed error, well within
//!   `ddp_timeout`, and the last checkpoint stays intact.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tchtrain_testing::lock;

use anyhow::{Context, Result};
use tch::{Device, Kind, Tensor};
use tchtrain_callbacks::{TrainerCallback, TrainerControl, TrainerState};
use tchtrain_trainer::{EvalPrediction, Metrics, Trainer};
use tchtrain_training_args::{IntervalStrategy, SaveStrategy, TrainingArguments};

use crate::common::{
    Log, blocks, initial_model, is_rank, launch, launch_nodes, numbers, rank, read_log, temp_dir,
    test_dir, wait_codes, write_log,
};

/// Rows per rank and micro-batch; the single process uses twice as many.
const B: usize = 2;

/// 32 rows, micro-batches of `batch` rows, accumulation 2, 6 updates (the random sampler
/// reshuffles after 4), evaluation of 12 rows and a save every 3 steps.
fn job_args(output_dir: &Path, batch: usize) -> Result<TrainingArguments> {
    let mut args = TrainingArguments {
        per_device_train_batch_size: batch,
        per_device_eval_batch_size: batch,
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
        include_num_input_tokens_seen: "all".into(),
        seed: 42,
        use_cpu: true,
        report_to: vec![],
        disable_tqdm: true,
        ..TrainingArguments::new(output_dir.display().to_string())
    };
    args.post_init()?;
    Ok(args)
}

/// Trains the job and returns its `log_history` and `is_world_process_zero`.
fn run_job(output_dir: &Path, batch: usize, lora: bool) -> Result<(Log, bool)> {
    let model: Box<dyn tchtrain_models::TrainableModel> = if lora {
        // The same adapter on every rank and in the single process.
        tch::manual_seed(0);
        Box::new(tchtrain_models::get_peft_model(
            initial_model()?,
            tchtrain_models::LoraConfig {
                r: 4,
                lora_alpha: 8.0,
                target_modules: Some(tchtrain_models::TargetModules::Regex("all-linear".into())),
                init_lora_weights: tchtrain_models::InitLoraWeights::Random,
                ..Default::default()
            },
        )?)
    } else {
        initial_model()?
    };
    let mut trainer = Trainer::builder(model, job_args(output_dir, batch)?)
        .train_dataset(blocks("train", 32)?)
        .eval_dataset(blocks("eval", 12)?)
        .preprocess_logits_for_metrics(|logits: &tch::Tensor, _: Option<&tch::Tensor>| {
            Ok(logits.f_argmax(-1, false)?)
        })
        .compute_metrics(Box::new(|p: &EvalPrediction| {
            let labels = p.label_ids.as_ref().expect("labels").array()?;
            let rows = labels.size()[0];
            let len = labels.size()[1];
            let hits = p
                .predictions
                .array()?
                .narrow(1, 0, len - 1)
                .eq_tensor(&labels.narrow(1, 1, len - 1))
                .to_kind(Kind::Float)
                .mean(Kind::Float)
                .double_value(&[]);
            // The rows' order: sum of (row number + 1) * (its first label).
            let weights = Tensor::arange_start(1, rows + 1, (Kind::Int64, Device::Cpu));
            let order = (labels.select(1, 0) * weights)
                .sum(Kind::Int64)
                .int64_value(&[]);
            Ok(Metrics::from([
                ("rows".to_string(), rows as f64),
                ("order".to_string(), order as f64),
                ("accuracy".to_string(), hits),
            ]))
        }))
        .build()?;
    trainer.train(None)?;
    Ok((
        numbers(&trainer.state.log_history),
        trainer.is_world_process_zero(),
    ))
}

fn num(entry: &BTreeMap<String, f64>, key: &str) -> Option<f64> {
    entry.get(key).copied()
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-12)
}

#[test]
fn two_ranks_equal_one_process_with_twice_the_batch() -> Result<()> {
    let _g = lock();
    world_equals_one_process(
        "two_ranks_equal_one_process_with_twice_the_batch",
        2,
        1,
        B,
        false,
    )
}

/// The same job training a LoRA adapter (`all-linear`, the base frozen): DDP reduces the
/// adapter's gradients alone, and rank 0's checkpoints hold the adapter.
#[test]
fn two_ranks_train_a_lora_adapter_as_one_process() -> Result<()> {
    let _g = lock();
    world_equals_one_process(
        "two_ranks_train_a_lora_adapter_as_one_process",
        2,
        1,
        B,
        true,
    )
}

/// Four ranks launched as two nodes of two (the environment `cargo xtask launch --nnodes 2`
/// gives: local ranks 0, 1 on each node, `GROUP_RANK` the node), all on 127.0.0.1.
#[test]
fn two_nodes_of_two_ranks_equal_one_process_with_four_times_the_batch() -> Result<()> {
    let _g = lock();
    world_equals_one_process(
        "two_nodes_of_two_ranks_equal_one_process_with_four_times_the_batch",
        4,
        2,
        1,
        false,
    )
}

/// `world` ranks (on `nodes` nodes) with micro-batches of `per_rank` rows against one
/// process with `world * per_rank`: the same logs (within the stated tolerances), rank 0
/// alone saving.
fn world_equals_one_process(
    test: &str,
    world: i32,
    nodes: i32,
    per_rank: usize,
    lora: bool,
) -> Result<()> {
    if is_rank() {
        let dir = test_dir();
        let r = rank();
        let (history, zero) = run_job(&dir.join(format!("out-rank{r}")), per_rank, lora)?;
        assert_eq!(zero, r == 0, "is_world_process_zero on rank {r}");
        write_log(&dir.join(format!("history-rank{r}.json")), &history)?;
        return Ok(());
    }
    let dir = temp_dir(&format!("parity-{world}-{lora}"));
    let total = world as usize * per_rank;
    let (single, _) = run_job(&dir.join("single"), total, lora)?;
    let codes = wait_codes(
        launch_nodes(test, nodes, world, &dir, "rank"),
        Duration::from_secs(600),
    );
    assert_eq!(codes, vec![Some(0); world as usize], "rank exit codes");
    let logs: Vec<Log> = (0..world)
        .map(|r| read_log(&dir.join(format!("history-rank{r}.json"))))
        .collect::<Result<_>>()?;
    let rank0 = &logs[0];

    // Every rank logs the same all-reduced values (only rank 0's callbacks print them).
    let strip = |h: &Log| -> Log {
        h.iter()
            .map(|e| {
                e.iter()
                    .filter(|(k, _)| !k.contains("runtime") && !k.contains("per_second"))
                    .map(|(k, v)| (k.clone(), *v))
                    .collect()
            })
            .collect()
    };
    for (r, log) in logs.iter().enumerate().skip(1) {
        assert_eq!(strip(rank0), strip(log), "rank 0 and rank {r} logs");
    }

    assert_eq!(rank0.len(), single.len(), "number of log entries");
    let mut worst: std::collections::BTreeMap<&str, f64> = Default::default();
    for (i, (d, s)) in rank0.iter().zip(&single).enumerate() {
        assert_eq!(num(d, "step"), num(s, "step"), "entry {i}: step");
        assert_eq!(num(d, "epoch"), num(s, "epoch"), "entry {i}: epoch");
        for key in [
            "loss",
            "grad_norm",
            "learning_rate",
            "eval_loss",
            "eval_accuracy",
            "train_loss",
            "total_flos",
        ] {
            match (num(d, key), num(s, key)) {
                (Some(a), Some(b)) => {
                    let w = worst.entry(key).or_default();
                    *w = w.max(rel(a, b));
                }
                (None, None) => {}
                (a, b) => panic!("entry {i}: {key} {a:?} ({world} ranks) vs {b:?} (1 process)"),
            }
        }
        // Exact: the gathered evaluation has every row once, in the dataset's order, and
        // the token counts are all-reduced integers.
        for key in ["eval_rows", "eval_order", "num_input_tokens_seen"] {
            assert_eq!(num(d, key), num(s, key), "entry {i}: {key}");
        }
    }
    println!(
        "{world} ranks x batch {per_rank} vs 1 process x batch {total}: max relative differences {worst:?}"
    );
    let evals: Vec<f64> = single.iter().filter_map(|e| num(e, "eval_rows")).collect();
    assert_eq!(evals, [12.0, 12.0], "two evaluations of every row");
    // fp32 on CPU: the ranks sum partial batches and add them up (the all-reduce), the single
    // process sums the whole batch, so results differ in the last bits, carried through 6
    // AdamW steps. Token-level argmax agreement may flip on a near-tie: at most 1 of 756.
    assert!(worst["loss"] < 1e-5, "loss {worst:?}");
    assert!(worst["train_loss"] < 1e-5, "train_loss {worst:?}");
    assert!(worst["eval_loss"] < 1e-5, "eval_loss {worst:?}");
    assert!(worst["grad_norm"] < 1e-4, "grad_norm {worst:?}");
    assert!(worst["learning_rate"] < 1e-12, "learning_rate {worst:?}");
    assert!(
        worst["eval_accuracy"] <= 1.5 / 756.0,
        "eval_accuracy {worst:?}"
    );
    // The ranks sum their flos as float32 (upstream's distributed_broadcast_scalars).
    assert!(worst["total_flos"] < 1e-6, "total_flos {worst:?}");

    // Rank 0 alone wrote checkpoints; the other ranks' output_dir was never created.
    for step in [3, 6] {
        let ckpt = dir.join(format!("out-rank0/checkpoint-{step}"));
        let weights = if lora {
            "adapter_model.safetensors"
        } else {
            "model.safetensors"
        };
        for file in [weights, "trainer_state.json", "optimizer.safetensors"] {
            assert!(ckpt.join(file).is_file(), "{} lacks {file}", ckpt.display());
        }
    }
    for r in 1..world {
        assert!(
            !dir.join(format!("out-rank{r}")).exists(),
            "rank {r} wrote into its output_dir"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// `eval_do_concat_batches=false` on 2 ranks: `predict` keeps one tensor per global step,
/// each gathered on its own (rank 0's rows then rank 1's), the last cut to the dataset's
/// 10 rows, exactly as one process with twice the batch keeps them.
#[test]
fn unconcatenated_batches_are_gathered_step_by_step() -> Result<()> {
    let _g = lock();
    let label_batches = |output_dir: &Path, batch: usize| -> Result<Vec<Vec<i64>>> {
        let mut args = job_args(output_dir, batch)?;
        args.eval_do_concat_batches = false;
        let mut trainer = Trainer::builder(initial_model()?, args)
            .preprocess_logits_for_metrics(|logits: &Tensor, _: Option<&Tensor>| {
                Ok(logits.f_argmax(-1, false)?)
            })
            .build()?;
        let out = trainer.predict(blocks("eval", 10)?, "test")?;
        let predictions = out.predictions.context("predictions")?;
        let labels = out.label_ids.context("labels")?;
        let shapes: Vec<Vec<i64>> = predictions.batches().iter().map(|t| t.size()).collect();
        assert_eq!(
            shapes,
            labels
                .batches()
                .iter()
                .map(|t| t.size())
                .collect::<Vec<_>>()
        );
        labels
            .batches()
            .iter()
            .map(|t| Ok(Vec::<i64>::try_from(t.f_select(1, 0)?)?))
            .collect()
    };
    if is_rank() {
        let got = label_batches(&test_dir().join("out"), B)?;
        if rank() == 0 {
            std::fs::write(
                test_dir().join("batches.json"),
                serde_json::to_string(&got)?,
            )?;
        }
        return Ok(());
    }
    let dir = temp_dir("unconcatenated");
    let single = label_batches(&dir.join("single"), 2 * B)?;
    assert_eq!(
        single.iter().map(Vec::len).collect::<Vec<_>>(),
        [4, 4, 2],
        "one process: 10 rows in batches of 4"
    );
    let codes = wait_codes(
        launch(
            "unconcatenated_batches_are_gathered_step_by_step",
            2,
            &dir,
            "rank",
        ),
        Duration::from_secs(300),
    );
    assert_eq!(codes, vec![Some(0); 2], "rank exit codes");
    let text = std::fs::read_to_string(dir.join("batches.json"))?;
    let ranks: Vec<Vec<i64>> = serde_json::from_str(&text)?;
    assert_eq!(ranks, single, "2 ranks x 2 rows vs 1 process x 4 rows");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Rank 1 exits when step 2 begins (after checkpoint-1 was written), as a crashed rank.
struct DieAtStep2 {
    began: Arc<Mutex<Option<Instant>>>,
}

impl TrainerCallback for DieAtStep2 {
    fn on_step_begin(
        &mut self,
        _args: &TrainingArguments,
        state: &TrainerState,
        _control: &mut TrainerControl,
    ) -> tchtrain_callbacks::Result<()> {
        if state.global_step == 1 {
            if rank() == 1 {
                std::process::exit(17);
            }
            *self.began.lock().unwrap() = Some(Instant::now());
        }
        Ok(())
    }
}

#[test]
fn a_dead_rank_makes_the_other_fail_within_ddp_timeout() -> Result<()> {
    let _g = lock();
    const TIMEOUT_S: i64 = 5;
    if is_rank() {
        let out = test_dir().join("out");
        let mut args = job_args(&out, B)?;
        args.ddp_timeout = TIMEOUT_S;
        args.save_steps = 1.0;
        args.eval_strategy = IntervalStrategy::No;
        let began = Arc::new(Mutex::new(None));
        let mut trainer = Trainer::builder(initial_model()?, args)
            .train_dataset(blocks("train", 32)?)
            .callback(DieAtStep2 {
                began: Arc::clone(&began),
            })
            .build()?;
        let err = trainer.train(None).unwrap_err();
        let waited = began.lock().unwrap().context("step 2 began")?.elapsed();
        std::fs::write(test_dir().join("error.txt"), format!("{err}\n{waited:?}"))?;
        assert!(
            matches!(
                err,
                tchtrain_trainer::Error::Distributed(tchtrain_distributed::Error::Collective {
                    rank: 0,
                    ..
                })
            ),
            "{err:?}"
        );
        // A dead peer is noticed when its socket closes (or at the latest when the timeout
        // elapses); the bound is twice the timeout to leave room for a loaded machine.
        assert!(
            waited < Duration::from_secs(2 * TIMEOUT_S as u64),
            "rank 0 noticed after {waited:?}"
        );
        return Ok(());
    }
    let dir = temp_dir("dead-rank");
    let codes = wait_codes(
        launch(
            "a_dead_rank_makes_the_other_fail_within_ddp_timeout",
            2,
            &dir,
            "rank",
        ),
        Duration::from_secs(300),
    );
    assert_eq!(
        codes,
        [Some(0), Some(17)],
        "rank exit codes (rank 0 asserts its error)"
    );
    let report = std::fs::read_to_string(dir.join("error.txt"))?;
    println!("rank 0: {report}");
    assert!(
        report.starts_with("distributed training: rank 0:"),
        "{report}"
    );
    // The checkpoint written before the death is complete; nothing half-written is left.
    let ckpt = dir.join("out/checkpoint-1");
    for file in [
        "model.safetensors",
        "config.json",
        "trainer_state.json",
        "optimizer.safetensors",
    ] {
        assert!(ckpt.join(file).is_file(), "checkpoint-1 lacks {file}");
    }
    let mut names: Vec<String> = std::fs::read_dir(dir.join("out"))?
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["checkpoint-1"]);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

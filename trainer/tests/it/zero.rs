//! ZeRO stages 1/2/3 and FSDP (full_shard, shard_grad_op) on 127.0.0.1 with real
//! processes: the test re-launches this binary as 2 ranks, each of which trains tiny GPT-2
//! (dropouts 0) under DDP and then under every sharded configuration, one after the other
//! on the same process group and output folder (as launched jobs do), writing its logs,
//! memory figures and checkpoints.
//!
//! * Every sharded run logs the losses, gradient norms and learning rates of the DDP run
//!   (the gradients are the same averages; only the global norm is summed in a different
//!   order: squared shard norms all-reduced instead of torch's norm of per-tensor norms).
//! * Optimizer state per rank is half of DDP's (plus padding); ZeRO-2/3 keep half the
//!   gradients after the reduction; ZeRO-3 and full_shard hold half the parameters between
//!   steps.
//! * The per-rank shards consolidate (zero_to_fp32) into a model.safetensors equal to the
//!   DDP run's within fp32 rounding, loadable by `tchtrain_models`.
//! * ZeRO-3 and full_shard (one unit per GPT2Block) gather layer by layer during a training
//!   step: the step's peak of parameters is the shards, the root unit and one layer.
//! * A DeepSpeed config that conflicts with the arguments fails with upstream's message
//!   before the first step.
//! * A rank that dies inside a layer-by-layer step (before its forward, or between its
//!   forward and backward) makes the other return the engine's collective error (from the
//!   layer hook, or from the gradient boundary's action inside the backward).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use tchtrain_testing::lock;

use anyhow::{Context, Result};
use serde_json::json;
use tch::{Device, Tensor};
use tchtrain_models::{AutoTask, LoadOptions, from_pretrained_dir};
use tchtrain_trainer::{Trainer, named_parameters};
use tchtrain_training_args::{
    DictOrPath, IntervalStrategy, SaveStrategy, StrOrBool, TrainingArguments,
};

use crate::common::{
    Log, blocks, initial_model, is_rank, launch, numbers, rank, read_log, role,
    small_vocab_initial, temp_dir, test_dir, wait_codes, write_log,
};

/// Rows per rank and micro-batch; the single process uses twice as many.
const B: usize = 2;

/// The configurations each rank trains, in order: (name, DeepSpeed config, FSDP config).
fn configs() -> Vec<(
    &'static str,
    Option<serde_json::Value>,
    Option<serde_json::Value>,
)> {
    let ds = |stage: i64| {
        json!({
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "train_batch_size": "auto",
            "gradient_clipping": "auto",
            "zero_optimization": {"stage": stage, "reduce_bucket_size": "auto",
                "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"},
        })
        // No `optimizer` section: the Trainer's AdamW (decay / no-decay groups) and linear
        // schedule run under ZeRO, as upstream does without one, so every number equals
        // the DDP run's. With the section DeepSpeed's own optimizer and scheduler stepping
        // take over (`deepspeed_configs.rs`).
    };
    // DeepSpeed's `offload_optimizer` to the CPU (master shards and optimizer state there)
    // and, at stage 3, `offload_param` (the parameter shards there), as the documentation's
    // ZeRO-2 / ZeRO-3 examples.
    let offloaded = |stage: i64| {
        let mut v = ds(stage);
        v["zero_optimization"]["offload_optimizer"] = json!({"device": "cpu", "pin_memory": true});
        if stage == 3 {
            v["zero_optimization"]["offload_param"] = json!({"device": "cpu", "pin_memory": true});
        }
        v
    };
    // `overlap_comm` (as the documentation's configs set it): the stage-2 reduction during
    // the backward; zero1 and zero2_offload keep DeepSpeed's default below stage 3, after it.
    let overlapped = |stage: i64| {
        let mut v = ds(stage);
        v["zero_optimization"]["overlap_comm"] = json!(true);
        v
    };
    vec![
        ("ddp", None, None),
        ("zero1", Some(ds(1)), None),
        ("zero2", Some(overlapped(2)), None),
        ("zero3", Some(ds(3)), None),
        ("zero2_offload", Some(offloaded(2)), None),
        ("zero3_offload", Some(offloaded(3)), None),
        (
            "fsdp_full_shard",
            None,
            Some(
                json!({"reshard_after_forward": true, "transformer_layer_cls_to_wrap": ["GPT2Block"],
                "state_dict_type": "SHARDED_STATE_DICT"}),
            ),
        ),
        (
            "fsdp_shard_grad_op",
            None,
            Some(json!({"reshard_after_forward": false})),
        ),
        (
            "fsdp_full_shard_offload",
            None,
            Some(
                json!({"reshard_after_forward": true, "transformer_layer_cls_to_wrap": ["GPT2Block"],
                "state_dict_type": "SHARDED_STATE_DICT", "cpu_offload": true}),
            ),
        ),
        // Activation checkpointing: `--activation_checkpointing` under ZeRO-3 layer by
        // layer, and FSDP's own `fsdp_config['activation_checkpointing']`.
        ("zero3_ac", Some(ds(3)), None),
        (
            "fsdp_full_shard_ac",
            None,
            Some(
                json!({"reshard_after_forward": true, "transformer_layer_cls_to_wrap": ["GPT2Block"],
                "state_dict_type": "SHARDED_STATE_DICT", "activation_checkpointing": true}),
            ),
        ),
    ]
}

/// 32 rows, micro-batches of `batch` rows, accumulation 2, 6 updates, evaluation of 12
/// rows and a save every 3 steps.
fn job_args(
    output_dir: &Path,
    batch: usize,
    deepspeed: Option<serde_json::Value>,
    fsdp: Option<serde_json::Value>,
) -> Result<TrainingArguments> {
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

/// What one rank measured in one run.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Figures {
    optimizer_state_bytes: usize,
    model_param_bytes: usize,
    step_end_param_bytes: usize,
    step_end_grad_bytes: usize,
    step_end_offload_bytes: usize,
    peak_param_bytes: usize,
    peak_unit_param_bytes: usize,
    /// Bytes of the parameters outside the decoder layers (embeddings, final norm).
    root_param_bytes: usize,
    /// Bytes of the largest decoder layer.
    layer_param_bytes: usize,
    zero_stage: Option<i64>,
    /// The buckets of the reduction overlapped with the backward (stages 1 and 2).
    reduce_buckets: Option<usize>,
}

/// Trains one configuration; returns its log and this rank's memory figures.
fn run_job(
    output_dir: &Path,
    name: &str,
    batch: usize,
    ds: Option<serde_json::Value>,
    fsdp: Option<serde_json::Value>,
) -> Result<(Log, Figures)> {
    let mut args = job_args(output_dir, batch, ds, fsdp)?;
    args.activation_checkpointing = name == "zero3_ac";
    // `lora_*` jobs train an all-linear LoRA adapter (the same draws on every rank).
    let model: Box<dyn tchtrain_models::TrainableModel> = if name.starts_with("lora_") {
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
    let mut trainer = Trainer::builder(model, args)
        .train_dataset(blocks("train", 32)?)
        .eval_dataset(blocks("eval", 12)?)
        .build()?;
    trainer
        .train(None)
        .with_context(|| format!("training {name}"))?;
    let mem = trainer.sharded_memory().unwrap_or_default();
    let named = named_parameters(trainer.model());
    let model_param_bytes = named.iter().map(|(_, t)| t.numel() * 4).sum();
    let layer_bytes = |i: usize| -> usize {
        let prefix = format!("transformer.h.{i}.");
        named
            .iter()
            .filter(|(n, _)| n.starts_with(&prefix))
            .map(|(_, t)| t.numel() * 4)
            .sum()
    };
    let layers: Vec<usize> = (0..).map(layer_bytes).take_while(|&b| b > 0).collect();
    let root_param_bytes = model_param_bytes - layers.iter().sum::<usize>();
    let figures = Figures {
        optimizer_state_bytes: trainer.optimizer_state_bytes(),
        model_param_bytes,
        step_end_param_bytes: mem.step_end_param_bytes,
        step_end_grad_bytes: mem.step_end_grad_bytes,
        step_end_offload_bytes: mem.step_end_offload_bytes,
        peak_param_bytes: mem.peak_param_bytes,
        peak_unit_param_bytes: mem.peak_unit_param_bytes,
        root_param_bytes,
        layer_param_bytes: layers.iter().copied().max().unwrap_or(0),
        zero_stage: trainer.zero_stage(),
        reduce_buckets: trainer.zero_reduce_buckets(),
    };
    Ok((numbers(&trainer.state.log_history), figures))
}

/// [`run_job`] in `dir/name` with micro-batches of `batch` rows, its log and figures written
/// to `dir/{name}-history{suffix}.json` and `dir/{name}-figures{suffix}.json`.
fn run_and_record(
    dir: &Path,
    name: &str,
    suffix: &str,
    batch: usize,
    ds: Option<serde_json::Value>,
    fsdp: Option<serde_json::Value>,
) -> Result<()> {
    let (history, figures) = run_job(&dir.join(name), name, batch, ds, fsdp)?;
    write_log(&dir.join(format!("{name}-history{suffix}.json")), &history)?;
    std::fs::write(
        dir.join(format!("{name}-figures{suffix}.json")),
        serde_json::to_string(&figures)?,
    )?;
    Ok(())
}

/// The DeepSpeed config of the configuration `name` in [`configs`].
fn deepspeed_config(name: &str) -> Result<serde_json::Value> {
    configs()
        .into_iter()
        .find(|(n, _, _)| *n == name)
        .and_then(|(_, ds, _)| ds)
        .with_context(|| format!("no DeepSpeed configuration `{name}`"))
}

fn num(entry: &BTreeMap<String, f64>, key: &str) -> Option<f64> {
    entry.get(key).copied()
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-12)
}

fn read_figures(path: &Path) -> Result<Figures> {
    Ok(serde_json::from_str(&std::fs::read_to_string(path)?)?)
}

fn max_abs_diff(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> Result<f64> {
    let b: BTreeMap<&str, &Tensor> = b.iter().map(|(k, t)| (k.as_str(), t)).collect();
    let mut worst = 0.0f64;
    assert_eq!(a.len(), b.len(), "tensor count");
    for (k, t) in a {
        let u = b.get(k.as_str()).with_context(|| format!("{k} missing"))?;
        assert_eq!(t.size(), u.size(), "{k} shape");
        worst = worst.max(t.f_sub(u)?.abs().max().double_value(&[]));
    }
    Ok(worst)
}

#[test]
fn zero_and_fsdp_runs_equal_ddp_with_sharded_memory() -> Result<()> {
    let _g = lock();
    if is_rank() {
        let dir = test_dir();
        let r = rank();
        for (name, ds, fsdp) in configs() {
            run_and_record(&dir, name, &format!("-rank{r}"), B, ds, fsdp)?;
        }
        return Ok(());
    }
    let dir = temp_dir("parity");
    let codes = wait_codes(
        launch(
            "zero_and_fsdp_runs_equal_ddp_with_sharded_memory",
            2,
            &dir,
            "rank",
        ),
        Duration::from_secs(900),
    );
    assert_eq!(codes, [Some(0), Some(0)], "rank exit codes");
    let ddp = read_log(&dir.join("ddp-history-rank0.json"))?;
    let ddp_fig = read_figures(&dir.join("ddp-figures-rank0.json"))?;
    assert!(
        ddp.iter().filter(|e| e.contains_key("loss")).count() == 6,
        "6 logged steps"
    );
    let full_params = ddp_fig.model_param_bytes as f64;
    let ddp_state = ddp_fig.optimizer_state_bytes as f64;
    assert!(ddp_state > 0.0);
    let ddp_model = tchtrain_models::read_checkpoint(&dir.join("ddp/checkpoint-6"))?;
    // Activation checkpointing changes no number: the same logs as without, to the bit.
    for (ac, base) in [
        ("zero3_ac", "zero3"),
        ("fsdp_full_shard_ac", "fsdp_full_shard"),
    ] {
        for r in 0..2 {
            let with = read_log(&dir.join(format!("{ac}-history-rank{r}.json")))?;
            let without = read_log(&dir.join(format!("{base}-history-rank{r}.json")))?;
            let numbers = |l: &Log| -> Vec<Vec<Option<u64>>> {
                l.iter()
                    .map(|e| {
                        ["step", "loss", "grad_norm", "learning_rate", "eval_loss"]
                            .iter()
                            .map(|k| num(e, k).map(f64::to_bits))
                            .collect()
                    })
                    .collect()
            };
            assert_eq!(numbers(&with), numbers(&without), "{ac} vs {base} rank {r}");
        }
    }
    // Padding: fewer than `world` elements per flat buffer (at most 2 groups x 3 units).
    let slack = 64.0 * 4.0;
    let mut python_loads = Vec::new();
    for (name, _, _) in configs().into_iter().skip(1) {
        for r in 0..2 {
            let log = read_log(&dir.join(format!("{name}-history-rank{r}.json")))?;
            assert_eq!(log.len(), ddp.len(), "{name}: number of log entries");
            let mut worst: BTreeMap<&str, f64> = BTreeMap::new();
            for (i, (z, d)) in log.iter().zip(&ddp).enumerate() {
                assert_eq!(num(z, "step"), num(d, "step"), "{name} entry {i}: step");
                for key in [
                    "loss",
                    "grad_norm",
                    "learning_rate",
                    "eval_loss",
                    "train_loss",
                ] {
                    match (num(z, key), num(d, key)) {
                        (Some(a), Some(b)) => {
                            let w = worst.entry(key).or_default();
                            *w = w.max(rel(a, b));
                        }
                        (None, None) => {}
                        (a, b) => panic!("{name} entry {i}: {key} {a:?} vs DDP {b:?}"),
                    }
                }
            }
            if r == 0 {
                println!("{name} vs DDP (2 ranks): max relative differences {worst:?}");
            }
            // fp32: the same averaged gradients; the global norm is summed differently
            // (squared shard norms accumulated in float64 and all-reduced, against torch's
            // float32 norm of per-tensor norms), which moves the clipping coefficient and so
            // the AdamW updates in the last bits; the gradient norm, a sum over the model's
            // elements, amplifies that over 6 steps (the DDP test's 1-vs-2-process bound).
            assert!(worst["loss"] < 1e-5, "{name} loss {worst:?}");
            assert!(worst["eval_loss"] < 1e-5, "{name} eval_loss {worst:?}");
            assert!(worst["train_loss"] < 1e-5, "{name} train_loss {worst:?}");
            assert!(worst["grad_norm"] < 5e-4, "{name} grad_norm {worst:?}");
            let first = |l: &Log| l.iter().find_map(|e| num(e, "grad_norm"));
            let step1 = rel(
                first(&log).context("grad_norm")?,
                first(&ddp).context("grad_norm")?,
            );
            assert!(
                step1 < 1e-5,
                "{name}: step-1 grad_norm differs by {step1} (same parameters, same gradients)"
            );
            assert!(
                worst["learning_rate"] < 1e-12,
                "{name} learning_rate {worst:?}"
            );

            let f = read_figures(&dir.join(format!("{name}-figures-rank{r}.json")))?;
            if r == 0 {
                println!(
                    "{name} rank 0: optimizer state {} B (DDP {}), params held at step end {} B, peak {} B (full {}), grads at step end {} B",
                    f.optimizer_state_bytes,
                    ddp_fig.optimizer_state_bytes,
                    f.step_end_param_bytes,
                    f.peak_param_bytes,
                    ddp_fig.model_param_bytes,
                    f.step_end_grad_bytes
                );
            }
            let state = f.optimizer_state_bytes as f64;
            assert!(
                (state - ddp_state / 2.0).abs() <= 2.0 * slack,
                "{name} rank {r}: optimizer state {state} vs DDP {ddp_state} / 2"
            );
            let stage = f.zero_stage.context("a sharded run")?;
            // With `overlap_comm` stages 1 and 2 reduce during the backward: DeepSpeed's
            // `reduce_bucket_size` ("auto": hidden_size², far under the model) makes many
            // buckets; FSDP's SHARD_GRAD_OP takes DDP's 25 MiB, one bucket for this model.
            // Without it (DeepSpeed's default below stage 3) after the backward, as at stage 3.
            let want = match stage {
                3 => "none",
                _ if name.starts_with("fsdp") => "one",
                _ if name == "zero2" => "many",
                _ => "none",
            };
            let got = match f.reduce_buckets {
                None => "none",
                Some(1) => "one",
                Some(_) => "many",
            };
            assert_eq!(
                got, want,
                "{name} rank {r}: overlapped buckets {:?}",
                f.reduce_buckets
            );
            let shard = full_params / 2.0;
            let params = f.step_end_param_bytes as f64;
            let grads = f.step_end_grad_bytes as f64;
            // offload_param: the shards live on the offload device, not the model's.
            let param_offload = stage == 3 && name.ends_with("_offload");
            let device_shard = if param_offload { 0.0 } else { shard };
            if stage == 3 {
                assert!(
                    (params - device_shard).abs() <= slack,
                    "{name} rank {r}: params {params} vs {device_shard}"
                );
                // Layer by layer (every stage-3 configuration wraps each GPT2Block): during a
                // training step a rank holds its shards, the root unit and one layer.
                let unit_peak = f.peak_unit_param_bytes as f64;
                let bound = device_shard + (f.root_param_bytes + f.layer_param_bytes) as f64;
                if r == 0 {
                    println!(
                        "{name} rank 0: layer-by-layer step peak {unit_peak} B (shards on the device {device_shard} + root {} + one layer {} = {bound}; all gathered: {})",
                        f.root_param_bytes,
                        f.layer_param_bytes,
                        shard + full_params
                    );
                }
                assert!(
                    unit_peak > device_shard && unit_peak <= bound + slack,
                    "{name} rank {r}: step peak {unit_peak} vs at most {bound}"
                );
            } else {
                assert!(
                    (params - full_params - shard).abs() <= slack,
                    "{name} rank {r}: params {params}"
                );
            }
            let offload = f.step_end_offload_bytes as f64;
            if let Some(base) = name.strip_suffix("_offload") {
                // The same updates as without offload, to the bit: the masters are copies
                // stepped by the same optimizer, copied back after each step.
                let plain = read_log(&dir.join(format!("{base}-history-rank{r}.json")))?;
                let trained = |l: &Log| -> Vec<Vec<Option<f64>>> {
                    l.iter()
                        .map(|e| {
                            [
                                "step",
                                "loss",
                                "grad_norm",
                                "learning_rate",
                                "eval_loss",
                                "train_loss",
                            ]
                            .iter()
                            .map(|k| num(e, k))
                            .collect()
                        })
                        .collect()
                };
                assert_eq!(
                    trained(&log),
                    trained(&plain),
                    "{name} vs {base}: the logged numbers"
                );
                // Masters and their gradients (and with offload_param the shards) on the
                // offload device; no gradients on the model's.
                // ZeRO-3 offloads both: shards, masters, masters' gradients. FSDP's
                // cpu_offload (full_shard) and ZeRO-2's offload_optimizer keep two copies:
                // the shards and their gradients, or the masters and theirs.
                let copies = if name == "zero3_offload" { 3.0 } else { 2.0 };
                if r == 0 {
                    println!(
                        "{name} rank 0: offloaded {offload} B ({copies} x shard {shard} B), params on the model's device at step end {params} B, grads {grads} B"
                    );
                }
                assert!(
                    (offload - copies * shard).abs() <= 3.0 * slack,
                    "{name} rank {r}: offloaded {offload} vs {copies} x {shard}"
                );
                assert_eq!(grads, 0.0, "{name} rank {r}: gradients left on the device");
            } else if stage >= 2 {
                assert_eq!(offload, 0.0, "{name} rank {r}: offloaded without offload");
                assert!(
                    (grads - shard).abs() <= slack,
                    "{name} rank {r}: grads {grads} vs {shard}"
                );
            } else {
                assert!(
                    (grads - full_params - shard).abs() <= slack,
                    "{name} rank {r}: grads {grads}"
                );
            }
        }
        // Checkpoints: per-rank shards, consolidated equal to DDP's model.
        let ckpt = dir.join(format!("{name}/checkpoint-6"));
        let shard_dir = tchtrain_deepspeed::find_shard_dir(&ckpt)?;
        for r in 0..2 {
            let stem = tchtrain_deepspeed::zero_shard_stem(r);
            assert!(
                shard_dir.join(format!("{stem}.safetensors")).is_file(),
                "{name}: rank {r} shards"
            );
        }
        let out = dir.join(format!("{name}-consolidated"));
        tchtrain_deepspeed::convert_zero_checkpoint_to_fp32_state_dict(&ckpt, &out)?;
        let consolidated = tchtrain_models::read_checkpoint(&out)?;
        let diff = max_abs_diff(&consolidated, &ddp_model)?;
        println!(
            "{name}: consolidated checkpoint-6 vs DDP's model.safetensors: max abs diff {diff:e}"
        );
        assert!(
            diff < 1e-5,
            "{name}: consolidated weights differ from DDP's by {diff}"
        );
        if name.starts_with("fsdp_full_shard") {
            assert!(
                !ckpt.join("model.safetensors").exists(),
                "SHARDED_STATE_DICT writes no full model"
            );
        } else {
            let rank0_model = tchtrain_models::read_checkpoint(&ckpt)?;
            assert_eq!(
                max_abs_diff(&consolidated, &rank0_model)?,
                0.0,
                "{name}: rank 0's model.safetensors"
            );
        }
        std::fs::copy(
            small_vocab_initial().join("config.json"),
            out.join("config.json"),
        )?;
        let loaded = from_pretrained_dir(
            &out,
            AutoTask::CausalLm,
            Device::Cpu,
            &LoadOptions::default(),
        )?;
        assert!(
            loaded.info.missing_keys.is_empty(),
            "{name}: {:?}",
            loaded.info.missing_keys
        );
        python_loads.push((out, name));
    }
    maybe_load_in_python(&python_loads)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// 4 ranks with 1 row each (the 2-rank runs' global batch): ZeRO-3, layer by layer, trains
/// as DDP on the same 4 ranks, each rank holding a quarter of the parameters and of the
/// optimizer state (flat buffers padded to a multiple of 4), and its checkpoint consolidates
/// to DDP's weights; rank 0's `model.safetensors`, gathered unit by unit, equals the
/// consolidation of the 4 shard files exactly.
#[test]
fn zero3_on_four_ranks_equals_ddp_with_a_quarter_of_the_memory() -> Result<()> {
    let _g = lock();
    const TEST: &str = "zero3_on_four_ranks_equals_ddp_with_a_quarter_of_the_memory";
    const WORLD: usize = 4;
    if is_rank() {
        let dir = test_dir();
        let suffix = format!("-rank{}", rank());
        run_and_record(&dir, "ddp", &suffix, 1, None, None)?;
        run_and_record(
            &dir,
            "zero3",
            &suffix,
            1,
            Some(deepspeed_config("zero3")?),
            None,
        )?;
        return Ok(());
    }
    let dir = temp_dir("zero3-four");
    let codes = wait_codes(
        launch(TEST, WORLD as i32, &dir, "rank"),
        Duration::from_secs(900),
    );
    assert_eq!(codes, vec![Some(0); WORLD], "rank exit codes");
    let ddp = read_log(&dir.join("ddp-history-rank0.json"))?;
    let ddp_fig = read_figures(&dir.join("ddp-figures-rank0.json"))?;
    let full_params = ddp_fig.model_param_bytes as f64;
    let ddp_state = ddp_fig.optimizer_state_bytes as f64;
    // Padding: fewer than 4 elements per flat buffer (2 groups x 3 units).
    let slack = 6.0 * 3.0 * 4.0;
    let mut worst: BTreeMap<&str, f64> = BTreeMap::new();
    for r in 0..WORLD {
        let log = read_log(&dir.join(format!("zero3-history-rank{r}.json")))?;
        assert_eq!(log.len(), ddp.len(), "rank {r}: number of log entries");
        for (z, d) in log.iter().zip(&ddp) {
            for key in ["loss", "grad_norm", "learning_rate", "eval_loss"] {
                match (num(z, key), num(d, key)) {
                    (Some(a), Some(b)) => {
                        let w = worst.entry(key).or_default();
                        *w = w.max(rel(a, b));
                    }
                    (None, None) => {}
                    (a, b) => panic!("rank {r}: {key} {a:?} vs DDP {b:?}"),
                }
            }
        }
        let f = read_figures(&dir.join(format!("zero3-figures-rank{r}.json")))?;
        let (state, params) = (
            f.optimizer_state_bytes as f64,
            f.step_end_param_bytes as f64,
        );
        if r == 0 {
            println!(
                "zero3 on 4 ranks, rank 0: optimizer state {state} B (DDP {ddp_state}), params held at step end {params} B (full {full_params}), layer-by-layer step peak {} B",
                f.peak_unit_param_bytes
            );
        }
        assert!(
            (state - ddp_state / 4.0).abs() <= 2.0 * slack,
            "rank {r}: optimizer state {state} vs DDP {ddp_state} / 4"
        );
        assert!(
            (params - full_params / 4.0).abs() <= slack,
            "rank {r}: params {params} vs {full_params} / 4"
        );
    }
    println!("zero3 vs DDP (4 ranks): max relative differences {worst:?}");
    // The 2-rank comparison's bounds (see zero_and_fsdp_runs_equal_ddp_with_sharded_memory).
    assert!(worst["loss"] < 1e-5, "loss {worst:?}");
    assert!(worst["eval_loss"] < 1e-5, "eval_loss {worst:?}");
    assert!(worst["grad_norm"] < 5e-4, "grad_norm {worst:?}");
    assert!(worst["learning_rate"] < 1e-12, "learning_rate {worst:?}");
    let ckpt = dir.join("zero3/checkpoint-6");
    let out = dir.join("zero3-consolidated");
    tchtrain_deepspeed::convert_zero_checkpoint_to_fp32_state_dict(&ckpt, &out)?;
    let consolidated = tchtrain_models::read_checkpoint(&out)?;
    let ddp_model = tchtrain_models::read_checkpoint(&dir.join("ddp/checkpoint-6"))?;
    let diff = max_abs_diff(&consolidated, &ddp_model)?;
    println!("zero3 (4 ranks): consolidated checkpoint-6 vs DDP's: max abs diff {diff:e}");
    assert!(
        diff < 1e-5,
        "consolidated weights differ from DDP's by {diff}"
    );
    let rank0_model = tchtrain_models::read_checkpoint(&ckpt)?;
    assert_eq!(
        max_abs_diff(&consolidated, &rank0_model)?,
        0.0,
        "rank 0's model.safetensors"
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// With `TCHTRAIN_VENV_PYTHON` set, transformers loads each consolidated folder.
fn maybe_load_in_python(dirs: &[(PathBuf, &str)]) -> Result<()> {
    let Some(python) = std::env::var_os("TCHTRAIN_VENV_PYTHON") else {
        return Ok(());
    };
    // One process for every folder: importing transformers is most of a load's time.
    let script = "import sys, transformers\nfor d in sys.argv[1:]: m = transformers.AutoModelForCausalLM.from_pretrained(d); print(sum(p.numel() for p in m.parameters()))";
    let out = Command::new(python)
        .args(["-c", script])
        .args(dirs.iter().map(|(d, _)| d))
        .output()?;
    assert!(
        out.status.success(),
        "transformers could not load {:?}: {}",
        dirs.iter().map(|(_, n)| n).collect::<Vec<_>>(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[test]
fn a_conflicting_deepspeed_config_fails_before_training_with_upstreams_message() -> Result<()> {
    let _g = lock();
    let dir = temp_dir("mismatch");
    let ds = json!({
        "train_micro_batch_size_per_gpu": 3,
        "gradient_clipping": 0.5,
        "zero_optimization": {"stage": 2},
    });
    let mut trainer = Trainer::builder(
        initial_model()?,
        job_args(&dir.join("out"), B, Some(ds), None)?,
    )
    .train_dataset(blocks("train", 32)?)
    .eval_dataset(blocks("eval", 12)?)
    .build()?;
    let err = trainer.train(None).unwrap_err().to_string();
    assert_eq!(
        err,
        "deepspeed: Please correct the following DeepSpeed config values that mismatch TrainingArguments values:\n\
         - ds train_micro_batch_size_per_gpu=3 vs hf per_device_train_batch_size=2\n\
         - ds gradient_clipping=0.5 vs hf max_grad_norm=1.0\n\
         The easiest method is to set these DeepSpeed config values to 'auto'."
    );
    assert_eq!(trainer.state.global_step, 0, "no step was taken");
    // The Trainer made the folder, as upstream's does; nothing was written in it.
    assert!(
        std::fs::read_dir(dir.join("out"))?.next().is_none(),
        "nothing was written"
    );
    // ZeRO-3 with auto_find_batch_size: upstream's constraint.
    let mut args = job_args(
        &dir.join("out"),
        B,
        Some(json!({"zero_optimization": {"stage": 3}})),
        None,
    )?;
    args.auto_find_batch_size = true;
    let mut trainer = Trainer::builder(initial_model()?, args)
        .train_dataset(blocks("train", 32)?)
        .eval_dataset(blocks("eval", 12)?)
        .build()?;
    let err = trainer.train(None).unwrap_err().to_string();
    assert_eq!(
        err,
        "deepspeed: `auto_find_batch_size` isn't supported yet with DeepSpeed Zero-3"
    );
    // save_only_model with load_best_model_at_end: upstream's refusal under DeepSpeed too.
    let mut args = job_args(
        &dir.join("out"),
        B,
        Some(json!({"zero_optimization": {"stage": 3}})),
        None,
    )?;
    args.save_only_model = true;
    args.load_best_model_at_end = true;
    args.metric_for_best_model = Some("loss".into());
    let mut trainer = Trainer::builder(initial_model()?, args)
        .train_dataset(blocks("train", 32)?)
        .eval_dataset(blocks("eval", 12)?)
        .build()?;
    let err = trainer.train(None).unwrap_err().to_string();
    assert_eq!(
        err,
        "deepspeed: DeepSpeed can't be used with `save_only_model` along with `load_best_model_at_end`."
    );
    // --fsdp with --deepspeed.
    let args = job_args(
        &dir.join("out"),
        B,
        Some(json!({"zero_optimization": {"stage": 1}})),
        Some(json!({"reshard_after_forward": true})),
    )?;
    let mut trainer = Trainer::builder(initial_model()?, args)
        .train_dataset(blocks("train", 32)?)
        .eval_dataset(blocks("eval", 12)?)
        .build()?;
    let err = trainer.train(None).unwrap_err().to_string();
    assert_eq!(
        err,
        "fsdp: Using --fsdp xxx together with --deepspeed is not possible, deactivate one of those flags."
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Rank 1 exits (status 17) in its third micro-batch (the second optimizer step): before the
/// forward when `phase` is "forward", between the forward and the backward when it is
/// "backward". Rank 0 is then inside a layer hook or a gradient boundary's action.
struct ExitMidStep {
    phase: &'static str,
    calls: std::sync::atomic::AtomicUsize,
}

impl tchtrain_trainer::TrainerHooks for ExitMidStep {
    fn training_step(
        &self,
        ctx: &tchtrain_trainer::StepContext<'_>,
        model: &mut dyn tchtrain_models::TrainableModel,
        inputs: &tchtrain_collators::Batch,
        num_items_in_batch: Option<&Tensor>,
    ) -> tchtrain_trainer::Result<Tensor> {
        let calls = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        if rank() == 1 && calls == 3 {
            if self.phase == "forward" {
                std::process::exit(17);
            }
            model.train();
            let (loss, _) = self.compute_loss(ctx, &*model, inputs, num_items_in_batch)?;
            drop(loss);
            std::process::exit(17);
        }
        tchtrain_trainer::default_training_step(self, ctx, model, inputs, num_items_in_batch)
    }
}

#[test]
fn a_dead_rank_inside_a_layer_by_layer_step_is_a_clear_error_within_ddp_timeout() -> Result<()> {
    let _g = lock();
    const TIMEOUT_S: i64 = 5;
    if is_rank() {
        // The role names the phase.
        let phase: &'static str = if role().as_deref() == Some("forward") {
            "forward"
        } else {
            "backward"
        };
        let out = test_dir().join(phase);
        let ds = Some(deepspeed_config("zero3")?);
        let mut args = job_args(&out, B, ds, None)?;
        args.ddp_timeout = TIMEOUT_S;
        args.eval_strategy = IntervalStrategy::No;
        args.save_strategy = SaveStrategy::No;
        let mut trainer = Trainer::builder(initial_model()?, args)
            .train_dataset(blocks("train", 32)?)
            .hooks(ExitMidStep {
                phase,
                calls: Default::default(),
            })
            .build()?;
        let began = std::time::Instant::now();
        let err = trainer.train(None).unwrap_err();
        std::fs::write(
            test_dir().join(format!("{phase}.txt")),
            format!("{err}\n{:?}", began.elapsed()),
        )?;
        // The engine's collective error itself (not the generic one the backward raises).
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
        return Ok(());
    }
    for phase in ["forward", "backward"] {
        let dir = temp_dir(&format!("zero3-death-{phase}"));
        let children = launch(
            "a_dead_rank_inside_a_layer_by_layer_step_is_a_clear_error_within_ddp_timeout",
            2,
            &dir,
            phase,
        );
        let codes = wait_codes(children, Duration::from_secs(300));
        let report = std::fs::read_to_string(dir.join(format!("{phase}.txt"))).unwrap_or_default();
        println!("{phase}: rank 0: {report}");
        assert_eq!(
            codes,
            [Some(0), Some(17)],
            "{phase}: rank exit codes (rank 0 asserts its error): {report}"
        );
        assert!(
            report.starts_with("distributed training: rank 0: "),
            "{phase}: {report}"
        );
        let waited = report.lines().nth(1).unwrap_or_default();
        println!("{phase}: rank 0 returned its error {waited} after train() began");
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// The reference blocks with their ids folded into a vocabulary of `vocab` tokens.
fn llama_blocks(n: usize, vocab: i64) -> Result<std::sync::Arc<dyn tchtrain_data::Dataset>> {
    let rows = crate::common::block_ids("train", n)?
        .into_iter()
        .map(|ids| {
            let ids: Vec<i64> = ids.into_iter().map(|id| id % vocab).collect();
            tchtrain_collators::Feature::new(ids.clone())
                .with_labels(tchtrain_collators::Label::Ids(ids))
        })
        .collect();
    Ok(tchtrain_data::InMemoryDataset::new(rows).into_shared())
}

/// The decoders the layer-by-layer ZeRO-3 run covers: tiny Llama, and tiny Qwen2 (q/k/v
/// biases, sliding-window layers) for the families built on Llama's layers.
const ZERO3_FAMILIES: [(&str, &str, i64); 2] = [
    ("llama", "tiny-llama", 49152),
    ("qwen2", "reference/models/tiny_qwen2_lm", 1000),
];

#[test]
fn zero3_layer_by_layer_on_llama_equals_ddp() -> Result<()> {
    let _g = lock();
    if is_rank() {
        let dir = test_dir();
        let r = rank();
        for (family, model_dir, vocab) in ZERO3_FAMILIES {
            let ds3 = deepspeed_config("zero3")?;
            for (mode, ds) in [("ddp", None), ("zero3", Some(ds3))] {
                let name = format!("{family}-{mode}");
                // Evaluations at the start and every 3 steps, saves every 3 steps.
                let mut args = job_args(&dir.join(&name), B, ds, None)?;
                args.eval_on_start = true;
                let model = from_pretrained_dir(
                    &crate::common::assets().join(model_dir),
                    AutoTask::CausalLm,
                    Device::Cpu,
                    &LoadOptions::default(),
                )?
                .model;
                let mut trainer = Trainer::builder(model, args)
                    .train_dataset(llama_blocks(32, vocab)?)
                    .eval_dataset(llama_blocks(12, vocab)?)
                    .build()?;
                trainer.train(None)?;
                let mem = trainer.sharded_memory().unwrap_or_default();
                write_log(
                    &dir.join(format!("{name}-history-rank{r}.json")),
                    &numbers(&trainer.state.log_history),
                )?;
                std::fs::write(
                    dir.join(format!("{name}-peak-rank{r}.txt")),
                    format!("{} {}", mem.peak_unit_param_bytes, mem.full_gathers),
                )?;
            }
        }
        return Ok(());
    }
    let dir = temp_dir("zero3-llama");
    let codes = wait_codes(
        launch("zero3_layer_by_layer_on_llama_equals_ddp", 2, &dir, "rank"),
        Duration::from_secs(600),
    );
    assert_eq!(codes, [Some(0), Some(0)], "rank exit codes");
    for (family, _, _) in ZERO3_FAMILIES {
        check_zero3_family(&dir, family)?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// One family's ZeRO-3 run against its DDP run (rank 0's logs and checkpoints).
fn check_zero3_family(dir: &Path, family: &str) -> Result<()> {
    let ddp = read_log(&dir.join(format!("{family}-ddp-history-rank0.json")))?;
    let zero3 = read_log(&dir.join(format!("{family}-zero3-history-rank0.json")))?;
    assert_eq!(ddp.len(), zero3.len(), "log entries");
    let (mut worst, mut worst_eval, mut evals) = (0.0f64, 0.0f64, 0);
    for (d, z) in ddp.iter().zip(&zero3) {
        if let (Some(a), Some(b)) = (num(z, "loss"), num(d, "loss")) {
            worst = worst.max(rel(a, b));
        }
        match (num(z, "eval_loss"), num(d, "eval_loss")) {
            (Some(a), Some(b)) => {
                worst_eval = worst_eval.max(rel(a, b));
                evals += 1;
            }
            (None, None) => {}
            (a, b) => panic!("eval_loss {a:?} vs DDP {b:?}"),
        }
    }
    // Rank 0's model.safetensors, gathered unit by unit, against DDP's at both saves.
    let mut worst_weights = 0.0f64;
    for step in [3, 6] {
        let ckpt = |run: &str| dir.join(format!("{family}-{run}/checkpoint-{step}"));
        let ddp_model = tchtrain_models::read_checkpoint(&ckpt("ddp"))?;
        let zero_model = tchtrain_models::read_checkpoint(&ckpt("zero3"))?;
        worst_weights = worst_weights.max(max_abs_diff(&zero_model, &ddp_model)?);
    }
    let figures = std::fs::read_to_string(dir.join(format!("{family}-zero3-peak-rank0.txt")))?;
    let (peak, full_gathers) = figures.trim().split_once(' ').context("peak figures")?;
    let (peak, full_gathers): (f64, usize) = (peak.parse()?, full_gathers.parse()?);
    println!(
        "tiny {family} ZeRO-3 layer by layer vs DDP (2 ranks): loss max relative difference {worst:.2e}, eval_loss {worst_eval:.2e} over {evals} evaluations; checkpoint-3/6 model.safetensors max abs diff {worst_weights:.2e}; step peak {peak} B; whole-model gathers {full_gathers}"
    );
    assert!(worst < 1e-5, "{family}: loss differs by {worst}");
    assert!(
        worst_eval < 1e-5,
        "{family}: eval_loss differs by {worst_eval}"
    );
    assert_eq!(evals, 3, "{family}: evaluations at steps 0, 3 and 6");
    assert!(
        worst_weights < 1e-5,
        "{family}: saved weights differ by {worst_weights}"
    );
    assert!(peak > 0.0, "{family}: the layers were gathered one by one");
    // Setup, the evaluations, the steps and the two saves gather one layer at a time: the
    // whole model is gathered once, when training ends (the model is handed back full).
    assert_eq!(full_gathers, 1, "{family}: whole-model gathers");
    Ok(())
}

/// One process (`WORLD_SIZE=1`): ZeRO-3 with `offload_optimizer` runs the engine over a
/// world of one, as DeepSpeed does on one GPU. Nothing is sharded, so it trains as the plain
/// run does (the same tolerances as the 2-rank comparison: the global norm is summed in
/// float64), with the masters and their gradients on the offload device and checkpoint-6
/// written as rank 0's shards.
#[test]
fn zero3_with_offload_on_one_process_trains_as_the_plain_run() -> Result<()> {
    let _g = lock();
    const TEST: &str = "zero3_with_offload_on_one_process_trains_as_the_plain_run";
    if is_rank() {
        let dir = test_dir();
        let mut cfg = deepspeed_config("zero3_offload")?;
        cfg["zero_optimization"]["offload_optimizer"]["pin_memory"] = json!(false);
        cfg["zero_optimization"]["offload_param"]["pin_memory"] = json!(false);
        for (name, ds) in [("plain", None), ("zero3_offload", Some(cfg))] {
            run_and_record(&dir, name, "", B, ds, None)?;
        }
        return Ok(());
    }
    let dir = temp_dir("one-process");
    let codes = wait_codes(launch(TEST, 1, &dir, "rank"), Duration::from_secs(600));
    assert_eq!(codes, [Some(0)], "exit code");
    let plain = read_log(&dir.join("plain-history.json"))?;
    let zero = read_log(&dir.join("zero3_offload-history.json"))?;
    assert_eq!(zero.len(), plain.len(), "number of log entries");
    let mut worst: BTreeMap<&str, f64> = BTreeMap::new();
    for (z, p) in zero.iter().zip(&plain) {
        assert_eq!(num(z, "step"), num(p, "step"));
        for key in ["loss", "grad_norm", "eval_loss", "learning_rate"] {
            if let (Some(a), Some(b)) = (num(z, key), num(p, key)) {
                let w = worst.entry(key).or_default();
                *w = w.max(rel(a, b));
            }
        }
    }
    println!("ZeRO-3 + offload on one process vs plain: max relative differences {worst:?}");
    assert!(
        worst["loss"] < 1e-5 && worst["eval_loss"] < 1e-5,
        "{worst:?}"
    );
    assert!(worst["grad_norm"] < 5e-4, "{worst:?}");
    assert_eq!(worst["learning_rate"], 0.0, "{worst:?}");
    let f = read_figures(&dir.join("zero3_offload-figures.json"))?;
    let p = read_figures(&dir.join("plain-figures.json"))?;
    assert_eq!((f.zero_stage, p.zero_stage), (Some(3), None));
    // A world of one: the shard is the whole model; it, the masters and their gradients
    // are offloaded, and the model's device holds no parameters between steps.
    let full = f.model_param_bytes as f64;
    let offload = f.step_end_offload_bytes as f64;
    assert!(
        (offload - 3.0 * full).abs() <= 64.0 * 4.0,
        "{offload} vs 3 x {full}"
    );
    assert_eq!(f.step_end_param_bytes, 0);
    assert_eq!(f.optimizer_state_bytes, p.optimizer_state_bytes);
    let shard_dir = tchtrain_deepspeed::find_shard_dir(&dir.join("zero3_offload/checkpoint-6"))?;
    let stem = tchtrain_deepspeed::zero_shard_stem(0);
    assert!(shard_dir.join(format!("{stem}.safetensors")).is_file());
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// LoRA under ZeRO-2 and ZeRO-3 on 2 ranks: the adapter (the base frozen) trains as under
/// DDP, within the tolerances of the full model's comparison.
#[test]
fn lora_under_zero_2_and_3_equals_ddp() -> Result<()> {
    let _g = lock();
    const TEST: &str = "lora_under_zero_2_and_3_equals_ddp";
    let cases = || -> Vec<(&'static str, Option<serde_json::Value>)> {
        configs()
            .into_iter()
            .filter_map(|(name, ds, _)| match name {
                "ddp" => Some(("lora_ddp", None)),
                "zero2" => Some(("lora_zero2", ds)),
                "zero3" => Some(("lora_zero3", ds)),
                _ => None,
            })
            .collect()
    };
    if is_rank() {
        let dir = test_dir();
        let r = rank();
        for (name, ds) in cases() {
            run_and_record(&dir, name, &format!("-rank{r}"), B, ds, None)?;
        }
        return Ok(());
    }
    let dir = temp_dir("lora-zero");
    let codes = wait_codes(launch(TEST, 2, &dir, "rank"), Duration::from_secs(600));
    assert_eq!(codes, [Some(0), Some(0)], "rank exit codes");
    let ddp = read_log(&dir.join("lora_ddp-history-rank0.json"))?;
    for name in ["lora_zero2", "lora_zero3"] {
        let log = read_log(&dir.join(format!("{name}-history-rank0.json")))?;
        assert_eq!(log.len(), ddp.len(), "{name}: number of log entries");
        let mut worst: BTreeMap<&str, f64> = BTreeMap::new();
        for (z, d) in log.iter().zip(&ddp) {
            for key in ["loss", "grad_norm", "eval_loss", "learning_rate"] {
                if let (Some(a), Some(b)) = (num(z, key), num(d, key)) {
                    let w = worst.entry(key).or_default();
                    *w = w.max(rel(a, b));
                }
            }
        }
        println!("{name} vs DDP: max relative differences {worst:?}");
        assert!(
            worst["loss"] < 1e-5 && worst["eval_loss"] < 1e-5,
            "{name}: {worst:?}"
        );
        assert!(worst["grad_norm"] < 5e-4, "{name}: {worst:?}");
        assert_eq!(worst["learning_rate"], 0.0, "{name}: {worst:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The DeepSpeed and FSDP settings of the configuration `name` in [`configs`].
fn sharding_config(name: &str) -> Result<(Option<serde_json::Value>, Option<serde_json::Value>)> {
    configs()
        .into_iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, ds, fsdp)| (ds, fsdp))
        .with_context(|| format!("no configuration `{name}`"))
}

/// Resumes `ckpt` with the configuration `config` and micro-batches of `batch` rows, to the
/// end of the job; the log of the resumed run (the checkpoint's history, then its own).
fn resume_job(out: &Path, batch: usize, config: &str, ckpt: &Path) -> Result<Log> {
    let (ds, fsdp) = sharding_config(config)?;
    let mut trainer = Trainer::builder(initial_model()?, job_args(out, batch, ds, fsdp)?)
        .train_dataset(blocks("train", 32)?)
        .eval_dataset(blocks("eval", 12)?)
        .build()?;
    trainer.train(Some(tchtrain_trainer::ResumeFrom::Path(ckpt.to_path_buf())))?;
    Ok(numbers(&trainer.state.log_history))
}

/// A ZeRO-2 checkpoint written by 2 ranks (step 3 of 6) resumed on 1 process at ZeRO-2 and
/// at ZeRO-3, and on 4 ranks at ZeRO-1; an FSDP full_shard SHARDED_STATE_DICT checkpoint of
/// 2 ranks resumed on 4 (FSDP on one process is refused, as upstream); a ZeRO-3 checkpoint of
/// 4 ranks resumed on 2 at ZeRO-2: the shards are read into DeepSpeed's universal form
/// (per-parameter fp32 master, `exp_avg`, `exp_avg_sq`) and cut for the new world, stage and
/// wrap units. With the global batch kept (2 x 2, 1 x 4, 4 x 1 rows), every resumed run
/// logs the losses, gradient norms, learning rates and evaluation losses of the run that
/// wrote the checkpoint from step 4 on: losses within 1e-6 relative, gradient norms 1e-4
/// (only the order of the sums differs, as between DDP and one process). zero_to_fp32
/// still reads the checkpoint.
#[test]
fn a_zero_checkpoint_resumes_on_another_world_size_and_stage() -> Result<()> {
    let _g = lock();
    const TEST: &str = "a_zero_checkpoint_resumes_on_another_world_size_and_stage";
    if is_rank() {
        let dir = test_dir();
        let r = rank();
        match role().as_deref() {
            Some("save") => {
                for name in ["zero2", "fsdp_full_shard"] {
                    let (ds, fsdp) = sharding_config(name)?;
                    let (log, _) = run_job(&dir.join(name), name, B, ds, fsdp)?;
                    write_log(&dir.join(format!("{name}-save-rank{r}.json")), &log)?;
                }
            }
            Some("one") => {
                for (name, config, from) in [
                    ("one_zero2", "zero2", "zero2"),
                    ("one_zero3", "zero3", "zero2"),
                ] {
                    let ckpt = dir.join(from).join("checkpoint-3");
                    let log = resume_job(&dir.join(name), 2 * B, config, &ckpt)?;
                    write_log(&dir.join(format!("{name}.json")), &log)?;
                }
            }
            Some("four") => {
                for (name, config, from) in [
                    ("four_zero1", "zero1", "zero2"),
                    ("four_fsdp", "fsdp_full_shard", "fsdp_full_shard"),
                ] {
                    let ckpt = dir.join(from).join("checkpoint-3");
                    let log = resume_job(&dir.join(name), B / 2, config, &ckpt)?;
                    write_log(&dir.join(format!("{name}-rank{r}.json")), &log)?;
                }
            }
            // A 4-rank ZeRO-3 run of its own (one row per rank), checkpoint-3 of which
            // 2 ranks resume at ZeRO-2.
            Some("four_save") => {
                let (ds, _) = sharding_config("zero3")?;
                let (log, _) = run_job(&dir.join("four_zero3"), "four_zero3", B / 2, ds, None)?;
                write_log(&dir.join(format!("four_zero3-save-rank{r}.json")), &log)?;
            }
            Some("two") => {
                let ckpt = dir.join("four_zero3").join("checkpoint-3");
                let log = resume_job(&dir.join("two_zero2"), B, "zero2", &ckpt)?;
                write_log(&dir.join(format!("two_zero2-rank{r}.json")), &log)?;
            }
            other => anyhow::bail!("unknown role {other:?}"),
        }
        return Ok(());
    }
    let dir = temp_dir("zero-reshard");
    for (world, role) in [
        (2, "save"),
        (1, "one"),
        (4, "four"),
        (4, "four_save"),
        (2, "two"),
    ] {
        let codes = wait_codes(launch(TEST, world, &dir, role), Duration::from_secs(600));
        assert_eq!(codes, vec![Some(0); world as usize], "{role}: exit codes");
    }
    let original = read_log(&dir.join("zero2-save-rank0.json"))?;
    let original_fsdp = read_log(&dir.join("fsdp_full_shard-save-rank0.json"))?;
    let original_four = read_log(&dir.join("four_zero3-save-rank0.json"))?;
    let after = |log: &Log| -> Log {
        log.iter()
            .filter(|e| num(e, "step").is_some_and(|s| s > 3.0))
            .filter(|e| num(e, "loss").is_some() || num(e, "eval_loss").is_some())
            .cloned()
            .collect()
    };
    for (name, original) in [
        ("one_zero2.json", &original),
        ("one_zero3.json", &original),
        ("four_zero1-rank0.json", &original),
        ("four_fsdp-rank0.json", &original_fsdp),
        ("two_zero2-rank0.json", &original_four),
    ] {
        let want = after(original);
        assert_eq!(want.len(), 4, "steps 4-6 and the evaluation at 6: {want:?}");
        let got = after(&read_log(&dir.join(name))?);
        assert_eq!(got.len(), want.len(), "{name}: {got:?}");
        let mut worst: BTreeMap<&str, f64> = BTreeMap::new();
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(num(g, "step"), num(w, "step"), "{name}");
            for key in ["loss", "grad_norm", "learning_rate", "eval_loss"] {
                match (num(g, key), num(w, key)) {
                    (Some(a), Some(b)) => {
                        let e = worst.entry(key).or_default();
                        *e = e.max(rel(a, b));
                    }
                    (None, None) => {}
                    (a, b) => panic!("{name}: {key} {a:?} vs {b:?}"),
                }
            }
        }
        println!(
            "{name} resumed on another world size or stage: max relative differences {worst:?}"
        );
        // Measured: losses 1.9e-7, gradient norms and learning rates equal.
        assert!(
            worst["loss"] < 1e-6 && worst["eval_loss"] < 1e-6,
            "{name}: {worst:?}"
        );
        assert!(worst["grad_norm"] < 1e-4, "{name}: {worst:?}");
        assert!(worst["learning_rate"] < 1e-12, "{name}: {worst:?}");
    }
    let consolidated = tchtrain_deepspeed::get_fp32_state_dict_from_zero_checkpoint(
        &dir.join("zero2/checkpoint-3"),
    )?;
    assert!(!consolidated.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

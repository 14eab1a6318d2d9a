//! FSDP's mixed precision against upstream's Trainer under torch 2.13's FSDP2
//! (`scripts/reference/fsdp_mixed_precision.py`: accelerate's GPU branch applied to a CPU
//! run, `fully_shard` with its `MixedPrecisionPolicy` on gloo), 2 ranks on 127.0.0.1, tiny
//! GPT-2 cut to 1024 tokens wrapped per `GPT2Block`, 8 steps of 2 rows per rank, evaluation every 4:
//!
//! * `full_shard_bf16`, `shard_grad_op_bf16`: `--bf16` gives the policy
//!   `(param_dtype, reduce_dtype, output_dtype) = bfloat16` under bf16 autocast: float32
//!   shards, parameters gathered in bfloat16, gradients reduced in bfloat16, the loss the
//!   Trainer logs rounded to bfloat16;
//! * `full_shard_fp16`: `--fp16` on the CPU: the policy in float16, with neither autocast
//!   nor a gradient scaler (accelerate's `native_amp` is off on the CPU for fp16);
//! * `full_shard_fp16_scaler`: `--fp16` as on a GPU (float16 autocast and FSDP2's
//!   `GradScaler`, starting at 2^20 so that the first six steps overflow): the scaler
//!   unscales the shards and reduces its inf flag over the ranks, the same steps are
//!   skipped, and the scale ends where torch's does.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::json;
use tchtrain_optim::GradScalerKwargs;
use tchtrain_testing::{lock, reference_dir};
use tchtrain_trainer::Trainer;
use tchtrain_training_args::{
    DictOrPath, IntervalStrategy, SaveStrategy, StrOrBool, TrainingArguments,
};

use crate::common::{
    blocks_in, initial_model_in, is_rank, launch, numbers, rank, temp_dir, test_dir, wait_codes,
};
use crate::deepspeed_half::{compare_logs, read_entries, reference_log, write_entries};

const CASES: [&str; 4] = [
    "full_shard_bf16",
    "shard_grad_op_bf16",
    "full_shard_fp16",
    "full_shard_fp16_scaler",
];
const KEYS: [&str; 5] = [
    "loss",
    "grad_norm",
    "learning_rate",
    "eval_loss",
    "train_loss",
];

fn args(output_dir: &Path, case: &str) -> Result<TrainingArguments> {
    let strategy = if case.starts_with("full_shard") {
        "full_shard auto_wrap"
    } else {
        "shard_grad_op auto_wrap"
    };
    let mut args = TrainingArguments {
        per_device_train_batch_size: 2,
        per_device_eval_batch_size: 2,
        gradient_accumulation_steps: 1,
        max_steps: 8,
        learning_rate: 1e-3,
        warmup_steps: 2.0,
        weight_decay: 0.01,
        max_grad_norm: 1.0,
        logging_steps: 1.0,
        eval_strategy: IntervalStrategy::Steps,
        eval_steps: Some(4.0),
        save_strategy: SaveStrategy::No,
        seed: 42,
        use_cpu: true,
        report_to: vec![],
        disable_tqdm: true,
        bf16: case.contains("bf16"),
        fp16: case.contains("fp16"),
        fsdp: Some(StrOrBool::Str(strategy.into())),
        fsdp_config: Some(DictOrPath::Dict(
            json!({"transformer_layer_cls_to_wrap": ["GPT2Block"]})
                .as_object()
                .cloned()
                .unwrap_or_default(),
        )),
        ..TrainingArguments::new(output_dir.display().to_string())
    };
    args.post_init()?;
    Ok(args)
}

#[test]
fn fsdp_mixed_precision_trains_as_fsdp2() -> Result<()> {
    let _g = lock();
    if is_rank() {
        let dir = test_dir();
        // The reference job's model and data (tiny GPT-2 cut to 1024 tokens).
        let job = reference_dir("fsdp_mixed_precision");
        for case in CASES {
            let out = dir.join(case);
            let mut builder = Trainer::builder(initial_model_in(&job)?, args(&out, case)?)
                .train_dataset(blocks_in(&job, "train", 32)?)
                .eval_dataset(blocks_in(&job, "eval", 12)?);
            if case.ends_with("_scaler") {
                builder = builder.grad_scaler(GradScalerKwargs {
                    init_scale: 2f64.powi(20),
                    growth_interval: 2,
                    ..Default::default()
                });
            }
            let mut trainer = builder.build()?;
            trainer
                .train(None)
                .with_context(|| format!("training {case}"))?;
            let log = numbers(&trainer.state.log_history);
            let scale = trainer.grad_scaler().map(|s| s.get_scale()).transpose()?;
            write_entries(
                &dir.join(format!("{case}-rank{}.json", rank())),
                &log,
                scale,
            )?;
        }
        return Ok(());
    }
    let dir = temp_dir("fsdp-half");
    let codes = wait_codes(
        launch("fsdp_mixed_precision_trains_as_fsdp2", 2, &dir, "rank"),
        Duration::from_secs(900),
    );
    assert_eq!(codes, [Some(0), Some(0)], "rank exit codes");
    for case in CASES {
        let (ours, scale) = read_entries(&dir.join(format!("{case}-rank0.json")))?;
        let (theirs, scales) = reference_log("fsdp_mixed_precision", case)?;
        let worst = compare_logs(case, &ours, &theirs, &KEYS);
        println!("{case} vs FSDP2: max relative differences {worst:?}");
        if case.ends_with("_scaler") {
            assert!(
                theirs
                    .iter()
                    .any(|e| e.get("grad_norm").is_some_and(|g| !g.is_finite())),
                "the reference skips steps"
            );
            assert_eq!(scale, scales.last().copied(), "{case}: the final scale");
        }
        // Every logged number equals FSDP2's: the same float32 shards, the same low-precision
        // gathers, reductions and outputs, and FSDP2's DTensor gradient norm (per-parameter
        // chunk norms, made whole across ranks, then their norm).
        for key in KEYS {
            let w = worst.get(key).copied().unwrap_or(0.0);
            assert!(w == 0.0, "{case} {key}: {w}");
        }
    }
    Ok(())
}

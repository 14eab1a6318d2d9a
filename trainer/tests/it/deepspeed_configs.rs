//! The DeepSpeed documentation's ZeRO-2 and ZeRO-3 example configs
//! (`integrations/deepspeed/tests/fixtures/ds_config_zero{2,3}.json`, every value `"auto"`)
//! passed to the Trainer as `--deepspeed <file>`:
//!
//! * as written they train on 2 ranks (ZeRO stage 2 / 3) with the optimizer (and at stage
//!   3 the parameters) offloaded to the CPU (`offload_optimizer`, `offload_param`), the
//!   processed config holding no `"auto"`, fp16 disabled (a CPU run), the batch sizes,
//!   clipping, optimizer and scheduler values from the arguments and the buckets from
//!   GPT-2's `n_embd`;
//! * a value that conflicts with the arguments fails with upstream's mismatch message.

use std::path::{Path, PathBuf};
use std::time::Duration;
use tchtrain_testing::lock;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use tchtrain_trainer::Trainer;
use tchtrain_training_args::{DictOrPath, SaveStrategy, TrainingArguments};

use crate::common::{
    blocks, initial_model, launch, rank, role, small_vocab_initial, temp_dir, test_dir, wait_codes,
};

/// Rows per rank and micro-batch.
const B: usize = 2;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../integrations/deepspeed/tests/fixtures")
        .join(name)
}

/// The fixture `name` with `overrides` (dotted keys) applied, written to `dir`; its path.
fn config_file(dir: &Path, name: &str, overrides: &[(&str, Value)]) -> Result<PathBuf> {
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(fixture(name))?)?;
    for (key, value) in overrides {
        let parts: Vec<&str> = key.split('.').collect();
        let mut node = &mut v;
        for p in &parts[..parts.len() - 1] {
            node = node.get_mut(*p).context("fixture key")?;
        }
        node[parts[parts.len() - 1]] = value.clone();
    }
    let path = dir.join(format!("{}-{name}", overrides.len()));
    std::fs::create_dir_all(dir)?;
    std::fs::write(&path, serde_json::to_string_pretty(&v)?)?;
    Ok(path)
}

const AS_WRITTEN: [(&str, Value); 0] = [];

/// Batch B, accumulation 2, 2 updates, lr 1e-3, `--deepspeed config`.
fn trainer(output_dir: &Path, config: &Path) -> Result<Trainer> {
    let mut args = TrainingArguments {
        per_device_train_batch_size: B,
        gradient_accumulation_steps: 2,
        max_steps: 2,
        learning_rate: 1e-3,
        warmup_steps: 1.0,
        weight_decay: 0.01,
        logging_steps: 1.0,
        save_strategy: SaveStrategy::No,
        seed: 42,
        use_cpu: true,
        report_to: vec![],
        disable_tqdm: true,
        deepspeed: Some(DictOrPath::Path(config.display().to_string())),
        ..TrainingArguments::new(output_dir.display().to_string())
    };
    args.post_init()?;
    Ok(Trainer::builder(initial_model()?, args)
        .train_dataset(blocks("train", 16)?)
        .build()?)
}

fn run_rank() -> Result<()> {
    let dir = test_dir();
    let r = rank();
    for stage in [2, 3] {
        let name = format!("ds_config_zero{stage}.json");
        let config = config_file(&dir.join(format!("configs-rank{r}")), &name, &AS_WRITTEN)?;
        let mut t = trainer(&dir.join(format!("zero{stage}")), &config)?;
        t.train(None)
            .with_context(|| format!("{name} on rank {r}"))?;
        let processed = t
            .hf_deepspeed_config()
            .context("a DeepSpeed run")?
            .config
            .clone();
        let losses: Vec<f64> = t
            .state
            .log_history
            .iter()
            .filter_map(|e| e.get("loss")?.as_f64())
            .collect();
        let offload_bytes = t
            .sharded_memory()
            .unwrap_or_default()
            .step_end_offload_bytes;
        let out = json!({"stage": t.zero_stage(), "config": processed, "losses": losses,
            "offload_bytes": offload_bytes});
        std::fs::write(
            dir.join(format!("zero{stage}-rank{r}.json")),
            serde_json::to_string(&out)?,
        )?;
    }
    Ok(())
}

#[test]
fn the_documentation_examples_train_on_two_ranks_with_the_optimizer_offloaded() -> Result<()> {
    let _g = lock();
    const TEST: &str = "the_documentation_examples_train_on_two_ranks_with_the_optimizer_offloaded";
    if role().is_some() {
        return run_rank();
    }
    let dir = temp_dir("ranks");
    let codes = wait_codes(launch(TEST, 2, &dir, "rank"), Duration::from_secs(600));
    assert_eq!(codes, [Some(0), Some(0)], "rank exit codes");
    let param_bytes: u64 = tchtrain_models::read_checkpoint(&small_vocab_initial())?
        .iter()
        .map(|(_, t)| t.numel() as u64 * 4)
        .sum();
    for stage in [2i64, 3] {
        for r in 0..2 {
            let path = dir.join(format!("zero{stage}-rank{r}.json"));
            let v: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
            assert_eq!(v["stage"], json!(stage));
            let c = &v["config"];
            assert!(!c.to_string().contains("\"auto\""), "zero{stage}: {c}");
            assert_eq!(c["fp16"]["enabled"], json!(false), "fp16 auto on the CPU");
            assert_eq!(c["train_micro_batch_size_per_gpu"], json!(B));
            assert_eq!(c["gradient_accumulation_steps"], json!(2));
            assert_eq!(
                c["train_batch_size"],
                json!(2 * B * 2),
                "world x batch x accumulation"
            );
            assert_eq!(c["gradient_clipping"], json!(1.0));
            assert_eq!(c["optimizer"]["params"]["lr"], json!(1e-3));
            assert_eq!(c["optimizer"]["params"]["betas"], json!([0.9, 0.999]));
            assert_eq!(c["optimizer"]["params"]["weight_decay"], json!(0.01));
            assert_eq!(c["scheduler"]["params"]["warmup_max_lr"], json!(1e-3));
            assert_eq!(c["scheduler"]["params"]["warmup_num_steps"], json!(1));
            if stage == 3 {
                // GPT-2 tiny: n_embd 64.
                let z = &c["zero_optimization"];
                assert_eq!(z["reduce_bucket_size"], json!(64 * 64));
                assert_eq!(z["stage3_prefetch_bucket_size"], json!(3686));
                assert_eq!(z["stage3_param_persistence_threshold"], json!(640));
            }
            let z = &c["zero_optimization"];
            assert_eq!(z["offload_optimizer"]["device"], json!("cpu"));
            // The master shards (and their gradients, kept until zero_grad; at stage 3 the
            // shards too) live on the offload device: at least this rank's half of the
            // model's float32 parameters.
            let offload = v["offload_bytes"].as_u64().context("offload_bytes")?;
            assert!(
                offload >= param_bytes / 2,
                "zero{stage} rank {r}: {offload} offloaded bytes"
            );
            let losses = v["losses"].as_array().context("losses")?;
            assert_eq!(losses.len(), 2, "zero{stage}: 2 logged steps");
            assert!(
                losses
                    .iter()
                    .all(|l| l.as_f64().is_some_and(f64::is_finite))
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[test]
fn offload_the_engine_lacks_is_refused_naming_the_key() -> Result<()> {
    let _g = lock();
    if role().is_some() {
        return Ok(());
    }
    let dir = temp_dir("offload");
    let cases = [
        (
            vec![("zero_optimization.offload_param.device", json!("nvme"))],
            "zero_optimization.offload_param.device=\"nvme\": NVMe offload (DeepSpeed's async I/O to nvme_path) is not implemented by this ZeRO engine: use \"cpu\" or \"none\"",
        ),
        (
            vec![("zero_optimization.offload_optimizer.device", json!("nvme"))],
            "zero_optimization.offload_optimizer.device=\"nvme\": NVMe offload (DeepSpeed's async I/O to nvme_path) is not implemented by this ZeRO engine: use \"cpu\" or \"none\"",
        ),
        (
            vec![("zero_optimization.offload_optimizer.device", json!("gpu"))],
            "zero_optimization.offload_optimizer.device=\"gpu\": DeepSpeed's offload devices are \"cpu\", \"nvme\" and \"none\"; this engine offloads to \"cpu\"",
        ),
    ];
    for (i, (overrides, detail)) in cases.into_iter().enumerate() {
        let config = config_file(
            &dir.join(format!("case{i}")),
            "ds_config_zero3.json",
            &overrides,
        )?;
        let out = dir.join(format!("out{i}"));
        let mut t = trainer(&out, &config)?;
        let err = t.train(None).unwrap_err().to_string();
        assert_eq!(err, format!("invalid `deepspeed`: {detail}"));
        assert_eq!(t.state.global_step, 0);
        // The Trainer made the folder, as upstream's does; nothing was written in it.
        assert!(
            std::fs::read_dir(&out)?.next().is_none(),
            "nothing was written"
        );
    }
    // A conflicting value: upstream's message, before the offload check.
    let config = config_file(
        &dir,
        "ds_config_zero3.json",
        &[
            ("gradient_clipping", json!(0.5)),
            ("train_micro_batch_size_per_gpu", json!(3)),
        ],
    )?;
    let err = trainer(&dir.join("out"), &config)?
        .train(None)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "deepspeed: Please correct the following DeepSpeed config values that mismatch TrainingArguments values:\n\
         - ds train_micro_batch_size_per_gpu=3 vs hf per_device_train_batch_size=2\n\
         - ds gradient_clipping=0.5 vs hf max_grad_norm=1.0\n\
         The easiest method is to set these DeepSpeed config values to 'auto'."
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn ds_reference(name: &str) -> Result<Value> {
    let path = tchtrain_testing::assets()
        .join("reference/deepspeed_lr_schedules/deepspeed_lr_schedules.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    v["cases"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == name).cloned())
        .with_context(|| format!("case {name}"))
}

#[test]
fn the_config_optimizer_and_scheduler_replace_the_trainers() -> Result<()> {
    let _g = lock();
    if role().is_some() {
        return Ok(());
    }
    // Upstream `deepspeed_optim_sched`: with `optimizer` and `scheduler` sections DeepSpeed
    // builds both: AdamW over one group of every parameter (weight decay on biases and
    // norms too) and its WarmupDecayLR (log warm-up), not the Trainer's linear schedule.
    let dir = temp_dir("ds-sections");
    let config = json!({
        "zero_optimization": {"stage": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto", "total_num_steps": "auto"}},
        "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto"
    });
    let path = dir.join("ds.json");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(&path, config.to_string())?;
    let mut args = TrainingArguments {
        per_device_train_batch_size: B,
        max_steps: 6,
        learning_rate: 1e-3,
        warmup_steps: 3.0,
        weight_decay: 0.01,
        logging_steps: 1.0,
        save_strategy: SaveStrategy::No,
        use_cpu: true,
        report_to: vec![],
        disable_tqdm: true,
        deepspeed: Some(DictOrPath::Path(path.display().to_string())),
        ..TrainingArguments::new(dir.join("out").display().to_string())
    };
    args.post_init()?;
    let mut t = Trainer::builder(initial_model()?, args)
        .train_dataset(blocks("train", 16)?)
        .build()?;
    t.train(None)?;
    let opt = t.optimizer().context("optimizer")?;
    assert_eq!(opt.name(), "adamw");
    assert_eq!(opt.param_groups().len(), 1, "DeepSpeed's one group");
    assert_eq!(opt.param_groups()[0].weight_decay, 0.01);
    // The logged lr is the scheduler's after each step: DeepSpeed's own values.
    let want = ds_reference("trainer_decay")?;
    let logged: Vec<f64> = t
        .state
        .log_history
        .iter()
        .filter_map(|e| e.get("learning_rate")?.as_f64())
        .collect();
    let expected: Vec<f64> = (1..=6)
        .map(|k| want["lrs"][k][0].as_f64().unwrap_or(f64::NAN))
        .collect();
    assert_eq!(logged, expected);

    // Another optimizer type is refused by key, before any step.
    let mut bad = config.clone();
    bad["optimizer"]["type"] = json!("Lamb");
    std::fs::write(&path, bad.to_string())?;
    let mut args = t.args().clone();
    args.output_dir = Some(dir.join("out2").display().to_string());
    let err = Trainer::builder(initial_model()?, args)
        .train_dataset(blocks("train", 16)?)
        .build()?
        .train(None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`optimizer.type`") && err.contains("Lamb"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

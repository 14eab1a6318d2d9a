//! Every `TrainingArguments` field is honoured, inert or refused (`FIELD_SUPPORT`): the walk
//! over the whole field table, the table in docs/fields.md, and the observations of the honoured
//! fields no other test looks at.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tchtrain_testing::lock;
use tchtrain_trainer::{
    DEEPSPEED_KEY_SUPPORT, FIELD_SUPPORT, FSDP_KEY_SUPPORT, FieldSupport, ResumeFrom, Support,
    Trainer, check_deepspeed_keys, check_fsdp_keys, check_fsdp_mixed_precision, markdown_table,
};
use tchtrain_training_args::{TrainingArguments, field_names};

use crate::common::{initial_model, small_train, temp_dir};
use crate::trainer::{losses, small_args};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the trainer crate sits in the workspace")
        .to_path_buf()
}

/// Every `.rs` file of the workspace's crates (not `target/`).
fn rust_sources(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if path.is_dir() {
            if !name.starts_with('.') && name != "target" {
                rust_sources(&path, out)?;
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// A value that sets `field` off its default (with any other key it needs), as a JSON
/// `TrainingArguments` dict, and the field its refusal (if any) names; `None` for fields
/// only checked through their tests.
fn non_default(field: &str) -> Option<(Value, &'static str)> {
    Some(match field {
        "torch_compile" => (json!({field: true}), "torch_compile"),
        // post_init turns torch_compile on when a backend or a mode is named, as upstream.
        "torch_compile_backend" => (json!({field: "inductor"}), "torch_compile"),
        "torch_compile_mode" => (json!({field: "max-autotune"}), "torch_compile"),
        "use_liger_kernel" => (json!({field: true}), "use_liger_kernel"),
        "liger_kernel_config" => (json!({field: {"rope": true}}), ""),
        "use_cache" => (json!({field: true}), ""),
        "torch_empty_cache_steps" => (json!({field: 2}), ""),
        "optim_target_modules" => (json!({field: "attn"}), ""),
        "run_name"
        | "project"
        | "trackio_space_id"
        | "trackio_bucket_id"
        | "trackio_static_space_id"
        | "hub_token"
        | "hub_model_id" => (json!({field: "me/name"}), ""),
        "eval_do_concat_batches" => (json!({field: false}), "eval_do_concat_batches"),
        "eval_use_gather_object" => (json!({field: true}), ""),
        "eval_accumulation_steps" => (json!({field: 2}), ""),
        // Creates a repository at build: walked by the push tests against the local hub.
        "push_to_hub" => return None,
        "hub_private_repo" | "hub_always_push" => (json!({field: true}), ""),
        "hub_strategy" => (json!({field: "end"}), ""),
        "hub_revision" => (json!({field: "dev"}), ""),
        "tf32" => (json!({field: false}), ""),
        "accelerator_config" => (json!({field: {"non_blocking": true}}), ""),
        "parallelism_config" => (json!({field: {"tp_size": 2}}), "parallelism_config"),
        "dataloader_pin_memory" | "dataloader_in_order" | "remove_unused_columns" => {
            (json!({field: false}), "")
        }
        "dataloader_persistent_workers" => (json!({field: true, "dataloader_num_workers": 1}), ""),
        "dataloader_multiprocessing_context" => {
            (json!({field: "spawn", "dataloader_num_workers": 1}), "")
        }
        "length_column_name" => (json!({field: "n_tokens"}), ""),
        "ddp_static_graph" => (json!({field: true}), ""),
        "ddp_broadcast_buffers" => (json!({field: false}), ""),
        "debug" => (json!({field: "underflow_overflow"}), "debug"),
        _ => return None,
    })
}

/// How building a Trainer on tiny GPT-2 with the JSON arguments `extra` went.
#[derive(Debug)]
enum Built {
    Ok,
    /// The arguments were refused when read (the message).
    ReadError(String),
    /// The Trainer refused them (the message).
    BuildError(String),
}

fn build_with(dir: &Path, extra: &Value) -> Result<Built> {
    let mut dict = json!({
        "output_dir": dir.display().to_string(),
        "use_cpu": true,
        "report_to": "none",
        "max_steps": 1,
    });
    for (k, v) in extra.as_object().context("an object")? {
        dict[k] = v.clone();
    }
    let Value::Object(map) = dict else {
        unreachable!()
    };
    let args = match TrainingArguments::from_dict(map) {
        Ok(parsed) => parsed.args,
        Err(e) => return Ok(Built::ReadError(e.to_string())),
    };
    Ok(
        match Trainer::builder(initial_model()?, args)
            .train_dataset(small_train()?)
            .build()
        {
            Ok(_) => Built::Ok,
            Err(e) => Built::BuildError(e.to_string()),
        },
    )
}

#[test]
fn every_field_is_honoured_inert_or_refused() -> Result<()> {
    let _g = lock();
    // One row per field of upstream's table, in its order: a new field fails here until it
    // is given a row.
    let table: Vec<&str> = FIELD_SUPPORT.iter().map(|r| r.field).collect();
    let upstream: Vec<&str> = field_names().collect();
    assert_eq!(
        table, upstream,
        "FIELD_SUPPORT must list every TrainingArguments field in order"
    );

    assert_tests_exist(FIELD_SUPPORT)?;
    let dir = temp_dir("fields");
    std::fs::create_dir_all(&dir)?;
    for row in FIELD_SUPPORT {
        let Some((value, named)) = non_default(row.field) else {
            assert!(
                matches!(row.support, Support::Honoured(_) | Support::Partly(..)),
                "{}: an inert or refused field needs a non-default value in this walk",
                row.field
            );
            continue;
        };
        let refusal = match build_with(&dir, &value)? {
            Built::Ok => None,
            // Only a field with no JSON form upstream is refused as it is read.
            Built::ReadError(e) if row.field == "parallelism_config" => Some(e),
            Built::ReadError(e) => bail!("{}: {value} could not be read: {e}", row.field),
            Built::BuildError(e) => Some(e),
        };
        match (row.support, refusal) {
            (Support::Refused(_), None) => bail!("{}: {value} was accepted", row.field),
            (Support::Refused(_), Some(e)) => assert!(
                e.contains(&format!("`{named}`")),
                "{}: the refusal names another field: {e}",
                row.field
            ),
            (_, Some(e)) => bail!(
                "{}: {value} is refused, yet its row accepts it: {e}",
                row.field
            ),
            (_, None) => {}
        }
    }
    // A partly honoured value: accelerate's non-seedable sampler is refused by key.
    let refused = json!({"accelerator_config": {"use_seedable_sampler": false}});
    match build_with(&dir, &refused)? {
        Built::BuildError(e) => assert!(
            e.contains("`accelerator_config`") && e.contains("use_seedable_sampler"),
            "{e}"
        ),
        other => bail!("use_seedable_sampler false: {other:?}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[test]
fn the_field_tables_in_docs_list_every_field_and_key_as_the_trainer_treats_it() -> Result<()> {
    let readme = std::fs::read_to_string(workspace_root().join("docs/fields.md"))?;
    for (name, table) in [
        ("field-support", markdown_table(FIELD_SUPPORT, "field")),
        (
            "deepspeed-key-support",
            markdown_table(DEEPSPEED_KEY_SUPPORT, "DeepSpeed key"),
        ),
        (
            "fsdp-key-support",
            markdown_table(FSDP_KEY_SUPPORT, "`fsdp_config` key"),
        ),
    ] {
        let begin = format!("<!-- {name}:begin -->\n");
        let end = format!("<!-- {name}:end -->");
        let start = readme
            .find(&begin)
            .with_context(|| format!("docs/fields.md lacks the {name} markers"))?
            + begin.len();
        let stop = readme[start..]
            .find(&end)
            .context("docs/fields.md lacks the end marker")?
            + start;
        if readme[start..stop] != table {
            bail!("docs/fields.md's {name} table is stale; replace it with:\n{table}");
        }
    }
    Ok(())
}

/// Every test a row names as observing it exists in the workspace.
fn assert_tests_exist(rows: &[FieldSupport]) -> Result<()> {
    let mut sources = Vec::new();
    rust_sources(&workspace_root(), &mut sources)?;
    let text: String = sources
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .collect();
    for row in rows {
        let tests = match row.support {
            Support::Honoured(tests) | Support::Partly(tests, _) => tests,
            Support::Inert(_) | Support::Refused(_) => &[],
        };
        for test in tests {
            assert!(
                text.contains(&format!("fn {test}(")),
                "{}: the test `{test}` named as observing it does not exist",
                row.field
            );
        }
    }
    Ok(())
}

fn fixture(name: &str) -> Result<serde_json::Map<String, Value>> {
    let path = workspace_root()
        .join("integrations/deepspeed/tests/fixtures")
        .join(name);
    match serde_json::from_str(&std::fs::read_to_string(path)?)? {
        Value::Object(m) => Ok(m),
        _ => bail!("{name} is not an object"),
    }
}

#[test]
fn every_deepspeed_and_fsdp_key_is_honoured_inert_or_refused() -> Result<()> {
    assert_tests_exist(DEEPSPEED_KEY_SUPPORT)?;
    assert_tests_exist(FSDP_KEY_SUPPORT)?;
    // The documentation's configs, as the Trainer fills them, are accepted as they are.
    for name in ["ds_config_zero2.filled.json", "ds_config_zero3.filled.json"] {
        check_deepspeed_keys(&fixture(name)?)?;
    }
    // Each row's key with a value it accepts (a `.*` row through one key under it).
    for row in DEEPSPEED_KEY_SUPPORT {
        let key = row.field.replace(".*", ".buffer_count");
        let value = match row.field {
            "fp16.enabled" | "bf16.enabled" => json!(false),
            "optimizer.type" => json!("AdamW"),
            "scheduler.type" => json!("WarmupLR"),
            "zero_optimization.offload_optimizer.device"
            | "zero_optimization.offload_param.device" => json!("cpu"),
            _ => json!(true),
        };
        // Dotted keys as nested objects.
        let nested = key
            .split('.')
            .rev()
            .fold(value, |inner, part| json!({ part: inner }));
        let Value::Object(nested) = nested else {
            unreachable!()
        };
        check_deepspeed_keys(&nested).with_context(|| format!("{key} should be accepted"))?;
    }
    // What is refused, by key.
    let refused = [
        (
            json!({"gradient_predivide_factor": 2.0}),
            "gradient_predivide_factor",
        ),
        (
            json!({"zero_optimization": {"stage3_gather_16bit_weights_on_model_save": false}}),
            "zero_optimization.stage3_gather_16bit_weights_on_model_save",
        ),
        (
            json!({"activation_checkpointing": {"partition_activations": true}}),
            "activation_checkpointing.partition_activations",
        ),
    ];
    for (config, key) in refused {
        let Value::Object(config) = config else {
            unreachable!()
        };
        let err = check_deepspeed_keys(&config).expect_err(key).to_string();
        assert!(
            err.starts_with(&format!("invalid `deepspeed`: `{key}`: ")),
            "{err}"
        );
    }
    // The documents' fp16 and bf16 sections are accepted as written.
    let Value::Object(half) = json!({"fp16": {"enabled": true, "loss_scale": 0, "loss_scale_window": 1000,
        "hysteresis": 2, "min_loss_scale": 1}, "bf16": {"enabled": "auto"}})
    else {
        unreachable!()
    };
    check_deepspeed_keys(&half)?;

    for row in FSDP_KEY_SUPPORT {
        let mut config = serde_json::Map::new();
        config.insert(row.field.to_string(), json!(false));
        check_fsdp_keys(&config).with_context(|| format!("fsdp_config {} false", row.field))?;
        config.insert(row.field.to_string(), json!(true));
        let outcome = check_fsdp_keys(&config);
        match row.support {
            Support::Refused(_) => {
                let err = outcome.expect_err(row.field).to_string();
                assert!(
                    err.starts_with(&format!("invalid `fsdp_config`: `{}`: ", row.field)),
                    "{err}"
                );
            }
            _ => outcome.with_context(|| format!("fsdp_config {} true", row.field))?,
        }
    }
    let Value::Object(unknown) = json!({"param_dtype": "bf16"}) else {
        unreachable!()
    };
    let err = check_fsdp_keys(&unknown)
        .expect_err("unknown key")
        .to_string();
    assert!(err.contains("`param_dtype`"), "{err}");
    Ok(())
}

#[test]
fn adam_hyperparameters_reach_the_optimizer() -> Result<()> {
    let _g = lock();
    let dir = temp_dir("adam-hp");
    let mut args = small_args(&dir)?;
    args.adam_beta1 = 0.8;
    args.adam_beta2 = 0.95;
    args.adam_epsilon = 1e-6;
    let mut trainer = Trainer::builder(initial_model()?, args)
        .train_dataset(small_train()?)
        .build()?;
    trainer.create_optimizer_and_scheduler(10)?;
    let hp = trainer
        .optimizer()
        .context("an optimizer")?
        .hyperparameters();
    assert_eq!(hp["betas"], serde_json::json!([0.8, 0.95]), "{hp}");
    assert_eq!(hp["eps"], serde_json::json!(1e-6), "{hp}");
    Ok(())
}

#[test]
fn prediction_loss_only_and_drop_last_shape_the_loops() -> Result<()> {
    let _g = lock();
    let dir = temp_dir("loss-only");
    // 38 rows in batches of 4: 10 batches, 9 when the last partial one is dropped.
    for (drop_last, batches) in [(false, 10), (true, 9)] {
        let mut args = small_args(&dir)?;
        args.dataloader_drop_last = drop_last;
        let mut trainer = Trainer::builder(initial_model()?, args)
            .train_dataset(small_train()?)
            .build()?;
        assert_eq!(trainer.get_train_dataloader()?.len(), batches);
    }
    for loss_only in [false, true] {
        let mut args = small_args(&dir)?;
        args.prediction_loss_only = loss_only;
        let mut trainer = Trainer::builder(initial_model()?, args)
            .train_dataset(small_train()?)
            .build()?;
        let out = trainer.predict(small_train()?, "test")?;
        assert_eq!(out.predictions.is_none(), loss_only);
        assert!(out.metrics.contains_key("test_loss"));
    }
    Ok(())
}

#[test]
fn label_names_name_the_label_columns() -> Result<()> {
    let _g = lock();
    let dir = temp_dir("label-names");
    // Upstream's prediction_step: without every label name among the inputs, no loss.
    for (names, has_loss) in [(None, true), (Some(vec!["targets".to_string()]), false)] {
        let mut args = small_args(&dir)?;
        args.label_names = names;
        let mut trainer = Trainer::builder(initial_model()?, args)
            .train_dataset(small_train()?)
            .build()?;
        let out = trainer.predict(small_train()?, "test")?;
        assert_eq!(
            out.metrics.contains_key("test_loss"),
            has_loss,
            "{:?}",
            out.metrics
        );
    }
    Ok(())
}

fn run_losses(args: TrainingArguments, resume: Option<ResumeFrom>) -> Result<Vec<(i64, f64)>> {
    let mut trainer = Trainer::builder(initial_model()?, args)
        .train_dataset(small_train()?)
        .build()?;
    trainer.train(resume)?;
    Ok(losses(&trainer.state.log_history))
}

#[test]
fn data_seed_orders_the_data_and_seed_the_model() -> Result<()> {
    let _g = lock();
    let dir = temp_dir("data-seed");
    let with = |seed: u64, data_seed: Option<u64>| -> Result<Vec<(i64, f64)>> {
        let mut args = small_args(&dir)?;
        args.max_steps = 3;
        args.save_strategy = tchtrain_training_args::SaveStrategy::No;
        args.seed = seed;
        args.data_seed = data_seed;
        run_losses(args, None)
    };
    // Dropout is off, so the seed only orders the data unless data_seed does.
    let by_seed_11 = with(11, None)?;
    assert_eq!(with(7, Some(11))?, by_seed_11);
    assert_ne!(with(7, None)?, by_seed_11);
    Ok(())
}

#[test]
fn ignore_data_skip_starts_the_epoch_over() -> Result<()> {
    let _g = lock();
    let out = temp_dir("ignore-skip");
    let full = run_losses(small_args(&out)?, None)?;
    let ckpt = out.join("checkpoint-8");
    let resumed = |ignore: bool| -> Result<Vec<(i64, f64)>> {
        let dir = temp_dir(&format!("ignore-skip-{ignore}"));
        let mut args = small_args(&dir)?;
        args.ignore_data_skip = ignore;
        run_losses(args, Some(ResumeFrom::Path(ckpt.clone())))
    };
    // 5 steps per epoch: resuming at step 8 (mid-epoch 1) skips the epoch's first 6
    // batches, so step 9 equals the uninterrupted run's; with ignore_data_skip it trains on
    // the epoch's first batches instead.
    let step9 = |l: &[(i64, f64)]| l.iter().find(|(s, _)| *s == 9).map(|(_, x)| *x);
    assert!(step9(&full).is_some());
    assert_eq!(step9(&resumed(false)?), step9(&full));
    assert_ne!(step9(&resumed(true)?), step9(&full));
    Ok(())
}

#[test]
fn process_log_levels_follow_upstream() -> Result<()> {
    use log::LevelFilter;
    // Node-local rank 1 of a run whose global rank is 0 (RANK unset): it logs and saves as
    // the main process unless `*_on_each_node` makes the node's own rank count.
    let mut args = TrainingArguments {
        local_rank: 1,
        log_level: "info".into(),
        log_level_replica: "error".into(),
        ..TrainingArguments::default()
    };
    assert!(!args.should_log());
    assert_eq!(
        tchtrain_trainer::get_process_log_level(&args),
        LevelFilter::Error
    );
    args.log_on_each_node = false;
    assert_eq!(
        tchtrain_trainer::get_process_log_level(&args),
        LevelFilter::Info
    );
    args.log_level_replica = "debug".into();
    args.log_on_each_node = true;
    assert_eq!(
        tchtrain_trainer::get_process_log_level(&args),
        LevelFilter::Debug
    );
    assert!(
        args.should_save(),
        "save_on_each_node=false: the global rank 0 saves"
    );
    args.save_on_each_node = true;
    assert!(
        !args.should_save(),
        "save_on_each_node: node-local rank 1 does not"
    );
    Ok(())
}

#[test]
fn tf32_and_full_determinism_set_the_backends() -> Result<()> {
    let _g = lock();
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            let _ = tchtrain_accelerate::use_deterministic_algorithms(false, false);
        }
    }
    let _reset = Reset;
    let dir = temp_dir("backends");
    std::fs::create_dir_all(&dir)?;
    // Upstream's __post_init__ raises for --tf32 true without an Ampere GPU.
    match build_with(&dir, &json!({"tf32": true}))? {
        Built::BuildError(e) => {
            assert!(
                e.contains("--tf32 requires Ampere or a newer GPU arch"),
                "{e}"
            )
        }
        other => bail!("tf32 on the CPU: {other:?}"),
    }
    assert!(matches!(
        build_with(&dir, &json!({"tf32": false}))?,
        Built::Ok
    ));

    assert!(!tchtrain_accelerate::are_deterministic_algorithms_enabled());
    assert!(matches!(
        build_with(&dir, &json!({"full_determinism": true}))?,
        Built::Ok
    ));
    assert!(tchtrain_accelerate::are_deterministic_algorithms_enabled());
    assert_eq!(
        std::env::var("CUBLAS_WORKSPACE_CONFIG").as_deref(),
        Ok(":16:8")
    );

    // torch_empty_cache_steps: on the CPU upstream's clear_device_cache frees nothing; the
    // run is the plain run.
    let mut args = small_args(&dir)?;
    args.max_steps = 2;
    args.save_strategy = tchtrain_training_args::SaveStrategy::No;
    let plain = run_losses(args.clone(), None)?;
    args.torch_empty_cache_steps = Some(1);
    assert_eq!(run_losses(args, None)?, plain);
    Ok(())
}

/// `skip_memory_metrics=False`: upstream's memory metrics, by the names upstream's Trainer
/// gives them (transformers 5.23 on tiny GPT-2 reports exactly these keys): `init` and `train`
/// with the training's metrics and log, `eval` with `evaluate`'s (not logged; an evaluation
/// during training is not tracked), `test` with `predict`'s. By default there are none.
#[test]
fn memory_metrics_are_reported_as_upstream() -> Result<()> {
    let _g = lock();
    let dir = temp_dir("memory-metrics");
    let mem_keys = |m: &std::collections::BTreeMap<String, f64>| -> Vec<String> {
        m.keys().filter(|k| k.contains("_mem_")).cloned().collect()
    };
    for skip in [true, false] {
        let mut args = small_args(&dir)?;
        args.max_steps = 2;
        args.save_strategy = tchtrain_training_args::SaveStrategy::No;
        args.eval_strategy = tchtrain_training_args::IntervalStrategy::Steps;
        args.eval_steps = Some(1.0);
        args.skip_memory_metrics = skip;
        let mut trainer = Trainer::builder(initial_model()?, args)
            .train_dataset(small_train()?)
            .eval_dataset(small_train()?)
            .build()?;
        let train = trainer.train(None)?.metrics;
        let eval = trainer.evaluate(None, "eval")?;
        let test = trainer.predict(small_train()?, "test")?.metrics;
        if skip {
            assert!(mem_keys(&train).is_empty() && mem_keys(&eval).is_empty());
            assert!(mem_keys(&test).is_empty());
            continue;
        }
        assert_eq!(
            mem_keys(&train),
            [
                "before_init_mem_cpu",
                "init_mem_cpu_alloc_delta",
                "init_mem_cpu_peaked_delta",
                "train_mem_cpu_alloc_delta",
                "train_mem_cpu_peaked_delta"
            ]
        );
        assert_eq!(
            mem_keys(&eval),
            ["eval_mem_cpu_alloc_delta", "eval_mem_cpu_peaked_delta"]
        );
        assert_eq!(
            mem_keys(&test),
            ["test_mem_cpu_alloc_delta", "test_mem_cpu_peaked_delta"]
        );
        // The process holds hundreds of MB before the Trainer (libtorch, the model).
        assert!(train["before_init_mem_cpu"] > 50e6, "{train:?}");
        assert!(train["train_mem_cpu_peaked_delta"] >= 0.0);
        let history = &trainer.state.log_history;
        let summary = history
            .iter()
            .find(|e| e.get("train_runtime").is_some())
            .context("the training's summary")?;
        assert!(
            summary.get("train_mem_cpu_alloc_delta").is_some(),
            "logged with the training's"
        );
        let logged_eval = history
            .iter()
            .find(|e| e.get("eval_loss").is_some())
            .context("an evaluation during training")?;
        assert!(
            logged_eval.iter().all(|(k, _)| !k.contains("_mem_")),
            "not tracked inside the training"
        );
    }
    Ok(())
}

/// `include_for_metrics`: `compute_metrics` also sees the rows' `input_ids` (`"inputs"`,
/// padded with -100 as the predictions) and each row's batch loss (`"loss"`, whose numpy
/// mean is `eval_loss`); without it, neither.
#[test]
fn include_for_metrics_hands_inputs_and_losses_to_compute_metrics() -> Result<()> {
    use std::sync::{Arc, Mutex};
    let _g = lock();
    let dir = temp_dir("include-for-metrics");
    for include in [vec![], vec!["inputs".to_string(), "loss".to_string()]] {
        let mut args = small_args(&dir)?;
        args.per_device_eval_batch_size = 8;
        args.include_for_metrics = include.clone();
        type Seen = Option<(Option<tch::Tensor>, Option<tch::Tensor>)>;
        let seen: Arc<Mutex<Seen>> = Arc::new(Mutex::new(None));
        let sink = Arc::clone(&seen);
        let mut trainer = Trainer::builder(initial_model()?, args)
            .train_dataset(small_train()?)
            .compute_metrics(move |p: &tchtrain_trainer::EvalPrediction| {
                let copy = |t: &Option<tchtrain_trainer::EvalArrays>| {
                    t.as_ref().map(|t| t.array().map(|t| t.copy())).transpose()
                };
                *sink.lock().unwrap() = Some((copy(&p.inputs)?, copy(&p.losses)?));
                Ok(Default::default())
            })
            .build()?;
        let metrics = trainer.evaluate(Some(small_train()?), "eval")?;
        let (inputs, losses) = seen.lock().unwrap().take().context("compute_metrics ran")?;
        if include.is_empty() {
            assert!(inputs.is_none() && losses.is_none());
            continue;
        }
        // 38 rows of 64 tokens in batches of 8: every row's ids, in order.
        let inputs = inputs.context("inputs")?;
        assert_eq!(inputs.size(), [38, 64]);
        let rows = small_train()?;
        for i in [0usize, 17, 37] {
            let want = tch::Tensor::from_slice(&rows.get(i)?.input_ids);
            assert!(inputs.get(i as i64).equal(&want), "row {i}");
        }
        let losses = losses.context("losses")?;
        assert_eq!(losses.size(), [38]);
        // Rows of one batch share its loss.
        assert!(losses.get(8).equal(&losses.get(15)));
        let values = Vec::<f32>::try_from(&losses)?;
        let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / 38.0;
        assert!(
            (mean - metrics["eval_loss"]).abs() < 1e-6,
            "{mean} vs {metrics:?}"
        );
    }
    Ok(())
}

/// `eval_do_concat_batches=false`: `compute_metrics` and `predict` get one tensor per batch
/// (38 rows in batches of 8: 8, 8, 8, 8, 6), each equal to those rows of the concatenated
/// default, inputs and losses too; `eval_loss` is the same number; asking for one tensor
/// is an error that names the field.
#[test]
fn eval_do_concat_batches_false_keeps_one_tensor_per_batch() -> Result<()> {
    use std::sync::{Arc, Mutex};
    use tchtrain_trainer::EvalArrays;
    let _g = lock();
    let dir = temp_dir("eval-do-concat-batches");
    type Seen = Vec<(Vec<tch::Tensor>, Vec<tch::Tensor>, Vec<tch::Tensor>, String)>;
    let mut runs = Vec::new();
    for concat in [true, false] {
        let mut args = small_args(&dir)?;
        args.per_device_eval_batch_size = 8;
        args.eval_do_concat_batches = concat;
        args.include_for_metrics = vec!["inputs".into(), "loss".into()];
        let seen: Arc<Mutex<Seen>> = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&seen);
        let mut trainer = Trainer::builder(initial_model()?, args)
            .compute_metrics(move |p: &tchtrain_trainer::EvalPrediction| {
                let all = |a: Option<&EvalArrays>| -> Vec<tch::Tensor> {
                    a.map(|a| a.batches().iter().map(|t| t.copy()).collect())
                        .unwrap_or_default()
                };
                let err = match p.predictions.array() {
                    Ok(_) => String::new(),
                    Err(e) => e.to_string(),
                };
                sink.lock().unwrap().push((
                    all(Some(&p.predictions)),
                    all(p.inputs.as_ref()),
                    all(p.losses.as_ref()),
                    err,
                ));
                Ok(Default::default())
            })
            .build()?;
        let metrics = trainer.evaluate(Some(small_train()?), "eval")?;
        let predicted = trainer.predict(small_train()?, "test")?;
        let predictions = predicted.predictions.context("predictions")?;
        let seen = seen.lock().unwrap().remove(0);
        runs.push((metrics["eval_loss"], seen, predictions));
    }
    let (loss_concat, (preds, inputs, losses, err), predicted) = &runs[0];
    assert!(err.is_empty());
    assert_eq!(preds.len(), 1);
    assert_eq!(predicted.batches().len(), 1);
    let (loss_batches, (preds_b, inputs_b, losses_b, err_b), predicted_b) = &runs[1];
    assert_eq!(loss_concat.to_bits(), loss_batches.to_bits());
    assert!(err_b.contains("eval_do_concat_batches"), "{err_b}");
    assert!(matches!(predicted_b, EvalArrays::Batches(b) if b.len() == 5));
    for (whole, parts) in [(preds, preds_b), (inputs, inputs_b), (losses, losses_b)] {
        let rows: Vec<i64> = parts.iter().map(|t| t.size()[0]).collect();
        assert_eq!(rows, [8, 8, 8, 8, 6]);
        assert!(tch::Tensor::cat(parts, 0).equal(&whole[0]));
    }
    assert!(predicted_b.concatenated()?.equal(predicted.array()?));
    Ok(())
}

/// `debug="underflow_overflow"`: a run with the tracer logs the same numbers as one without
/// (it only reads); with one weight set to inf, the first forward stops the training with
/// upstream's `ValueError` message and no step is taken (the frames' report itself is
/// compared with upstream's in the models crate). `tpu_metrics_debug` is refused.
#[test]
fn debug_underflow_overflow_stops_training_at_the_first_inf() -> Result<()> {
    use tchtrain_training_args::{DebugOption, SaveStrategy};
    let _g = lock();
    let dir = temp_dir("debug-underflow-overflow");
    type Run = (Option<String>, Vec<(i64, f64)>, i64);
    let run = |debug: bool, inf: bool| -> Result<Run> {
        let mut args = small_args(&dir)?;
        args.max_steps = 2;
        args.save_strategy = SaveStrategy::No;
        if debug {
            args.debug = vec![DebugOption::UnderflowOverflow];
        }
        let model = initial_model()?;
        if inf {
            let w =
                model.var_store().variables()["transformer.h.1.mlp.c_fc.weight"].shallow_clone();
            let _ = tch::no_grad(|| w.get(0).get(0).fill_(f64::INFINITY));
        }
        let mut trainer = Trainer::builder(model, args)
            .train_dataset(small_train()?)
            .build()?;
        let err = trainer.train(None).err().map(|e| e.to_string());
        Ok((
            err,
            losses(&trainer.state.log_history),
            trainer.state.global_step,
        ))
    };
    let (err, plain, _) = run(false, false)?;
    assert_eq!(err, None);
    let (err, traced, _) = run(true, false)?;
    assert_eq!(err, None);
    assert_eq!(plain.len(), 2);
    assert_eq!(
        traced
            .iter()
            .map(|(s, l)| (*s, l.to_bits()))
            .collect::<Vec<_>>(),
        plain
            .iter()
            .map(|(s, l)| (*s, l.to_bits()))
            .collect::<Vec<_>>()
    );
    let (err, logged, step) = run(true, true)?;
    assert_eq!(
        err.as_deref(),
        Some(
            "DebugUnderflowOverflow: inf/nan detected, aborting as there is no point running further. Please scroll up above this traceback to see the activation values prior to this event."
        )
    );
    assert!(logged.is_empty() && step == 0, "{logged:?} at step {step}");

    let refused = json!({"debug": "tpu_metrics_debug"});
    match build_with(&dir, &refused)? {
        Built::BuildError(e) => assert!(e.contains("`debug`") && e.contains("TPU"), "{e}"),
        other => bail!("tpu_metrics_debug: {other:?}"),
    }
    Ok(())
}

/// Upstream's argument checks that have no field of their own (accelerate's plugins,
/// `create_accelerator_and_postprocess`), as a user meets them: accelerate's
/// `gradient_accumulation_kwargs` (refused here by key, `num_steps` included, which upstream
/// refuses with `gradient_accumulation_steps` > 1); a DeepSpeed config without
/// `zero_optimization` (accelerate's `DeepSpeedPlugin` message) when the Trainer is built;
/// `--fsdp` in one process, at `train()` with upstream's message.
#[test]
fn upstream_plugin_checks_refuse_with_their_messages() -> Result<()> {
    let _g = lock();
    let dir = temp_dir("plugin-checks");
    let cases = [
        (
            json!({"gradient_accumulation_steps": 4, "accelerator_config": {"gradient_accumulation_kwargs": {"num_steps": 2}}}),
            "gradient_accumulation_kwargs",
        ),
        (
            json!({"deepspeed": {"train_micro_batch_size_per_gpu": "auto"}}),
            "Please specify the ZeRO optimization config in the DeepSpeed config.",
        ),
    ];
    for (extra, want) in cases {
        match build_with(&dir, &extra)? {
            Built::BuildError(e) => assert!(e.contains(want), "{extra}: {e}"),
            other => bail!("{extra}: {other:?}"),
        }
    }
    let mut args = small_args(&dir)?;
    args.fsdp = Some(tchtrain_training_args::StrOrBool::Bool(true));
    args.post_init()?;
    let mut trainer = Trainer::builder(initial_model()?, args)
        .train_dataset(small_train()?)
        .build()?;
    let err = trainer.train(None).unwrap_err().to_string();
    assert_eq!(err, "fsdp: Using fsdp only works in distributed training.");
    assert_eq!(trainer.state.global_step, 0);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// `use_cache`: upstream's Trainer sets `model.config.use_cache = args.use_cache` when it is
/// built, so a model saved by it carries `"use_cache": false` by default (the assets' configs
/// say `true`), `true` when asked.
#[test]
fn use_cache_is_written_into_the_saved_config() -> Result<()> {
    let _g = lock();
    let dir = temp_dir("use-cache");
    for use_cache in [false, true] {
        let mut args = small_args(&dir)?;
        args.use_cache = use_cache;
        let trainer = Trainer::builder(initial_model()?, args)
            .train_dataset(small_train()?)
            .build()?;
        let saved = trainer.save_model(Some(&dir.join(format!("saved-{use_cache}"))))?;
        let config: Value =
            serde_json::from_str(&std::fs::read_to_string(saved.join("config.json"))?)?;
        assert_eq!(config["use_cache"], json!(use_cache));
    }
    Ok(())
}

/// The `mixed_precision` key of the documents' FSDP config (`fsdp_gpt2_bf16.json`), which
/// upstream's Trainer does not read: accepted when it names the flag's precision, refused
/// (naming both) when it contradicts it.
#[test]
fn fsdp_mixed_precision_key_follows_the_flag() -> Result<()> {
    let out = temp_dir("fsdp-mp-key");
    let config = |v: Value| v.as_object().cloned().unwrap_or_default();
    let mut args = TrainingArguments::new(out.display().to_string());
    args.bf16 = true;
    check_fsdp_mixed_precision(&config(json!({"mixed_precision": "bf16"})), &args)?;
    check_fsdp_mixed_precision(&config(json!({"mixed_precision": "bfloat16"})), &args)?;
    check_fsdp_mixed_precision(&config(json!({"cpu_offload": true})), &args)?;
    let err = check_fsdp_mixed_precision(&config(json!({"mixed_precision": "fp16"})), &args)
        .expect_err("fp16 against --bf16")
        .to_string();
    assert!(
        err.starts_with("invalid `fsdp_config`: `mixed_precision`=\"fp16\" contradicts the run's precision `bf16`"),
        "{err}"
    );
    args.bf16 = false;
    assert!(
        check_fsdp_mixed_precision(&config(json!({"mixed_precision": "bf16"})), &args).is_err()
    );
    check_fsdp_mixed_precision(&config(json!({"mixed_precision": "no"})), &args)?;
    Ok(())
}

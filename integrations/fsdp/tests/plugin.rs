//! `fsdp_plugin_args` equals upstream's `TrainingArguments.fsdp_plugin_args`
//! (`scripts/reference/fsdp_config.py`) for every case; the combinations upstream rejects
//! are rejected (with upstream's message where the check lives in this crate); the
//! Trainer's FSDP checks.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;
use tchtrain_fsdp::{
    FsdpPlugin, ShardingStrategy, StateDictType, check_trainer_compat, check_wrap_classes,
    fsdp_plugin_args,
};
use tchtrain_training_args::TrainingArguments;

fn reference() -> Result<Vec<Value>> {
    let dir = std::env::var_os("TCHTRAIN_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets"));
    let path = dir.join("reference/fsdp_config/fsdp_config.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("{} (run `cargo xtask setup`)", path.display()))?;
    Ok(serde_json::from_str::<Value>(&text)?
        .as_array()
        .context("cases")?
        .clone())
}

fn args_for(kwargs: &Value) -> std::result::Result<TrainingArguments, String> {
    let mut dict = kwargs.as_object().unwrap().clone();
    dict.insert("output_dir".into(), "unused".into());
    TrainingArguments::from_dict(dict)
        .map(|p| p.args)
        .map_err(|e| e.to_string())
}

#[test]
fn plugin_args_match_upstream() -> Result<()> {
    let cases = reference()?;
    assert!(cases.len() >= 10);
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let ours: std::result::Result<Value, String> = args_for(&case["kwargs"]).and_then(|a| {
            fsdp_plugin_args(&a)
                .map(|m| Value::Object(m.unwrap_or_default()))
                .map_err(|e| e.to_string())
        });
        match (&ours, case["result"].get("error")) {
            (Ok(v), None) => {
                assert_eq!(v, &case["result"]["plugin_args"], "{name}");
                // accelerate's plugin accepts the arguments, or refuses them with its message
                // (an error that only says the machine has no GPU does not apply here: the
                // ranks shard on the CPU).
                let plugin = FsdpPlugin::from_args(v.as_object().unwrap());
                match (&plugin, case["result"].get("plugin_error")) {
                    (Ok(_), None) => {}
                    (Err(e), Some(msg)) => assert_eq!(&e.to_string(), msg, "{name}"),
                    _ => panic!("{name}: plugin {plugin:?}, upstream {}", case["result"]),
                }
            }
            (Err(e), Some(msg)) => {
                let msg = msg.as_str().unwrap();
                // Checks in this crate carry upstream's message verbatim; the ones in
                // training-args name the field and the offending value.
                assert!(
                    e == msg || msg.split(['`', ' ']).any(|w| w.len() > 4 && e.contains(w)),
                    "{name}: ours {e:?} vs upstream {msg:?}"
                );
            }
            _ => panic!("{name}: ours {ours:?}, upstream {}", case["result"]),
        }
    }
    Ok(())
}

#[test]
fn typed_plugin_and_trainer_checks() -> Result<()> {
    let cases = reference()?;
    let find = |n: &str| {
        cases.iter().find(|c| c["name"] == n).unwrap()["result"]["plugin_args"]
            .as_object()
            .unwrap()
            .clone()
    };
    let p = FsdpPlugin::from_args(&find("transformer_wrap"))?;
    assert_eq!(p.sharding_strategy, ShardingStrategy::FullShard);
    assert_eq!(p.state_dict_type, StateDictType::ShardedStateDict);
    assert_eq!(
        p.transformer_cls_names_to_wrap,
        vec!["GPT2Block".to_string()]
    );
    assert_eq!(
        FsdpPlugin::from_args(&find("legacy_shard_grad_op"))?.sharding_strategy,
        ShardingStrategy::ShardGradOp
    );
    assert_eq!(
        FsdpPlugin::from_args(&find("v1_no_shard"))?.sharding_strategy,
        ShardingStrategy::NoShard
    );
    assert!(FsdpPlugin::from_args(&find("legacy_full_shard_offload"))?.cpu_offload);

    let single = TrainingArguments::default();
    let err = check_trainer_compat(&single, &p, false, 1, false)
        .unwrap_err()
        .to_string();
    assert_eq!(err, "Using fsdp only works in distributed training.");
    let err = check_trainer_compat(&single, &p, true, 2, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("--deepspeed"), "{err}");
    // Upstream `create_accelerator_and_postprocess`'s FSDP checks (on 2 processes), then
    // `__init__`'s optimizers check.
    assert!(check_trainer_compat(&single, &p, false, 2, false).is_ok());
    let err = check_trainer_compat(&single, &p, false, 2, true)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("Passing `optimizers` is not allowed if PyTorch FSDP is enabled."),
        "{err}"
    );
    let with_ac = FsdpPlugin {
        activation_checkpointing: true,
        ..p.clone()
    };
    let args = TrainingArguments {
        activation_checkpointing: true,
        ..TrainingArguments::default()
    };
    let err = check_trainer_compat(&args, &with_ac, false, 2, false)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "`fsdp_config['activation_checkpointing']` (FSDP's own activation checkpointing) and the `activation_checkpointing` training argument can't both be set to True. Use FSDP's activation checkpointing when using FSDP."
    );
    let args = TrainingArguments {
        save_only_model: true,
        load_best_model_at_end: true,
        ..TrainingArguments::default()
    };
    let err = check_trainer_compat(&args, &p, false, 2, false)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "FSDP can't be used with `save_only_model` along with `load_best_model_at_end`."
    );
    let args = TrainingArguments {
        save_only_model: true,
        ..TrainingArguments::default()
    };
    assert_eq!(p.state_dict_type, StateDictType::ShardedStateDict);
    let err = check_trainer_compat(&args, &p, false, 2, false)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "save_only_model option is not compatible with FSDP state dict type 'SHARDED_STATE_DICT'"
    );
    Ok(())
}

/// `transformer_layer_cls_to_wrap` names classes of the model, as accelerate's
/// `set_auto_wrap_policy` finds them: the model's layer classes (upstream's names, e.g.
/// `Qwen3_5DecoderLayer`) pass, another is refused with accelerate's message; a model whose
/// layer classes are not known is not checked, nor a policy that wraps by size.
#[test]
fn wrap_classes_are_the_models() -> Result<()> {
    let plugin = |classes: &[&str], policy: &str| FsdpPlugin {
        version: 2,
        sharding_strategy: ShardingStrategy::FullShard,
        cpu_offload: false,
        auto_wrap_policy: policy.into(),
        transformer_cls_names_to_wrap: classes.iter().map(|c| c.to_string()).collect(),
        min_num_params: 0,
        cpu_ram_efficient_loading: false,
        state_dict_type: StateDictType::FullStateDict,
        activation_checkpointing: false,
    };
    let layers = vec!["Qwen3_5DecoderLayer".to_string()];
    check_wrap_classes(
        &plugin(&["Qwen3_5DecoderLayer"], "TRANSFORMER_BASED_WRAP"),
        &layers,
    )?;
    check_wrap_classes(&plugin(&[], "TRANSFORMER_BASED_WRAP"), &layers)?;
    let err = check_wrap_classes(
        &plugin(
            &["Qwen3_5DecoderLayer", "LlamaDecoderLayer"],
            "TRANSFORMER_BASED_WRAP",
        ),
        &layers,
    )
    .err()
    .context("a class the model lacks")?
    .to_string();
    assert!(
        err.starts_with(
            "Could not find the transformer layer class LlamaDecoderLayer in the model."
        ),
        "{err}"
    );
    check_wrap_classes(
        &plugin(&["LlamaDecoderLayer"], "TRANSFORMER_BASED_WRAP"),
        &[],
    )?;
    check_wrap_classes(&plugin(&["LlamaDecoderLayer"], "SIZE_BASED_WRAP"), &layers)?;
    Ok(())
}

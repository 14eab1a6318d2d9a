//! The FSDP plugin arguments upstream hands to Accelerate (`TrainingArguments.fsdp_plugin_args`,
//! the second half of `_process_fsdp_args`), as a JSON map equal to upstream's and as a
//! typed [`FsdpPlugin`], plus the Trainer's FSDP checks.

use serde_json::{Map, Value, json};
use tchtrain_training_args::{DictOrPath, StrOrBool, TrainingArguments};

use crate::{Error, Result};

/// Accelerate's `FSDP_AUTO_WRAP_POLICY`.
pub const FSDP_AUTO_WRAP_POLICY: [&str; 3] =
    ["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"];
/// Accelerate's `FSDP_STATE_DICT_TYPE`.
pub const FSDP_STATE_DICT_TYPE: [&str; 3] =
    ["FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"];

fn str_to_bool(key: &'static str, v: &Value) -> Result<bool> {
    let s = match v {
        Value::String(s) => s.to_lowercase(),
        Value::Bool(b) => if *b { "true" } else { "false" }.into(),
        other => other.to_string().to_lowercase(),
    };
    match s.as_str() {
        "y" | "yes" | "t" | "true" | "on" | "1" => Ok(true),
        "n" | "no" | "f" | "false" | "off" | "0" => Ok(false),
        _ => Err(Error::InvalidConfig {
            key,
            value: s,
            fix: "use a truth value (true/false, yes/no, 1/0)",
        }),
    }
}

fn py_str(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Bool(b) => if *b { "True" } else { "False" }.into(),
        other => other.to_string(),
    }
}

/// `TrainingArguments.fsdp_plugin_args`: `None` when FSDP is off (or on the XLA path).
/// Expects `args` after `post_init()` (which normalises `fsdp_config`).
pub fn fsdp_plugin_args(args: &TrainingArguments) -> Result<Option<Map<String, Value>>> {
    if !matches!(args.fsdp, Some(StrOrBool::Bool(true))) {
        return Ok(None);
    }
    let config = match &args.fsdp_config {
        Some(DictOrPath::Dict(d)) => d.clone(),
        _ => {
            return Err(Error::InvalidConfig {
                key: "fsdp_config",
                value: "not normalised".into(),
                fix: "call TrainingArguments::post_init() first",
            });
        }
    };
    if config.get("xla").is_some_and(|v| v.as_bool() == Some(true)) {
        return Ok(None);
    }
    let version = config
        .get("version")
        .map(|v| {
            v.as_i64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        })
        .unwrap_or(Some(2))
        .ok_or(Error::InvalidConfig {
            key: "version",
            value: config.get("version").map(py_str).unwrap_or_default(),
            fix: "use 1 or 2",
        })?;
    let mut out = Map::new();
    out.insert("fsdp_version".into(), json!(version));
    if config
        .get("cpu_offload")
        .is_some_and(|v| v.as_bool() == Some(true))
    {
        out.insert("cpu_offload".into(), json!(true));
    }
    let policy = config
        .get("auto_wrap_policy")
        .map(py_str)
        .unwrap_or_else(|| FSDP_AUTO_WRAP_POLICY[0].into());
    if !FSDP_AUTO_WRAP_POLICY.contains(&policy.as_str()) {
        return Err(Error::Upstream(
            format!(
                "`auto_wrap_policy` must be one of {:?}, got {policy}.",
                FSDP_AUTO_WRAP_POLICY
            )
            .replace('"', "'"),
        ));
    }
    out.insert("auto_wrap_policy".into(), json!(policy));
    // Kept as given (accelerate's plugin refuses a float, see `FsdpPlugin::from_args`).
    let min_num_params = config.get("min_num_params").cloned().unwrap_or(json!(0));
    if policy == FSDP_AUTO_WRAP_POLICY[1] && min_num_params.as_f64().is_some_and(|n| n > 0.0) {
        out.insert("min_num_params".into(), min_num_params);
    } else if policy == FSDP_AUTO_WRAP_POLICY[0]
        && let Some(Value::Array(classes)) = config.get("transformer_layer_cls_to_wrap")
    {
        let names: Vec<String> = classes.iter().map(py_str).collect();
        out.insert(
            "transformer_cls_names_to_wrap".into(),
            json!(names.join(",")),
        );
    }
    let cpu_ram = config
        .get("cpu_ram_efficient_loading")
        .cloned()
        .unwrap_or(json!("false"));
    out.insert(
        "cpu_ram_efficient_loading".into(),
        json!(str_to_bool("cpu_ram_efficient_loading", &cpu_ram)?),
    );
    let sdt = config
        .get("state_dict_type")
        .cloned()
        .unwrap_or(json!("FULL_STATE_DICT"));
    out.insert("state_dict_type".into(), sdt);
    if let Some(v) = config.get("activation_checkpointing") {
        out.insert(
            "activation_checkpointing".into(),
            json!(str_to_bool("activation_checkpointing", v)?),
        );
    }
    if version == 2 {
        let v = config
            .get("reshard_after_forward")
            .cloned()
            .unwrap_or(json!(true));
        out.insert(
            "reshard_after_forward".into(),
            json!(str_to_bool("reshard_after_forward", &v)?),
        );
    } else {
        let v = config
            .get("reshard_after_forward")
            .map(py_str)
            .unwrap_or_else(|| "full_shard".into());
        out.insert("reshard_after_forward".into(), json!(v.to_lowercase()));
        let get_bool = |key: &'static str, default: &str| {
            str_to_bool(key, config.get(key).unwrap_or(&json!(default)))
        };
        out.insert(
            "forward_prefetch".into(),
            json!(get_bool("forward_prefetch", "false")?),
        );
        let bp = config
            .get("backward_prefetch")
            .map(py_str)
            .unwrap_or_else(|| "NO_PREFETCH".into());
        out.insert("backward_prefetch".into(), json!(bp.to_uppercase()));
        out.insert(
            "use_orig_params".into(),
            json!(get_bool("use_orig_params", "true")?),
        );
        out.insert(
            "sync_module_states".into(),
            json!(get_bool("sync_module_states", "true")?),
        );
        if let Some(v) = config.get("limit_all_gathers") {
            out.insert(
                "limit_all_gathers".into(),
                json!(str_to_bool("limit_all_gathers", v)?),
            );
        }
    }
    Ok(Some(out))
}

/// How parameters, gradients and optimizer state are sharded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardingStrategy {
    /// Parameters, gradients and optimizer state sharded; parameters re-sharded after forward.
    FullShard,
    /// Gradients and optimizer state sharded; parameters kept gathered between forward and backward.
    ShardGradOp,
    /// Nothing sharded (DDP-like), FSDP1 only.
    NoShard,
}

/// What a checkpoint holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateDictType {
    /// One full state dict gathered on rank 0.
    FullStateDict,
    /// Each rank's local shards, unflattened.
    LocalStateDict,
    /// Each rank's shards with their global layout.
    ShardedStateDict,
}

/// The typed form of the plugin arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct FsdpPlugin {
    /// 1 or 2.
    pub version: i64,
    /// The sharding strategy.
    pub sharding_strategy: ShardingStrategy,
    /// Offload parameters / gradients / optimizer state to CPU.
    pub cpu_offload: bool,
    /// `TRANSFORMER_BASED_WRAP`, `SIZE_BASED_WRAP` or `NO_WRAP`.
    pub auto_wrap_policy: String,
    /// Layer classes that become FSDP units (transformer-based wrap).
    pub transformer_cls_names_to_wrap: Vec<String>,
    /// Minimum parameters per unit (size-based wrap).
    pub min_num_params: i64,
    /// Load weights on rank 0 only and broadcast.
    pub cpu_ram_efficient_loading: bool,
    /// Checkpoint form.
    pub state_dict_type: StateDictType,
    /// FSDP's own activation checkpointing.
    pub activation_checkpointing: bool,
}

impl FsdpPlugin {
    /// The typed plugin from [`fsdp_plugin_args`]' map.
    pub fn from_args(map: &Map<String, Value>) -> Result<Self> {
        let version = map.get("fsdp_version").and_then(Value::as_i64).unwrap_or(2);
        let sharding_strategy = match map.get("reshard_after_forward") {
            Some(Value::Bool(true)) => ShardingStrategy::FullShard,
            Some(Value::Bool(false)) => ShardingStrategy::ShardGradOp,
            Some(Value::String(s)) => match s.as_str() {
                "full_shard" | "1" => ShardingStrategy::FullShard,
                "shard_grad_op" | "2" => ShardingStrategy::ShardGradOp,
                "no_shard" | "3" => ShardingStrategy::NoShard,
                other => {
                    return Err(Error::InvalidConfig {
                        key: "reshard_after_forward",
                        value: other.into(),
                        fix: "use full_shard, shard_grad_op or no_shard (hybrid sharding needs several nodes)",
                    });
                }
            },
            _ => ShardingStrategy::FullShard,
        };
        let state_dict_type = match map
            .get("state_dict_type")
            .map(py_str)
            .as_deref()
            .unwrap_or("FULL_STATE_DICT")
        {
            "FULL_STATE_DICT" => StateDictType::FullStateDict,
            "LOCAL_STATE_DICT" => StateDictType::LocalStateDict,
            "SHARDED_STATE_DICT" => StateDictType::ShardedStateDict,
            other => {
                return Err(Error::InvalidConfig {
                    key: "state_dict_type",
                    value: other.into(),
                    fix: "use FULL_STATE_DICT, LOCAL_STATE_DICT or SHARDED_STATE_DICT",
                });
            }
        };
        // accelerate's `FullyShardedDataParallelPlugin.__post_init__` checks, in its order.
        let min_num_params = match map.get("min_num_params") {
            None => 0,
            Some(v) => v.as_i64().ok_or_else(|| {
                let (repr, ty) = match v.as_f64() {
                    Some(x) if x.fract() == 0.0 && x.abs() < 1e16 => (format!("{x:.1}"), "float"),
                    Some(x) => (x.to_string(), "float"),
                    None => (py_str(v), "str"),
                };
                Error::Upstream(format!(
                    "`min_num_params` must be an integer. Got {repr} of type <class '{ty}'>"
                ))
            })?,
        };
        if version == 2 && state_dict_type == StateDictType::LocalStateDict {
            return Err(Error::Upstream("FSDP2 does not support LOCAL_STATE_DICT. Please set `fsdp_state_dict_type` to `SHARDED_STATE_DICT` or `FULL_STATE_DICT`.".into()));
        }
        Ok(Self {
            version,
            sharding_strategy,
            cpu_offload: map
                .get("cpu_offload")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            auto_wrap_policy: map
                .get("auto_wrap_policy")
                .map(py_str)
                .unwrap_or_else(|| FSDP_AUTO_WRAP_POLICY[0].into()),
            transformer_cls_names_to_wrap: map
                .get("transformer_cls_names_to_wrap")
                .and_then(Value::as_str)
                .map(|s| s.split(',').map(str::to_string).collect())
                .unwrap_or_default(),
            min_num_params,
            cpu_ram_efficient_loading: map
                .get("cpu_ram_efficient_loading")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            state_dict_type,
            activation_checkpointing: map
                .get("activation_checkpointing")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        })
    }
}

/// The Trainer's FSDP checks, in upstream's order: `create_accelerator_and_postprocess`'s
/// (which `__init__` calls first), then `__init__`'s, for a run of `world_size` processes
/// with `optimizers_passed` (an optimizer or scheduler given to the Trainer).
pub fn check_trainer_compat(
    args: &TrainingArguments,
    plugin: &FsdpPlugin,
    deepspeed_enabled: bool,
    world_size: usize,
    optimizers_passed: bool,
) -> Result<()> {
    check_accelerator_compat(args, plugin)?;
    if deepspeed_enabled {
        return Err(Error::Upstream("Using --fsdp xxx together with --deepspeed is not possible, deactivate one of those flags.".into()));
    }
    if world_size <= 1 {
        return Err(Error::Upstream(
            "Using fsdp only works in distributed training.".into(),
        ));
    }
    if optimizers_passed {
        return Err(Error::Upstream("Passing `optimizers` is not allowed if PyTorch FSDP is enabled. You should subclass `Trainer` and override the `create_optimizer_and_scheduler` method.".into()));
    }
    Ok(())
}

/// `create_accelerator_and_postprocess`'s FSDP checks.
fn check_accelerator_compat(args: &TrainingArguments, plugin: &FsdpPlugin) -> Result<()> {
    if plugin.activation_checkpointing && args.activation_checkpointing {
        return Err(Error::Upstream("`fsdp_config['activation_checkpointing']` (FSDP's own activation checkpointing) and the `activation_checkpointing` training argument can't both be set to True. Use FSDP's activation checkpointing when using FSDP.".into()));
    }
    if args.save_only_model && args.load_best_model_at_end {
        return Err(Error::Upstream(
            "FSDP can't be used with `save_only_model` along with `load_best_model_at_end`.".into(),
        ));
    }
    if args.save_only_model && plugin.state_dict_type == StateDictType::ShardedStateDict {
        return Err(Error::Upstream("save_only_model option is not compatible with FSDP state dict type 'SHARDED_STATE_DICT'".into()));
    }
    Ok(())
}

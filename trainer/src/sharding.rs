//! The DeepSpeed / FSDP policy of a sharded run, read off the arguments before any engine
//! exists: which integration asked (with its processed config or plugin), the offload
//! settings of a DeepSpeed config, and whether a checkpoint holds its weights only as
//! shards. The Trainer's sharded-run methods (`zero.rs`) build on it.

use std::path::Path;

use tchtrain_deepspeed::HfTrainerDeepSpeedConfig;
use tchtrain_fsdp::FsdpPlugin;
use tchtrain_training_args::{DictOrPath, StrOrBool, TrainingArguments};

use crate::error::{Error, Result};

/// Which integration asked for sharding, with its settings.
#[derive(Debug)]
pub(crate) enum ShardingSource {
    /// `--deepspeed` (the processed config is `Trainer::deepspeed`).
    DeepSpeed,
    /// `--fsdp`, with the plugin.
    Fsdp(FsdpPlugin),
}

/// The DeepSpeed config named by `args.deepspeed`, if any; like accelerate's
/// `DeepSpeedPlugin` (which `TrainingArguments` builds), one without a `zero_optimization`
/// section is refused with its message.
pub(crate) fn deepspeed_config(
    args: &TrainingArguments,
) -> Result<Option<HfTrainerDeepSpeedConfig>> {
    let ds = match &args.deepspeed {
        None => return Ok(None),
        Some(DictOrPath::Dict(d)) => {
            HfTrainerDeepSpeedConfig::from_value(serde_json::Value::Object(d.clone()))?
        }
        Some(DictOrPath::Path(p)) => HfTrainerDeepSpeedConfig::from_path_or_json(p)?,
    };
    if ds.config.get("zero_optimization").is_none() {
        return Err(Error::InvalidArgument {
            field: "deepspeed",
            detail: "Please specify the ZeRO optimization config in the DeepSpeed config. (accelerate's message); add a \"zero_optimization\" section, e.g. {\"stage\": 2}".into(),
        });
    }
    Ok(Some(ds))
}

/// Where a DeepSpeed config offloads to: `(device, pin_memory)` for `offload_param` and
/// for `offload_optimizer`, each `None` when absent or `"none"`.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Offload {
    pub param: Option<(tch::Device, bool)>,
    pub optimizer: Option<(tch::Device, bool)>,
}

/// The `zero_optimization.offload_param` / `offload_optimizer` sections of a DeepSpeed
/// config: `"device": "cpu"` (with its `pin_memory`) is supported; an error naming the key
/// for what the engine does not do (`nvme`, an unknown device).
pub(crate) fn offload_settings(ds: &HfTrainerDeepSpeedConfig) -> Result<Offload> {
    let section = |name: &str| -> Result<Option<(tch::Device, bool)>> {
        let key = format!("zero_optimization.{name}.device");
        let device = ds
            .get_value(&key)
            .and_then(|v| v.as_str())
            .unwrap_or("none")
            .to_string();
        let refuse = |detail: String| Error::InvalidArgument {
            field: "deepspeed",
            detail: format!("{key}=\"{device}\": {detail}"),
        };
        match device.as_str() {
            "none" => Ok(None),
            "cpu" => {
                let pin = ds
                    .get_value(&format!("zero_optimization.{name}.pin_memory"))
                    .and_then(|v| v.as_bool())
                    .unwrap_or(false);
                Ok(Some((tch::Device::Cpu, pin)))
            }
            "nvme" => Err(refuse(
                "NVMe offload (DeepSpeed's async I/O to nvme_path) is not implemented by this ZeRO engine: use \"cpu\" or \"none\"".into(),
            )),
            _ => Err(refuse(
                "DeepSpeed's offload devices are \"cpu\", \"nvme\" and \"none\"; this engine offloads to \"cpu\"".into(),
            )),
        }
    };
    let offload = Offload {
        param: section("offload_param")?,
        optimizer: section("offload_optimizer")?,
    };
    if offload.param.is_some() || offload.optimizer.is_some() {
        // Upstream's note for a non-DeepSpeed optimizer with offload; every optimizer here
        // runs on the CPU.
        log::info!(
            "ZeRO offload to the CPU ({}{}) with the Trainer's optimizer",
            if offload.param.is_some() {
                "parameters "
            } else {
                ""
            },
            if offload.optimizer.is_some() {
                "optimizer"
            } else {
                ""
            }
        );
    }
    Ok(offload)
}

/// Whether the arguments ask for FSDP (`--fsdp` given).
pub(crate) fn fsdp_requested(args: &TrainingArguments) -> bool {
    matches!(args.fsdp, Some(StrOrBool::Bool(true)))
}

/// Whether checkpoint `ckpt` holds its weights only as shards: no `model.safetensors`
/// (nor its index) but shard files (FSDP's SHARDED_STATE_DICT). Resuming it skips the
/// full-model load; the shards restore the weights ([`Trainer::load_sharded_state`]).
pub(crate) fn weights_only_in_shards(ckpt: &Path) -> bool {
    !ckpt.join(tchtrain_models::SAFE_WEIGHTS_NAME).is_file()
        && !ckpt
            .join(tchtrain_models::SAFE_WEIGHTS_INDEX_NAME)
            .is_file()
        && tchtrain_deepspeed::find_shard_dir(ckpt).is_ok()
}

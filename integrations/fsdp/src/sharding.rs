//! FSDP's sharding strategies and auto-wrap policies mapped onto `tchtrain-accelerate`'s
//! ZeRO engine: `NO_SHARD` is DDP, `SHARD_GRAD_OP` is ZeRO stage 2 and `FULL_SHARD` is
//! ZeRO stage 3 whose units (one flat buffer each, gathered together) are the wrapped
//! modules.
//!
//! A wrap unit is a parameter-name prefix. `TRANSFORMER_BASED_WRAP` wraps every decoder
//! layer whose class is in `transformer_layer_cls_to_wrap` (tchtrain's models name their
//! layer lists as upstream, so a class is recognised by its list: `GPT2Block` is
//! `*.h.{i}.`, `LlamaDecoderLayer` / `MistralDecoderLayer` / ... `*.layers.{i}.`,
//! `BertLayer` `*.layer.{i}.`); with no class named, every layer of those lists (upstream's
//! default, the model's `_no_split_modules`). `SIZE_BASED_WRAP` wraps each such layer
//! holding at least `min_num_params` parameters; `NO_WRAP` has the root unit only.

use tch::Tensor;

use crate::error::{Error, Result};
use tchtrain_accelerate::ZeroStage;

use crate::plugin::{FsdpPlugin, ShardingStrategy};

/// The ZeRO stage of an FSDP sharding strategy (`None`: `NO_SHARD`, plain DDP).
pub fn zero_stage_for(strategy: ShardingStrategy) -> Option<ZeroStage> {
    match strategy {
        ShardingStrategy::NoShard => None,
        ShardingStrategy::ShardGradOp => Some(ZeroStage::Gradients),
        ShardingStrategy::FullShard => Some(ZeroStage::Weights),
    }
}

/// The name of the layer list a decoder-layer class lives in.
fn list_of_class(class: &str) -> Option<&'static str> {
    match class {
        "GPT2Block" => Some("h"),
        "BertLayer" => Some("layer"),
        c if c.ends_with("DecoderLayer") => Some("layers"),
        _ => None,
    }
}

/// The layer prefixes (`transformer.h.0.`, ...) among `names`, for the lists in `lists`,
/// in order of first appearance of each layer index (numerically sorted per list).
fn layer_prefixes(names: &[String], lists: &[&str]) -> Vec<String> {
    let mut found: Vec<(String, i64, String)> = Vec::new();
    for name in names {
        let parts: Vec<&str> = name.split('.').collect();
        for i in 1..parts.len().saturating_sub(1) {
            if lists.contains(&parts[i - 1])
                && let Ok(idx) = parts[i].parse::<i64>()
            {
                let list = parts[..i].join(".");
                let prefix = format!("{list}.{idx}.");
                if !found.iter().any(|(_, _, p)| *p == prefix) {
                    found.push((list, idx, prefix));
                }
                break;
            }
        }
    }
    found.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    found.into_iter().map(|(_, _, p)| p).collect()
}

/// accelerate's `set_auto_wrap_policy` check: every class `plugin` wraps is one of the
/// model's layer classes `layer_classes` (its `_no_split_modules`; empty: not known, nothing
/// checked), else accelerate's error.
pub fn check_wrap_classes(plugin: &FsdpPlugin, layer_classes: &[String]) -> Result<()> {
    if layer_classes.is_empty() || plugin.auto_wrap_policy != "TRANSFORMER_BASED_WRAP" {
        return Ok(());
    }
    match plugin
        .transformer_cls_names_to_wrap
        .iter()
        .map(|c| c.trim())
        .find(|c| !layer_classes.iter().any(|k| k == c))
    {
        Some(missing) => Err(Error::Upstream(format!(
            "Could not find the transformer layer class {missing} in the model. (its layers are {}: name those in fsdp_config.transformer_layer_cls_to_wrap, or leave the key out to wrap every layer)",
            layer_classes.join(", ")
        ))),
        None => Ok(()),
    }
}

/// The wrap units (parameter-name prefixes) of a model with parameters `named` under
/// `plugin`'s auto-wrap policy (see the module docs).
pub fn auto_wrap_units(named: &[(String, Tensor)], plugin: &FsdpPlugin) -> Vec<String> {
    let names: Vec<String> = named.iter().map(|(n, _)| n.clone()).collect();
    let all_lists = ["h", "layers", "layer"];
    match plugin.auto_wrap_policy.as_str() {
        "NO_WRAP" => Vec::new(),
        "SIZE_BASED_WRAP" => layer_prefixes(&names, &all_lists)
            .into_iter()
            .filter(|p| {
                let n: i64 = named
                    .iter()
                    .filter(|(name, _)| name.starts_with(p.as_str()))
                    .map(|(_, t)| t.numel() as i64)
                    .sum();
                n >= plugin.min_num_params
            })
            .collect(),
        _ => {
            let lists: Vec<&str> = if plugin.transformer_cls_names_to_wrap.is_empty() {
                all_lists.to_vec()
            } else {
                plugin
                    .transformer_cls_names_to_wrap
                    .iter()
                    .filter_map(|c| list_of_class(c.trim()))
                    .collect()
            };
            layer_prefixes(&names, &lists)
        }
    }
}

//! Upstream `args.to_dict()` as the integrations see it: the fields in upstream's declaration
//! order, with Python's value types (what MLflow logs as params and TensorBoard writes as the
//! `args` text).

use tchtrain_training_args::{JsonMap, JsonValue, TrainingArguments, loads};

/// The order upstream's `AcceleratorConfig` declares its fields (its `to_dict()` order).
const ACCELERATOR_CONFIG_ORDER: [&str; 6] = [
    "split_batches",
    "dispatch_batches",
    "even_batches",
    "use_seedable_sampler",
    "non_blocking",
    "gradient_accumulation_kwargs",
];

/// Upstream `args.to_dict()` in its field order, `accelerator_config` as a dict in its
/// declaration order (other dict-valued fields keep the sorted order `TrainingArguments`
/// stores them in).
pub(crate) fn args_to_dict(args: &TrainingArguments) -> JsonMap {
    let mut dict = match loads(&args.to_json_string()) {
        Ok(JsonValue::Object(m)) => m,
        _ => JsonMap::new(),
    };
    if let Some(JsonValue::Object(accel)) = dict.get_mut("accelerator_config") {
        let mut ordered = JsonMap::new();
        for k in ACCELERATOR_CONFIG_ORDER {
            if let Some(v) = accel.get(k) {
                ordered.insert(k, v.clone());
            }
        }
        for (k, v) in accel.iter() {
            if !ordered.contains_key(k) {
                ordered.insert(k, v.clone());
            }
        }
        *accel = ordered;
    }
    dict
}

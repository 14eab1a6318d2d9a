//! DeepSpeed JSON configs as upstream reads them: accelerate's `HfDeepSpeedConfig`
//! (ZeRO stage and offload queries) and transformers' `HfTrainerDeepSpeedConfig`
//! (`"auto"` values filled from `TrainingArguments`, conflicting values collected and
//! raised together as one mismatch error).

use std::path::Path;

use serde_json::{Map, Value, json};
use tch::Kind;
use tchtrain_accelerate::{DynamicLossArgs, LossScaler, ZeroMixedPrecision};
use tchtrain_training_args::{TrainingArguments, python_repr};

use crate::{Error, Result};

/// A DeepSpeed config (upstream `HfTrainerDeepSpeedConfig`).
#[derive(Debug, Clone, PartialEq)]
pub struct HfTrainerDeepSpeedConfig {
    /// The JSON object, `"auto"` values replaced once processed.
    pub config: Map<String, Value>,
    mismatches: Vec<String>,
}

/// Python equality of two JSON values (`1 == 1.0`, lists element-wise).
fn py_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Bool(x), Value::Number(y)) | (Value::Number(y), Value::Bool(x)) => {
            y.as_f64() == Some(f64::from(u8::from(*x)))
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| py_eq(p, q))
        }
        _ => a == b,
    }
}

fn truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
    }
}

impl HfTrainerDeepSpeedConfig {
    /// From a JSON object (upstream accepts a dict).
    pub fn from_value(value: Value) -> Result<Self> {
        match value {
            Value::Object(config) => Ok(Self {
                config,
                mismatches: Vec::new(),
            }),
            other => Err(Error::InvalidConfig {
                key: "<root>".into(),
                value: python_repr(&other),
                fix: "a DeepSpeed config is a JSON object",
            }),
        }
    }

    /// From a file path or an inline JSON string (the `--deepspeed` flag's two forms).
    pub fn from_path_or_json(spec: &str) -> Result<Self> {
        let path = Path::new(spec);
        let text = if path.is_file() {
            std::fs::read_to_string(path).map_err(|source| Error::Io {
                path: path.to_path_buf(),
                source,
            })?
        } else {
            spec.to_string()
        };
        let value: Value = serde_json::from_str(&text).map_err(|source| Error::Json {
            what: if path.is_file() {
                spec.to_string()
            } else {
                "--deepspeed value (neither an existing file nor JSON)".into()
            },
            source,
        })?;
        Self::from_value(value)
    }

    fn find_node(&self, key: &str) -> (Option<&Map<String, Value>>, String) {
        let mut nodes: Vec<&str> = key.split('.').collect();
        let leaf = nodes.pop().unwrap_or_default().to_string();
        let mut cur = Some(&self.config);
        for n in nodes {
            cur = cur.and_then(|c| c.get(n)).and_then(Value::as_object);
        }
        (cur, leaf)
    }

    fn find_node_mut(&mut self, key: &str) -> (Option<&mut Map<String, Value>>, String) {
        let mut nodes: Vec<&str> = key.split('.').collect();
        let leaf = nodes.pop().unwrap_or_default().to_string();
        let mut cur = Some(&mut self.config);
        for n in nodes {
            cur = cur
                .and_then(|c| c.get_mut(n))
                .and_then(Value::as_object_mut);
        }
        (cur, leaf)
    }

    /// `get_value("a.b.c")`.
    pub fn get_value(&self, key: &str) -> Option<&Value> {
        let (node, leaf) = self.find_node(key);
        node.and_then(|n| n.get(&leaf))
    }

    /// `is_true(key)` / truthiness of a value.
    pub fn is_true(&self, key: &str) -> bool {
        truthy(self.get_value(key))
    }

    /// `is_auto(key)`.
    pub fn is_auto(&self, key: &str) -> bool {
        self.get_value(key).and_then(Value::as_str) == Some("auto")
    }

    /// The ZeRO stage (`zero_optimization.stage`, -1 when absent).
    pub fn zero_stage(&self) -> i64 {
        self.get_value("zero_optimization.stage")
            .and_then(Value::as_i64)
            .unwrap_or(-1)
    }

    /// `is_zero2()`.
    pub fn is_zero2(&self) -> bool {
        self.zero_stage() == 2
    }

    /// `is_zero3()`.
    pub fn is_zero3(&self) -> bool {
        self.zero_stage() == 3
    }

    /// `is_offload()`: ZeRO 2/3 with optimizer or parameter offload to cpu / nvme.
    pub fn is_offload(&self) -> bool {
        (self.is_zero2() || self.is_zero3())
            && [
                "zero_optimization.offload_optimizer.device",
                "zero_optimization.offload_param.device",
            ]
            .iter()
            .any(|k| {
                matches!(
                    self.get_value(k).and_then(Value::as_str),
                    Some("cpu" | "nvme")
                )
            })
    }

    /// The offload keys of [`Self::is_offload`] that are set, with their device, e.g.
    /// `("zero_optimization.offload_optimizer.device", "cpu")` (stages 2 and 3 only, as
    /// upstream).
    pub fn offload_devices(&self) -> Vec<(&'static str, String)> {
        if !(self.is_zero2() || self.is_zero3()) {
            return Vec::new();
        }
        [
            "zero_optimization.offload_optimizer.device",
            "zero_optimization.offload_param.device",
        ]
        .into_iter()
        .filter_map(|k| match self.get_value(k).and_then(Value::as_str) {
            Some(d @ ("cpu" | "nvme")) => Some((k, d.to_string())),
            _ => None,
        })
        .collect()
    }

    /// `fill_match`: replace `"auto"` with `hf_val`; otherwise, when `must_match`, record a
    /// mismatch if the config's value differs.
    pub fn fill_match(&mut self, key: &str, hf_val: Value, hf_key: &str, must_match: bool) {
        let (node, leaf) = self.find_node_mut(key);
        let Some(node) = node else { return };
        if node.get(&leaf).and_then(Value::as_str) == Some("auto") {
            node.insert(leaf, hf_val);
            return;
        }
        if !must_match {
            return;
        }
        if let Some(ds_val) = node.get(&leaf).filter(|v| !v.is_null())
            && !py_eq(ds_val, &hf_val)
        {
            let line = format!(
                "- ds {key}={} vs hf {hf_key}={}",
                python_repr(ds_val),
                python_repr(&hf_val)
            );
            self.mismatches.push(line);
        }
    }

    /// `fill_only`: replace `"auto"` only.
    pub fn fill_only(&mut self, key: &str, hf_val: Value) {
        self.fill_match(key, hf_val, "", false);
    }

    /// Upstream `trainer_config_process(args, auto_find_batch_size)`; returns the dtype
    /// DeepSpeed will train in (`"bfloat16"`, `"float16"` or `"float32"`).
    pub fn trainer_config_process(
        &mut self,
        args: &TrainingArguments,
        auto_find_batch_size: bool,
    ) -> &'static str {
        let world = args.world_size();
        let train_batch_size =
            world * args.per_device_train_batch_size * args.gradient_accumulation_steps;
        self.fill_match(
            "train_micro_batch_size_per_gpu",
            json!(args.per_device_train_batch_size),
            "per_device_train_batch_size",
            !auto_find_batch_size,
        );
        self.fill_match(
            "gradient_accumulation_steps",
            json!(args.gradient_accumulation_steps),
            "gradient_accumulation_steps",
            true,
        );
        self.fill_match(
            "train_batch_size",
            json!(train_batch_size),
            "train_batch_size (calculated)",
            !auto_find_batch_size,
        );
        self.fill_match(
            "gradient_clipping",
            json!(args.max_grad_norm),
            "max_grad_norm",
            true,
        );
        self.fill_match(
            "optimizer.params.lr",
            json!(args.learning_rate),
            "learning_rate",
            true,
        );
        self.fill_match(
            "optimizer.params.betas",
            json!([args.adam_beta1, args.adam_beta2]),
            "adam_beta1+adam_beta2",
            true,
        );
        self.fill_match(
            "optimizer.params.eps",
            json!(args.adam_epsilon),
            "adam_epsilon",
            true,
        );
        self.fill_match(
            "optimizer.params.weight_decay",
            json!(args.weight_decay),
            "weight_decay",
            true,
        );
        self.fill_only("scheduler.params.warmup_min_lr", json!(0));
        self.fill_match(
            "scheduler.params.warmup_max_lr",
            json!(args.learning_rate),
            "learning_rate",
            true,
        );
        if args.save_on_each_node {
            let checkpoint = self.config.entry("checkpoint").or_insert_with(|| json!({}));
            if let Some(c) = checkpoint.as_object_mut() {
                c.insert("use_node_local_storage".into(), json!(true));
            }
        }
        self.fill_match(
            "fp16.enabled",
            json!(args.fp16 || args.fp16_full_eval),
            "fp16|fp16_full_eval",
            true,
        );
        self.fill_match(
            "bf16.enabled",
            json!(args.bf16 || args.bf16_full_eval),
            "bf16|bf16_full_eval",
            true,
        );
        if self.is_true("bf16.enabled") {
            "bfloat16"
        } else if self.is_true("fp16.enabled") {
            "float16"
        } else {
            "float32"
        }
    }

    /// Upstream `trainer_config_finalize(args, model, num_training_steps)`: fills the
    /// `hidden_size`-based bucket sizes and the scheduler steps, then fails with every
    /// mismatch collected so far.
    pub fn trainer_config_finalize(
        &mut self,
        args: &TrainingArguments,
        hidden_size: Option<i64>,
        num_training_steps: usize,
    ) -> Result<()> {
        let keys = [
            "zero_optimization.reduce_bucket_size",
            "zero_optimization.stage3_prefetch_bucket_size",
            "zero_optimization.stage3_param_persistence_threshold",
        ];
        let auto_keys: Vec<&str> = keys.iter().copied().filter(|k| self.is_auto(k)).collect();
        if !auto_keys.is_empty() {
            let h = hidden_size.ok_or_else(|| Error::NoHiddenSize {
                keys: auto_keys.iter().map(|k| k.to_string()).collect(),
            })?;
            self.fill_only("zero_optimization.reduce_bucket_size", json!(h * h));
            if self.is_zero3() {
                self.fill_only(
                    "zero_optimization.stage3_prefetch_bucket_size",
                    json!((0.9 * (h * h) as f64) as i64),
                );
                self.fill_only(
                    "zero_optimization.stage3_param_persistence_threshold",
                    json!(10 * h),
                );
            }
        }
        self.fill_match(
            "scheduler.params.total_num_steps",
            json!(num_training_steps),
            "num_training_steps (calculated)",
            true,
        );
        self.fill_match(
            "scheduler.params.warmup_num_steps",
            json!(args.get_warmup_steps(num_training_steps).max(1)),
            "warmup_steps",
            true,
        );
        if !self.mismatches.is_empty() {
            return Err(Error::Mismatch {
                lines: self.mismatches.clone(),
            });
        }
        Ok(())
    }

    /// DeepSpeed's deprecated `zero_optimization` keys mapped as its config classes map them
    /// (`DeepSpeedZeroConfig`'s `new_param_fn`s): `cpu_offload: true` becomes
    /// `offload_optimizer: {"device": "cpu"}`, `cpu_offload_param: true` becomes
    /// `offload_param: {"device": "cpu"}` (a false value removes the key and sets nothing);
    /// giving one with its replacement is DeepSpeed's assertion error.
    /// `cpu_offload_use_pin_memory` is kept as DeepSpeed keeps it (it reads nothing from
    /// it). Returns DeepSpeed's deprecation warnings, one per mapped key.
    pub fn normalize_deprecated_keys(&mut self) -> Result<Vec<String>> {
        let mut warnings = Vec::new();
        let Some(zero) = self
            .config
            .get_mut("zero_optimization")
            .and_then(Value::as_object_mut)
        else {
            return Ok(warnings);
        };
        for (old, new) in [
            ("cpu_offload", "offload_optimizer"),
            ("cpu_offload_param", "offload_param"),
        ] {
            let Some(value) = zero.remove(old) else {
                continue;
            };
            if zero.contains_key(new) {
                return Err(Error::InvalidConfig {
                    key: format!("zero_optimization.{old}"),
                    value: python_repr(&value),
                    fix: "Cannot provide a deprecated parameter and its replacing parameter together (DeepSpeed's assertion): remove it and keep the new key",
                });
            }
            let on = match &value {
                Value::Bool(b) => *b,
                Value::Null => false,
                _ => {
                    return Err(Error::InvalidConfig {
                        key: format!("zero_optimization.{old}"),
                        value: python_repr(&value),
                        fix: "a boolean (DeepSpeed's `Optional[bool]`)",
                    });
                }
            };
            if on {
                zero.insert(new.into(), json!({"device": "cpu"}));
            }
            warnings.push(format!(
                "Config parameter {old} is deprecated use {new} instead"
            ));
        }
        if zero.contains_key("cpu_offload_use_pin_memory") {
            warnings.push(
                "Config parameter cpu_offload_use_pin_memory is deprecated use offload_param or offload_optimizer instead"
                    .into(),
            );
        }
        Ok(warnings)
    }

    /// accelerate's `DeepSpeedPlugin.set_mixed_precision(mixed_precision)` (`"no"`,
    /// `"fp16"` or `"bf16"`, from `--fp16` / `--bf16`): the requested section is added when
    /// absent (`{"enabled": true, "auto_cast": true}` for fp16, `{"enabled": true}` for
    /// bf16), a config enabling the other dtype is accelerate's error, both sections exist
    /// afterwards and their `"auto"` `enabled` values are filled.
    pub fn set_mixed_precision(&mut self, mixed_precision: &str) -> Result<()> {
        match mixed_precision {
            "fp16" if !self.config.contains_key("fp16") => {
                self.config
                    .insert("fp16".into(), json!({"enabled": true, "auto_cast": true}));
            }
            "bf16" if !self.config.contains_key("bf16") => {
                self.config.insert("bf16".into(), json!({"enabled": true}));
            }
            _ => {}
        }
        if mixed_precision != "no" {
            let other = if mixed_precision == "fp16" {
                "bf16"
            } else {
                "fp16"
            };
            // `str(ds_config.get(diff_dtype, {}).get("enabled", "False")).lower() == "true"`
            let enabled = self
                .get_value(&format!("{other}.enabled"))
                .map(|v| match v {
                    Value::String(s) => s.to_lowercase(),
                    Value::Bool(b) => b.to_string(),
                    other => other.to_string(),
                });
            if enabled.as_deref() == Some("true") {
                return Err(Error::MixedPrecisionConflict {
                    mixed_precision: mixed_precision.to_string(),
                    other,
                });
            }
        }
        for dtype in ["fp16", "bf16"] {
            if !self.config.contains_key(dtype) {
                self.config.insert(dtype.into(), json!({"enabled": false}));
            }
        }
        self.fill_only("fp16.enabled", json!(mixed_precision == "fp16"));
        self.fill_only("bf16.enabled", json!(mixed_precision == "bf16"));
        Ok(())
    }

    /// The half-precision regime of the `fp16` / `bf16` sections, as DeepSpeed's engine
    /// builds its ZeRO optimizer from them (`DeepSpeedFP16Config` /
    /// `DeepSpeedBF16Config` with their validators, `CreateLossScaler`,
    /// `check_grad_overflow`): the dtype the model is cast to and what the engine takes;
    /// `None` when both are disabled. Call it on a processed config (no `"auto"` left in
    /// `enabled`).
    pub fn zero_mixed_precision(&self) -> Result<Option<(Kind, ZeroMixedPrecision)>> {
        let fp16 = self.is_true("fp16.enabled");
        // DeepSpeed still reads the old `bfloat16` section name.
        let bf16_section = if self.config.contains_key("bf16") {
            "bf16"
        } else {
            "bfloat16"
        };
        let bf16 = self.is_true(&format!("{bf16_section}.enabled"));
        if fp16 && bf16 {
            return Err(Error::InvalidConfig {
                key: "fp16.enabled".into(),
                value: "true".into(),
                fix: "fp16 and bf16 cannot both be enabled (DeepSpeed's check): enable one",
            });
        }
        let model = if fp16 {
            Kind::Half
        } else if bf16 {
            Kind::BFloat16
        } else {
            Kind::Float
        };
        self.check_grad_accum_dtype(model)?;
        let number = |key: &str, default: f64| -> Result<f64> {
            match self.get_value(key) {
                None | Some(Value::Null) => Ok(default),
                Some(Value::Number(n)) => n.as_f64().ok_or_else(|| Error::InvalidConfig {
                    key: key.into(),
                    value: n.to_string(),
                    fix: "a number",
                }),
                Some(other) => Err(Error::InvalidConfig {
                    key: key.into(),
                    value: python_repr(other),
                    fix: "a number (DeepSpeed's validator refuses booleans and strings)",
                }),
            }
        };
        let flag = |key: &str, default: bool| -> Result<bool> {
            match self.get_value(key) {
                None | Some(Value::Null) => Ok(default),
                Some(Value::Bool(b)) => Ok(*b),
                Some(other) => Err(Error::InvalidConfig {
                    key: key.into(),
                    value: python_repr(other),
                    fix: "true or false",
                }),
            }
        };
        if fp16 {
            if flag("fp16.fp16_master_weights_and_grads", false)? {
                return Err(Error::NotSupported {
                    key: "fp16.fp16_master_weights_and_grads".into(),
                    why: "fp16 master weights need DeepSpeed's CPU Adam (DeepSpeedCPUAdam), which is not implemented; the masters here are fp32: remove it".into(),
                });
            }
            let loss_scale = number("fp16.loss_scale", 0.0)?;
            if !loss_scale.is_finite() || loss_scale < 0.0 {
                return Err(Error::InvalidConfig {
                    key: "fp16.loss_scale".into(),
                    value: loss_scale.to_string(),
                    fix: "fp16.loss_scale must be >= 0 (0 enables dynamic loss scaling)",
                });
            }
            let power = number("fp16.initial_scale_power", 16.0)?;
            let window = number("fp16.loss_scale_window", 1000.0)?;
            let min_scale = number("fp16.min_loss_scale", 1.0)?;
            let hysteresis = number("fp16.hysteresis", 2.0)?;
            let dynamic = loss_scale == 0.0;
            if dynamic && window <= 0.0 {
                return Err(Error::InvalidConfig {
                    key: "fp16.loss_scale_window".into(),
                    value: window.to_string(),
                    fix: "fp16.loss_scale_window must be > 0 when dynamic loss scaling is enabled (loss_scale=0)",
                });
            }
            if dynamic && min_scale <= 0.0 {
                return Err(Error::InvalidConfig {
                    key: "fp16.min_loss_scale".into(),
                    value: min_scale.to_string(),
                    fix: "fp16.min_loss_scale must be > 0 when dynamic loss scaling is enabled (loss_scale=0)",
                });
            }
            let args = DynamicLossArgs {
                // `2**self.initial_scale_power` (an int power).
                init_scale: 2f64.powi(power as i32),
                // pydantic's int fields truncate floats.
                scale_window: window as i64,
                min_scale: (min_scale as i64) as f64,
                delayed_shift: hysteresis as i64,
                consecutive_hysteresis: flag("fp16.consecutive_hysteresis", false)?,
            };
            return Ok(Some((
                Kind::Half,
                ZeroMixedPrecision {
                    loss_scaler: LossScaler::create(true, loss_scale, dynamic, args),
                    check_grad_overflow: true,
                },
            )));
        }
        if bf16 {
            for key in ["bf16_master_weights_and_grads", "bf16_optimizer_states"] {
                if flag(&format!("{bf16_section}.{key}"), false)? {
                    return Err(Error::NotSupported {
                        key: format!("{bf16_section}.{key}"),
                        why: "bf16 master weights / optimizer states are not implemented; the masters and the optimizer state here are fp32: remove it".into(),
                    });
                }
            }
            return Ok(Some((
                Kind::BFloat16,
                ZeroMixedPrecision {
                    loss_scaler: LossScaler::create(false, 1.0, false, DynamicLossArgs::default()),
                    check_grad_overflow: flag(
                        &format!("{bf16_section}.check_grad_overflow"),
                        true,
                    )?,
                },
            )));
        }
        Ok(None)
    }

    /// `zero_optimization.overlap_comm`: whether the gradient reduction overlaps the
    /// backward (DeepSpeed's default when absent or null: true at stage 3, false below, as
    /// its config model's validator sets it). A value that is not a boolean is refused with
    /// the key.
    pub fn overlap_comm(&self) -> Result<bool> {
        const KEY: &str = "zero_optimization.overlap_comm";
        match self.get_value(KEY) {
            None | Some(Value::Null) => Ok(self.zero_stage() == 3),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(Error::InvalidConfig {
                key: KEY.into(),
                value: python_repr(other),
                fix: "overlap_comm is true or false (DeepSpeed's default: true at stage 3, false below)",
            }),
        }
    }

    /// `zero_optimization.reduce_bucket_size`: the elements of gradients the ZeRO-1 / 2
    /// optimizer gathers before it starts a reduction (DeepSpeed's default 500,000,000; the
    /// Trainer's `"auto"` is hidden_size², filled by [`Self::trainer_config_finalize`]).
    /// DeepSpeed's pydantic model takes an integer or a float with an integral value; a
    /// value under 1 or of another type is refused with the key.
    pub fn reduce_bucket_size(&self) -> Result<i64> {
        const KEY: &str = "zero_optimization.reduce_bucket_size";
        const DEFAULT: i64 = 500_000_000;
        let value = match self.get_value(KEY) {
            None | Some(Value::Null) => return Ok(DEFAULT),
            Some(v) => v,
        };
        let n = value.as_i64().or_else(|| {
            value
                .as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 9e18)
                .map(|f| f as i64)
        });
        match n {
            Some(n) if n >= 1 => Ok(n),
            _ => Err(Error::InvalidConfig {
                key: KEY.into(),
                value: python_repr(value),
                fix: "reduce_bucket_size is a number of gradient elements: a positive integer (DeepSpeed's default 5e8; \"auto\" lets the Trainer fill hidden_size * hidden_size)",
            }),
        }
    }

    /// DeepSpeed's `get_communication_data_type`: the top-level `communication_data_type`
    /// (`"fp32"`, `"fp16"`, `"bf16"`, any case) as the dtype the ZeRO optimizers reduce
    /// gradients in; `None` when absent or null (the engine then uses the model's dtype).
    /// Another value is DeepSpeed's `ValueError`, as [`Error::InvalidConfig`].
    pub fn communication_data_type(&self) -> Result<Option<Kind>> {
        const KEY: &str = "communication_data_type";
        let value = match self.get_value(KEY) {
            None | Some(Value::Null) => return Ok(None),
            Some(v) => v,
        };
        match value.as_str().map(str::to_lowercase).as_deref() {
            Some("fp32") => Ok(Some(Kind::Float)),
            Some("fp16") => Ok(Some(Kind::Half)),
            Some("bf16") => Ok(Some(Kind::BFloat16)),
            _ => Err(Error::InvalidConfig {
                key: KEY.into(),
                value: python_repr(value),
                fix: "Invalid communication_data_type. Supported data types: ['fp16', 'bf16', 'fp32'] (DeepSpeed's message)",
            }),
        }
    }

    /// `data_types.grad_accum_dtype` as DeepSpeed's `DtypeEnum` reads it (`None`: unset, the
    /// model's dtype).
    pub fn grad_accum_dtype(&self) -> Result<Option<Kind>> {
        const KEY: &str = "data_types.grad_accum_dtype";
        let value = match self.get_value(KEY) {
            None | Some(Value::Null) => return Ok(None),
            Some(v) => v,
        };
        Ok(Some(match value.as_str() {
            Some("torch.float16" | "fp16" | "float16" | "half") => Kind::Half,
            Some("torch.float32" | "fp32" | "float32" | "float") => Kind::Float,
            Some("torch.int8" | "int8") => Kind::Int8,
            Some("torch.bfloat16" | "bf16" | "bfloat16") => Kind::BFloat16,
            _ => {
                return Err(Error::InvalidConfig {
                    key: KEY.into(),
                    value: python_repr(value),
                    fix: "one of DeepSpeed's DtypeEnum values: \"fp32\", \"fp16\", \"bf16\" (or their torch / long names)",
                });
            }
        }))
    }

    /// DeepSpeed's `data_types.grad_accum_dtype` (`DeepSpeedEngine.get_data_types` and
    /// `_do_optimizer_sanity_check`; unset means the model's dtype). Under ZeRO its
    /// optimizers keep their own gradient buffers and the key changes nothing, except at stage
    /// 1 with bf16 weights, fp32 accumulation and no optimizer offload, where DeepSpeed runs
    /// its `BF16_Optimizer` instead: not implemented, refused by name. Without ZeRO, a dtype
    /// other than the model's is DeepSpeed's `NotImplementedError`; a value that is not a
    /// dtype is refused as DeepSpeed's `DtypeEnum` refuses it.
    pub fn check_grad_accum_dtype(&self, model: Kind) -> Result<()> {
        const KEY: &str = "data_types.grad_accum_dtype";
        let Some(accum) = self.grad_accum_dtype()? else {
            return Ok(());
        };
        let value = self.get_value(KEY).cloned().unwrap_or(Value::Null);
        let name = |k: Kind| match k {
            Kind::Half => "torch.float16",
            Kind::BFloat16 => "torch.bfloat16",
            Kind::Int8 => "torch.int8",
            _ => "torch.float32",
        };
        let stage = self.zero_stage();
        if stage >= 1 {
            let cpu_offload = self
                .get_value("zero_optimization.offload_optimizer.device")
                .and_then(Value::as_str)
                == Some("cpu");
            if stage == 1 && model == Kind::BFloat16 && accum == Kind::Float && !cpu_offload {
                return Err(Error::NotSupported {
                    key: KEY.into(),
                    why: "\"fp32\" with bf16 at ZeRO stage 1 (without optimizer offload) makes DeepSpeed run its BF16_Optimizer (fp32 gradient accumulation), which is not implemented; use ZeRO stage 2, or remove the key (bf16 accumulation, DeepSpeed's default)".into(),
                });
            }
            return Ok(());
        }
        if accum != model {
            return Err(Error::NotSupported {
                key: KEY.into(),
                why: format!(
                    "{}: unsupported mix of model_dtype={} and grad_accum_dtype={} (DeepSpeed's NotImplementedError: without ZeRO it accumulates in the model's dtype); remove the key",
                    python_repr(&value),
                    name(model),
                    name(accum)
                ),
            });
        }
        Ok(())
    }

    /// The Trainer's DeepSpeed constraints that do not depend on the model.
    pub fn check_trainer_compat(&self, args: &TrainingArguments) -> Result<()> {
        // Upstream `Trainer.__init__`, in its order.
        if args.save_only_model && args.load_best_model_at_end {
            return Err(Error::Unsupported {
                what: "DeepSpeed can't be used with `save_only_model` along with `load_best_model_at_end`.",
            });
        }
        if self.is_zero3() && args.auto_find_batch_size {
            return Err(Error::Unsupported {
                what: "`auto_find_batch_size` isn't supported yet with DeepSpeed Zero-3",
            });
        }
        if !(0..=3).contains(&self.zero_stage()) && self.zero_stage() != -1 {
            return Err(Error::InvalidConfig {
                key: "zero_optimization.stage".into(),
                value: self.zero_stage().to_string(),
                fix: "use 0, 1, 2 or 3",
            });
        }
        Ok(())
    }
}

//! Upstream's `__post_init__` and `_validate_args`: derived defaults (`eval_steps` from
//! `logging_steps`, `metric_for_best_model`, `do_eval`, ...) and the checks on combinations.
//!
//! Skipped on purpose, because they depend on the machine rather than the arguments (the trainer
//! checks what it needs when it picks a device):
//! - `bf16` / `bf16_full_eval` without `use_cpu` on hardware without bf16 support (upstream asks
//!   torch whether the GPU supports bf16);
//! - `tf32 = true` without an Ampere-or-newer CUDA GPU, and switching TF32 on or off;
//! - device set-up (`_setup_devices`), `torch_compile_backend` for HPU/Neuron (always
//!   `"inductor"` here), `dataloader_multiprocessing_context = "fork"` on Apple MPS;
//! - `report_to = "all"` is kept as `["all"]` (upstream replaces it with the integrations
//!   installed in the Python environment; the trainer resolves it against the loggers it has),
//!   and Kubeflow's automatic `report_to` entry;
//! - `disable_tqdm` unset resolves to `false` (upstream: whether the transformers log level,
//!   `TRANSFORMERS_VERBOSITY`, is above WARNING);
//! - DeepSpeed's `HfTrainerDeepSpeedConfig` processing (the `tchtrain-deepspeed` crate fills
//!   `"auto"` values and reports mismatches), Accelerate's FSDP plugin arguments and the
//!   `FSDP_CPU_RAM_EFFICIENT_LOADING` environment variable (`tchtrain-fsdp` reads `fsdp_config`).

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::parsed::Warning;
use crate::trainer_utils::{IntervalStrategy, SaveStrategy, SchedulerType};
use crate::training_args::TrainingArguments;
use crate::values::{DictOrPath, JsonDict, StrOrBool, convert_str_dict};

/// Accelerate's `FSDP_AUTO_WRAP_POLICY`.
const FSDP_AUTO_WRAP_POLICY: [&str; 3] = ["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"];
/// Accelerate's `FSDP_SHARDING_STRATEGY`.
const FSDP_SHARDING_STRATEGY: [&str; 5] = [
    "FULL_SHARD",
    "SHARD_GRAD_OP",
    "NO_SHARD",
    "HYBRID_SHARD",
    "HYBRID_SHARD_ZERO2",
];

/// Python's `%` on floats (the result takes the divisor's sign).
fn py_mod(a: f64, b: f64) -> f64 {
    let r = a % b;
    if r != 0.0 && ((r < 0.0) != (b < 0.0)) {
        r + b
    } else {
        r
    }
}

/// Python's `str()` of a float-typed step value (`500` stays `500`, `0.5` is `0.5`).
fn show(x: f64) -> String {
    tchtrain_python_json::python_float_repr(x)
}

impl TrainingArguments {
    /// Upstream's `__post_init__`: fills derived values and validates, returning the warnings.
    ///
    /// Idempotent: running it again on its own output changes nothing. See the module docs of
    /// `post_init.rs` for the hardware-dependent checks that are not mirrored.
    #[doc(alias = "__post_init__")]
    pub fn post_init(&mut self) -> Result<Vec<Warning>> {
        let mut warnings = Vec::new();

        // 1. Defaults & normalisation.
        if self.output_dir.is_none() {
            self.output_dir = Some("trainer_output".to_string());
        }
        if let Some(DictOrPath::Path(s)) = &self.fsdp_config
            && s.starts_with('{')
        {
            self.fsdp_config = Some(DictOrPath::Dict(parse_dict_string("fsdp_config", s)?));
        }
        if let Some(DictOrPath::Path(s)) = &self.deepspeed
            && s.starts_with('{')
        {
            self.deepspeed = Some(DictOrPath::Dict(parse_dict_string("deepspeed", s)?));
        }
        // `gradient_checkpointing*` mirror `activation_checkpointing*`; an old name set on its own
        // (the new one unset) is taken over with a deprecation warning.
        if self.gradient_checkpointing && !self.activation_checkpointing {
            warnings.push(deprecated_checkpointing(
                "gradient_checkpointing",
                "activation_checkpointing",
            ));
            self.activation_checkpointing = true;
        }
        self.gradient_checkpointing = self.activation_checkpointing;
        if self.activation_checkpointing_kwargs.is_none()
            && self.gradient_checkpointing_kwargs.is_some()
        {
            warnings.push(deprecated_checkpointing(
                "gradient_checkpointing_kwargs",
                "activation_checkpointing_kwargs",
            ));
            self.activation_checkpointing_kwargs = self.gradient_checkpointing_kwargs.clone();
        }
        self.gradient_checkpointing_kwargs = self.activation_checkpointing_kwargs.clone();
        if let Some(dir) = &self.output_dir {
            self.output_dir = Some(expand_user(dir));
        }

        // 3. Auto-derived values.
        if !self.do_eval && self.eval_strategy != IntervalStrategy::No {
            self.do_eval = true;
        }
        if self.eval_strategy == IntervalStrategy::Steps && self.eval_steps.is_none_or(|s| s == 0.0)
        {
            if self.logging_steps > 0.0 {
                self.eval_steps = Some(self.logging_steps);
            } else {
                return Err(Error::Requires {
                    field: "eval_strategy",
                    value: "\"steps\"".to_string(),
                    requirement: format!(
                        "either non-zero --eval_steps or --logging_steps (eval_steps is {}, logging_steps is {})",
                        self.eval_steps.map_or("None".to_string(), show),
                        show(self.logging_steps)
                    ),
                    fix: "set `eval_steps` (or `logging_steps`) to a positive number of steps"
                        .to_string(),
                });
            }
        }
        if (self.load_best_model_at_end
            || matches!(
                self.lr_scheduler_type,
                SchedulerType::ReduceLrOnPlateau | SchedulerType::Greedy
            ))
            && self.metric_for_best_model.is_none()
        {
            self.metric_for_best_model = Some("loss".to_string());
        }
        if self.greater_is_better.is_none()
            && let Some(metric) = &self.metric_for_best_model
        {
            self.greater_is_better = Some(!metric.ends_with("loss"));
        }
        if self.report_to.len() == 1 && self.report_to[0] == "none" {
            self.report_to.clear();
        }

        // 4. Validation.
        self.validate_args()?;

        // 6. torch.compile.
        if (self.torch_compile_mode.is_some() || self.torch_compile_backend.is_some())
            && !self.torch_compile
        {
            self.torch_compile = true;
        }
        if self.torch_compile && self.torch_compile_backend.is_none() {
            self.torch_compile_backend = Some("inductor".to_string());
        }

        // 10. Hardware overrides.
        if self.use_cpu {
            self.dataloader_pin_memory = false;
        }

        // 11. FSDP.
        self.process_fsdp_args(&mut warnings)?;
        Ok(warnings)
    }

    /// Upstream's `_validate_args`: the checks on values and combinations (no derivations).
    #[doc(alias = "_validate_args")]
    pub fn validate_args(&self) -> Result<()> {
        if let Some(n) = self.torch_empty_cache_steps
            && n <= 0
        {
            return Err(Error::OutOfRange {
                field: "torch_empty_cache_steps",
                value: n.to_string(),
                problem: "`torch_empty_cache_steps` must be an integer bigger than 0".to_string(),
                fix: "use a positive number of steps, or leave it unset to never empty the cache"
                    .to_string(),
            });
        }
        if self.logging_strategy == IntervalStrategy::Steps && self.logging_steps == 0.0 {
            return Err(Error::Requires {
                field: "logging_strategy",
                value: "\"steps\"".to_string(),
                requirement: "non-zero --logging_steps".to_string(),
                fix: "set `logging_steps` to a positive number (or a ratio in (0, 1)), or use another logging_strategy"
                    .to_string(),
            });
        }
        let whole = |field: &'static str, value: f64| {
            if value > 1.0 && value.fract() != 0.0 {
                Err(Error::StepsNotInteger { field, value })
            } else {
                Ok(())
            }
        };
        if self.logging_strategy == IntervalStrategy::Steps {
            whole("logging_steps", self.logging_steps)?;
        }
        if self.eval_strategy == IntervalStrategy::Steps
            && let Some(eval_steps) = self.eval_steps
        {
            whole("eval_steps", eval_steps)?;
        }
        if self.save_strategy == SaveStrategy::Steps {
            whole("save_steps", self.save_steps)?;
        }

        if self.load_best_model_at_end && self.save_strategy != SaveStrategy::Best {
            if self.eval_strategy.as_str() != self.save_strategy.as_str() {
                return Err(Error::Requires {
                    field: "load_best_model_at_end",
                    value: "true".to_string(),
                    requirement: format!(
                        "the save and eval strategy to match, except when --save_strategy=\"best\", but found \
                         eval_strategy {:?} and save_strategy {:?}",
                        self.eval_strategy.as_str(),
                        self.save_strategy.as_str()
                    ),
                    fix: "set `save_strategy` equal to `eval_strategy`, or `save_strategy = \"best\"`".to_string(),
                });
            }
            if self.eval_strategy == IntervalStrategy::Steps {
                let (save, eval) = (
                    self.save_steps,
                    self.eval_steps.unwrap_or(self.logging_steps),
                );
                if py_mod(save, eval) != 0.0 {
                    if eval < 1.0 || save < 1.0 {
                        if !(eval < 1.0 && save < 1.0) {
                            return Err(Error::SaveStepsNotMultiple {
                                save_steps: save,
                                eval_steps: eval,
                                kind: "",
                                detail: ", which cannot get guaranteed when mixing ratio and absolute steps",
                            });
                        }
                        const LARGE_MULTIPLIER: f64 = 1_000_000.0;
                        if py_mod(save * LARGE_MULTIPLIER, eval * LARGE_MULTIPLIER) != 0.0 {
                            return Err(Error::SaveStepsNotMultiple {
                                save_steps: save,
                                eval_steps: eval,
                                kind: "",
                                detail: "",
                            });
                        }
                    } else {
                        return Err(Error::SaveStepsNotMultiple {
                            save_steps: save,
                            eval_steps: eval,
                            kind: "round ",
                            detail: "",
                        });
                    }
                }
            }
        }

        if self.fp16 && self.bf16 {
            return Err(Error::MutuallyExclusive {
                first: "fp16",
                second: "bf16",
                context: "",
            });
        }
        if self.fp16_full_eval && self.bf16_full_eval {
            return Err(Error::MutuallyExclusive {
                first: "fp16_full_eval",
                second: "bf16_full_eval",
                context: " (full-precision evaluation)",
            });
        }
        for (scheduler, name) in [
            (SchedulerType::ReduceLrOnPlateau, "reduce_lr_on_plateau"),
            (SchedulerType::Greedy, "greedy"),
        ] {
            if self.lr_scheduler_type == scheduler && self.eval_strategy == IntervalStrategy::No {
                return Err(Error::Requires {
                    field: "lr_scheduler_type",
                    value: format!("{name:?}"),
                    requirement: "an eval strategy (eval_strategy is \"no\")".to_string(),
                    fix: "set `eval_strategy` to \"steps\" or \"epoch\"".to_string(),
                });
            }
        }
        if self.warmup_steps < 0.0 || self.warmup_steps.is_nan() {
            return Err(Error::OutOfRange {
                field: "warmup_steps",
                value: show(self.warmup_steps),
                problem: "expected value warmup_steps >= 0".to_string(),
                fix: "use a step count (>= 1) or a ratio of the total steps in [0, 1)".to_string(),
            });
        }
        if self.dataloader_num_workers == 0 && self.dataloader_prefetch_factor.is_some() {
            return Err(Error::Requires {
                field: "dataloader_prefetch_factor",
                value: format!("{}", self.dataloader_prefetch_factor.unwrap_or_default()),
                requirement:
                    "data loaded in a different process, i.e. --dataloader_num_workers > 0"
                        .to_string(),
                fix: "set `dataloader_num_workers` > 0 or unset `dataloader_prefetch_factor`"
                    .to_string(),
            });
        }
        self.validate_tchtrain_extras()
    }

    /// Checks tchtrain adds beyond upstream (upstream accepts these values at construction and
    /// fails, or silently misbehaves, later in training): negative step intervals under the
    /// `"steps"` strategy, and zero batch sizes or accumulation steps.
    fn validate_tchtrain_extras(&self) -> Result<()> {
        let steps = [
            (
                "logging_steps",
                self.logging_strategy == IntervalStrategy::Steps,
                Some(self.logging_steps),
            ),
            (
                "eval_steps",
                self.eval_strategy == IntervalStrategy::Steps,
                self.eval_steps,
            ),
            (
                "save_steps",
                self.save_strategy == SaveStrategy::Steps,
                Some(self.save_steps),
            ),
        ];
        for (field, active, value) in steps {
            if let (true, Some(v)) = (active, value)
                && (v < 0.0 || v.is_nan())
            {
                return Err(Error::OutOfRange {
                    field,
                    value: show(v),
                    problem: format!("`{field}` must be positive under the \"steps\" strategy"),
                    fix: "use a step count (>= 1) or a ratio of the total steps in (0, 1)"
                        .to_string(),
                });
            }
        }
        for (field, value) in [
            (
                "per_device_train_batch_size",
                self.per_device_train_batch_size,
            ),
            (
                "per_device_eval_batch_size",
                self.per_device_eval_batch_size,
            ),
            (
                "gradient_accumulation_steps",
                self.gradient_accumulation_steps,
            ),
        ] {
            if value == 0 {
                return Err(Error::OutOfRange {
                    field,
                    value: "0".to_string(),
                    problem: format!("`{field}` must be at least 1"),
                    fix: "use a positive integer".to_string(),
                });
            }
        }
        Ok(())
    }

    /// Upstream's `_process_fsdp_args`, up to (not including) Accelerate's plugin arguments:
    /// loads `fsdp_config` from its file, strips `fsdp_` key prefixes, translates the legacy
    /// `fsdp` option string into `fsdp_config` entries, fills the shared defaults, and sets
    /// `fsdp = true`.
    fn process_fsdp_args(&mut self, warnings: &mut Vec<Warning>) -> Result<()> {
        let legacy = match &self.fsdp {
            None | Some(StrOrBool::Bool(false)) => return Ok(()),
            Some(StrOrBool::Str(s)) if s.is_empty() => return Ok(()),
            Some(StrOrBool::Bool(true)) => None,
            Some(StrOrBool::Str(s)) => Some(s.clone()),
        };
        let mut config = match self.fsdp_config.take() {
            None => JsonDict::new(),
            Some(DictOrPath::Dict(d)) => d,
            Some(DictOrPath::Path(p)) => read_json_dict("fsdp_config", &p)?,
        };
        let prefixed: Vec<String> = config
            .keys()
            .filter(|k| k.starts_with("fsdp_"))
            .cloned()
            .collect();
        for key in prefixed {
            if let Some(v) = config.remove(&key) {
                config.insert(key["fsdp_".len()..].to_string(), v);
            }
        }
        if let Some(options) = legacy {
            warnings.push(Warning::new(
                "fsdp",
                "Passing `fsdp` as a string is deprecated and will be removed in Transformers v5.20. \
                 Use `fsdp=True` and configure everything via `fsdp_config` instead.",
            ));
            apply_legacy_fsdp_to_config(&options, &mut config)?;
        }
        self.fsdp = Some(StrOrBool::Bool(true));
        if self.activation_checkpointing {
            warnings.push(Warning::new(
                "activation_checkpointing",
                "When using FSDP, prefer `fsdp_config['activation_checkpointing']` (FSDP's own activation \
                 checkpointing) over the `activation_checkpointing` training argument; the latter introduces a \
                 redundant AllGather in the backward pass.",
            ));
        }
        config.entry("min_num_params").or_insert(0.into());
        if let Some(serde_json::Value::String(cls)) =
            config.get("transformer_layer_cls_to_wrap").cloned()
        {
            config.insert(
                "transformer_layer_cls_to_wrap".into(),
                serde_json::json!([cls]),
            );
        }
        for key in ["xla", "xla_fsdp_v2", "xla_fsdp_grad_ckpt"] {
            config.entry(key).or_insert(false.into());
        }
        let truthy = |v: Option<&serde_json::Value>| {
            v.is_some_and(|v| {
                !matches!(v, serde_json::Value::Bool(false) | serde_json::Value::Null)
            })
        };
        if !truthy(config.get("xla")) {
            if truthy(config.get("xla_fsdp_grad_ckpt")) {
                warnings.push(Warning::new(
                    "fsdp_config",
                    "`--xla_fsdp_grad_ckpt` is useful only when `--xla` is set to true.",
                ));
            }
            let version = fsdp_version(&config)?;
            let policy = config
                .get("auto_wrap_policy")
                .cloned()
                .unwrap_or_else(|| FSDP_AUTO_WRAP_POLICY[0].into());
            if !policy
                .as_str()
                .is_some_and(|p| FSDP_AUTO_WRAP_POLICY.contains(&p))
            {
                return Err(Error::InvalidValue {
                    field: "fsdp_config.auto_wrap_policy".to_string(),
                    value: policy.to_string(),
                    reason: format!("`auto_wrap_policy` must be one of {FSDP_AUTO_WRAP_POLICY:?}"),
                });
            }
            if version != 2 {
                warnings.push(Warning::new(
                    "fsdp_config",
                    "FSDP1 (`fsdp_config['version'] = 1`) is deprecated and will be removed in Transformers v5.20. \
                     Please migrate to FSDP2 by setting `fsdp_config['version'] = 2` (the default).",
                ));
            }
        }
        self.fsdp_config = Some(DictOrPath::Dict(config));
        Ok(())
    }
}

/// `int(fsdp_config.get("version", 2))`.
fn fsdp_version(config: &JsonDict) -> Result<i64> {
    match config.get("version") {
        None => Ok(2),
        Some(v) => v
            .as_i64()
            .or_else(|| v.as_f64().map(|f| f.trunc() as i64))
            .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
            .ok_or_else(|| Error::InvalidValue {
                field: "fsdp_config.version".to_string(),
                value: v.to_string(),
                reason: "expected an integer FSDP version (1 or 2)".to_string(),
            }),
    }
}

/// Upstream's `_apply_legacy_fsdp_to_config`.
fn apply_legacy_fsdp_to_config(options: &str, config: &mut JsonDict) -> Result<()> {
    let version = fsdp_version(config)?;
    for item in options.split_whitespace() {
        if FSDP_SHARDING_STRATEGY.contains(&item.to_uppercase().as_str()) {
            if version == 2 {
                let reshard = match item {
                    "full_shard" => true,
                    "shard_grad_op" => false,
                    _ => {
                        return Err(Error::Requires {
                            field: "fsdp",
                            value: format!("{item:?}"),
                            requirement: "FSDP1 (`fsdp_config['version'] = 1`), which is deprecated".to_string(),
                            fix: "use \"full_shard\" or \"shard_grad_op\" with FSDP2, or set fsdp_config version 1"
                                .to_string(),
                        });
                    }
                };
                config
                    .entry("reshard_after_forward")
                    .or_insert(reshard.into());
            } else {
                config.entry("reshard_after_forward").or_insert(item.into());
            }
        } else if item == "offload" {
            config.entry("cpu_offload").or_insert(true.into());
        } else if item != "auto_wrap" {
            let names = crate::trainer_utils::FsdpOption::values();
            return Err(Error::InvalidValue {
                field: "fsdp".to_string(),
                value: format!("{item:?}"),
                reason: format!(
                    "unknown `fsdp` option{}; valid options: {}",
                    crate::suggest::did_you_mean(&crate::suggest::close_matches(
                        item,
                        names.iter().copied()
                    )),
                    names.join(", ")
                ),
            });
        }
    }
    Ok(())
}

fn deprecated_checkpointing(old: &str, new: &str) -> Warning {
    Warning::new(
        old,
        format!("`{old}` is deprecated and will be removed in v6. Use `{new}` instead."),
    )
}

/// `os.path.expanduser`: a leading `~` becomes `$HOME`.
fn expand_user(path: &str) -> String {
    if (path == "~" || path.starts_with("~/"))
        && let Some(home) = std::env::var_os("HOME")
    {
        return format!("{}{}", home.to_string_lossy(), &path[1..]);
    }
    path.to_string()
}

/// Parses a dict given as a JSON string (upstream: `json.loads` then `_convert_str_dict`).
pub(crate) fn parse_dict_string(field: &str, s: &str) -> Result<JsonDict> {
    match serde_json::from_str::<serde_json::Value>(s) {
        Ok(serde_json::Value::Object(mut d)) => {
            convert_str_dict(&mut d);
            Ok(d)
        }
        Ok(other) => Err(Error::InvalidValue {
            field: field.to_string(),
            value: s.to_string(),
            reason: format!("expected a JSON object, got {other}"),
        }),
        Err(e) => Err(Error::InvalidValue {
            field: field.to_string(),
            value: s.to_string(),
            reason: format!(
                "not valid JSON ({e}); write the dict as a JSON object, e.g. '{{\"key\": 1}}'"
            ),
        }),
    }
}

/// Reads a JSON object from a file named by a field's value.
pub(crate) fn read_json_dict(field: &str, path: &str) -> Result<JsonDict> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        field: field.to_string(),
        path: PathBuf::from(path),
        source,
    })?;
    match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(serde_json::Value::Object(d)) => Ok(d),
        Ok(_) => Err(Error::InvalidValue {
            field: field.to_string(),
            value: path.to_string(),
            reason: "the file does not hold a JSON object".to_string(),
        }),
        Err(e) => Err(Error::InvalidValue {
            field: field.to_string(),
            value: path.to_string(),
            reason: format!("the file is not valid JSON: {e}"),
        }),
    }
}

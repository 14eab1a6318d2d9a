//! `LoraConfig`: peft's `tuners/lora/config.py` (names, defaults and checks of peft 0.21.2),
//! read from and written to `adapter_config.json` as peft writes it.

use indexmap::IndexMap;
use std::path::Path;

use serde_json::{Map, Value};

use crate::{Error, Result};

/// The file peft keeps an adapter's configuration in.
pub const ADAPTER_CONFIG_NAME: &str = "adapter_config.json";
/// The file peft keeps an adapter's weights in.
pub const ADAPTER_SAFE_WEIGHTS_NAME: &str = "adapter_model.safetensors";
/// The peft version whose files this module reads and writes.
pub const PEFT_VERSION: &str = "0.21.2";

/// `target_modules` (and `exclude_modules`): module names, or one regular expression that
/// must match a module's whole name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetModules {
    /// Names: a module is targeted when its name is one of them or ends with `.` + one of
    /// them.
    Names(Vec<String>),
    /// A regular expression matched against the whole module name (`re.fullmatch`);
    /// `"all-linear"` is every linear layer but the output layer.
    Regex(String),
}

/// `init_lora_weights`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InitLoraWeights {
    /// `True`: `lora_A` drawn as `nn.Linear`'s Kaiming-uniform, `lora_B` zeros (the adapter
    /// starts as a no-op).
    #[default]
    Default,
    /// `"gaussian"`: `lora_A` from a normal of deviation `1 / r`, `lora_B` zeros.
    Gaussian,
    /// `False`: both as `nn.Linear` draws them (the adapter starts active; for tests).
    Random,
}

/// `bias`: which biases train.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoraBias {
    /// `"none"`.
    #[default]
    None,
    /// `"all"`: every bias of the model.
    All,
    /// `"lora_only"`: the biases of the adapted layers.
    LoraOnly,
}

/// `layers_to_transform`: one layer index or several.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayerIndices {
    /// One index.
    One(i64),
    /// Several.
    Many(Vec<i64>),
}

/// peft's `LoraConfig` (the fields this crate implements; the others must keep peft's
/// defaults, see [`LoraConfig::from_json`]).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    /// `r`: the rank (default 8).
    pub r: i64,
    /// `lora_alpha` (default 8): the scaling is `lora_alpha / r` (`/ √r` with rsLoRA).
    pub lora_alpha: f64,
    /// `lora_dropout` (default 0): dropout on the adapter's input, in training.
    pub lora_dropout: f64,
    /// `target_modules`; `None`: peft's default for the model type (`q_proj` / `v_proj` for
    /// Llama-shaped models, `c_attn` for GPT-2, `query` / `value` for BERT and RoBERTa,
    /// `query_proj` / `value_proj` for DeBERTa-v2).
    pub target_modules: Option<TargetModules>,
    /// `exclude_modules`: as `target_modules`, checked first.
    pub exclude_modules: Option<TargetModules>,
    /// `fan_in_fan_out`: the layers store `[in, out]` weights (GPT-2's `Conv1D`; set for
    /// them whatever is given, as peft does).
    pub fan_in_fan_out: bool,
    /// `bias`.
    pub bias: LoraBias,
    /// `use_rslora`: scaling `lora_alpha / √r`.
    pub use_rslora: bool,
    /// `modules_to_save`: modules trained in full and saved with the adapter (a new
    /// classification head); SEQ_CLS / TOKEN_CLS add `classifier` and `score`.
    pub modules_to_save: Option<Vec<String>>,
    /// `init_lora_weights`.
    pub init_lora_weights: InitLoraWeights,
    /// `layers_to_transform`: only the layers with these indices.
    pub layers_to_transform: Option<LayerIndices>,
    /// `layers_pattern`: the name of the layer list (`layers`, `h`) whose index
    /// `layers_to_transform` reads.
    pub layers_pattern: Option<Vec<String>>,
    /// `rank_pattern`: a rank per module-name pattern (the first matching key, in insertion
    /// order, wins, as peft's dict; read from a file, in the file's order, which peft
    /// writes sorted).
    pub rank_pattern: IndexMap<String, i64>,
    /// `alpha_pattern`: an alpha per module-name pattern.
    pub alpha_pattern: IndexMap<String, f64>,
    /// `use_dora`: weight-decomposed LoRA (a magnitude vector per adapted layer).
    pub use_dora: bool,
    /// `target_parameters`: parameters adapted directly (peft's `ParamWrapper`), the
    /// mixture-of-experts' 3-D `experts.gate_up_proj` / `experts.down_proj`, matched by
    /// their full name or a `.`-bounded suffix of it.
    pub target_parameters: Option<Vec<String>>,
    /// `task_type` (`CAUSAL_LM`, `SEQ_CLS`, `TOKEN_CLS`, `QUESTION_ANS`,
    /// `FEATURE_EXTRACTION`).
    pub task_type: Option<String>,
    /// `base_model_name_or_path`.
    pub base_model_name_or_path: Option<String>,
    /// `revision`.
    pub revision: Option<String>,
    /// `inference_mode`: peft writes `true`; a model loaded with it is frozen.
    pub inference_mode: bool,
}

impl Default for LoraConfig {
    fn default() -> Self {
        Self {
            r: 8,
            lora_alpha: 8.0,
            lora_dropout: 0.0,
            target_modules: None,
            exclude_modules: None,
            fan_in_fan_out: false,
            bias: LoraBias::None,
            use_rslora: false,
            modules_to_save: None,
            init_lora_weights: InitLoraWeights::Default,
            layers_to_transform: None,
            layers_pattern: None,
            rank_pattern: IndexMap::new(),
            alpha_pattern: IndexMap::new(),
            use_dora: false,
            target_parameters: None,
            task_type: None,
            base_model_name_or_path: None,
            revision: None,
            inference_mode: false,
        }
    }
}

/// The `adapter_config.json` keys peft 0.21.2 writes for LoRA that this crate does not
/// implement, with the value that means "unused" (`null` unless given).
const UNSUPPORTED_KEYS: &[(&str, &str)] = &[
    ("alora_invocation_tokens", "activated LoRA"),
    ("arrow_config", "Arrow routing"),
    ("corda_config", "CorDA initialisation"),
    ("eva_config", "EVA initialisation"),
    ("kasa_config", "KaSA"),
    ("layer_replication", "layer replication"),
    ("lora_ga_config", "LoRA-GA initialisation"),
    ("megatron_config", "Megatron layers"),
    ("monteclora_config", "MonteCLoRA"),
    ("trainable_token_indices", "trainable tokens"),
    ("use_bdlora", "BD-LoRA"),
    ("velora_config", "VeLoRA"),
];

/// Keys peft writes whose value carries nothing this crate uses (besides the above).
const INFORMATIONAL_KEYS: &[&str] = &[
    "auto_mapping",
    "megatron_core",
    "peft_version",
    "qalora_group_size",
];

fn invalid(field: &'static str, value: impl Into<String>, fix: &'static str) -> Error {
    Error::InvalidConfig {
        field,
        value: value.into(),
        fix,
    }
}

fn is_unused(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

fn targets_from(v: &Value, field: &'static str) -> Result<Option<TargetModules>> {
    Ok(match v {
        Value::Null => None,
        Value::String(s) => Some(TargetModules::Regex(s.clone())),
        Value::Array(items) => {
            let mut names = items
                .iter()
                .map(|x| x.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| invalid(field, v.to_string(), "give module names as strings"))?;
            // peft keeps target_modules / exclude_modules as a set.
            if matches!(field, "target_modules" | "exclude_modules") {
                names.sort();
                names.dedup();
            }
            Some(TargetModules::Names(names))
        }
        other => {
            return Err(invalid(
                field,
                other.to_string(),
                "give a list of module names or one regular expression",
            ));
        }
    })
}

fn targets_to(t: &Option<TargetModules>) -> Value {
    match t {
        None => Value::Null,
        Some(TargetModules::Regex(s)) => Value::from(s.as_str()),
        Some(TargetModules::Names(names)) => {
            // peft writes a set (in hash order); sorted here, which peft reads the same.
            let mut names = names.clone();
            names.sort();
            names.dedup();
            Value::from(names)
        }
    }
}

/// A number as Python writes it: an integer when it is one (`lora_alpha: 16`).
fn number(x: f64) -> Value {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        Value::from(x as i64)
    } else {
        Value::from(x)
    }
}

impl LoraConfig {
    /// Reads `adapter_config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let value: Value = serde_json::from_str(&text).map_err(|source| Error::ConfigJson {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json(&value)
    }

    /// peft's `LoraConfig.from_peft_type(**json)`: `peft_type` must be `LORA`; absent keys
    /// take peft's defaults; the keys of features this crate does not implement must hold
    /// their unused value (an error names the feature otherwise); unknown keys are skipped
    /// with a warning, as peft does.
    pub fn from_json(value: &Value) -> Result<Self> {
        let map = value.as_object().ok_or_else(|| {
            invalid(
                "adapter_config.json",
                value.to_string(),
                "give a JSON object",
            )
        })?;
        match map.get("peft_type").and_then(Value::as_str) {
            Some("LORA") => {}
            Some(other) => {
                return Err(invalid(
                    "peft_type",
                    other,
                    "only LoRA adapters (peft_type LORA) are implemented",
                ));
            }
            None => {
                return Err(invalid(
                    "peft_type",
                    "missing",
                    "an adapter_config.json names its peft_type (LORA)",
                ));
            }
        }
        let mut c = Self::default();
        let mut unknown = Vec::new();
        for (key, v) in map {
            let int = |field: &'static str| {
                v.as_i64()
                    .ok_or_else(|| invalid(field, v.to_string(), "give an integer"))
            };
            let float = |field: &'static str| {
                v.as_f64()
                    .ok_or_else(|| invalid(field, v.to_string(), "give a number"))
            };
            let boolean = |field: &'static str| {
                v.as_bool()
                    .ok_or_else(|| invalid(field, v.to_string(), "give true or false"))
            };
            let opt_string = |field: &'static str| match v {
                Value::Null => Ok(None),
                Value::String(s) => Ok(Some(s.clone())),
                _ => Err(invalid(field, v.to_string(), "give a string or null")),
            };
            match key.as_str() {
                "peft_type" => {}
                "r" => c.r = int("r")?,
                "lora_alpha" => c.lora_alpha = float("lora_alpha")?,
                "lora_dropout" => c.lora_dropout = float("lora_dropout")?,
                "target_modules" => c.target_modules = targets_from(v, "target_modules")?,
                "exclude_modules" => c.exclude_modules = targets_from(v, "exclude_modules")?,
                "fan_in_fan_out" => c.fan_in_fan_out = boolean("fan_in_fan_out")?,
                "bias" => {
                    c.bias = match v.as_str() {
                        Some("none") => LoraBias::None,
                        Some("all") => LoraBias::All,
                        Some("lora_only") => LoraBias::LoraOnly,
                        _ => {
                            return Err(invalid(
                                "bias",
                                v.to_string(),
                                "give \"none\", \"all\" or \"lora_only\"",
                            ));
                        }
                    }
                }
                "use_rslora" => c.use_rslora = boolean("use_rslora")?,
                "modules_to_save" => {
                    c.modules_to_save = match targets_from(v, "modules_to_save")? {
                        None => None,
                        Some(TargetModules::Names(n)) => Some(n),
                        Some(TargetModules::Regex(s)) => Some(vec![s]),
                    }
                }
                "init_lora_weights" => {
                    c.init_lora_weights = match v {
                        Value::Bool(true) => InitLoraWeights::Default,
                        Value::Bool(false) => InitLoraWeights::Random,
                        Value::String(s) if s == "gaussian" => InitLoraWeights::Gaussian,
                        _ => {
                            return Err(invalid(
                                "init_lora_weights",
                                v.to_string(),
                                "implemented: true (Kaiming-uniform A, zero B), \"gaussian\" and false; initialise PiSSA / OLoRA / LoftQ / EVA / CorDA adapters in Python and load them",
                            ));
                        }
                    }
                }
                "layers_to_transform" => {
                    c.layers_to_transform = match v {
                        Value::Null => None,
                        Value::Number(_) => Some(LayerIndices::One(int("layers_to_transform")?)),
                        Value::Array(a) => Some(LayerIndices::Many(
                            a.iter()
                                .map(Value::as_i64)
                                .collect::<Option<Vec<_>>>()
                                .ok_or_else(|| {
                                    invalid("layers_to_transform", v.to_string(), "give integers")
                                })?,
                        )),
                        _ => {
                            return Err(invalid(
                                "layers_to_transform",
                                v.to_string(),
                                "give a layer index or a list of them",
                            ));
                        }
                    }
                }
                "layers_pattern" => {
                    c.layers_pattern = match targets_from(v, "layers_pattern")? {
                        None => None,
                        Some(TargetModules::Names(n)) => Some(n),
                        Some(TargetModules::Regex(s)) => Some(vec![s]),
                    }
                }
                "rank_pattern" | "alpha_pattern" => {
                    let m = v.as_object().ok_or_else(|| {
                        invalid(
                            "rank_pattern",
                            v.to_string(),
                            "give an object of pattern: value",
                        )
                    })?;
                    for (pattern, x) in m {
                        let x = x.as_f64().ok_or_else(|| {
                            invalid("rank_pattern", x.to_string(), "give numbers")
                        })?;
                        if key == "rank_pattern" {
                            c.rank_pattern.insert(pattern.clone(), x as i64);
                        } else {
                            c.alpha_pattern.insert(pattern.clone(), x);
                        }
                    }
                }
                "use_dora" => c.use_dora = boolean("use_dora")?,
                "target_parameters" => {
                    c.target_parameters = match v {
                        Value::Null => None,
                        Value::Array(a) => Some(
                            a.iter()
                                .map(|x| x.as_str().map(str::to_string))
                                .collect::<Option<Vec<_>>>()
                                .ok_or_else(|| {
                                    invalid(
                                        "target_parameters",
                                        v.to_string(),
                                        "give a list of parameter names",
                                    )
                                })?,
                        ),
                        _ => {
                            return Err(invalid(
                                "target_parameters",
                                v.to_string(),
                                "give a list of parameter names (peft: \"`target_parameters` must be a list of strings or None\")",
                            ));
                        }
                    }
                }
                "task_type" => c.task_type = opt_string("task_type")?,
                "base_model_name_or_path" => {
                    c.base_model_name_or_path = opt_string("base_model_name_or_path")?
                }
                "revision" => c.revision = opt_string("revision")?,
                "inference_mode" => c.inference_mode = boolean("inference_mode")?,
                "lora_bias" if v.as_bool() == Some(true) => {
                    return Err(invalid(
                        "lora_bias",
                        "true",
                        "a bias on lora_B is not implemented; use lora_bias false",
                    ));
                }
                "ensure_weight_tying" if v.as_bool() == Some(true) => {
                    return Err(invalid(
                        "ensure_weight_tying",
                        "true",
                        "tied adapters on tied embeddings are not implemented; use false",
                    ));
                }
                "use_qalora" if v.as_bool() == Some(true) => {
                    return Err(invalid(
                        "use_qalora",
                        "true",
                        "QA-LoRA (quantised bases) is not implemented; use false",
                    ));
                }
                "lora_bias" | "ensure_weight_tying" | "use_qalora" | "loftq_config"
                    if is_unused(v) => {}
                "loftq_config" => {
                    return Err(invalid(
                        "loftq_config",
                        v.to_string(),
                        "LoftQ initialisation is not implemented; leave it {}",
                    ));
                }
                k if INFORMATIONAL_KEYS.contains(&k) => {}
                k => match UNSUPPORTED_KEYS.iter().find(|(name, _)| *name == k) {
                    Some(_) if is_unused(v) => {}
                    Some((name, what)) => {
                        return Err(Error::InvalidArgument {
                            field: name,
                            detail: format!(
                                "{v}: {what} is not implemented; adapters using it load in Python peft only"
                            ),
                        });
                    }
                    None => unknown.push(k.to_string()),
                },
            }
        }
        if !unknown.is_empty() {
            log::warn!(
                "Unexpected keyword arguments {unknown:?} for class LoraConfig, these are ignored (as peft {PEFT_VERSION} does)"
            );
        }
        c.validate()?;
        Ok(c)
    }

    /// peft's `__post_init__` checks, and what this crate refuses.
    pub fn validate(&self) -> Result<()> {
        if self.r <= 0 {
            return Err(invalid("r", self.r.to_string(), "give a positive rank"));
        }
        if !(0.0..=1.0).contains(&self.lora_dropout) {
            return Err(invalid(
                "lora_dropout",
                self.lora_dropout.to_string(),
                "give a probability in [0, 1]",
            ));
        }
        if matches!(self.target_modules, Some(TargetModules::Regex(_)))
            && (self.layers_to_transform.is_some() || self.layers_pattern.is_some())
        {
            return Err(invalid(
                "layers_to_transform",
                "with a regular-expression target_modules",
                "`layers_to_transform` and `layers_pattern` take a list of target_modules; put the layers in the regular expression instead",
            ));
        }
        // peft tests these for truth: an empty pattern or list is no pattern / no list.
        let pattern_given = self
            .layers_pattern
            .as_ref()
            .is_some_and(|p| p.iter().any(|s| !s.is_empty()));
        if pattern_given && self.layers_to_transform.is_none() {
            return Err(invalid(
                "layers_pattern",
                "without layers_to_transform",
                "give layers_to_transform with layers_pattern",
            ));
        }
        for (k, &r) in &self.rank_pattern {
            if r <= 0 {
                return Err(Error::InvalidArgument {
                    field: "rank_pattern",
                    detail: format!("{k}: rank {r}; give positive ranks"),
                });
            }
        }
        Ok(())
    }

    /// `adapter_config.json` as peft 0.21.2 writes it (`json.dumps(indent=2,
    /// sort_keys=True)`: every LoRA key, `inference_mode` true, `peft_version`).
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        for (key, _) in UNSUPPORTED_KEYS {
            m.insert((*key).into(), Value::Null);
        }
        let patterns = |p: Vec<(String, Value)>| Value::Object(p.into_iter().collect());
        let entries: Vec<(&str, Value)> = vec![
            (
                "alpha_pattern",
                patterns(
                    self.alpha_pattern
                        .iter()
                        .map(|(k, &v)| (k.clone(), number(v)))
                        .collect(),
                ),
            ),
            ("auto_mapping", Value::Null),
            (
                "base_model_name_or_path",
                self.base_model_name_or_path.clone().into(),
            ),
            (
                "bias",
                match self.bias {
                    LoraBias::None => "none",
                    LoraBias::All => "all",
                    LoraBias::LoraOnly => "lora_only",
                }
                .into(),
            ),
            ("ensure_weight_tying", false.into()),
            ("exclude_modules", targets_to(&self.exclude_modules)),
            ("fan_in_fan_out", self.fan_in_fan_out.into()),
            ("inference_mode", true.into()),
            (
                "init_lora_weights",
                match self.init_lora_weights {
                    InitLoraWeights::Default => true.into(),
                    InitLoraWeights::Random => false.into(),
                    InitLoraWeights::Gaussian => "gaussian".into(),
                },
            ),
            (
                "layers_pattern",
                match &self.layers_pattern {
                    None => Value::Null,
                    Some(p) if p.len() == 1 => p[0].clone().into(),
                    Some(p) => p.clone().into(),
                },
            ),
            (
                "layers_to_transform",
                match &self.layers_to_transform {
                    None => Value::Null,
                    Some(LayerIndices::One(i)) => (*i).into(),
                    Some(LayerIndices::Many(v)) => v.clone().into(),
                },
            ),
            ("loftq_config", Value::Object(Map::new())),
            ("lora_alpha", number(self.lora_alpha)),
            ("lora_bias", false.into()),
            ("lora_dropout", self.lora_dropout.into()),
            ("megatron_core", "megatron.core".into()),
            ("modules_to_save", self.modules_to_save.clone().into()),
            ("peft_type", "LORA".into()),
            ("peft_version", PEFT_VERSION.into()),
            ("qalora_group_size", 16.into()),
            ("r", self.r.into()),
            (
                "rank_pattern",
                patterns(
                    self.rank_pattern
                        .iter()
                        .map(|(k, &v)| (k.clone(), v.into()))
                        .collect(),
                ),
            ),
            ("revision", self.revision.clone().into()),
            ("target_modules", targets_to(&self.target_modules)),
            ("target_parameters", self.target_parameters.clone().into()),
            ("task_type", self.task_type.clone().into()),
            ("use_dora", self.use_dora.into()),
            ("use_qalora", false.into()),
            ("use_rslora", self.use_rslora.into()),
        ];
        for (k, v) in entries {
            m.insert(k.into(), v);
        }
        Value::Object(m)
    }

    /// Writes `adapter_config.json` into `dir`.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join(ADAPTER_CONFIG_NAME);
        let text =
            serde_json::to_string_pretty(&self.to_json()).map_err(|e| Error::InvalidArgument {
                field: "adapter_config.json",
                detail: e.to_string(),
            })?;
        std::fs::write(&path, text).map_err(|source| Error::Io { path, source })
    }

    /// The scaling of an adapter of rank `r` and alpha `alpha` (`alpha / r`, or `/ √r` with
    /// rsLoRA).
    pub fn scaling(&self, r: i64, alpha: f64) -> f64 {
        if self.use_rslora {
            alpha / (r as f64).sqrt()
        } else {
            alpha / r as f64
        }
    }
}

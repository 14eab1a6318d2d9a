//! LoRA layers: which linear layers an adapter targets (peft's `check_target_module_exists`,
//! `"all-linear"`, the per-architecture defaults, `layers_to_transform`, `rank_pattern` /
//! `alpha_pattern`), their `lora_A` / `lora_B` drawn as peft draws them, and the forward
//! `base_layer(x) + lora_B(lora_A(dropout(x))) * scaling` (peft's `tuners/lora/layer.py`
//! `Linear.forward`) run by every model's linear layers while an adapter is active.
//!
//! The adapters live in the base model's own `VarStore` under peft's parameter names
//! without the `base_model.model.` prefix (`model.layers.0.self_attn.q_proj.lora_A.default.weight`),
//! so the Trainer's optimizer, gradient clipping, DDP and checkpoints see them as any
//! parameter. Each adaptable part of `tchtrain-nn` holds a LoRA slot; [`set_adapters`]
//! fills the slots before a forward, and each part adds its own slot's term.

use std::collections::{HashMap, HashSet};

use tch::{Kind, Tensor, nn};
use tchtrain_nn::{Dora, LoraAdapter, LoraSlot};

use super::config::{InitLoraWeights, LayerIndices, LoraConfig, TargetModules};
use crate::modeling_utils::LinearModule;
use crate::{Error, Result};

/// One adapted layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraLayer {
    /// The module's name (`model.layers.0.self_attn.q_proj`).
    pub module: String,
    /// Input features.
    pub in_features: i64,
    /// Output features.
    pub out_features: i64,
    /// GPT-2's `Conv1D` (`[in, out]` weight; `fan_in_fan_out`).
    pub conv1d: bool,
    /// An `nn.Embedding` (peft's `lora.Embedding`): `in_features` is the vocabulary,
    /// `out_features` the embedding width, the adapter `lora_embedding_A` `[r, vocab]` /
    /// `lora_embedding_B` `[width, r]`.
    pub embedding: bool,
    /// The rank (`r`, or `rank_pattern`'s).
    pub r: i64,
    /// `alpha / r` (or `/ √r`), with `alpha_pattern`'s alpha.
    pub scaling: f64,
    /// DoRA (`use_dora`): a magnitude vector rescales each output row.
    pub dora: bool,
    /// peft's `ParamWrapper` (`target_parameters`): the adapted 3-D expert parameter. The
    /// layer's `module` is then peft's path of its wrapper (the experts module, with a
    /// `.base_layer` per wrapper nested around it), `in_features` / `out_features` the
    /// parameter's last two sizes swapped, and `lora_A` `[r · experts, in]`, `lora_B`
    /// `[out, r · experts]`.
    pub parameter: Option<ParameterTarget>,
}

/// A 3-D parameter adapted by `target_parameters`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParameterTarget {
    /// The module that owns it (`model.layers.0.mlp.experts`).
    pub module: String,
    /// Its name in the module (`gate_up_proj`).
    pub parameter: String,
    /// Its first size.
    pub num_experts: i64,
}

impl LoraLayer {
    /// The name of the part's LoRA slot: the module, or for a parameter
    /// `<module>.<parameter>`.
    pub fn slot_name(&self) -> String {
        match &self.parameter {
            Some(p) => format!("{}.{}", p.module, p.parameter),
            None => self.module.clone(),
        }
    }

    /// `lora_A`'s rows (`lora_B`'s columns): `r`, times the experts for a parameter.
    fn adapter_rank(&self) -> i64 {
        self.r * self.parameter.as_ref().map_or(1, |p| p.num_experts)
    }

    /// The variable names of `lora_A` / `lora_B` (an embedding's `lora_embedding_A` /
    /// `lora_embedding_B`, plain parameters) under `adapter`.
    pub fn weight_names(&self, adapter: &str) -> (String, String) {
        if self.embedding {
            return (
                format!("{}.lora_embedding_A.{adapter}", self.module),
                format!("{}.lora_embedding_B.{adapter}", self.module),
            );
        }
        (
            format!("{}.lora_A.{adapter}.weight", self.module),
            format!("{}.lora_B.{adapter}.weight", self.module),
        )
    }

    /// The keys peft saves `lora_A` / `lora_B` under (no adapter name; an embedding's
    /// without `.weight`), without the `base_model.model.` prefix.
    pub fn saved_names(&self) -> (String, String) {
        if self.embedding {
            return (
                format!("{}.lora_embedding_A", self.module),
                format!("{}.lora_embedding_B", self.module),
            );
        }
        (
            format!("{}.lora_A.weight", self.module),
            format!("{}.lora_B.weight", self.module),
        )
    }

    /// Whether the base weight is oriented `[in, out]` relative to the adapter's `B @ A`
    /// (`Conv1D`, and an embedding's `[vocab, width]`): peft's `fan_in_fan_out` transpose.
    fn transposed(&self) -> bool {
        self.conv1d || self.embedding
    }

    /// The variable name of DoRA's magnitude vector under `adapter`.
    pub fn magnitude_name(&self, adapter: &str) -> String {
        format!("{}.lora_magnitude_vector.{adapter}.weight", self.module)
    }

    /// The adapter's variable names (`lora_A`, `lora_B`, and DoRA's magnitude), in peft's
    /// registration order.
    pub fn variable_names(&self, adapter: &str) -> Vec<String> {
        let (a, b) = self.weight_names(adapter);
        let mut names = vec![a, b];
        if self.dora {
            names.push(self.magnitude_name(adapter));
        }
        names
    }
}

/// peft's `TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING` for the model types here.
fn default_targets(model_type: &str) -> Option<&'static [&'static str]> {
    Some(match model_type {
        "llama" | "mistral" | "gemma" | "gemma2" | "gemma3_text" | "qwen2" | "qwen3" => {
            &["q_proj", "v_proj"]
        }
        "gpt2" => &["c_attn"],
        "bert" | "roberta" | "xlm-roberta" => &["query", "value"],
        "deberta-v2" => &["query_proj", "value_proj"],
        _ => return None,
    })
}

/// Python's `re.match(pattern, text)` (anchored at the start) or `re.fullmatch`.
fn regex_matches(pattern: &str, text: &str, full: bool) -> Result<bool> {
    let anchored = if full {
        format!("^(?:{pattern})$")
    } else {
        format!("^(?:{pattern})")
    };
    let re = regex::Regex::new(&anchored).map_err(|e| Error::InvalidArgument {
        field: "target_modules",
        detail: format!("{pattern:?} is not a regular expression this crate reads: {e}"),
    })?;
    Ok(re.is_match(text))
}

/// The first number after a dotted component (`.*?\.[^.]*\.(\d+)\.`), or after one of
/// `patterns` (`(?:^|.*?\.){pattern}\.(\d+)\.`): the layer index `layers_to_transform` reads.
fn layer_index(name: &str, patterns: Option<&[String]>) -> Result<Option<i64>> {
    let candidates: Vec<String> = match patterns {
        None | Some([]) => vec![r".*?\.[^.]*\.(\d+)\.".to_string()],
        Some(p) => p
            .iter()
            .map(|p| format!(r"(?:^|.*?\.){p}\.(\d+)\."))
            .collect(),
    };
    for pattern in candidates {
        let re =
            regex::Regex::new(&format!("^(?:{pattern})")).map_err(|e| Error::InvalidArgument {
                field: "layers_pattern",
                detail: format!("{pattern:?}: {e}"),
            })?;
        if let Some(c) = re.captures(name) {
            return Ok(c.get(1).and_then(|m| m.as_str().parse().ok()));
        }
    }
    Ok(None)
}

fn matches_targets(targets: &TargetModules, name: &str) -> Result<bool> {
    Ok(match targets {
        TargetModules::Regex(pattern) => regex_matches(pattern, name, true)?,
        TargetModules::Names(names) => names
            .iter()
            .any(|t| name == t || name.ends_with(&format!(".{t}"))),
    })
}

/// peft's `get_pattern_key`: the first key (in key order) with `(.*\.)?({key})$` matching
/// the start of `name`.
fn pattern_key<'a, V>(
    patterns: &'a indexmap::IndexMap<String, V>,
    name: &str,
) -> Result<Option<&'a V>> {
    for (key, value) in patterns {
        if regex_matches(&format!(r"(.*\.)?({key})$"), name, false)? {
            return Ok(Some(value));
        }
    }
    Ok(None)
}

/// An `nn.Embedding` of a model, as LoRA targets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EmbeddingModule {
    /// The module's name (`model.embed_tokens`).
    pub name: String,
    /// `num_embeddings`.
    pub num_embeddings: i64,
    /// `embedding_dim`.
    pub embedding_dim: i64,
}

/// What a model tells the target resolution.
pub(crate) struct ModelFacts<'a> {
    /// `model_type`.
    pub model_type: &'a str,
    /// Every module with parameters, in registration order (names of the variables without
    /// their last component).
    pub modules: Vec<String>,
    /// The linear layers (`nn.Linear` / `Conv1D`), in registration order.
    pub linear: Vec<LinearModule>,
    /// `get_output_embeddings()` (the causal LM's `lm_head`), left out of `"all-linear"`.
    pub output_embeddings: Option<String>,
    /// The embeddings (`nn.Embedding`), in registration order.
    pub embeddings: Vec<EmbeddingModule>,
    /// Whether the output embeddings are tied to the input embeddings.
    pub tied_embeddings: bool,
    /// Every parameter with its sizes, in registration order (what `target_parameters`
    /// matches).
    pub parameters: Vec<(String, Vec<i64>)>,
}

/// peft's injection walk: the adapted layers in module order, `config` resolved as peft
/// mutates it (`all-linear` into names, `fan_in_fan_out` for `Conv1D`, the task's
/// `modules_to_save`).
pub(crate) fn resolve_targets(
    config: &mut LoraConfig,
    facts: &ModelFacts<'_>,
) -> Result<Vec<LoraLayer>> {
    config.validate()?;
    let task = config.task_type.clone().unwrap_or_default();
    let task_modules: &[&str] = match task.as_str() {
        "SEQ_CLS" | "TOKEN_CLS" => &["classifier", "score"],
        "QUESTION_ANS" => &["qa_outputs"],
        "" | "CAUSAL_LM" | "FEATURE_EXTRACTION" => &[],
        other => {
            return Err(Error::InvalidArgument {
                field: "task_type",
                detail: format!(
                    "{other}: implemented are CAUSAL_LM, SEQ_CLS, TOKEN_CLS, QUESTION_ANS and FEATURE_EXTRACTION"
                ),
            });
        }
    };
    // SEQ_CLS adds its heads before the injection, TOKEN_CLS and QUESTION_ANS after (peft's
    // order: with "all-linear" their head is then targeted and wrapped, which peft refuses).
    if task == "SEQ_CLS" {
        config
            .modules_to_save
            .get_or_insert_with(Vec::new)
            .extend(task_modules.iter().map(|s| s.to_string()));
    }
    let targets = match config.target_modules.clone() {
        Some(TargetModules::Regex(s)) if s.eq_ignore_ascii_case("all-linear") => {
            let mut names: Vec<String> = facts
                .linear
                .iter()
                .map(|m| m.name.clone())
                .filter(|n| Some(n) != facts.output_embeddings.as_ref())
                .collect();
            if facts.output_embeddings.is_none()
                && task == "SEQ_CLS"
                && let Some(i) = names.iter().position(|n| n == "score" || n == "classifier")
            {
                names.remove(i);
            }
            TargetModules::Names(names)
        }
        Some(t) => t,
        None => match default_targets(facts.model_type) {
            Some(d) => TargetModules::Names(d.iter().map(|s| s.to_string()).collect()),
            // peft: no module targeted, the parameters only.
            None if config.target_parameters.is_some() => TargetModules::Names(Vec::new()),
            None => {
                return Err(Error::InvalidArgument {
                    field: "target_modules",
                    detail: format!(
                        "peft has no default target modules for {}: give target_modules (names, a regular expression or \"all-linear\")",
                        facts.model_type
                    ),
                });
            }
        },
    };
    config.target_modules = Some(targets.clone());
    let linear: HashMap<&str, &LinearModule> =
        facts.linear.iter().map(|m| (m.name.as_str(), m)).collect();
    let save_patterns: Vec<String> = config
        .modules_to_save
        .iter()
        .flatten()
        .map(|m| format!(r"(^|.*\.){m}($|\..*)"))
        .collect();
    let mut layers = Vec::new();
    for name in &facts.modules {
        if let Some(exclude) = &config.exclude_modules
            && matches_targets(exclude, name)?
        {
            continue;
        }
        let mut saved = false;
        for p in &save_patterns {
            saved |= regex_matches(p, name, false)?;
        }
        if saved || !matches_targets(&targets, name)? {
            continue;
        }
        let indices = match &config.layers_to_transform {
            Some(LayerIndices::Many(v)) if v.is_empty() => None,
            other => other.as_ref(),
        };
        if let (TargetModules::Names(names), Some(indices)) = (&targets, indices)
            && !names.contains(name)
        {
            let index = layer_index(name, config.layers_pattern.as_deref())?;
            let keep = match (index, indices) {
                (None, _) => false,
                (Some(i), LayerIndices::One(want)) => i == *want,
                (Some(i), LayerIndices::Many(want)) => want.contains(&i),
            };
            if !keep {
                continue;
            }
        }
        let r = *pattern_key(&config.rank_pattern, name)?.unwrap_or(&config.r);
        let alpha = *pattern_key(&config.alpha_pattern, name)?.unwrap_or(&config.lora_alpha);
        if let Some(e) = facts.embeddings.iter().find(|e| &e.name == name) {
            // peft's `lora.Embedding` (its `update_layer` refuses `lora_bias`, which is
            // refused here for every layer).
            if facts.tied_embeddings {
                log::warn!(
                    "Model has `tie_word_embeddings=True` and a tied layer is part of the adapter, but `ensure_weight_tying` is not set to True. This can lead to complications, for example when merging the adapter or converting your model to formats other than safetensors."
                );
            }
            layers.push(LoraLayer {
                module: name.clone(),
                in_features: e.num_embeddings,
                out_features: e.embedding_dim,
                conv1d: false,
                embedding: true,
                r,
                scaling: config.scaling(r, alpha),
                dora: config.use_dora,
                parameter: None,
            });
            continue;
        }
        let Some(module) = linear.get(name.as_str()) else {
            return Err(Error::InvalidArgument {
                field: "target_modules",
                detail: format!(
                    "{name} is targeted but is neither a linear layer (nn.Linear / Conv1D) nor an embedding; LoRA on other layers is not implemented"
                ),
            });
        };
        // peft sets `fan_in_fan_out` for each new layer by its kind, with a warning when
        // that changes it: the config keeps the last layer's.
        if module.conv1d != config.fan_in_fan_out {
            log::warn!(
                "fan_in_fan_out is set to {} but the target module is `{}`. Setting fan_in_fan_out to {}.",
                if config.fan_in_fan_out {
                    "True"
                } else {
                    "False"
                },
                if module.conv1d {
                    "Conv1D"
                } else {
                    "torch.nn.Linear"
                },
                if module.conv1d { "True" } else { "False" },
            );
            config.fan_in_fan_out = module.conv1d;
        }
        layers.push(LoraLayer {
            module: name.clone(),
            in_features: module.in_features,
            out_features: module.out_features,
            conv1d: module.conv1d,
            embedding: false,
            r,
            scaling: config.scaling(r, alpha),
            dora: config.use_dora,
            parameter: None,
        });
    }
    layers.extend(parameter_targets(config, facts)?);
    // peft walks every module, containers included: a target naming one (`mlp`,
    // `self_attn`) is "not supported" there.
    let mut containers: Vec<&str> = Vec::new();
    for name in &facts.modules {
        let mut rest = name.as_str();
        while let Some((parent, _)) = rest.rsplit_once('.') {
            if !containers.contains(&parent) && !facts.modules.iter().any(|m| m == parent) {
                containers.push(parent);
            }
            rest = parent;
        }
    }
    for container in containers {
        let excluded = match &config.exclude_modules {
            Some(exclude) => matches_targets(exclude, container)?,
            None => false,
        };
        if !excluded && matches_targets(&targets, container)? {
            return Err(Error::InvalidArgument {
                field: "target_modules",
                detail: format!(
                    "{container} is targeted but is a container of layers, not a linear layer (peft: \"Target module ... is not supported\"); name its linear layers instead"
                ),
            });
        }
    }
    if layers.is_empty() {
        return Err(Error::InvalidArgument {
            field: "target_modules",
            detail: format!(
                "{targets:?} matched no linear layer of the model (peft: \"Target modules not found in the base model\"); the linear layers are {}",
                facts
                    .linear
                    .iter()
                    .map(|m| m.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        });
    }
    if task == "TOKEN_CLS" || task == "QUESTION_ANS" {
        let added: Vec<String> = task_modules.iter().map(|s| s.to_string()).collect();
        if let Some(l) = layers
            .iter()
            .find(|l| added.iter().any(|m| l.module.ends_with(m.as_str())))
        {
            return Err(Error::InvalidArgument {
                field: "modules_to_save",
                detail: format!(
                    "{} is adapted and is also the head {task} trains in full (peft: \"modules_to_save cannot be applied to modules of type lora.Linear\"); leave it out of target_modules",
                    l.module
                ),
            });
        }
        config
            .modules_to_save
            .get_or_insert_with(Vec::new)
            .extend(added);
    }
    Ok(layers)
}

/// peft's `_inject_parameters` (after the modules): each module's own parameters in
/// registration order whose full name is a `target_parameters` entry or ends with `.`
/// and one, each wrapped in a `ParamWrapper` around the previous wrapper of the same module
/// (so the last one wrapped is the outermost, at the module's path, and each earlier one a
/// `.base_layer` further in).
fn parameter_targets(config: &LoraConfig, facts: &ModelFacts<'_>) -> Result<Vec<LoraLayer>> {
    let Some(targets) = &config.target_parameters else {
        return Ok(Vec::new());
    };
    if config.lora_dropout != 0.0 {
        return Err(Error::InvalidArgument {
            field: "lora_dropout",
            detail: format!(
                "{}: peft's ParamWrapper (target_parameters) \"does not work with lora_dropout != 0\"; use 0",
                config.lora_dropout
            ),
        });
    }
    if config.use_dora {
        return Err(Error::InvalidArgument {
            field: "use_dora",
            detail: "peft's ParamWrapper (target_parameters) \"does not work with LoRA variants like DoRA\"; use plain LoRA".into(),
        });
    }
    // Each module's targeted parameters (name, sizes), in registration order.
    type Targeted = Vec<(String, Vec<i64>)>;
    let mut per_module: Vec<(String, Targeted)> = Vec::new();
    for (name, size) in &facts.parameters {
        let matched = targets
            .iter()
            .any(|t| name == t || name.ends_with(&format!(".{t}")));
        if !matched {
            continue;
        }
        let Some((module, parameter)) = name.rsplit_once('.') else {
            return Err(Error::InvalidArgument {
                field: "target_parameters",
                detail: format!(
                    "{name}: targeting a parameter of the top-level module is not supported (peft)"
                ),
            });
        };
        if size.len() != 3 {
            return Err(Error::InvalidArgument {
                field: "target_parameters",
                detail: format!(
                    "{name} has {} dimensions; parameter LoRA is implemented for the experts' 3-D weights ([experts, out, in]); target 2-D weights through their module with target_modules",
                    size.len()
                ),
            });
        }
        match per_module.iter_mut().find(|(m, _)| m == module) {
            Some((_, params)) => params.push((parameter.to_string(), size.clone())),
            None => per_module.push((
                module.to_string(),
                vec![(parameter.to_string(), size.clone())],
            )),
        }
    }
    let mut layers = Vec::new();
    for (module, params) in per_module {
        let n = params.len();
        for (k, (parameter, size)) in params.into_iter().enumerate() {
            let key = format!("{module}.{parameter}");
            let r = *pattern_key(&config.rank_pattern, &key)?.unwrap_or(&config.r);
            let alpha = *pattern_key(&config.alpha_pattern, &key)?.unwrap_or(&config.lora_alpha);
            layers.push(LoraLayer {
                module: format!("{module}{}", ".base_layer".repeat(n - 1 - k)),
                // `_get_in_out_features` reads `[experts, in, out]`, then swaps them: the
                // parameter is not transposed.
                in_features: size[2],
                out_features: size[1],
                conv1d: false,
                embedding: false,
                r,
                scaling: config.scaling(r, alpha),
                dora: false,
                parameter: Some(ParameterTarget {
                    module: module.clone(),
                    parameter,
                    num_experts: size[0],
                }),
            });
        }
    }
    Ok(layers)
}

/// torch's `kaiming_uniform_(t, a=math.sqrt(5))` on a `[out, fan_in]` tensor (the bound
/// computed in double precision as torch computes it).
fn kaiming_uniform(t: &mut Tensor) -> Result<()> {
    let fan_in = t.size()[1] as f64;
    let a = 5f64.sqrt();
    let gain = (2.0 / (1.0 + a.powi(2))).sqrt();
    let bound = 3f64.sqrt() * (gain / fan_in.sqrt());
    let _ = t.f_uniform_(-bound, bound)?;
    Ok(())
}

/// A linear layer's draws (see [`create_adapters`]).
fn linear_adapter_draws(
    a: &mut Tensor,
    b: &mut Tensor,
    layer: &LoraLayer,
    init: InitLoraWeights,
) -> Result<()> {
    tch::no_grad(|| -> Result<()> {
        kaiming_uniform(a)?;
        kaiming_uniform(b)?;
        match init {
            InitLoraWeights::Default => {
                kaiming_uniform(a)?;
                let _ = b.f_zero_()?;
            }
            InitLoraWeights::Gaussian => {
                let _ = a.f_normal_(0.0, 1.0 / layer.r as f64)?;
                let _ = b.f_zero_()?;
            }
            InitLoraWeights::Random => {}
        }
        Ok(())
    })
}

/// An embedding's draws (peft's `Embedding.update_layer`): `randn(r, vocab)`,
/// `randn(width, r)`, then `reset_lora_parameters` zeroes A and draws B again from a
/// standard normal (for `"gaussian"` too); `init_lora_weights=False` keeps both draws.
fn embedding_adapter_draws(layer: &LoraLayer, init: InitLoraWeights) -> Result<(Tensor, Tensor)> {
    tch::no_grad(|| -> Result<(Tensor, Tensor)> {
        let cpu = (Kind::Float, tch::Device::Cpu);
        let mut a = Tensor::f_randn([layer.r, layer.in_features], cpu)?;
        let mut b = Tensor::f_randn([layer.out_features, layer.r], cpu)?;
        if init != InitLoraWeights::Random {
            let _ = a.f_zero_()?;
            let _ = b.f_normal_(0.0, 1.0)?;
        }
        Ok((a, b))
    })
}

/// Creates the adapters' `lora_A` / `lora_B` in `vs` for `layers` (in order), drawn from
/// the global generator exactly as peft's `update_layer` draws them: `nn.Linear(in, r)`
/// and `nn.Linear(r, out)` are built (two Kaiming-uniform draws), then
/// `reset_lora_parameters` draws `lora_A` again (Kaiming-uniform, or a normal of deviation
/// `1 / r` for `"gaussian"`) and zeroes `lora_B` (`init_lora_weights=False` keeps both
/// constructor draws). On the CPU, in float32, then rounded through the base weight's
/// half-precision dtype and back, as peft's `autocast_adapter_dtype`.
pub(crate) fn create_adapters(
    ctx: &tchtrain_nn::Context,
    vs: &nn::VarStore,
    layers: &[LoraLayer],
    adapter: &str,
    init: InitLoraWeights,
) -> Result<()> {
    let base_kind = vs.kind();
    for layer in layers {
        let cpu = (Kind::Float, tch::Device::Cpu);
        let (a, b) = if layer.embedding {
            embedding_adapter_draws(layer, init)?
        } else {
            let rank = layer.adapter_rank();
            let mut a = Tensor::f_empty([rank, layer.in_features], cpu)?;
            let mut b = Tensor::f_empty([layer.out_features, rank], cpu)?;
            linear_adapter_draws(&mut a, &mut b, layer, init)?;
            (a, b)
        };
        let round = |t: Tensor| -> Result<Tensor> {
            Ok(match base_kind {
                Kind::BFloat16 | Kind::Half => t.f_to_kind(base_kind)?.f_to_kind(Kind::Float)?,
                _ => t,
            })
        };
        let (a, b) = (round(a)?, round(b)?);
        let mut path = vs.root();
        for part in layer.module.split('.') {
            path = path / part;
        }
        // DoRA's `update_layer`: the magnitude is the row norm of `W + scaling · B @ A`
        // (`W` transposed for a `Conv1D` or an embedding, dequantized for a quantized
        // layer), in the weight's dtype.
        let magnitude = if layer.dora {
            let w = base_weight(ctx, vs, &layer.module)?;
            let w = if layer.transposed() { w.f_tr()? } else { w };
            let lora_weight = b
                .f_to_device(w.device())?
                .f_matmul(&a.f_to_device(w.device())?)?;
            Some(tch::no_grad(|| -> Result<Tensor> {
                Ok((&w + lora_weight.f_to_kind(w.kind())? * layer.scaling)
                    .f_linalg_norm(2.0, &[1i64][..], false, None::<Kind>)?
                    .f_to_kind(w.kind())?)
            })?)
        } else {
            None
        };
        // Float32 whatever the base's dtype (peft's `autocast_adapter_dtype`); an
        // embedding's A / B are plain parameters (`lora_embedding_A.<adapter>`).
        let device = vs.device();
        let (a_name, b_name) = if layer.embedding {
            ("lora_embedding_A", "lora_embedding_B")
        } else {
            ("lora_A", "lora_B")
        };
        for (which, t) in [(a_name, a), (b_name, b)] {
            let t = t.f_to_device(device)?.f_to_kind(Kind::Float)?;
            if layer.embedding {
                let _ = (&path / which).add(adapter, t, true);
            } else {
                let _ = (&path / which / adapter).add("weight", t, true);
            }
        }
        if let Some(m) = magnitude {
            let t = m.f_to_device(device)?.f_to_kind(Kind::Float)?;
            let _ = (&path / "lora_magnitude_vector" / adapter).add("weight", t, true);
        }
    }
    Ok(())
}

/// The adapted parts' slots by module name, and the adapted layers no part is named after.
pub(crate) type FilledSlots = (Vec<(String, LoraSlot)>, Vec<String>);

/// Fills the LoRA slots of the model whose parts share `ctx` for a forward: each part
/// adapted in `layers` gets the adapter named `adapter`, read from `vs` (so a dtype or
/// device move of the store is always seen); every other part, and the parts in `merged`
/// (an adapter merged into their weight, which run their base layer alone, as peft's),
/// gets none. Returns the adapted layers' slots, and the adapted layers no part of the
/// model is named after.
pub(crate) fn set_adapters(
    ctx: &tchtrain_nn::Context,
    vs: &nn::VarStore,
    layers: &[LoraLayer],
    adapter: &str,
    dropout: f64,
    train: bool,
    merged: &HashSet<String>,
) -> Result<FilledSlots> {
    let vars = vs.variables();
    let get = |n: &str| {
        vars.get(n)
            .map(Tensor::shallow_clone)
            .ok_or_else(|| Error::InvalidArgument {
                field: "adapter",
                detail: format!("{n} is missing from the model (was the adapter removed?)"),
            })
    };
    let mut by_name: HashMap<String, &LoraLayer> = layers
        .iter()
        .filter(|l| !merged.contains(&l.module))
        .map(|l| (l.slot_name(), l))
        .collect();
    let mut filled = Vec::with_capacity(by_name.len());
    for (name, slot) in ctx.lora_slots() {
        let Some(l) = by_name.remove(name.as_str()) else {
            slot.set(None);
            continue;
        };
        let (a, b) = l.weight_names(adapter);
        let dora = if l.dora {
            Some(Dora {
                magnitude: get(&l.magnitude_name(adapter))?,
                weight: base_weight(ctx, vs, &l.module)?,
                bias: vars
                    .get(&format!("{}.bias", l.module))
                    .map(Tensor::shallow_clone),
                conv1d: l.conv1d,
            })
        } else {
            None
        };
        slot.set(Some(LoraAdapter {
            a: get(&a)?,
            b: get(&b)?,
            scaling: l.scaling,
            dora,
            dropout: if l.embedding { 0.0 } else { dropout },
            train,
        }));
        filled.push((name, slot));
    }
    let mut unknown: Vec<String> = by_name.into_keys().collect();
    unknown.sort();
    Ok((filled, unknown))
}

/// The base layer's weight as DoRA reads it (peft's `dequantize_module_weight`): a quantized
/// layer's dequantized (again at each forward, as peft's), else the weight itself.
pub(crate) fn base_weight(
    ctx: &tchtrain_nn::Context,
    vs: &nn::VarStore,
    module: &str,
) -> Result<Tensor> {
    if let Some(w) = crate::bitsandbytes::dequantized_weight(ctx, module)? {
        return Ok(w);
    }
    vs.variables()
        .get(&format!("{module}.weight"))
        .map(Tensor::shallow_clone)
        .ok_or_else(|| Error::InvalidArgument {
            field: "use_dora",
            detail: format!("{module} has no weight"),
        })
}

/// peft's DoRA merge: `W' = m / ‖W + ΔW‖ · (W + ΔW)` (row norms of the weight as `nn.Linear`
/// holds it; the factor transposed for a `Conv1D`).
pub(crate) fn dora_merged_weight(
    weight: &Tensor,
    delta: &Tensor,
    magnitude: &Tensor,
    layer: &LoraLayer,
) -> Tensor {
    let orient = |t: &Tensor| {
        if layer.transposed() {
            t.tr()
        } else {
            t.shallow_clone()
        }
    };
    let weight_norm = (orient(weight) + orient(delta))
        .linalg_norm(2.0, &[1i64][..], false, None::<Kind>)
        .to_kind(weight.kind());
    let factor = orient(&(magnitude / weight_norm).view([-1, 1]));
    factor * (weight + delta)
}

/// peft's `get_delta_weight`: `B @ A * scaling`, transposed for a `Conv1D` (`[in, out]`)
/// and an embedding (`[vocab, width]`: `transpose(B @ A) * scaling`).
pub(crate) fn delta_weight(a: &Tensor, b: &Tensor, layer: &LoraLayer) -> Tensor {
    if layer.embedding {
        return b.matmul(a).tr() * layer.scaling;
    }
    let d = b.matmul(a) * layer.scaling;
    if layer.conv1d { d.tr() } else { d }
}

//! `PeftModel`: peft's `get_peft_model` / `PeftModel.from_pretrained` / `save_pretrained` /
//! `merge_and_unload` for LoRA, over any model here (`Box<dyn PreTrainedModel>`), and the
//! adapter files exactly as peft 0.21.2 writes them (`adapter_config.json`,
//! `adapter_model.safetensors` with keys `base_model.model.<module>.lora_A.weight`, no
//! adapter-name infix, `format: pt`).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use tch::{Tensor, nn::VarStore};

use super::config::{
    ADAPTER_CONFIG_NAME, ADAPTER_SAFE_WEIGHTS_NAME, LoraBias, LoraConfig, TargetModules,
};
use super::lora::{self, LoraLayer, ModelFacts};
use crate::configuration_utils::PretrainedConfig;
use crate::modeling_utils::{
    LabelCheck, ModelInputs, ModelOutput, PreTrainedModel, TrainableModel,
};
use crate::{Error, Result};

/// The first adapter's name (peft's `"default"`), saved at the folder's root.
pub const DEFAULT_ADAPTER: &str = "default";
/// The prefix of every saved adapter key.
const PREFIX: &str = "base_model.model.";
/// peft's `EMBEDDING_LAYER_NAMES`: targeting one of these by name also saves the targeted
/// layer's base weight (`save_embedding_layers="auto"`).
const EMBEDDING_LAYER_NAMES: [&str; 2] = ["embed_tokens", "lm_head"];
/// The input-embedding modules the models here run an adapter on (upstream's
/// `get_input_embeddings()`: GPT-2's `wte`, the encoders' `word_embeddings` /
/// `tok_embeddings`, the decoders' `embed_tokens`).
const INPUT_EMBEDDINGS: [&str; 4] = ["wte", "word_embeddings", "tok_embeddings", "embed_tokens"];

/// One named adapter: its resolved configuration and layers.
#[derive(Debug, Clone)]
struct Adapter {
    config: LoraConfig,
    layers: Vec<LoraLayer>,
    /// The base variables trained with the adapter (`modules_to_save`, biases).
    trained_base: Vec<String>,
    /// Those of `modules_to_save`: peft trains a copy beside the frozen original.
    copied: Vec<String>,
}

/// A model with LoRA adapters (peft's `PeftModel` over a `LoraModel`): the base model's
/// weights frozen, the active adapter's `lora_A` / `lora_B` (and `modules_to_save`, and the
/// biases `bias` names) trained; saving writes the adapters alone.
///
/// Several adapters are held as peft holds them (`add_adapter`, `load_adapter`,
/// `set_adapter`, `delete_adapter`; one active at a time). Unlike peft, which keeps one copy
/// of each `modules_to_save` module per adapter, the module itself is trained here: an
/// adapter with `modules_to_save` or trained biases is refused beside another adapter.
pub struct PeftModel {
    base: Box<dyn PreTrainedModel>,
    /// The adapters in insertion order (peft's `peft_config` keys).
    adapters: Vec<(String, Adapter)>,
    active: String,
    /// The adapters merged into the base weights (`merge_adapter`), in merge order.
    merged: Vec<String>,
    /// Inside peft's `disable_adapter()`: the forward runs the base model alone.
    adapters_disabled: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for PeftModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeftModel")
            .field("base", &self.base.architecture())
            .field("adapters", &self.adapter_names())
            .field("active", &self.active)
            .field("merged", &self.merged)
            .finish_non_exhaustive()
    }
}

fn module_of(var: &str) -> &str {
    var.rsplit_once('.').map_or(var, |(m, _)| m)
}

/// peft's `get_peft_model(model, config)` for LoRA: the adapter `"default"` resolved (the
/// config mutated as peft mutates it), drawn from the global generator as peft draws it,
/// the base frozen but for `modules_to_save` and the biases `bias` names.
pub fn get_peft_model(base: Box<dyn PreTrainedModel>, config: LoraConfig) -> Result<PeftModel> {
    let adapter = build_adapter(&*base, config)?;
    let inference_mode = adapter.config.inference_mode;
    let mut model = PeftModel {
        base,
        adapters: Vec::new(),
        active: DEFAULT_ADAPTER.to_string(),
        merged: Vec::new(),
        adapters_disabled: std::sync::atomic::AtomicBool::new(false),
    };
    model.create(DEFAULT_ADAPTER, adapter)?;
    // peft's `inject_adapter`: `set_adapter(..., inference_mode=config.inference_mode)`.
    model.set_trainable(!inference_mode);
    Ok(model)
}

/// Resolves `config` on `base` and creates the adapter `name`'s variables (peft's
/// `inject_adapter`).
fn build_adapter(base: &dyn PreTrainedModel, mut config: LoraConfig) -> Result<Adapter> {
    if config.use_dora && crate::bitsandbytes::has_8bit(base) {
        return Err(Error::InvalidArgument {
            field: "use_dora",
            detail: "DoRA over 8-bit layers fails in peft 0.21.2 on the CPU (its dequantize_module_weight leaves the int8 weight without its SCB), so there is no reference to match; train DoRA over the 4-bit model (load_in_4bit) or LoRA (use_dora=False) over the 8-bit one".into(),
        });
    }
    let names = crate::modeling_utils::ordered_variable_names(base.var_store());
    let vars = base.var_store().variables();
    let mut modules: Vec<String> = Vec::new();
    for n in &names {
        if is_adapter_variable(n) {
            continue;
        }
        let m = module_of(n).to_string();
        if modules.last() != Some(&m) && !modules.contains(&m) {
            modules.push(m);
        }
    }
    let embeddings = names
        .iter()
        .filter(|n| base.is_embedding_weight(n))
        .filter_map(|n| {
            let size = vars.get(n)?.size();
            (size.len() == 2).then(|| lora::EmbeddingModule {
                name: module_of(n).to_string(),
                num_embeddings: size[0],
                embedding_dim: size[1],
            })
        })
        .collect();
    let parameters = names
        .iter()
        .filter(|n| !is_adapter_variable(n))
        .filter_map(|n| Some((n.clone(), vars.get(n)?.size())))
        .collect();
    let facts = ModelFacts {
        model_type: base.config().model_type(),
        modules,
        linear: base.linear_modules(),
        output_embeddings: base.output_embeddings(),
        embeddings,
        tied_embeddings: !base.tied_weights().is_empty(),
        parameters,
    };
    let layers = lora::resolve_targets(&mut config, &facts)?;
    if let Some(l) = layers.iter().find(|l| {
        l.embedding && !INPUT_EMBEDDINGS.contains(&l.module.rsplit('.').next().unwrap_or(""))
    }) {
        return Err(Error::InvalidArgument {
            field: "target_modules",
            detail: format!(
                "{} is an embedding other than the input embeddings; LoRA runs on the input embeddings ({}) and linear layers here",
                l.module,
                INPUT_EMBEDDINGS.join(", ")
            ),
        });
    }
    let save_prefixes: Vec<String> = config.modules_to_save.iter().flatten().cloned().collect();
    let adapted: HashSet<&str> = layers.iter().map(|l| l.module.as_str()).collect();
    // peft wraps the modules whose name ends with a `modules_to_save` entry; an adapted
    // layer (or one inside such a module) cannot be wrapped.
    for l in &layers {
        let chain: Vec<&str> = std::iter::successors(Some(l.module.as_str()), |m| {
            m.rsplit_once('.').map(|(p, _)| p)
        })
        .collect();
        if let Some(s) = save_prefixes
            .iter()
            .find(|s| chain.iter().any(|m| m.ends_with(s.as_str())))
        {
            return Err(Error::InvalidArgument {
                field: "modules_to_save",
                detail: format!(
                    "{s:?} names {}, which is also adapted (peft: \"modules_to_save cannot be applied to modules of type lora.Linear\"); leave it out of target_modules or modules_to_save",
                    l.module
                ),
            });
        }
    }
    // peft's ModulesToSaveWrapper wraps every module whose name ends with one of the names
    // (no dot boundary); it trains a copy, equal to training the module itself here.
    let mut trained_base = Vec::new();
    let mut copied = Vec::new();
    for n in names.iter().filter(|n| !is_adapter_variable(n)) {
        let module = module_of(n);
        let mut ancestors =
            std::iter::successors(Some(module), |m| m.rsplit_once('.').map(|(p, _)| p));
        let saved = ancestors.any(|m| save_prefixes.iter().any(|s| m.ends_with(s.as_str())));
        let bias = n.ends_with(".bias")
            && match config.bias {
                LoraBias::None => false,
                LoraBias::All => true,
                LoraBias::LoraOnly => adapted.contains(module),
            };
        if saved || bias {
            trained_base.push(n.clone());
        }
        if saved {
            copied.push(n.clone());
        }
    }
    Ok(Adapter {
        config,
        layers,
        trained_base,
        copied,
    })
}

/// Whether `name` is an adapter's variable (`lora_A`, `lora_B`, `lora_embedding_A/B`,
/// DoRA's magnitude) rather than the base model's.
fn is_adapter_variable(name: &str) -> bool {
    [
        ".lora_A.",
        ".lora_B.",
        ".lora_embedding_A.",
        ".lora_embedding_B.",
        ".lora_magnitude_vector.",
    ]
    .iter()
    .any(|p| name.contains(p))
}

/// The adapter variable name a saved key (without the prefix) loads into, for `adapter`.
fn variable_for_key(key: &str, adapter: &str) -> Option<String> {
    for (suffix, infix, tail) in [
        (".lora_A.weight", "lora_A", ".weight"),
        (".lora_B.weight", "lora_B", ".weight"),
        (".lora_magnitude_vector", "lora_magnitude_vector", ".weight"),
        (".lora_embedding_A", "lora_embedding_A", ""),
        (".lora_embedding_B", "lora_embedding_B", ""),
    ] {
        if let Some(rest) = key.strip_suffix(suffix) {
            return Some(format!("{rest}.{infix}.{adapter}{tail}"));
        }
    }
    None
}

impl PeftModel {
    fn adapter(&self, name: &str) -> Result<&Adapter> {
        self.adapters
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| a)
            .ok_or_else(|| Error::InvalidArgument {
                field: "adapter_name",
                detail: format!(
                    "no adapter named {name:?}; the adapters are {:?}",
                    self.adapter_names()
                ),
            })
    }

    fn active_adapter_entry(&self) -> &Adapter {
        // `active` always names a held adapter (every method that changes either keeps it so).
        self.adapters
            .iter()
            .find(|(n, _)| *n == self.active)
            .map(|(_, a)| a)
            .unwrap_or(&self.adapters[0].1)
    }

    /// The adapters' names, in the order they were added (peft's `peft_config` keys).
    pub fn adapter_names(&self) -> Vec<String> {
        self.adapters.iter().map(|(n, _)| n.clone()).collect()
    }

    /// peft's `active_adapter`.
    pub fn active_adapter(&self) -> &str {
        &self.active
    }

    /// Sets `requires_grad`: the base frozen but for what trains with the active adapter,
    /// the active adapter's variables `trainable`, every other adapter's frozen (peft's
    /// `set_adapter` and `_mark_only_adapters_as_trainable`).
    fn set_trainable(&self, trainable: bool) {
        let active = self.active_adapter_entry();
        let lora: HashSet<String> = active
            .layers
            .iter()
            .flat_map(|l| l.variable_names(&self.active))
            .collect();
        let trained: HashSet<&String> = active.trained_base.iter().collect();
        for (name, t) in self.base.var_store().variables() {
            let on = trainable && (lora.contains(&name) || trained.contains(&name));
            let _ = t.set_requires_grad(on);
        }
    }

    /// The active adapter's LoRA configuration as resolved (`target_modules` as the adapted
    /// layers' names).
    pub fn peft_config(&self) -> &LoraConfig {
        &self.active_adapter_entry().config
    }

    /// The active adapter's layers, in module order.
    pub fn lora_layers(&self) -> &[LoraLayer] {
        &self.active_adapter_entry().layers
    }

    /// The base model.
    pub fn base_model(&self) -> &dyn PreTrainedModel {
        &*self.base
    }

    /// peft's `get_nb_trainable_parameters()`: (trainable, all) parameter counts.
    pub fn get_nb_trainable_parameters(&self) -> (i64, i64) {
        let vars = self.base.var_store().variables();
        let all: i64 = vars.values().map(|t| t.numel() as i64).sum();
        let trainable: i64 = vars
            .values()
            .filter(|t| t.requires_grad())
            .map(|t| t.numel() as i64)
            .sum();
        (trainable, all)
    }

    /// peft's `add_adapter(adapter_name, config)`: a second adapter injected (drawn from the
    /// global generator as peft draws it), frozen and not active; `set_adapter` activates it.
    /// Refused: a name already held, and `modules_to_save` / trained biases on either side
    /// (peft keeps a copy of those modules per adapter; here the module itself trains).
    pub fn add_adapter(&mut self, adapter_name: &str, config: LoraConfig) -> Result<()> {
        check_adapter_name(adapter_name)?;
        if self.adapters.iter().any(|(n, _)| n == adapter_name) {
            return Err(Error::InvalidArgument {
                field: "adapter_name",
                detail: format!("Adapter with name '{adapter_name}' already exists."),
            });
        }
        if !self.merged.is_empty() {
            return Err(Error::InvalidArgument {
                field: "adapter_name",
                detail: format!(
                    "the adapters {:?} are merged into the base weights: unmerge_adapter() first",
                    self.merged
                ),
            });
        }
        if let Some((n, _)) = self
            .adapters
            .iter()
            .find(|(_, a)| !a.trained_base.is_empty())
        {
            return Err(several_with_trained_base(n));
        }
        // Resolved before any draw: a refusal leaves the model (and the generator) untouched.
        let adapter = build_adapter(&*self.base, config)?;
        if !adapter.trained_base.is_empty() {
            return Err(several_with_trained_base(adapter_name));
        }
        self.create(adapter_name, adapter)
    }

    /// Draws the adapter's variables (frozen) and holds it.
    fn create(&mut self, adapter_name: &str, adapter: Adapter) -> Result<()> {
        lora::create_adapters(
            self.base.context(),
            self.base.var_store(),
            &adapter.layers,
            adapter_name,
            adapter.config.init_lora_weights,
        )?;
        set_requires_grad(self.base.var_store(), &adapter, adapter_name, false);
        self.adapters.push((adapter_name.to_string(), adapter));
        Ok(())
    }

    /// peft's `set_adapter(adapter_name)`: the adapter the forward applies and training
    /// updates (its variables trainable, every other adapter's frozen; train / eval mode
    /// untouched). Merged adapters are unmerged first, with peft's warning.
    pub fn set_adapter(&mut self, adapter_name: &str) -> Result<()> {
        self.adapter(adapter_name)?;
        if !self.merged.is_empty() {
            log::warn!(
                "Adapter cannot be set when the model is merged. Unmerging the model first."
            );
            self.unmerge_adapter()?;
        }
        self.active = adapter_name.to_string();
        self.set_trainable(true);
        Ok(())
    }

    /// peft's `delete_adapter(adapter_name)`: its variables removed; when it was active, the
    /// first remaining adapter in name order becomes active (peft picks per layer; the same
    /// where the adapters target the same layers). A merged adapter, and the last one, are
    /// refused.
    pub fn delete_adapter(&mut self, adapter_name: &str) -> Result<()> {
        let adapter = self.adapter(adapter_name)?.clone();
        if self.merged.iter().any(|m| m == adapter_name) {
            return Err(Error::InvalidArgument {
                field: "adapter_name",
                detail: format!(
                    "Cannot delete adapter(s) ['{adapter_name}'] while they are merged. Please unmerge them first."
                ),
            });
        }
        if self.adapters.len() == 1 {
            return Err(Error::InvalidArgument {
                field: "adapter_name",
                detail: format!(
                    "{adapter_name:?} is the only adapter: use merge_and_unload() or base_model() instead of a PeftModel without adapters"
                ),
            });
        }
        self.remove_variables(
            &adapter
                .layers
                .iter()
                .flat_map(|l| l.variable_names(adapter_name))
                .collect(),
        );
        self.adapters.retain(|(n, _)| n != adapter_name);
        if self.active == adapter_name {
            let mut names = self.adapter_names();
            names.sort();
            log::warn!(
                "Adapter {adapter_name} was active which is now deleted. Setting active adapter to {}.",
                names[0]
            );
            self.active = names[0].clone();
            self.set_trainable(true);
        }
        Ok(())
    }

    /// Removes `names` from the base model's store (variables and trainable list).
    fn remove_variables(&self, names: &HashSet<String>) {
        let vs = self.base.var_store();
        let vars = vs.variables();
        let ptrs: HashSet<usize> = names
            .iter()
            .filter_map(|n| vars.get(n))
            .map(|t| t.data_ptr() as usize)
            .collect();
        let mut v = match vs.variables_.lock() {
            Ok(v) => v,
            Err(p) => p.into_inner(),
        };
        v.named_variables.retain(|n, _| !names.contains(n));
        v.trainable_variables
            .retain(|var| !ptrs.contains(&(var.tensor.data_ptr() as usize)));
    }

    /// The adapter `adapter_name`'s tensors under the keys peft saves
    /// (`get_peft_model_state_dict`): no adapter-name infix, `modules_to_save` and trained
    /// biases by their module's name, and, when `target_modules` names `embed_tokens` or
    /// `lm_head` (peft's `save_embedding_layers="auto"`), the targeted layer's base weight
    /// as `<module>.base_layer.weight`.
    pub fn adapter_state_dict(&self, adapter_name: &str) -> Result<Vec<(String, Tensor)>> {
        let adapter = self.adapter(adapter_name)?;
        let vars = self.base.var_store().variables();
        let adapted: HashSet<&str> = adapter.layers.iter().map(|l| l.module.as_str()).collect();
        let get = |name: &str| {
            vars.get(name).ok_or_else(|| Error::InvalidArgument {
                field: "adapter",
                detail: format!("{name} is missing from the model"),
            })
        };
        let mut out = Vec::new();
        for l in &adapter.layers {
            let (a, b) = l.weight_names(adapter_name);
            let (ka, kb) = l.saved_names();
            let mut saved = vec![(a, ka), (b, kb)];
            if l.dora {
                // peft saves DoRA's magnitude without `.weight`.
                saved.push((
                    l.magnitude_name(adapter_name),
                    format!("{}.lora_magnitude_vector", l.module),
                ));
            }
            for (name, key) in saved {
                out.push((format!("{PREFIX}{key}"), get(&name)?.detach()));
            }
        }
        for l in self.saved_embedding_layers(adapter) {
            let weight = get(&format!("{}.weight", l.module))?;
            out.push((
                format!("{PREFIX}{}.base_layer.weight", l.module),
                weight.detach(),
            ));
        }
        for n in &adapter.trained_base {
            let t = get(n)?;
            // An adapted layer's own bias is `base_layer.bias` in peft's state dict.
            let module = module_of(n);
            let key = if n.ends_with(".bias") && adapted.contains(module) {
                format!("{PREFIX}{module}.base_layer.bias")
            } else {
                format!("{PREFIX}{n}")
            };
            out.push((key, t.detach()));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// peft's `save_embedding_layers="auto"`: with `embed_tokens` / `lm_head` named in
    /// `target_modules` (or matched by its regular expression), the adapted input / output
    /// embedding layers, whose base weight the adapter file carries.
    fn saved_embedding_layers<'a>(&self, adapter: &'a Adapter) -> Vec<&'a LoraLayer> {
        let targeted = match &adapter.config.target_modules {
            Some(TargetModules::Names(names)) => EMBEDDING_LAYER_NAMES
                .iter()
                .any(|e| names.iter().any(|n| n == e)),
            Some(TargetModules::Regex(_)) => adapter
                .layers
                .iter()
                .any(|l| EMBEDDING_LAYER_NAMES.iter().any(|e| l.module.ends_with(e))),
            None => false,
        };
        if !targeted {
            return Vec::new();
        }
        let output = self.base.output_embeddings();
        adapter
            .layers
            .iter()
            .filter(|l| l.embedding || Some(&l.module) == output.as_ref())
            .collect()
    }

    /// peft's `PeftModel.from_pretrained(model, adapter_dir, is_trainable)`: the adapter
    /// `"default"` built as `get_peft_model` builds it (drawing from the global generator as
    /// peft does), then its weights loaded. Stricter than peft, which only warns about
    /// missing adapter keys and ignores unexpected ones: both are errors naming the keys.
    /// Without `is_trainable`, everything is frozen and the model is in evaluation mode.
    pub fn from_pretrained(
        base: Box<dyn PreTrainedModel>,
        adapter_dir: &Path,
        is_trainable: bool,
    ) -> Result<Self> {
        let config = LoraConfig::from_file(&adapter_dir.join(ADAPTER_CONFIG_NAME))?;
        let mut model = get_peft_model(
            base,
            LoraConfig {
                inference_mode: !is_trainable,
                ..config
            },
        )?;
        model.load_adapter_weights(adapter_dir, DEFAULT_ADAPTER)?;
        // `inference_mode` (not `is_trainable`) already froze the adapter in get_peft_model.
        if !is_trainable {
            model.base.eval();
        }
        Ok(model)
    }

    /// peft's `load_adapter(adapter_dir, adapter_name, is_trainable)`: a new name is added
    /// as `add_adapter` adds it (the same draws) and not made active; then the weights are
    /// loaded. `is_trainable` makes the adapter's variables trainable; without it the model
    /// goes to evaluation mode, as peft's.
    pub fn load_adapter(
        &mut self,
        adapter_dir: &Path,
        adapter_name: &str,
        is_trainable: bool,
    ) -> Result<()> {
        let new = !self.adapters.iter().any(|(n, _)| n == adapter_name);
        if new {
            let config = LoraConfig::from_file(&adapter_dir.join(ADAPTER_CONFIG_NAME))?;
            self.add_adapter(
                adapter_name,
                LoraConfig {
                    inference_mode: !is_trainable,
                    ..config
                },
            )?;
        }
        if let Err(e) = self.load_adapter_weights(adapter_dir, adapter_name) {
            // A new adapter whose weights do not load is not kept half-made.
            if new {
                let names: HashSet<String> = self
                    .adapter(adapter_name)?
                    .layers
                    .iter()
                    .flat_map(|l| l.variable_names(adapter_name))
                    .collect();
                self.remove_variables(&names);
                self.adapters.retain(|(n, _)| n != adapter_name);
            }
            return Err(e);
        }
        // peft's `set_requires_grad` for a newly added trainable adapter.
        if is_trainable && new {
            set_requires_grad(
                self.base.var_store(),
                self.adapter(adapter_name)?,
                adapter_name,
                true,
            );
        } else {
            self.base.eval();
        }
        Ok(())
    }

    /// Loads `adapter_model.safetensors` of `adapter_dir` into the adapter `adapter_name`
    /// (and its `modules_to_save` / biases, and the base embedding weights peft saves with
    /// an adapter that targets them): every key of this adapter must be there with its
    /// shape, and nothing else.
    pub fn load_adapter_weights(&self, adapter_dir: &Path, adapter_name: &str) -> Result<()> {
        let path = adapter_dir.join(ADAPTER_SAFE_WEIGHTS_NAME);
        if !path.is_file() {
            return Err(Error::MissingFile {
                path,
                fix: "an adapter folder holds adapter_model.safetensors (peft's save_pretrained writes it)",
            });
        }
        let tensors: HashMap<String, Tensor> = Tensor::read_safetensors(&path)
            .map_err(|source| Error::Checkpoint {
                path: path.clone(),
                source,
            })?
            .into_iter()
            .collect();
        let adapter = self.adapter(adapter_name)?;
        let expected = self.adapter_state_dict(adapter_name)?;
        let vars = self.base.var_store().variables();
        let mut missing = Vec::new();
        let mut used = HashSet::new();
        let adapted: HashSet<&str> = adapter.layers.iter().map(|l| l.module.as_str()).collect();
        // Every key and shape checked first, then copied: a refused file changes nothing.
        let mut plan: Vec<(Tensor, &Tensor)> = Vec::new();
        let mut mismatched = Vec::new();
        for (key, _) in &expected {
            let name = key.strip_prefix(PREFIX).unwrap_or(key);
            let base_weight = name
                .strip_suffix(".base_layer.weight")
                .filter(|m| adapted.contains(m));
            let Some(src) = tensors.get(key) else {
                // A file saved with `save_embedding_layers=False` has no base weight.
                if base_weight.is_none() {
                    missing.push(key.clone());
                }
                continue;
            };
            used.insert(key.clone());
            let name = if let Some(v) = variable_for_key(name, adapter_name) {
                v
            } else if let Some(rest) = base_weight {
                format!("{rest}.weight")
            } else if let Some(rest) = name
                .strip_suffix(".base_layer.bias")
                .filter(|m| adapted.contains(m))
            {
                format!("{rest}.bias")
            } else {
                name.to_string()
            };
            let Some(var) = vars.get(&name) else {
                missing.push(key.clone());
                continue;
            };
            if var.size() != src.size() {
                mismatched.push(format!(
                    "{key}: checkpoint {:?}, model {:?}",
                    src.size(),
                    var.size()
                ));
                continue;
            }
            plan.push((var.shallow_clone(), src));
        }
        if !mismatched.is_empty() {
            return Err(Error::MismatchedSizes { keys: mismatched });
        }
        let mut unexpected: Vec<&String> = tensors.keys().filter(|k| !used.contains(*k)).collect();
        unexpected.sort();
        if !missing.is_empty() || !unexpected.is_empty() {
            return Err(Error::InvalidArgument {
                field: "adapter_model.safetensors",
                detail: format!(
                    "{}: missing adapter keys {missing:?}, unexpected keys {unexpected:?} (peft would warn and run with freshly drawn adapters); the adapter was trained for another base model or configuration",
                    path.display()
                ),
            });
        }
        tch::no_grad(|| -> Result<()> {
            for (mut var, src) in plan {
                var.f_copy_(&src.f_to_device(var.device())?.f_to_kind(var.kind())?)?;
            }
            Ok(())
        })?;
        Ok(())
    }

    /// peft's `merge_adapter(adapter_names)`: each adapted weight of the named adapters (the
    /// active one by default; merged ones skipped) becomes `W + ΔW` (DoRA: rescaled row by
    /// row to the magnitude); the layers then run their base weight alone until
    /// `unmerge_adapter`. A linear layer adds the float32 delta in place (one rounding in
    /// half precision), an embedding adds it cast to the weight's dtype first, as peft's.
    pub fn merge_adapter(&mut self, adapter_names: Option<&[&str]>) -> Result<()> {
        let names: Vec<String> = match adapter_names {
            Some(n) => n.iter().map(|s| s.to_string()).collect(),
            None => vec![self.active.clone()],
        };
        for name in names {
            if self.merged.contains(&name) {
                continue;
            }
            let adapter = self.adapter(&name)?;
            refuse_parameter_merge(adapter)?;
            let vars = self.base.var_store().variables();
            let base = &*self.base;
            tch::no_grad(|| -> Result<()> {
                for l in &adapter.layers {
                    let (a, b) = l.weight_names(&name);
                    let delta = lora::delta_weight(&vars[&a], &vars[&b], l);
                    // A quantized layer: dequantized, the delta added (DoRA: rescaled to the
                    // magnitude, in the dequantized weight's dtype), quantized again (not
                    // bit-exact with the float merge, as peft warns).
                    if crate::bitsandbytes::requantize(base, &l.module, |w| {
                        Ok(if l.dora {
                            lora::dora_merged_weight(
                                &w,
                                &delta.f_to_kind(w.kind())?,
                                &vars[&l.magnitude_name(&name)],
                                l,
                            )
                            .f_to_kind(w.kind())?
                        } else {
                            w.f_to_kind(delta.kind())?.f_add(&delta)?
                        })
                    })? {
                        continue;
                    }
                    let weight = &vars[&format!("{}.weight", l.module)];
                    if l.dora {
                        let merged = lora::dora_merged_weight(
                            weight,
                            &delta.f_to_kind(weight.kind())?,
                            &vars[&l.magnitude_name(&name)],
                            l,
                        );
                        weight.shallow_clone().f_copy_(&merged)?;
                    } else if l.embedding {
                        let _ = weight
                            .shallow_clone()
                            .f_add_(&delta.f_to_kind(weight.kind())?)?;
                    } else {
                        let _ = weight.shallow_clone().f_add_(&delta)?;
                    }
                }
                Ok(())
            })?;
            self.merged.push(name);
        }
        Ok(())
    }

    /// peft's `unmerge_adapter()`: the merged adapters subtracted in reverse order
    /// (`W - ΔW` in the weight's dtype: not bit-exact, as peft's). DoRA layers are refused
    /// (peft divides by a cached norm).
    pub fn unmerge_adapter(&mut self) -> Result<()> {
        // Checked before anything is subtracted: a refusal leaves every merge in place.
        for name in &self.merged {
            if let Some(l) = self.adapter(name)?.layers.iter().find(|l| l.dora) {
                return Err(Error::InvalidArgument {
                    field: "use_dora",
                    detail: format!(
                        "{} is a DoRA layer: unmerging DoRA is not implemented here; keep the unmerged model (merge_and_unload merges for good)",
                        l.module
                    ),
                });
            }
        }
        while let Some(name) = self.merged.last().cloned() {
            let adapter = self.adapter(&name)?;
            let vars = self.base.var_store().variables();
            let base = &*self.base;
            tch::no_grad(|| -> Result<()> {
                for l in adapter.layers.iter().rev() {
                    let (a, b) = l.weight_names(&name);
                    let delta = lora::delta_weight(&vars[&a], &vars[&b], l);
                    if crate::bitsandbytes::requantize(base, &l.module, |w| {
                        Ok(w.f_to_kind(delta.kind())?.f_sub(&delta)?)
                    })? {
                        continue;
                    }
                    let weight = &vars[&format!("{}.weight", l.module)];
                    let _ = weight
                        .shallow_clone()
                        .f_sub_(&delta.f_to_kind(weight.kind())?)?;
                }
                Ok(())
            })?;
            self.merged.pop();
        }
        Ok(())
    }

    /// The adapters merged into the base weights (`merge_adapter`), in merge order.
    pub fn merged_adapters(&self) -> &[String] {
        &self.merged
    }

    /// peft's `merge_and_unload()`: the active adapter merged (as `merge_adapter`), every
    /// adapter removed from the model, and the base model returned (its parameters keep
    /// their `requires_grad`, as peft leaves them).
    pub fn merge_and_unload(mut self) -> Result<Box<dyn PreTrainedModel>> {
        if !self.merged.contains(&self.active) {
            self.merge_adapter(None)?;
        }
        let removed: HashSet<String> = self
            .adapters
            .iter()
            .flat_map(|(n, a)| a.layers.iter().flat_map(move |l| l.variable_names(n)))
            .collect();
        self.remove_variables(&removed);
        // The parts keep no adapter of the adapters just removed.
        for (_, slot) in self.base.context().lora_slots() {
            slot.set(None);
        }
        Ok(self.base)
    }

    /// Writes the adapters as peft's `save_pretrained`: for each, `adapter_config.json` (the
    /// resolved configuration, `inference_mode` true) and `adapter_model.safetensors`, the
    /// adapter `"default"` in `dir` and any other in `dir/<name>/`.
    pub fn save_adapter(&self, dir: &Path) -> Result<()> {
        let names = self.adapter_names();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        self.save_selected_adapters(dir, &names)
    }

    /// `save_pretrained(dir, selected_adapters=names)`.
    pub fn save_selected_adapters(&self, dir: &Path, names: &[&str]) -> Result<()> {
        for name in names {
            self.adapter(name)?;
        }
        for name in names {
            let adapter = self.adapter(name)?;
            if !self.saved_embedding_layers(adapter).is_empty() {
                log::warn!(
                    "Setting `save_embedding_layers` to `True` as embedding layers found in `target_modules`."
                );
            }
            let out = if *name == DEFAULT_ADAPTER {
                dir.to_path_buf()
            } else {
                dir.join(name)
            };
            std::fs::create_dir_all(&out).map_err(|source| Error::Io {
                path: out.clone(),
                source,
            })?;
            adapter.config.save(&out)?;
            crate::loading::write_safetensors(
                &self.adapter_state_dict(name)?,
                &out.join(ADAPTER_SAFE_WEIGHTS_NAME),
            )?;
        }
        Ok(())
    }

    /// Upstream's Trainer resuming a `PeftModel` (`_load_from_checkpoint`): with adapter
    /// subfolders, `"default"` from `dir` (where it has an adapter file) and each subfolder
    /// as the adapter of its name, trainable when it is the active one, then the active
    /// adapter set again; without, `dir` into the active adapter.
    fn resume_adapters(&mut self, dir: &Path) -> Result<()> {
        let mut subdirs: Vec<String> = std::fs::read_dir(dir)
            .map_err(|source| Error::Io {
                path: dir.to_path_buf(),
                source,
            })?
            .filter_map(|e| e.ok())
            .filter(|e| e.path().join(ADAPTER_SAFE_WEIGHTS_NAME).is_file())
            .filter_map(|e| e.file_name().to_str().map(String::from))
            .collect();
        subdirs.sort();
        let active = self.active.clone();
        let training = self.base.is_training();
        if subdirs.is_empty() {
            self.load_adapter(dir, &active, true)?;
        } else {
            if dir.join(ADAPTER_SAFE_WEIGHTS_NAME).is_file() {
                self.load_adapter(dir, DEFAULT_ADAPTER, active == DEFAULT_ADAPTER)?;
            }
            for sub in subdirs {
                self.load_adapter(&dir.join(&sub), &sub, sub == active)?;
            }
            self.set_adapter(&active)?;
        }
        // peft's non-trainable loads call `eval()`; the training step sets the mode again.
        self.base.set_training(training);
        Ok(())
    }
}

/// Sets `requires_grad` of the adapter `name`'s variables.
fn set_requires_grad(vs: &VarStore, adapter: &Adapter, name: &str, on: bool) {
    let vars = vs.variables();
    for n in adapter.layers.iter().flat_map(|l| l.variable_names(name)) {
        if let Some(t) = vars.get(&n) {
            let _ = t.set_requires_grad(on);
        }
    }
}

/// An adapter's name is a key of peft's `ModuleDict`s: not empty, without a dot.
/// Merging a `target_parameters` adapter into its 3-D weight is not implemented.
fn refuse_parameter_merge(adapter: &Adapter) -> Result<()> {
    match adapter.layers.iter().find(|l| l.parameter.is_some()) {
        Some(l) => Err(Error::InvalidArgument {
            field: "target_parameters",
            detail: format!(
                "{} adapts a parameter (peft's ParamWrapper); merging such an adapter into the experts' weights is not implemented here: run it unmerged, or merge it with peft in Python",
                l.slot_name()
            ),
        }),
        None => Ok(()),
    }
}

fn check_adapter_name(name: &str) -> Result<()> {
    if name.is_empty() || name.contains('.') {
        return Err(Error::InvalidArgument {
            field: "adapter_name",
            detail: format!(
                "{name:?}: module name can't contain \".\" or be empty (torch's ModuleDict); name the adapter without dots"
            ),
        });
    }
    Ok(())
}

fn several_with_trained_base(name: &str) -> Error {
    Error::InvalidArgument {
        field: "modules_to_save",
        detail: format!(
            "the adapter {name:?} trains base modules (modules_to_save or bias): with several adapters peft keeps a copy of them per adapter, which is not implemented here; train such an adapter alone"
        ),
    }
}

impl PeftModel {
    /// Fills the parts' LoRA slots with the active adapter (every merged adapter's layers
    /// left to their base weights): the adapted layers' slots, and the layers never named.
    fn fill_slots(&self) -> Result<lora::FilledSlots> {
        let adapter = self.active_adapter_entry();
        // peft: a layer any merged adapter lives in runs its (merged) base weight alone.
        let merged: HashSet<String> = self
            .adapters
            .iter()
            .filter(|(n, _)| self.merged.contains(n))
            .flat_map(|(_, a)| a.layers.iter().map(|l| l.module.clone()))
            .collect();
        lora::set_adapters(
            self.base.context(),
            self.base.var_store(),
            &adapter.layers,
            &self.active,
            adapter.config.lora_dropout,
            self.base.is_training(),
            &merged,
        )
    }

    /// Runs `f` (the base model's forward or encoder) with the active adapter's layers
    /// applied (and every merged adapter's layers left to their base weights); with
    /// `check_all_ran`, an adapted layer `f` never reached is an error.
    fn with_active_adapters<R>(
        &self,
        check_all_ran: bool,
        f: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        if self
            .adapters_disabled
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            // peft's `disable_adapter()`: every adapted layer runs its base layer alone.
            lora::set_adapters(
                self.base.context(),
                self.base.var_store(),
                &[],
                &self.active,
                0.0,
                false,
                &HashSet::new(),
            )?;
            return f();
        }
        let (filled, mut missed) = self.fill_slots()?;
        let out = f()?;
        missed.extend(
            filled
                .iter()
                .filter(|(_, slot)| !slot.ran())
                .map(|(name, _)| name.clone()),
        );
        missed.sort();
        if check_all_ran && !missed.is_empty() {
            return Err(Error::InvalidArgument {
                field: "target_modules",
                detail: format!(
                    "the forward never ran the adapted layers {missed:?}: this model applies them under other names"
                ),
            });
        }
        Ok(out)
    }
}

impl TrainableModel for PeftModel {
    fn context(&self) -> &tchtrain_nn::Context {
        self.base.context()
    }
    /// The active adapter's `modules_to_save` variables: peft's `ModulesToSaveWrapper`
    /// keeps the original module beside the trained copy.
    fn parameters_held_twice(&self) -> Vec<String> {
        self.adapters
            .iter()
            .find(|(n, _)| *n == self.active)
            .map(|(_, a)| a.copied.clone())
            .unwrap_or_default()
    }
    fn var_store(&self) -> &VarStore {
        self.base.var_store()
    }
    fn var_store_mut(&mut self) -> &mut VarStore {
        self.base.var_store_mut()
    }
    fn is_training(&self) -> bool {
        self.base.is_training()
    }
    fn set_training(&mut self, training: bool) {
        self.base.set_training(training);
    }
    /// The base model's forward with the adapter applied by every adapted layer; an error
    /// names the adapted layers the forward never ran.
    fn forward(&self, inputs: &ModelInputs<'_>) -> Result<ModelOutput> {
        // Given the encoder's output, an encoder-decoder model runs its decoder alone: the
        // encoder's adapted layers are not missed.
        self.with_active_adapters(inputs.encoder_outputs.is_none(), || {
            self.base.forward(inputs)
        })
    }
    fn is_encoder_decoder(&self) -> bool {
        self.base.is_encoder_decoder()
    }
    fn decoder_start(&self) -> Result<Option<tchtrain_collators::DecoderStart>> {
        self.base.decoder_start()
    }
    fn encode(&self, input_ids: &Tensor, attention_mask: Option<&Tensor>) -> Result<Tensor> {
        self.with_active_adapters(false, || self.base.encode(input_ids, attention_mask))
    }
    fn activation_checkpointing_enable(
        &mut self,
        settings: crate::ActivationCheckpointing,
    ) -> Result<()> {
        self.base.activation_checkpointing_enable(settings)
    }
    fn activation_checkpointing_disable(&mut self) {
        self.base.activation_checkpointing_disable();
    }
    fn is_activation_checkpointing(&self) -> bool {
        self.base.is_activation_checkpointing()
    }
    fn set_use_cache(&mut self, use_cache: bool) {
        self.base.set_use_cache(use_cache);
    }
    /// Upstream applies Liger to the peft model's base (`unwrap_peft_model`).
    fn apply_liger_kernel(
        &mut self,
        liger_kernel_config: Option<&serde_json::Value>,
    ) -> Result<()> {
        self.base.apply_liger_kernel(liger_kernel_config)
    }
    fn model_name(&self) -> &str {
        "PeftModel"
    }
    fn as_pretrained(&self) -> Option<&dyn PreTrainedModel> {
        Some(self)
    }
    fn loss_type(&self) -> Option<&str> {
        self.base.loss_type()
    }
    fn loss_shifts_labels(&self) -> bool {
        self.base.loss_shifts_labels()
    }
    fn is_causal_lm(&self) -> bool {
        self.base.is_causal_lm()
    }
    fn has_adapter(&self) -> bool {
        true
    }
    /// peft's `disable_adapter()` context: the base model alone while `disabled`. Refused
    /// while adapters are merged (peft unmerges them; do so first) and when the active
    /// adapter trains base weights (`modules_to_save`, biases): peft keeps their originals
    /// beside the trained copies, which are the module itself here.
    fn set_adapters_disabled(&self, disabled: bool) -> Result<()> {
        if disabled {
            if !self.merged.is_empty() {
                return Err(Error::InvalidArgument {
                    field: "disable_adapter",
                    detail: format!(
                        "the adapters {:?} are merged into the base weights; unmerge_adapter first",
                        self.merged
                    ),
                });
            }
            let trained = &self.active_adapter_entry().trained_base;
            if !trained.is_empty() {
                return Err(Error::InvalidArgument {
                    field: "disable_adapter",
                    detail: format!(
                        "the adapter trains the base variables {trained:?} (modules_to_save or biases), whose originals are not kept here: the base model cannot be recovered; drop modules_to_save / bias, or give a separate reference model"
                    ),
                });
            }
        }
        let was = self
            .adapters_disabled
            .swap(disabled, std::sync::atomic::Ordering::SeqCst);
        if was && !disabled {
            // The slots hold the adapter again at once: a checkpointed layer recomputed in
            // the backward of an earlier forward runs with it, as peft's re-enabled layers.
            self.fill_slots()?;
        }
        Ok(())
    }
    fn accepts_loss_kwargs(&self) -> bool {
        self.base.accepts_loss_kwargs()
    }
    fn label_names(&self) -> Vec<String> {
        self.base.label_names()
    }
    fn main_input_name(&self) -> &'static str {
        self.base.main_input_name()
    }
    fn label_check(&self) -> Option<LabelCheck> {
        self.base.label_check()
    }
    fn layernorm_modules(&self) -> Vec<String> {
        self.base.layernorm_modules()
    }
    fn is_embedding_weight(&self, name: &str) -> bool {
        self.base.is_embedding_weight(name)
    }
    fn tied_weights(&self) -> Vec<(String, String)> {
        self.base.tied_weights()
    }
    fn linear_modules(&self) -> Vec<crate::modeling_utils::LinearModule> {
        self.base.linear_modules()
    }
    fn output_embeddings(&self) -> Option<String> {
        self.base.output_embeddings()
    }
    fn output_head(&self) -> Option<crate::OutputHead> {
        self.base.output_head()
    }
    fn supports_cache(&self) -> bool {
        self.base.supports_cache()
    }
    fn no_split_modules(&self) -> Vec<String> {
        self.base.no_split_modules()
    }
    /// Upstream's `model.parameters()` of a `PeftModel`: module order, each adapted layer's
    /// adapters at its place, the trainable ones only.
    fn parameters(&self) -> Vec<Tensor> {
        let vs = self.base.var_store();
        let vars = vs.variables();
        // Per adapted module, its (adapter, layer) pairs in adapter order.
        let mut lora: HashMap<&str, Vec<(&str, &LoraLayer)>> = HashMap::new();
        for (name, adapter) in &self.adapters {
            for l in &adapter.layers {
                lora.entry(l.module.as_str())
                    .or_default()
                    .push((name.as_str(), l));
            }
        }
        let mut out = Vec::new();
        // peft's LoRA layer registers `base_layer` (the module's own parameters) first,
        // then its dictionaries `lora_A`, `lora_B` (or `lora_embedding_A` / `_B`) and
        // `lora_magnitude_vector`, each holding every adapter in order.
        let flush = |module: Option<&str>, out: &mut Vec<Tensor>| {
            if let Some(entries) = module.and_then(|m| lora.get(m)) {
                for which in 0..3 {
                    for (adapter, l) in entries {
                        if let Some(n) = l.variable_names(adapter).get(which) {
                            out.push(vars[n].shallow_clone());
                        }
                    }
                }
            }
        };
        let mut current: Option<String> = None;
        for name in crate::modeling_utils::ordered_variable_names(vs) {
            if is_adapter_variable(&name) {
                continue;
            }
            let module = module_of(&name);
            if current.as_deref() != Some(module) {
                flush(current.as_deref(), &mut out);
                current = Some(module.to_string());
            }
            out.push(vars[&name].shallow_clone());
        }
        flush(current.as_deref(), &mut out);
        out.into_iter().filter(Tensor::requires_grad).collect()
    }
    /// `save_model` and checkpoints of a `PeftModel` hold the adapter alone, as upstream's
    /// Trainer saves one.
    fn save_weights(&self, dir: &Path) -> Result<()> {
        self.save_adapter(dir)
    }
    fn load_adapter(&mut self, dir: &Path) -> Result<()> {
        self.resume_adapters(dir)
    }
}

impl PeftModel {
    /// What `print(peft_model)` shows (peft 0.21.2): `PeftModelFor<Task>` (`PeftModel`
    /// without `task_type`) over `LoraModel` over the base model's tree, each targeted
    /// linear layer a `lora.Linear` (its `base_layer` and one entry per adapter in
    /// `lora_dropout` / `lora_A` / `lora_B`, DoRA's `lora_magnitude_vector`), each
    /// `modules_to_save` module a `ModulesToSaveWrapper`. `None` where the base's tree is not
    /// written out, for quantized bases, and for adapters on embeddings or expert parameters.
    fn peft_module_repr(&self) -> Option<tchtrain_nn::ModuleRepr> {
        use tchtrain_nn::ModuleRepr;
        if crate::bitsandbytes::is_quantized(&*self.base) {
            return None;
        }
        let base = self.base.module_repr()?;
        let mut targeted: HashMap<&str, Vec<(&str, &LoraLayer, &LoraConfig)>> = HashMap::new();
        let mut saved: HashMap<&str, Vec<&str>> = HashMap::new();
        for (name, adapter) in &self.adapters {
            for layer in &adapter.layers {
                if layer.embedding || layer.parameter.is_some() {
                    return None;
                }
                targeted.entry(layer.module.as_str()).or_default().push((
                    name,
                    layer,
                    &adapter.config,
                ));
            }
            // The wrapped module: a copied variable's outermost module whose name ends with
            // one of `modules_to_save` (peft's suffix rule).
            let names = adapter.config.modules_to_save.iter().flatten();
            let names: Vec<&String> = names.collect();
            let mut modules: Vec<&str> = Vec::new();
            for v in &adapter.copied {
                let module = module_of(v);
                let wrapped = module
                    .match_indices('.')
                    .map(|(i, _)| &module[..i])
                    .chain([module])
                    .find(|m| names.iter().any(|n| m.ends_with(n.as_str())));
                if let Some(m) = wrapped
                    && !modules.contains(&m)
                {
                    modules.push(m);
                }
            }
            for m in modules {
                saved.entry(m).or_default().push(name);
            }
        }
        let dict = |items: Vec<(String, ModuleRepr)>| ModuleRepr::module_dict(items);
        let tree = base.map_modules(&mut |path, m| {
            if let Some(adapters) = targeted.get(path) {
                let each = |f: &dyn Fn(&LoraLayer, &LoraConfig) -> Option<ModuleRepr>| {
                    dict(
                        adapters
                            .iter()
                            .filter_map(|(n, l, c)| f(l, c).map(|m| (n.to_string(), m)))
                            .collect(),
                    )
                };
                ModuleRepr::new("lora.Linear")
                    .child("base_layer", m)
                    .child(
                        "lora_dropout",
                        each(&|_, c| {
                            Some(match c.lora_dropout > 0.0 {
                                true => ModuleRepr::dropout(c.lora_dropout),
                                false => ModuleRepr::new("Identity"),
                            })
                        }),
                    )
                    .child(
                        "lora_A",
                        each(&|l, _| Some(ModuleRepr::linear(l.in_features, l.r, false))),
                    )
                    .child(
                        "lora_B",
                        each(&|l, _| Some(ModuleRepr::linear(l.r, l.out_features, false))),
                    )
                    .child("lora_embedding_A", ModuleRepr::new("ParameterDict"))
                    .child("lora_embedding_B", ModuleRepr::new("ParameterDict"))
                    .child(
                        "lora_magnitude_vector",
                        each(&|l, _| l.dora.then(|| ModuleRepr::new("lora.dora.DoraLinearLayer"))),
                    )
            } else if let Some(adapters) = saved.get(path) {
                ModuleRepr::new("ModulesToSaveWrapper")
                    .child("original_module", m.clone())
                    .child(
                        "modules_to_save",
                        dict(
                            adapters
                                .iter()
                                .map(|n| (n.to_string(), m.clone()))
                                .collect(),
                        ),
                    )
            } else {
                m
            }
        });
        let task = self
            .adapters
            .first()
            .and_then(|(_, a)| a.config.task_type.as_deref());
        let class = match task {
            Some("CAUSAL_LM") => "PeftModelForCausalLM",
            Some("SEQ_CLS") => "PeftModelForSequenceClassification",
            Some("TOKEN_CLS") => "PeftModelForTokenClassification",
            Some("QUESTION_ANS") => "PeftModelForQuestionAnswering",
            Some("SEQ_2_SEQ_LM") => "PeftModelForSeq2SeqLM",
            Some("FEATURE_EXTRACTION") => "PeftModelForFeatureExtraction",
            _ => "PeftModel",
        };
        Some(ModuleRepr::new(class).child(
            "base_model",
            ModuleRepr::new("LoraModel").child("model", tree),
        ))
    }
}

impl PreTrainedModel for PeftModel {
    fn architecture(&self) -> &'static str {
        self.base.architecture()
    }
    fn module_repr(&self) -> Option<tchtrain_nn::ModuleRepr> {
        self.peft_module_repr()
    }
    fn config(&self) -> &dyn PretrainedConfig {
        self.base.config()
    }
    fn generation_config(&self) -> Option<&serde_json::Value> {
        self.base.generation_config()
    }
    /// The adapter alone (peft's `PeftModel.save_pretrained`).
    fn save_pretrained(&self, dir: &Path) -> Result<()> {
        self.save_adapter(dir)
    }
}

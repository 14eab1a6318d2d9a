//! `PeftModel`: peft's `get_peft_model` / `PeftModel.from_pretrained` / `save_pretrained` /
//! `merge_and_unload` for LoRA, over any model here (`Box<dyn PreTrainedModel>`), and the
//! adapter files exactly as peft 0.21.2 writes them (`adapter_config.json`,
//! `adapter_model.safetensors` with keys `base_model.model.<module>.lora_A.weight`, no
//! adapter-name infix, `format: pt`).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use tch::{Tensor, nn::VarStore};

use super::config::{ADAPTER_CONFIG_NAME, ADAPTER_SAFE_WEIGHTS_NAME, LoraBias, LoraConfig};
use super::lora::{self, ActiveAdapters, LoraLayer, ModelFacts};
use crate::configuration_utils::PretrainedConfig;
use crate::modeling_utils::{
    LabelCheck, ModelInputs, ModelOutput, PreTrainedModel, TrainableModel,
};
use crate::{Error, Result};

/// The adapter's name (peft's `"default"`, the only one implemented).
const ADAPTER: &str = "default";
/// The prefix of every saved adapter key.
const PREFIX: &str = "base_model.model.";

/// A model with a LoRA adapter (peft's `PeftModel` over a `LoraModel`): the base model's
/// weights frozen, the adapter's `lora_A` / `lora_B` (and `modules_to_save`, and the biases
/// `bias` names) trained; saving writes the adapter alone.
pub struct PeftModel {
    base: Box<dyn PreTrainedModel>,
    config: LoraConfig,
    layers: Vec<LoraLayer>,
    /// The base variables trained with the adapter (`modules_to_save`, biases).
    trained_base: Vec<String>,
}

impl std::fmt::Debug for PeftModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeftModel")
            .field("base", &self.base.architecture())
            .field("config", &self.config)
            .field("layers", &self.layers.len())
            .finish_non_exhaustive()
    }
}

fn module_of(var: &str) -> &str {
    var.rsplit_once('.').map_or(var, |(m, _)| m)
}

/// peft's `get_peft_model(model, config)` for LoRA: the adapted layers resolved (the
/// config mutated as peft mutates it), their adapters drawn from the global generator as
/// peft draws them, the base frozen but for `modules_to_save` and the biases `bias` names.
pub fn get_peft_model(base: Box<dyn PreTrainedModel>, mut config: LoraConfig) -> Result<PeftModel> {
    let names = crate::modeling_utils::ordered_variable_names(base.var_store());
    let mut modules: Vec<String> = Vec::new();
    for n in &names {
        let m = module_of(n).to_string();
        if modules.last() != Some(&m) && !modules.contains(&m) {
            modules.push(m);
        }
    }
    let facts = ModelFacts {
        model_type: base.config().model_type(),
        modules,
        linear: base.linear_modules(),
        output_embeddings: base.output_embeddings(),
    };
    let layers = lora::resolve_targets(&mut config, &facts)?;
    lora::create_adapters(base.var_store(), &layers, ADAPTER, config.init_lora_weights)?;
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
    for n in &names {
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
    }
    let model = PeftModel {
        base,
        config,
        layers,
        trained_base,
    };
    // peft's `inject_adapter`: `set_adapter(..., inference_mode=config.inference_mode)`.
    model.set_trainable(!model.config.inference_mode);
    Ok(model)
}

impl PeftModel {
    /// Freezes the base but for what trains with the adapter; `trainable` false freezes
    /// the adapter too (peft's `inference_mode`).
    fn set_trainable(&self, trainable: bool) {
        let lora: HashSet<String> = self
            .layers
            .iter()
            .flat_map(|l| l.variable_names(ADAPTER))
            .collect();
        let trained: HashSet<&String> = self.trained_base.iter().collect();
        for (name, t) in self.base.var_store().variables() {
            let on = trainable && (lora.contains(&name) || trained.contains(&name));
            let _ = t.set_requires_grad(on);
        }
    }

    /// The LoRA configuration as resolved (`target_modules` as the adapted layers' names).
    pub fn peft_config(&self) -> &LoraConfig {
        &self.config
    }

    /// The adapted layers, in module order.
    pub fn lora_layers(&self) -> &[LoraLayer] {
        &self.layers
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

    /// The adapter's tensors under the keys peft saves (`get_peft_model_state_dict`).
    pub fn adapter_state_dict(&self) -> Result<Vec<(String, Tensor)>> {
        let vars = self.base.var_store().variables();
        let adapted: HashSet<&str> = self.layers.iter().map(|l| l.module.as_str()).collect();
        let mut out = Vec::new();
        for l in &self.layers {
            let (a, b) = l.weight_names(ADAPTER);
            let mut saved = vec![
                (a, format!("{}.lora_A.weight", l.module)),
                (b, format!("{}.lora_B.weight", l.module)),
            ];
            if l.dora {
                // peft saves DoRA's magnitude without `.weight`.
                saved.push((
                    l.magnitude_name(ADAPTER),
                    format!("{}.lora_magnitude_vector", l.module),
                ));
            }
            for (name, key) in saved {
                let t = vars.get(&name).ok_or_else(|| Error::InvalidArgument {
                    field: "adapter",
                    detail: format!("{name} is missing from the model"),
                })?;
                out.push((format!("{PREFIX}{key}"), t.detach()));
            }
        }
        for n in &self.trained_base {
            let t = &vars[n];
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

    /// peft's `PeftModel.from_pretrained(model, adapter_dir, is_trainable)`: the adapter
    /// built as `get_peft_model` builds it (drawing from the global generator as peft does),
    /// then its weights loaded. Stricter than peft, which only warns about missing adapter
    /// keys and ignores unexpected ones: both are errors naming the keys. Without
    /// `is_trainable`, everything is frozen and the model is in evaluation mode.
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
        model.load_adapter_weights(adapter_dir)?;
        // `inference_mode` (not `is_trainable`) already froze the adapter in get_peft_model.
        if !is_trainable {
            model.base.eval();
        }
        Ok(model)
    }

    /// Loads `adapter_model.safetensors` of `adapter_dir` into this adapter (and its
    /// `modules_to_save` / biases): every key of this adapter must be there with its shape,
    /// and nothing else.
    pub fn load_adapter_weights(&self, adapter_dir: &Path) -> Result<()> {
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
        let expected = self.adapter_state_dict()?;
        let vars = self.base.var_store().variables();
        let mut missing = Vec::new();
        let mut used = HashSet::new();
        let adapted: HashSet<&str> = self.layers.iter().map(|l| l.module.as_str()).collect();
        tch::no_grad(|| -> Result<()> {
            for (key, _) in &expected {
                let Some(src) = tensors.get(key) else {
                    missing.push(key.clone());
                    continue;
                };
                used.insert(key.clone());
                let name = key.strip_prefix(PREFIX).unwrap_or(key);
                let name = if let Some(rest) = name.strip_suffix(".lora_A.weight") {
                    format!("{rest}.lora_A.{ADAPTER}.weight")
                } else if let Some(rest) = name.strip_suffix(".lora_B.weight") {
                    format!("{rest}.lora_B.{ADAPTER}.weight")
                } else if let Some(rest) = name.strip_suffix(".lora_magnitude_vector") {
                    format!("{rest}.lora_magnitude_vector.{ADAPTER}.weight")
                } else if let Some(rest) = name
                    .strip_suffix(".base_layer.bias")
                    .filter(|m| adapted.contains(m))
                {
                    format!("{rest}.bias")
                } else {
                    name.to_string()
                };
                let var = &vars[&name];
                if var.size() != src.size() {
                    return Err(Error::MismatchedSizes {
                        keys: vec![format!(
                            "{key}: checkpoint {:?}, model {:?}",
                            src.size(),
                            var.size()
                        )],
                    });
                }
                var.shallow_clone()
                    .f_copy_(&src.f_to_device(var.device())?.f_to_kind(var.kind())?)?;
            }
            Ok(())
        })?;
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
        Ok(())
    }

    /// peft's `merge_and_unload()`: each adapted weight becomes `W + B @ A * scaling`
    /// (transposed for `Conv1D`; with DoRA, rescaled row by row to the magnitude), the
    /// adapters are removed from the model, and the base model is returned (its parameters
    /// keep their `requires_grad`, as peft leaves them).
    pub fn merge_and_unload(self) -> Result<Box<dyn PreTrainedModel>> {
        let vs = self.base.var_store();
        let vars = vs.variables();
        tch::no_grad(|| -> Result<()> {
            for l in &self.layers {
                let (a, b) = l.weight_names(ADAPTER);
                let weight = &vars[&format!("{}.weight", l.module)];
                let delta = lora::delta_weight(&vars[&a], &vars[&b], l).f_to_kind(weight.kind())?;
                if l.dora {
                    let merged = lora::dora_merged_weight(
                        weight,
                        &delta,
                        &vars[&l.magnitude_name(ADAPTER)],
                        l,
                    );
                    weight.shallow_clone().f_copy_(&merged)?;
                } else {
                    let _ = weight.shallow_clone().f_add_(&delta)?;
                }
            }
            Ok(())
        })?;
        let removed: HashSet<String> = self
            .layers
            .iter()
            .flat_map(|l| l.variable_names(ADAPTER))
            .collect();
        let ptrs: HashSet<usize> = removed
            .iter()
            .filter_map(|n| vars.get(n))
            .map(|t| t.data_ptr() as usize)
            .collect();
        {
            let mut v = match vs.variables_.lock() {
                Ok(v) => v,
                Err(p) => p.into_inner(),
            };
            v.named_variables.retain(|n, _| !removed.contains(n));
            v.trainable_variables
                .retain(|var| !ptrs.contains(&(var.tensor.data_ptr() as usize)));
        }
        Ok(self.base)
    }

    /// Writes the adapter as peft's `save_pretrained`: `adapter_config.json` (the resolved
    /// configuration, `inference_mode` true) and `adapter_model.safetensors`.
    pub fn save_adapter(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        self.config.save(dir)?;
        crate::loading::write_safetensors(
            &self.adapter_state_dict()?,
            &dir.join(ADAPTER_SAFE_WEIGHTS_NAME),
        )
    }
}

impl TrainableModel for PeftModel {
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
        let active = ActiveAdapters::new(
            self.base.var_store(),
            &self.layers,
            ADAPTER,
            self.config.lora_dropout,
            self.base.is_training(),
        )?;
        let shared = Arc::new(Mutex::new(active));
        let out = lora::with_adapters(Arc::clone(&shared), || self.base.forward(inputs))?;
        let missed = match shared.lock() {
            Ok(a) => a.missed(),
            Err(p) => p.into_inner().missed(),
        };
        if !missed.is_empty() {
            return Err(Error::InvalidArgument {
                field: "target_modules",
                detail: format!(
                    "the forward never ran the adapted layers {missed:?}: this model applies them under other names"
                ),
            });
        }
        Ok(out)
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
    fn accepts_loss_kwargs(&self) -> bool {
        self.base.accepts_loss_kwargs()
    }
    fn label_names(&self) -> Vec<String> {
        self.base.label_names()
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
    /// Upstream's `model.parameters()` of a `PeftModel`: module order, each adapted layer's
    /// `lora_A` / `lora_B` at its place, the trainable ones only.
    fn parameters(&self) -> Vec<Tensor> {
        let vs = self.base.var_store();
        let vars = vs.variables();
        let lora: HashMap<&str, &LoraLayer> =
            self.layers.iter().map(|l| (l.module.as_str(), l)).collect();
        let mut out = Vec::new();
        // peft's LoRA layer registers `base_layer` (the module's own parameters) first,
        // then `lora_A`, `lora_B`: a module's adapters follow its last own parameter.
        let flush = |module: Option<&str>, out: &mut Vec<Tensor>| {
            if let Some(l) = module.and_then(|m| lora.get(m)) {
                out.extend(
                    l.variable_names(ADAPTER)
                        .iter()
                        .map(|n| vars[n].shallow_clone()),
                );
            }
        };
        let mut current: Option<String> = None;
        for name in crate::modeling_utils::ordered_variable_names(vs) {
            if name.contains(".lora_A.")
                || name.contains(".lora_B.")
                || name.contains(".lora_magnitude_vector.")
            {
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
        self.load_adapter_weights(dir)
    }
}

impl PreTrainedModel for PeftModel {
    fn architecture(&self) -> &'static str {
        self.base.architecture()
    }
    fn config(&self) -> &dyn PretrainedConfig {
        self.base.config()
    }
    /// The adapter alone (peft's `PeftModel.save_pretrained`).
    fn save_pretrained(&self, dir: &Path) -> Result<()> {
        self.save_adapter(dir)
    }
}

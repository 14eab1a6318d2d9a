//! transformers' bitsandbytes integration (`utils/quantization_config.py`'s
//! `BitsAndBytesConfig`, `quantizers/quantizer_bnb_4bit.py`, `integrations/bitsandbytes.py`):
//! `from_pretrained` with `quantization_config` loads the base model in 4 or 8 bits — every
//! `nn.Linear` but the modules left out (`llm_int8_skip_modules`, by default the output
//! embeddings, the tied weights and the last parameter's module) becomes bitsandbytes'
//! `Linear4bit` ([`tchtrain_nn::Linear4bit`]) or `Linear8bitLt`
//! ([`tchtrain_nn::Linear8bitLt`], LLM.int8), its weight quantized as it loads; a checkpoint
//! whose `config.json` has a `quantization_config` is pre-quantized and its quantized weights
//! and states load as they are. The model's variables then hold bitsandbytes' layout — 4-bit:
//! `weight` packed, `weight.absmax`, `weight.quant_map`, `weight.nested_absmax`,
//! `weight.nested_quant_map`, `weight.quant_state.bitsandbytes__nf4`; 8-bit: `weight` int8,
//! `SCB`, `weight_format` — which `save_pretrained` writes, with the `quantization_config` in
//! `config.json`, as transformers saves a quantized model.
//!
//! Refused: 8-bit training of the int8 weights themselves (`llm_int8_has_fp16_weight`, which
//! keeps float weights and quantizes them at each forward), and 4-bit storages other than
//! `uint8` (`bnb_4bit_quant_storage`, for FSDP).

use serde_json::Value;
use tch::{Kind, Tensor};
use tchtrain_nn::bitsandbytes::{QuantState, QuantType, int8_vectorwise_quant, quantize_4bit};
use tchtrain_nn::{Linear4bit, Linear8bitLt, QuantizedWeight};

use crate::{Error, Result, TrainableModel};

/// transformers' `BitsAndBytesConfig` (its defaults; written as its `to_dict`).
#[derive(Debug, Clone, PartialEq)]
pub struct BitsAndBytesConfig {
    /// `load_in_4bit`.
    pub load_in_4bit: bool,
    /// `load_in_8bit` (LLM.int8).
    pub load_in_8bit: bool,
    /// `llm_int8_threshold` (8-bit only).
    pub llm_int8_threshold: f64,
    /// `llm_int8_skip_modules`: the modules left in full precision (replacing the defaults).
    pub llm_int8_skip_modules: Option<Vec<String>>,
    /// `llm_int8_enable_fp32_cpu_offload`.
    pub llm_int8_enable_fp32_cpu_offload: bool,
    /// `llm_int8_has_fp16_weight` (refused when true).
    pub llm_int8_has_fp16_weight: bool,
    /// `bnb_4bit_compute_dtype` (`float32` by default).
    pub bnb_4bit_compute_dtype: Kind,
    /// `bnb_4bit_quant_type` (`fp4` by default, `nf4` as QLoRA uses).
    pub bnb_4bit_quant_type: QuantType,
    /// `bnb_4bit_use_double_quant`: the absmax quantized again (`compress_statistics`).
    pub bnb_4bit_use_double_quant: bool,
}

impl Default for BitsAndBytesConfig {
    fn default() -> Self {
        Self {
            load_in_4bit: false,
            load_in_8bit: false,
            llm_int8_threshold: 6.0,
            llm_int8_skip_modules: None,
            llm_int8_enable_fp32_cpu_offload: false,
            llm_int8_has_fp16_weight: false,
            bnb_4bit_compute_dtype: Kind::Float,
            bnb_4bit_quant_type: QuantType::Fp4,
            bnb_4bit_use_double_quant: false,
        }
    }
}

fn invalid(field: &'static str, detail: impl Into<String>) -> Error {
    Error::InvalidArgument {
        field,
        detail: detail.into(),
    }
}

fn dtype_name(kind: Kind) -> &'static str {
    match kind {
        Kind::BFloat16 => "bfloat16",
        Kind::Half => "float16",
        Kind::Double => "float64",
        _ => "float32",
    }
}

impl BitsAndBytesConfig {
    /// QLoRA's usual 4-bit config: `load_in_4bit`, NF4, double quantization, the given
    /// compute dtype.
    pub fn nf4(compute_dtype: Kind) -> Self {
        Self {
            load_in_4bit: true,
            bnb_4bit_quant_type: QuantType::Nf4,
            bnb_4bit_use_double_quant: true,
            bnb_4bit_compute_dtype: compute_dtype,
            ..Self::default()
        }
    }

    /// `BitsAndBytesConfig.from_dict` (a `config.json`'s `quantization_config`, or the keys a
    /// user gives), checked as its `post_init`; what is not implemented here is refused.
    pub fn from_json(value: &Value) -> Result<Self> {
        let map = value
            .as_object()
            .ok_or_else(|| invalid("quantization_config", format!("{value} is not a dict")))?;
        let mut c = Self::default();
        let flag = |key: &'static str, v: &Value| {
            v.as_bool()
                .ok_or_else(|| invalid(key, format!("{v}: {key} must be a boolean")))
        };
        for (key, v) in map {
            match key.as_str() {
                "quant_method" if v.as_str() != Some("bitsandbytes") => {
                    return Err(invalid(
                        "quantization_config.quant_method",
                        format!("{v}: only bitsandbytes quantization is implemented here"),
                    ));
                }
                "load_in_4bit" | "_load_in_4bit" => c.load_in_4bit = flag("load_in_4bit", v)?,
                "load_in_8bit" | "_load_in_8bit" => c.load_in_8bit = flag("load_in_8bit", v)?,
                "llm_int8_threshold" => {
                    c.llm_int8_threshold = v.as_f64().ok_or_else(|| {
                        invalid("llm_int8_threshold", "llm_int8_threshold must be a float")
                    })?
                }
                "llm_int8_skip_modules" => {
                    c.llm_int8_skip_modules = match v {
                        Value::Null => None,
                        Value::Array(a) => Some(
                            a.iter()
                                .map(|s| s.as_str().map(str::to_string))
                                .collect::<Option<Vec<_>>>()
                                .ok_or_else(|| {
                                    invalid(
                                        "llm_int8_skip_modules",
                                        "llm_int8_skip_modules must be a list of strings",
                                    )
                                })?,
                        ),
                        _ => {
                            return Err(invalid(
                                "llm_int8_skip_modules",
                                "llm_int8_skip_modules must be a list of strings",
                            ));
                        }
                    }
                }
                "llm_int8_enable_fp32_cpu_offload" => {
                    c.llm_int8_enable_fp32_cpu_offload =
                        flag("llm_int8_enable_fp32_cpu_offload", v)?
                }
                "llm_int8_has_fp16_weight" => {
                    c.llm_int8_has_fp16_weight = flag("llm_int8_has_fp16_weight", v)?
                }
                "bnb_4bit_compute_dtype" => {
                    c.bnb_4bit_compute_dtype =
                        match v.as_str().map(|s| s.trim_start_matches("torch.")) {
                            None => Kind::Float,
                            Some("float32") => Kind::Float,
                            Some("bfloat16") => Kind::BFloat16,
                            Some("float16") => Kind::Half,
                            Some(other) => {
                                return Err(invalid(
                                    "bnb_4bit_compute_dtype",
                                    format!("{other:?}: use float32, bfloat16 or float16"),
                                ));
                            }
                        }
                }
                "bnb_4bit_quant_type" => {
                    let s = v.as_str().ok_or_else(|| {
                        invalid(
                            "bnb_4bit_quant_type",
                            "bnb_4bit_quant_type must be a string",
                        )
                    })?;
                    c.bnb_4bit_quant_type = QuantType::parse(s, "bnb_4bit_quant_type")
                        .map_err(|e| invalid("bnb_4bit_quant_type", e.to_string()))?;
                }
                "bnb_4bit_use_double_quant" => {
                    c.bnb_4bit_use_double_quant = flag("bnb_4bit_use_double_quant", v)?
                }
                "bnb_4bit_quant_storage" => match v.as_str() {
                    None | Some("uint8") => {}
                    Some(other) => {
                        return Err(invalid(
                            "bnb_4bit_quant_storage",
                            format!(
                                "{other:?}: the packed 4-bit codes are stored as uint8 here (other storages serve FSDP sharding, not implemented); use uint8"
                            ),
                        ));
                    }
                },
                // Unused keys are logged and ignored upstream (`Unused kwargs`).
                _ => {}
            }
        }
        if c.load_in_4bit && c.load_in_8bit {
            return Err(invalid(
                "load_in_4bit",
                "load_in_4bit and load_in_8bit are both True, but only one can be used at the same time (upstream's message)",
            ));
        }
        if c.llm_int8_has_fp16_weight {
            return Err(invalid(
                "llm_int8_has_fp16_weight",
                "True keeps float weights that bitsandbytes quantizes again at each forward and trains through the int8 product (full 8-bit fine-tuning), which is not implemented here; leave it False and train adapters over the int8 weights (LoRA), or train the model loaded without quantization_config",
            ));
        }
        Ok(c)
    }

    /// A 8-bit config (`BitsAndBytesConfig(load_in_8bit=True)`: LLM.int8 with outliers of
    /// magnitude 6 or more).
    pub fn int8() -> Self {
        Self {
            load_in_8bit: true,
            ..Self::default()
        }
    }

    /// `to_dict()`, as `config.json`'s `quantization_config` holds it.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "quant_method": "bitsandbytes",
            "_load_in_8bit": self.load_in_8bit,
            "_load_in_4bit": self.load_in_4bit,
            "llm_int8_threshold": self.llm_int8_threshold,
            "llm_int8_skip_modules": self.llm_int8_skip_modules,
            "llm_int8_enable_fp32_cpu_offload": self.llm_int8_enable_fp32_cpu_offload,
            "llm_int8_has_fp16_weight": self.llm_int8_has_fp16_weight,
            "bnb_4bit_quant_type": self.bnb_4bit_quant_type.name(),
            "bnb_4bit_use_double_quant": self.bnb_4bit_use_double_quant,
            "bnb_4bit_compute_dtype": dtype_name(self.bnb_4bit_compute_dtype),
            "bnb_4bit_quant_storage": "uint8",
            "load_in_4bit": self.load_in_4bit,
            "load_in_8bit": self.load_in_8bit,
        })
    }
}

/// `should_convert_module(full_name, patterns)`: a pattern leaves a module out when it
/// matches from the start up to a module boundary (as a regex), or as a suffix.
pub(crate) fn should_convert_module(name: &str, patterns: &[String]) -> bool {
    !patterns.iter().any(|key| {
        name.ends_with(key.as_str())
            || regex::Regex::new(&format!(r"^(?:{key})(?:\.|$)"))
                .map(|re| re.is_match(name))
                .unwrap_or(false)
    })
}

/// `get_modules_to_not_convert`: the skip list when given, else the tied weights' modules,
/// the last parameter's module and the output embeddings.
fn modules_to_not_convert(model: &dyn TrainableModel, config: &BitsAndBytesConfig) -> Vec<String> {
    if let Some(skip) = &config.llm_int8_skip_modules {
        return skip.clone();
    }
    let strip = |k: &str| k.strip_suffix(".weight").unwrap_or(k).to_string();
    let mut out: Vec<String> = Vec::new();
    for (a, b) in model.tied_weights() {
        out.push(strip(&a));
        out.push(strip(&b));
    }
    // `list(model.named_parameters())[-1][0]`.
    let named = model.var_store().variables();
    if let Some(last) = model.parameters().last()
        && let Some((name, _)) = named
            .iter()
            .find(|(_, v)| v.data_ptr() == last.data_ptr() && v.size() == last.size())
    {
        out.push(strip(name));
    }
    out.extend(model.output_embeddings());
    out.sort();
    out.dedup();
    out
}

/// The linear parts bitsandbytes replaces: every [`tchtrain_nn::Linear`] of the model but
/// those left out.
fn targets(
    model: &dyn TrainableModel,
    config: &BitsAndBytesConfig,
) -> Vec<(String, tchtrain_nn::QuantSlot)> {
    let skip = modules_to_not_convert(model, config);
    model
        .context()
        .quant_slots()
        .into_iter()
        .filter(|(name, _)| should_convert_module(name, &skip))
        .collect()
}

/// The variables beside a quantized part's `weight`: the 4-bit state (`weight.absmax`,
/// ...) or the 8-bit `SCB` and `weight_format` (0: bitsandbytes' row-major layout, the only
/// one it writes).
fn extra_variables(name: &str, weight: &QuantizedWeight) -> Result<Vec<(String, Tensor)>> {
    Ok(match weight {
        QuantizedWeight::FourBit(w) => w.state.as_dict(&format!("{name}.weight"))?,
        QuantizedWeight::EightBit(w) => vec![
            (format!("{name}.SCB"), w.scb.shallow_clone()),
            (
                format!("{name}.weight_format"),
                Tensor::f_from_slice(&[0u8])?.f_reshape([] as [i64; 0])?,
            ),
        ],
    })
}

/// Replaces the float `weight` of `name` by the quantized one and its state tensors in the
/// model's variables (none trainable), and makes the part quantized.
fn install(
    model: &dyn TrainableModel,
    name: &str,
    slot: &tchtrain_nn::QuantSlot,
    weight: QuantizedWeight,
) -> Result<()> {
    let weight_name = format!("{name}.weight");
    let extra = extra_variables(name, &weight)?;
    // A part quantized again (a merge) drops its former state's variables.
    let former: Vec<String> = match slot.with(|q| q.map(|q| extra_variables(name, q))) {
        Some(vars) => vars?.into_iter().map(|(k, _)| k).collect(),
        None => Vec::new(),
    };
    let quantized = weight.weight().shallow_clone();
    {
        let vs = model.var_store();
        let mut vars = vs.variables_.lock().map_err(|_| {
            invalid(
                "quantization_config",
                "the variable store's lock is poisoned",
            )
        })?;
        let old = vars.named_variables.remove(&weight_name).ok_or_else(|| {
            invalid(
                "quantization_config",
                format!("{weight_name}: no such weight to quantize"),
            )
        })?;
        // The quantized weight takes the float one's place in the creation order (frozen),
        // which orders the modules (`named_modules()`: peft draws its adapters in it).
        let ptr = old.data_ptr();
        for v in vars.trainable_variables.iter_mut() {
            if v.tensor.data_ptr() == ptr {
                v.tensor = quantized.shallow_clone();
            }
        }
        // The float weight's storage is released (the part's handle shares it).
        let mut old = old;
        let empty = Tensor::f_empty([0], (old.kind(), old.device()))?;
        old.f_set_data(&empty)?;
        vars.named_variables
            .insert(weight_name.clone(), quantized.shallow_clone());
        for k in former {
            vars.named_variables.remove(&k);
        }
        for (k, t) in extra {
            vars.named_variables.insert(k, t);
        }
    }
    slot.set(Some(weight));
    Ok(())
}

/// `Int8Params._quantize`: the weight in float16, `int8_vectorwise_quant` (no threshold).
fn quantize_8bit(weight: &Tensor, threshold: f64) -> Result<Linear8bitLt> {
    let (cb, scb, _) = int8_vectorwise_quant(&weight.f_contiguous()?.f_to_kind(Kind::Half)?, 0.0)?;
    Ok(Linear8bitLt {
        weight: cb,
        scb,
        threshold,
    })
}

/// A float weight quantized as the config says (`Params4bit` with `blocksize`, or
/// `Int8Params`).
fn quantize_weight(
    weight: &Tensor,
    config: &BitsAndBytesConfig,
    blocksize: i64,
) -> Result<QuantizedWeight> {
    tch::no_grad(|| {
        if config.load_in_8bit {
            return Ok(quantize_8bit(weight, config.llm_int8_threshold)?.into());
        }
        let (packed, state) = quantize_4bit(
            weight,
            blocksize,
            config.bnb_4bit_quant_type,
            config.bnb_4bit_use_double_quant,
        )?;
        state.validate(&packed)?;
        Ok(Linear4bit {
            packed,
            state,
            compute_dtype: Some(config.bnb_4bit_compute_dtype),
        }
        .into())
    })
}

/// `from_pretrained(..., quantization_config=BitsAndBytesConfig(...))` after the float
/// weights loaded: each target's weight quantized (`Params4bit` with the config's block size
/// 64, type and double quantization, or `Int8Params`), its part made 4-bit or 8-bit.
pub fn quantize_model(model: &mut dyn TrainableModel, config: &BitsAndBytesConfig) -> Result<()> {
    if !config.load_in_4bit && !config.load_in_8bit {
        return Err(invalid(
            "quantization_config",
            "neither load_in_4bit nor load_in_8bit is set: nothing to quantize",
        ));
    }
    for (name, slot) in targets(model, config) {
        if slot.is_set() {
            continue;
        }
        let weight = model
            .var_store()
            .variables()
            .remove(&format!("{name}.weight"))
            .ok_or_else(|| {
                invalid(
                    "quantization_config",
                    format!("{name}.weight: no such weight"),
                )
            })?;
        let quantized = quantize_weight(&weight.detach(), config, 64)?;
        install(model, &name, &slot, quantized)?;
    }
    Ok(())
}

/// peft's merge into a quantized part (`bnb.Linear4bit.merge` / `bnb.Linear8bitLt.merge`, and
/// their `unmerge`): the weight dequantized (`dequantize_bnb_weight`, float32 for 8 bits), `f`
/// applied (adding or subtracting the adapter's delta) and the result quantized again with
/// the part's own settings (`Params4bit(w, **weight.__dict__)`: its block size, type and
/// double quantization; `Int8Params(w)`). Returns false when `module` is not quantized.
pub(crate) fn requantize(
    model: &dyn TrainableModel,
    module: &str,
    f: impl FnOnce(Tensor) -> Result<Tensor>,
) -> Result<bool> {
    let Some(slot) = model
        .context()
        .quant_slots()
        .into_iter()
        .find_map(|(name, slot)| (name == module && slot.is_set()).then_some(slot))
    else {
        return Ok(false);
    };
    let (dequantized, settings, blocksize) = slot
        .with(|q| {
            q.map(|q| -> Result<_> {
                let (settings, blocksize) = match q {
                    QuantizedWeight::FourBit(w) => (
                        BitsAndBytesConfig {
                            load_in_4bit: true,
                            bnb_4bit_quant_type: w.state.quant_type,
                            bnb_4bit_use_double_quant: w.state.nested.is_some(),
                            bnb_4bit_compute_dtype: w.compute_dtype.unwrap_or(Kind::Float),
                            ..BitsAndBytesConfig::default()
                        },
                        w.state.blocksize,
                    ),
                    QuantizedWeight::EightBit(w) => (
                        BitsAndBytesConfig {
                            llm_int8_threshold: w.threshold,
                            ..BitsAndBytesConfig::int8()
                        },
                        64,
                    ),
                };
                Ok((tch::no_grad(|| q.dequantize())?, settings, blocksize))
            })
        })
        .ok_or_else(|| invalid("merge_adapter", format!("{module}: not quantized")))??;
    let w = tch::no_grad(|| f(dequantized))?;
    let merged = quantize_weight(&w, &settings, blocksize)?;
    install(model, module, &slot, merged)?;
    Ok(true)
}

/// peft's `dequantize_module_weight` for a quantized part `module` (`None`: not quantized):
/// `dequantize_4bit` in the weight's own dtype, or `int8_vectorwise_dequant` in float32.
pub(crate) fn dequantized_weight(
    ctx: &tchtrain_nn::Context,
    module: &str,
) -> Result<Option<Tensor>> {
    for (name, slot) in ctx.quant_slots() {
        if name == module {
            return Ok(slot
                .with(|q| q.map(QuantizedWeight::dequantize))
                .transpose()?);
        }
    }
    Ok(None)
}

/// The checkpoint keys of a pre-quantized 4-bit part `name` (its packed `weight` and the
/// state beside it), taken out of `tensors`.
fn take_state(
    tensors: &mut Vec<(String, Tensor)>,
    name: &str,
) -> Option<(Tensor, Vec<(String, Tensor)>)> {
    let weight = format!("{name}.weight");
    let pos = tensors
        .iter()
        .position(|(k, t)| *k == weight && t.kind() == Kind::Uint8)?;
    let (_, packed) = tensors.remove(pos);
    let prefix = format!("{weight}.");
    let mut state = Vec::new();
    let mut i = 0;
    while i < tensors.len() {
        if tensors[i].0.starts_with(&prefix) {
            let (k, t) = tensors.remove(i);
            state.push((k[prefix.len()..].to_string(), t));
        } else {
            i += 1;
        }
    }
    Some((packed, state))
}

/// The checkpoint keys of a pre-quantized 8-bit part `name` (its int8 `weight`, `SCB` and
/// `weight_format` when saved), taken out of `tensors` (`Bnb8bitDeserialize` and
/// `maybe_rearrange_weight`).
fn take_8bit(
    tensors: &mut Vec<(String, Tensor)>,
    name: &str,
    threshold: f64,
) -> Result<Option<Linear8bitLt>> {
    let mut take = |key: String| {
        tensors
            .iter()
            .position(|(k, _)| *k == key)
            .map(|pos| tensors.remove(pos).1)
    };
    let weight = take(format!("{name}.weight"));
    let scb = take(format!("{name}.SCB"));
    let format = take(format!("{name}.weight_format"));
    let (Some(weight), Some(scb)) = (weight, scb) else {
        return Ok(None);
    };
    if let Some(f) = format {
        let code = f.f_to_kind(Kind::Int64)?.f_reshape([-1])?;
        if code.numel() != 1 || code.int64_value(&[0]) != 0 {
            return Err(invalid(
                "quantization_config",
                format!(
                    "{name}.weight_format: Only 'row' weight format is supported (upstream's message); the checkpoint holds {code:?}"
                ),
            ));
        }
    }
    let size = weight.size();
    if weight.kind() != Kind::Int8
        || size.len() != 2
        || scb.kind() != Kind::Float
        || scb.size() != [size[0]]
    {
        return Err(invalid(
            "quantization_config",
            format!(
                "{name}: an 8-bit part holds an int8 2-D `weight` and a float32 `SCB` of one value per row; the checkpoint holds {:?} {size:?} and {:?} {:?}",
                weight.kind(),
                scb.kind(),
                scb.size()
            ),
        ));
    }
    Ok(Some(Linear8bitLt {
        weight,
        scb,
        threshold,
    }))
}

/// A pre-quantized part read from its checkpoint, to install once the rest has loaded.
pub(crate) struct PrequantizedPart {
    /// The module name.
    pub(crate) name: String,
    weight: QuantizedWeight,
    slot: tchtrain_nn::QuantSlot,
}

/// A pre-quantized checkpoint's quantized parts (`Bnb4bitDeserialize`, `Bnb8bitDeserialize`):
/// for each target its quantized weight and state read and checked; the keys are taken out of
/// `tensors` (the rest loads as usual).
pub(crate) fn load_prequantized(
    model: &mut dyn TrainableModel,
    config: &BitsAndBytesConfig,
    tensors: &mut Vec<(String, Tensor)>,
) -> Result<Vec<PrequantizedPart>> {
    let mut parts = Vec::new();
    for (name, slot) in targets(model, config) {
        let missing = || {
            invalid(
                "quantization_config",
                format!(
                    "{name}.weight: the checkpoint says it is quantized in {} (config.json's quantization_config) but holds no {} weight for this linear part",
                    if config.load_in_8bit {
                        "8 bits"
                    } else {
                        "4 bits"
                    },
                    if config.load_in_8bit {
                        "int8 (with its SCB)"
                    } else {
                        "packed uint8"
                    }
                ),
            )
        };
        let weight: QuantizedWeight = if config.load_in_8bit {
            take_8bit(tensors, &name, config.llm_int8_threshold)?
                .ok_or_else(missing)?
                .into()
        } else {
            let (packed, state) = take_state(tensors, &name).ok_or_else(missing)?;
            let lookup = |key: &str| {
                state
                    .iter()
                    .find(|(k, _)| k == key)
                    .map(|(_, t)| t.shallow_clone())
            };
            let quant = QuantState::from_dict(lookup)?;
            quant
                .validate(&packed)
                .map_err(|e| invalid("quantization_config", format!("{name}.weight: {e}")))?;
            Linear4bit {
                packed,
                state: quant,
                compute_dtype: Some(config.bnb_4bit_compute_dtype),
            }
            .into()
        };
        parts.push(PrequantizedPart { name, weight, slot });
    }
    Ok(parts)
}

/// Installs the parts [`load_prequantized`] read (after the rest of the model loaded and
/// took its dtype, which the states keep their own of).
pub(crate) fn install_prequantized(
    model: &mut dyn TrainableModel,
    parts: Vec<PrequantizedPart>,
) -> Result<()> {
    for p in parts {
        install(model, &p.name, &p.slot, p.weight)?;
    }
    Ok(())
}

/// The `quantization_config` of the checkpoint in `dir` (`config.json`), when it has one:
/// the checkpoint is pre-quantized.
pub(crate) fn checkpoint_quantization_config(
    dir: &std::path::Path,
) -> Result<Option<BitsAndBytesConfig>> {
    let path = dir.join(crate::loading::CONFIG_NAME);
    if !path.exists() {
        return Ok(None);
    }
    let config: Value = crate::configuration_utils::read_config(&path)?;
    match config.get("quantization_config") {
        None | Some(Value::Null) => Ok(None),
        // Other methods are the model's config's to read (gpt-oss's MXFP4 experts are
        // dequantized on load) or to refuse.
        Some(q)
            if q.get("quant_method").and_then(Value::as_str) != Some("bitsandbytes")
                && !(q.get("quant_method").is_none()
                    && (q.get("load_in_4bit").is_some() || q.get("load_in_8bit").is_some())) =>
        {
            Ok(None)
        }
        Some(q) => BitsAndBytesConfig::from_json(q).map(Some),
    }
}

/// The model's quantized parts, by module name (their `weight` holds the packed codes or the
/// int8 rows, the variables beside it the state).
pub fn quantized_modules(model: &dyn TrainableModel) -> Vec<String> {
    model
        .context()
        .quant_slots()
        .into_iter()
        .filter(|(_, s)| s.is_set())
        .map(|(name, _)| name)
        .collect()
}

/// Whether the model has quantized parts (upstream's `is_loaded_in_4bit` /
/// `is_loaded_in_8bit`).
pub fn is_quantized(model: &dyn TrainableModel) -> bool {
    model
        .context()
        .quant_slots()
        .iter()
        .any(|(_, s)| s.is_set())
}

/// Whether the model has 8-bit parts (upstream's `is_loaded_in_8bit`).
pub(crate) fn has_8bit(model: &dyn TrainableModel) -> bool {
    model
        .context()
        .quant_slots()
        .iter()
        .any(|(_, s)| s.with(|q| matches!(q, Some(QuantizedWeight::EightBit(_)))))
}

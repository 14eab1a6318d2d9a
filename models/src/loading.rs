//! Reading and writing weights: `model.safetensors` and sharded
//! `model.safetensors.index.json`, base-model prefix mapping, tied weights, dtype casts,
//! and upstream's loading report (missing / unexpected / mismatched keys).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use tch::{Kind, Tensor, nn::VarStore};

use crate::modeling_utils::PreTrainedModel;
use crate::{Error, Result};

/// File name of a single-file checkpoint.
pub const SAFE_WEIGHTS_NAME: &str = "model.safetensors";
/// File name of a sharded checkpoint's index.
pub const SAFE_WEIGHTS_INDEX_NAME: &str = "model.safetensors.index.json";
/// File name of the config.
pub const CONFIG_NAME: &str = "config.json";

/// Upstream's loading report (`output_loading_info=True`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadingInfo {
    /// Model parameters absent from the checkpoint (initialised fresh, e.g. a new head).
    pub missing_keys: Vec<String>,
    /// Checkpoint tensors the model has no parameter for.
    pub unexpected_keys: Vec<String>,
    /// `(key, checkpoint shape, model shape)` of tensors whose shapes differ.
    pub mismatched_keys: Vec<(String, Vec<i64>, Vec<i64>)>,
}

impl LoadingInfo {
    /// True when every parameter was loaded and nothing was left over.
    pub fn is_clean(&self) -> bool {
        self.missing_keys.is_empty()
            && self.unexpected_keys.is_empty()
            && self.mismatched_keys.is_empty()
    }
}

impl std::fmt::Display for LoadingInfo {
    /// The table upstream logs as `... LOAD REPORT`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_clean() {
            return writeln!(f, "all keys loaded");
        }
        writeln!(f, "Key | Status | Details")?;
        for k in &self.missing_keys {
            writeln!(f, "{k} | MISSING | newly initialized")?;
        }
        for k in &self.unexpected_keys {
            writeln!(f, "{k} | UNEXPECTED | ignored")?;
        }
        for (k, ckpt, model) in &self.mismatched_keys {
            writeln!(f, "{k} | MISMATCH | checkpoint {ckpt:?} vs model {model:?}")?;
        }
        Ok(())
    }
}

/// Options of [`load_into`], as upstream's `from_pretrained` keyword arguments.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Keep freshly initialised weights where checkpoint shapes differ instead of failing.
    pub ignore_mismatched_sizes: bool,
    /// `dtype=`: the floating dtype of the loaded weights.
    pub dtype: LoadDtype,
    /// `quantization_config=`: load the base model in 4 bits (bitsandbytes). A checkpoint
    /// whose `config.json` holds its own `quantization_config` is pre-quantized, and that
    /// one is used (upstream's warning: "the model already has a quantization_config").
    pub quantization_config: Option<crate::BitsAndBytesConfig>,
}

/// Upstream `from_pretrained(dtype=...)`. transformers 5 defaults to `"auto"`: the
/// `dtype` (or v4 `torch_dtype`) of `config.json`, else the checkpoint's first floating
/// tensor's; a bfloat16 hub checkpoint loads (and trains) in bfloat16.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LoadDtype {
    /// The config's dtype, else the checkpoint's.
    #[default]
    Auto,
    /// This floating kind (`float32`, `float16`, `bfloat16`, `float64`).
    Kind(Kind),
}

impl std::str::FromStr for LoadDtype {
    type Err = Error;

    /// [`LoadDtype::parse`].
    fn from_str(value: &str) -> Result<Self> {
        Self::parse(value)
    }
}

impl LoadDtype {
    /// Parses upstream's values: `auto` or a torch dtype name (`bfloat16`, `torch.float16`,
    /// `fp32`-style abbreviations are not torch's and are refused, as upstream's).
    pub fn parse(value: &str) -> Result<Self> {
        let name = value.strip_prefix("torch.").unwrap_or(value);
        Ok(match name {
            "auto" => Self::Auto,
            "float32" | "float" => Self::Kind(Kind::Float),
            "float16" | "half" => Self::Kind(Kind::Half),
            "bfloat16" => Self::Kind(Kind::BFloat16),
            "float64" | "double" => Self::Kind(Kind::Double),
            _ => {
                return Err(Error::InvalidArgument {
                    field: "dtype",
                    detail: format!(
                        "{value:?}: use auto, float32, float16, bfloat16 or float64 (upstream's `dtype` names)"
                    ),
                });
            }
        })
    }

    /// The kind for a model folder: `Auto` reads `config.json`'s `dtype` / `torch_dtype`,
    /// else the first floating tensor of `tensors`.
    fn resolve(self, dir: &Path, tensors: &[(String, Tensor)]) -> Result<Kind> {
        match self {
            Self::Kind(k) => Ok(k),
            Self::Auto => {
                let config = dir.join(CONFIG_NAME);
                let text = std::fs::read_to_string(&config).map_err(|source| Error::Io {
                    path: config.clone(),
                    source,
                })?;
                let json: serde_json::Value =
                    serde_json::from_str(&text).map_err(|source| Error::ConfigJson {
                        path: config.clone(),
                        source,
                    })?;
                let named = ["dtype", "torch_dtype"]
                    .iter()
                    .find_map(|k| json.get(*k).and_then(serde_json::Value::as_str));
                match named {
                    Some(name) => match Self::parse(name)? {
                        Self::Kind(k) => Ok(k),
                        Self::Auto => Ok(Kind::Float),
                    },
                    None => Ok(tensors
                        .iter()
                        .map(|(_, t)| t.kind())
                        .find(|k| {
                            matches!(k, Kind::Half | Kind::BFloat16 | Kind::Float | Kind::Double)
                        })
                        .unwrap_or(Kind::Float)),
                }
            }
        }
    }
}

/// The checkpoint files of a model folder: the single file or every shard of the index.
pub fn checkpoint_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join(SAFE_WEIGHTS_NAME);
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index = dir.join(SAFE_WEIGHTS_INDEX_NAME);
    if index.is_file() {
        #[derive(serde::Deserialize)]
        struct Index {
            weight_map: BTreeMap<String, String>,
        }
        let text = std::fs::read_to_string(&index).map_err(|source| Error::Io {
            path: index.clone(),
            source,
        })?;
        let parsed: Index = serde_json::from_str(&text).map_err(|source| Error::ConfigJson {
            path: index.clone(),
            source,
        })?;
        let files: BTreeSet<&String> = parsed.weight_map.values().collect();
        return files
            .into_iter()
            .map(|f| {
                let p = dir.join(f);
                if p.is_file() {
                    Ok(p)
                } else {
                    Err(Error::MissingFile { path: p, fix: "the index names a shard that is not in the folder: re-download or re-save the model" })
                }
            })
            .collect();
    }
    let fix = if dir.join("pytorch_model.bin").exists() {
        "only safetensors checkpoints are read (pytorch_model.bin is a pickle): convert it with `model.save_pretrained(dir, safe_serialization=True)` in Python"
    } else {
        "the folder needs model.safetensors or model.safetensors.index.json"
    };
    Err(Error::MissingFile { path: single, fix })
}

/// Reads every tensor of a checkpoint folder (all shards).
pub fn read_checkpoint(dir: &Path) -> Result<Vec<(String, Tensor)>> {
    let mut out = Vec::new();
    for file in checkpoint_files(dir)? {
        let tensors = Tensor::read_safetensors(&file).map_err(|source| Error::Checkpoint {
            path: file.clone(),
            source,
        })?;
        out.extend(tensors);
    }
    Ok(out)
}

/// The raw bytes, dtype and shape of the tensor `key` in the checkpoint in `dir` (read from
/// its file's header and byte range alone), `None` when no file holds it.
fn checkpoint_tensor_bytes(dir: &Path, key: &str) -> Result<Option<(String, Vec<u8>)>> {
    use std::io::{Read, Seek, SeekFrom};
    for file in checkpoint_files(dir)? {
        let io = |e: std::io::Error| Error::Io {
            path: file.clone(),
            source: e,
        };
        let mut f = std::fs::File::open(&file).map_err(io)?;
        let mut len = [0u8; 8];
        f.read_exact(&mut len).map_err(io)?;
        let header_len = u64::from_le_bytes(len);
        let mut header = vec![
            0u8;
            usize::try_from(header_len)
                .unwrap_or(usize::MAX)
                .min(100 << 20)
        ];
        f.read_exact(&mut header).map_err(io)?;
        let header: serde_json::Value =
            serde_json::from_slice(&header).map_err(|e| Error::Checkpoint {
                path: file.clone(),
                source: tch::TchError::FileFormat(format!("unreadable safetensors header: {e}")),
            })?;
        let Some(entry) = header.get(key) else {
            continue;
        };
        let offsets: Vec<u64> = entry["data_offsets"]
            .as_array()
            .map(|a| a.iter().filter_map(serde_json::Value::as_u64).collect())
            .unwrap_or_default();
        let [start, end] = offsets[..] else {
            return Err(Error::Checkpoint {
                path: file.clone(),
                source: tch::TchError::FileFormat(format!("{key}: no data_offsets in the header")),
            });
        };
        f.seek(SeekFrom::Start(8 + header_len + start))
            .map_err(io)?;
        let mut bytes = vec![0u8; usize::try_from(end.saturating_sub(start)).unwrap_or(0)];
        f.read_exact(&mut bytes).map_err(io)?;
        let described = format!("{} {}", entry["dtype"], entry["shape"]);
        return Ok(Some((described, bytes)));
    }
    Ok(None)
}

/// Every tensor's name, shape and dtype in the checkpoint in `dir`, read from the files'
/// headers alone.
pub(crate) fn checkpoint_shapes(dir: &Path) -> Result<Vec<(String, Vec<i64>, Kind)>> {
    use std::io::Read;
    let mut out = Vec::new();
    for file in checkpoint_files(dir)? {
        let io = |e: std::io::Error| Error::Io {
            path: file.clone(),
            source: e,
        };
        let mut f = std::fs::File::open(&file).map_err(io)?;
        let mut len = [0u8; 8];
        f.read_exact(&mut len).map_err(io)?;
        let header_len = usize::try_from(u64::from_le_bytes(len))
            .unwrap_or(usize::MAX)
            .min(100 << 20);
        let mut header = vec![0u8; header_len];
        f.read_exact(&mut header).map_err(io)?;
        let bad = |detail: String| Error::Checkpoint {
            path: file.clone(),
            source: tch::TchError::FileFormat(detail),
        };
        let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&header)
            .map_err(|e| bad(format!("unreadable safetensors header: {e}")))?;
        for (key, entry) in header.iter().filter(|(k, _)| *k != "__metadata__") {
            let shape = entry["shape"]
                .as_array()
                .map(|a| a.iter().filter_map(serde_json::Value::as_i64).collect())
                .ok_or_else(|| bad(format!("{key}: no shape in the header")))?;
            let kind = match entry["dtype"].as_str() {
                Some("F32") => Kind::Float,
                Some("F16") => Kind::Half,
                Some("BF16") => Kind::BFloat16,
                Some("F64") => Kind::Double,
                Some("I64") => Kind::Int64,
                Some("I32") => Kind::Int,
                Some("I8") => Kind::Int8,
                Some("U8") => Kind::Uint8,
                Some("BOOL") => Kind::Bool,
                other => return Err(bad(format!("{key}: dtype {other:?} is not read here"))),
            };
            out.push((key.clone(), shape, kind));
        }
    }
    Ok(out)
}

/// Whether the checkpoint in `dir` holds `key` with other values than `other` (upstream's
/// `tie_weights` leaves two such weights apart): `false` when `key` is absent or equal.
pub(crate) fn checkpoint_tensors_differ(dir: &Path, key: &str, other: &str) -> Result<bool> {
    let Some(a) = checkpoint_tensor_bytes(dir, key)? else {
        return Ok(false);
    };
    Ok(checkpoint_tensor_bytes(dir, other)?.is_none_or(|b| a != b))
}

/// Keys that are buffers or leftovers of older upstream versions, never reported.
fn ignorable(key: &str) -> bool {
    key.ends_with("embeddings.position_ids")
        || key.ends_with(".attn.bias")
        || key.ends_with(".attn.masked_bias")
        || key.ends_with("rotary_emb.inv_freq")
}

/// Upstream `from_pretrained` on a resolved folder for the model `build` makes: the model is
/// built with initialisation deferred, the checkpoint loaded into it under
/// `base_model_prefix` (its tied weights and the `dropped` keys neither expected nor
/// reported), and only the weights it lacks drawn, as upstream's `_initialize_missing_keys`
/// (see `initialization`).
pub(crate) fn from_pretrained_with<M: crate::TrainableModel>(
    dir: &Path,
    base_model_prefix: &str,
    dropped: &[&str],
    options: &LoadOptions,
    build: impl FnOnce(&tchtrain_nn::Context) -> Result<M>,
) -> Result<crate::Loaded<M>> {
    let ctx = tchtrain_nn::Context::deferred();
    let built = build(&ctx);
    let inits = ctx.take_deferred();
    let mut model = built?;
    // A pre-quantized checkpoint's own config wins over the one given.
    let prequantized = crate::bitsandbytes::checkpoint_quantization_config(dir)?;
    let quantization = prequantized
        .clone()
        .or_else(|| options.quantization_config.clone());
    if let Some(q) = &quantization {
        model.set_quantization_config(Some(q.to_json()))?;
    }
    let mut skipped: Vec<String> = model.tied_weights().into_iter().map(|(k, _)| k).collect();
    skipped.extend(dropped.iter().map(|k| k.to_string()));
    let tensors = read_checkpoint(dir)?;
    let mut tensors = match model.load_conversion() {
        Some(conversion) => {
            let used = conversion.used_by(&tensors);
            model.set_weight_conversion(used);
            conversion.convert(tensors)?
        }
        None => tensors,
    };
    let prequantized_parts = match (&prequantized, &quantization) {
        (Some(_), Some(q)) => Some(crate::bitsandbytes::load_prequantized(
            &mut model,
            q,
            &mut tensors,
        )?),
        _ => None,
    };
    let kind = options.dtype.resolve(dir, &tensors)?;
    let mut info = load_into(
        model.var_store_mut(),
        tensors,
        base_model_prefix,
        &skipped,
        options,
    )?;
    // The pre-quantized parts' float weights are replaced, not missing.
    if let Some(parts) = &prequantized_parts {
        info.missing_keys
            .retain(|k| !parts.iter().any(|p| *k == format!("{}.weight", p.name)));
    }
    // The missing weights are drawn in float32 and then cast (upstream draws them in the
    // model's dtype; whether those half-precision draws are bit-equal is not measured).
    tchtrain_nn::initialization::initialize_missing(model.var_store(), &inits, &info.missing_keys)?;
    if kind != Kind::Float {
        model.var_store_mut().set_kind(kind);
    }
    match (prequantized_parts, &quantization) {
        (Some(parts), Some(_)) => crate::bitsandbytes::install_prequantized(&mut model, parts)?,
        (None, Some(q)) => crate::bitsandbytes::quantize_model(&mut model, q)?,
        _ => {}
    }
    Ok(crate::Loaded { model, info })
}

/// Copies checkpoint tensors into a model's variables by name, mapping the base-model
/// prefix both ways (a base checkpoint into a head model and back), skipping tied keys,
/// casting dtypes, and returning upstream's loading report.
pub fn load_into(
    vs: &mut VarStore,
    tensors: Vec<(String, Tensor)>,
    base_model_prefix: &str,
    tied_keys: &[String],
    options: &LoadOptions,
) -> Result<LoadingInfo> {
    let vars = vs.variables();
    let prefix = format!("{base_model_prefix}.");
    let model_has_prefix =
        !base_model_prefix.is_empty() && vars.keys().any(|k| k.starts_with(&prefix));
    let ckpt_has_prefix =
        !base_model_prefix.is_empty() && tensors.iter().any(|(k, _)| k.starts_with(&prefix));
    let rename = |k: &str| -> String {
        if model_has_prefix && !ckpt_has_prefix && !vars.contains_key(k) {
            format!("{prefix}{k}")
        } else if !model_has_prefix && ckpt_has_prefix {
            k.strip_prefix(&prefix).unwrap_or(k).to_string()
        } else {
            k.to_string()
        }
    };
    let mut info = LoadingInfo::default();
    let mut loaded: HashMap<String, ()> = HashMap::new();
    tch::no_grad(|| -> Result<()> {
        for (key, src) in tensors {
            let name = rename(&key);
            match vars.get(&name) {
                Some(var) => {
                    if var.size() != src.size() {
                        info.mismatched_keys
                            .push((name.clone(), src.size(), var.size()));
                        continue;
                    }
                    let mut var = var.shallow_clone();
                    var.f_copy_(&src.f_to_device(var.device())?)?;
                    loaded.insert(name, ());
                }
                None if tied_keys.contains(&name) || ignorable(&name) => {}
                None => info.unexpected_keys.push(name),
            }
        }
        Ok(())
    })?;
    info.missing_keys = vars
        .keys()
        .filter(|k| !loaded.contains_key(*k))
        .cloned()
        .collect();
    for v in [&mut info.missing_keys, &mut info.unexpected_keys] {
        v.sort();
    }
    info.mismatched_keys.sort();
    if !info.mismatched_keys.is_empty() && !options.ignore_mismatched_sizes {
        return Err(Error::MismatchedSizes {
            keys: info
                .mismatched_keys
                .iter()
                .map(|(k, a, b)| format!("{k}: checkpoint {a:?} vs model {b:?}"))
                .collect(),
        });
    }
    info.missing_keys
        .extend(info.mismatched_keys.iter().map(|(k, _, _)| k.clone()));
    info.missing_keys.sort();
    info.missing_keys.dedup();
    Ok(info)
}

fn safetensors_dtype(kind: Kind) -> Result<safetensors::Dtype> {
    Ok(match kind {
        Kind::Float => safetensors::Dtype::F32,
        Kind::Double => safetensors::Dtype::F64,
        Kind::Half => safetensors::Dtype::F16,
        Kind::BFloat16 => safetensors::Dtype::BF16,
        Kind::Int64 => safetensors::Dtype::I64,
        Kind::Int => safetensors::Dtype::I32,
        Kind::Int8 => safetensors::Dtype::I8,
        Kind::Uint8 => safetensors::Dtype::U8,
        Kind::Bool => safetensors::Dtype::BOOL,
        other => {
            return Err(Error::UnsupportedDtype {
                kind: format!("{other:?}"),
            });
        }
    })
}

/// Writes named tensors as a safetensors file with upstream's `{"format": "pt"}` metadata
/// (written to a temporary name, then renamed).
pub fn write_safetensors(tensors: &[(String, Tensor)], path: &Path) -> Result<()> {
    let mut owned: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> =
        Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let t = t.f_to_device(tch::Device::Cpu)?.f_contiguous()?;
        let dtype = safetensors_dtype(t.kind())?;
        let numel = t.numel();
        let mut bytes = vec![0u8; numel * t.kind().elt_size_in_bytes()];
        t.f_copy_data_u8(&mut bytes, numel)?;
        let shape = t.size().iter().map(|&d| d as usize).collect();
        owned.push((name.clone(), dtype, shape, bytes));
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = owned
        .iter()
        .map(|(n, d, s, b)| {
            Ok((
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b)?,
            ))
        })
        .collect::<std::result::Result<_, safetensors::SafeTensorError>>()
        .map_err(|source| Error::Safetensors {
            path: path.to_path_buf(),
            source,
        })?;
    let metadata = Some(HashMap::from([("format".to_string(), "pt".to_string())]));
    let tmp = path.with_extension("safetensors.tmp");
    safetensors::serialize_to_file(views, &metadata, &tmp).map_err(|source| {
        Error::Safetensors {
            path: path.to_path_buf(),
            source,
        }
    })?;
    std::fs::rename(&tmp, path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// A model's state dict alone as `dir/model.safetensors`, names sorted (what upstream's
/// Trainer writes for a model that is not a `PreTrainedModel`).
pub fn save_state_dict(dir: &Path, mut tensors: Vec<(String, Tensor)>) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    write_safetensors(&tensors, &dir.join(SAFE_WEIGHTS_NAME))
}

/// Upstream `save_pretrained`: `config.json` (with `architectures`, `dtype` and
/// `transformers_version`) and `model.safetensors` without tied duplicates.
pub fn save_pretrained<M: PreTrainedModel + ?Sized>(model: &M, dir: &Path) -> Result<()> {
    let tensors: Vec<(String, Tensor)> = model.var_store().variables().into_iter().collect();
    save_pretrained_state_dict(model, dir, tensors)
}

/// Upstream `save_pretrained(dir, state_dict=...)`: `model`'s `config.json` with `state_dict`
/// as its weights, for a model whose variables do not hold them (ZeRO-3 saves the state dict
/// it gathered unit by unit, as the Trainer does under DeepSpeed).
pub fn save_pretrained_state_dict<M: PreTrainedModel + ?Sized>(
    model: &M,
    dir: &Path,
    mut tensors: Vec<(String, Tensor)>,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    if let Some(conversion) = model.weight_conversion() {
        tensors = conversion.revert(tensors)?;
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let dtype = tensors
        .first()
        .map(|(_, t)| t.kind())
        .unwrap_or(Kind::Float);
    write_safetensors(&tensors, &dir.join(SAFE_WEIGHTS_NAME))?;
    write_config(model, dir, dtype)?;
    if let Some(generation) = model.generation_config() {
        crate::generation::save_model_generation_config(dir, generation)?;
    }
    Ok(())
}

/// `config.save_pretrained(dir)` of a model's config: `config.json` with the architecture,
/// model type, `dtype` and transformers version.
pub fn write_config<M: PreTrainedModel + ?Sized>(model: &M, dir: &Path, dtype: Kind) -> Result<()> {
    let mut config = model.config().to_json_value()?;
    if let Some(obj) = config.as_object_mut() {
        obj.insert(
            "architectures".into(),
            serde_json::json!([model.architecture()]),
        );
        obj.insert("model_type".into(), model.config().model_type().into());
        obj.insert("dtype".into(), dtype_name(dtype).into());
        obj.insert(
            "transformers_version".into(),
            crate::configuration_utils::TRANSFORMERS_VERSION.into(),
        );
    }
    let text = serde_json::to_string_pretty(&config).map_err(|source| Error::ConfigJson {
        path: dir.join(CONFIG_NAME),
        source,
    })?;
    let path = dir.join(CONFIG_NAME);
    std::fs::write(&path, text + "\n").map_err(|source| Error::Io { path, source })?;
    Ok(())
}

/// Upstream's dtype names in config.json.
pub fn dtype_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Half => "float16",
        Kind::BFloat16 => "bfloat16",
        Kind::Double => "float64",
        _ => "float32",
    }
}

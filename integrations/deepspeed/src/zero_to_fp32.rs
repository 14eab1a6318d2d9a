//! Consolidation of per-rank ZeRO / sharded FSDP checkpoints into one full state dict,
//! DeepSpeed's `zero_to_fp32.py` (`get_fp32_state_dict_from_zero_checkpoint`,
//! `convert_zero_checkpoint_to_fp32_state_dict`): every rank's slice of each flat buffer is
//! concatenated in rank order, the padding dropped, and the buffer cut back into its
//! parameters by the recorded offsets and shapes. The result is `model.safetensors` with
//! upstream's `{"format": "pt"}` metadata, which `from_pretrained` loads (tied weights
//! appear once, under the name the model keeps, as `save_pretrained` writes them).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tch::Tensor;

use crate::zero_checkpoint::{FSDP_MODEL_DIR, LATEST_NAME, read_zero_shard, zero_shard_stem};
use crate::{Error, Result};

/// The file [`convert_zero_checkpoint_to_fp32_state_dict`] writes.
pub const SAFE_WEIGHTS_NAME: &str = "model.safetensors";

/// The folder holding the shard files of `checkpoint_dir`: the `global_step{N}` folder its
/// `latest` file names, its `pytorch_model_fsdp_0/`, or the folder itself when it holds
/// rank 0's shard files.
pub fn find_shard_dir(checkpoint_dir: &Path) -> Result<PathBuf> {
    let latest = checkpoint_dir.join(LATEST_NAME);
    if latest.is_file() {
        let tag = std::fs::read_to_string(&latest).map_err(|source| Error::Io {
            path: latest.clone(),
            source,
        })?;
        return Ok(checkpoint_dir.join(tag.trim()));
    }
    let fsdp = checkpoint_dir.join(FSDP_MODEL_DIR);
    if fsdp.is_dir() {
        return Ok(fsdp);
    }
    if checkpoint_dir
        .join(format!("{}.json", zero_shard_stem(0)))
        .is_file()
    {
        return Ok(checkpoint_dir.to_path_buf());
    }
    Err(Error::Checkpoint {
        path: checkpoint_dir.to_path_buf(),
        detail: format!(
            "no `{LATEST_NAME}` file, no `{FSDP_MODEL_DIR}/` and no `{}.json`: not a ZeRO or sharded FSDP checkpoint",
            zero_shard_stem(0)
        ),
    })
}

/// Upstream `get_fp32_state_dict_from_zero_checkpoint`: the full parameters of the
/// checkpoint in `checkpoint_dir` (see [`find_shard_dir`]), by name, in buffer order.
pub fn get_fp32_state_dict_from_zero_checkpoint(
    checkpoint_dir: &Path,
) -> Result<Vec<(String, Tensor)>> {
    let dir = find_shard_dir(checkpoint_dir)?;
    let (meta0, first) = read_zero_shard(&dir, 0)?;
    let world = meta0.world_size;
    let mut ranks: Vec<HashMap<String, Tensor>> = vec![first.into_iter().collect()];
    for r in 1..world {
        let (meta, tensors) = read_zero_shard(&dir, r)?;
        if meta.buffers != meta0.buffers || meta.world_size != world {
            return Err(Error::Checkpoint {
                path: dir.clone(),
                detail: format!(
                    "rank {r}'s layout differs from rank 0's (files of two runs mixed?)"
                ),
            });
        }
        ranks.push(tensors.into_iter().collect());
    }
    let mut out = Vec::new();
    for (b, layout) in meta0.buffers.iter().enumerate() {
        let key = format!("fp32_flat.{b}");
        let slices = ranks
            .iter()
            .enumerate()
            .map(|(r, t)| {
                let s = t.get(&key).ok_or_else(|| Error::Checkpoint {
                    path: dir.clone(),
                    detail: format!("rank {r} has no tensor {key}"),
                })?;
                if s.numel() as i64 != layout.shard_numel {
                    return Err(Error::Checkpoint {
                        path: dir.clone(),
                        detail: format!(
                            "rank {r}'s {key} has {} elements, the layout {}",
                            s.numel(),
                            layout.shard_numel
                        ),
                    });
                }
                Ok(s.shallow_clone())
            })
            .collect::<Result<Vec<_>>>()?;
        let full = Tensor::f_cat(&slices, 0)?;
        for (i, p) in layout.params.iter().enumerate() {
            let t = layout.piece(&full, i)?.f_contiguous()?.copy();
            out.push((p.name.clone(), t));
        }
    }
    Ok(out)
}

/// Upstream `convert_zero_checkpoint_to_fp32_state_dict`: writes the consolidated
/// parameters of `checkpoint_dir` to `output_dir/model.safetensors` and returns that path.
pub fn convert_zero_checkpoint_to_fp32_state_dict(
    checkpoint_dir: &Path,
    output_dir: &Path,
) -> Result<PathBuf> {
    let mut tensors = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir)?;
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    std::fs::create_dir_all(output_dir).map_err(|source| Error::Io {
        path: output_dir.to_path_buf(),
        source,
    })?;
    let path = output_dir.join(SAFE_WEIGHTS_NAME);
    write_safetensors_pt(&tensors, &path)?;
    Ok(path)
}

/// Writes `tensors` as safetensors with `{"format": "pt"}` metadata (transformers refuses
/// files without it), through a temporary name.
fn write_safetensors_pt(tensors: &[(String, Tensor)], path: &Path) -> Result<()> {
    let bad = |detail: String| Error::Checkpoint {
        path: path.to_path_buf(),
        detail,
    };
    let mut owned: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, t) in tensors {
        let t = t.f_to_device(tch::Device::Cpu)?.f_contiguous()?;
        let dtype = match t.kind() {
            tch::Kind::Float => safetensors::Dtype::F32,
            tch::Kind::Double => safetensors::Dtype::F64,
            tch::Kind::Half => safetensors::Dtype::F16,
            tch::Kind::BFloat16 => safetensors::Dtype::BF16,
            other => return Err(bad(format!("`{name}` has dtype {other:?}"))),
        };
        let numel = t.numel();
        let mut bytes = vec![0u8; numel * t.kind().elt_size_in_bytes()];
        t.f_copy_data_u8(&mut bytes, numel)?;
        let shape = t.size().iter().map(|&d| d as usize).collect();
        owned.push((name.clone(), dtype, shape, bytes));
    }
    let views = owned
        .iter()
        .map(|(n, d, s, b)| {
            safetensors::tensor::TensorView::new(*d, s.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| bad(e.to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    let metadata = Some(HashMap::from([("format".to_string(), "pt".to_string())]));
    let tmp = path.with_extension("safetensors.tmp");
    safetensors::serialize_to_file(views, &metadata, &tmp).map_err(|e| bad(e.to_string()))?;
    std::fs::rename(&tmp, path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

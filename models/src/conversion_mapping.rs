//! Upstream `conversion_mapping.py`: the families whose checkpoints on disk name their
//! weights otherwise than their modules do. transformers 5 holds a mixture of experts'
//! weights fused (`experts.gate_up_proj` `[experts, 2 · inter, hidden]`, `experts.down_proj`
//! `[experts, hidden, inter]`) but reads and writes checkpoints per expert, as the released
//! ones are: `from_pretrained` fuses them ([`WeightConversion::convert`]) and `save_pretrained`
//! splits them back ([`WeightConversion::revert`]). Fused keys load as they are.

use std::collections::BTreeMap;

use tch::{Kind, Tensor};

use crate::{Error, Result};

/// A family's checkpoint layout (upstream's `_MODEL_TO_CONVERSION_PATTERN` entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightConversion {
    /// `qwen2_moe` (and `qwen3_moe`, `olmoe`): `mlp.experts.{j}.gate_proj.weight`,
    /// `up_proj.weight`, `down_proj.weight`.
    Qwen2Moe,
    /// `mixtral`: `block_sparse_moe.` for `mlp.`, and `experts.{j}.w1.weight` (gate),
    /// `w3.weight` (up), `w2.weight` (down).
    Mixtral,
    /// `llava` (and `gemma3`): the multimodal checkpoints' layout, `language_model.model.`
    /// for `model.language_model.`, `language_model.lm_head.` for `lm_head.`,
    /// `vision_tower.` (the hub's `vision_tower.vision_model.` too) for `model.vision_tower.`,
    /// `multi_modal_projector.` for `model.multi_modal_projector.`.
    Llava,
    /// `qwen3_5_text` (upstream's `PrefixChange(prefix_to_remove="language_model",
    /// model_prefix="model")`): `model.language_model.` read as `model.`, and written back
    /// so; a multimodal checkpoint's vision tower (`model.visual.`) and multi-token
    /// prediction head (`mtp.`) are left out, as `Qwen3_5ForCausalLM` ignores them.
    Qwen3_5Text,
    /// `qwen3_5_moe_text`: Qwen3.5's prefix and Qwen2-MoE's per-expert weights.
    Qwen3_5MoeText,
    /// gpt-oss's MXFP4 experts (`quantization_config` `mxfp4`): `….gate_up_proj_blocks`
    /// `[experts, out, in / 32, 16]` (two FP4 codes a byte) and `….gate_up_proj_scales`
    /// `[experts, out, in / 32]` (E8M0 exponents) dequantised into `….gate_up_proj`
    /// `[experts, in, out]`, as upstream's `Mxfp4Dequantize` (its kernels absent). Saved back
    /// in full precision under the parameters' own names (upstream writes the dequantised
    /// tensors under the `_blocks` names, which its own loader then reports unexpected).
    Mxfp4,
}

/// Upstream's `FP4_VALUES`: the E2M1 code → value table.
const FP4_VALUES: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Upstream `_convert_moe_packed_tensors`: the codes looked up (low nibble first), scaled by
/// `2^(scale - 127)` (`torch.ldexp`), the blocks flattened and the last two dimensions
/// swapped, in float32 (exact: every value is a 3-bit-mantissa float times a power of two).
pub fn dequantize_mxfp4(blocks: &Tensor, scales: &Tensor) -> Result<Tensor> {
    let shape = blocks.size();
    if shape.len() < 3 || scales.size() != shape[..shape.len() - 1] {
        return Err(Error::InvalidArgument {
            field: "checkpoint",
            detail: format!(
                "MXFP4 blocks {:?} and scales {:?}: the scales must be the blocks' shape without its last dimension",
                shape,
                scales.size()
            ),
        });
    }
    let b = shape[shape.len() - 1];
    let g = shape[shape.len() - 2];
    let prefix = &shape[..shape.len() - 2];
    let rows: i64 = prefix.iter().product::<i64>() * g;
    let device = blocks.device();
    let lut = Tensor::from_slice(&FP4_VALUES).to_device(device);
    let blk = blocks.f_to_kind(Kind::Uint8)?.f_reshape([rows, b])?;
    let exp = (scales.f_to_kind(Kind::Int)? - 127).f_reshape([rows, 1])?;
    let lo = lut.f_index_select(
        0,
        &blk.f_bitwise_and(0x0F)?
            .f_to_kind(Kind::Int64)?
            .f_reshape([-1])?,
    )?;
    let hi = lut.f_index_select(
        0,
        &blk.f_bitwise_right_shift_tensor_scalar(4)?
            .f_to_kind(Kind::Int64)?
            .f_reshape([-1])?,
    )?;
    // Interleaved: `out[:, 0::2] = lut[lo]`, `out[:, 1::2] = lut[hi]`.
    let out = Tensor::f_stack(&[lo.f_reshape([rows, b])?, hi.f_reshape([rows, b])?], -1)?
        .f_reshape([rows, 2 * b])?;
    let out = out.f_ldexp(&exp)?;
    let mut full = prefix.to_vec();
    full.push(g * b * 2);
    Ok(out.f_reshape(full)?.f_transpose(1, 2)?.f_contiguous()?)
}

/// Qwen3.5's language-model prefix, (on disk, in the model).
const QWEN3_5_PREFIX: (&str, &str) = ("model.language_model.", "model.");

/// The Llava layout's prefixes, (on disk, in the model); the first matching rule applies.
const LLAVA_PREFIXES: [(&str, &str); 5] = [
    ("language_model.lm_head.", "lm_head."),
    ("language_model.model.", "model.language_model."),
    ("vision_tower.vision_model.", "model.vision_tower."),
    ("vision_tower.", "model.vision_tower."),
    ("multi_modal_projector.", "model.multi_modal_projector."),
];

/// One expert projection's place in a per-expert key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Part {
    Gate,
    Up,
    Down,
}

impl WeightConversion {
    /// The conversion a model made from scratch saves through: upstream drops the prefix
    /// changes (it cannot know whether a checkpoint had the prefix).
    pub fn fresh(self) -> Option<Self> {
        match self {
            Self::Qwen3_5Text => None,
            Self::Qwen3_5MoeText => Some(Self::Qwen2Moe),
            Self::Mxfp4 => None,
            other => Some(other),
        }
    }

    /// The conversion that applies to a checkpoint with these keys, kept for saving it
    /// back: the prefix change only where a key has the prefix (upstream keeps the
    /// conversions that matched a key).
    pub fn used_by(self, tensors: &[(String, Tensor)]) -> Option<Self> {
        let prefixed = || tensors.iter().any(|(k, _)| k.starts_with(QWEN3_5_PREFIX.0));
        match self {
            Self::Qwen3_5Text | Self::Qwen3_5MoeText if !prefixed() => self.fresh(),
            Self::Mxfp4 => None,
            other => Some(other),
        }
    }

    /// A checkpoint key's name in the model, for the layouts that only rename (the others'
    /// keys as they are).
    pub fn rename(self, key: &str) -> String {
        match self {
            Self::Llava => LLAVA_PREFIXES
                .iter()
                .find_map(|(disk, model)| {
                    key.strip_prefix(disk).map(|rest| format!("{model}{rest}"))
                })
                .unwrap_or_else(|| key.to_string()),
            Self::Qwen3_5Text | Self::Qwen3_5MoeText => match key.strip_prefix(QWEN3_5_PREFIX.0) {
                Some(rest) => format!("{}{rest}", QWEN3_5_PREFIX.1),
                None => key.to_string(),
            },
            Self::Qwen2Moe | Self::Mixtral | Self::Mxfp4 => key.to_string(),
        }
    }

    /// A model name's key on disk, as upstream's `save_pretrained` writes it.
    fn unrename(self, key: &str) -> String {
        match self {
            // `vision_tower.vision_model.` is read, `vision_tower.` written (upstream's).
            Self::Llava => LLAVA_PREFIXES
                .iter()
                .filter(|(disk, _)| *disk != "vision_tower.vision_model.")
                .find_map(|(disk, model)| {
                    key.strip_prefix(model).map(|rest| format!("{disk}{rest}"))
                })
                .unwrap_or_else(|| key.to_string()),
            Self::Qwen3_5Text | Self::Qwen3_5MoeText => match key.strip_prefix(QWEN3_5_PREFIX.1) {
                Some(rest) if !key.starts_with(QWEN3_5_PREFIX.0) => {
                    format!("{}{rest}", QWEN3_5_PREFIX.0)
                }
                _ => key.to_string(),
            },
            Self::Qwen2Moe | Self::Mixtral | Self::Mxfp4 => key.to_string(),
        }
    }

    /// The checkpoint keys the model ignores on load (upstream's
    /// `_keys_to_ignore_on_load_unexpected`).
    fn ignored(self, key: &str) -> bool {
        matches!(self, Self::Qwen3_5Text | Self::Qwen3_5MoeText)
            && (key.starts_with("mtp.") || key.starts_with("model.visual."))
    }

    /// The per-expert names of gate, up and down.
    fn names(self) -> [&'static str; 3] {
        match self {
            Self::Qwen2Moe
            | Self::Llava
            | Self::Qwen3_5Text
            | Self::Qwen3_5MoeText
            | Self::Mxfp4 => ["gate_proj", "up_proj", "down_proj"],
            Self::Mixtral => ["w1", "w3", "w2"],
        }
    }

    /// `(…experts, j, part)` of a per-expert key (after Mixtral's renaming).
    fn split(self, key: &str) -> Option<(String, usize, Part)> {
        let rest = key.strip_suffix(".weight")?;
        let (head, name) = rest.rsplit_once('.')?;
        let part = match self.names().iter().position(|n| *n == name)? {
            0 => Part::Gate,
            1 => Part::Up,
            _ => Part::Down,
        };
        let (experts, j) = head.rsplit_once('.')?;
        if !experts.ends_with("experts") {
            return None;
        }
        Some((experts.to_string(), j.parse().ok()?, part))
    }

    /// Checkpoint names and tensors → the model's: each layer's experts stacked, gate and up
    /// concatenated (`MergeModulelist(dim=0)`, `Concatenate(dim=1)`).
    pub fn convert(self, tensors: Vec<(String, Tensor)>) -> Result<Vec<(String, Tensor)>> {
        if self == Self::Mxfp4 {
            return convert_mxfp4(tensors);
        }
        if matches!(self, Self::Llava | Self::Qwen3_5Text | Self::Qwen3_5MoeText) {
            let renamed = tensors
                .into_iter()
                .filter(|(k, _)| !self.ignored(k))
                .map(|(k, t)| (self.rename(&k), t))
                .collect();
            if self != Self::Qwen3_5MoeText {
                return Ok(renamed);
            }
            return Self::Qwen2Moe.convert(renamed);
        }
        let mut out = Vec::with_capacity(tensors.len());
        let mut experts: BTreeMap<String, BTreeMap<(Part, usize), Tensor>> = BTreeMap::new();
        for (key, t) in tensors {
            let key = match self {
                Self::Mixtral => key.replace(".block_sparse_moe.", ".mlp."),
                _ => key,
            };
            match self.split(&key) {
                Some((prefix, j, part)) => {
                    experts.entry(prefix).or_default().insert((part, j), t);
                }
                None => out.push((key, t)),
            }
        }
        for (prefix, mut parts) in experts {
            let count = parts.keys().map(|(_, j)| j + 1).max().unwrap_or(0);
            let mut take = |part: Part| -> Result<Vec<Tensor>> {
                (0..count)
                    .map(|j| {
                        parts.remove(&(part, j)).ok_or_else(|| Error::InvalidArgument {
                            field: "checkpoint",
                            detail: format!(
                                "{prefix}.{j}.{}.weight is missing while other experts of the layer are there: the checkpoint is incomplete",
                                self.names()[part as usize]
                            ),
                        })
                    })
                    .collect()
            };
            let gate = Tensor::f_stack(&take(Part::Gate)?, 0)?;
            let up = Tensor::f_stack(&take(Part::Up)?, 0)?;
            let down = Tensor::f_stack(&take(Part::Down)?, 0)?;
            out.push((
                format!("{prefix}.gate_up_proj"),
                Tensor::f_cat(&[gate, up], 1)?,
            ));
            out.push((format!("{prefix}.down_proj"), down));
        }
        Ok(out)
    }

    /// The model's names and tensors → the checkpoint's (upstream's reverse conversion in
    /// `save_pretrained`).
    pub fn revert(self, tensors: Vec<(String, Tensor)>) -> Result<Vec<(String, Tensor)>> {
        if self == Self::Mxfp4 {
            return Ok(tensors);
        }
        if matches!(self, Self::Llava | Self::Qwen3_5Text | Self::Qwen3_5MoeText) {
            let tensors = match self {
                Self::Qwen3_5MoeText => Self::Qwen2Moe.revert(tensors)?,
                _ => tensors,
            };
            return Ok(tensors
                .into_iter()
                .map(|(k, t)| (self.unrename(&k), t))
                .collect());
        }
        let [gate_name, up_name, down_name] = self.names();
        let mut out = Vec::with_capacity(tensors.len());
        for (key, t) in tensors {
            if let Some(prefix) = key.strip_suffix(".experts.gate_up_proj") {
                let half = t.size()[1] / 2;
                for j in 0..t.size()[0] {
                    let e = t.f_select(0, j)?;
                    out.push((
                        format!("{prefix}.experts.{j}.{gate_name}.weight"),
                        e.f_narrow(0, 0, half)?,
                    ));
                    out.push((
                        format!("{prefix}.experts.{j}.{up_name}.weight"),
                        e.f_narrow(0, half, half)?,
                    ));
                }
            } else if let Some(prefix) = key.strip_suffix(".experts.down_proj") {
                for j in 0..t.size()[0] {
                    out.push((
                        format!("{prefix}.experts.{j}.{down_name}.weight"),
                        t.f_select(0, j)?,
                    ));
                }
            } else {
                out.push((key, t));
            }
        }
        Ok(match self {
            Self::Mixtral => out
                .into_iter()
                .map(|(k, t)| (k.replace(".mlp.", ".block_sparse_moe."), t))
                .collect(),
            _ => out,
        })
    }
}

/// [`WeightConversion::Mxfp4`]'s load: each `X_blocks` / `X_scales` pair dequantised into `X`.
fn convert_mxfp4(tensors: Vec<(String, Tensor)>) -> Result<Vec<(String, Tensor)>> {
    let mut out = Vec::with_capacity(tensors.len());
    let mut pairs: BTreeMap<String, (Option<Tensor>, Option<Tensor>)> = BTreeMap::new();
    for (key, t) in tensors {
        if let Some(base) = key.strip_suffix("_blocks") {
            pairs.entry(base.to_string()).or_default().0 = Some(t);
        } else if let Some(base) = key.strip_suffix("_scales") {
            pairs.entry(base.to_string()).or_default().1 = Some(t);
        } else {
            out.push((key, t));
        }
    }
    for (base, pair) in pairs {
        match pair {
            (Some(blocks), Some(scales)) => out.push((base, dequantize_mxfp4(&blocks, &scales)?)),
            (blocks, _) => {
                return Err(Error::InvalidArgument {
                    field: "checkpoint",
                    detail: format!(
                        "{base}_{} is missing: an MXFP4 weight needs its blocks and its scales",
                        if blocks.is_some() { "scales" } else { "blocks" }
                    ),
                });
            }
        }
    }
    Ok(out)
}

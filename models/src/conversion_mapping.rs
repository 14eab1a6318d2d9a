//! Upstream `conversion_mapping.py`: the families whose checkpoints on disk name their
//! weights otherwise than their modules do. transformers 5 holds a mixture of experts'
//! weights fused (`experts.gate_up_proj` `[experts, 2 · inter, hidden]`, `experts.down_proj`
//! `[experts, hidden, inter]`) but reads and writes checkpoints per expert, as the released
//! ones are: `from_pretrained` fuses them ([`WeightConversion::convert`]) and `save_pretrained`
//! splits them back ([`WeightConversion::revert`]). Fused keys load as they are.

use std::collections::BTreeMap;

use tch::Tensor;

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
            Self::Qwen2Moe | Self::Mixtral => key.to_string(),
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
            Self::Qwen2Moe | Self::Mixtral => key.to_string(),
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
            Self::Qwen2Moe | Self::Llava | Self::Qwen3_5Text | Self::Qwen3_5MoeText => {
                ["gate_proj", "up_proj", "down_proj"]
            }
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

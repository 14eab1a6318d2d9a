//! What every model config shares (upstream `PretrainedConfig`): labels, problem type,
//! special token ids, and reading / writing `config.json`.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::{Error, Result};

/// The transformers version written into `config.json` (the format we follow).
pub const TRANSFORMERS_VERSION: &str = "5.23.0";

/// A model config that can be written as `config.json`.
pub trait PretrainedConfig: std::fmt::Debug + Send + Sync {
    /// Upstream `model_type` (`"gpt2"`, `"bert"`, `"llama"`).
    fn model_type(&self) -> &'static str;
    /// The config as the JSON object upstream's `to_dict()` would write.
    fn to_json_value(&self) -> Result<serde_json::Value>;
    /// The label fields.
    fn labels(&self) -> &LabelConfig;
    /// Upstream `num_labels` (length of `id2label`, 2 when absent).
    fn num_labels(&self) -> i64 {
        self.labels().num_labels()
    }
}

/// The label part of upstream's `PretrainedConfig`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct LabelConfig {
    /// Index → label name (JSON object keys are strings, as upstream writes them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id2label: Option<BTreeMap<String, String>>,
    /// Label name → index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label2id: Option<BTreeMap<String, i64>>,
    /// `regression`, `single_label_classification` or `multi_label_classification`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem_type: Option<String>,
}

impl LabelConfig {
    /// Upstream `num_labels`.
    pub fn num_labels(&self) -> i64 {
        self.id2label.as_ref().map(|m| m.len() as i64).unwrap_or(2)
    }

    /// Upstream's `num_labels` setter: `LABEL_0 .. LABEL_{n-1}`, unless the existing
    /// mapping already has `n` labels.
    pub fn set_num_labels(&mut self, n: i64) -> Result<()> {
        if n < 1 {
            return Err(Error::InvalidConfig {
                field: "num_labels",
                value: n.to_string(),
                fix: "use at least 1 label",
            });
        }
        if self.num_labels() == n && self.id2label.is_some() {
            return Ok(());
        }
        let id2label: BTreeMap<String, String> = (0..n)
            .map(|i| (i.to_string(), format!("LABEL_{i}")))
            .collect();
        self.label2id = Some(
            id2label
                .iter()
                .map(|(k, v)| (v.clone(), k.parse().unwrap_or(0)))
                .collect(),
        );
        self.id2label = Some(id2label);
        Ok(())
    }

    /// The parsed problem type, if set.
    pub fn problem_type(&self) -> Result<Option<tchtrain_losses::ProblemType>> {
        use tchtrain_losses::ProblemType;
        match self.problem_type.as_deref() {
            None => Ok(None),
            Some("regression") => Ok(Some(ProblemType::Regression)),
            Some("single_label_classification") => Ok(Some(ProblemType::SingleLabelClassification)),
            Some("multi_label_classification") => Ok(Some(ProblemType::MultiLabelClassification)),
            Some(other) => Err(Error::InvalidConfig {
                field: "problem_type",
                value: other.to_string(),
                fix: "use regression, single_label_classification or multi_label_classification",
            }),
        }
    }
}

/// Reads a config struct from a `config.json` file, naming the file on error.
pub fn read_config<C: DeserializeOwned>(path: &Path) -> Result<C> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| Error::ConfigJson {
        path: path.to_path_buf(),
        source,
    })
}

/// Checks that the sizes a model's tensors are made of are positive (and layer counts not
/// negative), naming the first bad field: libtorch refuses negative dimensions with a panic
/// deep inside variable creation, so `validate` refuses them first.
/// `pad_token_id` as an embedding's `padding_idx`: inside `[-vocab_size, vocab_size)`, as
/// upstream's `nn.Embedding` asserts (`None` is no padding row).
pub(crate) fn check_padding_idx(pad_token_id: Option<i64>, vocab_size: i64) -> Result<()> {
    match pad_token_id {
        Some(pad) if !(-vocab_size..vocab_size).contains(&pad) => Err(Error::InvalidConfig {
            field: "pad_token_id",
            value: format!("{pad} (vocab_size {vocab_size})"),
            fix: "use a token id inside the vocabulary, or null",
        }),
        _ => Ok(()),
    }
}

pub(crate) fn check_sizes(
    sizes: &[(&'static str, i64)],
    layers: (&'static str, i64),
) -> Result<()> {
    if let Some(&(field, value)) = sizes.iter().find(|(_, v)| *v <= 0) {
        return Err(Error::InvalidConfig {
            field,
            value: value.to_string(),
            fix: "model sizes must be positive: fix config.json",
        });
    }
    if layers.1 < 0 {
        return Err(Error::InvalidConfig {
            field: layers.0,
            value: layers.1.to_string(),
            fix: "the number of layers cannot be negative: fix config.json",
        });
    }
    Ok(())
}

/// The `model_type` of a `config.json`, to pick the architecture.
pub fn read_model_type(path: &Path) -> Result<String> {
    #[derive(Deserialize)]
    struct Head {
        model_type: Option<String>,
    }
    let head: Head = read_config(path)?;
    head.model_type.ok_or_else(|| Error::InvalidConfig {
        field: "model_type",
        value: format!("missing in {}", path.display()),
        fix: "add \"model_type\" (gpt2, bert or llama) to config.json",
    })
}

/// Serialises a config struct to a JSON value, for [`PretrainedConfig::to_json_value`].
pub(crate) fn to_value<C: Serialize>(config: &C) -> Result<serde_json::Value> {
    serde_json::to_value(config).map_err(|source| Error::ConfigJson {
        path: "config.json".into(),
        source,
    })
}

/// The config's `use_cache` (upstream's default `true` when the key is absent).
pub(crate) fn use_cache(extra: &serde_json::Map<String, serde_json::Value>) -> bool {
    extra
        .get("use_cache")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(true)
}

/// Whether upstream's plain forward builds a cache: the config's `use_cache`, turned off in a
/// training forward with gradient checkpointing (`merge_with_config_defaults`). With a cache,
/// upstream does not look for packed rows.
pub(crate) fn forward_builds_cache(
    extra: &serde_json::Map<String, serde_json::Value>,
    train: bool,
    checkpointing: bool,
) -> bool {
    use_cache(extra) && !(train && checkpointing)
}

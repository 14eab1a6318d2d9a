//! The `configs:` field of a dataset card's YAML front matter (`datasets/utils/metadata.py`,
//! `MetadataConfigs`): each configuration's name, `data_files` (a pattern, a list of
//! patterns, or a list of `{split, path}` entries), `data_dir` and `default` flag.
//!
//! Only that field is read (with [`crate::yaml`]'s small reader); the rest of the card
//! (`dataset_info`, `features`, ...) is never parsed, so nothing there can fail a load.
//! Input it cannot read is an error naming the card.

use crate::data_files::{SplitPatterns, is_valid_split_name};
use crate::yaml::{Yaml, front_matter, parse_block, top_level_block};
use crate::{Error, Result};

/// One entry of `configs:`.
#[derive(Debug, Clone, PartialEq)]
pub struct MetadataConfig {
    /// `config_name`.
    pub config_name: String,
    /// `data_files`, sanitized to split → patterns (`sanitize_patterns`); `None` when absent.
    pub data_files: Option<SplitPatterns>,
    /// `data_dir`: the folder the patterns are relative to.
    pub data_dir: Option<String>,
    /// `default: true`.
    pub default: bool,
    /// The other keys (loader arguments such as `sep`), with their scalar values.
    pub params: Vec<(String, String)>,
}

/// The configurations a card declares, in order (`MetadataConfigs`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MetadataConfigs(pub Vec<MetadataConfig>);

impl MetadataConfigs {
    /// The `configs:` of a dataset card (`README.md`): its YAML front matter between `---`
    /// lines. No front matter or no `configs:` gives no configurations.
    pub fn from_readme(text: &str, card: &str) -> Result<Self> {
        match front_matter(text) {
            Some(yaml) => Self::from_yaml_text(yaml, card),
            None => Ok(Self::default()),
        }
    }

    /// The `configs:` of a YAML document (the front matter, or `.huggingface.yaml`).
    pub fn from_yaml_text(yaml: &str, card: &str) -> Result<Self> {
        let fail = |detail: String| Error::InvalidMetadata {
            card: card.into(),
            detail,
        };
        let Some(block) = top_level_block(yaml, "configs") else {
            return Ok(Self::default());
        };
        let value = parse_block(&block).map_err(fail)?;
        Self::from_value(&value).map_err(fail)
    }

    /// `MetadataConfigs.from_dataset_card_data`, with `_raise_if_data_files_field_not_valid`.
    fn from_value(value: &Yaml) -> std::result::Result<Self, String> {
        let items = match value {
            Yaml::Null => return Ok(Self::default()),
            Yaml::Seq(items) => items,
            other => {
                return Err(format!(
                    "Expected configs to be a list, but got '{}'",
                    other.repr()
                ));
            }
        };
        let mut configs = Vec::new();
        for item in items {
            let (Yaml::Map(entries), Some(Yaml::Str(name))) = (item, item.get("config_name"))
            else {
                return Err(format!(
                    "Each config must include `config_name` field with a string name of a config, but got {}. ",
                    item.repr()
                ));
            };
            let mut config = MetadataConfig {
                config_name: name.clone(),
                data_files: None,
                data_dir: None,
                default: false,
                params: Vec::new(),
            };
            for (key, v) in entries {
                match key.as_str() {
                    "config_name" => {}
                    "data_files" => config.data_files = sanitize_yaml_data_files(v)?,
                    "data_dir" => match v {
                        Yaml::Str(s) => config.data_dir = Some(s.clone()),
                        Yaml::Null => {}
                        other => {
                            return Err(format!(
                                "`data_dir` must be a string, got {}",
                                other.repr()
                            ));
                        }
                    },
                    "default" => config.default = v.is_truthy(),
                    _ => config.params.push((
                        key.clone(),
                        match v {
                            Yaml::Str(s) => s.clone(),
                            other => other.repr(),
                        },
                    )),
                }
            }
            configs.push(config);
        }
        Ok(Self(configs))
    }

    /// Whether there is no configuration.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The names, in order.
    pub fn names(&self) -> Vec<String> {
        self.0.iter().map(|c| c.config_name.clone()).collect()
    }

    /// `get_default_config_name`: the only configuration, else the one named `default` or
    /// marked `default: true`; two such are an error.
    pub fn get_default_config_name(&self) -> Result<Option<&str>> {
        let mut found: Option<&str> = None;
        for c in &self.0 {
            if self.0.len() == 1 || c.config_name == "default" || c.default {
                match found {
                    None => found = Some(&c.config_name),
                    Some(first) => {
                        return Err(Error::InvalidMetadata {
                            card: String::new(),
                            detail: format!(
                                "Dataset has several default configs: '{first}' and '{}'.",
                                c.config_name
                            ),
                        });
                    }
                }
            }
        }
        Ok(found)
    }
}

/// `_raise_if_data_files_field_not_valid` then `sanitize_patterns` for a card's `data_files`.
fn sanitize_yaml_data_files(v: &Yaml) -> std::result::Result<Option<SplitPatterns>, String> {
    let invalid = || {
        format!(
            "Expected data_files in YAML to be either a string or a list of strings or a list of dicts with two keys: 'split' and 'path', but got {}",
            v.repr()
        )
    };
    let path_list = |p: &Yaml| -> Option<Vec<String>> {
        match p {
            Yaml::Str(s) => Some(vec![s.clone()]),
            Yaml::Seq(items) => items
                .iter()
                .map(|i| match i {
                    Yaml::Str(s) => Some(s.clone()),
                    _ => None,
                })
                .collect(),
            _ => None,
        }
    };
    match v {
        Yaml::Null => Ok(None),
        Yaml::Str(s) => Ok(Some(vec![("train".into(), vec![s.clone()])])),
        Yaml::Seq(items) if items.iter().any(|i| matches!(i, Yaml::Map(_))) => {
            let mut out: SplitPatterns = Vec::new();
            for item in items {
                let (Yaml::Map(entries), Some(Yaml::Str(split)), Some(paths)) = (
                    item,
                    item.get("split"),
                    item.get("path").and_then(path_list),
                ) else {
                    return Err(invalid());
                };
                if entries.len() != 2 || !is_valid_split_name(split) {
                    return Err(invalid());
                }
                if out.iter().any(|(s, _)| s == split) {
                    let splits: Vec<String> = items
                        .iter()
                        .filter_map(|i| i.get("split").map(Yaml::repr))
                        .collect();
                    return Err(format!(
                        "Some splits are duplicated in data_files: [{}]",
                        splits.join(", ")
                    ));
                }
                out.push((split.clone(), paths));
            }
            Ok(Some(out))
        }
        Yaml::Seq(_) => path_list(v)
            .map(|p| Some(vec![("train".into(), p)]))
            .ok_or_else(invalid),
        _ => Err(invalid()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CARD: &str = "---
license: mit
dataset_info:
  features:
  - name: text
    dtype: string
configs:
- config_name: plain   # a comment
  data_files:
  - split: train
    path: \"data/plain/train-*.parquet\"
  - split: test
    path:
    - data/plain/test-a.parquet
    - 'data/plain/test-b.parquet'
  default: true
- config_name: other
  data_files: other/*.csv
  sep: ;
- config_name: listed
  data_files: [a.jsonl, \"b.jsonl\"]
  data_dir: sub
task_categories:
- text-classification
---
# Title

configs: not this one
";

    #[test]
    fn reads_the_configs_of_a_card() {
        let c = MetadataConfigs::from_readme(CARD, "README.md").unwrap();
        assert_eq!(c.names(), ["plain", "other", "listed"]);
        let plain = &c.0[0];
        assert!(plain.default);
        assert_eq!(
            plain.data_files.as_ref().unwrap(),
            &vec![
                (
                    "train".to_string(),
                    vec!["data/plain/train-*.parquet".to_string()]
                ),
                (
                    "test".to_string(),
                    vec![
                        "data/plain/test-a.parquet".to_string(),
                        "data/plain/test-b.parquet".to_string()
                    ]
                ),
            ]
        );
        assert_eq!(
            c.0[1].data_files.as_ref().unwrap(),
            &vec![("train".to_string(), vec!["other/*.csv".to_string()])]
        );
        assert_eq!(c.0[1].params, vec![("sep".to_string(), ";".to_string())]);
        assert_eq!(c.0[2].data_dir.as_deref(), Some("sub"));
        assert_eq!(
            c.0[2].data_files.as_ref().unwrap()[0].1,
            ["a.jsonl", "b.jsonl"]
        );
        assert_eq!(c.get_default_config_name().unwrap(), Some("plain"));
    }

    #[test]
    fn indented_sequences_and_no_configs() {
        let card = "---\nconfigs:\n  - config_name: default\n    data_files:\n      - split: train\n        path: x.csv\n---\n";
        let c = MetadataConfigs::from_readme(card, "README.md").unwrap();
        assert_eq!(
            c.0[0].data_files.as_ref().unwrap()[0],
            ("train".to_string(), vec!["x.csv".to_string()])
        );
        assert!(
            MetadataConfigs::from_readme("# no front matter\n", "README.md")
                .unwrap()
                .is_empty()
        );
        assert!(
            MetadataConfigs::from_readme("---\nlicense: mit\n---\n", "README.md")
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn bad_cards_are_errors_not_panics() {
        for card in [
            "---\nconfigs: 3\n---\n",
            "---\nconfigs:\n- data_files: x.csv\n---\n",
            "---\nconfigs:\n- config_name: a\n  data_files:\n  - split: bad-name\n    path: x\n---\n",
            "---\nconfigs:\n- config_name: a\n  data_files:\n  - split: t\n    path: x\n  - split: t\n    path: y\n---\n",
            "---\nconfigs:\n- config_name: a\n  data_files: {train: x}\n---\n",
            "---\nconfigs:\n- config_name: \"a\n---\n",
            "---\nconfigs:\n- config_name: a\n   weird: 1\n---\n",
            "---\nconfigs:\n- config_name: &x a\n---\n",
            "---\nconfigs:\n- config_name: a\n  data_files: [x, \n---\n",
            "---\nconfigs:\n- - a\n---\n",
        ] {
            let err = MetadataConfigs::from_readme(card, "README.md");
            assert!(err.is_err(), "{card:?} gave {err:?}");
        }
        let two = "---\nconfigs:\n- config_name: a\n  default: true\n- config_name: default\n---\n";
        let c = MetadataConfigs::from_readme(two, "README.md").unwrap();
        let err = c.get_default_config_name().unwrap_err().to_string();
        assert!(
            err.contains("several default configs: 'a' and 'default'"),
            "{err}"
        );
    }
}

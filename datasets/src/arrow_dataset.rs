//! The folders `datasets`' `save_to_disk` writes, read back as `load_from_disk` does.
//!
//! A `Dataset` folder holds `state.json` (its `_data_files` list the shards in order),
//! `dataset_info.json` (features, description) and the shards `data-0000K-of-0000N.arrow`
//! (Arrow IPC streams); a `DatasetDict` folder holds `dataset_dict.json` (`{"splits": [...]}`)
//! and one `Dataset` folder per split. Mirrors `datasets.load_from_disk`,
//! `Dataset.load_from_disk` and `DatasetDict.load_from_disk`.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};
use crate::table::Table;

const STATE: &str = "state.json";
const INFO: &str = "dataset_info.json";
const DICT: &str = "dataset_dict.json";

/// What [`load_from_disk`] found: one dataset or a dict of splits (upstream returns a
/// `Dataset` or a `DatasetDict`).
#[derive(Debug, Clone, PartialEq)]
pub enum LoadedDataset {
    /// A `Dataset.save_to_disk` folder.
    Dataset(Table),
    /// A `DatasetDict.save_to_disk` folder.
    DatasetDict(DatasetDict),
}

/// Named splits (`train`, `validation`, ...), in the order `dataset_dict.json` lists them
/// (upstream's `DatasetDict`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DatasetDict {
    path: PathBuf,
    splits: Vec<(String, Table)>,
}

/// Reads a folder written by `Dataset.save_to_disk` or `DatasetDict.save_to_disk`
/// (`datasets.load_from_disk`): a folder with `dataset_info.json` and `state.json` is a
/// `Dataset`, one with `dataset_dict.json` a `DatasetDict`; anything else is
/// [`Error::InvalidSavedDataset`].
///
/// ```no_run
/// use tchtrain_datasets::{LoadedDataset, load_from_disk};
/// match load_from_disk("saved/")? {
///     LoadedDataset::Dataset(table) => println!("{} rows", table.len()),
///     LoadedDataset::DatasetDict(dict) => {
///         let train = dict.get("train")?;
///         println!("{} training rows of {:?}", train.len(), train.columns());
///     }
/// }
/// # Ok::<(), tchtrain_datasets::Error>(())
/// ```
pub fn load_from_disk(path: impl AsRef<Path>) -> Result<LoadedDataset> {
    let path = path.as_ref();
    if path.join(INFO).is_file() && path.join(STATE).is_file() {
        Ok(LoadedDataset::Dataset(load_dataset_folder(path)?))
    } else if path.join(DICT).is_file() {
        Ok(LoadedDataset::DatasetDict(DatasetDict::load_from_disk(
            path,
        )?))
    } else if !path.is_dir() {
        Err(Error::io(
            "reading the saved dataset",
            path,
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such folder"),
        ))
    } else {
        Err(Error::InvalidSavedDataset {
            path: path.to_path_buf(),
            detail: format!(
                "the folder is neither a `Dataset` folder ({INFO} and {STATE}) nor a \
                 `DatasetDict` folder ({DICT}); write it with save_to_disk"
            ),
        })
    }
}

impl LoadedDataset {
    /// The `Dataset`, or [`Error::InvalidSavedDataset`] naming the folder as a `DatasetDict`.
    pub fn into_dataset(self) -> Result<Table> {
        match self {
            Self::Dataset(t) => Ok(t),
            Self::DatasetDict(d) => Err(Error::InvalidSavedDataset {
                detail: format!(
                    "a `DatasetDict` (splits {}), not a `Dataset`: pick a split with \
                     `DatasetDict::get`",
                    d.split_names().join(", ")
                ),
                path: d.path,
            }),
        }
    }

    /// The `DatasetDict`, or [`Error::InvalidSavedDataset`] naming the folder as a `Dataset`.
    pub fn into_dataset_dict(self) -> Result<DatasetDict> {
        match self {
            Self::DatasetDict(d) => Ok(d),
            Self::Dataset(t) => Err(Error::InvalidSavedDataset {
                path: t.path().to_path_buf(),
                detail: "a `Dataset`, not a `DatasetDict`".into(),
            }),
        }
    }
}

impl DatasetDict {
    /// Splits from `(name, table)` pairs, in that order; `path` names the dict in errors.
    pub fn new(path: impl AsRef<Path>, splits: Vec<(String, Table)>) -> Self {
        Self {
            path: path.as_ref().to_path_buf(),
            splits,
        }
    }

    /// Reads a `DatasetDict.save_to_disk` folder: `dataset_dict.json`'s `splits`, each the
    /// sub-folder of that name (`DatasetDict.load_from_disk`).
    pub fn load_from_disk(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let dict_json = path.join(DICT);
        if !dict_json.is_file() && path.join(STATE).is_file() {
            return Err(Error::InvalidSavedDataset {
                path: path.to_path_buf(),
                detail: format!(
                    "no {DICT}: this is a `Dataset` folder, not a `DatasetDict` folder; read it \
                     with load_from_disk or Table::load_from_disk"
                ),
            });
        }
        let dict = read_json(&dict_json)?;
        let bad = |detail: &str| Error::InvalidSavedDataset {
            path: dict_json.clone(),
            detail: detail.to_string(),
        };
        let names = dict
            .get("splits")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no \"splits\" list"))?;
        let mut splits = Vec::with_capacity(names.len());
        for name in names {
            let name = name
                .as_str()
                .ok_or_else(|| bad("a split name that is not a string"))?;
            splits.push((name.to_string(), load_dataset_folder(&path.join(name))?));
        }
        Ok(Self::new(path, splits))
    }

    /// The folder (or name) it came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The split names, in order (upstream's `keys()`).
    pub fn split_names(&self) -> Vec<&str> {
        self.splits.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// The split `name`, or [`Error::MissingSplit`].
    pub fn get(&self, name: &str) -> Result<&Table> {
        self.splits
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
            .ok_or_else(|| Error::MissingSplit {
                split: name.to_string(),
                path: self.path.clone(),
                available: self.split_names().join(", "),
            })
    }

    /// The splits, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Table)> {
        self.splits.iter().map(|(n, t)| (n.as_str(), t))
    }

    /// The splits, in order, by value.
    pub fn into_splits(self) -> Vec<(String, Table)> {
        self.splits
    }

    /// The number of splits.
    pub fn len(&self) -> usize {
        self.splits.len()
    }

    /// Whether there are no splits.
    pub fn is_empty(&self) -> bool {
        self.splits.is_empty()
    }
}

/// `Dataset.load_from_disk`: the shards `state.json` lists, read in that order into one
/// table. Shards must agree on their columns.
pub(crate) fn load_dataset_folder(path: &Path) -> Result<Table> {
    for name in [INFO, STATE] {
        if !path.join(name).is_file() {
            let what = if path.join(DICT).is_file() {
                "this is a `DatasetDict` folder: use load_from_disk or DatasetDict::load_from_disk"
            } else {
                "it is not a `Dataset` folder written by save_to_disk"
            };
            return Err(Error::InvalidSavedDataset {
                path: path.to_path_buf(),
                detail: format!("no {name}: {what}"),
            });
        }
    }
    let state_json = path.join(STATE);
    let state = read_json(&state_json)?;
    let files = state
        .get("_data_files")
        .and_then(Value::as_array)
        .ok_or_else(|| Error::InvalidSavedDataset {
            path: state_json.clone(),
            detail: "no \"_data_files\" list".into(),
        })?;
    let mut columns: Option<Vec<String>> = None;
    let mut rows = Vec::new();
    for file in files {
        let name = file
            .get("filename")
            .and_then(Value::as_str)
            .ok_or_else(|| Error::InvalidSavedDataset {
                path: state_json.clone(),
                detail: format!("a data file entry without a \"filename\": {file}"),
            })?;
        let shard = Table::read_arrow(path.join(name))?;
        match &columns {
            None => columns = Some(shard.columns().to_vec()),
            Some(c) if c.as_slice() != shard.columns() => {
                return Err(Error::InvalidSavedDataset {
                    path: path.join(name),
                    detail: format!(
                        "its columns [{}] differ from the first shard's [{}]",
                        shard.columns().join(", "),
                        c.join(", ")
                    ),
                });
            }
            Some(_) => {}
        }
        rows.extend(shard.into_rows());
    }
    Ok(Table::from_parts(
        path.to_path_buf(),
        columns.unwrap_or_default(),
        rows,
    ))
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io("reading", path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::DataFile {
        path: path.to_path_buf(),
        line: e.line(),
        detail: e.to_string(),
    })
}

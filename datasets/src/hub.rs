//! `load_dataset(path, name, revision=...)` up to its data files, as `datasets/load.py` (5.2)
//! settles them before reading: a local folder, or a hub dataset repository whose files come
//! through the hub cache (`tchtrain-hub`: `HF_HUB_CACHE`, the `datasets--org--name` layout
//! Python shares, `HF_HUB_OFFLINE` / `HF_DATASETS_OFFLINE` answered from the cache).
//!
//! The configuration comes from the card's `configs:` (README.md YAML or `.huggingface.yaml`),
//! else the default split patterns over the files; the loader from the files' extensions.
//! Where upstream 5.2 stops — a repository that is a loading script, or one without data
//! files — this goes on to the hub's Parquet export (branch `refs/convert/parquet`,
//! `{config}/{split}/NNNN.parquet`), as datasets 2.x-3.x did for scripts
//! (`HubDatasetModuleFactoryWithParquetExport`, with the export listed from the branch
//! rather than from the dataset viewer's API), and says so in a warning. Asking for
//! `revision="refs/convert/parquet"` reads that layout too.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use tchtrain_hub::{HubOptions, RepoType};

use crate::data_files::{
    DataFilesDict, PackagedModule, SplitPatterns, all_allowed_extensions, filter_extensions,
    get_data_patterns, infer_module_for_data_files, is_valid_split_name, list_local_files,
    resolve_split_patterns,
};
use crate::metadata::{MetadataConfig, MetadataConfigs};
use crate::{Error, Result};

/// The branch the hub's dataset viewer writes each dataset's Parquet export to.
pub const PARQUET_EXPORT_REVISION: &str = "refs/convert/parquet";

/// `config.REPOCARD_FILENAME`.
const REPOCARD_FILENAME: &str = "README.md";
/// `config.REPOYAML_FILENAME`: a standalone YAML whose keys override the card's.
const REPOYAML_FILENAME: &str = ".huggingface.yaml";

/// What `load_dataset_builder(path, name, revision=...)` settles before reading: the
/// configuration, the packaged loader the files select, and each split's local files.
#[derive(Debug, Clone, PartialEq)]
pub struct DatasetFiles {
    /// The configuration (`builder.config.name`): `default` for a dataset without `configs:`.
    pub config_name: String,
    /// The loader the files' extensions select (`infer_module_for_data_files`; for a card
    /// with `configs:`, from the first configuration's files, as upstream), with a card's
    /// `sep` / `delimiter` for CSV.
    pub module: PackagedModule,
    /// Split → local files (in the hub cache for a hub dataset), in upstream's order.
    pub data_files: DataFilesDict,
    /// The hub commit the files are at; `None` for a local folder.
    pub commit_hash: Option<String>,
}

/// [`HubOptions`] as `datasets.config` reads the environment: huggingface_hub's variables,
/// with `HF_DATASETS_OFFLINE`, when set, deciding offline mode.
pub fn hub_options_from_env() -> HubOptions {
    hub_options_from_vars(|name| std::env::var_os(name))
}

/// [`hub_options_from_env`] with the variables `var` gives.
pub fn hub_options_from_vars(var: impl Fn(&str) -> Option<OsString>) -> HubOptions {
    let mut options = HubOptions::from_vars(&var);
    if let Some(v) = var("HF_DATASETS_OFFLINE") {
        options.offline = tchtrain_hub::is_true(&v.to_string_lossy());
    }
    options
}

/// The data files of dataset `path` (a local folder, `org/name` on the hub, or
/// `hf://datasets/org/name`), configuration `name`, at `revision` (default
/// `options.revision`, normally `main`), as `load_dataset` resolves them; hub files are
/// downloaded into the hub cache (or found there offline).
///
/// Errors name the dataset and the fix: [`Error::ConfigNotFound`] and
/// [`Error::ConfigNameMissing`] with the available configurations, [`Error::DatasetNotFound`],
/// [`Error::DataFilesNotFound`], [`Error::DatasetScripts`], and [`Error::Hub`] (offline
/// and not cached: [`tchtrain_hub::Error::NotCached`]).
///
/// ```no_run
/// use tchtrain_datasets::{hub_options_from_env, load_dataset_files};
/// let files = load_dataset_files("stanfordnlp/imdb", None, None, &hub_options_from_env())?;
/// for (split, paths) in files.data_files.iter() {
///     println!("{split}: {} {} files", paths.len(), files.module.name());
/// }
/// # Ok::<(), tchtrain_datasets::Error>(())
/// ```
pub fn load_dataset_files(
    path: &str,
    name: Option<&str>,
    revision: Option<&str>,
    options: &HubOptions,
) -> Result<DatasetFiles> {
    let (path, remote_only) = match path.strip_prefix("hf://datasets/") {
        Some(rest) => (rest, true),
        None => (path, false),
    };
    let basename = path.split('/').rfind(|p| !p.is_empty()).unwrap_or(path);
    let script = if basename.ends_with(".py") {
        basename.to_string()
    } else {
        format!("{basename}.py")
    };
    if !remote_only && (path.ends_with(".py") || Path::new(path).join(&script).is_file()) {
        return Err(Error::DatasetScripts {
            filename: script,
            parquet_export_tried: false,
        });
    }
    let local = Path::new(path);
    if !remote_only && local.is_dir() {
        let root = std::path::absolute(local).map_err(|e| Error::io("resolving", local, e))?;
        let files = list_local_files(&root)?;
        let source = Source::Local { root: root.clone() };
        let resolved = resolve_configs(path, &files, &source, name)?;
        return resolved.fetch(&source, None);
    }
    let relative = !path.starts_with('/') && path.split('/').count() <= 2;
    if !relative || !tchtrain_hub::is_valid_repo_id(path) {
        let shown = std::path::absolute(local).unwrap_or_else(|_| local.to_path_buf());
        return Err(Error::DataFilesNotFound {
            detail: format!(
                "Couldn't find any data file at {}.{}",
                shown.display(),
                if relative {
                    format!(" '{path}' is not a hub dataset id either (`org/name`).")
                } else {
                    String::new()
                }
            ),
        });
    }
    let revision = revision.unwrap_or(&options.revision);
    load_hub_dataset_files(path, &script, name, revision, options)
}

/// Where the files are read from.
enum Source<'a> {
    Local {
        root: PathBuf,
    },
    Hub {
        repo_id: &'a str,
        sha: String,
        options: &'a HubOptions,
    },
}

impl Source<'_> {
    /// The root as upstream names it in messages.
    fn base(&self) -> String {
        match self {
            Source::Local { root } => root.display().to_string(),
            Source::Hub { repo_id, sha, .. } => format!("hf://datasets/{repo_id}@{sha}"),
        }
    }

    /// The local path of a file of the listing.
    fn fetch(&self, file: &str) -> Result<PathBuf> {
        match self {
            Source::Local { root } => Ok(root.join(file)),
            Source::Hub {
                repo_id,
                sha,
                options,
            } => Ok(tchtrain_hub::hf_hub_download(
                repo_id,
                file,
                RepoType::Dataset,
                sha,
                options,
            )?),
        }
    }

    fn commit(&self) -> Option<String> {
        match self {
            Source::Local { .. } => None,
            Source::Hub { sha, .. } => Some(sha.clone()),
        }
    }
}

/// Split → files relative to the root, in order.
type SplitFiles = Vec<(String, Vec<String>)>;

/// A configuration chosen, its files still relative to the root.
struct Resolved {
    config_name: String,
    module: PackagedModule,
    splits: SplitFiles,
}

impl Resolved {
    /// The files made local (downloaded for a hub dataset). A configuration whose patterns
    /// match no file at all is an error here (upstream's builder fails on it later); offline,
    /// that means its files are not in the cached snapshot.
    fn fetch(
        self,
        source: &Source<'_>,
        offline_repo: Option<(&str, &str, &HubOptions)>,
    ) -> Result<DatasetFiles> {
        if self.splits.iter().all(|(_, f)| f.is_empty()) {
            return Err(match offline_repo {
                Some((repo_id, revision, options)) => not_cached(repo_id, revision, options),
                None => Error::DataFilesNotFound {
                    detail: format!(
                        "The data_files patterns of config '{}' match no file in {}",
                        self.config_name,
                        source.base()
                    ),
                },
            });
        }
        let mut data_files = DataFilesDict::new();
        for (split, files) in self.splits {
            let local = files
                .iter()
                .map(|f| source.fetch(f))
                .collect::<Result<Vec<_>>>()?;
            data_files.insert(split, local);
        }
        Ok(DatasetFiles {
            config_name: self.config_name,
            module: self.module,
            data_files,
            commit_hash: source.commit(),
        })
    }
}

fn not_cached(repo_id: &str, revision: &str, options: &HubOptions) -> Error {
    Error::from(tchtrain_hub::Error::NotCached {
        repo_id: repo_id.into(),
        repo_type: RepoType::Dataset,
        revision: revision.into(),
        file: None,
        cache_dir: options.cache_dir.clone(),
    })
}

/// A hub error about the repository as upstream's `DatasetNotFoundError`.
fn dataset_not_found(
    repo_id: &str,
    revision: &str,
    options: &HubOptions,
    e: tchtrain_hub::Error,
) -> Error {
    use tchtrain_hub::Error as Hub;
    let message = match &e {
        Hub::RepositoryNotFound { .. } => {
            format!("Dataset '{repo_id}' doesn't exist on the Hub or cannot be accessed.")
        }
        Hub::RevisionNotFound { .. } => {
            format!("Revision '{revision}' doesn't exist for dataset '{repo_id}' on the Hub.")
        }
        Hub::GatedRepo { status, .. } => {
            let mut m = format!("Dataset '{repo_id}' is a gated dataset on the Hub.");
            if *status == 401 {
                m.push_str(" You must be authenticated to access it.");
            } else if *status == 403 {
                m.push_str(&format!(
                    " Visit the dataset page at {}/datasets/{repo_id} to ask for access.",
                    options.endpoint
                ));
            }
            m
        }
        _ => return Error::from(e),
    };
    Error::DatasetNotFound {
        message,
        source: Box::new(e),
    }
}

fn load_hub_dataset_files(
    repo_id: &str,
    script: &str,
    name: Option<&str>,
    revision: &str,
    options: &HubOptions,
) -> Result<DatasetFiles> {
    if revision == PARQUET_EXPORT_REVISION {
        return parquet_export_files(repo_id, name, options);
    }
    // The export stands in for `main` only: another revision's data is not in it.
    let may_use_export = revision == "main";
    let info = match tchtrain_hub::repo_info(repo_id, RepoType::Dataset, revision, options) {
        Ok(info) => info,
        Err(e @ tchtrain_hub::Error::NotCached { .. }) if may_use_export => {
            // Offline, with only the export in the cache (a script dataset read before).
            return parquet_export_files(repo_id, name, options).map_err(|_| Error::from(e));
        }
        Err(e) => return Err(dataset_not_found(repo_id, revision, options, e)),
    };
    if info.siblings.iter().any(|f| f == script) {
        if !may_use_export {
            return Err(Error::DatasetScripts {
                filename: script.into(),
                parquet_export_tried: false,
            });
        }
        log::warn!(
            "{repo_id} is a loading script ({script}), which datasets 5.2 refuses; loading its Parquet export ({PARQUET_EXPORT_REVISION}) instead"
        );
        return parquet_export_files(repo_id, name, options).map_err(|e| match e {
            Error::DataFilesNotFound { .. } | Error::DatasetNotFound { .. } => {
                Error::DatasetScripts {
                    filename: script.into(),
                    parquet_export_tried: true,
                }
            }
            other => other,
        });
    }
    let source = Source::Hub {
        repo_id,
        sha: info.sha.clone(),
        options,
    };
    let resolved = resolve_configs(repo_id, &info.siblings, &source, name);
    let offline_empty = options.offline
        && resolved
            .as_ref()
            .is_ok_and(|r| r.splits.iter().all(|(_, f)| f.is_empty()));
    let no_files = offline_empty || matches!(resolved, Err(Error::DataFilesNotFound { .. }));
    if no_files
        && may_use_export
        && let Ok(files) = parquet_export_files(repo_id, name, options)
    {
        log::warn!(
            "{repo_id} has no data files at {revision}; loading its Parquet export ({PARQUET_EXPORT_REVISION})"
        );
        return Ok(files);
    }
    if options.offline && no_files {
        return Err(not_cached(repo_id, revision, options));
    }
    let offline = options.offline.then_some((repo_id, revision, options));
    resolved?.fetch(&source, offline)
}

/// The card's configurations and the chosen one's files (`HubDatasetModuleFactory` /
/// `LocalDatasetModuleFactory` `.get_module()` then `_create_builder_config`).
fn resolve_configs(
    dataset: &str,
    files: &[String],
    source: &Source<'_>,
    name: Option<&str>,
) -> Result<Resolved> {
    let base = source.base();
    let card_name = |f: &str| format!("{dataset}/{f}");
    let mut configs = MetadataConfigs::default();
    if files.iter().any(|f| f == REPOCARD_FILENAME) {
        let card = read(&source.fetch(REPOCARD_FILENAME)?)?;
        configs = MetadataConfigs::from_readme(&card, &card_name(REPOCARD_FILENAME))?;
    }
    if files.iter().any(|f| f == REPOYAML_FILENAME) {
        let yaml = read(&source.fetch(REPOYAML_FILENAME)?)?;
        let standalone = MetadataConfigs::from_yaml_text(&yaml, &card_name(REPOYAML_FILENAME))?;
        if !standalone.is_empty() {
            configs = standalone;
        }
    }
    let allowed: Vec<&str> = all_allowed_extensions().collect();
    let empty = |detail: String| Error::DataFilesNotFound { detail };
    // The loader, from the first configuration's files or the default patterns.
    let module_patterns = match configs.0.first().and_then(|c| c.data_files.clone()) {
        Some(patterns) => patterns,
        None => get_data_patterns(files)?.ok_or_else(|| {
            empty(format!(
                "The directory at {base} doesn't contain any data files"
            ))
        })?,
    };
    let module_files = resolve_split_patterns(&module_patterns, files, Some(&allowed), &base)?;
    let mut module = infer_module_for_data_files(&module_files, dataset)?;
    if configs.is_empty() {
        if let Some(n) = name.filter(|n| *n != "default") {
            return Err(Error::ConfigNotFound {
                name: n.into(),
                available: vec!["default".into()],
            });
        }
        return Ok(Resolved {
            config_name: "default".into(),
            module,
            splits: filter_extensions(module_files, module),
        });
    }
    // Every configuration's patterns (those without `data_files` are looked for now, as
    // upstream builds all of them), then the chosen one's files.
    let mut patterns: Vec<SplitPatterns> = Vec::new();
    for c in &configs.0 {
        let under = files_under(files, c.data_dir.as_deref());
        patterns.push(match &c.data_files {
            Some(p) => p.clone(),
            None => get_data_patterns(&under)?.ok_or_else(|| {
                empty(format!(
                    "Dataset at '{base}' doesn't contain data files matching the patterns for config '{}', check `data_files` and `data_fir` parameters in the `configs` YAML field in README.md. ",
                    c.config_name
                ))
            })?,
        });
    }
    let default = configs.get_default_config_name().map_err(|e| match e {
        Error::InvalidMetadata { detail, .. } => Error::InvalidMetadata {
            card: card_name(REPOCARD_FILENAME),
            detail,
        },
        other => other,
    })?;
    let chosen = match name.or(default) {
        Some(n) => n,
        None => {
            return Err(Error::ConfigNameMissing {
                dataset: dataset.into(),
                available: configs.names(),
            });
        }
    };
    let Some(index) = configs.0.iter().position(|c| c.config_name == chosen) else {
        return Err(Error::ConfigNotFound {
            name: chosen.into(),
            available: configs.names(),
        });
    };
    let config = &configs.0[index];
    let dir = normalized_dir(config.data_dir.as_deref());
    let under = files_under(files, dir.as_deref());
    let config_base = match &dir {
        Some(d) => format!("{base}/{d}"),
        None => base.clone(),
    };
    let splits = resolve_split_patterns(&patterns[index], &under, Some(&allowed), &config_base)?
        .into_iter()
        .map(|(split, found)| {
            let found = match &dir {
                Some(d) => found.into_iter().map(|f| format!("{d}/{f}")).collect(),
                None => found,
            };
            (split, found)
        })
        .collect();
    apply_params(config, &mut module, dataset);
    Ok(Resolved {
        config_name: chosen.into(),
        module,
        splits,
    })
}

/// A card's loader arguments: `sep` / `delimiter` for CSV; the others are named in a warning
/// (tchtrain's readers take no such argument).
fn apply_params(config: &MetadataConfig, module: &mut PackagedModule, dataset: &str) {
    let mut unused = Vec::new();
    for (key, value) in &config.params {
        match (key.as_str(), &mut *module) {
            ("sep" | "delimiter", PackagedModule::Csv { sep }) if value.chars().count() == 1 => {
                *sep = value.chars().next().unwrap_or(',');
            }
            _ => unused.push(key.as_str()),
        }
    }
    if !unused.is_empty() {
        log::warn!(
            "{dataset}: config '{}' sets {} for datasets' {} loader; tchtrain's reader does not use them",
            config.config_name,
            unused.join(", "),
            module.name()
        );
    }
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::io("reading", path, e))
}

/// `data_dir` without `./` and slashes around it; `None` for the root.
fn normalized_dir(dir: Option<&str>) -> Option<String> {
    let d = dir?.trim_start_matches("./").trim_matches('/');
    (!d.is_empty() && d != ".").then(|| d.to_string())
}

/// The files under `dir`, relative to it.
fn files_under(files: &[String], dir: Option<&str>) -> Vec<String> {
    match normalized_dir(dir) {
        None => files.to_vec(),
        Some(d) => files
            .iter()
            .filter_map(|f| {
                f.strip_prefix(&d)
                    .and_then(|r| r.strip_prefix('/'))
                    .map(str::to_string)
            })
            .collect(),
    }
}

/// The configurations of a Parquet export: `{config}/{split}/NNNN.parquet`, configurations
/// and files sorted, splits `train`, `validation`, `test` first.
fn exported_configs(siblings: &[String]) -> Vec<(String, SplitFiles)> {
    let mut configs: Vec<(String, SplitFiles)> = Vec::new();
    let mut sorted: Vec<&String> = siblings.iter().collect();
    sorted.sort();
    for f in sorted {
        let parts: Vec<&str> = f.split('/').collect();
        let [config, split, file] = parts.as_slice() else {
            continue;
        };
        if !file.ends_with(".parquet") || !is_valid_split_name(split) {
            continue;
        }
        let i = match configs.iter().position(|(c, _)| c == config) {
            Some(i) => i,
            None => {
                configs.push((config.to_string(), Vec::new()));
                configs.len() - 1
            }
        };
        let entry = &mut configs[i].1;
        match entry.iter_mut().find(|(s, _)| s == split) {
            Some((_, files)) => files.push(f.clone()),
            None => entry.push((split.to_string(), vec![f.clone()])),
        }
    }
    let rank = |s: &str| {
        ["train", "validation", "test"]
            .iter()
            .position(|d| *d == s)
            .unwrap_or(3)
    };
    for (_, splits) in &mut configs {
        splits.sort_by(|a, b| (rank(&a.0), &a.0).cmp(&(rank(&b.0), &b.0)));
    }
    configs
}

/// A configuration of the hub's Parquet export (`refs/convert/parquet`).
fn parquet_export_files(
    repo_id: &str,
    name: Option<&str>,
    options: &HubOptions,
) -> Result<DatasetFiles> {
    let info =
        tchtrain_hub::repo_info(repo_id, RepoType::Dataset, PARQUET_EXPORT_REVISION, options)
            .map_err(|e| dataset_not_found(repo_id, PARQUET_EXPORT_REVISION, options, e))?;
    let mut configs = exported_configs(&info.siblings);
    if configs.is_empty() {
        return Err(Error::DataFilesNotFound {
            detail: format!(
                "No (supported) data files found in {repo_id} at {PARQUET_EXPORT_REVISION} (no {{config}}/{{split}}/NNNN.parquet files)"
            ),
        });
    }
    let names: Vec<String> = configs.iter().map(|(c, _)| c.clone()).collect();
    let chosen = match name {
        Some(n) => n.to_string(),
        None if configs.len() == 1 => names[0].clone(),
        None if names.iter().any(|n| n == "default") => "default".into(),
        None => {
            return Err(Error::ConfigNameMissing {
                dataset: repo_id.into(),
                available: names,
            });
        }
    };
    let Some(index) = names.iter().position(|n| *n == chosen) else {
        return Err(Error::ConfigNotFound {
            name: chosen,
            available: names,
        });
    };
    let (_, splits) = configs.swap_remove(index);
    let resolved = Resolved {
        config_name: chosen,
        module: PackagedModule::Parquet,
        splits,
    };
    let source = Source::Hub {
        repo_id,
        sha: info.sha,
        options,
    };
    resolved.fetch(&source, None)
}

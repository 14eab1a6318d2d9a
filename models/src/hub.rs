//! Resolving `from_pretrained(name_or_path)` to a local folder, in upstream's order: a local
//! folder; a complete snapshot in the Hugging Face cache (`HF_HUB_OFFLINE=1` honoured); a
//! download of the files a model needs (config, weights or their index and shards, the
//! tokenizer and generation files it has) into that same cache. The cache, the endpoint,
//! the token and the downloads themselves are `tchtrain-hub`'s ([`HubOptions`]); this file
//! owns which files make a model.

use std::path::{Path, PathBuf};

/// Where and how to reach the hub: `tchtrain-hub`'s, re-exported for `crate::hub` users.
pub use tchtrain_hub::HubOptions;
use tchtrain_hub::RepoType;

use crate::loading::{CONFIG_NAME, SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME};
use crate::{Error, Result};

/// Files fetched next to the weights when the repository has them.
pub const OPTIONAL_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
];

/// A snapshot of model `repo_id` at `revision` in the cache that holds a config and weights.
pub fn cached_snapshot(cache_dir: &Path, repo_id: &str, revision: &str) -> Option<PathBuf> {
    let commit = tchtrain_hub::cached_commit_hash(cache_dir, repo_id, RepoType::Model, revision)
        .unwrap_or_else(|| revision.to_string());
    let snapshot = tchtrain_hub::repo_cache_dir(cache_dir, repo_id, RepoType::Model)
        .join("snapshots")
        .join(commit);
    let complete =
        snapshot.join(CONFIG_NAME).is_file() && crate::loading::checkpoint_files(&snapshot).is_ok();
    complete.then_some(snapshot)
}

/// Resolves a name or path to a folder with `config.json` and safetensors weights (or a
/// local LoRA adapter folder, `adapter_config.json`).
pub fn resolve(name_or_path: &str, options: &HubOptions) -> Result<PathBuf> {
    let local = Path::new(name_or_path);
    if local.is_dir() {
        // A LoRA adapter's folder stands for its base model with the adapter (the Auto
        // classes load both).
        if !local.join(CONFIG_NAME).is_file() && !local.join(crate::ADAPTER_CONFIG_NAME).is_file() {
            return Err(Error::MissingFile {
                path: local.join(CONFIG_NAME),
                fix: "a model folder needs config.json (save it with save_pretrained), or adapter_config.json for a LoRA adapter",
            });
        }
        return Ok(local.to_path_buf());
    }
    if !tchtrain_hub::is_valid_repo_id(name_or_path) {
        return Err(Error::Resolve {
            name: name_or_path.into(),
            detail: "not a folder and not a hub repository id (`org/name`)".into(),
        });
    }
    if let Some(snapshot) = cached_snapshot(&options.cache_dir, name_or_path, &options.revision) {
        return Ok(snapshot);
    }
    if options.offline {
        return Err(Error::Resolve {
            name: name_or_path.into(),
            detail: format!(
                "not in the cache {} at revision `{}` and HF_HUB_OFFLINE is set: download it first or unset HF_HUB_OFFLINE",
                options.cache_dir.display(),
                options.revision
            ),
        });
    }
    download(name_or_path, options)
}

/// Downloads what a model needs at the commit `options.revision` points to (as
/// `snapshot_download` would, restricted to these files); returns the snapshot folder.
fn download(repo_id: &str, options: &HubOptions) -> Result<PathBuf> {
    let fail = |what: &str, e: tchtrain_hub::Error| Error::Resolve {
        name: repo_id.into(),
        detail: format!("{what}: {e}"),
    };
    let info = tchtrain_hub::repo_info(repo_id, RepoType::Model, &options.revision, options)
        .map_err(|e| fail("listing the repository", e))?;
    let has = |f: &str| info.siblings.iter().any(|s| s == f);
    let get = |f: &str| {
        tchtrain_hub::hf_hub_download(repo_id, f, RepoType::Model, &info.sha, options)
            .map_err(|e| fail(&format!("downloading {f}"), e))
    };
    let config = get(CONFIG_NAME)?;
    if has(SAFE_WEIGHTS_NAME) || !has(SAFE_WEIGHTS_INDEX_NAME) {
        get(SAFE_WEIGHTS_NAME)?;
    } else {
        let index = get(SAFE_WEIGHTS_INDEX_NAME)?;
        #[derive(serde::Deserialize)]
        struct Index {
            weight_map: std::collections::BTreeMap<String, String>,
        }
        let text = std::fs::read_to_string(&index).map_err(|source| Error::Io {
            path: index.clone(),
            source,
        })?;
        let parsed: Index = serde_json::from_str(&text).map_err(|source| Error::ConfigJson {
            path: index.clone(),
            source,
        })?;
        let shards: std::collections::BTreeSet<&String> = parsed.weight_map.values().collect();
        for shard in shards {
            get(shard)?;
        }
    }
    for f in OPTIONAL_FILES.iter().filter(|f| has(f)) {
        get(f)?;
    }
    config
        .parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| Error::Resolve {
            name: repo_id.into(),
            detail: "config.json has no parent folder".into(),
        })
}

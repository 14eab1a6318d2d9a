//! Resolving `from_pretrained(name_or_path)` to a local folder, in upstream's order:
//! a local folder; the Hugging Face cache (`HF_HUB_CACHE`, `HF_HOME`, the
//! `models--org--name/snapshots/<rev>/` layout, `HF_HUB_OFFLINE=1` honoured); a download
//! through the `hf-hub` crate (endpoint overridable with `HF_ENDPOINT`; the token of
//! `HF_TOKEN`, else of the file `huggingface-cli login` writes, as huggingface_hub resolves
//! it) into that same cache, so Python and Rust share downloads. Downloads show progress
//! bars unless `HF_HUB_DISABLE_PROGRESS_BARS` is set.

use std::path::{Path, PathBuf};

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

/// Where and how to look for a model (upstream's `from_pretrained` hub arguments and
/// huggingface_hub's environment variables).
#[derive(Debug, Clone, PartialEq)]
pub struct HubOptions {
    /// Branch, tag or commit (`revision=`); default `main`.
    pub revision: String,
    /// The hub cache folder (`cache_dir=`).
    pub cache_dir: PathBuf,
    /// The hub endpoint (`HF_ENDPOINT`).
    pub endpoint: String,
    /// Never use the network (`HF_HUB_OFFLINE=1` or `local_files_only=True`).
    pub offline: bool,
    /// Access token: `HF_TOKEN`, else the login file (`HF_TOKEN_PATH`, else
    /// `$HF_HOME/token`, else `~/.cache/huggingface/token`).
    pub token: Option<String>,
    /// Progress bars while downloading (off with `HF_HUB_DISABLE_PROGRESS_BARS`).
    pub progress: bool,
}

impl HubOptions {
    /// Options from the environment, as huggingface_hub reads it.
    pub fn from_env() -> Self {
        Self::from_vars(|name| std::env::var_os(name))
    }

    /// [`from_env`](Self::from_env) with the variables `var` gives.
    pub fn from_vars(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Self {
        let path = |n: &str| var(n).filter(|v| !v.is_empty()).map(PathBuf::from);
        let text = |n: &str| {
            var(n)
                .map(|v| v.to_string_lossy().into_owned())
                .filter(|v| !v.is_empty())
        };
        let is_true = |n: &str| {
            text(n).is_some_and(|v| {
                matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on")
            })
        };
        // huggingface_hub's constants: HF_HOME defaults to $XDG_CACHE_HOME/huggingface.
        let hf_home = path("HF_HOME")
            .or_else(|| path("XDG_CACHE_HOME").map(|c| c.join("huggingface")))
            .or_else(|| path("HOME").map(|h| h.join(".cache").join("huggingface")));
        let cache_dir = path("HF_HUB_CACHE")
            .or_else(|| hf_home.as_ref().map(|h| h.join("hub")))
            .unwrap_or_else(|| PathBuf::from(".cache/huggingface/hub"));
        // `get_token()`: the variable, else the file `huggingface-cli login` writes.
        let token_file = path("HF_TOKEN_PATH").or_else(|| hf_home.map(|h| h.join("token")));
        let token = text("HF_TOKEN").or_else(|| {
            let t = std::fs::read_to_string(token_file?).ok()?;
            Some(t.trim().to_string()).filter(|t| !t.is_empty())
        });
        Self {
            revision: "main".into(),
            cache_dir,
            endpoint: text("HF_ENDPOINT").unwrap_or_else(|| "https://huggingface.co".into()),
            offline: is_true("HF_HUB_OFFLINE") || is_true("TRANSFORMERS_OFFLINE"),
            token,
            progress: !is_true("HF_HUB_DISABLE_PROGRESS_BARS"),
        }
    }
}

/// The cache folder of one model repository (`models--org--name`).
pub fn repo_cache_dir(cache_dir: &Path, repo_id: &str) -> PathBuf {
    cache_dir.join(format!("models--{}", repo_id.replace('/', "--")))
}

/// A snapshot of `repo_id` at `revision` in the cache that holds a config and weights.
pub fn cached_snapshot(cache_dir: &Path, repo_id: &str, revision: &str) -> Option<PathBuf> {
    let repo = repo_cache_dir(cache_dir, repo_id);
    let commit = std::fs::read_to_string(repo.join("refs").join(revision))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| revision.to_string());
    let snapshot = repo.join("snapshots").join(commit);
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
    let looks_like_repo = !name_or_path.is_empty()
        && name_or_path.split('/').count() <= 2
        && name_or_path
            .split('/')
            .all(|p| !p.is_empty() && p != "." && p != "..")
        && !name_or_path.starts_with('/');
    if !looks_like_repo {
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

fn download(repo_id: &str, options: &HubOptions) -> Result<PathBuf> {
    use hf_hub::api::sync::ApiBuilder;
    use hf_hub::{Repo, RepoType};
    let fail = |what: &str, e: &dyn std::fmt::Display| Error::Resolve {
        name: repo_id.into(),
        detail: format!("{what} from {}: {e}", options.endpoint),
    };
    std::fs::create_dir_all(&options.cache_dir).map_err(|source| Error::Io {
        path: options.cache_dir.clone(),
        source,
    })?;
    let api = ApiBuilder::new()
        .with_endpoint(options.endpoint.clone())
        .with_cache_dir(options.cache_dir.clone())
        .with_token(options.token.clone())
        .with_progress(options.progress)
        .with_retries(0)
        .build()
        .map_err(|e| fail("creating the hub client", &e))?;
    let repo = api.repo(Repo::with_revision(
        repo_id.into(),
        RepoType::Model,
        options.revision.clone(),
    ));
    let config = repo
        .get(CONFIG_NAME)
        .map_err(|e| fail("downloading config.json", &e))?;
    if repo.get(SAFE_WEIGHTS_NAME).is_err() {
        let index = repo.get(SAFE_WEIGHTS_INDEX_NAME).map_err(|e| {
            fail(
                "downloading model.safetensors or model.safetensors.index.json",
                &e,
            )
        })?;
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
            repo.get(shard)
                .map_err(|e| fail(&format!("downloading shard {shard}"), &e))?;
        }
    }
    for f in OPTIONAL_FILES {
        let _ = repo.get(f);
    }
    config
        .parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| fail("locating the snapshot", &"config.json has no parent folder"))
}

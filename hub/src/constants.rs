//! [`HubOptions`]: where the hub cache is, which endpoint and token to use, offline mode and
//! progress bars, read from the environment as `huggingface_hub/constants.py` reads it.

use std::ffi::OsString;
use std::path::PathBuf;

/// The hub every repository id refers to unless `HF_ENDPOINT` says otherwise.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Where and how to reach the hub (the hub arguments of `from_pretrained` /
/// `load_dataset`, and huggingface_hub's environment variables).
#[derive(Debug, Clone, PartialEq)]
pub struct HubOptions {
    /// Branch, tag or commit (`revision=`); default `main`.
    pub revision: String,
    /// The hub cache folder (`cache_dir=`; `HF_HUB_CACHE`, else `$HF_HOME/hub`).
    pub cache_dir: PathBuf,
    /// The hub endpoint (`HF_ENDPOINT`), without a trailing `/`.
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
    pub fn from_vars(var: impl Fn(&str) -> Option<OsString>) -> Self {
        let path = |n: &str| var(n).filter(|v| !v.is_empty()).map(PathBuf::from);
        let text = |n: &str| {
            var(n)
                .map(|v| v.to_string_lossy().into_owned())
                .filter(|v| !v.is_empty())
        };
        // HF_HOME defaults to $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface.
        let hf_home = path("HF_HOME")
            .or_else(|| path("XDG_CACHE_HOME").map(|c| c.join("huggingface")))
            .or_else(|| path("HOME").map(|h| h.join(".cache").join("huggingface")));
        // HF_HUB_CACHE, else the legacy HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub.
        let cache_dir = path("HF_HUB_CACHE")
            .or_else(|| path("HUGGINGFACE_HUB_CACHE"))
            .or_else(|| hf_home.as_ref().map(|h| h.join("hub")))
            .unwrap_or_else(|| PathBuf::from(".cache/huggingface/hub"));
        // `get_token()`: the variable, else the file `huggingface-cli login` writes.
        let token_file = path("HF_TOKEN_PATH").or_else(|| hf_home.map(|h| h.join("token")));
        let token = text("HF_TOKEN").or_else(|| {
            let t = std::fs::read_to_string(token_file?).ok()?;
            Some(t.trim().to_string()).filter(|t| !t.is_empty())
        });
        // `_is_true(os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE"))`:
        // the first variable that is set and not empty decides.
        let offline = text("HF_HUB_OFFLINE")
            .or_else(|| text("TRANSFORMERS_OFFLINE"))
            .is_some_and(|v| is_true(&v));
        let endpoint = text("HF_ENDPOINT")
            .map(|e| e.trim_end_matches('/').to_string())
            .unwrap_or_else(|| DEFAULT_ENDPOINT.into());
        Self {
            revision: "main".into(),
            cache_dir,
            endpoint,
            offline,
            token,
            progress: !text("HF_HUB_DISABLE_PROGRESS_BARS").is_some_and(|v| is_true(&v)),
        }
    }
}

/// huggingface_hub's `_is_true`: `1`, `ON`, `YES` or `TRUE`, in any case.
pub fn is_true(value: &str) -> bool {
    matches!(
        value.to_ascii_uppercase().as_str(),
        "1" | "ON" | "YES" | "TRUE"
    )
}

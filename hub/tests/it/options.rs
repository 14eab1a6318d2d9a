//! `HubOptions::from_vars` reads the environment as `huggingface_hub.constants` does.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::PathBuf;

use tchtrain_hub::HubOptions;
use tchtrain_testing::temp_dir;

fn options(vars: &[(&str, &str)]) -> HubOptions {
    let vars: HashMap<String, OsString> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), OsString::from(v)))
        .collect();
    HubOptions::from_vars(|name| vars.get(name).cloned())
}

#[test]
fn cache_folder_endpoint_and_offline_follow_huggingface_hub() {
    // HF_HUB_CACHE, else the legacy HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else
    // $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub.
    let o = options(&[("HOME", "/h"), ("HF_HOME", "/hf"), ("HF_HUB_CACHE", "/c")]);
    assert_eq!(o.cache_dir, PathBuf::from("/c"));
    let o = options(&[("HF_HOME", "/hf"), ("HUGGINGFACE_HUB_CACHE", "/legacy")]);
    assert_eq!(o.cache_dir, PathBuf::from("/legacy"));
    assert_eq!(
        options(&[("HF_HOME", "/hf")]).cache_dir,
        PathBuf::from("/hf/hub")
    );
    let o = options(&[("HOME", "/h"), ("XDG_CACHE_HOME", "/x")]);
    assert_eq!(o.cache_dir, PathBuf::from("/x/huggingface/hub"));
    let o = options(&[("HOME", "/h")]);
    assert_eq!(o.cache_dir, PathBuf::from("/h/.cache/huggingface/hub"));
    assert_eq!(o.endpoint, "https://huggingface.co");
    assert_eq!(o.revision, "main");
    assert!(!o.offline && o.progress && o.token.is_none());
    // ENDPOINT = os.getenv("HF_ENDPOINT", ...).rstrip("/")
    let o = options(&[("HF_ENDPOINT", "http://127.0.0.1:8080/")]);
    assert_eq!(o.endpoint, "http://127.0.0.1:8080");
    // _is_true(os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE"))
    for (vars, want) in [
        (vec![("HF_HUB_OFFLINE", "1")], true),
        (vec![("HF_HUB_OFFLINE", "yes")], true),
        (vec![("HF_HUB_OFFLINE", "TRUE")], true),
        (vec![("HF_HUB_OFFLINE", "0")], false),
        (vec![("TRANSFORMERS_OFFLINE", "1")], true),
        (
            vec![("HF_HUB_OFFLINE", ""), ("TRANSFORMERS_OFFLINE", "on")],
            true,
        ),
        (
            vec![("HF_HUB_OFFLINE", "0"), ("TRANSFORMERS_OFFLINE", "1")],
            false,
        ),
    ] {
        assert_eq!(options(&vars).offline, want, "{vars:?}");
    }
    assert!(!options(&[("HF_HUB_DISABLE_PROGRESS_BARS", "1")]).progress);
}

#[test]
fn the_token_comes_from_hf_token_else_the_login_file() {
    let home = temp_dir("hub-options-home");
    std::fs::write(home.join("token"), "hf_file\n").unwrap();
    let h = home.to_str().unwrap();
    assert_eq!(options(&[("HF_HOME", h)]).token.as_deref(), Some("hf_file"));
    let o = options(&[("HF_HOME", h), ("HF_TOKEN", "hf_env")]);
    assert_eq!(o.token.as_deref(), Some("hf_env"));
    let other = home.join("elsewhere");
    std::fs::write(&other, "hf_path").unwrap();
    let o = options(&[("HF_HOME", h), ("HF_TOKEN_PATH", other.to_str().unwrap())]);
    assert_eq!(o.token.as_deref(), Some("hf_path"));
    std::fs::write(home.join("token"), "  \n").unwrap();
    assert_eq!(options(&[("HF_HOME", h)]).token, None);
}

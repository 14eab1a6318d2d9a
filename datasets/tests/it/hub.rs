//! `load_dataset_files` on local folders and on dataset repositories served by the local hub
//! (`tchtrain_testing::HubServer`): the same split → file lists as datasets 5.2 for the same
//! layouts (`scripts/reference/hub_datasets.py`), configurations, revisions, the Parquet
//! export fallback, offline mode from the cache, typed errors, the token.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;
use tchtrain_datasets::{
    DatasetFiles, Error, PackagedModule, hub_options_from_vars, load_dataset_files,
};
use tchtrain_hub::HubOptions;
use tchtrain_testing::{HubServer, reference_dir, temp_dir};

fn options(cache: &Path, endpoint: &str) -> HubOptions {
    HubOptions {
        revision: "main".into(),
        cache_dir: cache.to_path_buf(),
        endpoint: endpoint.into(),
        offline: false,
        token: None,
        progress: false,
    }
}

fn offline(cache: &Path) -> HubOptions {
    HubOptions {
        offline: true,
        ..options(cache, "http://127.0.0.1:9")
    }
}

fn write(root: &Path, files: &[(&str, &str)]) {
    for (path, content) in files {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
}

/// `[(split, [paths relative to root])]`.
fn relative_splits(files: &DatasetFiles, root: &Path) -> Result<Vec<(String, Vec<String>)>> {
    files
        .data_files
        .iter()
        .map(|(split, paths)| {
            let rel = paths
                .iter()
                .map(|p| {
                    p.strip_prefix(root)
                        .map(|r| r.to_string_lossy().into_owned())
                        .with_context(|| format!("{} is not under {}", p.display(), root.display()))
                })
                .collect::<Result<Vec<_>>>()?;
            Ok((split.to_string(), rel))
        })
        .collect()
}

fn snapshot(cache: &Path, repo_id: &str, commit: &str) -> PathBuf {
    cache
        .join(format!("datasets--{}", repo_id.replace('/', "--")))
        .join("snapshots")
        .join(commit)
}

/// One resolution against Python's answer for the same layout.
fn compare(
    case: &str,
    query: &Value,
    got: tchtrain_datasets::Result<DatasetFiles>,
    root: &Path,
) -> Result<()> {
    let want = &query["result"];
    let what = format!("{case} / {}", query["name"]);
    if let Some(kind) = want["error"].as_str() {
        let message = want["message"].as_str().unwrap_or_default();
        let err = match got {
            Ok(files) => bail!("{what}: datasets raised {kind}: {message}; we resolved {files:?}"),
            Err(e) => e,
        };
        let ok = match (&err, kind) {
            (Error::ConfigNotFound { .. }, "ValueError") => err.to_string() == message,
            // The usage example names the folder (Python) or the repository: the same first lines.
            (Error::ConfigNameMissing { .. }, "ValueError") => {
                let head = |s: &str| s.lines().take(2).collect::<Vec<_>>().join("\n");
                head(&err.to_string()) == head(message)
            }
            (Error::DataFilesNotFound { detail }, "EmptyDatasetError") => {
                detail.ends_with("doesn't contain any data files")
                    && message.ends_with("doesn't contain any data files")
            }
            _ => false,
        };
        ensure!(
            ok,
            "{what}: datasets raised {kind}: {message:?}; we raised {err:?}"
        );
        return Ok(());
    }
    let files = got.with_context(|| format!("{what}: datasets resolved {want}"))?;
    ensure!(
        files.config_name == want["config_name"].as_str().unwrap_or_default(),
        "{what}: config {} vs {}",
        files.config_name,
        want["config_name"]
    );
    ensure!(
        files.module.name() == want["module"].as_str().unwrap_or_default(),
        "{what}: module {:?} vs {}",
        files.module,
        want["module"]
    );
    if let PackagedModule::Csv { sep } = files.module {
        ensure!(
            want["sep"].as_str() == Some(sep.to_string().as_str()),
            "{what}: sep {sep:?} vs {}",
            want["sep"]
        );
    }
    let want_splits: Vec<(String, Vec<String>)> = serde_json::from_value(want["splits"].clone())?;
    let got_splits = relative_splits(&files, root)?;
    ensure!(
        got_splits == want_splits,
        "{what}:\n ours   {got_splits:?}\n theirs {want_splits:?}"
    );
    Ok(())
}

/// Every layout of the reference, as a local folder and as a hub repository: the same
/// configuration, loader and split → file lists as `load_dataset_builder` in datasets 5.2,
/// or the same error. The export layout also as a scripted repository's `refs/convert/parquet`.
#[test]
fn resolves_as_datasets_does_locally_and_from_the_hub() -> Result<()> {
    let reference: Value = serde_json::from_str(&std::fs::read_to_string(
        reference_dir("hub_datasets").join("hub_datasets.json"),
    )?)?;
    let work = temp_dir("datasets-hub-reference");
    let mut builder = HubServer::builder();
    let mut cases = Vec::new();
    for case in reference["cases"].as_array().context("cases")? {
        let name = case["name"].as_str().context("name")?.to_string();
        let folder = work.join("layouts").join(&name);
        let files: BTreeMap<String, String> = serde_json::from_value(case["files"].clone())?;
        for (path, content) in &files {
            write(&folder, &[(path, content)]);
        }
        builder = builder.dataset(&format!("org/{name}"), "main", folder.clone());
        if name == "parquet_export_layout" {
            let main = work.join("scripted-main");
            write(
                &main,
                &[
                    ("README.md", "# a scripted dataset\n"),
                    ("parquet_export_layout.py", "# a loading script\n"),
                ],
            );
            builder = builder
                .dataset("scripted/parquet_export_layout", "main", main)
                .dataset(
                    "scripted/parquet_export_layout",
                    "refs/convert/parquet",
                    folder.clone(),
                );
        }
        cases.push((
            name,
            folder,
            case["queries"].as_array().context("queries")?.clone(),
        ));
    }
    let server = builder.start();
    let cache = work.join("cache");
    let online = options(&cache, server.endpoint());
    let mut compared = 0;
    for (name, folder, queries) in &cases {
        for query in queries {
            let config = query["name"].as_str();
            let local =
                load_dataset_files(folder.to_str().unwrap(), config, None, &offline(&cache));
            compare(name, query, local, folder)?;
            let repo_id = format!("org/{name}");
            let hub = load_dataset_files(&repo_id, config, None, &online);
            let commit = server.commit(&repo_id, "main").unwrap();
            if let Ok(files) = &hub {
                assert_eq!(files.commit_hash.as_deref(), Some(commit.as_str()));
            }
            compare(name, query, hub, &snapshot(&cache, &repo_id, &commit))?;
            if name == "parquet_export_layout" {
                let repo_id = "scripted/parquet_export_layout";
                let export = server.commit(repo_id, "refs/convert/parquet").unwrap();
                let got = load_dataset_files(repo_id, config, None, &online);
                compare(name, query, got, &snapshot(&cache, repo_id, &export))?;
            }
            compared += 1;
        }
    }
    assert!(compared >= 15, "{compared} queries compared");
    Ok(())
}

const CARD: &str = "---
configs:
- config_name: a
  data_files:
  - split: train
    path: a/train-*.csv
  - split: validation
    path: a/valid.csv
  default: true
- config_name: b
  data_files: b/*.jsonl
---
";

fn configs_repo(root: &Path) {
    write(
        root,
        &[
            ("README.md", CARD),
            ("a/train-0.csv", "text\nx\n"),
            ("a/train-1.csv", "text\ny\n"),
            ("a/valid.csv", "text\nz\n"),
            ("b/rows.jsonl", "{\"text\": \"w\"}\n"),
        ],
    );
}

#[test]
fn revisions_pick_their_own_files_and_unknown_ones_are_named() -> Result<()> {
    let main = temp_dir("datasets-hub-rev-main");
    write(&main, &[("train.csv", "text\nmain\n")]);
    let v1 = temp_dir("datasets-hub-rev-v1");
    write(
        &v1,
        &[
            ("data/train-00000-of-00001.parquet", "PAR1"),
            ("data/test-00000-of-00001.parquet", "PAR1 t"),
        ],
    );
    let cache = temp_dir("datasets-hub-rev-cache");
    let server = HubServer::builder()
        .dataset("org/versioned", "main", &*main)
        .dataset("org/versioned", "v1", &*v1)
        .start();
    let o = options(&cache, server.endpoint());
    let got = load_dataset_files("org/versioned", None, None, &o)?;
    assert_eq!(got.module, PackagedModule::Csv { sep: ',' });
    assert_eq!(got.data_files.split_names().collect::<Vec<_>>(), ["train"]);
    let v1_commit = server.commit("org/versioned", "v1").unwrap();
    let got = load_dataset_files("org/versioned", None, Some("v1"), &o)?;
    assert_eq!(
        (got.module, got.commit_hash.as_deref()),
        (PackagedModule::Parquet, Some(v1_commit.as_str()))
    );
    let root = snapshot(&cache, "org/versioned", &v1_commit);
    assert_eq!(
        relative_splits(&got, &root)?,
        [
            (
                "train".to_string(),
                vec!["data/train-00000-of-00001.parquet".to_string()]
            ),
            (
                "test".to_string(),
                vec!["data/test-00000-of-00001.parquet".to_string()]
            ),
        ]
    );
    assert_eq!(
        std::fs::read(got.data_files.get("test").unwrap()[0].clone())?,
        b"PAR1 t"
    );
    // The revision in HubOptions is the default; a commit hash works as a revision.
    let by_options = HubOptions {
        revision: "v1".into(),
        ..o.clone()
    };
    assert_eq!(
        load_dataset_files("org/versioned", None, None, &by_options)?,
        got
    );
    assert_eq!(
        load_dataset_files("org/versioned", None, Some(&v1_commit), &o)?,
        got
    );
    let err = load_dataset_files("org/versioned", None, Some("v9"), &o).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Revision 'v9' doesn't exist for dataset 'org/versioned' on the Hub."
    );
    let err = load_dataset_files("org/nothing", None, None, &o).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Dataset 'org/nothing' doesn't exist on the Hub or cannot be accessed."
    );
    Ok(())
}

#[test]
fn configs_from_the_card_and_typed_config_errors() -> Result<()> {
    let repo = temp_dir("datasets-hub-configs");
    configs_repo(&repo);
    let cache = temp_dir("datasets-hub-configs-cache");
    let server = HubServer::builder()
        .dataset("org/configs", "main", &*repo)
        .start();
    let o = options(&cache, server.endpoint());
    let root = snapshot(
        &cache,
        "org/configs",
        &server.commit("org/configs", "main").unwrap(),
    );
    let a = load_dataset_files("org/configs", None, None, &o)?;
    assert_eq!(a.config_name, "a");
    assert_eq!(
        relative_splits(&a, &root)?,
        [
            (
                "train".to_string(),
                vec!["a/train-0.csv".to_string(), "a/train-1.csv".to_string()]
            ),
            ("validation".to_string(), vec!["a/valid.csv".to_string()]),
        ]
    );
    // Only the chosen configuration's files are downloaded.
    let resolved: Vec<String> = server
        .requests()
        .into_iter()
        .map(|r| r.path)
        .filter(|p| p.contains("/resolve/"))
        .collect();
    assert!(
        resolved.iter().any(|p| p.ends_with("/a/valid.csv")),
        "{resolved:?}"
    );
    assert!(
        !resolved.iter().any(|p| p.ends_with("/b/rows.jsonl")),
        "{resolved:?}"
    );
    // The loader comes from the first configuration's files, as upstream infers it.
    let b = load_dataset_files("org/configs", Some("b"), None, &o)?;
    assert_eq!(
        (b.config_name.as_str(), b.module),
        ("b", PackagedModule::Csv { sep: ',' })
    );
    assert_eq!(
        relative_splits(&b, &root)?,
        [("train".to_string(), vec!["b/rows.jsonl".to_string()])]
    );
    let err = load_dataset_files("org/configs", Some("c"), None, &o).unwrap_err();
    assert!(
        matches!(&err, Error::ConfigNotFound { available, .. } if available == &["a", "b"]),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "BuilderConfig 'c' not found. Available: ['a', 'b']"
    );
    // A card that cannot be read is an error naming it, not a panic.
    let bad = temp_dir("datasets-hub-bad-card");
    write(
        &bad,
        &[
            ("README.md", "---\nconfigs:\n- data_files: x.csv\n---\n"),
            ("x.csv", "t\n"),
        ],
    );
    let server2 = HubServer::builder()
        .dataset("org/bad", "main", &*bad)
        .start();
    let err = load_dataset_files("org/bad", None, None, &options(&cache, server2.endpoint()))
        .unwrap_err();
    assert!(matches!(err, Error::InvalidMetadata { .. }), "{err:?}");
    assert!(
        err.to_string().contains("org/bad/README.md") && err.to_string().contains("config_name"),
        "{err}"
    );
    Ok(())
}

#[test]
fn scripts_and_empty_repositories_fall_back_to_the_parquet_export() -> Result<()> {
    let main = temp_dir("datasets-hub-export-main");
    write(
        &main,
        &[
            ("README.md", "# scripted\n"),
            ("scripted.py", "# a loading script\n"),
        ],
    );
    let export = temp_dir("datasets-hub-export");
    write(
        &export,
        &[
            ("cfg_a/train/0000.parquet", "PAR1 a0"),
            ("cfg_a/train/0001.parquet", "PAR1 a1"),
            ("cfg_a/test/0000.parquet", "PAR1 at"),
            ("cfg_a/partial-extra/0000.parquet", "PAR1 partial"),
            ("cfg_b/train/0000.parquet", "PAR1 b0"),
            (".gitattributes", "*.parquet filter=lfs\n"),
        ],
    );
    let empty = temp_dir("datasets-hub-export-empty");
    write(&empty, &[("README.md", "# nothing here\n")]);
    let empty_export = temp_dir("datasets-hub-export-empty-export");
    write(&empty_export, &[("default/train/0000.parquet", "PAR1 d")]);
    let lonely = temp_dir("datasets-hub-export-lonely");
    write(&lonely, &[("lonely.py", "# script\n")]);
    let cache = temp_dir("datasets-hub-export-cache");
    let server = HubServer::builder()
        .dataset("org/scripted", "main", &*main)
        .dataset("org/scripted", "refs/convert/parquet", &*export)
        .dataset("org/empty", "main", &*empty)
        .dataset("org/empty", "refs/convert/parquet", &*empty_export)
        .dataset("org/lonely", "main", &*lonely)
        .start();
    let o = options(&cache, server.endpoint());
    let export_commit = server
        .commit("org/scripted", "refs/convert/parquet")
        .unwrap();
    let root = snapshot(&cache, "org/scripted", &export_commit);

    let err = load_dataset_files("org/scripted", None, None, &o).unwrap_err();
    assert!(
        matches!(&err, Error::ConfigNameMissing { available, .. } if available == &["cfg_a", "cfg_b"]),
        "{err:?}"
    );
    assert!(err.to_string().starts_with("Config name is missing.\nPlease pick one among the available configs: ['cfg_a', 'cfg_b']"), "{err}");
    let a = load_dataset_files("org/scripted", Some("cfg_a"), None, &o)?;
    assert_eq!(
        (a.module, a.commit_hash.as_deref()),
        (PackagedModule::Parquet, Some(export_commit.as_str()))
    );
    assert_eq!(
        relative_splits(&a, &root)?,
        [
            (
                "train".to_string(),
                vec![
                    "cfg_a/train/0000.parquet".to_string(),
                    "cfg_a/train/0001.parquet".to_string()
                ]
            ),
            (
                "test".to_string(),
                vec!["cfg_a/test/0000.parquet".to_string()]
            ),
        ]
    );
    // Asking for the export branch reads the same layout.
    assert_eq!(
        load_dataset_files(
            "org/scripted",
            Some("cfg_a"),
            Some("refs/convert/parquet"),
            &o
        )?,
        a
    );
    let err = load_dataset_files("org/scripted", Some("cfg_c"), None, &o).unwrap_err();
    assert_eq!(
        err.to_string(),
        "BuilderConfig 'cfg_c' not found. Available: ['cfg_a', 'cfg_b']"
    );
    let paths: Vec<String> = server.requests().into_iter().map(|r| r.path).collect();
    assert!(
        paths
            .iter()
            .any(|p| p == "/api/datasets/org/scripted/revision/refs%2Fconvert%2Fparquet"),
        "{paths:?}"
    );
    assert!(
        !paths.iter().any(|p| p.ends_with("scripted.py")),
        "the script is never downloaded"
    );

    let d = load_dataset_files("org/empty", None, None, &o)?;
    assert_eq!(
        (
            d.config_name.as_str(),
            d.data_files.split_names().collect::<Vec<_>>()
        ),
        ("default", vec!["train"])
    );

    let err = load_dataset_files("org/lonely", None, None, &o).unwrap_err();
    assert!(
        matches!(&err, Error::DatasetScripts { filename, parquet_export_tried: true } if filename == "lonely.py"),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .starts_with("Dataset scripts are no longer supported, but found lonely.py"),
        "{err}"
    );
    // Another revision of a script is refused: the export holds main's data only.
    let err = load_dataset_files(
        "org/scripted",
        Some("cfg_a"),
        Some(&server.commit("org/scripted", "main").unwrap()),
        &o,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::DatasetScripts {
                parquet_export_tried: false,
                ..
            }
        ),
        "{err:?}"
    );
    Ok(())
}

#[test]
fn offline_mode_answers_from_the_cache_after_a_download() -> Result<()> {
    let repo = temp_dir("datasets-hub-offline");
    configs_repo(&repo);
    let scripted = temp_dir("datasets-hub-offline-scripted");
    write(&scripted, &[("scripted.py", "#\n")]);
    let export = temp_dir("datasets-hub-offline-export");
    write(&export, &[("default/train/0000.parquet", "PAR1")]);
    let cache = temp_dir("datasets-hub-offline-cache");
    let mut server = HubServer::builder()
        .dataset("org/ds", "main", &*repo)
        .dataset("org/scripted", "main", &*scripted)
        .dataset("org/scripted", "refs/convert/parquet", &*export)
        .start();
    let o = options(&cache, server.endpoint());
    let online = load_dataset_files("org/ds", None, None, &o)?;
    let online_export = load_dataset_files("org/scripted", None, None, &o)?;
    let requests = server.requests().len();

    // HF_DATASETS_OFFLINE (or HF_HUB_OFFLINE): the cache only, no request.
    let env = hub_options_from_vars(|name| match name {
        "HF_HUB_CACHE" => Some(cache.as_os_str().to_owned()),
        "HF_ENDPOINT" => Some(server.endpoint().into()),
        "HF_DATASETS_OFFLINE" => Some("1".into()),
        _ => None,
    });
    assert!(env.offline);
    assert_eq!(load_dataset_files("org/ds", None, None, &env)?, online);
    assert_eq!(
        load_dataset_files("org/scripted", None, None, &env)?,
        online_export
    );
    assert_eq!(server.requests().len(), requests);
    // A configuration never downloaded is not cached: a typed error naming the repository.
    let err = load_dataset_files("org/ds", Some("b"), None, &env).unwrap_err();
    assert!(
        matches!(&err, Error::Hub(e) if matches!(**e, tchtrain_hub::Error::NotCached { .. })),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("'org/ds'") && err.to_string().contains("not cached"),
        "{err}"
    );

    // The hub gone: offline still answers; online falls back to the cache as upstream does.
    server.stop();
    assert_eq!(
        load_dataset_files("org/ds", None, None, &offline(&cache))?,
        online
    );
    assert_eq!(load_dataset_files("org/ds", None, None, &o)?, online);

    // HF_DATASETS_OFFLINE=0 wins over HF_HUB_OFFLINE=1, as datasets.config reads them.
    let v = |vars: &'static [(&'static str, &'static str)]| {
        hub_options_from_vars(move |n| vars.iter().find(|(k, _)| *k == n).map(|(_, v)| v.into()))
            .offline
    };
    assert!(v(&[("HF_HUB_OFFLINE", "1")]));
    assert!(!v(&[("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "0")]));
    assert!(!v(&[]));
    Ok(())
}

#[test]
fn offline_with_nothing_cached_is_a_typed_error() {
    let cache = temp_dir("datasets-hub-offline-empty");
    let err = load_dataset_files("org/ds", None, None, &offline(&cache)).unwrap_err();
    match &err {
        Error::Hub(e) => match &**e {
            tchtrain_hub::Error::NotCached { repo_id, .. } => assert_eq!(repo_id, "org/ds"),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("dataset repository 'org/ds'") && msg.contains("not cached"),
        "{msg}"
    );
}

#[test]
fn the_token_is_sent_as_a_bearer_header() -> Result<()> {
    let repo = temp_dir("datasets-hub-token");
    configs_repo(&repo);
    let cache = temp_dir("datasets-hub-token-cache");
    let server = HubServer::builder()
        .dataset("org/private", "main", &*repo)
        .start();
    let o = HubOptions {
        token: Some("hf_dataset_token".into()),
        ..options(&cache, server.endpoint())
    };
    load_dataset_files("org/private", None, None, &o)?;
    let requests = server.requests();
    assert!(
        requests.iter().any(|r| r.path.contains("/resolve/")),
        "{requests:?}"
    );
    for r in &requests {
        assert_eq!(
            r.authorization.as_deref(),
            Some("Bearer hf_dataset_token"),
            "{r:?}"
        );
    }
    Ok(())
}

#[test]
fn local_folders_and_bad_names() {
    let dir = temp_dir("datasets-hub-local");
    write(
        &dir,
        &[("train.csv", "t\n"), ("datasets-hub-local-x.py", "#\n")],
    );
    let cache = temp_dir("datasets-hub-local-cache");
    let got = load_dataset_files(dir.to_str().unwrap(), None, None, &offline(&cache)).unwrap();
    assert_eq!(
        got.data_files.get("train").unwrap(),
        [dir.join("train.csv")]
    );
    assert_eq!(got.commit_hash, None);
    // A folder holding `<folder name>.py` is a loading script.
    let scripted = dir.join("scripted");
    write(&scripted, &[("scripted.py", "#\n"), ("train.csv", "t\n")]);
    let err =
        load_dataset_files(scripted.to_str().unwrap(), None, None, &offline(&cache)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Dataset scripts are no longer supported, but found scripted.py"
    );
    for bad in ["/no/such/folder", "a/b/c", "no such"] {
        let err = load_dataset_files(bad, None, None, &offline(&cache)).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("Couldn't find any data file at"),
            "{bad}: {err}"
        );
    }
}

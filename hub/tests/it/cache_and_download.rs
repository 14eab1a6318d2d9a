//! Repository listings and downloads against the local hub server: the cache layout Python
//! shares, commits reused without a request, offline mode, typed errors, the token.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;

use anyhow::Result;
use tchtrain_hub::{
    Error, HubOptions, RepoType, cached_repo_info, hf_hub_download, repo_info,
    try_to_load_from_cache,
};
use tchtrain_testing::{HubServer, temp_dir};

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

fn write(root: &Path, files: &[(&str, &[u8])]) {
    for (path, bytes) in files {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }
}

const TRAIN: &str = "data/train-00000-of-00001.parquet";

#[test]
fn downloads_land_in_the_layout_python_shares_and_serve_offline_later() -> Result<()> {
    let repo = temp_dir("hub-dl-repo");
    write(
        &repo,
        &[
            ("README.md", b"# ds\n"),
            (TRAIN, b"PAR1 train"),
            ("data/test-00000-of-00001.parquet", b"PAR1 test"),
        ],
    );
    let cache = temp_dir("hub-dl-cache");
    let mut server = HubServer::builder()
        .dataset("org/ds", "main", &*repo)
        .start();
    let o = options(&cache, server.endpoint());

    let info = repo_info("org/ds", RepoType::Dataset, "main", &o)?;
    let sha = server.commit("org/ds", "main").unwrap();
    assert_eq!(info.sha, sha);
    assert_eq!(
        info.siblings,
        ["README.md", "data/test-00000-of-00001.parquet", TRAIN]
    );
    let repo_dir = cache.join("datasets--org--ds");
    assert_eq!(std::fs::read_to_string(repo_dir.join("refs/main"))?, sha);

    let path = hf_hub_download("org/ds", TRAIN, RepoType::Dataset, &sha, &o)?;
    assert_eq!(path, repo_dir.join("snapshots").join(&sha).join(TRAIN));
    assert_eq!(std::fs::read(&path)?, b"PAR1 train");
    // snapshots/ links into blobs/, as huggingface_hub lays it out.
    assert!(std::fs::symlink_metadata(&path)?.file_type().is_symlink());
    assert!(
        std::fs::canonicalize(&path)?.starts_with(std::fs::canonicalize(repo_dir.join("blobs"))?)
    );
    // A commit is not a ref: huggingface_hub records none for it.
    assert!(!repo_dir.join("refs").join(&sha).exists());

    // A cached commit needs no request.
    let before = server.requests().len();
    assert_eq!(
        hf_hub_download("org/ds", TRAIN, RepoType::Dataset, &sha, &o)?,
        path
    );
    assert_eq!(server.requests().len(), before);

    // Offline: the cache answers for the branch; what was not downloaded is a typed error.
    let offline = HubOptions {
        offline: true,
        ..o.clone()
    };
    assert_eq!(
        try_to_load_from_cache("org/ds", TRAIN, RepoType::Dataset, "main", &cache),
        Some(path.clone())
    );
    assert_eq!(
        hf_hub_download("org/ds", TRAIN, RepoType::Dataset, "main", &offline)?,
        path
    );
    let cached = repo_info("org/ds", RepoType::Dataset, "main", &offline)?;
    assert_eq!(
        (cached.sha.as_str(), cached.siblings.as_slice()),
        (sha.as_str(), [TRAIN.to_string()].as_slice())
    );
    let err =
        hf_hub_download("org/ds", "README.md", RepoType::Dataset, "main", &offline).unwrap_err();
    assert!(matches!(err, Error::NotCached { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("'org/ds'") && msg.contains("not cached") && msg.contains("README.md"),
        "{msg}"
    );
    let err = repo_info("org/other", RepoType::Dataset, "main", &offline).unwrap_err();
    assert!(matches!(err, Error::NotCached { .. }), "{err}");
    assert_eq!(server.requests().len(), before);

    // The hub gone: the listing falls back to the cache, an uncached file cannot come.
    server.stop();
    assert_eq!(repo_info("org/ds", RepoType::Dataset, "main", &o)?.sha, sha);
    let err = hf_hub_download("org/ds", "README.md", RepoType::Dataset, "main", &o).unwrap_err();
    assert!(err.is_connection(), "{err}");
    Ok(())
}

#[test]
fn hub_errors_are_typed() -> Result<()> {
    let repo = temp_dir("hub-err-repo");
    write(&repo, &[("config.json", b"{}")]);
    let cache = temp_dir("hub-err-cache");
    let server = HubServer::builder().model("org/m", "main", &*repo).start();
    let o = options(&cache, server.endpoint());
    assert_eq!(
        repo_info("org/m", RepoType::Model, "main", &o)?.siblings,
        ["config.json"]
    );
    let err = repo_info("org/missing", RepoType::Model, "main", &o).unwrap_err();
    assert!(
        matches!(err, Error::RepositoryNotFound { status: 401, .. }),
        "{err}"
    );
    let err = repo_info("org/m", RepoType::Dataset, "main", &o).unwrap_err();
    assert!(matches!(err, Error::RepositoryNotFound { .. }), "{err}");
    let err = repo_info("org/m", RepoType::Model, "v9", &o).unwrap_err();
    assert!(matches!(err, Error::RevisionNotFound { .. }), "{err}");
    let err = hf_hub_download("org/m", "nope.json", RepoType::Model, "main", &o).unwrap_err();
    assert!(
        matches!(&err, Error::EntryNotFound { file, .. } if file == "nope.json"),
        "{err}"
    );
    let before = server.requests().len();
    for bad in ["a/b/c", "", "org/-x", "org--x/y", "../x"] {
        let err = repo_info(bad, RepoType::Model, "main", &o).unwrap_err();
        assert!(matches!(err, Error::InvalidRepoId { .. }), "{bad}: {err}");
    }
    let err = hf_hub_download("org/m", "../../escape", RepoType::Model, "main", &o).unwrap_err();
    assert!(matches!(err, Error::EntryNotFound { .. }), "{err}");
    assert_eq!(
        server.requests().len(),
        before,
        "invalid input sent no request"
    );
    Ok(())
}

#[test]
fn a_revision_with_slashes_is_percent_encoded_and_cached_as_nested_refs() -> Result<()> {
    let main = temp_dir("hub-rev-main");
    write(&main, &[("README.md", b"---\n---\n"), ("script.py", b"")]);
    let export = temp_dir("hub-rev-export");
    write(&export, &[("default/train/0000.parquet", b"PAR1 exported")]);
    let cache = temp_dir("hub-rev-cache");
    let server = HubServer::builder()
        .dataset("org/scripted", "main", &*main)
        .dataset("org/scripted", "refs/convert/parquet", &*export)
        .start();
    let o = options(&cache, server.endpoint());
    let rev = "refs/convert/parquet";
    let info = repo_info("org/scripted", RepoType::Dataset, rev, &o)?;
    assert_eq!(info.siblings, ["default/train/0000.parquet"]);
    let path = hf_hub_download(
        "org/scripted",
        "default/train/0000.parquet",
        RepoType::Dataset,
        rev,
        &o,
    )?;
    assert_eq!(std::fs::read(&path)?, b"PAR1 exported");
    let paths: Vec<String> = server.requests().into_iter().map(|r| r.path).collect();
    assert!(
        paths.contains(&"/api/datasets/org/scripted/revision/refs%2Fconvert%2Fparquet".to_string()),
        "{paths:?}"
    );
    assert!(
        paths.iter().any(|p| p
            .starts_with("/datasets/org/scripted/resolve/refs%2Fconvert%2Fparquet/default/train/")),
        "{paths:?}"
    );
    let refs = cache.join("datasets--org--scripted/refs/refs/convert/parquet");
    assert_eq!(std::fs::read_to_string(refs)?, info.sha);
    let offline = HubOptions { offline: true, ..o };
    assert_eq!(
        cached_repo_info("org/scripted", RepoType::Dataset, rev, &cache)
            .unwrap()
            .siblings,
        info.siblings
    );
    assert_eq!(
        hf_hub_download(
            "org/scripted",
            "default/train/0000.parquet",
            RepoType::Dataset,
            rev,
            &offline
        )?,
        path
    );
    Ok(())
}

#[test]
fn the_token_is_sent_as_a_bearer_header() -> Result<()> {
    let repo = temp_dir("hub-token-repo");
    write(&repo, &[("a.txt", b"a")]);
    let cache = temp_dir("hub-token-cache");
    let server = HubServer::builder()
        .dataset("org/private", "main", &*repo)
        .start();
    let o = HubOptions {
        token: Some("hf_secret".into()),
        ..options(&cache, server.endpoint())
    };
    let info = repo_info("org/private", RepoType::Dataset, "main", &o)?;
    hf_hub_download("org/private", "a.txt", RepoType::Dataset, &info.sha, &o)?;
    let requests = server.requests();
    assert!(requests.len() >= 3, "{requests:?}");
    for r in &requests {
        assert_eq!(
            r.authorization.as_deref(),
            Some("Bearer hf_secret"),
            "{r:?}"
        );
    }
    Ok(())
}

/// A server answering every request with `status` and `body`.
fn serve_raw(status: u16, body: &'static str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming().take(8) {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 2 {
                line.clear();
            }
            let _ = write!(
                stream,
                "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

#[test]
fn a_broken_answer_is_an_error_not_a_panic() {
    let cache = temp_dir("hub-bad-cache");
    for (status, body, want) in [
        (200, "not json", "not repository info JSON"),
        (
            200,
            r#"{"sha": "../../etc", "siblings": []}"#,
            "not a commit hash",
        ),
        (
            200,
            r#"{"sha": "abc123", "siblings": [{"rfilename": "../x"}]}"#,
            "leaves the repository",
        ),
        (200, r#"{"siblings": []}"#, "not repository info JSON"),
        (500, "boom", "HTTP 500"),
    ] {
        let o = options(&cache, &serve_raw(status, body));
        let err = repo_info("org/ds", RepoType::Dataset, "main", &o).unwrap_err();
        assert!(err.to_string().contains(want), "{body}: {err}");
    }
    // A file answer without the headers hf-hub needs.
    let o = options(&cache, &serve_raw(200, "data"));
    let err = hf_hub_download("org/ds", "a.txt", RepoType::Dataset, "main", &o).unwrap_err();
    assert!(matches!(err, Error::InvalidResponse { .. }), "{err}");
    assert!(!cache.join("datasets--org--ds/snapshots").exists());
}

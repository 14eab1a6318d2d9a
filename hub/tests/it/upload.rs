//! Pushing to the local hub server: `create_repo` (a name alone put in the token's namespace,
//! an existing repository accepted), `upload_folder` (regular files inline, weights through
//! the LFS batch API, ignore patterns, `path_in_repo`), the pushed files downloaded back with
//! `hf_hub_download`; a failing commit is an error naming the status. The server's side of
//! the protocol is checked against huggingface_hub itself: its `upload_folder` pushes to the
//! same server and lands the same files.

use std::path::Path;
use std::process::Command;

use anyhow::{Result, ensure};
use tchtrain_hub::{
    Error, HubOptions, RepoType, UploadFolder, create_repo, hf_hub_download, upload_folder,
};
use tchtrain_testing::{HubServer, temp_dir};

fn options(cache: &Path, endpoint: &str) -> HubOptions {
    HubOptions {
        revision: "main".into(),
        cache_dir: cache.to_path_buf(),
        endpoint: endpoint.into(),
        offline: false,
        token: Some("hf_test_token".into()),
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

#[test]
fn upload_folder_commits_regular_and_lfs_files() -> Result<()> {
    let server = HubServer::builder().start();
    let cache = temp_dir("hub-up-cache");
    let o = options(&cache, server.endpoint());
    let repo_id = create_repo("tiny-run", None, &o)?;
    ensure!(repo_id == "tchtrain-user/tiny-run", "{repo_id}");
    // Existing: accepted, the id read from the 409 answer (a bare name too).
    ensure!(create_repo("tchtrain-user/tiny-run", Some(false), &o)? == "tchtrain-user/tiny-run");
    ensure!(create_repo("tiny-run", None, &o)? == "tchtrain-user/tiny-run");
    let folder = temp_dir("hub-up-folder");
    let weights: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
    write(
        &folder,
        &[
            ("config.json", b"{\"a\": 1}"),
            ("model.safetensors", &weights),
            ("README.md", b"# card\n"),
            ("_private.txt", b"x"),
            ("checkpoint-5/model.safetensors", b"old"),
            ("sub/notes.txt", b"notes"),
        ],
    );
    let info = upload_folder(
        &UploadFolder {
            repo_id: &repo_id,
            folder: &folder,
            path_in_repo: None,
            commit_message: "End of training",
            revision: None,
            ignore_patterns: &["_*", "checkpoint-*"],
        },
        &o,
    )?;
    let commits = server.commits();
    ensure!(commits.len() == 1);
    let c = &commits[0];
    ensure!(c.message == "End of training" && c.oid == info.oid);
    let mut files = c.files.clone();
    files.sort();
    ensure!(
        files
            == [
                "README.md",
                "config.json",
                "model.safetensors",
                "sub/notes.txt"
            ],
        "{files:?}"
    );
    ensure!(c.lfs_files == ["model.safetensors"], "{:?}", c.lfs_files);
    // Downloaded back at the new commit.
    let path = hf_hub_download(&repo_id, "model.safetensors", RepoType::Model, "main", &o)?;
    ensure!(std::fs::read(path)? == weights);
    // Into a subfolder.
    upload_folder(
        &UploadFolder {
            repo_id: &repo_id,
            folder: &folder.join("sub"),
            path_in_repo: Some("last-checkpoint"),
            commit_message: "Training in progress, step 5, checkpoint",
            revision: None,
            ignore_patterns: &[],
        },
        &o,
    )?;
    ensure!(
        server
            .pushed_file(&repo_id, "main", "last-checkpoint/notes.txt")
            .as_deref()
            == Some(&b"notes"[..])
    );
    // A failing commit: an error naming the status, nothing committed.
    server.fail_commits(true);
    let err = upload_folder(
        &UploadFolder {
            repo_id: &repo_id,
            folder: &folder.join("sub"),
            path_in_repo: None,
            commit_message: "fails",
            revision: None,
            ignore_patterns: &[],
        },
        &o,
    )
    .unwrap_err();
    ensure!(matches!(err, Error::Http { status: 500, .. }), "{err}");
    ensure!(server.commits().len() == 2);
    // Every request carried the token.
    ensure!(
        server
            .requests()
            .iter()
            .filter(|r| r.path.starts_with("/api/"))
            .all(|r| r.authorization.as_deref() == Some("Bearer hf_test_token"))
    );
    Ok(())
}

/// A server that asks for large LFS objects in parts (the hub's multipart transfer): the
/// 70,000-byte weights go up as five `PUT`s of 16 KiB parts to the numbered URLs, in order,
/// then one completion `POST`; the small LFS file stays a single `PUT`; the commit lands and
/// the weights download back equal. A server answering with too few part URLs is an error
/// naming the batch endpoint.
#[test]
fn large_lfs_files_go_up_in_parts_when_the_server_asks() -> Result<()> {
    let server = HubServer::builder().multipart_chunk_size(16 * 1024).start();
    let cache = temp_dir("hub-multipart-cache");
    let o = options(&cache, server.endpoint());
    let repo_id = create_repo("parts", None, &o)?;
    let folder = temp_dir("hub-multipart-folder");
    let weights: Vec<u8> = (0..70_000u32).map(|i| (i * 7 % 251) as u8).collect();
    write(
        &folder,
        &[("model.safetensors", &weights), ("optimizer.pt", b"small")],
    );
    let info = upload_folder(
        &UploadFolder {
            repo_id: &repo_id,
            folder: &folder,
            path_in_repo: None,
            commit_message: "in parts",
            revision: None,
            ignore_patterns: &[],
        },
        &o,
    )?;
    let commits = server.commits();
    ensure!(commits.len() == 1 && commits[0].oid == info.oid);
    let mut lfs = commits[0].lfs_files.clone();
    lfs.sort();
    ensure!(lfs == ["model.safetensors", "optimizer.pt"], "{lfs:?}");
    let requests = server.requests();
    let parts: Vec<&str> = requests
        .iter()
        .filter(|r| r.path.contains("/lfs-part/"))
        .map(|r| r.path.rsplit('/').next().unwrap_or_default())
        .collect();
    ensure!(parts == ["1", "2", "3", "4", "5"], "{parts:?}");
    ensure!(
        requests
            .iter()
            .filter(|r| r.method == "POST" && r.path.contains("/lfs-complete/"))
            .count()
            == 1
    );
    ensure!(
        requests
            .iter()
            .filter(|r| r.method == "PUT" && r.path.contains("/lfs-upload/"))
            .count()
            == 1,
        "the small file: one PUT"
    );
    let path = hf_hub_download(&repo_id, "model.safetensors", RepoType::Model, "main", &o)?;
    ensure!(std::fs::read(path)? == weights);
    Ok(())
}

/// huggingface_hub's own `upload_folder` against the same server, with basic and with
/// multipart LFS transfers: the server speaks the protocol the real client speaks.
#[test]
fn huggingface_hub_pushes_to_the_test_server() -> Result<()> {
    for chunk in [None, Some(16 * 1024)] {
        huggingface_hub_push(chunk)?;
    }
    Ok(())
}

fn huggingface_hub_push(chunk: Option<usize>) -> Result<()> {
    let Some(python) = std::env::var_os("TCHTRAIN_VENV_PYTHON") else {
        panic!(
            "TCHTRAIN_VENV_PYTHON is not set: it names the setup virtualenv's python (with huggingface_hub); run `cargo xtask setup`"
        );
    };
    let server = match chunk {
        Some(c) => HubServer::builder().multipart_chunk_size(c).start(),
        None => HubServer::builder().start(),
    };
    let folder = temp_dir("hub-up-python");
    let weights: Vec<u8> = (0..50_000u32).map(|i| (i % 253) as u8).collect();
    write(
        &folder,
        &[("config.json", b"{}"), ("model.safetensors", &weights)],
    );
    let script = format!(
        "from huggingface_hub import HfApi\n\
         api = HfApi(endpoint={endpoint:?}, token='hf_test_token')\n\
         url = api.create_repo('py-run', exist_ok=True)\n\
         info = api.upload_folder(repo_id=url.repo_id, folder_path={folder:?}, commit_message='from python')\n\
         print(url.repo_id, info.oid)\n",
        endpoint = server.endpoint(),
        folder = folder.display().to_string(),
    );
    let out = Command::new(python)
        .args(["-c", &script])
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env("HF_HUB_DISABLE_XET", "1")
        .output()?;
    ensure!(
        out.status.success(),
        "huggingface_hub failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let commits = server.commits();
    ensure!(commits.len() == 1, "{commits:?}");
    ensure!(commits[0].repo_id == "tchtrain-user/py-run" && commits[0].message == "from python");
    ensure!(
        commits[0].lfs_files == ["model.safetensors"],
        "{:?}",
        commits[0]
    );
    ensure!(
        server.pushed_file("tchtrain-user/py-run", "main", "model.safetensors") == Some(weights)
    );
    // 50,000 bytes in parts of 16 KiB: four parts.
    let parts = server
        .requests()
        .iter()
        .filter(|r| r.path.contains("/lfs-part/"))
        .count();
    ensure!(
        parts == if chunk.is_some() { 4 } else { 0 },
        "{chunk:?}: {parts} parts"
    );
    Ok(())
}

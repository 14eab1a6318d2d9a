//! W&B artifacts as wandb 0.31 logs them from an offline run (`run.log_artifact`): every file
//! copied read-only into the staging folder (`<WANDB_DATA_DIR>/artifacts/staging/tmpXXXXXXXX`,
//! `WANDB_DATA_DIR` by default `~/.local/share/wandb`), an MD5 manifest of them, and an
//! `ArtifactRecord` in the run's transaction log pointing at the staged copies, which `wandb
//! sync` uploads; online, the artifact sent to the server as wandb-core sends it
//! ([`Artifact::upload`]).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use md5::{Digest, Md5};
use tchtrain_training_args::{JsonMap, JsonValue, dumps_compact};

use crate::error::{Error, Result};
use crate::mlflow_rest::base64;
use crate::protobuf::Proto;

/// wandb's `NAME_MAXLEN` for artifact names.
const NAME_MAXLEN: usize = 128;

/// One file of the manifest (`ArtifactManifestEntry`).
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    /// The file's path in the artifact.
    path: String,
    /// Base64 of its MD5.
    digest: String,
    size: u64,
    /// The staged copy.
    local_path: PathBuf,
    /// `new_file`'s files skip wandb's download cache; `add_dir`'s do not.
    skip_cache: bool,
}

/// A draft artifact: its name, type, metadata and files.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Artifact {
    name: String,
    kind: String,
    metadata: JsonMap,
    entries: Vec<Entry>,
    staging: PathBuf,
}

/// wandb's `get_staging_dir()` under `data_dir`.
pub(crate) fn staging_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("artifacts").join("staging")
}

fn io(action: &'static str, path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

impl Artifact {
    /// `wandb.Artifact(name, type, metadata)`, its files staged under `staging`; refuses the
    /// names wandb refuses (longer than 128 characters, or holding `/`).
    pub(crate) fn new(name: &str, kind: &str, metadata: JsonMap, staging: &Path) -> Result<Self> {
        let reason = match () {
            _ if name.chars().count() > NAME_MAXLEN => {
                Some(format!("longer than {NAME_MAXLEN} characters"))
            }
            _ if name.contains('/') => Some("it holds '/'".to_string()),
            _ => None,
        };
        if let Some(reason) = reason {
            return Err(Error::WandbArtifact {
                name: name.to_string(),
                reason: format!(
                    "W&B refuses this artifact name ({reason}); it is `model-` and the run's name: set a run_name without '/' or unset WANDB_LOG_MODEL"
                ),
            });
        }
        std::fs::create_dir_all(staging).map_err(|e| io("creating", staging, e))?;
        Ok(Self {
            name: name.to_string(),
            kind: kind.to_string(),
            metadata,
            entries: Vec::new(),
            staging: staging.to_path_buf(),
        })
    }

    /// `artifact.new_file(name)` written with `bytes` (a file that skips the cache).
    pub(crate) fn new_file(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        self.stage(name, Path::new(name), bytes, true)
    }

    /// `artifact.add_file(path, name)` for a `new_file`-like file already on disk (the
    /// model the Trainer saved for the artifact): staged as a copy, skipping the cache.
    pub(crate) fn add_file_skipping_cache(&mut self, name: &str, path: &Path) -> Result<()> {
        self.add_file(name, path, true)
    }

    /// `artifact.add_dir(dir)`: every file under `dir` (symbolic links followed), named by
    /// its path relative to `dir`.
    pub(crate) fn add_dir(&mut self, dir: &Path) -> Result<()> {
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            let listing = std::fs::read_dir(&d).map_err(|e| io("listing", &d, e))?;
            for entry in listing {
                let path = entry.map_err(|e| io("listing", &d, e))?.path();
                let meta = std::fs::metadata(&path).map_err(|e| io("reading", &path, e))?;
                if meta.is_dir() {
                    stack.push(path);
                } else {
                    let relative = path.strip_prefix(dir).unwrap_or(&path);
                    let name = relative
                        .components()
                        .map(|c| c.as_os_str().to_string_lossy())
                        .collect::<Vec<_>>()
                        .join("/");
                    self.add_file(&name, &path, false)?;
                }
            }
        }
        Ok(())
    }

    fn add_file(&mut self, name: &str, path: &Path, skip_cache: bool) -> Result<()> {
        let source = std::fs::File::open(path).map_err(|e| io("reading", path, e))?;
        self.stage(name, path, source, skip_cache)
    }

    /// A new file in the staging folder, named as Python's `NamedTemporaryFile` names it.
    fn staged_file(&self) -> Result<(PathBuf, std::fs::File)> {
        loop {
            let name =
                crate::checksum_time::random_chars(b"abcdefghijklmnopqrstuvwxyz0123456789_", 8);
            let path = self.staging.join(format!("tmp{name}"));
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(file) => return Ok((path, file)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io("creating", &path, e)),
            }
        }
    }

    /// Copies `source` (read from `origin`) into a new staged file, its MD5 and size taken as it is copied (one
    /// pass, a buffer at a time: a model's weights are never held whole), and makes the copy
    /// read-only as wandb does.
    fn stage(
        &mut self,
        name: &str,
        origin: &Path,
        mut source: impl Read,
        skip_cache: bool,
    ) -> Result<()> {
        let (local_path, mut file) = self.staged_file()?;
        let (mut hasher, mut size, mut buf) = (Md5::new(), 0u64, vec![0u8; 1 << 20]);
        loop {
            let n = match source.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io("reading", origin, e)),
            };
            hasher.update(&buf[..n]);
            size += n as u64;
            file.write_all(&buf[..n])
                .map_err(|e| io("writing", &local_path, e))?;
        }
        file.sync_all().map_err(|e| io("writing", &local_path, e))?;
        drop(file);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&local_path, std::fs::Permissions::from_mode(0o400))
                .map_err(|e| io("protecting", &local_path, e))?;
        }
        self.entries.retain(|e| e.path != name);
        self.entries.push(Entry {
            path: name.to_string(),
            digest: base64(&hasher.finalize()),
            size,
            local_path,
            skip_cache,
        });
        Ok(())
    }

    /// The artifact's digest (`ArtifactManifestV1.digest()`): the MD5 of the manifest's
    /// header and each `path:digest` line, the paths sorted.
    pub(crate) fn digest(&self) -> String {
        let mut hasher = Md5::new();
        hasher.update(b"wandb-artifact-manifest-v1\n");
        for e in self.sorted_entries() {
            hasher.update(format!("{}:{}\n", e.path, e.digest).as_bytes());
        }
        hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn sorted_entries(&self) -> Vec<&Entry> {
        let mut entries: Vec<&Entry> = self.entries.iter().collect();
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        entries
    }

    /// The `ArtifactRecord` `run.log_artifact(artifact, aliases)` writes to an offline run's
    /// log: `latest` added to the aliases, the manifest inline with the staged paths.
    pub(crate) fn record(
        &self,
        run_id: &str,
        project: &str,
        entity: Option<&str>,
        aliases: &[String],
    ) -> Proto {
        let mut a = Proto::default();
        a.string(1, run_id);
        a.string(2, project);
        if let Some(e) = entity {
            a.string(3, e);
        }
        a.string(4, &self.kind);
        a.string(5, &self.name);
        a.string(6, &self.digest());
        if !self.metadata.is_empty() {
            a.string(
                8,
                &dumps_compact(&JsonValue::Object(self.metadata.clone()), false),
            );
        }
        a.string(11, "latest");
        for alias in aliases.iter().filter(|a| a.as_str() != "latest") {
            a.string(11, alias);
        }
        let mut manifest = Proto::default();
        manifest.int(1, 1);
        manifest.string(2, "wandb-storage-policy-v1");
        let mut layout = Proto::default();
        layout.string(1, "storageLayout");
        layout.string(2, "\"V2\"");
        manifest.message(3, &layout);
        for e in self.sorted_entries() {
            let mut entry = Proto::default();
            entry.string(1, &e.path);
            entry.string(2, &e.digest);
            if e.size != 0 {
                entry.int(4, e.size as i64);
            }
            entry.string(6, &e.local_path.to_string_lossy());
            if e.skip_cache {
                entry.bool(8, true);
            }
            manifest.message(4, &entry);
        }
        a.message(12, &manifest);
        a.bool(14, true);
        a.string(15, &client_id());
        a.string(16, &client_id());
        a.string(20, "MANIFEST_MD5");
        a
    }
}

/// Files this large W&B uploads in parts (wandb-core's multipart threshold), which is not
/// implemented here.
const MULTIPART_THRESHOLD: u64 = 2 * 1024 * 1024 * 1024;

impl Artifact {
    /// The artifact's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Whether every file can be uploaded in one request (none reaches 2 GiB).
    pub(crate) fn uploads_whole(&self) -> bool {
        self.entries.iter().all(|e| e.size < MULTIPART_THRESHOLD)
    }

    /// The SDK's check before `run.log_artifact` online: the type of `<name>:latest` on the
    /// server; `Ok(Err(..))` when it is another type (wandb's refusal).
    pub(crate) fn check_type(
        &self,
        api: &crate::wandb_api::WandbApi,
        run: &crate::wandb_api::RunPath,
    ) -> Result<Result<()>> {
        let existing =
            api.artifact_type(&run.entity, &run.project, &format!("{}:latest", self.name))?;
        Ok(match existing {
            Some(t) if t != self.kind => Err(Error::WandbArtifact {
                name: self.name.clone(),
                reason: format!(
                    "Artifact {} already exists with type '{t}'; cannot create another with type '{}'",
                    self.name, self.kind
                ),
            }),
            _ => Ok(()),
        })
    }

    /// `run.log_artifact(artifact, aliases)` online after [`check_type`](Self::check_type),
    /// as wandb-core sends it: `CreateArtifact` (the aliases with `latest`, the manifest's digest, the metadata,
    /// the run and its history step), the manifest created, the files asked for and each
    /// uploaded to the URL handed out (none when the server already has it), the manifest
    /// (wandb-core's `wandb_manifest.json`: the staged paths, the new artifact as each file's
    /// birth artifact) created again with its MD5 and uploaded, `CommitArtifact`; then, as
    /// wandb-core does, the staged copies removed, those that do not skip the cache kept in
    /// wandb's artifact cache (`<cache_dir>/artifacts/obj/md5/<2 hex>/<30 hex>`).
    pub(crate) fn upload(
        &self,
        api: &crate::wandb_api::WandbApi,
        run: &crate::wandb_api::RunPath,
        aliases: &[String],
        history_step: Option<i64>,
        cache_dir: &Path,
    ) -> Result<()> {
        use serde_json::{Value, json};
        let mut all_aliases = vec!["latest".to_string()];
        all_aliases.extend(aliases.iter().filter(|a| a.as_str() != "latest").cloned());
        let metadata = if self.metadata.is_empty() {
            Value::Null
        } else {
            Value::String(dumps_compact(
                &JsonValue::Object(self.metadata.clone()),
                false,
            ))
        };
        let artifact_id = api.create_artifact(json!({
            "aliases": all_aliases
                .iter()
                .map(|a| json!({"alias": a, "artifactCollectionName": self.name}))
                .collect::<Vec<_>>(),
            "artifactCollectionName": self.name,
            "artifactCollectionNames": null,
            "artifactTypeName": self.kind,
            "clientID": client_id(),
            "clientMutationId": null,
            "description": null,
            "digest": self.digest(),
            "digestAlgorithm": "MANIFEST_MD5",
            "distributedID": null,
            "enableDigestDeduplication": true,
            "entityName": run.entity,
            "historyStep": history_step,
            "labels": null,
            "metadata": metadata,
            "projectName": run.project,
            "runName": run.run,
            "sequenceClientID": client_id(),
            "storageRegion": null,
            "ttlDurationSeconds": null,
        }))?;
        let manifest_variables = |digest: &str, include_upload: bool| {
            json!({
                "artifactID": artifact_id,
                "baseArtifactID": null,
                "name": "wandb_manifest.json",
                "digest": digest,
                "entityName": run.entity,
                "projectName": run.project,
                "runName": run.run,
                "manifestType": "FULL",
                "includeUpload": include_upload,
            })
        };
        let (manifest_id, _) = api.create_artifact_manifest(manifest_variables("", false))?;
        let entries = self.sorted_entries();
        let uploads = api.create_artifact_files(
            json!({
                "artifactFiles": entries
                    .iter()
                    .map(|e| json!({
                        "artifactID": artifact_id,
                        "artifactManifestID": manifest_id,
                        "md5": e.digest,
                        "mimetype": null,
                        "name": e.path,
                        "uploadPartsInput": null,
                    }))
                    .collect::<Vec<_>>(),
                "clientMutationId": null,
                "cloudRegionID": null,
                "storageLayout": "V2",
            }),
            entries.len(),
        )?;
        for (entry, upload) in entries.iter().zip(uploads) {
            if let Some((url, headers)) = upload {
                api.put_file(&entry.path, &url, &headers, &entry.local_path, entry.size)?;
            }
        }
        // wandb-core's manifest: its fields in its order, the files by path.
        let mut contents = JsonMap::new();
        for e in &entries {
            let mut entry = JsonMap::new();
            entry.insert("digest", e.digest.as_str());
            entry.insert("size", e.size as i64);
            entry.insert("local_path", e.local_path.to_string_lossy().into_owned());
            entry.insert("birthArtifactID", artifact_id.as_str());
            entry.insert("skip_cache", e.skip_cache);
            contents.insert(e.path.as_str(), JsonValue::Object(entry));
        }
        let mut layout = JsonMap::new();
        layout.insert("storageLayout", "V2");
        let mut manifest = JsonMap::new();
        manifest.insert("version", 1i64);
        manifest.insert("storagePolicy", "wandb-storage-policy-v1");
        manifest.insert("storagePolicyConfig", JsonValue::Object(layout));
        manifest.insert("contents", JsonValue::Object(contents));
        let manifest = dumps_compact(&JsonValue::Object(manifest), false);
        let digest = base64(&Md5::digest(manifest.as_bytes()));
        let (_, upload) = api.create_artifact_manifest(manifest_variables(&digest, true))?;
        let (url, headers) = upload.ok_or_else(|| Error::WandbArtifact {
            name: self.name.clone(),
            reason: "the server handed out no upload URL for the manifest".into(),
        })?;
        api.put("wandb_manifest.json", &url, &headers, manifest.as_bytes())?;
        api.commit_artifact(&artifact_id)?;
        for e in &entries {
            if !e.skip_cache {
                let hex: String = base64_decode_hex(&e.digest);
                let cached = cache_dir
                    .join("artifacts")
                    .join("obj")
                    .join("md5")
                    .join(&hex[..2])
                    .join(&hex[2..]);
                if !cached.exists() {
                    if let Some(parent) = cached.parent() {
                        std::fs::create_dir_all(parent)
                            .map_err(|err| io("creating", parent, err))?;
                    }
                    std::fs::copy(&e.local_path, &cached)
                        .map_err(|err| io("caching", &cached, err))?;
                    #[cfg(unix)]
                    {
                        use std::os::unix::fs::PermissionsExt;
                        let _ = std::fs::set_permissions(
                            &cached,
                            std::fs::Permissions::from_mode(0o666),
                        );
                    }
                }
            }
            let _ = std::fs::remove_file(&e.local_path);
        }
        Ok(())
    }
}

/// The hex digits of a base64 MD5.
fn base64_decode_hex(b64: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut n = 0;
    let mut out = String::new();
    for c in b64.bytes().take_while(|c| *c != b'=') {
        let Some(v) = ALPHABET.iter().position(|a| *a == c) else {
            continue;
        };
        bits = (bits << 6) | v as u32;
        n += 6;
        if n >= 8 {
            n -= 8;
            out.push_str(&format!("{:02x}", (bits >> n) & 0xff));
        }
    }
    out
}

/// wandb's client ids (`generate_fast_id(128)`): 128 characters of `[a-z0-9]`.
fn client_id() -> String {
    crate::checksum_time::random_chars(b"abcdefghijklmnopqrstuvwxyz0123456789", 128)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// wandb's `md5_string` / `b64_from_hasher` and `ArtifactManifestV1.digest()` on the files
    /// of an artifact holding `x.txt` = "hi" (from wandb 0.31 in Python).
    #[test]
    fn digests_are_wandbs() -> Result<()> {
        assert_eq!(base64(&Md5::digest(b"hi")), "SfaKXIST7CwL9ImCHCH8Ow==");
        let staging =
            std::env::temp_dir().join(format!("tchtrain-wandb-artifact-{}", std::process::id()));
        let mut a = Artifact::new("m-1", "model", JsonMap::new(), &staging)?;
        a.new_file("x.txt", b"hi")?;
        assert_eq!(a.digest(), "307b6aed2b1eb15ba124123ab4d463f4");
        let _ = std::fs::remove_dir_all(&staging);
        assert!(Artifact::new("a/b", "model", JsonMap::new(), &staging).is_err());
        assert_eq!(
            base64_decode_hex("rtVj7K+0vMVlTFl6QhVHsg=="),
            "aed563ecafb4bcc5654c597a421547b2"
        );
        Ok(())
    }
}

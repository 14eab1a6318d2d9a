//! Pushing to the hub (upstream `Trainer.init_hf_repo`, `push_to_hub`, `_push_from_checkpoint`):
//! the repository created at build when `push_to_hub` is set (`hub_model_id`, else
//! `output_dir`'s name; `hub_private_repo`; `hub_token`, else the environment's token; the
//! endpoint from `HF_ENDPOINT`), then by `hub_strategy`:
//!
//! - `every_save`, `checkpoint`, `all_checkpoints`: at each checkpoint, its model files copied
//!   into `output_dir` with the processing class and the arguments, and `output_dir`
//!   committed ("Training in progress, step N" / "epoch N", the `checkpoint-*` folders and `_*`
//!   left out); `checkpoint` also commits the checkpoint as `last-checkpoint/`,
//!   `all_checkpoints` under its own name (", checkpoint");
//! - `end`: nothing until [`Trainer::push_to_hub`], which saves the model, writes the model
//!   card and commits `output_dir` ("End of training").
//!
//! `Trainer::save_model` does not push (upstream's public `save_model` commits "Model save"
//! when `push_to_hub` is set; here `save_model` is also the Trainer's own saver): the example
//! scripts push after it, as upstream's do through it.
//!
//! Pushes run synchronously (upstream's checkpoint pushes run in the background), so
//! `hub_always_push` has nothing to wait on. A checkpoint push that fails is logged and
//! training goes on (the checkpoint is on disk); [`Trainer::push_to_hub`] returns the error
//! after the model and its card are saved locally.

use std::path::Path;

use tchtrain_hub::{CommitInfo, HubOptions, UploadFolder, create_repo, upload_folder};
use tchtrain_training_args::{HubStrategy, SaveStrategy};

use crate::error::{Error, Result};
use crate::modelcard::ModelCardOptions;
use crate::trainer::Trainer;

const IGNORE: [&str; 2] = ["_*", "checkpoint-*"];

impl Trainer {
    fn hub_options(&self) -> HubOptions {
        let mut options = HubOptions::from_env();
        if let Some(t) = &self.args.hub_token {
            options.token = Some(t.clone());
        }
        options
    }

    fn hub_error(e: tchtrain_hub::Error) -> Error {
        Error::Hub(e.to_string())
    }

    /// Upstream `init_hf_repo`: creates (or finds) the repository; its id (in the token's
    /// namespace when `hub_model_id` names no organisation) is where pushes go.
    pub fn init_hf_repo(&mut self) -> Result<()> {
        if !self.is_world_process_zero() {
            return Ok(());
        }
        let name = match &self.args.hub_model_id {
            Some(id) => id.clone(),
            None => std::path::absolute(self.args.output_dir())
                .ok()
                .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_else(|| self.args.output_dir().to_string()),
        };
        let id = create_repo(&name, self.args.hub_private_repo, &self.hub_options())
            .map_err(Self::hub_error)?;
        self.hub_model_id = Some(id);
        Ok(())
    }

    /// The repository pushes go to (after [`init_hf_repo`](Self::init_hf_repo)).
    pub fn hub_model_id(&self) -> Option<&str> {
        self.hub_model_id.as_deref()
    }

    fn upload(
        &self,
        folder: &Path,
        path_in_repo: Option<&str>,
        message: &str,
        ignore: &[&str],
    ) -> Result<CommitInfo> {
        let repo_id = self.hub_model_id.as_deref().ok_or_else(|| {
            Error::Hub("no hub repository: call init_hf_repo (push_to_hub does it)".into())
        })?;
        upload_folder(
            &UploadFolder {
                repo_id,
                folder,
                path_in_repo,
                commit_message: message,
                revision: self.args.hub_revision.as_deref(),
                ignore_patterns: ignore,
            },
            &self.hub_options(),
        )
        .map_err(Self::hub_error)
    }

    /// Upstream `push_to_hub(commit_message, **kwargs)`: saves the model, writes the model
    /// card (`options`, its `model_name` defaulting to `hub_model_id`'s name or `output_dir`'s)
    /// and commits `output_dir` (without `checkpoint-*` and `_*`). `None` on the processes
    /// that do not push.
    pub fn push_to_hub(
        &mut self,
        commit_message: Option<&str>,
        mut options: ModelCardOptions,
    ) -> Result<Option<CommitInfo>> {
        self.callback_handler
            .on_push_begin(&self.args, &self.state, &mut self.control)?;
        if options.model_name.is_none() && self.args.should_save() {
            options.model_name = Some(match &self.args.hub_model_id {
                Some(id) => id.rsplit('/').next().unwrap_or(id).to_string(),
                None => Path::new(self.args.output_dir())
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            });
        }
        if self.hub_model_id.is_none() {
            self.init_hf_repo()?;
        }
        self.save_model(None)?;
        if !self.is_world_process_zero() {
            return Ok(None);
        }
        self.create_model_card(options)?;
        let output_dir = self.args.output_dir().to_string();
        self.upload(
            Path::new(&output_dir),
            None,
            commit_message.unwrap_or("End of training"),
            &IGNORE,
        )
        .map(Some)
    }

    /// Upstream `_push_from_checkpoint` (see the module documentation).
    pub(crate) fn push_from_checkpoint(&mut self, checkpoint: &Path) -> Result<()> {
        if !self.is_world_process_zero() || self.args.hub_strategy == HubStrategy::End {
            return Ok(());
        }
        self.callback_handler
            .on_push_begin(&self.args, &self.state, &mut self.control)?;
        let output_dir = std::path::PathBuf::from(self.args.output_dir());
        let mut files: Vec<String> = [
            "config.json",
            "generation_config.json",
            "pytorch_model.bin",
            "model.safetensors",
            "adapter_config.json",
            "adapter_model.bin",
            "adapter_model.safetensors",
        ]
        .map(String::from)
        .to_vec();
        for index in [
            "pytorch_model.bin.index.json",
            "model.safetensors.index.json",
        ] {
            let path = checkpoint.join(index);
            if let Ok(text) = std::fs::read_to_string(&path) {
                files.push(index.into());
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text)
                    && let Some(map) = v.get("weight_map").and_then(|m| m.as_object())
                {
                    let mut shards: Vec<String> = map
                        .values()
                        .filter_map(|s| s.as_str().map(String::from))
                        .collect();
                    shards.sort();
                    shards.dedup();
                    files.extend(shards);
                }
            }
        }
        for f in &files {
            let from = checkpoint.join(f);
            if from.is_file() {
                let to = output_dir.join(f);
                std::fs::copy(&from, &to).map_err(|e| Error::io("copying", &from, e))?;
            }
        }
        self.data.save_processing_class(&output_dir)?;
        self.args
            .to_json_file(output_dir.join(crate::checkpoint::TRAINING_ARGS_NAME))?;
        let message = if self.args.save_strategy == SaveStrategy::Steps {
            format!("Training in progress, step {}", self.state.global_step)
        } else {
            format!("Training in progress, epoch {}", self.state.epoch as i64)
        };
        self.upload(&output_dir, None, &message, &IGNORE)?;
        let path_in_repo = match self.args.hub_strategy {
            HubStrategy::Checkpoint => Some("last-checkpoint".to_string()),
            HubStrategy::AllCheckpoints => checkpoint
                .file_name()
                .map(|n| n.to_string_lossy().into_owned()),
            _ => None,
        };
        if let Some(p) = path_in_repo {
            self.upload(checkpoint, Some(&p), &format!("{message}, checkpoint"), &[])?;
        }
        Ok(())
    }
}

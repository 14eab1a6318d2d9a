//! `push_to_hub` against the local hub server (the repository created at build, named by
//! `hub_model_id` or `output_dir`): each `hub_strategy`'s commits — `every_save` a commit of
//! `output_dir` per checkpoint, `checkpoint` also `last-checkpoint/`, `all_checkpoints` also
//! `checkpoint-N/`, `end` none until `push_to_hub` —, the final commit with the model card
//! (upstream's text, as `create_model_card` writes it) and the weights through LFS, the
//! pushed weights equal to the saved ones; an outage: training goes on with its checkpoints on
//! disk, and `push_to_hub` reports the error after saving the model and its card locally.

use anyhow::{Result, ensure};
use serde_json::json;
use tchtrain_testing::{HubServer, lock};
use tchtrain_trainer::{ModelCardOptions, Trainer};
use tchtrain_training_args::TrainingArguments;

use crate::common::{initial_model, small_train, temp_dir};

/// `HF_ENDPOINT` / `HF_TOKEN` set for the test (the tests hold the lock; restored after).
struct Env(Vec<(&'static str, Option<std::ffi::OsString>)>);

impl Env {
    #[allow(unsafe_code)]
    fn set(vars: &[(&'static str, &str)]) -> Self {
        let saved = vars
            .iter()
            .map(|(k, v)| {
                let old = std::env::var_os(k);
                // SAFETY: the tests of this binary hold `lock()`; no other thread reads the
                // environment meanwhile.
                unsafe { std::env::set_var(k, v) };
                (*k, old)
            })
            .collect();
        Self(saved)
    }
}

impl Drop for Env {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        for (k, v) in &self.0 {
            // SAFETY: as in `set`.
            unsafe {
                match v {
                    Some(v) => std::env::set_var(k, v),
                    None => std::env::remove_var(k),
                }
            }
        }
    }
}

fn args(dir: &std::path::Path, strategy: &str, repo: Option<&str>) -> Result<TrainingArguments> {
    let mut dict = json!({
        "output_dir": dir.display().to_string(),
        "use_cpu": true,
        "report_to": "none",
        "max_steps": 4,
        "per_device_train_batch_size": 2,
        "save_steps": 2,
        "logging_steps": 2,
        "push_to_hub": true,
        "hub_strategy": strategy,
    });
    if let Some(r) = repo {
        dict["hub_model_id"] = json!(r);
    }
    Ok(TrainingArguments::from_dict(dict.as_object().unwrap().clone())?.args)
}

#[test]
fn push_to_hub_commits_as_each_hub_strategy() -> Result<()> {
    let _g = lock();
    let server = HubServer::builder().start();
    let _env = Env::set(&[("HF_ENDPOINT", server.endpoint()), ("HF_TOKEN", "hf_test")]);
    for (strategy, extra) in [
        ("every_save", vec![]),
        ("checkpoint", vec!["last-checkpoint/"]),
        ("all_checkpoints", vec!["checkpoint-2/", "checkpoint-4/"]),
        ("end", vec![]),
    ] {
        let dir = temp_dir(&format!("push-{strategy}"));
        let repo = format!("org/tiny-{strategy}");
        let before = server.commits().len();
        let mut trainer = Trainer::builder(initial_model()?, args(&dir, strategy, Some(&repo))?)
            .train_dataset(small_train()?)
            .build()?;
        ensure!(trainer.hub_model_id() == Some(repo.as_str()));
        trainer.train(None)?;
        let info = trainer
            .push_to_hub(
                None,
                ModelCardOptions {
                    finetuned_from: Some("org/base".into()),
                    ..Default::default()
                },
            )?
            .expect("pushed");
        let commits: Vec<_> = server.commits()[before..].to_vec();
        let messages: Vec<&str> = commits.iter().map(|c| c.message.as_str()).collect();
        let expected: Vec<String> = match strategy {
            "end" => vec!["End of training".into()],
            "every_save" => vec![
                "Training in progress, step 2".into(),
                "Training in progress, step 4".into(),
                "End of training".into(),
            ],
            _ => vec![
                "Training in progress, step 2".into(),
                "Training in progress, step 2, checkpoint".into(),
                "Training in progress, step 4".into(),
                "Training in progress, step 4, checkpoint".into(),
                "End of training".into(),
            ],
        };
        ensure!(messages == expected, "{strategy}: {messages:?}");
        let last = commits.last().unwrap();
        ensure!(last.oid == info.oid);
        for f in [
            "config.json",
            "model.safetensors",
            "README.md",
            "training_args.json",
        ] {
            ensure!(
                last.files.iter().any(|p| p == f),
                "{strategy}: {f} not in {:?}",
                last.files
            );
        }
        ensure!(
            last.lfs_files == ["model.safetensors"],
            "{:?}",
            last.lfs_files
        );
        ensure!(
            !last.files.iter().any(|p| p.starts_with("checkpoint-")),
            "{strategy}: checkpoints in the final commit"
        );
        for prefix in &extra {
            ensure!(
                commits.iter().any(|c| c
                    .files
                    .iter()
                    .any(|p| p.starts_with(prefix) && p.ends_with("trainer_state.json"))),
                "{strategy}: no {prefix}trainer_state.json pushed"
            );
        }
        // What the hub holds is what was saved.
        let pushed = server
            .pushed_file(&repo, "main", "model.safetensors")
            .unwrap();
        ensure!(pushed == std::fs::read(dir.join("model.safetensors"))?);
        let card = String::from_utf8(server.pushed_file(&repo, "main", "README.md").unwrap())?;
        ensure!(card == std::fs::read_to_string(dir.join("README.md"))?);
        ensure!(
            card.contains("base_model: org/base") && card.contains(&format!("# tiny-{strategy}")),
            "{card}"
        );
        ensure!(card.contains("- training_steps: 4"), "{card}");
    }
    // Without hub_model_id: the repository is output_dir's name, in the token's namespace.
    let dir = temp_dir("push-default-name");
    let trainer = Trainer::builder(initial_model()?, args(&dir, "end", None)?)
        .train_dataset(small_train()?)
        .build()?;
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    ensure!(trainer.hub_model_id() == Some(format!("tchtrain-user/{name}").as_str()));
    Ok(())
}

#[test]
fn a_failed_push_leaves_training_and_local_files_intact() -> Result<()> {
    let _g = lock();
    let server = HubServer::builder().start();
    let _env = Env::set(&[("HF_ENDPOINT", server.endpoint()), ("HF_TOKEN", "hf_test")]);
    let dir = temp_dir("push-outage");
    let mut trainer = Trainer::builder(
        initial_model()?,
        args(&dir, "checkpoint", Some("org/outage"))?,
    )
    .train_dataset(small_train()?)
    .build()?;
    server.fail_commits(true);
    let out = trainer.train(None)?;
    ensure!(out.global_step == 4);
    ensure!(dir.join("checkpoint-2/model.safetensors").is_file());
    ensure!(dir.join("checkpoint-4/trainer_state.json").is_file());
    let err = trainer
        .push_to_hub(None, ModelCardOptions::default())
        .unwrap_err()
        .to_string();
    ensure!(err.contains("HTTP 500") && err.contains("intact"), "{err}");
    ensure!(dir.join("model.safetensors").is_file() && dir.join("README.md").is_file());
    ensure!(server.commits().is_empty());
    // The hub back: the same call pushes.
    server.fail_commits(false);
    trainer.push_to_hub(None, ModelCardOptions::default())?;
    ensure!(server.commits().len() == 1);
    Ok(())
}

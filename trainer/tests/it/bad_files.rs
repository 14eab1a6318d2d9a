//! Corrupt or foreign files: each is a typed error that names the file and says what to
//! do, before any training step. Every resume case copies one good checkpoint (tiny GPT-2,
//! step 2) into `<case>/checkpoint-2`, spoils one file, and resumes a fresh Trainer from
//! it: the error must be [`Error::InvalidCheckpoint`] naming the file and the fix, the
//! Trainer must be at step 0 with no log entry, its `output_dir` must have no checkpoint,
//! and the model must still hold its initial weights.
//!
//! The model crate's own files (a `config.json` that is not JSON, a garbage tokenizer) are
//! checked at load time the same way.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use tchtrain_testing::lock;

use anyhow::{Context, Result};
use tchtrain_models::{AutoTask, LoadOptions, TrainableModel, from_pretrained_dir};
use tchtrain_trainer::{Error, ResumeFrom, Trainer};
use tchtrain_training_args::{SaveStrategy, TrainingArguments};

use crate::common::{assets, blocks, initial_model, reference_dir, small_vocab_initial};

fn args(output_dir: &Path) -> Result<TrainingArguments> {
    let mut args = TrainingArguments {
        per_device_train_batch_size: 4,
        max_steps: 4,
        learning_rate: 1e-3,
        logging_steps: 1.0,
        save_strategy: SaveStrategy::Steps,
        save_steps: 2.0,
        seed: 7,
        use_cpu: true,
        report_to: vec![],
        disable_tqdm: true,
        ..TrainingArguments::new(output_dir.display().to_string())
    };
    args.post_init()?;
    Ok(args)
}

fn root() -> PathBuf {
    std::env::temp_dir().join(format!("tchtrain-bad-files-{}", std::process::id()))
}

/// One good checkpoint (`checkpoint-2` of a 2-step run), made once per process.
fn good_checkpoint() -> &'static Path {
    static CKPT: OnceLock<PathBuf> = OnceLock::new();
    CKPT.get_or_init(|| {
        let out = root().join("source");
        let _ = std::fs::remove_dir_all(&out);
        let mut a = args(&out).unwrap();
        a.max_steps = 2;
        let mut t = Trainer::builder(initial_model().unwrap(), a)
            .train_dataset(blocks("train", 8).unwrap())
            .build()
            .unwrap();
        t.train(None).unwrap();
        out.join("checkpoint-2")
    })
}

/// A copy of the good checkpoint as `<case>/checkpoint-2`.
fn copy_checkpoint(case: &str) -> Result<PathBuf> {
    let dir = root().join(case).join("checkpoint-2");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    for entry in std::fs::read_dir(good_checkpoint())? {
        let entry = entry?;
        std::fs::copy(entry.path(), dir.join(entry.file_name()))?;
    }
    Ok(dir)
}

/// The model's weights equal the initial model's (every tensor, exactly).
fn assert_initial_weights(model: &dyn TrainableModel) -> Result<()> {
    let initial = tchtrain_models::read_checkpoint(&small_vocab_initial())?;
    let vars = model.var_store().variables();
    assert!(!initial.is_empty());
    for (name, t) in &initial {
        let v = vars
            .get(name)
            .with_context(|| format!("{name} not in the model"))?;
        assert!(v.equal(t), "{name} was changed");
    }
    Ok(())
}

/// Resumes a fresh Trainer from `ckpt`, which must fail with an
/// [`Error::InvalidCheckpoint`] naming the checkpoint before any step (step 0, no log
/// entry, no checkpoint written, initial weights). Returns the message.
fn resume_error(case: &str, ckpt: &Path) -> Result<String> {
    let out = root().join(case).join("out");
    let mut t = Trainer::builder(initial_model()?, args(&out)?)
        .train_dataset(blocks("train", 8)?)
        .build()?;
    let err = t
        .train(Some(ResumeFrom::Path(ckpt.to_path_buf())))
        .expect_err("resuming from a bad checkpoint must fail");
    let text = err.to_string();
    assert!(
        matches!(err, Error::InvalidCheckpoint { .. }),
        "{case}: {err:?}"
    );
    assert!(
        text.contains(&ckpt.display().to_string()),
        "{case}: the error does not name the checkpoint: {text}"
    );
    assert_eq!(t.state.global_step, 0, "{case}: a step ran");
    assert!(
        t.state.log_history.is_empty(),
        "{case}: something was logged"
    );
    assert_eq!(
        tchtrain_trainer::get_last_checkpoint(&out)?,
        None,
        "{case}: a checkpoint was written"
    );
    assert_initial_weights(t.model())?;
    println!("{case}: {text}");
    let _ = std::fs::remove_dir_all(root().join(case));
    Ok(text)
}

/// [`resume_error`], whose message must also name `file` and contain `fix`.
fn expect_resume_error(case: &str, ckpt: &Path, file: &str, fix: &str) -> Result<String> {
    let text = resume_error(case, ckpt)?;
    assert!(
        text.contains(file),
        "{case}: the error does not name {file}: {text}"
    );
    assert!(
        text.contains(fix),
        "{case}: the error does not say `{fix}`: {text}"
    );
    Ok(text)
}

fn spoil(path: &Path, bytes: &[u8]) -> Result<()> {
    Ok(std::fs::write(path, bytes)?)
}

fn truncate_half(path: &Path) -> Result<()> {
    let bytes = std::fs::read(path)?;
    spoil(path, &bytes[..bytes.len() / 2])
}

const RECOPY: &str = "copy the file again from the original checkpoint";
const COPY_AGAIN: &str = "copy it again from the original checkpoint";

#[test]
fn truncated_model_safetensors() -> Result<()> {
    let _g = lock();
    let ckpt = copy_checkpoint("truncated-model")?;
    truncate_half(&ckpt.join("model.safetensors"))?;
    let text = expect_resume_error("truncated-model", &ckpt, "model.safetensors", RECOPY)?;
    assert!(text.contains("truncated"), "{text}");
    Ok(())
}

#[test]
fn truncated_optimizer_safetensors() -> Result<()> {
    let _g = lock();
    let ckpt = copy_checkpoint("truncated-optimizer")?;
    truncate_half(&ckpt.join("optimizer.safetensors"))?;
    let text = expect_resume_error(
        "truncated-optimizer",
        &ckpt,
        "optimizer.safetensors",
        RECOPY,
    )?;
    assert!(text.contains("truncated"), "{text}");
    Ok(())
}

#[test]
fn corrupt_optimizer_safetensors_header() -> Result<()> {
    let _g = lock();
    let ckpt = copy_checkpoint("corrupt-optimizer")?;
    // A plausible header length followed by bytes that are not JSON.
    let mut bytes = 16u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"\x00garbage\xffgarbage\x01 and more bytes after it");
    spoil(&ckpt.join("optimizer.safetensors"), &bytes)?;
    let text = expect_resume_error("corrupt-optimizer", &ckpt, "optimizer.safetensors", RECOPY)?;
    assert!(text.contains("unreadable header"), "{text}");
    Ok(())
}

#[test]
fn optimizer_json_not_json() -> Result<()> {
    let _g = lock();
    let ckpt = copy_checkpoint("optimizer-json")?;
    spoil(
        &ckpt.join("optimizer.json"),
        b"{\"optimizer\": \"adamw\", \"param_gr",
    )?;
    expect_resume_error("optimizer-json", &ckpt, "optimizer.json", COPY_AGAIN)?;
    Ok(())
}

#[test]
fn missing_optimizer_files() -> Result<()> {
    let _g = lock();
    let ckpt = copy_checkpoint("missing-optimizer")?;
    std::fs::remove_file(ckpt.join("optimizer.safetensors"))?;
    std::fs::remove_file(ckpt.join("optimizer.json"))?;
    let text = expect_resume_error(
        "missing-optimizer",
        &ckpt,
        "optimizer.safetensors",
        "without resume_from_checkpoint",
    )?;
    assert!(text.contains("missing"), "{text}");
    // One of the pair alone is the same incomplete copy.
    let ckpt = copy_checkpoint("missing-optimizer-json")?;
    std::fs::remove_file(ckpt.join("optimizer.json"))?;
    expect_resume_error(
        "missing-optimizer-json",
        &ckpt,
        "optimizer.json is missing",
        "copy it from the original checkpoint",
    )?;
    Ok(())
}

#[test]
fn scheduler_json_not_json() -> Result<()> {
    let _g = lock();
    let ckpt = copy_checkpoint("scheduler-json")?;
    spoil(&ckpt.join("scheduler.json"), b"\x00\x01 not a scheduler")?;
    expect_resume_error("scheduler-json", &ckpt, "scheduler.json", COPY_AGAIN)?;
    let ckpt = copy_checkpoint("scheduler-json-array")?;
    spoil(&ckpt.join("scheduler.json"), b"[1, 2, 3]")?;
    expect_resume_error("scheduler-json-array", &ckpt, "scheduler.json", COPY_AGAIN)?;
    Ok(())
}

#[test]
fn trainer_state_from_another_version() -> Result<()> {
    let _g = lock();
    let ckpt = copy_checkpoint("state-version")?;
    let path = ckpt.join("trainer_state.json");
    let mut state: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    state["field_of_a_future_version"] = serde_json::json!(true);
    spoil(&path, serde_json::to_string(&state)?.as_bytes())?;
    expect_resume_error(
        "state-version",
        &ckpt,
        "trainer_state.json",
        "put back the trainer_state.json this checkpoint was saved with",
    )?;
    Ok(())
}

#[test]
fn trainer_state_whose_global_step_is_not_the_folders() -> Result<()> {
    let _g = lock();
    let ckpt = copy_checkpoint("state-step")?;
    let path = ckpt.join("trainer_state.json");
    let mut state: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    state["global_step"] = serde_json::json!(7);
    spoil(&path, serde_json::to_string_pretty(&state)?.as_bytes())?;
    let text = expect_resume_error(
        "state-step",
        &ckpt,
        "trainer_state.json says global_step 7 but the folder is checkpoint-2",
        "put back this checkpoint's own trainer_state.json",
    )?;
    assert!(text.contains("belongs to another checkpoint"), "{text}");
    Ok(())
}

#[test]
fn checkpoint_config_json_not_json() -> Result<()> {
    let _g = lock();
    let ckpt = copy_checkpoint("config-json")?;
    spoil(&ckpt.join("config.json"), b"model_type = gpt2\n")?;
    expect_resume_error("config-json", &ckpt, "config.json", COPY_AGAIN)?;
    Ok(())
}

#[test]
fn checkpoint_of_another_architecture() -> Result<()> {
    let _g = lock();
    // Tiny Llama's folder (config.json + model.safetensors), named as a checkpoint.
    let ckpt = root().join("other-arch").join("checkpoint-2");
    let _ = std::fs::remove_dir_all(&ckpt);
    std::fs::create_dir_all(&ckpt)?;
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(assets().join("tiny-llama").join(file), ckpt.join(file))?;
    }
    // The preflight check reads config.json: the architecture, the file and the fix.
    let out = root().join("other-arch").join("out");
    let t = Trainer::builder(initial_model()?, args(&out)?)
        .train_dataset(blocks("train", 8)?)
        .build()?;
    let err = t.check_resume_checkpoint(&ckpt).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::InvalidCheckpoint { .. }), "{err:?}");
    for needle in [
        "config.json describes a LlamaForCausalLM (model_type llama)",
        "this Trainer's model is a GPT2LMHeadModel (model_type gpt2)",
        "load it with from_pretrained and train without resume_from_checkpoint",
    ] {
        assert!(text.contains(needle), "missing `{needle}`: {text}");
    }
    println!("other-arch (check_resume_checkpoint): {text}");
    // Resuming from it fails before any weight is copied: on config.json where the train
    // loop runs the check above, else on the first foreign tensor.
    let text = resume_error("other-arch", &ckpt)?;
    assert!(
        text.contains("config.json describes a LlamaForCausalLM")
            || text.contains(
                "is not a parameter of this GPT2LMHeadModel (a checkpoint of another model?)"
            ),
        "{text}"
    );
    Ok(())
}

#[test]
fn model_folder_config_json_not_json() -> Result<()> {
    let _g = lock();
    let dir = root().join("model-config");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let initial = reference_dir().join("initial");
    std::fs::copy(
        initial.join("model.safetensors"),
        dir.join("model.safetensors"),
    )?;
    spoil(&dir.join("config.json"), b"<html>404 Not Found</html>")?;
    let err = from_pretrained_dir(
        &dir,
        AutoTask::CausalLm,
        tch::Device::Cpu,
        &LoadOptions::default(),
    )
    .map(|_| ())
    .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, tchtrain_models::Error::ConfigJson { .. }),
        "{err:?}"
    );
    assert!(
        text.contains(&dir.join("config.json").display().to_string()),
        "{text}"
    );
    assert!(
        text.contains("write it again with save_pretrained"),
        "{text}"
    );
    println!("model-config: {text}");
    Ok(())
}

#[test]
fn garbage_tokenizer_files() -> Result<()> {
    let _g = lock();
    let dir = root().join("tokenizer");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    // tokenizer.json that is not a tokenizer.
    let file = dir.join("tokenizer.json");
    spoil(&file, b"\x89PNG\r\n\x1a\n not a tokenizer")?;
    let err = tchtrain_models::AutoTokenizer::from_pretrained(&dir).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, tchtrain_models::Error::Tokenizer { .. }),
        "{err:?}"
    );
    assert!(text.contains(&file.display().to_string()), "{text}");
    assert!(text.contains("tokenizer.save_pretrained(dir)"), "{text}");
    println!("tokenizer.json: {text}");
    // GPT-2's vocab.json + merges.txt with a vocabulary that is not JSON.
    let vocab = dir.join("vocab.json");
    let merges = dir.join("merges.txt");
    spoil(&vocab, b"this is not json")?;
    std::fs::copy(assets().join("gpt2-tokenizer/merges.txt"), &merges)?;
    std::fs::remove_file(&file)?;
    let err = tchtrain_models::AutoTokenizer::from_pretrained(&dir).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, tchtrain_models::Error::Tokenizer { .. }),
        "{err:?}"
    );
    assert!(text.contains(&vocab.display().to_string()), "{text}");
    assert!(text.contains("copy both again"), "{text}");
    println!("vocab.json: {text}");
    Ok(())
}

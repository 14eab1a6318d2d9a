//! The design documents' own runs, as a user runs them: each example script under
//! `cargo xtask launch --nproc-per-node 2` with its config file from `../shared/configs/`
//! unchanged, to the end, saving a checkpoint mid-run and the model at the end; then the run
//! resumed from that checkpoint, whose later steps must log exactly what the uninterrupted
//! run logged (every number, to the bit), and the saved model loaded back.
//!
//! | config | run |
//! |---|---|
//! | `ds_zero2_fp16.json` (fp16 with its dynamic loss scaler, the legacy `cpu_offload`, DeepSpeed's AdamW and WarmupLR) | `run_translation --fp16` on a tiny T5, with the document's `--learning_rate 3e-5 --adam_beta1 0.8 --weight_decay 3e-7 --warmup_steps 500 --lr_scheduler_type constant_with_warmup` |
//! | `ds_zero2_fp16.json` | the document's own model: `run_translation --fp16` on a tiny mBART (`assets/tiny-mbart`, mBART's real tokenizer) with `--source_lang en_XX --target_lang ro_RO` |
//! | `ds_zero2_short.json` (the ZeRO-2 section alone) | the same, the Trainer's optimizer and schedule |
//! | `ds_zero3_bf16_auto.json` (the DeepSpeed docs' ZeRO-3: `bf16: auto`, offload, `"auto"` sizes) | `run_clm --bf16` on tiny GPT-2 |
//! | `fsdp_gpt2_bf16.json` (`GPT2Block` units, `min_num_params`, CPU offload, `mixed_precision: "bf16"`) | `run_clm --fsdp "full_shard auto_wrap" --bf16` |

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};
use tch::{Device, Kind};
use tchtrain_callbacks::{JsonValue, TrainerState};
use tchtrain_models::{AutoTask, LoadOptions, from_pretrained_dir};
use tchtrain_testing::{asset, temp_dir};

use crate::launch::{launch_2_as_given as launch_2, strings};

/// A config file of the documents (`../shared/configs/`, beside the repository).
fn config(name: &str) -> Result<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/configs")
        .join(name);
    ensure!(
        path.is_file(),
        "{} missing: the documents' configs sit beside the repository",
        path.display()
    );
    Ok(path.display().to_string())
}

/// The numbers of `trainer_state.json`'s log history, by step, as bits (speed keys left out).
/// Log entries by step: `(step, [(key, bits)])`.
type Steps = Vec<(i64, Vec<(String, u64)>)>;

fn logged_steps(out: &Path) -> Result<Steps> {
    let state = TrainerState::load_from_json(out.join("trainer_state.json"))?;
    Ok(state
        .log_history
        .iter()
        .filter(|e| e.contains_key("loss") || e.contains_key("eval_loss"))
        .map(|e| {
            let step = e.get("step").and_then(JsonValue::as_i64).unwrap_or(-1);
            let numbers = e
                .iter()
                .filter(|(k, _)| !k.contains("runtime") && !k.contains("per_second"))
                .filter_map(|(k, v)| Some((k.to_string(), v.as_f64()?.to_bits())))
                .collect();
            (step, numbers)
        })
        .collect())
}

/// What a test checks in the uninterrupted run's output folder.
type Check<'a> = &'a dyn Fn(&Path) -> Result<()>;

/// Runs `script` with `args` to step 6 (a checkpoint at 3), resumes a second run from that
/// checkpoint, and checks: both end at step 6, the resumed steps equal the uninterrupted
/// run's to the bit, the saved model loads in `dtype`, and `check` on the first run's folder.
fn run_and_resume(
    name: &str,
    script: &str,
    args: &[String],
    task: AutoTask,
    dtype: Kind,
    check: Check<'_>,
) -> Result<String> {
    let dir = temp_dir(name);
    let full = dir.join("full");
    let common = strings(&[
        "--use_cpu",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
        "--max_steps",
        "6",
        "--logging_steps",
        "1",
        "--save_strategy",
        "steps",
        "--save_steps",
        "3",
        "--seed",
        "42",
    ]);
    let mut argv = args.to_vec();
    argv.extend(common.iter().cloned());
    let mut first = argv.clone();
    first.extend(["--output_dir".into(), full.display().to_string()]);
    let log = launch_2(script, &first)?;
    let resumed = dir.join("resumed");
    copy_dir(&full.join("checkpoint-3"), &resumed.join("checkpoint-3"))?;
    let mut second = argv;
    second.extend([
        "--output_dir".into(),
        resumed.display().to_string(),
        "--resume_from_checkpoint".into(),
        resumed.join("checkpoint-3").display().to_string(),
    ]);
    launch_2(script, &second)?;
    let (a, b) = (logged_steps(&full)?, logged_steps(&resumed)?);
    ensure!(
        a.iter()
            .filter(|(_, e)| e.iter().any(|(k, _)| k == "loss"))
            .count()
            == 6,
        "{name}: 6 logged steps: {a:?}"
    );
    let later = |l: &[(i64, Vec<(String, u64)>)]| -> Steps {
        l.iter().filter(|(s, _)| *s > 3).cloned().collect()
    };
    ensure!(
        later(&a) == later(&b),
        "{name}: the resumed steps differ:\n{:?}\nvs\n{:?}",
        later(&a),
        later(&b)
    );
    // The file holds the dtype the run trained in (DeepSpeed's half-precision weights; FSDP's
    // fp32 parameters), and the model loads from it.
    let tensors = tch::Tensor::read_safetensors(full.join("model.safetensors"))?;
    let kinds: Vec<(String, Kind)> = tensors
        .iter()
        .filter(|(_, t)| t.kind() != dtype)
        .map(|(n, t)| (n.clone(), t.kind()))
        .collect();
    ensure!(
        kinds.is_empty(),
        "{name}: saved tensors not in {dtype:?}: {kinds:?}"
    );
    from_pretrained_dir(&full, task, Device::Cpu, &LoadOptions::default())
        .with_context(|| format!("{name}: loading the saved model"))?;
    loads_in_python(&full, task)?;
    check(&full)?;
    Ok(log)
}

/// Upstream's `AutoModelFor...from_pretrained(dir)` loads the folder (when `cargo xtask test`
/// names the reference virtualenv's python).
fn loads_in_python(dir: &Path, task: AutoTask) -> Result<()> {
    let Some(python) = std::env::var_os("TCHTRAIN_VENV_PYTHON") else {
        return Ok(());
    };
    let class = match task {
        AutoTask::Seq2SeqLm => "AutoModelForSeq2SeqLM",
        _ => "AutoModelForCausalLM",
    };
    let out = Command::new(python)
        .args([
            "-c",
            "import sys, transformers as tf; m = getattr(tf, sys.argv[1]).from_pretrained(sys.argv[2]); print(m.dtype)",
            class,
        ])
        .arg(dir)
        .env("HF_HUB_OFFLINE", "1")
        .output()?;
    ensure!(
        out.status.success(),
        "transformers could not load {}:\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target: PathBuf = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// The documents' translation run: a tiny T5 with its task prefix, or (`mbart`) the tiny
/// mBART with the language codes `en_XX` / `ro_RO`.
fn translation(config_file: &str, mbart: bool) -> Result<Vec<String>> {
    let reference = |rel: &str| {
        asset(&format!(
            "reference/trainer_translation_summarization/{rel}"
        ))
    };
    let model = if mbart {
        strings(&[
            "--model_name_or_path",
            &asset("tiny-mbart"),
            "--source_lang",
            "en_XX",
            "--target_lang",
            "ro_RO",
            // The tiny model's 128 positions (upstream's script refuses the default 1024).
            "--max_source_length",
            "128",
        ])
    } else {
        strings(&[
            "--model_name_or_path",
            &reference("translation/initial"),
            "--source_lang",
            "en",
            "--target_lang",
            "ro",
            "--source_prefix",
            "translate English to Romanian: ",
        ])
    };
    Ok([
        model,
        strings(&[
            "--train_file",
            &reference("translation/train.json"),
            "--do_train",
            "--per_device_train_batch_size",
            "2",
            "--deepspeed",
            &config(config_file)?,
            "--fp16",
            "--learning_rate",
            "3e-5",
            "--adam_beta1",
            "0.8",
            "--weight_decay",
            "3e-7",
            "--warmup_steps",
            "500",
            "--lr_scheduler_type",
            "constant_with_warmup",
        ]),
    ]
    .concat())
}

fn clm(extra: &[&str]) -> Vec<String> {
    let mut args = strings(&[
        "--model_name_or_path",
        &asset("tiny-gpt2"),
        "--tokenizer_name",
        &asset("gpt2-tokenizer"),
        "--train_file",
        &asset("text/hamlet.txt"),
        "--block_size",
        "32",
        "--per_device_train_batch_size",
        "2",
        "--learning_rate",
        "1e-3",
        "--do_train",
        "--bf16",
    ]);
    args.extend(strings(extra));
    args
}

#[test]
fn the_documents_deepspeed_fp16_translation_runs_and_resumes() -> Result<()> {
    let log = run_and_resume(
        "doc-ds-zero2-fp16",
        env!("CARGO_BIN_EXE_run_translation"),
        &translation("ds_zero2_fp16.json", false)?,
        AutoTask::Seq2SeqLm,
        Kind::Half,
        &|_| Ok(()),
    )?;
    ensure!(
        log.contains("cpu_offload is deprecated"),
        "DeepSpeed's deprecation warning:\n{log}"
    );
    run_and_resume(
        "doc-ds-zero2-short",
        env!("CARGO_BIN_EXE_run_translation"),
        &translation("ds_zero2_short.json", false)?,
        AutoTask::Seq2SeqLm,
        Kind::Half,
        &|_| Ok(()),
    )?;
    Ok(())
}

/// The document's own model: an mBART en-ro (here the tiny one) with `en_XX` / `ro_RO`.
/// Its config names no `decoder_start_token_id`, so the script sets the model's to `ro_RO`'s
/// id, as upstream's does: the saved `config.json` holds it, the generation config keeps
/// the loaded one's (transformers 5 reads none from a modified model config).
#[test]
fn the_documents_mbart_translation_runs_under_deepspeed_fp16() -> Result<()> {
    run_and_resume(
        "doc-ds-zero2-fp16-mbart",
        env!("CARGO_BIN_EXE_run_translation"),
        &translation("ds_zero2_fp16.json", true)?,
        AutoTask::Seq2SeqLm,
        Kind::Half,
        &|full| {
            let read = |name: &str| -> Result<serde_json::Value> {
                Ok(serde_json::from_str(&std::fs::read_to_string(
                    full.join(name),
                )?)?)
            };
            let (config, generation) = (read("config.json")?, read("generation_config.json")?);
            // mBART's `ro_RO`: 250001 + its place (19) among the 25 fairseq codes.
            ensure!(
                config["decoder_start_token_id"] == 250020,
                "config.json: {config}"
            );
            ensure!(
                generation.get("decoder_start_token_id").is_none(),
                "generation_config.json: {generation}"
            );
            Ok(())
        },
    )?;
    Ok(())
}

#[test]
fn the_documents_deepspeed_zero3_bf16_auto_runs_and_resumes() -> Result<()> {
    let args = clm(&["--deepspeed", &config("ds_zero3_bf16_auto.json")?]);
    run_and_resume(
        "doc-ds-zero3-bf16",
        env!("CARGO_BIN_EXE_run_clm"),
        &args,
        AutoTask::CausalLm,
        Kind::BFloat16,
        &|_| Ok(()),
    )?;
    Ok(())
}

#[test]
fn the_documents_fsdp_bf16_run_trains_and_resumes() -> Result<()> {
    let args = clm(&[
        "--fsdp",
        "full_shard auto_wrap",
        "--fsdp_config",
        &config("fsdp_gpt2_bf16.json")?,
    ]);
    // FSDP keeps fp32 parameters (its sharded masters) and saves them.
    run_and_resume(
        "doc-fsdp-bf16",
        env!("CARGO_BIN_EXE_run_clm"),
        &args,
        AutoTask::CausalLm,
        Kind::Float,
        &|_| Ok(()),
    )?;
    Ok(())
}

//! `cargo xtask e2e [--short] [--case NAME]`: the example scripts against upstream's, end to
//! end, on the same flags and data.
//!
//! Each case runs one of our example binaries (`run_clm`, `run_classification`, `sft`, `dpo`,
//! `reward`) and the Python driver of the same name in `scripts/e2e/` — for TRL's three, TRL's
//! own script run as its `__main__`; for the others upstream's example script's steps
//! (HfArgumentParser, `datasets.load_dataset`, `map(batched=True)` tokenization,
//! `group_texts` / the label list, `set_seed` before the model, `Trainer` with the script's
//! `compute_metrics`, train then evaluate) on the pinned transformers / datasets / torch —
//! with the same command line into two output folders, on 1 rank, or on 2 ranks (ours under
//! `xtask launch`, theirs under `python -m torch.distributed.run`, Gloo on the CPU). Both
//! sides run with `OMP_NUM_THREADS=2` (the reference scripts' intra-op thread count: some
//! libtorch kernels split their sums by thread) and offline.
//!
//! It then reads both `trainer_state.json` `log_history`s, `train_results.json` and
//! `eval_results.json` (and compares `predict_results.txt` line for line), and prints per case one table of the logged steps (loss, and the
//! relative differences of the loss, the gradient norm and the learning rate) and one of the
//! final metrics (train loss, evaluation loss and accuracy, perplexity, sample counts,
//! epochs; timings are left out). Relative difference: `|ours - theirs| / |theirs|`, 0 when
//! equal. **Tolerance: a case passes when every relative difference is at most 1e-6**
//! ([`TOLERANCE`]); both sides run the same libtorch on the same batches in the same op
//! order, so equal values are expected, and the tolerance leaves room for no more than a
//! sum's rounding (docs/commands.md has the measured figures). A key written by one side only
//! fails the case, as does a line of `predict_results.txt` that differs. A case whose preparation our script refuses with a
//! usage error naming the case's flag (a data format or `--dataset_name` not wired yet) is
//! skipped with the script's message; any other failure of either side fails the case. The
//! command exits non-zero when a case fails.
//!
//! The data are written by `scripts/e2e/prepare_data.py` into `target/e2e/data/` (Parquet
//! copies of hamlet.txt, the same laid out as a hub dataset repository, Rotten Tomatoes
//! reviews as `sentence,label` Parquet files, a GPT-2 tokenizer folder both sides load);
//! every run's output folder and log stay under `target/e2e/<case>/` for inspection.
//! The binaries are the dev profile's (`target/debug/`), the profile `cargo xtask test`
//! builds, so the short form inside `test` builds nothing; the numbers do not depend on
//! the profile (libtorch does the arithmetic, and Rust does not reassociate floats).
//!
//! `--short` is the form `cargo xtask test` runs ([`short_step`]): fewer cases and steps.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

mod compare;

use crate::build_examples::build_examples;
use crate::cmd;
use crate::paths;
use crate::setup;

/// The largest relative difference a case may show in any compared value.
pub const TOLERANCE: f64 = 1e-6;

/// Intra-op threads on both sides: the reference scripts' (`REFERENCE_THREADS`).
const THREADS: &str = crate::test::REFERENCE_THREADS;

/// Which example script a case runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Script {
    Clm,
    Classification,
    /// TRL's `trl sft` (our `sft`; theirs TRL's own script).
    Sft,
    /// TRL's `trl dpo`.
    Dpo,
    /// TRL's `trl reward`.
    Reward,
    /// TRL's `trl grpo`.
    Grpo,
    /// `run_speech_recognition_seq2seq` (Whisper).
    SpeechRecognition,
    /// `run_image_classification` (ViT).
    ImageClassification,
}

impl Script {
    /// The binary, and the Python driver's file stem.
    fn name(self) -> &'static str {
        match self {
            Script::Clm => "run_clm",
            Script::Classification => "run_classification",
            Script::Sft => "sft",
            Script::Dpo => "dpo",
            Script::Reward => "reward",
            Script::Grpo => "grpo",
            Script::SpeechRecognition => "run_speech_recognition_seq2seq",
            Script::ImageClassification => "run_image_classification",
        }
    }
}

/// Where a case finds its inputs.
struct Inputs<'a> {
    assets: &'a Path,
    data: &'a Path,
}

/// One parity case.
struct Case {
    name: &'static str,
    what: &'static str,
    script: Script,
    ranks: usize,
    /// Part of `--short` (and so of `cargo xtask test`).
    short: bool,
    /// The flag whose refusal by our script (a usage error naming it) skips the case.
    skip_if_refused: Option<&'static str>,
    /// The script's flags (without the common ones and `--output_dir`); `short` asks for
    /// the short form's sizes.
    args: fn(&Inputs<'_>, bool) -> Vec<String>,
    /// The checkpoint folder whose `trainer_state.json` is compared (TRL's scripts save the
    /// model only: both sides then save a checkpoint at the last step), instead of the
    /// output folder's own files.
    checkpoint: Option<&'static str>,
}

fn path_arg(p: PathBuf) -> String {
    p.display().to_string()
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Tiny GPT-2 (the checkpoint's dropout 0.1), GPT-2's tokenizer, 64-token blocks, AdamW
/// lr 1e-3 with 2 warmup steps, batches of 4; evaluation at the end.
fn clm_args(i: &Inputs<'_>, short: bool, data: &[String]) -> Vec<String> {
    let mut v = vec![
        "--model_name_or_path".into(),
        path_arg(i.assets.join("tiny-gpt2")),
        "--tokenizer_name".into(),
        path_arg(i.data.join("gpt2-tokenizer")),
    ];
    v.extend(data.iter().cloned());
    v.extend(strings(&[
        "--block_size",
        "64",
        "--do_train",
        "--do_eval",
        "--max_steps",
        if short { "6" } else { "12" },
        "--per_device_train_batch_size",
        "4",
        "--per_device_eval_batch_size",
        "4",
        "--learning_rate",
        "1e-3",
        "--warmup_steps",
        "2",
        "--weight_decay",
        "0.01",
    ]));
    if short {
        v.extend(strings(&["--max_eval_samples", "16"]));
    }
    v
}

fn clm_txt(i: &Inputs<'_>, short: bool) -> Vec<String> {
    let file = path_arg(i.assets.join("text").join("hamlet.txt"));
    clm_args(i, short, &["--train_file".into(), file])
}

/// The design documents' FSDP run: run_clm on hamlet.txt with `--fsdp "full_shard
/// auto_wrap" --bf16` and the documents' `fsdp_gpt2_bf16.json` as it is (`../shared/configs/`,
/// beside the repository: GPT2Block wrapping, `cpu_offload`, and the `mixed_precision` key
/// upstream does not read).
fn clm_fsdp_documents(i: &Inputs<'_>, short: bool) -> Vec<String> {
    let file = path_arg(i.assets.join("text").join("hamlet.txt"));
    let config = paths::workspace_root().join("../shared/configs/fsdp_gpt2_bf16.json");
    let mut v = clm_args(i, short, &["--train_file".into(), file]);
    v.extend([
        "--fsdp".into(),
        "full_shard auto_wrap".into(),
        "--fsdp_config".into(),
        path_arg(config),
        "--bf16".into(),
    ]);
    v
}

fn clm_parquet(i: &Inputs<'_>, short: bool) -> Vec<String> {
    let file = path_arg(i.data.join("hamlet.parquet"));
    clm_args(i, short, &["--train_file".into(), file])
}

fn clm_dataset_name(i: &Inputs<'_>, short: bool) -> Vec<String> {
    let repo = path_arg(i.data.join("hamlet-repo"));
    clm_args(i, short, &["--dataset_name".into(), repo])
}

/// SmolLM2-135M (a real Llama-family checkpoint, its own tokenizer) on hamlet.txt: 64-token
/// blocks, AdamW lr 1e-4 with 1 warmup step, batches of 2, 4 steps (2 in the short form),
/// evaluation on 16 blocks.
fn clm_smollm2(i: &Inputs<'_>, short: bool) -> Vec<String> {
    strings(&[
        "--model_name_or_path",
        &path_arg(i.assets.join("smollm2-135m")),
        "--train_file",
        &path_arg(i.assets.join("text").join("hamlet.txt")),
        "--block_size",
        "64",
        "--do_train",
        "--do_eval",
        "--max_steps",
        if short { "2" } else { "4" },
        "--per_device_train_batch_size",
        "2",
        "--per_device_eval_batch_size",
        "4",
        "--max_eval_samples",
        "16",
        "--learning_rate",
        "1e-4",
        "--warmup_steps",
        "1",
    ])
}

/// MiniLM-L6 with a new 2-label head on the Rotten Tomatoes rows (Parquet, `sentence` and
/// `label` columns), 64 tokens padded, AdamW lr 1e-4 with 2 warmup steps, batches of 8; then
/// `--do_predict` on the test rows (`predict_results.txt`).
fn classification_parquet(i: &Inputs<'_>, short: bool) -> Vec<String> {
    let dir = i.data.join("rotten-tomatoes");
    let mut v = vec![
        "--model_name_or_path".into(),
        path_arg(i.assets.join("minilm")),
        "--train_file".into(),
        path_arg(dir.join("train.parquet")),
        "--validation_file".into(),
        path_arg(dir.join("validation.parquet")),
    ];
    v.extend(["--test_file".into(), path_arg(dir.join("test.parquet"))]);
    v.extend(strings(&[
        "--max_seq_length",
        "64",
        "--do_train",
        "--do_eval",
        "--do_predict",
        "--max_steps",
        if short { "5" } else { "10" },
        "--per_device_train_batch_size",
        "8",
        "--per_device_eval_batch_size",
        "16",
        "--learning_rate",
        "1e-4",
        "--warmup_steps",
        "2",
        "--weight_decay",
        "0.01",
    ]));
    if short {
        v.extend(strings(&[
            "--max_eval_samples",
            "48",
            "--max_predict_samples",
            "24",
        ]));
    }
    v
}

/// The classification case as a regression: the `score` column (fresh 1.0, rotten 0.0) as
/// the label (`--remove_columns label --label_column_name score`), so `predict_results.txt`
/// holds each row's value to three decimals.
fn regression_parquet(i: &Inputs<'_>, short: bool) -> Vec<String> {
    let mut v = classification_parquet(i, short);
    v.extend(strings(&[
        "--remove_columns",
        "label",
        "--label_column_name",
        "score",
    ]));
    v
}

/// TRL's scripts on the tiny Llama with SmolLM2's tokenizer (`tiny-llama-chat`): batches of
/// 4, 6 steps at lr 1e-3, an evaluation every 3 steps, float32 without checkpointing, a
/// checkpoint at step 6 (whose `trainer_state.json` is compared).
fn trl_args(i: &Inputs<'_>, data: &str, extra: &[&str]) -> Vec<String> {
    trl_args_on(i, i.data.join("tiny-llama-chat"), data, extra)
}

/// [`trl_args`] on the model at `model`.
fn trl_args_on(i: &Inputs<'_>, model: PathBuf, data: &str, extra: &[&str]) -> Vec<String> {
    let mut v = vec![
        "--model_name_or_path".into(),
        path_arg(model),
        "--dataset_name".into(),
        path_arg(i.data.join(data)),
    ];
    v.extend(strings(&[
        "--per_device_train_batch_size",
        "4",
        "--per_device_eval_batch_size",
        "4",
        "--max_steps",
        "6",
        "--learning_rate",
        "1e-3",
        "--eval_strategy",
        "steps",
        "--eval_steps",
        "3",
        "--save_strategy",
        "steps",
        "--save_steps",
        "6",
        "--bf16",
        "false",
        "--gradient_checkpointing",
        "false",
    ]));
    v.extend(strings(extra));
    v
}

fn trl_sft(i: &Inputs<'_>, _short: bool) -> Vec<String> {
    trl_args(i, "trl-messages", &["--max_length", "64"])
}

/// `trl sft` on the tiny Gemma 3 vision-language model (its processor: Gemma 3's chat
/// template, 28x28 images at 4 tokens each) over `messages` with no, one or two images a row
/// (Parquet `List(Image())`), with TRL's default gradient checkpointing on.
fn trl_sft_vlm(i: &Inputs<'_>, _short: bool) -> Vec<String> {
    let mut v = trl_args_on(i, i.assets.join("tiny-gemma3"), "vlm-repo", &[]);
    if let Some(at) = v.iter().position(|a| a == "--gradient_checkpointing") {
        v[at + 1] = "true".into();
    }
    v
}

fn trl_dpo(i: &Inputs<'_>, _short: bool) -> Vec<String> {
    trl_args(
        i,
        "trl-pairs",
        &["--max_length", "48", "--loss_type", "sigmoid", "bco_pair"],
    )
}

fn trl_reward(i: &Inputs<'_>, _short: bool) -> Vec<String> {
    trl_args(i, "trl-pairs", &["--max_length", "30"])
}

fn trl_grpo(i: &Inputs<'_>, _short: bool) -> Vec<String> {
    let mut v = trl_args(
        i,
        "trl-prompts",
        &[
            "--num_generations",
            "4",
            "--max_completion_length",
            "8",
            "--beta",
            "0.04",
            "--loss_type",
            "grpo",
            "--reward_funcs",
            "think_format_reward",
            "get_soft_overlong_punishment",
        ],
    );
    v.push("--reward_model_name_or_path".into());
    v.push(path_arg(i.data.join("tiny-llama-reward")));
    v
}

/// The tiny Whisper (its tokenizer on GPT-2's BPE, Whisper's special tokens) on the speech
/// asset's clips (espeak-ng at 16 kHz: WAV, FLAC, stereo, 24-bit), English transcription,
/// AdamW lr 1e-3, batches of 4 over 8 clips for 6 steps (with gradient accumulation 2),
/// then generation (at most 16 tokens, greedy) scored by word error rate on 4 clips.
fn speech_recognition(i: &Inputs<'_>, _short: bool) -> Vec<String> {
    let mut v = vec![
        "--model_name_or_path".into(),
        path_arg(i.assets.join("tiny-whisper")),
        "--dataset_name".into(),
        path_arg(i.data.join("speech-repo")),
    ];
    v.extend(strings(&[
        "--text_column_name",
        "sentence",
        "--language",
        "en",
        "--freeze_feature_encoder",
        "False",
        "--do_train",
        "--do_eval",
        "--predict_with_generate",
        "--generation_max_length",
        "16",
        "--per_device_train_batch_size",
        "2",
        "--gradient_accumulation_steps",
        "2",
        "--per_device_eval_batch_size",
        "2",
        "--learning_rate",
        "1e-3",
        "--max_steps",
        "6",
        "--eval_strategy",
        "steps",
        "--eval_steps",
        "3",
    ]));
    v
}

/// The vision reference's tiny ViT (dropout 0.1) on its 24 PNGs as a dataset repository
/// (ClassLabel column), 12 training and 6 evaluation images picked by `shuffle(seed)` (numpy's
/// PCG64), torchvision's random crops and flips on the global generator, AdamW lr 1e-3,
/// batches of 4 for 6 steps with gradient accumulation 2, accuracy every 3 steps.
fn image_classification(i: &Inputs<'_>, _short: bool) -> Vec<String> {
    let mut v = vec![
        "--model_name_or_path".into(),
        path_arg(i.data.join("tiny-vit")),
        "--dataset_name".into(),
        path_arg(i.data.join("images-repo")),
    ];
    v.extend(strings(&[
        "--remove_unused_columns",
        "False",
        "--max_train_samples",
        "12",
        "--max_eval_samples",
        "6",
        "--do_train",
        "--do_eval",
        "--per_device_train_batch_size",
        "4",
        "--gradient_accumulation_steps",
        "2",
        "--per_device_eval_batch_size",
        "4",
        "--learning_rate",
        "1e-3",
        "--max_steps",
        "6",
        "--eval_strategy",
        "steps",
        "--eval_steps",
        "3",
    ]));
    v
}

/// Every case, in the order they run.
fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "clm-txt",
            what: "run_clm, tiny GPT-2 on hamlet.txt (text loader, 5% held out), 1 rank",
            script: Script::Clm,
            ranks: 1,
            short: false,
            skip_if_refused: None,
            args: clm_txt,
            checkpoint: None,
        },
        Case {
            name: "clm-txt-2ranks",
            what: "run_clm, tiny GPT-2 on hamlet.txt, 2 ranks (DDP, Gloo)",
            script: Script::Clm,
            ranks: 2,
            short: true,
            skip_if_refused: None,
            args: clm_txt,
            checkpoint: None,
        },
        Case {
            name: "clm-fsdp-bf16-documents",
            what: "run_clm, tiny GPT-2 on hamlet.txt, 2 ranks, FSDP full_shard with the documents' fsdp_gpt2_bf16.json and --bf16 (FSDP2's mixed-precision policy; upstream's side runs accelerate's GPU branch on the CPU)",
            script: Script::Clm,
            ranks: 2,
            short: false,
            skip_if_refused: None,
            args: clm_fsdp_documents,
            checkpoint: None,
        },
        Case {
            name: "clm-parquet",
            what: "run_clm, tiny GPT-2 on hamlet.parquet (one row per line), 1 rank",
            script: Script::Clm,
            ranks: 1,
            short: false,
            skip_if_refused: Some("train_file"),
            args: clm_parquet,
            checkpoint: None,
        },
        Case {
            name: "classification-parquet",
            what: "run_classification, MiniLM on Rotten Tomatoes train/validation.parquet, 1 rank",
            script: Script::Classification,
            ranks: 1,
            short: true,
            skip_if_refused: Some("train_file"),
            args: classification_parquet,
            checkpoint: None,
        },
        Case {
            name: "regression-parquet",
            what: "run_classification as a regression (float labels), MiniLM on the same rows, 1 rank",
            script: Script::Classification,
            ranks: 1,
            short: false,
            skip_if_refused: Some("train_file"),
            args: regression_parquet,
            checkpoint: None,
        },
        Case {
            name: "clm-smollm2",
            what: "run_clm, SmolLM2-135M (fp32) on hamlet.txt, 1 rank",
            script: Script::Clm,
            ranks: 1,
            short: false,
            skip_if_refused: None,
            args: clm_smollm2,
            checkpoint: None,
        },
        Case {
            name: "clm-dataset-name",
            what: "run_clm --dataset_name <local folder laid out as a hub dataset repository>, 1 rank",
            script: Script::Clm,
            ranks: 1,
            short: false,
            skip_if_refused: Some("dataset_name"),
            args: clm_dataset_name,
            checkpoint: None,
        },
        Case {
            name: "trl-sft",
            what: "sft against TRL's trl sft, tiny Llama on chat messages (SmolLM2's template), 1 rank",
            script: Script::Sft,
            ranks: 1,
            short: false,
            skip_if_refused: None,
            args: trl_sft,
            checkpoint: Some("checkpoint-6"),
        },
        Case {
            name: "trl-sft-vlm",
            what: "sft against TRL's trl sft, tiny Gemma 3 vision-language model (SigLIP tower, Gemma3Processor) on chat messages with images (Parquet List(Image())), gradient checkpointing, 1 rank",
            script: Script::Sft,
            ranks: 1,
            short: true,
            skip_if_refused: None,
            args: trl_sft_vlm,
            checkpoint: Some("checkpoint-6"),
        },
        Case {
            name: "trl-dpo",
            what: "dpo against TRL's trl dpo, tiny Llama on explicit-prompt pairs (sigmoid + bco_pair), 1 rank",
            script: Script::Dpo,
            ranks: 1,
            short: false,
            skip_if_refused: None,
            args: trl_dpo,
            checkpoint: Some("checkpoint-6"),
        },
        Case {
            name: "trl-reward",
            what: "reward against TRL's trl reward, tiny Llama (a new score head) on the same pairs, 1 rank",
            script: Script::Reward,
            ranks: 1,
            short: false,
            skip_if_refused: None,
            args: trl_reward,
            checkpoint: Some("checkpoint-6"),
        },
        Case {
            name: "trl-grpo",
            what: "grpo against TRL's trl grpo, tiny Llama sampling 4 completions per chat prompt, a tiny reward model and TRL's reward functions, KL to the reloaded reference, 1 rank",
            script: Script::Grpo,
            ranks: 1,
            short: false,
            skip_if_refused: None,
            args: trl_grpo,
            checkpoint: Some("checkpoint-6"),
        },
        Case {
            name: "speech-recognition",
            what: "run_speech_recognition_seq2seq, tiny Whisper on espeak-ng clips (Parquet Audio column), English transcription, WER by generation, 1 rank",
            script: Script::SpeechRecognition,
            ranks: 1,
            short: true,
            skip_if_refused: None,
            args: speech_recognition,
            checkpoint: None,
        },
        Case {
            name: "image-classification",
            what: "run_image_classification, tiny ViT on 24 PNGs (Parquet Image + ClassLabel columns), torchvision's random crops and flips at fetch time, accuracy, 1 rank",
            script: Script::ImageClassification,
            ranks: 1,
            short: true,
            skip_if_refused: None,
            args: image_classification,
            checkpoint: None,
        },
    ]
}

/// Command-line options of `e2e`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// The short form (`cargo xtask test`'s): fewer cases, fewer steps.
    short: bool,
    /// Only these cases (default: every case of the form).
    cases: Vec<String>,
}

impl Options {
    /// Parses `e2e`'s arguments.
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let known: Vec<&str> = cases().iter().map(|c| c.name).collect();
        let mut o = Options::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let (flag, inline) = match a.split_once('=') {
                Some((f, v)) => (f, Some(v.to_string())),
                None => (a.as_str(), None),
            };
            match flag {
                "--short" if inline.is_none() => o.short = true,
                "--case" => {
                    let v = inline
                        .or_else(|| it.next().cloned())
                        .ok_or("--case needs a case name")?;
                    for name in v.split(',') {
                        if !known.contains(&name) {
                            return Err(format!(
                                "e2e: unknown case `{name}` (known: {})",
                                known.join(", ")
                            ));
                        }
                        o.cases.push(name.to_string());
                    }
                }
                _ => {
                    return Err(format!(
                        "e2e: unknown option `{a}` (known: --short, --case NAME[,NAME...]; cases: {})",
                        known.join(", ")
                    ));
                }
            }
        }
        Ok(o)
    }

    fn selected(&self) -> Vec<Case> {
        cases()
            .into_iter()
            .filter(|c| {
                if self.cases.is_empty() {
                    !self.short || c.short
                } else {
                    self.cases.iter().any(|n| n == c.name)
                }
            })
            .collect()
    }
}

/// How one case ended.
#[derive(Debug, Clone, PartialEq)]
enum Verdict {
    /// Every compared value within [`TOLERANCE`]; the largest relative difference.
    Passed(f64),
    /// Skipped, and why.
    Skipped(String),
    /// Failed, and why.
    Failed(String),
}

/// One case's outcome, for the summary.
#[derive(Debug, Clone)]
struct Outcome {
    name: &'static str,
    ranks: usize,
    steps: usize,
    verdict: Verdict,
    seconds: f64,
}

/// What a suite run found: the summary clause and whether it failed.
#[derive(Debug, Clone)]
pub struct Report {
    outcomes: Vec<Outcome>,
    /// A failure before any case ran (no binary, no data).
    error: Option<String>,
    /// Wall time of the whole suite.
    pub seconds: f64,
}

impl Report {
    /// Whether every case passed or was skipped.
    pub fn passed(&self) -> bool {
        self.error.is_none()
            && !self
                .outcomes
                .iter()
                .any(|o| matches!(o.verdict, Verdict::Failed(_)))
    }

    /// One clause for `cargo xtask test`'s summary line, e.g.
    /// `e2e: 2 cases within 1e-6 of upstream (max relative difference 0.0e0), 0 skipped`.
    pub fn summary(&self) -> String {
        if let Some(e) = &self.error {
            return format!("e2e: FAILED ({e})");
        }
        let mut passed = 0;
        let mut worst = 0f64;
        let mut skipped = Vec::new();
        let mut failed = Vec::new();
        for o in &self.outcomes {
            match &o.verdict {
                Verdict::Passed(m) => {
                    passed += 1;
                    worst = worst.max(*m);
                }
                Verdict::Skipped(_) => skipped.push(o.name),
                Verdict::Failed(_) => failed.push(o.name),
            }
        }
        let mut s = format!(
            "e2e: {passed} case{} within {TOLERANCE:e} of upstream (max relative difference {worst:.1e})",
            if passed == 1 { "" } else { "s" }
        );
        if !skipped.is_empty() {
            s.push_str(&format!(", skipped {}", skipped.join(", ")));
        }
        if !failed.is_empty() {
            s.push_str(&format!(", FAILED {}", failed.join(", ")));
        }
        s
    }
}

/// `cargo xtask e2e [--short] [--case NAME]`: setup, the dev build of the two example
/// binaries, the cases, the tables and a summary; fails when a case fails.
pub fn run(args: &[String]) -> Result<(), String> {
    if matches!(
        args.first().map(String::as_str),
        Some("--help" | "-h" | "help")
    ) {
        print!("{}", crate::USAGE);
        return Ok(());
    }
    let o = Options::parse(args)?;
    let t0 = Instant::now();
    let s = setup::run(&setup::Options::default())?;
    let mut bins: Vec<&str> = o.selected().iter().map(|c| c.script.name()).collect();
    bins.sort_unstable();
    bins.dedup();
    build_examples(&s, false, &bins, "e2e")?;
    let report = suite(&s, &o.selected(), o.short);
    println!(
        "xtask e2e finished in {:.1}s (setup and build included); {}",
        t0.elapsed().as_secs_f64(),
        report.summary()
    );
    if report.passed() {
        Ok(())
    } else {
        Err("a parity case failed (see its table and log above)".into())
    }
}

/// The short form for `cargo xtask test`, on the binaries its `cargo test` built.
pub fn short_step(s: &setup::Setup) -> Report {
    let o = Options {
        short: true,
        cases: Vec::new(),
    };
    suite(s, &o.selected(), true)
}

/// Prepares the data and runs `cases`, printing each one's tables, then the summary table.
fn suite(s: &setup::Setup, cases: &[Case], short: bool) -> Report {
    let t0 = Instant::now();
    let root = paths::workspace_root();
    let bin = paths::target_dir().join("debug");
    let work = root.join("target").join("e2e");
    let fail = |e: String| Report {
        outcomes: Vec::new(),
        error: Some(e),
        seconds: t0.elapsed().as_secs_f64(),
    };
    for script in [Script::Clm, Script::Classification] {
        let exe = bin.join(script.name());
        if !exe.is_file() {
            return fail(format!(
                "no {} binary at {} (build it with `cargo build -p tchtrain-examples --bins`)",
                script.name(),
                exe.display()
            ));
        }
    }
    if let Err(e) = prepare(s, &root, &work) {
        return fail(e);
    }
    let inputs = Inputs {
        assets: &s.assets,
        data: &work.join("data"),
    };
    println!(
        "e2e: {} case(s){}, {THREADS} intra-op threads on both sides, tolerance {TOLERANCE:e} (relative)",
        cases.len(),
        if short { " (short form)" } else { "" }
    );
    let mut outcomes = Vec::new();
    for case in cases {
        let tc = Instant::now();
        println!("\n=== e2e {}: {} ===", case.name, case.what);
        let (verdict, steps) = match run_case(s, &root, &bin, &work, &inputs, case, short) {
            Ok(r) => r,
            Err(e) => (Verdict::Failed(e), 0),
        };
        match &verdict {
            Verdict::Passed(m) => println!(
                "e2e {}: PASSED (max relative difference {m:.1e} <= {TOLERANCE:e})",
                case.name
            ),
            Verdict::Skipped(why) => println!("e2e {}: SKIPPED: {why}", case.name),
            Verdict::Failed(why) => println!("e2e {}: FAILED: {why}", case.name),
        }
        outcomes.push(Outcome {
            name: case.name,
            ranks: case.ranks,
            steps,
            verdict,
            seconds: tc.elapsed().as_secs_f64(),
        });
    }
    print_summary(&outcomes);
    Report {
        outcomes,
        error: None,
        seconds: t0.elapsed().as_secs_f64(),
    }
}

/// The environment both sides run in: the reference thread count, offline, the
/// `datasets` cache inside the work folder.
fn side_env(c: &mut Command, s: &setup::Setup, work: &Path) {
    c.env("OMP_NUM_THREADS", THREADS)
        .env("OMP_WAIT_POLICY", crate::test::OMP_WAIT_POLICY)
        .env("TCHTRAIN_ASSETS", &s.assets)
        .env("HF_DATASETS_CACHE", work.join("hf-datasets-cache"))
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_DATASETS_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .env("TOKENIZERS_PARALLELISM", "false")
        .env("PYTHONUNBUFFERED", "1");
}

/// Empties `work` and writes the cases' data with `scripts/e2e/prepare_data.py`.
fn prepare(s: &setup::Setup, root: &Path, work: &Path) -> Result<(), String> {
    if work.exists() {
        std::fs::remove_dir_all(work)
            .map_err(|e| format!("cannot clear {}: {e}", work.display()))?;
    }
    std::fs::create_dir_all(work).map_err(|e| format!("cannot create {}: {e}", work.display()))?;
    let mut c = Command::new(&s.python);
    c.current_dir(root)
        .arg(root.join("scripts").join("e2e").join("prepare_data.py"))
        .arg(work);
    side_env(&mut c, s, work);
    let t0 = Instant::now();
    let out = cmd::output(&mut c, "writing the e2e data (scripts/e2e/prepare_data.py)")?;
    println!(
        "e2e: data in {} ({:.1}s): {}",
        work.join("data").display(),
        t0.elapsed().as_secs_f64(),
        out.trim()
    );
    Ok(())
}

/// How one side's run ended.
struct SideRun {
    ok: bool,
    /// The exit code (2: our scripts' usage errors).
    code: Option<i32>,
    seconds: f64,
    log: PathBuf,
}

/// Runs `c` with its output into `log`.
fn run_logged(c: &mut Command, log: &Path) -> Result<SideRun, String> {
    let file = File::create(log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
    let err = file
        .try_clone()
        .map_err(|e| format!("cannot open {} twice: {e}", log.display()))?;
    c.stdin(std::process::Stdio::null())
        .stdout(file)
        .stderr(err);
    println!("e2e: {}", cmd::display(c));
    let t0 = Instant::now();
    let status = c
        .status()
        .map_err(|e| format!("could not start `{}`: {e}", cmd::display(c)))?;
    Ok(SideRun {
        ok: status.success(),
        code: status.code(),
        seconds: t0.elapsed().as_secs_f64(),
        log: log.to_path_buf(),
    })
}

/// The last `n` lines of a log, indented.
fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| format!("    {l}\n"))
        .collect()
}

/// The line of our script's usage error, when the run ended with one that names `flag`.
fn refusal(run: &SideRun, flag: &str) -> Option<String> {
    if run.code != Some(2) {
        return None;
    }
    let text = std::fs::read_to_string(&run.log).ok()?;
    text.lines()
        .find(|l| l.contains(": error:") && l.contains(flag))
        .map(|l| l.trim().to_string())
}

/// This xtask binary, to run `launch` with. `cargo test --workspace` (in `cargo xtask test`)
/// rebuilds it while it runs, replacing the file: then the running one, which the kernel
/// keeps, is started through `/proc/self/exe`.
fn xtask_exe() -> Result<PathBuf, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find the xtask binary to launch ranks: {e}"))?;
    if exe.is_file() {
        return Ok(exe);
    }
    let running = PathBuf::from("/proc/self/exe");
    if running.exists() {
        Ok(running)
    } else {
        Err(format!(
            "the xtask binary {} is gone (rebuilt?); rerun `cargo xtask e2e`",
            exe.display()
        ))
    }
}

/// Runs both sides of one case and compares them: the verdict and the steps compared.
fn run_case(
    s: &setup::Setup,
    root: &Path,
    bin: &Path,
    work: &Path,
    inputs: &Inputs<'_>,
    case: &Case,
    short: bool,
) -> Result<(Verdict, usize), String> {
    let dir = work.join(case.name);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let (ours_dir, theirs_dir) = (dir.join("ours"), dir.join("theirs"));
    let script_args = (case.args)(inputs, short);
    let with_common = |out: &Path| -> Vec<String> {
        let mut v = script_args.clone();
        if case.checkpoint.is_none() {
            v.extend(strings(&["--save_strategy", "no"]));
        }
        v.extend(strings(&[
            "--seed",
            "42",
            "--logging_steps",
            "1",
            "--use_cpu",
            "--report_to",
            "none",
            "--disable_tqdm",
            "true",
            "--output_dir",
        ]));
        v.push(path_arg(out.to_path_buf()));
        v
    };
    let exe = bin.join(case.script.name());
    let mut ours = if case.ranks == 1 {
        Command::new(&exe)
    } else {
        let mut c = Command::new(xtask_exe()?);
        c.args([
            "launch",
            "--nproc-per-node",
            &case.ranks.to_string(),
            "--standalone",
            "--",
        ])
        .arg(&exe);
        c
    };
    ours.current_dir(root).args(with_common(&ours_dir));
    side_env(&mut ours, s, work);
    let ours_run = run_logged(&mut ours, &dir.join("ours.log"))?;
    if !ours_run.ok {
        if let Some(flag) = case.skip_if_refused
            && let Some(line) = refusal(&ours_run, flag)
        {
            return Ok((
                Verdict::Skipped(format!(
                    "our {} refuses `--{flag}` here: {line}",
                    case.script.name()
                )),
                0,
            ));
        }
        print!("{}", log_tail(&ours_run.log, 30));
        return Err(format!(
            "our {} failed (exit {:?}); log {}",
            case.script.name(),
            ours_run.code,
            ours_run.log.display()
        ));
    }

    let driver = root
        .join("scripts")
        .join("e2e")
        .join(format!("{}.py", case.script.name()));
    let mut theirs = Command::new(&s.python);
    if case.ranks > 1 {
        theirs.args([
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            &case.ranks.to_string(),
        ]);
    }
    theirs
        .current_dir(root)
        .arg(&driver)
        .args(with_common(&theirs_dir));
    side_env(&mut theirs, s, work);
    let theirs_run = run_logged(&mut theirs, &dir.join("theirs.log"))?;
    if !theirs_run.ok {
        print!("{}", log_tail(&theirs_run.log, 30));
        return Err(format!(
            "the upstream driver {} failed (exit {:?}); log {}",
            driver.display(),
            theirs_run.code,
            theirs_run.log.display()
        ));
    }
    println!(
        "e2e: ours {:.1}s, theirs {:.1}s ({} rank{})",
        ours_run.seconds,
        theirs_run.seconds,
        case.ranks,
        if case.ranks == 1 { "" } else { "s" }
    );
    let cmp = match case.checkpoint {
        Some(c) => compare::compare_dirs(&ours_dir.join(c), &theirs_dir.join(c))?,
        None => compare::compare_dirs(&ours_dir, &theirs_dir)?,
    };
    print!("{}", cmp.render());
    let steps = cmp.steps();
    let worst = cmp.max_rel();
    if let Some(p) = cmp.problems.first() {
        return Ok((
            Verdict::Failed(format!("{p} ({} problem(s) in all)", cmp.problems.len())),
            steps,
        ));
    }
    if steps == 0 {
        return Ok((Verdict::Failed("no training step was logged".into()), 0));
    }
    if worst <= TOLERANCE {
        Ok((Verdict::Passed(worst), steps))
    } else {
        Ok((
            Verdict::Failed(format!(
                "max relative difference {worst:.3e} > {TOLERANCE:e}"
            )),
            steps,
        ))
    }
}

/// The summary table of the cases.
fn print_summary(outcomes: &[Outcome]) {
    println!("\n| case | ranks | steps | max rel diff | result | seconds |");
    println!("|---|---:|---:|---:|---|---:|");
    for o in outcomes {
        let (max, result) = match &o.verdict {
            Verdict::Passed(m) => (format!("{m:.1e}"), "passed".to_string()),
            Verdict::Skipped(_) => ("—".into(), "skipped".into()),
            Verdict::Failed(why) => {
                // The whole reason is printed with the case above.
                let short: String = why.chars().take(100).collect();
                let more = if short.len() < why.len() { " ..." } else { "" };
                ("—".into(), format!("FAILED: {short}{more}"))
            }
        };
        println!(
            "| {} | {} | {} | {max} | {result} | {:.0} |",
            o.name, o.ranks, o.steps, o.seconds
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_and_case_selection() {
        let all = Options::parse(&[]).unwrap().selected();
        assert_eq!(all.len(), cases().len());
        let short = Options::parse(&["--short".into()]).unwrap().selected();
        assert!(!short.is_empty() && short.len() < all.len());
        assert!(short.iter().all(|c| c.short));
        let one = Options::parse(&["--case".into(), "clm-txt,clm-parquet".into()])
            .unwrap()
            .selected();
        assert_eq!(
            one.iter().map(|c| c.name).collect::<Vec<_>>(),
            ["clm-txt", "clm-parquet"]
        );
        assert!(Options::parse(&["--case=nope".into()]).is_err());
        assert!(Options::parse(&["--fast".into()]).is_err());
        // Names are unique and every case has a 1- or 2-rank form.
        let mut names: Vec<&str> = all.iter().map(|c| c.name).collect();
        names.dedup();
        assert_eq!(names.len(), all.len());
    }

    #[test]
    fn summary_clause() {
        let r = Report {
            outcomes: vec![
                Outcome {
                    name: "a",
                    ranks: 1,
                    steps: 3,
                    verdict: Verdict::Passed(0.0),
                    seconds: 1.0,
                },
                Outcome {
                    name: "b",
                    ranks: 1,
                    steps: 0,
                    verdict: Verdict::Skipped("refused".into()),
                    seconds: 1.0,
                },
            ],
            error: None,
            seconds: 2.0,
        };
        assert!(r.passed());
        assert_eq!(
            r.summary(),
            "e2e: 1 case within 1e-6 of upstream (max relative difference 0.0e0), skipped b"
        );
    }
}

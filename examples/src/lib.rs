//! `tchtrain-examples` — the example scripts of upstream's `examples/pytorch/` as library
//! functions, so that the binaries in `src/bin/` are one line each and tests call the same
//! code in process: [`run_clm`] (causal LM fine-tuning on a text file), [`run_mlm`] (masked LM
//! fine-tuning on a text file), [`run_classification`] (sequence classification from a CSV /
//! JSON-lines file) and [`run_ner`] (token classification of pre-split words, scored by
//! [`seqeval`]); the sequence-to-sequence scripts [`run_translation`] (translation pairs,
//! sacreBLEU) and [`run_summarization`] (texts and summaries, ROUGE with nltk's sentence
//! splitter ported as [`punkt`]) on `Seq2SeqTrainer`; [`run_generation`] samples
//! continuations of a prompt (`generate`).
//!
//! Each script's `main_with_args(argv)` takes the command line without the program name:
//! its own flags (upstream's `ModelArguments` / `DataTrainingArguments`) next to every
//! `TrainingArguments` flag, parsed by one `HfArgumentParser` with the script's dataclasses
//! added (`HfArgumentParser::with_dataclass`; a single `args.json` argument is read as
//! upstream's `parse_json_file`), each script's `COMMAND_LINE` listing them. It returns an
//! [`ExampleOutput`]; [`exit_code`] turns a result into the process's exit status the way
//! argparse and upstream's scripts do (help: 0, bad flags: 2, failures: 1).

//!
//! [`custom_model`] trains a model the user wrote (a [`TrainableModel`](tchtrain_models::TrainableModel)
//! of a few lines) with the same Trainer; [`accelerate_loop`] trains it in a hand-written
//! loop on the `Accelerator` alone; [`custom_loss`] is the documentation's custom
//! `compute_loss` (class weights) as [`TrainerHooks`](tchtrain_trainer::TrainerHooks).
//!
//! The metrics of upstream's seq2seq scripts are here too, in pure Rust: [`sacrebleu`]
//! (`run_translation`'s corpus BLEU) and [`rouge`] (`run_summarization`'s ROUGE, with nltk's
//! Porter stemmer in [`porter`]).
//!
//! Also here: the plot of a run's `log_history` ([`plot_log_history`], drawn by a small
//! raster with a built-in font into a PNG), `run_classification`'s text-classification
//! preparation ([`tokenize_text_classification`], [`ClassificationLabels`]), and the
//! binaries `plot_log_history`, `zero_to_fp32` and the bench drivers of `cargo xtask bench`.

pub mod accelerate_loop;
mod args;
mod common;
pub mod custom_loss;
pub mod custom_model;
pub mod dpo;
mod error;
pub mod grpo;
pub mod peft_args;
mod plain_args;
mod plot;
pub mod porter;
pub mod punkt;
mod raster;
pub mod reward;
pub mod rouge;
pub mod run_classification;
pub mod run_clm;
pub mod run_generation;
pub mod run_image_classification;
pub mod run_mlm;
pub mod run_ner;
pub mod run_speech_recognition_seq2seq;
pub mod run_summarization;
pub mod run_translation;
pub mod sacrebleu;
mod seq2seq_example;
pub mod seqeval;
pub mod sft;
mod split;
mod text_classification;
pub mod trl_script;
pub mod wer;

use std::path::PathBuf;
use std::process::ExitCode;

use tchtrain_trainer::Metrics;

pub use common::load_example_tokenizer;
pub use error::{Error, Result};
pub use plot::{PLOT_HEIGHT, PLOT_WIDTH, log_history_series, plot_log_history, render_log_history};
pub use raster::{Rgb, RgbImage};
pub use seq2seq_example::Seq2SeqDataArguments;
pub use text_classification::{
    ClassificationLabels, TextClassificationOptions, tokenize_text_classification,
};

/// What a script run produced.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ExampleOutput {
    /// `--output_dir`: the saved model, `trainer_state.json`, `*_results.json`, checkpoints.
    pub output_dir: PathBuf,
    /// The metrics of `--do_train` (`train_loss`, `train_runtime`, `train_samples`, ...).
    pub train_metrics: Option<Metrics>,
    /// The metrics of `--do_eval` (`eval_loss`, the script's metric, ...).
    pub eval_metrics: Option<Metrics>,
    /// The metrics of `--do_predict` (`test_...`), for scripts that predict.
    pub predict_metrics: Option<Metrics>,
}

/// The exit status for a script's result, printing what needs printing: the help text
/// (status 0), a usage line and the error for bad flags (status 2, as argparse), the error
/// and its causes for any other failure (status 1).
pub fn exit_code<T>(script: &str, result: Result<T>) -> ExitCode {
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(Error::TrainingArgs(tchtrain_training_args::Error::HelpRequested(help))) => {
            println!("{help}");
            ExitCode::SUCCESS
        }
        Err(e @ (Error::TrainingArgs(_) | Error::InvalidFlag { .. })) => {
            eprintln!("usage: {script} [-h] [--FLAG VALUE ...]\n{script}: error: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            let mut message = format!("{script}: error: {e}");
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                message.push_str(&format!("\n  caused by: {s}"));
                source = s.source();
            }
            eprintln!("{message}");
            ExitCode::FAILURE
        }
    }
}

//! The `run_translation` and `run_summarization` examples against upstream's steps around
//! `Seq2SeqTrainer` on the same data (scripts/reference/trainer_translation_summarization.py,
//! transformers 5.23 / torch 2.13, CPU, fp32, a tiny T5 with dropout 0): every logged
//! `loss`, `grad_norm`, `learning_rate` and every evaluation value (`eval_loss`, `eval_bleu`
//! / `eval_rouge*`, `eval_gen_len`) of the example's `trainer_state.json` against upstream's
//! `log_history`, the final evaluation and prediction metrics, `generated_predictions.txt`
//! byte for byte, the tokenized rows, nltk's `sent_tokenize` ([`punkt`]), and the scripts'
//! handling of bad flags.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, ensure};
use tchtrain_callbacks::TrainerState;
use tchtrain_collators::Label;
use tchtrain_data::Dataset;
use tchtrain_datasets::{Table, cell_text};
use tchtrain_examples::punkt::{PunktSentenceTokenizer, find_punkt_tab};
use tchtrain_examples::run_translation::preprocess_function;
use tchtrain_examples::{
    Error, ExampleOutput, Seq2SeqDataArguments, exit_code, run_summarization, run_translation,
};
use tchtrain_models::AutoTokenizer;
use tchtrain_testing::{assert_exact, asset, assets, compare, lock};

use super::examples_mlm_ner::read_json;

fn reference(rel: &str) -> String {
    asset(&format!(
        "reference/trainer_translation_summarization/{rel}"
    ))
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "tchtrain-examples-seq2seq-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn flags(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// The flags of both reference runs.
fn run_flags(out: &Path) -> Vec<String> {
    flags(&[
        "--do_train",
        "--do_eval",
        "--do_predict",
        "--per_device_train_batch_size",
        "8",
        "--per_device_eval_batch_size",
        "8",
        "--num_train_epochs",
        "2",
        "--learning_rate",
        "3e-3",
        "--lr_scheduler_type",
        "linear",
        "--warmup_steps",
        "2",
        "--weight_decay",
        "0.01",
        "--eval_strategy",
        "epoch",
        "--predict_with_generate",
        "--max_source_length",
        "32",
        "--max_target_length",
        "32",
        "--val_max_target_length",
        "16",
        "--num_beams",
        "2",
        "--logging_steps",
        "1",
        "--save_strategy",
        "no",
        "--seed",
        "42",
        "--use_cpu",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
        "--output_dir",
        &out.display().to_string(),
    ])
}

/// Whether a metric is timing (runtime, speed), which no run repeats.
fn timing(key: &str) -> bool {
    key.ends_with("_runtime") || key.ends_with("_per_second")
}

/// The run's log history and result files against upstream's, each evaluation value and
/// final metric (timings aside) bit for bit.
fn check_run(task: &str, result: &ExampleOutput, out: &Path) -> Result<()> {
    let state = TrainerState::load_from_json(out.join("trainer_state.json"))?;
    let want = read_json(reference(&format!("{task}/log_history.json")))?;
    let m = compare(task, &state.log_history, &want)?;
    assert_exact(task, &m);
    let want_rows = want.as_array().context("log history")?;
    assert_eq!(state.log_history.len(), want_rows.len(), "{task}: log rows");
    let mut evals = 0;
    for (ours, theirs) in state.log_history.iter().zip(want_rows) {
        let theirs = theirs.as_object().context("row")?;
        for (k, v) in theirs {
            if k.starts_with("eval_") && !timing(k) {
                evals += 1;
                let got = ours.get(k).and_then(|x| x.as_f64());
                assert_eq!(
                    got,
                    v.as_f64(),
                    "{task}: {k} at epoch {:?}",
                    theirs.get("epoch")
                );
            }
        }
    }
    ensure!(evals > 0, "{task}: no evaluation in the log");
    let train_output = read_json(reference(&format!("{task}/train_output.json")))?;
    let train = result.train_metrics.as_ref().context("train metrics")?;
    assert_eq!(
        Some(train["train_loss"]),
        train_output["training_loss"].as_f64()
    );
    for (split, metrics) in [
        ("train", result.train_metrics.as_ref()),
        ("eval", result.eval_metrics.as_ref()),
        ("predict", result.predict_metrics.as_ref()),
    ] {
        let metrics = metrics.with_context(|| format!("{split} metrics"))?;
        let want = read_json(reference(&format!("{task}/{split}_results.json")))?;
        for (k, v) in want.as_object().context("results")? {
            if timing(k) || k == "total_flos" || k == "train_loss" && split != "train" {
                continue;
            }
            assert_eq!(metrics.get(k).copied(), v.as_f64(), "{task} {split}: {k}");
        }
        ensure!(
            out.join(format!("{split}_results.json")).is_file(),
            "{split}_results.json missing"
        );
    }
    assert_eq!(
        std::fs::read_to_string(out.join("generated_predictions.txt"))?,
        std::fs::read_to_string(reference(&format!("{task}/generated_predictions.txt")))?,
        "{task}: generated_predictions.txt"
    );
    ensure!(out.join("all_results.json").is_file());
    Ok(())
}

/// The reference translation run's command line with the data flags `data`.
fn translation_argv(data: &[&str], out: &Path) -> Vec<String> {
    let mut argv = flags(&[
        "--model_name_or_path",
        &reference("translation/initial"),
        "--source_lang",
        "en",
        "--target_lang",
        "ro",
        "--source_prefix",
        "translate English to Romanian: ",
    ]);
    argv.extend(flags(data));
    argv.extend(run_flags(out));
    argv
}

#[test]
fn run_translation_matches_upstream() -> Result<()> {
    let _g = lock();
    let out = temp_dir("translation");
    let argv = translation_argv(
        &[
            "--train_file",
            &reference("translation/train.json"),
            "--validation_file",
            &reference("translation/validation.jsonl"),
            "--test_file",
            &reference("translation/test.json"),
        ],
        &out,
    );
    let result = run_translation::main_with_args(&argv)?;
    check_run("translation", &result, &out)?;
    let eval = result.eval_metrics.context("eval")?;
    assert!(eval["eval_bleu"] > 0.0, "{eval:?}");
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

/// `--dataset_name` on a local folder laid out as a dataset repository (the reference's
/// `train.json`, `validation.jsonl` and `test.json`: `datasets`' split patterns) trains,
/// evaluates and predicts as the same files given as `--train_file` / `--validation_file` /
/// `--test_file`: upstream's values, to the bit. A split the folder lacks names itself.
#[test]
fn run_translation_reads_the_splits_of_a_dataset_folder() -> Result<()> {
    let _g = lock();
    let data = temp_dir("translation-dataset");
    std::fs::create_dir_all(&data)?;
    for file in ["train.json", "validation.jsonl", "test.json"] {
        std::fs::copy(reference(&format!("translation/{file}")), data.join(file))?;
    }
    let out = temp_dir("translation-dataset-out");
    let folder = data.display().to_string();
    let argv = |out: &Path| translation_argv(&["--dataset_name", &folder], out);
    let result = run_translation::main_with_args(argv(&out))?;
    check_run("translation", &result, &out)?;
    std::fs::remove_file(data.join("test.json"))?;
    let err = run_translation::main_with_args(argv(&out)).unwrap_err();
    usage_error(
        err,
        "run_translation",
        "dataset_name",
        "--do_predict requires a test dataset",
    );
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(&data);
    Ok(())
}

#[test]
fn run_summarization_matches_upstream() -> Result<()> {
    let _g = lock();
    let out = temp_dir("summarization");
    let mut argv = flags(&[
        "--model_name_or_path",
        &reference("summarization/initial"),
        "--source_prefix",
        "summarize: ",
        "--train_file",
        &reference("summarization/train.csv"),
        "--validation_file",
        &reference("summarization/validation.csv"),
        "--test_file",
        &reference("summarization/test.csv"),
        "--nltk_data",
        &asset("nltk_data"),
    ]);
    argv.extend(run_flags(&out));
    let result = run_summarization::main_with_args(&argv)?;
    check_run("summarization", &result, &out)?;
    // One training row has an empty summary: dropped.
    assert_eq!(
        result.train_metrics.context("train")?["train_samples"],
        47.0
    );
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

/// A file's `translation` texts.
fn pairs(file: &str) -> Result<(Vec<String>, Vec<String>)> {
    let (mut en, mut ro) = (Vec::new(), Vec::new());
    for line in std::fs::read_to_string(file)?.lines() {
        let row: serde_json::Value = serde_json::from_str(line)?;
        en.push(row["translation"]["en"].as_str().context("en")?.to_string());
        ro.push(row["translation"]["ro"].as_str().context("ro")?.to_string());
    }
    Ok((en, ro))
}

#[test]
fn translation_rows_tokenize_as_upstream() -> Result<()> {
    let ids = read_json(reference("translation/ids.json"))?;
    let tok = AutoTokenizer::from_pretrained(reference("translation/initial"))?;
    let data = Seq2SeqDataArguments {
        source_prefix: Some("translate English to Romanian: ".into()),
        max_source_length: 32,
        ..Seq2SeqDataArguments::default()
    };
    let check = |ds: &dyn Dataset, key: &str| -> Result<()> {
        let want_ids: Vec<Vec<i64>> =
            serde_json::from_value(ids[format!("{key}_input_ids")].clone())?;
        let want_mask: Vec<Vec<i64>> =
            serde_json::from_value(ids[format!("{key}_attention_mask")].clone())?;
        let want_labels: Vec<Vec<i64>> =
            serde_json::from_value(ids[format!("{key}_labels")].clone())?;
        assert_eq!(ds.len(), want_ids.len(), "{key}");
        for i in 0..ds.len() {
            let row = ds.get(i)?;
            assert_eq!(row.input_ids, want_ids[i], "{key} row {i}: input_ids");
            assert_eq!(
                row.attention_mask.as_ref(),
                Some(&want_mask[i]),
                "{key} row {i}: mask"
            );
            assert_eq!(
                row.labels,
                Some(Label::Ids(want_labels[i].clone())),
                "{key} row {i}"
            );
        }
        Ok(())
    };
    for (split, file, len) in [
        ("train", "train.json", 32),
        ("validation", "validation.jsonl", 16),
        ("test", "test.json", 16),
    ] {
        let (en, ro) = pairs(&reference(&format!("translation/{file}")))?;
        check(&preprocess_function(&tok, &data, &en, &ro, len)?, split)?;
    }
    let (en, ro) = pairs(&reference("translation/train.json"))?;
    let padded = Seq2SeqDataArguments {
        pad_to_max_length: true,
        ..data.clone()
    };
    check(
        &preprocess_function(&tok, &padded, &en, &ro, 32)?,
        "train_padded",
    )?;
    let keep = Seq2SeqDataArguments {
        ignore_pad_token_for_loss: false,
        ..padded
    };
    let ds = preprocess_function(&tok, &keep, &en, &ro, 32)?;
    let want: Vec<Vec<i64>> = serde_json::from_value(ids["train_padded_keep_pad_labels"].clone())?;
    for (i, w) in want.iter().enumerate() {
        assert_eq!(ds.get(i)?.labels, Some(Label::Ids(w.clone())), "row {i}");
    }
    assert!(
        want.iter().flatten().any(|&t| t == 0),
        "padded labels keep the pad id"
    );
    Ok(())
}

#[test]
fn summarization_rows_tokenize_as_upstream() -> Result<()> {
    let ids = read_json(reference("summarization/ids.json"))?;
    let tok = AutoTokenizer::from_pretrained(reference("summarization/initial"))?;
    let data = Seq2SeqDataArguments {
        source_prefix: Some("summarize: ".into()),
        max_source_length: 32,
        ..Seq2SeqDataArguments::default()
    };
    for (split, len) in [("train", 32), ("validation", 16), ("test", 16)] {
        let table = Table::read(reference(&format!("summarization/{split}.csv")))?;
        let (mut texts, mut summaries) = (Vec::new(), Vec::new());
        for row in 0..table.len() {
            let text = cell_text(table.cell(row, "text")?);
            let summary = cell_text(table.cell(row, "summary")?);
            if !text.is_empty() && !summary.is_empty() {
                texts.push(text);
                summaries.push(summary);
            }
        }
        let ds = preprocess_function(&tok, &data, &texts, &summaries, len)?;
        let want_ids: Vec<Vec<i64>> =
            serde_json::from_value(ids[format!("{split}_input_ids")].clone())?;
        let want_labels: Vec<Vec<i64>> =
            serde_json::from_value(ids[format!("{split}_labels")].clone())?;
        assert_eq!(ds.len(), want_ids.len(), "{split}");
        for i in 0..ds.len() {
            let row = ds.get(i)?;
            assert_eq!(row.input_ids, want_ids[i], "{split} row {i}: input_ids");
            assert_eq!(
                row.labels,
                Some(Label::Ids(want_labels[i].clone())),
                "{split} row {i}: labels"
            );
        }
    }
    Ok(())
}

#[test]
fn punkt_matches_nltk() -> Result<()> {
    let punkt = PunktSentenceTokenizer::load(&find_punkt_tab(
        Some(&assets().join("nltk_data")),
        "english",
    )?)?;
    let cases = read_json(reference("punkt.json"))?;
    let mut n = 0;
    for case in cases.as_array().context("cases")? {
        let text = case[0].as_str().context("text")?;
        let want: Vec<String> = serde_json::from_value(case[1].clone())?;
        assert_eq!(punkt.tokenize(text), want, "{text:?}");
        n += 1;
    }
    ensure!(n > 20, "{n} cases");
    Ok(())
}

/// The error of a command line, checked to be a usage error (exit status 2) of `flag`
/// whose message holds `needle`.
fn usage_error(err: Error, script: &str, flag: &str, needle: &str) {
    let text = err.to_string();
    assert!(
        matches!(err, Error::InvalidFlag { flag: ref f, .. } if f == flag),
        "{script}: {text}"
    );
    assert!(text.contains(needle), "{script}: {text}");
    assert_eq!(exit_code(script, Err::<(), _>(err)), ExitCode::from(2));
}

#[test]
fn bad_flags_name_the_fix() -> Result<()> {
    let out = temp_dir("bad");
    let out_s = out.display().to_string();
    let model = reference("translation/initial");
    let train_json = reference("translation/train.json");
    let train_csv = reference("summarization/train.csv");
    let translation = |extra: &[&str]| {
        let mut argv = flags(&["--model_name_or_path", &model, "--output_dir", &out_s]);
        argv.extend(flags(extra));
        run_translation::main_with_args(argv).map(|_| ())
    };
    let summarization = |extra: &[&str]| {
        let mut argv = flags(&[
            "--model_name_or_path",
            &reference("summarization/initial"),
            "--output_dir",
            &out_s,
        ]);
        argv.extend(flags(extra));
        run_summarization::main_with_args(argv).map(|_| ())
    };
    let e = translation(&["--train_file", &train_json, "--target_lang", "ro"]).unwrap_err();
    usage_error(
        e,
        "run_translation",
        "source_lang",
        "Need to specify the source language",
    );
    let e = translation(&[
        "--train_file",
        &train_csv,
        "--source_lang",
        "en",
        "--target_lang",
        "ro",
    ])
    .unwrap_err();
    usage_error(
        e,
        "run_translation",
        "train_file",
        "`train_file` should be a jsonlines file.",
    );
    let e = translation(&["--source_lang", "en", "--target_lang", "ro"]).unwrap_err();
    usage_error(
        e,
        "run_translation",
        "train_file",
        "Need either a dataset name",
    );
    let e =
        summarization(&["--train_file", &reference("translation/validation.jsonl")]).unwrap_err();
    usage_error(
        e,
        "run_summarization",
        "train_file",
        "should be a csv or a json file.",
    );
    let e = summarization(&[
        "--train_file",
        &train_csv,
        "--do_train",
        "--text_column",
        "body",
    ])
    .unwrap_err();
    usage_error(
        e,
        "run_summarization",
        "text_column",
        "--text_column' value 'body' needs to be one of: text, summary",
    );
    let e = summarization(&["--train_file", &train_csv, "--do_predict"]).unwrap_err();
    usage_error(
        e,
        "run_summarization",
        "test_file",
        "--do_predict requires a test dataset",
    );
    // BART (32 position embeddings) with the default --max_source_length 1024.
    let e = translation(&[
        "--model_name_or_path",
        &asset("reference/seq2seq/bart"),
        "--tokenizer_name",
        &asset("reference/trainer_seq2seq/t5/initial"),
        "--train_file",
        &train_json,
        "--source_lang",
        "en",
        "--target_lang",
        "ro",
        "--do_train",
    ])
    .unwrap_err();
    usage_error(
        e,
        "run_translation",
        "max_source_length",
        "`--max_source_length` is set to 1024, but the model only has 32 position encodings",
    );
    // A tokenizer larger than the embeddings (upstream resizes them).
    let e = translation(&[
        "--tokenizer_name",
        &reference("summarization/initial"),
        "--train_file",
        &train_json,
        "--source_lang",
        "en",
        "--target_lang",
        "ro",
        "--do_train",
    ])
    .unwrap_err();
    usage_error(
        e,
        "run_translation",
        "tokenizer_name",
        "the tokenizer has 491 tokens but the model's embeddings only 428",
    );
    // --predict_with_generate without nltk's punkt_tab: the error says how to get it.
    let empty = out.join("no-nltk-data");
    std::fs::create_dir_all(&empty)?;
    let e = summarization(&[
        "--train_file",
        &train_csv,
        "--do_train",
        "--predict_with_generate",
        "--nltk_data",
        &empty.display().to_string(),
    ])
    .unwrap_err();
    usage_error(
        e,
        "run_summarization",
        "nltk_data",
        "nltk.download('punkt_tab')",
    );
    // --help: the script's flags, then every Seq2SeqTrainingArguments flag; status 0.
    for (script, result) in [
        ("run_translation", translation(&["--help"])),
        ("run_summarization", summarization(&["--help"])),
    ] {
        let e = result.unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("--max_source_length") && text.contains("--predict_with_generate"),
            "{script}: {text}"
        );
        assert_eq!(exit_code(script, Err::<(), _>(e)), ExitCode::SUCCESS);
    }
    // Nothing requested: upstream returns without doing anything.
    translation(&[
        "--train_file",
        &train_json,
        "--source_lang",
        "en",
        "--target_lang",
        "ro",
    ])?;
    ensure!(!out.join("train_results.json").exists());
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

#[test]
fn translation_pads_to_max_length_with_the_default_collator() -> Result<()> {
    let _g = lock();
    let out = temp_dir("padded");
    let argv = flags(&[
        "--model_name_or_path",
        &reference("translation/initial"),
        "--source_lang",
        "en_XX",
        "--target_lang",
        "ro_RO",
        "--train_file",
        &reference("translation/train.json"),
        "--validation_file",
        &reference("translation/validation.jsonl"),
        "--pad_to_max_length",
        "--max_source_length",
        "24",
        "--max_target_length",
        "24",
        "--max_train_samples",
        "16",
        "--max_eval_samples",
        "8",
        "--do_train",
        "--do_eval",
        "--max_steps",
        "2",
        "--per_device_train_batch_size",
        "8",
        "--use_cpu",
        "--report_to",
        "none",
        "--save_strategy",
        "no",
        "--output_dir",
        &out.display().to_string(),
    ]);
    let result = run_translation::main_with_args(&argv)?;
    let train = result.train_metrics.context("train")?;
    assert_eq!(train["train_samples"], 16.0);
    let eval = result.eval_metrics.context("eval")?;
    assert_eq!(eval["eval_samples"], 8.0);
    assert!(eval["eval_loss"].is_finite());
    // Without --predict_with_generate: the loss alone.
    assert!(!eval.contains_key("eval_bleu"));
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

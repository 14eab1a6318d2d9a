//! The `run_mlm` and `run_ner` examples against upstream's Trainer on the same data
//! (scripts/reference/trainer_mlm_ner.py, transformers 5.23 / torch 2.13, CPU, fp32,
//! dropout off): every logged `loss`, `grad_norm`, `learning_rate` and `eval_loss` of the
//! example's `trainer_state.json` against upstream's `log_history`, the final evaluation
//! (MLM) and the predicted tags (NER); the word / label alignment against upstream's
//! tokenizer; and the scripts' handling of bad flags and data files.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, ensure};
use tchtrain_callbacks::TrainerState;
use tchtrain_collators::Label;
use tchtrain_data::Dataset;
use tchtrain_examples::run_ner::tokenize_and_align_labels;
use tchtrain_examples::{Error, exit_code, run_mlm, run_ner, seqeval};
use tchtrain_models::AutoTokenizer;
use tchtrain_testing::{assert_exact, asset, assets, compare, lock, rel};

fn reference(rel: &str) -> String {
    asset(&format!("reference/trainer_mlm_ner/{rel}"))
}

pub(crate) fn read_json(path: impl AsRef<Path>) -> Result<serde_json::Value> {
    let path = path.as_ref();
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(serde_json::from_str(&text)?)
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "tchtrain-examples-mlm-ner-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// The flags both reference runs share (upstream's `TrainingArguments` there).
fn common_flags(out: &Path) -> Vec<String> {
    [
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
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn flags(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn run_mlm_matches_upstream_trainer_with_seeded_masks() -> Result<()> {
    let _g = lock();
    let out = temp_dir("mlm");
    let mut argv = flags(&[
        "--model_name_or_path",
        &reference("mlm/initial"),
        "--tokenizer_name",
        &asset("minilm"),
        "--train_file",
        &reference("mlm/hamlet_400.txt"),
        "--validation_split_percentage",
        "10",
        "--max_seq_length",
        "32",
        "--max_train_samples",
        "32",
        "--max_eval_samples",
        "12",
        "--mlm_probability",
        "0.15",
        "--mlm_seed",
        "1234",
        "--overwrite_cache",
        "--preprocessing_num_workers",
        "1",
        "--do_train",
        "--do_eval",
        "--per_device_train_batch_size",
        "4",
        "--per_device_eval_batch_size",
        "4",
        "--gradient_accumulation_steps",
        "2",
        "--num_train_epochs",
        "3",
        "--learning_rate",
        "1e-3",
        "--lr_scheduler_type",
        "linear",
        "--warmup_steps",
        "2",
        "--weight_decay",
        "0.01",
        "--max_grad_norm",
        "1.0",
        "--eval_strategy",
        "epoch",
    ]);
    argv.extend(common_flags(&out));
    let result = run_mlm::main_with_args(&argv)?;
    for f in [
        "model.safetensors",
        "tokenizer.json",
        "trainer_state.json",
        "train_results.json",
        "eval_results.json",
        "all_results.json",
    ] {
        ensure!(out.join(f).is_file(), "{f} missing in {}", out.display());
    }
    let state = TrainerState::load_from_json(out.join("trainer_state.json"))?;
    let m = compare(
        "run_mlm",
        &state.log_history,
        &read_json(reference("mlm/log_history.json"))?,
    )?;
    let summary = read_json(reference("mlm/train_output.json"))?;
    assert_eq!(state.global_step, summary["global_step"].as_i64().unwrap());
    assert_exact("run_mlm", &m);

    // The script's final evaluation: the masks drawn after training's, as upstream.
    let eval = result.eval_metrics.context("eval metrics")?;
    let want = read_json(reference("mlm/eval_results.json"))?;
    let want_loss = want["eval_loss"].as_f64().unwrap();
    assert_eq!(eval["eval_loss"], want_loss, "final eval_loss");
    // Masked-token accuracy over 12 x 32 tokens: the same argmax ids, the same count.
    assert_eq!(
        eval["eval_accuracy"],
        want["eval_accuracy"].as_f64().unwrap()
    );
    assert!(rel(eval["perplexity"], eval["eval_loss"].exp()) < 1e-12);
    // The 40 held-out lines make 8 blocks: max_eval_samples 12 keeps them all, as upstream.
    assert_eq!((eval["eval_samples"], eval["epoch"]), (8.0, 3.0));
    let train = result.train_metrics.context("train metrics")?;
    assert_eq!(train["train_samples"], 32.0);
    let all = read_json(out.join("all_results.json"))?;
    assert!(all["train_loss"].is_f64() && all["perplexity"].is_f64());
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

/// The tags of a JSON-lines NER file.
fn file_tags(path: &str) -> Result<Vec<Vec<String>>> {
    std::fs::read_to_string(path)?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let row: serde_json::Value = serde_json::from_str(l)?;
            Ok(serde_json::from_value(row["ner_tags"].clone())?)
        })
        .collect()
}

#[test]
fn run_ner_matches_upstream_trainer() -> Result<()> {
    let _g = lock();
    let out = temp_dir("ner");
    let validation = reference("ner/validation.json");
    let mut argv = flags(&[
        "--model_name_or_path",
        &reference("ner/initial"),
        "--tokenizer_name",
        &asset("minilm"),
        "--train_file",
        &reference("ner/train.json"),
        "--validation_file",
        &validation,
        "--test_file",
        &validation,
        "--do_train",
        "--do_eval",
        "--do_predict",
        "--per_device_train_batch_size",
        "8",
        "--per_device_eval_batch_size",
        "8",
        "--num_train_epochs",
        "3",
        "--learning_rate",
        "2e-3",
        "--lr_scheduler_type",
        "linear",
        "--warmup_steps",
        "3",
        "--weight_decay",
        "0.01",
        "--eval_strategy",
        "epoch",
    ]);
    argv.extend(common_flags(&out));
    let result = run_ner::main_with_args(&argv)?;
    let state = TrainerState::load_from_json(out.join("trainer_state.json"))?;
    let m = compare(
        "run_ner",
        &state.log_history,
        &read_json(reference("ner/log_history.json"))?,
    )?;
    assert_exact("run_ner", &m);

    // The predicted tags (argmax of the same logits) as upstream's predictions.txt.
    let predictions = std::fs::read_to_string(out.join("predictions.txt"))?;
    assert_eq!(
        predictions,
        std::fs::read_to_string(reference("ner/predictions.txt"))?
    );
    // The evaluation's seqeval metrics are those of these tags against the file's.
    let predicted: Vec<Vec<String>> = predictions
        .lines()
        .map(|l| l.split(' ').map(str::to_string).collect())
        .collect();
    let scores = seqeval::compute(&predicted, &file_tags(&validation)?);
    let eval = result.eval_metrics.context("eval metrics")?;
    assert_eq!(eval["eval_f1"], scores.overall_f1);
    assert_eq!(eval["eval_precision"], scores.overall_precision);
    assert_eq!(eval["eval_recall"], scores.overall_recall);
    assert_eq!(eval["eval_accuracy"], scores.overall_accuracy);
    assert_eq!(eval["eval_samples"], 16.0);
    let predict = result.predict_metrics.context("predict metrics")?;
    assert_eq!(predict["predict_f1"], scores.overall_f1);
    // `predict` and `evaluate` run the same loop on the same rows: the same loss, bit for bit.
    assert_eq!(predict["predict_loss"], eval["eval_loss"]);
    for f in ["predict_results.json", "all_results.json", "tokenizer.json"] {
        ensure!(out.join(f).is_file(), "{f} missing");
    }
    // The saved model names its labels.
    let config = read_json(out.join("config.json"))?;
    assert_eq!(config["id2label"]["0"], "B-LOC");
    assert_eq!(config["label2id"]["O"], 6);
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

#[test]
fn ner_labels_align_with_word_pieces_as_upstream() -> Result<()> {
    let ids = read_json(reference("ner/ids.json"))?;
    let labels: Vec<String> = serde_json::from_value(ids["labels"].clone())?;
    let tok = AutoTokenizer::from_pretrained(assets().join("minilm"))?;
    let tokenizer = tok.tokenizer();
    let mut continued = 0;
    for split in ["train", "validation"] {
        let rows = std::fs::read_to_string(reference(&format!("ner/{split}.json")))?;
        let (mut words, mut tags) = (Vec::new(), Vec::new());
        for line in rows.lines() {
            let row: serde_json::Value = serde_json::from_str(line)?;
            words.push(serde_json::from_value::<Vec<String>>(
                row["tokens"].clone(),
            )?);
            tags.push(serde_json::from_value::<Vec<String>>(
                row["ner_tags"].clone(),
            )?);
        }
        for (all_tokens, key) in [(false, "labels"), (true, "labels_all_tokens")] {
            let ds = tokenize_and_align_labels(tokenizer, &words, &tags, &labels, all_tokens, 512)?;
            let want_ids: Vec<Vec<i64>> =
                serde_json::from_value(ids[format!("{split}_input_ids")].clone())?;
            let want: Vec<Vec<i64>> =
                serde_json::from_value(ids[format!("{split}_{key}")].clone())?;
            assert_eq!(ds.len(), want.len());
            for (i, (w_ids, w)) in want_ids.iter().zip(&want).enumerate() {
                let row = ds.get(i)?;
                assert_eq!(&row.input_ids, w_ids, "{split} row {i}: input_ids");
                assert_eq!(
                    row.labels,
                    Some(Label::Ids(w.clone())),
                    "{split} row {i}: {key}"
                );
                if !all_tokens {
                    // Later word pieces: -100 here, a label with label_all_tokens.
                    let all: Vec<Vec<i64>> =
                        serde_json::from_value(ids[format!("{split}_labels_all_tokens")].clone())?;
                    continued += w
                        .iter()
                        .zip(&all[i])
                        .filter(|(a, b)| **a == -100 && **b != -100)
                        .count();
                }
            }
        }
    }
    assert!(continued > 0, "the data has words of several pieces");
    Ok(())
}

#[test]
fn run_mlm_line_by_line_pads_to_max_length() -> Result<()> {
    let _g = lock();
    let out = temp_dir("mlm-lbl");
    let mut argv = flags(&[
        "--model_name_or_path",
        &asset("tiny-bert"),
        "--tokenizer_name",
        &asset("minilm"),
        "--train_file",
        &reference("mlm/hamlet_400.txt"),
        "--line_by_line",
        "--pad_to_max_length",
        "--max_seq_length",
        "24",
        "--max_eval_samples",
        "8",
        "--do_train",
        "--do_eval",
        "--max_steps",
        "2",
        "--per_device_train_batch_size",
        "4",
    ]);
    argv.extend(common_flags(&out));
    let result = run_mlm::main_with_args(&argv)?;
    let eval = result.eval_metrics.context("eval metrics")?;
    assert_eq!(eval["eval_samples"], 8.0);
    assert!((0.0..=1.0).contains(&eval["eval_accuracy"]));
    let state = TrainerState::load_from_json(out.join("trainer_state.json"))?;
    assert_eq!(state.global_step, 2);
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

/// A run_ner command line on `train` (JSON lines), training only.
fn ner_argv(train: &Path, extra: &[&str]) -> Vec<String> {
    let mut argv = flags(&[
        "--model_name_or_path",
        &asset("tiny-bert"),
        "--tokenizer_name",
        &asset("minilm"),
        "--train_file",
        &train.display().to_string(),
        "--do_train",
        "--output_dir",
        "unused",
    ]);
    argv.extend(flags(extra));
    argv
}

#[test]
fn bad_flags_and_files_name_the_column_and_the_fix() -> Result<()> {
    let dir = temp_dir("bad");
    std::fs::create_dir_all(&dir)?;
    let train = dir.join("train.json");
    std::fs::write(
        &train,
        "{\"words\": [\"Tom\", \"left\"], \"tags\": [\"B-PER\", \"O\"]}\n",
    )?;

    // A named column that is not there: a usage error naming it, the columns and the flag.
    let err = run_ner::main_with_args(ner_argv(&train, &["--label_column_name", "ner_tags"]))
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, Error::InvalidFlag { ref flag, .. } if flag == "label_column_name"),
        "{err}"
    );
    assert!(
        text.contains("'ner_tags'")
            && text.contains("tags")
            && text.contains("words")
            && text.contains("--label_column_name"),
        "{text}"
    );
    assert_eq!(exit_code("run_ner", Err::<(), _>(err)), ExitCode::from(2));
    let err =
        run_ner::main_with_args(ner_argv(&train, &["--text_column_name", "tokens"])).unwrap_err();
    assert!(
        matches!(err, Error::InvalidFlag { ref flag, ref detail } if flag == "text_column_name" && detail.contains("'tokens'")),
        "{err}"
    );

    // Words and tags of different lengths: the file and line.
    std::fs::write(
        &train,
        "{\"tokens\": [\"Tom\", \"left\"], \"ner_tags\": [\"B-PER\", \"O\"]}\n{\"tokens\": [\"Ann\"], \"ner_tags\": [\"B-PER\", \"O\"]}\n",
    )?;
    let err = run_ner::main_with_args(ner_argv(&train, &[])).unwrap_err();
    assert!(matches!(err, Error::DataFile { line: 2, .. }), "{err}");
    // --do_eval without a validation file, and unknown flags.
    let err = run_ner::main_with_args(ner_argv(&train, &["--do_eval"])).unwrap_err();
    assert!(
        matches!(err, Error::InvalidFlag { ref flag, .. } if flag == "validation_file"),
        "{err}"
    );
    let err = run_ner::main_with_args(["--label_all_tokenz"]).unwrap_err();
    assert!(err.to_string().contains("--label_all_tokens"), "{err}");
    let err = run_mlm::main_with_args(["--mlm_probability", "1.5"]).unwrap_err();
    assert!(matches!(err, Error::InvalidFlag { ref flag, .. } if flag == "mlm_probability"));
    assert_eq!(exit_code("run_mlm", Err::<(), _>(err)), ExitCode::from(2));
    let err = run_mlm::main_with_args([
        "--model_name_or_path",
        &asset("tiny-bert"),
        "--tokenizer_name",
        &asset("minilm"),
        "--do_train",
        "--output_dir",
        "unused",
    ])
    .unwrap_err();
    assert!(
        matches!(err, Error::InvalidFlag { ref flag, .. } if flag == "train_file"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[test]
fn run_ner_reads_integer_tags_and_csv_lists() -> Result<()> {
    let _g = lock();
    let dir = temp_dir("ner-kinds");
    std::fs::create_dir_all(&dir)?;
    // Integer tags: the label list is the sorted numbers ("0" < "2" < "10" as numbers).
    let json = dir.join("ints.jsonl");
    std::fs::write(
        &json,
        "{\"tokens\": [\"Tom\", \"left\", \"Paris\"], \"ner_tags\": [10, 0, 2]}\n{\"tokens\": [\"Ann\", \"stayed\"], \"ner_tags\": [10, 0]}\n",
    )?;
    // CSV: a JSON list in one cell, words separated by spaces in the other.
    let csv = dir.join("rows.csv");
    std::fs::write(
        &csv,
        "words,tags\nTom left Paris,\"[\"\"B-PER\"\", \"\"O\"\", \"\"B-LOC\"\"]\"\nAnn stayed,B-PER O\n",
    )?;
    // A Parquet file `Dataset.to_parquet` wrote, whose ner_tags are a list of ClassLabel:
    // the label list is the class names (in their order), the tags are named by them.
    let parquet = PathBuf::from(asset(
        "reference/datasets_parquet/parquet/ner_class_label.parquet",
    ));
    let class_names: &[&str] = &["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-MISC"];
    for (file, text_column, label_column, id2label, rows) in [
        (&json, "tokens", "ner_tags", &["0", "2", "10"][..], 2.0),
        (&csv, "words", "tags", &["B-LOC", "B-PER", "O"][..], 2.0),
        (&parquet, "tokens", "ner_tags", class_names, 24.0),
    ] {
        let out = dir.join(format!(
            "out-{label_column}-{}",
            file.extension().unwrap_or_default().display()
        ));
        let file = file.display().to_string();
        let mut argv = flags(&[
            "--model_name_or_path",
            &asset("tiny-bert"),
            "--tokenizer_name",
            &asset("minilm"),
            "--train_file",
            &file,
            "--validation_file",
            &file,
            "--text_column_name",
            text_column,
            "--label_column_name",
            label_column,
            "--label_all_tokens",
            "--return_entity_level_metrics",
            "--do_train",
            "--do_eval",
            "--max_steps",
            "1",
        ]);
        argv.extend(common_flags(&out));
        let result = run_ner::main_with_args(&argv)?;
        let eval = result.eval_metrics.context("eval metrics")?;
        assert_eq!(eval["eval_samples"], rows, "{file}");
        // --return_entity_level_metrics: seqeval's nested dict flattened, as upstream.
        for key in ["eval_overall_f1", "eval_overall_accuracy"] {
            assert!(eval.contains_key(key), "{key} missing: {eval:?}");
        }
        if label_column == "tags" {
            assert_eq!(eval["eval_PER_number"], 2.0);
            assert_eq!(eval["eval_LOC_number"], 1.0);
        }
        if rows == 24.0 {
            // Named tags make entities: seqeval counts them per type.
            for key in ["eval_PER_number", "eval_LOC_number", "eval_MISC_number"] {
                assert!(eval.get(key).is_some_and(|n| *n > 0.0), "{key}: {eval:?}");
            }
        }
        let config = read_json(out.join("config.json"))?;
        for (i, name) in id2label.iter().enumerate() {
            assert_eq!(config["id2label"][i.to_string()], *name, "{file}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

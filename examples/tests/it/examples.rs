//! The example scripts run in process on tiny models: `run_clm` on tiny GPT-2 and
//! hamlet.txt, `run_classification` on tiny BERT and a slice of the Rotten Tomatoes corpus
//! (bzip2 CSV for training, JSON lines for evaluation); plus the data-file loaders on the
//! real corpus and the scripts' handling of bad flags.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, ensure};
use tchtrain_callbacks::TrainerState;
use tchtrain_datasets::{Table, cell_text};
use tchtrain_examples::{ClassificationLabels, Error, exit_code, run_classification, run_clm};
use tchtrain_models::LoadDtype;
use tchtrain_testing::{asset, assets, lock};

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tchtrain-examples-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// The `loss` entries of `trainer_state.json`'s `log_history`.
fn logged_losses(state: &TrainerState) -> Vec<f64> {
    state
        .log_history
        .iter()
        .filter_map(|e| e.get("loss").and_then(|v| v.as_f64()))
        .collect()
}

#[test]
fn run_clm_fine_tunes_tiny_gpt2_on_hamlet() -> Result<()> {
    let _g = lock();
    let out = temp_dir("clm");
    let o = out.display().to_string();
    let result = run_clm::main_with_args([
        "--model_name_or_path",
        &asset("tiny-gpt2"),
        "--tokenizer_name",
        &asset("gpt2-tokenizer"),
        "--train_file",
        &asset("text/hamlet.txt"),
        "--block_size",
        "32",
        "--max_eval_samples",
        "8",
        "--do_train",
        "--do_eval",
        "--max_steps",
        "8",
        "--per_device_train_batch_size",
        "4",
        "--learning_rate",
        "1e-3",
        "--logging_steps",
        "2",
        "--save_steps",
        "8",
        "--use_cpu",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
        "--output_dir",
        &o,
    ])?;
    let ckpt = out.join("checkpoint-8");
    for f in ["model.safetensors", "config.json", "trainer_state.json"] {
        ensure!(ckpt.join(f).is_file(), "{f} missing in {}", ckpt.display());
    }
    for f in [
        "model.safetensors",
        "tokenizer.json",
        "trainer_state.json",
        "train_results.json",
        "eval_results.json",
        "all_results.json",
    ] {
        ensure!(out.join(f).is_file(), "{f} missing in {o}");
    }
    let state = TrainerState::load_from_json(ckpt.join("trainer_state.json"))?;
    assert_eq!(state.global_step, 8);
    let losses = logged_losses(&state);
    assert_eq!(losses.len(), 4, "logged every 2 of 8 steps: {losses:?}");
    // A random tiny GPT-2 starts near ln(50257) = 10.8; 8 steps at lr 1e-3 (linear decay)
    // take it down by about 0.2 (10.48 -> 10.26 here).
    assert!(
        losses[3] < losses[0] - 0.1,
        "train loss did not decrease: {losses:?}"
    );

    let train = result.train_metrics.context("train metrics")?;
    assert_eq!(train["train_samples"], train["train_samples"].round());
    assert!(train["train_loss"].is_finite());
    let eval = result.eval_metrics.context("eval metrics")?;
    assert_eq!(eval["eval_samples"], 8.0);
    // perplexity = exp(eval_loss), as upstream's script.
    assert!((eval["perplexity"] - eval["eval_loss"].exp()).abs() < 1e-9 * eval["perplexity"]);
    let acc = eval["eval_accuracy"];
    assert!((0.0..=1.0).contains(&acc), "accuracy {acc}");
    let all: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("all_results.json"))?)?;
    assert!(all["train_loss"].is_f64() && all["eval_loss"].is_f64());

    // The saved folder loads again (its own tokenizer.json), evaluating to the same loss.
    let again = run_clm::main_with_args([
        "--model_name_or_path",
        &o,
        "--train_file",
        &asset("text/hamlet.txt"),
        "--block_size",
        "32",
        "--max_eval_samples",
        "8",
        "--do_eval",
        "--use_cpu",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
        "--output_dir",
        &out.join("reloaded").display().to_string(),
    ])?;
    let reloaded = again.eval_metrics.context("eval metrics")?["eval_loss"];
    // The reloaded weights are the saved bits; same batches, same kernels, same threads:
    // the same loss, bit for bit.
    assert_eq!(reloaded, eval["eval_loss"]);
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

#[test]
fn run_classification_trains_tiny_bert_on_rotten_tomatoes() -> Result<()> {
    let _g = lock();
    let out = temp_dir("cls");
    std::fs::create_dir_all(&out)?;
    // Evaluation rows: 16 reviews from the end of the corpus (it is sorted by category),
    // half fresh, half rotten, as JSON lines.
    let corpus = Table::read(asset("text/rotten_tomatoes_corpus.csv.bz2"))?;
    let mut valid = String::new();
    let mut counts = [0usize; 2];
    for row in (0..corpus.len()).rev() {
        let category = cell_text(corpus.cell(row, "category")?);
        let k = match category.as_str() {
            "fresh" => 0,
            "rotten" => 1,
            _ => continue,
        };
        if counts[k] < 8 {
            counts[k] += 1;
            let text = cell_text(corpus.cell(row, "text")?);
            valid.push_str(&serde_json::json!({"text": text, "category": category}).to_string());
            valid.push('\n');
        }
    }
    let valid_path = out.join("valid.jsonl");
    std::fs::write(&valid_path, valid)?;

    let o = out.join("run").display().to_string();
    let result = run_classification::main_with_args([
        "--model_name_or_path",
        &asset("tiny-bert"),
        "--tokenizer_name",
        &asset("minilm"),
        "--train_file",
        &asset("text/rotten_tomatoes_corpus.csv.bz2"),
        "--validation_file",
        &valid_path.display().to_string(),
        "--text_column_names",
        "text",
        "--label_column_name",
        "category",
        "--shuffle_train_dataset",
        "--max_train_samples",
        "96",
        "--max_seq_length",
        "48",
        "--pad_to_max_length",
        "false",
        "--do_train",
        "--do_eval",
        "--num_train_epochs",
        "3",
        "--per_device_train_batch_size",
        "8",
        "--learning_rate",
        "2e-3",
        "--logging_steps",
        "9",
        "--use_cpu",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
        "--output_dir",
        &o,
    ])?;
    let run = Path::new(&o);
    let ckpt = run.join("checkpoint-36");
    ensure!(
        ckpt.join("trainer_state.json").is_file(),
        "no checkpoint-36 in {o}"
    );
    let state = TrainerState::load_from_json(ckpt.join("trainer_state.json"))?;
    let losses = logged_losses(&state);
    assert_eq!(losses.len(), 4, "{losses:?}");
    assert!(
        losses[3] < losses[0],
        "train loss did not decrease: {losses:?}"
    );

    // The labels are the corpus's three categories, sorted, in the saved config.
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("config.json"))?)?;
    assert_eq!(config["id2label"]["0"], "fresh");
    assert_eq!(config["id2label"]["1"], "plot");
    assert_eq!(config["label2id"]["rotten"], 2);
    let eval = result.eval_metrics.context("eval metrics")?;
    assert_eq!(eval["eval_samples"], 16.0);
    let acc = eval["eval_accuracy"];
    // 16 rows: accuracy is a multiple of 1/16.
    assert!(
        (acc * 16.0 - (acc * 16.0).round()).abs() < 1e-9,
        "accuracy {acc}"
    );
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

#[test]
fn rotten_tomatoes_corpus_reads_as_python_csv_does() -> Result<()> {
    // Python: csv.DictReader over the decompressed file gives 5022 rows:
    // fresh 2455, rotten 2411, plot 156 (plot texts span several lines).
    let t = Table::read(asset("text/rotten_tomatoes_corpus.csv.bz2"))?;
    assert_eq!(t.columns(), ["category", "filename", "text", "movie_name"]);
    assert_eq!(t.len(), 5022);
    let cats: Vec<String> = t.column("category")?.into_iter().map(cell_text).collect();
    let count = |c: &str| cats.iter().filter(|x| *x == c).count();
    assert_eq!(
        (count("fresh"), count("rotten"), count("plot")),
        (2455, 2411, 156)
    );
    assert!(cell_text(t.cell(0, "text")?).contains("...\n\nCatherine Burke"));
    assert_eq!(
        ClassificationLabels::from_table(&t, "category")?,
        ClassificationLabels::Classes(vec!["fresh".into(), "plot".into(), "rotten".into()])
    );
    assert!(matches!(
        t.column("label"),
        Err(tchtrain_datasets::Error::MissingColumn { ref column, .. }) if column == "label"
    ));
    Ok(())
}

#[test]
fn json_lines_and_label_kinds() -> Result<()> {
    let t = Table::from_json_str(
        "{\"s\": \"a\", \"y\": 1}\n\n{\"s\": \"b\", \"y\": 0.5, \"extra\": true}\n",
        "x.jsonl",
    )?;
    assert_eq!(t.columns(), ["s", "y", "extra"]);
    assert_eq!(t.cell(0, "extra")?, &serde_json::Value::Null);
    assert_eq!(
        ClassificationLabels::from_table(&t, "y")?,
        ClassificationLabels::Regression
    );
    let ints = Table::from_csv_str("s,y\na,10\nb,9\nc,10\n", "x.csv")?;
    assert_eq!(
        ClassificationLabels::from_table(&ints, "y")?,
        ClassificationLabels::Classes(vec!["9".into(), "10".into()])
    );
    assert!(matches!(
        Table::from_json_str("{\"s\": 1}\n[1]\n", "bad.jsonl"),
        Err(tchtrain_datasets::Error::DataFile { line: 2, .. })
    ));
    assert!(matches!(
        Table::from_csv_str("a,b\n1,2,3\n", "bad.csv"),
        Err(tchtrain_datasets::Error::DataFile { line: 2, .. })
    ));
    assert!(matches!(
        Table::from_csv_str("a,b\n\"1,2\n", "open.csv"),
        Err(tchtrain_datasets::Error::DataFile { .. })
    ));
    Ok(())
}

#[test]
fn bad_flags_are_usage_errors() {
    // An unknown flag: upstream's parser's error, with the close match.
    let err = run_clm::main_with_args(["--blok_size", "3"]).unwrap_err();
    assert!(matches!(err, Error::TrainingArgs(_)), "{err}");
    assert!(err.to_string().contains("--block_size"), "{err}");
    assert_eq!(exit_code("run_clm", Err::<(), _>(err)), ExitCode::from(2));
    let err = run_clm::main_with_args(["--max_steps", "many"]).unwrap_err();
    assert!(matches!(err, Error::TrainingArgs(_)), "{err}");
    assert_eq!(exit_code("run_clm", Err::<(), _>(err)), ExitCode::from(2));
    let err = run_classification::main_with_args(["--max_seq_length", "x"]).unwrap_err();
    assert!(err.to_string().contains("invalid int value: 'x'"), "{err}");
    // `--dtype` takes upstream's names; transformers 5's scripts dropped v4's `--torch_dtype`.
    let (clm, _) = run_clm::parse_args(["--dtype", "bfloat16", "--output_dir", "o"]).unwrap();
    assert_eq!(clm.dtype, LoadDtype::Kind(tch::Kind::BFloat16));
    let (clm, _) = run_clm::parse_args(["--dtype", "auto", "--output_dir", "o"]).unwrap();
    assert_eq!(clm.dtype, LoadDtype::Auto);
    assert!(run_clm::parse_args(["--torch_dtype", "auto", "--output_dir", "o"]).is_err());
    let err = run_clm::main_with_args(["--dtype", "fp8"]).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("`dtype`") && text.contains("invalid choice"),
        "{err}"
    );
    // No model: a flag error before anything is loaded.
    let err = run_clm::main_with_args(["--do_train", "--output_dir", "unused"]).unwrap_err();
    assert!(
        matches!(err, Error::InvalidFlag { ref flag, .. } if flag == "model_name_or_path"),
        "{err}"
    );
    // A missing label column is reported before training.
    let err = run_classification::main_with_args([
        "--model_name_or_path",
        &asset("tiny-bert"),
        "--tokenizer_name",
        &asset("minilm"),
        "--train_file",
        &asset("text/rotten_tomatoes_corpus.csv.bz2"),
        "--do_train",
        "--output_dir",
        "unused",
    ])
    .unwrap_err();
    assert!(
        matches!(err, Error::Datasets(tchtrain_datasets::Error::MissingColumn { ref column, .. }) if column == "label"),
        "{err}"
    );
    // `--do_predict`'s test file, checked as upstream before anything is trained.
    let predict = |extra: &[&str]| {
        let mut argv = vec![
            "--model_name_or_path".to_string(),
            asset("tiny-bert"),
            "--tokenizer_name".into(),
            asset("minilm"),
            "--train_file".into(),
            asset("text/rotten_tomatoes_corpus.csv.bz2"),
            "--output_dir".into(),
            "unused".into(),
        ];
        argv.extend(extra.iter().map(|s| s.to_string()));
        run_classification::main_with_args(argv).unwrap_err()
    };
    for (extra, says) in [
        (
            &["--do_predict"][..],
            "Need either a dataset name or a test file",
        ),
        (
            &["--test_file", "t.csv.bz2"][..],
            "--do_predict requires a test dataset",
        ),
        (
            &["--do_predict", "--test_file", "t.json"][..],
            "should have the same extension",
        ),
    ] {
        let err = predict(extra);
        assert!(
            matches!(err, Error::InvalidFlag { ref flag, .. } if flag == "test_file")
                && err.to_string().contains(says),
            "{extra:?}: {err}"
        );
    }
}

/// `--dataset_name` with a folder laid out as a dataset repository (`train.txt`,
/// `validation.txt`: `datasets`' split patterns) trains as the same files given as
/// `--train_file` / `--validation_file` with `--no_keep_linebreaks` (the `text` builder of
/// `load_dataset(name)` drops line breaks), to the bit; a missing dataset names itself.
#[test]
fn run_clm_dataset_name_reads_the_splits_of_a_dataset_folder() -> Result<()> {
    let _g = lock();
    let data = temp_dir("clm-dataset-folder");
    std::fs::create_dir_all(&data)?;
    let text = std::fs::read_to_string(asset("text/hamlet.txt"))?;
    let lines: Vec<&str> = text.lines().collect();
    std::fs::write(data.join("train.txt"), lines[..1200].join("\n"))?;
    std::fs::write(data.join("validation.txt"), lines[1200..1500].join("\n"))?;
    let mut runs = Vec::new();
    for by_name in [true, false] {
        let out = temp_dir(&format!("clm-dataset-{by_name}"));
        let mut argv: Vec<String> = [
            "--model_name_or_path",
            &asset("tiny-gpt2"),
            "--tokenizer_name",
            &asset("gpt2-tokenizer"),
            "--block_size",
            "32",
            "--do_train",
            "--do_eval",
            "--max_steps",
            "3",
            "--per_device_train_batch_size",
            "4",
            "--logging_steps",
            "1",
            "--save_strategy",
            "no",
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
        .collect();
        if by_name {
            argv.extend(["--dataset_name".into(), data.display().to_string()]);
        } else {
            argv.extend([
                "--train_file".into(),
                data.join("train.txt").display().to_string(),
                "--validation_file".into(),
                data.join("validation.txt").display().to_string(),
                "--no_keep_linebreaks".into(),
            ]);
        }
        let result = run_clm::main_with_args(&argv)?;
        let state = TrainerState::load_from_json(out.join("trainer_state.json"))?;
        let eval = result.eval_metrics.context("eval metrics")?;
        runs.push((logged_losses(&state), eval["eval_loss"]));
        let _ = std::fs::remove_dir_all(&out);
    }
    assert_eq!(runs[0].0.len(), 3);
    assert_eq!(runs[0], runs[1]);
    let missing = data.join("nothing-here");
    let err = run_clm::main_with_args([
        "--model_name_or_path",
        &asset("tiny-gpt2"),
        "--tokenizer_name",
        &asset("gpt2-tokenizer"),
        "--dataset_name",
        &missing.display().to_string(),
        "--do_train",
        "--output_dir",
        &data.join("o").display().to_string(),
    ])
    .unwrap_err();
    assert!(err.to_string().contains("nothing-here"), "{err}");
    let _ = std::fs::remove_dir_all(&data);
    Ok(())
}

#[test]
fn run_clm_streaming_trains_as_the_loaded_file_in_sequence() -> Result<()> {
    let _g = lock();
    let mut runs = Vec::new();
    for streaming in [false, true] {
        let out = temp_dir(&format!("clm-stream-{streaming}"));
        let o = out.display().to_string();
        let mut argv: Vec<String> = [
            "--model_name_or_path",
            &asset("tiny-gpt2"),
            "--tokenizer_name",
            &asset("gpt2-tokenizer"),
            "--train_file",
            &asset("text/hamlet.txt"),
            "--block_size",
            "32",
            "--do_train",
            "--max_steps",
            "3",
            "--per_device_train_batch_size",
            "4",
            "--logging_steps",
            "1",
            "--save_strategy",
            "no",
            "--use_cpu",
            "--report_to",
            "none",
            "--disable_tqdm",
            "true",
            "--output_dir",
            &o,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if streaming {
            argv.push("--streaming".into());
        } else {
            // The loaded file in the stream's order: every line trains, sequentially.
            argv.extend(
                [
                    "--validation_split_percentage",
                    "0",
                    "--train_sampling_strategy",
                    "sequential",
                ]
                .map(String::from),
            );
        }
        run_clm::main_with_args(&argv)?;
        let state = TrainerState::load_from_json(out.join("trainer_state.json"))?;
        runs.push(logged_losses(&state));
        let _ = std::fs::remove_dir_all(&out);
    }
    assert_eq!(runs[0].len(), 3);
    assert_eq!(runs[0], runs[1]);

    // --streaming needs --max_steps, and a --validation_file to evaluate.
    let out = temp_dir("clm-stream-bad");
    let o = out.display().to_string();
    let base = [
        "--model_name_or_path",
        &asset("tiny-gpt2"),
        "--tokenizer_name",
        &asset("gpt2-tokenizer"),
        "--train_file",
        &asset("text/hamlet.txt"),
        "--streaming",
        "--use_cpu",
        "--output_dir",
        &o,
    ];
    let err = run_clm::main_with_args(base.iter().chain(&["--do_train"])).unwrap_err();
    assert!(err.to_string().contains("--max_steps"), "{err}");
    let err =
        run_clm::main_with_args(base.iter().chain(&["--do_eval", "--max_steps", "2"])).unwrap_err();
    assert!(err.to_string().contains("--validation_file"), "{err}");
    Ok(())
}

#[test]
fn bad_label_columns_and_values_are_named() -> Result<()> {
    use tchtrain_examples::{TextClassificationOptions, tokenize_text_classification};
    // A data file without the label column: named, with the columns it has.
    let table = Table::from_json_str(
        "{\"sentence\": \"a fine film\"}\n{\"sentence\": \"dull\"}\n",
        "train.jsonl",
    )?;
    let err = ClassificationLabels::from_table(&table, "label").unwrap_err();
    assert!(
        matches!(&err, Error::Datasets(tchtrain_datasets::Error::MissingColumn { column, .. }) if column == "label"),
        "{err}"
    );
    let tok = tchtrain_models::AutoTokenizer::from_pretrained(assets().join("minilm"))?;
    let tokenizer = tok.tokenizer().clone();
    let labels = ClassificationLabels::Classes(vec!["fresh".into(), "rotten".into()]);
    let err = tokenize_text_classification(
        &table,
        &tokenizer,
        &labels,
        &TextClassificationOptions::default(),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Datasets(tchtrain_datasets::Error::MissingColumn { .. })
        ),
        "{err}"
    );
    // A label the label list does not have.
    let table = Table::from_json_str(
        "{\"sentence\": \"a fine film\", \"label\": \"fresh\"}\n{\"sentence\": \"dull\", \"label\": \"plot\"}\n",
        "train.jsonl",
    )?;
    let err = tokenize_text_classification(
        &table,
        &tokenizer,
        &labels,
        &TextClassificationOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, Error::InvalidLabel { row: 1, .. }), "{err}");

    Ok(())
}

/// The MiniLM classification rows of scripts/reference/trainer_parity.py: the label list
/// and the token ids upstream's tokenizer gave (truncation to 64, no padding), which the
/// Trainer's parity test trains on.
#[test]
fn tokenize_text_classification_gives_upstreams_ids() -> Result<()> {
    use tchtrain_examples::{TextClassificationOptions, tokenize_text_classification};
    let dir = assets().join("reference/trainer_parity/minilm_cls");
    let ids: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("ids.json"))?)?;
    let tok = tchtrain_models::AutoTokenizer::from_pretrained(assets().join("minilm"))?;
    let tokenizer = tok.tokenizer().clone();
    let want_labels: Vec<String> = serde_json::from_value(ids["labels"].clone())?;
    // The label list comes from the training file (upstream's sorted unique labels).
    let labels = ClassificationLabels::from_table(&Table::read(dir.join("train.jsonl"))?, "label")?;
    assert_eq!(labels, ClassificationLabels::Classes(want_labels));
    for split in ["train", "eval"] {
        let table = Table::read(dir.join(format!("{split}.jsonl")))?;
        let options = TextClassificationOptions {
            max_seq_length: 64,
            pad_to_max_length: false,
            ..TextClassificationOptions::default()
        };
        let rows = tokenize_text_classification(&table, &tokenizer, &labels, &options)?;
        let want: Vec<Vec<i64>> = serde_json::from_value(ids[split].clone())?;
        assert_eq!(rows.rows().len(), want.len());
        for (i, w) in want.iter().enumerate() {
            assert_eq!(&rows.rows()[i].input_ids, w, "{split} row {i}");
        }
    }
    Ok(())
}

/// `run_clm --use_peft --lora_target_parameters` on a tiny Qwen3-MoE
/// (`decoder_families.py`'s, router logits on): the experts' 3-D weights get peft's
/// `ParamWrapper` adapters (no module: peft has no default targets for `qwen3_moe`), the
/// saved adapter names them as peft does
/// (`experts.lora_A` on `down_proj`, `experts.base_layer.lora_A` on `gate_up_proj`), and
/// peft loads it back with every tensor in place (when `cargo xtask test` names the
/// reference virtualenv's python). peft refuses dropout on such adapters: so does the
/// script, naming `lora_dropout`.
#[test]
fn run_clm_trains_expert_adapters_that_peft_loads() -> Result<()> {
    let _g = lock();
    let out = temp_dir("clm-expert-lora");
    let o = out.display().to_string();
    let base = assets().join("reference/decoder_families/qwen3_moe_smollm2");
    let (tokenizer, train) = (asset("smollm2-135m"), asset("text/hamlet.txt"));
    let args = |dropout: &str| -> Vec<String> {
        let flags = [
            "--model_name_or_path",
            &base.display().to_string(),
            "--tokenizer_name",
            &tokenizer,
            "--train_file",
            &train,
            "--block_size",
            "32",
            "--max_train_samples",
            "32",
            "--max_eval_samples",
            "8",
            "--do_train",
            "--do_eval",
            "--max_steps",
            "3",
            "--learning_rate",
            "1e-2",
            "--save_strategy",
            "no",
            "--use_peft",
            "--lora_r",
            "2",
            "--lora_alpha",
            "4",
            "--lora_dropout",
            dropout,
            "--lora_target_parameters",
            "mlp.experts.gate_up_proj",
            "mlp.experts.down_proj",
            "--use_cpu",
            "--report_to",
            "none",
            "--disable_tqdm",
            "true",
            "--output_dir",
            &o,
        ]
        .map(String::from);
        flags.to_vec()
    };
    let err = run_clm::main_with_args(args("0.05")).unwrap_err();
    assert!(err.to_string().contains("lora_dropout"), "{err}");
    let result = run_clm::main_with_args(args("0.0"))?;
    assert!(result.eval_metrics.context("eval metrics")?["eval_loss"].is_finite());
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("adapter_config.json"))?)?;
    assert_eq!(
        config["target_parameters"],
        serde_json::json!(["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
    );
    let mut keys: Vec<String> =
        tch::Tensor::read_safetensors(out.join("adapter_model.safetensors"))?
            .into_iter()
            .map(|(k, _)| k)
            .collect();
    keys.sort();
    // No module targeted (peft has no default for qwen3_moe): in the 2 sparse layers, 2
    // expert weights, each with A and B.
    assert_eq!(keys.len(), 8, "{keys:?}");
    assert!(keys.contains(
        &"base_model.model.model.layers.0.mlp.experts.base_layer.lora_A.weight".to_string()
    ));
    assert!(
        keys.contains(&"base_model.model.model.layers.2.mlp.experts.lora_B.weight".to_string())
    );
    if let Some(python) = std::env::var_os("TCHTRAIN_VENV_PYTHON") {
        let check = "import sys, torch, peft, transformers as tf\n\
from safetensors.torch import load_file\n\
m = peft.PeftModel.from_pretrained(tf.AutoModelForCausalLM.from_pretrained(sys.argv[1]), sys.argv[2])\n\
ours = peft.get_peft_model_state_dict(m)\n\
saved = load_file(sys.argv[2] + '/adapter_model.safetensors')\n\
assert sorted(ours) == sorted(saved), (sorted(ours), sorted(saved))\n\
assert all(torch.equal(ours[k], saved[k]) for k in saved)\n";
        let run = std::process::Command::new(python)
            .args(["-c", check])
            .arg(&base)
            .arg(&out)
            .env("HF_HUB_OFFLINE", "1")
            .output()?;
        ensure!(
            run.status.success(),
            "peft could not load the adapter:\n{}",
            String::from_utf8_lossy(&run.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

/// QLoRA through `run_clm`: `--load_in_4bit --bnb_4bit_quant_type nf4
/// --use_bnb_nested_quant --use_peft` on the tiny Llama trains the adapter over the 4-bit
/// base and saves it alone; `--load_in_8bit` trains it over the int8 base (LLM.int8); both
/// at once are refused with TRL's message, and the quantization flags without `--use_peft`
/// name it.
#[test]
fn run_clm_trains_qlora_with_trl_flags() -> Result<()> {
    let _g = lock();
    let out = temp_dir("clm-qlora");
    let o = out.display().to_string();
    let args = |extra: &[&str]| -> Vec<String> {
        [
            "--model_name_or_path",
            &asset("tiny-llama"),
            "--tokenizer_name",
            &asset("smollm2-135m"),
            "--train_file",
            &asset("text/hamlet.txt"),
            "--block_size",
            "32",
            "--max_train_samples",
            "32",
            "--max_eval_samples",
            "8",
            "--do_train",
            "--do_eval",
            "--max_steps",
            "3",
            "--use_peft",
            "--lora_target_modules",
            "all-linear",
            "--use_cpu",
            "--report_to",
            "none",
            "--disable_tqdm",
            "true",
            "--save_strategy",
            "no",
            "--output_dir",
            &o,
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(extra.iter().map(|s| s.to_string()))
        .collect()
    };
    let result = run_clm::main_with_args(args(&[
        "--load_in_4bit",
        "--bnb_4bit_quant_type",
        "nf4",
        "--use_bnb_nested_quant",
    ]))?;
    assert!(result.eval_metrics.context("eval metrics")?["eval_loss"].is_finite());
    ensure!(
        out.join("adapter_model.safetensors").is_file() && !out.join("model.safetensors").exists(),
        "the adapter alone"
    );
    let result = run_clm::main_with_args(args(&["--load_in_8bit"]))?;
    assert!(result.eval_metrics.context("eval metrics")?["eval_loss"].is_finite());
    let err = run_clm::main_with_args(args(&["--load_in_8bit", "--load_in_4bit"])).unwrap_err();
    assert!(err.to_string().contains("at the same time"), "{err}");
    let err = run_clm::parse_args(["--load_in_4bit", "--output_dir", "o"]).unwrap_err();
    assert!(err.to_string().contains("--use_peft"), "{err}");
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

/// `run_clm --use_peft` (TRL's LoRA flags) on the tiny Llama: the adapter trains (the
/// eval loss drops) and the output folder and checkpoints hold peft's adapter files
/// (`adapter_config.json` with the flags' values, `adapter_model.safetensors` with the
/// two targeted projections of each layer), no full model.
#[test]
fn run_clm_trains_a_lora_adapter_with_trl_flags() -> Result<()> {
    let _g = lock();
    let out = temp_dir("clm-lora");
    let o = out.display().to_string();
    let result = run_clm::main_with_args([
        "--model_name_or_path",
        &asset("tiny-llama"),
        "--tokenizer_name",
        &asset("smollm2-135m"),
        "--train_file",
        &asset("text/hamlet.txt"),
        "--block_size",
        "32",
        "--max_train_samples",
        "64",
        "--max_eval_samples",
        "8",
        "--do_train",
        "--do_eval",
        "--max_steps",
        "6",
        "--learning_rate",
        "1e-2",
        "--save_steps",
        "6",
        "--use_peft",
        "--lora_r",
        "4",
        "--lora_alpha",
        "8",
        "--lora_target_modules",
        "q_proj",
        "v_proj",
        "--use_cpu",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
        "--output_dir",
        &o,
    ])?;
    for dir in [out.clone(), out.join("checkpoint-6")] {
        ensure!(
            dir.join("adapter_model.safetensors").is_file()
                && dir.join("adapter_config.json").is_file()
                && !dir.join("model.safetensors").exists(),
            "{}: the adapter alone",
            dir.display()
        );
    }
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("adapter_config.json"))?)?;
    assert_eq!(config["r"], 4);
    assert_eq!(config["lora_alpha"], 8);
    assert_eq!(config["lora_dropout"], 0.05);
    assert_eq!(config["task_type"], "CAUSAL_LM");
    assert_eq!(
        config["target_modules"],
        serde_json::json!(["q_proj", "v_proj"])
    );
    // peft records the base model as it was given, so that the folder loads on its own.
    assert_eq!(config["base_model_name_or_path"], asset("tiny-llama"));
    let keys: Vec<String> = tch::Tensor::read_safetensors(out.join("adapter_model.safetensors"))?
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    // 2 layers x 2 projections x (A, B).
    assert_eq!(keys.len(), 8, "{keys:?}");
    let eval = result.eval_metrics.context("eval metrics")?;
    assert!(eval["eval_loss"].is_finite());
    // LoRA flags without --use_peft would do nothing: refused; one target is a regular
    // expression (TRL passes a single value on as a string).
    let err = run_clm::parse_args(["--lora_r", "4", "--output_dir", "o"]).unwrap_err();
    assert!(err.to_string().contains("--use_peft"), "{err}");
    let (clm, _) = run_clm::parse_args([
        "--use_peft",
        "--lora_target_modules",
        "all-linear",
        "--output_dir",
        "o",
    ])?;
    let config = clm.peft.lora_config().context("a LoRA config")?;
    assert_eq!(
        config.target_modules,
        Some(tchtrain_models::TargetModules::Regex("all-linear".into()))
    );
    // The other scripts take the same flags.
    let argv = [
        "--use_peft",
        "--lora_r",
        "2",
        "--output_dir",
        "o",
        "--model_name_or_path",
        "m",
    ];
    let (mlm, _) = tchtrain_examples::run_mlm::parse_args(argv)?;
    let (ner, _) = tchtrain_examples::run_ner::parse_args(argv)?;
    let (cls, _) = run_classification::parse_args(argv)?;
    for peft in [mlm.peft, ner.peft, cls.peft] {
        assert_eq!(peft.lora_config().context("a LoRA config")?.r, 2);
    }
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

/// `run_generation` prints what upstream's `run_generation.py` prints for SmolLM2-135M
/// (`scripts/reference/generation.py`: the same seed, sampling flags, stop token and text
/// assembly); its refusals name the flag.
#[test]
fn run_generation_samples_as_upstreams_script() -> Result<()> {
    let _g = lock();
    let want: Vec<String> = serde_json::from_str(&std::fs::read_to_string(
        assets().join("reference/generation/run_generation.json"),
    )?)?;
    let texts = tchtrain_examples::run_generation::main_with_args([
        "--model_type",
        "llama",
        "--model_name_or_path",
        &asset("smollm2-135m"),
        "--prompt",
        "To be, or not to be: that is",
        "--length",
        "24",
        "--k",
        "50",
        "--temperature",
        "0.7",
        "--num_return_sequences",
        "2",
        "--stop_token",
        ".",
    ])?;
    assert_eq!(texts, want);
    for (argv, flag) in [
        (
            vec!["--model_type", "ctrl", "--model_name_or_path", "x"],
            "model_type",
        ),
        (
            vec!["--model_type", "nope", "--model_name_or_path", "x"],
            "model_type",
        ),
        (
            vec![
                "--model_type",
                "gpt2",
                "--model_name_or_path",
                "x",
                "--fp16",
            ],
            "fp16",
        ),
        (vec!["--model_name_or_path", "x"], "model_type"),
    ] {
        let err = tchtrain_examples::run_generation::parse_args(argv).expect_err("refused");
        assert!(
            matches!(&err, Error::InvalidFlag { flag: f, .. } if f == flag),
            "{err}"
        );
    }
    Ok(())
}

/// `run_clm --packing` against TRL's packing under upstream's Trainer
/// (scripts/reference/packed_sequences.py, `run_clm_packing`): hamlet's lines packed into
/// 64-token rows by best-fit decreasing, batches flattened with positions restarting per
/// document, tiny GPT-2 with dropout 0.1, 8 steps with evaluation every 4. Every logged
/// loss, gradient norm, learning rate and evaluation loss within 1e-6 relative (the issue's
/// bound; the same batches, dropout draws and kernels give equal numbers up to the sums'
/// rounding).
#[test]
fn run_clm_packing_trains_as_trl_packing_under_upstreams_trainer() -> Result<()> {
    let _g = lock();
    let out = temp_dir("clm-packing");
    let o = out.display().to_string();
    run_clm::main_with_args([
        "--model_name_or_path",
        &asset("tiny-gpt2"),
        "--tokenizer_name",
        &asset("gpt2-tokenizer"),
        "--train_file",
        &asset("text/hamlet.txt"),
        "--block_size",
        "64",
        "--packing",
        "--max_eval_samples",
        "8",
        "--do_train",
        "--do_eval",
        "--max_steps",
        "8",
        "--per_device_train_batch_size",
        "4",
        "--per_device_eval_batch_size",
        "4",
        "--learning_rate",
        "1e-3",
        "--logging_steps",
        "1",
        "--eval_strategy",
        "steps",
        "--eval_steps",
        "4",
        "--save_strategy",
        "no",
        "--use_cpu",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
        "--output_dir",
        &o,
    ])?;
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("trainer_state.json"))?)?;
    let ours = state["log_history"].as_array().context("log_history")?;
    let reference: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(
        assets().join("reference/packed_sequences/run_clm_packing/log_history.json"),
    )?)?;
    let mut compared = 0;
    let mut worst = 0f64;
    for key in ["loss", "grad_norm", "learning_rate", "eval_loss"] {
        let pick = |entries: &[serde_json::Value]| -> Vec<f64> {
            entries
                .iter()
                .filter_map(|e| e.get(key).and_then(serde_json::Value::as_f64))
                .collect()
        };
        let (a, b) = (pick(ours), pick(&reference));
        ensure!(
            a.len() == b.len() && !a.is_empty(),
            "{key}: {} entries here, {} upstream",
            a.len(),
            b.len()
        );
        for (step, (x, y)) in a.iter().zip(&b).enumerate() {
            let rel = (x - y).abs() / y.abs().max(f64::MIN_POSITIVE);
            worst = worst.max(rel);
            ensure!(
                rel <= 1e-6,
                "{key} #{step}: {x} here, {y} upstream ({rel:e})"
            );
            compared += 1;
        }
    }
    println!("run_clm --packing: {compared} logged values, max relative difference {worst:e}");
    assert_eq!(compared, 8 + 8 + 8 + 2);
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

/// `--ignore_mismatched_sizes` (upstream's `ModelArguments` flag, which the loading error
/// names): a checkpoint with a 3-label classifier fine-tuned on the 2 labels of the Rotten
/// Tomatoes rows is refused without it, naming the flag, and trains with the classifier
/// re-initialised with it.
#[test]
fn run_classification_ignore_mismatched_sizes_reinitialises_the_classifier() -> Result<()> {
    let _g = lock();
    let out = temp_dir("cls-mismatched");
    let o = out.display().to_string();
    let argv = |extra: &[&str]| {
        let mut v: Vec<String> = [
            "--model_name_or_path",
            &asset("reference/models/tiny_bert_seqcls"),
            "--tokenizer_name",
            &asset("minilm"),
            "--train_file",
            &asset("text/rotten_tomatoes_corpus.csv.bz2"),
            "--text_column_names",
            "text",
            "--label_column_name",
            "category",
            "--label_filter",
            "fresh,rotten",
            "--max_train_samples",
            "16",
            "--max_seq_length",
            "32",
            "--do_train",
            "--max_steps",
            "2",
            "--per_device_train_batch_size",
            "4",
            "--use_cpu",
            "--report_to",
            "none",
            "--save_strategy",
            "no",
            "--disable_tqdm",
            "true",
            "--output_dir",
            &o,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let err = run_classification::main_with_args(argv(&[]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("classifier") && err.contains("ignore_mismatched_sizes"),
        "{err}"
    );
    let result = run_classification::main_with_args(argv(&["--ignore_mismatched_sizes"]))?;
    let train = result.train_metrics.context("train metrics")?;
    assert!(train["train_loss"].is_finite());
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json"))?)?;
    assert_eq!(config["id2label"].as_object().map(|m| m.len()), Some(2));
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

/// Without `--do_train`, run_classification maps the labels through the checkpoint's own
/// `label2id`, as upstream ("using label infos in the model config"): with a config that
/// names the classes out of sorted order (`0: rotten, 1: fresh`), the evaluation's accuracy
/// is the share of `predict_results.txt` names that equal the rows' labels. A label the
/// checkpoint does not name is an error naming it.
#[test]
fn run_classification_without_training_uses_the_models_label_ids() -> Result<()> {
    let _g = lock();
    let dir = temp_dir("cls-model-labels");
    let model = dir.join("model");
    std::fs::create_dir_all(&model)?;
    std::fs::copy(
        asset("tiny-bert/model.safetensors"),
        model.join("model.safetensors"),
    )?;
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(asset("tiny-bert/config.json"))?)?;
    config["id2label"] = serde_json::json!({"0": "rotten", "1": "fresh"});
    config["label2id"] = serde_json::json!({"rotten": 0, "fresh": 1});
    std::fs::write(model.join("config.json"), config.to_string())?;
    // Unbalanced on purpose: a head that always says one class scores 3/4 or 1/4.
    let data = dir.join("rows.csv");
    let labels = ["fresh", "fresh", "rotten", "fresh"];
    let mut csv = String::from("sentence,label\n");
    for (i, l) in labels.iter().enumerate() {
        csv.push_str(&format!("review number {i} of the film,{l}\n"));
    }
    std::fs::write(&data, csv)?;
    let argv = |data: &Path, out: &Path| {
        [
            "--model_name_or_path",
            &model.display().to_string(),
            "--tokenizer_name",
            &asset("minilm"),
            "--validation_file",
            &data.display().to_string(),
            "--train_file",
            &data.display().to_string(),
            "--test_file",
            &data.display().to_string(),
            "--do_eval",
            "--do_predict",
            "--max_seq_length",
            "16",
            "--output_dir",
            &out.display().to_string(),
            "--report_to",
            "none",
            "--use_cpu",
        ]
        .map(String::from)
    };
    let out = dir.join("out");
    let result = run_classification::main_with_args(argv(&data, &out))?;
    let accuracy = result.eval_metrics.context("eval metrics")?["eval_accuracy"];
    let predicted = std::fs::read_to_string(out.join("predict_results.txt"))?;
    let names: Vec<&str> = predicted
        .lines()
        .skip(1)
        .map(|l| l.split('\t').nth(1).unwrap_or_default())
        .collect();
    assert_eq!(names.len(), labels.len(), "{predicted}");
    let agree = names.iter().zip(labels).filter(|(n, l)| **n == *l).count();
    assert_eq!(accuracy, agree as f64 / labels.len() as f64, "{predicted}");
    // A label the model does not name.
    let other = dir.join("other.csv");
    std::fs::write(&other, "sentence,label\na,fresh\nb,stale\n")?;
    let err = run_classification::main_with_args(argv(&other, &dir.join("out2"))).unwrap_err();
    assert!(
        matches!(err, Error::InvalidLabel { ref label, .. } if label == "stale"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A TRL reference's tiny model with its tokenizer (SmolLM2's cut to 1024 tokens) beside it
/// (as a hub model has it),
/// and a dataset folder whose `train.jsonl` / `test.jsonl` are the reference's `data` files.
fn trl_script_folders(
    reference: &std::path::Path,
    root: &std::path::Path,
    data_name: &str,
) -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    let model = root.join("model");
    let data = root.join("data");
    std::fs::create_dir_all(&model)?;
    std::fs::create_dir_all(&data)?;
    for f in ["config.json", "generation_config.json", "model.safetensors"] {
        std::fs::copy(reference.join("initial").join(f), model.join(f))?;
    }
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    ] {
        std::fs::copy(reference.join("tokenizer").join(f), model.join(f))?;
    }
    std::fs::copy(
        reference.join(format!("data/{data_name}.jsonl")),
        data.join("train.jsonl"),
    )?;
    std::fs::copy(
        reference.join(format!("data/{data_name}.eval.jsonl")),
        data.join("test.jsonl"),
    )?;
    Ok((model, data))
}

/// The reference's shared flags: batches of 4, 8 steps at lr 1e-3, logs every 2 steps and an
/// evaluation every 4, seed 42, float32 without checkpointing.
fn trl_reference_flags(model: &str, data: &str, out: &str) -> Vec<String> {
    [
        "--model_name_or_path",
        model,
        "--dataset_name",
        data,
        "--per_device_train_batch_size",
        "4",
        "--per_device_eval_batch_size",
        "4",
        "--max_steps",
        "8",
        "--learning_rate",
        "1e-3",
        "--logging_steps",
        "2",
        "--eval_strategy",
        "steps",
        "--eval_steps",
        "4",
        "--save_strategy",
        "no",
        "--seed",
        "42",
        "--use_cpu",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
        "--bf16",
        "false",
        "--gradient_checkpointing",
        "false",
        "--output_dir",
        out,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// TRL's `trl reward` and `trl dpo` command lines end to end on trl_reward.py's standard case
/// and trl_dpo.py's MPO case (`--loss_type sigmoid,bco_pair,sft --loss_weights 0.8,0.2,1.0`):
/// the mean training loss is TRL's to the bit, the model is saved, and TRL's defaults apply to
/// the flags not given (`--learning_rate` 1e-4 / 1e-6).
#[test]
fn reward_and_dpo_scripts_train_as_trl() -> Result<()> {
    let _g = lock();
    let root = temp_dir("trl-preference-scripts");
    for (script, case, data, extra) in [
        ("reward", "standard", "standard", vec!["--max_length", "48"]),
        (
            "dpo",
            "mpo",
            "explicit",
            vec![
                "--max_length",
                "48",
                "--loss_type",
                "sigmoid,bco_pair,sft",
                "--loss_weights",
                "0.8,0.2,1.0",
            ],
        ),
    ] {
        let reference = assets().join(format!("reference/trl_{script}"));
        let (model, data) = trl_script_folders(&reference, &root.join(script), data)?;
        let out = root.join(script).join("out");
        let mut argv = trl_reference_flags(
            &model.display().to_string(),
            &data.display().to_string(),
            &out.display().to_string(),
        );
        argv.extend(extra.iter().map(|s| s.to_string()));
        let result = match script {
            "reward" => tchtrain_examples::reward::main_with_args(&argv)?,
            _ => tchtrain_examples::dpo::main_with_args(&argv)?,
        };
        let history: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
            reference.join(case).join("log_history.json"),
        )?)?;
        let want = history
            .as_array()
            .and_then(|h| h.last())
            .and_then(|e| e["train_loss"].as_f64());
        let loss = result.train_metrics.context("train metrics")?["train_loss"];
        assert_eq!(Some(loss), want, "{script}: train_loss");
        ensure!(
            out.join("model.safetensors").is_file(),
            "{script}: the model saved"
        );
    }
    let (_, t) = tchtrain_examples::reward::parse_args(["--output_dir", "o", "--use_cpu"])?;
    assert_eq!((t.learning_rate, t.bf16), (1e-4, true));
    let (d, t) = tchtrain_examples::dpo::parse_args(["--output_dir", "o", "--use_cpu"])?;
    assert_eq!((t.learning_rate, d.beta), (1e-6, 0.1));
    let err =
        tchtrain_examples::dpo::parse_args(["--output_dir", "o", "--beta_typo", "1"]).unwrap_err();
    assert!(err.to_string().contains("beta_typo"), "{err}");
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}

/// TRL's `trl sft` command line end to end: `sft --dataset_name <folder of train.jsonl /
/// test.jsonl>` on trl_sft.py's conversational case (its flags on the command line) trains
/// to the mean loss TRL's SFTTrainer reached, to the bit, and saves the model; TRL's defaults
/// apply to the Trainer's flags not given (`--learning_rate` 2e-5, `--logging_steps` 10,
/// `--gradient_checkpointing`, `--bf16` unless `--fp16`).
#[test]
fn sft_script_trains_as_trl() -> Result<()> {
    let _g = lock();
    let reference = assets().join("reference/trl_sft");
    let root = temp_dir("sft-script");
    let (model, data) = trl_script_folders(&reference, &root, "messages")?;
    let out = root.join("out");
    let m = model.display().to_string();
    let d = data.display().to_string();
    let o = out.display().to_string();
    let result = tchtrain_examples::sft::main_with_args([
        "--model_name_or_path",
        &m,
        "--dataset_name",
        &d,
        "--per_device_train_batch_size",
        "4",
        "--per_device_eval_batch_size",
        "4",
        "--max_steps",
        "8",
        "--learning_rate",
        "1e-3",
        "--max_length",
        "80",
        "--logging_steps",
        "2",
        "--eval_strategy",
        "steps",
        "--eval_steps",
        "4",
        "--save_strategy",
        "no",
        "--seed",
        "42",
        "--use_cpu",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
        "--bf16",
        "false",
        "--gradient_checkpointing",
        "false",
        "--output_dir",
        &o,
    ])?;
    let expected: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        reference.join("messages/train_output.json"),
    )?)?;
    let loss = result.train_metrics.context("train metrics")?["train_loss"];
    assert_eq!(Some(loss), expected["training_loss"].as_f64(), "train_loss");
    ensure!(out.join("model.safetensors").is_file(), "the model saved");
    // TRL's defaults for the flags not given.
    let (_, t) = tchtrain_examples::sft::parse_args(["--output_dir", "o", "--use_cpu"])?;
    assert_eq!(
        (
            t.learning_rate,
            t.logging_steps,
            t.gradient_checkpointing,
            t.bf16
        ),
        (2e-5, 10.0, true, true)
    );
    let (_, t) = tchtrain_examples::sft::parse_args([
        "--output_dir",
        "o",
        "--use_cpu",
        "--learning_rate",
        "1e-4",
        "--bf16",
        "false",
    ])?;
    assert_eq!((t.learning_rate, t.bf16), (1e-4, false));
    let err = tchtrain_examples::sft::parse_args(["--output_dir", "o", "--dataset_streaming"])
        .unwrap_err();
    assert!(err.to_string().contains("dataset_streaming"), "{err}");
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}

/// `run_clm --push_to_hub` against the local hub server (`HF_ENDPOINT`): the repository
/// `--hub_model_id`, a commit per checkpoint (`every_save`), "Model save" (upstream's
/// `save_model` pushes), the final commit with the model
/// card upstream's script asks for (`finetuned_from` the model, task `text-generation`); and
/// without `--push_to_hub` the card is written to output_dir (upstream's
/// `create_model_card`).
#[test]
#[allow(unsafe_code)]
fn run_clm_pushes_to_the_hub_with_its_model_card() -> Result<()> {
    let _g = lock();
    let server = tchtrain_testing::HubServer::builder().start();
    // SAFETY: the tests of this binary hold `lock()`; no other thread reads the environment.
    unsafe {
        std::env::set_var("HF_ENDPOINT", server.endpoint());
        std::env::set_var("HF_TOKEN", "hf_test");
    }
    let run = |dir: &Path, push: bool| -> Result<()> {
        let o = dir.display().to_string();
        let mut argv = vec![
            "--model_name_or_path".to_string(),
            asset("tiny-gpt2"),
            "--tokenizer_name".into(),
            asset("gpt2-tokenizer"),
            "--train_file".into(),
            asset("text/hamlet.txt"),
            "--block_size".into(),
            "32".into(),
            "--do_train".into(),
            "--max_steps".into(),
            "2".into(),
            "--per_device_train_batch_size".into(),
            "2".into(),
            "--save_steps".into(),
            "2".into(),
            "--use_cpu".into(),
            "--report_to".into(),
            "none".into(),
            "--output_dir".into(),
            o,
        ];
        if push {
            argv.extend([
                "--push_to_hub".into(),
                "--hub_model_id".into(),
                "org/clm-push".into(),
            ]);
        }
        run_clm::main_with_args(argv)?;
        Ok(())
    };
    let pushed = temp_dir("clm-push");
    let result = run(&pushed, true);
    let local = temp_dir("clm-card");
    let local_result = run(&local, false);
    // SAFETY: as above.
    unsafe {
        std::env::remove_var("HF_ENDPOINT");
        std::env::remove_var("HF_TOKEN");
    }
    result?;
    local_result?;
    let messages: Vec<String> = server.commits().into_iter().map(|c| c.message).collect();
    ensure!(
        messages
            == [
                "Training in progress, step 2",
                "Model save",
                "End of training"
            ],
        "{messages:?}"
    );
    let card = String::from_utf8(
        server
            .pushed_file("org/clm-push", "main", "README.md")
            .context("README.md pushed")?,
    )?;
    ensure!(
        card.contains("# clm-push") && card.contains("- training_steps: 2"),
        "{card}"
    );
    ensure!(
        card.contains(&format!("base_model: {}", asset("tiny-gpt2"))),
        "{card}"
    );
    let written = std::fs::read_to_string(local.join("README.md"))?;
    ensure!(
        written.contains("generated_from_trainer")
            && written.contains("library_name: transformers")
    );
    Ok(())
}

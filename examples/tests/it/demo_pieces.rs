//! What `cargo xtask demo` relies on, checked fast on tiny BERT: `run_classification`'s
//! `--label_filter` and `--validation_split_percentage` on the Rotten Tomatoes corpus
//! (two labels, a seeded held-out split, typos and conflicting flags reported), and the
//! loss / learning-rate PNG drawn from the run's `log_history` (valid PNG, the plot's size,
//! both series drawn).

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use tchtrain_callbacks::{JsonMap, TrainerState};
use tchtrain_examples::{
    Error, PLOT_HEIGHT, PLOT_WIDTH, log_history_series, plot_log_history, render_log_history,
    run_classification,
};
use tchtrain_testing::{asset, lock};

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tchtrain-demo-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// The flags of a small run on the fresh / rotten rows of the corpus.
fn flags(out: &Path, extra: &[&str]) -> Vec<String> {
    let corpus = asset("text/rotten_tomatoes_corpus.csv.bz2");
    let o = out.display().to_string();
    let tiny = asset("tiny-bert");
    let tok = asset("minilm");
    [
        "--model_name_or_path",
        &tiny,
        "--tokenizer_name",
        &tok,
        "--train_file",
        &corpus,
        "--text_column_names",
        "text",
        "--label_column_name",
        "category",
        "--max_seq_length",
        "32",
        "--pad_to_max_length",
        "false",
        "--use_cpu",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
        "--output_dir",
        &o,
    ]
    .iter()
    .chain(extra)
    .map(|s| s.to_string())
    .collect()
}

/// The chunks of a PNG file after its signature: (type, data), CRCs checked.
fn png_chunks(bytes: &[u8]) -> Result<Vec<([u8; 4], Vec<u8>)>> {
    ensure!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "no PNG signature");
    let mut chunks = Vec::new();
    let mut at = 8;
    while at < bytes.len() {
        let len = u32::from_be_bytes(bytes[at..at + 4].try_into()?) as usize;
        let kind: [u8; 4] = bytes[at + 4..at + 8].try_into()?;
        let data = bytes[at + 8..at + 8 + len].to_vec();
        let crc = u32::from_be_bytes(bytes[at + 8 + len..at + 12 + len].try_into()?);
        ensure!(
            crc == crc32fast::hash(&bytes[at + 4..at + 8 + len]),
            "bad CRC"
        );
        chunks.push((kind, data));
        at += 12 + len;
    }
    Ok(chunks)
}

#[test]
fn label_filter_and_held_out_split_then_plot() -> Result<()> {
    let _g = lock();
    let out = temp_dir("cls");
    let run = out.join("run");
    let result = run_classification::main_with_args(flags(
        &run,
        &[
            "--label_filter",
            "fresh,rotten",
            "--validation_split_percentage",
            "10",
            "--shuffle_seed",
            "42",
            "--max_train_samples",
            "32",
            "--do_train",
            "--do_eval",
            "--eval_on_start",
            "--max_steps",
            "4",
            "--per_device_train_batch_size",
            "8",
            "--per_device_eval_batch_size",
            "128",
            "--learning_rate",
            "1e-3",
            "--warmup_steps",
            "1",
            "--logging_steps",
            "1",
            "--save_strategy",
            "no",
        ],
    ))?;

    // Only the two sentiment labels; the plot synopses are gone.
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("config.json"))?)?;
    assert_eq!(config["id2label"]["0"], "fresh");
    assert_eq!(config["id2label"]["1"], "rotten");
    assert!(config["id2label"].get("2").is_none(), "{config}");
    // 2455 fresh + 2411 rotten rows; 10 % of 4866, rounded down, held out.
    let eval = result.eval_metrics.context("eval metrics")?;
    assert_eq!(eval["eval_samples"], 486.0);

    // Without training, the same flags hold out the same number of rows for evaluation.
    let again = run_classification::main_with_args(flags(
        &out.join("again"),
        &[
            "--label_filter",
            "fresh,rotten",
            "--validation_split_percentage",
            "10",
            "--do_eval",
            "--per_device_eval_batch_size",
            "128",
        ],
    ))?;
    assert_eq!(
        again.eval_metrics.context("eval metrics")?["eval_samples"],
        486.0
    );

    // log_history: the evaluation before the first step, four losses, learning rates.
    let state = TrainerState::load_from_json(run.join("trainer_state.json"))?;
    let evals = log_history_series(&state.log_history, "eval_accuracy");
    assert_eq!(evals.first().map(|p| p.0), Some(0.0), "{evals:?}");
    assert_eq!(log_history_series(&state.log_history, "loss").len(), 4);
    assert_eq!(
        log_history_series(&state.log_history, "learning_rate").len(),
        4
    );

    let png = out.join("loss_lr.png");
    plot_log_history(&state.log_history, "tiny bert, fresh vs rotten", &png)?;
    let chunks = png_chunks(&std::fs::read(&png)?)?;
    let kinds: Vec<&[u8]> = chunks.iter().map(|(k, _)| &k[..]).collect();
    assert_eq!(kinds, [&b"IHDR"[..], b"IDAT", b"IEND"]);
    let ihdr = &chunks[0].1;
    let (w, h) = (
        u32::from_be_bytes(ihdr[0..4].try_into()?),
        u32::from_be_bytes(ihdr[4..8].try_into()?),
    );
    assert_eq!((w, h), (PLOT_WIDTH, PLOT_HEIGHT));
    assert_eq!(&ihdr[8..], [8, 2, 0, 0, 0], "8-bit RGB");
    let mut raw = Vec::new();
    flate2::read::ZlibDecoder::new(&chunks[1].1[..]).read_to_end(&mut raw)?;
    let stride = 1 + 3 * w as usize;
    assert_eq!(raw.len(), stride * h as usize);
    let pixels: Vec<&[u8]> = raw
        .chunks(stride)
        .flat_map(|row| row[1..].chunks(3))
        .collect();
    let ink = pixels.iter().filter(|p| **p != [255, 255, 255]).count();
    // Axes, ticks, labels and two curves: a few percent of the image, not all of it.
    assert!(
        ink > pixels.len() / 100 && ink < pixels.len() / 2,
        "{ink} of {} pixels drawn",
        pixels.len()
    );
    // Both series are drawn in their colours (loss blue, learning rate green).
    let img = render_log_history(&state.log_history, "x")?;
    let has = |c: [u8; 3]| {
        (0..img.height()).any(|y| (0..img.width()).any(|x| img.pixel(x, y) == Some(c)))
    };
    assert!(has([31, 119, 180]) && has([44, 160, 44]));
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

#[test]
fn bad_filter_and_split_flags_are_reported() {
    let _g = lock();
    let out = temp_dir("bad");
    let typo = run_classification::main_with_args(flags(
        &out,
        &[
            "--label_filter",
            "fresh,rottn",
            "--do_train",
            "--max_steps",
            "1",
        ],
    ));
    match typo {
        Err(Error::InvalidFlag { flag, detail }) => {
            assert_eq!(flag, "label_filter");
            assert!(
                detail.contains("rottn") && detail.contains("plot"),
                "{detail}"
            );
        }
        other => panic!("expected a --label_filter error, got {other:?}"),
    }
    let both = run_classification::main_with_args(flags(
        &out,
        &[
            "--validation_split_percentage",
            "10",
            "--validation_file",
            "valid.csv",
            "--do_eval",
        ],
    ));
    assert!(
        matches!(&both, Err(Error::InvalidFlag { flag, .. }) if flag == "validation_split_percentage"),
        "{both:?}"
    );
    let empty: Vec<JsonMap> = Vec::new();
    assert!(matches!(
        render_log_history(&empty, "nothing"),
        Err(Error::InvalidArgument { .. })
    ));
    let _ = std::fs::remove_dir_all(&out);
}

//! The tokenized-dataset cache (`MapCache`, upstream's `Dataset.map` cache files): the file
//! format round-trips every field and rejects any damage without panicking; the cache
//! computes once, loads after, recomputes on `overwrite` or a corrupt file and survives an
//! unwritable folder; `run_clm` and `run_ner` run twice with the same data tokenize once and
//! train / evaluate identically (each in a child process whose environment points
//! `TCHTRAIN_DATASETS_CACHE` at a fresh folder).

use std::cell::Cell;
use std::path::{Path, PathBuf};

use anyhow::Result;
use tchtrain_collators::{Feature, Label};
use tchtrain_trainer::examples::{run_clm, run_ner};
use tchtrain_trainer::{DATASETS_CACHE_ENV, Fingerprint, MapCache, decode_rows, encode_rows};

fn rows() -> Vec<Feature> {
    vec![
        Feature::new(vec![1, 2, 3]).with_labels(Label::Class(-7)),
        Feature {
            input_ids: vec![i64::MAX, 0, i64::MIN],
            token_type_ids: Some(vec![0, 0, 1]),
            attention_mask: Some(vec![1, 1, 0]),
            special_tokens_mask: Some(vec![1, 0, 1]),
            offset_mapping: Some(vec![(0, 0), (0, 4), (5, 9)]),
            labels: Some(Label::Ids(vec![-100, 4, 5])),
        },
        Feature::new(vec![]).with_labels(Label::Value(-0.125)),
        Feature::new(vec![9]).with_labels(Label::Values(vec![1.5, f64::NAN, -0.0])),
        Feature::new(vec![4, 4]),
    ]
}

/// `Feature`'s `PartialEq` compares NaN as unequal; compare the float labels by bits.
fn same(a: &[Feature], b: &[Feature]) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tchtrain-dscache-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn rows_round_trip_and_damage_is_an_error() {
    let rows = rows();
    let bytes = encode_rows(&rows);
    assert!(same(&decode_rows(&bytes).expect("decodes"), &rows));
    assert!(decode_rows(&encode_rows(&[])).expect("empty").is_empty());
    // Every truncation and every single flipped byte is reported, never a panic.
    for n in 0..bytes.len() {
        assert!(decode_rows(&bytes[..n]).is_err(), "prefix of {n} bytes");
    }
    for i in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[i] ^= 0x40;
        assert!(decode_rows(&bad).is_err(), "byte {i} flipped");
    }
    let err = decode_rows(b"TCHTRAIN-ROWS-v0 and more bytes here").unwrap_err();
    assert!(err.contains("magic"), "{err}");
}

#[test]
fn fingerprints_depend_on_every_part_and_its_boundaries() {
    let hex = |parts: &[&str]| {
        let mut f = Fingerprint::new("f");
        for p in parts {
            f.update(p);
        }
        f.hex()
    };
    assert_eq!(hex(&["ab", "c"]), hex(&["ab", "c"]));
    assert_ne!(hex(&["ab", "c"]), hex(&["a", "bc"]));
    assert_ne!(hex(&["ab"]), hex(&["ab", ""]));
    assert_ne!(Fingerprint::new("f").hex(), Fingerprint::new("g").hex());
    assert_eq!(hex(&[]).len(), 64);
}

#[test]
fn computes_once_then_loads_and_rebuilds_when_asked_or_damaged() -> Result<()> {
    let dir = temp_dir("map");
    let cache = MapCache::new(&dir);
    let mut fp = Fingerprint::new("test");
    fp.update("data");
    let calls = Cell::new(0);
    let compute = || {
        calls.set(calls.get() + 1);
        Ok(rows())
    };
    assert!(same(&cache.map(&fp, false, compute)?, &rows()));
    assert_eq!(calls.get(), 1);
    let file = cache.path(&fp);
    assert!(file.is_file(), "{}", file.display());
    assert!(same(&cache.map(&fp, false, compute)?, &rows()));
    assert_eq!(calls.get(), 1, "the second call loads the file");
    cache.map(&fp, true, compute)?;
    assert_eq!(calls.get(), 2, "overwrite recomputes");

    // Another fingerprint, another file.
    let mut other = Fingerprint::new("test");
    other.update("other data");
    cache.map(&other, false, compute)?;
    assert_eq!(calls.get(), 3);
    assert_ne!(cache.path(&other), file);

    // A damaged file is rebuilt (and rewritten whole).
    let mut bytes = std::fs::read(&file)?;
    let mid = bytes.len() / 2;
    bytes[mid] ^= 1;
    std::fs::write(&file, &bytes)?;
    assert!(same(&cache.map(&fp, false, compute)?, &rows()));
    assert_eq!(calls.get(), 4);
    assert!(same(
        &decode_rows(&std::fs::read(&file)?).expect("rewritten"),
        &rows()
    ));

    // compute's own error is returned, and nothing is written.
    let mut failing = Fingerprint::new("test");
    failing.update("failing");
    let err = cache
        .map(&failing, false, || {
            Err(tchtrain_trainer::Error::InvalidArgument {
                field: "x",
                detail: "bad".into(),
            })
        })
        .unwrap_err();
    assert!(err.to_string().contains("bad"), "{err}");
    assert!(!cache.path(&failing).exists());

    // A folder that cannot be created (a file stands in its way): the rows are still returned.
    let blocked = dir.join("blocked");
    std::fs::write(&blocked, b"a file")?;
    let unwritable = MapCache::new(blocked.join("cache"));
    assert!(same(&unwritable.map(&fp, false, compute)?, &rows()));
    assert_eq!(calls.get(), 5);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn assets() -> PathBuf {
    std::env::var_os("TCHTRAIN_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets"))
}

/// A script's command line: `flags` (`@name` is the asset `name`), then the output folder,
/// no reports, no saves, the CPU and, with `overwrite`, `--overwrite_cache`.
fn script_argv(flags: &[&str], out: &Path, overwrite: bool) -> Vec<String> {
    let mut argv: Vec<String> = flags
        .iter()
        .map(|f| match f.strip_prefix('@') {
            Some(rel) => assets().join(rel).display().to_string(),
            None => f.to_string(),
        })
        .collect();
    argv.extend(["--output_dir".into(), out.display().to_string()]);
    argv.extend(["--report_to", "none", "--save_strategy", "no", "--use_cpu"].map(String::from));
    if overwrite {
        argv.push("--overwrite_cache".into());
    }
    argv
}

/// `run_clm` on Hamlet (train only): the training loss.
fn run_clm_once(out: &Path, overwrite: bool) -> Result<f64> {
    let flags = [
        "--model_name_or_path",
        "@tiny-gpt2",
        "--tokenizer_name",
        "@gpt2-tokenizer",
        "--train_file",
        "@text/hamlet.txt",
        "--block_size",
        "32",
        "--do_train",
        "--max_steps",
        "3",
        "--per_device_train_batch_size",
        "2",
    ];
    let result = run_clm::main_with_args(script_argv(&flags, out, overwrite))?;
    Ok(result.train_metrics.expect("trained")["train_loss"])
}

/// `run_ner` on the reference NER files (train and evaluate): the evaluation loss.
fn run_ner_once(out: &Path, overwrite: bool) -> Result<f64> {
    let flags = [
        "--model_name_or_path",
        "@reference/trainer_mlm_ner/ner/initial",
        "--tokenizer_name",
        "@minilm",
        "--train_file",
        "@reference/trainer_mlm_ner/ner/train.json",
        "--validation_file",
        "@reference/trainer_mlm_ner/ner/validation.json",
        "--do_train",
        "--do_eval",
        "--max_steps",
        "2",
        "--per_device_train_batch_size",
        "4",
    ];
    let result = run_ner::main_with_args(script_argv(&flags, out, overwrite))?;
    Ok(result.eval_metrics.expect("evaluated")["eval_loss"])
}

/// Set in the child process that runs a script's check with the cache folder in its
/// environment.
const CHILD: &str = "TCHTRAIN_DATASET_CACHE_TEST_CHILD";

/// Runs test `test` again in a child process whose environment names a fresh cache folder;
/// `None` in the parent (after the child passed), the folder in the child.
fn cache_folder_of_child(test: &str) -> Result<Option<PathBuf>> {
    if let Some(dir) = std::env::var_os(CHILD).and(std::env::var_os(DATASETS_CACHE_ENV)) {
        return Ok(Some(PathBuf::from(dir)));
    }
    let cache_dir = temp_dir(&format!("{test}-cache"));
    let status = std::process::Command::new(std::env::current_exe()?)
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env(CHILD, "1")
        .env(DATASETS_CACHE_ENV, &cache_dir)
        .stdout(std::process::Stdio::null())
        .status()?;
    let _ = std::fs::remove_dir_all(&cache_dir);
    anyhow::ensure!(status.success(), "the child run failed: {status}");
    Ok(None)
}

/// A script run twice with the same data tokenizes once (`files` cache files, read the
/// second time, not rewritten) and gives the same number; `--overwrite_cache` tokenizes
/// again (rewriting the files) with the same number.
fn tokenizes_once(
    cache_dir: &Path,
    files: usize,
    run: impl Fn(&Path, bool) -> Result<f64>,
) -> Result<()> {
    let out = temp_dir(&format!("out-{files}"));
    let stamps = || -> Result<Vec<std::time::SystemTime>> {
        let mut entries: Vec<_> = std::fs::read_dir(cache_dir)?.collect::<std::io::Result<_>>()?;
        entries.sort_by_key(|e| e.file_name());
        entries
            .iter()
            .map(|e| Ok(e.metadata()?.modified()?))
            .collect()
    };
    let first = run(&out, false)?;
    let written = stamps()?;
    assert_eq!(written.len(), files, "cache files");
    let second = run(&out, false)?;
    assert_eq!(first, second, "running from the cached rows is identical");
    assert_eq!(
        stamps()?,
        written,
        "the cache files were read, not rewritten"
    );
    assert_eq!(run(&out, true)?, first);
    let rewritten = stamps()?;
    assert!(
        rewritten.iter().zip(&written).all(|(a, b)| a != b),
        "--overwrite_cache rewrites every file"
    );
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

#[test]
fn run_clm_tokenizes_once_and_trains_the_same_from_the_cache() -> Result<()> {
    let Some(cache_dir) =
        cache_folder_of_child("run_clm_tokenizes_once_and_trains_the_same_from_the_cache")?
    else {
        return Ok(());
    };
    // Only --do_train: the training lines' tokens, one file.
    tokenizes_once(&cache_dir, 1, run_clm_once)
}

#[test]
fn run_ner_tokenizes_once_and_evaluates_the_same_from_the_cache() -> Result<()> {
    let Some(cache_dir) =
        cache_folder_of_child("run_ner_tokenizes_once_and_evaluates_the_same_from_the_cache")?
    else {
        return Ok(());
    };
    // The training and the validation rows: two files.
    tokenizes_once(&cache_dir, 2, run_ner_once)
}

//! Parquet files against `scripts/reference/datasets_parquet.py` (pyarrow 26.0.1, datasets
//! 5.2.0): every cell of every file (six compressions, plain and dictionary encoding, data
//! pages v1 and v2, nulls, lists, structs, dictionaries) equals what
//! `load_dataset("parquet").to_list()` gives; a column streams row group by row group; the
//! causal-LM stream of a Parquet text column yields the blocks of the same text read whole;
//! bad files are typed errors, never panics.

use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Map, Value, json};
use tchtrain_datasets::{
    CausalLmTextStream, Error, ParquetFile, Table, causal_lm_blocks_from_file, clm_text_column,
    group_texts, load_text_lines, tokenize_lines,
};
use tchtrain_testing::{assets, reference_dir, temp_dir};
use tokenizers::Tokenizer;

/// `expected.json` of the reference script.
pub(crate) fn expected() -> Result<Value> {
    let path = reference_dir("datasets_parquet").join("expected.json");
    if !path.exists() {
        bail!("{} is missing: run `cargo xtask setup`", path.display());
    }
    Ok(serde_json::from_str(&std::fs::read_to_string(&path)?)?)
}

/// Asserts that `table` has `entry`'s columns and, cell for cell, its rows (`to_list()`).
pub(crate) fn assert_rows_equal(what: &str, table: &Table, entry: &Value) -> Result<()> {
    let columns: Vec<String> = serde_json::from_value(entry["columns"].clone())?;
    assert_eq!(table.columns(), columns, "{what}: columns");
    let rows = entry["rows"].as_array().context("rows")?;
    assert_eq!(table.len(), rows.len(), "{what}: number of rows");
    for (r, row) in rows.iter().enumerate() {
        let row: &Map<String, Value> = row.as_object().context("a row object")?;
        for c in &columns {
            assert_eq!(table.cell(r, c)?, &row[c], "{what}: row {r}, column {c}");
        }
    }
    Ok(())
}

fn parquet(name: &str) -> std::path::PathBuf {
    reference_dir("datasets_parquet").join("parquet").join(name)
}

/// GPT-2's byte-level BPE from the offline assets (the tokenizer is the same on both sides
/// of every comparison here; any would do).
fn gpt2() -> Result<Arc<Tokenizer>> {
    let dir = assets().join("gpt2-tokenizer");
    let vocab = dir.join("vocab.json");
    let merges = dir.join("merges.txt");
    let bpe = tokenizers::models::bpe::BPE::from_file(
        &vocab.display().to_string(),
        &merges.display().to_string(),
    )
    .build()
    .map_err(|e| anyhow!("{e}"))?;
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(
        tokenizers::pre_tokenizers::byte_level::ByteLevel::new(false, true, true),
    ));
    Ok(Arc::new(tokenizer))
}

#[test]
fn every_parquet_cell_equals_load_dataset() -> Result<()> {
    let expected = expected()?;
    let files = expected["parquet"].as_object().context("parquet files")?;
    assert_eq!(
        files.len(),
        9,
        "six compressions, hamlet, first_column, ner_class_label"
    );
    for (name, entry) in files {
        let path = parquet(name);
        let table = Table::read(&path)?;
        assert_rows_equal(name, &table, entry)?;
        let file = ParquetFile::open(&path)?;
        assert_eq!(
            file.num_row_groups() as u64,
            entry["num_row_groups"].as_u64().context("num_row_groups")?,
            "{name}"
        );
        assert_eq!(file.num_rows(), table.len(), "{name}");
        assert_eq!(file.columns(), table.columns(), "{name}");
        assert_eq!(Table::read_parquet(&path)?, table, "{name}");
    }
    // The types files: 43 rows in row groups of 8, the same cells whatever the compression.
    let snappy = Table::read(parquet("types_snappy.parquet"))?;
    assert_eq!(
        ParquetFile::open(parquet("types_snappy.parquet"))?.num_row_groups(),
        6
    );
    assert_eq!(snappy.cell(1, "u64")?, &Value::from(u64::MAX));
    assert_eq!(snappy.cell(0, "i64")?, &Value::from(i64::MIN));
    Ok(())
}

#[test]
fn a_column_streams_one_row_group_at_a_time() -> Result<()> {
    let expected = expected()?;
    let entry = &expected["parquet"]["hamlet.parquet"];
    let file = ParquetFile::open(parquet("hamlet.parquet"))?;
    let groups = file.num_row_groups();
    assert_eq!(
        groups as u64,
        entry["num_row_groups"].as_u64().context("groups")?
    );
    assert!(groups > 5, "hamlet spans several row groups of 700 rows");
    let chunks = file.iter_column("text")?;
    assert_eq!(chunks.num_row_groups(), groups);
    let mut lines = Vec::new();
    let mut sizes = Vec::new();
    for chunk in chunks {
        let chunk = chunk?;
        sizes.push(chunk.len());
        lines.extend(chunk);
    }
    // One item per row group, each the row group's rows.
    assert_eq!(sizes.len(), groups);
    assert!(sizes[..groups - 1].iter().all(|&n| n == 700), "{sizes:?}");
    assert_eq!(sizes.iter().sum::<usize>(), file.num_rows());
    let text: Vec<Value> = load_text_lines(assets().join("text/hamlet.txt"), true)?
        .into_iter()
        .map(Value::String)
        .collect();
    assert_eq!(lines, text, "the text loader's lines, line breaks kept");
    let rows = entry["rows"].as_array().context("rows")?;
    assert!(lines.iter().zip(rows).all(|(l, r)| *l == r["text"]));

    // Row groups as tables, columns in the order asked for.
    let mut seen = 0;
    for (g, table) in file.iter_row_groups(Some(&["text", "id"]))?.enumerate() {
        let table = table?;
        assert_eq!(table.columns(), ["text", "id"]);
        assert_eq!(table.cell(0, "id")?, &Value::from(g * 700));
        seen += table.len();
    }
    assert_eq!(seen, file.num_rows());
    let group = file.read_row_group(2, Some(&["id"]))?;
    assert_eq!(group.columns(), ["id"]);
    assert_eq!(group.len(), 700);
    assert_eq!(group.cell(699, "id")?, &Value::from(2099));
    assert!(matches!(
        file.read_row_group(groups, None),
        Err(Error::IndexOutOfRange { .. })
    ));
    assert!(matches!(
        file.iter_row_groups(Some(&["id", "id"])),
        Err(Error::InvalidArgument { .. })
    ));
    Ok(())
}

#[test]
fn a_parquet_text_column_streams_the_blocks_of_the_text_file() -> Result<()> {
    let tokenizer = gpt2()?;
    let hamlet_txt = assets().join("text/hamlet.txt");
    let hamlet = parquet("hamlet.parquet");
    let whole = causal_lm_blocks_from_file(&hamlet_txt, &tokenizer, 64)?;
    assert_eq!(causal_lm_blocks_from_file(&hamlet, &tokenizer, 64)?, whole);
    // Chunks of 1000 rows cut across row groups of 700: the same blocks as the text file.
    let stream = CausalLmTextStream::new(&hamlet, Arc::clone(&tokenizer), 64)?;
    let streamed = stream
        .blocks()?
        .collect::<tchtrain_datasets::Result<Vec<_>>>()?;
    assert_eq!(streamed.len(), whole.len());
    assert_eq!(streamed, whole);

    // No "text" column: run_clm.py takes the first one.
    let first = parquet("first_column.parquet");
    let file = ParquetFile::open(&first)?;
    assert_eq!(file.columns(), ["content", "id"]);
    assert_eq!(clm_text_column(&file.columns(), &first)?, "content");
    let content: Vec<String> = Table::read(&first)?
        .column("content")?
        .into_iter()
        .map(|v| v.as_str().map(str::to_string).context("text"))
        .collect::<Result<_>>()?;
    let expected = group_texts(&tokenize_lines(&tokenizer, &content)?, 16, None)?;
    assert!(!expected.is_empty());
    let streamed = CausalLmTextStream::new(&first, Arc::clone(&tokenizer), 16)?
        .blocks()?
        .collect::<tchtrain_datasets::Result<Vec<_>>>()?;
    assert_eq!(streamed, expected);
    assert_eq!(
        clm_text_column(&["a".into(), "text".into()], &first)?,
        "text"
    );
    assert!(matches!(
        clm_text_column(&[], &first),
        Err(Error::MissingColumn { .. })
    ));

    // A first column of numbers (with nulls) is no text: the row is named.
    let types = parquet("types_snappy.parquet");
    let err = CausalLmTextStream::new(&types, tokenizer, 16)?
        .blocks()?
        .find_map(|b| b.err())
        .context("an error item")?;
    match &err {
        Error::InvalidCell {
            column, row, path, ..
        } => {
            assert_eq!(column, "i8");
            assert_eq!(*row, 0);
            assert_eq!(path, &types);
        }
        other => panic!("expected InvalidCell, got {other}"),
    }
    assert!(err.to_string().contains("-128"), "{err}");
    Ok(())
}

#[test]
fn bad_parquet_files_are_typed_errors() -> Result<()> {
    let dir = temp_dir("datasets-parquet-errors");
    let good = std::fs::read(parquet("types_snappy.parquet"))?;

    let csv = dir.join("data.parquet");
    std::fs::write(&csv, "text,label\nhello,1\n")?;
    let err = Table::read(&csv).unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotFormat {
                format: "Parquet",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("data.parquet"), "{err}");

    std::fs::write(&csv, b"")?;
    assert!(matches!(
        ParquetFile::open(&csv),
        Err(Error::NotFormat { .. })
    ));

    let arrow_named_parquet = dir.join("stream.parquet");
    std::fs::copy(
        reference_dir("datasets_parquet").join("arrow/types_stream.arrow"),
        &arrow_named_parquet,
    )?;
    let err = Table::read(&arrow_named_parquet).unwrap_err();
    assert!(err.to_string().contains("Arrow IPC"), "{err}");

    // Cut short: at half, and just before the final magic.
    let cut = dir.join("cut.parquet");
    for len in [good.len() / 2, good.len() - 1, 10, 3] {
        std::fs::write(&cut, &good[..len])?;
        let err = Table::read(&cut).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Truncated {
                    format: "Parquet",
                    ..
                }
            ),
            "{len} bytes: {err}"
        );
    }
    // A footer length past the start of the file.
    let mut bad_footer = good.clone();
    let at = bad_footer.len() - 8;
    bad_footer[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    std::fs::write(&cut, &bad_footer)?;
    assert!(matches!(Table::read(&cut), Err(Error::Truncated { .. })));

    // The footer kept, the data cut out: every column chunk lies past the end of the file
    // (the decoder would allocate the declared size before reading).
    let footer_len = u32::from_le_bytes(good[good.len() - 8..good.len() - 4].try_into()?) as usize;
    let mut no_data = b"PAR1".to_vec();
    no_data.extend_from_slice(&good[good.len() - 8 - footer_len..]);
    std::fs::write(&cut, &no_data)?;
    let err = ParquetFile::open(&cut).unwrap_err();
    assert!(
        matches!(err, Error::Corrupt { .. }) && err.to_string().contains("outside the file"),
        "{err}"
    );

    // Types with no cell: named with the column; the other columns still stream.
    let unsupported = parquet("unsupported.parquet");
    match Table::read(&unsupported) {
        Err(Error::UnsupportedType {
            column, data_type, ..
        }) => {
            assert_eq!(column, "when");
            assert!(data_type.starts_with("Timestamp"), "{data_type}");
        }
        other => panic!("expected UnsupportedType, got {other:?}"),
    }
    let file = ParquetFile::open(&unsupported)?;
    // Binary (an `Image` / `Audio` cell's bytes) reads as the list of its byte values.
    let blob: Vec<Value> = file
        .iter_column("blob")?
        .collect::<tchtrain_datasets::Result<Vec<_>>>()?
        .concat();
    assert_eq!(blob, [json!([0]), json!([120, 121]), Value::Null]);
    let text: Vec<Value> = file
        .iter_column("text")?
        .collect::<tchtrain_datasets::Result<Vec<_>>>()?
        .concat();
    assert_eq!(text, ["a", "b", "c"]);
    match file.iter_column("nope") {
        Err(Error::MissingColumn {
            column, available, ..
        }) => {
            assert_eq!(column, "nope");
            assert_eq!(available, "text, when, blob");
        }
        other => panic!("expected MissingColumn, got {other:?}"),
    }

    // Damage anywhere in the file: an error or (damage in unread bytes) a table, never a
    // panic.
    let damaged = dir.join("damaged.parquet");
    for i in (0..good.len()).step_by(good.len() / 97 + 1) {
        let mut bytes = good.clone();
        bytes[i] ^= 0x5a;
        if i + 1 < bytes.len() {
            bytes[i + 1] = bytes[i + 1].wrapping_add(113);
        }
        std::fs::write(&damaged, &bytes)?;
        let _ = Table::read(&damaged);
    }
    Ok(())
}

/// The `ClassLabel` names of a file `Dataset.to_parquet` wrote are the ones `load_dataset`
/// gives its columns (a list of class labels and a class label); other columns and other
/// formats have none.
#[test]
fn class_label_names_are_the_ones_load_dataset_gives() -> Result<()> {
    let expected = expected()?;
    let want = &expected["class_labels"]["ner_class_label.parquet"];
    let file = parquet("ner_class_label.parquet");
    for column in ["ner_tags", "label"] {
        let names = tchtrain_datasets::class_label_names(&file, column)?;
        let want: Vec<String> = serde_json::from_value(want[column].clone())?;
        assert_eq!(names, Some(want), "{column}");
    }
    assert_eq!(tchtrain_datasets::class_label_names(&file, "tokens")?, None);
    assert_eq!(
        tchtrain_datasets::class_label_names(parquet("hamlet.parquet"), "text")?,
        None
    );
    Ok(())
}

//! TRL's `pack_dataset` against `scripts/reference/packing.py` (trl 1.16.0): 2,300 rows of
//! three list columns (lengths 0..300, empty rows, many ties) packed with `bfd` at
//! seq_length 128, 100 and 7, `bfd_split` and `wrapped` at 128 and 100 (datasets' batches of
//! 1000 rows), and `bfd` with batches of 64: every packed column and every `seq_lengths`
//! equal TRL's.

use anyhow::{Context, Result, bail};
use serde_json::Value;
use tchtrain_datasets::{PackingStrategy, pack_dataset};
use tchtrain_testing::assets;

fn lists(v: &Value) -> Result<Vec<Vec<i64>>> {
    v.as_array()
        .context("a list of rows")?
        .iter()
        .map(|row| {
            row.as_array()
                .context("a row")?
                .iter()
                .map(|x| x.as_i64().context("an integer"))
                .collect()
        })
        .collect()
}

const COLUMNS: [&str; 3] = ["input_ids", "attention_mask", "labels"];

#[test]
fn pack_dataset_equals_trl() -> Result<()> {
    let path = assets().join("reference/packing/packing.json");
    if !path.exists() {
        bail!("{} is missing: run `cargo xtask setup`", path.display());
    }
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let columns: Vec<Vec<Vec<i64>>> = COLUMNS
        .iter()
        .map(|c| lists(&r["rows"][c]))
        .collect::<Result<_>>()?;
    let cases = r["cases"].as_array().context("cases")?;
    assert_eq!(cases.len(), 8);
    for case in cases {
        let strategy: PackingStrategy = case["strategy"].as_str().context("strategy")?.parse()?;
        let seq_length = case["seq_length"].as_u64().context("seq_length")? as usize;
        let batch_size = case["batch_size"].as_u64().context("batch_size")? as usize;
        let packed = pack_dataset(&columns, seq_length, strategy, batch_size)?;
        let what = format!("{strategy:?} {seq_length} (batches of {batch_size})");
        for (c, name) in COLUMNS.iter().enumerate() {
            assert_eq!(
                packed.columns[c],
                lists(&case["packed"][name])?,
                "{what}: {name}"
            );
        }
        match &packed.seq_lengths {
            Some(lengths) => assert_eq!(*lengths, lists(&case["packed"]["seq_lengths"])?, "{what}"),
            None => assert!(case["packed"].get("seq_lengths").is_none(), "{what}"),
        }
        if strategy != PackingStrategy::Wrapped {
            let lengths = packed.seq_lengths.as_ref().context("seq_lengths")?;
            assert!(
                lengths
                    .iter()
                    .all(|l| l.iter().sum::<i64>() <= seq_length as i64)
            );
        }
        eprintln!(
            "{what}: {} rows -> {} packed",
            columns[0].len(),
            packed.columns[0].len()
        );
    }
    Ok(())
}

#[test]
fn bad_packing_input_is_refused_with_trls_messages() -> Result<()> {
    let err = "best".parse::<PackingStrategy>().unwrap_err().to_string();
    assert!(err.contains("Invalid packing strategy 'best'"), "{err}");
    let uneven = vec![vec![vec![1, 2]], vec![vec![1]]];
    let err = pack_dataset(&uneven, 4, PackingStrategy::Bfd, 1000)
        .unwrap_err()
        .to_string();
    assert!(err.contains("same length"), "{err}");
    let err = pack_dataset(&[vec![vec![1]]], 0, PackingStrategy::Bfd, 1000)
        .unwrap_err()
        .to_string();
    assert!(err.contains("seq_length"), "{err}");
    Ok(())
}

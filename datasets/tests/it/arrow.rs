//! Arrow IPC files and `save_to_disk` folders against `scripts/reference/datasets_parquet.py`
//! (pyarrow 26.0.1, datasets 5.2.0): streams (plain, zstd, lz4) and the file format read
//! as `load_dataset("arrow")` reads them, `Dataset` and `DatasetDict` folders (several
//! shards, a flattened shuffle) as `load_from_disk` does, cell for cell; bad files and
//! folders are typed errors, never panics.

use anyhow::{Context, Result};
use tchtrain_datasets::{DatasetDict, Error, LoadedDataset, Table, load_from_disk};
use tchtrain_testing::{reference_dir, temp_dir};

use crate::parquet::{assert_rows_equal, expected};

fn arrow(name: &str) -> std::path::PathBuf {
    reference_dir("datasets_parquet").join("arrow").join(name)
}

#[test]
fn every_arrow_cell_equals_load_dataset() -> Result<()> {
    let expected = expected()?;
    let files = expected["arrow"].as_object().context("arrow files")?;
    assert_eq!(files.len(), 4, "a stream, a file, a zstd and an lz4 stream");
    for (name, entry) in files {
        let table = Table::read(arrow(name))?;
        assert_rows_equal(name, &table, entry)?;
        assert_eq!(Table::read_arrow(arrow(name))?, table);
    }
    // The Parquet files hold the same table.
    let parquet =
        Table::read(reference_dir("datasets_parquet").join("parquet/types_zstd.parquet"))?;
    let stream = Table::read(arrow("types_stream.arrow"))?;
    assert_eq!(parquet.columns(), stream.columns());
    for c in stream.columns() {
        assert_eq!(parquet.column(c)?, stream.column(c)?, "{c}");
    }
    Ok(())
}

#[test]
fn load_from_disk_reads_save_to_disk_folders() -> Result<()> {
    let expected = expected()?;
    let root = reference_dir("datasets_parquet");

    // A Dataset of three shards, in state.json's order.
    let single = root.join("saved_dataset");
    let LoadedDataset::Dataset(table) = load_from_disk(&single)? else {
        panic!("a Dataset folder");
    };
    assert_rows_equal("saved_dataset", &table, &expected["saved_dataset"])?;
    assert_eq!(Table::load_from_disk(&single)?, table);
    assert_eq!(load_from_disk(&single)?.into_dataset()?, table);
    assert!(matches!(
        load_from_disk(&single)?.into_dataset_dict(),
        Err(Error::InvalidSavedDataset { .. })
    ));
    assert!(matches!(
        DatasetDict::load_from_disk(&single),
        Err(Error::InvalidSavedDataset { .. })
    ));

    // A DatasetDict: the splits in dataset_dict.json's order, train in two shards.
    let dict_dir = root.join("saved_dict");
    let dict = load_from_disk(&dict_dir)?.into_dataset_dict()?;
    let names: Vec<String> = serde_json::from_value(expected["saved_dict"]["splits"].clone())?;
    assert_eq!(dict.split_names(), names);
    assert_eq!(dict.len(), 3);
    for (name, split) in dict.iter() {
        assert_rows_equal(name, split, &expected["saved_dict"][name])?;
    }
    assert_eq!(DatasetDict::load_from_disk(&dict_dir)?, dict);
    match dict.get("dev") {
        Err(Error::MissingSplit {
            split, available, ..
        }) => {
            assert_eq!(split, "dev");
            assert_eq!(available, "train, validation, test");
        }
        other => panic!("expected MissingSplit, got {other:?}"),
    }
    assert!(matches!(
        Table::load_from_disk(&dict_dir),
        Err(Error::InvalidSavedDataset { .. })
    ));
    assert!(matches!(
        load_from_disk(&dict_dir)?.into_dataset(),
        Err(Error::InvalidSavedDataset { .. })
    ));

    // Not a saved dataset; a listed shard missing.
    assert!(matches!(
        load_from_disk(root.join("parquet")),
        Err(Error::InvalidSavedDataset { .. })
    ));
    assert!(matches!(
        load_from_disk(root.join("no-such-folder")),
        Err(Error::Io { .. })
    ));
    let dir = temp_dir("datasets-load-from-disk");
    for f in [
        "state.json",
        "dataset_info.json",
        "data-00000-of-00003.arrow",
    ] {
        std::fs::copy(single.join(f), dir.join(f))?;
    }
    let err = load_from_disk(&dir).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    assert!(
        err.to_string().contains("data-00001-of-00003.arrow"),
        "{err}"
    );
    Ok(())
}

#[test]
fn bad_arrow_files_are_typed_errors() -> Result<()> {
    let dir = temp_dir("datasets-arrow-errors");
    let path = dir.join("data.arrow");

    std::fs::write(&path, "text,label\nhello,1\n")?;
    let err = Table::read(&path).unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotFormat {
                format: "Arrow IPC",
                ..
            }
        ),
        "{err}"
    );
    std::fs::write(&path, b"")?;
    assert!(matches!(Table::read(&path), Err(Error::NotFormat { .. })));
    std::fs::copy(
        reference_dir("datasets_parquet").join("parquet/types_none.parquet"),
        &path,
    )?;
    let err = Table::read(&path).unwrap_err();
    assert!(err.to_string().contains("name it .parquet"), "{err}");

    // An IPC file with its footer kept and its data cut out: every block lies past the end
    // (the file reader would allocate the declared size before reading).
    let good = std::fs::read(arrow("types_file.arrow"))?;
    let n = good.len();
    let footer_len = u32::from_le_bytes(good[n - 10..n - 6].try_into()?) as usize;
    let mut no_data = b"ARROW1\0\0".to_vec();
    no_data.extend_from_slice(&good[n - 10 - footer_len..]);
    std::fs::write(&path, &no_data)?;
    let err = Table::read(&path).unwrap_err();
    assert!(
        matches!(err, Error::Corrupt { .. }) && err.to_string().contains("outside the file"),
        "{err}"
    );

    for name in [
        "types_stream.arrow",
        "types_file.arrow",
        "types_stream_zstd.arrow",
    ] {
        let good = std::fs::read(arrow(name))?;
        for len in [good.len() / 2, good.len() - 20, 9] {
            std::fs::write(&path, &good[..len])?;
            let err = Table::read(&path).unwrap_err();
            assert!(
                matches!(err, Error::Truncated { .. }),
                "{name} cut at {len}: {err}"
            );
        }
        // Damage anywhere: an error or a table, never a panic.
        for i in (0..good.len()).step_by(good.len() / 97 + 1) {
            let mut bytes = good.clone();
            bytes[i] ^= 0xa5;
            std::fs::write(&path, &bytes)?;
            let _ = Table::read(&path);
        }
    }
    Ok(())
}

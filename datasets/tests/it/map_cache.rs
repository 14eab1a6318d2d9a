//! The tokenized-dataset cache (`MapCache`, upstream's `Dataset.map` cache files): the file
//! format round-trips every field and rejects any damage without panicking; the cache
//! computes once, loads after, recomputes on `overwrite` or a corrupt file and survives an
//! unwritable folder. (The example scripts' use of it: tchtrain-examples' tests.)

use std::cell::Cell;

use anyhow::Result;
use tchtrain_datasets::{Feature, Fingerprint, Label, MapCache, decode_rows, encode_rows};
use tchtrain_testing::temp_dir;

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
            start_positions: Some(i64::MIN),
            end_positions: Some(-1),
            seq_lengths: Some(vec![1, 0, 2]),
        },
        Feature::new(vec![]).with_labels(Label::Value(-0.125)),
        Feature::new(vec![9]).with_labels(Label::Values(vec![1.5, f64::NAN, -0.0])),
        Feature::new(vec![4, 4]),
        Feature::new(vec![6, 7]).with_answer(1, 1),
    ]
}

/// `Feature`'s `PartialEq` compares NaN as unequal; compare the float labels by bits.
fn same(a: &[Feature], b: &[Feature]) -> bool {
    format!("{a:?}") == format!("{b:?}")
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
    let dir = temp_dir("map-cache");
    let cache = MapCache::new(dir.path());
    let mut fp = Fingerprint::new("test");
    fp.update("data");
    let calls = Cell::new(0);
    let compute = || {
        calls.set(calls.get() + 1);
        Ok::<_, tchtrain_datasets::Error>(rows())
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
            Err(tchtrain_datasets::Error::InvalidArgument {
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
    Ok(())
}

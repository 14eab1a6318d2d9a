//! The tokenized-dataset cache (`MapCache`, upstream's `Dataset.map` cache files): the file
//! format round-trips every field and rejects any damage without panicking; the cache
//! computes once, loads after, recomputes on `overwrite` or a corrupt file and survives an
//! unwritable folder. (The example scripts' use of it: tchtrain-examples' tests.)

use std::cell::Cell;

use anyhow::Result;
use tchtrain_datasets::{Column, Feature, Fingerprint, Label, MapCache, decode_rows, encode_rows};
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
            columns: [
                ("chosen_ids".to_string(), Column::Ids(vec![3, -1])),
                ("margin".to_string(), Column::Float(-0.5)),
            ]
            .into_iter()
            .collect(),
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

/// The cache keeps its files under the cap, the least recently used (written or loaded)
/// going first; a dataset larger than the cap is used uncached; a bad cap in the
/// environment is an error naming the variable.
#[test]
fn the_cache_is_bounded_least_recently_used_first() -> Result<()> {
    let dir = temp_dir("map-cache-lru");
    let one = encode_rows(&rows()).len() as u64;
    // Room for three files, not four.
    let cache = MapCache::new(dir.path()).with_max_bytes(3 * one + one / 2);
    let fp = |name: &str| {
        let mut f = Fingerprint::new("lru");
        f.update(name);
        f
    };
    let compute = || Ok::<_, tchtrain_datasets::Error>(rows());
    let pause = || std::thread::sleep(std::time::Duration::from_millis(20));
    for name in ["a", "b", "c"] {
        cache.map(&fp(name), false, compute)?;
        pause();
    }
    // Loading `a` makes `b` the least recently used.
    cache.map(&fp("a"), false, || {
        Err(tchtrain_datasets::Error::InvalidArgument {
            field: "a",
            detail: "must load from the cache".into(),
        })
    })?;
    pause();
    cache.map(&fp("d"), false, compute)?;
    let names: Vec<bool> = ["a", "b", "c", "d"]
        .iter()
        .map(|n| cache.path(&fp(n)).is_file())
        .collect();
    assert_eq!(
        names,
        [true, false, true, true],
        "b was the least recently used"
    );
    let total: u64 = cache.entries()?.iter().map(|e| e.bytes).sum();
    assert!(
        total <= cache.max_bytes(),
        "{total} > {}",
        cache.max_bytes()
    );
    // Entries come least recently used first.
    let order: Vec<_> = cache.entries()?.into_iter().map(|e| e.path).collect();
    assert_eq!(
        order,
        [
            cache.path(&fp("c")),
            cache.path(&fp("a")),
            cache.path(&fp("d"))
        ]
    );

    // Larger than the whole cap: used, not stored, nothing evicted.
    let tiny = MapCache::new(dir.join("tiny")).with_max_bytes(one - 1);
    assert!(same(&tiny.map(&fp("e"), false, compute)?, &rows()));
    assert!(!tiny.path(&fp("e")).exists());

    let vars = |mb: &'static str| {
        let dir = dir.path().as_os_str().to_owned();
        move |name: &str| match name {
            "TCHTRAIN_DATASETS_CACHE" => Some(dir.clone()),
            "TCHTRAIN_DATASETS_CACHE_MB" => Some(mb.into()),
            _ => None,
        }
    };
    let from_env = MapCache::from_vars(vars("12"))?.expect("a cache");
    assert_eq!(
        (from_env.dir(), from_env.max_bytes()),
        (dir.path(), 12 << 20)
    );
    let err = MapCache::from_vars(vars("12GB")).unwrap_err().to_string();
    assert!(
        err.contains("TCHTRAIN_DATASETS_CACHE_MB") && err.contains("12GB"),
        "{err}"
    );
    let default = MapCache::from_vars(|name| (name == "HOME").then(|| "/home/u".into()))?;
    assert_eq!(
        default.map(|c| (c.dir().to_path_buf(), c.max_bytes())),
        Some(("/home/u/.cache/tchtrain/datasets".into(), 4096 << 20))
    );
    Ok(())
}

//! The data side against upstream: `group_texts` (tchtrain-datasets) on hamlet.txt gives the blocks of
//! `run_clm.py` (recorded by scripts/reference/trainer_clm.py), the random sampler gives the
//! order upstream's Trainer fetched rows in, and the data loader batches, drops and skips.

use std::sync::Arc;

use anyhow::{Context, Result};
use tchtrain_collators::{DefaultDataCollator, Feature, Label};
use tchtrain_data::{
    DataLoader, Dataset, Error, InMemoryDataset, RandomSampler, Sampler, SequentialSampler,
    shared_collator,
};
use tchtrain_datasets::{group_texts, load_text_lines, split_lines, tokenize_lines};
use tchtrain_testing::{assets, reference_dir};

fn reference(file: &str) -> Result<serde_json::Value> {
    let path = reference_dir("trainer_clm").join(file);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(serde_json::from_str(&text)?)
}

fn ids_of(v: &serde_json::Value) -> Vec<Vec<i64>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|row| {
            row.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_i64().unwrap())
                .collect()
        })
        .collect()
}

#[test]
fn group_texts_matches_run_clm_on_hamlet() -> Result<()> {
    let blocks = reference("blocks.json")?;
    let a = assets();
    let tok = tchtrain_models::AutoTokenizer::from_pretrained(a.join("gpt2-tokenizer"))?;
    let tokenizer = tok.tokenizer();
    let lines = load_text_lines(a.join("text/hamlet.txt"), true)?;
    let ids = tokenize_lines(tokenizer, &lines)?;
    let ours = group_texts(&ids, 64, None)?;
    assert_eq!(ours.len() as u64, blocks["num_blocks"].as_u64().unwrap());
    let expected: Vec<Vec<i64>> = ids_of(&blocks["train"])
        .into_iter()
        .chain(ids_of(&blocks["eval"]))
        .collect();
    for (i, want) in expected.iter().enumerate() {
        assert_eq!(&ours[i].input_ids, want, "block {i}");
        assert_eq!(ours[i].labels, Some(Label::Ids(want.clone())));
        assert_eq!(ours[i].attention_mask.as_deref(), Some(&[1i64; 64][..]));
    }
    Ok(())
}

#[test]
fn group_texts_drops_each_chunk_remainder_and_rejects_zero_block() {
    let rows = vec![vec![1, 2, 3], vec![4, 5, 6], vec![7, 8, 9]];
    // Chunks of two rows: [1..6] -> one block of 4 (5, 6 dropped); [7, 8, 9] -> none.
    let blocks = group_texts(&rows, 4, Some(2)).unwrap();
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0].input_ids, [1, 2, 3, 4]);
    // One chunk: 9 tokens -> two blocks.
    assert_eq!(group_texts(&rows, 4, None).unwrap().len(), 2);
    assert!(matches!(
        group_texts(&rows, 0, None),
        Err(tchtrain_datasets::Error::InvalidArgument {
            field: "block_size",
            ..
        })
    ));
}

#[test]
fn split_lines_follows_python_splitlines() {
    // "a\nb\r\nc\rd\x0ce".splitlines(keepends=True) == ['a\n', 'b\r\n', 'c\r', 'd\x0c', 'e']
    assert_eq!(
        split_lines("a\nb\r\nc\rd\x0ce", true),
        ["a\n", "b\r\n", "c\r", "d\x0c", "e"]
    );
    assert_eq!(split_lines("a\n\nb\n", false), ["a", "", "b"]);
    assert!(split_lines("", true).is_empty());
}

#[test]
fn random_sampler_gives_upstreams_order() -> Result<()> {
    // Upstream's Trainer on 90 rows for 2 epochs with seed 42 fetched rows in this order
    // (accelerate's SeedableRandomSampler: randperm with a generator seeded seed + epoch).
    let order: Vec<usize> = serde_json::from_value(reference("random/order.json")?)?;
    let sampler = RandomSampler::new(42);
    let ours: Vec<usize> = (0..2).flat_map(|e| sampler.indices(90, e)).collect();
    assert_eq!(ours, order);
    let seq: Vec<usize> = serde_json::from_value(reference("sequential/order.json")?)?;
    let ours: Vec<usize> = (0..2)
        .flat_map(|e| SequentialSampler.indices(90, e))
        .collect();
    assert_eq!(ours, seq);
    Ok(())
}

fn rows(n: i64) -> Arc<dyn Dataset> {
    InMemoryDataset::new(
        (0..n)
            .map(|i| Feature::new(vec![i, i + 1]).with_labels(Label::Class(i)))
            .collect(),
    )
    .into_shared()
}

#[test]
fn data_loader_batches_drops_and_skips() -> Result<()> {
    let collator = shared_collator(DefaultDataCollator);
    let loader = DataLoader::new(
        rows(10),
        collator.clone(),
        Arc::new(SequentialSampler),
        4,
        false,
    )?;
    assert_eq!(loader.len(), 3);
    let sizes: Vec<i64> = loader
        .epoch(0)
        .map(|b| b.map(|b| b.get("input_ids").unwrap().size()[0]))
        .collect::<Result<_, _>>()?;
    assert_eq!(sizes, [4, 4, 2]);

    let dropping = DataLoader::new(
        rows(10),
        collator.clone(),
        Arc::new(SequentialSampler),
        4,
        true,
    )?;
    assert_eq!(dropping.len(), 2);
    assert_eq!(dropping.epoch(0).count(), 2);

    let mut it = loader.epoch(0);
    it.skip_batches(2);
    assert_eq!(it.position(), 2);
    let last = it.next().unwrap()?;
    assert_eq!(Vec::<i64>::try_from(last.get("labels").unwrap())?, [8, 9]);
    assert!(it.next().is_none());

    let random = DataLoader::new(
        rows(10),
        collator.clone(),
        Arc::new(RandomSampler::new(7)),
        5,
        false,
    )?;
    assert_eq!(
        random.epoch(3).order(),
        RandomSampler::new(7).indices(10, 3)
    );
    assert_ne!(random.epoch(0).order(), random.epoch(1).order());

    assert!(matches!(
        DataLoader::new(rows(3), collator, Arc::new(SequentialSampler), 0, false),
        Err(Error::InvalidArgument {
            field: "batch_size",
            ..
        })
    ));
    Ok(())
}

#[test]
fn dataset_index_out_of_range_is_an_error() {
    let ds = rows(2);
    assert!(matches!(
        ds.get(5),
        Err(Error::IndexOutOfRange { index: 5, len: 2 })
    ));
}

/// A dataset whose row `bad` cannot be read.
struct FailsAt {
    rows: Arc<dyn Dataset>,
    bad: usize,
}

impl Dataset for FailsAt {
    fn len(&self) -> usize {
        self.rows.len()
    }

    fn get(&self, index: usize) -> tchtrain_data::Result<Feature> {
        if index == self.bad {
            return Err(Error::IndexOutOfRange {
                index,
                len: self.bad,
            });
        }
        self.rows.get(index)
    }
}

#[test]
fn prefetched_epochs_equal_inline_ones() -> Result<()> {
    let loader = DataLoader::new(
        rows(23),
        shared_collator(DefaultDataCollator),
        Arc::new(RandomSampler::new(3)),
        4,
        false,
    )?;
    let labels = |b: tchtrain_collators::Batch| -> Result<Vec<i64>> {
        Ok(Vec::<i64>::try_from(b.get("labels").context("labels")?)?)
    };
    for depth in [1, 2, 8] {
        let mut inline = loader.epoch(2);
        let mut ahead = loader.epoch(2);
        inline.skip_batches(1);
        ahead.skip_batches(1);
        let want: Vec<Vec<i64>> = inline.map(|b| labels(b?)).collect::<Result<_>>()?;
        let got: Vec<Vec<i64>> = ahead
            .prefetch(depth)
            .map(|b| labels(b?))
            .collect::<Result<_>>()?;
        assert_eq!(got, want, "depth {depth}");
        assert_eq!(got.len(), 5);
    }
    // Dropped half-way (the training stopped): the thread stops, nothing hangs.
    let mut it = loader.epoch(0).prefetch(1);
    assert!(it.next().is_some());
    drop(it);
    // A row that cannot be read: its error arrives in order, after the good batches.
    let failing = DataLoader::new(
        Arc::new(FailsAt {
            rows: rows(12),
            bad: 9,
        }),
        shared_collator(DefaultDataCollator),
        Arc::new(SequentialSampler),
        4,
        false,
    )?;
    let items: Vec<_> = failing.epoch(0).prefetch(2).collect();
    assert_eq!(items.len(), 3);
    assert!(items[0].is_ok() && items[1].is_ok());
    assert!(matches!(
        items[2],
        Err(Error::IndexOutOfRange { index: 9, .. })
    ));
    Ok(())
}

//! numpy's `default_rng(seed)` against numpy 2.4 (`scripts/reference/numpy_random.py`):
//! `SeedSequence`'s pool and state words, PCG64's raw draws, `permutation(n)` for several
//! seeds and sizes (a seed above 2**32 included), and `datasets`' `Dataset.shuffle(seed)`
//! order: all equal.

use tchtrain_datasets::numpy_random::{SeedSequence, default_rng};

fn reference() -> serde_json::Value {
    let path = tchtrain_testing::reference_dir("numpy_random").join("numpy_random.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask setup`)", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn ints(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

#[test]
fn default_rng_equals_numpy() {
    let r = reference();
    for case in r["pool"].as_array().unwrap() {
        let ss = SeedSequence::new(case[0].as_u64().unwrap());
        let state: Vec<u64> = ss.generate_state(8).into_iter().map(u64::from).collect();
        assert_eq!(state, ints(&case[2]), "seed {}", case[0]);
    }
    let mut g = default_rng(42);
    let raw: Vec<u64> = (0..4).map(|_| g.next_u64()).collect();
    assert_eq!(raw, ints(&r["raw"]));
    for case in r["cases"]
        .as_array()
        .unwrap()
        .iter()
        .chain(r["shuffle"].as_array().unwrap())
    {
        let (seed, n) = (
            case[0].as_u64().unwrap(),
            case[1].as_u64().unwrap() as usize,
        );
        let perm: Vec<u64> = default_rng(seed)
            .permutation(n)
            .into_iter()
            .map(|i| i as u64)
            .collect();
        assert_eq!(perm, ints(&case[2]), "seed {seed}, n {n}");
    }
}

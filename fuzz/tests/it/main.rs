//! The replay of every fuzz target: its committed seeds (`corpus/<name>/`), then
//! `TCHTRAIN_FUZZ_RUNS` inputs (default [`DEFAULT_RUNS`]) made from them by
//! [`tchtrain_fuzz::Mutator`] with the seed `TCHTRAIN_FUZZ_SEED` (default [`DEFAULT_SEED`])
//! mixed with the target's name. A panic fails the test, names the input's index and
//! writes it to `target/fuzz/artifacts/<name>/`, where the libFuzzer binary of
//! `cargo xtask fuzz` (or this test, with the same seed) reproduces it.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tchtrain_fuzz::{Mutator, TARGETS, last_panic, quiet_panics};

/// Inputs made per target after its seeds.
const DEFAULT_RUNS: u64 = 5000;

/// The seed of the inputs made.
const DEFAULT_SEED: u64 = 1;

/// A target stops making inputs after this long (a slow target on a slow machine); the
/// test's output says how many ran.
const MAX_TIME_PER_TARGET: Duration = Duration::from_secs(120);

/// A number from an environment variable, or `default` when it is not set.
fn env_number(name: &str, default: u64) -> Result<u64, String> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| format!("{name}=`{v}` is not a whole number")),
    }
}

/// The committed seeds of `name`, in file-name order.
fn seeds(name: &str) -> Result<Vec<Vec<u8>>, String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(name);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("cannot list the seeds in {}: {e}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("cannot list the seeds in {}: {e}", dir.display()))?;
    files.sort();
    files
        .iter()
        .map(|f| std::fs::read(f).map_err(|e| format!("cannot read {}: {e}", f.display())))
        .collect()
}

/// FNV-1a of the target's name, so that each target draws its own inputs.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Writes a failing input where `cargo xtask fuzz` keeps its crash reproducers.
fn keep_reproducer(name: &str, label: &str, data: &[u8]) -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/fuzz/artifacts")
        .join(name);
    let path = dir.join(format!("replay-{label}"));
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, data)) {
        Ok(()) => format!("the input is in {}", path.display()),
        Err(e) => format!("the input could not be kept in {}: {e}", path.display()),
    }
}

/// Runs `name`'s function on its seeds, then on the inputs made from them.
fn replay(name: &str) -> Result<(), String> {
    let run = TARGETS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, f)| *f)
        .ok_or_else(|| format!("no fuzz target `{name}`"))?;
    let runs = env_number("TCHTRAIN_FUZZ_RUNS", DEFAULT_RUNS)?;
    let seed = env_number("TCHTRAIN_FUZZ_SEED", DEFAULT_SEED)?;
    replay_inputs(name, run, &seeds(name)?, runs, seed)
}

/// Runs `run` on `seeds`, then on `runs` inputs made from them with `seed`.
fn replay_inputs(
    name: &str,
    run: fn(&[u8]),
    seeds: &[Vec<u8>],
    runs: u64,
    seed: u64,
) -> Result<(), String> {
    // Parsers that catch panics of other crates (Parquet) must not print them.
    quiet_panics();
    let one = |label: String, data: &[u8]| -> Result<(), String> {
        catch_unwind(AssertUnwindSafe(|| run(data))).map_err(|_| {
            format!(
                "{name}: input {label} panicked: {}; {}",
                last_panic(),
                keep_reproducer(name, &label, data)
            )
        })
    };
    for (i, data) in seeds.iter().enumerate() {
        one(format!("seed-{i}"), data)?;
    }
    let mut mutator = Mutator::new(seed ^ name_hash(name));
    let t0 = Instant::now();
    let mut made = 0;
    while made < runs && t0.elapsed() < MAX_TIME_PER_TARGET {
        let data = mutator.input(seeds);
        one(format!("{seed}-{made}"), &data)?;
        made += 1;
    }
    println!(
        "{name}: {} seeds and {made} inputs made from them in {:.1}s, no panic{}",
        seeds.len(),
        t0.elapsed().as_secs_f64(),
        if made < runs {
            " (stopped by the time guard)"
        } else {
            ""
        }
    );
    Ok(())
}

macro_rules! replay_tests {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() -> Result<(), String> {
                replay(stringify!($name))
            }
        )*

        /// Every target of the library has its test here. (An `Err`, not a panic: the
        /// replay's quiet panic hook would swallow a panic's message.)
        #[test]
        fn every_target_is_replayed() -> Result<(), String> {
            let tested = [$(stringify!($name)),*];
            for (name, _) in TARGETS {
                if !tested.contains(&name) {
                    return Err(format!("the fuzz target `{name}` has no replay test"));
                }
            }
            if tested.len() != TARGETS.len() {
                return Err(format!("{} replay tests for {} targets", tested.len(), TARGETS.len()));
            }
            Ok(())
        }
    };
}

replay_tests!(
    training_args_json,
    training_args_cli,
    trainer_state_json,
    deepspeed_config,
    fsdp_config,
    config_json,
    tokenizer_json,
    gpt2_vocab_merges,
    table_csv,
    table_json,
    data_file,
    dataset_cache_rows,
    adapter_config,
    generation_config,
    torch_pickle,
    deepspeed_scheduler,
    parquet,
    image_png,
    audio,
);

/// The made inputs follow from the seed alone: two mutators with one seed make the same
/// inputs, and another seed makes others.
#[test]
fn inputs_follow_from_the_seed() {
    let seeds = vec![br#"{"a": [1, 2.5, "x"]}"#.to_vec(), b"a,b\n1,2\n".to_vec()];
    let make = |seed| {
        let mut m = Mutator::new(seed);
        (0..50).map(|_| m.input(&seeds)).collect::<Vec<_>>()
    };
    assert_eq!(make(7), make(7));
    assert_ne!(make(7), make(8));
    assert!(make(7).iter().any(|d| !seeds.contains(d)));
}

/// A target that panics on some input fails the replay, which names the input and keeps it.
#[test]
fn a_panic_fails_the_replay_and_keeps_the_input() {
    fn picky(data: &[u8]) {
        assert!(!data.contains(&b'#'), "a `#` in the input");
    }
    let seeds = vec![b"{\"a\": 1}".to_vec()];
    let err = replay_inputs("replay_self_test", picky, &seeds, 5000, 1).unwrap_err();
    assert!(
        err.contains("panicked: ") && err.contains("a `#` in the input"),
        "{err}"
    );
    let kept = err.rsplit("the input is in ").next().unwrap();
    let data = std::fs::read(kept).unwrap();
    assert!(data.contains(&b'#'));
    let label = kept.rsplit("replay-").next().unwrap();
    let index: usize = label.strip_prefix("1-").unwrap().parse().unwrap();
    let mut m = Mutator::new(1 ^ name_hash("replay_self_test"));
    let remade = (0..=index).map(|_| m.input(&seeds)).last().unwrap();
    assert_eq!(remade, data, "the label reproduces the input");
    replay_inputs("replay_self_test", picky, &seeds, 0, 1).unwrap();
}

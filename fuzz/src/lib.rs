//! The fuzz targets, one module per parser of outside input, and the helpers they share.
//!
//! Each target is a function of one input ([`TARGETS`]). Two drivers call them:
//! - libFuzzer, through `fuzz_targets/<name>.rs` (`cargo xtask fuzz`: nightly, coverage
//!   guided, the `libfuzzer` feature);
//! - the replay test, `tests/it/main.rs` (`cargo test -p tchtrain-fuzz`, so also
//!   `cargo xtask test`): every committed seed in `corpus/<name>/`, then inputs made from
//!   them by [`Mutator`] with a fixed seed. It builds on stable, with the workspace's
//!   dependencies, and needs no instrumented build.

use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::Once;

mod mutator;
pub mod targets;

pub use mutator::Mutator;

/// Every target: its name (the folder of its seeds under `corpus/`, the libFuzzer binary)
/// and its function of one input. A target fails by panicking.
pub const TARGETS: [(&str, fn(&[u8])); 19] = [
    ("training_args_json", targets::training_args_json::run),
    ("training_args_cli", targets::training_args_cli::run),
    ("trainer_state_json", targets::trainer_state_json::run),
    ("deepspeed_config", targets::deepspeed_config::run),
    ("fsdp_config", targets::fsdp_config::run),
    ("config_json", targets::config_json::run),
    ("tokenizer_json", targets::tokenizer_json::run),
    ("gpt2_vocab_merges", targets::gpt2_vocab_merges::run),
    ("table_csv", targets::table_csv::run),
    ("table_json", targets::table_json::run),
    ("data_file", targets::data_file::run),
    ("dataset_cache_rows", targets::dataset_cache_rows::run),
    ("adapter_config", targets::adapter_config::run),
    ("generation_config", targets::generation_config::run),
    ("torch_pickle", targets::torch_pickle::run),
    ("deepspeed_scheduler", targets::deepspeed_scheduler::run),
    ("parquet", targets::parquet::run),
    ("image_png", targets::image_png::run),
    ("audio", targets::audio::run),
];

/// The input as text, or `None` when it is not UTF-8 (every text parser takes `&str`).
pub fn text(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}

/// Writes `data` to `name` in a folder of this thread's own (under the system temporary
/// folder) and returns the path, for the parsers whose public entry point reads a file.
/// The replay test runs targets on several threads at once.
pub fn scratch_file(name: &str, data: &[u8]) -> PathBuf {
    let thread = format!("{:?}", std::thread::current().id());
    let thread: String = thread.chars().filter(char::is_ascii_digit).collect();
    let dir = std::env::temp_dir().join(format!("tchtrain-fuzz-{}-{thread}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("creating the fuzz scratch folder");
    let path = dir.join(name);
    std::fs::write(&path, data).expect("writing the fuzz scratch file");
    path
}

thread_local! {
    /// The message of the last panic on this thread, caught or not (for error reports,
    /// not behaviour).
    static LAST_PANIC: RefCell<String> = const { RefCell::new(String::new()) };
}

static QUIET_HOOK: Once = Once::new();

/// Replaces the panic hook, once per process, with one that prints nothing and keeps the
/// message for [`last_panic`]. libfuzzer-sys's own hook aborts on every panic, even one a
/// reader catches; the readers of Parquet / Arrow catch the panics of those crates.
pub fn quiet_panics() {
    QUIET_HOOK.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            LAST_PANIC.with(|l| *l.borrow_mut() = info.to_string());
        }));
    });
}

/// The message of the last panic on this thread since [`quiet_panics`].
pub fn last_panic() -> String {
    LAST_PANIC.with(|l| l.borrow().clone())
}

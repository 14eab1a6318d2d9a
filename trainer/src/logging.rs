//! Upstream's logging set-up (`log_level`, `log_level_replica`, `log_on_each_node`): the
//! level of this process's log ([`get_process_log_level`]) and a logger on stderr when the
//! process has none ([`init_logging`], what the example scripts' `logging.basicConfig` plus
//! `transformers.utils.logging.set_verbosity(log_level)` do), so that the Trainer's
//! warnings (fp16 on the CPU, a stop signal, a missing best checkpoint, ...) are seen.
//!
//! The log facade is the `log` crate. A program that installs its own logger keeps it: the
//! Trainer then sets no level either. `RUST_LOG`, when set, wins over `log_level`
//! (`env_logger`'s filter syntax).

use std::sync::atomic::{AtomicBool, Ordering};

use log::LevelFilter;
use tchtrain_training_args::TrainingArguments;

/// transformers' default verbosity (`logging.WARNING`), what `passive` keeps.
const DEFAULT_VERBOSITY: LevelFilter = LevelFilter::Warn;

/// Whether [`init_logging`] installed the process's logger (and so owns its level).
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// A `log_level` name as a level; `None` for `passive` (keep the current verbosity).
fn level_of(name: &str) -> Option<LevelFilter> {
    match name {
        "debug" => Some(LevelFilter::Debug),
        "info" => Some(LevelFilter::Info),
        "warning" => Some(LevelFilter::Warn),
        "error" | "critical" => Some(LevelFilter::Error),
        _ => None,
    }
}

/// Upstream `TrainingArguments.get_process_log_level`: `log_level` on the process that logs
/// (the main process, or each node's with `log_on_each_node`), `log_level_replica` on the
/// others; `passive` keeps the current verbosity (transformers' default, warnings).
pub fn get_process_log_level(args: &TrainingArguments) -> LevelFilter {
    let name = if args.should_log() {
        &args.log_level
    } else {
        &args.log_level_replica
    };
    level_of(name).unwrap_or(DEFAULT_VERBOSITY)
}

/// Installs a logger on stderr (`LEVEL - target - message`) when the process has none, and
/// sets this process's level ([`get_process_log_level`]) on the logger it installed. With
/// `RUST_LOG` set, that filter is used instead. Called by `TrainerBuilder::build` and by the
/// example scripts once their arguments are parsed; calling it again only updates the
/// level.
pub fn init_logging(args: &TrainingArguments) {
    let level = get_process_log_level(args);
    let from_env = std::env::var_os("RUST_LOG").is_some();
    if !INSTALLED.load(Ordering::SeqCst) {
        let mut builder = if from_env {
            env_logger::Builder::from_default_env()
        } else {
            let mut b = env_logger::Builder::new();
            b.filter_level(LevelFilter::Trace);
            b
        };
        // Written with `eprint!`, so a test harness captures it like its own output.
        builder.is_test(true);
        builder.format(|f, record| {
            use std::io::Write;
            writeln!(
                f,
                "{} - {} - {}",
                record.level(),
                record.target(),
                record.args()
            )
        });
        if builder.try_init().is_err() {
            // The program has its own logger: leave it and its level alone.
            return;
        }
        INSTALLED.store(true, Ordering::SeqCst);
    }
    if !from_env {
        log::set_max_level(level);
    }
}

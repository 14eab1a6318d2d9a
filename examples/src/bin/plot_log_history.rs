//! `plot_log_history`: draws the training loss (evaluation losses as dots) and the
//! learning rate against the step from a run's `trainer_state.json` into a PNG
//! (see `tchtrain_examples::plot_log_history`).
//!
//! ```sh
//! cargo run --release -p tchtrain-examples --bin plot_log_history -- \
//!     target/demo/train/trainer_state.json target/demo/train/loss_lr.png --title "my run"
//! ```

use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use tchtrain_callbacks::TrainerState;

const USAGE: &str = "usage: plot_log_history TRAINER_STATE_JSON OUT_PNG [--title TITLE]";

fn run(args: &[String]) -> Result<()> {
    let mut positional = Vec::new();
    let mut title = "training".to_string();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--title" => title = it.next().context("--title needs a value")?.clone(),
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            _ => positional.push(a.clone()),
        }
    }
    let [state, out] = positional.as_slice() else {
        bail!("{USAGE}");
    };
    let state = TrainerState::load_from_json(state).with_context(|| format!("reading {state}"))?;
    tchtrain_examples::plot_log_history(&state.log_history, &title, out)?;
    println!("plot_log_history: wrote {out}");
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plot_log_history: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

//! `dpo`: direct preference optimization with TRL's `trl dpo` flags (ScriptArguments, DPOConfig,
//! ModelConfig) and every `TrainingArguments` flag (see `tchtrain_examples::dpo`).
//!
//! ```sh
//! cargo run --release -p tchtrain-examples --bin dpo -- \
//!     --model_name_or_path assets/tiny-llama --dataset_name data/pairs \
//!     --max_steps 20 --output_dir target/dpo
//! ```

use std::process::ExitCode;

use tchtrain_examples::{dpo, exit_code};

fn main() -> ExitCode {
    exit_code("dpo", dpo::main_with_args(std::env::args().skip(1)))
}

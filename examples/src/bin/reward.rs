//! `reward`: reward modelling with TRL's `trl reward` flags (ScriptArguments, RewardConfig,
//! ModelConfig) and every `TrainingArguments` flag (see `tchtrain_examples::reward`).
//!
//! ```sh
//! cargo run --release -p tchtrain-examples --bin reward -- \
//!     --model_name_or_path assets/tiny-llama --dataset_name data/pairs \
//!     --max_steps 20 --output_dir target/reward
//! ```

use std::process::ExitCode;

use tchtrain_examples::{exit_code, reward};

fn main() -> ExitCode {
    exit_code("reward", reward::main_with_args(std::env::args().skip(1)))
}

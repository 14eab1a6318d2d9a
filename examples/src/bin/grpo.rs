//! `grpo`: group relative policy optimization with TRL's `trl grpo` flags (GRPOScriptArguments,
//! GRPOConfig, ModelConfig) and every `TrainingArguments` flag (see `tchtrain_examples::grpo`).
//!
//! ```sh
//! cargo run --release -p tchtrain-examples --bin grpo -- \
//!     --model_name_or_path assets/tiny-llama --dataset_name data/prompts --reward_model_name_or_path assets/tiny-reward \
//!     --max_steps 20 --output_dir target/grpo
//! ```

use std::process::ExitCode;

use tchtrain_examples::{exit_code, grpo};

fn main() -> ExitCode {
    exit_code("grpo", grpo::main_with_args(std::env::args().skip(1)))
}

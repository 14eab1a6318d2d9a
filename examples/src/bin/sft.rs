//! `sft`: supervised fine-tuning with TRL's `trl sft` flags (ScriptArguments, SFTConfig,
//! ModelConfig) and every `TrainingArguments` flag (see `tchtrain_examples::sft`).
//!
//! ```sh
//! cargo run --release -p tchtrain-examples --bin sft -- \
//!     --model_name_or_path assets/tiny-llama --dataset_name data/chat \
//!     --max_length 512 --max_steps 20 --output_dir target/sft
//! ```

use std::process::ExitCode;

use tchtrain_examples::{exit_code, sft};

fn main() -> ExitCode {
    exit_code("sft", sft::main_with_args(std::env::args().skip(1)))
}

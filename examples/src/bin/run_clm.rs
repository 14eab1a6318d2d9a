//! `run_clm`: causal language-model fine-tuning with upstream `run_clm.py`'s flags and
//! every `TrainingArguments` flag (see `tchtrain_examples::run_clm`).
//!
//! ```sh
//! cargo run --release -p tchtrain-examples --bin run_clm -- \
//!     --model_name_or_path assets/tiny-gpt2 --tokenizer_name assets/gpt2-tokenizer \
//!     --train_file assets/text/hamlet.txt --block_size 128 --do_train --do_eval \
//!     --max_steps 20 --output_dir target/run_clm
//! ```

use std::process::ExitCode;

use tchtrain_examples::{exit_code, run_clm};

fn main() -> ExitCode {
    exit_code("run_clm", run_clm::main_with_args(std::env::args().skip(1)))
}

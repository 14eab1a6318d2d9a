//! `run_mlm`: masked language-model fine-tuning with upstream `run_mlm.py`'s flags and
//! every `TrainingArguments` flag (see `tchtrain_examples::run_mlm`).
//!
//! ```sh
//! cargo run --release -p tchtrain-examples --bin run_mlm -- \
//!     --model_name_or_path assets/tiny-bert --tokenizer_name assets/minilm \
//!     --train_file assets/text/hamlet.txt --max_seq_length 64 --do_train --do_eval \
//!     --max_steps 20 --output_dir target/run_mlm
//! ```

use std::process::ExitCode;

use tchtrain_examples::{exit_code, run_mlm};

fn main() -> ExitCode {
    exit_code("run_mlm", run_mlm::main_with_args(std::env::args().skip(1)))
}

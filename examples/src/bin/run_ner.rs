//! `run_ner`: token classification (NER) with upstream `run_ner.py`'s flags and every
//! `TrainingArguments` flag (see `tchtrain_examples::run_ner`).
//!
//! ```sh
//! cargo run --release -p tchtrain-examples --bin run_ner -- \
//!     --model_name_or_path assets/tiny-bert --tokenizer_name assets/minilm \
//!     --train_file train.json --validation_file dev.json \
//!     --do_train --do_eval --num_train_epochs 3 --output_dir target/run_ner
//! ```

use std::process::ExitCode;

use tchtrain_examples::{exit_code, run_ner};

fn main() -> ExitCode {
    exit_code("run_ner", run_ner::main_with_args(std::env::args().skip(1)))
}

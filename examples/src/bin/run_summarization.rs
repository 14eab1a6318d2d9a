//! `run_summarization`: sequence-to-sequence summarization with upstream
//! `run_summarization.py`'s flags and every `Seq2SeqTrainingArguments` flag (see
//! `tchtrain_examples::run_summarization`).
//!
//! ```sh
//! cargo run --release -p tchtrain-examples --bin run_summarization -- \
//!     --model_name_or_path t5-tiny --source_prefix "summarize: " \
//!     --train_file train.csv --validation_file dev.csv \
//!     --do_train --do_eval --predict_with_generate --output_dir target/run_summarization
//! ```

use std::process::ExitCode;

use tchtrain_examples::{exit_code, run_summarization};

fn main() -> ExitCode {
    exit_code(
        "run_summarization",
        run_summarization::main_with_args(std::env::args().skip(1)),
    )
}

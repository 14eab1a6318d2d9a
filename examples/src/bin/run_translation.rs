//! `run_translation`: sequence-to-sequence translation with upstream
//! `run_translation.py`'s flags and every `Seq2SeqTrainingArguments` flag (see
//! `tchtrain_examples::run_translation`).
//!
//! ```sh
//! cargo run --release -p tchtrain-examples --bin run_translation -- \
//!     --model_name_or_path t5-tiny --source_lang en --target_lang ro \
//!     --source_prefix "translate English to Romanian: " \
//!     --train_file train.json --validation_file dev.json \
//!     --do_train --do_eval --predict_with_generate --output_dir target/run_translation
//! ```

use std::process::ExitCode;

use tchtrain_examples::{exit_code, run_translation};

fn main() -> ExitCode {
    exit_code(
        "run_translation",
        run_translation::main_with_args(std::env::args().skip(1)),
    )
}

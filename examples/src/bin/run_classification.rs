//! `run_classification`: sequence classification from a CSV / JSON-lines file with upstream
//! `run_classification.py`'s flags and every `TrainingArguments` flag (see
//! `tchtrain_examples::run_classification`).
//!
//! ```sh
//! cargo run --release -p tchtrain-examples --bin run_classification -- \
//!     --model_name_or_path assets/minilm --train_file train.csv --validation_file valid.csv \
//!     --text_column_names text --label_column_name category --shuffle_train_dataset \
//!     --do_train --do_eval --num_train_epochs 1 --output_dir target/run_classification
//! ```

use std::process::ExitCode;

use tchtrain_examples::{exit_code, run_classification};

fn main() -> ExitCode {
    exit_code(
        "run_classification",
        run_classification::main_with_args(std::env::args().skip(1)),
    )
}

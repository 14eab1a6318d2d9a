//! `run_image_classification`: image classification with upstream
//! `run_image_classification.py`'s flags and every `TrainingArguments` flag (see
//! `tchtrain_examples::run_image_classification`).
//!
//! ```sh
//! cargo run --release -p tchtrain-examples --bin run_image_classification -- \
//!     --model_name_or_path tiny-vit --dataset_name data/images-repo \
//!     --remove_unused_columns False --do_train --do_eval --output_dir target/ic
//! ```

use std::process::ExitCode;

use tchtrain_examples::{exit_code, run_image_classification};

fn main() -> ExitCode {
    exit_code(
        "run_image_classification",
        run_image_classification::main_with_args(std::env::args().skip(1)),
    )
}

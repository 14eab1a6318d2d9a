//! `custom_model`: a user-written `TrainableModel` trained by the Trainer (see
//! `tchtrain_examples::custom_model`).
//!
//! ```sh
//! cargo run --release -p tchtrain-examples --bin custom_model -- \
//!     --output_dir target/custom --do_train --max_steps 40 --learning_rate 0.05
//! ```

use std::process::ExitCode;

use tchtrain_examples::{custom_model, exit_code};

fn main() -> ExitCode {
    exit_code(
        "custom_model",
        custom_model::main_with_args(std::env::args().skip(1)),
    )
}

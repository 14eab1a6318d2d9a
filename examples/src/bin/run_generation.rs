//! `run_generation`: continuations of a prompt sampled from a causal LM, with upstream
//! `run_generation.py`'s flags (see `tchtrain_examples::run_generation`).
//!
//! ```sh
//! cargo run --release -p tchtrain-examples --bin run_generation -- \
//!     --model_type llama --model_name_or_path assets/smollm2-135m \
//!     --prompt "To be, or not to be" --length 30 --k 50 --temperature 0.7
//! ```

use std::process::ExitCode;

use tchtrain_examples::{exit_code, run_generation};

fn main() -> ExitCode {
    exit_code(
        "run_generation",
        run_generation::main_with_args(std::env::args().skip(1)),
    )
}

//! `accelerate_loop`: a hand-written training loop on the `Accelerator` alone (see
//! `tchtrain_examples::accelerate_loop`).
//!
//! ```sh
//! cargo run --release -p tchtrain-examples --bin accelerate_loop -- --cpu --max_steps 40
//! ```

use std::process::ExitCode;

use tchtrain_examples::{accelerate_loop, exit_code};

fn main() -> ExitCode {
    let result = accelerate_loop::main_with_args(std::env::args().skip(1));
    if let Ok(out) = &result {
        for s in &out.steps {
            println!(
                "step {:>4}  loss {:.6}  grad_norm {:.6}",
                s.step, s.loss, s.grad_norm
            );
        }
        println!("eval_accuracy {:.4}", out.eval_accuracy);
    }
    exit_code("accelerate_loop", result)
}

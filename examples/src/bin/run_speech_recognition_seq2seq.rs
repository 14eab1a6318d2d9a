//! `run_speech_recognition_seq2seq`: speech recognition with Whisper, with upstream
//! `run_speech_recognition_seq2seq.py`'s flags and every `Seq2SeqTrainingArguments` flag (see
//! `tchtrain_examples::run_speech_recognition_seq2seq`).
//!
//! ```sh
//! cargo run --release -p tchtrain-examples --bin run_speech_recognition_seq2seq -- \
//!     --model_name_or_path assets/tiny-whisper --dataset_name data/speech \
//!     --freeze_feature_encoder False --language en --do_train --do_eval \
//!     --predict_with_generate --output_dir target/asr
//! ```

use std::process::ExitCode;

use tchtrain_examples::{exit_code, run_speech_recognition_seq2seq};

fn main() -> ExitCode {
    exit_code(
        "run_speech_recognition_seq2seq",
        run_speech_recognition_seq2seq::main_with_args(std::env::args().skip(1)),
    )
}

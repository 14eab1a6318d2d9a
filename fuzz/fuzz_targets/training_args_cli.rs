//! libFuzzer's entry for [`tchtrain_fuzz::targets::training_args_cli`].

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tchtrain_fuzz::targets::training_args_cli::run(data));

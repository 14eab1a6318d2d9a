//! libFuzzer's entry for [`tchtrain_fuzz::targets::training_args_json`].

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tchtrain_fuzz::targets::training_args_json::run(data));

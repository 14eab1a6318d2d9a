//! libFuzzer's entry for [`tchtrain_fuzz::targets::trainer_state_json`].

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tchtrain_fuzz::targets::trainer_state_json::run(data));

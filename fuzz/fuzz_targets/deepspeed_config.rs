//! libFuzzer's entry for [`tchtrain_fuzz::targets::deepspeed_config`].

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tchtrain_fuzz::targets::deepspeed_config::run(data));

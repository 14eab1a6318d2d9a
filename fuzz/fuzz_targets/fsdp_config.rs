//! libFuzzer's entry for [`tchtrain_fuzz::targets::fsdp_config`].

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tchtrain_fuzz::targets::fsdp_config::run(data));

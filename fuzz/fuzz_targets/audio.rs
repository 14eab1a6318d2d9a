//! libFuzzer's entry for [`tchtrain_fuzz::targets::audio`].

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tchtrain_fuzz::targets::audio::run(data));

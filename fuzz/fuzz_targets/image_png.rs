//! libFuzzer's entry for [`tchtrain_fuzz::targets::image_png`].

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tchtrain_fuzz::targets::image_png::run(data));

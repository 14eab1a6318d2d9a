//! libFuzzer's entry for [`tchtrain_fuzz::targets::data_file`].

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tchtrain_fuzz::targets::data_file::run(data));

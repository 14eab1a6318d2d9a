//! libFuzzer's entry for [`tchtrain_fuzz::targets::parquet`].

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tchtrain_fuzz::targets::parquet::run(data));

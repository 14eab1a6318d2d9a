//! libFuzzer's entry for [`tchtrain_fuzz::targets::dataset_cache_rows`].

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tchtrain_fuzz::targets::dataset_cache_rows::run(data));

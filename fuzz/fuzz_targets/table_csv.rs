//! libFuzzer's entry for [`tchtrain_fuzz::targets::table_csv`].

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tchtrain_fuzz::targets::table_csv::run(data));

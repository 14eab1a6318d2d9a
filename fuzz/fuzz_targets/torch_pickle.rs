//! libFuzzer's entry for [`tchtrain_fuzz::targets::torch_pickle`].

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tchtrain_fuzz::targets::torch_pickle::run(data));

//! libFuzzer's entry for [`tchtrain_fuzz::targets::gpt2_vocab_merges`].

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tchtrain_fuzz::targets::gpt2_vocab_merges::run(data));

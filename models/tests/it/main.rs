//! The integration tests of tchtrain-models, one binary (a module per topic); every
//! test takes `tchtrain_testing::lock` (libtorch's global generator is process-wide).

mod audio;
mod checkpointing;
mod debug_utils;
mod dropout;
mod fresh_heads;
mod fuzz_regressions;
mod generation;
mod hub_and_save;
mod layer_hooks;
mod liger;
mod module_repr;
mod padding_free;
mod parity;
mod peft;
mod seq2seq;
mod tokenization;
mod vision;

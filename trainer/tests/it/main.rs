//! The integration tests of tchtrain-trainer, one binary (a module per topic). Tests that
//! relaunch this binary as ranks or as a child process name themselves with
//! `crate::common::test_path`; every test takes `tchtrain_testing::lock` (libtorch's global
//! generator and allocator are process-wide).

mod audio;
mod autocast_families;
mod bad_files;
mod bitsandbytes;
mod checkpoints;
mod common;
mod cpu_cache;
mod crash_save;
mod decoder_families;
mod deepspeed_configs;
mod deepspeed_half;
mod dist_faults;
mod dist_signals;
mod distributed;
mod distributed_resume;
mod fields;
mod fsdp_half;
mod gpu;
mod hooks;
mod interop;
mod model_card;
mod optimizers;
mod parity;
mod push;
mod sampling;
mod save_failures;
mod seq2seq;
mod signals;
mod streaming;
mod trackers;
mod trainer;
mod vision;
mod vlm;
mod zero;

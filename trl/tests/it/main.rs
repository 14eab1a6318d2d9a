//! The integration tests of tchtrain-trl, one binary (a module per trainer). Every test takes
//! `tchtrain_testing::lock` (libtorch's global generator and allocator are process-wide).

mod common;
mod dpo;
mod grpo;
mod reward;
mod sft;
mod sft_vlm;

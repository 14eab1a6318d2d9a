//! The integration tests of tchtrain-optim, one binary (a module per topic); every
//! test takes `tchtrain_testing::lock` (libtorch's global generator is process-wide).

mod bitsandbytes;
mod grad_scaler;
mod low_rank;
mod optimizers;
mod packages;
mod schedule_free;
mod schedules;
mod set_grad;
mod torch_state;
mod torchao;

//! The integration tests of tchtrain-optim, one binary (a module per topic); every
//! test takes `tchtrain_testing::lock` (libtorch's global generator is process-wide).

mod grad_scaler;
mod optimizers;
mod packages;
mod schedules;
mod set_grad;
mod torchao;

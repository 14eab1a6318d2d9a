//! The integration tests of tchtrain-callbacks, one binary (a module per topic).

mod clearml;
mod codecarbon;
mod comet;
mod common;
mod dvclive;
mod handler_and_loggers;
mod kubeflow;
mod mlflow;
mod swanlab;
mod trackio;
mod upstream_parity;
mod wandb;

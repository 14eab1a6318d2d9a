//! The integration tests of tchtrain-deepspeed, one binary (a module per topic).

mod config;
mod doc_configs;
mod half_precision;
mod lr_schedules;

//! The integration tests of tchtrain-hub, one binary (a module per topic).

mod cache_and_download;
mod options;
mod upload;

//! The integration tests of tchtrain-datasets, one binary (a module per topic).

mod arrow;
mod hub;
mod map_cache;
mod numpy_random;
mod packing;
mod parquet;

//! The integration tests of tchtrain-datasets, one binary (a module per topic).

mod map_cache;
mod packing;

//! The integration tests of tchtrain-data, one binary (a module per topic).

mod data;

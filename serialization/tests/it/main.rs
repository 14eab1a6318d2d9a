//! Integration tests of tchtrain-serialization (one binary): reading torch's files, writing
//! files torch reads, and refusing hostile input.

mod common;
mod hostile;
mod reading;
mod writing;

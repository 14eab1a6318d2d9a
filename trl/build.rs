//! Gives this crate's tests an rpath to libtorch (its C++ lives in `tchtrain-sys`).

fn main() {
    tchtrain_build::link_libtorch();
}

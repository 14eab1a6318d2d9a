//! Gives this crate's tests and binaries an rpath to libtorch and a real libtorch_cuda link.

fn main() {
    tchtrain_build::link_libtorch();
}

//! Gives the fuzz binaries an rpath to libtorch, as every tchtrain crate's build.rs does.

fn main() {
    tchtrain_build::link_libtorch();
}

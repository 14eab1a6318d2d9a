//! Gives this crate's tests and binaries an rpath to libtorch and a real libtorch_cuda link,
//! and compiles the C++ shim (`csrc/optim_shim.cpp`) against the libtorch `torch-sys` linked.

use std::path::PathBuf;

fn main() {
    tchtrain_build::link_libtorch();

    println!("cargo:rerun-if-changed=csrc/optim_shim.cpp");
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    let lib_dir = std::env::var_os("DEP_TCH_LIBTORCH_LIB")
        .map(PathBuf::from)
        .expect("DEP_TCH_LIBTORCH_LIB is unset: tchtrain-optim must depend on torch-sys directly");
    let root = lib_dir
        .parent()
        .expect("the libtorch lib folder has a parent")
        .to_path_buf();
    cc::Build::new()
        .cpp(true)
        .file("csrc/optim_shim.cpp")
        .include(root.join("include"))
        .include(root.join("include/torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .flag_if_supported("-Wno-unused-parameter")
        .warnings(false)
        .compile("tchtrain_optim_shim");
}

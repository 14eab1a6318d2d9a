//! Gives this crate's tests and binaries an rpath to libtorch and a real libtorch_cuda link,
//! and compiles the c10d shim (`csrc/c10d_shim.cpp`) against the libtorch `torch-sys` linked.
//! `csrc/gloo/` holds stand-in declarations of the gloo types the c10d header names (the
//! torch wheel has no gloo headers); libtorch_cpu carries gloo itself, so nothing else links.

fn main() {
    tchtrain_build::link_libtorch();
    for f in ["csrc/c10d_shim.cpp", "csrc/gloo"] {
        println!("cargo:rerun-if-changed={f}");
    }
    let Some(includes) = tchtrain_build::libtorch_include_dirs() else {
        panic!(
            "DEP_TCH_LIBTORCH_LIB is unset: tchtrain-distributed must depend on torch-sys directly"
        );
    };
    cc::Build::new()
        .cpp(true)
        .file("csrc/c10d_shim.cpp")
        .include("csrc")
        .includes(includes)
        .flag("-std=c++20")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .flag("-DUSE_C10D_GLOO")
        .flag("-DUSE_DISTRIBUTED")
        .warnings(false)
        .compile("tchtrain_c10d_shim");
}

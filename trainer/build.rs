//! Gives this crate's tests and binaries an rpath to libtorch and a real libtorch_cuda link,
//! and compiles the C++ shim (`csrc/trainer_shim.cpp`: autocast per device type, generator
//! states; `csrc/cpu_cache.cpp`: the caching CPU allocator) against the libtorch `torch-sys` linked.

fn main() {
    tchtrain_build::link_libtorch();
    println!("cargo:rerun-if-changed=csrc/trainer_shim.cpp");
    println!("cargo:rerun-if-changed=csrc/cpu_cache.cpp");
    let Some(includes) = tchtrain_build::libtorch_include_dirs() else {
        panic!("DEP_TCH_LIBTORCH_LIB is unset: tchtrain-trainer must depend on torch-sys directly");
    };
    cc::Build::new()
        .cpp(true)
        .file("csrc/trainer_shim.cpp")
        .file("csrc/cpu_cache.cpp")
        .includes(includes)
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .flag_if_supported("-Wno-unused-parameter")
        .warnings(false)
        .compile("tchtrain_trainer_shim");
}

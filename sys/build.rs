//! Compiles all of tchtrain's C++ (`csrc/*.cpp`, one exception guard in `csrc/guard.h`)
//! into one static library against the libtorch `torch-sys` linked, as C++20, from one
//! translation unit (`csrc/unity.cpp`).
//! `csrc/gloo/` holds stand-in declarations of the gloo types the c10d header names (the
//! torch wheel has no gloo headers); libtorch_cpu carries gloo itself, so nothing else links.
//!
//! With the `cuda` feature the shim is compiled with `USE_C10D_NCCL` (ProcessGroupNCCL) and
//! links `torch_cuda` / `c10_cuda`. The CUDA and NCCL headers come from the CUDA toolkit at
//! `CUDA_HOME` when set, else from the `nvidia-*` wheels beside the torch wheel
//! (`site-packages/nvidia/cu13/include` with `nvidia-cuda-crt` and `nvidia-cuda-cccl`, which
//! `cargo xtask setup` installs, and `nvidia/nccl/include`).
//!
//! `_GLIBCXX_USE_CXX11_ABI` follows torch-sys (`tchtrain_build::libtorch_cxx11_abi`). Under
//! docs.rs or the `doc-only` feature nothing is compiled (there is no libtorch); other
//! failures are `cargo::error` lines, not panics.

use std::path::{Path, PathBuf};

/// The header folders the NCCL shim needs, or what is missing and how to get it.
fn cuda_include_dirs(libtorch_lib: &Path) -> Result<Vec<PathBuf>, String> {
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    let mut dirs = Vec::new();
    if let Some(home) = std::env::var_os("CUDA_HOME") {
        let inc = PathBuf::from(home).join("include");
        dirs.push(inc.join("cccl"));
        dirs.push(inc);
    } else if let Some(site) = libtorch_lib.parent().and_then(Path::parent) {
        let nvidia = site.join("nvidia");
        for sub in ["cu13/include/cccl", "cu13/include", "nccl/include"] {
            dirs.push(nvidia.join(sub));
        }
    }
    let found = |name: &str| dirs.iter().any(|d| d.join(name).exists());
    let missing: Vec<&str> = ["cuda_runtime.h", "crt/host_config.h", "nv/target", "nccl.h"]
        .into_iter()
        .filter(|h| !found(h))
        .collect();
    if missing.is_empty() {
        Ok(dirs.into_iter().filter(|d| d.exists()).collect())
    } else {
        Err(format!(
            "the `cuda` feature compiles ProcessGroupNCCL and needs the CUDA headers {missing:?}, not found in {dirs:?}: set CUDA_HOME to a CUDA toolkit, or install the wheels `nvidia-cuda-runtime nvidia-cuda-crt nvidia-cuda-cccl nvidia-nccl-cu13` next to torch (`cargo xtask setup` does)"
        ))
    }
}

fn main() {
    println!("cargo:rerun-if-changed=csrc");
    // A failure is reported with `cargo::error` (one line, no panic backtrace); cargo then
    // fails the build.
    if let Err(e) = build() {
        println!("cargo::error={}", e.replace('\n', " "));
    }
}

fn build() -> Result<(), String> {
    if tchtrain_build::doc_only() {
        // docs.rs or the `doc-only` feature: no libtorch to compile against, and rustdoc
        // needs no C++ (torch-sys's `doc-only` links nothing either).
        return Ok(());
    }
    let includes = tchtrain_build::libtorch_include_dirs().ok_or(
        "torch-sys did not report its libtorch (DEP_TCH_LIBTORCH_LIB is unset): tchtrain-sys compiles its C++ on Linux and macOS against the libtorch torch-sys found (LIBTORCH or LIBTORCH_USE_PYTORCH); to build documentation only, enable the `doc-only` feature",
    )?;
    // The same `_GLIBCXX_USE_CXX11_ABI` torch-sys compiled with: a mismatch fails to link
    // (std::string in every libtorch signature).
    let abi = tchtrain_build::libtorch_cxx11_abi()?;
    let mut build = cc::Build::new();
    build.cpp(true);
    // One translation unit (csrc/unity.cpp includes every other .cpp): libtorch's headers
    // are parsed once instead of once per file.
    build.file("csrc/unity.cpp");
    build
        .include("csrc")
        .includes(includes)
        .flag("-std=c++20")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={abi}"))
        .flag("-DUSE_C10D_GLOO")
        .flag("-DUSE_DISTRIBUTED")
        .flag_if_supported("-Wno-unused-parameter")
        .warnings(false);
    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        let lib =
            PathBuf::from(std::env::var_os(tchtrain_build::LIBTORCH_LIB_VAR).unwrap_or_default());
        if !lib.join("libtorch_cuda.so").exists() {
            return Err(format!(
                "the `cuda` feature needs a CUDA build of libtorch, but {} has no libtorch_cuda.so: point LIBTORCH (or LIBTORCH_USE_PYTORCH) at a CUDA torch",
                lib.display()
            ));
        }
        build
            .includes(cuda_include_dirs(&lib)?)
            .flag("-DUSE_C10D_NCCL")
            .flag("-DUSE_CUDA");
        println!("cargo:rustc-link-search=native={}", lib.display());
        for l in ["c10_cuda", "torch_cuda"] {
            println!("cargo:rustc-link-lib=dylib={l}");
        }
    }
    build.try_compile("tchtrain_sys").map_err(|e| e.to_string())
}

//! Build-script helper shared by every tchtrain crate that links libtorch.
//!
//! `torch-sys` links libtorch but leaves two things to the final binary:
//!
//! * an **rpath** to the libtorch `lib/` folder, so binaries and test executables run
//!   without `LD_LIBRARY_PATH`;
//! * a **real link to `libtorch_cuda`**: rustc links with `--as-needed`, and since no
//!   Rust code calls into `libtorch_cuda` directly the linker drops it, which makes CUDA
//!   silently vanish on a GPU machine (`tch::Cuda::is_available()` returns `false`).
//!
//! Cargo only applies `rustc-link-arg` to the package that prints it, so each crate with
//! binaries, tests or examples calls [`link_libtorch`] from its `build.rs`. Your own crate
//! can do the same:
//!
//! ```no_run
//! // build.rs (with `torch-sys` as a direct dependency, so Cargo hands us its lib dir):
//! // fn main() { tchtrain_build::link_libtorch(); }
//! tchtrain_build::link_libtorch();
//! ```

use std::path::Path;

/// Environment variable Cargo sets for build scripts of packages that depend directly on
/// `torch-sys` (`links = "tch"`), holding the libtorch `lib/` folder it linked against.
pub const LIBTORCH_LIB_VAR: &str = "DEP_TCH_LIBTORCH_LIB";

/// Linker arguments for a libtorch `lib/` folder: the rpath, and `libtorch_cuda` kept
/// under `--no-as-needed` when the folder has it.
pub fn link_args(lib_dir: &Path) -> Vec<String> {
    let mut args = vec![format!("-Wl,-rpath,{}", lib_dir.display())];
    for cuda_lib in ["torch_cuda", "torch_hip"] {
        if lib_dir.join(format!("lib{cuda_lib}.so")).exists() {
            args.push(format!(
                "-Wl,--push-state,--no-as-needed,-l{cuda_lib},--pop-state"
            ));
        }
    }
    args
}

/// Prints the `cargo:rustc-link-arg` lines for the libtorch that `torch-sys` linked.
///
/// Call it from `build.rs`. Without `DEP_TCH_LIBTORCH_LIB` (the package does not depend
/// on `torch-sys` directly, or on Windows/macOS) it prints nothing.
pub fn link_libtorch() {
    println!("cargo:rerun-if-env-changed={LIBTORCH_LIB_VAR}");
    if !cfg!(target_os = "linux") {
        return;
    }
    let Some(lib_dir) = std::env::var_os(LIBTORCH_LIB_VAR) else {
        return;
    };
    for arg in link_args(Path::new(&lib_dir)) {
        println!("cargo:rustc-link-arg={arg}");
    }
}

/// The include folders of the libtorch `torch-sys` linked (`include/` and the C++ API
/// folder), for build scripts that compile a C++ shim against it; `None` without
/// `DEP_TCH_LIBTORCH_LIB`.
pub fn libtorch_include_dirs() -> Option<Vec<std::path::PathBuf>> {
    println!("cargo:rerun-if-env-changed={LIBTORCH_LIB_VAR}");
    let lib_dir = std::path::PathBuf::from(std::env::var_os(LIBTORCH_LIB_VAR)?);
    let root = lib_dir.parent()?.to_path_buf();
    Some(vec![
        root.join("include"),
        root.join("include/torch/csrc/api/include"),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpath_always_cuda_only_when_present() {
        let dir = std::env::temp_dir().join(format!("tchtrain-build-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(
            link_args(&dir),
            vec![format!("-Wl,-rpath,{}", dir.display())]
        );
        std::fs::write(dir.join("libtorch_cuda.so"), b"").unwrap();
        let args = link_args(&dir);
        assert_eq!(args.len(), 2);
        assert_eq!(
            args[1],
            "-Wl,--push-state,--no-as-needed,-ltorch_cuda,--pop-state"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

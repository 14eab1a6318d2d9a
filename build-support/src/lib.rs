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
//! binaries, tests or examples calls [`link_libtorch`] from its `build.rs`.
//!
//! Two more facts for build scripts that compile C++ against that libtorch (`tchtrain-sys`):
//! [`libtorch_include_dirs`] and [`libtorch_cxx11_abi`] (the `_GLIBCXX_USE_CXX11_ABI` value
//! torch-sys compiled with, decided as torch-sys decides it). [`doc_only`] tells a build script
//! that it only feeds rustdoc (docs.rs, or the crate's `doc-only` feature): there is no
//! libtorch then, and [`link_libtorch`] prints nothing.
//!
//! Your own crate can do what ours do:
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
/// on `torch-sys` directly, or on Windows/macOS) or under [`doc_only`] it prints nothing.
pub fn link_libtorch() {
    println!("cargo:rerun-if-env-changed={LIBTORCH_LIB_VAR}");
    if !cfg!(target_os = "linux") || doc_only() {
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

/// Whether this build only feeds rustdoc: on docs.rs (`DOCS_RS` is set) or with the building
/// crate's `doc-only` feature (`CARGO_FEATURE_DOC_ONLY`, which also turns on tch's and
/// torch-sys's `doc-only`). There is no libtorch then: a build script compiles no C++ and
/// prints no link arguments, and the result documents but cannot run.
pub fn doc_only() -> bool {
    println!("cargo:rerun-if-env-changed=DOCS_RS");
    std::env::var_os("DOCS_RS").is_some() || std::env::var_os("CARGO_FEATURE_DOC_ONLY").is_some()
}

/// The `_GLIBCXX_USE_CXX11_ABI` value (`"0"` or `"1"`) that torch-sys compiled its C++
/// with; C++ compiled against the same libtorch must use the same one.
///
/// torch-sys 0.26 exports no `DEP_TCH_*` value for it, so this repeats its decision (its
/// `build.rs`, `SystemInfo::new`): with `LIBTORCH_USE_PYTORCH` set, Python's
/// `torch._C._GLIBCXX_USE_CXX11_ABI` (the interpreter is `python` inside a `VIRTUAL_ENV`,
/// else `python3`); otherwise `LIBTORCH_CXX11_ABI`, default `"1"`. Both variables are read
/// from the same environment torch-sys's build script saw.
pub fn libtorch_cxx11_abi() -> Result<String, String> {
    println!("cargo:rerun-if-env-changed=LIBTORCH_USE_PYTORCH");
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    if std::env::var("LIBTORCH_USE_PYTORCH").is_err() {
        return Ok(std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".to_owned()));
    }
    let python = if std::env::var_os("VIRTUAL_ENV").is_some() {
        "python"
    } else {
        "python3"
    };
    let output = std::process::Command::new(python)
        .args([
            "-c",
            "import torch; print('LIBTORCH_CXX11:', torch._C._GLIBCXX_USE_CXX11_ABI)",
        ])
        .output()
        .map_err(|e| format!("LIBTORCH_USE_PYTORCH is set but `{python}` did not run: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    cxx11_abi_from_python(&stdout).map(str::to_owned).ok_or_else(|| {
        format!(
            "LIBTORCH_USE_PYTORCH is set but `{python}` gave no torch._C._GLIBCXX_USE_CXX11_ABI (stdout {stdout:?}, stderr {:?})",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

/// The ABI value from the `LIBTORCH_CXX11: True|False` line torch-sys's Python query prints.
fn cxx11_abi_from_python(stdout: &str) -> Option<&'static str> {
    stdout
        .lines()
        .find_map(|line| match line.strip_prefix("LIBTORCH_CXX11: ") {
            Some("True") => Some("1"),
            Some("False") => Some("0"),
            _ => None,
        })
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

    #[test]
    fn cxx11_abi_as_torch_sys_reads_python() {
        assert_eq!(cxx11_abi_from_python("LIBTORCH_CXX11: True\n"), Some("1"));
        assert_eq!(
            cxx11_abi_from_python("noise\nLIBTORCH_CXX11: False"),
            Some("0")
        );
        assert_eq!(cxx11_abi_from_python("LIBTORCH_CXX11: maybe"), None);
    }
}

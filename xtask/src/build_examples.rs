//! Building the example binaries the demos, the benchmarks and the e2e suite run: one
//! `cargo build -p tchtrain-examples --bin ...` against the libtorch setup chose.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use crate::{cmd, paths, setup};

/// Builds `bins` of `tchtrain-examples` (`release`: the release profile, else dev), printing
/// the command and the time under `who`; returns the folder the binaries land in.
pub fn build_examples(
    s: &setup::Setup,
    release: bool,
    bins: &[&str],
    who: &str,
) -> Result<PathBuf, String> {
    build_examples_with(s, release, bins, who, &[])
}

/// [`build_examples`] with cargo `features` (e.g. `tchtrain/cuda` for a run on a GPU).
pub fn build_examples_with(
    s: &setup::Setup,
    release: bool,
    bins: &[&str],
    who: &str,
    features: &[&str],
) -> Result<PathBuf, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build.current_dir(paths::workspace_root()).arg("build");
    if release {
        build.arg("--release");
    }
    build.args(["-p", "tchtrain-examples"]);
    for bin in bins {
        build.args(["--bin", bin]);
    }
    if !features.is_empty() {
        build.args(["--features", &features.join(",")]);
    }
    if let Some(libtorch) = &s.child_libtorch {
        build.env("LIBTORCH", libtorch);
    }
    println!("{who}: {}", cmd::display(&build));
    let t0 = Instant::now();
    cmd::status(
        &mut build,
        &format!("building the examples {}", bins.join(", ")),
    )?;
    println!("{who}: built in {:.1}s", t0.elapsed().as_secs_f64());
    Ok(paths::target_dir().join(if release { "release" } else { "debug" }))
}

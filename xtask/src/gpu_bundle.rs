//! `cargo xtask gpu-bundle` and `cargo xtask gpu-check`: the device check, prepared here and
//! run on a GPU machine that has no Rust toolchain and no network, only Python with its own
//! torch (another version than the one this workspace pins) and transformers, reached by
//! copying a folder of at most 64 MiB to it.
//!
//! `gpu-bundle [--torch VERSION] [--out DIR] [--max-mb N]`:
//!
//! 1. the torch wheel of that version (`pip download torch==VERSION --no-deps`, a CUDA build)
//!    unpacked once into the cache (`gpu-bundle/torch-VERSION/site/torch/{lib,include}`), its
//!    CUDA and NCCL headers taken from the `nvidia-*` wheels of the setup's virtualenv (the
//!    same CUDA major version, checked);
//! 2. tch's C++ (`torch-sys`, the version Cargo.lock pins) copied beside it and checked against
//!    those headers (`g++ -fsyntax-only`): each generated `atg_*` function the older libtorch
//!    lacks gets a body that returns libtorch's error "... is not in libtorch VERSION"
//!    (listed in the bundle's MANIFEST.json); nothing here calls them;
//! 3. a copy of the working tree (tracked and untracked files, modification times kept)
//!    built in release against that libtorch with the `cuda` feature (NCCL), torch-sys
//!    replaced by the copy (`--config patch.crates-io.torch-sys.path=...`), stripped;
//! 4. the folder `DIR` (default `<workspace>/target/gpu-bundle`, whatever `CARGO_TARGET_DIR`
//!    says): `bin/run_clm`, `gpu_check.py` and
//!    `zero3_offload.json` (`scripts/gpu/`), `data/` (hamlet.txt, SmolLM2's config and
//!    tokenizer), `MANIFEST.json` (versions, the binary's needed libraries and newest
//!    GLIBC / GLIBCXX symbol versions, the stubbed ops) and `README.txt` (how to run it
//!    there); refused when larger than `--max-mb` (default 56).
//!
//! `gpu-check [--bundle DIR] [--out DIR] [-- ARGS...]`: the bundle's `gpu_check.py` run
//! here, the dry run of the device check: the setup's Python and torch, our binary on the
//! bundle's libtorch (`--torch-lib`), which falls back to the CPU and a tiny model.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::json::Json;
use crate::{cmd, paths, setup};

/// The GPU machine's torch when the issue was written: torch 2.11 (+cu130).
const DEFAULT_TORCH: &str = "2.11.0";
/// The bundle's size cap: the machine takes 64 MiB of copied files, with room for the rest.
const DEFAULT_MAX_MB: u64 = 56;
/// The binaries of the check.
const BINARIES: [&str; 1] = ["run_clm"];

#[derive(Debug, PartialEq)]
struct Options {
    torch: String,
    out: Option<PathBuf>,
    max_mb: u64,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        torch: DEFAULT_TORCH.into(),
        out: None,
        max_mb: DEFAULT_MAX_MB,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("gpu-bundle: {a} needs a value"))
        };
        match a.as_str() {
            "--torch" => o.torch = value()?,
            "--out" => o.out = Some(PathBuf::from(value()?)),
            "--max-mb" => {
                let v = value()?;
                o.max_mb = v.parse().map_err(|_| {
                    format!("gpu-bundle: --max-mb takes a number of MiB, got `{v}`")
                })?;
            }
            other => {
                return Err(format!(
                    "gpu-bundle: unknown option `{other}` (known: --torch VERSION, --out DIR, --max-mb N)"
                ));
            }
        }
    }
    if !o
        .torch
        .split('.')
        .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(format!(
            "gpu-bundle: --torch takes a release such as 2.11.0, got `{}`",
            o.torch
        ));
    }
    Ok(o)
}

/// `<workspace>/target/gpu-bundle`: inside the checkout (and ignored by git) even when
/// `CARGO_TARGET_DIR` puts the build elsewhere, so that the folder travels with the tree.
fn default_bundle_dir() -> PathBuf {
    paths::workspace_root().join("target").join("gpu-bundle")
}

/// `cargo xtask gpu-bundle`.
pub fn bundle(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    let t0 = Instant::now();
    let s = setup::run(&setup::Options::default())?;
    let work = paths::cache_dir()?
        .join("gpu-bundle")
        .join(format!("torch-{}", o.torch));
    let site = fetch_libtorch(&s.python, &work, &o.torch)?;
    let torch_sys = patched_torch_sys(&work, &site, &o.torch)?;
    let binaries = build(&work, &site, &torch_sys)?;
    let out = o.out.clone().unwrap_or_else(default_bundle_dir);
    pack(&out, &binaries, &s.assets, &o.torch, &torch_sys)?;
    let mb = dir_bytes(&out)? as f64 / (1024.0 * 1024.0);
    if mb > o.max_mb as f64 {
        return Err(format!(
            "gpu-bundle: {} holds {mb:.1} MiB, over --max-mb {}",
            out.display(),
            o.max_mb
        ));
    }
    println!(
        "gpu-bundle: {} ({mb:.1} MiB, built in {:.0}s). On the GPU machine, from a copy of that folder:\n    python gpu_check.py --out OUT\n(`cargo xtask gpu-check` runs it here on the CPU first.)",
        out.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `cargo xtask gpu-check`: the bundle's script here (the CPU dry run).
pub fn check(args: &[String]) -> Result<(), String> {
    let (own, rest) = match args.iter().position(|a| a == "--") {
        Some(i) => (&args[..i], &args[i + 1..]),
        None => (args, &[][..]),
    };
    let mut bundle = default_bundle_dir();
    let mut out = paths::workspace_root().join("target").join("gpu-check");
    let mut it = own.iter();
    while let Some(a) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("gpu-check: {a} needs a value"))?;
        match a.as_str() {
            "--bundle" => bundle = PathBuf::from(value),
            "--out" => out = PathBuf::from(value),
            other => {
                return Err(format!(
                    "gpu-check: unknown option `{other}` (known: --bundle DIR, --out DIR, -- ARGS for gpu_check.py)"
                ));
            }
        }
    }
    let manifest = std::fs::read_to_string(bundle.join("MANIFEST.json")).map_err(|e| {
        format!(
            "gpu-check: {}/MANIFEST.json: {e}; run `cargo xtask gpu-bundle` first",
            bundle.display()
        )
    })?;
    let manifest = Json::parse(&manifest)
        .map_err(|e| format!("gpu-check: {}/MANIFEST.json: {e}", bundle.display()))?;
    let torch = manifest
        .get("torch")
        .and_then(Json::as_str)
        .ok_or("gpu-check: MANIFEST.json has no `torch`")?;
    let s = setup::run(&setup::Options::default())?;
    let lib = paths::cache_dir()?
        .join("gpu-bundle")
        .join(format!("torch-{torch}"))
        .join("site/torch/lib");
    if !lib.join("libtorch_cpu.so").is_file() {
        return Err(format!(
            "gpu-check: {} is missing: run `cargo xtask gpu-bundle --torch {torch}` on this machine first",
            lib.display()
        ));
    }
    let mut c = Command::new(&s.python);
    c.arg(bundle.join("gpu_check.py"))
        .arg("--out")
        .arg(&out)
        .arg("--torch-lib")
        .arg(&lib)
        .args(rest);
    cmd::status(&mut c, "gpu-check (the CPU dry run)")
}

/// The wheel's libtorch in `work/site/torch` (and `work/site/nvidia`, the headers), once.
fn fetch_libtorch(python: &Path, work: &Path, version: &str) -> Result<PathBuf, String> {
    let site = work.join("site");
    let torch = site.join("torch");
    if !torch.join("lib/libtorch_cpu.so").is_file() {
        let wheels = work.join("wheel");
        std::fs::create_dir_all(&wheels).map_err(|e| format!("{}: {e}", wheels.display()))?;
        let mut pip = Command::new(python);
        pip.args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
            .arg(format!("torch=={version}"))
            .arg("-d")
            .arg(&wheels);
        cmd::status(&mut pip, &format!("downloading the torch {version} wheel"))?;
        let mut unzip = Command::new(python);
        unzip
            .arg("-c")
            .arg(
                "import sys, zipfile, glob\n\
                 w = sorted(glob.glob(sys.argv[1] + '/torch-*.whl'))[-1]\n\
                 z = zipfile.ZipFile(w)\n\
                 keep = ('torch/lib/', 'torch/include/', 'torch/version.py')\n\
                 z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith(keep)])\n",
            )
            .arg(&wheels)
            .arg(&site);
        cmd::status(&mut unzip, "unpacking libtorch from the wheel")?;
    }
    let version_py = std::fs::read_to_string(torch.join("version.py"))
        .map_err(|e| format!("{}/version.py: {e}", torch.display()))?;
    let cuda = py_string(&version_py, "cuda").ok_or_else(|| {
        format!("the torch {version} wheel is not a CUDA build (its version.py names no cuda)")
    })?;
    let major = cuda.split('.').next().unwrap_or_default();
    // The CUDA / NCCL headers: the virtualenv's nvidia wheels, of the same CUDA major.
    let venv_site = python
        .parent()
        .and_then(Path::parent)
        .ok_or("the virtualenv's python has no parent folder")?
        .join("lib");
    let nvidia = std::fs::read_dir(&venv_site)
        .map_err(|e| format!("{}: {e}", venv_site.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("site-packages/nvidia"))
        .find(|p| p.is_dir())
        .ok_or_else(|| format!("no site-packages/nvidia under {}", venv_site.display()))?;
    if !nvidia.join(format!("cu{major}/include")).is_dir() {
        return Err(format!(
            "torch {version} is built for CUDA {cuda}, but {} has no cu{major} headers",
            nvidia.display()
        ));
    }
    let link = site.join("nvidia");
    if !link.exists() {
        std::os::unix::fs::symlink(&nvidia, &link)
            .map_err(|e| format!("linking {}: {e}", link.display()))?;
    }
    Ok(site)
}

/// `name = 'value'` of a Python file.
fn py_string(text: &str, name: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        let k = k.split(':').next()?.trim();
        (k == name)
            .then(|| v.trim().trim_matches(['\'', '"']).to_string())
            .filter(|v| !v.is_empty() && v != "None")
    })
}

/// The torch-sys version Cargo.lock pins.
fn locked_torch_sys() -> Result<String, String> {
    let lock = std::fs::read_to_string(paths::workspace_root().join("Cargo.lock"))
        .map_err(|e| format!("Cargo.lock: {e}"))?;
    let mut lines = lock.lines();
    while let Some(l) = lines.next() {
        if l == "name = \"torch-sys\""
            && let Some(v) = lines.next().and_then(|v| v.strip_prefix("version = \""))
        {
            return Ok(v.trim_end_matches('"').to_string());
        }
    }
    Err("Cargo.lock pins no torch-sys".into())
}

/// torch-sys's sources from Cargo's registry.
fn registry_torch_sys(version: &str) -> Result<PathBuf, String> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .ok_or("neither CARGO_HOME nor HOME is set")?;
    let src = home.join("registry/src");
    std::fs::read_dir(&src)
        .map_err(|e| format!("{}: {e}", src.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join(format!("torch-sys-{version}")))
        .find(|p| p.join("libtch/torch_api_generated.cpp").is_file())
        .ok_or_else(|| {
            format!(
                "torch-sys {version}'s sources are not under {} (a `cargo fetch` brings them)",
                src.display()
            )
        })
}

/// The copy of torch-sys whose C++ compiles against `site`'s headers.
fn patched_torch_sys(work: &Path, site: &Path, torch: &str) -> Result<PathBuf, String> {
    let version = locked_torch_sys()?;
    let dst = work.join(format!("torch-sys-{version}"));
    let done = dst.join("STUBBED.txt");
    if done.is_file() {
        return Ok(dst);
    }
    let _ = std::fs::remove_dir_all(&dst);
    let mut cp = Command::new("cp");
    cp.arg("-a").arg(registry_torch_sys(&version)?).arg(&dst);
    cmd::status(&mut cp, "copying torch-sys")?;
    let generated = dst.join("libtch/torch_api_generated.cpp");
    let include = site.join("torch/include");
    let mut stubbed = Vec::new();
    for round in 0..4 {
        let mut gxx = Command::new("g++");
        gxx.args(["-std=c++17", "-fsyntax-only", "-fmax-errors=0", "-w"])
            .arg("-D_GLIBCXX_USE_CXX11_ABI=1")
            .arg("-I")
            .arg(&include)
            .arg("-I")
            .arg(include.join("torch/csrc/api/include"))
            .arg("-I")
            .arg(dst.join("libtch"))
            .arg(&generated);
        let shown = cmd::display(&gxx);
        let out = gxx
            .output()
            .map_err(|e| format!("could not start `{shown}`: {e}"))?;
        if out.status.success() {
            break;
        }
        let errors = String::from_utf8_lossy(&out.stderr);
        let lines = error_lines(&errors, "torch_api_generated.cpp");
        let text = std::fs::read_to_string(&generated)
            .map_err(|e| format!("{}: {e}", generated.display()))?;
        let (fixed, names) = stub_functions(&text, &lines, torch);
        if names.is_empty() || round == 3 {
            let first: Vec<&str> = errors
                .lines()
                .filter(|l| l.contains("error:"))
                .take(5)
                .collect();
            return Err(format!(
                "torch-sys's C++ does not compile against torch {torch}'s headers, and not in a generated op:\n{}",
                first.join("\n")
            ));
        }
        std::fs::write(&generated, fixed).map_err(|e| format!("{}: {e}", generated.display()))?;
        stubbed.extend(names);
    }
    stubbed.sort();
    stubbed.dedup();
    println!(
        "gpu-bundle: {} of tch's generated ops are not in libtorch {torch}, stubbed: {}",
        stubbed.len(),
        stubbed.join(", ")
    );
    std::fs::write(&done, stubbed.join("\n") + "\n")
        .map_err(|e| format!("{}: {e}", done.display()))?;
    Ok(dst)
}

/// The line numbers (1-based) of `file`'s errors in g++'s output.
fn error_lines(stderr: &str, file: &str) -> Vec<usize> {
    stderr
        .lines()
        .filter(|l| l.contains(": error:"))
        .filter_map(|l| {
            let at = l.find(file)? + file.len();
            l[at..].strip_prefix(':')?.split(':').next()?.parse().ok()
        })
        .collect()
}

/// `source` with the `PROTECT(...)` body of every generated function holding one of `lines`
/// replaced by a throw libtorch's error handler turns into tch's error; the functions'
/// names.
fn stub_functions(source: &str, lines: &[usize], torch: &str) -> (String, Vec<String>) {
    let mut text: Vec<String> = source.lines().map(str::to_string).collect();
    let mut names = Vec::new();
    // Bottom up, so that a replaced body does not move the lines of the errors above it.
    let mut lines = lines.to_vec();
    lines.sort_unstable_by(|a, b| b.cmp(a));
    lines.dedup();
    for line in lines {
        let i = line.saturating_sub(1).min(text.len().saturating_sub(1));
        // The function's first line: at column 0, naming an `atg_` function.
        let Some(start) = (0..=i).rev().find(|&k| {
            let l = &text[k];
            !l.starts_with(' ') && l.contains(" atg_") && l.trim_end().ends_with('{')
        }) else {
            continue;
        };
        let name = text[start]
            .split(" atg_")
            .nth(1)
            .and_then(|r| r.split('(').next())
            .map(|n| format!("atg_{n}"))
            .unwrap_or_default();
        let Some(open) = (start..text.len()).find(|&k| text[k].trim() == "PROTECT(") else {
            continue;
        };
        let Some(close) = (open..text.len()).find(|&k| text[k] == "  )") else {
            continue;
        };
        if names.contains(&name) {
            continue;
        }
        let stub = format!(
            "    throw std::runtime_error(\"{name}: this op is not in libtorch {torch} (stubbed by cargo xtask gpu-bundle)\");"
        );
        text.splice(open + 1..close, [stub]);
        names.push(name);
    }
    names.reverse();
    (text.join("\n") + "\n", names)
}

/// A copy of the working tree built in release against `site`'s libtorch: the stripped
/// binaries.
fn build(work: &Path, site: &Path, torch_sys: &Path) -> Result<Vec<PathBuf>, String> {
    let src = work.join("src");
    // Afresh each time (a file deleted from the checkout must not linger); the copied
    // modification times keep the build folder's fingerprints valid.
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(&src).map_err(|e| format!("{}: {e}", src.display()))?;
    // Tracked and untracked (not ignored) files, their modification times kept so that an
    // unchanged crate is not rebuilt.
    let root = paths::workspace_root();
    let mut sh = Command::new("sh");
    sh.arg("-c")
        .arg(
            "git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -xpf - -C \"$1\"",
        )
        .arg("sh")
        .arg(&src)
        .current_dir(&root);
    cmd::status(&mut sh, "copying the working tree")?;
    let target = work.join("target");
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(&src)
        .args([
            "build",
            "--release",
            "-p",
            "tchtrain-examples",
            "--features",
            "tchtrain/cuda",
        ])
        .args(BINARIES.iter().flat_map(|b| ["--bin", b]))
        .arg("--config")
        .arg(format!(
            "patch.crates-io.torch-sys.path={:?}",
            torch_sys.display().to_string()
        ))
        .args(["--config", "profile.release.strip=\"symbols\""])
        .args(["--config", "profile.release.debug=0"])
        .env("CARGO_TARGET_DIR", &target)
        .env("LIBTORCH", site.join("torch"))
        .env("LIBTORCH_BYPASS_VERSION_CHECK", "1")
        .env_remove("LIBTORCH_USE_PYTORCH");
    cmd::status(&mut c, "building the bundle's binaries")?;
    Ok(BINARIES
        .iter()
        .map(|b| target.join("release").join(b))
        .collect())
}

/// The newest `PREFIX_x.y.z` symbol version `readelf` lists for `binary`.
fn newest_symbol_version(dynsym: &str, prefix: &str) -> Option<String> {
    dynsym
        .split(|c: char| c.is_whitespace() || c == '@' || c == '(' || c == ')')
        .filter_map(|w| w.strip_prefix(prefix))
        .filter_map(|v| {
            let parts: Option<Vec<u32>> = v.split('.').map(|p| p.parse().ok()).collect();
            parts.map(|p| (p, v.to_string()))
        })
        .max()
        .map(|(_, v)| format!("{prefix}{v}"))
}

/// Writes the bundle folder.
fn pack(
    out: &Path,
    binaries: &[PathBuf],
    assets: &Path,
    torch: &str,
    torch_sys: &Path,
) -> Result<(), String> {
    let _ = std::fs::remove_dir_all(out);
    let root = paths::workspace_root();
    let copy = |from: &Path, to: &Path| -> Result<(), String> {
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        std::fs::copy(from, to)
            .map(|_| ())
            .map_err(|e| format!("copying {} to {}: {e}", from.display(), to.display()))
    };
    let mut bins = Vec::new();
    for b in binaries {
        let name = b.file_name().unwrap_or_default();
        let to = out.join("bin").join(name);
        copy(b, &to)?;
        let needed = cmd::output(Command::new("readelf").arg("-d").arg(&to), "readelf -d")?;
        let needed: Vec<Json> = needed
            .lines()
            .filter(|l| l.contains("(NEEDED)"))
            .filter_map(|l| {
                Some(Json::Str(
                    l.split('[').nth(1)?.trim_end_matches(']').to_string(),
                ))
            })
            .collect();
        let dynsym = cmd::output(
            Command::new("readelf").args(["--dyn-syms", "-W"]).arg(&to),
            "readelf --dyn-syms",
        )?;
        let bytes = std::fs::metadata(&to).map(|m| m.len()).unwrap_or(0);
        bins.push((
            name.to_string_lossy().into_owned(),
            Json::Obj(BTreeMap::from([
                ("bytes".into(), Json::Num(bytes as f64)),
                ("needed".into(), Json::Arr(needed)),
                (
                    "glibc".into(),
                    newest_symbol_version(&dynsym, "GLIBC_").map_or(Json::Null, Json::Str),
                ),
                (
                    "glibcxx".into(),
                    newest_symbol_version(&dynsym, "GLIBCXX_").map_or(Json::Null, Json::Str),
                ),
            ])),
        ));
    }
    for f in ["gpu_check.py", "zero3_offload.json"] {
        copy(&root.join("scripts/gpu").join(f), &out.join(f))?;
    }
    copy(
        &assets.join("text/hamlet.txt"),
        &out.join("data/hamlet.txt"),
    )?;
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        copy(
            &assets.join("smollm2-135m").join(f),
            &out.join("data/smollm2").join(f),
        )?;
    }
    let stubbed: Vec<Json> = std::fs::read_to_string(torch_sys.join("STUBBED.txt"))
        .unwrap_or_default()
        .lines()
        .map(|l| Json::Str(l.to_string()))
        .collect();
    let rev = cmd::output(
        Command::new("git")
            .args(["rev-parse", "--short", "HEAD"])
            .current_dir(&root),
        "git rev-parse",
    )
    .unwrap_or_default();
    let manifest = Json::Obj(BTreeMap::from([
        ("torch".into(), Json::Str(torch.into())),
        ("commit".into(), Json::Str(rev.trim().into())),
        ("binaries".into(), Json::Obj(bins.into_iter().collect())),
        ("stubbed_ops".into(), Json::Arr(stubbed)),
    ]));
    std::fs::write(out.join("MANIFEST.json"), manifest.pretty() + "\n")
        .map_err(|e| format!("{}/MANIFEST.json: {e}", out.display()))?;
    std::fs::write(
        out.join("README.txt"),
        format!(
            "tchtrain's device check, built against torch {torch} (CUDA, the GPU machine's).\n\
             Run from a copy of this folder, with the Python that has torch {torch} and transformers:\n\n    \
             python gpu_check.py --out OUT\n\n\
             It prints a table last and writes OUT/check.json and OUT/table.md (see gpu_check.py's\n\
             docstring; --minutes, --steps and --regimes adjust it).\n"
        ),
    )
    .map_err(|e| format!("{}/README.txt: {e}", out.display()))
}

/// Bytes under `dir`.
fn dir_bytes(dir: &Path) -> Result<u64, String> {
    let mut total = 0;
    for e in std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let e = e.map_err(|e| format!("{}: {e}", dir.display()))?;
        let m = e
            .metadata()
            .map_err(|err| format!("{}: {err}", e.path().display()))?;
        total += if m.is_dir() {
            dir_bytes(&e.path())?
        } else {
            m.len()
        };
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let o = parse(&args(&[])).unwrap();
        assert_eq!((o.torch.as_str(), o.max_mb, o.out), ("2.11.0", 56, None));
        let o = parse(&args(&[
            "--torch", "2.12.1", "--max-mb", "60", "--out", "b",
        ]))
        .unwrap();
        assert_eq!((o.torch.as_str(), o.max_mb), ("2.12.1", 60));
        assert!(
            parse(&args(&["--torch", "latest"]))
                .unwrap_err()
                .contains("2.11.0")
        );
        assert!(
            parse(&args(&["--max-mb"]))
                .unwrap_err()
                .contains("needs a value")
        );
        assert!(
            parse(&args(&["--gpu"]))
                .unwrap_err()
                .contains("unknown option")
        );
    }

    #[test]
    fn stubs_the_functions_g_plus_plus_rejects() {
        let source = "\
#include \"torch_api.h\"

void atg_abs(tensor *out__, tensor self) {
  PROTECT(
    auto outputs__ = torch::abs(*self);
    out__[0] = new torch::Tensor(outputs__);
  )
}

void atg__philox_key_split(tensor *out__, tensor key, int64_t num_splits) {
  PROTECT(
    auto outputs__ = torch::_philox_key_split(*key, num_splits);
    out__[0] = new torch::Tensor(outputs__);
  )
}

int64_t atg__new_op_count(tensor self) {
  PROTECT(
    return torch::_new_op_count(*self);
  )
  return 0;
}

void atg_neg(tensor *out__, tensor self) {
  PROTECT(
    auto outputs__ = torch::neg(*self);
    out__[0] = new torch::Tensor(outputs__);
  )
}
";
        let stderr = "\
/x/libtch/torch_api_generated.cpp:12:29: error: '_philox_key_split' is not a member of 'torch'
/x/libtch/torch_api_generated.cpp:19:12: error: '_new_op_count' is not a member of 'torch'
/x/libtch/torch_api_generated.cpp:19:12: note: suggested alternative
/x/libtch/torch_api_generated.cpp:20:1: error: again in the same function
";
        let lines = error_lines(stderr, "torch_api_generated.cpp");
        assert_eq!(lines, [12, 19, 20]);
        let (fixed, names) = stub_functions(source, &lines, "2.11.0");
        assert_eq!(names, ["atg__philox_key_split", "atg__new_op_count"]);
        assert!(fixed.contains("torch::abs(*self)"), "untouched: {fixed}");
        assert!(
            fixed.contains("torch::neg(*self)"),
            "untouched below: {fixed}"
        );
        assert!(!fixed.contains("_philox_key_split(*key"));
        assert!(!fixed.contains("torch::_new_op_count"));
        assert!(fixed.contains(
            "throw std::runtime_error(\"atg__new_op_count: this op is not in libtorch 2.11.0 (stubbed by cargo xtask gpu-bundle)\");\n  )\n  return 0;"
        ));
    }

    #[test]
    fn reads_versions() {
        let v = "__version__ = '2.11.0+cu130'\ncuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n";
        assert_eq!(py_string(v, "cuda").as_deref(), Some("13.0"));
        assert_eq!(py_string(v, "hip"), None);
        let syms = "  1: 0 FUNC GLOBAL DEFAULT UND memcpy@GLIBC_2.14 (2)\n  2: 0 FUNC GLOBAL DEFAULT UND x@GLIBC_2.2.5 (3)\n  3: 0 FUNC GLOBAL DEFAULT UND y@GLIBCXX_3.4.30 (4)\n  4: 0 FUNC GLOBAL DEFAULT UND z@GLIBCXX_3.4.9 (5)\n";
        assert_eq!(
            newest_symbol_version(syms, "GLIBC_").as_deref(),
            Some("GLIBC_2.14")
        );
        assert_eq!(
            newest_symbol_version(syms, "GLIBCXX_").as_deref(),
            Some("GLIBCXX_3.4.30")
        );
    }
}

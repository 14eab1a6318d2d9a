//! `cargo xtask setup`: everything a fresh machine needs, idempotent and safe to rerun.
//!
//! 1. A virtualenv in the per-user cache (`venv-torch-2.13.0`) with `xtask/requirements.txt`
//!    installed, then `requirements-nodeps.txt` without dependency resolution; a stamp holding
//!    a hash of the two files marks it complete, so an interrupted
//!    install is simply resumed on the next run. uv installs them (bootstrapped into the
//!    virtualenv by pip; pip itself where uv cannot be used).
//! 2. `.cargo/libtorch.toml` (ignored by git, included by `.cargo/config.toml`) with
//!    `LIBTORCH` pointing at the venv's torch, so plain `cargo build` / `cargo test` work.
//!    Binaries get an rpath and a real `libtorch_cuda` link from `tchtrain-build`.
//! 3. Offline assets and reference values through `scripts/setup_assets.py`, into the
//!    per-user cache, linked from `<workspace>/assets` (`cargo xtask test` makes them while
//!    cargo builds the tests, and builds the dependencies that need no libtorch while pip
//!    installs: [`WarmBuild`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::cmd;
use crate::paths::{self, TORCH_VERSION};

/// Command-line options of `setup`.
#[derive(Debug, Default)]
pub struct Options {
    verify: bool,
    libtorch: Option<PathBuf>,
    /// While pip installs a new virtualenv, build the dependencies that need no libtorch
    /// ([`WarmBuild`]); `cargo xtask test` asks for it.
    warm_build: bool,
}

impl Options {
    /// The defaults with the warm-up build during pip ([`WarmBuild`]).
    pub fn with_warm_build() -> Self {
        Self {
            warm_build: true,
            ..Self::default()
        }
    }
}

impl Options {
    /// Parses `setup`'s arguments.
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let mut o = Options::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--verify" => o.verify = true,
                "--libtorch" => {
                    let dir = it.next().ok_or("--libtorch needs a folder argument")?;
                    o.libtorch = Some(PathBuf::from(dir));
                }
                other => {
                    return Err(format!(
                        "setup: unknown option `{other}` (known: --verify, --libtorch DIR)"
                    ));
                }
            }
        }
        Ok(o)
    }
}

/// What setup produced, for the commands that run after it.
#[derive(Debug)]
pub struct Setup {
    /// The libtorch folder cargo builds against.
    pub libtorch: PathBuf,
    /// The virtualenv's python.
    pub python: PathBuf,
    /// The assets folder.
    pub assets: PathBuf,
    /// `LIBTORCH` to hand to child cargo processes: set when this process inherited a
    /// stale value from the previous `.cargo/libtorch.toml`; `None` when the user exported
    /// their own `LIBTORCH` (which then wins) or none was inherited.
    pub child_libtorch: Option<PathBuf>,
}

/// Runs every setup step.
pub fn run(o: &Options) -> Result<Setup, String> {
    let (setup, references, warm) = run_deferring_references(o)?;
    if let Some(warm) = warm {
        warm.finish()?;
    }
    references.generate()?;
    println!("setup: done");
    Ok(setup)
}

/// The offline assets and the reference values `scripts/setup_assets.py` makes (or finds up
/// to date), as a step a caller may run beside other work: `cargo xtask test` runs it on a
/// thread of its own while cargo builds the tests, which need only libtorch (on a fresh
/// machine the assets take ~2 min and the 44 scripts ~15 min of 2 cores, the build ~25).
#[derive(Debug, Clone)]
pub struct References {
    root: PathBuf,
    python: PathBuf,
    assets: PathBuf,
    verify: bool,
}

impl References {
    /// Makes the assets and reference values that are missing or stale.
    pub fn generate(&self) -> Result<(), String> {
        let t0 = Instant::now();
        let mut c = Command::new(&self.python);
        c.arg(self.root.join("scripts").join("setup_assets.py"))
            .arg("--out")
            .arg(&self.assets)
            // Its own torch work (the assets) shares the cores with the build too.
            .env("OMP_WAIT_POLICY", crate::test::OMP_WAIT_POLICY);
        if self.verify {
            c.arg("--verify");
        }
        cmd::status(&mut c, "making the offline assets and reference values")?;
        println!(
            "setup: offline assets and reference values ready in {:.1}s",
            t0.elapsed().as_secs_f64()
        );
        Ok(())
    }
}

/// `cargo build --workspace --tests --keep-going` without libtorch, started while pip
/// installs a new virtualenv (a fresh machine's ~6 min, mostly downloads): every dependency
/// that does not need libtorch (~1,200 of the build's ~2,200 CPU-seconds) compiles meanwhile,
/// into the folder the test build uses, with the same profile and the same dependency
/// features (the test build's `cuda` features change only this workspace's crates).
/// torch-sys and what depends on it fail here (`LIBTORCH` names no folder) and are built by
/// the test build; the output goes to a log, and the exit status means nothing.
#[derive(Debug)]
pub struct WarmBuild {
    child: std::process::Child,
    log: PathBuf,
    started: Instant,
}

impl WarmBuild {
    fn start(cache: &Path) -> Result<Self, String> {
        let log = cache.join("warm-build.log");
        let file = std::fs::File::create(&log)
            .map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let err = file
            .try_clone()
            .map_err(|e| format!("cannot open {}: {e}", log.display()))?;
        let mut c = cmd::cargo();
        c.args(["build", "--workspace", "--tests", "--keep-going"])
            // A folder that does not exist: a `.cargo/libtorch.toml` of an earlier setup
            // must not point torch-sys at the torch pip is replacing.
            .env(
                "LIBTORCH",
                cache.join("no-libtorch-during-the-warm-up-build"),
            )
            .stdin(std::process::Stdio::null())
            .stdout(file)
            .stderr(err);
        let shown = cmd::display(&c);
        let child = c
            .spawn()
            .map_err(|e| format!("could not start `{shown}`: {e}"))?;
        println!(
            "setup: building the dependencies that need no libtorch while pip installs ({shown}, log {})",
            log.display()
        );
        Ok(Self {
            child,
            log,
            started: Instant::now(),
        })
    }

    /// Waits for it (the test build would wait for cargo's lock on the build folder anyway).
    pub fn finish(mut self) -> Result<(), String> {
        self.child
            .wait()
            .map_err(|e| format!("waiting for the warm-up build: {e}"))?;
        println!(
            "setup: warm-up build done after {:.1}s (its log: {})",
            self.started.elapsed().as_secs_f64(),
            self.log.display()
        );
        Ok(())
    }
}

/// Every setup step but the assets and reference values, which come back as a step to
/// run; with [`Options::warm_build`], the warm-up build when pip had to install.
pub fn run_deferring_references(
    o: &Options,
) -> Result<(Setup, References, Option<WarmBuild>), String> {
    let t0 = Instant::now();
    let root = paths::workspace_root();
    let cache = paths::cache_dir()?;
    std::fs::create_dir_all(&cache)
        .map_err(|e| format!("cannot create cache folder {}: {e}", cache.display()))?;
    println!("setup: cache folder {}", cache.display());

    let venv = paths::venv_dir(&cache);
    let warm = if o.warm_build && !venv_up_to_date(&root, &venv)? {
        Some(WarmBuild::start(&cache)?)
    } else {
        None
    };
    ensure_venv(&root, &venv)?;
    let python = paths::venv_python(&venv);

    let libtorch = match &o.libtorch {
        Some(dir) => check_libtorch_dir(dir)?,
        None => venv_torch_dir(&python)?,
    };
    let previous = write_cargo_config(&root, &libtorch, &python)?;
    // cargo injected LIBTORCH from the previous file into this process: hand children the
    // new one. A LIBTORCH the user exported (different from the file) is left alone.
    let child_libtorch = match std::env::var_os("LIBTORCH") {
        Some(v) if Some(PathBuf::from(&v)) != previous => {
            println!(
                "setup: note: LIBTORCH={} from your environment overrides the file",
                v.to_string_lossy()
            );
            None
        }
        _ => Some(libtorch.clone()),
    };

    let assets = assets_dir(&root, &cache)?;
    println!(
        "setup: virtualenv done in {:.1}s; offline assets and reference values in {}",
        t0.elapsed().as_secs_f64(),
        assets.display()
    );
    let references = References {
        root,
        python: python.clone(),
        assets: assets.clone(),
        verify: o.verify,
    };
    Ok((
        Setup {
            libtorch,
            python,
            assets,
            child_libtorch,
        },
        references,
        warm,
    ))
}

/// 64-bit FNV-1a: a stamp of the requirements file, not a security measure.
fn fnv1a(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// `xtask/requirements.txt` and the stamp of it (and of `requirements-nodeps.txt`) a
/// complete install leaves in the venv.
fn requirements_stamp(root: &Path, venv: &Path) -> Result<(PathBuf, String, PathBuf), String> {
    let req_path = root.join("xtask").join("requirements.txt");
    let mut req =
        std::fs::read(&req_path).map_err(|e| format!("cannot read {}: {e}", req_path.display()))?;
    let nodeps = nodeps_requirements(root);
    req.extend(
        std::fs::read(&nodeps).map_err(|e| format!("cannot read {}: {e}", nodeps.display()))?,
    );
    Ok((req_path, fnv1a(&req), venv.join(".tchtrain-requirements")))
}

/// `xtask/requirements-nodeps.txt`: installed after the requirements without dependency
/// resolution (see the file).
fn nodeps_requirements(root: &Path) -> PathBuf {
    root.join("xtask").join("requirements-nodeps.txt")
}

/// Whether the virtualenv exists with every requirement installed.
fn venv_up_to_date(root: &Path, venv: &Path) -> Result<bool, String> {
    let (_, stamp, stamp_path) = requirements_stamp(root, venv)?;
    Ok(paths::venv_python(venv).exists()
        && std::fs::read_to_string(&stamp_path).ok().as_deref() == Some(&stamp))
}

fn ensure_venv(root: &Path, venv: &Path) -> Result<(), String> {
    let (req_path, stamp, stamp_path) = requirements_stamp(root, venv)?;
    let python = paths::venv_python(venv);
    if venv_up_to_date(root, venv)? {
        println!("setup: virtualenv {} is up to date", venv.display());
        return Ok(());
    }
    let t0 = Instant::now();
    if !python.exists() {
        let base = std::env::var("TCHTRAIN_PYTHON").unwrap_or_else(|_| "python3".into());
        let version = cmd::output(
            Command::new(&base).args(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"]),
            "checking the base python (set TCHTRAIN_PYTHON to a python >= 3.10)",
        )?;
        let (major, minor) = version
            .trim()
            .split_once('.')
            .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)))
            .ok_or_else(|| format!("cannot parse python version `{}`", version.trim()))?;
        if (major, minor) < (3, 10) {
            return Err(format!(
                "{base} is python {major}.{minor}; transformers 5.23 needs >= 3.10 \
                 (set TCHTRAIN_PYTHON to a newer python)"
            ));
        }
        println!(
            "setup: creating virtualenv {} with {base} ({major}.{minor})",
            venv.display()
        );
        cmd::status(
            Command::new(&base).arg("-m").arg("venv").arg(venv),
            "creating the virtualenv",
        )?;
    }
    println!(
        "setup: installing torch=={TORCH_VERSION} and reference packages from {} (first time: ~2-10 min, ~5 GB)",
        req_path.display()
    );
    let nodeps = nodeps_requirements(root);
    let installed = match bootstrap_uv(&python) {
        Ok(()) => install_with_uv(&python, &req_path, false)
            .and_then(|()| install_with_uv(&python, &nodeps, true)),
        Err(e) => Err(e),
    };
    if let Err(e) = installed {
        println!("setup: {e}; installing with pip instead");
        install_with_pip(&python, &req_path, false)?;
        install_with_pip(&python, &nodeps, true)?;
    }
    std::fs::write(&stamp_path, &stamp)
        .map_err(|e| format!("cannot write {}: {e}", stamp_path.display()))?;
    println!(
        "setup: virtualenv ready in {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The uv release that installs the requirements (into the virtualenv, from PyPI through pip).
const UV_VERSION: &str = "0.13.9";

/// uv in the virtualenv. uv downloads and installs the requirements in parallel where pip
/// works one package at a time: a fresh virtualenv (~5 GB, torch's CUDA libraries included)
/// took 94 s instead of pip's 400-640 s, to the same versions of every package.
fn bootstrap_uv(python: &Path) -> Result<(), String> {
    cmd::status(
        Command::new(python).args([
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--quiet",
            &format!("uv=={UV_VERSION}"),
        ]),
        "installing uv",
    )
}

/// pip's settings from its environment variables, for uv: the certificate the registries
/// are reached through, extra wheel folders, index URLs, the timeout.
fn uv_environment(cmd: &mut Command) {
    for (pip, uv) in [
        ("PIP_CERT", "SSL_CERT_FILE"),
        ("PIP_FIND_LINKS", "UV_FIND_LINKS"),
        ("PIP_INDEX_URL", "UV_INDEX_URL"),
        ("PIP_EXTRA_INDEX_URL", "UV_EXTRA_INDEX_URL"),
        ("PIP_DEFAULT_TIMEOUT", "UV_HTTP_TIMEOUT"),
    ] {
        if let Ok(v) = std::env::var(pip)
            && !v.is_empty()
            && std::env::var_os(uv).is_none()
        {
            cmd.env(uv, v);
        }
    }
}

/// `uv pip install [--no-deps] -r requirements` into the virtualenv, byte-compiled as pip
/// does: where PYTHONDONTWRITEBYTECODE is set (as on the CI machines), Python caches nothing
/// later, and every reference script would compile torch and transformers again (measured:
/// the warm-up build beside them took 1288 s instead of 770 s).
fn install_with_uv(python: &Path, requirements: &Path, no_deps: bool) -> Result<(), String> {
    let mut c = Command::new(python);
    c.args([
        "-m",
        "uv",
        "pip",
        "install",
        "--system-certs",
        "--compile-bytecode",
        "--python",
    ])
    .arg(python);
    if no_deps {
        c.arg("--no-deps");
    }
    c.arg("-r").arg(requirements);
    uv_environment(&mut c);
    cmd::status(&mut c, "installing the Python requirements with uv")
}

/// `pip install [--no-deps] -r requirements` (where uv could not be used).
fn install_with_pip(python: &Path, requirements: &Path, no_deps: bool) -> Result<(), String> {
    let mut c = Command::new(python);
    c.args(["-m", "pip", "install", "--disable-pip-version-check"]);
    if no_deps {
        c.arg("--no-deps");
    }
    c.arg("-r").arg(requirements);
    cmd::status(
        &mut c,
        "installing the Python requirements from PyPI (is PyPI reachable?)",
    )
}

fn venv_torch_dir(python: &Path) -> Result<PathBuf, String> {
    let out = cmd::output(
        Command::new(python).args([
            "-c",
            "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__)",
        ]),
        "locating torch in the virtualenv",
    )?;
    let mut lines = out.lines();
    let dir = PathBuf::from(lines.next().unwrap_or_default().trim());
    let version = lines.next().unwrap_or_default().trim().to_string();
    let base = version.split('+').next().unwrap_or_default();
    if base != TORCH_VERSION {
        return Err(format!(
            "the virtualenv has torch {version}, tch 0.26 needs {TORCH_VERSION}: \
             delete {} and rerun `cargo xtask setup`",
            python
                .parent()
                .and_then(Path::parent)
                .unwrap_or(python)
                .display()
        ));
    }
    check_libtorch_dir(&dir)
}

fn check_libtorch_dir(dir: &Path) -> Result<PathBuf, String> {
    let dir = dir
        .canonicalize()
        .map_err(|e| format!("libtorch folder {}: {e}", dir.display()))?;
    let lib = dir.join("lib").join("libtorch_cpu.so");
    let include = dir.join("include").join("torch");
    if !lib.exists() || !include.exists() {
        return Err(format!(
            "{} is not a libtorch folder: expected lib/libtorch_cpu.so and include/torch/",
            dir.display()
        ));
    }
    if let Ok(v) = std::fs::read_to_string(dir.join("build-version"))
        && v.trim().split('+').next() != Some(TORCH_VERSION)
    {
        return Err(format!(
            "{} is libtorch {}, tch 0.26 needs {TORCH_VERSION}",
            dir.display(),
            v.trim()
        ));
    }
    Ok(dir)
}

fn toml_string(p: &Path) -> String {
    let s = p.display().to_string();
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Writes `.cargo/libtorch.toml`; returns the LIBTORCH the previous file named, if any.
fn write_cargo_config(
    root: &Path,
    libtorch: &Path,
    python: &Path,
) -> Result<Option<PathBuf>, String> {
    let path = root.join(".cargo").join("libtorch.toml");
    let previous = std::fs::read_to_string(&path).ok().and_then(|old| {
        old.lines()
            .find_map(|l| l.strip_prefix("LIBTORCH = "))
            .map(|v| {
                PathBuf::from(
                    v.trim()
                        .trim_matches('"')
                        .replace("\\\"", "\"")
                        .replace("\\\\", "\\"),
                )
            })
    });
    let content = format!(
        "# Written by `cargo xtask setup`: machine-specific, ignored by git.\n\
         # An exported LIBTORCH overrides this (cargo's [env] does not replace set variables).\n\
         [env]\n\
         LIBTORCH = {}\n\
         TCHTRAIN_VENV_PYTHON = {}\n",
        toml_string(libtorch),
        toml_string(python),
    );
    if std::fs::read_to_string(&path).ok().as_deref() == Some(content.as_str()) {
        println!(
            "setup: {} is up to date (LIBTORCH={})",
            path.display(),
            libtorch.display()
        );
        return Ok(previous);
    }
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, &content)
        .and_then(|_| std::fs::rename(&tmp, &path))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!(
        "setup: wrote {} (LIBTORCH={})",
        path.display(),
        libtorch.display()
    );
    Ok(previous)
}

/// The assets folder: a real `<workspace>/assets` folder is used as is; otherwise the
/// per-user cache's, which `<workspace>/assets` links to.
fn assets_dir(root: &Path, cache: &Path) -> Result<PathBuf, String> {
    let link = root.join("assets");
    let is_real_dir = link.symlink_metadata().map(|m| m.is_dir()).unwrap_or(false);
    if is_real_dir {
        return Ok(link);
    }
    let out = paths::assets_cache(cache);
    std::fs::create_dir_all(&out)
        .map_err(|e| format!("cannot create the assets folder {}: {e}", out.display()))?;
    let current = std::fs::read_link(&link).ok();
    if current.as_deref() != Some(out.as_path()) {
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&out, &link)
            .map_err(|e| format!("cannot link {} -> {}: {e}", link.display(), out.display()))?;
    }
    Ok(out)
}

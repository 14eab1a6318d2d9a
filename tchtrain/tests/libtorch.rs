//! libtorch links, loads through the rpath, keeps libtorch_cuda, and computes what
//! PyTorch computes: a matmul, tanh, softmax and a backward pass against
//! `scripts/reference/libtorch_smoke.py`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use tch::{Kind, Tensor};

fn assets_dir() -> PathBuf {
    std::env::var_os("TCHTRAIN_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../assets"))
}

fn values(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(t.to_kind(Kind::Double).flatten(0, -1)).expect("1-d double tensor")
}

fn floats(v: &serde_json::Value, key: &str) -> Vec<f64> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("reference has no array `{key}`"))
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

#[test]
fn forward_and_backward_match_pytorch() -> Result<()> {
    let path = assets_dir().join("reference/libtorch_smoke/libtorch_smoke.json");
    let reference: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&path)
            .with_context(|| format!("{} (run `cargo xtask setup`)", path.display()))?,
    )?;
    let x = (Tensor::arange(12, (Kind::Float, tch::Device::Cpu)).reshape([3, 4]) / 10.0 - 0.5)
        .set_requires_grad(true);
    let w = (Tensor::arange(8, (Kind::Float, tch::Device::Cpu)).reshape([4, 2]) / 7.0 - 0.3)
        .set_requires_grad(true);
    let h = x.matmul(&w).tanh();
    let p = h.softmax(-1, Kind::Float);
    let weights = Tensor::arange_start(1, 4, (Kind::Float, tch::Device::Cpu));
    let loss = (p.select(1, 0) * weights).sum(Kind::Float) + h.square().mean(Kind::Float);
    loss.backward();

    // fp32, the same ops on the same tiny tensors (single-threaded kernels) as torch:
    // identical bits.
    let tol = 0.0;
    assert!(max_abs_diff(&values(&h), &floats(&reference, "h")) <= tol);
    assert!((loss.double_value(&[]) - reference["loss"].as_f64().unwrap()).abs() <= tol);
    assert!(max_abs_diff(&values(&x.grad()), &floats(&reference, "x_grad")) <= tol);
    assert!(max_abs_diff(&values(&w.grad()), &floats(&reference, "w_grad")) <= tol);
    Ok(())
}

/// The loaded libtorch_cpu came through the rpath (not LD_LIBRARY_PATH), and when the
/// libtorch folder ships libtorch_cuda it is loaded too (`--as-needed` did not drop it).
#[test]
fn libtorch_loaded_by_rpath_with_cuda_library_kept() -> Result<()> {
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let loaded: Vec<&str> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .collect();
    let cpu = loaded
        .iter()
        .find(|p| p.ends_with("/libtorch_cpu.so"))
        .context("libtorch_cpu.so is not mapped")?;
    let lib_dir = std::path::Path::new(cpu).parent().unwrap();
    let ld_path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    assert!(
        !ld_path
            .split(':')
            .any(|d| std::path::Path::new(d) == lib_dir),
        "test ran with LD_LIBRARY_PATH containing {}: rpath is not being exercised",
        lib_dir.display()
    );
    if lib_dir.join("libtorch_cuda.so").exists() {
        assert!(
            loaded.iter().any(|p| p.ends_with("/libtorch_cuda.so")),
            "libtorch_cuda.so exists in {} but was not loaded",
            lib_dir.display()
        );
    }
    Ok(())
}

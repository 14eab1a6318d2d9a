//! The activation-checkpointing benchmark of `cargo xtask bench --activation-memory`: one
//! process per setting runs SmolLM2-135M (`assets/smollm2-135m`, fp32, training mode) on
//! batches of `--batch` rows of 512 tokens, forward and backward, `--steps` times, with or
//! without `--activation_checkpointing` (every decoder layer), and prints one flat JSON line:
//! `baseline_rss_mb` (`VmRSS` once the model is loaded), `peak_rss_mb` (`VmHWM`),
//! `param_mb` (the parameters, which is also what their gradients take), `activation_mb` =
//! peak - baseline - param_mb (what the forward keeps for the backward, plus the backward's
//! transient buffers), `median_step_ms`. The caching CPU allocator is not installed, so that
//! freed memory goes back to the system and the peak is that of live tensors.
//! `scripts/bench/bench_checkpointing.py` does the same with upstream's
//! `gradient_checkpointing_enable()`. `--use_liger_kernel` computes the loss with Liger's
//! fused linear + cross-entropy (no `[512, 49152]` logits; upstream's Liger kernels need a
//! GPU, so that setting has no Python side).
//!
//! ```sh
//! cargo run --release -p tchtrain-examples --bin bench_checkpointing -- [--activation_checkpointing] [--use_liger_kernel] [--batch N] [--steps N] [--threads N]
//! ```

use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::json;
use tchtrain::models::{
    ActivationCheckpointing, AutoTask, LoadOptions, ModelInputs, from_pretrained_dir,
};
use tchtrain::tch::{self, Device, Kind, Tensor};

const BLOCK: i64 = 512;

fn status_mb(key: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn main() -> Result<()> {
    let (mut checkpointing, mut liger) = (false, false);
    let (mut batch, mut steps, mut threads) = (1i64, 3usize, None);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| -> Result<usize> {
            args.next()
                .and_then(|v| v.parse().ok())
                .filter(|&n: &usize| n > 0)
                .with_context(|| format!("{name} takes a positive whole number"))
        };
        match a.as_str() {
            "--activation_checkpointing" => checkpointing = true,
            "--use_liger_kernel" => liger = true,
            "--batch" => batch = value("--batch")? as i64,
            "--steps" => steps = value("--steps")?,
            "--threads" => threads = Some(value("--threads")? as i32),
            other => bail!(
                "unknown option {other} (known: --activation_checkpointing, --use_liger_kernel, --batch N, --steps N, --threads N)"
            ),
        }
    }
    if let Some(n) = threads {
        tch::set_num_threads(n);
    }
    let dir = std::path::PathBuf::from(
        std::env::var_os("TCHTRAIN_ASSETS")
            .context("TCHTRAIN_ASSETS names the assets folder (`cargo xtask bench` sets it)")?,
    )
    .join("smollm2-135m");
    let mut model = from_pretrained_dir(
        &dir,
        AutoTask::CausalLm,
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model;
    if checkpointing {
        model.activation_checkpointing_enable(ActivationCheckpointing::default())?;
    }
    if liger {
        model.apply_liger_kernel(None)?;
    }
    model.train();
    let param_mb = model
        .var_store()
        .trainable_variables()
        .iter()
        .map(|t| t.numel() as f64 * 4.0)
        .sum::<f64>()
        / (1u64 << 20) as f64;
    tch::manual_seed(0);
    let ids = Tensor::randint(49_152, [batch, BLOCK], (Kind::Int64, Device::Cpu));
    let baseline_rss_mb = status_mb("VmRSS:");
    let mut times = Vec::new();
    for _ in 0..steps {
        let t = Instant::now();
        let inputs = ModelInputs {
            input_ids: Some(&ids),
            labels: Some(&ids),
            ..ModelInputs::default()
        };
        let loss = model.forward(&inputs)?.loss.context("a loss")?;
        loss.backward();
        drop(loss);
        model
            .var_store()
            .trainable_variables()
            .iter_mut()
            .for_each(|v| {
                let mut g = v.grad();
                if g.defined() {
                    let _ = g.zero_();
                }
            });
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    let peak_rss_mb = status_mb("VmHWM:");
    println!(
        "{}",
        json!({
            "impl": "tchtrain",
            "activation_checkpointing": checkpointing,
            "use_liger_kernel": liger,
            "batch": batch,
            "block": BLOCK,
            "baseline_rss_mb": baseline_rss_mb,
            "peak_rss_mb": peak_rss_mb,
            "param_mb": param_mb,
            "activation_mb": peak_rss_mb - baseline_rss_mb - param_mb,
            "median_step_ms": times[times.len() / 2],
            "threads": tch::get_num_threads(),
        })
    );
    Ok(())
}

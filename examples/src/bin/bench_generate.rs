//! Greedy decoding speed of tchtrain's `generate` with the key / value cache on
//! SmolLM2-135M (CPU, fp32), for `cargo xtask bench --generate`.
//!
//! For each batch size (1 and 8): `batch` prompts of 32 tokens, consecutive windows of
//! hamlet.txt tokenized by SmolLM2's tokenizer (no padding), greedy decoding of exactly
//! `--new-tokens` tokens (`max_new_tokens` = `min_new_tokens`, so that an end-of-sequence
//! token cannot stop a row early), the model's own generation config otherwise. One warm-up
//! pass, then `--passes` passes: `median_ms` is the median pass, `min_ms` the fastest, and
//! `tokens_per_s` the new tokens of the median pass (`batch × new tokens` over its time).
//! `tokens` is the new tokens per pass and `padded_len_sum` the sum of every generated id:
//! the xtask checks both sides generated the same tokens.
//!
//! Prints one flat JSON object per measurement, e.g.
//! `{"bench":"generate/greedy_b1","impl":"tchtrain","median_ms":2310.0,...}`;
//! `scripts/bench/bench_generate.py` prints the same lines for transformers' `generate`.
//!
//! ```sh
//! cargo run --release -p tchtrain-examples --bin bench_generate -- [--threads N]
//!     [--passes N] [--new-tokens N] [--batches 1,8]
//! ```
//! Assets come from `$TCHTRAIN_ASSETS` or `<workspace>/assets` (`cargo xtask setup`).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::json;
use tchtrain::models::{
    AutoTask, AutoTokenizer, GenerationConfig, LoadOptions, from_pretrained_dir, generate,
};
use tchtrain::tch::{self, Device, Kind, Tensor};

/// Prompt length in tokens.
const PROMPT_TOKENS: usize = 32;

struct Options {
    threads: Option<i32>,
    passes: usize,
    new_tokens: i64,
    batches: Vec<i64>,
}

impl Options {
    fn parse() -> Result<Self> {
        let mut o = Options {
            threads: None,
            passes: 3,
            new_tokens: 128,
            batches: vec![1, 8],
        };
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            let mut value = || args.next().ok_or_else(|| anyhow!("{a} needs a value"));
            match a.as_str() {
                "--threads" => o.threads = Some(value()?.parse()?),
                "--passes" => o.passes = value()?.parse()?,
                "--new-tokens" => o.new_tokens = value()?.parse()?,
                "--batches" => {
                    o.batches = value()?
                        .split(',')
                        .map(str::parse)
                        .collect::<std::result::Result<_, _>>()?
                }
                other => bail!(
                    "unknown option `{other}` (known: --threads N, --passes N, --new-tokens N, \
                     --batches 1,8)"
                ),
            }
        }
        if o.passes == 0 || o.new_tokens < 1 || o.batches.iter().any(|b| *b < 1) {
            bail!("--passes, --new-tokens and every batch size must be at least 1");
        }
        Ok(o)
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn assets() -> PathBuf {
    std::env::var_os("TCHTRAIN_ASSETS").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../assets"),
        PathBuf::from,
    )
}

fn main() -> Result<()> {
    let o = Options::parse()?;
    if let Some(t) = o.threads {
        tch::set_num_threads(t);
    }
    let threads = tch::get_num_threads();
    let dir = assets().join("smollm2-135m");
    let tokenizer = AutoTokenizer::from_pretrained(&dir)?;
    let text = std::fs::read_to_string(assets().join("text/hamlet.txt"))
        .context("hamlet.txt: run `cargo xtask setup`")?;
    let ids = tokenizer.encode(&text, false)?;
    let mut model = from_pretrained_dir(
        &dir,
        AutoTask::CausalLm,
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model;
    model.eval();
    let mut config = match model.generation_config() {
        Some(json) => GenerationConfig::from_json(json)?,
        None => GenerationConfig::default(),
    };
    config.update(&GenerationConfig {
        max_new_tokens: Some(o.new_tokens),
        min_new_tokens: Some(o.new_tokens),
        do_sample: Some(false),
        ..Default::default()
    });
    for &batch in &o.batches {
        let rows = usize::try_from(batch)?;
        if ids.len() < rows * PROMPT_TOKENS {
            bail!("hamlet.txt is too short for {rows} prompts");
        }
        let prompts =
            Tensor::from_slice(&ids[..rows * PROMPT_TOKENS]).reshape([batch, PROMPT_TOKENS as i64]);
        let mask = Tensor::ones([batch, PROMPT_TOKENS as i64], (Kind::Int64, Device::Cpu));
        let one_pass = || -> Result<(f64, Tensor)> {
            let t0 = Instant::now();
            let out = generate(&*model, &prompts, Some(&mask), &config, None)?;
            Ok((t0.elapsed().as_secs_f64(), out.sequences))
        };
        let (_, sequences) = one_pass()?;
        let new = sequences.narrow(1, PROMPT_TOKENS as i64, o.new_tokens);
        let times = (0..o.passes)
            .map(|_| one_pass().map(|(t, _)| t))
            .collect::<Result<Vec<_>>>()?;
        let pass_s = median(times.clone());
        let tokens = batch * o.new_tokens;
        println!(
            "{}",
            json!({
                "bench": format!("generate/greedy_b{batch}"),
                "impl": "tchtrain",
                "median_ms": pass_s * 1e3,
                "min_ms": times.iter().copied().fold(f64::INFINITY, f64::min) * 1e3,
                "tokens_per_s": tokens as f64 / pass_s,
                "tokens": tokens,
                "padded_len_sum": new.sum(Kind::Int64).int64_value(&[]),
                "threads": threads,
            })
        );
    }
    Ok(())
}

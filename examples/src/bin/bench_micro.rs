//! Micro-benchmarks of tchtrain on CPU, fp32, for `cargo xtask bench --micro`.
//!
//! * Optimizer step time on a ~30M-parameter set (8 × [1920, 1920] weights + 8 × [1920]
//!   biases = 29,506,560 floats, fixed random grads, one param group, weight decay 0.01
//!   where the optimizer has one): AdamW single-tensor (`adamw_torch`), AdamW fused
//!   (`adamw_torch_fused`), SGD with momentum 0.9, Adafactor with the Trainer's settings
//!   (`lr=1e-3, scale_parameter=False, relative_step=False`). Median of `--steps` steps after
//!   `--warmup` steps (`min_ms`: the fastest step).
//! * The optimizers upstream's `optim` names take from packages ([`PACKAGE_OPTIMS`]), each
//!   built as the Trainer builds it (`create_optimizer` from `optim`, `learning_rate=1e-3`,
//!   `optim_target_modules="all-linear"` for GaLore / APOLLO, the eight weights as the
//!   model's linear layers) over one group. Every optimizer row also reports `state_bytes`:
//!   the optimizer's state after the steps (each storage counted once).
//! * Collator throughput: `DataCollatorWithPadding` and `DataCollatorForLanguageModeling`
//!   (mlm, seed 42) on the lines of `hamlet.txt` longer than 20 characters, tokenized with
//!   the MiniLM tokenizer (`input_ids`, `token_type_ids`, `attention_mask`,
//!   `special_tokens_mask`), 32 rows per batch. One pass collates every batch; `median_ms` is
//!   the mean batch time of the median pass of `--passes` (after one warm-up pass), `min_ms`
//!   that of the fastest pass, and `tokens_per_s` counts real (unpadded) tokens over the
//!   median pass.
//!
//! * Dropout in training mode (`torch.nn.functional.dropout`), the shapes of a LoRA step on
//!   SmolLM2-135M (batch 4 × 128 tokens × 576 and × 1536 features), p 0.05 and 0.1: each
//!   step times 20 calls, `median_ms` / `min_ms` per call; `dropout_cached/*` the same while
//!   holding the caching CPU allocator, as the Trainer does (tchtrain only).
//!
//! Prints one flat JSON object per measurement, e.g.
//! `{"bench":"optim/adamw_torch","impl":"tchtrain","median_ms":61.2,"threads":2,...}`;
//! `scripts/bench/bench_micro.py` prints the same lines for PyTorch / transformers.
//!
//! ```sh
//! cargo run --release -p tchtrain-examples --bin bench_micro -- [--threads N] [--steps N]
//!     [--warmup N] [--passes N] [--only optim|collate|dropout]
//! ```
//! Assets come from `$TCHTRAIN_ASSETS` or `<workspace>/assets` (`cargo xtask setup`).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::json;
use tchtrain::collators::{
    DataCollator, DataCollatorForLanguageModeling, DataCollatorWithPadding, Feature,
    LanguageModelingOptions,
};
use tchtrain::models::AutoTokenizer;
use tchtrain::optim::{
    Adafactor, AdafactorConfig, AdamW, AdamWConfig, GroupSpec, Optimizer, OptimizerArgs, Sgd,
    SgdConfig, create_optimizer,
};
use tchtrain::tch::{self, Device, Kind, Tensor};
use tchtrain::training_args::StrOrList;

/// Shape of the benchmark's parameter set: `LAYERS` × ([`WIDTH`, `WIDTH`] + [`WIDTH`]).
const LAYERS: usize = 8;
const WIDTH: i64 = 1920;
/// Rows per collated batch.
const BATCH_ROWS: usize = 32;
/// Lines of hamlet.txt shorter than this (after trimming) are skipped, as the collator
/// reference script does.
const MIN_LINE_CHARS: usize = 20;
const MLM_SEED: u64 = 42;

/// The package-backed `optim` names benchmarked against their packages (LOMO / AdaLomo are
/// left out: their update runs inside a backward pass, not in `step()`).
const PACKAGE_OPTIMS: [&str; 16] = [
    "stable_adamw",
    "grokadamw",
    "schedule_free_adamw",
    "schedule_free_sgd",
    "schedule_free_radam",
    "paged_adamw_32bit",
    "adamw_bnb_8bit",
    "ademamix",
    "ademamix_8bit",
    "lion_8bit",
    "rmsprop_bnb_8bit",
    "galore_adamw",
    "galore_adafactor",
    "apollo_adamw",
    "adamw_torch_8bit",
    "adamw_torch_4bit",
];

struct Options {
    threads: Option<i32>,
    steps: usize,
    warmup: usize,
    passes: usize,
    only: Option<String>,
}

impl Options {
    fn parse() -> Result<Self> {
        let mut o = Options {
            threads: None,
            steps: 10,
            warmup: 2,
            passes: 10,
            only: None,
        };
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            let mut value = || args.next().ok_or_else(|| anyhow!("{a} needs a value"));
            match a.as_str() {
                "--threads" => o.threads = Some(value()?.parse()?),
                "--steps" => o.steps = value()?.parse()?,
                "--warmup" => o.warmup = value()?.parse()?,
                "--passes" => o.passes = value()?.parse()?,
                "--only" => o.only = Some(value()?),
                other => bail!(
                    "unknown option `{other}` (known: --threads N, --steps N, --warmup N, \
                     --passes N, --only optim|collate|dropout)"
                ),
            }
        }
        if o.steps == 0 || o.passes == 0 {
            bail!("--steps and --passes must be at least 1");
        }
        Ok(o)
    }

    fn wants(&self, suite: &str) -> bool {
        self.only.as_deref().is_none_or(|s| s == suite)
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

/// The parameter set with fixed random grads (set through one backward pass).
fn parameter_set() -> Vec<(String, Tensor)> {
    tch::manual_seed(0);
    let opts = (Kind::Float, Device::Cpu);
    let mut named = Vec::new();
    for i in 0..LAYERS {
        let w = Tensor::randn([WIDTH, WIDTH], opts).set_requires_grad(true);
        let b = (Tensor::randn([WIDTH], opts) * 0.02).set_requires_grad(true);
        named.push((format!("layers.{i}.weight"), w));
        named.push((format!("layers.{i}.bias"), b));
    }
    // d/dp sum(p * g) = g: one backward gives every parameter a random grad.
    let mut loss = Tensor::zeros([], opts);
    for (_, p) in &named {
        loss += (p * Tensor::randn_like(p)).sum(Kind::Float);
    }
    loss.backward();
    named
}

/// The bytes of the optimizer's state tensors, each storage counted once.
fn state_bytes(opt: &dyn Optimizer) -> f64 {
    let mut seen = std::collections::BTreeSet::new();
    let mut bytes = 0usize;
    for st in opt.state().iter().flatten() {
        for t in st.tensors.values() {
            if seen.insert(t.data_ptr() as usize) {
                bytes += t.numel() * t.kind().elt_size_in_bytes();
            }
        }
    }
    bytes as f64
}

fn numel(named: &[(String, Tensor)]) -> i64 {
    named.iter().map(|(_, p)| p.numel() as i64).sum()
}

fn bench_optimizer(
    name: &str,
    threads: i32,
    o: &Options,
    make: impl FnOnce(Vec<GroupSpec>) -> Result<Box<dyn Optimizer>>,
) -> Result<()> {
    let named = parameter_set();
    let params = numel(&named);
    let shallow = named
        .iter()
        .map(|(n, p)| (n.clone(), p.shallow_clone()))
        .collect();
    let mut opt = make(vec![GroupSpec::new(shallow)])?;
    for _ in 0..o.warmup {
        opt.step()?;
    }
    let mut times = Vec::with_capacity(o.steps);
    for _ in 0..o.steps {
        let t0 = Instant::now();
        opt.step()?;
        times.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    println!(
        "{}",
        json!({
            "bench": format!("optim/{name}"),
            "impl": "tchtrain",
            "median_ms": median(times.clone()),
            "min_ms": times.iter().copied().fold(f64::INFINITY, f64::min),
            "steps": o.steps,
            "params": params,
            "threads": threads,
            "state_bytes": state_bytes(opt.as_ref()),
        })
    );
    Ok(())
}

fn assets_dir() -> PathBuf {
    match std::env::var_os("TCHTRAIN_ASSETS") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the facade crate lives one level below the workspace root")
            .join("assets"),
    }
}

/// The lines of hamlet.txt longer than [`MIN_LINE_CHARS`], trimmed, in file order.
fn hamlet_lines() -> Result<Vec<String>> {
    let path = assets_dir().join("text").join("hamlet.txt");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading {} (run `cargo xtask setup`)", path.display()))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| l.chars().count() > MIN_LINE_CHARS)
        .map(String::from)
        .collect())
}

fn bench_collator(
    name: &str,
    threads: i32,
    o: &Options,
    batches: &[Vec<Feature>],
    collator: &mut dyn DataCollator,
) -> Result<()> {
    let tokens: usize = batches.iter().flatten().map(|f| f.input_ids.len()).sum();
    let mut checksum = 0i64;
    let mut pass = |collator: &mut dyn DataCollator| -> Result<f64> {
        let t0 = Instant::now();
        for b in batches {
            let batch = collator.collate(b)?;
            checksum += batch.get("input_ids").map_or(0, |t| t.size()[1]);
        }
        Ok(t0.elapsed().as_secs_f64())
    };
    pass(collator)?;
    let mut times = Vec::with_capacity(o.passes);
    for _ in 0..o.passes {
        times.push(pass(collator)?);
    }
    let min_s = times.iter().copied().fold(f64::INFINITY, f64::min);
    let pass_s = median(times);
    println!(
        "{}",
        json!({
            "bench": format!("collate/{name}"),
            "impl": "tchtrain",
            "median_ms": pass_s * 1e3 / batches.len() as f64,
            "min_ms": min_s * 1e3 / batches.len() as f64,
            "tokens_per_s": tokens as f64 / pass_s,
            "batches": batches.len(),
            "rows_per_batch": BATCH_ROWS,
            "tokens": tokens,
            "threads": threads,
            "padded_len_sum": checksum / (o.passes as i64 + 1),
        })
    );
    Ok(())
}

/// Calls per timed dropout step.
const DROPOUT_CALLS: usize = 20;

/// Times `tchtrain_models::dropout` on `shape` at rate `p` (seeded, in training mode);
/// `cached`: while holding the caching CPU allocator, as the Trainer does (a row of
/// tchtrain's only: PyTorch has no such cache on the CPU).
fn bench_dropout(shape: &[i64], p: f64, threads: i32, o: &Options, cached: bool) {
    let _cache = cached.then(tchtrain::trainer::CpuMemoryCache::from_env);
    tch::manual_seed(0);
    let x = Tensor::randn(shape, (Kind::Float, Device::Cpu));
    let mut times = Vec::new();
    for step in 0..o.warmup + o.steps {
        let t0 = Instant::now();
        for _ in 0..DROPOUT_CALLS {
            let _ = tchtrain::models::dropout(&x, p, true);
        }
        if step >= o.warmup {
            times.push(t0.elapsed().as_secs_f64() * 1e3 / DROPOUT_CALLS as f64);
        }
    }
    let dims: Vec<String> = shape.iter().map(i64::to_string).collect();
    println!(
        "{}",
        json!({
            "bench": format!(
                "{}/{}_p{p}",
                if cached { "dropout_cached" } else { "dropout" },
                dims.join("x")
            ),
            "impl": "tchtrain",
            "median_ms": median(times.clone()),
            "min_ms": times.iter().copied().fold(f64::INFINITY, f64::min),
            "threads": threads,
            "fast_path": tchtrain::models::dropout_fast_path(),
        })
    );
}

fn main() -> Result<()> {
    let o = Options::parse()?;
    if let Some(n) = o.threads {
        tch::set_num_threads(n);
    }
    let threads = tch::get_num_threads();

    if o.wants("optim") {
        bench_optimizer("adamw_torch", threads, &o, |g| {
            Ok(Box::new(AdamW::new(g, AdamWConfig::default())?))
        })?;
        bench_optimizer("adamw_torch_fused", threads, &o, |g| {
            let config = AdamWConfig {
                fused: true,
                ..Default::default()
            };
            Ok(Box::new(AdamW::new(g, config)?))
        })?;
        bench_optimizer("sgd_momentum", threads, &o, |g| {
            let config = SgdConfig {
                lr: 1e-3,
                momentum: 0.9,
                ..Default::default()
            };
            Ok(Box::new(Sgd::new(g, config)?))
        })?;
        bench_optimizer("adafactor", threads, &o, |g| {
            let config = AdafactorConfig {
                lr: Some(1e-3),
                scale_parameter: false,
                relative_step: false,
                ..Default::default()
            };
            Ok(Box::new(Adafactor::new(g, config)?))
        })?;
        for name in PACKAGE_OPTIMS {
            bench_optimizer(name, threads, &o, |g| {
                let args = OptimizerArgs {
                    optim: name.into(),
                    learning_rate: 1e-3,
                    optim_target_modules: Some(StrOrList::One("all-linear".into())),
                    linear_modules: (0..LAYERS).map(|i| format!("layers.{i}")).collect(),
                    ..Default::default()
                };
                let mut opt = create_optimizer(&args, g)?;
                // schedule-free optimizers step only in train mode (the Trainer's
                // training_step calls it; a no-op for the others)
                opt.train()?;
                Ok(opt)
            })?;
        }
    }

    if o.wants("dropout") {
        for shape in [[4, 128, 576], [4, 128, 1536]] {
            for p in [0.05, 0.1] {
                bench_dropout(&shape, p, threads, &o, false);
                bench_dropout(&shape, p, threads, &o, true);
            }
        }
    }

    if o.wants("collate") {
        let tok = AutoTokenizer::from_pretrained(assets_dir().join("minilm"))
            .context("loading the MiniLM tokenizer (run `cargo xtask setup`)")?;
        let (info, tokenizer) = (tok.info().clone(), tok.tokenizer());
        let mut rows = Vec::new();
        for line in hamlet_lines()? {
            let enc = tokenizer
                .encode(line.as_str(), true)
                .map_err(|e| anyhow!("tokenizing {line:?}: {e}"))?;
            let mut f = Feature::from_encoding(&enc, true);
            // upstream's `tokenizer.pad` leaves offsets unpadded: not a collator input here
            f.offset_mapping = None;
            rows.push(f);
        }
        // batches of BATCH_ROWS rows; the last, shorter batch is dropped
        let batches: Vec<Vec<Feature>> = rows
            .chunks_exact(BATCH_ROWS)
            .map(<[Feature]>::to_vec)
            .collect();
        let mut padding = DataCollatorWithPadding::new(info.clone());
        bench_collator("with_padding", threads, &o, &batches, &mut padding)?;
        let options = LanguageModelingOptions {
            seed: Some(MLM_SEED),
            ..Default::default()
        };
        let mut mlm = DataCollatorForLanguageModeling::new(info, options)?;
        bench_collator("language_modeling_mlm", threads, &o, &batches, &mut mlm)?;
    }
    Ok(())
}

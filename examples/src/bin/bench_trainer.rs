//! The Trainer benchmark of `cargo xtask bench`: one training job with our
//! [`Trainer`](tchtrain::trainer::Trainer), or (`--bare`) with a bare tch loop doing the same
//! work, or (`--peak`) a matmul probe of the machine.
//!
//! The jobs are prepared by `scripts/bench/bench_trainer.py --prepare DIR` (the same weights,
//! rows and settings the Python side reads; see that script for the jobs): `DIR/<job>/`
//! holds `initial/` (config.json + model.safetensors), `rows.json` and `job.json`.
//!
//! * Trainer run: `TrainingArguments` as the Python side (max_steps = warm-up + measured
//!   steps, the job's batch size, lr 5e-5, linear schedule, the default fused AdamW,
//!   max_grad_norm 1.0, seed 42, no logging until the end, no saving, no reports), the same
//!   collator (`DefaultDataCollator` / `DataCollatorWithPadding`), the seeded random sampler.
//!   A callback takes the time at `on_step_begin` / `on_step_end`.
//! * The jobs with padded batches (MiniLM's classifier, the padded Qwen2) run padding-free
//!   (`set_padding_free(true)`: the layers on the real tokens only; `"padding_free": true`
//!   in the line), `--padded` runs them padded as upstream.
//! * `--bare`: the same model, rows, order (the same seeded permutation), collator, optimizer
//!   with the same decay groups, scheduler and clipping, in a plain loop: collate, forward
//!   with labels (and `num_items_in_batch` counted on the host for the causal LM; in bf16
//!   inside CPU autocast through the Trainer's public `model_forward`, the only way to get
//!   CPU autocast from tch), backward, clip, optimizer step, scheduler step, zero grad. What
//!   the Trainer adds on top is its overhead.
//! * `--zero-stage N`: the Trainer run under DeepSpeed ZeRO stage N (`zero_config`, the
//!   same dict on the Python side, where DeepSpeed's own engine runs).
//! * `--device cuda` (or `cuda:N`): the model trains on that GPU (`use_cpu` false, the
//!   Trainer's device; the bare loop moves the model and each batch there), every time
//!   stamp taken after a device synchronisation, as the Python side's `--device cuda`.
//! * `--peak`: the best of 5 timed `[N, N] x [N, N]` matmuls (N = 2048; 8192 on a GPU) in fp32 and bf16
//!   (those `--peak-precisions` names), in
//!   FLOP/s (2 N^3 per product).
//!
//! Each run prints one flat JSON line with the fields of the Python side: `tokens_per_s` (input
//! tokens, padded, of the measured steps over the wall time from the warm-up's last step end to
//! the last step end; `real_tokens_per_s` counts only the tokens the attention mask keeps), `median_step_ms` / `min_step_ms` (step begin to step end, after the
//! warm-up), `peak_rss_mb` (`VmHWM` of /proc/self/status, what `ru_maxrss` reports), `steps`,
//! `tokens`, `threads`; plus `matmul_flops` (the measured steps' matmul FLOPs, counted
//! analytically by `Job::matmul_flops`; padding-free, the real tokens' share), `matmul_flops_per_s` (those over the same wall time)
//! and the step's parts (medians): `median_forward_backward_ms` (step begin to
//! `on_pre_optimizer_step`: forward, loss, backward, the loop's bookkeeping, clipping),
//! `median_optimizer_ms` (to `on_optimizer_step`) and `median_after_optimizer_ms` (scheduler,
//! zero grad, state, callbacks, to step end), and the caching CPU allocator's counters
//! (`cpu_cache_hits`, `cpu_cache_misses`, `cpu_cache_peak_mb`: see `CpuMemoryCache`; both the
//! Trainer and the bare loop hold it, `TCHTRAIN_CPU_CACHE_MB=0` turns it off).
//!
//! ```sh
//! cargo run --release -p tchtrain-examples --bin bench_trainer -- --data DIR --job gpt2_tiny
//!     [--precision fp32|bf16] [--threads N] [--device cpu|cuda|cuda:N] [--zero-stage N] [--bare]
//! cargo run --release -p tchtrain-examples --bin bench_trainer -- --peak [--threads N] [--device ...]
//! ```

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};
use tchtrain::callbacks::{TrainerCallback, TrainerControl, TrainerState};
use tchtrain::collators::{
    Batch, DataCollator, DataCollatorWithPadding, DefaultDataCollator, Feature, Label,
};
use tchtrain::data::{Dataset, InMemoryDataset, RandomSampler, Sampler};
use tchtrain::models::{
    AutoTask, AutoTokenizer, LoadOptions, LoraConfig, ModelInputs, PreTrainedModel,
    from_pretrained_dir, get_peft_model,
};
use tchtrain::optim::{OptimizerArgs, create_optimizer, create_scheduler, decay_param_groups};
use tchtrain::tch::{self, Device, Kind, Tensor};
use tchtrain::trainer::{StepContext, Trainer, model_forward, named_parameters};
use tchtrain::training_args::{SaveStrategy, TrainingArguments};

struct Options {
    data: Option<PathBuf>,
    job: Option<String>,
    bf16: bool,
    threads: Option<i32>,
    bare: bool,
    /// `--padded`: the sequence classifier runs padded batches padded (by default it runs
    /// them padding-free, `set_padding_free(true)`).
    padded: bool,
    peak: bool,
    /// The precisions the probe measures (`--peak-precisions`, default both).
    peak_precisions: Vec<String>,
    /// `--device cpu|cuda|cuda:N` (default the CPU): where the model trains. `cuda` is the
    /// device of `LOCAL_RANK` (0 alone), as the Trainer picks it.
    device: Device,
    /// `--zero-stage N`: the Trainer run under DeepSpeed ZeRO stage N ([`zero_config`]).
    zero_stage: Option<i64>,
}

impl Options {
    fn parse() -> Result<Self> {
        let mut o = Options {
            data: None,
            job: None,
            bf16: false,
            threads: None,
            bare: false,
            padded: false,
            peak: false,
            peak_precisions: vec!["fp32".into(), "bf16".into()],
            device: Device::Cpu,
            zero_stage: None,
        };
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            let mut value = || args.next().ok_or_else(|| anyhow!("{a} needs a value"));
            match a.as_str() {
                "--data" => o.data = Some(value()?.into()),
                "--job" => o.job = Some(value()?),
                "--precision" => {
                    o.bf16 = match value()?.as_str() {
                        "fp32" => false,
                        "bf16" => true,
                        other => bail!("--precision: fp32 or bf16, got `{other}`"),
                    }
                }
                "--threads" => o.threads = Some(value()?.parse()?),
                "--device" => o.device = parse_device(&value()?)?,
                "--zero-stage" => {
                    o.zero_stage = match value()?.as_str() {
                        v @ ("1" | "2" | "3") => Some(v.parse()?),
                        other => bail!("--zero-stage: 1, 2 or 3, got `{other}`"),
                    }
                }
                "--bare" => o.bare = true,
                "--padded" => o.padded = true,
                "--peak" => o.peak = true,
                "--peak-precisions" => {
                    o.peak_precisions = value()?.split(',').map(String::from).collect();
                    if let Some(p) = o
                        .peak_precisions
                        .iter()
                        .find(|p| !["fp32", "bf16"].contains(&p.as_str()))
                    {
                        bail!("--peak-precisions: fp32 and / or bf16, got `{p}`");
                    }
                }
                other => bail!(
                    "unknown option `{other}` (known: --data DIR, --job NAME, \
                     --precision fp32|bf16, --threads N, --device cpu|cuda|cuda:N, --zero-stage N, --bare, --padded, \
                     --peak, --peak-precisions LIST)"
                ),
            }
        }
        DEVICE
            .set(o.device)
            .map_err(|_| anyhow!("the options were parsed twice"))?;
        Ok(o)
    }
}

/// `--zero-stage N`'s DeepSpeed config, the same dict on the Python side: the Trainer's
/// `"auto"` sizes (`reduce_bucket_size` hidden_size², the ZeRO-3 bucket and threshold from
/// it), `overlap_comm` (the documentation's configs set it), and `"bf16": {"enabled":
/// "auto"}` (on with `--precision bf16`).
fn zero_config(stage: i64) -> tchtrain::training_args::JsonDict {
    let value = json!({
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "zero_optimization": {
            "stage": stage,
            "overlap_comm": true,
            "reduce_bucket_size": "auto",
            "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto",
        },
    });
    match value {
        Value::Object(map) => map,
        _ => unreachable!("an object literal"),
    }
}

/// The device of the run, for [`stamp`].
static DEVICE: std::sync::OnceLock<Device> = std::sync::OnceLock::new();

/// `--device`: `cpu`, `cuda` (the device of `LOCAL_RANK`, 0 without it) or `cuda:N`; a CUDA
/// device this machine does not have is refused.
fn parse_device(spec: &str) -> Result<Device> {
    let device = match spec {
        "cpu" => return Ok(Device::Cpu),
        "cuda" => {
            let local = std::env::var("LOCAL_RANK").ok().map(|v| v.parse::<usize>());
            Device::Cuda(local.transpose().context("LOCAL_RANK")?.unwrap_or(0))
        }
        other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(i)) => Device::Cuda(i),
            _ => bail!("--device: cpu, cuda or cuda:N, got `{other}`"),
        },
    };
    let Device::Cuda(i) = device else {
        unreachable!("a CUDA device")
    };
    let count = tch::Cuda::device_count();
    if i as i64 >= count {
        bail!("--device {spec}: cuda:{i} is not on this machine ({count} CUDA devices)");
    }
    Ok(device)
}

/// Now, after the device's queued work (a CUDA device is synchronised first, so that a step's
/// times include its kernels, as `torch.cuda.synchronize()` does on the Python side).
fn stamp() -> Instant {
    if let Some(Device::Cuda(i)) = DEVICE.get() {
        tch::Cuda::synchronize(*i as i64);
    }
    Instant::now()
}

/// A job as `bench_trainer.py --prepare` wrote it.
struct Job {
    name: String,
    dir: PathBuf,
    /// `"clm"` (GPT-2 causal LM) or `"cls"` (BERT sequence classification).
    kind: String,
    batch: usize,
    warmup: usize,
    steps: usize,
    /// The model's config.json.
    config: Value,
    /// peft's `LoraConfig` fields: the model trains a LoRA adapter.
    lora: Option<Value>,
    /// `BitsAndBytesConfig` fields: the base loads in 4 bits (QLoRA).
    quantization: Option<Value>,
    /// The causal-LM rows are padded (`"padded": true`: attention mask, labels -100).
    padded_rows: bool,
}

impl Job {
    fn read(data: &Path, name: &str) -> Result<Self> {
        let dir = data.join(name);
        let job = read_json(&dir.join("job.json"))?;
        let config = read_json(&dir.join("initial").join("config.json"))?;
        let num = |k: &str| {
            job[k]
                .as_u64()
                .map(|n| n as usize)
                .with_context(|| format!("job.json: {k}"))
        };
        Ok(Self {
            name: name.to_string(),
            kind: job["kind"].as_str().context("job.json: kind")?.to_string(),
            batch: num("batch")?,
            warmup: num("warmup")?,
            steps: num("steps")?,
            padded_rows: job["padded"].as_bool().unwrap_or(false),
            config,
            lora: job.get("lora").cloned(),
            quantization: job.get("quantization").cloned(),
            dir,
        })
    }

    fn total_steps(&self) -> usize {
        self.warmup + self.steps
    }

    fn task(&self) -> AutoTask {
        if matches!(self.kind.as_str(), "clm" | "sft" | "dpo") {
            AutoTask::CausalLm
        } else {
            AutoTask::SequenceClassification { num_labels: None }
        }
    }

    /// The job's model; with `lora`, wrapped by `get_peft_model` after `manual_seed(0)` (the
    /// Python side draws the same adapter). The sequence classifier runs padding-free
    /// unless `padded`.
    fn load_model(&self, padded: bool, device: Device) -> Result<Box<dyn PreTrainedModel>> {
        let dir = self.dir.join("initial");
        let options = LoadOptions {
            quantization_config: self
                .quantization
                .as_ref()
                .map(tchtrain_models::BitsAndBytesConfig::from_json)
                .transpose()?,
            ..LoadOptions::default()
        };
        let mut model = from_pretrained_dir(&dir, self.task(), device, &options)?.model;
        if self.kind == "cls" || self.padded_rows {
            model.set_padding_free(!padded)?;
        }
        Ok(match &self.lora {
            Some(lora) => {
                // The keyword arguments of `LoraConfig(...)`, as an adapter_config.json.
                let mut fields = lora.clone();
                fields["peft_type"] = json!("LORA");
                tch::manual_seed(0);
                Box::new(get_peft_model(model, LoraConfig::from_json(&fields)?)?)
            }
            None => model,
        })
    }

    /// The rows: causal-LM blocks with `labels` = `input_ids`, or tokenized reviews with
    /// their class.
    fn rows(&self) -> Result<Vec<Feature>> {
        let rows = read_json(&self.dir.join("rows.json"))?;
        let ids = |v: &Value| -> Result<Vec<i64>> {
            v.as_array()
                .context("a list of ids")?
                .iter()
                .map(|x| x.as_i64().context("an id"))
                .collect()
        };
        rows.as_array()
            .context("rows.json")?
            .iter()
            .map(|r| {
                let input_ids = ids(&r["input_ids"])?;
                Ok(if self.kind == "clm" {
                    // Padded rows (qwen2_padded) bring their attention mask and labels.
                    let labels = match r.get("labels") {
                        Some(l) => ids(l)?,
                        None => input_ids.clone(),
                    };
                    let mut f = Feature::new(input_ids).with_labels(Label::Ids(labels));
                    if let Some(m) = r.get("attention_mask") {
                        f.attention_mask = Some(ids(m)?);
                    }
                    f
                } else {
                    Feature {
                        input_ids,
                        token_type_ids: Some(ids(&r["token_type_ids"])?),
                        attention_mask: Some(ids(&r["attention_mask"])?),
                        labels: Some(Label::Class(r["label"].as_i64().context("label")?)),
                        ..Feature::default()
                    }
                })
            })
            .collect()
    }

    fn collator(&self) -> Result<Box<dyn DataCollator<Feature> + Send>> {
        Ok(if self.kind == "clm" {
            Box::new(DefaultDataCollator)
        } else {
            let assets = std::env::var_os("TCHTRAIN_ASSETS")
                .map(PathBuf::from)
                .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets"));
            let info = AutoTokenizer::from_pretrained(assets.join("minilm"))?
                .info()
                .clone();
            Box::new(DataCollatorWithPadding::new(info))
        })
    }

    /// The training arguments both sides use.
    fn args(&self, output_dir: &Path, o: &Options) -> Result<TrainingArguments> {
        let mut args = TrainingArguments {
            max_steps: self.total_steps() as i64,
            per_device_train_batch_size: self.batch,
            learning_rate: 5e-5,
            logging_steps: 1e6,
            save_strategy: SaveStrategy::No,
            seed: 42,
            use_cpu: o.device == Device::Cpu,
            report_to: vec![],
            disable_tqdm: true,
            dataloader_num_workers: 0,
            bf16: o.bf16,
            deepspeed: o
                .zero_stage
                .map(|stage| tchtrain::training_args::DictOrPath::Dict(zero_config(stage))),
            ..TrainingArguments::new(output_dir.display().to_string())
        };
        args.post_init()?;
        Ok(args)
    }

    /// Matmul FLOPs of one training step (forward + backward = 3 x forward) on a batch of
    /// `b` rows of `s` tokens, as a dense model computes them:
    ///
    /// * every weight matrix a token goes through, 2 FLOPs per weight per token forward:
    ///   per layer Q, K, V, output projection (4 d^2) and the MLP (2 d i), plus GPT-2's LM head
    ///   (V d, tied to the embedding) or, per row, BERT's pooler (d^2) and classifier (d x 2);
    /// * attention: scores Q K^T and the weighted sum of V, 2 x (s d) multiply-adds per
    ///   token and layer (the full s x s matrix, as the math / flash kernels on CPU compute it).
    ///
    /// With a LoRA adapter the frozen weights get no gradient: they count 2 x forward
    /// (forward and the input's gradient), attention still 3 x, and each adapted layer adds
    /// its `r (in + out)` multiply-adds per token (3 x forward).
    ///
    /// Embedding look-ups, layer norms, softmax, GELU, the loss and the optimizer are not
    /// matmuls and are not counted. transformers' `floating_point_ops` (6 x parameters without
    /// embeddings x tokens) counts neither the LM head nor attention.
    fn matmul_flops(&self, b: i64, s: i64) -> f64 {
        let c = |keys: &[&str]| -> f64 {
            keys.iter()
                .find_map(|k| self.config[*k].as_f64())
                .unwrap_or(0.0)
        };
        let (b, s) = (b as f64, s as f64);
        let tokens = b * s;
        let layers = c(&["n_layer", "num_hidden_layers"]);
        let d = c(&["n_embd", "hidden_size"]);
        let inner = match c(&["n_inner", "intermediate_size"]) {
            0.0 => 4.0 * d,
            i => i,
        };
        // Llama-shaped configs (`num_key_value_heads`): q and o of d x d, k and v of
        // d x (kv_heads · head_dim), and the gated MLP's three matrices; GPT-2 / BERT: four
        // d x d and two d x inner.
        let per_token_weights = match self.config["num_key_value_heads"].as_f64() {
            Some(kv) => {
                let kv_width = kv * d / c(&["num_attention_heads"]).max(1.0);
                layers * (2.0 * d * d + 2.0 * d * kv_width + 3.0 * d * inner)
            }
            None => layers * (4.0 * d * d + 2.0 * d * inner),
        };
        let (head_per_token, head_per_row) = if self.kind != "cls" {
            (c(&["vocab_size"]) * d, 0.0)
        } else {
            (0.0, d * d + d * 2.0)
        };
        let attention_macs = layers * 2.0 * s * d * tokens;
        let Some(lora) = &self.lora else {
            return 3.0
                * 2.0
                * ((per_token_weights + head_per_token) * tokens
                    + head_per_row * b
                    + attention_macs);
        };
        // "all-linear" on a Llama-shaped model: q, k, v, o, gate, up, down.
        let r = lora["r"].as_f64().unwrap_or(8.0);
        let kv_width = self.config["num_key_value_heads"].as_f64().unwrap_or(0.0) * d
            / c(&["num_attention_heads"]).max(1.0);
        let adapter_per_token =
            layers * r * (2.0 * 2.0 * d + 2.0 * (d + kv_width) + 3.0 * (d + inner));
        2.0 * 2.0 * (per_token_weights + head_per_token) * tokens
            + 3.0 * 2.0 * (attention_macs + adapter_per_token * tokens)
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(serde_json::from_str(&text)?)
}

/// Peak resident set size in MiB (`VmHWM`, what `getrusage`'s `ru_maxrss` reports).
fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Begin and end times of each optimizer step (and the times just before and after the
/// optimizer's `step`), and each batch's `input_ids` shape.
#[derive(Default)]
struct Record {
    begin: Vec<Instant>,
    pre_optimizer: Vec<Instant>,
    post_optimizer: Vec<Instant>,
    end: Vec<Instant>,
    shapes: Vec<(i64, i64)>,
    /// Each batch's real tokens (the attention mask's sum; every token without one).
    real: Vec<i64>,
}

type SharedRecord = Arc<Mutex<Record>>;

fn lock(r: &SharedRecord) -> std::sync::MutexGuard<'_, Record> {
    r.lock().unwrap_or_else(|e| e.into_inner())
}

/// Times the Trainer's steps (the Python side's `StepTimer`).
struct StepTimer(SharedRecord);

impl TrainerCallback for StepTimer {
    fn on_step_begin(
        &mut self,
        _: &TrainingArguments,
        _: &TrainerState,
        _: &mut TrainerControl,
    ) -> tchtrain::callbacks::Result<()> {
        lock(&self.0).begin.push(stamp());
        Ok(())
    }

    fn on_pre_optimizer_step(
        &mut self,
        _: &TrainingArguments,
        _: &TrainerState,
        _: &mut TrainerControl,
    ) -> tchtrain::callbacks::Result<()> {
        lock(&self.0).pre_optimizer.push(stamp());
        Ok(())
    }

    fn on_optimizer_step(
        &mut self,
        _: &TrainingArguments,
        _: &TrainerState,
        _: &mut TrainerControl,
    ) -> tchtrain::callbacks::Result<()> {
        lock(&self.0).post_optimizer.push(stamp());
        Ok(())
    }

    fn on_step_end(
        &mut self,
        _: &TrainingArguments,
        _: &TrainerState,
        _: &mut TrainerControl,
    ) -> tchtrain::callbacks::Result<()> {
        lock(&self.0).end.push(stamp());
        Ok(())
    }
}

/// A collator that records each batch's `input_ids` shape (the Python side's
/// `ShapeRecorder`).
struct ShapeRecorder {
    inner: Box<dyn DataCollator<Feature> + Send>,
    record: SharedRecord,
}

impl DataCollator<Feature> for ShapeRecorder {
    fn collate(&mut self, features: &[Feature]) -> tchtrain::collators::Result<Batch> {
        let batch = self.inner.collate(features)?;
        if let Some(ids) = batch.get("input_ids") {
            let size = ids.size();
            let mut record = lock(&self.record);
            record.shapes.push((size[0], size[1]));
            record.real.push(real_tokens(&batch, size[0] * size[1]));
        }
        Ok(batch)
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A batch's real tokens: the attention mask's sum, `all` without one.
fn real_tokens(batch: &Batch, all: i64) -> i64 {
    batch
        .get("attention_mask")
        .map_or(all, |m| m.sum(Kind::Int64).int64_value(&[]))
}

/// The JSON line of a finished run.
fn report(job: &Job, o: &Options, implementation: &str, record: &Record) -> Result<Value> {
    let (w, total) = (job.warmup, job.total_steps());
    if record.end.len() < total || record.begin.len() < total || record.shapes.len() < total {
        bail!(
            "{}: expected {total} steps, saw {} begins, {} ends, {} batches",
            job.name,
            record.begin.len(),
            record.end.len(),
            record.shapes.len()
        );
    }
    let ms = |from: &[Instant], to: &[Instant]| -> f64 {
        if from.len() < total || to.len() < total {
            return f64::NAN;
        }
        median(
            (w..total)
                .map(|i| (to[i] - from[i]).as_secs_f64() * 1e3)
                .collect(),
        )
    };
    let steps: Vec<f64> = (w..total)
        .map(|i| (record.end[i] - record.begin[i]).as_secs_f64() * 1e3)
        .collect();
    let measured = &record.shapes[w..total];
    let tokens: i64 = measured.iter().map(|(b, s)| b * s).sum();
    let real: i64 = record.real[w..total].iter().sum();
    // Padding-free, the real tokens' share of the work (attention, computed padded, is
    // counted in the same share: the figure is a lower bound there).
    let padding_free = (job.kind == "cls" || job.padded_rows) && !o.padded;
    let flops: f64 = measured
        .iter()
        .zip(&record.real[w..total])
        .map(|(&(b, s), &real)| {
            let share = if padding_free {
                real as f64 / (b * s) as f64
            } else {
                1.0
            };
            job.matmul_flops(b, s) * share
        })
        .sum();
    let wall = (record.end[total - 1] - record.end[w - 1]).as_secs_f64();
    let cache = tchtrain::trainer::CpuMemoryCache::stats();
    Ok(json!({
        "job": job.name,
        "precision": if o.bf16 { "bf16" } else { "fp32" },
        "impl": implementation,
        "padding_free": padding_free,
        "tokens_per_s": tokens as f64 / wall,
        "real_tokens_per_s": real as f64 / wall,
        "median_step_ms": median(steps.clone()),
        "min_step_ms": steps.iter().copied().fold(f64::INFINITY, f64::min),
        "peak_rss_mb": peak_rss_mb(),
        "cpu_cache_hits": cache.hits,
        "cpu_cache_misses": cache.misses,
        "cpu_cache_peak_mb": cache.peak_cached_bytes as f64 / (1u64 << 20) as f64,
        "steps": steps.len(),
        "tokens": tokens,
        "threads": tch::get_num_threads(),
        "matmul_flops": flops,
        "matmul_flops_per_s": flops / wall,
        "median_forward_backward_ms": ms(&record.begin, &record.pre_optimizer),
        "median_optimizer_ms": ms(&record.pre_optimizer, &record.post_optimizer),
        "median_after_optimizer_ms": ms(&record.post_optimizer, &record.end),
    }))
}

/// One run of our Trainer.
fn run_trainer(job: &Job, o: &Options) -> Result<Value> {
    let out = std::env::temp_dir().join(format!("tchtrain-bench-{}", std::process::id()));
    let record = SharedRecord::default();
    let args = job.args(&out, o)?;
    let mut trainer = Trainer::builder(job.load_model(o.padded, Device::Cpu)?, args)
        .train_dataset(InMemoryDataset::new(job.rows()?).into_shared())
        .data_collator(ShapeRecorder {
            inner: job.collator()?,
            record: record.clone(),
        })
        .callback(StepTimer(record.clone()))
        .build()?;
    trainer.train(None)?;
    let _ = std::fs::remove_dir_all(&out);
    let record = lock(&record);
    report(job, o, "tchtrain", &record)
}

/// The tokenizer's pad token id (its EOS token's without one), as TRL's trainers pad.
fn pad_token_id(tokenizer: &tchtrain::models::PreTrainedTokenizerFast) -> Result<i64> {
    let special = tokenizer.special_tokens_map();
    let pad = special
        .iter()
        .find(|(k, _)| k == "pad_token")
        .or_else(|| special.iter().find(|(k, _)| k == "eos_token"))
        .map(|(_, v)| v.clone())
        .context("the tokenizer's pad / eos token")?;
    Ok(i64::from(
        tokenizer
            .tokenizer()
            .token_to_id(&pad)
            .context("the pad token's id")?,
    ))
}

/// TRL's SFT with packing through `tchtrain-trl` (`smollm2_sft_packed`): the job's text rows
/// prepared, packed and collated padding-free by `SFTTrainer`, each batch recorded.
fn run_sft(job: &Job, o: &Options) -> Result<Value> {
    let out = std::env::temp_dir().join(format!("tchtrain-bench-{}", std::process::id()));
    let record = SharedRecord::default();
    let assets = std::env::var_os("TCHTRAIN_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets"));
    let tokenizer = AutoTokenizer::from_pretrained(assets.join("smollm2-135m"))?;
    let pad_token_id = pad_token_id(&tokenizer)?;
    let mut config = tchtrain_trl::SFTConfig::new(out.display().to_string());
    config.base = job.args(&out, o)?;
    config.bf16 = Some(o.bf16);
    config.base.gradient_checkpointing = false;
    config.max_length = Some(
        read_json(&job.dir.join("job.json"))?["max_length"]
            .as_u64()
            .context("job.json: max_length")? as usize,
    );
    config.packing = true;
    let rows = tchtrain::datasets::Table::read(job.dir.join("rows.jsonl"))?;
    let (timer, recorded) = (StepTimer(record.clone()), record.clone());
    let mut trainer =
        tchtrain_trl::SFTTrainer::builder(job.load_model(false, Device::Cpu)?, config, tokenizer)
            .train_dataset(rows)
            .configure(move |b| {
                b.data_collator(ShapeRecorder {
                    inner: Box::new(tchtrain_trl::DataCollatorForLanguageModeling {
                        pad_token_id,
                        padding_free: true,
                        pad_to_multiple_of: None,
                    }),
                    record: recorded,
                })
                .callback(timer)
            })
            .build()?;
    trainer.train(None)?;
    let _ = std::fs::remove_dir_all(&out);
    let record = lock(&record);
    report(job, o, "tchtrain", &record)
}

/// TRL's DPO through `tchtrain-trl` (`smollm2_dpo`): the job's preference rows prepared and
/// collated by `DPOTrainer`, the reference loaded again from the checkpoint, each batch
/// recorded.
fn run_dpo(job: &Job, o: &Options) -> Result<Value> {
    let out = std::env::temp_dir().join(format!("tchtrain-bench-{}", std::process::id()));
    let record = SharedRecord::default();
    let assets = std::env::var_os("TCHTRAIN_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets"));
    let tokenizer = AutoTokenizer::from_pretrained(assets.join("smollm2-135m"))?;
    let pad_token_id = pad_token_id(&tokenizer)?;
    let mut config = tchtrain_trl::DPOConfig::new(out.display().to_string());
    config.base = job.args(&out, o)?;
    config.base.learning_rate = 5e-7;
    config.bf16 = Some(o.bf16);
    config.base.gradient_checkpointing = false;
    let max_length = read_json(&job.dir.join("job.json"))?["max_length"]
        .as_u64()
        .context("job.json: max_length")? as usize;
    config.max_length = Some(max_length);
    let rows = tchtrain::datasets::Table::read(job.dir.join("rows.jsonl"))?;
    let (timer, recorded) = (StepTimer(record.clone()), record.clone());
    let mut trainer = tchtrain_trl::DPOTrainer::builder_from_pretrained(
        job.dir.join("initial"),
        config,
        tokenizer,
    )
    .train_dataset(rows)
    .configure(move |b| {
        b.data_collator(ShapeRecorder {
            inner: Box::new(
                tchtrain_trl::trainer::dpo_trainer::DataCollatorForPreference {
                    pad_token_id,
                    max_length: Some(max_length),
                    truncation_mode: tchtrain_trl::TruncationMode::KeepStart,
                    pad_to_multiple_of: None,
                },
            ),
            record: recorded,
        })
        .callback(timer)
    })
    .build()?;
    trainer.train(None)?;
    let _ = std::fs::remove_dir_all(&out);
    let record = lock(&record);
    report(job, o, "tchtrain", &record)
}

/// The same work in a bare tch loop.
fn run_bare(job: &Job, o: &Options) -> Result<Value> {
    let out = std::env::temp_dir().join(format!("tchtrain-bench-{}", std::process::id()));
    let args = job.args(&out, o)?;
    tch::manual_seed(args.seed as i64);
    let mut model = job.load_model(o.padded, o.device)?;
    model.train();
    // The Trainer holds the caching CPU allocator from the start of `train` (the model
    // already loaded); so does the bare loop.
    let _cache = tchtrain::trainer::CpuMemoryCache::from_env();
    let named = named_parameters(&*model);
    let params: Vec<Tensor> = named.iter().map(|(_, t)| t.shallow_clone()).collect();
    let layernorms = model.layernorm_modules();
    let groups = decay_param_groups(named, args.weight_decay, &layernorms);
    let mut optimizer = create_optimizer(&OptimizerArgs::from(&args), groups)?;
    let mut scheduler = create_scheduler(&args, optimizer.as_mut(), job.total_steps())?;
    let rows = InMemoryDataset::new(job.rows()?);
    let mut collator = job.collator()?;
    let sampler = RandomSampler::new(args.seed);
    let mut order = Vec::new();
    let mut epoch = 0;
    while order.len() < job.total_steps() * job.batch {
        // Full batches only, as the Trainer's epochs here (rows are a multiple of the batch).
        let idx = sampler.indices(rows.len(), epoch);
        order.extend(idx.chunks_exact(job.batch).flatten().copied());
        epoch += 1;
    }
    let label_names = vec!["labels".to_string()];
    // Only for the forward's autocast (bf16); the loop itself is bare.
    let accelerator = tchtrain::accelerate::Accelerator::on_device(
        o.device,
        tchtrain::accelerate::AcceleratorOptions {
            cpu: o.device == Device::Cpu,
            mixed_precision: if args.bf16 {
                tchtrain::accelerate::MixedPrecision::Bf16
            } else {
                tchtrain::accelerate::MixedPrecision::No
            },
            ..Default::default()
        },
    )?;
    let mut record = Record::default();
    optimizer.zero_grad();
    for step in 0..job.total_steps() {
        let features: Vec<Feature> = order[step * job.batch..(step + 1) * job.batch]
            .iter()
            .map(|&i| rows.get(i))
            .collect::<std::result::Result<_, _>>()?;
        let batch = collator.collate(&features)?;
        let ids = batch.get("input_ids").context("input_ids")?;
        let size = ids.size();
        record.shapes.push((size[0], size[1]));
        record.real.push(real_tokens(&batch, size[0] * size[1]));
        record.begin.push(stamp());
        // As the Trainer's `_prepare_inputs`, inside the step.
        let batch = batch.to_device(o.device)?;
        let ids = batch.get("input_ids").context("input_ids")?;
        // The causal LM's loss is a sum over the predicted tokens divided by their count
        // (`num_items_in_batch`), counted here on the host.
        let num_items = (job.kind == "clm").then(|| {
            let n: usize = features
                .iter()
                .map(|f| match &f.labels {
                    Some(Label::Ids(l)) => l.iter().skip(1).filter(|&&x| x != -100).count(),
                    _ => f.input_ids.len() - 1,
                })
                .sum();
            Tensor::from(n as f32).to_device(o.device)
        });
        let inputs = ModelInputs {
            input_ids: Some(ids),
            attention_mask: batch.get("attention_mask"),
            token_type_ids: batch.get("token_type_ids"),
            labels: batch.get("labels"),
            num_items_in_batch: num_items.as_ref(),
            ..ModelInputs::default()
        };
        // fp32: the model's forward; bf16: the same inside CPU autocast with the outputs back
        // in fp32 (the Trainer's `model_forward`, what accelerate does).
        let ctx = StepContext {
            args: &args,
            global_step: step as i64,
            model_accepts_loss_kwargs: true,
            current_gradient_accumulation_steps: 1,
            device: o.device,
            label_names: &label_names,
            loss_shifts_labels: job.kind == "clm",
            is_causal_lm: job.kind == "clm",
            accelerator: &accelerator,
            skip_logits: None,
            fused_backward: None,
            forward_time: None,
            num_input_tokens_seen: None,
        };
        let loss = model_forward(&ctx, &*model, &inputs)?
            .loss
            .context("no loss")?;
        loss.f_backward()?;
        tchtrain::optim::clip_grad_norm_if_enabled(&params, args.max_grad_norm)?;
        record.pre_optimizer.push(stamp());
        optimizer.step()?;
        record.post_optimizer.push(stamp());
        scheduler.step(optimizer.as_mut())?;
        optimizer.zero_grad();
        record.end.push(stamp());
    }
    report(job, o, "bare", &record)
}

/// Best FLOP/s of `[n, n] x [n, n]` over a few runs in `kind`.
fn matmul_peak(kind: Kind, device: Device) -> f64 {
    let n = if device == Device::Cpu { 2048 } else { 8192 };
    let a = Tensor::randn([n, n], (Kind::Float, device)).to_kind(kind);
    let b = Tensor::randn([n, n], (Kind::Float, device)).to_kind(kind);
    let _ = a.matmul(&b);
    let best = (0..5)
        .map(|_| {
            let t0 = stamp();
            let c = a.matmul(&b);
            let dt = (stamp() - t0).as_secs_f64();
            drop(c);
            dt
        })
        .fold(f64::INFINITY, f64::min);
    2.0 * (n as f64).powi(3) / best
}

fn main() -> Result<()> {
    let o = Options::parse()?;
    if let Some(n) = o.threads {
        tch::set_num_threads(n);
    }
    if o.peak {
        // Only the precisions asked for: on a CPU without bf16 instructions the bf16 probe
        // alone takes minutes. One not measured is `null`.
        let probe = |name: &str, kind: Kind| {
            o.peak_precisions
                .iter()
                .any(|p| p == name)
                .then(|| matmul_peak(kind, o.device))
        };
        let line = json!({
            "probe": "matmul",
            "fp32_flops_per_s": probe("fp32", Kind::Float),
            "bf16_flops_per_s": probe("bf16", Kind::BFloat16),
            "threads": tch::get_num_threads(),
            "device": format!("{:?}", o.device),
        });
        println!("{line}");
        return Ok(());
    }
    let data = o.data.as_deref().context("--data DIR is needed")?;
    let job = Job::read(data, o.job.as_deref().context("--job NAME is needed")?)?;
    let implementation = if o.bare { "bare" } else { "tchtrain" };
    let line = match (o.bare, job.kind.as_str()) {
        (true, "sft" | "dpo") => Err(anyhow!(
            "{}: no bare loop (TRL's preparation and fused loss are the work measured)",
            job.kind
        )),
        (false, "dpo") => run_dpo(&job, &o),
        (true, _) => run_bare(&job, &o),
        (false, "sft") => run_sft(&job, &o),
        (false, _) => run_trainer(&job, &o),
    };
    match line {
        Ok(line) => println!("{line}"),
        // A refused configuration is a result too (the table shows it): one line, exit 0.
        Err(e) => println!(
            "{}",
            json!({
                "job": job.name,
                "precision": if o.bf16 { "bf16" } else { "fp32" },
                "impl": implementation,
                "error": format!("{e:#}"),
            })
        ),
    }
    Ok(())
}

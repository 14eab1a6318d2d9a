//! `accelerate_loop`: a hand-written training loop on the [`Accelerator`] alone, no
//! Trainer — accelerate's `nlp_example.py` shape on the user model of [`custom_model`]
//! ([`BagOfWords`] on its seeded rows).
//!
//! ```text
//! accelerator = Accelerator(cpu=..., mixed_precision=...)
//! train_dataloader = accelerator.prepare(train_dataloader)   # this rank's shard
//! model, optimizer = accelerator.prepare(model, optimizer)   # DDP on several ranks
//! for batch in train_dataloader:                             # (gradient accumulation)
//!     with accelerator.autocast(): loss = model(**batch).loss / accumulation_steps
//!     accelerator.backward(loss)                             # reduced on the window's last
//!     accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
//!     optimizer.step(); optimizer.zero_grad()
//! predictions, references = accelerator.gather_for_metrics((predictions, batch["labels"]))
//! ```
//!
//! The same run through the Trainer (`custom_model` with `--lr_scheduler_type constant`)
//! logs the same losses and gradient norms to the bit: the Trainer's step is this loop.
//! Launched on several processes (`cargo xtask launch --nproc-per-node 2 -- accelerate_loop
//! ...`) each rank trains on its shard of every batch and DDP averages the gradients.
//!
//! ```sh
//! cargo run --release -p tchtrain-examples --bin accelerate_loop -- --cpu --max_steps 40
//! ```

use std::path::PathBuf;
use std::sync::Arc;

use tch::{Kind, Tensor};
use tchtrain_accelerate::{Accelerator, AcceleratorOptions, MixedPrecision, Reduction};
use tchtrain_collators::DefaultDataCollator;
use tchtrain_data::{
    DataLoader, InMemoryDataset, RandomSampler, SequentialSampler, shared_collator,
};
use tchtrain_models::{ModelInputs, TrainableModel};
use tchtrain_optim::{AdamW, AdamWConfig, GroupSpec, Optimizer};

use crate::custom_model::{BagOfWords, rows};
use crate::error::{Error, Result};
use crate::plain_args::split_flags;

/// The loop's flags (upstream's `nlp_example.py` arguments and its hyper-parameters).
#[derive(Debug, Clone, PartialEq)]
pub struct AccelerateLoopArguments {
    /// `--cpu`: train on the CPU even when CUDA is present.
    pub cpu: bool,
    /// `--mixed_precision no|fp16|bf16` (default `no`).
    pub mixed_precision: MixedPrecision,
    /// `--learning_rate` (default 0.05).
    pub learning_rate: f64,
    /// `--weight_decay` for AdamW (default 0).
    pub weight_decay: f64,
    /// `--per_device_train_batch_size` (default 8).
    pub per_device_train_batch_size: usize,
    /// `--gradient_accumulation_steps` (default 1).
    pub gradient_accumulation_steps: usize,
    /// `--max_steps`: optimizer steps (default 24).
    pub max_steps: usize,
    /// `--max_grad_norm` (default 1.0; 0 computes the norm without clipping).
    pub max_grad_norm: f64,
    /// `--seed` (default 7): the model's initialisation and the data order.
    pub seed: u64,
    /// `--embedding_dim`, `--train_rows`, `--eval_rows`: as `custom_model`.
    pub embedding_dim: i64,
    /// See [`embedding_dim`](Self::embedding_dim).
    pub train_rows: usize,
    /// See [`embedding_dim`](Self::embedding_dim).
    pub eval_rows: usize,
    /// `--output_dir`: where the main process writes `steps.json` (nothing when unset).
    pub output_dir: Option<PathBuf>,
}

impl Default for AccelerateLoopArguments {
    fn default() -> Self {
        Self {
            cpu: false,
            mixed_precision: MixedPrecision::No,
            learning_rate: 0.05,
            weight_decay: 0.0,
            per_device_train_batch_size: 8,
            gradient_accumulation_steps: 1,
            max_steps: 24,
            max_grad_norm: 1.0,
            seed: 7,
            embedding_dim: 16,
            train_rows: 256,
            eval_rows: 64,
            output_dir: None,
        }
    }
}

const HELP: &str = "\
accelerate_loop: a hand-written loop on the Accelerator alone (BagOfWords on seeded rows).
  --cpu                           train on the CPU
  --mixed_precision no|fp16|bf16  (default no)
  --learning_rate X               (default 0.05)
  --weight_decay X                AdamW's (default 0)
  --per_device_train_batch_size N (default 8)
  --gradient_accumulation_steps N (default 1)
  --max_steps N                   optimizer steps (default 24)
  --max_grad_norm X               (default 1.0)
  --seed N                        (default 7)
  --embedding_dim N, --train_rows N, --eval_rows N   as custom_model
  --output_dir DIR                write steps.json there
";

fn value<'a>(name: &str, value: Option<&'a str>) -> Result<&'a str> {
    value.ok_or_else(|| Error::InvalidFlag {
        flag: name.into(),
        detail: "needs a value".into(),
    })
}

fn number<T: std::str::FromStr>(name: &str, v: Option<&str>) -> Result<T> {
    let v = value(name, v)?;
    v.parse().map_err(|_| Error::InvalidFlag {
        flag: name.into(),
        detail: format!("'{v}' is not a number"),
    })
}

impl AccelerateLoopArguments {
    /// Parses `argv` (without the program name); `--help` is
    /// [`Error::TrainingArgs`]`(HelpRequested)` with the help text, as the other scripts.
    pub fn parse<I, S>(argv: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let argv: Vec<String> = argv.into_iter().map(|a| a.as_ref().to_string()).collect();
        let mut out = Self::default();
        for (name, v) in split_flags(&argv)? {
            let v = v.as_deref();
            match name.as_str() {
                "help" | "h" => {
                    return Err(Error::TrainingArgs(
                        tchtrain_training_args::Error::HelpRequested(HELP.into()),
                    ));
                }
                "cpu" => out.cpu = v.is_none_or(|v| v == "true" || v == "True"),
                "mixed_precision" => {
                    out.mixed_precision = match value(&name, v)? {
                        "no" => MixedPrecision::No,
                        "fp16" => MixedPrecision::Fp16,
                        "bf16" => MixedPrecision::Bf16,
                        other => {
                            return Err(Error::InvalidFlag {
                                flag: name,
                                detail: format!("'{other}': use no, fp16 or bf16"),
                            });
                        }
                    }
                }
                "learning_rate" => out.learning_rate = number(&name, v)?,
                "weight_decay" => out.weight_decay = number(&name, v)?,
                "per_device_train_batch_size" => {
                    out.per_device_train_batch_size = number(&name, v)?
                }
                "gradient_accumulation_steps" => {
                    out.gradient_accumulation_steps = number(&name, v)?
                }
                "max_steps" => out.max_steps = number(&name, v)?,
                "max_grad_norm" => out.max_grad_norm = number(&name, v)?,
                "seed" => out.seed = number(&name, v)?,
                "embedding_dim" => out.embedding_dim = number(&name, v)?,
                "train_rows" => out.train_rows = number(&name, v)?,
                "eval_rows" => out.eval_rows = number(&name, v)?,
                "output_dir" => out.output_dir = Some(PathBuf::from(value(&name, v)?)),
                _ => {
                    return Err(Error::InvalidFlag {
                        flag: name,
                        detail: "unrecognized argument (see --help)".into(),
                    });
                }
            }
        }
        for (flag, n) in [
            (
                "per_device_train_batch_size",
                out.per_device_train_batch_size,
            ),
            (
                "gradient_accumulation_steps",
                out.gradient_accumulation_steps,
            ),
            ("max_steps", out.max_steps),
        ] {
            if n == 0 {
                return Err(Error::InvalidFlag {
                    flag: flag.into(),
                    detail: "must be at least 1".into(),
                });
            }
        }
        Ok(out)
    }
}

/// One optimizer step of the loop, as the Trainer logs it with `logging_steps=1`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepLog {
    /// The step, from 1.
    pub step: usize,
    /// The window's loss (the accumulated, scaled micro-batch losses), averaged over the
    /// processes.
    pub loss: f64,
    /// The gradient norm before clipping.
    pub grad_norm: f64,
}

/// What the loop returns.
#[derive(Debug, Clone, PartialEq)]
pub struct AccelerateLoopOutput {
    /// Every optimizer step.
    pub steps: Vec<StepLog>,
    /// The accuracy on the evaluation rows, over every process's predictions.
    pub eval_accuracy: f64,
}

/// Parses `argv` and runs the loop.
pub fn main_with_args<I, S>(argv: I) -> Result<AccelerateLoopOutput>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    run(&AccelerateLoopArguments::parse(argv)?)
}

/// The loop (see the module documentation).
pub fn run(a: &AccelerateLoopArguments) -> Result<AccelerateLoopOutput> {
    let mut accelerator = Accelerator::new(AcceleratorOptions {
        cpu: a.cpu,
        mixed_precision: a.mixed_precision,
        ..Default::default()
    })?;
    let device = accelerator.device();
    tch::manual_seed(a.seed as i64);
    let mut model = BagOfWords::new(a.embedding_dim, device);
    let collator = shared_collator(DefaultDataCollator);
    let train_dataloader = accelerator.prepare_data_loader(DataLoader::new(
        Arc::new(InMemoryDataset::new(rows(a.train_rows, 1))),
        Arc::clone(&collator),
        Arc::new(RandomSampler::new(a.seed)),
        a.per_device_train_batch_size,
        false,
    )?);
    let eval_dataloader = accelerator.prepare_data_loader(DataLoader::new(
        Arc::new(InMemoryDataset::new(rows(a.eval_rows, 2))),
        collator,
        Arc::new(SequentialSampler),
        a.per_device_train_batch_size,
        false,
    )?);
    let mut named = model
        .var_store()
        .variables()
        .into_iter()
        .collect::<Vec<_>>();
    named.sort_by(|x, y| x.0.cmp(&y.0));
    let parameters: Vec<Tensor> = named.iter().map(|(_, t)| t.shallow_clone()).collect();
    accelerator.prepare_model(parameters.iter().map(Tensor::shallow_clone).collect())?;
    let mut optimizer = AdamW::new(
        vec![GroupSpec::new(named)],
        AdamWConfig {
            lr: a.learning_rate,
            weight_decay: a.weight_decay,
            fused: true,
            ..Default::default()
        },
    )?;

    let ga = a.gradient_accumulation_steps;
    let mut steps = Vec::with_capacity(a.max_steps);
    let mut epoch = 0;
    model.train();
    optimizer.zero_grad();
    'training: loop {
        let batches: Vec<_> = train_dataloader
            .epoch(epoch)
            .collect::<std::result::Result<_, _>>()?;
        for window in batches.chunks(ga) {
            let mut window_loss = Tensor::f_zeros([], (Kind::Float, device))?;
            for (i, batch) in window.iter().enumerate() {
                let batch = batch.to_device(device)?;
                accelerator.set_sync_gradients(i + 1 == window.len());
                let out = {
                    let _autocast = accelerator.autocast()?;
                    model.forward(&ModelInputs {
                        input_ids: batch.get("input_ids"),
                        labels: batch.get("labels"),
                        ..Default::default()
                    })?
                };
                let loss = out
                    .loss
                    .ok_or(tchtrain_models::Error::MissingInput { name: "labels" })?
                    .f_to_kind(Kind::Float)?
                    .f_div_scalar(window.len() as f64)?;
                accelerator.backward(&loss)?;
                window_loss = window_loss.f_add(&loss.detach())?;
            }
            let grad_norm =
                accelerator.clip_grad_norm_(&parameters, a.max_grad_norm, &optimizer)?;
            accelerator.optimizer_step(&mut optimizer)?;
            optimizer.zero_grad();
            steps.push(StepLog {
                step: steps.len() + 1,
                loss: accelerator
                    .reduce(&window_loss, Reduction::Mean)?
                    .f_double_value(&[])?,
                grad_norm: grad_norm.f_double_value(&[])?,
            });
            if steps.len() == a.max_steps {
                break 'training;
            }
        }
        epoch += 1;
    }

    model.eval();
    let (mut predictions, mut references, mut none) = (Vec::new(), Vec::new(), Vec::new());
    for batch in eval_dataloader.epoch(0) {
        let batch = batch?.to_device(device)?;
        let logits = tch::no_grad(|| {
            let _autocast = accelerator.autocast()?;
            model
                .forward(&ModelInputs {
                    input_ids: batch.get("input_ids"),
                    ..Default::default()
                })
                .map_err(Error::from)
        })?;
        predictions.push(logits.logits()?.f_argmax(-1, false)?);
        if let Some(labels) = batch.get("labels") {
            references.push(labels.shallow_clone());
        }
    }
    accelerator.gather_for_metrics(
        [&mut predictions, &mut references, &mut none],
        &eval_dataloader,
        false,
        true,
    )?;
    let (p, r) = (
        Tensor::f_cat(&predictions, 0)?,
        Tensor::f_cat(&references, 0)?,
    );
    let correct = p.f_eq_tensor(&r)?.f_sum(Kind::Int64)?.f_int64_value(&[])?;
    let eval_accuracy = correct as f64 / r.size()[0].max(1) as f64;

    if let Some(dir) = &a.output_dir
        && accelerator.is_main_process()
    {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("creating", dir, e))?;
        let path = dir.join("steps.json");
        let json = serde_json::json!({
            "steps": steps.iter().map(|s| serde_json::json!({
                "step": s.step, "loss": s.loss, "grad_norm": s.grad_norm,
            })).collect::<Vec<_>>(),
            "eval_accuracy": eval_accuracy,
        });
        std::fs::write(&path, json.to_string()).map_err(|e| Error::io("writing", &path, e))?;
    }
    accelerator.wait_for_everyone()?;
    Ok(AccelerateLoopOutput {
        steps,
        eval_accuracy,
    })
}

//! `custom_model`: a model the user wrote, trained by the Trainer like a hub model.
//!
//! [`BagOfWords`] is a few lines of tch (an embedding bag and a linear head) that implements
//! [`TrainableModel`]: its variables, train / eval mode, a forward that returns the loss when
//! the rows have labels, and two facts the Trainer reads off a model (its loss is a per-batch
//! mean, so `accepts_loss_kwargs` is false and the Trainer scales it over gradient
//! accumulation as upstream does; its head takes class ids, so the Trainer checks the labels
//! before the first step). Nothing else is needed: the Trainer drives it on one process or on
//! several (`cargo xtask launch`), checkpoints it (`model.safetensors` of its variables, as
//! upstream's Trainer saves a model that is not a `PreTrainedModel`) and resumes it exactly.
//!
//! The data is synthetic and seeded: rows of 8 token ids out of 32, labelled 1 when the row
//! holds token 3. Every `TrainingArguments` flag works on the command line:
//!
//! ```sh
//! cargo run --release -p tchtrain-examples --bin custom_model -- \
//!     --output_dir target/custom --max_steps 40 --learning_rate 0.05 --logging_steps 10
//! ```

use std::path::Path;

use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};
use tchtrain_data::InMemoryDataset;
use tchtrain_datasets::{Feature, Label};
use tchtrain_models::{LabelCheck, ModelInputs, ModelOutput, TrainableModel};
use tchtrain_trainer::{Metrics, Trainer};
use tchtrain_training_args::TrainingArguments;

use crate::ExampleOutput;
use crate::args::{self, ScriptCommandLine};
use crate::error::Result;
use tchtrain_training_args::{Dataclass, FieldSpec};

/// Token ids run over `0..VOCAB`.
pub const VOCAB: i64 = 32;
/// Tokens per row.
pub const ROW_LEN: usize = 8;
/// The token whose presence makes a row's label 1.
pub const MARKER: i64 = 3;

/// Mean of the token embeddings, then a linear map to 2 classes; cross entropy against
/// class ids.
pub struct BagOfWords {
    vs: nn::VarStore,
    /// Its parts are tch's own: the context nothing reads (no layer hooks, tracer or
    /// adapters).
    ctx: tchtrain_models::Context,
    embed: nn::Embedding,
    head: nn::Linear,
    training: bool,
}

impl BagOfWords {
    /// A fresh model with `dim`-wide embeddings, initialised from libtorch's global
    /// generator (seed it first for a reproducible start).
    pub fn new(dim: i64, device: Device) -> Self {
        let vs = nn::VarStore::new(device);
        let root = vs.root();
        let embed = nn::embedding(&root / "embed", VOCAB, dim, Default::default());
        let head = nn::linear(&root / "head", dim, 2, Default::default());
        Self {
            vs,
            ctx: tchtrain_models::Context::new(),
            embed,
            head,
            training: false,
        }
    }
}

impl TrainableModel for BagOfWords {
    fn context(&self) -> &tchtrain_models::Context {
        &self.ctx
    }
    fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }
    fn var_store_mut(&mut self) -> &mut nn::VarStore {
        &mut self.vs
    }
    fn is_training(&self) -> bool {
        self.training
    }
    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
    fn forward(&self, inputs: &ModelInputs<'_>) -> tchtrain_models::Result<ModelOutput> {
        let ids = inputs
            .input_ids
            .ok_or(tchtrain_models::Error::MissingInput { name: "input_ids" })?;
        let pooled = self.embed.forward(ids).f_mean_dim(1, false, Kind::Float)?;
        let logits = self.head.forward(&pooled);
        let loss = match inputs.labels {
            Some(labels) => Some(logits.f_cross_entropy_loss::<Tensor>(
                labels,
                None,
                tch::Reduction::Mean,
                -100,
                0.0,
            )?),
            None => None,
        };
        Ok(ModelOutput {
            loss,
            logits: Some(logits),
            last_hidden_state: None,
            pooler_output: None,
            aux_loss: None,
        })
    }
    fn model_name(&self) -> &str {
        "BagOfWords"
    }
    // A per-batch mean that ignores `num_items_in_batch`: the Trainer divides it by the
    // accumulation steps, as upstream does for a model without `**kwargs` in its forward.
    fn accepts_loss_kwargs(&self) -> bool {
        false
    }
    fn label_check(&self) -> Option<LabelCheck> {
        Some(LabelCheck::Sequence { num_labels: 2 })
    }
    fn is_embedding_weight(&self, name: &str) -> bool {
        name == "embed.weight"
    }
}

/// `n` seeded rows: 8 token ids each (a 64-bit LCG), label 1 when the row holds
/// [`MARKER`].
pub fn rows(n: usize, seed: u64) -> Vec<Feature> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            let ids: Vec<i64> = (0..ROW_LEN)
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((x >> 33) % VOCAB as u64) as i64
                })
                .collect();
            let label = i64::from(ids.contains(&MARKER));
            Feature::new(ids).with_labels(Label::Class(label))
        })
        .collect()
}

/// The script's own flags (defaults from [`COMMAND_LINE`]).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomModelArguments {
    /// `--embedding_dim` (default 16).
    pub embedding_dim: i64,
    /// `--train_rows` (default 256).
    pub train_rows: usize,
    /// `--eval_rows` (default 64).
    pub eval_rows: usize,
}

impl Default for CustomModelArguments {
    fn default() -> Self {
        args::defaults(COMMAND_LINE)
            .unwrap_or_else(|e| unreachable!("custom_model's defaults read: {e}"))
    }
}

static CUSTOM_MODEL_ARGUMENTS: Dataclass = Dataclass {
    name: "CustomModelArguments",
    fields: &[
        FieldSpec::int("embedding_dim", "16", "Embedding width."),
        FieldSpec::int("train_rows", "256", "Training rows."),
        FieldSpec::int("eval_rows", "64", "Evaluation rows."),
    ],
};

/// The command line: the script's one dataclass.
pub const COMMAND_LINE: &[&Dataclass] = &[&CUSTOM_MODEL_ARGUMENTS];

const LINE: ScriptCommandLine = ScriptCommandLine {
    title: "custom_model: a user-written TrainableModel (an embedding bag classifier) on seeded rows",
    dataclasses: COMMAND_LINE,
    refused: &[],
};

/// Runs the script with `argv` (without the program name).
pub fn main_with_args<I, S>(argv: I) -> Result<ExampleOutput>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let (values, training) = args::parse(argv, &LINE)?;
    let custom: CustomModelArguments = values.take(&[0])?;
    run(&custom, training)
}

/// Trains (and evaluates) [`BagOfWords`] with `training`, resuming as
/// `--resume_from_checkpoint` says; saves the model and the trainer state like the other
/// scripts.
pub fn run(custom: &CustomModelArguments, training: TrainingArguments) -> Result<ExampleOutput> {
    if training.do_predict {
        return Err(crate::Error::InvalidFlag {
            flag: "do_predict".into(),
            detail: "custom_model has no test split: use --do_eval for its held-out rows".into(),
        });
    }
    // Upstream's scripts call `set_seed(training_args.seed)` before building the model.
    tch::manual_seed(training.seed as i64);
    let model = BagOfWords::new(custom.embedding_dim, Device::Cpu);
    let output_dir = Path::new(training.output_dir()).to_path_buf();
    let resume = crate::common::resume_point(&training)?;
    let mut trainer = Trainer::builder(Box::new(model), training)
        .train_dataset(InMemoryDataset::new(rows(custom.train_rows, 1)))
        .eval_dataset(InMemoryDataset::new(rows(custom.eval_rows, 2)))
        .build()?;
    let mut out = ExampleOutput {
        output_dir,
        ..ExampleOutput::default()
    };
    if trainer.args().do_train {
        let result = trainer.train(resume)?;
        trainer.save_model(None)?;
        let metrics: Metrics = result.metrics;
        trainer.log_metrics("train", &metrics);
        trainer.save_metrics("train", &metrics, true)?;
        trainer.save_state()?;
        out.train_metrics = Some(metrics);
    }
    if trainer.args().do_eval {
        let metrics = trainer.evaluate(None, "eval")?;
        trainer.log_metrics("eval", &metrics);
        trainer.save_metrics("eval", &metrics, true)?;
        out.eval_metrics = Some(metrics);
    }
    Ok(out)
}

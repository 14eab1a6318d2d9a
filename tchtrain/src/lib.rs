//! `tchtrain` — the Hugging Face `transformers` Trainer stack in Rust on `tch` (libtorch).
//!
//! This facade re-exports every tchtrain crate under the name of the upstream module it
//! mirrors. Each crate is also usable on its own.
//!
//! | module | crate | upstream |
//! |---|---|---|
//! | [`training_args`] | `tchtrain-training-args` | `training_args.py` |
//! | [`callbacks`] | `tchtrain-callbacks` | `trainer_callback.py` |
//! | [`optim`] | `tchtrain-optim` | `optimization.py`, `torch.optim` |
//! | [`losses`] | `tchtrain-losses` | `loss/loss_utils.py` |
//! | [`datasets`] | `tchtrain-datasets` | Hugging Face `datasets` |
//! | [`collators`] | `tchtrain-collators` | `data/data_collator.py` |
//! | [`data`] | `tchtrain-data` | `torch.utils.data`, accelerate's data loader |
//! | [`models`] | `tchtrain-models` | `modeling_utils.py` + model files |
//! | [`distributed`] | `tchtrain-distributed` | `torch.distributed` |
//! | [`accelerate`] | `tchtrain-accelerate` | accelerate's `Accelerator` |
//! | [`deepspeed`] | `tchtrain-deepspeed` | `integrations/deepspeed.py` |
//! | [`fsdp`] | `tchtrain-fsdp` | FSDP integration |
//! | [`trainer`] | `tchtrain-trainer` | `trainer.py` |
//!
//! [`prelude`] holds the types a transformers user types daily. `tch` itself is
//! re-exported, so one dependency gives the tensors too:
//!
//! ```
//! use tchtrain::tch::{Kind, Tensor};
//!
//! let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0]).set_requires_grad(true);
//! let loss = (&x * &x).sum(Kind::Float);
//! loss.backward();
//! assert_eq!(Vec::<f32>::try_from(x.grad()).unwrap(), vec![2.0, 4.0, 6.0]);
//! ```

pub use tch;
pub use tchtrain_accelerate as accelerate;
pub use tchtrain_callbacks as callbacks;
pub use tchtrain_collators as collators;
pub use tchtrain_data as data;
pub use tchtrain_datasets as datasets;
pub use tchtrain_deepspeed as deepspeed;
pub use tchtrain_distributed as distributed;
pub use tchtrain_fsdp as fsdp;
pub use tchtrain_losses as losses;
pub use tchtrain_models as models;
pub use tchtrain_optim as optim;
pub use tchtrain_trainer as trainer;
pub use tchtrain_training_args as training_args;

/// The types a transformers user types daily: `use tchtrain::prelude::*;`. The README's
/// first Trainer (kept compiling here):
///
/// ```no_run
/// use tchtrain::prelude::*;
/// use tchtrain::tch::Device;
///
/// fn main() -> anyhow::Result<()> {
///     let model = from_pretrained_dir(
///         "assets/tiny-gpt2".as_ref(),
///         AutoTask::CausalLm,
///         Device::Cpu,
///         &LoadOptions::default(),
///     )?
///     .model;
///     // Two rows of token ids; for a causal LM the labels are the ids (shifted inside the loss).
///     let rows: Vec<Feature> = [vec![464, 3290, 318, 257], vec![40, 716, 257, 1310]]
///         .into_iter()
///         .map(|ids| Feature::new(ids.clone()).with_labels(Label::Ids(ids)))
///         .collect();
///     let mut args = TrainingArguments {
///         max_steps: 3,
///         per_device_train_batch_size: 2,
///         learning_rate: 1e-3,
///         logging_steps: 1.0,
///         use_cpu: true,
///         report_to: vec![],
///         ..TrainingArguments::new("target/quickstart".to_string())
///     };
///     args.post_init()?;
///     let mut trainer = Trainer::builder(model, args)
///         .train_dataset(InMemoryDataset::new(rows))
///         .build()?;
///     let output = trainer.train(None)?;
///     println!("train_loss {}", output.metrics["train_loss"]);
///     Ok(())
/// }
/// ```
pub mod prelude {
    pub use tchtrain_callbacks::{
        EarlyStoppingCallback, TrainerCallback, TrainerControl, TrainerState,
    };
    pub use tchtrain_collators::{
        DataCollator, DataCollatorForLanguageModeling, DataCollatorWithPadding,
        DefaultDataCollator, TokenizerInfo,
    };
    pub use tchtrain_data::{Dataset, InMemoryDataset, IterableDataset};
    pub use tchtrain_datasets::{Feature, Label};
    pub use tchtrain_models::{
        AutoTask, LoadOptions, ModelInputs, ModelOutput, PreTrainedModel, TrainableModel,
        from_pretrained_dir,
    };
    pub use tchtrain_trainer::{
        EvalPrediction, Metrics, ResumeFrom, Trainer, TrainerBuilder, TrainerHooks,
    };
    pub use tchtrain_training_args::{
        HfArgumentParser, IntervalStrategy, OptimizerNames, SaveStrategy, SchedulerType,
        TrainingArguments,
    };
}

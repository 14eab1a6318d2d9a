//! The error type of `tchtrain-trainer`: one typed variant per failure, the lower crates'
//! errors wrapped with `#[from]`.

use std::path::PathBuf;

/// Errors returned by `tchtrain-trainer`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An error raised by libtorch.
    #[error(transparent)]
    Torch(#[from] tch::TchError),
    /// An error from the model crate (forward pass, loading, saving).
    #[error(transparent)]
    Model(#[from] tchtrain_models::Error),
    /// An error from the optimizer / scheduler crate.
    #[error(transparent)]
    Optim(#[from] tchtrain_optim::Error),
    /// Reading or writing one of upstream's torch files (`optimizer.pt`, `rng_state.pth`, ...).
    #[error(transparent)]
    Serialization(#[from] tchtrain_serialization::Error),
    /// An error from a callback or the trainer state.
    #[error(transparent)]
    Callbacks(#[from] tchtrain_callbacks::Error),
    /// An error from a loss function (label smoothing).
    #[error(transparent)]
    Losses(#[from] tchtrain_losses::Error),
    /// An error from a data collator.
    #[error(transparent)]
    Collator(#[from] tchtrain_collators::Error),
    /// An error from the data loader or a dataset (a row that cannot be read, the prefetch
    /// thread).
    #[error(transparent)]
    Data(#[from] tchtrain_data::Error),
    /// An error from the training arguments (validation, JSON).
    #[error(transparent)]
    TrainingArgs(#[from] tchtrain_training_args::Error),
    /// A collective or the rendezvous of a data-parallel run failed (a rank died, the
    /// `ddp_timeout` elapsed, a bad launcher environment).
    #[error("distributed training: {0}")]
    Distributed(#[from] tchtrain_distributed::Error),
    /// An error from the DeepSpeed integration (config mismatch, ZeRO engine, shard files).
    #[error("deepspeed: {0}")]
    DeepSpeed(#[from] tchtrain_deepspeed::Error),
    /// An error from the FSDP integration (plugin arguments, upstream's FSDP checks).
    #[error("fsdp: {0}")]
    Fsdp(#[from] tchtrain_fsdp::Error),
    /// Pushing to the hub failed (`push_to_hub`: the repository, an upload, the commit).
    #[error(
        "push to the hub: {0}; the model and checkpoints in output_dir are intact: push them again later (push_to_hub, or `hf upload`)"
    )]
    Hub(String),
    /// `compute_metrics` asked for one tensor where the evaluation kept one per batch.
    #[error(
        "the evaluation outputs are a list of {batches} batches because `eval_do_concat_batches` is false: read them with `.batches()` (or `.concatenated()`), or leave eval_do_concat_batches at true"
    )]
    BatchesNotConcatenated {
        /// How many batches were kept.
        batches: usize,
    },
    /// Reading or writing a file failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done (`"reading"`, `"writing"`, `"renaming"`, ...).
        action: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A checkpoint could not be written (the disk full, a file-size limit, a read-only
    /// folder, a file removed while saving): its partial folder was removed, the previous
    /// checkpoint is untouched and the newest complete one; the training stops here (see
    /// [`SaveFailure`](crate::SaveFailure)).
    #[error("{failure}")]
    CheckpointSave {
        /// What failed, why, and what a resume can start from.
        failure: Box<crate::SaveFailure>,
        /// The error the write returned.
        #[source]
        source: Box<Error>,
    },
    /// The SIGINT / SIGTERM handler of `enable_jit_checkpoint` could not be installed.
    #[error("installing the SIGINT / SIGTERM handler for enable_jit_checkpoint: {0}")]
    Signal(#[source] std::io::Error),
    /// A JSON file of a checkpoint could not be parsed or written.
    #[error("JSON in {}: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: serde_json::Error,
    },
    /// A dataset has no rows where some are needed.
    #[error("the {what} dataset is empty{hint}")]
    EmptyDataset {
        /// Which dataset (`"training"`, `"evaluation"`).
        what: &'static str,
        /// How to fix it (may be empty).
        hint: String,
    },
    /// A dataset is needed but none was given.
    #[error("{what} requires a{} {dataset} dataset; {fix}", if dataset.starts_with('e') { "n" } else { "" })]
    MissingDataset {
        /// The operation (`"training"`, `"evaluation"`, `eval_strategy=\"steps\"`).
        what: String,
        /// Which dataset (`"train"`, `"eval"`).
        dataset: &'static str,
        /// How to fix it.
        fix: &'static str,
    },
    /// The accelerator refused (a ZeRO layout or setting the engine does not run with).
    #[error(transparent)]
    Accelerate(tchtrain_accelerate::Error),
    /// The arguments are invalid for the Trainer (checked before training starts).
    #[error("invalid `{field}`: {detail}")]
    InvalidArgument {
        /// The `TrainingArguments` field or Trainer option.
        field: &'static str,
        /// What is wrong and how to fix it.
        detail: String,
    },
    /// The model returned no loss (no `labels` in the batch, or a model without a loss).
    #[error(
        "the model did not return a loss from the inputs ({keys}); the batch needs `labels`, or override `TrainerHooks::compute_loss`"
    )]
    MissingLoss {
        /// The batch's keys.
        keys: String,
    },
    /// `metric_for_best_model` (or a metric-driven scheduler) names a metric evaluation did not return.
    #[error(
        "the `metric_for_best_model` training argument is set to '{metric}', which is not found in the evaluation metrics; the available evaluation metrics are: {available}"
    )]
    MetricNotFound {
        /// The metric looked for.
        metric: String,
        /// The metrics there are.
        available: String,
    },
    /// No `checkpoint-N` folder where one was asked for.
    #[error("no valid checkpoint found in output directory ({})", dir.display())]
    NoCheckpoint {
        /// The folder searched.
        dir: PathBuf,
    },
    /// [`TrainerBuilder::stop_on_non_finite`](crate::TrainerBuilder::stop_on_non_finite):
    /// an optimizer step's gradient norm was NaN or infinite; the step was not applied.
    #[error(
        "the gradient norm of step {step} is {grad_norm} (a NaN or infinite loss, or overflowing gradients); the update was not applied and the last good state is saved in {}: lower the learning rate, check the data of that step, or resume from that checkpoint",
        checkpoint.display()
    )]
    NonFiniteLoss {
        /// The optimizer step (1-based) whose gradients were not finite.
        step: i64,
        /// The non-finite norm.
        grad_norm: f64,
        /// The checkpoint of the state after the previous step.
        checkpoint: PathBuf,
    },
    /// A checkpoint that does not fit this training (missing file, different model).
    #[error("checkpoint {}: {detail}", dir.display())]
    InvalidCheckpoint {
        /// The checkpoint folder.
        dir: PathBuf,
        /// What does not fit.
        detail: String,
    },
    /// A label value that cannot be used (not in the label list, not a number for
    /// regression).
    #[error("label '{label}' in row {row}: {detail}")]
    InvalidLabel {
        /// The value found.
        label: String,
        /// The 0-based row.
        row: usize,
        /// What is wrong and how to fix it.
        detail: String,
    },
}

impl Error {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source,
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl From<tchtrain_accelerate::Error> for Error {
    /// The accelerator's errors as the Trainer reports its own: a bad option is
    /// [`Error::InvalidArgument`], a collective [`Error::Distributed`], the scaler
    /// [`Error::Optim`], libtorch [`Error::Torch`].
    fn from(e: tchtrain_accelerate::Error) -> Self {
        use tchtrain_accelerate::Error as A;
        match e {
            A::InvalidArgument { field, detail } => Error::InvalidArgument { field, detail },
            A::Distributed(e) => Error::Distributed(e),
            A::Optim(e) => Error::Optim(e),
            A::Torch(e) => Error::Torch(e),
            other => Error::Accelerate(other),
        }
    }
}

//! The error type of `tchtrain-accelerate`.

/// Errors returned by `tchtrain-accelerate`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An option (or the launcher's environment) the accelerator cannot run with.
    #[error("invalid `{field}`: {detail}")]
    InvalidArgument {
        /// The option, as the Trainer's `TrainingArguments` names it (`ddp_backend`,
        /// `WORLD_SIZE`, ...).
        field: &'static str,
        /// What is wrong and what to use instead.
        detail: String,
    },
    /// A ZeRO setting the engine does not run with.
    #[error("DeepSpeed config `{key}` = {value}: {fix}")]
    InvalidConfig {
        /// The dotted key.
        key: String,
        /// The value.
        value: String,
        /// What to do.
        fix: &'static str,
    },
    /// Parameters that cannot be sharded, or shards that do not fit the layout.
    #[error("ZeRO sharding: {detail}")]
    Sharding {
        /// What is wrong.
        detail: String,
    },
    /// DeepSpeed's dynamic loss scaler overflowed at its minimum scale (its `Exception`).
    #[error(
        "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run. (DeepSpeed's message: the fp16 gradients overflowed at loss scale {scale} = fp16.min_loss_scale; lower fp16.min_loss_scale, lower the learning rate, or train in bf16)"
    )]
    LossScaleAtMinimum {
        /// The scale that overflowed.
        scale: f64,
    },
    /// A collective failed.
    #[error(transparent)]
    Distributed(#[from] tchtrain_distributed::Error),
    /// The optimizer or the loss scaler refused.
    #[error(transparent)]
    Optim(#[from] tchtrain_optim::Error),
    /// An error raised by libtorch.
    #[error(transparent)]
    Torch(#[from] tch::TchError),
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

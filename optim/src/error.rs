//! The error type of `tchtrain-optim`.

use std::path::PathBuf;

/// Errors returned by `tchtrain-optim`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An error raised by libtorch.
    #[error(transparent)]
    Torch(#[from] tch::TchError),

    /// Reading or writing a state file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A torch checkpoint file (`optimizer.pt`, ...) could not be read or written.
    #[error(transparent)]
    Serialization(#[from] tchtrain_serialization::Error),

    /// A torch state file (`optimizer.pt`, `scheduler.pt`, `scaler.pt`) holds something this
    /// optimizer / scheduler cannot take, or ours has no torch form.
    #[error("{file}: `{field}`: {detail}")]
    TorchState {
        /// The file (`optimizer.pt`).
        file: String,
        /// The field (`param_groups[0].params`, `state[3].exp_avg`).
        field: String,
        /// What is wrong.
        detail: String,
    },

    /// A state JSON file could not be parsed or written.
    #[error("{path}: invalid state JSON: {source}")]
    Json {
        /// The file (empty when parsing a value in memory).
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: serde_json::Error,
    },

    /// A hyper-parameter is out of its valid range (torch.optim's `Invalid ... value`).
    #[error("invalid {name}: {value} ({expected})")]
    InvalidHyperparameter {
        /// Upstream name of the hyper-parameter (`lr`, `betas[0]`, `eps`, ...).
        name: &'static str,
        /// The value given.
        value: f64,
        /// What is accepted.
        expected: &'static str,
    },

    /// `GradScaler` used out of order (torch's messages: `unscale_()` twice, `step()` twice
    /// before `update()`, no `scale()` first) or on float16 gradients.
    #[error("GradScaler: {0}")]
    GradScaler(String),

    /// Two options that cannot be combined (e.g. Adafactor's manual `lr` with `relative_step`).
    #[error("conflicting options: {0}")]
    ConflictingOptions(&'static str),

    /// `load_state_dict` was given the state of another optimizer.
    #[error("state dict is for optimizer `{found}`, this optimizer is `{expected}`")]
    OptimizerMismatch {
        /// This optimizer's name.
        expected: String,
        /// The name in the state dict.
        found: String,
    },

    /// The param-group layout of a state dict differs from this optimizer's.
    #[error("param group layout differs: {detail}")]
    GroupLayoutMismatch {
        /// What differs (group count, group sizes, parameter names).
        detail: String,
    },

    /// A state tensor has another shape than the parameter it belongs to requires.
    #[error("state `{key}` of parameter {param}: expected shape {expected:?}, found {found:?}")]
    ShapeMismatch {
        /// Flat parameter index (torch's state_dict key).
        param: usize,
        /// State entry (`exp_avg`, ...).
        key: String,
        /// The shape required.
        expected: Vec<i64>,
        /// The shape in the state dict.
        found: Vec<i64>,
    },

    /// A state entry the optimizer needs is absent.
    #[error("missing state `{key}` for parameter {param}")]
    MissingState {
        /// Flat parameter index.
        param: usize,
        /// State entry (`exp_avg`, `step`, ...).
        key: String,
    },

    /// A list given per param group has the wrong length.
    #[error("{what}: expected {expected} values (one per param group), got {found}")]
    GroupCountMismatch {
        /// Which list.
        what: &'static str,
        /// Number of param groups.
        expected: usize,
        /// Length given.
        found: usize,
    },

    /// No scheduler has this name (upstream `SchedulerType`).
    #[error("unknown scheduler `{name}`; accepted: {accepted}")]
    UnknownScheduler {
        /// The name given.
        name: String,
        /// The accepted names, comma-separated.
        accepted: String,
    },

    /// A scheduler got a keyword argument it does not take.
    #[error(
        "scheduler `{scheduler}` got an unexpected keyword argument `{kwarg}`; accepted: {accepted}"
    )]
    UnknownSchedulerKwarg {
        /// Scheduler name.
        scheduler: String,
        /// The offending keyword.
        kwarg: String,
        /// The accepted keywords, comma-separated (empty when it takes none).
        accepted: String,
    },

    /// A scheduler keyword argument has the wrong type or an invalid value.
    #[error("scheduler `{scheduler}`: invalid value for `{kwarg}`: {reason}")]
    InvalidSchedulerKwarg {
        /// Scheduler name.
        scheduler: String,
        /// The keyword.
        kwarg: String,
        /// What is wrong.
        reason: String,
    },

    /// A scheduler needs an argument that was not given (`num_warmup_steps`, `num_training_steps`, ...).
    #[error("scheduler `{scheduler}` requires `{argument}`, please provide that argument")]
    MissingSchedulerArgument {
        /// Scheduler name.
        scheduler: String,
        /// The missing argument.
        argument: &'static str,
    },

    /// `step()` was called on a scheduler that steps on a metric, or the reverse.
    #[error("scheduler `{scheduler}` {reason}")]
    WrongStepKind {
        /// Scheduler name.
        scheduler: String,
        /// `steps on a metric: call step_with_metric` or the reverse.
        reason: &'static str,
    },

    /// A scheduler state dict is for another scheduler or lacks a field.
    #[error("scheduler state: {detail}")]
    SchedulerStateMismatch {
        /// What differs.
        detail: String,
    },

    /// `optim` is not one of upstream's `OptimizerNames`, or is one tchtrain refuses (the
    /// reason and the name to use instead come from `OptimizerNames::support`).
    #[error("unsupported optimizer `{name}`: {why}; use `{instead}` instead")]
    UnsupportedOptimizer {
        /// The name given.
        name: String,
        /// Why it is refused.
        why: String,
        /// The name to use instead.
        instead: String,
    },

    /// The optimizer's arguments do not fit what it needs (`optim_target_modules` missing,
    /// a layer-wise optimizer with gradient accumulation, ...), as upstream's handler refuses.
    #[error("optimizer `{name}`: {detail}")]
    InvalidOptimizerSetup {
        /// The `optim` name.
        name: String,
        /// What is wrong and what to do.
        detail: String,
    },

    /// `fused_backward` on an optimizer that does not fuse its update into the backward, or a
    /// loss it cannot run the fused backward of.
    #[error("optimizer `{optimizer}`: {detail}")]
    FusedBackward {
        /// The optimizer's name.
        optimizer: &'static str,
        /// What is wrong and what to do.
        detail: String,
    },

    /// `step()` on a schedule-free optimizer that is not in train mode (upstream raises the
    /// same).
    #[error(
        "{optimizer}: optimizer was not in train mode when step is called; call train() before \
         the training steps and eval() before evaluating"
    )]
    NotInTrainMode {
        /// The optimizer's name.
        optimizer: &'static str,
    },

    /// `optim_args` is not a comma-separated list of `key=value`.
    #[error("invalid optim_args entry `{entry}`: expected key=value")]
    InvalidOptimArgs {
        /// The offending entry.
        entry: String,
    },

    /// An `optim_args` value could not be parsed.
    #[error("optim_args `{key}={value}`: expected {expected}")]
    InvalidOptimArgValue {
        /// The key.
        key: String,
        /// The value.
        value: String,
        /// The type expected.
        expected: &'static str,
    },

    /// The total gradient norm is nan or inf and `error_if_nonfinite` was set.
    #[error(
        "the total norm of order {norm_type} for gradients from `parameters` is non-finite, so it \
         cannot be clipped; to disable this error and scale the gradients by the non-finite norm \
         anyway, set `error_if_nonfinite=false`"
    )]
    NonFiniteNorm {
        /// The norm order.
        norm_type: f64,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

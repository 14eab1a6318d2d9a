//! The error type of `tchtrain-losses`.

use tch::Kind;

/// Errors returned by `tchtrain-losses`.
///
/// Every check runs before libtorch is called, so bad input surfaces as one of the typed
/// variants below rather than as a libtorch exception (or a panic).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An error raised by libtorch.
    #[error(transparent)]
    Torch(#[from] tch::TchError),

    /// A tensor that must hold at least one element is empty.
    #[error("`{what}` is empty (shape {shape:?}); a loss needs at least one element")]
    EmptyBatch {
        /// The argument that is empty.
        what: &'static str,
        /// Its shape.
        shape: Vec<i64>,
    },

    /// Two tensors (or a tensor and a size argument) do not fit together.
    #[error("shape mismatch: `{what}` has shape {got:?}, expected {expected}")]
    ShapeMismatch {
        /// The argument whose shape is wrong.
        what: &'static str,
        /// What the shape should be, in words (derived from the other arguments).
        expected: String,
        /// The shape received.
        got: Vec<i64>,
    },

    /// A class index outside `0..num_classes` that is not the ignore index.
    #[error(
        "`{what}` holds the class index {label}, outside 0..{num_classes} and not the ignore index {ignore_index}"
    )]
    LabelOutOfRange {
        /// The argument holding the label.
        what: &'static str,
        /// The first offending label.
        label: i64,
        /// Number of classes (the size of the logits' class dimension).
        num_classes: i64,
        /// The ignore index in effect.
        ignore_index: i64,
    },

    /// A tensor has a dtype the loss cannot use.
    #[error("`{what}` has dtype {got:?}, expected {expected}")]
    InvalidDtype {
        /// The argument with the wrong dtype.
        what: &'static str,
        /// The dtypes accepted, in words.
        expected: &'static str,
        /// The dtype received.
        got: Kind,
    },

    /// A `LOSS_MAPPING` key that upstream does not have.
    #[error("unknown loss type `{0}` (not a key of transformers' LOSS_MAPPING)")]
    UnknownLossType(String),

    /// A `LOSS_MAPPING` key that exists upstream but whose loss (object detection, CTC,
    /// segmentation, speech) is not implemented here.
    #[error("loss type `{0}` exists in LOSS_MAPPING but is not implemented by tchtrain-losses")]
    UnsupportedLossType(String),

    /// A `problem_type` string that is not one of upstream's three.
    #[error(
        "invalid problem type `{0}`; expected regression, single_label_classification or multi_label_classification"
    )]
    InvalidProblemType(String),

    /// A `num_labels` or `vocab_size` that is zero or negative.
    #[error("`{what}` must be positive, got {value}")]
    NonPositiveSize {
        /// The argument.
        what: &'static str,
        /// The value received.
        value: i64,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

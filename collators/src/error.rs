//! The error type of `tchtrain-collators`.

use std::path::PathBuf;

/// Errors returned by `tchtrain-collators`.
///
/// Bad input (an empty batch, rows of different lengths that are not padded, labels
/// that do not fit their rows, missing pad or mask tokens) is reported with one of the
/// typed variants below before any tensor is built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An error raised by libtorch.
    #[error(transparent)]
    Torch(#[from] tch::TchError),

    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },

    /// A JSON file (tokenizer config) could not be parsed.
    #[error("parsing {path}: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The parse error.
        source: serde_json::Error,
    },

    /// The `tokenizers` crate could not load a tokenizer.
    #[error("loading tokenizer {path}: {source}")]
    Tokenizer {
        /// The tokenizer file.
        path: PathBuf,
        /// The error reported by `tokenizers`.
        #[source]
        source: tokenizers::Error,
    },

    /// The batch has no rows.
    #[error("the batch is empty; a collator needs at least one feature")]
    EmptyBatch,

    /// Rows that must form one tensor have different lengths (not padded, or padding
    /// that could not reach a common length).
    #[error(
        "rows of `{key}` have different lengths {lengths:?} and cannot be stacked; pad them (padding = longest / max_length with a max_length at least as long as every row)"
    )]
    RaggedBatch {
        /// The batch key.
        key: &'static str,
        /// The length of each row.
        lengths: Vec<usize>,
    },

    /// A key present in the first feature is missing in another one, or the other way round.
    #[error("feature {index} {presence} `{key}` but feature 0 {other}")]
    InconsistentFeatures {
        /// The key.
        key: &'static str,
        /// The feature that differs from the first.
        index: usize,
        /// `"has"` or `"lacks"`.
        presence: &'static str,
        /// `"does not"` or `"does"`.
        other: &'static str,
    },

    /// Labels of a kind this collator cannot use (e.g. a class id where a sequence is needed,
    /// or a mix of kinds across the batch).
    #[error("feature {index}: labels must be {expected}")]
    LabelKind {
        /// The feature.
        index: usize,
        /// What the collator needs, in words.
        expected: &'static str,
    },

    /// A feature's labels are longer than the padded sequence they belong to.
    #[error(
        "feature {index}: labels have {label_len} entries but the padded sequence has {seq_len}"
    )]
    LabelLengthMismatch {
        /// The feature.
        index: usize,
        /// Its number of labels.
        label_len: usize,
        /// The padded sequence length.
        seq_len: usize,
    },

    /// A per-token field (attention_mask, token_type_ids, ...) has a different length
    /// than the feature's input_ids.
    #[error("feature {index}: `{key}` has {len} entries but input_ids has {input_len}")]
    FieldLengthMismatch {
        /// The feature.
        index: usize,
        /// The field.
        key: &'static str,
        /// Its length.
        len: usize,
        /// The length of input_ids.
        input_len: usize,
    },

    /// A packed row's `seq_lengths` do not split its `input_ids` (a negative length, or a
    /// sum other than the row's length).
    #[error(
        "feature {index}: `seq_lengths` {seq_lengths:?} do not split its {input_len} input_ids (each length >= 0, their sum the row's length)"
    )]
    SeqLengthsMismatch {
        /// The feature.
        index: usize,
        /// Its `seq_lengths`.
        seq_lengths: Vec<i64>,
        /// The length of input_ids.
        input_len: usize,
    },

    /// Padding was asked for but the tokenizer has no pad token.
    #[error(
        "asking to pad but the tokenizer has no pad token; set `pad_token_id` on the TokenizerInfo (e.g. to the eos id)"
    )]
    NoPadToken,

    /// Masked language modeling needs a mask token.
    #[error(
        "this tokenizer has no mask token, which masked language modeling needs; use mlm = false for causal language modeling"
    )]
    NoMaskToken,

    /// A probability outside `[0, 1]`.
    #[error("{name} should be between 0 and 1, got {value}")]
    InvalidProbability {
        /// The field.
        name: &'static str,
        /// The value.
        value: f64,
    },

    /// `mask_replace_prob + random_replace_prob > 1`.
    #[error(
        "the sum of mask_replace_prob ({mask_replace_prob}) and random_replace_prob ({random_replace_prob}) should not exceed 1"
    )]
    ReplaceProbabilitiesExceedOne {
        /// `mask_replace_prob`.
        mask_replace_prob: f64,
        /// `random_replace_prob`.
        random_replace_prob: f64,
    },

    /// Whole-word masking was asked for without masked language modeling.
    #[error("whole word masking can only be used with mlm = true")]
    WholeWordMaskWithoutMlm,

    /// Whole-word masking needs each feature's `offset_mapping`.
    #[error(
        "feature {index} has no offset_mapping, which whole word masking needs (tokenize with offsets)"
    )]
    MissingOffsetMapping {
        /// The feature.
        index: usize,
    },

    /// `pad_to_multiple_of` of zero.
    #[error("pad_to_multiple_of must be positive")]
    ZeroPadToMultipleOf,

    /// A feature with no token where at least one is needed.
    #[error("feature {index} has no input_ids")]
    EmptySequence {
        /// The feature.
        index: usize,
    },

    /// Multiple-choice examples with different numbers of choices.
    #[error("example {index} has {got} choices but example 0 has {expected}")]
    ChoiceCountMismatch {
        /// The example.
        index: usize,
        /// Number of choices of example 0.
        expected: usize,
        /// Number of choices of this example.
        got: usize,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

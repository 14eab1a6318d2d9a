//! `Feature`: one tokenized dataset row (upstream's dict of `input_ids`,
//! `attention_mask`, ... and `label` / `labels`), and its [`Label`].

/// The label of one row: upstream's `label` (a class id or a float) or `labels` /
/// `label_ids` (a sequence of ids or of floats).
#[derive(Debug, Clone, PartialEq)]
pub enum Label {
    /// A class id (`int` upstream): collated as int64.
    Class(i64),
    /// A regression target (`float` upstream): collated as float32.
    Value(f64),
    /// Token / tag ids (`list[int]`): collated as int64, padded by the collators that pad labels.
    Ids(Vec<i64>),
    /// Several floats (multi-label targets, `list[float]`): collated as float32.
    Values(Vec<f64>),
}

/// A column of a row that no field of [`Feature`] names (TRL's `chosen_ids`, `rejected_ids`,
/// `margin`, ...): the trainers that read it say which; the default collators ignore it.
#[derive(Debug, Clone, PartialEq)]
pub enum Column {
    /// A list of ids (`list[int]`).
    Ids(Vec<i64>),
    /// A float (`float`).
    Float(f64),
    /// A float32 array of `shape` (an image processor's `pixel_values` `[channels, height,
    /// width]`): stacked into `[batch, ...shape]` by the default collator.
    Floats {
        /// The array's shape.
        shape: Vec<i64>,
        /// Its values, row-major.
        values: Vec<f32>,
    },
}

/// One tokenized row, as a tokenizer returns it (`input_ids`, `token_type_ids`,
/// `attention_mask`, and on request `special_tokens_mask` and `offset_mapping`), plus
/// its label.
///
/// Optional fields that are `None` in the first row of a batch are left out of the
/// batch, as upstream leaves out keys that are absent (or `None`) in the first row; a
/// field must be present in every row or in none.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Feature {
    /// Token ids.
    pub input_ids: Vec<i64>,
    /// Segment ids (BERT-style tokenizers).
    pub token_type_ids: Option<Vec<i64>>,
    /// 1 for real tokens, 0 for padding; added (all ones) by padding when absent.
    pub attention_mask: Option<Vec<i64>>,
    /// 1 for special tokens (`[CLS]`, `[SEP]`, padding); MLM never masks them.
    pub special_tokens_mask: Option<Vec<i64>>,
    /// Character span of each token; whole-word masking groups tokens by it.
    pub offset_mapping: Option<Vec<(i64, i64)>>,
    /// The label (`label`, `labels` or `label_ids` upstream; always `labels` in the batch).
    pub labels: Option<Label>,
    /// Token index where the answer starts (upstream's `start_positions` column of
    /// question answering, `run_qa`'s `prepare_train_features`); collated as int64 `[batch]`.
    pub start_positions: Option<i64>,
    /// Token index where the answer ends (upstream's `end_positions`).
    pub end_positions: Option<i64>,
    /// The lengths of the documents a packed row holds, in order (the `seq_lengths` column
    /// of TRL's `pack_dataset`, see [`pack_dataset`](crate::pack_dataset)); a padding-free
    /// collator restarts `position_ids` at each.
    pub seq_lengths: Option<Vec<i64>>,
    /// The row's other columns, by name (see [`Column`]).
    pub columns: std::collections::BTreeMap<String, Column>,
}

impl Feature {
    /// A row with only `input_ids`.
    pub fn new(input_ids: Vec<i64>) -> Self {
        Self {
            input_ids,
            ..Self::default()
        }
    }

    /// This row with `labels` set.
    pub fn with_labels(mut self, labels: Label) -> Self {
        self.labels = Some(labels);
        self
    }

    /// This row with column `name` set to `value`.
    pub fn with_column(mut self, name: impl Into<String>, value: Column) -> Self {
        self.columns.insert(name.into(), value);
        self
    }

    /// Column `name`, if the row has it.
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.get(name)
    }

    /// This row with an answer span (`start_positions`, `end_positions`).
    pub fn with_answer(mut self, start: i64, end: i64) -> Self {
        self.start_positions = Some(start);
        self.end_positions = Some(end);
        self
    }

    /// A row from a `tokenizers` encoding: `input_ids`, `token_type_ids`,
    /// `attention_mask`, `special_tokens_mask` and `offset_mapping`.
    ///
    /// `token_type_ids` is kept only when `with_token_type_ids` (upstream returns it
    /// only for tokenizers whose `model_input_names` list it, e.g. BERT, not Llama or
    /// GPT-2).
    pub fn from_encoding(encoding: &tokenizers::Encoding, with_token_type_ids: bool) -> Self {
        let ids = |v: &[u32]| v.iter().map(|&x| i64::from(x)).collect::<Vec<_>>();
        Self {
            input_ids: ids(encoding.get_ids()),
            token_type_ids: with_token_type_ids.then(|| ids(encoding.get_type_ids())),
            attention_mask: Some(ids(encoding.get_attention_mask())),
            special_tokens_mask: Some(ids(encoding.get_special_tokens_mask())),
            offset_mapping: Some(
                encoding
                    .get_offsets()
                    .iter()
                    .map(|&(a, b)| (a as i64, b as i64))
                    .collect(),
            ),
            labels: None,
            start_positions: None,
            end_positions: None,
            seq_lengths: None,
            columns: Default::default(),
        }
    }
}

//! Sequence-classification data as upstream's `run_classification.py` prepares it: the
//! label list (`get_label_list`, or regression when the label column is float), then
//! `preprocess_function` (text columns joined, tokenized with truncation, optionally padded
//! to `max_seq_length`, `label` mapped through `label_to_id`).

use serde_json::Value;
use tchtrain_collators::{Feature, Label};
use tchtrain_models::Tokenizer;
use tokenizers::{PaddingParams, PaddingStrategy, TruncationParams};

use crate::error::{Error, Result};
use tchtrain_data::InMemoryDataset;
use tchtrain_datasets::{Table, cell_text};

/// What the label column holds: class names (single-label classification) or numbers
/// (regression, when the column is float as `datasets` would type it).
#[derive(Debug, Clone, PartialEq)]
pub enum ClassificationLabels {
    /// Upstream `label_list`: the classes, index = class id.
    Classes(Vec<String>),
    /// A float label column: `num_labels = 1`, mean-squared-error loss.
    Regression,
}

/// Whether a cell is a float as `datasets` types a column (a JSON float, or CSV text that
/// parses as a number but not as an integer).
fn is_float_cell(v: &Value) -> Option<bool> {
    match v {
        Value::Number(n) => Some(!(n.is_i64() || n.is_u64())),
        Value::String(s) => {
            let s = s.trim();
            if s.parse::<i64>().is_ok() {
                Some(false)
            } else if s.parse::<f64>().is_ok() {
                Some(true)
            } else {
                None
            }
        }
        _ => None,
    }
}

/// Upstream's last steps on `label_list`: the label -1 of an integer column removed (with a
/// warning: it marks unlabelled rows), then sorted as Python sorts the column's values,
/// numerically when every one is an integer, else as strings.
fn sort_labels(labels: &mut Vec<String>) {
    if labels.iter().all(|l| l.trim().parse::<i64>().is_ok()) {
        if labels.iter().any(|l| l.trim() == "-1") {
            log::warn!("Label -1 found in label list, removing it.");
            labels.retain(|l| l.trim() != "-1");
        }
        labels.sort_by_key(|l| l.trim().parse::<i64>().unwrap_or(0));
    } else {
        labels.sort();
    }
}

/// Lists in the label column are upstream's multi-label classification (multi-hot float
/// labels, BCE loss, micro F1, `['a', 'b']` predictions), which this script does not do:
/// refused, not read as one class per distinct list.
fn refuse_lists(cells: &[&Value]) -> Result<()> {
    match cells.iter().position(|v| v.is_array()) {
        Some(row) => Err(Error::InvalidLabel {
            label: "a list".into(),
            row,
            detail: "the label column holds lists: that is multi-label classification upstream (multi-hot labels, BCE loss, F1), which run_classification does not do yet; give each row one label".into(),
        }),
        None => Ok(()),
    }
}

impl ClassificationLabels {
    /// Upstream's choice for the training split's label column: regression when every
    /// value is a number and some is a float, else the sorted distinct values
    /// (`get_label_list`).
    ///
    /// ```
    /// use tchtrain_datasets::Table;
    /// use tchtrain_examples::ClassificationLabels;
    /// let t = Table::from_csv_str("text,label\na,rotten\nb,fresh\nc,rotten\n", "t.csv")?;
    /// let labels = ClassificationLabels::from_table(&t, "label")?;
    /// assert_eq!(labels, ClassificationLabels::Classes(vec!["fresh".into(), "rotten".into()]));
    /// # Ok::<(), tchtrain_examples::Error>(())
    /// ```
    pub fn from_table(table: &Table, label_column: &str) -> Result<Self> {
        let cells = table.column(label_column)?;
        refuse_lists(&cells)?;
        let kinds: Vec<Option<bool>> = cells.iter().map(|v| is_float_cell(v)).collect();
        if !cells.is_empty() && kinds.iter().all(Option::is_some) && kinds.contains(&Some(true)) {
            return Ok(Self::Regression);
        }
        let mut labels: Vec<String> = Vec::new();
        for v in cells {
            let t = cell_text(v);
            if !labels.contains(&t) {
                labels.push(t);
            }
        }
        sort_labels(&mut labels);
        Ok(Self::Classes(labels))
    }

    /// Adds the classes of another split that the training split lacks (upstream warns and
    /// extends `label_list`), then sorts the whole list as upstream does.
    pub fn extend_from(&mut self, table: &Table, label_column: &str) -> Result<()> {
        let Self::Classes(list) = self else {
            return Ok(());
        };
        let mut extra: Vec<String> = Vec::new();
        let cells = table.column(label_column)?;
        refuse_lists(&cells)?;
        for v in cells {
            let t = cell_text(v);
            if !list.contains(&t) && !extra.contains(&t) {
                extra.push(t);
            }
        }
        if !extra.is_empty() {
            log::warn!(
                "labels {extra:?} of {} are not in the training data; they are added to the label list",
                table.path().display()
            );
            list.extend(extra);
            sort_labels(list);
        }
        Ok(())
    }

    /// Upstream `num_labels` (1 for regression).
    pub fn num_labels(&self) -> usize {
        match self {
            Self::Classes(l) => l.len(),
            Self::Regression => 1,
        }
    }

    /// The label of a cell: its class id (`label_to_id`), or its value for regression.
    pub fn label(&self, value: &Value, row: usize) -> Result<Label> {
        let text = cell_text(value);
        match self {
            Self::Classes(list) => list
                .iter()
                .position(|l| *l == text)
                .map(|i| Label::Class(i as i64))
                .ok_or_else(|| Error::InvalidLabel {
                    label: text,
                    row,
                    detail: format!("not one of the labels {list:?}"),
                }),
            Self::Regression => {
                text.trim()
                    .parse::<f64>()
                    .map(Label::Value)
                    .map_err(|_| Error::InvalidLabel {
                        label: text.clone(),
                        row,
                        detail: "the label column is numeric (regression) but this is not a number"
                            .into(),
                    })
            }
        }
    }
}

/// How [`tokenize_text_classification`] prepares rows (upstream's `DataTrainingArguments`).
#[derive(Debug, Clone, PartialEq)]
pub struct TextClassificationOptions {
    /// The text columns, joined with `text_column_delimiter` (`--text_column_names`).
    pub text_column_names: Vec<String>,
    /// Put between the text columns (`--text_column_delimiter`, default `" "`).
    pub text_column_delimiter: String,
    /// The label column (`--label_column_name`, default `"label"`); `None` for unlabeled
    /// (prediction) data.
    pub label_column_name: Option<String>,
    /// Truncate to this many tokens (`--max_seq_length`, default 128).
    pub max_seq_length: usize,
    /// Pad every row to `max_seq_length` (`--pad_to_max_length`, default true upstream);
    /// otherwise the collator pads each batch to its longest row.
    pub pad_to_max_length: bool,
    /// Keep `token_type_ids` (tokenizers that return them, e.g. BERT's).
    pub with_token_type_ids: bool,
    /// The id padding uses with `pad_to_max_length` (`tokenizer.pad_token_id`).
    pub pad_token_id: u32,
}

impl Default for TextClassificationOptions {
    fn default() -> Self {
        Self {
            text_column_names: vec!["sentence".into()],
            text_column_delimiter: " ".into(),
            label_column_name: Some("label".into()),
            max_seq_length: 128,
            pad_to_max_length: true,
            with_token_type_ids: true,
            pad_token_id: 0,
        }
    }
}

/// Upstream `preprocess_function`: one tokenized row per table row, `labels` from
/// `labels` (when a label column is set), truncated to `max_seq_length`.
pub fn tokenize_text_classification(
    table: &Table,
    tokenizer: &Tokenizer,
    labels: &ClassificationLabels,
    options: &TextClassificationOptions,
) -> Result<InMemoryDataset> {
    if options.max_seq_length == 0 {
        return Err(Error::InvalidArgument {
            field: "max_seq_length",
            detail: "must be at least 1".into(),
        });
    }
    let text_cols = options
        .text_column_names
        .iter()
        .map(|c| table.column_index(c))
        .collect::<tchtrain_datasets::Result<Vec<_>>>()?;
    let label_cells = match &options.label_column_name {
        Some(c) => Some(table.column(c)?),
        None => None,
    };
    let mut tok = tokenizer.clone();
    let tok_err = |e: tokenizers::Error| Error::Tokenizer {
        what: "settings".into(),
        detail: e.to_string(),
    };
    tok.with_truncation(Some(TruncationParams {
        max_length: options.max_seq_length,
        ..TruncationParams::default()
    }))
    .map_err(tok_err)?;
    if options.pad_to_max_length {
        tok.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::Fixed(options.max_seq_length),
            pad_id: options.pad_token_id,
            ..PaddingParams::default()
        }));
    }
    let columns = table.columns();
    let row_ids: Vec<usize> = (0..table.len()).collect();
    // Tokenized on all cores, in order (`TCHTRAIN_NUM_PROC` to change).
    let rows = tchtrain_datasets::parallel_map(&row_ids, |_, &row| {
        let parts: Vec<String> = text_cols
            .iter()
            .map(|&i| table.cell(row, &columns[i]).map(cell_text))
            .collect::<tchtrain_datasets::Result<_>>()?;
        let text = parts.join(&options.text_column_delimiter);
        let enc = tok.encode(text, true).map_err(|e| Error::Tokenizer {
            what: format!("row {row} of {}", table.path().display()),
            detail: e.to_string(),
        })?;
        let mut feature = Feature::from_encoding(&enc, options.with_token_type_ids);
        feature.special_tokens_mask = None;
        feature.offset_mapping = None;
        if let Some(cells) = &label_cells {
            feature.labels = Some(labels.label(cells[row], row)?);
        }
        Ok::<_, Error>(feature)
    })?;
    Ok(InMemoryDataset::new(rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream's `label_list`: the training split's labels, the other splits' extra ones
    /// added, -1 dropped from an integer column, then the whole list sorted.
    #[test]
    fn label_lists_are_extended_then_sorted_as_upstream() -> Result<()> {
        let train = Table::from_csv_str("text,label\na,b\nb,c\n", "train.csv")?;
        let valid = Table::from_csv_str("text,label\nc,a\nd,c\n", "validation.csv")?;
        let mut labels = ClassificationLabels::from_table(&train, "label")?;
        labels.extend_from(&valid, "label")?;
        assert_eq!(
            labels,
            ClassificationLabels::Classes(vec!["a".into(), "b".into(), "c".into()])
        );
        let train = Table::from_csv_str("text,label\na,10\nb,2\n", "train.csv")?;
        let test = Table::from_csv_str("text,label\nc,-1\nd,3\n", "test.csv")?;
        let mut labels = ClassificationLabels::from_table(&train, "label")?;
        labels.extend_from(&test, "label")?;
        assert_eq!(
            labels,
            ClassificationLabels::Classes(vec!["2".into(), "3".into(), "10".into()])
        );
        Ok(())
    }

    /// List labels (multi-label classification upstream) are refused, naming the row.
    #[test]
    fn list_labels_are_refused() -> Result<()> {
        let path =
            std::env::temp_dir().join(format!("tchtrain-list-labels-{}.jsonl", std::process::id()));
        std::fs::write(
            &path,
            "{\"text\": \"a\", \"label\": \"x\"}\n{\"text\": \"b\", \"label\": [\"x\", \"y\"]}\n",
        )
        .map_err(|e| Error::io("writing", &path, e))?;
        let table = Table::read(&path)?;
        let _ = std::fs::remove_file(&path);
        let err = ClassificationLabels::from_table(&table, "label").unwrap_err();
        assert!(
            matches!(err, Error::InvalidLabel { row: 1, ref detail, .. } if detail.contains("multi-label")),
            "{err}"
        );
        let mut labels = ClassificationLabels::Classes(vec!["x".into()]);
        assert!(labels.extend_from(&table, "label").is_err());
        Ok(())
    }
}

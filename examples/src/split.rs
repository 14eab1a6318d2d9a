//! Row selection for `run_classification` before tokenization: `--label_filter` (keep the
//! rows of some labels, as `datasets`' `filter`) and `--validation_split_percentage` (a
//! seeded held-out split of the training file, as `datasets`' `train_test_split`, for a
//! file without a validation companion).

use tchtrain_collators::TorchGenerator;

use super::run_classification::ClassificationArguments;
use crate::error::{Error, Result};
use tchtrain_data::randperm;
use tchtrain_datasets::{Table, cell_text};

/// The rows of `table` whose `label_column` (as text) is one of `keep`. Each of `keep`
/// must occur in the column: a name that matches no row is a misspelling, reported as an
/// [`Error::InvalidFlag`] naming `--label_filter` and the labels there are.
pub(crate) fn filter_labels(table: &Table, label_column: &str, keep: &[String]) -> Result<Table> {
    let labels: Vec<String> = table
        .column(label_column)?
        .into_iter()
        .map(cell_text)
        .collect();
    for k in keep {
        if !labels.contains(k) {
            let mut present: Vec<&str> = labels.iter().map(String::as_str).collect();
            present.sort_unstable();
            present.dedup();
            return Err(Error::InvalidFlag {
                flag: "label_filter".into(),
                detail: format!(
                    "label '{k}' is not in column '{label_column}' of {}; its labels are: {}",
                    table.path().display(),
                    present.join(", ")
                ),
            });
        }
    }
    Ok(table.filter(|_, row| keep.contains(&labels[row])))
}

/// Splits `table` into (training, validation) rows: `percentage` % of the rows (rounded
/// down, at least one) drawn by libtorch's `randperm` seeded with `seed` are held out.
/// Both parts keep the file's row order. `percentage` must be in 1..=99 and the table
/// needs two rows.
pub(crate) fn train_validation_split(
    table: &Table,
    percentage: usize,
    seed: u64,
) -> Result<(Table, Table)> {
    if !(1..=99).contains(&percentage) {
        return Err(Error::InvalidFlag {
            flag: "validation_split_percentage".into(),
            detail: format!("expected a percentage from 1 to 99, got {percentage}"),
        });
    }
    let n = table.len();
    if n < 2 {
        return Err(Error::EmptyDataset {
            what: "training",
            hint: format!(
                " or too small to split: {} has {n} row(s) (after --label_filter)",
                table.path().display()
            ),
        });
    }
    let held = (n * percentage / 100).clamp(1, n - 1);
    let order = randperm(n, &mut TorchGenerator::new(seed));
    let mut valid: Vec<usize> = order[..held].to_vec();
    let mut train: Vec<usize> = order[held..].to_vec();
    valid.sort_unstable();
    train.sort_unstable();
    Ok((table.select(&train)?, table.select(&valid)?))
}

/// The training and evaluation tables of a run: `train` (already read) and, with
/// `do_eval`, `validation` (a dataset's split), `--validation_file` or the `--validation_split_percentage` held out of
/// `train`; both filtered by `--label_filter` first. The held-out rows leave the training
/// table even without `do_eval`, so that a training run never sees them.
pub(crate) fn prepare_tables(
    cls: &ClassificationArguments,
    train: Option<Table>,
    validation: Option<Table>,
    do_eval: bool,
) -> Result<(Option<Table>, Option<Table>)> {
    let filter = |t: Table| match &cls.label_filter {
        Some(keep) => filter_labels(&t, &cls.label_column_name, keep),
        None => Ok(t),
    };
    let train = train.map(filter).transpose()?;
    match (cls.validation_split_percentage, &cls.validation_file) {
        (Some(_), Some(_)) => Err(Error::InvalidFlag {
            flag: "validation_split_percentage".into(),
            detail: "pass either --validation_file or --validation_split_percentage, not both"
                .into(),
        }),
        (Some(p), None) => {
            let t = train.ok_or_else(|| Error::InvalidFlag {
                flag: "validation_split_percentage".into(),
                detail: "it splits the training file: pass --train_file".into(),
            })?;
            let (train, valid) = train_validation_split(&t, p, cls.shuffle_seed)?;
            Ok((Some(train), do_eval.then_some(valid)))
        }
        (None, _) if do_eval && validation.is_some() => {
            Ok((train, validation.map(filter).transpose()?))
        }
        (None, file) if do_eval => {
            let file = file.as_ref().ok_or_else(|| Error::InvalidFlag {
                flag: "validation_file".into(),
                detail: "required: --validation_file FILE (.csv, .json or .jsonl), or --validation_split_percentage P".into(),
            })?;
            Ok((train, Some(filter(Table::read(file)?)?)))
        }
        (None, _) => Ok((train, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Table {
        let mut csv = String::from("text,label\n");
        for i in 0..10 {
            let label = ["a", "b", "c"][i % 3];
            csv.push_str(&format!("t{i},{label}\n"));
        }
        Table::from_csv_str(&csv, "t.csv").unwrap()
    }

    #[test]
    fn filters_and_splits() {
        let t = filter_labels(&table(), "label", &["a".into(), "c".into()]).unwrap();
        assert_eq!(t.len(), 7);
        assert!(filter_labels(&table(), "label", &["z".into()]).is_err());
        let (train, valid) = train_validation_split(&t, 30, 42).unwrap();
        assert_eq!((train.len(), valid.len()), (5, 2));
        let (train2, valid2) = train_validation_split(&t, 30, 42).unwrap();
        assert_eq!((train, valid), (train2, valid2));
        assert!(train_validation_split(&t, 0, 42).is_err());
        assert!(train_validation_split(&t, 100, 42).is_err());
    }
}

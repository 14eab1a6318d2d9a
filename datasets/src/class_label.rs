//! `datasets`' `ClassLabel` names as a file records them: the `huggingface` metadata of a
//! Parquet file written by `datasets` (`Dataset.to_parquet`, the hub's Parquet export)
//! holds the features, where a column is `{"_type": "ClassLabel", "names": [...]}`, or a
//! list of them (`{"_type": "List" | "Sequence" | "LargeList", "feature": ...}`, e.g. the
//! `ner_tags` of a token-classification dataset). `load_dataset` gives those columns the
//! class names; the cells hold the class ids.

use std::path::Path;

use serde_json::Value;

use crate::Result;
use crate::parquet::ParquetFile;

/// The class names of `column` when the file at `path` is a Parquet file whose features
/// make the column (or its list elements) a `ClassLabel`; `None` otherwise (other formats,
/// no metadata, another feature type).
///
/// ```no_run
/// let names = tchtrain_datasets::class_label_names("train.parquet", "ner_tags")?;
/// assert_eq!(names.as_deref(), Some(&["O".to_string(), "B-PER".into()][..]));
/// # Ok::<(), tchtrain_datasets::Error>(())
/// ```
pub fn class_label_names(path: impl AsRef<Path>, column: &str) -> Result<Option<Vec<String>>> {
    let path = path.as_ref();
    if path.extension().is_none_or(|e| e != "parquet") {
        return Ok(None);
    }
    let file = ParquetFile::open(path)?;
    Ok(file
        .huggingface_features()
        .and_then(|features| names_in(&features, column)))
}

/// The `ClassLabel` names of `column` in a features dict (`Features.to_dict()`), looking
/// through list features.
fn names_in(features: &Value, column: &str) -> Option<Vec<String>> {
    let mut feature = features.get(column)?;
    loop {
        match feature.get("_type")?.as_str()? {
            "ClassLabel" => {
                return feature
                    .get("names")?
                    .as_array()?
                    .iter()
                    .map(|n| n.as_str().map(str::to_string))
                    .collect();
            }
            "List" | "Sequence" | "LargeList" => feature = feature.get("feature")?,
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_found_in_class_labels_and_lists_of_them() {
        let features: Value = serde_json::from_str(
            r#"{"tokens": {"feature": {"dtype": "string", "_type": "Value"}, "_type": "List"},
                "ner_tags": {"feature": {"names": ["O", "B-PER"], "_type": "ClassLabel"}, "_type": "List"},
                "old": {"feature": {"names": ["a", "b"], "_type": "ClassLabel"}, "_type": "Sequence"},
                "label": {"names": ["neg", "pos"], "_type": "ClassLabel"},
                "bad": {"names": [1, 2], "_type": "ClassLabel"}}"#,
        )
        .unwrap();
        let names = |c: &str| names_in(&features, c);
        assert_eq!(names("ner_tags"), Some(vec!["O".into(), "B-PER".into()]));
        assert_eq!(names("old"), Some(vec!["a".into(), "b".into()]));
        assert_eq!(names("label"), Some(vec!["neg".into(), "pos".into()]));
        assert_eq!(names("tokens"), None);
        assert_eq!(names("bad"), None);
        assert_eq!(names("missing"), None);
    }
}

//! The word error rate of `evaluate.load("wer")` (its `wer.py`, over jiwer 4): each pair's
//! reference and prediction transformed as jiwer's `wer_default` (runs of two or more
//! whitespace characters made one space, stripped, split on spaces), their word-level
//! Levenshtein distance (substitutions + deletions + insertions) summed over the pairs and
//! divided by the references' word count summed (substitutions + deletions + hits).
//! `concatenate_texts=True` (one `process_words` over every pair) gives the same ratio.
//!
//! ```
//! let wer = tchtrain_examples::wer::compute(
//!     &["the cat sat".to_string()],
//!     &["the cat sat down".to_string()],
//! )?;
//! assert_eq!(wer, 0.25);
//! # Ok::<(), tchtrain_examples::Error>(())
//! ```

use crate::error::{Error, Result};
use crate::sacrebleu::py_isspace;

/// jiwer's `wer_default` of one sentence: its words.
pub fn words(sentence: &str) -> Vec<String> {
    // `RemoveMultipleSpaces` (`re.sub(r"\s\s+", " ", s)`), `Strip`, then
    // `ReduceToListOfListOfWords` (`s.split(" ")`, empty pieces dropped). A lone tab or
    // newline between two words stays inside one word, as jiwer's.
    let chars: Vec<char> = sentence.chars().collect();
    let mut collapsed = String::with_capacity(sentence.len());
    let mut i = 0;
    while i < chars.len() {
        let mut j = i;
        while j < chars.len() && py_isspace(chars[j]) {
            j += 1;
        }
        if j - i >= 2 {
            collapsed.push(' ');
            i = j;
        } else {
            collapsed.push(chars[i]);
            i += 1;
        }
    }
    collapsed
        .trim_matches(py_isspace)
        .split(' ')
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

/// Word-level Levenshtein distance of `a` and `b`.
fn distance(a: &[String], b: &[String]) -> usize {
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, x) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, y) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(x != y);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// `wer.compute(predictions=predictions, references=references)`.
pub fn compute(predictions: &[String], references: &[String]) -> Result<f64> {
    if predictions.len() != references.len() {
        return Err(Error::InvalidArgument {
            field: "predictions",
            detail: format!(
                "{} predictions for {} references",
                predictions.len(),
                references.len()
            ),
        });
    }
    let (mut incorrect, mut total) = (0usize, 0usize);
    for (p, r) in predictions.iter().zip(references) {
        let (p, r) = (words(p), words(r));
        incorrect += distance(&r, &p);
        total += r.len();
    }
    if total == 0 {
        return Err(Error::InvalidArgument {
            field: "references",
            detail: "every reference is empty: the word error rate divides by the references' word count (upstream raises ZeroDivisionError)".into(),
        });
    }
    Ok(incorrect as f64 / total as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// jiwer 4's words and per-pair counts, and evaluate's `wer` over the pairs of
    /// `scripts/reference/text_metrics.py` (tabs, non-breaking and em spaces, line breaks,
    /// empty strings): equal.
    #[test]
    fn wer_equals_evaluate() {
        let path = tchtrain_testing::reference_dir("text_metrics").join("text_metrics.json");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask setup`)", path.display()));
        let r: serde_json::Value = serde_json::from_str(&text).unwrap();
        for case in r["wer_words"].as_array().unwrap() {
            let want: Vec<String> = serde_json::from_value(case[1].clone()).unwrap();
            assert_eq!(words(case[0].as_str().unwrap()), want, "{}", case[0]);
        }
        let pairs = r["pairs"].as_array().unwrap();
        let (mut preds, mut refs) = (Vec::new(), Vec::new());
        for (pair, counts) in pairs.iter().zip(r["wer_pairs"].as_array().unwrap()) {
            let (p, rf) = (pair[0].as_str().unwrap(), pair[1].as_str().unwrap());
            let (pw, rw) = (words(p), words(rf));
            assert_eq!(
                [distance(&rw, &pw) as u64, rw.len() as u64],
                [counts[0].as_u64().unwrap(), counts[1].as_u64().unwrap()],
                "{p:?} / {rf:?}"
            );
            preds.push(p.to_string());
            refs.push(rf.to_string());
        }
        assert_eq!(
            compute(&preds, &refs).unwrap(),
            r["wer_corpus"].as_f64().unwrap()
        );
        assert!(compute(&[String::new()], &[String::new()]).is_err());
    }
}

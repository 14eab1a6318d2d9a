//! The `seqeval` metric as `run_ner` uses it (through `evaluate.load("seqeval")`, seqeval
//! 1.2 in its default mode): entities read from IOB tags by seqeval's `get_entities`
//! (lenient: an `I-` tag after `O` or after another type opens an entity, as seqeval does),
//! precision / recall / F1 per entity type and over all entities (micro average, 0 where a
//! ratio is 0 / 0, as `zero_division="warn"`), and the token accuracy.

use std::collections::{BTreeMap, BTreeSet};

/// One entity type's scores (`evaluate`'s per-type dict).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EntityScores {
    /// Correct entities of this type over predicted ones.
    pub precision: f64,
    /// Correct entities of this type over true ones.
    pub recall: f64,
    /// Harmonic mean of precision and recall.
    pub f1: f64,
    /// Number of true entities of this type (`number`, seqeval's support).
    pub number: usize,
}

/// What `evaluate`'s seqeval returns.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqevalResult {
    /// Scores per entity type, by type name.
    pub per_type: BTreeMap<String, EntityScores>,
    /// Micro-averaged precision over all entities.
    pub overall_precision: f64,
    /// Micro-averaged recall.
    pub overall_recall: f64,
    /// Micro-averaged F1.
    pub overall_f1: f64,
    /// Share of tokens whose predicted tag equals the true tag.
    pub overall_accuracy: f64,
}

/// Splits a tag into (prefix letter, type) as seqeval does without `suffix`:
/// `"B-PER"` is `('B', "PER")`, `"O"` is `('O', "_")`.
fn split_tag(chunk: &str) -> (char, String) {
    let mut chars = chunk.chars();
    let tag = chars.next().unwrap_or('O');
    let rest = chars.as_str();
    let type_ = match rest.split_once('-') {
        Some((_, t)) => t,
        None => rest,
    };
    let type_ = if type_.is_empty() { "_" } else { type_ };
    (tag, type_.to_string())
}

fn end_of_chunk(prev_tag: char, tag: char, prev_type: &str, type_: &str) -> bool {
    matches!(prev_tag, 'E' | 'S')
        || (matches!(prev_tag, 'B' | 'I') && matches!(tag, 'B' | 'S' | 'O'))
        || (prev_tag != 'O' && prev_tag != '.' && prev_type != type_)
}

fn start_of_chunk(prev_tag: char, tag: char, prev_type: &str, type_: &str) -> bool {
    matches!(tag, 'B' | 'S')
        || (matches!(prev_tag, 'E' | 'S' | 'O') && matches!(tag, 'E' | 'I'))
        || (tag != 'O' && tag != '.' && prev_type != type_)
}

/// seqeval's `get_entities` over sentences: they are joined with an `O` after each, and
/// the entities are `(type, first, last)` positions in that joined sequence.
pub fn get_entities<S: AsRef<str>>(sentences: &[Vec<S>]) -> Vec<(String, usize, usize)> {
    let mut seq: Vec<&str> = Vec::new();
    for s in sentences {
        seq.extend(s.iter().map(AsRef::as_ref));
        seq.push("O");
    }
    seq.push("O");
    let mut chunks = Vec::new();
    let (mut prev_tag, mut prev_type) = ('O', String::new());
    let mut begin = 0;
    for (i, chunk) in seq.iter().enumerate() {
        let (tag, type_) = split_tag(chunk);
        if end_of_chunk(prev_tag, tag, &prev_type, &type_) {
            chunks.push((prev_type.clone(), begin, i - 1));
        }
        if start_of_chunk(prev_tag, tag, &prev_type, &type_) {
            begin = i;
        }
        prev_tag = tag;
        prev_type = type_;
    }
    chunks
}

/// Entity spans (first, last position).
type Spans = BTreeSet<(usize, usize)>;

fn ratio(num: usize, den: usize) -> f64 {
    if den == 0 {
        0.0
    } else {
        num as f64 / den as f64
    }
}

fn f1(p: f64, r: f64) -> f64 {
    if p + r == 0.0 {
        0.0
    } else {
        2.0 * p * r / (p + r)
    }
}

/// `evaluate.load("seqeval").compute(predictions, references)`: one tag list per sentence
/// in each (same lengths).
///
/// ```
/// use tchtrain_examples::seqeval;
/// let truth = vec![vec!["B-PER", "I-PER", "O", "B-LOC"]];
/// let pred = vec![vec!["B-PER", "I-PER", "O", "O"]];
/// let r = seqeval::compute(&pred, &truth);
/// assert_eq!((r.overall_precision, r.overall_recall), (1.0, 0.5));
/// assert_eq!(r.overall_accuracy, 0.75);
/// ```
pub fn compute<S: AsRef<str>>(predictions: &[Vec<S>], references: &[Vec<S>]) -> SeqevalResult {
    // (true spans, predicted spans) per entity type.
    let mut by_type: BTreeMap<String, (Spans, Spans)> = BTreeMap::new();
    for (t, a, b) in get_entities(references) {
        by_type.entry(t).or_default().0.insert((a, b));
    }
    for (t, a, b) in get_entities(predictions) {
        by_type.entry(t).or_default().1.insert((a, b));
    }
    let mut per_type = BTreeMap::new();
    let (mut tp_all, mut pred_all, mut true_all) = (0, 0, 0);
    for (name, (truth, pred)) in &by_type {
        let tp = truth.intersection(pred).count();
        let (p, r) = (ratio(tp, pred.len()), ratio(tp, truth.len()));
        per_type.insert(
            name.clone(),
            EntityScores {
                precision: p,
                recall: r,
                f1: f1(p, r),
                number: truth.len(),
            },
        );
        tp_all += tp;
        pred_all += pred.len();
        true_all += truth.len();
    }
    let (p, r) = (ratio(tp_all, pred_all), ratio(tp_all, true_all));
    let (mut correct, mut total) = (0, 0);
    for (ps, ts) in predictions.iter().zip(references) {
        for (a, b) in ps.iter().zip(ts) {
            correct += usize::from(a.as_ref() == b.as_ref());
            total += 1;
        }
    }
    SeqevalResult {
        per_type,
        overall_precision: p,
        overall_recall: r,
        overall_f1: f1(p, r),
        overall_accuracy: ratio(correct, total),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entities_as_seqeval_reads_them() {
        // seqeval's README example: [('MISC', 3, 5), ('PER', 7, 8)] for
        // ['O', 'O', 'O', 'B-MISC', 'I-MISC', 'I-MISC', 'O', 'B-PER', 'I-PER'].
        let seq = vec![vec![
            "O", "O", "O", "B-MISC", "I-MISC", "I-MISC", "O", "B-PER", "I-PER",
        ]];
        assert_eq!(
            get_entities(&seq),
            [("MISC".into(), 3, 5), ("PER".into(), 7, 8)]
        );
        // Lenient IOB: a lone I- opens an entity; a type change closes one; sentences are
        // separated by an O.
        let seq = vec![vec!["I-LOC", "I-PER", "B-PER"], vec!["I-PER"]];
        assert_eq!(
            get_entities(&seq),
            [
                ("LOC".into(), 0, 0),
                ("PER".into(), 1, 1),
                ("PER".into(), 2, 2),
                ("PER".into(), 4, 4)
            ]
        );
    }

    #[test]
    fn scores_equal_seqeval_1_2_2() {
        // evaluate's seqeval on seqeval 1.2.2 (scikit-learn 1.9.1) gave, for these tags:
        // LOC p 0 r 0 (2), MISC 1 1 (1), ORG 0 0 (0), PER 2/3 1 f1 0.8 (2);
        // overall p 0.5, r 0.6, f1 0.5454545454545454, accuracy 0.6923076923076923.
        let truth = vec![
            vec!["B-PER", "I-PER", "O", "B-LOC", "I-LOC", "O"],
            vec!["O", "B-MISC", "I-MISC", "O"],
            vec!["I-PER", "O", "B-LOC"],
        ];
        let pred = vec![
            vec!["B-PER", "I-PER", "O", "B-LOC", "O", "O"],
            vec!["O", "I-MISC", "I-MISC", "B-ORG"],
            vec!["I-PER", "O", "B-PER"],
        ];
        let r = compute(&pred, &truth);
        let s = |t: &str| r.per_type[t];
        assert_eq!(
            (s("LOC").precision, s("LOC").recall, s("LOC").number),
            (0.0, 0.0, 2)
        );
        assert_eq!((s("MISC").f1, s("MISC").number), (1.0, 1));
        assert_eq!(
            (s("ORG").precision, s("ORG").f1, s("ORG").number),
            (0.0, 0.0, 0)
        );
        assert_eq!(s("PER").precision, 2.0 / 3.0);
        assert!((s("PER").f1 - 0.8).abs() < 1e-15);
        assert_eq!((r.overall_precision, r.overall_recall), (0.5, 0.6));
        assert!((r.overall_f1 - 0.5454545454545454).abs() < 1e-15);
        assert!((r.overall_accuracy - 0.6923076923076923).abs() < 1e-15);
        // No entities at all: every ratio 0 (zero_division), accuracy from the tokens.
        let r = compute(&[vec!["O", "O"]], &[vec!["O", "O"]]);
        assert!(r.per_type.is_empty());
        assert_eq!((r.overall_f1, r.overall_accuracy), (0.0, 1.0));
    }
}

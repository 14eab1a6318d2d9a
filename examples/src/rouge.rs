//! The `rouge` metric as `run_summarization` uses it: `evaluate.load("rouge")`,
//! `metric.compute(predictions=preds, references=labels, use_stemmer=True)`, which scores
//! each pair with rouge-score 0.1.2's `RougeScorer(["rouge1", "rouge2", "rougeL",
//! "rougeLsum"], use_stemmer=True).score(reference, prediction)`.
//!
//! What rouge-score computes per pair, and [`RougeScorer::score`] with it exactly:
//!
//! - tokens ([`RougeScorer::tokenize`]): the text lowercased, every run of characters other
//!   than ASCII `[a-z0-9]` a separator, tokens longer than 3 characters stemmed by nltk's
//!   Porter stemmer ([`porter`](crate::porter)) when `use_stemmer`;
//! - `rouge1` / `rouge2`: the unigram / bigram counts' overlap (the minimum count of each
//!   reference n-gram) over the prediction's n-grams (precision) and the reference's
//!   (recall), each denominator at least 1;
//! - `rougeL`: the longest common subsequence of the two token lists over the prediction's
//!   (precision) and the reference's (recall) length, 0 when either is empty;
//! - `rougeLsum`: the summary-level LCS. Both texts are split into sentences at `"\n"`
//!   (empty lines dropped); for each reference sentence, the union of the token positions of
//!   one LCS with each prediction sentence (rouge-score's backtracking picks which) gives
//!   tokens that count as hits while both texts still have that token unused; hits over
//!   the prediction's (precision) and the reference's (recall) total tokens;
//! - F-measure `2 p r / (p + r)`, 0 when `p + r` is 0.
//!
//! Aggregation. evaluate's default (`use_aggregator=True`) feeds the per-pair scores to
//! rouge-score's `BootstrapAggregator()` and returns each key's `mid.fmeasure`: the median
//! of 1000 means of resamples drawn with replacement by numpy's global `np.random` (unseeded
//! by evaluate; `run_summarization` seeds it through `set_seed`, but its state then depends
//! on every earlier draw). That median is a random estimate of the plain mean, which
//! [`compute`] returns instead: numpy's `np.mean` of the per-pair F-measures (what
//! `use_aggregator=False` and a mean give), bit for bit. The two differ by the bootstrap's
//! noise, of the order of the per-pair scores' spread over `n` (on the reference script's
//! 45 pairs with `np.random.seed(0)`: up to 0.0032 on `rougeL`); `run_summarization`'s
//! rounding to 4 digits of a percentage does not hide it.

use std::collections::{BTreeSet, HashMap};

use crate::porter;

/// A precision / recall / F-measure triple (rouge-score's `Score`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Score {
    /// Matches over the prediction's size.
    pub precision: f64,
    /// Matches over the reference's size.
    pub recall: f64,
    /// Harmonic mean of precision and recall (0 when both are 0).
    pub fmeasure: f64,
}

impl Score {
    fn new(precision: f64, recall: f64) -> Self {
        Self {
            precision,
            recall,
            fmeasure: fmeasure(precision, recall),
        }
    }
}

/// The four scores of one pair (`scorer.score(reference, prediction)`'s dict).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RougeScores {
    /// `rouge1`: unigram overlap.
    pub rouge1: Score,
    /// `rouge2`: bigram overlap.
    pub rouge2: Score,
    /// `rougeL`: longest common subsequence of the whole texts.
    pub rouge_l: Score,
    /// `rougeLsum`: summary-level LCS over `"\n"`-separated sentences.
    pub rouge_lsum: Score,
}

/// The value per key that [`compute`] returns (F-measures, 0–1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RougeResult {
    /// `rouge1`.
    pub rouge1: f64,
    /// `rouge2`.
    pub rouge2: f64,
    /// `rougeL`.
    pub rouge_l: f64,
    /// `rougeLsum`.
    pub rouge_lsum: f64,
}

/// rouge-score's `scoring.fmeasure`.
fn fmeasure(precision: f64, recall: f64) -> f64 {
    if precision + recall > 0.0 {
        2.0 * precision * recall / (precision + recall)
    } else {
        0.0
    }
}

/// rouge-score's `RougeScorer` for the four keys, with its default tokenizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RougeScorer {
    use_stemmer: bool,
}

impl RougeScorer {
    /// `RougeScorer(["rouge1", "rouge2", "rougeL", "rougeLsum"], use_stemmer=use_stemmer)`.
    pub fn new(use_stemmer: bool) -> Self {
        Self { use_stemmer }
    }

    /// rouge-score's `DefaultTokenizer(use_stemmer).tokenize(text)`.
    ///
    /// ```
    /// use tchtrain_examples::rouge::RougeScorer;
    /// let tokens = RougeScorer::new(true).tokenize("The runners' generalization, 2-3 cats!");
    /// assert_eq!(tokens, ["the", "runner", "gener", "2", "3", "cat"]);
    /// ```
    pub fn tokenize(&self, text: &str) -> Vec<String> {
        text.to_lowercase()
            .split(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit()))
            .filter(|t| !t.is_empty())
            .map(|t| {
                if self.use_stemmer && t.len() > 3 {
                    porter::stem(t)
                } else {
                    t.to_string()
                }
            })
            // rouge-score's final `^[a-z0-9]+$` check.
            .filter(|t| {
                !t.is_empty()
                    && t.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            })
            .collect()
    }

    /// `scorer.score(reference, prediction)`.
    ///
    /// ```
    /// use tchtrain_examples::rouge::RougeScorer;
    /// let s = RougeScorer::new(true).score("The cat sat on the mat.", "The cat is on the mat.");
    /// assert_eq!((s.rouge1.precision, s.rouge1.recall), (5.0 / 6.0, 5.0 / 6.0));
    /// assert_eq!(s.rouge2.recall, 3.0 / 5.0);
    /// ```
    pub fn score(&self, reference: &str, prediction: &str) -> RougeScores {
        let target = self.tokenize(reference);
        let pred = self.tokenize(prediction);
        let sentences = |text: &str| -> Vec<Vec<String>> {
            text.split('\n')
                .filter(|s| !s.is_empty())
                .map(|s| self.tokenize(s))
                .collect()
        };
        RougeScores {
            rouge1: score_ngrams(&target, &pred, 1),
            rouge2: score_ngrams(&target, &pred, 2),
            rouge_l: score_lcs(&target, &pred),
            rouge_lsum: summary_level_lcs(&sentences(reference), &sentences(prediction)),
        }
    }

    /// `scorer.score_multi(references, prediction)`: per key, the scores against the
    /// reference with the highest F-measure (the first on ties, as `np.argmax`); all zero
    /// without references (rouge-score raises).
    pub fn score_multi<S: AsRef<str>>(&self, references: &[S], prediction: &str) -> RougeScores {
        let all: Vec<RougeScores> = references
            .iter()
            .map(|r| self.score(r.as_ref(), prediction))
            .collect();
        let best = |key: fn(&RougeScores) -> Score| {
            let mut best: Option<Score> = None;
            for s in &all {
                let s = key(s);
                if best.is_none_or(|b| s.fmeasure > b.fmeasure) {
                    best = Some(s);
                }
            }
            best.unwrap_or_default()
        };
        RougeScores {
            rouge1: best(|s| s.rouge1),
            rouge2: best(|s| s.rouge2),
            rouge_l: best(|s| s.rouge_l),
            rouge_lsum: best(|s| s.rouge_lsum),
        }
    }
}

/// rouge-score's `_create_ngrams`.
fn ngram_counts(tokens: &[String], n: usize) -> HashMap<&[String], usize> {
    let mut counts = HashMap::new();
    for gram in tokens.windows(n) {
        *counts.entry(gram).or_insert(0) += 1;
    }
    counts
}

/// rouge-score's `_score_ngrams`.
fn score_ngrams(target: &[String], prediction: &[String], n: usize) -> Score {
    let (t, p) = (ngram_counts(target, n), ngram_counts(prediction, n));
    let intersection: usize = t
        .iter()
        .map(|(g, &c)| c.min(p.get(g).copied().unwrap_or(0)))
        .sum();
    let t_total: usize = t.values().sum();
    let p_total: usize = p.values().sum();
    Score::new(
        intersection as f64 / p_total.max(1) as f64,
        intersection as f64 / t_total.max(1) as f64,
    )
}

/// rouge-score's `_lcs_table(ref, can)`: `table[i][j]` is the LCS length of `ref[..i]` and
/// `can[..j]`.
fn lcs_table(reference: &[String], candidate: &[String]) -> Vec<Vec<usize>> {
    let mut table = vec![vec![0; candidate.len() + 1]; reference.len() + 1];
    for i in 1..=reference.len() {
        for j in 1..=candidate.len() {
            table[i][j] = if reference[i - 1] == candidate[j - 1] {
                table[i - 1][j - 1] + 1
            } else {
                table[i - 1][j].max(table[i][j - 1])
            };
        }
    }
    table
}

/// rouge-score's `_score_lcs`.
fn score_lcs(target: &[String], prediction: &[String]) -> Score {
    if target.is_empty() || prediction.is_empty() {
        return Score::default();
    }
    let lcs = lcs_table(target, prediction)[target.len()][prediction.len()];
    Score::new(
        lcs as f64 / prediction.len() as f64,
        lcs as f64 / target.len() as f64,
    )
}

/// rouge-score's `lcs_ind` (`_backtrack_norec`): the positions in `reference` of one LCS.
fn lcs_indices(reference: &[String], candidate: &[String]) -> Vec<usize> {
    let t = lcs_table(reference, candidate);
    let (mut i, mut j) = (reference.len(), candidate.len());
    let mut lcs = Vec::new();
    while i > 0 && j > 0 {
        if reference[i - 1] == candidate[j - 1] {
            lcs.push(i - 1);
            i -= 1;
            j -= 1;
        } else if t[i][j - 1] > t[i - 1][j] {
            j -= 1;
        } else {
            i -= 1;
        }
    }
    lcs.reverse();
    lcs
}

/// rouge-score's `_summary_level_lcs` (ROUGE-1.5.5's union LCS without double counting).
fn summary_level_lcs(reference: &[Vec<String>], candidate: &[Vec<String>]) -> Score {
    if reference.is_empty() || candidate.is_empty() {
        return Score::default();
    }
    let m: usize = reference.iter().map(Vec::len).sum();
    let n: usize = candidate.iter().map(Vec::len).sum();
    if m == 0 || n == 0 {
        return Score::default();
    }
    let mut counts_r: HashMap<&str, usize> = HashMap::new();
    let mut counts_c: HashMap<&str, usize> = HashMap::new();
    for t in reference.iter().flatten() {
        *counts_r.entry(t).or_insert(0) += 1;
    }
    for t in candidate.iter().flatten() {
        *counts_c.entry(t).or_insert(0) += 1;
    }
    let mut hits = 0usize;
    for r in reference {
        let union: BTreeSet<usize> = candidate.iter().flat_map(|c| lcs_indices(r, c)).collect();
        for i in union {
            let t = r[i].as_str();
            let (Some(cc), Some(cr)) = (counts_c.get(t).copied(), counts_r.get(t).copied()) else {
                continue;
            };
            if cc > 0 && cr > 0 {
                hits += 1;
                counts_c.insert(t, cc - 1);
                counts_r.insert(t, cr - 1);
            }
        }
    }
    Score::new(hits as f64 / n as f64, hits as f64 / m as f64)
}

/// numpy's `PW_BLOCKSIZE`.
const PW_BLOCKSIZE: usize = 128;

/// numpy's float64 pairwise summation (`pairwise_sum` in `loops_utils.h.src`).
fn pairwise_sum(a: &[f64]) -> f64 {
    let n = a.len();
    if n < 8 {
        a.iter().fold(0.0, |acc, &x| acc + x)
    } else if n <= PW_BLOCKSIZE {
        let mut r = [0.0f64; 8];
        r.copy_from_slice(&a[..8]);
        let mut i = 8;
        while i < n - (n % 8) {
            for (j, acc) in r.iter_mut().enumerate() {
                *acc += a[i + j];
            }
            i += 8;
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for &x in &a[i..] {
            res += x;
        }
        res
    } else {
        let mut n2 = n / 2;
        n2 -= n2 % 8;
        pairwise_sum(&a[..n2]) + pairwise_sum(&a[n2..])
    }
}

/// `np.mean(values)` of float64 values (NaN when empty, as numpy).
fn numpy_mean(values: &[f64]) -> f64 {
    (0.0 + pairwise_sum(values)) / values.len() as f64
}

/// The mean F-measure per key of per-pair scores (numpy's `np.mean`, bit for bit; NaN
/// for no scores).
pub fn mean_fmeasure(scores: &[RougeScores]) -> RougeResult {
    let mean =
        |key: fn(&RougeScores) -> f64| numpy_mean(&scores.iter().map(key).collect::<Vec<_>>());
    RougeResult {
        rouge1: mean(|s| s.rouge1.fmeasure),
        rouge2: mean(|s| s.rouge2.fmeasure),
        rouge_l: mean(|s| s.rouge_l.fmeasure),
        rouge_lsum: mean(|s| s.rouge_lsum.fmeasure),
    }
}

/// `evaluate.load("rouge").compute(predictions, references, use_stemmer=use_stemmer)`
/// with the bootstrap median replaced by the mean it estimates (see the module
/// documentation): the mean F-measure per key over the pairs (taken in order up to the
/// shorter list, as evaluate's `zip`). NaN for no pairs.
///
/// ```
/// use tchtrain_examples::rouge;
/// let r = rouge::compute(&["hello there", "general kenobi"], &["hello there", "general kenobi"], true);
/// assert_eq!((r.rouge1, r.rouge2, r.rouge_l, r.rouge_lsum), (1.0, 1.0, 1.0, 1.0));
/// ```
pub fn compute<P: AsRef<str>, R: AsRef<str>>(
    predictions: &[P],
    references: &[R],
    use_stemmer: bool,
) -> RougeResult {
    let scorer = RougeScorer::new(use_stemmer);
    let scores: Vec<RougeScores> = predictions
        .iter()
        .zip(references)
        .map(|(p, r)| scorer.score(r.as_ref(), p.as_ref()))
        .collect();
    mean_fmeasure(&scores)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference() -> serde_json::Value {
        let path = tchtrain_testing::reference_dir("text_metrics").join("text_metrics.json");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask setup`)", path.display()));
        serde_json::from_str(&text).unwrap()
    }

    fn close(a: f64, b: f64) -> bool {
        a == b || (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
    }

    fn assert_scores(what: &str, got: &RougeScores, want: &serde_json::Value) {
        for (key, s) in [
            ("rouge1", got.rouge1),
            ("rouge2", got.rouge2),
            ("rougeL", got.rouge_l),
            ("rougeLsum", got.rouge_lsum),
        ] {
            let w: Vec<f64> = want[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            for (name, g, w) in [
                ("precision", s.precision, w[0]),
                ("recall", s.recall, w[1]),
                ("fmeasure", s.fmeasure, w[2]),
            ] {
                assert!(close(g, w), "{what}: {key} {name} {g} vs rouge-score {w}");
            }
        }
    }

    #[test]
    fn tokens_equal_rouge_score() {
        let json = reference();
        let scorer = RougeScorer::new(true);
        let cases = json["rouge_tokens"].as_array().unwrap();
        assert!(cases.len() >= 80);
        for case in cases {
            let text = case[0].as_str().unwrap();
            let want: Vec<&str> = case[1]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str().unwrap())
                .collect();
            assert_eq!(scorer.tokenize(text), want, "{text:?}");
        }
    }

    #[test]
    fn pair_scores_equal_rouge_score() {
        let json = reference();
        let scorer = RougeScorer::new(true);
        let pairs = json["pairs"].as_array().unwrap();
        let want = json["rouge_pairs"].as_array().unwrap();
        assert_eq!(pairs.len(), want.len());
        let mut all = Vec::new();
        for (pair, want) in pairs.iter().zip(want) {
            let (pred, reference) = (pair[0].as_str().unwrap(), pair[1].as_str().unwrap());
            let got = scorer.score(reference, pred);
            assert_scores(&format!("{pred:?} / {reference:?}"), &got, want);
            all.push(got);
        }
        // The mean, as numpy computes it, bit for bit.
        let mean = mean_fmeasure(&all);
        let want = &json["rouge_mean"];
        for (key, got) in [
            ("rouge1", mean.rouge1),
            ("rouge2", mean.rouge2),
            ("rougeL", mean.rouge_l),
            ("rougeLsum", mean.rouge_lsum),
        ] {
            let w = want[key].as_f64().unwrap();
            assert_eq!(got.to_bits(), w.to_bits(), "{key}: {got} vs numpy {w}");
            // evaluate's default, the bootstrap median, only estimates that mean.
            let mid = json["rouge_bootstrap_mid"][key].as_f64().unwrap();
            assert!(
                (mid - got).abs() < 0.02,
                "{key}: bootstrap mid {mid} vs mean {got}"
            );
        }
        let preds: Vec<&str> = pairs.iter().map(|p| p[0].as_str().unwrap()).collect();
        let refs: Vec<&str> = pairs.iter().map(|p| p[1].as_str().unwrap()).collect();
        assert_eq!(compute(&preds, &refs, true), mean);
    }

    #[test]
    fn score_multi_equals_rouge_score() {
        let json = reference();
        let scorer = RougeScorer::new(true);
        for case in json["rouge_multi"].as_array().unwrap() {
            let pred = case["prediction"].as_str().unwrap();
            let refs: Vec<&str> = case["references"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r.as_str().unwrap())
                .collect();
            assert_scores(pred, &scorer.score_multi(&refs, pred), &case["scores"]);
        }
        assert_eq!(scorer.score_multi::<&str>(&[], "x"), RougeScores::default());
    }

    #[test]
    fn pairwise_mean_matches_numpy_block_structure() {
        // Below 8 values: left to right from 0.
        assert_eq!(numpy_mean(&[0.1, 0.2, 0.3]), (0.1 + 0.2 + 0.3) / 3.0);
        assert!(numpy_mean(&[]).is_nan());
        let empty: [&str; 0] = [];
        assert!(compute(&empty, &empty, true).rouge1.is_nan());
    }
}

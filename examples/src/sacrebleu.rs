//! The `sacrebleu` metric as `run_translation` uses it: `evaluate.load("sacrebleu")`,
//! `metric.compute(predictions=preds, references=[[label] for label in labels])`, which calls
//! sacreBLEU 2.6.0's `corpus_bleu(predictions, [labels])` with evaluate's defaults
//! (`smooth_method="exp"`, `smooth_value=None`, `force=False`, `lowercase=False`, the `13a`
//! tokenizer, `use_effective_order=False`) and returns `score`, `counts`, `totals`,
//! `precisions`, `bp`, `sys_len` and `ref_len` ([`BleuScore`]).
//!
//! What sacreBLEU computes, and this module with it:
//!
//! - each segment is `rstrip`ped (Python's whitespace, which includes `\x1c`–`\x1f`) and
//!   tokenized by [`tokenize_13a`] (mteval-v13a: `<skipped>` dropped, `-\n` joined, newlines
//!   to spaces, `&quot;` `&amp;` `&lt;` `&gt;` unescaped, then sacreBLEU's four regular
//!   expressions: most ASCII punctuation split off, `.` and `,` split off unless between
//!   digits, `-` split off after a digit; then whitespace runs collapsed);
//! - per segment, the 1- to 4-gram counts of the hypothesis are clipped by the references'
//!   (the maximum count over a segment's references), `counts` / `totals` sum the clipped
//!   matches / the hypothesis n-grams over the corpus, `sys_len` the hypothesis tokens and
//!   `ref_len` the length of the reference closest to each hypothesis (the shorter on ties);
//! - `precisions[n] = 100 * counts[n] / totals[n]`; a zero count takes the `exp`
//!   smoothing's `100 / (2^k * totals[n])` (k = 1, 2, ... for each zero count met so far),
//!   and an order with no n-gram at all stops the loop (leaving the rest 0);
//! - `bp = exp(1 - ref_len / sys_len)` when `sys_len < ref_len` (0 when `sys_len` is 0),
//!   else 1; `score = bp * exp(Σ log(precisions) / 4)` with `log(0)` taken as
//!   `-9999999999`; without any match at all the score and precisions are 0.
//!
//! The floating-point operations are those of sacreBLEU in the same order, so the results
//! are bit-identical to Python's on the same C math library.
//!
//! Hypotheses and references are paired in order up to the shorter list (sacreBLEU's
//! `zip`; evaluate rejects lists of different lengths before). An empty corpus gives the
//! all-zero statistics' result (score 0, bp 1) where sacreBLEU raises `IndexError`.

use std::collections::HashMap;

/// The n-gram orders BLEU counts (sacreBLEU's `MAX_NGRAM_ORDER`).
pub const MAX_NGRAM_ORDER: usize = 4;

/// What `evaluate`'s sacrebleu returns (sacreBLEU's `BLEUScore`).
#[derive(Debug, Clone, PartialEq)]
pub struct BleuScore {
    /// The BLEU score, 0–100.
    pub score: f64,
    /// Matched (clipped) n-grams per order, 1 to 4.
    pub counts: [usize; MAX_NGRAM_ORDER],
    /// Hypothesis n-grams per order.
    pub totals: [usize; MAX_NGRAM_ORDER],
    /// The n-gram precisions in percent (smoothed where a count is 0).
    pub precisions: [f64; MAX_NGRAM_ORDER],
    /// The brevity penalty.
    pub bp: f64,
    /// Hypothesis tokens over the corpus.
    pub sys_len: usize,
    /// Closest-reference tokens over the corpus.
    pub ref_len: usize,
}

/// Python's `str.isspace` (what `str.split()` and `str.rstrip()` strip): Rust's
/// `char::is_whitespace` plus the separators `\x1c`–`\x1f`.
pub(crate) fn py_isspace(c: char) -> bool {
    matches!(
        c,
        '\t'..='\r'
            | '\x1c'..='\x1f'
            | ' '
            | '\u{85}'
            | '\u{a0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200a}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202f}'
            | '\u{205f}'
            | '\u{3000}'
    )
}

/// Python's `line.split()`.
fn py_split(line: &str) -> impl Iterator<Item = &str> {
    line.split(py_isspace).filter(|t| !t.is_empty())
}

/// The characters of sacreBLEU's first regular expression,
/// `[\{-\~\[-\` -\&\(-\+\:-\@\/]`: ASCII punctuation other than `'`, `,`, `-` and `.`.
fn is_split_punctuation(c: char) -> bool {
    matches!(c, '{'..='~' | '['..='`' | ' '..='&' | '('..='+' | ':'..='@' | '/')
}

/// One `re.sub` of a two-character pattern `(A)(B)`: matches are taken left to right
/// without overlapping; each is replaced by `replace(a, b)`.
fn sub_pairs(
    line: &[char],
    first: impl Fn(char) -> bool,
    second: impl Fn(char) -> bool,
    replace: impl Fn(&mut Vec<char>, char, char),
) -> Vec<char> {
    let mut out = Vec::with_capacity(line.len() + line.len() / 2);
    let mut i = 0;
    while i < line.len() {
        if i + 1 < line.len() && first(line[i]) && second(line[i + 1]) {
            replace(&mut out, line[i], line[i + 1]);
            i += 2;
        } else {
            out.push(line[i]);
            i += 1;
        }
    }
    out
}

/// sacreBLEU's `TokenizerRegexp` (the language-dependent part of `13a`).
fn tokenize_re(line: &str) -> String {
    let is_digit = |c: char| c.is_ascii_digit();
    let is_period_comma = |c: char| matches!(c, '.' | ',');
    // ([\{-\~\[-\` -\&\(-\+\:-\@\/]) -> ' \1 '
    let mut chars: Vec<char> = Vec::with_capacity(line.len() * 2);
    for c in line.chars() {
        if is_split_punctuation(c) {
            chars.extend([' ', c, ' ']);
        } else {
            chars.push(c);
        }
    }
    // ([^0-9])([\.,]) -> '\1 \2 ': period and comma unless preceded by a digit.
    let chars = sub_pairs(
        &chars,
        |c| !is_digit(c),
        is_period_comma,
        |o, a, b| o.extend([a, ' ', b, ' ']),
    );
    // ([\.,])([^0-9]) -> ' \1 \2': period and comma unless followed by a digit.
    let chars = sub_pairs(
        &chars,
        is_period_comma,
        |c| !is_digit(c),
        |o, a, b| o.extend([' ', a, ' ', b]),
    );
    // ([0-9])(-) -> '\1 \2 ': dash after a digit.
    let chars = sub_pairs(
        &chars,
        is_digit,
        |c| c == '-',
        |o, a, b| o.extend([a, ' ', b, ' ']),
    );
    let line: String = chars.into_iter().collect();
    py_split(&line).collect::<Vec<_>>().join(" ")
}

/// sacreBLEU's `Tokenizer13a()(line)`: the tokens of `line` joined by single spaces.
///
/// ```
/// use tchtrain_examples::sacrebleu::tokenize_13a;
/// assert_eq!(tokenize_13a("He said &quot;hi&quot;, then left."), "He said \" hi \" , then left .");
/// assert_eq!(tokenize_13a("It costs $3.50 (1,000 yen) in 2019-2020."),
///            "It costs $ 3.50 ( 1,000 yen ) in 2019 - 2020 .");
/// ```
pub fn tokenize_13a(line: &str) -> String {
    let mut line = line
        .replace("<skipped>", "")
        .replace("-\n", "")
        .replace('\n', " ");
    if line.contains('&') {
        line = line
            .replace("&quot;", "\"")
            .replace("&amp;", "&")
            .replace("&lt;", "<")
            .replace("&gt;", ">");
    }
    tokenize_re(&format!(" {line} "))
}

/// `BLEU._preprocess_segment` without lowercasing: `tokenize_13a(sent.rstrip())`.
fn preprocess(segment: &str) -> String {
    tokenize_13a(segment.trim_end_matches(py_isspace))
}

/// The 1- to 4-gram counts of a tokenized line, and its length.
fn ngram_counts(tokens: &[&str]) -> HashMap<Vec<String>, usize> {
    let mut counts = HashMap::new();
    for n in 1..=MAX_NGRAM_ORDER {
        for gram in tokens.windows(n) {
            let key: Vec<String> = gram.iter().map(|t| (*t).to_string()).collect();
            *counts.entry(key).or_insert(0) += 1;
        }
    }
    counts
}

/// sacreBLEU's `_get_closest_ref_len`: the reference length nearest the hypothesis length,
/// the shorter on ties (0 without references).
fn closest_ref_len(hyp_len: usize, ref_lens: &[usize]) -> usize {
    let mut best: Option<(usize, usize)> = None;
    for &len in ref_lens {
        let diff = hyp_len.abs_diff(len);
        best = match best {
            Some((d, l)) if diff > d || (diff == d && len >= l) => Some((d, l)),
            _ => Some((diff, len)),
        };
    }
    best.map_or(0, |(_, l)| l)
}

/// Segment statistics: hypothesis length, closest reference length, matches, totals.
struct SegmentStats {
    sys_len: usize,
    ref_len: usize,
    correct: [usize; MAX_NGRAM_ORDER],
    total: [usize; MAX_NGRAM_ORDER],
}

fn segment_statistics<S: AsRef<str>>(hypothesis: &str, references: &[S]) -> SegmentStats {
    let mut ref_ngrams: HashMap<Vec<String>, usize> = HashMap::new();
    let mut ref_lens = Vec::with_capacity(references.len());
    for reference in references {
        let line = preprocess(reference.as_ref());
        let tokens: Vec<&str> = py_split(&line).collect();
        ref_lens.push(tokens.len());
        for (gram, count) in ngram_counts(&tokens) {
            let max = ref_ngrams.entry(gram).or_insert(0);
            *max = (*max).max(count);
        }
    }
    let line = preprocess(hypothesis);
    let tokens: Vec<&str> = py_split(&line).collect();
    let mut stats = SegmentStats {
        sys_len: tokens.len(),
        ref_len: closest_ref_len(tokens.len(), &ref_lens),
        correct: [0; MAX_NGRAM_ORDER],
        total: [0; MAX_NGRAM_ORDER],
    };
    for (gram, count) in ngram_counts(&tokens) {
        let n = gram.len() - 1;
        stats.total[n] += count;
        if let Some(&r) = ref_ngrams.get(&gram) {
            stats.correct[n] += count.min(r);
        }
    }
    stats
}

/// sacreBLEU's `my_log`: `log`, with `log(0)` floored to `-9999999999`.
fn my_log(x: f64) -> f64 {
    if x == 0.0 { -9_999_999_999.0 } else { x.ln() }
}

/// sacreBLEU's `BLEU.compute_bleu` with `smooth_method="exp"`, `effective_order=False`.
fn compute_bleu(
    correct: [usize; MAX_NGRAM_ORDER],
    total: [usize; MAX_NGRAM_ORDER],
    sys_len: usize,
    ref_len: usize,
) -> BleuScore {
    let bp = if sys_len < ref_len {
        if sys_len > 0 {
            (1.0 - ref_len as f64 / sys_len as f64).exp()
        } else {
            0.0
        }
    } else {
        1.0
    };
    let mut precisions = [0.0; MAX_NGRAM_ORDER];
    let mut result = BleuScore {
        score: 0.0,
        counts: correct,
        totals: total,
        precisions,
        bp,
        sys_len,
        ref_len,
    };
    if correct.iter().all(|&c| c == 0) {
        return result;
    }
    let mut smooth_mteval = 1.0f64;
    for n in 0..MAX_NGRAM_ORDER {
        if total[n] == 0 {
            break;
        }
        if correct[n] == 0 {
            smooth_mteval *= 2.0;
            precisions[n] = 100.0 / (smooth_mteval * total[n] as f64);
        } else {
            precisions[n] = 100.0 * correct[n] as f64 / total[n] as f64;
        }
    }
    // Python's `sum([...])` starts from the integer 0, then adds left to right.
    let log_sum = precisions.iter().fold(0.0, |acc, &p| acc + my_log(p));
    result.score = bp * (log_sum / MAX_NGRAM_ORDER as f64).exp();
    result.precisions = precisions;
    result
}

/// `evaluate.load("sacrebleu").compute(predictions=hypotheses, references=[[r] for r in
/// references])`: corpus BLEU with one reference per hypothesis.
///
/// ```
/// use tchtrain_examples::sacrebleu;
/// let r = sacrebleu::corpus_bleu(&["The cat sat on the mat."], &["The cat sat on the mat."]);
/// assert_eq!((r.counts, r.totals, r.bp), ([7, 6, 5, 4], [7, 6, 5, 4], 1.0));
/// assert!((r.score - 100.0).abs() < 1e-9);
/// ```
pub fn corpus_bleu<S: AsRef<str>, R: AsRef<str>>(hypotheses: &[S], references: &[R]) -> BleuScore {
    let refs: Vec<[&str; 1]> = references.iter().map(|r| [r.as_ref()]).collect();
    corpus_bleu_multi(hypotheses, &refs)
}

/// `evaluate.load("sacrebleu").compute(predictions=hypotheses, references=references)`
/// with several references per hypothesis (`references[i]` are hypothesis i's). evaluate
/// requires the same number for each; here a hypothesis may have any number (sacreBLEU's
/// `None` padding of the reference streams), and one with none counts no match and a
/// reference length of 0.
pub fn corpus_bleu_multi<S: AsRef<str>, R: AsRef<[T]>, T: AsRef<str>>(
    hypotheses: &[S],
    references: &[R],
) -> BleuScore {
    let (mut sys_len, mut ref_len) = (0, 0);
    let mut correct = [0; MAX_NGRAM_ORDER];
    let mut total = [0; MAX_NGRAM_ORDER];
    for (hypothesis, refs) in hypotheses.iter().zip(references) {
        let s = segment_statistics(hypothesis.as_ref(), refs.as_ref());
        sys_len += s.sys_len;
        ref_len += s.ref_len;
        for n in 0..MAX_NGRAM_ORDER {
            correct[n] += s.correct[n];
            total[n] += s.total[n];
        }
    }
    compute_bleu(correct, total, sys_len, ref_len)
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

    fn usizes(v: &serde_json::Value) -> Vec<usize> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as usize)
            .collect()
    }

    fn close(a: f64, b: f64) -> bool {
        a == b || (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
    }

    /// Asserts `got` equals sacreBLEU's dict; returns whether every float is bit-identical.
    fn assert_bleu(what: &str, got: &BleuScore, want: &serde_json::Value) -> bool {
        assert_eq!(
            got.counts.to_vec(),
            usizes(&want["counts"]),
            "{what}: counts"
        );
        assert_eq!(
            got.totals.to_vec(),
            usizes(&want["totals"]),
            "{what}: totals"
        );
        assert_eq!(
            got.sys_len as u64,
            want["sys_len"].as_u64().unwrap(),
            "{what}"
        );
        assert_eq!(
            got.ref_len as u64,
            want["ref_len"].as_u64().unwrap(),
            "{what}"
        );
        let mut floats = vec![(got.score, want["score"].as_f64().unwrap())];
        floats.push((got.bp, want["bp"].as_f64().unwrap()));
        for (i, p) in got.precisions.iter().enumerate() {
            floats.push((*p, want["precisions"][i].as_f64().unwrap()));
        }
        for (g, w) in &floats {
            assert!(close(*g, *w), "{what}: {got:?} vs sacrebleu {want}");
        }
        floats.iter().all(|(g, w)| g.to_bits() == w.to_bits())
    }

    #[test]
    fn tokenizer_13a_equals_sacrebleu() {
        let json = reference();
        let cases = json["tokenize_13a"].as_array().unwrap();
        assert!(cases.len() >= 80);
        for case in cases {
            let (line, want) = (case[0].as_str().unwrap(), case[1].as_str().unwrap());
            assert_eq!(tokenize_13a(line), want, "{line:?}");
        }
        // The regular expressions' left-to-right, non-overlapping matching.
        assert_eq!(
            tokenize_13a("a.. 1.,2 ,,x 3--4"),
            "a . . 1 . , 2 , , x 3 - -4"
        );
    }

    #[test]
    fn corpus_bleu_equals_sacrebleu() {
        let json = reference();
        let pairs = json["pairs"].as_array().unwrap();
        let preds: Vec<&str> = pairs.iter().map(|p| p[0].as_str().unwrap()).collect();
        let refs: Vec<&str> = pairs.iter().map(|p| p[1].as_str().unwrap()).collect();
        let mut exact = assert_bleu("corpus", &corpus_bleu(&preds, &refs), &json["bleu_corpus"]);
        let singles = json["bleu_single"].as_array().unwrap();
        assert_eq!(singles.len(), pairs.len());
        for ((p, r), want) in preds.iter().zip(&refs).zip(singles) {
            exact &= assert_bleu(&format!("{p:?} / {r:?}"), &corpus_bleu(&[p], &[r]), want);
        }
        let multi = &json["bleu_multi"];
        let hyps: Vec<&str> = multi["hypotheses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h.as_str().unwrap())
            .collect();
        let refs: Vec<Vec<&str>> = multi["references"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                r.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_str().unwrap())
                    .collect()
            })
            .collect();
        exact &= assert_bleu("multi", &corpus_bleu_multi(&hyps, &refs), &multi["result"]);
        assert!(exact, "within 1e-12 but not bit-identical");
    }

    #[test]
    fn edge_cases() {
        let empty: [&str; 0] = [];
        let r = corpus_bleu(&empty, &empty);
        assert_eq!((r.score, r.bp, r.sys_len, r.ref_len), (0.0, 1.0, 0, 0));
        // An order without n-grams stops the loop: "A dog ." has no 4-gram.
        let r = corpus_bleu(&["A dog."], &["A dog."]);
        assert_eq!(
            (r.counts, r.totals, r.score),
            ([3, 2, 1, 0], [3, 2, 1, 0], 0.0)
        );
        assert_eq!(closest_ref_len(5, &[3, 7, 9]), 3);
        assert_eq!(closest_ref_len(5, &[]), 0);
    }
}

//! nltk's `sent_tokenize` (nltk 3.10.4's `PunktSentenceTokenizer.tokenize` with a trained
//! `punkt_tab` model), which `run_summarization` uses to put each sentence of a generated
//! summary on its own line before `rougeLsum`.
//!
//! A port of the tokenizing half of nltk's `punkt.py` (no training): the candidate
//! sentence ends (`.`, `?`, `!` followed by other punctuation or by whitespace and a token),
//! the word before each found right to left with overlapping candidates dropped
//! (`_match_potential_end_contexts`), and for each candidate the decision on its context:
//! the punkt word tokenizer, the first pass (sentence-end characters, ellipses, known
//! abbreviations) and the second pass (collocations, the orthographic heuristic, frequent
//! sentence starters, initials and numbers); then the realignment of closing quotes and
//! brackets after a boundary. The regular expressions of nltk are written out as scanners
//! over the text's characters (Python's string indices). `\d` is taken as Rust's
//! `char::is_numeric` and `\w` as `char::is_alphanumeric` or `_`.
//!
//! The model is nltk's `tokenizers/punkt_tab/english/` (`abbrev_types.txt`,
//! `sent_starters.txt`, `collocations.tab`, `ortho_context.tab`), found as nltk finds it:
//! see [`find_punkt_tab`].
//!
//! ```no_run
//! use tchtrain_examples::punkt::PunktSentenceTokenizer;
//! let punkt = PunktSentenceTokenizer::load(&tchtrain_examples::punkt::find_punkt_tab(None, "english")?)?;
//! assert_eq!(punkt.tokenize("Mr. Smith left. He was late."), ["Mr. Smith left.", "He was late."]);
//! # Ok::<(), tchtrain_examples::Error>(())
//! ```

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::sacrebleu::py_isspace;

const ORTHO_BEG_UC: i64 = 1 << 1;
const ORTHO_MID_UC: i64 = 1 << 2;
const ORTHO_UNK_UC: i64 = 1 << 3;
const ORTHO_BEG_LC: i64 = 1 << 4;
const ORTHO_MID_LC: i64 = 1 << 5;
const ORTHO_UNK_LC: i64 = 1 << 6;
const ORTHO_UC: i64 = ORTHO_BEG_UC + ORTHO_MID_UC + ORTHO_UNK_UC;
const ORTHO_LC: i64 = ORTHO_BEG_LC + ORTHO_MID_LC + ORTHO_UNK_LC;

/// The folders nltk searches for its data (`nltk.data.path` on Linux), after `NLTK_DATA`.
const NLTK_DIRS: [&str; 4] = [
    "/usr/share/nltk_data",
    "/usr/local/share/nltk_data",
    "/usr/lib/nltk_data",
    "/usr/local/lib/nltk_data",
];

/// The `tokenizers/punkt_tab/{language}` folder: under `dir` (`--nltk_data`) when given,
/// else under each folder of `NLTK_DATA` (`:`-separated), `~/nltk_data`, nltk's system
/// folders (`/usr/share/nltk_data`, ...) and last `$TCHTRAIN_ASSETS/nltk_data` (the asset
/// `cargo xtask setup` writes). Missing: an error saying how to get it.
pub fn find_punkt_tab(dir: Option<&Path>, language: &str) -> Result<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Some(d) = dir {
        roots.push(d.to_path_buf());
    } else {
        if let Some(paths) = std::env::var_os("NLTK_DATA") {
            roots.extend(std::env::split_paths(&paths));
        }
        if let Some(home) = std::env::var_os("HOME") {
            roots.push(Path::new(&home).join("nltk_data"));
        }
        roots.extend(NLTK_DIRS.iter().map(PathBuf::from));
        if let Some(assets) = std::env::var_os("TCHTRAIN_ASSETS") {
            roots.push(Path::new(&assets).join("nltk_data"));
        }
    }
    let rel = Path::new("tokenizers").join("punkt_tab").join(language);
    roots
        .iter()
        .map(|r| r.join(&rel))
        .find(|p| p.join("abbrev_types.txt").is_file())
        .ok_or_else(|| Error::InvalidFlag {
            flag: "nltk_data".into(),
            detail: format!(
                "nltk's punkt_tab model ({}) was not found under {}: install it (python -c \"import nltk; nltk.download('punkt_tab')\", or `cargo xtask setup`, which writes $TCHTRAIN_ASSETS/nltk_data) and pass --nltk_data DIR or set NLTK_DATA",
                rel.display(),
                roots
                    .iter()
                    .map(|r| r.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
}

/// nltk's `PunktSentenceTokenizer` with a `punkt_tab` model's parameters.
#[derive(Debug, Clone, Default)]
pub struct PunktSentenceTokenizer {
    abbrev_types: HashSet<String>,
    sent_starters: HashSet<String>,
    collocations: HashSet<(String, String)>,
    ortho_context: HashMap<String, i64>,
}

/// One word token and its annotations (nltk's `PunktToken`).
#[derive(Debug, Clone)]
struct Token {
    tok: Vec<char>,
    typ: String,
    period_final: bool,
    sentbreak: bool,
    abbr: bool,
    ellipsis: bool,
}

/// `[^\W\d]`: a word character that is not a digit.
fn is_word_non_digit(c: char) -> bool {
    (c.is_alphanumeric() && !c.is_numeric()) || c == '_'
}

/// `^-?[\.,]?\d[\d,\.-]*\.?$` on a whole (lowercased) token.
fn is_numeric_token(t: &[char]) -> bool {
    let mut i = 0;
    if t.get(i) == Some(&'-') {
        i += 1;
    }
    if matches!(t.get(i), Some('.' | ',')) {
        i += 1;
    }
    if !t.get(i).is_some_and(|c| c.is_numeric()) {
        return false;
    }
    i += 1;
    t[i..]
        .iter()
        .all(|&c| c.is_numeric() || matches!(c, ',' | '.' | '-'))
}

impl Token {
    fn new(tok: Vec<char>) -> Self {
        let lower: String = tok.iter().collect::<String>().to_lowercase();
        let lower_chars: Vec<char> = lower.chars().collect();
        let typ = if is_numeric_token(&lower_chars) {
            "##number##".to_string()
        } else {
            lower
        };
        let period_final = tok.last() == Some(&'.');
        Self {
            tok,
            typ,
            period_final,
            sentbreak: false,
            abbr: false,
            ellipsis: false,
        }
    }

    fn type_no_period(&self) -> String {
        let chars: Vec<char> = self.typ.chars().collect();
        if chars.len() > 1 && chars[chars.len() - 1] == '.' {
            chars[..chars.len() - 1].iter().collect()
        } else {
            self.typ.clone()
        }
    }

    fn type_no_sentperiod(&self) -> String {
        if self.sentbreak {
            self.type_no_period()
        } else {
            self.typ.clone()
        }
    }

    fn first_upper(&self) -> bool {
        self.tok.first().is_some_and(|c| c.is_uppercase())
    }

    fn first_lower(&self) -> bool {
        self.tok.first().is_some_and(|c| c.is_lowercase())
    }

    /// `\.\.+$` matched at the start.
    fn is_ellipsis(&self) -> bool {
        self.tok.len() >= 2 && self.tok.iter().all(|&c| c == '.')
    }

    /// `[^\W\d]\.$` matched at the start.
    fn is_initial(&self) -> bool {
        self.tok.len() == 2 && is_word_non_digit(self.tok[0]) && self.tok[1] == '.'
    }
}

/// `_re_non_word_chars`: characters that cannot be inside a word.
fn is_non_word(c: char) -> bool {
    matches!(
        c,
        ')' | '"'
            | ';'
            | '}'
            | ']'
            | '*'
            | ':'
            | '@'
            | '\''
            | '('
            | '{'
            | '['
            | '\u{2018}'
            | '\u{2019}'
            | '\u{201c}'
            | '\u{201d}'
            | '\u{ab}'
            | '\u{bb}'
            | '?'
            | '!'
    )
}

/// The length of `_re_multi_char_punct` (`\-{2,}|\.{2,}|(?:\.\s){2,}\.`) matched at `i`.
fn multi_char_at(s: &[char], i: usize) -> Option<usize> {
    let run = |c: char| s[i..].iter().take_while(|&&x| x == c).count();
    if s.get(i) == Some(&'-') && run('-') >= 2 {
        return Some(run('-'));
    }
    if s.get(i) == Some(&'.') && run('.') >= 2 {
        return Some(run('.'));
    }
    // (?:\.\s){2,}\.  (greedy repetition, backtracking one pair when no final period)
    let mut pairs = 0;
    let mut j = i;
    while s.get(j) == Some(&'.') && s.get(j + 1).is_some_and(|&c| py_isspace(c)) {
        pairs += 1;
        j += 2;
    }
    while pairs >= 2 {
        if s.get(i + 2 * pairs) == Some(&'.') {
            return Some(2 * pairs + 1);
        }
        pairs -= 1;
    }
    None
}

/// The lookahead ending a word at `i`: whitespace, the end, a non-word character, a
/// multi-character punctuation, or a comma at a word's end.
fn word_ends_at(s: &[char], i: usize) -> bool {
    let Some(&c) = s.get(i) else {
        return true;
    };
    if py_isspace(c) || is_non_word(c) || multi_char_at(s, i).is_some() {
        return true;
    }
    if c == ',' {
        return match s.get(i + 1) {
            None => true,
            Some(&n) => py_isspace(n) || is_non_word(n) || multi_char_at(s, i + 1).is_some(),
        };
    }
    false
}

/// `PunktLanguageVars.word_tokenize` (the `findall` of `_word_tokenize_fmt`) on one line.
fn word_tokenize(s: &[char]) -> Vec<Vec<char>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if let Some(n) = multi_char_at(s, i) {
            out.push(s[i..i + n].to_vec());
            i += n;
            continue;
        }
        if py_isspace(c) {
            i += 1;
            continue;
        }
        let word_start = !matches!(
            c,
            '(' | '"'
                | '`'
                | '{'
                | '['
                | ':'
                | ';'
                | '&'
                | '#'
                | '*'
                | '@'
                | ')'
                | '}'
                | ']'
                | '-'
                | ','
        );
        if word_start {
            // \S+? up to the first position where the word may end.
            let mut k = i + 1;
            while k < s.len() && !word_ends_at(s, k) {
                if py_isspace(s[k]) {
                    break;
                }
                k += 1;
            }
            out.push(s[i..k].to_vec());
            i = k;
            continue;
        }
        out.push(vec![c]);
        i += 1;
    }
    out
}

/// One candidate sentence end (`period_context_re`'s match): the character's index, the
/// text of `after_tok` and the start of `next_tok` when whitespace and a token follow.
struct EndMatch {
    start: usize,
    after_tok: String,
    next_tok: Option<usize>,
}

impl PunktSentenceTokenizer {
    /// Reads a `punkt_tab` language folder (`abbrev_types.txt`, `sent_starters.txt`,
    /// `collocations.tab`, `ortho_context.tab`).
    pub fn load(dir: &Path) -> Result<Self> {
        let read = |name: &str| -> Result<Vec<String>> {
            let path = dir.join(name);
            let text =
                std::fs::read_to_string(&path).map_err(|e| Error::io("reading", &path, e))?;
            Ok(text
                .split_inclusive('\n')
                .map(|l| l.strip_suffix('\n').unwrap_or(l).to_string())
                .collect())
        };
        let tabbed = |line: &str| -> Vec<String> { line.split('\t').map(String::from).collect() };
        let mut ortho_context = HashMap::new();
        for (n, line) in read("ortho_context.tab")?.iter().enumerate() {
            let parts = tabbed(line);
            let value = parts
                .get(1)
                .and_then(|v| v.trim().parse::<i64>().ok())
                .ok_or_else(|| Error::DataFile {
                    path: dir.join("ortho_context.tab"),
                    line: n + 1,
                    detail: "expected WORD<TAB>INTEGER".into(),
                })?;
            ortho_context.insert(parts[0].clone(), value);
        }
        Ok(Self {
            abbrev_types: read("abbrev_types.txt")?.into_iter().collect(),
            sent_starters: read("sent_starters.txt")?.into_iter().collect(),
            collocations: read("collocations.tab")?
                .iter()
                .map(|l| {
                    let p = tabbed(l);
                    (p[0].clone(), p.get(1).cloned().unwrap_or_default())
                })
                .collect(),
            ortho_context,
        })
    }

    /// `sent_tokenize(text)`: the sentences of `text`.
    pub fn tokenize(&self, text: &str) -> Vec<String> {
        let chars: Vec<char> = text.chars().collect();
        let slices = self.slices_from_text(&chars);
        self.realign_boundaries(&chars, &slices)
            .into_iter()
            .map(|(a, b)| chars[a..b].iter().collect())
            .collect()
    }

    /// `period_context_re().finditer(text)`.
    fn period_contexts(s: &[char]) -> Vec<EndMatch> {
        let mut out = Vec::new();
        for (i, &c) in s.iter().enumerate() {
            if !matches!(c, '.' | '?' | '!') {
                continue;
            }
            match s.get(i + 1) {
                Some(&n) if is_non_word(n) => out.push(EndMatch {
                    start: i,
                    after_tok: n.to_string(),
                    next_tok: None,
                }),
                Some(&n) if py_isspace(n) => {
                    let mut j = i + 1;
                    while j < s.len() && py_isspace(s[j]) {
                        j += 1;
                    }
                    let mut k = j;
                    while k < s.len() && !py_isspace(s[k]) {
                        k += 1;
                    }
                    if k > j {
                        out.push(EndMatch {
                            start: i,
                            after_tok: s[i + 1..k].iter().collect(),
                            next_tok: Some(j),
                        });
                    }
                }
                _ => {}
            }
        }
        out
    }

    /// `_match_potential_end_contexts`: each kept candidate and its context (the word
    /// before, the character, `after_tok`).
    fn potential_end_contexts(s: &[char]) -> Vec<(EndMatch, String)> {
        let last_whitespace = |t: &[char]| -> usize {
            (0..t.len())
                .rev()
                .find(|&i| matches!(t[i], ' ' | '\t' | '\n' | '\r' | '\x0b' | '\x0c'))
                .unwrap_or(0)
        };
        let context = |slice: (usize, usize), m: &EndMatch| -> String {
            let mut c: String = s[slice.0..slice.1].iter().collect();
            c.push(s[m.start]);
            c.push_str(&m.after_tok);
            c
        };
        let mut out = Vec::new();
        let mut previous_slice = (0usize, 0usize);
        let mut previous_match: Option<EndMatch> = None;
        for m in Self::period_contexts(s) {
            let before = &s[previous_slice.1.min(m.start)..m.start];
            let mut index = last_whitespace(before);
            if index != 0 {
                index += previous_slice.1 + 1;
            } else {
                index = previous_slice.0;
            }
            let prev_word_slice = (index, m.start);
            if let Some(pm) = previous_match.take()
                && previous_slice.1 <= prev_word_slice.0
            {
                let c = context(previous_slice, &pm);
                out.push((pm, c));
            }
            previous_match = Some(m);
            previous_slice = prev_word_slice;
        }
        if let Some(pm) = previous_match {
            let c = context(previous_slice, &pm);
            out.push((pm, c));
        }
        out
    }

    /// `_slices_from_text`.
    fn slices_from_text(&self, s: &[char]) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut last_break = 0;
        for (m, context) in Self::potential_end_contexts(s) {
            if self.text_contains_sentbreak(&context) {
                out.push((last_break, m.start + 1));
                last_break = m.next_tok.unwrap_or(m.start + 1);
            }
        }
        let mut end = s.len();
        while end > 0 && py_isspace(s[end - 1]) {
            end -= 1;
        }
        out.push((last_break, end));
        out
    }

    /// `re_boundary_realignment.match` at the start of `t`: the length of the closing
    /// punctuation (`m.group(0).rstrip()`) and of the whole match.
    fn boundary_realignment(t: &[char]) -> Option<(usize, usize)> {
        let closing = |c: char| {
            matches!(
                c,
                '"' | '\''
                    | ')'
                    | ']'
                    | '}'
                    | '\u{2018}'
                    | '\u{2019}'
                    | '\u{201c}'
                    | '\u{201d}'
                    | '\u{ab}'
                    | '\u{bb}'
            )
        };
        let mut k = 1;
        while k <= t.len() && closing(t[k - 1]) {
            // (?:\s+|(?=--)|$) after k characters
            let ws = t[k..].iter().take_while(|&&c| py_isspace(c)).count();
            if ws > 0 {
                return Some((k, k + ws));
            }
            if t[k..].starts_with(&['-', '-']) || k == t.len() || t[k] == '\n' {
                return Some((k, k));
            }
            k += 1;
        }
        None
    }

    /// `_realign_boundaries`.
    fn realign_boundaries(&self, s: &[char], slices: &[(usize, usize)]) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut realign = 0;
        for (i, &(start, stop)) in slices.iter().enumerate() {
            let sentence1 = (start + realign, stop);
            let non_empty = sentence1.0 < sentence1.1.min(s.len());
            let Some(&sentence2) = slices.get(i + 1) else {
                if non_empty {
                    out.push(sentence1);
                }
                continue;
            };
            let t = &s[sentence2.0.min(sentence2.1)..sentence2.1];
            if let Some((kept, end)) = Self::boundary_realignment(t) {
                out.push((sentence1.0, sentence2.0 + kept));
                realign = end;
            } else {
                realign = 0;
                if non_empty {
                    out.push(sentence1);
                }
            }
        }
        out
    }

    /// `_tokenize_words`: the tokens of each non-blank line.
    fn tokenize_words(text: &str) -> Vec<Token> {
        let mut out = Vec::new();
        for line in text.split('\n') {
            if line.chars().all(py_isspace) {
                continue;
            }
            let chars: Vec<char> = line.chars().collect();
            out.extend(word_tokenize(&chars).into_iter().map(Token::new));
        }
        out
    }

    /// `_first_pass_annotation`.
    fn first_pass(&self, t: &mut Token) {
        let tok: String = t.tok.iter().collect();
        if matches!(tok.as_str(), "." | "?" | "!") {
            t.sentbreak = true;
        } else if t.is_ellipsis() {
            t.ellipsis = true;
        } else if t.period_final && !tok.ends_with("..") {
            let stem = tok[..tok.len() - 1].to_lowercase();
            let last = stem.rsplit('-').next().unwrap_or_default();
            if self.abbrev_types.contains(&stem) || self.abbrev_types.contains(last) {
                t.abbr = true;
            } else {
                t.sentbreak = true;
            }
        }
    }

    fn ortho(&self, typ: &str) -> i64 {
        self.ortho_context.get(typ).copied().unwrap_or(0)
    }

    /// `_ortho_heuristic`: `Some(true)` / `Some(false)`, `None` for "unknown".
    fn ortho_heuristic(&self, t: &Token) -> Option<bool> {
        if t.tok.len() == 1 && matches!(t.tok[0], ';' | ':' | ',' | '.' | '!' | '?') {
            return Some(false);
        }
        let ortho = self.ortho(&t.type_no_sentperiod());
        if t.first_upper() && ortho & ORTHO_LC != 0 && ortho & ORTHO_MID_UC == 0 {
            return Some(true);
        }
        if t.first_lower() && (ortho & ORTHO_UC != 0 || ortho & ORTHO_BEG_LC == 0) {
            return Some(false);
        }
        None
    }

    /// `_second_pass_annotation` of `t1` followed by `t2`.
    fn second_pass(&self, t1: &mut Token, t2: &Token) {
        if !t1.period_final {
            return;
        }
        let typ = t1.type_no_period();
        let next_typ = t2.type_no_sentperiod();
        let is_initial = t1.is_initial();
        if self.collocations.contains(&(typ.clone(), next_typ.clone())) {
            t1.sentbreak = false;
            t1.abbr = true;
            return;
        }
        if (t1.abbr || t1.ellipsis) && !is_initial {
            if self.ortho_heuristic(t2) == Some(true) {
                t1.sentbreak = true;
                return;
            }
            if t2.first_upper() && self.sent_starters.contains(&next_typ) {
                t1.sentbreak = true;
                return;
            }
        }
        if is_initial || typ == "##number##" {
            let starter = self.ortho_heuristic(t2);
            if starter == Some(false) {
                t1.sentbreak = false;
                t1.abbr = true;
                return;
            }
            if starter.is_none()
                && is_initial
                && t2.first_upper()
                && self.ortho(&next_typ) & ORTHO_LC == 0
            {
                t1.sentbreak = false;
                t1.abbr = true;
            }
        }
    }

    /// `text_contains_sentbreak`: whether a token other than the last is a sentence break
    /// after both passes.
    fn text_contains_sentbreak(&self, text: &str) -> bool {
        let mut tokens = Self::tokenize_words(text);
        for t in &mut tokens {
            self.first_pass(t);
        }
        let n = tokens.len();
        for i in 0..n {
            if i + 1 < n {
                let (a, b) = tokens.split_at_mut(i + 1);
                self.second_pass(&mut a[i], &b[0]);
            }
            if tokens[i].sentbreak {
                return i + 1 < n;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_split_as_punkt() {
        let w = |s: &str| -> Vec<String> {
            word_tokenize(&s.chars().collect::<Vec<_>>())
                .into_iter()
                .map(|t| t.into_iter().collect())
                .collect()
        };
        assert_eq!(
            w("Hello, world... (yes)"),
            ["Hello", ",", "world", "...", "(", "yes", ")"]
        );
        assert_eq!(w("a--b 3.5 x."), ["a", "--", "b", "3.5", "x."]);
    }
}

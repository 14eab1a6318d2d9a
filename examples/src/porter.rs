//! nltk's `PorterStemmer()` in its default mode (`NLTK_EXTENSIONS`, nltk 3.10), the stemmer
//! that rouge-score's tokenizer applies with `use_stemmer=True` ([`rouge`](crate::rouge)).
//!
//! What nltk computes, and this module with it, step for step:
//!
//! - the word is lowercased; the irregular forms of NLTK's pool map directly (`skies` →
//!   `sky`, `dying` → `die`, `lying` → `lie`, `tying` → `tie`, `news`, `innings` →
//!   `inning`, `outings` → `outing`, `cannings` → `canning`, `howe`, `proceed`, `exceed`,
//!   `succeed`); a word of at most 2 characters (counted before lowercasing) is returned
//!   lowercased;
//! - Porter's steps 1a, 1b, 1c, 2, 3, 4, 5a, 5b, with NLTK's deviations: `ies` / `ied` of a
//!   4-letter word become `ie` (`ties` → `tie`), any other `ied` becomes `i`; step 1c turns
//!   `y` into `i` only after a consonant that is not the stem's first letter (`happy` →
//!   `happi`, `sky` stays); `*o` also holds for a 2-letter vowel-consonant stem; step 2
//!   first rewrites `alli` to `al` (and runs again), has `bli` → `ble` (Martin Porter's
//!   version of `abli`), `fulli` → `ful` and `logi` → `log` (measured without the `ogi`).
//!
//! Each rule list stops at the first suffix the word ends with, whether or not its
//! condition holds, as nltk's `_apply_rule_list` does. Characters are Unicode scalar values
//! (Python's code points); letters other than `a e i o u y` are consonants, digits included.
//! Lowercasing is Rust's `to_lowercase`, which equals Python's `str.lower` except for
//! characters whose case mapping changed between the two Unicode versions (none of them
//! ASCII); rouge-score only passes ASCII `[a-z0-9]` tokens.

/// NLTK's `pool`: irregular forms and the stem each maps to.
const IRREGULAR_FORMS: &[(&str, &str)] = &[
    ("sky", "sky"),
    ("skies", "sky"),
    ("dying", "die"),
    ("lying", "lie"),
    ("tying", "tie"),
    ("news", "news"),
    ("innings", "inning"),
    ("inning", "inning"),
    ("outings", "outing"),
    ("outing", "outing"),
    ("cannings", "canning"),
    ("canning", "canning"),
    ("howe", "howe"),
    ("proceed", "proceed"),
    ("exceed", "exceed"),
    ("succeed", "succeed"),
];

/// `PorterStemmer().stem(word)` (nltk, mode `NLTK_EXTENSIONS`, `to_lowercase=True`).
///
/// ```
/// use tchtrain_examples::porter;
/// assert_eq!(porter::stem("caresses"), "caress");
/// assert_eq!(porter::stem("Generalization"), "gener");
/// assert_eq!(porter::stem("happy"), "happi");
/// assert_eq!(porter::stem("skies"), "sky");
/// ```
pub fn stem(word: &str) -> String {
    let lower = word.to_lowercase();
    if let Some((_, s)) = IRREGULAR_FORMS.iter().find(|(form, _)| *form == lower) {
        return (*s).to_string();
    }
    if word.chars().count() <= 2 {
        return lower;
    }
    let w: Vec<char> = lower.chars().collect();
    let w = step1a(w);
    let w = step1b(w);
    let w = step1c(w);
    let w = step2(w);
    let w = step3(w);
    let w = step4(w);
    let w = step5a(w);
    let w = step5b(w);
    w.into_iter().collect()
}

fn is_vowel(c: char) -> bool {
    matches!(c, 'a' | 'e' | 'i' | 'o' | 'u')
}

/// nltk's `_is_consonant(word, i)`: a letter other than `a e i o u`, and other than a `y`
/// after a consonant (nltk walks back over the run of `y`s, flipping at each one).
fn is_consonant(word: &[char], mut i: usize) -> bool {
    if is_vowel(word[i]) {
        return false;
    }
    if word[i] == 'y' {
        let mut negate = false;
        while i > 0 && word[i] == 'y' {
            negate = !negate;
            i -= 1;
        }
        // `(word[i] not in vowels) != negate`
        return is_vowel(word[i]) == negate;
    }
    true
}

/// nltk's `_consonant_flags`: `true` for each consonant (the single-pass equivalent of
/// [`is_consonant`] at every position).
fn consonant_flags(word: &[char]) -> Vec<bool> {
    let mut flags: Vec<bool> = Vec::with_capacity(word.len());
    for (i, &c) in word.iter().enumerate() {
        let flag = if is_vowel(c) {
            false
        } else if c == 'y' {
            i == 0 || !flags[i - 1]
        } else {
            true
        };
        flags.push(flag);
    }
    flags
}

/// Porter's measure *m*: the number of vowel-consonant transitions (`"vc"` in the word's
/// c/v pattern).
fn measure(stem: &[char]) -> usize {
    let flags = consonant_flags(stem);
    flags.windows(2).filter(|w| !w[0] && w[1]).count()
}

fn has_positive_measure(stem: &[char]) -> bool {
    measure(stem) > 0
}

fn contains_vowel(stem: &[char]) -> bool {
    !consonant_flags(stem).iter().all(|&c| c)
}

/// `*d`: ends with a double consonant.
fn ends_double_consonant(word: &[char]) -> bool {
    let n = word.len();
    n >= 2 && word[n - 1] == word[n - 2] && is_consonant(word, n - 1)
}

/// `*o`: ends consonant-vowel-consonant, the last not `w`, `x` or `y`; or (NLTK) is a
/// 2-letter vowel-consonant word.
fn ends_cvc(word: &[char]) -> bool {
    let n = word.len();
    (n >= 3
        && is_consonant(word, n - 3)
        && !is_consonant(word, n - 2)
        && is_consonant(word, n - 1)
        && !matches!(word[n - 1], 'w' | 'x' | 'y'))
        || (n == 2 && !is_consonant(word, 0) && is_consonant(word, 1))
}

fn ends_with(word: &[char], suffix: &str) -> bool {
    let n = suffix.chars().count();
    word.len() >= n && word[word.len() - n..].iter().copied().eq(suffix.chars())
}

/// `word` without its last `n` characters, followed by `replacement`.
fn replace_tail(word: &[char], n: usize, replacement: &str) -> Vec<char> {
    let mut out = word[..word.len() - n].to_vec();
    out.extend(replacement.chars());
    out
}

/// A condition on the stem left once the suffix is removed.
type Condition<'a> = &'a dyn Fn(&[char]) -> bool;

/// nltk's `_apply_rule_list` for rules with a literal suffix: the first rule whose suffix
/// ends the word decides (its replacement if the condition holds, else the word unchanged).
fn apply_rule_list(word: Vec<char>, rules: &[(&str, &str, Option<Condition<'_>>)]) -> Vec<char> {
    for (suffix, replacement, condition) in rules {
        if ends_with(&word, suffix) {
            let n = suffix.chars().count();
            let stem = &word[..word.len() - n];
            if condition.is_none_or(|c| c(stem)) {
                return replace_tail(&word, n, replacement);
            }
            return word;
        }
    }
    word
}

fn step1a(word: Vec<char>) -> Vec<char> {
    if ends_with(&word, "ies") && word.len() == 4 {
        return replace_tail(&word, 3, "ie");
    }
    apply_rule_list(
        word,
        &[
            ("sses", "ss", None),
            ("ies", "i", None),
            ("ss", "ss", None),
            ("s", "", None),
        ],
    )
}

fn step1b(word: Vec<char>) -> Vec<char> {
    if ends_with(&word, "ied") {
        let replacement = if word.len() == 4 { "ie" } else { "i" };
        return replace_tail(&word, 3, replacement);
    }
    if ends_with(&word, "eed") {
        let stem = &word[..word.len() - 3];
        if measure(stem) > 0 {
            return replace_tail(&word, 3, "ee");
        }
        return word;
    }
    let mut intermediate = None;
    for suffix in ["ed", "ing"] {
        if ends_with(&word, suffix) {
            let stem = &word[..word.len() - suffix.len()];
            if contains_vowel(stem) {
                intermediate = Some(stem.to_vec());
                break;
            }
        }
    }
    let Some(stem) = intermediate else {
        return word;
    };
    // The rule list of nltk's step 1b, applied to the intermediate stem:
    // AT -> ATE, BL -> BLE, IZ -> IZE, (*d and not *L/*S/*Z) -> single letter,
    // (m=1 and *o) -> E.
    for (suffix, replacement) in [("at", "ate"), ("bl", "ble"), ("iz", "ize")] {
        if ends_with(&stem, suffix) {
            return replace_tail(&stem, 2, replacement);
        }
    }
    if ends_double_consonant(&stem) {
        let last = stem[stem.len() - 1];
        if !matches!(last, 'l' | 's' | 'z') {
            return replace_tail(&stem, 1, "");
        }
        return stem;
    }
    if measure(&stem) == 1 && ends_cvc(&stem) {
        let mut out = stem;
        out.push('e');
        return out;
    }
    stem
}

fn step1c(word: Vec<char>) -> Vec<char> {
    let nltk_condition = |stem: &[char]| stem.len() > 1 && is_consonant(stem, stem.len() - 1);
    apply_rule_list(word, &[("y", "i", Some(&nltk_condition))])
}

fn step2(word: Vec<char>) -> Vec<char> {
    if ends_with(&word, "alli") && has_positive_measure(&word[..word.len() - 4]) {
        return step2(replace_tail(&word, 4, "al"));
    }
    let pos: Condition<'_> = &has_positive_measure;
    // `logi` is measured on the word without `ogi` (the `l` kept), as nltk's lambda does.
    let logi_word = word.clone();
    let logi = move |_: &[char]| {
        logi_word.len() >= 3 && has_positive_measure(&logi_word[..logi_word.len() - 3])
    };
    apply_rule_list(
        word,
        &[
            ("ational", "ate", Some(pos)),
            ("tional", "tion", Some(pos)),
            ("enci", "ence", Some(pos)),
            ("anci", "ance", Some(pos)),
            ("izer", "ize", Some(pos)),
            ("bli", "ble", Some(pos)),
            ("alli", "al", Some(pos)),
            ("entli", "ent", Some(pos)),
            ("eli", "e", Some(pos)),
            ("ousli", "ous", Some(pos)),
            ("ization", "ize", Some(pos)),
            ("ation", "ate", Some(pos)),
            ("ator", "ate", Some(pos)),
            ("alism", "al", Some(pos)),
            ("iveness", "ive", Some(pos)),
            ("fulness", "ful", Some(pos)),
            ("ousness", "ous", Some(pos)),
            ("aliti", "al", Some(pos)),
            ("iviti", "ive", Some(pos)),
            ("biliti", "ble", Some(pos)),
            ("fulli", "ful", Some(pos)),
            ("logi", "log", Some(&logi)),
        ],
    )
}

fn step3(word: Vec<char>) -> Vec<char> {
    let pos: Condition<'_> = &has_positive_measure;
    apply_rule_list(
        word,
        &[
            ("icate", "ic", Some(pos)),
            ("ative", "", Some(pos)),
            ("alize", "al", Some(pos)),
            ("iciti", "ic", Some(pos)),
            ("ical", "ic", Some(pos)),
            ("ful", "", Some(pos)),
            ("ness", "", Some(pos)),
        ],
    )
}

fn step4(word: Vec<char>) -> Vec<char> {
    let gt1 = |stem: &[char]| measure(stem) > 1;
    let gt1: Condition<'_> = &gt1;
    let ion = |stem: &[char]| measure(stem) > 1 && matches!(stem.last(), Some('s' | 't'));
    apply_rule_list(
        word,
        &[
            ("al", "", Some(gt1)),
            ("ance", "", Some(gt1)),
            ("ence", "", Some(gt1)),
            ("er", "", Some(gt1)),
            ("ic", "", Some(gt1)),
            ("able", "", Some(gt1)),
            ("ible", "", Some(gt1)),
            ("ant", "", Some(gt1)),
            ("ement", "", Some(gt1)),
            ("ment", "", Some(gt1)),
            ("ent", "", Some(gt1)),
            ("ion", "", Some(&ion)),
            ("ou", "", Some(gt1)),
            ("ism", "", Some(gt1)),
            ("ate", "", Some(gt1)),
            ("iti", "", Some(gt1)),
            ("ous", "", Some(gt1)),
            ("ive", "", Some(gt1)),
            ("ize", "", Some(gt1)),
        ],
    )
}

fn step5a(word: Vec<char>) -> Vec<char> {
    if ends_with(&word, "e") {
        let stem = &word[..word.len() - 1];
        let m = measure(stem);
        if m > 1 || (m == 1 && !ends_cvc(stem)) {
            return stem.to_vec();
        }
    }
    word
}

fn step5b(word: Vec<char>) -> Vec<char> {
    // (m > 1 and *d and *L) -> single letter, m measured on the word less one `l`.
    if ends_with(&word, "ll") && measure(&word[..word.len() - 1]) > 1 {
        return replace_tail(&word, 1, "");
    }
    word
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_papers_examples() {
        for (word, want) in [
            ("caresses", "caress"),
            ("ponies", "poni"),
            ("ties", "tie"),
            ("cats", "cat"),
            ("feed", "feed"),
            ("agreed", "agre"),
            ("plastered", "plaster"),
            ("motoring", "motor"),
            ("sing", "sing"),
            ("hopping", "hop"),
            ("falling", "fall"),
            ("filing", "file"),
            ("happy", "happi"),
            ("sky", "sky"),
            ("relational", "relat"),
            ("conditional", "condit"),
            ("hopefully", "hope"),
            ("running", "run"),
            ("generalization", "gener"),
            ("controll", "control"),
            ("is", "is"),
            ("", ""),
        ] {
            assert_eq!(stem(word), want, "{word}");
        }
    }

    /// nltk's own stems (scripts/reference/text_metrics.py) of several hundred words.
    #[test]
    fn equals_nltk() {
        let path = tchtrain_testing::reference_dir("text_metrics").join("text_metrics.json");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask setup`)", path.display()));
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let words = json["porter"].as_array().unwrap();
        assert!(words.len() >= 500, "{} words", words.len());
        let mut wrong = Vec::new();
        for pair in words {
            let (word, want) = (pair[0].as_str().unwrap(), pair[1].as_str().unwrap());
            let got = stem(word);
            if got != want {
                wrong.push(format!("{word}: {got} vs nltk {want}"));
            }
        }
        assert!(
            wrong.is_empty(),
            "{} differ:\n{}",
            wrong.len(),
            wrong.join("\n")
        );
    }
}

//! Close-match suggestions (Levenshtein edit distance) for unknown names and values.

/// Levenshtein edit distance between two strings, counted in chars.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// The candidates closest to `name` (at most three, nearest first): those within an edit
/// distance of a third of the longer name (at least 2), or that contain `name` or are contained in it.
pub(crate) fn close_matches<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Vec<String> {
    let needle = name.to_ascii_lowercase();
    let mut scored: Vec<(usize, &str)> = candidates
        .into_iter()
        .filter_map(|c| {
            let d = edit_distance(&needle, &c.to_ascii_lowercase());
            let limit = (needle.chars().count().max(c.chars().count()) / 3).max(2);
            let contains = needle.len() >= 3 && (c.contains(needle.as_str()) || needle.contains(c));
            (d <= limit || contains).then_some((d, c))
        })
        .collect();
    scored.sort();
    scored.dedup_by(|a, b| a.1 == b.1);
    scored
        .into_iter()
        .take(3)
        .map(|(_, c)| c.to_string())
        .collect()
}

/// `" (did you mean `a`, `b`?)"`, or an empty string when there is nothing close.
pub(crate) fn did_you_mean(suggestions: &[String]) -> String {
    if suggestions.is_empty() {
        String::new()
    } else {
        let quoted: Vec<String> = suggestions.iter().map(|s| format!("`{s}`")).collect();
        format!(" (did you mean {}?)", quoted.join(", "))
    }
}

/// `s` cut to at most `max` chars, with `...` when cut.
pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        format!("{}...", s.chars().take(max).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_and_matches() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        let m = close_matches(
            "cosin",
            ["linear", "cosine", "cosine_with_restarts", "constant"],
        );
        assert_eq!(m[0], "cosine");
        assert!(close_matches("zzzzzzzz", ["linear", "cosine"]).is_empty());
    }
}

//! fsspec's glob (`glob_translate`, fsspec >= 2023.12, as datasets resolves `data_files`
//! patterns with it): `*` within a name, `**` as a whole part for any number of folders
//! (`.*` when last), `?`, `[...]` / `[!...]` classes, consecutive `*` as one, an unclosed
//! `[` literal. Matched part by part over `/`-separated paths.

use crate::{Error, Result};

/// One `/`-separated part of a glob.
#[derive(Debug, Clone)]
enum Segment {
    /// `**`: any number of folders.
    AnyPath,
    /// A name pattern.
    Name(Vec<Token>),
}

#[derive(Debug, Clone)]
enum Token {
    Char(char),
    AnyChar,
    Star,
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
    Never,
}

/// fsspec's `glob_translate` as a matcher over `/`-separated parts.
#[derive(Debug, Clone)]
pub(crate) struct Glob {
    segments: Vec<Segment>,
}

impl Glob {
    /// The pattern, or an error for a `**` that is not a whole part.
    pub(crate) fn new(pattern: &str) -> Result<Self> {
        let mut segments = Vec::new();
        for part in pattern.split('/') {
            if part == "**" {
                segments.push(Segment::AnyPath);
            } else if part.contains("**") {
                return Err(Error::DataFilesNotFound {
                    detail: format!(
                        "Invalid pattern '{pattern}': '**' can only be an entire path component"
                    ),
                });
            } else {
                segments.push(Segment::Name(tokens(part)));
            }
        }
        Ok(Self { segments })
    }

    /// Whether `path` (relative, `/`-separated) matches.
    pub(crate) fn matches(&self, path: &str) -> bool {
        let parts: Vec<&str> = path.split('/').collect();
        match_segments(&self.segments, &parts)
    }
}

fn match_segments(segments: &[Segment], parts: &[&str]) -> bool {
    match segments.split_first() {
        None => parts.is_empty(),
        // A final `**` is `.*` after the `/`: one part or more.
        Some((Segment::AnyPath, [])) => !parts.is_empty(),
        // Elsewhere `(?:.+/)?`: zero parts or more.
        Some((Segment::AnyPath, rest)) => {
            (0..=parts.len()).any(|k| match_segments(rest, &parts[k..]))
        }
        Some((Segment::Name(tokens), rest)) => match parts.split_first() {
            Some((part, parts)) => {
                let chars: Vec<char> = part.chars().collect();
                match_name(tokens, &chars) && match_segments(rest, parts)
            }
            None => false,
        },
    }
}

fn match_name(tokens: &[Token], name: &[char]) -> bool {
    match tokens.split_first() {
        None => name.is_empty(),
        Some((Token::Star, rest)) => (0..=name.len()).any(|k| match_name(rest, &name[k..])),
        Some((token, rest)) => match name.split_first() {
            Some((&c, name)) => {
                let ok = match token {
                    Token::Char(t) => *t == c,
                    Token::AnyChar => true,
                    Token::Class { negated, ranges } => {
                        ranges.iter().any(|&(a, b)| a <= c && c <= b) != *negated
                    }
                    Token::Never | Token::Star => false,
                };
                ok && match_name(rest, name)
            }
            None => false,
        },
    }
}

/// One name of a glob as fsspec's `_translate` reads it (consecutive `*` are one).
fn tokens(part: &str) -> Vec<Token> {
    let p: Vec<char> = part.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < p.len() {
        let c = p[i];
        i += 1;
        match c {
            '*' => {
                if !matches!(out.last(), Some(Token::Star)) {
                    out.push(Token::Star);
                }
            }
            '?' => out.push(Token::AnyChar),
            '[' => {
                let mut j = i;
                if j < p.len() && p[j] == '!' {
                    j += 1;
                }
                if j < p.len() && p[j] == ']' {
                    j += 1;
                }
                while j < p.len() && p[j] != ']' {
                    j += 1;
                }
                if j >= p.len() {
                    out.push(Token::Char('['));
                    continue;
                }
                let stuff = &p[i..j];
                i = j + 1;
                out.push(match stuff {
                    [] => Token::Never,
                    ['!'] => Token::AnyChar,
                    ['!', rest @ ..] => Token::Class {
                        negated: true,
                        ranges: class_ranges(rest),
                    },
                    _ => Token::Class {
                        negated: false,
                        ranges: class_ranges(stuff),
                    },
                });
            }
            c => out.push(Token::Char(c)),
        }
    }
    out
}

/// The members of a `[...]` class: single characters and `a-z` ranges (a `-` first or last
/// is itself; empty ranges match nothing).
fn class_ranges(stuff: &[char]) -> Vec<(char, char)> {
    let mut out = Vec::new();
    let mut k = 0;
    while k < stuff.len() {
        if k + 2 < stuff.len() && stuff[k + 1] == '-' {
            out.push((stuff[k], stuff[k + 2]));
            k += 3;
        } else {
            out.push((stuff[k], stuff[k]));
            k += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_follow_fsspec() {
        let m = |p: &str, f: &str| Glob::new(p).unwrap().matches(f);
        assert!(m("**", "a.csv") && m("**", "x/y/a.csv"));
        assert!(
            m("**/train[-._ 0-9]*", "train.csv") && m("**/train[-._ 0-9]*", "data/train_1.csv")
        );
        assert!(!m("**/train[-._ 0-9]*", "trains.csv"));
        assert!(m("**/train/**", "train/a.csv") && m("**/train/**", "data/train/x/a.csv"));
        assert!(!m("**/train/**", "train"));
        assert!(m(
            "data/*-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9]*.*",
            "data/train-00000-of-00002.parquet"
        ));
        assert!(!m("data/*.csv", "data/x/a.csv"));
        assert!(m("*.csv", "a.csv") && !m("*.csv", "d/a.csv"));
        assert!(m("a?c", "abc") && m("[!a]bc", "xbc") && !m("[!a]bc", "abc"));
        assert!(m("[ab", "[ab"), "an unclosed class is a literal");
        assert!(Glob::new("a**/b").is_err());
    }
}

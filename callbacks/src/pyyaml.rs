//! PyYAML 6's `yaml.safe_dump(data, allow_unicode=True, default_flow_style=False)` of JSON
//! data, byte for byte: block mappings with their keys sorted, block sequences at their key's
//! indentation, YAML 1.1's resolver deciding which strings need quotes (`'yes'`, `'1_0'`,
//! `'2024-01-01'`, `''`), `null`, floats as Python's `repr` lower-cased with `.0` before a bare
//! exponent, and plain or single-quoted strings folded at a space past column 80 as PyYAML's
//! emitter folds them. Strings with characters PyYAML must escape are double-quoted with its
//! escapes (unfolded: such values do not occur in a Trainer's configuration).

use std::sync::LazyLock;

use regex::Regex;
use tchtrain_training_args::{JsonMap, JsonValue, python_float_repr};

/// PyYAML's `best_width`.
const BEST_WIDTH: usize = 80;

/// PyYAML's implicit resolvers (YAML 1.1): a plain string matching one reads back as
/// something else, so it is quoted.
static RESOLVERS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"^(?:",
        // bool
        r"yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF",
        // float
        r"|[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?",
        r"|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)",
        // int
        r"|[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+",
        r"|[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+",
        // merge, null, value
        r"|<<|~|null|Null|NULL|=",
        // timestamp
        r"|[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]",
        r"|[0-9][0-9][0-9][0-9]-[0-9][0-9]?-[0-9][0-9]?(?:[Tt]|[ \t]+)[0-9][0-9]?:[0-9][0-9]:[0-9][0-9]",
        r"(?:\.[0-9]*)?(?:[ \t]*(?:Z|[-+][0-9][0-9]?(?::[0-9][0-9])?))?",
        r")$"
    ))
    .expect("PyYAML's resolver patterns are valid")
});

/// `yaml.safe_dump(value, allow_unicode=True, default_flow_style=False)`.
pub fn safe_dump(value: &JsonValue) -> String {
    let mut e = Emitter::default();
    match value {
        JsonValue::Object(m) if !m.is_empty() => e.mapping(m, 0, false),
        JsonValue::Array(a) if !a.is_empty() => e.sequence(a, 0, false),
        other => {
            e.scalar(other, 2, false);
            e.write("\n");
            if !matches!(other, JsonValue::Object(_) | JsonValue::Array(_)) {
                e.write("...\n");
            }
        }
    }
    e.out
}

/// Python's `str.__lt__` order (code points, which UTF-8 bytes keep).
fn sorted(m: &JsonMap) -> Vec<(&str, &JsonValue)> {
    let mut entries: Vec<(&str, &JsonValue)> = m.iter().collect();
    entries.sort_by(|a, b| a.0.cmp(b.0));
    entries
}

#[derive(Default)]
struct Emitter {
    out: String,
    column: usize,
}

/// How PyYAML writes a string (`choose_scalar_style`).
#[derive(PartialEq)]
enum Style {
    Plain,
    Single,
    Double,
}

fn is_break(c: char) -> bool {
    matches!(c, '\n' | '\u{85}' | '\u{2028}' | '\u{2029}')
}

fn is_blank(c: Option<char>) -> bool {
    c.is_none_or(|c| matches!(c, '\0' | ' ' | '\t' | '\r') || is_break(c))
}

/// PyYAML's `analyze_scalar` then `choose_scalar_style` for a string in block context.
fn style(s: &str, simple_key: bool) -> Style {
    if s.is_empty() {
        return Style::Single;
    }
    let chars: Vec<char> = s.chars().collect();
    let n = chars.len();
    let mut block_indicators = s.starts_with("---") || s.starts_with("...");
    let (mut line_breaks, mut special) = (false, false);
    let (mut leading, mut trailing, mut space_break, mut break_space) =
        (false, false, false, false);
    let (mut previous_space, mut previous_break) = (false, false);
    let mut preceded_by_whitespace = true;
    let mut followed_by_whitespace = is_blank(chars.get(1).copied());
    for (i, &ch) in chars.iter().enumerate() {
        if i == 0 {
            if "#,[]{}&*!|>'\"%@`".contains(ch)
                || (matches!(ch, '?' | ':' | '-') && followed_by_whitespace)
            {
                block_indicators = true;
            }
        } else if (ch == ':' && followed_by_whitespace) || (ch == '#' && preceded_by_whitespace) {
            block_indicators = true;
        }
        if is_break(ch) {
            line_breaks = true;
        }
        let printable = ch == '\n'
            || (' '..='~').contains(&ch)
            || ((ch == '\u{85}'
                || ('\u{a0}'..='\u{d7ff}').contains(&ch)
                || ('\u{e000}'..='\u{fffd}').contains(&ch)
                || ('\u{10000}'..'\u{10ffff}').contains(&ch))
                && ch != '\u{feff}');
        if !printable {
            special = true;
        }
        if ch == ' ' {
            leading |= i == 0;
            trailing |= i == n - 1;
            break_space |= previous_break;
            (previous_space, previous_break) = (true, false);
        } else if is_break(ch) {
            leading |= i == 0;
            trailing |= i == n - 1;
            space_break |= previous_space;
            (previous_space, previous_break) = (false, true);
        } else {
            (previous_space, previous_break) = (false, false);
        }
        preceded_by_whitespace = is_blank(Some(ch));
        followed_by_whitespace = is_blank(chars.get(i + 2).copied());
    }
    let single_ok = !(space_break || special || break_space);
    let plain_ok = single_ok && !leading && !trailing && !line_breaks && !block_indicators;
    let implicit = !RESOLVERS.is_match(s);
    if implicit && plain_ok && !(simple_key && line_breaks) {
        Style::Plain
    } else if single_ok && !(simple_key && line_breaks) {
        Style::Single
    } else {
        Style::Double
    }
}

/// PyYAML's `represent_float`.
fn float(x: f64) -> String {
    if x.is_nan() {
        return ".nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { ".inf" } else { "-.inf" }.into();
    }
    let value = python_float_repr(x).to_lowercase();
    if !value.contains('.') && value.contains('e') {
        value.replacen('e', ".0e", 1)
    } else {
        value
    }
}

impl Emitter {
    fn write(&mut self, s: &str) {
        for c in s.chars() {
            if c == '\n' {
                self.column = 0;
            } else {
                self.column += 1;
            }
        }
        self.out.push_str(s);
    }

    fn indent(&mut self, indent: usize) {
        self.write("\n");
        self.write(&" ".repeat(indent));
    }

    /// A block mapping whose entries sit at `indent` (the first right here when `inline_first`,
    /// after a sequence's `- `).
    fn mapping(&mut self, m: &JsonMap, indent: usize, inline_first: bool) {
        for (i, (k, v)) in sorted(m).into_iter().enumerate() {
            if !(inline_first && i == 0) {
                self.write(&" ".repeat(indent));
            }
            self.string(k, indent + 2, true);
            self.write(":");
            match v {
                JsonValue::Object(m) if !m.is_empty() => {
                    self.write("\n");
                    self.mapping(m, indent + 2, false);
                }
                JsonValue::Array(a) if !a.is_empty() => {
                    self.write("\n");
                    self.sequence(a, indent, false);
                }
                other => {
                    self.write(" ");
                    self.scalar(other, indent + 2, false);
                    self.write("\n");
                }
            }
        }
    }

    /// A block sequence whose `- ` sit at `indent` (the first right here when `inline_first`).
    fn sequence(&mut self, a: &[JsonValue], indent: usize, inline_first: bool) {
        for (i, v) in a.iter().enumerate() {
            if !(inline_first && i == 0) {
                self.write(&" ".repeat(indent));
            }
            self.write("- ");
            match v {
                JsonValue::Object(m) if !m.is_empty() => self.mapping(m, indent + 2, true),
                JsonValue::Array(a) if !a.is_empty() => self.sequence(a, indent + 2, true),
                other => {
                    self.scalar(other, indent + 2, false);
                    self.write("\n");
                }
            }
        }
    }

    /// A scalar (or an empty collection, in flow style); folded lines continue at `indent`.
    fn scalar(&mut self, v: &JsonValue, indent: usize, simple_key: bool) {
        match v {
            JsonValue::Null => self.write("null"),
            JsonValue::Bool(b) => self.write(if *b { "true" } else { "false" }),
            JsonValue::Int(i) => self.write(&i.to_string()),
            JsonValue::Float(x) => self.write(&float(*x)),
            JsonValue::Str(s) => self.string(s, indent, simple_key),
            JsonValue::Object(_) => self.write("{}"),
            JsonValue::Array(_) => self.write("[]"),
        }
    }

    fn string(&mut self, s: &str, indent: usize, simple_key: bool) {
        match style(s, simple_key) {
            Style::Plain => self.plain(s, indent, !simple_key),
            Style::Single => self.single_quoted(s, indent, !simple_key),
            Style::Double => self.double_quoted(s),
        }
    }

    /// PyYAML's `write_plain`: a single space past the width becomes a line break.
    fn plain(&mut self, text: &str, indent: usize, split: bool) {
        let mut words = text.split(' ').peekable();
        let mut first = true;
        while let Some(word) = words.next() {
            if !first {
                // `word` follows one space; runs of spaces are written as they are.
                if !word.is_empty() && self.column > BEST_WIDTH && split {
                    self.indent(indent);
                } else {
                    self.write(" ");
                }
            }
            first = false;
            self.write(word);
            // Several spaces: the empty words between them write one space each.
            while words.peek() == Some(&"") {
                words.next();
                self.write(" ");
            }
        }
    }

    /// PyYAML's `write_single_quoted`: quotes doubled, a single inner space past the width a
    /// line break, line breaks written as PyYAML folds them.
    fn single_quoted(&mut self, text: &str, indent: usize, split: bool) {
        self.write("'");
        let chars: Vec<char> = text.chars().collect();
        let n = chars.len();
        let (mut spaces, mut breaks) = (false, false);
        let (mut start, mut end) = (0usize, 0usize);
        while end <= n {
            let ch = chars.get(end).copied();
            if spaces {
                if ch != Some(' ') {
                    if start + 1 == end
                        && self.column > BEST_WIDTH
                        && split
                        && start != 0
                        && end != n
                    {
                        self.indent(indent);
                    } else {
                        self.write(&chars[start..end].iter().collect::<String>());
                    }
                    start = end;
                }
            } else if breaks {
                if ch.is_none_or(|c| !is_break(c)) {
                    if chars[start] == '\n' {
                        self.write("\n");
                    }
                    for &br in &chars[start..end] {
                        if br == '\n' {
                            self.write("\n");
                        } else {
                            self.write(&br.to_string());
                            self.column = 0;
                        }
                    }
                    self.write(&" ".repeat(indent));
                    start = end;
                }
            } else if ch.is_none_or(|c| c == ' ' || c == '\'' || is_break(c)) && start < end {
                self.write(&chars[start..end].iter().collect::<String>());
                start = end;
            }
            if ch == Some('\'') {
                self.write("''");
                start = end + 1;
            }
            if let Some(c) = ch {
                spaces = c == ' ';
                breaks = is_break(c);
            }
            end += 1;
        }
        self.write("'");
    }

    /// PyYAML's `write_double_quoted` with its escapes (unfolded).
    fn double_quoted(&mut self, text: &str) {
        let mut out = String::from("\"");
        for ch in text.chars() {
            let plain = (' '..='~').contains(&ch)
                || ('\u{a0}'..='\u{d7ff}').contains(&ch)
                || ('\u{e000}'..='\u{fffd}').contains(&ch);
            let escape = match ch {
                '\0' => Some("0"),
                '\u{7}' => Some("a"),
                '\u{8}' => Some("b"),
                '\t' => Some("t"),
                '\n' => Some("n"),
                '\u{b}' => Some("v"),
                '\u{c}' => Some("f"),
                '\r' => Some("r"),
                '\u{1b}' => Some("e"),
                '"' => Some("\""),
                '\\' => Some("\\"),
                '\u{85}' => Some("N"),
                '\u{a0}' => Some("_"),
                '\u{2028}' => Some("L"),
                '\u{2029}' => Some("P"),
                _ => None,
            };
            match escape {
                Some(e) => {
                    out.push('\\');
                    out.push_str(e);
                }
                None if plain && ch != '\u{feff}' => out.push(ch),
                None => {
                    let c = ch as u32;
                    out.push_str(&if c <= 0xff {
                        format!("\\x{c:02X}")
                    } else if c <= 0xffff {
                        format!("\\u{c:04X}")
                    } else {
                        format!("\\U{c:08X}")
                    });
                }
            }
        }
        out.push('"');
        self.write(&out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tchtrain_training_args::loads;

    #[test]
    fn strings_are_quoted_and_folded_as_pyyaml_does() {
        // yaml.safe_dump of the same data, allow_unicode=True, default_flow_style=False.
        let data = loads(
            r##"{"a": [[1, 2], [], {}, {"k": "y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y ", "j": [3]}],
                "b": {"c": ["z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z "]},
                "ke y": "v", "yes": "on", "c": "it's", "d": " lead", "e": "a\tb",
                "f": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx y",
                "g": "- x", "h": "#x", "i": "a #b", "j": "2024-01-01", "k": "1:20", "l": ".5", "m": "+1",
                "n": "NULL", "o": "\u00e9", "p": "3.", "q": "x:", "r": "a: b", "s": "a\nb", "t": 1e-07,
                "u": 12345678.0, "v": null, "w": "1e5", "x": "\ud83e\udd17transformers", "y": ""}"##,
        )
        .unwrap();
        let expected = "a:\n- - 1\n  - 2\n- []\n- {}\n- j:\n  - 3\n  k: 'y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y y\n    y y y y y y y y y y y y '\nb:\n  c:\n  - 'z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z\n    z z z z z z z z z z z '\nc: it's\nd: ' lead'\ne: \"a\\tb\"\nf: xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n  y\ng: '- x'\nh: '#x'\ni: 'a #b'\nj: '2024-01-01'\nk: '1:20'\nke y: v\nl: '.5'\nm: '+1'\nn: 'NULL'\no: é\np: '3.'\nq: 'x:'\nr: 'a: b'\ns: 'a\n\n  b'\nt: 1.0e-07\nu: 12345678.0\nv: null\nw: 1e5\nx: 🤗transformers\ny: ''\n'yes': 'on'\n";
        assert_eq!(safe_dump(&data), expected);
    }
}

//! The small YAML reader behind [`MetadataConfigs`](crate::metadata::MetadataConfigs): a
//! dataset card's front matter (between `---` lines), one top-level key's block, and the
//! YAML the hub's cards use there — block mappings and sequences (a sequence may sit at its
//! key's indentation), plain and quoted scalars, one-line flow lists and maps, comments, and
//! PyYAML's null and boolean words. Anything else (anchors, tags, multi-line plain scalars)
//! is an error message, never a panic.

/// A YAML value, as far as `configs:` needs one.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Yaml {
    Null,
    Bool(bool),
    Str(String),
    Seq(Vec<Yaml>),
    Map(Vec<(String, Yaml)>),
}

impl Yaml {
    pub(crate) fn get(&self, key: &str) -> Option<&Yaml> {
        match self {
            Yaml::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// Python's truth value of what PyYAML would load.
    pub(crate) fn is_truthy(&self) -> bool {
        match self {
            Yaml::Null => false,
            Yaml::Bool(b) => *b,
            Yaml::Str(s) => !s.is_empty() && !s.parse::<f64>().is_ok_and(|v| v == 0.0),
            Yaml::Seq(v) => !v.is_empty(),
            Yaml::Map(v) => !v.is_empty(),
        }
    }

    /// A Python-like rendering for error messages.
    pub(crate) fn repr(&self) -> String {
        match self {
            Yaml::Null => "None".into(),
            Yaml::Bool(b) => if *b { "True" } else { "False" }.into(),
            Yaml::Str(s) => format!("'{s}'"),
            Yaml::Seq(v) => format!(
                "[{}]",
                v.iter().map(Yaml::repr).collect::<Vec<_>>().join(", ")
            ),
            Yaml::Map(v) => format!(
                "{{{}}}",
                v.iter()
                    .map(|(k, v)| format!("'{k}': {}", v.repr()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// The YAML between the card's opening `---` line and the next `---` line (huggingface_hub's
/// `REGEX_YAML_BLOCK`).
pub(crate) fn front_matter(text: &str) -> Option<&str> {
    let start = text.trim_start();
    let rest = start.strip_prefix("---")?;
    let rest = rest
        .strip_prefix("\r\n")
        .or_else(|| rest.strip_prefix('\n'))?;
    let mut offset = 0;
    for line in rest.split_inclusive('\n') {
        if line.trim_end_matches(['\r', '\n']) == "---" {
            return Some(&rest[..offset]);
        }
        offset += line.len();
    }
    None
}

/// The lines of a top-level key's value: the rest of its line, then every following line
/// that is blank, a comment, indented, or a `-` item at column 0 (YAML lets a block
/// sequence sit at its key's indentation).
pub(crate) fn top_level_block(yaml: &str, key: &str) -> Option<Vec<String>> {
    let mut lines = yaml.lines();
    let value = lines.by_ref().find_map(|line| {
        let rest = line.strip_prefix(key)?.trim_start();
        Some(strip_comment(rest.strip_prefix(':')?).trim().to_string())
    })?;
    if !value.is_empty() {
        // `configs: [...]` on the key's line.
        return Some(vec![format!("__value__: {value}")]);
    }
    Some(
        lines
            .take_while(|line| {
                let t = line.trim_start();
                t.is_empty()
                    || t.starts_with('#')
                    || line.starts_with([' ', '\t'])
                    || line.starts_with('-')
            })
            .map(str::to_string)
            .collect(),
    )
}

/// A line's content without a trailing `# comment` (a `#` after whitespace, outside quotes).
fn strip_comment(line: &str) -> &str {
    let (mut single, mut double, mut prev_space) = (false, false, true);
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && prev_space => return &line[..i],
            _ => {}
        }
        prev_space = c == ' ' || c == '\t';
    }
    line
}

/// A logical line: indentation and content (comment stripped, not blank).
#[derive(Debug)]
struct Line {
    indent: usize,
    text: String,
}

/// The value a block of lines holds (from [`top_level_block`]).
pub(crate) fn parse_block(raw: &[String]) -> std::result::Result<Yaml, String> {
    let mut lines = Vec::new();
    for l in raw {
        let content = strip_comment(l).trim_end();
        if content.trim().is_empty() {
            continue;
        }
        let text = content.trim_start();
        let indentation = &content[..content.len() - text.len()];
        if indentation.contains('\t') {
            return Err("a tab in the indentation of `configs:` (YAML indents with spaces)".into());
        }
        lines.push(Line {
            indent: indentation.len(),
            text: text.to_string(),
        });
    }
    if lines.len() == 1
        && let Some(v) = lines[0].text.strip_prefix("__value__: ")
    {
        return scalar_or_flow(v);
    }
    if lines.is_empty() {
        return Ok(Yaml::Null);
    }
    let mut pos = 0;
    let indent = lines[0].indent;
    let value = parse_node(&lines, &mut pos, indent)?;
    if pos < lines.len() {
        return Err(format!("unexpected indentation at `{}`", lines[pos].text));
    }
    Ok(value)
}

fn is_item(text: &str) -> bool {
    text == "-" || text.starts_with("- ")
}

/// The node starting at `lines[*pos]`, whose lines are indented by `indent`.
fn parse_node(lines: &[Line], pos: &mut usize, indent: usize) -> std::result::Result<Yaml, String> {
    if is_item(&lines[*pos].text) {
        parse_seq(lines, pos, indent)
    } else {
        parse_map(lines, pos, indent, None)
    }
}

fn parse_seq(lines: &[Line], pos: &mut usize, indent: usize) -> std::result::Result<Yaml, String> {
    let mut items = Vec::new();
    while *pos < lines.len() && lines[*pos].indent == indent && is_item(&lines[*pos].text) {
        let rest = lines[*pos].text[1..].trim_start().to_string();
        let rest_indent = indent + (lines[*pos].text.len() - rest.len());
        *pos += 1;
        if rest.is_empty() {
            if *pos < lines.len() && lines[*pos].indent > indent {
                let child = lines[*pos].indent;
                items.push(parse_node(lines, pos, child)?);
            } else {
                items.push(Yaml::Null);
            }
        } else if is_item(&rest) {
            return Err(format!(
                "nested `- -` sequences are not supported: `{rest}`"
            ));
        } else if split_key(&rest).is_some() && !rest.starts_with(['[', '{', '"', '\'']) {
            // `- key: value` opens a mapping whose keys line up with `key`.
            items.push(parse_map(lines, pos, rest_indent, Some(&rest))?);
        } else {
            items.push(scalar_or_flow(&rest)?);
        }
    }
    Ok(Yaml::Seq(items))
}

/// A block mapping at `indent`; `first` is an entry already taken from a `- ` line.
fn parse_map(
    lines: &[Line],
    pos: &mut usize,
    indent: usize,
    first: Option<&str>,
) -> std::result::Result<Yaml, String> {
    let mut entries: Vec<(String, Yaml)> = Vec::new();
    let mut pending = first.map(str::to_string);
    loop {
        let text = match pending.take() {
            Some(t) => t,
            None => {
                if *pos >= lines.len() || lines[*pos].indent != indent || is_item(&lines[*pos].text)
                {
                    break;
                }
                *pos += 1;
                lines[*pos - 1].text.clone()
            }
        };
        let (key, value) =
            split_key(&text).ok_or_else(|| format!("expected `key: value`, got `{text}`"))?;
        let value = if value.is_empty() {
            if *pos < lines.len() && lines[*pos].indent > indent {
                let child = lines[*pos].indent;
                parse_node(lines, pos, child)?
            } else if *pos < lines.len()
                && lines[*pos].indent == indent
                && is_item(&lines[*pos].text)
            {
                parse_seq(lines, pos, indent)?
            } else {
                Yaml::Null
            }
        } else if value == "|" || value == ">" || value.starts_with(['|', '>']) && value.len() <= 3
        {
            // A block scalar: its more indented lines.
            let mut text = Vec::new();
            while *pos < lines.len() && lines[*pos].indent > indent {
                text.push(lines[*pos].text.clone());
                *pos += 1;
            }
            Yaml::Str(text.join(if value.starts_with('|') { "\n" } else { " " }))
        } else {
            if *pos < lines.len() && lines[*pos].indent > indent {
                return Err(format!(
                    "a value continued on the next line is not supported: `{text}`"
                ));
            }
            scalar_or_flow(&value)?
        };
        if entries.iter().any(|(k, _)| *k == key) {
            return Err(format!("duplicate key `{key}`"));
        }
        entries.push((key, value));
    }
    Ok(Yaml::Map(entries))
}

/// `key: value` (or `key:`) split at the first `: ` outside quotes; the key unquoted.
fn split_key(text: &str) -> Option<(String, String)> {
    let (mut single, mut double) = (false, false);
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    for (n, &(i, c)) in chars.iter().enumerate() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            ':' if !single && !double => {
                let next = chars.get(n + 1).map(|&(_, c)| c);
                if next.is_none() || next == Some(' ') {
                    let key = unquote(text[..i].trim()).ok()?;
                    return Some((key, text[i + 1..].trim().to_string()));
                }
            }
            '[' | '{' if n == 0 => return None,
            _ => {}
        }
    }
    None
}

fn unquote(s: &str) -> std::result::Result<String, String> {
    match scalar_or_flow(s)? {
        Yaml::Str(s) => Ok(s),
        Yaml::Bool(b) => Ok(if b { "True" } else { "False" }.into()),
        Yaml::Null => Ok(String::new()),
        other => Err(format!("a key must be a scalar, got {}", other.repr())),
    }
}

/// A scalar (plain, `'...'`, `"..."`) or a one-line flow list / map.
fn scalar_or_flow(s: &str) -> std::result::Result<Yaml, String> {
    let s = s.trim();
    if !s.starts_with(['[', '{', '"', '\'', '&', '*', '!', '|', '>', '%', '@', '`']) {
        // A plain scalar in block context: the whole (comment-free) rest of the line.
        return Ok(plain(s));
    }
    let mut chars = s.chars().peekable();
    let v = parse_flow(&mut chars)?;
    if let Some(c) = chars.find(|c| !c.is_whitespace()) {
        return Err(format!("unexpected `{c}` in `{s}`"));
    }
    Ok(v)
}

fn parse_flow(
    chars: &mut std::iter::Peekable<std::str::Chars<'_>>,
) -> std::result::Result<Yaml, String> {
    while chars.peek().is_some_and(|c| c.is_whitespace()) {
        chars.next();
    }
    match chars.peek() {
        Some('[') => {
            chars.next();
            let mut items = Vec::new();
            loop {
                skip_ws(chars);
                if chars.peek() == Some(&']') {
                    chars.next();
                    return Ok(Yaml::Seq(items));
                }
                items.push(parse_flow(chars)?);
                skip_ws(chars);
                match chars.next() {
                    Some(',') => {}
                    Some(']') => return Ok(Yaml::Seq(items)),
                    other => {
                        return Err(format!("expected `,` or `]` in a flow list, got {other:?}"));
                    }
                }
            }
        }
        Some('{') => {
            chars.next();
            let mut entries = Vec::new();
            loop {
                skip_ws(chars);
                if chars.peek() == Some(&'}') {
                    chars.next();
                    return Ok(Yaml::Map(entries));
                }
                let key = match parse_flow(chars)? {
                    Yaml::Str(k) => k,
                    other => return Err(format!("a key must be a string, got {}", other.repr())),
                };
                skip_ws(chars);
                if chars.next() != Some(':') {
                    return Err(format!("expected `:` after `{key}` in a flow map"));
                }
                let value = parse_flow(chars)?;
                entries.push((key, value));
                skip_ws(chars);
                match chars.next() {
                    Some(',') => {}
                    Some('}') => return Ok(Yaml::Map(entries)),
                    other => {
                        return Err(format!("expected `,` or `}}` in a flow map, got {other:?}"));
                    }
                }
            }
        }
        Some('"') => {
            chars.next();
            let mut out = String::new();
            loop {
                match chars.next() {
                    Some('"') => return Ok(Yaml::Str(out)),
                    Some('\\') => match chars.next() {
                        Some('n') => out.push('\n'),
                        Some('t') => out.push('\t'),
                        Some('u') => {
                            let hex: String = chars.by_ref().take(4).collect();
                            let c = u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32);
                            out.push(c.ok_or_else(|| format!("bad escape \\u{hex}"))?);
                        }
                        Some(c @ ('"' | '\\' | '/')) => out.push(c),
                        other => {
                            return Err(format!(
                                "unsupported escape \\{other:?} in a quoted string"
                            ));
                        }
                    },
                    Some(c) => out.push(c),
                    None => return Err("unterminated \"string\"".into()),
                }
            }
        }
        Some('\'') => {
            chars.next();
            let mut out = String::new();
            loop {
                match chars.next() {
                    Some('\'') if chars.peek() == Some(&'\'') => {
                        chars.next();
                        out.push('\'');
                    }
                    Some('\'') => return Ok(Yaml::Str(out)),
                    Some(c) => out.push(c),
                    None => return Err("unterminated 'string'".into()),
                }
            }
        }
        Some(c @ ('&' | '*' | '!' | '|' | '>' | '%' | '@' | '`')) => Err(format!(
            "YAML feature `{c}` (anchors, aliases, tags) is not supported in `configs:`"
        )),
        _ => {
            // A plain scalar inside a flow collection: up to `,`, `]`, `}` or `: `.
            let mut out = String::new();
            while let Some(&c) = chars.peek() {
                if matches!(c, ',' | ']' | '}') || (c == ':' && out.ends_with(' ')) {
                    break;
                }
                if c == ':' {
                    let mut look = chars.clone();
                    look.next();
                    if look.peek().is_none_or(|n| n.is_whitespace()) {
                        break;
                    }
                }
                out.push(c);
                chars.next();
            }
            Ok(plain(out.trim()))
        }
    }
}

fn skip_ws(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    while chars.peek().is_some_and(|c| c.is_whitespace()) {
        chars.next();
    }
}

/// PyYAML's resolution of a plain scalar: null, booleans (YAML 1.1 words), else text.
fn plain(s: &str) -> Yaml {
    match s {
        "" | "~" | "null" | "Null" | "NULL" => Yaml::Null,
        "true" | "True" | "TRUE" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => Yaml::Bool(true),
        "false" | "False" | "FALSE" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => {
            Yaml::Bool(false)
        }
        _ => Yaml::Str(s.to_string()),
    }
}

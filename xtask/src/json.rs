//! A small JSON reader and writer (xtask stays std-only): the results files, `trainer_state.json`, and
//! the measurement lines the benchmark binaries print, as Python's `json` module or
//! serde_json write them (Python's `NaN` / `Infinity` included).

use std::collections::BTreeMap;

/// A JSON value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(BTreeMap<String, Json>),
}

impl Json {
    /// The object one line holds (`{"key": value, ...}`), or `None` for anything else, e.g. a
    /// log line: what the benchmark binaries print, one measurement a line.
    pub(crate) fn object_line(line: &str) -> Option<BTreeMap<String, Json>> {
        let line = line.trim();
        if !line.starts_with('{') {
            return None;
        }
        match Json::parse(line).ok()? {
            Json::Obj(m) => Some(m),
            _ => None,
        }
    }

    /// The string, when this is one.
    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The JSON value `text` holds (Python's `NaN` / `Infinity` too), or what is wrong.
    pub(crate) fn parse(text: &str) -> Result<Json, String> {
        let mut p = Parser {
            s: text.as_bytes(),
            i: 0,
        };
        let v = p.value()?;
        p.ws();
        if p.i != p.s.len() {
            return Err(format!("trailing characters at byte {}", p.i));
        }
        Ok(v)
    }

    pub(crate) fn get(&self, key: &str) -> Option<&Json> {
        self.as_object()?.get(key)
    }

    pub(crate) fn as_object(&self) -> Option<&BTreeMap<String, Json>> {
        match self {
            Json::Obj(m) => Some(m),
            _ => None,
        }
    }

    pub(crate) fn as_array(&self) -> Option<&Vec<Json>> {
        match self {
            Json::Arr(v) => Some(v),
            _ => None,
        }
    }

    /// A number; also the strings `"inf"` / `"nan"` some writers use for non-finite ones.
    /// The value as indented JSON (two spaces, keys in order; non-finite numbers as null).
    pub(crate) fn pretty(&self) -> String {
        let mut out = String::new();
        self.write(&mut out, 0);
        out
    }

    fn write(&self, out: &mut String, depth: usize) {
        let pad = |out: &mut String, d: usize| out.push_str(&"  ".repeat(d));
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Num(x) if !x.is_finite() => out.push_str("null"),
            Json::Num(x) if x.fract() == 0.0 && x.abs() < 1e15 => out.push_str(&format!("{x:.0}")),
            Json::Num(x) => out.push_str(&x.to_string()),
            Json::Str(s) => {
                out.push('"');
                for c in s.chars() {
                    match c {
                        '"' => out.push_str("\\\""),
                        '\\' => out.push_str("\\\\"),
                        '\n' => out.push_str("\\n"),
                        c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                        c => out.push(c),
                    }
                }
                out.push('"');
            }
            Json::Arr(items) if items.is_empty() => out.push_str("[]"),
            Json::Obj(items) if items.is_empty() => out.push_str("{}"),
            Json::Arr(items) => {
                out.push_str("[\n");
                for (i, v) in items.iter().enumerate() {
                    pad(out, depth + 1);
                    v.write(out, depth + 1);
                    out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
                }
                pad(out, depth);
                out.push(']');
            }
            Json::Obj(items) => {
                out.push_str("{\n");
                for (i, (k, v)) in items.iter().enumerate() {
                    pad(out, depth + 1);
                    Json::Str(k.clone()).write(out, depth + 1);
                    out.push_str(": ");
                    v.write(out, depth + 1);
                    out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
                }
                pad(out, depth);
                out.push('}');
            }
        }
    }

    pub(crate) fn as_f64(&self) -> Option<f64> {
        match self {
            Json::Num(x) => Some(*x),
            Json::Str(s) if matches!(s.as_str(), "inf" | "-inf" | "nan" | "NaN") => s.parse().ok(),
            _ => None,
        }
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn error(&self, what: &str) -> String {
        format!("{what} at byte {}", self.i)
    }

    fn eat(&mut self, word: &str) -> bool {
        if self.s[self.i..].starts_with(word.as_bytes()) {
            self.i += word.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self) -> Result<Json, String> {
        self.ws();
        match self.s.get(self.i) {
            None => Err(self.error("unexpected end")),
            Some(b'{') => self.object(),
            Some(b'[') => self.array(),
            Some(b'"') => Ok(Json::Str(self.string()?)),
            Some(_) if self.eat("null") => Ok(Json::Null),
            Some(_) if self.eat("true") => Ok(Json::Bool(true)),
            Some(_) if self.eat("false") => Ok(Json::Bool(false)),
            // Python's json.dumps writes these for non-finite floats.
            Some(_) if self.eat("NaN") => Ok(Json::Num(f64::NAN)),
            Some(_) if self.eat("Infinity") => Ok(Json::Num(f64::INFINITY)),
            Some(_) if self.eat("-Infinity") => Ok(Json::Num(f64::NEG_INFINITY)),
            Some(_) => self.number(),
        }
    }

    fn number(&mut self) -> Result<Json, String> {
        let start = self.i;
        while self.i < self.s.len()
            && matches!(
                self.s[self.i],
                b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'
            )
        {
            self.i += 1;
        }
        let text =
            std::str::from_utf8(&self.s[start..self.i]).map_err(|_| self.error("bad number"))?;
        text.parse::<f64>()
            .map(Json::Num)
            .map_err(|_| format!("bad number `{text}` at byte {start}"))
    }

    fn string(&mut self) -> Result<String, String> {
        self.i += 1; // the opening quote
        let mut out: Vec<u8> = Vec::new();
        loop {
            let Some(&b) = self.s.get(self.i) else {
                return Err(self.error("unterminated string"));
            };
            self.i += 1;
            match b {
                b'"' => break,
                b'\\' => {
                    let Some(&e) = self.s.get(self.i) else {
                        return Err(self.error("unterminated escape"));
                    };
                    self.i += 1;
                    match e {
                        b'n' => out.push(b'\n'),
                        b't' => out.push(b'\t'),
                        b'r' => out.push(b'\r'),
                        b'b' => out.push(8),
                        b'f' => out.push(12),
                        b'u' => {
                            let mut code = self.hex4()?;
                            // A surrogate pair.
                            if (0xD800..0xDC00).contains(&code) && self.eat("\\u") {
                                let low = self.hex4()?;
                                code = 0x10000
                                    + ((code - 0xD800) << 10)
                                    + (low.wrapping_sub(0xDC00) & 0x3FF);
                            }
                            let c = char::from_u32(code).unwrap_or('\u{FFFD}');
                            let mut buf = [0u8; 4];
                            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                        }
                        other => out.push(other),
                    }
                }
                other => out.push(other),
            }
        }
        String::from_utf8(out).map_err(|_| self.error("string is not UTF-8"))
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let digits = self
            .s
            .get(self.i..self.i + 4)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u32::from_str_radix(h, 16).ok())
            .ok_or_else(|| self.error("bad \\u escape"))?;
        self.i += 4;
        Ok(digits)
    }

    fn array(&mut self) -> Result<Json, String> {
        self.i += 1;
        let mut v = Vec::new();
        self.ws();
        if self.eat("]") {
            return Ok(Json::Arr(v));
        }
        loop {
            v.push(self.value()?);
            self.ws();
            if self.eat(",") {
                continue;
            }
            if self.eat("]") {
                return Ok(Json::Arr(v));
            }
            return Err(self.error("expected `,` or `]`"));
        }
    }

    fn object(&mut self) -> Result<Json, String> {
        self.i += 1;
        let mut m = BTreeMap::new();
        self.ws();
        if self.eat("}") {
            return Ok(Json::Obj(m));
        }
        loop {
            self.ws();
            if self.s.get(self.i) != Some(&b'"') {
                return Err(self.error("expected a key"));
            }
            let key = self.string()?;
            self.ws();
            if !self.eat(":") {
                return Err(self.error("expected `:`"));
            }
            let value = self.value()?;
            m.insert(key, value);
            self.ws();
            if self.eat(",") {
                continue;
            }
            if self.eat("}") {
                return Ok(Json::Obj(m));
            }
            return Err(self.error("expected `,` or `}`"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_python_and_serde_json() {
        let j = Json::parse(
            r#"{"a": [1, 2.5e-3, -0.0, NaN, Infinity], "b": {"c": "x\"\u00e9\ud83d\ude00"}, "d": null, "e": true}"#,
        )
        .unwrap();
        let a = j.get("a").and_then(Json::as_array).unwrap();
        assert_eq!(a[1], Json::Num(2.5e-3));
        assert!(a[3].as_f64().unwrap().is_nan());
        assert_eq!(a[4].as_f64(), Some(f64::INFINITY));
        assert_eq!(
            j.get("b").and_then(|b| b.get("c")),
            Some(&Json::Str("x\"é😀".into()))
        );
        assert_eq!(j.get("d"), Some(&Json::Null));
        // Python's float repr round-trips through Rust's parser.
        assert_eq!(
            Json::parse("10.661139488220215").unwrap(),
            Json::Num(10.661139488220215)
        );
        assert!(Json::parse("{\"a\": 1,}").is_err());
        assert!(Json::parse("[1 2]").is_err());
        assert!(Json::parse("{} x").is_err());
    }

    #[test]
    fn writes_what_it_reads() {
        let v = Json::parse(r#"{"a": [1, 2.5, "x\"y\n"], "b": {}, "c": null, "d": true}"#).unwrap();
        let text = v.pretty();
        assert_eq!(Json::parse(&text).unwrap(), v);
        assert!(
            text.starts_with("{\n  \"a\": [\n    1,\n    2.5,"),
            "{text}"
        );
    }

    #[test]
    fn object_lines() {
        let m = Json::object_line(r#"{"a": "x, \"y\"", "b": null, "c": -1e-3, "d": "\u00e9"}"#)
            .unwrap();
        assert_eq!(m["a"], Json::Str("x, \"y\"".into()));
        assert_eq!(m["b"], Json::Null);
        assert_eq!(m["c"], Json::Num(-1e-3));
        assert_eq!(m["d"].as_str(), Some("é"));
        assert_eq!(Json::object_line("{}"), Some(BTreeMap::new()));
        assert_eq!(Json::object_line("warning: something"), None);
        assert_eq!(Json::object_line(r#"{"a" 1}"#), None);
        assert_eq!(Json::object_line("[1]"), None);
    }
}

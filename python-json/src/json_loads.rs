//! `json.loads` as Python does it: a JSON parser that also accepts `NaN`, `Infinity` and
//! `-Infinity`, keeps integers apart from floats, and reports the line and column of errors.

use crate::json_value::{JsonMap, JsonValue};

/// Where and why a JSON text could not be parsed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("line {line} column {column}: {message}")]
pub struct JsonSyntaxError {
    /// 1-based line of the offending character.
    pub line: usize,
    /// 1-based column (in characters) of the offending character.
    pub column: usize,
    /// What was expected or found.
    pub message: String,
}

/// `json.loads(text)`: parses one JSON value, accepting `NaN`, `Infinity` and `-Infinity`.
///
/// Duplicate keys keep the last value at the first key's position, as a Python `dict` does.
pub fn loads(text: &str) -> std::result::Result<JsonValue, JsonSyntaxError> {
    let mut p = Parser {
        s: text.as_bytes(),
        text,
        i: 0,
        depth: 0,
    };
    p.ws();
    let v = p.value()?;
    p.ws();
    if p.i != p.s.len() {
        return Err(p.err("extra data after the JSON value"));
    }
    Ok(v)
}

struct Parser<'a> {
    s: &'a [u8],
    text: &'a str,
    i: usize,
    depth: usize,
}

impl Parser<'_> {
    fn err(&self, message: &str) -> JsonSyntaxError {
        let before = &self.text[..self.i.min(self.text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        JsonSyntaxError {
            line,
            column,
            message: message.to_string(),
        }
    }

    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn eat(&mut self, lit: &str) -> bool {
        if self.s[self.i..].starts_with(lit.as_bytes()) {
            self.i += lit.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self) -> std::result::Result<JsonValue, JsonSyntaxError> {
        let Some(&c) = self.s.get(self.i) else {
            return Err(self.err("expected a value, found the end of the text"));
        };
        match c {
            b'{' | b'[' => {
                self.depth += 1;
                if self.depth > 512 {
                    return Err(self.err("nesting deeper than 512 levels"));
                }
                let v = if c == b'{' {
                    self.object()
                } else {
                    self.array()
                };
                self.depth -= 1;
                v
            }
            b'"' => Ok(JsonValue::Str(self.string()?)),
            b't' if self.eat("true") => Ok(JsonValue::Bool(true)),
            b'f' if self.eat("false") => Ok(JsonValue::Bool(false)),
            b'n' if self.eat("null") => Ok(JsonValue::Null),
            b'N' if self.eat("NaN") => Ok(JsonValue::Float(f64::NAN)),
            b'I' if self.eat("Infinity") => Ok(JsonValue::Float(f64::INFINITY)),
            b'-' if self.eat("-Infinity") => Ok(JsonValue::Float(f64::NEG_INFINITY)),
            b'-' | b'0'..=b'9' => self.number(),
            _ => Err(self.err("expected a value")),
        }
    }

    fn object(&mut self) -> std::result::Result<JsonValue, JsonSyntaxError> {
        self.i += 1;
        let mut map = JsonMap::new();
        self.ws();
        if self.eat("}") {
            return Ok(JsonValue::Object(map));
        }
        loop {
            self.ws();
            if self.s.get(self.i) != Some(&b'"') {
                return Err(self.err("expected a property name in double quotes"));
            }
            let key = self.string()?;
            self.ws();
            if !self.eat(":") {
                return Err(self.err("expected ':' after a property name"));
            }
            self.ws();
            let v = self.value()?;
            map.insert(key, v);
            self.ws();
            if self.eat(",") {
                continue;
            }
            if self.eat("}") {
                return Ok(JsonValue::Object(map));
            }
            return Err(self.err("expected ',' or '}' in an object"));
        }
    }

    fn array(&mut self) -> std::result::Result<JsonValue, JsonSyntaxError> {
        self.i += 1;
        let mut items = Vec::new();
        self.ws();
        if self.eat("]") {
            return Ok(JsonValue::Array(items));
        }
        loop {
            self.ws();
            items.push(self.value()?);
            self.ws();
            if self.eat(",") {
                continue;
            }
            if self.eat("]") {
                return Ok(JsonValue::Array(items));
            }
            return Err(self.err("expected ',' or ']' in an array"));
        }
    }

    fn hex4(&mut self) -> std::result::Result<u32, JsonSyntaxError> {
        let h = self
            .s
            .get(self.i..self.i + 4)
            .and_then(|b| std::str::from_utf8(b).ok());
        let v = h.and_then(|h| u32::from_str_radix(h, 16).ok());
        match v {
            Some(v) => {
                self.i += 4;
                Ok(v)
            }
            None => Err(self.err("invalid \\uXXXX escape")),
        }
    }

    fn string(&mut self) -> std::result::Result<String, JsonSyntaxError> {
        self.i += 1;
        let mut out = String::new();
        loop {
            let start = self.i;
            while self.i < self.s.len() && !matches!(self.s[self.i], b'"' | b'\\' | 0..=0x1f) {
                self.i += 1;
            }
            out.push_str(&self.text[start..self.i]);
            match self.s.get(self.i) {
                None => return Err(self.err("unterminated string")),
                Some(b'"') => {
                    self.i += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.i += 1;
                    let Some(&e) = self.s.get(self.i) else {
                        return Err(self.err("unterminated string"));
                    };
                    self.i += 1;
                    match e {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let mut cp = self.hex4()?;
                            if (0xd800..0xdc00).contains(&cp)
                                && self.s[self.i..].starts_with(b"\\u")
                            {
                                let save = self.i;
                                self.i += 2;
                                let lo = self.hex4()?;
                                if (0xdc00..0xe000).contains(&lo) {
                                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                                } else {
                                    self.i = save;
                                }
                            }
                            // A lone surrogate cannot live in a Rust `String`: U+FFFD stands in.
                            out.push(char::from_u32(cp).unwrap_or('\u{fffd}'));
                        }
                        _ => {
                            self.i -= 1;
                            return Err(self.err("invalid escape"));
                        }
                    }
                }
                Some(_) => return Err(self.err("control character in a string")),
            }
        }
    }

    fn number(&mut self) -> std::result::Result<JsonValue, JsonSyntaxError> {
        let start = self.i;
        let digits = |p: &mut Self| {
            let s = p.i;
            while p.i < p.s.len() && p.s[p.i].is_ascii_digit() {
                p.i += 1;
            }
            p.i - s
        };
        if self.s[self.i] == b'-' {
            self.i += 1;
        }
        let int_start = self.i;
        if digits(self) == 0 {
            return Err(self.err("expected digits"));
        }
        if self.s[int_start] == b'0' && self.i - int_start > 1 {
            self.i = int_start + 1;
            return Err(self.err("leading zeros are not allowed"));
        }
        let mut is_float = false;
        if self.s.get(self.i) == Some(&b'.') {
            self.i += 1;
            if digits(self) == 0 {
                return Err(self.err("expected digits after '.'"));
            }
            is_float = true;
        }
        if matches!(self.s.get(self.i), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.s.get(self.i), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if digits(self) == 0 {
                return Err(self.err("expected digits in the exponent"));
            }
            is_float = true;
        }
        let lit = &self.text[start..self.i];
        if is_float {
            lit.parse()
                .map(JsonValue::Float)
                .map_err(|_| self.err("invalid number"))
        } else {
            lit.parse().map(JsonValue::Int).map_err(|_| {
                self.i = start;
                self.err("integer out of the 64-bit range")
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syntax_errors_say_where() {
        let e = loads("{\n  \"a\": 1,\n  \"b\" 2\n}").unwrap_err();
        assert_eq!((e.line, e.column), (3, 7));
        assert!(loads("[1, 2").is_err());
        assert!(loads("01").is_err());
        assert!(loads("99999999999999999999").is_err());
        assert!(loads("\"abc").is_err());
        assert!(loads("[1] x").is_err());
    }
}

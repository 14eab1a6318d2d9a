//! JSON values as Python's `json` module sees them, and `json.dumps`.
//!
//! Owns [`JsonValue`] / [`JsonMap`] (an insertion-ordered map, like a Python `dict`) and
//! [`dumps`], which
//! reproduces `json.dumps(value, indent=..., sort_keys=...)` byte for byte with the defaults
//! `ensure_ascii=True` and `allow_nan=True`: Python's float `repr` (`1e-05`, `0.0`,
//! `1.5e+16`), integers kept apart from floats, `\uXXXX` escapes for every non-ASCII character.
//! `trainer_state.json` and the logs passed to callbacks use these types; the float `repr`
//! is [`python_float_repr`], shared with `training_args.json`.

use std::fmt::Write as _;

#[cfg(test)]
use crate::json_loads::loads;
use crate::repr::python_float_repr;

/// A JSON value as Python's `json` module sees it: integers and floats are distinct.
#[derive(Debug, Clone, PartialEq)]
pub enum JsonValue {
    /// `null` (Python `None`).
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// A number written without fraction or exponent (Python `int`, within `i64`).
    Int(i64),
    /// A number with a fraction or exponent, or `NaN` / `Infinity` (Python `float`).
    Float(f64),
    /// A string.
    Str(String),
    /// An array (Python `list`).
    Array(Vec<JsonValue>),
    /// An object (Python `dict`), keys in insertion order.
    Object(JsonMap),
}

impl JsonValue {
    /// The value as `f64` when it is a number (an `Int` converts).
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            JsonValue::Int(i) => Some(*i as f64),
            JsonValue::Float(f) => Some(*f),
            _ => None,
        }
    }

    /// The value as `i64` when it is an `Int`.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            JsonValue::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The value as `bool` when it is a `Bool`.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            JsonValue::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The value as `&str` when it is a `Str`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            JsonValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The value as a map when it is an `Object`.
    pub fn as_object(&self) -> Option<&JsonMap> {
        match self {
            JsonValue::Object(m) => Some(m),
            _ => None,
        }
    }

    /// The value as a slice when it is an `Array`.
    pub fn as_array(&self) -> Option<&[JsonValue]> {
        match self {
            JsonValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The Python type name of this value (`"int"`, `"float"`, `"str"`, `"dict"`, ...), for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            JsonValue::Null => "None",
            JsonValue::Bool(_) => "bool",
            JsonValue::Int(_) => "int",
            JsonValue::Float(_) => "float",
            JsonValue::Str(_) => "str",
            JsonValue::Array(_) => "list",
            JsonValue::Object(_) => "dict",
        }
    }
}

impl From<f64> for JsonValue {
    fn from(v: f64) -> Self {
        JsonValue::Float(v)
    }
}
impl From<i64> for JsonValue {
    fn from(v: i64) -> Self {
        JsonValue::Int(v)
    }
}
impl From<bool> for JsonValue {
    fn from(v: bool) -> Self {
        JsonValue::Bool(v)
    }
}
impl From<&str> for JsonValue {
    fn from(v: &str) -> Self {
        JsonValue::Str(v.to_string())
    }
}
impl From<String> for JsonValue {
    fn from(v: String) -> Self {
        JsonValue::Str(v)
    }
}
impl From<JsonMap> for JsonValue {
    fn from(v: JsonMap) -> Self {
        JsonValue::Object(v)
    }
}
impl<T: Into<JsonValue>> From<Option<T>> for JsonValue {
    fn from(v: Option<T>) -> Self {
        v.map_or(JsonValue::Null, Into::into)
    }
}

/// An insertion-ordered string-keyed map, like a Python `dict`.
///
/// Inserting an existing key replaces its value in place (as `d[k] = v` does).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JsonMap {
    entries: Vec<(String, JsonValue)>,
}

impl JsonMap {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key` to `value`; an existing key keeps its position. Returns the old value.
    pub fn insert(
        &mut self,
        key: impl Into<String>,
        value: impl Into<JsonValue>,
    ) -> Option<JsonValue> {
        let key = key.into();
        let value = value.into();
        match self.entries.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => Some(std::mem::replace(v, value)),
            None => {
                self.entries.push((key, value));
                None
            }
        }
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&JsonValue> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The value of `key`, mutably.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut JsonValue> {
        self.entries
            .iter_mut()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// Removes `key` (Python `dict.pop(key, None)`).
    pub fn remove(&mut self, key: &str) -> Option<JsonValue> {
        let i = self.entries.iter().position(|(k, _)| k == key)?;
        Some(self.entries.remove(i).1)
    }

    /// Whether `key` is present.
    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &JsonValue)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }
}

impl<K: Into<String>, V: Into<JsonValue>> FromIterator<(K, V)> for JsonMap {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut m = JsonMap::new();
        for (k, v) in iter {
            m.insert(k, v);
        }
        m
    }
}

impl IntoIterator for JsonMap {
    type Item = (String, JsonValue);
    type IntoIter = std::vec::IntoIter<(String, JsonValue)>;
    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

fn write_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
        }
    }
    out.push('"');
}

/// The separators `json.dumps` writes between items and after keys.
#[derive(Clone, Copy)]
struct Separators {
    item: &'static str,
    key: &'static str,
}

fn write_value(
    out: &mut String,
    v: &JsonValue,
    indent: Option<usize>,
    sort_keys: bool,
    level: usize,
) {
    let item = if indent.is_some() { "," } else { ", " };
    write_with(
        out,
        v,
        indent,
        sort_keys,
        level,
        Separators { item, key: ": " },
    );
}

fn write_with(
    out: &mut String,
    v: &JsonValue,
    indent: Option<usize>,
    sort_keys: bool,
    level: usize,
    seps: Separators,
) {
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * level));
        }
    };
    let item_sep = seps.item;
    match v {
        JsonValue::Null => out.push_str("null"),
        JsonValue::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        JsonValue::Int(i) => {
            let _ = write!(out, "{i}");
        }
        JsonValue::Float(f) => out.push_str(&python_float_repr(*f)),
        JsonValue::Str(s) => write_str(out, s),
        JsonValue::Array(items) => {
            if items.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                write_with(out, item, indent, sort_keys, level + 1, seps);
            }
            newline(out, level);
            out.push(']');
        }
        JsonValue::Object(map) => {
            if map.is_empty() {
                out.push_str("{}");
                return;
            }
            let mut entries: Vec<(&str, &JsonValue)> = map.iter().collect();
            if sort_keys {
                // Python sorts str keys by code point; UTF-8 byte order is the same order.
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                write_str(out, k);
                out.push_str(seps.key);
                write_with(out, item, indent, sort_keys, level + 1, seps);
            }
            newline(out, level);
            out.push('}');
        }
    }
}

/// `json.dumps(value, indent=indent, sort_keys=sort_keys)` with Python's other defaults
/// (`ensure_ascii=True`, `allow_nan=True`, separators `", "`/`": "`, or `","` with an indent).
pub fn dumps(value: &JsonValue, indent: Option<usize>, sort_keys: bool) -> String {
    let mut out = String::new();
    write_value(&mut out, value, indent, sort_keys, 0);
    out
}

/// `json.dumps(value, separators=(",", ":"), sort_keys=sort_keys)`: no spaces, one line.
pub fn dumps_compact(value: &JsonValue, sort_keys: bool) -> String {
    let mut out = String::new();
    let seps = Separators {
        item: ",",
        key: ":",
    };
    write_with(&mut out, value, None, sort_keys, 0, seps);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dumps_round_trips_and_escapes() {
        let text =
            "{\"b\": [1, 2.5, NaN, -Infinity], \"a\": \"caf\\u00e9 \\ud83d\\ude00\\n\", \"c\": {}}";
        let v = loads(text).unwrap();
        assert_eq!(
            dumps(&v, None, true),
            "{\"a\": \"caf\\u00e9 \\ud83d\\ude00\\n\", \"b\": [1, 2.5, NaN, -Infinity], \"c\": {}}"
        );
        assert_eq!(dumps(&v, Some(2), false).lines().count(), 10);
        assert_eq!(
            dumps_compact(&v, true),
            "{\"a\":\"caf\\u00e9 \\ud83d\\ude00\\n\",\"b\":[1,2.5,NaN,-Infinity],\"c\":{}}"
        );
    }
}

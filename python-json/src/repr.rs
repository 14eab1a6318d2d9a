//! Python's `repr(float)` ([`python_float_repr`], the one implementation every tchtrain file
//! writer uses: `training_args.json`, `trainer_state.json`, logs), JSON text in the form
//! Python's `json.dumps(..., indent=2)` writes it from serde values (floats as Python's
//! `repr`, non-ASCII escaped, two-space indent), and Python's `repr` of JSON values and
//! strings (`to_sanitized_dict`, chat templates' literals). Python's own JSON values,
//! `json.dumps` and `json.loads` are in `json_value` and `json_loads`.

use std::io;

use serde_json::ser::{Formatter, PrettyFormatter};

/// Python's `repr(float)`: the shortest string that reads back to the same `f64`, in fixed
/// notation for exponents in `[-5, 16)` (with `.0` for whole numbers) and exponent notation
/// otherwise (`1e-05`, `1.5e+16`); `NaN`, `Infinity`, `-Infinity` as `json` writes them.
pub fn python_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    let sign = if x.is_sign_negative() { "-" } else { "" };
    // Rust's `{:e}` gives the shortest round-trip digits ("d.ddde-5" / "de16"), but breaks a
    // tie between two equally near candidates upwards; Python (David Gay's dtoa) takes the
    // even one, which exact formatting to the same number of digits yields.
    let shortest = format!("{:e}", x.abs());
    let n = shortest
        .split_once('e')
        .map_or(1, |(m, _)| m.chars().filter(char::is_ascii_digit).count());
    let even = format!("{:.*e}", n - 1, x.abs());
    let sci = if even.parse::<f64>() == Ok(x.abs()) {
        even
    } else {
        shortest
    };
    let (mantissa, exp) = sci.split_once('e').expect("`{:e}` always has an exponent");
    let exp: i32 = exp.parse().expect("`{:e}` exponent is an integer");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if x == 0.0 {
        return format!("{sign}0.0");
    }
    if !(-4..16).contains(&exp) {
        let m = if digits.len() == 1 {
            digits.clone()
        } else {
            format!("{}.{}", &digits[..1], &digits[1..])
        };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{m}e{esign}{:02}", exp.abs());
    }
    // Fixed notation: the decimal point sits after `exp + 1` digits.
    let point = exp + 1;
    let out = if point <= 0 {
        format!("0.{}{}", "0".repeat((-point) as usize), digits)
    } else if point as usize >= digits.len() {
        format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
    } else {
        let (a, b) = digits.split_at(point as usize);
        format!("{a}.{b}")
    };
    format!("{sign}{out}")
}

/// A `serde_json` formatter writing what Python's `json.dumps(obj, indent=2)` writes.
pub(crate) struct PythonFormatter {
    inner: PrettyFormatter<'static>,
}

impl PythonFormatter {
    pub(crate) fn new() -> Self {
        Self {
            inner: PrettyFormatter::with_indent(b"  "),
        }
    }
}

impl Formatter for PythonFormatter {
    fn write_f64<W: ?Sized + io::Write>(&mut self, writer: &mut W, value: f64) -> io::Result<()> {
        writer.write_all(python_float_repr(value).as_bytes())
    }

    fn write_f32<W: ?Sized + io::Write>(&mut self, writer: &mut W, value: f32) -> io::Result<()> {
        self.write_f64(writer, f64::from(value))
    }

    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        if fragment.is_ascii() {
            return writer.write_all(fragment.as_bytes());
        }
        let mut buf = [0u16; 2];
        for c in fragment.chars() {
            if c.is_ascii() {
                writer.write_all(&[c as u8])?;
            } else {
                for unit in c.encode_utf16(&mut buf) {
                    write!(writer, "\\u{unit:04x}")?;
                }
            }
        }
        Ok(())
    }

    fn begin_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.inner.begin_array(writer)
    }

    fn end_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.inner.end_array(writer)
    }

    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.inner.begin_array_value(writer, first)
    }

    fn end_array_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.inner.end_array_value(writer)
    }

    fn begin_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.inner.begin_object(writer)
    }

    fn end_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.inner.end_object(writer)
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.inner.begin_object_key(writer, first)
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.inner.begin_object_value(writer)
    }

    fn end_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.inner.end_object_value(writer)
    }
}

/// Serialises `value` as Python's `json.dumps(value, indent=2)` would.
pub fn to_python_json<T: serde::Serialize + ?Sized>(value: &T) -> serde_json::Result<String> {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonFormatter::new());
    value.serialize(&mut ser)?;
    // The formatter writes only ASCII and valid UTF-8 from serde_json.
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Python's `repr` of a JSON value (`None`, `True`, `'text'`, `[1, 2]`, `{'k': 0.5}`).
pub fn python_repr(value: &serde_json::Value) -> String {
    use serde_json::Value;
    match value {
        Value::Null => "None".to_string(),
        Value::Bool(b) => if *b { "True" } else { "False" }.to_string(),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i.to_string(),
            (_, Some(u), _) => u.to_string(),
            (_, _, Some(f)) => python_float_repr(f),
            _ => n.to_string(),
        },
        Value::String(s) => python_str_repr(s),
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(python_repr).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(map) => format!(
            "{{{}}}",
            map.iter()
                .map(|(k, v)| format!("{}: {}", python_str_repr(k), python_repr(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Python's `repr(str)`: single quotes unless the text holds a single quote and no double quote.
pub fn python_str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        // Each pair is (value, repr(value)) from CPython 3.11.
        let cases: &[(f64, &str)] = &[
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (1e-05, "1e-05"),
            (0.0001, "0.0001"),
            (1.2345e-7, "1.2345e-07"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (1e15, "1000000000000000.0"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (0.1 + 0.2, "0.30000000000000004"),
            (5735.8, "5735.8"),
            // A float32 value exactly halfway between two 17-digit strings: Python picks the even one.
            (f32::from_bits(0x418d_c608) as f64, "17.721694946289062"),
            (1e300, "1e+300"),
            (5e-324, "5e-324"),
            (-2.5e-10, "-2.5e-10"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
        ];
        for (v, want) in cases {
            assert_eq!(python_float_repr(*v), *want, "repr of {v:e}");
        }
    }

    #[test]
    fn float_repr_matches_python_on_training_args_values() {
        for (x, s) in [
            (5e-5, "5e-05"),
            (1e-8, "1e-08"),
            (3.0, "3.0"),
            (0.9, "0.9"),
            (0.999, "0.999"),
            (1e16, "1e+16"),
            (1234567890123456.0, "1234567890123456.0"),
            (0.0001, "0.0001"),
            (-2.5, "-2.5"),
            (1.5e-7, "1.5e-07"),
            (100.0, "100.0"),
        ] {
            assert_eq!(python_float_repr(x), s, "{x}");
        }
    }

    #[test]
    fn repr_of_values() {
        let v = serde_json::json!({"a": [1, 0.5, null, true], "b": "it's"});
        assert_eq!(
            python_repr(&v),
            "{'a': [1, 0.5, None, True], 'b': \"it's\"}"
        );
    }
}

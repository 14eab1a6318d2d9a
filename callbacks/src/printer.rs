//! `PrinterCallback`, and the Python-style rendering of a logs dict it shares with `ProgressCallback`.

use tchtrain_training_args::TrainingArguments;

use crate::error::Result;
use crate::trainer_callback::TrainerCallback;
use crate::trainer_control::TrainerControl;
use crate::trainer_state::TrainerState;
use tchtrain_training_args::{JsonMap, JsonValue, python_float_repr};

/// Python's `f"{v:.{precision}g}"`: `precision` significant digits, trailing zeros removed,
/// exponent notation (`1.741e+04`) outside `[1e-4, 10**precision)`.
pub fn format_g(v: f64, precision: usize) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let p = precision.max(1);
    if v == 0.0 {
        return if v.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    // Rounding to `p` digits first decides the exponent, as Python does.
    let sci = format!("{:.*e}", p - 1, v);
    let (mantissa, exp) = sci.split_once('e').expect("`{:e}` has an exponent");
    let exp: i32 = exp.parse().expect("`{:e}` exponent is an integer");
    let strip = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if exp < -4 || exp >= p as i32 {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", strip(mantissa), exp.abs())
    } else {
        strip(&format!("{:.*}", (p as i32 - 1 - exp) as usize, v))
    }
}

pub(crate) use tchtrain_training_args::python_str_repr;

/// Python's `repr` of a JSON-like value (`True`, `None`, `[1, 2.5]`, `{'a': 1}`).
pub(crate) fn python_repr(v: &JsonValue) -> String {
    match v {
        JsonValue::Null => "None".into(),
        JsonValue::Bool(b) => if *b { "True" } else { "False" }.into(),
        JsonValue::Int(i) => i.to_string(),
        JsonValue::Float(f) => match python_float_repr(*f).as_str() {
            "NaN" => "nan".into(),
            "Infinity" => "inf".into(),
            "-Infinity" => "-inf".into(),
            s => s.to_string(),
        },
        JsonValue::Str(s) => python_str_repr(s),
        JsonValue::Array(items) => format!(
            "[{}]",
            items.iter().map(python_repr).collect::<Vec<_>>().join(", ")
        ),
        JsonValue::Object(m) => python_dict_repr(m.iter().map(|(k, v)| (k, python_repr(v)))),
    }
}

/// Python's `str` of a JSON-like value: a string as it is, anything else as its `repr`.
pub(crate) fn python_str(v: &JsonValue) -> String {
    match v {
        JsonValue::Str(s) => s.clone(),
        other => python_repr(other),
    }
}

/// Python's `type(v)` as `str` shows it (`<class 'str'>`, `<class 'NoneType'>`).
pub(crate) fn python_type(v: &JsonValue) -> String {
    let name = match v {
        JsonValue::Null => "NoneType",
        other => other.type_name(),
    };
    format!("<class '{name}'>")
}

fn python_dict_repr<'a>(entries: impl Iterator<Item = (&'a str, String)>) -> String {
    let parts: Vec<String> = entries
        .map(|(k, v)| format!("{}: {v}", python_str_repr(k)))
        .collect();
    format!("{{{}}}", parts.join(", "))
}

/// The line upstream prints for `logs`: `total_flos` dropped, floats as `'{v:.4g}'` strings,
/// strings longer than `max_str_len` (when given) replaced by a note, rendered as `str(dict)`.
pub fn format_logs(logs: &JsonMap, max_str_len: Option<usize>) -> String {
    python_dict_repr(logs.iter().filter(|(k, _)| *k != "total_flos").map(|(k, v)| {
        let shown = match v {
            JsonValue::Float(f) => python_str_repr(&format_g(*f, 4)),
            JsonValue::Str(s) if max_str_len.is_some_and(|n| s.chars().count() > n) => python_str_repr(&format!(
                "[String too long to display, length: {} > {}. Consider increasing `max_str_len` if needed.]",
                s.chars().count(),
                max_str_len.unwrap_or_default()
            )),
            other => python_repr(other),
        };
        (k, shown)
    }))
}

/// Upstream `PrinterCallback`: prints the logs (the Trainer uses it instead of
/// [`ProgressCallback`](crate::ProgressCallback) when `disable_tqdm` is set).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrinterCallback;

impl TrainerCallback for PrinterCallback {
    fn on_log(
        &mut self,
        _: &TrainingArguments,
        state: &TrainerState,
        _: &mut TrainerControl,
        logs: &JsonMap,
    ) -> Result<()> {
        if state.is_local_process_zero {
            println!("{}", format_logs(logs, None));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_g_matches_python() {
        // (value, f"{value:.4g}") from CPython 3.11.
        let cases: &[(f64, &str)] = &[
            (27.69833755493164, "27.7"),
            (0.0028, "0.0028"),
            (17412.783, "1.741e+04"),
            (0.09166666666666667, "0.09167"),
            (1e-05, "1e-05"),
            (0.00012345, "0.0001234"),
            (9999.5, "1e+04"),
            (1.0, "1"),
            (0.0, "0"),
            (-2.5, "-2.5"),
            (123456.0, "1.235e+05"),
            (f64::NAN, "nan"),
        ];
        for (v, want) in cases {
            assert_eq!(format_g(*v, 4), *want, "{v}");
        }
    }

    #[test]
    fn logs_render_like_python_dict() {
        let mut logs = JsonMap::new();
        logs.insert("loss", 27.69833755493164);
        logs.insert("total_flos", 1.0);
        logs.insert("step", 3i64);
        logs.insert("note", "it's");
        logs.insert("long", "x".repeat(5));
        assert_eq!(
            format_logs(&logs, Some(4)),
            "{'loss': '27.7', 'step': 3, 'note': \"it's\", 'long': '[String too long to display, length: 5 > 4. \
             Consider increasing `max_str_len` if needed.]'}"
        );
    }
}

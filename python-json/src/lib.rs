//! `tchtrain-python-json` — Python's `json` module and `repr` as the Trainer's files need
//! them: [`JsonValue`] (a `dict`'s insertion order, integers apart from floats), [`dumps`] and
//! [`loads`] byte for byte as `json.dumps` / `json.loads`, Python's float `repr`
//! ([`python_float_repr`]) and `repr` of strings and values. No libtorch; every crate that
//! writes or reads upstream's JSON files uses this one.

mod json_loads;
mod json_value;
mod repr;

pub use json_loads::{JsonSyntaxError, loads};
pub use json_value::{JsonMap, JsonValue, dumps, dumps_compact};
pub use repr::{python_float_repr, python_repr, python_str_repr, to_python_json};

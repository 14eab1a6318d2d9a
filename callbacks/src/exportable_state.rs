//! `ExportableState`: a callback's state as stored under `stateful_callbacks` in `trainer_state.json`.
//!
//! Upstream stores `{"args": {...constructor kwargs...}, "attributes": {...}}` per callback
//! and rebuilds the callback with `cls(**args)` and `setattr` for each attribute.

use crate::error::{Error, Result};
use tchtrain_training_args::{JsonMap, JsonValue};

/// The exported state of one callback: constructor arguments and mutable attributes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CallbackState {
    /// Keyword arguments that recreate the callback (upstream `state()["args"]`).
    pub args: JsonMap,
    /// Attributes set on the recreated callback (upstream `state()["attributes"]`).
    pub attributes: JsonMap,
}

impl CallbackState {
    /// The JSON object `{"args": ..., "attributes": ...}` upstream writes.
    pub fn to_json(&self) -> JsonValue {
        let mut m = JsonMap::new();
        m.insert("args", self.args.clone());
        m.insert("attributes", self.attributes.clone());
        JsonValue::Object(m)
    }

    /// Reads `{"args": ..., "attributes": ...}`; missing parts are empty (as upstream's
    /// `callback_data.get("args", {})`). `what` names the document in errors.
    pub fn from_json(value: &JsonValue, what: &str) -> Result<Self> {
        let map = value.as_object().ok_or_else(|| Error::FieldType {
            what: what.to_string(),
            field: "(callback state)".into(),
            expected: "a dict with `args` and `attributes`",
            found: value.type_name().into(),
        })?;
        let part = |key: &str| -> Result<JsonMap> {
            match map.get(key) {
                None => Ok(JsonMap::new()),
                Some(JsonValue::Object(m)) => Ok(m.clone()),
                Some(other) => Err(Error::FieldType {
                    what: what.to_string(),
                    field: key.to_string(),
                    expected: "a dict",
                    found: other.type_name().into(),
                }),
            }
        };
        Ok(Self {
            args: part("args")?,
            attributes: part("attributes")?,
        })
    }

    /// Reads field `key` of `args` or `attributes` with `get`, naming `what.part.key` on a type
    /// mismatch. A missing key gives `Ok(None)`.
    pub fn field<T>(
        &self,
        what: &str,
        part: &str,
        key: &str,
        expected: &'static str,
        get: impl Fn(&JsonValue) -> Option<T>,
    ) -> Result<Option<T>> {
        let map = if part == "args" {
            &self.args
        } else {
            &self.attributes
        };
        match map.get(key) {
            None => Ok(None),
            Some(v) => get(v).map(Some).ok_or_else(|| Error::FieldType {
                what: what.to_string(),
                field: format!("{part}.{key}"),
                expected,
                found: v.type_name().into(),
            }),
        }
    }
}

/// Upstream `ExportableState`: an object whose state is saved in a checkpoint's
/// `trainer_state.json` and restored when training resumes.
pub trait ExportableState {
    /// The state to save (upstream `state()`).
    fn state(&self) -> CallbackState;

    /// Rebuilds the object from a saved state (upstream `from_state`: `cls(**args)`, then
    /// each attribute set). Errors name the field with the wrong type.
    fn from_state(state: &CallbackState) -> Result<Self>
    where
        Self: Sized;
}

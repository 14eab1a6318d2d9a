//! `ModelConfig`: what the logger callbacks read of `model.config` (upstream passes the model to
//! every event; MLflow logs `model.config.to_dict()` as params, TensorBoard writes
//! `model.config.to_json_string()` as the `model_config` text).

use crate::error::{Error, Result};
use tchtrain_training_args::{JsonMap, JsonValue, dumps, loads};

/// The model's configuration in the two forms upstream's integrations read. The Trainer hands
/// it to the callbacks once, through
/// [`CallbackHandler::set_model_config`](crate::CallbackHandler::set_model_config).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Upstream `model.config.to_dict()`: every field, in the config's order (JSON object
    /// keys are strings; an `id2label` whose keys are integers is shown with integer keys, as
    /// upstream's dict holds them).
    pub dict: JsonMap,
    /// Upstream `model.config.to_json_string()`: the text `config.json` holds.
    pub json_string: String,
    /// Upstream `model.num_parameters()` (W&B logs it as `model/num_parameters`), when the
    /// Trainer knows the model.
    pub num_parameters: Option<i64>,
    /// Upstream `print(model)` (the module tree; W&B's model artifacts carry it as
    /// `model_architecture.txt`), when the Trainer's model writes it out.
    pub architecture: Option<String>,
}

impl ModelConfig {
    /// From `to_dict()`'s map; the JSON text is `json.dumps(dict, indent=2, sort_keys=True) +
    /// "\n"`, upstream's `to_json_string(use_diff=False)` (upstream's default `use_diff=True`
    /// leaves out the fields equal to the class defaults, which only the model knows: pass
    /// that text with [`ModelConfig::with_json_string`] where it matters).
    pub fn from_dict(dict: JsonMap) -> Self {
        let json_string = dumps(&JsonValue::Object(dict.clone()), Some(2), true) + "\n";
        Self {
            dict,
            json_string,
            num_parameters: None,
            architecture: None,
        }
    }

    /// Parses a JSON object (a `config.json` text, or `to_dict()` dumped as JSON) and keeps
    /// the text as it is for the `model_config` text.
    pub fn from_json(text: &str) -> Result<Self> {
        match loads(text) {
            Ok(JsonValue::Object(dict)) => Ok(Self {
                dict,
                json_string: text.to_string(),
                num_parameters: None,
                architecture: None,
            }),
            Ok(other) => Err(Error::FieldType {
                what: "model config".into(),
                field: "-".into(),
                expected: "a JSON object",
                found: other.type_name().into(),
            }),
            Err(source) => Err(Error::JsonSyntax {
                what: "the model config".into(),
                source,
            }),
        }
    }

    /// From a config serialised as a JSON object (the models' `to_json_value()`, upstream's
    /// `to_dict()`), through [`ModelConfig::from_dict`].
    pub fn from_json_value(value: &serde_json::Value) -> Result<Self> {
        Self::from_json(&value.to_string()).map(|c| Self::from_dict(c.dict))
    }

    /// The same config with the model's parameter count.
    pub fn with_num_parameters(mut self, n: i64) -> Self {
        self.num_parameters = Some(n);
        self
    }

    /// The same config with upstream's `print(model)` text.
    pub fn with_architecture(mut self, text: impl Into<String>) -> Self {
        self.architecture = Some(text.into());
        self
    }

    /// The same dict with `json_string` as the text.
    pub fn with_json_string(mut self, json_string: impl Into<String>) -> Self {
        self.json_string = json_string.into();
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_string_is_upstreams_sorted_indented_dump() {
        let value = serde_json::json!({"n_layer": 2, "activation": "gelu", "eps": 1e-5});
        let config = ModelConfig::from_json_value(&value).unwrap();
        assert_eq!(config.dict.get("eps"), Some(&JsonValue::Float(1e-5)));
        assert_eq!(
            config.json_string,
            "{\n  \"activation\": \"gelu\",\n  \"eps\": 1e-05,\n  \"n_layer\": 2\n}\n"
        );
        let err = ModelConfig::from_json("[1]").unwrap_err().to_string();
        assert!(err.contains("JSON object"), "{err}");
    }
}

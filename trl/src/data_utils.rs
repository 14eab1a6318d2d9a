//! `trl/data_utils.py`: the dataset formats TRL's trainers read.

use serde_json::{Map, Value};

/// `is_conversational(example)`: the first of `prompt`, `chosen`, `rejected`, `completion`,
/// `messages` the row has is a list of messages (objects with a `role`).
pub fn is_conversational(example: &Map<String, Value>) -> bool {
    ["prompt", "chosen", "rejected", "completion", "messages"]
        .iter()
        .find_map(|k| example.get(*k))
        .and_then(Value::as_array)
        .and_then(|m| m.first())
        .and_then(Value::as_object)
        .is_some_and(|m| m.contains_key("role"))
}

/// `is_conversational_from_value(example)`: ShareGPT's `conversations` of `{"from", "value"}`.
pub fn is_conversational_from_value(example: &Map<String, Value>) -> bool {
    example
        .get("conversations")
        .and_then(Value::as_array)
        .and_then(|m| m.first())
        .and_then(Value::as_object)
        .is_some_and(|m| m.contains_key("from") && m.contains_key("value"))
}

/// `common_prefix_length(ids, other_ids)`: the number of leading tokens both have.
pub fn common_prefix_length(ids: &[i64], other_ids: &[i64]) -> usize {
    ids.iter()
        .zip(other_ids)
        .take_while(|(a, b)| a == b)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn formats() {
        let chat = obj(serde_json::json!({"messages": [{"role": "user", "content": "hi"}]}));
        assert!(is_conversational(&chat));
        assert!(!is_conversational(&obj(
            serde_json::json!({"prompt": "The sky is", "completion": " blue"})
        )));
        assert!(is_conversational_from_value(&obj(
            serde_json::json!({"conversations": [{"from": "human", "value": "hi"}]})
        )));
        assert_eq!(common_prefix_length(&[1, 2, 3], &[1, 2, 4, 5]), 2);
    }
}

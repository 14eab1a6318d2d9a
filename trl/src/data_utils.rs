//! `trl/data_utils.py`: the dataset formats TRL's trainers read.

use serde_json::{Map, Value};
use tchtrain_models::{ChatTemplateOptions, PreTrainedTokenizerFast};

use crate::error::Result;

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

/// `prepare_multimodal_messages(messages, images)` with `images` images: every message's
/// text content made a list of parts (`{"type": "text", "text": ...}`), the first user message
/// given one `{"type": "image"}` placeholder per image before its text (messages whose
/// content is already a list are kept). Errors as TRL's: a role other than `system`, `user`,
/// `assistant`, `tool`; a count of placeholders other than the images'.
pub fn prepare_multimodal_messages(messages: &Value, images: usize) -> Result<Value> {
    let bad = |detail: String| crate::Error::InvalidArgument {
        field: "messages",
        detail,
    };
    let list = messages
        .as_array()
        .ok_or_else(|| bad(format!("a list of messages, got {messages}")))?;
    let text_part = |t: &str| serde_json::json!([{"type": "text", "text": t}]);
    let mut included = false;
    let mut out = Vec::with_capacity(list.len());
    for message in list {
        let mut m = message
            .as_object()
            .cloned()
            .ok_or_else(|| bad(format!("a message must be an object, got {message}")))?;
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        match (role.as_str(), m.get("content")) {
            ("user", Some(Value::String(t))) if !included => {
                let mut parts = vec![serde_json::json!({"type": "image"}); images];
                parts.push(serde_json::json!({"type": "text", "text": t}));
                m.insert("content".into(), Value::Array(parts));
                included = true;
            }
            ("user" | "assistant" | "system" | "tool", Some(Value::String(t))) => {
                let parts = text_part(t);
                m.insert("content".into(), parts);
            }
            ("user" | "assistant" | "system" | "tool", _) => {}
            (other, _) => {
                return Err(bad(format!(
                    "Invalid role in message: {other}. Expected 'system', 'user', 'assistant', or 'tool'. (TRL's message)"
                )));
            }
        }
        out.push(Value::Object(m));
    }
    let placeholders: usize = out
        .iter()
        .filter(|m| m.get("role").and_then(Value::as_str) != Some("tool"))
        .filter_map(|m| m.get("content").and_then(Value::as_array))
        .map(|parts| {
            parts
                .iter()
                .filter(|p| {
                    p.get("type").and_then(Value::as_str) == Some("image")
                        && p.get("image").is_none()
                })
                .count()
        })
        .sum();
    if placeholders != images {
        return Err(bad(format!(
            "Number of images provided ({images}) does not match number of image placeholders ({placeholders}). (TRL's message)"
        )));
    }
    Ok(Value::Array(out))
}

/// `common_prefix_length(ids, other_ids)`: the number of leading tokens both have.
pub fn common_prefix_length(ids: &[i64], other_ids: &[i64]) -> usize {
    ids.iter()
        .zip(other_ids)
        .take_while(|(a, b)| a == b)
        .count()
}

/// `extract_prompt(example)`: the longest common prefix of `chosen` and `rejected` (message
/// by message, or character by character for text, a space before the first difference left
/// to the completions) as `prompt`, the rest as the completions. Returns `None` when they are
/// not both lists or both strings. As upstream's loop, when one is a prefix of the other the
/// prompt stops one element short of the shorter.
pub fn extract_prompt(chosen: &Value, rejected: &Value) -> Option<(Value, Value, Value)> {
    fn split<T: PartialEq>(c: &[T], r: &[T], is_space: impl Fn(&T) -> bool) -> Option<usize> {
        let n = c.len().min(r.len());
        if n == 0 {
            // Upstream's loop never binds `idx` (a NameError there).
            return None;
        }
        let mut idx = n - 1;
        for i in 0..n {
            if c[i] != r[i] {
                idx = i;
                // `chosen[idx - 1]` with Python's negative index at 0.
                let before = if i == 0 { c.len() - 1 } else { i - 1 };
                if is_space(&c[before]) {
                    idx = if i == 0 { usize::MAX } else { i - 1 };
                }
                break;
            }
        }
        Some(idx)
    }
    match (chosen, rejected) {
        (Value::String(c), Value::String(r)) => {
            let (c, r): (Vec<char>, Vec<char>) = (c.chars().collect(), r.chars().collect());
            let idx = split(&c, &r, |x| *x == ' ')?;
            // `idx = -1` slices `[:-1]` and `[-1:]`.
            let (p, cs, rs) = if idx == usize::MAX {
                (
                    c[..c.len() - 1].iter().collect::<String>(),
                    c[c.len() - 1..].iter().collect(),
                    r[r.len() - 1..].iter().collect(),
                )
            } else {
                (
                    c[..idx].iter().collect::<String>(),
                    c[idx..].iter().collect(),
                    r[idx..].iter().collect(),
                )
            };
            Some((Value::String(p), Value::String(cs), Value::String(rs)))
        }
        (Value::Array(c), Value::Array(r)) => {
            let idx = split(c, r, |x| x.as_str() == Some(" "))?;
            if idx == usize::MAX {
                return None;
            }
            Some((
                Value::Array(c[..idx].to_vec()),
                Value::Array(c[idx..].to_vec()),
                Value::Array(r[idx..].to_vec()),
            ))
        }
        _ => None,
    }
}

/// `_tokenize(processing_class, messages, tools=..., **chat_template_kwargs)` for
/// conversational input: `apply_chat_template(messages, tokenize=True)` with the row's
/// `tools` (a list, or JSON text) and `chat_template_kwargs`, and with `with_mask` the
/// assistant mask (`return_assistant_tokens_mask`).
pub fn tokenize_messages(
    tokenizer: &PreTrainedTokenizerFast,
    messages: &Value,
    example: &Map<String, Value>,
    add_generation_prompt: bool,
    with_mask: bool,
) -> Result<(Vec<i64>, Option<Vec<i64>>)> {
    let tools = match example.get("tools") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => Some(v.to_string()),
    };
    let template_kwargs = match example.get("chat_template_kwargs") {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    let options = ChatTemplateOptions {
        add_generation_prompt,
        tools,
        template_kwargs,
        ..ChatTemplateOptions::default()
    };
    if with_mask {
        let (f, mask) =
            tokenizer.apply_chat_template_with_assistant_mask(&messages.to_string(), &options)?;
        return Ok((f.input_ids, Some(mask)));
    }
    Ok((
        tokenizer
            .apply_chat_template(&messages.to_string(), &options)?
            .input_ids,
        None,
    ))
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
        // extract_prompt: the space before the difference goes to the completions.
        let (p, c, r) = extract_prompt(
            &Value::String("The sky is blue.".into()),
            &Value::String("The sky is green.".into()),
        )
        .unwrap_or((Value::Null, Value::Null, Value::Null));
        assert_eq!(
            (p.as_str(), c.as_str(), r.as_str()),
            (Some("The sky is"), Some(" blue."), Some(" green."))
        );
        // One a prefix of the other: upstream's loop stops one short.
        let (p, c, r) = extract_prompt(&Value::String("abc".into()), &Value::String("abcd".into()))
            .unwrap_or((Value::Null, Value::Null, Value::Null));
        assert_eq!(
            (p.as_str(), c.as_str(), r.as_str()),
            (Some("ab"), Some("c"), Some("cd"))
        );
    }
}

//! `trl/rewards/`: TRL's ready-made reward functions for [`GRPOTrainer`](crate::GRPOTrainer),
//! under upstream's names (the names their metrics are logged under). The accuracy rewards
//! (`accuracy_reward`, `reasoning_accuracy_reward`) verify LaTeX answers with `math_verify`,
//! which has no counterpart here: [`by_name`] refuses them.

use serde_json::Value;

use crate::error::{Error, Result};
use crate::trainer::grpo_trainer::{RewardFunc, RewardInputs};

fn content(c: &Value) -> &str {
    match c {
        Value::Array(m) => m
            .first()
            .and_then(|x| x.get("content"))
            .and_then(Value::as_str)
            .unwrap_or(""),
        other => other.as_str().unwrap_or(""),
    }
}

/// `think_format_reward`: 1.0 when the completion's content is `<think>...</think>` followed
/// by anything, with no second `<think>` (upstream's `^<think>(?!.*<think>)(.*?)</think>.*$`
/// under `DOTALL`), else 0.0.
///
/// ```
/// use tchtrain_trl::rewards::think_format;
/// assert_eq!(think_format("<think>\nThis is my reasoning.\n</think>\nThis is my answer."), 1.0);
/// assert_eq!(think_format("<think>\nThis is my reasoning.\nThis is my answer."), 0.0);
/// ```
pub fn think_format(text: &str) -> f64 {
    match text.strip_prefix("<think>") {
        Some(rest) if !rest.contains("<think>") && rest.contains("</think>") => 1.0,
        _ => 0.0,
    }
}

/// `think_format_reward` as a reward function.
pub fn think_format_reward() -> RewardFunc {
    RewardFunc::function("think_format_reward", |i: &RewardInputs<'_>| {
        Ok(i.completions
            .iter()
            .map(|c| Some(think_format(content(c))))
            .collect())
    })
}

/// `get_soft_overlong_punishment(max_completion_len, soft_punish_cache)` (DAPO's Eq. 13): 0
/// up to `max_completion_len - soft_punish_cache` tokens, then falling linearly to -1 at
/// `max_completion_len`, -1 beyond.
///
/// ```
/// use tchtrain_trl::rewards::soft_overlong_punishment;
/// assert_eq!(soft_overlong_punishment(10, 20, 5), 0.0);
/// assert_eq!(soft_overlong_punishment(18, 20, 5), -0.6);
/// assert_eq!(soft_overlong_punishment(21, 20, 5), -1.0);
/// ```
pub fn soft_overlong_punishment(
    completion_length: usize,
    max_completion_len: usize,
    soft_punish_cache: usize,
) -> f64 {
    let (len, max, cache) = (
        completion_length as i64,
        max_completion_len as i64,
        soft_punish_cache as i64,
    );
    if len <= max - cache {
        0.0
    } else if len <= max {
        (max - cache - len) as f64 / cache as f64
    } else {
        -1.0
    }
}

/// `get_soft_overlong_punishment(...)` as a reward function
/// (`soft_overlong_punishment_reward`).
pub fn get_soft_overlong_punishment(
    max_completion_len: usize,
    soft_punish_cache: usize,
) -> RewardFunc {
    RewardFunc::function(
        "soft_overlong_punishment_reward",
        move |i: &RewardInputs<'_>| {
            Ok(i.completion_ids
                .iter()
                .map(|ids| {
                    Some(soft_overlong_punishment(
                        ids.len(),
                        max_completion_len,
                        soft_punish_cache,
                    ))
                })
                .collect())
        },
    )
}

/// `get_repetition_penalty_reward(ngram_size, max_penalty)`: `(1 - unique / total) ·
/// max_penalty` over the completion's token n-grams (0 below `ngram_size` tokens).
///
/// ```
/// use tchtrain_trl::rewards::repetition_penalty;
/// assert_eq!(repetition_penalty(&[1, 2, 3, 4], 2, -1.0), 0.0);
/// assert_eq!(repetition_penalty(&[5, 5, 5, 5, 5], 2, -1.0), -0.75);
/// ```
pub fn repetition_penalty(ids: &[i64], ngram_size: usize, max_penalty: f64) -> f64 {
    if ngram_size == 0 || ids.len() < ngram_size {
        return 0.0;
    }
    let ngrams: Vec<&[i64]> = ids.windows(ngram_size).collect();
    let unique: std::collections::HashSet<&[i64]> = ngrams.iter().copied().collect();
    let scaling = 1.0 - unique.len() as f64 / ngrams.len() as f64;
    if scaling != 0.0 {
        scaling * max_penalty
    } else {
        0.0
    }
}

/// `get_repetition_penalty_reward(ngram_size, max_penalty)` as a reward function
/// (`repetition_penalty_reward`); a positive `max_penalty` is refused with upstream's message.
pub fn get_repetition_penalty_reward(ngram_size: usize, max_penalty: f64) -> Result<RewardFunc> {
    if max_penalty > 0.0 {
        return Err(Error::InvalidArgument {
            field: "max_penalty",
            detail: format!("max_penalty {max_penalty} should not be positive (TRL's message)"),
        });
    }
    Ok(RewardFunc::function(
        "repetition_penalty_reward",
        move |i: &RewardInputs<'_>| {
            Ok(i.completion_ids
                .iter()
                .map(|ids| Some(repetition_penalty(ids, ngram_size, max_penalty)))
                .collect())
        },
    ))
}

/// The registry of TRL's `trl grpo` script (`--reward_funcs NAME`): `think_format_reward`,
/// `get_soft_overlong_punishment` (1280 tokens, cache 256, as the script fixes them); the
/// accuracy rewards and dotted import paths are refused, naming them.
pub fn by_name(name: &str) -> Result<RewardFunc> {
    match name {
        "think_format_reward" => Ok(think_format_reward()),
        "get_soft_overlong_punishment" => Ok(get_soft_overlong_punishment(1280, 256)),
        "accuracy_reward" | "reasoning_accuracy_reward" => Err(Error::InvalidArgument {
            field: "reward_funcs",
            detail: format!(
                "'{name}' verifies LaTeX answers with math_verify, which is not available here; write the check as a RewardFunc::function"
            ),
        }),
        other if other.contains('.') => Err(Error::InvalidArgument {
            field: "reward_funcs",
            detail: format!(
                "'{other}': Python import paths cannot be loaded here; give a Rust reward function (RewardFunc::function) to GRPOTrainer instead"
            ),
        }),
        other => Err(Error::InvalidArgument {
            field: "reward_funcs",
            detail: format!(
                "Could not load reward function '{other}'. Expected one of ['accuracy_reward', 'reasoning_accuracy_reward', 'think_format_reward', 'get_soft_overlong_punishment'] or a valid import path. (TRL's message)"
            ),
        }),
    }
}

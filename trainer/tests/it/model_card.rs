//! The model card against transformers 5.23's (`scripts/reference/model_card.py`:
//! `TrainingSummary.from_trainer(...).to_model_card()` in offline mode): for a causal LM trained
//! from scratch (gradient accumulation, warm-up, a training-steps budget), a classifier
//! fine-tuned from a hub id with language, license, tags, dataset tags and arguments (metric
//! tags, model-index, Adafactor, cosine schedule, label smoothing, a results table that starts
//! with "No log") and an evaluation-only Whisper run (explicit model name and task): the README
//! text equal to upstream's, except the local build suffix of PyTorch's version (`+cu130`).

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use tchtrain_callbacks::{JsonMap, JsonValue, loads};
use tchtrain_testing::assets;
use tchtrain_trainer::{ModelCardOptions, TrainingSummary};
use tchtrain_training_args::TrainingArguments;

fn list(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}

#[test]
fn model_card_equals_transformers() -> Result<()> {
    let path = assets().join("reference/model_card/model_card.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("{} (run `cargo xtask setup`)", path.display()))?;
    let reference: Value = serde_json::from_str(&text)?;
    // The log entries' key order matters (the table's columns): read them keeping it.
    let ordered = match loads(&text)? {
        JsonValue::Object(m) => m,
        _ => anyhow::bail!("model_card.json is not an object"),
    };
    let ordered_cases = match ordered.get("cases") {
        Some(JsonValue::Array(a)) => a.clone(),
        _ => anyhow::bail!("model_card.json has no cases"),
    };
    for (index, case) in reference["cases"]
        .as_array()
        .context("cases")?
        .iter()
        .enumerate()
    {
        let name = case["name"].as_str().context("name")?;
        let mut args =
            TrainingArguments::from_dict(case["args"].as_object().context("args")?.clone())?.args;
        args.post_init()?;
        let log_history: Vec<JsonMap> = match ordered_cases[index]
            .as_object()
            .and_then(|c| c.get("log_history"))
        {
            Some(JsonValue::Array(entries)) => entries
                .iter()
                .map(|e| match e {
                    JsonValue::Object(m) => Ok(m.clone()),
                    _ => anyhow::bail!("{name}: a log entry is not an object"),
                })
                .collect::<Result<_>>()?,
            _ => anyhow::bail!("{name}: no log_history"),
        };
        let k = &case["kwargs"];
        let options = ModelCardOptions {
            language: list(k.get("language")),
            license: k.get("license").and_then(Value::as_str).map(str::to_string),
            tags: list(k.get("tags")),
            model_name: k
                .get("model_name")
                .and_then(Value::as_str)
                .map(str::to_string),
            finetuned_from: k
                .get("finetuned_from")
                .and_then(Value::as_str)
                .map(str::to_string),
            tasks: list(k.get("tasks")),
            dataset_tags: list(k.get("dataset_tags")),
            dataset: list(k.get("dataset")),
            dataset_args: list(k.get("dataset_args")),
        };
        let card = TrainingSummary::from_parts(
            &args,
            &log_history,
            case["class_name"].as_str().context("class_name")?,
            case["name_or_path"].as_str(),
            options,
        )
        .to_model_card();
        let torch = reference["framework_versions"]["torch"]
            .as_str()
            .context("torch")?;
        let expected = case["card"].as_str().context("card")?.replace(
            &format!("Pytorch {torch}"),
            &format!("Pytorch {}", torch.split('+').next().unwrap_or(torch)),
        );
        if card != expected {
            let first = card
                .lines()
                .zip(expected.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(card.lines().count().min(expected.lines().count()));
            anyhow::bail!(
                "{name}: the card differs at line {first}:\nours:\n{card}\ntheirs:\n{expected}"
            );
        }
        ensure!(card.contains("generated_from_trainer"));
    }
    Ok(())
}

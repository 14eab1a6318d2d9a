//! What the trainers' tests share.

use anyhow::{Context, Result, ensure};
use tchtrain_training_args::JsonMap;

/// Every value of every entry equal to TRL's but the timings.
pub(crate) fn assert_logs_equal(
    case: &str,
    ours: &[JsonMap],
    theirs: &serde_json::Value,
) -> Result<()> {
    let theirs = theirs.as_array().context("log_history")?;
    ensure!(
        ours.len() == theirs.len(),
        "{case}: {} entries vs {}",
        ours.len(),
        theirs.len()
    );
    let timing = |k: &str| k.ends_with("_runtime") || k.ends_with("_per_second");
    let mut bad = Vec::new();
    for (i, (o, e)) in ours.iter().zip(theirs).enumerate() {
        let e = e.as_object().context("entry")?;
        let mut mine: Vec<&str> = o.iter().map(|(k, _)| k).filter(|k| !timing(k)).collect();
        let mut want: Vec<&str> = e
            .keys()
            .map(String::as_str)
            .filter(|k| !timing(k))
            .collect();
        mine.sort();
        want.sort();
        ensure!(mine == want, "{case} entry {i}: keys {mine:?} vs {want:?}");
        for k in want {
            let (a, b) = (o.get(k).and_then(|v| v.as_f64()), e[k].as_f64());
            if a != b {
                bad.push(format!("entry {i}: {k} = {a:?}, TRL's {b:?}"));
            }
        }
    }
    ensure!(bad.is_empty(), "{case}: {}", bad.join("\n"));
    Ok(())
}

/// The references' Trainer settings: batches of 4, 8 steps at lr 1e-3, logs every 2 steps and
/// an evaluation every 4, no saves, seed 42, on the CPU without gradient checkpointing.
pub(crate) fn reference_arguments(base: &mut tchtrain_training_args::TrainingArguments) {
    base.per_device_train_batch_size = 4;
    base.per_device_eval_batch_size = 4;
    base.max_steps = 8;
    base.learning_rate = 1e-3;
    base.logging_steps = 2.0;
    base.eval_strategy = tchtrain_training_args::IntervalStrategy::Steps;
    base.eval_steps = Some(4.0);
    base.save_strategy = tchtrain_training_args::SaveStrategy::No;
    base.seed = 42;
    base.use_cpu = true;
    base.report_to = vec!["none".into()];
    base.disable_tqdm = true;
    base.gradient_checkpointing = false;
}

/// A safetensors file's tensors by name.
pub(crate) fn tensors(
    path: &std::path::Path,
) -> Result<std::collections::HashMap<String, tch::Tensor>> {
    Ok(tch::Tensor::read_safetensors(path)
        .with_context(|| path.display().to_string())?
        .into_iter()
        .collect())
}

/// The same tensor names in both files, each equal to the bit.
pub(crate) fn assert_same_tensors(
    case: &str,
    ours: &std::path::Path,
    theirs: &std::path::Path,
) -> Result<()> {
    let (ours, theirs) = (tensors(ours)?, tensors(theirs)?);
    let mut names: Vec<&String> = theirs.keys().collect();
    names.sort();
    let mut ours_names: Vec<&String> = ours.keys().collect();
    ours_names.sort();
    ensure!(
        names == ours_names,
        "{case}: saved {ours_names:?} vs TRL's {names:?}"
    );
    for n in names {
        ensure!(
            ours[n].equal(&theirs[n]),
            "{case}: saved {n} differs from TRL's"
        );
    }
    Ok(())
}

/// A run resumed from its step-4 checkpoint against the reference's uninterrupted
/// `log_history.json`: the same number of entries, and every entry after step 4's log and
/// evaluation equal to the reference's to the bit but the timings, the summary's mean loss
/// and FLOPs (which cover the resumed steps only, upstream's too) and `num_tokens`, which TRL
/// keeps on the trainer, not in the checkpoint, so a resumed run counts from zero.
pub(crate) fn assert_resumed_logs(history: &[JsonMap], reference: &std::path::Path) -> Result<()> {
    let expected: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(reference)?)?;
    let expected = expected.as_array().context("log_history")?;
    let tokens_at_4 = expected[1]["num_tokens"].as_f64().context("num_tokens")?;
    ensure!(
        history.len() == expected.len(),
        "{} entries after resuming vs {}",
        history.len(),
        expected.len()
    );
    for (i, (o, e)) in history[3..].iter().zip(&expected[3..]).enumerate() {
        for (k, v) in e.as_object().context("entry")? {
            let timing = k.ends_with("_runtime") || k.ends_with("_per_second");
            if timing || k == "train_loss" || k == "total_flos" {
                continue;
            }
            let want = match k.as_str() {
                "num_tokens" | "eval_num_tokens" => v.as_f64().map(|w| w - tokens_at_4),
                _ => v.as_f64(),
            };
            let got = o.get(k).and_then(|x| x.as_f64());
            ensure!(
                got == want,
                "resumed entry {i}: {k} = {got:?}, TRL's {want:?}"
            );
        }
    }
    Ok(())
}

/// The references' adapter: `LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj",
/// "v_proj"], task_type=task)`.
pub(crate) fn lora_q_v(task: &str) -> tchtrain_models::LoraConfig {
    tchtrain_models::LoraConfig {
        r: 4,
        lora_alpha: 8.0,
        target_modules: Some(tchtrain_models::TargetModules::Names(vec![
            "q_proj".into(),
            "v_proj".into(),
        ])),
        task_type: Some(task.into()),
        inference_mode: false,
        ..tchtrain_models::LoraConfig::default()
    }
}

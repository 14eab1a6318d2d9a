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

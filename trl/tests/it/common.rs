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

//! Comparing two finished runs' output folders: the `log_history` of `trainer_state.json`
//! step by step, `train_results.json` / `eval_results.json` key by key, and text outputs
//! (`predict_results.txt`) line by line; the tables `e2e` prints.

use std::collections::BTreeMap;
use std::path::Path;

use crate::json::Json;

/// Relative difference of `ours` against `theirs`: 0 when equal (two NaNs included),
/// infinite when only one is finite, else `|ours - theirs| / |theirs|`.
fn rel(ours: f64, theirs: f64) -> f64 {
    if ours == theirs || (ours.is_nan() && theirs.is_nan()) {
        return 0.0;
    }
    if !ours.is_finite() || !theirs.is_finite() {
        return f64::INFINITY;
    }
    (ours - theirs).abs() / theirs.abs().max(f64::MIN_POSITIVE)
}

/// Keys that measure time, not numbers of the run (TRL GRPO's `step_time` too): never
/// compared.
fn is_timing(key: &str) -> bool {
    key.ends_with("_runtime") || key.contains("per_second") || key == "step_time"
}

/// One logged training step of both sides.
#[derive(Debug, Clone, PartialEq)]
struct StepRow {
    step: i64,
    loss: (f64, f64),
    grad_norm: Option<(f64, f64)>,
    learning_rate: Option<(f64, f64)>,
    epoch: Option<(f64, f64)>,
}

impl StepRow {
    fn max_rel(&self) -> f64 {
        [
            Some(self.loss),
            self.grad_norm,
            self.learning_rate,
            self.epoch,
        ]
        .into_iter()
        .flatten()
        .map(|(a, b)| rel(a, b))
        .fold(0.0, f64::max)
    }
}

/// One final value of both sides (`place` names the file or log entry).
#[derive(Debug, Clone, PartialEq)]
struct MetricRow {
    place: String,
    key: String,
    ours: f64,
    theirs: f64,
}

/// The comparison of one case's two output folders.
#[derive(Debug, Default)]
pub(super) struct Comparison {
    steps: Vec<StepRow>,
    metrics: Vec<MetricRow>,
    /// Differences that fail the case whatever the numbers (a step logged by one side, a key
    /// one side writes and the other does not, a text output that differs).
    pub(super) problems: Vec<String>,
    /// Text outputs found equal.
    texts: Vec<String>,
}

impl Comparison {
    /// The number of compared training steps.
    pub(super) fn steps(&self) -> usize {
        self.steps.len()
    }

    /// The largest relative difference of any compared value.
    pub(super) fn max_rel(&self) -> f64 {
        let steps = self.steps.iter().map(StepRow::max_rel);
        let metrics = self.metrics.iter().map(|m| rel(m.ours, m.theirs));
        steps.chain(metrics).fold(0.0, f64::max)
    }

    /// The two tables and the problems.
    pub(super) fn render(&self) -> String {
        let mut out = String::from(
            "| step | loss ours | loss theirs | rel diff | grad_norm rel diff | lr rel diff |\n|---:|---:|---:|---:|---:|---:|\n",
        );
        let opt = |v: Option<(f64, f64)>| {
            v.map_or("—".to_string(), |(a, b)| format!("{:.1e}", rel(a, b)))
        };
        for r in &self.steps {
            out.push_str(&format!(
                "| {} | {} | {} | {:.1e} | {} | {} |\n",
                r.step,
                r.loss.0,
                r.loss.1,
                rel(r.loss.0, r.loss.1),
                opt(r.grad_norm),
                opt(r.learning_rate)
            ));
        }
        out.push_str("\n| metric | ours | theirs | rel diff |\n|---|---:|---:|---:|\n");
        for m in &self.metrics {
            out.push_str(&format!(
                "| {} {} | {} | {} | {:.1e} |\n",
                m.place,
                m.key,
                m.ours,
                m.theirs,
                rel(m.ours, m.theirs)
            ));
        }
        for t in &self.texts {
            out.push_str(&format!("{t}\n"));
        }
        for p in &self.problems {
            out.push_str(&format!("problem: {p}\n"));
        }
        out
    }
}

/// A JSON object's numbers (numbers, and the strings Python writes for non-finite ones).
fn numbers(obj: &BTreeMap<String, Json>) -> BTreeMap<String, f64> {
    obj.iter()
        .filter_map(|(k, v)| v.as_f64().map(|x| (k.clone(), x)))
        .collect()
}

/// Compares the numeric keys of two flat objects into `cmp`, timings left out.
fn compare_objects(
    place: &str,
    ours: &BTreeMap<String, f64>,
    theirs: &BTreeMap<String, f64>,
    skip: &[&str],
    cmp: &mut Comparison,
) {
    for (key, &o) in ours {
        if is_timing(key) || skip.contains(&key.as_str()) {
            continue;
        }
        match theirs.get(key) {
            Some(&t) => cmp.metrics.push(MetricRow {
                place: place.to_string(),
                key: key.clone(),
                ours: o,
                theirs: t,
            }),
            None => cmp
                .problems
                .push(format!("{place}: `{key}` = {o} is written by ours only")),
        }
    }
    for (key, t) in theirs {
        if !is_timing(key) && !skip.contains(&key.as_str()) && !ours.contains_key(key) {
            cmp.problems.push(format!(
                "{place}: `{key}` = {t} is written by upstream only"
            ));
        }
    }
}

fn read_json(path: &Path) -> Result<Json, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    Json::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// `trainer_state.json`'s `log_history` entries.
fn log_history(dir: &Path) -> Result<Vec<BTreeMap<String, Json>>, String> {
    let path = dir.join("trainer_state.json");
    let state = read_json(&path)?;
    let entries = state
        .get("log_history")
        .and_then(Json::as_array)
        .ok_or_else(|| format!("{}: no log_history array", path.display()))?;
    entries
        .iter()
        .map(|e| {
            e.as_object()
                .cloned()
                .ok_or_else(|| format!("{}: a log_history entry is not an object", path.display()))
        })
        .collect()
}

/// Compares two finished runs' output folders.
pub(super) fn compare_dirs(ours: &Path, theirs: &Path) -> Result<Comparison, String> {
    let mut cmp = Comparison::default();
    let (ours_log, theirs_log) = (log_history(ours)?, log_history(theirs)?);
    compare_logs(&ours_log, &theirs_log, &mut cmp);
    for file in ["train_results.json", "eval_results.json"] {
        let (o, t) = (ours.join(file), theirs.join(file));
        match (o.is_file(), t.is_file()) {
            (true, true) => {
                let num = |p: &Path| -> Result<BTreeMap<String, f64>, String> {
                    let j = read_json(p)?;
                    let obj = j
                        .as_object()
                        .ok_or_else(|| format!("{}: not a JSON object", p.display()))?;
                    Ok(numbers(obj))
                };
                compare_objects(file, &num(&o)?, &num(&t)?, &[], &mut cmp);
            }
            (false, false) => {}
            (mine, _) => cmp.problems.push(format!(
                "{file} is written by {} only",
                if mine { "ours" } else { "upstream" }
            )),
        }
    }
    compare_text(ours, theirs, "predict_results.txt", &mut cmp)?;
    Ok(cmp)
}

/// A text output of both runs (`file`), compared line for line; one written by one side
/// only is a problem.
fn compare_text(
    ours: &Path,
    theirs: &Path,
    file: &str,
    cmp: &mut Comparison,
) -> Result<(), String> {
    let (o, t) = (ours.join(file), theirs.join(file));
    let read =
        |p: &Path| std::fs::read_to_string(p).map_err(|e| format!("reading {}: {e}", p.display()));
    match (o.is_file(), t.is_file()) {
        (true, true) => {
            let (o, t) = (read(&o)?, read(&t)?);
            if let Some((i, (a, b))) = o
                .lines()
                .zip(t.lines())
                .enumerate()
                .find(|(_, (a, b))| a != b)
            {
                cmp.problems
                    .push(format!("{file} line {}: ours {a:?}, upstream {b:?}", i + 1));
            } else if o.lines().count() != t.lines().count() {
                cmp.problems.push(format!(
                    "{file}: ours has {} lines, upstream {}",
                    o.lines().count(),
                    t.lines().count()
                ));
            } else {
                cmp.texts
                    .push(format!("{file}: {} lines equal", o.lines().count()));
            }
        }
        (false, false) => {}
        (mine, _) => cmp.problems.push(format!(
            "{file} is written by {} only",
            if mine { "ours" } else { "upstream" }
        )),
    }
    Ok(())
}

/// Compares two `log_history`s: the training steps (entries with `loss`) by step, the
/// evaluation entries (`eval_loss`) by step, the end-of-training entry (`train_loss`).
fn compare_logs(
    ours: &[BTreeMap<String, Json>],
    theirs: &[BTreeMap<String, Json>],
    cmp: &mut Comparison,
) {
    type Entries = BTreeMap<i64, BTreeMap<String, f64>>;
    let split = |log: &[BTreeMap<String, Json>]| -> (Entries, Entries, Vec<BTreeMap<String, f64>>) {
        let (mut train, mut eval, mut end) = (Entries::new(), Entries::new(), Vec::new());
        for e in log {
            let n = numbers(e);
            let step = n.get("step").map_or(-1, |&s| s as i64);
            if n.contains_key("train_loss") {
                end.push(n);
            } else if n.contains_key("loss") {
                train.insert(step, n);
            } else if n.contains_key("eval_loss") {
                eval.insert(step, n);
            }
        }
        (train, eval, end)
    };
    let (o_train, o_eval, o_end) = split(ours);
    let (t_train, t_eval, t_end) = split(theirs);
    let pair = |o: &BTreeMap<String, f64>, t: &BTreeMap<String, f64>, k: &str| {
        o.get(k).copied().zip(t.get(k).copied())
    };
    let steps: std::collections::BTreeSet<i64> =
        o_train.keys().chain(t_train.keys()).copied().collect();
    for step in steps {
        match (o_train.get(&step), t_train.get(&step)) {
            (Some(o), Some(t)) => cmp.steps.push(StepRow {
                step,
                loss: (o["loss"], t["loss"]),
                grad_norm: pair(o, t, "grad_norm"),
                learning_rate: pair(o, t, "learning_rate"),
                epoch: pair(o, t, "epoch"),
            }),
            (Some(_), None) => cmp
                .problems
                .push(format!("step {step} is logged by ours only")),
            _ => cmp
                .problems
                .push(format!("step {step} is logged by upstream only")),
        }
    }
    let eval_steps: std::collections::BTreeSet<i64> =
        o_eval.keys().chain(t_eval.keys()).copied().collect();
    for step in eval_steps {
        match (o_eval.get(&step), t_eval.get(&step)) {
            (Some(o), Some(t)) => {
                compare_objects(&format!("log step {step}"), o, t, &["step"], cmp);
            }
            _ => cmp.problems.push(format!(
                "the evaluation at step {step} is logged by one side only"
            )),
        }
    }
    match (o_end.first(), t_end.first()) {
        (Some(o), Some(t)) => compare_objects("log end", o, t, &["step"], cmp),
        (None, None) => {}
        _ => cmp
            .problems
            .push("the end-of-training log entry is written by one side only".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::e2e::TOLERANCE;

    fn obj(text: &str) -> BTreeMap<String, Json> {
        Json::parse(text).unwrap().as_object().unwrap().clone()
    }

    #[test]
    fn relative_difference() {
        assert_eq!(rel(1.0, 1.0), 0.0);
        assert_eq!(rel(f64::NAN, f64::NAN), 0.0);
        assert_eq!(rel(f64::NAN, 1.0), f64::INFINITY);
        assert!((rel(1.000001, 1.0) - 1e-6).abs() < 1e-12);
        assert_eq!(rel(0.0, 0.0), 0.0);
    }

    #[test]
    fn compares_log_histories_by_step() {
        let ours = vec![
            obj(
                r#"{"step": 1, "loss": 2.0, "grad_norm": 1.0, "learning_rate": 0.001, "epoch": 0.1}"#,
            ),
            obj(
                r#"{"step": 2, "loss": 1.5, "grad_norm": 1.0, "learning_rate": 0.001, "epoch": 0.2}"#,
            ),
            obj(r#"{"step": 2, "eval_loss": 1.25, "eval_runtime": 3.0, "epoch": 0.2}"#),
            obj(
                r#"{"step": 2, "train_loss": 1.75, "train_runtime": 9.0, "total_flos": 5.0, "epoch": 0.2}"#,
            ),
        ];
        let mut theirs = ours.clone();
        theirs[1].insert("loss".into(), Json::Num(1.5 * (1.0 + 2e-6)));
        theirs[2].insert("eval_runtime".into(), Json::Num(1.0));
        let mut cmp = Comparison::default();
        compare_logs(&ours, &theirs, &mut cmp);
        assert!(cmp.problems.is_empty(), "{:?}", cmp.problems);
        assert_eq!(cmp.steps.len(), 2);
        assert_eq!(cmp.steps[0].max_rel(), 0.0);
        assert!(cmp.steps[1].max_rel() > TOLERANCE);
        // eval_loss and epoch at step 2, train_loss / total_flos / epoch at the end; no timings.
        let keys: Vec<String> = cmp
            .metrics
            .iter()
            .map(|m| format!("{} {}", m.place, m.key))
            .collect();
        assert_eq!(
            keys,
            [
                "log step 2 epoch",
                "log step 2 eval_loss",
                "log end epoch",
                "log end total_flos",
                "log end train_loss"
            ]
        );
        let table = cmp.render();
        assert!(
            table.contains("| 1 | 2 | 2 | 0.0e0 | 0.0e0 | 0.0e0 |"),
            "{table}"
        );

        let mut cmp = Comparison::default();
        compare_logs(&ours[..1], &ours[..2], &mut cmp);
        assert_eq!(cmp.problems, ["step 2 is logged by upstream only"]);
    }

    #[test]
    fn one_sided_keys_are_problems() {
        let ours = numbers(&obj(
            r#"{"train_loss": 1.0, "total_flos": 3.0, "train_runtime": 2.0}"#,
        ));
        let theirs = numbers(&obj(r#"{"train_loss": 1.0, "train_runtime": 5.0}"#));
        let mut cmp = Comparison::default();
        compare_objects("train_results.json", &ours, &theirs, &[], &mut cmp);
        assert_eq!(cmp.metrics.len(), 1);
        assert_eq!(cmp.problems.len(), 1);
        assert!(cmp.problems[0].contains("total_flos"));
    }
}

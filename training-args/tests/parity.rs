//! Parity with transformers 5.23.0: defaults, accepted/rejected combinations, `get_warmup_steps`,
//! `HfArgumentParser` command lines and JSON, for `TrainingArguments` and
//! `Seq2SeqTrainingArguments`, against the values that
//! `scripts/reference/training_args.py` records with the pinned Python packages.
//!
//! Values are compared field by field; numbers compare by value (upstream's float-typed step
//! fields may hold `500` or `500.0`), exactly otherwise. Fields whose upstream value depends on
//! the machine are listed in the reference's `env_dependent` and the cases avoid them.

use std::path::PathBuf;

use serde_json::Value;
use tchtrain_training_args::{
    Error, HfArgumentParser, IntervalStrategy, JsonDict, OptimizerNames, SchedulerType,
    Seq2SeqTrainingArguments, TrainingArguments, field_names, seq2seq_field_names,
};

fn reference_dir() -> PathBuf {
    let assets = std::env::var_os("TCHTRAIN_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../assets"));
    assets.join("reference/training_args")
}

fn reference() -> Value {
    let path = reference_dir().join("training_args.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "missing reference values {} ({e}); run `cargo xtask setup` (or `python scripts/setup_assets.py --out ASSETS --only-reference training_args`)",
            path.display()
        )
    });
    serde_json::from_str(&text).expect("reference JSON parses")
}

/// Replaces the `{REF}` placeholder with this machine's reference folder.
fn subst(v: &Value) -> Value {
    let dir = reference_dir().to_string_lossy().into_owned();
    match v {
        Value::String(s) => Value::String(s.replace("{REF}", &dir)),
        Value::Array(a) => Value::Array(a.iter().map(subst).collect()),
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), subst(v))).collect()),
        other => other.clone(),
    }
}

/// Equal as JSON values, numbers by value.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

/// Field-by-field differences between our `to_dict` and upstream's.
fn diff(ours: &JsonDict, theirs: &Value) -> Vec<String> {
    let theirs = subst(theirs);
    let theirs = theirs.as_object().expect("upstream to_dict is an object");
    let mut out = Vec::new();
    for (k, v) in theirs {
        match ours.get(k) {
            None => out.push(format!("{k}: missing (upstream {v})")),
            Some(o) if !same(o, v) => out.push(format!("{k}: ours {o}, upstream {v}")),
            _ => {}
        }
    }
    for k in ours.keys().filter(|k| !theirs.contains_key(*k)) {
        out.push(format!("{k}: not an upstream field"));
    }
    out
}

fn kwargs_map(v: &Value) -> JsonDict {
    subst(v).as_object().expect("kwargs object").clone()
}

#[test]
fn defaults_equal_upstream_to_dict_and_json_string() {
    let r = reference();
    let ours = TrainingArguments::new("out");
    let d = diff(&ours.to_dict(), &r["defaults"]["to_dict"]);
    assert!(d.is_empty(), "defaults differ:\n{}", d.join("\n"));
    let order: Vec<&str> = r["defaults"]["field_order"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let ours_order: Vec<&str> = tchtrain_training_args::field_names().collect();
    assert_eq!(ours_order, order, "field order");
    // Byte for byte: key order, Python float text (5e-05, 1e-08, 3.0), ints for step counts.
    assert_eq!(
        ours.to_json_string(),
        r["defaults"]["to_json_string"].as_str().unwrap()
    );
    let d = diff(
        &ours.to_sanitized_dict(),
        &r["defaults"]["to_sanitized_dict"],
    );
    assert!(d.is_empty(), "to_sanitized_dict differs:\n{}", d.join("\n"));
    // Default::default() is upstream's TrainingArguments() after __post_init__.
    let mut reparsed = TrainingArguments::default();
    assert!(reparsed.post_init().unwrap().is_empty());
    assert_eq!(reparsed, TrainingArguments::default());
    assert_eq!(
        TrainingArguments::default().output_dir.as_deref(),
        Some("trainer_output")
    );
}

#[test]
fn enums_hold_every_upstream_value() {
    let r = reference();
    let values = |name: &str| -> Vec<String> {
        r["enums"][name]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    };
    let strs = |v: Vec<&str>| v.into_iter().map(String::from).collect::<Vec<_>>();
    assert_eq!(
        strs(tchtrain_training_args::IntervalStrategy::values()),
        values("IntervalStrategy")
    );
    assert_eq!(
        strs(tchtrain_training_args::SaveStrategy::values()),
        values("SaveStrategy")
    );
    assert_eq!(
        strs(tchtrain_training_args::HubStrategy::values()),
        values("HubStrategy")
    );
    assert_eq!(strs(SchedulerType::values()), values("SchedulerType"));
    assert_eq!(SchedulerType::ALL.len(), 12);
    assert_eq!(strs(OptimizerNames::values()), values("OptimizerNames"));
    assert_eq!(
        strs(tchtrain_training_args::FsdpOption::values()),
        values("FSDPOption")
    );
    assert_eq!(
        strs(tchtrain_training_args::DebugOption::values()),
        values("DebugOption")
    );
    assert_eq!(
        strs(tchtrain_training_args::ParallelMode::values()),
        values("ParallelMode")
    );
    for name in values("OptimizerNames") {
        let o: OptimizerNames = name.parse().unwrap();
        assert_eq!(o.to_string(), name);
        assert_eq!(
            serde_json::to_value(o).unwrap(),
            Value::String(name.clone())
        );
        assert_eq!(
            o.ensure_supported().is_ok(),
            OptimizerNames::supported().contains(&o)
        );
    }
    let err = "adamw_torch_xla"
        .parse::<OptimizerNames>()
        .unwrap()
        .ensure_supported()
        .unwrap_err();
    assert!(matches!(err, Error::UnsupportedOptimizer { .. }), "{err}");
    assert!(err.to_string().contains("XLA"), "{err}");
    assert!(err.to_string().contains("adamw_torch_fused"), "{err}");
    let err = "cosin".parse::<SchedulerType>().unwrap_err();
    assert!(err.to_string().contains("`cosine`"), "{err}");
}

#[test]
fn combinations_accepted_and_rejected_as_upstream() {
    let r = reference();
    let mut failures = Vec::new();
    for case in r["combos"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let upstream_ok = case["ok"].as_bool().unwrap();
        let tchtrain_rejects = case["tchtrain_rejects"].as_bool().unwrap();
        let field = case["field"].as_str();
        let result = TrainingArguments::from_dict(kwargs_map(&case["kwargs"]));
        match (upstream_ok && !tchtrain_rejects, result) {
            (true, Ok(parsed)) => {
                let d = diff(&parsed.args.to_dict(), &case["to_dict"]);
                if !d.is_empty() {
                    failures.push(format!("{name}: to_dict differs:\n  {}", d.join("\n  ")));
                }
                for w in case["future_warnings"].as_array().unwrap() {
                    let old = w.as_str().unwrap().split('`').nth(1).unwrap();
                    if !parsed.warnings.iter().any(|x| x.field == old) {
                        failures.push(format!(
                            "{name}: upstream warns about `{old}`, we do not: {:?}",
                            parsed.warnings
                        ));
                    }
                }
            }
            (true, Err(e)) => failures.push(format!("{name}: upstream accepts, we reject: {e}")),
            (false, Ok(_)) => failures.push(format!(
                "{name}: upstream rejects ({}), we accept",
                case["error"]
            )),
            (false, Err(e)) => {
                if e.field() != field {
                    failures.push(format!(
                        "{name}: error names {:?}, expected {field:?}: {e}",
                        e.field()
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn get_warmup_steps_matches_upstream() {
    let r = reference();
    for case in r["warmup"].as_array().unwrap() {
        let mut args = TrainingArguments::new("out");
        args.warmup_steps = case["warmup_steps"].as_f64().unwrap();
        let n = case["num_training_steps"].as_u64().unwrap() as usize;
        assert_eq!(
            args.get_warmup_steps(n) as u64,
            case["result"].as_u64().unwrap(),
            "{case}"
        );
    }
}

#[test]
fn command_lines_parse_as_hf_argument_parser() {
    let r = reference();
    let parser = HfArgumentParser::new();
    let mut failures = Vec::new();
    for case in r["cli"].as_array().unwrap() {
        let argv: Vec<String> = subst(&case["argv"])
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        let shown = argv.join(" ");
        match (
            case["ok"].as_bool().unwrap(),
            parser.parse_args_into_dataclasses(&argv),
        ) {
            (true, Ok(parsed)) => {
                let d = diff(&parsed.args.to_dict(), &case["to_dict"]);
                if !d.is_empty() {
                    failures.push(format!("{shown}: to_dict differs:\n  {}", d.join("\n  ")));
                }
                if !case["v5_argv"].is_null() {
                    let alias = argv
                        .iter()
                        .find(|a| {
                            a.starts_with("--")
                                && !case["v5_argv"].as_array().unwrap().iter().any(|v| v == *a)
                        })
                        .unwrap();
                    if !parsed.warnings.iter().any(|w| alias.contains(&w.field)) {
                        failures.push(format!(
                            "{shown}: v4 alias {alias} gave no warning: {:?}",
                            parsed.warnings
                        ));
                    }
                }
            }
            (true, Err(e)) => failures.push(format!("{shown}: upstream accepts, we reject: {e}")),
            (false, Ok(_)) => failures.push(format!(
                "{shown}: upstream rejects ({}), we accept",
                case["error"]
            )),
            (false, Err(e)) => {
                if e.field().is_none() {
                    failures.push(format!("{shown}: error names no field or flag: {e}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn command_line_errors_explain_themselves() {
    let p = HfArgumentParser::new();
    let err = p
        .parse_args_into_dataclasses(["--max_stepz", "10"])
        .unwrap_err();
    assert!(
        matches!(&err, Error::UnknownArgument { suggestions, .. } if suggestions[0] == "--max_steps"),
        "{err}"
    );
    let err = p
        .parse_args_into_dataclasses(["--learning", "1e-4"])
        .unwrap_err();
    assert!(
        matches!(&err, Error::AmbiguousOption { matches, .. } if matches.len() == 2),
        "{err}"
    );
    let err = p
        .parse_args_into_dataclasses(["--lr_scheduler_type", "cosin"])
        .unwrap_err();
    assert_eq!(err.field(), Some("lr_scheduler_type"));
    assert!(err.to_string().contains("`cosine`"), "{err}");
    let err = p
        .parse_args_into_dataclasses(["--per_device_train_batch_size", "x"])
        .unwrap_err();
    assert_eq!(err.field(), Some("per_device_train_batch_size"));
    let Err(Error::HelpRequested(help)) = p.parse_args_into_dataclasses(["--bf16", "--help"])
    else {
        panic!("--help must give the help text");
    };
    for name in tchtrain_training_args::field_names() {
        assert!(help.contains(&format!("--{name} ")), "help lacks --{name}");
    }
    assert!(
        help.contains("The batch size per device for training. (default: 8)"),
        "{help}"
    );
    assert!(help.contains("--no_dataloader_pin_memory"));
    // Programs with their own flags take the rest.
    let (parsed, rest) = p
        .parse_known_args(["--model_name_or_path", "gpt2", "--seed", "3"])
        .unwrap();
    assert_eq!(parsed.args.seed, 3);
    assert_eq!(rest, ["--model_name_or_path", "gpt2"]);
}

#[test]
fn json_round_trips_and_reads_python_files() {
    let r = reference();
    for case in r["combos"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["ok"].as_bool().unwrap() && !c["tchtrain_rejects"].as_bool().unwrap())
    {
        let name = case["name"].as_str().unwrap();
        let parsed = TrainingArguments::from_dict(kwargs_map(&case["kwargs"])).unwrap();
        // Ours -> JSON -> ours.
        let text = parsed.args.to_json_string();
        let back = TrainingArguments::from_json_str(&text)
            .unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
        let mut expected = parsed.args.clone();
        expected.hub_token = None; // written masked, as upstream's to_dict does
        assert_eq!(back.args, expected, "{name}");
        // A training_args.json written by Python reads back to the same to_dict.
        let python_text = serde_json::to_string(&subst(&case["to_dict"])).unwrap();
        let from_python = TrainingArguments::from_json_str(&python_text)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let d = diff(&from_python.args.to_dict(), &case["to_dict"]);
        assert!(d.is_empty(), "{name}: {}", d.join("\n"));
        // Reading a finished config warns about nothing it did not already say.
        assert!(
            from_python
                .warnings
                .iter()
                .all(|w| w.field != "gradient_checkpointing"),
            "{name}: {:?}",
            from_python.warnings
        );
    }
    let dir = std::env::temp_dir().join(format!("tchtrain-training-args-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("training_args.json");
    let mut args = TrainingArguments::new("out");
    args.learning_rate = 3e-4;
    args.report_to = vec!["tensorboard".into()];
    args.to_json_file(&path).unwrap();
    assert_eq!(TrainingArguments::from_json_file(&path).unwrap().args, args);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_input_is_an_error_naming_the_field_never_a_panic() {
    assert!(matches!(
        TrainingArguments::from_json_str("{\"learning_rate\": "),
        Err(Error::Json(_))
    ));
    assert!(TrainingArguments::from_json_str("[1, 2]").is_err());
    let field_of = |json: &str| {
        TrainingArguments::from_json_str(json)
            .unwrap_err()
            .field()
            .map(String::from)
    };
    assert_eq!(
        field_of(r#"{"per_device_train_batch_size": "x"}"#).as_deref(),
        Some("per_device_train_batch_size")
    );
    assert_eq!(
        field_of(r#"{"per_device_train_batch_size": -2}"#).as_deref(),
        Some("per_device_train_batch_size")
    );
    assert_eq!(
        field_of(r#"{"lr_scheduler_type": "cosin"}"#).as_deref(),
        Some("lr_scheduler_type")
    );
    assert_eq!(field_of(r#"{"optim": 3}"#).as_deref(), Some("optim"));
    assert_eq!(
        field_of(r#"{"warmup_steps": -1}"#).as_deref(),
        Some("warmup_steps")
    );
    assert_eq!(
        field_of(r#"{"max_steps": 1.5}"#).as_deref(),
        Some("max_steps")
    );
    assert_eq!(
        field_of(r#"{"lr_scheduler_kwargs": "{not json"}"#).as_deref(),
        Some("lr_scheduler_kwargs")
    );
    assert_eq!(
        field_of(r#"{"accelerator_config": {"split_batch": true}}"#).as_deref(),
        Some("accelerator_config.split_batch")
    );
    assert_eq!(
        field_of(r#"{"fsdp": true, "fsdp_config": "/nonexistent/fsdp.json"}"#).as_deref(),
        Some("fsdp_config")
    );
    let err = TrainingArguments::from_json_str(r#"{"learning_rat": 1e-4}"#).unwrap_err();
    assert!(
        matches!(&err, Error::UnknownField { suggestions, .. } if suggestions[0] == "learning_rate"),
        "{err}"
    );
    let err = TrainingArguments::from_json_str(
        r#"{"eval_strategy": "steps", "evaluation_strategy": "epoch"}"#,
    )
    .unwrap_err();
    assert!(matches!(err, Error::AliasConflict { .. }), "{err}");
    // Every field with wrongly typed values: an error naming that field, or an accepted value.
    let bad = [
        serde_json::json!("zz"),
        serde_json::json!(-7),
        serde_json::json!({"x": [1]}),
        serde_json::json!([true]),
        serde_json::json!(1e300),
    ];
    for name in tchtrain_training_args::field_names() {
        for value in &bad {
            let mut map = JsonDict::new();
            map.insert(name.to_string(), value.clone());
            if let Err(e) = TrainingArguments::from_dict(map) {
                let f = e
                    .field()
                    .unwrap_or_else(|| panic!("{name} = {value}: error names no field: {e}"));
                assert!(
                    f.starts_with(name) || f == "logging_strategy" || f == "eval_strategy",
                    "{name} = {value}: error names {f}: {e}"
                );
            }
        }
    }
}

#[test]
fn v4_aliases_are_accepted_with_warnings() {
    let p = TrainingArguments::from_json_str(
        r#"{"output_dir": "o", "evaluation_strategy": "epoch", "warmup_ratio": 0.1, "group_by_length": true,
            "gradient_checkpointing": true, "logging_dir": "runs/x"}"#,
    )
    .unwrap();
    assert_eq!(p.args.eval_strategy, IntervalStrategy::Epoch);
    assert_eq!(p.args.warmup_steps, 0.1);
    assert_eq!(p.args.train_sampling_strategy, "group_by_length");
    assert!(p.args.activation_checkpointing && p.args.gradient_checkpointing);
    assert_eq!(p.logging_dir.as_deref(), Some("runs/x"));
    let fields: Vec<&str> = p.warnings.iter().map(|w| w.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "evaluation_strategy",
            "warmup_ratio",
            "group_by_length",
            "gradient_checkpointing",
            "logging_dir"
        ]
    );
    assert!(TrainingArguments::from_json_str(r#"{"warmup_ratio": 1.0}"#).is_err());
}

#[test]
fn setters_follow_upstream_keyword_defaults() {
    use tchtrain_training_args::{SetEvaluate, SetLogging, SetLrScheduler, SetOptimizer, SetSave};
    let args = TrainingArguments::new("working_dir")
        .set_evaluate(SetEvaluate {
            strategy: IntervalStrategy::Steps,
            steps: 100.0,
            ..Default::default()
        })
        .unwrap()
        .set_optimizer(SetOptimizer {
            beta1: 0.8,
            ..Default::default()
        })
        .set_lr_scheduler(SetLrScheduler {
            name: SchedulerType::Cosine,
            warmup_steps: 0.05,
            ..Default::default()
        })
        .set_logging(SetLogging {
            steps: 100.0,
            report_to: vec!["none".into()],
            ..Default::default()
        })
        .unwrap();
    assert_eq!(args.eval_steps, Some(100.0));
    assert!(args.do_eval);
    assert_eq!(args.optim, OptimizerNames::AdamwTorch); // set_optimizer's keyword default
    assert_eq!(args.adam_beta1, 0.8);
    assert_eq!(args.get_warmup_steps(1000), 50);
    assert!(!args.logging_nan_inf_filter); // set_logging's keyword default is False
    assert!(args.report_to.is_empty());
    let err = TrainingArguments::new("d")
        .set_save(SetSave {
            steps: 0.0,
            ..Default::default()
        })
        .unwrap_err();
    assert_eq!(err.field(), Some("save_strategy"));
}

// ------------------------------------------------------------- Seq2SeqTrainingArguments

fn seq2seq_reference() -> Value {
    reference()["seq2seq"].clone()
}

fn strings(v: &Value) -> Vec<String> {
    subst(v)
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn seq2seq_defaults_and_json_equal_upstream() {
    let r = seq2seq_reference();
    let ours = Seq2SeqTrainingArguments::new("out");
    let d = diff(&ours.to_dict(), &r["defaults"]["to_dict"]);
    assert!(d.is_empty(), "defaults differ:\n{}", d.join("\n"));
    // Upstream's to_dict order: every TrainingArguments field, then the five after `local_rank`.
    let ours_order: Vec<&str> = field_names().chain(seq2seq_field_names()).collect();
    assert_eq!(ours_order, strings(&r["defaults"]["field_order"]));
    assert_eq!(
        seq2seq_field_names().collect::<Vec<_>>(),
        [
            "sortish_sampler",
            "predict_with_generate",
            "generation_max_length",
            "generation_num_beams",
            "generation_config"
        ]
    );
    assert_eq!(
        ours.to_json_string(),
        r["defaults"]["to_json_string"].as_str().unwrap()
    );
    let d = diff(
        &ours.to_sanitized_dict(),
        &r["defaults"]["to_sanitized_dict"],
    );
    assert!(d.is_empty(), "to_sanitized_dict differs:\n{}", d.join("\n"));
    // Default::default() is upstream's Seq2SeqTrainingArguments() after __post_init__.
    let mut reparsed = Seq2SeqTrainingArguments::default();
    assert!(reparsed.post_init().unwrap().is_empty());
    assert_eq!(reparsed, Seq2SeqTrainingArguments::default());
    assert_eq!(
        Seq2SeqTrainingArguments::default().base,
        TrainingArguments::default()
    );
    let ours = Seq2SeqTrainingArguments::default();
    assert!(!ours.sortish_sampler && !ours.predict_with_generate);
    assert_eq!(
        (
            ours.generation_max_length,
            ours.generation_num_beams,
            &ours.generation_config
        ),
        (None, None, &None)
    );

    // All five set (generation_config a path): byte for byte.
    let mut set = Seq2SeqTrainingArguments::new("out");
    set.sortish_sampler = true;
    set.predict_with_generate = true;
    set.generation_max_length = Some(64);
    set.generation_num_beams = Some(4);
    set.generation_config = Some(Value::String("gen_dir".into()));
    assert!(set.post_init().unwrap().is_empty());
    assert_eq!(
        set.to_json_string(),
        r["set"]["to_json_string"].as_str().unwrap()
    );
    let d = diff(&set.to_sanitized_dict(), &r["set"]["to_sanitized_dict"]);
    assert!(d.is_empty(), "to_sanitized_dict differs:\n{}", d.join("\n"));
    // A JSON object is written as given; sanitized as Python's str() of the dict.
    set.generation_config = Some(serde_json::json!({"max_length": 3, "num_beams": 2}));
    assert_eq!(
        set.to_dict()["generation_config"],
        serde_json::json!({"max_length": 3, "num_beams": 2})
    );
    assert_eq!(
        set.to_sanitized_dict()["generation_config"],
        "{'max_length': 3, 'num_beams': 2}"
    );
    assert!(set.to_json_string().ends_with(
        "\"generation_config\": {\n    \"max_length\": 3,\n    \"num_beams\": 2\n  }\n}"
    ));
}

#[test]
fn seq2seq_combinations_accepted_and_rejected_as_upstream() {
    let r = seq2seq_reference();
    let mut failures = Vec::new();
    for case in r["combos"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let upstream_ok = case["ok"].as_bool().unwrap();
        let tchtrain_rejects = case["tchtrain_rejects"].as_bool().unwrap();
        let field = case["field"].as_str();
        let result = Seq2SeqTrainingArguments::from_dict(kwargs_map(&case["kwargs"]));
        match (upstream_ok && !tchtrain_rejects, result) {
            (true, Ok(parsed)) => {
                let d = diff(&parsed.args.to_dict(), &case["to_dict"]);
                if !d.is_empty() {
                    failures.push(format!("{name}: to_dict differs:\n  {}", d.join("\n  ")));
                }
            }
            (true, Err(e)) => failures.push(format!("{name}: upstream accepts, we reject: {e}")),
            (false, Ok(_)) => failures.push(format!(
                "{name}: {} rejects ({}), we accept",
                if tchtrain_rejects {
                    "tchtrain"
                } else {
                    "upstream"
                },
                case["error"]
            )),
            (false, Err(e)) => {
                if e.field() != field {
                    failures.push(format!(
                        "{name}: error names {:?}, expected {field:?}: {e}",
                        e.field()
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn seq2seq_command_lines_parse_as_hf_argument_parser() {
    let r = seq2seq_reference();
    let parser = HfArgumentParser::for_seq2seq();
    let mut failures = Vec::new();
    for case in r["cli"].as_array().unwrap() {
        let argv = strings(&case["argv"]);
        let shown = argv.join(" ");
        let tchtrain_rejects = case["tchtrain_rejects"].as_bool().unwrap();
        match (
            case["ok"].as_bool().unwrap() && !tchtrain_rejects,
            parser.parse_seq2seq_args_into_dataclasses(&argv),
        ) {
            (true, Ok(parsed)) => {
                let d = diff(&parsed.args.to_dict(), &case["to_dict"]);
                if !d.is_empty() {
                    failures.push(format!("{shown}: to_dict differs:\n  {}", d.join("\n  ")));
                }
            }
            (true, Err(e)) => failures.push(format!("{shown}: upstream accepts, we reject: {e}")),
            (false, Ok(_)) => failures.push(format!(
                "{shown}: {} rejects ({}), we accept",
                if tchtrain_rejects {
                    "tchtrain"
                } else {
                    "upstream"
                },
                case["error"]
            )),
            (false, Err(e)) => match (e.field(), case["field"].as_str()) {
                (None, _) => failures.push(format!("{shown}: error names no field or flag: {e}")),
                (Some(ours), Some(want)) if ours != want => {
                    failures.push(format!("{shown}: error names {ours}, expected {want}: {e}"))
                }
                _ => {}
            },
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn seq2seq_command_line_help_and_errors() {
    let p = HfArgumentParser::for_seq2seq();
    let Err(Error::HelpRequested(help)) = p.parse_seq2seq_args_into_dataclasses(["--help"]) else {
        panic!("--help must give the help text");
    };
    assert!(
        help.contains("transformers.Seq2SeqTrainingArguments"),
        "{help}"
    );
    for name in field_names().chain(seq2seq_field_names()) {
        assert!(help.contains(&format!("--{name} ")), "help lacks --{name}");
    }
    for line in [
        "--sortish_sampler [SORTISH_SAMPLER]",
        "--predict_with_generate [PREDICT_WITH_GENERATE]",
        "--generation_max_length GENERATION_MAX_LENGTH",
        "--generation_num_beams GENERATION_NUM_BEAMS",
        "--generation_config GENERATION_CONFIG",
    ] {
        assert!(help.contains(line), "help lacks {line:?}:\n{help}");
    }
    // Upstream's help strings and defaults (the text is wrapped, so compared word by word).
    let words = help.split_whitespace().collect::<Vec<_>>().join(" ");
    for text in [
        "Whether to use SortishSampler or not. (default: False)",
        "Whether to use generate to calculate generative metrics (ROUGE, BLEU). (default: False)",
        "The `max_length` to use on each evaluation loop when `predict_with_generate=True`. Will default to \
         the `max_length` value of the model configuration. (default: None)",
        "Model id, file path or url pointing to a GenerationConfig json file, to use during prediction. \
         (default: None)",
    ] {
        assert!(words.contains(text), "help lacks {text:?}:\n{help}");
    }
    // The five come right after local_rank, as upstream's --help lists them.
    let at = |flag: &str| help.find(&format!("  --{flag} ")).unwrap();
    assert!(at("local_rank") < at("sortish_sampler"));
    assert!(at("sortish_sampler") < at("predict_with_generate"));
    assert!(at("generation_num_beams") < at("generation_config"));
    // The TrainingArguments parser knows none of them.
    let base = HfArgumentParser::new();
    assert!(
        !base
            .format_help("train")
            .contains("--predict_with_generate")
    );
    let err = base
        .parse_seq2seq_args_into_dataclasses(["--predict_with_generate"])
        .unwrap_err();
    assert!(matches!(err, Error::UnknownArgument { .. }), "{err}");
    // A seq2seq parser read into TrainingArguments: no silent drop of a seq2seq flag.
    let err = p
        .parse_args_into_dataclasses(["--predict_with_generate"])
        .unwrap_err();
    assert_eq!(err.field(), Some("predict_with_generate"));
    assert!(
        err.to_string()
            .contains("parse_seq2seq_args_into_dataclasses"),
        "{err}"
    );
    assert_eq!(
        p.parse_args_into_dataclasses(["--seed", "3"])
            .unwrap()
            .args
            .seed,
        3
    );

    let err = p
        .parse_seq2seq_args_into_dataclasses(["--generation_num_beams", "0"])
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::OutOfRange {
                field: "generation_num_beams",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("at least 1"), "{err}");
    let err = p
        .parse_seq2seq_args_into_dataclasses(["--generation_max_length", "x"])
        .unwrap_err();
    assert_eq!(err.field(), Some("generation_max_length"));
    assert!(err.to_string().contains("invalid int value"), "{err}");
    let err = p
        .parse_seq2seq_args_into_dataclasses(["--predict_with_generate", "maybe"])
        .unwrap_err();
    assert_eq!(err.field(), Some("predict_with_generate"));
    let err = p
        .parse_seq2seq_args_into_dataclasses(["--predict_with_genrate"])
        .unwrap_err();
    assert!(
        matches!(&err, Error::UnknownArgument { suggestions, .. } if suggestions[0] == "--predict_with_generate"),
        "{err}"
    );
    // Programs with their own flags take the rest; v4 aliases still warn.
    let (parsed, rest) = p
        .parse_seq2seq_known_args([
            "--model_name_or_path",
            "t5-small",
            "--predict_with_generate",
            "--evaluation_strategy",
            "epoch",
            "--generation_config",
            "{\"not\": \"parsed\"}",
        ])
        .unwrap();
    assert!(parsed.args.predict_with_generate);
    assert_eq!(parsed.args.eval_strategy, IntervalStrategy::Epoch);
    assert_eq!(parsed.warnings[0].field, "evaluation_strategy");
    assert_eq!(rest, ["--model_name_or_path", "t5-small"]);
    // On the command line generation_config is a path (upstream's type is pathlib.Path).
    assert_eq!(
        parsed.args.generation_config,
        Some(Value::String("{\"not\": \"parsed\"}".into()))
    );
}

#[test]
fn seq2seq_json_round_trips_and_reads_python_files() {
    let r = seq2seq_reference();
    for case in r["combos"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["ok"].as_bool().unwrap() && !c["tchtrain_rejects"].as_bool().unwrap())
    {
        let name = case["name"].as_str().unwrap();
        let parsed = Seq2SeqTrainingArguments::from_dict(kwargs_map(&case["kwargs"])).unwrap();
        let text = parsed.args.to_json_string();
        let back = Seq2SeqTrainingArguments::from_json_str(&text)
            .unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
        assert_eq!(back.args, parsed.args, "{name}");
        let python_text = serde_json::to_string(&subst(&case["to_dict"])).unwrap();
        let from_python = Seq2SeqTrainingArguments::from_json_str(&python_text)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let d = diff(&from_python.args.to_dict(), &case["to_dict"]);
        assert!(d.is_empty(), "{name}: {}", d.join("\n"));
    }
    // Upstream writes a GenerationConfig object as its to_dict(); that file reads back.
    let object = &r["generation_config_object"]["to_dict"];
    let parsed =
        Seq2SeqTrainingArguments::from_json_str(&serde_json::to_string(object).unwrap()).unwrap();
    let d = diff(&parsed.args.to_dict(), object);
    assert!(d.is_empty(), "{}", d.join("\n"));
    let config = parsed.args.generation_config.as_ref().unwrap();
    assert_eq!(config["max_length"], 32);
    assert_eq!(config["temperature"], 0.7);
    // A TrainingArguments document reads with the five at their defaults.
    let plain =
        Seq2SeqTrainingArguments::from_json_str(&TrainingArguments::new("o").to_json_string())
            .unwrap();
    assert_eq!(plain.args, Seq2SeqTrainingArguments::new("o"));

    let dir = std::env::temp_dir().join(format!("tchtrain-seq2seq-args-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("training_args.json");
    let mut args = Seq2SeqTrainingArguments::new("out");
    args.predict_with_generate = true;
    args.generation_num_beams = Some(2);
    args.generation_config = Some(serde_json::json!({"max_new_tokens": 8, "do_sample": false}));
    args.to_json_file(&path).unwrap();
    assert_eq!(
        Seq2SeqTrainingArguments::from_json_file(&path)
            .unwrap()
            .args,
        args
    );
    assert_eq!(
        HfArgumentParser::for_seq2seq()
            .parse_seq2seq_json_file(&path)
            .unwrap()
            .args,
        args
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn seq2seq_from_training_arguments_and_deref() {
    let mut base = TrainingArguments::new("out");
    base.learning_rate = 3e-4;
    let mut args = Seq2SeqTrainingArguments::from(base.clone());
    assert_eq!(args.base, base);
    assert_eq!(args.learning_rate, 3e-4); // Deref
    args.num_train_epochs = 2.0; // DerefMut
    args.generation_max_length = Some(32);
    args.post_init().unwrap();
    assert_eq!(args.base.num_train_epochs, 2.0);
    assert_eq!(args.to_dict()["learning_rate"], 3e-4);
    assert_eq!(args.to_dict()["generation_max_length"], 32);
    // post_init checks the five as well as the base.
    args.generation_num_beams = Some(0);
    assert_eq!(
        args.post_init().unwrap_err().field(),
        Some("generation_num_beams")
    );
    args.generation_num_beams = None;
    args.generation_config = Some(serde_json::json!(true));
    assert_eq!(
        args.validate_args().unwrap_err().field(),
        Some("generation_config")
    );
    args.generation_config = Some(Value::Null);
    args.post_init().unwrap();
    assert_eq!(args.generation_config, None);
    args.logging_steps = 0.0;
    assert_eq!(
        args.post_init().unwrap_err().field(),
        Some("logging_strategy")
    );
}

#[test]
fn seq2seq_bad_input_is_an_error_naming_the_field() {
    let field_of = |json: &str| {
        Seq2SeqTrainingArguments::from_json_str(json)
            .unwrap_err()
            .field()
            .map(String::from)
    };
    for (json, field) in [
        (
            r#"{"predict_with_generate": "yes"}"#,
            "predict_with_generate",
        ),
        (r#"{"sortish_sampler": 1}"#, "sortish_sampler"),
        (r#"{"generation_num_beams": "4"}"#, "generation_num_beams"),
        (r#"{"generation_num_beams": 4.0}"#, "generation_num_beams"),
        (r#"{"generation_max_length": 0}"#, "generation_max_length"),
        (
            r#"{"generation_max_length": true}"#,
            "generation_max_length",
        ),
        (r#"{"generation_config": 3}"#, "generation_config"),
        (r#"{"generation_config": ["gen"]}"#, "generation_config"),
        (
            r#"{"per_device_train_batch_size": "x"}"#,
            "per_device_train_batch_size",
        ),
    ] {
        assert_eq!(field_of(json).as_deref(), Some(field), "{json}");
    }
    let err =
        Seq2SeqTrainingArguments::from_json_str(r#"{"generation_max_length": -1}"#).unwrap_err();
    assert!(err.to_string().contains("must be at least 1"), "{err}");
    assert!(err.to_string().contains("leave it unset"), "{err}");
    let err =
        Seq2SeqTrainingArguments::from_json_str(r#"{"generation_num_beams": "4"}"#).unwrap_err();
    assert!(err.to_string().contains("whole number"), "{err}");
    let err =
        Seq2SeqTrainingArguments::from_json_str(r#"{"predict_with_generat": true}"#).unwrap_err();
    assert!(
        matches!(&err, Error::UnknownField { suggestions, .. } if suggestions[0] == "predict_with_generate"),
        "{err}"
    );
    let err = Seq2SeqTrainingArguments::from_json_str(r#"{"learning_rat": 1e-4}"#).unwrap_err();
    assert!(
        matches!(&err, Error::UnknownField { suggestions, .. } if suggestions[0] == "learning_rate"),
        "{err}"
    );
    assert!(Seq2SeqTrainingArguments::from_json_str("[1]").is_err());
    assert!(matches!(
        Seq2SeqTrainingArguments::from_json_str("{\"predict_with_generate\": "),
        Err(Error::Json(_))
    ));
    // Every seq2seq field with wrongly typed values: an error naming that field, or accepted.
    let bad = [
        serde_json::json!("zz"),
        serde_json::json!(-7),
        serde_json::json!({"x": [1]}),
        serde_json::json!([true]),
        serde_json::json!(1e300),
    ];
    for name in seq2seq_field_names() {
        for value in &bad {
            let mut map = JsonDict::new();
            map.insert(name.to_string(), value.clone());
            if let Err(e) = Seq2SeqTrainingArguments::from_dict(map) {
                assert_eq!(e.field(), Some(name), "{name} = {value}: {e}");
            }
        }
    }
}

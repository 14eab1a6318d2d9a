//! The example scripts' command lines against upstream's: every field of every upstream
//! script's `ModelArguments` / `DataTrainingArguments` (the list in
//! `upstream_script_flags.json`, taken from the scripts' source: names, types, defaults) is
//! accepted, or refused by an error naming it. And the parser is `HfArgumentParser`'s:
//! `--no_<flag>`, abbreviations, did-you-mean, required fields, `script.json` as the only
//! argument.

use std::path::Path;

use serde_json::Value;
use tchtrain_examples::{
    Error, run_classification, run_clm, run_mlm, run_ner, run_summarization, run_translation,
};
use tchtrain_testing::TempDir;

/// Parses `argv` with the named script's parser; `Ok(())` when accepted.
fn parse(script: &str, argv: &[String]) -> Result<(), Error> {
    match script {
        "run_clm" => run_clm::parse_args(argv).map(drop),
        "run_mlm" => run_mlm::parse_args(argv).map(drop),
        "run_classification" => run_classification::parse_args(argv).map(drop),
        "run_ner" => run_ner::parse_args(argv).map(drop),
        "run_translation" => run_translation::parse_args(argv).map(drop),
        "run_summarization" => run_summarization::parse_args(argv).map(drop),
        other => panic!("no script {other}"),
    }
}

/// What each script needs to get past upstream's `__post_init__` checks.
fn base(script: &str) -> Vec<String> {
    let mut argv = vec!["--output_dir", "out", "--model_name_or_path", "m"];
    argv.extend(match script {
        "run_translation" => &[
            "--source_lang",
            "en",
            "--target_lang",
            "de",
            "--train_file",
            "t.json",
        ][..],
        "run_summarization" => &["--train_file", "t.json"][..],
        _ => &[][..],
    });
    argv.into_iter().map(String::from).collect()
}

/// A value other than the default for an upstream field.
fn value_for(field: &Value) -> Option<String> {
    let default = &field["default"];
    if let Some(choices) = field["choices"].as_array() {
        let pick = choices.iter().find(|c| *c != default)?;
        return pick.as_str().map(String::from);
    }
    let ty = field["type"].as_str().unwrap_or("str");
    Some(match ty {
        "bool" => (default != &Value::Bool(true)).to_string(),
        "int" => "3".into(),
        "float" => "0.5".into(),
        _ if field["name"].as_str().is_some_and(|n| n.ends_with("_file")) => "x.json".into(),
        _ => "x".into(),
    })
}

#[test]
fn every_upstream_flag_is_accepted_or_refused_by_name() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/upstream_script_flags.json");
    let list: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let scripts = list["scripts"].as_object().unwrap();
    assert_eq!(scripts.len(), 6);
    let (mut accepted, mut refused) = (Vec::new(), Vec::new());
    for (script, classes) in scripts {
        for class in ["ModelArguments", "DataTrainingArguments"] {
            let fields = classes[class]
                .as_array()
                .unwrap_or_else(|| panic!("{script} {class}"));
            assert!(!fields.is_empty());
            for field in fields {
                let name = field["name"].as_str().unwrap();
                let Some(value) = value_for(field) else {
                    continue;
                };
                let mut argv = base(script);
                // Replace the base's value when the walked flag is one of them.
                if let Some(i) = argv.iter().position(|a| *a == format!("--{name}")) {
                    argv.drain(i..i + 2);
                }
                argv.extend([format!("--{name}"), value.clone()]);
                match parse(script, &argv) {
                    Ok(()) => accepted.push(format!("{script} --{name}")),
                    Err(Error::InvalidFlag { flag, detail }) if flag == name => {
                        assert!(detail.len() > 20, "{script} --{name}: a reason: {detail}");
                        refused.push(format!("{script} --{name}: {detail}"));
                    }
                    Err(e) => panic!(
                        "{script} --{name} {value}: neither accepted nor refused by name: {e}"
                    ),
                }
            }
        }
    }
    eprintln!(
        "accepted {} flags, refused {}:",
        accepted.len(),
        refused.len()
    );
    for r in &refused {
        eprintln!("  {r}");
    }
    // The flags that cannot apply are refused, not ignored.
    for must in [
        "run_clm --trust_remote_code",
        "run_clm --model_type",
        "run_clm --use_fast_tokenizer",
        "run_classification --trust_remote_code",
        "run_ner --trust_remote_code",
        "run_translation --trust_remote_code",
    ] {
        assert!(
            refused.iter().any(|r| r.starts_with(&format!("{must}:"))),
            "{must} should be refused"
        );
    }
    assert!(accepted.len() > 100, "{accepted:?}");
}

#[test]
fn script_flags_parse_as_hf_argument_parser_does() {
    let out = ["--output_dir", "o"];
    // `--no_<flag>` for a true-by-default bool, and a prefix abbreviation.
    let (clm, _) = run_clm::parse_args(out.iter().copied().chain([
        "--no_keep_linebreaks",
        "--block_si",
        "32",
    ]))
    .unwrap();
    assert!(!clm.keep_linebreaks);
    assert_eq!(clm.block_size, Some(32));
    assert_eq!(clm.model_revision, "main");
    assert_eq!(clm.validation_split_percentage, 5);
    // An ambiguous prefix (`--max_` is max_train_samples, max_eval_samples, max_steps, ...).
    let err = run_clm::parse_args(out.iter().copied().chain(["--max_", "3"])).unwrap_err();
    assert!(err.to_string().contains("ambiguous option"), "{err}");
    // Did-you-mean across the script's and TrainingArguments' flags.
    let err = run_clm::parse_args(out.iter().copied().chain(["--blok_size", "3"])).unwrap_err();
    assert!(err.to_string().contains("--block_size"), "{err}");
    // argparse's required field (run_classification's model_name_or_path has no default).
    let err = run_classification::parse_args(out).unwrap_err();
    assert!(
        err.to_string()
            .contains("the following arguments are required: --model_name_or_path"),
        "{err}"
    );
    // `Optional[bool] = None` takes a value: upstream gives it no `nargs="?"`.
    let err = run_summarization::parse_args(
        out.iter()
            .copied()
            .chain(["--model_name_or_path", "m", "--train_file", "t.json"])
            .chain(["--resize_position_embeddings"]),
    )
    .unwrap_err();
    assert!(err.to_string().contains("expected one argument"), "{err}");
    // `--help` lists the script's dataclasses before TrainingArguments.
    let help = run_clm::parse_args(["--help"]).unwrap_err().to_string();
    for needle in [
        "run_clm:",
        "--keep_linebreaks",
        "--no_keep_linebreaks",
        "--dataset_name",
        "--use_peft",
        "--per_device_train_batch_size",
    ] {
        assert!(help.contains(needle), "{needle} in the help");
    }
    assert!(help.find("--block_size") < help.find("--per_device_train_batch_size"));
}

#[test]
fn a_json_file_as_the_only_argument_is_read_as_parse_json_file() {
    let dir = TempDir::new("script-json");
    let file = dir.path().join("args.json");
    std::fs::write(
        &file,
        r#"{"model_name_or_path": "m", "block_size": 16, "keep_linebreaks": false,
            "output_dir": "o", "learning_rate": 0.001, "use_peft": true, "lora_r": 4,
            "lora_target_modules": ["q_proj", "v_proj"], "dtype": null}"#,
    )
    .unwrap();
    let (clm, training) = run_clm::parse_args([file.display().to_string()]).unwrap();
    assert_eq!(clm.block_size, Some(16));
    assert!(!clm.keep_linebreaks);
    assert_eq!(clm.peft.lora_r, 4);
    assert_eq!(
        clm.peft.lora_target_modules.as_deref(),
        Some(&["q_proj".to_string(), "v_proj".to_string()][..])
    );
    assert_eq!(training.learning_rate, 0.001);
    // A key no dataclass has is an error (upstream's `allow_extra_keys=False`).
    std::fs::write(&file, r#"{"output_dir": "o", "blok_size": 16}"#).unwrap();
    let err = run_clm::parse_args([file.display().to_string()]).unwrap_err();
    assert!(err.to_string().contains("blok_size"), "{err}");
    // A value of the wrong type names its field.
    std::fs::write(&file, r#"{"output_dir": "o", "block_size": "sixteen"}"#).unwrap();
    let err = run_clm::parse_args([file.display().to_string()]).unwrap_err();
    assert!(err.to_string().contains("block_size"), "{err}");
}

//! Every collator against transformers 5.23 on the real tokenizers of the assets folder:
//! identical output tensors (values, dtype, shape, key order) for the rows written by
//! `scripts/reference/collators.py`, MLM masks identical for fixed seeds (the collator's own
//! generator) and after `tch::manual_seed` (the global one), and typed errors for bad input.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;
use tch::{Kind, Tensor};
use tchtrain_collators::{
    DataCollator, DataCollatorForLanguageModeling, DataCollatorForMultipleChoice,
    DataCollatorForSeq2Seq, DataCollatorForTokenClassification, DataCollatorWithFlattening,
    DataCollatorWithPadding, DecoderStart, Error, Feature, Label, LanguageModelingOptions,
    MultipleChoiceFeature, PaddingSide, PaddingStrategy, TokenizerInfo, TorchGenerator,
    default_data_collator,
};
use tokenizers::Tokenizer;

fn assets_dir() -> PathBuf {
    std::env::var_os("TCHTRAIN_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../assets"))
}

fn missing(path: &std::path::Path) -> String {
    format!(
        "{} is missing: run `cargo xtask setup` to fetch the assets and generate the reference values",
        path.display()
    )
}

struct Reference {
    json: Value,
    tensors: HashMap<String, Tensor>,
}

fn reference() -> Result<Reference> {
    let dir = assets_dir().join("reference/collators");
    let json_path = dir.join("collators.json");
    let text = std::fs::read_to_string(&json_path).with_context(|| missing(&json_path))?;
    let st = dir.join("collators.safetensors");
    let tensors = Tensor::read_safetensors(&st)
        .with_context(|| missing(&st))?
        .into_iter()
        .collect();
    Ok(Reference {
        json: serde_json::from_str(&text)?,
        tensors,
    })
}

/// The three tokenizers: BERT WordPiece and Llama BPE from their folders, GPT-2 built
/// from vocab.json + merges.txt with its pad token set to eos (as the reference does).
fn tokenizers() -> Result<HashMap<&'static str, (TokenizerInfo, Tokenizer)>> {
    let a = assets_dir();
    let mut out = HashMap::new();
    for (name, dir) in [("bert", "minilm"), ("llama", "smollm2-135m")] {
        let path = a.join(dir);
        ensure!(
            path.join("tokenizer.json").is_file(),
            missing(&path.join("tokenizer.json"))
        );
        let mut tokenizer =
            Tokenizer::from_file(path.join("tokenizer.json")).map_err(anyhow::Error::msg)?;
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(None)
            .map_err(anyhow::Error::msg)?;
        let config = tchtrain_collators::read_tokenizer_config(&path)?;
        let info = TokenizerInfo::from_tokenizer_config(&tokenizer, &config);
        out.insert(name, (info, tokenizer));
    }
    let vocab = a.join("gpt2-tokenizer/vocab.json");
    let merges = a.join("gpt2-tokenizer/merges.txt");
    ensure!(vocab.is_file(), missing(&vocab));
    let bpe =
        tokenizers::models::bpe::BPE::from_file(vocab.to_str().unwrap(), merges.to_str().unwrap())
            .build()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut gpt2 = Tokenizer::new(bpe);
    gpt2.with_pre_tokenizer(Some(
        tokenizers::pre_tokenizers::byte_level::ByteLevel::default().add_prefix_space(false),
    ));
    let mut info = TokenizerInfo::from_tokenizer(&gpt2);
    let eos = i64::from(gpt2.token_to_id("<|endoftext|>").context("gpt2 eos")?);
    info.pad_token_id = Some(eos);
    info.all_special_ids = [eos].into();
    out.insert("gpt2", (info, gpt2));
    Ok(out)
}

fn ints(v: &Value) -> Vec<i64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_i64().expect("int"))
        .collect()
}

fn label_of(v: &Value) -> Label {
    match v {
        Value::Number(n) if n.is_i64() => Label::Class(n.as_i64().unwrap()),
        Value::Number(n) => Label::Value(n.as_f64().unwrap()),
        Value::Array(a) if a.iter().all(|x| x.is_i64()) => Label::Ids(ints(v)),
        Value::Array(a) => Label::Values(a.iter().map(|x| x.as_f64().unwrap()).collect()),
        other => panic!("unexpected label {other}"),
    }
}

fn feature_of(v: &Value) -> Feature {
    let opt = |k: &str| v.get(k).map(ints);
    Feature {
        input_ids: ints(&v["input_ids"]),
        token_type_ids: opt("token_type_ids"),
        attention_mask: opt("attention_mask"),
        special_tokens_mask: opt("special_tokens_mask"),
        offset_mapping: v.get("offset_mapping").map(|o| {
            o.as_array()
                .unwrap()
                .iter()
                .map(|p| (p[0].as_i64().unwrap(), p[1].as_i64().unwrap()))
                .collect()
        }),
        labels: ["label", "labels", "label_ids"]
            .iter()
            .find_map(|k| v.get(*k))
            .map(label_of),
        start_positions: v.get("start_positions").and_then(Value::as_i64),
        end_positions: v.get("end_positions").and_then(Value::as_i64),
        seq_lengths: opt("seq_lengths"),
        columns: Default::default(),
    }
}

fn padding_of(options: &Value) -> PaddingStrategy {
    match options.get("padding").and_then(Value::as_str) {
        Some("max_length") => PaddingStrategy::MaxLength,
        Some("do_not_pad") => PaddingStrategy::DoNotPad,
        _ => PaddingStrategy::Longest,
    }
}

fn usize_opt(options: &Value, key: &str) -> Option<usize> {
    options.get(key).and_then(Value::as_u64).map(|v| v as usize)
}

fn lm_options(o: &Value) -> LanguageModelingOptions {
    let d = LanguageModelingOptions::default();
    LanguageModelingOptions {
        mlm: o.get("mlm").and_then(Value::as_bool).unwrap_or(d.mlm),
        whole_word_mask: o
            .get("whole_word_mask")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        mlm_probability: o
            .get("mlm_probability")
            .and_then(Value::as_f64)
            .unwrap_or(d.mlm_probability),
        mask_replace_prob: o
            .get("mask_replace_prob")
            .and_then(Value::as_f64)
            .unwrap_or(d.mask_replace_prob),
        random_replace_prob: o
            .get("random_replace_prob")
            .and_then(Value::as_f64)
            .unwrap_or(d.random_replace_prob),
        pad_to_multiple_of: usize_opt(o, "pad_to_multiple_of"),
        seed: o.get("seed").and_then(Value::as_u64),
    }
}

fn assert_same(name: &str, key: &str, got: &Tensor, expected: &Tensor) {
    assert_eq!(got.kind(), expected.kind(), "{name}.{key}: dtype");
    assert_eq!(got.size(), expected.size(), "{name}.{key}: shape");
    let equal = got.f_equal(expected).unwrap();
    if !equal {
        panic!("{name}.{key}: values differ\n got      {got}\n expected {expected}");
    }
}

#[test]
fn tokenizer_facts_and_encodings_match_upstream() -> Result<()> {
    let r = reference()?;
    let toks = tokenizers()?;
    for (name, facts) in r.json["tokenizers"].as_object().unwrap() {
        let (info, tok) = &toks[name.as_str()];
        assert_eq!(
            info.pad_token_id,
            facts["pad_token_id"].as_i64(),
            "{name} pad"
        );
        assert_eq!(
            info.mask_token_id,
            facts["mask_token_id"].as_i64(),
            "{name} mask"
        );
        assert_eq!(
            info.vocab_size,
            facts["len"].as_i64().unwrap(),
            "{name} len"
        );
        let special: BTreeSet<i64> = ints(&facts["all_special_ids"]).into_iter().collect();
        assert_eq!(info.all_special_ids, special, "{name} all_special_ids");
        assert_eq!(
            info.model_max_length,
            facts["model_max_length"].as_u64().map(|m| m as usize),
            "{name} model_max_length"
        );
        assert_eq!(info.padding_side, PaddingSide::Right);
        for e in r.json["encodings"][name.as_str()].as_array().unwrap() {
            let text = e["text"].as_str().unwrap();
            let enc = tok.encode(text, true).map_err(|e| anyhow::anyhow!("{e}"))?;
            let ids: Vec<i64> = enc.get_ids().iter().map(|&i| i64::from(i)).collect();
            assert_eq!(ids, ints(&e["input_ids"]), "{name}: encoding of {text:?}");
        }
    }
    Ok(())
}

#[test]
fn every_collator_matches_upstream() -> Result<()> {
    let r = reference()?;
    let toks = tokenizers()?;
    let mut lm_collators: HashMap<String, DataCollatorForLanguageModeling> = HashMap::new();
    let cases = r.json["cases"].as_array().unwrap();
    assert!(cases.len() >= 25);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let o = &case["options"];
        let mut info = toks[case["tokenizer"].as_str().unwrap()].0.clone();
        if case["padding_side"] == "left" {
            info.padding_side = PaddingSide::Left;
        }
        let features: Vec<Feature> = if case["collator"] == "multiple_choice" {
            Vec::new()
        } else {
            case["features"]
                .as_array()
                .unwrap()
                .iter()
                .map(feature_of)
                .collect()
        };
        let batch = match case["collator"].as_str().unwrap() {
            "default" => default_data_collator(&features)?,
            "with_padding" => DataCollatorWithPadding {
                padding: padding_of(o),
                max_length: usize_opt(o, "max_length"),
                pad_to_multiple_of: usize_opt(o, "pad_to_multiple_of"),
                ..DataCollatorWithPadding::new(info)
            }
            .collate(&features)?,
            "token_classification" => DataCollatorForTokenClassification {
                pad_to_multiple_of: usize_opt(o, "pad_to_multiple_of"),
                label_pad_token_id: o
                    .get("label_pad_token_id")
                    .and_then(Value::as_i64)
                    .unwrap_or(-100),
                ..DataCollatorForTokenClassification::new(info)
            }
            .collate(&features)?,
            "multiple_choice" => {
                let examples: Vec<MultipleChoiceFeature> = case["features"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|e| MultipleChoiceFeature {
                        choices: e["choices"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(feature_of)
                            .collect(),
                        label: e["label"].as_i64().unwrap(),
                    })
                    .collect();
                DataCollatorForMultipleChoice::new(info).collate(&examples)?
            }
            "seq2seq" => DataCollatorForSeq2Seq {
                padding: padding_of(o),
                max_length: usize_opt(o, "max_length"),
                pad_to_multiple_of: usize_opt(o, "pad_to_multiple_of"),
                label_pad_token_id: o
                    .get("label_pad_token_id")
                    .and_then(Value::as_i64)
                    .unwrap_or(-100),
                decoder_start: case
                    .get("decoder_start_token_id")
                    .map(|d| DecoderStart::Token {
                        decoder_start_token_id: d.as_i64().unwrap(),
                        pad_token_id: case["decoder_pad_token_id"].as_i64().unwrap(),
                    }),
                ..DataCollatorForSeq2Seq::new(info)
            }
            .collate(&features)?,
            "language_modeling" => {
                let sequence = case["sequence"].as_str().unwrap().to_string();
                let collator = match lm_collators.entry(sequence) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(DataCollatorForLanguageModeling::new(info, lm_options(o))?)
                    }
                };
                if let Some(seed) = case.get("global_seed").and_then(Value::as_i64) {
                    tch::manual_seed(seed);
                }
                if case["list_examples"].as_bool().unwrap() {
                    let rows: Vec<Vec<i64>> =
                        features.iter().map(|f| f.input_ids.clone()).collect();
                    collator.collate(&rows)?
                } else {
                    collator.collate(&features)?
                }
            }
            "flattening" => DataCollatorWithFlattening {
                return_flash_attn_kwargs: o
                    .get("return_flash_attn_kwargs")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                return_seq_idx: o
                    .get("return_seq_idx")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                separator_id: o
                    .get("separator_id")
                    .and_then(Value::as_i64)
                    .unwrap_or(-100),
                position_ids_start: o
                    .get("position_ids_start")
                    .and_then(Value::as_i64)
                    .unwrap_or(0),
                ..DataCollatorWithFlattening::default()
            }
            .collate(&features)?,
            other => bail!("unknown collator {other}"),
        };
        let mut expected_keys: Vec<&str> = case["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap())
            .collect();
        let mut keys: Vec<&str> = batch.keys().collect();
        // TRL's collator names the same outputs in another order.
        if case.get("unordered_keys").is_some() {
            keys.sort_unstable();
            expected_keys.sort_unstable();
        }
        assert_eq!(keys, expected_keys, "{name}: keys");
        for key in &expected_keys {
            let expected = &r.tensors[&format!("{name}.{key}")];
            assert_same(name, key, batch.get(key).unwrap(), expected);
        }
        for (key, value) in case["ints"].as_object().unwrap() {
            assert_eq!(batch.int(key), value.as_i64(), "{name}.{key}");
        }
        println!("{name}: identical ({} tensors)", expected_keys.len());
    }
    Ok(())
}

#[test]
fn torch_generator_reproduces_torch_streams() -> Result<()> {
    let r = reference()?;
    for (seed, s) in r.json["generator_streams"].as_object().unwrap() {
        let mut g = TorchGenerator::new(seed.parse()?);
        let draw = |g: &mut TorchGenerator, high: i64, n: usize| -> Vec<i64> {
            (0..n).map(|_| g.randint(high)).collect()
        };
        assert_eq!(draw(&mut g, 10, 5), ints(&s["randint10"]), "seed {seed}");
        assert_eq!(
            draw(&mut g, 1 << 20, 1000),
            ints(&s["randint_2_20"]),
            "seed {seed}"
        );
        assert_eq!(
            draw(&mut g, 1 << 30, 100),
            ints(&s["randint_2_30"]),
            "seed {seed}"
        );
        let b: Vec<i64> = g
            .bernoulli_matrix(&[0.3; 1000])
            .into_iter()
            .map(i64::from)
            .collect();
        assert_eq!(b, ints(&s["bernoulli_0_3"]), "seed {seed}");
        assert_eq!(
            draw(&mut g, 30522, 50),
            ints(&s["randint30522"]),
            "seed {seed}"
        );
    }
    Ok(())
}

/// Beyond identity with upstream: on a large batch the masking statistics are those
/// asked for (binomial bounds at ~5 sigma) and special tokens are never selected.
#[test]
fn mlm_mask_statistics_and_special_tokens() -> Result<()> {
    let info = TokenizerInfo {
        pad_token_id: Some(0),
        mask_token_id: Some(103),
        vocab_size: 30522,
        all_special_ids: [0, 100, 101, 102, 103].into(),
        ..TokenizerInfo::default()
    };
    let mut collator = DataCollatorForLanguageModeling::new(
        info,
        LanguageModelingOptions {
            seed: Some(1),
            ..Default::default()
        },
    )?;
    let rows: Vec<Feature> = (0..64)
        .map(|r| {
            let mut ids = vec![101];
            ids.extend((0..200).map(|i| 1000 + (r * 200 + i) % 20000));
            ids.push(102);
            Feature::new(ids)
        })
        .collect();
    let batch = collator.collate(&rows)?;
    let input = Vec::<i64>::try_from(batch.get("input_ids").unwrap().reshape([-1]))?;
    let labels = Vec::<i64>::try_from(batch.get("labels").unwrap().reshape([-1]))?;
    let original: Vec<i64> = rows.iter().flat_map(|f| f.input_ids.clone()).collect();
    let eligible = 64.0 * 200.0;
    let selected: Vec<usize> = (0..labels.len()).filter(|&i| labels[i] != -100).collect();
    for &i in &selected {
        assert!(
            original[i] != 101 && original[i] != 102,
            "special token selected"
        );
        assert_eq!(labels[i], original[i]);
    }
    let within =
        |count: f64, n: f64, p: f64| (count - n * p).abs() <= 5.0 * (n * p * (1.0 - p)).sqrt();
    let n_sel = selected.len() as f64;
    assert!(
        within(n_sel, eligible, 0.15),
        "selected {n_sel} of {eligible}"
    );
    let masked = selected.iter().filter(|&&i| input[i] == 103).count() as f64;
    let kept = selected
        .iter()
        .filter(|&&i| input[i] == original[i])
        .count() as f64;
    assert!(within(masked, n_sel, 0.8), "mask share {masked}/{n_sel}");
    // kept: 10% left as is, plus random replacements that drew the same token (negligible)
    assert!(within(kept, n_sel, 0.1), "kept share {kept}/{n_sel}");
    assert!(within(n_sel - masked - kept, n_sel, 0.1), "random share");
    Ok(())
}

#[test]
fn bad_input_gives_typed_errors() -> Result<()> {
    let info = TokenizerInfo {
        pad_token_id: Some(0),
        ..TokenizerInfo::default()
    };
    let ragged = [Feature::new(vec![1, 2, 3]), Feature::new(vec![4])];
    assert!(matches!(default_data_collator(&[]), Err(Error::EmptyBatch)));
    assert!(matches!(
        default_data_collator(&ragged),
        Err(Error::RaggedBatch {
            key: "input_ids",
            ..
        })
    ));
    let mut no_pad = DataCollatorWithPadding {
        padding: PaddingStrategy::DoNotPad,
        ..DataCollatorWithPadding::new(info.clone())
    };
    assert!(matches!(
        no_pad.collate(&ragged),
        Err(Error::RaggedBatch { .. })
    ));
    let mut short_max = DataCollatorWithPadding {
        padding: PaddingStrategy::MaxLength,
        max_length: Some(2),
        ..DataCollatorWithPadding::new(info.clone())
    };
    assert!(matches!(
        short_max.collate(&ragged),
        Err(Error::RaggedBatch { .. })
    ));
    assert!(matches!(
        DataCollatorWithPadding::new(TokenizerInfo::default()).collate(&ragged),
        Err(Error::NoPadToken)
    ));
    // labels longer than the padded sequence
    let rows = [Feature::new(vec![1, 2]).with_labels(Label::Ids(vec![1, 2, 3]))];
    assert!(matches!(
        DataCollatorForTokenClassification::new(info.clone()).collate(&rows),
        Err(Error::LabelLengthMismatch {
            label_len: 3,
            seq_len: 2,
            ..
        })
    ));
    // mixed label kinds, inconsistent fields, field length mismatch
    let mixed = [
        Feature::new(vec![1]).with_labels(Label::Class(1)),
        Feature::new(vec![2]).with_labels(Label::Value(0.5)),
    ];
    assert!(matches!(
        default_data_collator(&mixed),
        Err(Error::LabelKind { index: 1, .. })
    ));
    let mut with_mask = Feature::new(vec![2]);
    with_mask.attention_mask = Some(vec![1]);
    assert!(matches!(
        default_data_collator(&[Feature::new(vec![1]), with_mask]),
        Err(Error::InconsistentFeatures {
            key: "attention_mask",
            index: 1,
            ..
        })
    ));
    let mut bad_len = Feature::new(vec![1, 2]);
    bad_len.attention_mask = Some(vec![1]);
    assert!(matches!(
        default_data_collator(&[bad_len]),
        Err(Error::FieldLengthMismatch {
            key: "attention_mask",
            ..
        })
    ));
    // MLM configuration checks
    assert!(matches!(
        DataCollatorForLanguageModeling::new(info.clone(), LanguageModelingOptions::default()),
        Err(Error::NoMaskToken)
    ));
    let with_mask_token = TokenizerInfo {
        mask_token_id: Some(103),
        ..info.clone()
    };
    assert!(matches!(
        DataCollatorForLanguageModeling::new(
            with_mask_token.clone(),
            LanguageModelingOptions {
                mlm_probability: 1.5,
                ..Default::default()
            }
        ),
        Err(Error::InvalidProbability {
            name: "mlm_probability",
            ..
        })
    ));
    assert!(matches!(
        DataCollatorForLanguageModeling::new(
            with_mask_token.clone(),
            LanguageModelingOptions {
                mask_replace_prob: 0.7,
                random_replace_prob: 0.4,
                ..Default::default()
            }
        ),
        Err(Error::ReplaceProbabilitiesExceedOne { .. })
    ));
    assert!(matches!(
        DataCollatorForLanguageModeling::new(
            with_mask_token.clone(),
            LanguageModelingOptions {
                mlm: false,
                whole_word_mask: true,
                ..Default::default()
            }
        ),
        Err(Error::WholeWordMaskWithoutMlm)
    ));
    let mut wwm = DataCollatorForLanguageModeling::new(
        with_mask_token,
        LanguageModelingOptions {
            whole_word_mask: true,
            ..Default::default()
        },
    )?;
    assert!(matches!(
        wwm.collate(&[Feature::new(vec![1, 2])]),
        Err(Error::MissingOffsetMapping { index: 0 })
    ));
    // multiple choice with different numbers of choices; flattening with an empty row
    let examples = [
        MultipleChoiceFeature {
            choices: vec![Feature::new(vec![1]), Feature::new(vec![2])],
            label: 0,
        },
        MultipleChoiceFeature {
            choices: vec![Feature::new(vec![1])],
            label: 0,
        },
    ];
    assert!(matches!(
        DataCollatorForMultipleChoice::new(info.clone()).collate(&examples),
        Err(Error::ChoiceCountMismatch {
            index: 1,
            expected: 2,
            got: 1
        })
    ));
    assert!(matches!(
        DataCollatorWithFlattening::default().collate(&[Feature::new(vec![])]),
        Err(Error::EmptySequence { index: 0 })
    ));
    assert!(matches!(
        DataCollatorForSeq2Seq::new(info)
            .collate(&[Feature::new(vec![1]).with_labels(Label::Class(3))]),
        Err(Error::LabelKind { .. })
    ));
    let _ = Kind::Int64;
    Ok(())
}

//! Every loss against transformers 5.23 / torch 2.13: loss value and gradient w.r.t. the
//! logits on the inputs written by `scripts/reference/losses.py`, plus the typed errors
//! for bad input.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use tch::{Kind, Tensor};
use tchtrain_losses::{
    Error, LabelSmoother, LossType, ProblemType, fixed_cross_entropy, for_causal_lm_loss,
    for_masked_lm_loss, for_question_answering_loss, for_sequence_classification_loss,
    for_token_classification, loss_mapping, loss_type_for_model_class,
};

fn assets_dir() -> PathBuf {
    std::env::var_os("TCHTRAIN_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../assets"))
}

struct Reference {
    json: Value,
    tensors: HashMap<String, Tensor>,
}

fn reference() -> Result<Reference> {
    let dir = assets_dir().join("reference/losses");
    let json_path = dir.join("losses.json");
    let text = std::fs::read_to_string(&json_path).with_context(|| {
        format!(
            "{} is missing: run `cargo xtask setup` to generate the reference values",
            json_path.display()
        )
    })?;
    let st_path = dir.join("losses.safetensors");
    let tensors = Tensor::read_safetensors(&st_path)
        .with_context(|| format!("{} (run `cargo xtask setup`)", st_path.display()))?
        .into_iter()
        .collect();
    Ok(Reference {
        json: serde_json::from_str(&text)?,
        tensors,
    })
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size(), "shape mismatch");
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

/// Runs one reference case in Rust; returns the loss and the leaves (by input name)
/// whose gradients the reference recorded.
fn run_case(case: &Value, t: &HashMap<String, Tensor>) -> Result<(Tensor, Vec<(String, Tensor)>)> {
    let name = case["name"].as_str().unwrap();
    let get = |k: &str| t.get(&format!("{name}.{k}"));
    let input = |k: &str| get(k).with_context(|| format!("{name}.{k} missing"));
    let args = &case["args"];
    let int_arg = |k: &str| args[k].as_i64().with_context(|| format!("{name}: arg {k}"));
    let grads: Vec<String> = case["grads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_str().unwrap().to_string())
        .collect();
    let leaves: HashMap<String, Tensor> = grads
        .iter()
        .map(|g| Ok((g.clone(), input(g)?.detach().copy().set_requires_grad(true))))
        .collect::<Result<_>>()?;
    let leaf = |k: &str| &leaves[k];
    let n = get("num_items_in_batch");
    let loss = match case["function"].as_str().unwrap() {
        "fixed_cross_entropy" => fixed_cross_entropy(
            leaf("logits"),
            input("target")?,
            n,
            int_arg("ignore_index")?,
        )?,
        "for_causal_lm_loss" => for_causal_lm_loss(
            leaf("logits"),
            input("labels")?,
            int_arg("vocab_size")?,
            n,
            int_arg("ignore_index")?,
            get("shift_labels"),
        )?,
        "for_masked_lm_loss" => for_masked_lm_loss(
            leaf("logits"),
            input("labels")?,
            int_arg("vocab_size")?,
            n,
            int_arg("ignore_index")?,
        )?,
        "for_token_classification" => {
            for_token_classification(leaf("logits"), input("labels")?, int_arg("num_labels")?, n)?
        }
        "for_sequence_classification_loss" => {
            let labels = input("labels")?;
            let num_labels = int_arg("num_labels")?;
            let given = args["problem_type"].as_str().map(str::parse).transpose()?;
            let inferred: ProblemType = case["inferred_problem_type"].as_str().unwrap().parse()?;
            assert_eq!(
                given.unwrap_or_else(|| ProblemType::infer(num_labels, labels.kind())),
                inferred,
                "{name}: inferred problem type"
            );
            for_sequence_classification_loss(labels, leaf("logits"), num_labels, given, n)?
        }
        "for_question_answering_loss" => for_question_answering_loss(
            leaf("start_logits"),
            leaf("end_logits"),
            input("start_positions")?,
            input("end_positions")?,
            n,
        )?,
        "label_smoother" => LabelSmoother {
            epsilon: args["epsilon"].as_f64().unwrap(),
            ignore_index: int_arg("ignore_index")?,
        }
        .compute(
            leaf("logits"),
            input("labels")?,
            args["shift_labels"].as_bool().unwrap(),
            n,
        )?,
        other => bail!("unknown function {other}"),
    };
    loss.backward();
    Ok((
        loss,
        grads
            .into_iter()
            .map(|g| {
                let grad = leaves[&g].grad();
                (g, grad)
            })
            .collect(),
    ))
}

/// fp32, the same libtorch ops on the same small tensors (below libtorch's parallel grain,
/// so single-threaded) as upstream: identical bits, so no tolerance.
const TOL: f64 = 0.0;

#[test]
fn every_loss_and_gradient_matches_upstream() -> Result<()> {
    let r = reference()?;
    let cases = r.json["cases"].as_array().unwrap();
    assert!(cases.len() >= 20, "reference has {} cases", cases.len());
    let mut worst_loss: f64 = 0.0;
    let mut worst_grad: f64 = 0.0;
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let (loss, grads) = run_case(case, &r.tensors).with_context(|| name.to_string())?;
        let expected = &r.tensors[&format!("{name}.loss")];
        let d = max_abs_diff(&loss.detach().reshape([1]), expected);
        worst_loss = worst_loss.max(d);
        assert!(d <= TOL, "{name}: loss differs by {d:e}");
        for (g, grad) in grads {
            let expected = &r.tensors[&format!("{name}.grad_{g}")];
            let d = max_abs_diff(&grad, expected);
            worst_grad = worst_grad.max(d);
            assert!(d <= TOL, "{name}: grad of {g} differs by {d:e}");
        }
        println!("{name}: ok (loss {:.6})", loss.double_value(&[]));
    }
    println!(
        "{} cases; max |loss diff| = {worst_loss:e}, max |grad diff| = {worst_grad:e}",
        cases.len()
    );
    Ok(())
}

#[test]
fn loss_types_from_class_names_match_upstream() -> Result<()> {
    let r = reference()?;
    let keys: Vec<&str> = r.json["loss_mapping_keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert_eq!(keys, tchtrain_losses::LOSS_MAPPING_KEYS.to_vec());
    for (class, expected) in r.json["loss_types"].as_object().unwrap() {
        assert_eq!(
            loss_type_for_model_class(class),
            expected.as_str(),
            "loss_type of {class}"
        );
    }
    assert_eq!(loss_mapping("ForMaskedLM")?, LossType::MaskedLm);
    assert_eq!(
        loss_mapping("ForAudioClassification")?,
        LossType::SequenceClassification
    );
    assert!(matches!(
        loss_mapping("ForObjectDetection"),
        Err(Error::UnsupportedLossType(_))
    ));
    assert!(matches!(
        loss_mapping("ForNothing"),
        Err(Error::UnknownLossType(_))
    ));
    Ok(())
}

fn cpu() -> (Kind, tch::Device) {
    (Kind::Float, tch::Device::Cpu)
}

#[test]
fn bad_input_gives_typed_errors() {
    let logits = Tensor::zeros([2, 3, 5], cpu());
    let labels = Tensor::from_slice(&[1i64, 2, 3, 4, 0, -100]).reshape([2, 3]);

    // logits / labels shape mismatch
    let short = Tensor::from_slice(&[1i64, 2]).reshape([1, 2]);
    assert!(matches!(
        for_causal_lm_loss(&logits, &short, 5, None, -100, None),
        Err(Error::ShapeMismatch { what: "labels", .. })
    ));
    assert!(matches!(
        for_masked_lm_loss(&logits, &labels, 7, None, -100),
        Err(Error::ShapeMismatch { what: "logits", .. })
    ));
    // label out of range (5 is not a class of 5 and not the ignore index), negative too
    let bad = Tensor::from_slice(&[1i64, 5, 3, 4, 0, -100]).reshape([2, 3]);
    match for_masked_lm_loss(&logits, &bad, 5, None, -100) {
        Err(Error::LabelOutOfRange {
            label: 5,
            num_classes: 5,
            ..
        }) => {}
        other => panic!("expected LabelOutOfRange, got {other:?}"),
    }
    let negative = Tensor::from_slice(&[1i64, -1, 3, 4, 0, -100]).reshape([2, 3]);
    assert!(matches!(
        for_token_classification(&logits, &negative, 5, None),
        Err(Error::LabelOutOfRange { label: -1, .. })
    ));
    assert!(matches!(
        LabelSmoother::default().compute(&logits, &bad, false, None),
        Err(Error::LabelOutOfRange { label: 5, .. })
    ));
    // empty batch
    let empty = Tensor::zeros([0, 3, 5], cpu());
    let empty_labels = Tensor::zeros([0, 3], (Kind::Int64, tch::Device::Cpu));
    assert!(matches!(
        for_causal_lm_loss(&empty, &empty_labels, 5, None, -100, None),
        Err(Error::EmptyBatch { .. })
    ));
    // float labels where class indices are needed
    assert!(matches!(
        fixed_cross_entropy(
            &Tensor::zeros([2, 3], cpu()),
            &Tensor::zeros([2], cpu()),
            None,
            -100
        ),
        Err(Error::InvalidDtype { what: "target", .. })
    ));
    // regression with integer labels, multi-label with mismatched shape
    assert!(matches!(
        for_sequence_classification_loss(
            &Tensor::from_slice(&[1i64, 2]),
            &Tensor::zeros([2, 1], cpu()),
            1,
            None,
            None
        ),
        Err(Error::InvalidDtype { what: "labels", .. })
    ));
    assert!(matches!(
        for_sequence_classification_loss(
            &Tensor::zeros([2, 4], cpu()),
            &Tensor::zeros([2, 3], cpu()),
            3,
            Some(ProblemType::MultiLabelClassification),
            None
        ),
        Err(Error::ShapeMismatch { what: "labels", .. })
    ));
    assert!(matches!(
        "binary".parse::<ProblemType>(),
        Err(Error::InvalidProblemType(_))
    ));
    // QA: mismatched batch
    assert!(matches!(
        for_question_answering_loss(
            &Tensor::zeros([2, 4], cpu()),
            &Tensor::zeros([2, 4], cpu()),
            &Tensor::from_slice(&[1i64, 2, 3]),
            &Tensor::from_slice(&[1i64, 2]),
            None
        ),
        Err(Error::ShapeMismatch {
            what: "start_positions",
            ..
        })
    ));
    assert!(matches!(
        for_causal_lm_loss(&logits, &labels, 0, None, -100, None),
        Err(Error::NonPositiveSize { .. })
    ));
}

/// Upstream's contract for gradient accumulation: with `num_items_in_batch` equal to the
/// label count of all micro-batches, the summed micro-batch losses equal the loss of the
/// concatenated batch.
#[test]
fn num_items_in_batch_makes_accumulated_loss_equal_full_batch_loss() -> Result<()> {
    tch::manual_seed(0);
    let logits = Tensor::randn([4, 6, 9], cpu());
    let labels = Tensor::randint(9, [4, 6], (Kind::Int64, tch::Device::Cpu));
    let labels = labels.masked_fill(&Tensor::rand([4, 6], cpu()).lt(0.3), -100);
    let full = for_causal_lm_loss(&logits, &labels, 9, None, -100, None)?;
    let count = labels.narrow(1, 1, 5).ne(-100).sum(Kind::Int64);
    let mut accumulated = Tensor::zeros([], cpu());
    for i in 0..2 {
        let l = for_causal_lm_loss(
            &logits.narrow(0, 2 * i, 2),
            &labels.narrow(0, 2 * i, 2),
            9,
            Some(&count),
            -100,
            None,
        )?;
        accumulated += l;
    }
    let d = (full - accumulated).abs().double_value(&[]);
    // The same n <= 20 per-token losses (|l| <= 5 here) summed as one sum or as two halves
    // each divided by the count: at most (n - 1 + 3) u max|l| = 22 * 6e-8 * 5 = 6.6e-6 apart.
    assert!(d < 1e-5, "accumulated vs full: {d:e}");
    Ok(())
}

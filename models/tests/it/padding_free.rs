//! Padding costs nothing.
//!
//! Packed sequences against `scripts/reference/packed_sequences.py`: a batch of
//! `DataCollatorWithFlattening` (no attention mask, `position_ids` restarting at each
//! document) gives upstream's block-diagonal causal attention (sliding windows included) in
//! every decoder family: logits, loss and every gradient equal transformers 5.23's, and the
//! loss equals the documents' own losses, each run alone.
//!
//! Tolerances: logits, loss and gradients are compared to the bit (the same kernels on the
//! same mask); the packed loss against the documents run alone within 1e-6 relative (their
//! attention rows are shorter, so the softmax and the matmuls sum other lengths: measured
//! ≤ 1.3e-7 upstream). Phi-3 is left out of the last check, in upstream as here: LongRoPE
//! picks its short or long factors by the batch's largest position, so a short document
//! packed with long ones gets the long factors.
//!
//! Padding-free execution of padded batches (the encoders' heads, the causal LMs in
//! training, the decoders' sequence classifiers; turned on by `set_padding_free`): against the same
//! model run padded. Tolerances: evaluation
//! logits and the loss 1e-6 relative, training logits and gradients 1e-5 relative to each
//! tensor's largest magnitude (measured 2.7e-7, 0, 1.3e-6, 4.9e-6); the dropout masks are the
//! padded run's, so what differs is only the order of the matmuls' sums (fewer rows; the
//! weight gradients summed over the tokens in other chunks).

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use tch::{Device, Kind, Tensor};
use tchtrain_models::{AutoTask, LoadOptions, ModelInputs, PreTrainedModel, from_pretrained_dir};
use tchtrain_testing::{assets, lock};

fn reference(case: &str) -> Result<HashMap<String, Tensor>> {
    let path = assets()
        .join("reference/packed_sequences")
        .join(format!("{case}.safetensors"));
    if !path.exists() {
        bail!("{} is missing: run `cargo xtask setup`", path.display());
    }
    Ok(Tensor::read_safetensors(&path)?.into_iter().collect())
}

fn model_dir(case: &str) -> PathBuf {
    match case {
        "gpt2" => assets().join("tiny-gpt2"),
        _ => assets()
            .join("reference/packed_sequences")
            .join(case.trim_end_matches("_rows")),
    }
}

fn load(case: &str) -> Result<Box<dyn PreTrainedModel>> {
    let loaded = from_pretrained_dir(
        &model_dir(case),
        AutoTask::CausalLm,
        Device::Cpu,
        &LoadOptions::default(),
    )?;
    assert!(loaded.info.is_clean(), "{case}: {}", loaded.info);
    Ok(loaded.model)
}

fn max_abs(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size(), "shape mismatch");
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

/// Each row's documents, split where a position does not follow its predecessor by 1.
fn documents(ids: &Tensor, positions: &Tensor) -> Result<Vec<Tensor>> {
    let mut docs = Vec::new();
    for row in 0..ids.size()[0] {
        let p = Vec::<i64>::try_from(positions.get(row))?;
        let mut start = 0usize;
        for i in 1..=p.len() {
            if i == p.len() || p[i] != p[i - 1] + 1 {
                docs.push(
                    ids.get(row)
                        .narrow(0, start as i64, (i - start) as i64)
                        .unsqueeze(0),
                );
                start = i;
            }
        }
    }
    Ok(docs)
}

const CASES: [&str; 9] = [
    "qwen2",
    "qwen2_rows",
    "qwen3",
    "mistral",
    "llama",
    "gemma2",
    "gemma3",
    "phi3",
    "gpt2",
];

/// Logits, loss and gradients of a packed batch equal upstream's, to the bit, on Qwen2
/// (one and two rows; layers sliding over 3 tokens), Qwen3, Mistral (sliding), Llama,
/// Gemma 2 (eager soft-capped attention, sliding layers), Gemma 3 (sliding layers with
/// their own RoPE), Phi-3 (LongRoPE, sliding) and GPT-2 (learned positions).
#[test]
fn packed_documents_attend_only_within_themselves_as_upstream() -> Result<()> {
    let _g = lock();
    for case in CASES {
        let r = reference(case)?;
        let mut model = load(case)?;
        // As the Trainer sets it (`args.use_cache`, false) and the reference runs.
        model.set_use_cache(false);
        model.eval();
        let inputs = ModelInputs {
            input_ids: Some(&r["input_ids"]),
            position_ids: Some(&r["position_ids"]),
            ..Default::default()
        };
        let logits = tch::no_grad(|| model.forward(&inputs))?
            .logits
            .context("no logits")?;
        let logits_diff = max_abs(&logits, &r["logits"]);
        for (_, v) in model.var_store().variables() {
            let mut g = v.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
        let out = model.forward(&ModelInputs {
            labels: Some(&r["labels"]),
            ..inputs
        })?;
        let loss = out.loss.context("no loss")?;
        let loss_diff = max_abs(&loss.reshape([1]), &r["loss"]);
        loss.backward();
        let vars = model.var_store().variables();
        let tied = model.tied_weights();
        let mut worst_grad = 0.0f64;
        let mut n = 0;
        for (key, expected) in r.iter().filter(|(k, _)| k.starts_with("grad.")) {
            let name = &key["grad.".len()..];
            let name = tied
                .iter()
                .find(|(t, _)| t == name)
                .map_or(name, |(_, source)| source.as_str());
            let var = vars
                .get(name)
                .with_context(|| format!("{case}: no parameter {name}"))?;
            worst_grad = worst_grad.max(max_abs(&var.grad(), expected));
            n += 1;
        }
        assert!(n > 0, "{case}: no gradients compared");
        eprintln!(
            "{case}: logits {logits_diff:.1e}, loss {loss_diff:.1e}, worst grad {worst_grad:.1e} (max abs)"
        );
        assert_eq!(logits_diff, 0.0, "{case}: logits");
        assert_eq!(loss_diff, 0.0, "{case}: loss");
        assert_eq!(worst_grad, 0.0, "{case}: gradients");
    }
    Ok(())
}

/// The packed loss is the token-weighted mean of the documents' losses, each document run
/// alone (within 1e-6 relative), and equals the reference's own per-document figure.
#[test]
fn packed_loss_equals_the_documents_run_alone() -> Result<()> {
    let _g = lock();
    for case in CASES.into_iter().filter(|c| *c != "phi3") {
        let r = reference(case)?;
        let mut model = load(case)?;
        model.set_use_cache(false);
        model.eval();
        let packed = tch::no_grad(|| {
            model.forward(&ModelInputs {
                input_ids: Some(&r["input_ids"]),
                position_ids: Some(&r["position_ids"]),
                labels: Some(&r["labels"]),
                ..Default::default()
            })
        })?
        .loss
        .context("no loss")?
        .double_value(&[]);
        let (mut total, mut count) = (0.0, 0.0);
        for doc in documents(&r["input_ids"], &r["position_ids"])? {
            let loss = tch::no_grad(|| {
                model.forward(&ModelInputs {
                    input_ids: Some(&doc),
                    labels: Some(&doc),
                    ..Default::default()
                })
            })?
            .loss
            .context("no loss")?
            .double_value(&[]);
            let tokens = (doc.size()[1] - 1) as f64;
            total += loss * tokens;
            count += tokens;
        }
        let alone = total / count;
        let rel = (packed - alone).abs() / alone;
        let upstream = r["doc_loss"].double_value(&[0]);
        eprintln!(
            "{case}: packed {packed:.8}, documents alone {alone:.8} (rel {rel:.1e}), upstream's documents alone {upstream:.8}"
        );
        assert!(rel <= 1e-6, "{case}: packed loss {packed} vs {alone}");
        assert!((alone - upstream).abs() / upstream <= 1e-6, "{case}");
    }
    Ok(())
}

/// Under the config's `use_cache: true` a plain forward builds a cache in upstream, which
/// then does not look for packed rows: the documents see each other, here as there. The
/// Trainer sets `use_cache` from `args.use_cache` (false by default) and packs.
#[test]
fn with_the_configs_use_cache_packed_rows_are_not_detected_as_upstream() -> Result<()> {
    let _g = lock();
    let r = reference("qwen2")?;
    let mut model = load("qwen2")?;
    model.eval();
    let inputs = ModelInputs {
        input_ids: Some(&r["input_ids"]),
        position_ids: Some(&r["position_ids"]),
        ..Default::default()
    };
    let logits = tch::no_grad(|| model.forward(&inputs))?
        .logits
        .context("no logits")?;
    assert_eq!(max_abs(&logits, &r["logits_use_cache"]), 0.0);
    assert!(max_abs(&logits, &r["logits"]) > 0.1);
    Ok(())
}

fn rel(a: &Tensor, b: &Tensor) -> f64 {
    max_abs(a, b) / b.abs().max().double_value(&[]).max(1e-12)
}

/// A padded batch for MiniLM's vocabulary: 4 rows of 16 tokens, 16, 9, 5 and 12 of them
/// real (`[CLS]` first), random ids, labels 0 / 1.
fn padded_batch() -> (Tensor, Tensor, Tensor) {
    let lengths = [16i64, 9, 5, 12];
    tch::manual_seed(3);
    let ids = Tensor::randint_low(1000, 30000, [4, 16], (Kind::Int64, Device::Cpu));
    let _ = ids.narrow(1, 0, 1).fill_(101);
    let mask = Tensor::zeros([4, 16], (Kind::Int64, Device::Cpu));
    for (row, n) in lengths.iter().enumerate() {
        let _ = mask.get(row as i64).narrow(0, 0, *n).fill_(1);
    }
    let ids = ids * &mask;
    let labels = Tensor::from_slice(&[0i64, 1, 1, 0]);
    (ids, mask, labels)
}

/// A training step's loss, logits and named gradients (sorted by name).
type TrainStep = (Tensor, Tensor, Vec<(String, Tensor)>);

/// One forward and backward in training mode (dropout drawn after `manual_seed(0)`):
/// the loss, the logits and every parameter's gradient.
fn train_step(model: &mut dyn PreTrainedModel, inputs: &ModelInputs<'_>) -> Result<TrainStep> {
    model.train();
    for (_, v) in model.var_store().variables() {
        let mut g = v.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
    tch::manual_seed(0);
    let out = model.forward(inputs)?;
    let loss = out.loss.context("no loss")?;
    loss.backward();
    let mut grads: Vec<(String, Tensor)> = model
        .var_store()
        .variables()
        .into_iter()
        .filter(|(_, v)| v.grad().defined())
        .map(|(n, v)| (n, v.grad().copy()))
        .collect();
    grads.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((
        loss.detach(),
        out.logits.context("no logits")?.detach(),
        grads,
    ))
}

/// The worst relative difference between two steps' gradients (names checked in step).
/// The attention key bias's gradient is zero in exact arithmetic (softmax does not see a
/// constant added to a row's logits): both runs hold rounding noise (~1e-10), checked
/// small and left out.
fn worst_gradient(free: &TrainStep, padded: &TrainStep) -> f64 {
    let mut worst = 0.0f64;
    for ((name, a), (other, b)) in free.2.iter().zip(&padded.2) {
        assert_eq!(name, other);
        if name.ends_with("key.bias") {
            let noise = a.abs().max().double_value(&[]);
            assert!(noise <= 1e-7, "gradient of {name}: {noise}");
            continue;
        }
        worst = worst.max(rel(a, b));
    }
    worst
}

/// The evaluation-mode logits of `inputs`, padded then padding-free.
fn eval_logits_padded_then_free(
    model: &mut dyn PreTrainedModel,
    inputs: &ModelInputs<'_>,
) -> Result<[Tensor; 2]> {
    let mut run = |on: bool| -> Result<Tensor> {
        model.set_padding_free(on)?;
        model.eval();
        tch::no_grad(|| model.forward(inputs))?
            .logits
            .context("no logits")
    };
    Ok([run(false)?, run(true)?])
}

/// The same training step run padded, then padding-free.
fn padded_then_free(
    model: &mut dyn PreTrainedModel,
    inputs: &ModelInputs<'_>,
) -> Result<(TrainStep, TrainStep)> {
    model.set_padding_free(false)?;
    let padded = train_step(model, inputs)?;
    model.set_padding_free(true)?;
    Ok((padded, train_step(model, inputs)?))
}

/// MiniLM's sequence classifier (hidden and attention dropout 0.1) on a padded batch:
/// padding-free gives the padded run's logits, loss and gradients within the
/// module's tolerances, in evaluation and in training with dropout.
#[test]
fn padding_free_sequence_classification_equals_the_padded_run() -> Result<()> {
    let _g = lock();
    let mut model = load_task(
        "reference/models/minilm_seqcls",
        AutoTask::SequenceClassification { num_labels: None },
    )?;
    let (ids, mask, labels) = padded_batch();
    let inputs = ModelInputs {
        input_ids: Some(&ids),
        attention_mask: Some(&mask),
        labels: Some(&labels),
        ..Default::default()
    };
    let mut runs = Vec::new();
    for padding_free in [false, true] {
        model.set_padding_free(padding_free)?;
        model.eval();
        let logits = tch::no_grad(|| model.forward(&inputs))?
            .logits
            .context("no logits")?;
        runs.push((logits, train_step(&mut *model, &inputs)?));
    }
    let (padded, free) = (&runs[0], &runs[1]);
    let eval_rel = rel(&free.0, &padded.0);
    let loss_rel = rel(&free.1.0, &padded.1.0);
    let train_logits_rel = rel(&free.1.1, &padded.1.1);
    let worst = worst_gradient(&free.1, &padded.1);
    assert!(worst <= 1e-5, "gradient rel {worst}");
    eprintln!(
        "padding-free vs padded: eval logits {eval_rel:.1e}, train logits {train_logits_rel:.1e}, loss {loss_rel:.1e}, worst gradient {worst:.1e} ({} tensors)",
        free.1.2.len()
    );
    assert!(eval_rel <= 1e-6, "eval logits rel {eval_rel}");
    assert!(
        train_logits_rel <= 1e-5,
        "train logits rel {train_logits_rel}"
    );
    assert!(loss_rel <= 1e-6, "loss rel {loss_rel}");
    assert!(
        free.1.2.len() > 100,
        "gradients compared: {}",
        free.1.2.len()
    );
    Ok(())
}

/// Heads that read every position refuse padding-free execution with the reason; so do
/// models without the path.
#[test]
fn padding_free_is_refused_where_every_position_is_read() -> Result<()> {
    let _g = lock();
    let mut base = load_task("tiny-bert", AutoTask::Base)?;
    let err = base.set_padding_free(true).unwrap_err().to_string();
    assert!(
        err.contains("padding_free") && err.contains("every position"),
        "{err}"
    );
    base.set_padding_free(false)?;
    let mut qa = load_task("tiny-gpt2", AutoTask::QuestionAnswering)?;
    let err = qa.set_padding_free(true).unwrap_err().to_string();
    assert!(err.contains("no padding-free path"), "{err}");
    Ok(())
}

fn load_task(asset: &str, task: AutoTask) -> Result<Box<dyn PreTrainedModel>> {
    Ok(from_pretrained_dir(
        &assets().join(asset),
        task,
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model)
}

/// Rows of 12 tokens, 12, 7 and 4 of them real: right-padded (pad id 0, labels -100 on the
/// padding), or (`left`) left-padded with every real token labelled.
fn padded_lm_batch(left: bool) -> (Tensor, Tensor, Tensor) {
    tch::manual_seed(5);
    let ids = Tensor::randint_low(1, 1000, [3, 12], (Kind::Int64, Device::Cpu));
    let mask = Tensor::zeros([3, 12], (Kind::Int64, Device::Cpu));
    for (row, n) in [12i64, 7, 4].iter().enumerate() {
        let start = if left { 12 - n } else { 0 };
        let _ = mask.get(row as i64).narrow(0, start, *n).fill_(1);
    }
    let ids = ids * &mask;
    let labels = ids.masked_fill(&mask.eq(0), -100);
    (ids, mask, labels)
}

/// The causal LMs in training (Qwen2 with sliding layers, Gemma 2's eager soft-capped
/// attention, Phi-3's fused projections and partial rotary, GPT-2 with its dropouts at 0.1)
/// on right-padded rows: padding-free gives the padded run's loss (1e-6) and gradients (1e-5, relative to
/// each tensor's largest magnitude). Left-padded rows whose first real token is labelled
/// make the loss read a padding position's logits: those run padded, to the bit.
#[test]
fn padding_free_causal_lm_training_equals_the_padded_run() -> Result<()> {
    let _g = lock();
    for case in ["qwen2", "gemma2", "phi3", "gpt2"] {
        let mut model = load(case)?;
        model.set_use_cache(false);
        for left in [false, true] {
            let (ids, mask, labels) = padded_lm_batch(left);
            let inputs = ModelInputs {
                input_ids: Some(&ids),
                attention_mask: Some(&mask),
                labels: Some(&labels),
                ..Default::default()
            };
            let (padded, free) = &padded_then_free(&mut *model, &inputs)?;
            let loss_rel = rel(&free.0, &padded.0);
            let worst = worst_gradient(free, padded);
            eprintln!(
                "{case} ({} padding): loss {loss_rel:.1e}, worst gradient {worst:.1e}",
                if left { "left" } else { "right" }
            );
            // Padding-free, the padding positions' logits are zeros (nothing computes them);
            // padded, upstream's values.
            let at_padding = |logits: &Tensor| {
                logits
                    .masked_select(&mask.eq(0).unsqueeze(-1))
                    .abs()
                    .max()
                    .double_value(&[])
            };
            assert!(at_padding(&padded.1) > 0.0, "{case}");
            if left {
                assert_eq!(
                    (loss_rel, worst),
                    (0.0, 0.0),
                    "{case}: left padding runs padded"
                );
                assert!(
                    at_padding(&free.1) > 0.0,
                    "{case}: left padding runs padded"
                );
            } else {
                assert_eq!(at_padding(&free.1), 0.0, "{case}: padding-free");
                assert!(loss_rel <= 1e-6, "{case}: loss rel {loss_rel}");
                assert!(worst <= 1e-5, "{case}: gradient rel {worst}");
            }
        }
    }
    Ok(())
}

/// The tiny BERT's masked-LM and token-classification heads in training (dropout on), labels
/// -100 on the padding and on some real tokens: padding-free gives the padded run's loss
/// (1e-6) and gradients (1e-5); with a label on a padding position the forward runs padded,
/// to the bit. MiniLM's sequence classifier on left-padded rows (position 0, which its head
/// reads, is padding) runs padded too.
#[test]
fn padding_free_encoder_heads_fall_back_where_padding_is_read() -> Result<()> {
    let _g = lock();
    let (ids, mask, _) = padded_batch();
    let ids = ids.remainder(1000);
    for task in [
        AutoTask::MaskedLm,
        AutoTask::TokenClassification {
            num_labels: Some(3),
        },
    ] {
        let mut model = load_task("tiny-bert", task)?;
        let classes = if task == AutoTask::MaskedLm { 1000 } else { 3 };
        tch::manual_seed(11);
        let labels = Tensor::randint(classes, [4, 16], (Kind::Int64, Device::Cpu));
        let ignored = Tensor::rand([4, 16], (Kind::Float, Device::Cpu)).lt(0.3);
        let clean = labels.masked_fill(&ignored.logical_or(&mask.eq(0)), -100);
        // One label on a padding position (row 2, token 10).
        let leaky = clean.copy();
        let _ = leaky.get(2).get(10).fill_(1);
        for (labels, falls_back) in [(&clean, false), (&leaky, true)] {
            let inputs = ModelInputs {
                input_ids: Some(&ids),
                attention_mask: Some(&mask),
                labels: Some(labels),
                ..Default::default()
            };
            let (padded, free) = &padded_then_free(&mut *model, &inputs)?;
            let loss_rel = rel(&free.0, &padded.0);
            let worst = worst_gradient(free, padded);
            let padding_logits = max_abs(
                &free.1.masked_select(&mask.eq(0).unsqueeze(-1)),
                &padded.1.masked_select(&mask.eq(0).unsqueeze(-1)),
            );
            eprintln!(
                "{task:?} (labels on padding: {falls_back}): loss {loss_rel:.1e}, worst gradient {worst:.1e}, padding logits differ by {padding_logits:.1e}"
            );
            if falls_back {
                assert_eq!(
                    (loss_rel, worst, padding_logits),
                    (0.0, 0.0, 0.0),
                    "{task:?}"
                );
            } else {
                assert!(padding_logits > 0.0, "{task:?}: the padding-free path ran");
                assert!(loss_rel <= 1e-6, "{task:?}: loss rel {loss_rel}");
                assert!(worst <= 1e-5, "{task:?}: gradient rel {worst}");
            }
        }
    }
    let mut cls = load_task(
        "reference/models/minilm_seqcls",
        AutoTask::SequenceClassification { num_labels: None },
    )?;
    let (ids, mask, labels) = padded_batch();
    let (ids, mask) = (ids.flip([1]), mask.flip([1]));
    let inputs = ModelInputs {
        input_ids: Some(&ids),
        attention_mask: Some(&mask),
        labels: Some(&labels),
        ..Default::default()
    };
    let (padded, free) = &padded_then_free(&mut *cls, &inputs)?;
    assert_eq!(max_abs(&free.0, &padded.0), 0.0, "left padding runs padded");
    for ((name, a), (_, b)) in free.2.iter().zip(&padded.2) {
        assert_eq!(max_abs(a, b), 0.0, "{name}");
    }
    Ok(())
}

/// The decoders' sequence classifiers (tiny Qwen2, Gemma 2; GPT-2 with its dropouts, pad id
/// 50256), pooled at each
/// row's last non-pad token: padding-free on right-padded rows gives the padded run's
/// pooled logits, loss (1e-6) and gradients (1e-5), padding positions unused (the last
/// hidden state is zero there). When the pooled token is a padding position (rows padded
/// with another id than the pad id), the forward runs padded, to the bit.
#[test]
fn padding_free_decoder_sequence_classification_equals_the_padded_run() -> Result<()> {
    let _g = lock();
    for (case, pad) in [
        ("tiny_qwen2_seqcls", 0),
        ("tiny_gemma2_seqcls", 0),
        ("tiny_gpt2_seqcls", 50256),
    ] {
        let mut model = load_task(
            &format!("reference/models/{case}"),
            AutoTask::SequenceClassification { num_labels: None },
        )?;
        let (ids, mask, _) = padded_lm_batch(false);
        let ids = &ids + mask.eq(0).to_kind(Kind::Int64) * pad;
        let labels = Tensor::from_slice(&[0i64, 2, 1]);
        // Padding with id 7 instead of the pad id: upstream pools a padding position.
        let other_pad = ids.where_self(&mask.ne(0), &ids.full_like(7));
        for (ids, falls_back) in [(&ids, false), (&other_pad, true)] {
            let inputs = ModelInputs {
                input_ids: Some(ids),
                attention_mask: Some(&mask),
                labels: Some(&labels),
                ..Default::default()
            };
            let (padded, free) = &padded_then_free(&mut *model, &inputs)?;
            let (loss_rel, logits_rel) = (rel(&free.0, &padded.0), rel(&free.1, &padded.1));
            let worst = worst_gradient(free, padded);
            eprintln!(
                "{case} (pooling a padding position: {falls_back}): logits {logits_rel:.1e}, loss {loss_rel:.1e}, worst gradient {worst:.1e}"
            );
            if falls_back {
                assert_eq!((loss_rel, logits_rel, worst), (0.0, 0.0, 0.0), "{case}");
            } else {
                assert!(logits_rel <= 1e-6 && loss_rel <= 1e-6, "{case}");
                assert!(worst <= 1e-5, "{case}: gradient rel {worst}");
            }
        }
        // The path ran: the last hidden state is zero at the padding.
        model.set_padding_free(true)?;
        model.eval();
        let out = tch::no_grad(|| {
            model.forward(&ModelInputs {
                input_ids: Some(&ids),
                attention_mask: Some(&mask),
                ..Default::default()
            })
        })?;
        let h = out.last_hidden_state.context("hidden states")?;
        let at_padding = h.masked_select(&mask.eq(0).unsqueeze(-1)).abs().max();
        assert_eq!(at_padding.double_value(&[]), 0.0, "{case}");
    }
    Ok(())
}

/// A copy of the tiny checkpoint `reference/models/{case}` with every dropout of `keys` at
/// 0.1 (ModernBERT's tiny checkpoints have none), so that the padding-free dropouts are
/// checked to drop the padded run's elements.
fn with_dropout(case: &str, keys: &[&str]) -> Result<PathBuf> {
    let from = assets().join("reference/models").join(case);
    let to = std::env::temp_dir().join(format!(
        "tchtrain-padding-free-{case}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&to)?;
    for entry in std::fs::read_dir(&from)? {
        let entry = entry?;
        std::fs::copy(entry.path(), to.join(entry.file_name()))?;
    }
    let path = to.join("config.json");
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    for key in keys {
        config[*key] = serde_json::json!(0.1);
    }
    std::fs::write(&path, serde_json::to_string(&config)?)?;
    Ok(to)
}

/// DistilBERT, DeBERTa-v2 (c2p + p2c relative attention) and ModernBERT (alternating
/// sliding-window layers, RoPE; its first-token and mean-pooling classifiers, its dense and
/// sparse masked LM) on the padded batch, dropout on: padding-free gives the padded run's
/// evaluation logits and training loss within 1e-6 relative, training logits and
/// gradients within 1e-5 (the module's tolerances: only the matmuls' summation order
/// differs). The padding positions' hidden states show the padding-free path ran (zeros
/// there, the padded run's values differ). The question answerers refuse it.
#[test]
fn padding_free_every_encoder_family_equals_the_padded_run() -> Result<()> {
    let _g = lock();
    let (ids, mask, class_labels) = padded_batch();
    let ids = ids.remainder(1000);
    tch::manual_seed(11);
    let token_labels = Tensor::randint(2, [4, 16], (Kind::Int64, Device::Cpu));
    let vocab_labels = Tensor::randint(1000, [4, 16], (Kind::Int64, Device::Cpu));
    let ignored = Tensor::rand([4, 16], (Kind::Float, Device::Cpu))
        .lt(0.3)
        .logical_or(&mask.eq(0));
    let modernbert_dropouts = ["attention_dropout", "mlp_dropout", "embedding_dropout"];
    // The checkpoints' own label counts (2 or more); the labels are 0 / 1.
    let seq = AutoTask::SequenceClassification { num_labels: None };
    let tok = AutoTask::TokenClassification { num_labels: None };
    let mlm = AutoTask::MaskedLm;
    let cases = [
        ("tiny_distilbert_seqcls", seq),
        ("tiny_distilbert_tokcls", tok),
        ("tiny_distilbert_mlm", mlm),
        ("tiny_deberta_seqcls", seq),
        ("tiny_deberta_tokcls", tok),
        ("tiny_deberta_mlm", mlm),
        ("tiny_modernbert_seqcls", seq),
        ("tiny_modernbert_biased_seqcls", seq),
        ("tiny_modernbert_tokcls", tok),
        ("tiny_modernbert_mlm", mlm),
        ("tiny_modernbert_sparse_mlm", mlm),
    ];
    for (case, task) in cases {
        let dir = if case.starts_with("tiny_modernbert") {
            with_dropout(case, &modernbert_dropouts)?
        } else {
            assets().join("reference/models").join(case)
        };
        let mut model =
            from_pretrained_dir(&dir, task, Device::Cpu, &LoadOptions::default())?.model;
        let labels = match task {
            AutoTask::MaskedLm => vocab_labels.masked_fill(&ignored, -100),
            AutoTask::TokenClassification { .. } => token_labels.masked_fill(&ignored, -100),
            _ => class_labels.shallow_clone(),
        };
        let inputs = ModelInputs {
            input_ids: Some(&ids),
            attention_mask: Some(&mask),
            labels: Some(&labels),
            ..Default::default()
        };
        let eval = eval_logits_padded_then_free(&mut *model, &inputs)?;
        // The last hidden state at the padding: zeros when the path ran (in training, where
        // every head takes it), the values the padded run computes otherwise.
        let padding = mask.eq(0).unsqueeze(-1);
        let mut at_padding = Vec::new();
        for on in [false, true] {
            model.set_padding_free(on)?;
            model.train();
            let h = tch::no_grad(|| model.forward(&inputs))?
                .last_hidden_state
                .context("no hidden state")?;
            at_padding.push(h.masked_select(&padding).abs().max().double_value(&[]));
        }
        let (padded, free) = &padded_then_free(&mut *model, &inputs)?;
        let loss_rel = rel(&free.0, &padded.0);
        let train_logits_rel = if task == seq {
            rel(&free.1, &padded.1)
        } else {
            // The per-token heads' logits at the padding are not the padded run's.
            let real = mask.ne(0).unsqueeze(-1);
            let pick = |t: &Tensor| match task {
                // The sparse masked LM's logits are the labelled tokens' only.
                AutoTask::MaskedLm if t.dim() == 2 => t.shallow_clone(),
                _ => t.masked_select(&real),
            };
            rel(&pick(&free.1), &pick(&padded.1))
        };
        let worst = worst_gradient_of(free, padded);
        eprintln!(
            "{case}: eval logits {:.1e}, train logits {train_logits_rel:.1e}, loss {loss_rel:.1e}, worst gradient {worst:.1e}",
            rel(&eval[1], &eval[0])
        );
        assert_eq!(at_padding[1], 0.0, "{case}: the padding-free path ran");
        assert!(
            at_padding[0] > 0.0,
            "{case}: the padded run computes the padding"
        );
        if task == seq {
            let eval_rel = rel(&eval[1], &eval[0]);
            assert!(eval_rel <= 1e-6, "{case}: eval logits rel {eval_rel}");
        }
        assert!(loss_rel <= 1e-6, "{case}: loss rel {loss_rel}");
        assert!(
            train_logits_rel <= 1e-5,
            "{case}: train logits rel {train_logits_rel}"
        );
        assert!(worst <= 1e-5, "{case}: gradient rel {worst}");
        assert!(
            free.2.len() > 10,
            "{case}: gradients compared: {}",
            free.2.len()
        );
    }
    for case in [
        "tiny_distilbert_qa",
        "tiny_deberta_qa",
        "tiny_modernbert_qa",
    ] {
        let mut qa = load_task(
            &format!("reference/models/{case}"),
            AutoTask::QuestionAnswering,
        )?;
        let err = qa.set_padding_free(true).unwrap_err().to_string();
        assert!(
            err.contains("padding_free") && err.contains("every position"),
            "{case}: {err}"
        );
    }
    Ok(())
}

/// [`worst_gradient`] for any encoder: the key projections' biases (BERT's `key.bias`,
/// DistilBERT's `k_lin.bias`, BART's `k_proj.bias`) get a gradient that is zero in exact
/// arithmetic and are checked to be noise (not DeBERTa's `key_proj.bias`: its keys also meet the relative
/// position queries, `p2c`).
fn worst_gradient_of(free: &TrainStep, padded: &TrainStep) -> f64 {
    let mut worst = 0.0f64;
    for ((name, a), (other, b)) in free.2.iter().zip(&padded.2) {
        assert_eq!(name, other);
        if [".key.bias", ".k_lin.bias", ".k_proj.bias"]
            .iter()
            .any(|k| name.ends_with(k))
        {
            let noise = a.abs().max().double_value(&[]);
            assert!(noise <= 1e-7, "gradient of {name}: {noise}");
            continue;
        }
        worst = worst.max(rel(a, b));
    }
    worst
}

/// The encoder-decoder models (BART, mBART, T5 v1, Flan-T5; dropout 0.1) with a padded
/// encoder batch (rows of 12, 7, 4 and 10 real tokens) and labels padded with -100: the
/// encoder runs padding-free (the decoder reads it through the cross-attention, whose mask
/// hides the padding), the decoder padded. Evaluation logits and the training loss within
/// 1e-6 relative, training logits and gradients within 1e-5 (the module's tolerances); the
/// encoder's output is zero at the padding (the path ran).
#[test]
fn padding_free_encoder_decoder_equals_the_padded_run() -> Result<()> {
    let _g = lock();
    let lengths = [12i64, 7, 4, 10];
    for case in ["bart", "mbart", "t5_v1", "flan_t5"] {
        let dir = assets().join("reference/seq2seq").join(case);
        let mut model = from_pretrained_dir(
            &dir,
            AutoTask::Seq2SeqLm,
            Device::Cpu,
            &LoadOptions::default(),
        )?
        .model;
        let pad = if case.ends_with("t5") || case == "t5_v1" {
            0
        } else {
            1
        };
        tch::manual_seed(5);
        let ids = Tensor::randint_low(3, 99, [4, 12], (Kind::Int64, Device::Cpu));
        let mask = Tensor::zeros([4, 12], (Kind::Int64, Device::Cpu));
        for (row, n) in lengths.iter().enumerate() {
            let _ = mask.get(row as i64).narrow(0, 0, *n).fill_(1);
        }
        let ids = ids.where_self(&mask.ne(0), &Tensor::from(pad));
        let labels = Tensor::randint_low(3, 99, [4, 6], (Kind::Int64, Device::Cpu));
        let _ = labels.get(2).narrow(0, 3, 3).fill_(-100);
        let inputs = ModelInputs {
            input_ids: Some(&ids),
            attention_mask: Some(&mask),
            labels: Some(&labels),
            ..Default::default()
        };
        let eval = eval_logits_padded_then_free(&mut *model, &inputs)?;
        // The encoder's output at the padding: zeros padding-free, computed padded.
        let padding = mask.eq(0).unsqueeze(-1);
        let mut at_padding = Vec::new();
        for on in [false, true] {
            model.set_padding_free(on)?;
            let h = tch::no_grad(|| model.encode(&ids, Some(&mask)))?;
            at_padding.push(h.masked_select(&padding).abs().max().double_value(&[]));
        }
        assert_eq!(at_padding[1], 0.0, "{case}: the padding-free path ran");
        assert!(
            at_padding[0] > 0.0,
            "{case}: the padded run computes the padding"
        );
        let (padded, free) = &padded_then_free(&mut *model, &inputs)?;
        let eval_rel = rel(&eval[1], &eval[0]);
        let loss_rel = rel(&free.0, &padded.0);
        let logits_rel = rel(&free.1, &padded.1);
        let worst = worst_gradient_of(free, padded);
        eprintln!(
            "{case}: eval logits {eval_rel:.1e}, train logits {logits_rel:.1e}, loss {loss_rel:.1e}, worst gradient {worst:.1e} ({} tensors)",
            free.2.len()
        );
        assert!(eval_rel <= 1e-6, "{case}: eval logits rel {eval_rel}");
        assert!(loss_rel <= 1e-6, "{case}: loss rel {loss_rel}");
        assert!(logits_rel <= 1e-5, "{case}: train logits rel {logits_rel}");
        assert!(worst <= 1e-5, "{case}: gradient rel {worst}");
        assert!(
            free.2.len() > 20,
            "{case}: gradients compared: {}",
            free.2.len()
        );
    }
    Ok(())
}
